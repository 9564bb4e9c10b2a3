// Control flow laid out at build time (issue 15, item 3): an If with a condition known at build
// time (exporters branch on a tensor's rank or size, or on a constant) runs as the branch it takes,
// its nodes inlined in place; a Loop with a known trip count whose body keeps its condition true,
// and a Scan of known length, are unrolled, their loop-carried values threaded through copies of
// the body (shapes that grow per iteration included). An If on data runs both branches' nodes
// under its condition and picks the result of the one that ran. A Loop whose trip count or
// condition is data, and a Scan over a length that changes at run time, run at run time:
// tests/loops_test.cc.
#include <gtest/gtest.h>

#include <string>

#include "ir/text.h"
#include "kiln.h"
#include "model_util.h"
#include "plan/plan.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

StatusOr<Engine> build(const std::string& text) {
  Network net;
  KILN_ASSIGN_OR_RETURN(net.graph, ir::parse_text(text, {}));
  BuilderConfig config;
  OptimizationProfile p;
  KILN_RETURN_IF_ERROR(p.set_dimensions("x", {1, 4}, {2, 4}, {8, 4}));
  config.add_profile(p);
  return Builder().build(net, config);
}

// x's rank decides: 2 takes then (Relu), anything else Neg. The else branch also passes x through.
const char* kByRank = R"(graph g(%x: float32[n, 4]) -> (%y: float32[?], %z: float32[?]) {
  %two: int64[] = dense<2>
  %s: int64[?] = Shape(%x)  # shape
  %r: int64[?] = Size(%s)  # rank
  %c: bool[?] = Equal(%r, %two)  # is_matrix
  %y: float32[?], %z: float32[?] = If(%c) {else_branch=graph else_body() -> (%e: float32[?], %x: float32[?]) {
    %e: float32[?] = Neg(%x)  # neg
  }, then_branch=graph then_body() -> (%t: float32[?], %k: float32[1]) {
    %k: float32[1] = dense<3.0>
    %t: float32[?] = Relu(%x)  # relu
  }}  # branch
}
)";

TEST(ControlFlow, AnIfOnTheRankRunsAsTheBranchItTakes) {
  auto engine = build(kByRank);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  bool relu = false;
  for (const LayerInfo& l : engine->layers()) {
    EXPECT_NE(l.op_type, "If");
    EXPECT_NE(l.op_type, "Neg") << "the branch not taken is gone";
    relu |= l.op_type == "Relu" && l.name == "branch/relu";
  }
  EXPECT_TRUE(relu);
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  Tensor x = random_f32({3, 4}, 5);
  auto out = (*ctx)->run({{"x", x}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->at("y").shape(), (Shape{3, 4}));
  for (int64_t i = 0; i < 12; ++i) {
    EXPECT_EQ(out->at("y").data_as<float>()[i], std::max(x.data_as<float>()[i], 0.f)) << i;
  }
  ASSERT_EQ(out->at("z").shape(), (Shape{1}));
  EXPECT_EQ(out->at("z").data_as<float>()[0], 3.f);
}

StatusOr<Engine> build_on(Device device, const std::string& text) {
  Network net;
  KILN_ASSIGN_OR_RETURN(net.graph, ir::parse_text(text, {}));
  BuilderConfig config;
  OptimizationProfile p;
  KILN_RETURN_IF_ERROR(p.set_dimensions("x", {1}, {6}, {16}));
  config.add_profile(p);
  return Builder(device).build(net, config);
}

// The condition is data (whether x sums above zero): the run reads it and runs one branch. The
// branches give different sizes, as torchvision's batched_nms does (no boxes: an empty list; else
// the kept ones): then the positions of x's positive elements, else x's length.
const char* kOnData = R"(graph g(%x: float32[n]) -> (%y: int64[?], %z: float32[?]) {
  %zero: float32[] = dense<0.0>
  %s: float32[?] = ReduceSum(%x) {keepdims=0}  # sum
  %c: bool[?] = Greater(%s, %zero)  # positive
  %y: int64[?], %z: float32[?] = If(%c) {else_branch=graph else_body() -> (%len: int64[?], %neg: float32[?]) {
    %len: int64[?] = Shape(%x)  # len
    %neg: float32[?] = Neg(%x)  # neg
  }, then_branch=graph then_body() -> (%idx: int64[?], %r: float32[?]) {
    %p: bool[?] = Greater(%x, %zero)  # mask
    %nz: int64[?] = NonZero(%p)  # nonzero
    %one: int64[1] = dense<0>
    %idx: int64[?] = Squeeze(%nz, %one)  # squeeze
    %r: float32[?] = Relu(%x)  # relu
  }}  # branch
}
)";

