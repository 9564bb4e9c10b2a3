// Shape-value inputs (issue 15, item 2; TensorRT's shape tensors): an integer input whose values
// decide shapes (TopK's K, an Expand target, a Range limit, Pad's pads) is given at run time, each
// element in the range its profile gives (OptimizationProfile::set_shape_values). The build proves
// the model over those ranges, the run reads the values in host memory and sizes everything by
// them, a value outside the profile (or unlike the one value a float input was built for) is
// refused by name, and the engine file keeps them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ir/text.h"
#include "kiln.h"
#include "model_util.h"
#include "plan/plan.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

// vals/idx = TopK(x, k) along dim 1; e = a [1, 4] row expanded to `shape`; r = Range(0, lim, 1);
// p = x padded by `pads` (constant 0).
const char* kModel =
    R"(graph g(%x: float32[n, 10], %k: int64[1], %shape: int64[2], %lim: int64[], %pads: int64[4])
    -> (%vals: float32[?], %idx: int64[?], %e: float32[?], %r: int64[?], %p: float32[?]) {
  %row: float32[1, 4] = dense<[1.0, 2.0, 3.0, 4.0]>
  %zero: int64[] = dense<0>
  %one: int64[] = dense<1>
  %vals: float32[?], %idx: int64[?] = TopK(%x, %k) {axis=1}  # topk
  %e: float32[?] = Expand(%row, %shape)  # expand
  %r: int64[?] = Range(%zero, %lim, %one)  # range
  %p: float32[?] = Pad(%x, %pads)  # pad
}
)";

StatusOr<Network> parse_model(const char* text = kModel) {
  Network net;
  KILN_ASSIGN_OR_RETURN(net.graph, ir::parse_text(text, {}));
  return net;
}

OptimizationProfile ranged_profile() {
  OptimizationProfile p;
  EXPECT_TRUE(p.set_dimensions("x", {1, 10}, {2, 10}, {4, 10}).ok());
  EXPECT_TRUE(p.set_shape_values("k", {1}, {3}, {5}).ok());
  EXPECT_TRUE(p.set_shape_values("shape", {1, 4}, {2, 4}, {6, 4}).ok());  // dim 1 fixed at 4
  EXPECT_TRUE(p.set_shape_values("lim", {0}, {5}, {50}).ok());
  EXPECT_TRUE(p.set_shape_values("pads", {0, 0, 0, 0}, {0, 1, 0, 1}, {2, 3, 2, 3}).ok());
  return p;
}

StatusOr<Engine> build(Device device, const OptimizationProfile& p) {
  KILN_ASSIGN_OR_RETURN(Network net, parse_model());
  BuilderConfig config;
  config.add_profile(p);
  return Builder(device).build(net, config);
}

Tensor input(int64_t n) {
  std::vector<float> v(size_t(n * 10));
  for (int64_t i = 0; i < n * 10; ++i) v[size_t(i)] = float((i * 7) % 23) - 5.0f;
  return make_f32({n, 10}, v);
}

struct Values {
  int64_t k, rows, lim;
  std::vector<int64_t> pads;  // begin rows, begin cols, end rows, end cols
};

std::map<std::string, Tensor> feeds(int64_t n, const Values& v) {
  return {{"x", input(n)},
          {"k", make_i64({1}, {v.k})},
          {"shape", make_i64({2}, {v.rows, 4})},
          {"lim", make_i64({}, {v.lim})},
          {"pads", make_i64({4}, v.pads)}};
}

