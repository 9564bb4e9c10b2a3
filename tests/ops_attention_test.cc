// Attention op family: shape inference of Attention (3-D and 4-D, past key/value, GQA) and
// RotaryEmbedding, and the CPU kernels against naive formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/schema.h"
#include "test_util.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::make_f32;
using testing::make_i64;
using testing::run_cpu_kernel;

struct Inferred {
  Status status;
  std::vector<ops::InferContext::Output> outs;
};

Inferred infer(ir::Node node, const std::vector<std::vector<Dim>>& shapes, int num_outputs) {
  ir::Graph g;
  for (const auto& s : shapes) {
    int v = g.add_value("in" + std::to_string(g.values.size()));
    g.values[v].dtype = DType::kFloat32;
    g.values[v].shape = s;
    node.inputs.push_back(v);
  }
  for (int i = 0; i < num_outputs; ++i)
    node.outputs.push_back(g.add_value("out" + std::to_string(i)));
  g.nodes.push_back(node);
  std::vector<ops::Constraint> constraints;
  ops::InferContext ctx(g, g.nodes[0], 0, &constraints);
  const ops::OpSchema* schema = ops::find_schema(g.nodes[0]);
  if (!schema) return {internal_error("no schema for " + node.op_type), {}};
  Status s = schema->infer(ctx);
  return {s, ctx.outputs()};
}

ir::Node make_node(const std::string& op) {
  ir::Node n;
  n.name = "a0";
  n.op_type = op;
  n.opset = 23;
  return n;
}

void set_int(ir::Node& n, const std::string& name, int64_t v) {
  ir::Attribute a;
  a.type = ir::AttrType::kInt;
  a.i = v;
  n.attrs.set(name, a);
}

TEST(AttentionInfer, ThreeDWithHeadsAndPast) {
  const Dim s = Dim::symbol("s"), p = Dim::symbol("p");
  ir::Node n = make_node("Attention");
  set_int(n, "q_num_heads", 4);
  set_int(n, "kv_num_heads", 2);
  auto r = infer(n, {{2, s, 32}, {2, s, 16}, {2, s, 24}}, 1);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outs[0].shape[2], Dim(48));  // 4 heads x head size 12 of V
  // 4-D with a mask and past: present is [B, kv_heads, P + S, head].
  ir::Node m = make_node("Attention");
  r = infer(m, {{1, 4, s, 8}, {1, 2, s, 8}, {1, 2, s, 8}, {s, p + s}, {1, 2, p, 8}, {1, 2, p, 8}},
            4);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outs[1].shape[2], p + s);
  EXPECT_EQ(r.outs[3].shape[1], Dim(4));
  EXPECT_EQ(r.outs[3].shape[3], p + s);
  // Q heads must be a multiple of KV heads.
  EXPECT_FALSE(infer(m, {{1, 3, 4, 8}, {1, 2, 4, 8}, {1, 2, 4, 8}}, 1).status.ok());
}

