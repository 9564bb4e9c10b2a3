// The CPU backend's thread pool: every index of a parallel_for runs exactly once, calls from
// several threads at once share the workers and each gets its own indices, a parallel_for inside
// a task runs inline instead of waiting on itself, and an empty range runs nothing.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "backends/cpu/thread_pool.h"

namespace kiln {
namespace {

using backends::cpu::cpu_threads;
using backends::cpu::parallel_for;

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

}  // namespace
}  // namespace kiln
