// Loops that run at run time (issue 15, item 3): an ONNX Loop whose trip count or condition is
// data keeps one copy of its body between a kiln::LoopBegin and a kiln::LoopEnd, and the run
// repeats it (plan/loops.h). Checked against the loop written out by hand, on the CPU and (on the
// GPU host) CUDA: a `for` over a trip count from data, a `while` on a condition the body computes,
// carried values that swap (copied through the LoopEnd's workspace), a value from before the loop
// that only the body reads (kept live across iterations), nested loops, an If on data in the
// body, no iteration at all, the iteration limit, and the refusals and tampered plans.
#include "plan/loops.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <thread>

#include "ir/text.h"
#include "kiln.h"
#include "model_util.h"
#include "ops/loop_end.h"
#include "plan/plan.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

class RunTimeLoop : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    Status why = device_available(GetParam());
    if (!why.ok()) GTEST_SKIP() << why.message();
  }
  // Each input in `dynamic` ranges its first dim over 1..16 (opt 4), followed by `tail`.
  StatusOr<Engine> build(const std::string& text, const std::vector<std::string>& dynamic = {"x"},
                         const std::vector<int64_t>& tail = {}) {
    Network net;
    KILN_ASSIGN_OR_RETURN(net.graph, ir::parse_text(text, {}));
    BuilderConfig config;
    OptimizationProfile p;
    auto dims = [&](int64_t first) {
      std::vector<int64_t> d = {first};
      d.insert(d.end(), tail.begin(), tail.end());
      return d;
    };
    for (const std::string& name : dynamic)
      KILN_RETURN_IF_ERROR(p.set_dimensions(name, dims(1), dims(4), dims(16)));
    config.add_profile(p);
    return Builder(GetParam()).build(net, config);
  }
  // Runs each case on one context (CUDA graphs asked for: a loop's runs take none).
  static StatusOr<std::map<std::string, Tensor>> run(ExecutionContext& ctx,
                                                     const std::map<std::string, Tensor>& in) {
    ctx.set_use_cuda_graph(true);
    return ctx.run(in);
  }
};

// y = -y + i per iteration (i = 0, 1, ...), k sums the iterations' numbers; m is data.
const char* kForOnData = R"(graph g(%x: float32[n], %m: int64[]) -> (%y: float32[?], %k: int64[?]) {
  %t: bool[] = dense<1>
  %k0: int64[] = dense<0>
  %y: float32[?], %k: int64[?] = Loop(%m, %t, %x, %k0) {body=graph body(%i: int64[], %c: bool[], %a: float32[?], %kin: int64[?]) -> (%c2: bool[?], %b: float32[?], %kout: int64[?]) {
    %c2: bool[?] = Identity(%c)  # keep
    %fi: float32[?] = Cast(%i) {to=1}  # as_float
    %na: float32[?] = Neg(%a)  # neg
    %b: float32[?] = Add(%na, %fi)  # add
    %kout: int64[?] = Add(%kin, %i)  # count
  }}  # loop
}
)";

void check_for_on_data(Engine& engine, const std::string& where) {
  auto ctx = engine.create_execution_context();
  ASSERT_TRUE(ctx.ok());
  for (int64_t m : {3, 0, 1, 6, -2, 2500}) {  // 2500: past a lap of the context's counter words
    for (int64_t n : {4, 1}) {
      Tensor x = random_f32({n}, uint32_t(m + 10 * n + 20));
      std::vector<float> want(x.data_as<float>(), x.data_as<float>() + n);
      int64_t k = 0;
      for (int64_t i = 0; i < m; ++i) {
        for (float& v : want) v = -v + float(i);
        k += i;
      }
      (*ctx)->set_use_cuda_graph(true);
      auto out = (*ctx)->run({{"x", x}, {"m", make_i64({}, {m})}});
      const std::string at = where + " m=" + std::to_string(m) + " n=" + std::to_string(n);
      ASSERT_TRUE(out.ok()) << at << ": " << out.status().to_string();
      EXPECT_TRUE(all_close(out->at("y"), make_f32({n}, want), kFp32Atol, kFp32Rtol)) << at;
      ASSERT_EQ(out->at("k").numel(), 1) << at;
      EXPECT_EQ(out->at("k").data_as<int64_t>()[0], k) << at;
    }
  }
}

