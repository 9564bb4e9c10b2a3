// Sequence-model ops: LinearAttention, CausalConvWithState and FlexAttention shape inference and
// kernels (every backend, against the CPU reference) checked on hand-computed recurrences.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "op_harness.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::f32;
using testing::infer_node;
using testing::initializer;
using testing::make_f32;
using testing::NodeInput;
using testing::op;
using testing::OpNode;
using testing::run_case;

OpNode make_node(const std::string& op_type, const std::string& domain = "") {
  return op(op_type, domain.empty() ? 27 : 1, domain).named("s0");
}

// All inputs are float32; an empty shape leaves that input absent.
std::vector<NodeInput> f32_inputs(const std::vector<std::vector<Dim>>& shapes) {
  std::vector<NodeInput> out;
  for (const auto& s : shapes) out.push_back(s.empty() ? testing::kOmitted : f32(s));
  return out;
}

TEST(SequenceModelsInfer, LinearAttentionShapesAndRuleInputs) {
  const Dim t = Dim::symbol("t");
  OpNode n = make_node("LinearAttention");
  n.i("q_num_heads", 4);
  n.i("kv_num_heads", 2);
  // gated_delta (the default): decay and beta are required.
  auto r =
      infer_node(n, f32_inputs({{2, t, 32}, {2, t, 16}, {2, t, 24}, {}, {2, t, 2}, {2, t, 2}}), 2);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outputs[0].shape[2], Dim(48));  // 4 query heads x value head size 12
  EXPECT_EQ(r.outputs[1].shape, (std::vector<Dim>{2, 2, 8, 12}));
  EXPECT_FALSE(infer_node(n, f32_inputs({{2, t, 32}, {2, t, 16}, {2, t, 24}}), 2).status.ok());
  n.s("update_rule", "linear");
  EXPECT_TRUE(infer_node(n, f32_inputs({{2, t, 32}, {2, t, 16}, {2, t, 24}}), 2).status.ok());
  n.s("update_rule", "cubic");
  EXPECT_FALSE(infer_node(n, f32_inputs({{2, t, 32}, {2, t, 16}, {2, t, 24}}), 2).status.ok());
}

TEST(SequenceModelsInfer, FlexAttentionPreviewDomainAndCausalConvState) {
  OpNode f = make_node("FlexAttention", "ai.onnx.preview");
  auto r = infer_node(f, f32_inputs({{1, 4, 5, 8}, {1, 2, 6, 8}, {1, 2, 6, 3}}), 1);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outputs[0].shape, (std::vector<Dim>{1, 4, 5, 3}));
  // Q heads must be a multiple of KV heads.
  EXPECT_FALSE(
      infer_node(f, f32_inputs({{1, 3, 5, 8}, {1, 2, 6, 8}, {1, 2, 6, 3}}), 1).status.ok());
  OpNode c = make_node("CausalConvWithState");
  r = infer_node(c, f32_inputs({{2, 4, Dim::symbol("l")}, {4, 1, 3}}), 2);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outputs[1].shape, (std::vector<Dim>{2, 4, 2}));
  // A past state of the wrong length is rejected.
  EXPECT_FALSE(infer_node(c, f32_inputs({{2, 4, 8}, {4, 1, 3}, {}, {2, 4, 3}}), 2).status.ok());
}

