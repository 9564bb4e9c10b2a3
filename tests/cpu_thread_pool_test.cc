// The CPU backend's thread pool: every index of a parallel_for runs exactly once, calls from
// several threads at once share the workers and each gets its own indices, a parallel_for inside
// a task runs inline instead of waiting on itself, an empty range runs nothing, and a
// ScopedThreadLimit bounds the threads one caller's calls use (growing the pool past the CPUs).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "backends/cpu/thread_pool.h"

namespace kiln {
namespace {

using backends::cpu::cpu_threads;
using backends::cpu::parallel_for;
using backends::cpu::ScopedThreadLimit;
using backends::cpu::thread_limit;

// The distinct threads that ran a parallel_for of `count` tasks of `ms` milliseconds each.
size_t threads_used(int64_t count, int ms) {
  std::mutex mu;
  std::set<std::thread::id> ids;
  parallel_for(count, [&](int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  return ids.size();
}

TEST(CpuThreadPool, EveryIndexRunsOnce) {
  ASSERT_GE(cpu_threads(), 1);
  std::vector<std::atomic<int>> hits(1000);
  parallel_for(1000, [&](int64_t i) { hits[size_t(i)].fetch_add(1); });
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i;
  int calls = 0;
  parallel_for(0, [&](int64_t) { ++calls; });
  parallel_for(-3, [&](int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(CpuThreadPool, ConcurrentCallersEachGetTheirOwnIndices) {
  constexpr int kCallers = 4, kRounds = 200, kCount = 64;
  std::vector<std::thread> callers;
  std::vector<int64_t> wrong(kCallers, 0);
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int r = 0; r < kRounds; ++r) {
        std::vector<int64_t> out(kCount, -1);
        parallel_for(kCount, [&](int64_t i) { out[size_t(i)] = i * (c + 1) + r; });
        for (int64_t i = 0; i < kCount; ++i) wrong[size_t(c)] += out[size_t(i)] != i * (c + 1) + r;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(wrong[size_t(c)], 0) << "caller " << c;
}

TEST(CpuThreadPool, NestedCallsRunInline) {
  std::atomic<int64_t> sum{0};
  parallel_for(8,
               [&](int64_t i) { parallel_for(8, [&](int64_t j) { sum.fetch_add(i * 8 + j); }); });
  EXPECT_EQ(sum.load(), 63 * 64 / 2);
}

TEST(CpuThreadPool, AThreadLimitBoundsTheThreadsOfItsCallerAndIsRestored) {
  const int base = thread_limit();
  EXPECT_EQ(base, cpu_threads());
  {
    ScopedThreadLimit one(1);
    EXPECT_EQ(thread_limit(), 1);
    EXPECT_EQ(threads_used(16, 1), 1u);  // all on the caller
    {
      // Past the CPUs of a two-core machine: the pool grows, and sleeping tasks let every one
      // of the four threads take some.
      ScopedThreadLimit four(4);
      EXPECT_EQ(thread_limit(), 4);
      const size_t used = threads_used(64, 5);
      EXPECT_LE(used, 4u);
      EXPECT_GE(used, 2u);
    }
    EXPECT_EQ(thread_limit(), 1);
    // Another thread's calls keep their own (default) limit.
    int other = 0;
    std::thread([&] { other = thread_limit(); }).join();
    EXPECT_EQ(other, cpu_threads());
  }
  EXPECT_EQ(thread_limit(), base);
  ScopedThreadLimit huge(100000);
  EXPECT_EQ(thread_limit(), backends::cpu::kMaxCpuThreads);
}

}  // namespace
}  // namespace kiln