TEST_P(RunTimeLoop, AForLoopOverATripCountFromDataRunsItsBodyThatManyTimes) {
  auto engine = build(kForOnData);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  int begins = 0, ends = 0;
  for (const LayerInfo& l : engine->layers()) {
    EXPECT_NE(l.op_type, "Loop");
    // The body's layers and the LoopEnd repeat per iteration of the LoopBegin; it runs once.
    EXPECT_EQ(l.repeats_in,
              l.name.rfind("loop/", 0) == 0 && l.op_type != "LoopBegin" ? "loop/begin" : "")
        << l.name;
    begins += l.op_type == "LoopBegin";
    ends += l.op_type == "LoopEnd";
    if (l.op_type == "LoopBegin" || l.op_type == "LoopEnd") EXPECT_EQ(l.kernel, plan::kControlImpl);
  }
  EXPECT_EQ(begins, 1);
  EXPECT_EQ(ends, 1);
  check_for_on_data(*engine, "built");
  // The loop travels in the engine file.
  auto loaded = Engine::deserialize(engine->serialize());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  check_for_on_data(*loaded, "loaded");
}

// Halves y until its absolute sum is at most 1 (a while loop: no M, the body computes the
// condition), counting the iterations.
const char* kWhile = R"(graph g(%x: float32[n]) -> (%y: float32[?], %count: int64[?]) {
  %half: float32[] = dense<0.5>
  %limit: float32[] = dense<1.0>
  %k0: int64[] = dense<0>
  %k1: int64[] = dense<1>
  %ax: float32[?] = Abs(%x)  # abs0
  %s0: float32[?] = ReduceSum(%ax) {keepdims=0}  # sum0
  %go: bool[?] = Greater(%s0, %limit)  # go
  %y: float32[?], %count: int64[?] = Loop(_, %go, %x, %k0) {body=graph body(%i: int64[], %c: bool[], %a: float32[?], %kin: int64[?]) -> (%c2: bool[?], %b: float32[?], %kout: int64[?]) {
    %b: float32[?] = Mul(%a, %half)  # halve
    %ab: float32[?] = Abs(%b)  # abs
    %s: float32[?] = ReduceSum(%ab) {keepdims=0}  # sum
    %c2: bool[?] = Greater(%s, %limit)  # more
    %kout: int64[?] = Add(%kin, %k1)  # count
  }}  # loop
}
)";

TEST_P(RunTimeLoop, AWhileLoopRunsUntilItsConditionTurnsFalse) {
  auto engine = build(kWhile);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  for (const std::vector<float>& xs :
       std::vector<std::vector<float>>{{100, -3, 7}, {0.25f}, {1.5f}, {-900, 1e4f, 3, 3}}) {
    std::vector<float> want = xs;
    int64_t count = 0;
    auto total = [&] {
      float s = 0;
      for (float v : want) s += std::fabs(v);
      return s;
    };
    while (total() > 1) {
      for (float& v : want) v *= 0.5f;
      ++count;
    }
    auto out = run(**ctx, {{"x", make_f32({int64_t(xs.size())}, xs)}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_TRUE(all_close(out->at("y"), make_f32({int64_t(xs.size())}, want), kFp32Atol, kFp32Rtol))
        << xs[0];
    EXPECT_EQ(out->at("count").data_as<int64_t>()[0], count) << xs[0];
  }
}

TEST_P(RunTimeLoop, ALoopWhoseConditionNeverTurnsFalseStopsAtTheIterationLimit) {
  auto engine = build(R"(graph g(%x: float32[n]) -> (%y: float32[?]) {
  %t: bool[] = dense<1>
  %floor: float32[] = dense<-1.0>
  %y: float32[?] = Loop(_, %t, %x) {body=graph body(%i: int64[], %c: bool[], %a: float32[?]) -> (%c2: bool[?], %b: float32[?]) {
    %b: float32[?] = Abs(%a)  # abs
    %s: float32[?] = ReduceSum(%b) {keepdims=0}  # sum
    %c2: bool[?] = Greater(%s, %floor)  # always
  }}  # spin
}
)");
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  EXPECT_EQ((*ctx)->max_loop_iterations(), 1000000);
  (*ctx)->set_max_loop_iterations(40);
  auto out = (*ctx)->run({{"x", make_f32({2}, {1, 2})}});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("ran 40 iterations and its condition still holds"),
            std::string::npos)
      << out.status().to_string();
  EXPECT_NE(out.status().message().find("spin/begin"), std::string::npos)
      << out.status().to_string();
}