// What the model computes, by hand.
void expect_outputs(int64_t n, const Values& v, const std::map<std::string, Tensor>& out,
                    const std::string& where) {
  const Tensor x = input(n);
  const float* xs = x.data_as<float>();
  ASSERT_EQ(out.at("vals").shape(), (Shape{n, v.k})) << where;
  ASSERT_EQ(out.at("idx").shape(), (Shape{n, v.k})) << where;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<std::pair<float, int64_t>> row;
    for (int64_t j = 0; j < 10; ++j) row.push_back({xs[i * 10 + j], j});
    std::stable_sort(row.begin(), row.end(), [](auto a, auto b) { return a.first > b.first; });
    for (int64_t j = 0; j < v.k; ++j) {
      EXPECT_EQ(out.at("vals").data_as<float>()[i * v.k + j], row[size_t(j)].first) << where;
      EXPECT_EQ(out.at("idx").data_as<int64_t>()[i * v.k + j], row[size_t(j)].second) << where;
    }
  }
  ASSERT_EQ(out.at("e").shape(), (Shape{v.rows, 4})) << where;
  for (int64_t i = 0; i < v.rows * 4; ++i)
    EXPECT_EQ(out.at("e").data_as<float>()[i], float(i % 4 + 1)) << where;
  ASSERT_EQ(out.at("r").shape(), (Shape{v.lim})) << where;
  for (int64_t i = 0; i < v.lim; ++i) EXPECT_EQ(out.at("r").data_as<int64_t>()[i], i) << where;
  const int64_t pr = n + v.pads[0] + v.pads[2], pc = 10 + v.pads[1] + v.pads[3];
  ASSERT_EQ(out.at("p").shape(), (Shape{pr, pc})) << where;
  for (int64_t i = 0; i < pr; ++i) {
    for (int64_t j = 0; j < pc; ++j) {
      const int64_t si = i - v.pads[0], sj = j - v.pads[1];
      const float want = si >= 0 && si < n && sj >= 0 && sj < 10 ? xs[si * 10 + sj] : 0.f;
      EXPECT_EQ(out.at("p").data_as<float>()[i * pc + j], want) << where << " at " << i << "," << j;
    }
  }
}

const std::vector<std::pair<int64_t, Values>> kRuns = {{2, {3, 2, 5, {0, 1, 0, 1}}},
                                                       {4, {5, 6, 50, {2, 3, 2, 3}}},
                                                       {1, {1, 1, 0, {0, 0, 0, 0}}},
                                                       {3, {2, 3, 17, {1, 0, 2, 3}}},
                                                       {2, {3, 2, 5, {0, 1, 0, 1}}}};

TEST(ShapeValues, ValuesGivenAtRunTimeSizeEveryOutput) {
  auto engine = build(Device::kCPU, ranged_profile());
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  for (const char* name : {"k", "shape", "lim", "pads"})
    EXPECT_TRUE(engine->is_shape_inference_io(name)) << name;
  EXPECT_FALSE(engine->is_shape_inference_io("x"));
  EXPECT_FALSE(engine->is_shape_inference_io("vals"));
  // The outputs' formulas name the values' symbols; shape's dim 1 is fixed at 4 by the profile.
  EXPECT_EQ(ir::dims_to_string(*engine->tensor_symbolic_shape("vals")), "[n, k_0]");
  EXPECT_EQ(ir::dims_to_string(*engine->tensor_symbolic_shape("e")), "[shape_0, 4]");
  EXPECT_EQ(ir::dims_to_string(*engine->tensor_symbolic_shape("r")), "[lim]");
  EXPECT_EQ(*engine->profile_tensor_values("pads", 0, OptProfileSelector::kMAX),
            (std::vector<int64_t>{2, 3, 2, 3}));
  EXPECT_EQ(*engine->profile_tensor_values("k", 0, OptProfileSelector::kOPT),
            (std::vector<int64_t>{3}));
  EXPECT_FALSE(engine->profile_tensor_values("x", 0, OptProfileSelector::kMIN).ok());
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  for (const auto& [n, v] : kRuns) {
    const std::string where = "n=" + std::to_string(n) + " k=" + std::to_string(v.k) +
                              " rows=" + std::to_string(v.rows) + " lim=" + std::to_string(v.lim);
    auto out = (*ctx)->run(feeds(n, v));
    ASSERT_TRUE(out.ok()) << where << ": " << out.status().to_string();
    expect_outputs(n, v, *out, where);
  }
}

