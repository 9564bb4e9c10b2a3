// Progress bars and stage lines. Drawing is throttled to 10 Hz so the bar never costs what it
// measures (bench calls update() between timed iterations, outside the timed region).
#include "progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kiln::cli {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

bool stdout_is_tty() {
  if (const char* env = std::getenv("KILN_PROGRESS")) return std::strcmp(env, "0") != 0;
  return isatty(STDOUT_FILENO) != 0;
}

Progress::Progress(std::string label, int64_t total, double total_seconds)
    : label_(std::move(label)),
      total_(total),
      total_seconds_(total_seconds),
      tty_(stdout_is_tty()),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {
  if (tty_) draw(0, true);
}

Progress::~Progress() { finish(false); }

void Progress::update(int64_t done) {
  done_ = done;
  if (tty_) draw(done, false);
}

void Progress::draw(int64_t done, bool force) {
  auto now = std::chrono::steady_clock::now();
  if (!force && std::chrono::duration<double>(now - last_draw_).count() < 0.1) return;
  last_draw_ = now;
  double elapsed = seconds_since(start_);
  double frac = total_ > 0           ? double(done) / double(total_)
                : total_seconds_ > 0 ? elapsed / total_seconds_
                                     : 0;
  frac = frac < 0 ? 0 : frac > 1 ? 1 : frac;
  constexpr int kWidth = 30;
  int filled = int(frac * kWidth + 0.5);
  std::string bar(filled, '#');
  bar.resize(kWidth, '-');
  if (total_ > 0) {
    std::printf("\r%s [%s] %3d%%  %lld/%lld  %.1f s ", label_.c_str(), bar.c_str(), int(frac * 100),
                static_cast<long long>(done), static_cast<long long>(total_), elapsed);
  } else {
    std::printf("\r%s [%s] %3d%%  %lld done  %.1f s ", label_.c_str(), bar.c_str(), int(frac * 100),
                static_cast<long long>(done), elapsed);
  }
  std::fflush(stdout);
}

void Progress::finish(bool plain_end) {
  if (finished_) return;
  finished_ = true;
  if (tty_) {
    std::printf("\r%s\r", std::string(label_.size() + 70, ' ').c_str());
    std::fflush(stdout);
  } else if (plain_end) {
    std::printf("%s: done (%lld in %.2f s)\n", label_.c_str(), static_cast<long long>(done_),
                seconds_since(start_));
  }
}

Stages::Stages(std::string label, int total, bool verbose, bool plain_lines)
    : label_(std::move(label)),
      total_(total),
      tty_(stdout_is_tty()),
      verbose_(verbose),
      plain_lines_(plain_lines) {}

void Stages::begin(const std::string& what) {
  ++index_;
  what_ = what;
  start_ = std::chrono::steady_clock::now();
  if (tty_) {
    std::printf("\r[%d/%d] %s ...", index_, total_, what.c_str());
    std::fflush(stdout);
  }
}

void Stages::end() {
  double t = seconds_since(start_);
  if (tty_) {
    std::printf("\r%s\r", std::string(what_.size() + 20, ' ').c_str());
    if (verbose_) std::printf("[%d/%d] %s (%.2f s)\n", index_, total_, what_.c_str(), t);
  } else if (plain_lines_ || verbose_) {
    std::printf("[%d/%d] %s (%.2f s)\n", index_, total_, what_.c_str(), t);
  }
  std::fflush(stdout);
}

}  // namespace kiln::cli