// The carried values swap each iteration: the next a is b's bytes and the next b is a's, so the
// LoopEnd copies through its workspace.
const char* kSwap =
    R"(graph g(%x: float32[n], %z: float32[n], %m: int64[]) -> (%p: float32[?], %q: float32[?]) {
  %t: bool[] = dense<1>
  %p: float32[?], %q: float32[?] = Loop(%m, %t, %x, %z) {body=graph body(%i: int64[], %c: bool[], %a: float32[?], %b: float32[?]) -> (%c2: bool[?], %b2: float32[?], %a2: float32[?]) {
    %c2: bool[?] = Identity(%c)  # keep
    %b2: float32[?] = Identity(%b)  # pass_b
    %a2: float32[?] = Identity(%a)  # pass_a
  }}  # swap
}
)";

TEST_P(RunTimeLoop, CarriedValuesThatSwapCopyThroughTheWorkspace) {
  auto engine = build(kSwap, {"x", "z"});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const plan::Plan& p = engine->plan();
  bool staged = false;
  for (size_t n = 0; n < p.graph.nodes.size(); ++n) {
    if (p.graph.nodes[n].op_type == "LoopEnd") staged = p.nodes[n].workspace_slot >= 0;
  }
  EXPECT_TRUE(staged);
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  Tensor x = make_f32({3}, {1, 2, 3}), z = make_f32({3}, {-4, -5, -6});
  for (int64_t m : {0, 1, 2, 5}) {
    auto out = run(**ctx, {{"x", x}, {"z", z}, {"m", make_i64({}, {m})}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_TRUE(all_close(out->at("p"), m % 2 ? z : x, 0, 0)) << m;
    EXPECT_TRUE(all_close(out->at("q"), m % 2 ? x : z, 0, 0)) << m;
  }
  // A plan whose LoopEnd lost that workspace would copy over what it reads next.
  plan::Plan bad = p;
  for (size_t n = 0; n < bad.graph.nodes.size(); ++n) {
    if (bad.graph.nodes[n].op_type == "LoopEnd") bad.nodes[n].workspace_slot = -1;
  }
  auto refused = Engine::from_plan(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("copies through a workspace that holds them"),
            std::string::npos)
      << refused.status().to_string();
}

// w is computed before the loop and read only by the body's first node: each iteration reads it
// again, so no later body value may take its memory (q, of w's size, would).
TEST_P(RunTimeLoop, AValueFromBeforeTheLoopStaysLiveForEveryIteration) {
  auto engine = build(R"(graph g(%x: float32[n], %w0: float32[n], %m: int64[]) -> (%y: float32[?]) {
  %t: bool[] = dense<1>
  %w: float32[?] = Relu(%w0)  # relu
  %y: float32[?] = Loop(%m, %t, %x) {body=graph body(%i: int64[], %c: bool[], %a: float32[?]) -> (%c2: bool[?], %b: float32[?]) {
    %c2: bool[?] = Identity(%c)  # keep
    %p: float32[?] = Mul(%a, %w)  # scale
    %q: float32[?] = Neg(%p)  # neg
    %b: float32[?] = Abs(%q)  # abs
  }}  # loop
}
)",
                      {"x", "w0"});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  Tensor x = make_f32({4}, {1, -2, 3, 0.5f}), w0 = make_f32({4}, {2, 0.5f, -1, 3});
  auto out = run(**ctx, {{"x", x}, {"w0", w0}, {"m", make_i64({}, {3})}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close(out->at("y"), make_f32({4}, {8, 0.25f, 0, 13.5f}), kFp32Atol, kFp32Rtol));
}

// An inner loop whose trip count is the outer loop's iteration number (data): y = x + 0 + 1 + ...
// + (m - 1), the inner body reading `one` from the outermost graph.
// Iteration i of the outer loop runs an inner loop of i iterations, each adding 1.
const char* kNested = R"(graph g(%x: float32[n], %m: int64[]) -> (%y: float32[?]) {
  %t: bool[] = dense<1>
  %one: float32[] = dense<1.0>
  %y: float32[?] = Loop(%m, %t, %x) {body=graph outer(%i: int64[], %c: bool[], %a: float32[?]) -> (%c2: bool[?], %b: float32[?]) {
    %c2: bool[?] = Identity(%c)  # keep
    %b: float32[?] = Loop(%i, %t, %a) {body=graph inner(%j: int64[], %d: bool[], %u: float32[?]) -> (%d2: bool[?], %v: float32[?]) {
      %d2: bool[?] = Identity(%d)  # keep
      %v: float32[?] = Add(%u, %one)  # inc
    }}  # inner
  }}  # outer
}
)";

