// A pool of workers (cpu_threads() - 1 at first, more when a ScopedThreadLimit asks for more) and
// a queue of parallel_for jobs. A job hands out its indices through an atomic counter; its caller
// takes indices too, so a job finishes even when every worker is busy with another context's job,
// and waits only for indices already taken. A job admits at most its caller's thread limit less
// one workers.
//
// Waiting spins before it sleeps: a worker that finds no job watches for the next one for up to
// kSpin before it blocks on the condition variable, and a caller whose indices are all taken
// watches its job finish for as long before it blocks. The layers of one inference follow each
// other within microseconds, and waking a thread blocked in the kernel took tens of them on the
// 2-core development VM: MobileNetV3-small at batch 1 ran slower on two threads than on one
// (4.5 against 3.9 ms, `kiln bench --threads`), its ~70 parallel layers each paying a wake-up and a
// join; with 200 us of spinning, 2.9-3.5 ms. ONNX Runtime's pool spins the same way.
#include "backends/cpu/thread_pool.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kiln::backends::cpu {
namespace {

thread_local bool t_in_worker = false;
thread_local int t_limit = 0;  // ScopedThreadLimit's; 0: cpu_threads()

// How long a worker watches for the next job, and a caller for its job's end, before blocking.
constexpr std::chrono::microseconds kSpin{200};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Calls `done` until it returns true or kSpin has passed; whether it returned true.
template <typename F>
bool spin_until(F done) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1;; ++i) {
    if (done()) return true;
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) return done();
  }
}

struct Job {
  const std::function<void(int64_t)>* fn;
  int64_t count;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  // Workers inside drain(): raised under the pool's mutex (admission), lowered under it too, read
  // without it by the caller's spin once the job is off the queue (when it can only fall).
  std::atomic<int> users{0};
  int max_users = 0;  // the workers it admits: its caller's thread limit less one
};

class Pool {
 public:
  explicit Pool(int threads) : owner_(getpid()) {
    for (int i = 0; i + 1 < threads; ++i) workers_.emplace_back([this] { work(); });
  }

  void run(int64_t count, const std::function<void(int64_t)>& fn) {
    if (count <= 0) return;
    const int64_t helpers = std::min<int64_t>(thread_limit() - 1, count - 1);
    if (helpers <= 0 || t_in_worker || getpid() != owner_) {
      for (int64_t i = 0; i < count; ++i) fn(i);
      return;
    }
    Job job;
    job.fn = &fn;
    job.count = count;
    job.max_users = int(helpers);
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (int64_t(workers_.size()) < helpers) workers_.emplace_back([this] { work(); });
      jobs_.push_back(&job);
      posted_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();  // no system call when every worker is spinning
    drain(job);
    // Off the queue, so no worker starts on it; then wait for the indices others took and for
    // every worker to have left it, since the job lives on this stack frame.
    std::unique_lock<std::mutex> lock(mu_);
    jobs_.erase(std::remove(jobs_.begin(), jobs_.end(), &job), jobs_.end());
    auto finished = [&] {
      return job.users.load(std::memory_order_acquire) == 0 &&
             job.done.load(std::memory_order_acquire) == count;
    };
    if (finished()) return;
    lock.unlock();
    if (spin_until(finished)) {
      // The last worker lowered `users` under the mutex and may still hold it: taking it once
      // more makes sure that worker is out of every use of the job before the frame goes.
      lock.lock();
      return;
    }
    lock.lock();
    finished_.wait(lock, finished);
  }

 private:
  // Runs indices of `job` until none is left.
  void drain(Job& job) {
    for (;;) {
      const int64_t i = job.next.fetch_add(1, std::memory_order_relaxed);
      if (i >= job.count) return;
      (*job.fn)(i);
      if (job.done.fetch_add(1, std::memory_order_acq_rel) + 1 == job.count) {
        std::lock_guard<std::mutex> lock(mu_);
        finished_.notify_all();
      }
    }
  }

  void work() {
    t_in_worker = true;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (!has_work()) {
        const uint64_t seen = posted_.load(std::memory_order_acquire);
        lock.unlock();
        spin_until([&] { return posted_.load(std::memory_order_acquire) != seen; });
        lock.lock();
        wake_.wait(lock, [&] { return has_work(); });
      }
      Job* job = nullptr;
      for (Job* j : jobs_) {
        if (open(*j)) {
          job = j;
          break;
        }
      }
      if (!job) continue;
      ++job->users;  // its caller returns only once users is back to 0
      lock.unlock();
      drain(*job);
      lock.lock();
      if (--job->users == 0) finished_.notify_all();
    }
  }

  // Indices left and room for one more worker (called with mu_ held).
  static bool open(const Job& j) {
    return j.users < j.max_users && j.next.load(std::memory_order_relaxed) < j.count;
  }
  bool has_work() const {
    return std::any_of(jobs_.begin(), jobs_.end(), [](const Job* j) { return open(*j); });
  }

  const pid_t owner_;
  std::atomic<uint64_t> posted_{0};  // jobs queued so far, watched by spinning workers
  std::mutex mu_;
  std::condition_variable wake_, finished_;
  std::deque<Job*> jobs_;
  std::vector<std::thread> workers_;
};

// Never destroyed: a context still running while static destructors run at exit (a Python thread,
// say) must not find the workers gone. The workers block on the queue until the process ends.
Pool& pool() {
  static Pool* p = new Pool(cpu_threads());
  return *p;
}

}  // namespace

int cpu_threads() {
  static const int n = [] {
    if (const char* env = std::getenv("KILN_CPU_THREADS")) {
      char* end = nullptr;
      const long v = std::strtol(env, &end, 10);
      if (end != env && *end == '\0' && v >= 1 && v <= 256) return int(v);
    }
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
    return int(std::max(1u, std::thread::hardware_concurrency()));
  }();
  return n;
}

int thread_limit() { return t_limit > 0 ? t_limit : cpu_threads(); }

ScopedThreadLimit::ScopedThreadLimit(int threads) : saved_(t_limit) {
  t_limit = threads <= 0 ? 0 : std::min(threads, kMaxCpuThreads);
}

ScopedThreadLimit::~ScopedThreadLimit() { t_limit = saved_; }

void parallel_for(int64_t count, const std::function<void(int64_t)>& fn) { pool().run(count, fn); }

void parallel_for(int64_t count, void (*fn)(const void* ctx, int64_t i), const void* ctx) {
  pool().run(count, [fn, ctx](int64_t i) { fn(ctx, i); });
}

}  // namespace kiln::backends::cpu