TEST(SequenceModelsKernel, LinearAttentionRecurrences) {
  // linear, one head of size 1, scale 1: S_0 = 1*3 = 3, S_1 = 3 + 2*4 = 11; o_t = q_t * S_t.
  OpNode n = make_node("LinearAttention");
  n.i("q_num_heads", 1);
  n.i("kv_num_heads", 1);
  n.f("scale", 1.0f);
  n.s("update_rule", "linear");
  auto out = run_case(
      n, {make_f32({1, 2, 1}, {1, 2}), make_f32({1, 2, 1}, {1, 2}), make_f32({1, 2, 1}, {3, 4})},
      2);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({1, 2, 1}, {3, 22})));
  EXPECT_TRUE(testing::all_close((*out)[1], make_f32({1, 1, 1, 1}, {11})));
  // gated_delta from past 2: decay ln 0.5 gives 1; v' = 0.5 * (3 - 1 * 1) = 1; S = 1 + 1 = 2.
  OpNode g = make_node("LinearAttention");
  g.i("q_num_heads", 1);
  g.i("kv_num_heads", 1);
  g.f("scale", 1.0f);
  out = run_case(g,
                 {make_f32({1, 1, 1}, {1}), make_f32({1, 1, 1}, {1}), make_f32({1, 1, 1}, {3}),
                  make_f32({1, 1, 1, 1}, {2}), make_f32({1, 1, 1}, {std::log(0.5f)}),
                  make_f32({1, 1, 1}, {0.5f})},
                 2);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_NEAR((*out)[0].data_as<float>()[0], 2.f, 1e-5f);
  EXPECT_NEAR((*out)[1].data_as<float>()[0], 2.f, 1e-5f);
}

TEST(SequenceModelsKernel, CausalConvCarriesStateAndFlexAttentionSharesKvHeads) {
  // padded = [5 | 1 2 3], weight (1, 10): y = 15, 21, 32; present = the last input, 3.
  OpNode c = make_node("CausalConvWithState");
  auto out = run_case(c,
                      {make_f32({1, 1, 3}, {1, 2, 3}), initializer(make_f32({1, 1, 2}, {1, 10})),
                       testing::kNoInput, make_f32({1, 1, 1}, {5})},
                      2);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({1, 1, 3}, {15, 21, 32})));
  EXPECT_TRUE(testing::all_close((*out)[1], make_f32({1, 1, 1}, {3})));
  // silu(y) = y * sigmoid(y).
  c.s("activation", "silu");
  out = run_case(c, {make_f32({1, 1, 1}, {1}), initializer(make_f32({1, 1, 1}, {1}))}, 2);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_NEAR((*out)[0].data_as<float>()[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  // Two query heads on one KV head: key weights 0.5/0.5 average the values (equal scores).
  OpNode f = make_node("FlexAttention", "ai.onnx.preview");
  out = run_case(f, {make_f32({1, 2, 1, 1}, {1, -1}), make_f32({1, 1, 2, 1}, {0, 0}),
                     make_f32({1, 1, 2, 1}, {2, 4})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({1, 2, 1, 1}, {3, 3})));
}

std::vector<float> wave(int64_t n, float scale, float offset) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = std::sin(float(i) * scale) * 0.8f + offset;
  return v;
}