TEST_P(RunTimeLoop, NestedLoopsRunEachInnerLoopPerOuterIteration) {
  auto engine = build(kNested);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  int begins = 0;
  for (const LayerInfo& l : engine->layers()) {
    begins += l.op_type == "LoopBegin";
    if (l.op_type == "LoopBegin")
      EXPECT_EQ(l.repeats_in, l.name == "outer/begin" ? "" : "outer/begin") << l.name;
    if (l.op_type == "Add") EXPECT_EQ(l.repeats_in, "outer/inner/begin") << l.name;
  }
  EXPECT_EQ(begins, 2);
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  for (int64_t m : {0, 1, 4}) {
    auto out = run(**ctx, {{"x", make_f32({2}, {1, -1})}, {"m", make_i64({}, {m})}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    const float add = float(m * (m - 1) / 2);
    EXPECT_TRUE(all_close(out->at("y"), make_f32({2}, {1 + add, -1 + add}), kFp32Atol, kFp32Rtol))
        << m;
  }
}

// The iteration budget bounds the whole run (issue 41): nested loops each under it would
// multiply. m = 12 outer iterations run 66 inner ones, 78 in all.
TEST_P(RunTimeLoop, NestedLoopsShareOneIterationBudgetPerRun) {
  auto engine = build(kNested);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  (*ctx)->set_max_loop_iterations(50);  // each loop alone stays under it
  auto out = run(**ctx, {{"x", make_f32({2}, {1, -1})}, {"m", make_i64({}, {12})}});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("iterations in all"), std::string::npos)
      << out.status().to_string();
  EXPECT_NE(out.status().message().find("for all of a run's loops together"), std::string::npos)
      << out.status().to_string();
  // The budget is per run: a smaller run right after on the same context succeeds.
  out = run(**ctx, {{"x", make_f32({2}, {1, -1})}, {"m", make_i64({}, {5})}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close(out->at("y"), make_f32({2}, {11, 9}), kFp32Atol, kFp32Rtol));
  (*ctx)->set_max_loop_iterations(100);
  out = run(**ctx, {{"x", make_f32({2}, {1, -1})}, {"m", make_i64({}, {12})}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
}

// A Loop of a constant 2^61 iterations whose condition stays true: too long to unroll, it runs at
// run time and ends only at the iteration budget or a cancel.
const char* kHugeLoop = R"(graph g(%x: float32[n]) -> (%y: float32[?]) {
  %t: bool[] = dense<1>
  %huge: int64[] = dense<2305843009213693952>
  %y: float32[?] = Loop(%huge, %t, %x) {body=graph body(%i: int64[], %c: bool[], %a: float32[?]) -> (%c2: bool[?], %b: float32[?]) {
    %c2: bool[?] = Identity(%c)  # keep
    %b: float32[?] = Neg(%a)  # neg
  }}  # huge
}
)";

// ExecutionContext::cancel() from another thread stops a run that would go on for hours (a loop of
// 2^61 iterations under an unlimited budget) with kCancelled naming where it stopped; a cancel
// with no run in progress, and the runs after a cancelled one, are not affected (issue 41).
TEST_P(RunTimeLoop, CancelFromAnotherThreadStopsTheRunInProgressOnly) {
  auto engine = build(kHugeLoop);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  (*ctx)->cancel();  // no run in progress: nothing to stop, and the next run is not stopped by it
  (*ctx)->set_max_loop_iterations(30);
  auto out = run(**ctx, {{"x", make_f32({2}, {1, 2})}});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("ran 30 iterations"), std::string::npos)
      << out.status().to_string();
  (*ctx)->set_max_loop_iterations(std::numeric_limits<int64_t>::max());
  const auto start = std::chrono::steady_clock::now();
  std::thread watchdog([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    (*ctx)->cancel();
  });
  out = run(**ctx, {{"x", make_f32({2}, {1, 2})}});
  watchdog.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kCancelled) << out.status().to_string();
  EXPECT_NE(out.status().message().find("cancelled (ExecutionContext::cancel) before node"),
            std::string::npos)
      << out.status().to_string();
  EXPECT_LT(seconds, 30.0);  // stopped, not run to the end (which would take years)
  (*ctx)->set_max_loop_iterations(30);
  out = run(**ctx, {{"x", make_f32({2}, {1, 2})}});  // the next run is not cancelled
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("ran 30 iterations"), std::string::npos)
      << out.status().to_string();
}