void run_on_data(Engine& engine, bool graph, const std::string& where) {
  auto ctx = engine.create_execution_context();
  ASSERT_TRUE(ctx.ok());
  if (graph) (*ctx)->set_use_cuda_graph(true);
  const std::vector<std::vector<float>> runs = {{1, -2, 3, 4, -5, 6},
                                                {-1, -2, 3, -4},
                                                {2},
                                                {-2},
                                                {0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1}};
  for (const auto& xs : runs) {
    Tensor x = Tensor::from_vector(DType::kFloat32, Shape{int64_t(xs.size())}, xs);
    float sum = 0;
    for (float v : xs) sum += v;
    const std::string at =
        where + " x of " + std::to_string(xs.size()) + " summing to " + std::to_string(sum);
    auto out = (*ctx)->run({{"x", x}});
    ASSERT_TRUE(out.ok()) << at << ": " << out.status().to_string();
    const Tensor& y = out->at("y");
    const Tensor& z = out->at("z");
    std::vector<int64_t> want_y;
    if (sum > 0) {
      for (size_t i = 0; i < xs.size(); ++i) {
        if (xs[i] > 0) want_y.push_back(int64_t(i));
      }
    } else {
      want_y = {int64_t(xs.size())};
    }
    ASSERT_EQ(y.shape(), (Shape{int64_t(want_y.size())})) << at;
    for (size_t i = 0; i < want_y.size(); ++i)
      EXPECT_EQ(y.data_as<int64_t>()[i], want_y[i]) << at << " y " << i;
    ASSERT_EQ(z.shape(), (Shape{int64_t(xs.size())})) << at;
    for (size_t i = 0; i < xs.size(); ++i) {
      EXPECT_EQ(z.data_as<float>()[i], sum > 0 ? std::max(xs[i], 0.f) : -xs[i]) << at << " z " << i;
    }
  }
}

TEST(ControlFlow, AnIfOnDataRunsTheBranchItsConditionPicks) {
  auto engine = build_on(Device::kCPU, kOnData);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  bool select = false;
  for (const LayerInfo& l : engine->layers()) {
    EXPECT_NE(l.op_type, "If");
    select |= l.op_type == "SelectBranch";
    // Each branch's layers say which value of the condition runs them; the rest run always.
    const bool then = l.name.rfind("branch/then/", 0) == 0,
               other = l.name.rfind("branch/else/", 0) == 0;
    if (then || other) {
      ASSERT_EQ(l.runs_when.size(), 1u) << l.name;
      EXPECT_EQ(l.runs_when[0].first, "c") << l.name;
      EXPECT_EQ(l.runs_when[0].second, then) << l.name;
    } else {
      EXPECT_TRUE(l.runs_when.empty()) << l.name;
    }
  }
  EXPECT_TRUE(select);
  run_on_data(*engine, false, "cpu");
  // The guards travel in the engine file.
  auto loaded = Engine::deserialize(engine->serialize());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  run_on_data(*loaded, false, "cpu, loaded");
}

TEST(ControlFlow, AnIfOnDataRunsOnCuda) {
  Status why = device_available(Device::kCUDA);
  if (!why.ok()) GTEST_SKIP() << why.message();
  auto engine = build_on(Device::kCUDA, kOnData);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  run_on_data(*engine, false, "cuda");
  run_on_data(*engine, true, "cuda, graphs asked for");
}