// execute() with addresses: the values are read from host memory when shapes resolve and again by
// every run, so rewriting them in place changes the next run's shapes.
TEST(ShapeValues, ExecuteRereadsTheValuesEveryRun) {
  auto engine = build(Device::kCPU, ranged_profile());
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  ExecutionContext& c = **ctx;
  std::map<std::string, Tensor> in = feeds(2, kRuns[0].second);
  for (auto& [name, t] : in) {
    ASSERT_TRUE(c.set_input_shape(name, t.shape()).ok());
    ASSERT_TRUE(c.set_tensor_address(name, t.data()).ok());
  }
  EXPECT_EQ(*c.tensor_shape("vals"), (Shape{2, 3}));
  EXPECT_EQ(*c.tensor_shape("r"), (Shape{5}));
  GrowingOutputAllocator alloc[5] = {
      GrowingOutputAllocator(Device::kCPU), GrowingOutputAllocator(Device::kCPU),
      GrowingOutputAllocator(Device::kCPU), GrowingOutputAllocator(Device::kCPU),
      GrowingOutputAllocator(Device::kCPU)};
  const char* outs[5] = {"vals", "idx", "e", "r", "p"};
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(c.set_output_allocator(outs[i], &alloc[i]).ok());
  ASSERT_TRUE(c.execute().ok());
  EXPECT_EQ(alloc[0].shape(), (Shape{2, 3}));
  EXPECT_EQ(alloc[3].shape(), (Shape{5}));
  in.at("k").data_as<int64_t>()[0] = 4;
  in.at("lim").data_as<int64_t>()[0] = 9;
  Status st = c.execute();
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(alloc[0].shape(), (Shape{2, 4}));
  EXPECT_EQ(alloc[3].shape(), (Shape{9}));
  EXPECT_EQ(*c.tensor_shape("idx"), (Shape{2, 4}));
  for (int64_t i = 0; i < 9; ++i) EXPECT_EQ(static_cast<int64_t*>(alloc[3].data())[i], i);
  // Without its values bound, the input is named.
  ASSERT_TRUE(c.set_tensor_address("k", nullptr).ok());
  st = c.infer_shapes();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("input 'k' holds shape values"), std::string::npos) << st.to_string();
}

TEST(ShapeValues, ValuesOutsideTheProfileAreRefusedByName) {
  auto engine = build(Device::kCPU, ranged_profile());
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  auto out = (*ctx)->run(feeds(2, {6, 2, 5, {0, 0, 0, 0}}));
  ASSERT_FALSE(out.ok());
  EXPECT_NE(
      out.status().message().find(
          "input 'k' element 0 (k_0) = 6 is outside the range [1, 5] of optimization profile 0"),
      std::string::npos)
      << out.status().to_string();
  // shape's dim 1 is fixed at 4 by every profile.
  std::map<std::string, Tensor> in = feeds(2, {3, 2, 5, {0, 0, 0, 0}});
  in["shape"] = make_i64({2}, {2, 3});
  out = (*ctx)->run(in);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find(
                "input 'shape' element 1 = 3, but the engine's profiles fix it at 4"),
            std::string::npos)
      << out.status().to_string();
  // A good run after the refusals.
  out = (*ctx)->run(feeds(3, kRuns[3].second));
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  expect_outputs(3, kRuns[3].second, *out, "after refusals");
}

// The proof covers every value in the ranges: a K that may pass the axis is refused at build,
// naming the symbol and the range that would build.
TEST(ShapeValues, TheProofCoversTheRanges) {
  OptimizationProfile p = ranged_profile();
  ASSERT_TRUE(p.set_shape_values("k", {1}, {3}, {12}).ok());
  auto engine = build(Device::kCPU, p);
  ASSERT_FALSE(engine.ok());
  const std::string msg = engine.status().message();
  EXPECT_NE(msg.find("node 'topk'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("k_0 in [1, 12]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("k_0 in [1, 10] would build"), std::string::npos) << msg;
}

TEST(ShapeValues, BadProfilesAreRefusedByName) {
  OptimizationProfile p;
  EXPECT_FALSE(p.set_shape_values("k", {3}, {2}, {5}).ok());
  EXPECT_FALSE(p.set_shape_values("k", {1, 2}, {2}, {5}).ok());
  struct Case {
    std::function<void(OptimizationProfile&)> edit;
    std::string want;
  };
  const std::vector<Case> cases = {
      {[](OptimizationProfile& q) { (void)q.set_shape_values("nope", {1}, {1}, {2}); },
       "'nope', which is not an input"},
      {[](OptimizationProfile& q) {
         (void)q.set_shape_values("pads", {0, 0}, {0, 0}, {1, 1});
       },
       "gives 2 shape values for input 'pads', which has 4 elements"},
      {[](OptimizationProfile& q) {
         (void)q.set_shape_values("x", make_f32({1, 10}, std::vector<float>(10, 0.f)));
       },
       "must fix its shape"},
      {[](OptimizationProfile& q) { (void)q.set_shape_values("k", make_f32({1}, {2.f})); },
       "the shape value given for input 'k' is float32[1]; the input is int64[1]"},
  };
  for (const Case& c : cases) {
    OptimizationProfile q = ranged_profile();
    c.edit(q);
    auto engine = build(Device::kCPU, q);
    ASSERT_FALSE(engine.ok()) << c.want;
    EXPECT_NE(engine.status().message().find(c.want), std::string::npos)
        << engine.status().to_string();
  }
  // Every profile gives values for the same inputs.
  auto net = parse_model();
  ASSERT_TRUE(net.ok());
  BuilderConfig config;
  config.add_profile(ranged_profile());
  OptimizationProfile second;
  ASSERT_TRUE(second.set_dimensions("x", {5, 10}, {6, 10}, {8, 10}).ok());
  config.add_profile(second);
  auto engine = Builder(Device::kCPU).build(*net, config);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("profile 1 gives no shape values for input"),
            std::string::npos)
      << engine.status().to_string();
}