// A constant trip count near 2^61 (a 1 KB hostile model): the unroll-size check's product wrapped
// and the builder unrolled forever. Now the product is checked: the loop is too long to unroll,
// runs at run time, and its run stops at the iteration budget.
TEST_P(RunTimeLoop, AHugeConstantTripCountBuildsAsARunTimeLoopAndStopsAtTheBudget) {
  auto engine = build(kHugeLoop);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  (*ctx)->set_max_loop_iterations(30);
  auto out = run(**ctx, {{"x", make_f32({2}, {1, 2})}});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("ran 30 iterations"), std::string::npos)
      << out.status().to_string();
  EXPECT_NE(out.status().message().find("2305843009213693952"), std::string::npos)
      << out.status().to_string();
}

// The body branches on its carried value: its condition is read again each iteration.
TEST_P(RunTimeLoop, AnIfOnDataInTheBodyReadsItsConditionEachIteration) {
  auto engine = build(R"(graph g(%x: float32[n], %m: int64[]) -> (%y: float32[?]) {
  %t: bool[] = dense<1>
  %zero: float32[] = dense<0.0>
  %three: float32[] = dense<3.0>
  %two: float32[] = dense<2.0>
  %y: float32[?] = Loop(%m, %t, %x) {body=graph body(%i: int64[], %c: bool[], %a: float32[?]) -> (%c2: bool[?], %b: float32[?]) {
    %c2: bool[?] = Identity(%c)  # keep
    %s: float32[?] = ReduceSum(%a) {keepdims=0}  # sum
    %pos: bool[?] = Greater(%s, %zero)  # positive
    %b: float32[?] = If(%pos) {else_branch=graph else_body() -> (%e: float32[?]) {
      %e: float32[?] = Add(%a, %two)  # up
    }, then_branch=graph then_body() -> (%d: float32[?]) {
      %d: float32[?] = Sub(%a, %three)  # down
    }}  # branch
  }}  # loop
}
)");
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  std::vector<float> want = {4, 1};
  for (int i = 0; i < 7; ++i) {
    const float s = want[0] + want[1];
    for (float& v : want) v = s > 0 ? v - 3 : v + 2;
  }
  auto out = run(**ctx, {{"x", make_f32({2}, {4, 1})}, {"m", make_i64({}, {7})}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close(out->at("y"), make_f32({2}, want), kFp32Atol, kFp32Rtol));
}