TEST(ControlFlow, APlanWhoseGuardsAreWrongIsRefused) {
  auto engine = build_on(Device::kCPU, kOnData);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  // A branch node whose guard names a float value.
  plan::Plan p = engine->plan();
  int guarded = -1;
  for (size_t n = 0; n < p.graph.nodes.size(); ++n) {
    if (!p.graph.nodes[n].guards.empty()) guarded = int(n);
  }
  ASSERT_GE(guarded, 0);
  p.graph.nodes[size_t(guarded)].guards[0].cond = p.graph.inputs[0];
  auto bad = Engine::from_plan(p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("a guard is a bool scalar computed before the node"),
            std::string::npos)
      << bad.status().to_string();
  // A branch node that lost its guard would run whatever the condition says.
  p = engine->plan();
  for (ir::Node& n : p.graph.nodes) {
    if (n.op_type == "Squeeze") n.guards.clear();
  }
  bad = Engine::from_plan(p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("a node reads a branch's values only inside that branch"),
            std::string::npos)
      << bad.status().to_string();
  // Issue 41, class 5: the SelectBranch's then- and else-values swapped (each read when its branch
  // did not run), and a graph output taken from inside a branch (stale bytes on the other path).
  p = engine->plan();
  int select = -1;
  for (size_t n = 0; n < p.graph.nodes.size(); ++n) {
    if (p.graph.nodes[n].op_type == "SelectBranch") select = int(n);
  }
  ASSERT_GE(select, 0);
  ir::Node& sel = p.graph.nodes[size_t(select)];
  const size_t k = sel.outputs.size();
  std::swap(sel.inputs[1], sel.inputs[1 + k]);
  bad = Engine::from_plan(p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(
                "a SelectBranch takes each value from the branch that computes it"),
            std::string::npos)
      << bad.status().to_string();
  p = engine->plan();
  const ir::Node& chooser = p.graph.nodes[size_t(select)];
  const int branch_value = chooser.inputs[1], chosen = chooser.outputs[0];
  for (int& o : p.graph.outputs) o = o == chosen ? branch_value : o;
  p.graph.values[size_t(branch_value)].name.swap(p.graph.values[size_t(chosen)].name);
  bad = Engine::from_plan(p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("graph outputs are written whichever way the run goes"),
            std::string::npos)
      << bad.status().to_string();
}

TEST(ControlFlow, AnIfOnDataWhoseBranchesDisagreeOnRankIsRefused) {
  auto engine = build_on(Device::kCPU, R"(graph g(%x: float32[n], %c: bool[]) -> (%y: float32[?]) {
  %y: float32[?] = If(%c) {else_branch=graph else_body() -> (%e: float32[?]) {
    %e: float32[?] = Neg(%x)  # neg
  }, then_branch=graph then_body() -> (%t: float32[?]) {
    %one: int64[1] = dense<0>
    %t: float32[?] = Unsqueeze(%x, %one)  # unsqueeze
  }}  # branch
}
)");
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("the branches give ranks 2 and 1"), std::string::npos)
      << engine.status().message();
}

// y grows by x's row every iteration (a loop-carried shape that changes: [1, 4], [2, 4], ...), s
// adds the iteration number to a running sum, and the scan output stacks each iteration's sum.
const char* kGrowingLoop =
    R"(graph g(%x: float32[n, 4], %m: int64[]) -> (%y: float32[?], %s: float32[?], %hist: float32[?]) {
  %t: bool[] = dense<1>
  %s0: float32[] = dense<0.0>
  %y0: float32[1, 4] = dense<[1.0, 2.0, 3.0, 4.0]>
  %y: float32[?], %s: float32[?], %hist: float32[?] = Loop(%m, %t, %y0, %s0) {body=graph body(%i: int64[], %c: bool[], %y_in: float32[?], %s_in: float32[?]) -> (%c_out: bool[?], %y_out: float32[?], %s_out: float32[?], %scan: float32[?]) {
    %c_out: bool[?] = Identity(%c)  # keep
    %row: float32[?] = ReduceSum(%x) {axes=[0], keepdims=1}  # row
    %y_out: float32[?] = Concat(%y_in, %row) {axis=0}  # grow
    %fi: float32[?] = Cast(%i) {to=1}  # as_float
    %s_out: float32[?] = Add(%s_in, %fi)  # sum
    %scan: float32[?] = Identity(%s_out)  # record
  }}  # loop
}
)";

