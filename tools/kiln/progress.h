// Progress reporting for long CLI work: a redrawn bar on a terminal, and on a pipe or a file only
// plain lines (a start and an end), so logs stay readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace kiln::cli {

// True when stdout is a terminal (isatty); KILN_PROGRESS=0/1 overrides, for tests and demos.
bool stdout_is_tty();

class Progress {
 public:
  // `total` 0 means unknown (time-based work): the bar shows elapsed time against `total_seconds`.
  Progress(std::string label, int64_t total, double total_seconds = 0);
  ~Progress();
  void update(int64_t done);
  // Clears the bar; on a pipe prints "label: done (N in T s)" when `plain_end` is set.
  void finish(bool plain_end = true);

 private:
  void draw(int64_t done, bool force);
  std::string label_;
  int64_t total_;
  double total_seconds_;
  bool tty_;
  bool finished_ = false;
  int64_t done_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// Numbered build stages ("[2/4] building engine"): redrawn in place on a terminal, one line each
// with its time otherwise (without `plain_lines`, only when verbose).
class Stages {
 public:
  Stages(std::string label, int total, bool verbose, bool plain_lines = true);
  void begin(const std::string& what);
  void end();  // marks the current stage done
 private:
  std::string label_;
  int total_;
  int index_ = 0;
  bool tty_, verbose_, plain_lines_;
  std::string what_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace kiln::cli