// A running sum over x's rows, scanned in reverse, its outputs stacked along axis 1 in reverse,
// over a row count only the run knows; and a Loop over a trip count the input shapes decide
// (x's rows), whose scan output stacks each iteration's value.
TEST_P(RunTimeLoop, AScanOverALengthOnlyTheRunKnowsStacksItsOutputs) {
  auto engine = build(
      R"(graph g(%init: float32[2], %x: float32[n, 2]) -> (%last: float32[?], %all: float32[?]) {
  %last: float32[?], %all: float32[?] = Scan(%init, %x) {num_scan_inputs=1, scan_input_directions=[1], scan_output_axes=[1], scan_output_directions=[1], body=graph body(%acc: float32[?], %row: float32[?]) -> (%acc2: float32[?], %out: float32[2]) {
    %acc2: float32[?] = Add(%acc, %row)  # add
    %out: float32[2] = Identity(%acc2)  # record
  }}  # scan
}
)",
      {"x"}, {2});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ(ir::dims_to_string(*engine->tensor_symbolic_shape("all")), "[2, n]");
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  for (int64_t n : {3, 1, 7}) {
    Tensor x = random_f32({n, 2}, uint32_t(n));
    std::vector<float> acc = {10, 20}, all(size_t(2 * n));
    for (int64_t t = 0; t < n; ++t) {  // rows n-1 .. 0; output column t written at n-1-t
      for (int c = 0; c < 2; ++c) {
        acc[size_t(c)] += x.data_as<float>()[(n - 1 - t) * 2 + c];
        all[size_t(c * n + (n - 1 - t))] = acc[size_t(c)];
      }
    }
    auto out = run(**ctx, {{"init", make_f32({2}, {10, 20})}, {"x", x}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_TRUE(all_close(out->at("last"), make_f32({2}, acc), kFp32Atol, kFp32Rtol)) << n;
    EXPECT_TRUE(all_close(out->at("all"), make_f32({2, n}, all), kFp32Atol, kFp32Rtol)) << n;
  }
}

TEST_P(RunTimeLoop, ALoopOverAShapeTripCountStacksItsScanOutputs) {
  auto engine = build(R"(graph g(%x: float32[n]) -> (%y: float32[?], %hist: float32[?]) {
  %t: bool[] = dense<1>
  %s: int64[?] = Shape(%x)  # shape
  %zero: int64[] = dense<0>
  %m: int64[?] = Gather(%s, %zero) {axis=0}  # rows
  %y: float32[?], %hist: float32[?] = Loop(%m, %t, %x) {body=graph body(%i: int64[], %c: bool[], %a: float32[?]) -> (%c2: bool[?], %b: float32[?], %h: float32[?]) {
    %c2: bool[?] = Identity(%c)  # keep
    %fi: float32[?] = Cast(%i) {to=1}  # as_float
    %b: float32[?] = Add(%a, %fi)  # add
    %h: float32[?] = ReduceSum(%b) {keepdims=0}  # total
  }}  # loop
}
)");
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ(ir::dims_to_string(*engine->tensor_symbolic_shape("hist")), "[n]");
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  for (int64_t n : {4, 1, 9}) {
    Tensor x = random_f32({n}, uint32_t(n + 3));
    std::vector<float> a(x.data_as<float>(), x.data_as<float>() + n), hist;
    for (int64_t i = 0; i < n; ++i) {
      float total = 0;
      for (float& v : a) total += (v += float(i));
      hist.push_back(total);
    }
    auto out = run(**ctx, {{"x", x}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_TRUE(all_close(out->at("y"), make_f32({n}, a), kFp32Atol, kFp32Rtol)) << n;
    EXPECT_TRUE(all_close(out->at("hist"), make_f32({n}, hist), kFp32Atol, kFp32Rtol)) << n;
  }
}

// A list the body appends to (greedy decoding's tokens): y grows by one element per iteration,
// the sum of y halved, while that sum is above 1 and for at most 10 iterations. Its length is a
// data-dependent dim sized for the longest run (n + 10) and bound after each iteration.
const char* kAppend = R"(graph g(%x: float32[n]) -> (%y: float32[?], %count: int64[?]) {
  %t: bool[] = dense<1>
  %m: int64[] = dense<10>
  %half: float32[] = dense<0.5>
  %limit: float32[] = dense<1.0>
  %zero: int64[] = dense<0>
  %one: int64[] = dense<1>
  %axes: int64[1] = dense<[0]>
  %y: float32[?], %count: int64[?] = Loop(%m, %t, %x, %zero) {body=graph body(%i: int64[], %c: bool[], %a: float32[?], %k: int64[?]) -> (%c2: bool[?], %b: float32[?], %k2: int64[?]) {
    %s: float32[?] = ReduceSum(%a) {keepdims=0}  # sum
    %h: float32[?] = Mul(%s, %half)  # halve
    %h1: float32[?] = Unsqueeze(%h, %axes)  # as_list
    %b: float32[?] = Concat(%a, %h1) {axis=0}  # append
    %c2: bool[?] = Greater(%h, %limit)  # more
    %k2: int64[?] = Add(%k, %one)  # count
  }}  # decode
}
)";

TEST_P(RunTimeLoop, AListTheBodyAppendsToGrowsOneElementPerIteration) {
  auto built = build(kAppend);
  ASSERT_TRUE(built.ok()) << built.status().to_string();
  EXPECT_EQ(ir::dims_to_string(*built->tensor_symbolic_shape("y")), "[loop_len]");
  // The growing dim travels in the engine file.
  auto engine = Engine::deserialize(built->serialize());
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  for (const std::vector<float>& xs :
       std::vector<std::vector<float>>{{1, 2, 3}, {0.5f}, {100, 1}, {1e6f, 5, 5, 5}}) {
    std::vector<float> want = xs;
    int64_t count = 0;
    for (int i = 0; i < 10; ++i) {
      float sum = 0;
      for (float v : want) sum += v;
      want.push_back(sum * 0.5f);
      ++count;
      if (!(sum * 0.5f > 1)) break;
    }
    auto out = run(**ctx, {{"x", make_f32({int64_t(xs.size())}, xs)}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    ASSERT_EQ(out->at("y").shape(), (Shape{int64_t(want.size())})) << xs[0];
    EXPECT_TRUE(
        all_close(out->at("y"), make_f32({int64_t(want.size())}, want), kFp32Atol, kFp32Rtol))
        << xs[0];
    EXPECT_EQ(out->at("count").data_as<int64_t>()[0], count) << xs[0];
  }
  // A trip count from data gives no longest run to size the list for.
  auto refused = build(R"(graph g(%x: float32[n], %m: int64[]) -> (%y: float32[?]) {
  %t: bool[] = dense<1>
  %two: float32[1] = dense<[2.0]>
  %y: float32[?] = Loop(%m, %t, %x) {body=graph body(%i: int64[], %c: bool[], %a: float32[?]) -> (%c2: bool[?], %b: float32[?]) {
    %c2: bool[?] = Identity(%c)  # keep
    %b: float32[?] = Concat(%a, %two) {axis=0}  # append
  }}  # loop
}
)");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(
                "carried value 0 ('x') grows by 1 along dim 0 per iteration; kiln sizes it for "
                "the longest run, which needs a trip count the profile bounds"),
            std::string::npos)
      << refused.status().to_string();
  // A list that doubles has no longest run that a step gives.
  refused = build(R"(graph g(%x: float32[n]) -> (%y: float32[?]) {
  %t: bool[] = dense<1>
  %m: int64[] = dense<3>
  %zero: float32[] = dense<0.0>
  %y: float32[?] = Loop(%m, %t, %x) {body=graph body(%i: int64[], %c: bool[], %a: float32[?]) -> (%c2: bool[?], %b: float32[?]) {
    %b: float32[?] = Concat(%a, %a) {axis=0}  # double
    %s: float32[?] = ReduceSum(%b) {keepdims=0}  # sum
    %c2: bool[?] = Greater(%s, %zero)  # more
  }}  # loop
}
)");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("is float32[n] but the body gives float32[2*n]"),
            std::string::npos)
      << refused.status().to_string();
}