TEST(ControlFlow, ALoopWithAKnownTripCountUnrollsAndItsCarriedShapesGrow) {
  Network net;
  auto g = ir::parse_text(kGrowingLoop, {});
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  net.graph = std::move(*g);
  BuilderConfig config;
  OptimizationProfile p;
  ASSERT_TRUE(p.set_dimensions("x", {1, 4}, {2, 4}, {8, 4}).ok());
  ASSERT_TRUE(
      p.set_shape_values("m", {3}, {3}, {3}).ok());  // the trip count, a shape value fixed at 3
  config.add_profile(p);
  auto engine = Builder().build(net, config);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  for (const LayerInfo& l : engine->layers()) EXPECT_NE(l.op_type, "Loop");
  EXPECT_EQ(ir::dims_to_string(*engine->tensor_symbolic_shape("y")), "[4, 4]");
  EXPECT_EQ(ir::dims_to_string(*engine->tensor_symbolic_shape("hist")), "[3]");
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  Tensor x = random_f32({2, 4}, 7);
  auto out = (*ctx)->run({{"x", x}, {"m", make_i64({}, {3})}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->at("y").shape(), (Shape{4, 4}));
  for (int64_t r = 1; r < 4; ++r) {
    for (int64_t c = 0; c < 4; ++c) {
      const float want = x.data_as<float>()[c] + x.data_as<float>()[4 + c];
      EXPECT_NEAR(out->at("y").data_as<float>()[r * 4 + c], want, 1e-6) << r << "," << c;
    }
  }
  EXPECT_EQ(out->at("s").data_as<float>()[0], 3.f);  // 0 + 1 + 2
  ASSERT_EQ(out->at("hist").shape(), (Shape{3}));
  EXPECT_EQ(out->at("hist").data_as<float>()[0], 0.f);
  EXPECT_EQ(out->at("hist").data_as<float>()[1], 1.f);
  EXPECT_EQ(out->at("hist").data_as<float>()[2], 3.f);
  // A run given another trip count than the engine was built for is refused by name.
  out = (*ctx)->run({{"x", x}, {"m", make_i64({}, {4})}});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(
      out.status().message().find("input 'm' = [4], but the engine was built for the value [3]"),
      std::string::npos)
      << out.status().to_string();
}

// A running sum over x's rows, scanned in reverse, its outputs stacked along axis 1 in reverse.
TEST(ControlFlow, AScanOfKnownLengthUnrollsInEitherDirection) {
  Network net;
  auto g = ir::parse_text(
      R"(graph g(%init: float32[2], %x: float32[3, 2]) -> (%last: float32[?], %all: float32[?]) {
  %last: float32[?], %all: float32[?] = Scan(%init, %x) {num_scan_inputs=1, scan_input_directions=[1], scan_output_axes=[1], scan_output_directions=[1], body=graph body(%acc: float32[?], %row: float32[?]) -> (%acc2: float32[?], %out: float32[?]) {
    %acc2: float32[?] = Add(%acc, %row)  # add
    %out: float32[?] = Identity(%acc2)  # record
  }}  # scan
}
)",
      {});
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  net.graph = std::move(*g);
  auto engine = Builder().build(net, BuilderConfig());
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  auto out = (*ctx)->run({{"init", make_f32({2}, {10.f, 20.f})},
                          {"x", make_f32({3, 2}, {1.f, 2.f, 3.f, 4.f, 5.f, 6.f})}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  // Rows taken 2, 1, 0: sums (15, 26), (18, 30), (19, 32); stacked on axis 1, last first.
  EXPECT_TRUE(all_close(out->at("last"), make_f32({2}, {19.f, 32.f}), 0, 0));
  EXPECT_TRUE(
      all_close(out->at("all"), make_f32({2, 3}, {19.f, 18.f, 15.f, 32.f, 30.f, 26.f}), 0, 0))
      << out->at("all").data_as<float>()[0] << " " << out->at("all").data_as<float>()[1];
}

}  // namespace
}  // namespace kiln::testing