// A float input given one value (Resize's scales): the engine is built for it, and a run given
// another is refused with both values.
TEST(ShapeValues, AFloatInputTakesTheOneValueItWasBuiltFor) {
  const char* model = R"(graph g(%x: float32[1, 1, 2, 2], %scales: float32[4]) -> (%y: float32[?]) {
  %y: float32[?] = Resize(%x, _, %scales) {mode="nearest"}  # up
}
)";
  auto net = parse_model(model);
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  BuilderConfig config;
  OptimizationProfile p;
  ASSERT_TRUE(p.set_shape_values("scales", make_f32({4}, {1.f, 1.f, 2.f, 3.f})).ok());
  config.add_profile(p);
  auto engine = Builder(Device::kCPU).build(*net, config);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_TRUE(engine->is_shape_inference_io("scales"));
  EXPECT_EQ(*engine->tensor_shape("y"), (Shape{1, 1, 4, 6}));
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  const Tensor x = make_f32({1, 1, 2, 2}, {1.f, 2.f, 3.f, 4.f});
  auto out = (*ctx)->run({{"x", x}, {"scales", make_f32({4}, {1.f, 1.f, 2.f, 3.f})}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->at("y").shape(), (Shape{1, 1, 4, 6}));
  EXPECT_EQ(out->at("y").data_as<float>()[23], 4.f);
  out = (*ctx)->run({{"x", x}, {"scales", make_f32({4}, {1.f, 1.f, 2.f, 2.f})}});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(
      out.status().message().find(
          "input 'scales' = [1, 1, 2, 2], but the engine was built for the value [1, 1, 2, 3]"),
      std::string::npos)
      << out.status().to_string();
}

TEST(ShapeValues, TheEngineFileKeepsThemAndTheVerifierChecksThem) {
  auto engine = build(Device::kCPU, ranged_profile());
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto loaded = Engine::deserialize(engine->serialize());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_TRUE(loaded->is_shape_inference_io("lim"));
  EXPECT_EQ(*loaded->profile_tensor_values("lim", 0, OptProfileSelector::kMAX),
            (std::vector<int64_t>{50}));
  auto ctx = loaded->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  auto out = (*ctx)->run(feeds(4, kRuns[1].second));
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  expect_outputs(4, kRuns[1].second, *out, "loaded");

  // A plan whose profile ranges a value wider than its symbol's box is refused.
  plan::Plan p = engine->plan();
  ASSERT_FALSE(p.profiles[0].values.empty());
  p.profiles[0].values[0].max[0] += 100;
  auto bad = Engine::from_plan(p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("every profile ranges each shape value as its symbol"),
            std::string::npos)
      << bad.status().to_string();
  // A plan whose shape-value symbol collides with an input dim's.
  p = engine->plan();
  for (auto& sv : p.shape_values) {
    for (auto& sym : sv.symbols) {
      if (!sym.empty()) sym = "n";
    }
  }
  bad = Engine::from_plan(p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("shape-value symbols are new symbols"), std::string::npos)
      << bad.status().to_string();
}

// On CUDA the values stay in host memory; the run and the graph cache follow them.
TEST(ShapeValues, CudaGivesTheSameOutputs) {
  Status why = device_available(Device::kCUDA);
  if (!why.ok()) GTEST_SKIP() << why.message();
  auto engine = build(Device::kCUDA, ranged_profile());
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  for (bool graph : {false, true}) {
    auto ctx = engine->create_execution_context();
    ASSERT_TRUE(ctx.ok());
    (*ctx)->set_use_cuda_graph(graph);
    for (const auto& [n, v] : kRuns) {
      const std::string where = std::string(graph ? "graph " : "") + "n=" + std::to_string(n) +
                                " k=" + std::to_string(v.k);
      auto out = (*ctx)->run(feeds(n, v));
      ASSERT_TRUE(out.ok()) << where << ": " << out.status().to_string();
      expect_outputs(n, v, *out, where);
    }
  }
}

}  // namespace
}  // namespace kiln::testing