INSTANTIATE_TEST_SUITE_P(Devices, RunTimeLoop, ::testing::Values(Device::kCPU, Device::kCUDA),
                         [](const ::testing::TestParamInfo<Device>& info) {
                           return std::string(info.param == Device::kCPU ? "Cpu" : "Cuda");
                         });

StatusOr<Engine> build_cpu(const std::string& text) {
  Network net;
  KILN_ASSIGN_OR_RETURN(net.graph, ir::parse_text(text, {}));
  BuilderConfig config;
  OptimizationProfile p;
  KILN_RETURN_IF_ERROR(p.set_dimensions("x", {1, 4}, {2, 4}, {8, 4}));
  config.add_profile(p);
  return Builder(Device::kCPU).build(net, config);
}

// A graph of one Loop over x (n x 4) whose trip count m is data and whose body keeps its
// condition and computes `line` (b from a).
std::string one_loop(const std::string& line) {
  return R"(graph g(%x: float32[n, 4], %m: int64[]) -> (%y: float32[?]) {
  %t: bool[] = dense<1>
  %y: float32[?] = Loop(%m, %t, %x) {body=graph body(%i: int64[], %c: bool[], %a: float32[?]) -> (%c2: bool[?], %b: float32[?]) {
    %c2: bool[?] = Identity(%c)  # keep
    )" + line +
         R"(
  }}  # loop
}
)";
}

TEST(RunTimeLoops, ACarriedValueWhoseShapeChangesOrAScanOutputIsRefusedWithTheReason) {
  // y grows by a row per iteration, and the trip count is data: no unrolling, no fixed shape.
  auto engine = build_cpu(one_loop("%b: float32[?] = Concat(%a, %a) {axis=0}  # grow"));
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(
      engine.status().message().find(
          "loop-carried value 0 ('loop/a') is float32[n, 4] but the body gives float32[2*n, 4]"),
      std::string::npos)
      << engine.status().message();
  EXPECT_NE(engine.status().message().find("keeps its type and shape"), std::string::npos)
      << engine.status().message();
  // A scan output stacks one slice per iteration: its length is the trip count.
  engine =
      build_cpu(R"(graph g(%x: float32[n, 4], %m: int64[]) -> (%y: float32[?], %all: float32[?]) {
  %t: bool[] = dense<1>
  %y: float32[?], %all: float32[?] = Loop(%m, %t, %x) {body=graph body(%i: int64[], %c: bool[], %a: float32[?]) -> (%c2: bool[?], %b: float32[?], %s: float32[?]) {
    %c2: bool[?] = Identity(%c)  # keep
    %b: float32[?] = Neg(%a)  # neg
    %s: float32[?] = Identity(%b)  # record
  }}  # loop
}
)");
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find(
                "its trip count ('m') is computed from tensor data at run time, and its "
                "body has 1 scan output(s)"),
            std::string::npos)
      << engine.status().message();
}

