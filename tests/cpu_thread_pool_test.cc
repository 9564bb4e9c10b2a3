// The CPU backend's thread pool: every index of a parallel_for runs exactly once, calls from
// several threads at once share the workers and each gets its own indices, a parallel_for inside
// a task runs inline instead of waiting on itself, an empty range runs nothing, and a
// ScopedThreadLimit bounds the threads one caller's calls use (growing the pool past the CPUs);
// broadcast walks split over the threads visit every row once with its own offsets.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "backends/cpu/broadcast.h"
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

// for_each_row splits the rows over the threads (parallel_chunks): a squeeze-excite gate
// ([4, 3136, 16] times [4, 1, 16], as NHWC MobileNet multiplies) and a [3, 5, 7, 2] + [5, 1, 2]
// broadcast give each element its own operands' product or sum on 1, 2 and 4 threads, and the
// same bits on each.
TEST(CpuThreadPool, BroadcastRowsSplitOverTheThreadsEachGetTheirOwnOperands) {
  using backends::cpu::BroadcastPlan;
  using backends::cpu::make_broadcast_plan;
  using backends::cpu::rows2;
  struct Case {
    std::vector<int64_t> out, a, b;
  };
  for (const Case& c : {Case{{4, 3136, 16}, {4, 3136, 16}, {4, 1, 16}},
                        Case{{3, 5, 7, 2}, {3, 5, 7, 2}, {5, 1, 2}}}) {
    BroadcastPlan<2> plan;
    ASSERT_TRUE(make_broadcast_plan<2>(c.out, {c.a, c.b}, &plan).ok());
    std::vector<float> a(size_t(plan.numel)), b;
    int64_t nb = 1;
    for (int64_t d : c.b) nb *= d;
    b.resize(size_t(nb));
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(i % 1013) * 0.25f - 7.f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = float(i % 17) + 1.5f;
    // The expected element: the output index decomposed, b's index with its broadcast dims at 0.
    std::vector<float> want(a.size());
    const size_t rank = c.out.size(), off = rank - c.b.size();
    for (int64_t e = 0; e < plan.numel; ++e) {
      int64_t rem = e, bi = 0, bstride = 1;
      for (size_t d = rank; d-- > 0;) {
        const int64_t i = rem % c.out[d];
        rem /= c.out[d];
        if (d >= off) {
          const int64_t bd = c.b[d - off];
          bi += (bd == 1 ? 0 : i) * bstride;
          bstride *= bd;
        }
      }
      want[size_t(e)] =
          c.b.size() == 3 ? a[size_t(e)] * b[size_t(bi)] : a[size_t(e)] + b[size_t(bi)];
    }
    for (int threads : {1, 2, 4}) {
      ScopedThreadLimit limit(threads);
      std::vector<float> got(a.size(), -1.f);
      if (c.b.size() == 3) {
        rows2(plan, a.data(), b.data(), got.data(), [](float u, float v) { return u * v; });
      } else {
        rows2(plan, a.data(), b.data(), got.data(), [](float u, float v) { return u + v; });
      }
      for (size_t e = 0; e < got.size(); ++e) {
        ASSERT_EQ(got[e], want[e]) << "threads " << threads << " element " << e;
      }
    }
  }
}

}  // namespace
}  // namespace kiln
