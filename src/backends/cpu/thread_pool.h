// The CPU backend's worker threads: one pool per process that kernels split their work over
// (parallel_for), shared fairly by every execution context that runs at once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <type_traits>

namespace kiln::backends::cpu {

// Runs fn(i) for every i in [0, count), on the calling thread and the pool's workers, and
// returns when all have run. Each index runs exactly once; the calls for one parallel_for may run
// in any order and at once, so fn must write disjoint data. Calls from several threads at once
// share the workers; a call made by a worker runs inline. In a process forked from the one that
// made the pool, and with one thread, everything runs inline on the caller.
void parallel_for(int64_t count, const std::function<void(int64_t)>& fn);
// The same with a plain callback fn(ctx, i), for code that cannot make a std::function (gemm.cc:
// clang 14 emits no std::function code in a file of target_clones functions).
void parallel_for(int64_t count, void (*fn)(const void* ctx, int64_t i), const void* ctx);

// The threads parallel_for uses by default, the caller included: KILN_CPU_THREADS when set (1 to
// 256), else the CPUs this process may run on (sched_getaffinity).
int cpu_threads();

inline constexpr int kMaxCpuThreads = 256;

// While it lives, the parallel_for calls of the thread that made it use at most `threads`
// threads, the caller included (0: cpu_threads()); clamped to 1..kMaxCpuThreads. The pool grows
// to the largest limit asked for (more threads than CPUs is allowed, as ONNX Runtime allows more
// intra-op threads than cores). ExecutionContext::set_cpu_threads sets one around each run.
class ScopedThreadLimit {
 public:
  explicit ScopedThreadLimit(int threads);
  ~ScopedThreadLimit();
  ScopedThreadLimit(const ScopedThreadLimit&) = delete;
  ScopedThreadLimit& operator=(const ScopedThreadLimit&) = delete;

 private:
  int saved_;
};

// The threads a parallel_for from this thread may use now (the caller included).
int thread_limit();

// fn(begin, end) over [0, n) in contiguous ranges of at least `grain` items (up to four ranges per
// thread, so an uneven split evens out), through parallel_for; one call fn(0, n) where the work
// is smaller than two grains. Each item is in exactly one range, so a kernel that computes each
// item on its own gives the same bits however the range is split. It goes through the plain
// callback form of parallel_for, so files of target_clones functions may call it too.
template <typename F>
void parallel_chunks(int64_t n, int64_t grain, F&& fn) {
  const int64_t chunks =
      std::min<int64_t>(int64_t(thread_limit()) * 4, n / std::max<int64_t>(grain, 1));
  if (chunks <= 1) {
    if (n > 0) fn(int64_t(0), n);
    return;
  }
  struct Ctx {
    std::remove_reference_t<F>* fn;
    int64_t n, step;
  };
  const Ctx ctx{&fn, n, (n + chunks - 1) / chunks};
  parallel_for(
      chunks,
      [](const void* c, int64_t i) {
        const Ctx& x = *static_cast<const Ctx*>(c);
        const int64_t begin = i * x.step, end = std::min(x.n, begin + x.step);
        if (begin < end) (*x.fn)(begin, end);
      },
      &ctx);
}

// Items of this many floats or more are worth splitting over threads (below it, waking a worker
// costs more than it saves).
inline constexpr int64_t kParallelGrain = 16384;

}  // namespace kiln::backends::cpu