// Issue 41, class 8: an enumerated attribute outside what ONNX allows is refused by name before
// anything reads it, in the main graph and in a body alike (ops/attribute_domains.h).
TEST(RunTimeLoops, AttributeValuesOnnxForbidsAreRefusedByName) {
  auto refused = [](const std::string& text, const std::string& phrase) {
    auto engine = build_cpu(text);
    ASSERT_FALSE(engine.ok()) << phrase;
    EXPECT_EQ(engine.status().code(), StatusCode::kInvalidModel) << engine.status().to_string();
    EXPECT_NE(engine.status().message().find(phrase), std::string::npos)
        << engine.status().to_string();
  };
  refused(
      R"(graph g(%init: float32[2], %x: float32[3, 2]) -> (%last: float32[2], %all: float32[3, 2]) {
  %last: float32[2], %all: float32[3, 2] = Scan(%init, %x) {num_scan_inputs=1, scan_input_directions=[2], body=graph body(%acc: float32[2], %row: float32[2]) -> (%acc2: float32[2], %out: float32[2]) {
    %acc2: float32[2] = Add(%acc, %row)  # add
    %out: float32[2] = Identity(%acc2)  # out
  }}  # scan
}
)",
      "node 'scan' (Scan) attribute scan_input_directions[0] is 2; ONNX allows 0 or 1");
  refused(R"(graph g(%x: float32[2, 3]) -> (%y: float32[?]) {
  %s: float32[2, 3] = SequenceConstruct(%x, %x)  # seq
  %y: float32[?] = ConcatFromSequence(%s) {axis=0, new_axis=7}  # cat
}
)",
          "node 'cat' (ConcatFromSequence) attribute new_axis is 7; ONNX allows 0 or 1");
  // Inside a Loop's body, which check_supported reads too.
  refused(one_loop("%b: float32[?] = ReduceSum(%a) {keepdims=3}  # sum"),
          "node 'sum' (ReduceSum) attribute keepdims is 3");
}

// check_supported reads the main graph; a body's nodes are checked as the build brings them in.
TEST(RunTimeLoops, ABodyNodeOfAnUnknownOpOrArityIsRefusedByName) {
  auto engine = build_cpu(one_loop("%b: float32[?] = Frobnicate(%a)  # frob"));
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("node 'loop/frob' (Frobnicate) in domain 'ai.onnx'"),
            std::string::npos)
      << engine.status().to_string();
  EXPECT_NE(engine.status().message().find("uses an op kiln does not support"), std::string::npos)
      << engine.status().to_string();
  engine = build_cpu(one_loop("%b: float32[?] = Add(%a)  # add"));
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find(
                "node 'loop/add' (Add) has 1 inputs, expected 2..2 (a node of a subgraph)"),
            std::string::npos)
      << engine.status().to_string();
}

TEST(RunTimeLoops, APlanWhoseLoopIsBrokenIsRefused) {
  auto engine = build_cpu(one_loop("%b: float32[?] = Neg(%a)  # neg"));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto tamper = [&](auto edit) {
    plan::Plan p = engine->plan();
    for (size_t n = 0; n < p.graph.nodes.size(); ++n) edit(p, n);
    return Engine::from_plan(p).status();
  };
  // The LoopEnd no longer takes the LoopBegin's outputs: nothing pairs them.
  Status st = tamper([](plan::Plan& p, size_t n) {
    ir::Node& node = p.graph.nodes[n];
    if (node.op_type == "LoopEnd")
      std::swap(node.inputs[node.inputs.size() - 1], node.inputs[node.inputs.size() - 3]);
  });
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("run-time loops pair up"), std::string::npos) << st.to_string();
  // A graph output read from the body instead of the LoopEnd: the last iteration may not have
  // written it (no iteration at all), or a later one would have overwritten it.
  plan::Plan p = engine->plan();
  int end = -1;
  for (size_t n = 0; n < p.graph.nodes.size(); ++n) {
    if (p.graph.nodes[n].op_type == "LoopEnd") end = int(n);
  }
  ASSERT_GE(end, 0);
  const ir::Node& loop_end = p.graph.nodes[size_t(end)];
  const int body_value =
      loop_end
          .inputs[ops::LoopEndLayout::of(loop_end.inputs.size(), loop_end.outputs.size())->next(0)];
  const int y = p.graph.outputs[0];
  p.graph.outputs[0] = body_value;
  std::swap(p.values[size_t(y)], p.values[size_t(body_value)]);  // the body value's slot to y
  auto bad = Engine::from_plan(p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("is a graph output"), std::string::npos)
      << bad.status().to_string();
  // A LoopBegin planned with a kernel id instead of the run's control.
  st = tamper([](plan::Plan& p, size_t n) {
    if (p.graph.nodes[n].op_type == "LoopBegin") p.nodes[n].impl = "cpu.Neg";
  });
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("does not implement LoopBegin"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace kiln::testing