TEST(AttentionKernel, SingleHeadMatchesSoftmaxFormulaAndCausalMasks) {
  // Q, K, V: [1, 1, 2, 2]. Non-causal: y_i = sum_j softmax(q_i.k_j / sqrt(2)) v_j.
  std::vector<float> q = {1, 0, 0, 1}, k = {1, 0, 0, 1}, v = {1, 2, 3, 4};
  ir::Node n = make_node("Attention");
  auto out = run_cpu_kernel(
      n, {make_f32({1, 1, 2, 2}, q), make_f32({1, 1, 2, 2}, k), make_f32({1, 1, 2, 2}, v)},
      {{DType::kFloat32, {1, 1, 2, 2}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  double e = std::exp(1.0 / std::sqrt(2.0));
  double w0 = e / (e + 1), w1 = 1 / (e + 1);
  std::vector<float> want = {float(w0 * 1 + w1 * 3), float(w0 * 2 + w1 * 4), float(w1 * 1 + w0 * 3),
                             float(w1 * 2 + w0 * 4)};
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({1, 1, 2, 2}, want)));
  set_int(n, "is_causal", 1);
  out = run_cpu_kernel(
      n, {make_f32({1, 1, 2, 2}, q), make_f32({1, 1, 2, 2}, k), make_f32({1, 1, 2, 2}, v)},
      {{DType::kFloat32, {1, 1, 2, 2}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  // The first query sees only the first key.
  EXPECT_NEAR((*out)[0].data_as<float>()[0], 1.f, 1e-6f);
  EXPECT_NEAR((*out)[0].data_as<float>()[1], 2.f, 1e-6f);
}

TEST(AttentionInfer, WindowAttributesFromOpset25) {
  const std::vector<std::vector<Dim>> shapes = {{1, 2, 3, 4}, {1, 2, 5, 4}, {1, 2, 5, 4}};
  ir::Node n = make_node("Attention");
  set_int(n, "left_window_size", 2);
  auto r = infer(n, shapes, 1);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidModel);  // opset 23 has no windows
  EXPECT_NE(r.status.message().find("opset 25"), std::string::npos) << r.status.message();
  n.opset = 25;
  r = infer(n, shapes, 1);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(ir::dims_to_string(r.outs[0].shape), "[1, 2, 3, 4]");
  set_int(n, "right_window_size", -2);
  EXPECT_EQ(infer(n, shapes, 1).status.code(), StatusCode::kInvalidModel);
}

// With all-zero Q and K every allowed key gets the same weight, so each output is the mean of the
// V rows its query may attend: the masks can be read off the values.
std::vector<float> attend_means(ir::Node n, int64_t s, int64_t l, std::vector<Tensor> extra = {}) {
  std::vector<float> vals(static_cast<size_t>(l));
  for (int64_t j = 0; j < l; ++j) vals[size_t(j)] = float(1 << j);
  std::vector<Tensor> in = {make_f32({1, 1, s, 1}, std::vector<float>(size_t(s), 0.f)),
                            make_f32({1, 1, l, 1}, std::vector<float>(size_t(l), 0.f)),
                            make_f32({1, 1, l, 1}, vals)};
  for (Tensor& t : extra) in.push_back(t);
  auto out = run_cpu_kernel(n, in, {{DType::kFloat32, {1, 1, s, 1}}});
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  if (!out.ok()) return {};
  const float* y = (*out)[0].data_as<float>();
  return std::vector<float>(y, y + s);
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5f) << i;
}

TEST(AttentionKernel, SlidingWindowsAndBottomRightOffsets) {
  ir::Node n = make_node("Attention");
  n.opset = 25;
  // V rows are 1, 2, 4, 8: query i sees only key i.
  set_int(n, "left_window_size", 0);
  set_int(n, "right_window_size", 0);
  expect_near(attend_means(n, 4, 4), {1, 2, 4, 8});
  // Causal with one key of look-back: {0}, {0,1}, {1,2}, {2,3}.
  ir::Node c = make_node("Attention");
  c.opset = 25;
  set_int(c, "is_causal", 1);
  set_int(c, "left_window_size", 1);
  expect_near(attend_means(c, 4, 4), {1, 1.5f, 3, 6});
  // Right window only (non-causal): query i sees keys 0..i+1.
  ir::Node rw = make_node("Attention");
  rw.opset = 25;
  set_int(rw, "right_window_size", 1);
  expect_near(attend_means(rw, 2, 4), {1.5f, 7.0f / 3});
  // An external cache (nonpad_kv_seqlen, no past): causal alignment is bottom-right, offset
  // nonpad - S = 3 - 1, so the one query sees keys 0..2 (mean 7/3), not key 0 alone.
  ir::Node e = make_node("Attention");
  set_int(e, "is_causal", 1);
  std::vector<Tensor> nonpad = {Tensor(), Tensor(), Tensor(), make_i64({1}, {3})};
  expect_near(attend_means(e, 1, 4, nonpad), {7.0f / 3});
}

TEST(AttentionKernel, FullyMaskedRowsAreZeroNotNaN) {
  ir::Node n = make_node("Attention");
  set_int(n, "qk_matmul_output_mode", 3);
  std::vector<uint8_t> mask = {0, 0, 0, 1, 1, 0};  // query 0 may attend nothing
  auto out = run_cpu_kernel(
      n,
      {make_f32({1, 1, 2, 1}, {1, 2}), make_f32({1, 1, 3, 1}, {1, 0, -1}),
       make_f32({1, 1, 3, 1}, {1, 2, 3}), Tensor::from_vector(DType::kBool, {2, 3}, mask)},
      {{DType::kFloat32, {1, 1, 2, 1}},
       {DType::kFloat32, {1, 1, 3, 1}},
       {DType::kFloat32, {1, 1, 3, 1}},
       {DType::kFloat32, {1, 1, 2, 3}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const float* y = (*out)[0].data_as<float>();
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_FALSE(std::isnan(y[1]));
  const float* p = (*out)[3].data_as<float>();
  for (int j = 0; j < 3; ++j) EXPECT_EQ(p[j], 0.0f) << j;  // mode 3 probabilities too
  EXPECT_NEAR(p[3] + p[4], 1.0f, 1e-6f);
  EXPECT_EQ(p[5], 0.0f);
}

TEST(RotaryEmbeddingKernel, RotatesPairsByPosition) {
  // One head of size 2 at positions 0 and 1: angle 0 keeps x, angle pi/2 rotates (1, 0) to (0, 1).
  ir::Node n = make_node("RotaryEmbedding");
  Tensor x = make_f32({1, 1, 2, 2}, {1, 0, 1, 0});
  Tensor cos = make_f32({2, 1}, {1, 0}), sin = make_f32({2, 1}, {0, 1});
  Tensor pos = testing::make_i64({1, 2}, {0, 1});
  auto out = run_cpu_kernel(n, {x, cos, sin, pos}, {{DType::kFloat32, {1, 1, 2, 2}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({1, 1, 2, 2}, {1, 0, 0, 1})));
  // A position outside the cache is an error.
  pos = testing::make_i64({1, 2}, {0, 5});
  EXPECT_FALSE(run_cpu_kernel(n, {x, cos, sin, pos}, {{DType::kFloat32, {1, 1, 2, 2}}}).ok());
}

}  // namespace
}  // namespace kiln
