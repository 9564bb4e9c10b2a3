// A pool of workers (cpu_threads() - 1 at first, more when a ScopedThreadLimit asks for more) and
// a queue of parallel_for jobs. A job hands out its indices through an atomic counter; its caller
// takes indices too, so a job finishes even when every worker is busy with another context's job,
// and waits only for indices already taken. A job admits at most its caller's thread limit less
// one workers.
#include "backends/cpu/thread_pool.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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

struct Job {
  const std::function<void(int64_t)>* fn;
  int64_t count;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int users = 0;      // workers inside drain(); guarded by the pool's mutex
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
    }
    wake_.notify_all();
    drain(job);
    // Off the queue, so no worker starts on it; then wait for the indices others took and for
    // every worker to have left it, since the job lives on this stack frame.
    std::unique_lock<std::mutex> lock(mu_);
    jobs_.erase(std::remove(jobs_.begin(), jobs_.end(), &job), jobs_.end());
    finished_.wait(
        lock, [&] { return job.users == 0 && job.done.load(std::memory_order_acquire) == count; });
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
      wake_.wait(lock, [&] { return has_work(); });
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