TEST(SequenceModelsKernel, LinearAttentionGqaGatedDeltaOverTime) {
  // B 2, T 5, 4 query heads on 2 KV heads, d_k 3, d_v 4; per-key decay and per-head beta, a past.
  OpNode n = make_node("LinearAttention");
  n.i("q_num_heads", 4);
  n.i("kv_num_heads", 2);
  std::vector<testing::CaseInput> in = {
      make_f32({2, 5, 12}, wave(120, 0.31f, 0.0f)), make_f32({2, 5, 6}, wave(60, 0.47f, 0.1f)),
      make_f32({2, 5, 8}, wave(80, 0.29f, -0.2f)),  make_f32({2, 2, 3, 4}, wave(48, 0.53f, 0.0f)),
      make_f32({2, 5, 6}, wave(60, 0.7f, -0.6f)),   make_f32({2, 5, 2}, wave(20, 0.9f, 0.5f))};
  auto out = run_case(n, in, 2);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].shape(), (Shape{2, 5, 16}));
  EXPECT_EQ((*out)[1].shape(), (Shape{2, 2, 3, 4}));
  // Gated only (decay per head), no past, no present requested.
  n.s("update_rule", "gated");
  out = run_case(
      n, {in[0], in[1], in[2], testing::kNoInput, make_f32({2, 5, 2}, wave(20, 0.3f, -0.4f))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
}

TEST(SequenceModelsKernel, CausalConvChannelsBiasStateAndFlexAttentionScale) {
  OpNode c = make_node("CausalConvWithState");
  c.s("activation", "swish");
  auto out = run_case(
      c,
      {make_f32({2, 3, 6}, wave(36, 0.4f, 0.1f)), make_f32({3, 1, 4}, wave(12, 0.8f, 0.0f)),
       make_f32({3}, {0.1f, -0.2f, 0.3f}), make_f32({2, 3, 3}, wave(18, 0.6f, 0.2f))},
      2);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  // present is the input's last three steps (L = 6 >= k - 1).
  EXPECT_EQ((*out)[1].data_as<float>()[0], wave(36, 0.4f, 0.1f)[3]);
  // FlexAttention: GQA, an explicit scale, 200 keys (two CUDA chunks).
  OpNode f = make_node("FlexAttention", "ai.onnx.preview");
  f.f("scale", 0.2f);
  out = run_case(f, {make_f32({1, 4, 3, 8}, wave(96, 0.37f, 0.0f)),
                     make_f32({1, 2, 200, 8}, wave(3200, 0.013f, 0.1f)),
                     make_f32({1, 2, 200, 5}, wave(2000, 0.07f, 0.0f))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].shape(), (Shape{1, 4, 3, 5}));
}

// FlexAttention on float64 tensors computes in double on every backend (the float64 tolerance):
// GQA over 200 keys (two CUDA chunks) with an explicit scale, then the default scale. A device
// must accept it.
TEST(SequenceModelsKernel, FlexAttentionFloat64) {
  auto f64 = [](Shape shape, float scale, float offset) {
    std::vector<float> w = wave(shape_numel(shape), scale, offset);
    return Tensor::from_vector(DType::kFloat64, std::move(shape),
                               std::vector<double>(w.begin(), w.end()));
  };
  std::vector<testing::CaseInput> in = {f64({1, 4, 3, 8}, 0.37f, 0.0f),
                                        f64({1, 2, 200, 8}, 0.013f, 0.1f),
                                        f64({1, 2, 200, 5}, 0.07f, 0.0f)};
  for (bool explicit_scale : {true, false}) {
    OpNode f = make_node("FlexAttention", "ai.onnx.preview");
    if (explicit_scale) f.f("scale", 0.2f);
    testing::KernelCase c{
        .node = f,
        .inputs = in,
        .expect_support = true,
        .label = explicit_scale ? "float64, scale 0.2" : "float64, default scale"};
    auto out = run_case(c);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ((*out)[0].dtype(), DType::kFloat64);
    EXPECT_EQ((*out)[0].shape(), (Shape{1, 4, 3, 5}));
  }
}

TEST(SequenceModelsKernel, FlexAttentionRunsProbMod) {
  // prob_mod = probs * 2 doubles the output; an op the evaluator lacks is an error.
  auto g = std::make_shared<ir::Graph>();
  int x = g->add_value("probs"), two = g->add_value("two"), y = g->add_value("out");
  g->values[two].constant = make_f32({}, {2});
  ir::Node mul = make_node("Mul").node;
  mul.inputs = {x, two};
  mul.outputs = {y};
  g->nodes.push_back(mul);
  g->inputs = {x};
  g->outputs = {y};
  OpNode f = make_node("FlexAttention", "ai.onnx.preview").graph("prob_mod", g);
  std::vector<testing::CaseInput> in = {make_f32({1, 1, 1, 1}, {1}), make_f32({1, 1, 2, 1}, {0, 0}),
                                        make_f32({1, 1, 2, 1}, {2, 4})};
  auto out = run_case(f, in);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_NEAR((*out)[0].data_as<float>()[0], 6.f, 1e-5f);
  g->nodes[0].op_type = "Einsum";
  EXPECT_FALSE(run_case(f, in).ok());
}

}  // namespace
}  // namespace kiln
