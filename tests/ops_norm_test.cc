// Norm op family: symbolic shape inference and CPU reference kernels (LayerNormalization,
// BatchNormalization, Softmax and LogSoftmax in both axis semantics).
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "ops/schema.h"
#include "test_util.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::make_f32;
using testing::run_cpu_kernel;

struct In {
  DType dtype;
  std::vector<Dim> shape;
};

struct Inferred {
  Status status;
  std::vector<ops::InferContext::Output> outs;
};

Inferred infer(ir::Node node, const std::vector<std::optional<In>>& inputs, int num_outputs) {
  ir::Graph g;
  node.inputs.clear();
  node.outputs.clear();
  for (const auto& in : inputs) {
    if (!in) {
      node.inputs.push_back(-1);
      continue;
    }
    int v = g.add_value("in" + std::to_string(g.values.size()));
    g.values[v].dtype = in->dtype;
    g.values[v].shape = in->shape;
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

ir::Node make_node(const std::string& op, int opset) {
  ir::Node n;
  n.name = "n0";
  n.op_type = op;
  n.opset = opset;
  return n;
}

void set_int(ir::Node& n, const std::string& name, int64_t v) {
  ir::Attribute a;
  a.type = ir::AttrType::kInt;
  a.i = v;
  n.attrs.set(name, a);
}

void set_float(ir::Node& n, const std::string& name, float v) {
  ir::Attribute a;
  a.type = ir::AttrType::kFloat;
  a.f = v;
  n.attrs.set(name, a);
}

std::vector<float> ramp(int64_t n, float scale, float offset) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(float(i) * scale) * 3.0f + offset;
  return v;
}

const Dim kB = Dim::symbol("b");
const Dim kS = Dim::symbol("s");

TEST(NormOpsInfer, LayerNormKeepsShapeAndShapesStatistics) {
  ir::Node n = make_node("LayerNormalization", 17);
  auto r = infer(
      n, {In{DType::kFloat32, {kB, kS, 64}}, In{DType::kFloat32, {64}}, In{DType::kFloat32, {64}}},
      3);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(ir::dims_to_string(r.outs[0].shape), "[b, s, 64]");
  EXPECT_EQ(ir::dims_to_string(r.outs[1].shape), "[b, s, 1]");
  EXPECT_EQ(r.outs[2].dtype, DType::kFloat32);
  set_int(n, "axis", 1);
  r = infer(n, {In{DType::kFloat16, {kB, kS, 64}}, In{DType::kFloat16, {kS, 64}}}, 2);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outs[0].dtype, DType::kFloat16);
  EXPECT_EQ(ir::dims_to_string(r.outs[1].shape), "[b, 1, 1]");
  EXPECT_EQ(r.outs[1].dtype, DType::kFloat32);  // stash_type 1
}

TEST(NormOpsInfer, LayerNormRejectsBadScaleAndAxis) {
  ir::Node n = make_node("LayerNormalization", 17);
  auto r = infer(n, {In{DType::kFloat32, {kB, kS, 64}}, In{DType::kFloat32, {32}}}, 1);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidModel);
  EXPECT_NE(r.status.message().find("n0"), std::string::npos) << r.status.message();
  set_int(n, "axis", 3);
  r = infer(n, {In{DType::kFloat32, {kB, kS, 64}}, In{DType::kFloat32, {64}}}, 1);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidModel);
  r = infer(make_node("LayerNormalization", 17),
            {In{DType::kInt64, {kB, 64}}, In{DType::kInt64, {64}}}, 1);
  EXPECT_FALSE(r.status.ok());
}

TEST(NormOpsInfer, BatchNormChecksChannelsAndMode) {
  ir::Node n = make_node("BatchNormalization", 15);
  std::vector<std::optional<In>> ins = {In{DType::kFloat32, {kB, 8, kS, kS}}};
  for (int i = 0; i < 4; ++i) ins.push_back(In{DType::kFloat32, {8}});
  auto r = infer(n, ins, 1);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(ir::dims_to_string(r.outs[0].shape), "[b, 8, s, s]");
  ins[3] = In{DType::kFloat32, {4}};
  EXPECT_EQ(infer(n, ins, 1).status.code(), StatusCode::kInvalidModel);
  ins[3] = In{DType::kFloat32, {8}};
  set_int(n, "training_mode", 1);
  EXPECT_EQ(infer(n, ins, 1).status.code(), StatusCode::kUnsupported);
}

TEST(NormOpsInfer, SoftmaxAxisPerOpset) {
  ir::Node n = make_node("Softmax", 13);
  auto r = infer(n, {In{DType::kFloat32, {kB, kS, 10}}}, 1);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(ir::dims_to_string(r.outs[0].shape), "[b, s, 10]");
  set_int(n, "axis", 3);
  EXPECT_EQ(infer(n, {In{DType::kFloat32, {kB, kS, 10}}}, 1).status.code(),
            StatusCode::kInvalidModel);
  // Opset 11 flattens at axis, and axis == rank is a valid (trivial) split.
  ir::Node old = make_node("LogSoftmax", 11);
  set_int(old, "axis", 3);
  EXPECT_TRUE(infer(old, {In{DType::kFloat32, {kB, kS, 10}}}, 1).status.ok());
  set_int(old, "axis", 4);
  EXPECT_FALSE(infer(old, {In{DType::kFloat32, {kB, kS, 10}}}, 1).status.ok());
}

// Naive softmax over (outer, n, inner) computed in double.
std::vector<float> naive_softmax(const std::vector<float>& x, int64_t outer, int64_t n,
                                 int64_t inner, bool log) {
  std::vector<float> y(x.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      double mx = -INFINITY, sum = 0;
      for (int64_t k = 0; k < n; ++k) mx = std::max(mx, double(x[(o * n + k) * inner + i]));
      for (int64_t k = 0; k < n; ++k) sum += std::exp(double(x[(o * n + k) * inner + i]) - mx);
      for (int64_t k = 0; k < n; ++k) {
        double v = double(x[(o * n + k) * inner + i]) - mx;
        y[(o * n + k) * inner + i] = float(log ? v - std::log(sum) : std::exp(v) / sum);
      }
    }
  }
  return y;
}

TEST(NormOpsKernel, SoftmaxSingleAxisOpset13) {
  std::vector<float> x = ramp(24, 0.7f, 0.5f);
  ir::Node n = make_node("Softmax", 13);
  set_int(n, "axis", 1);
  auto out = run_cpu_kernel(n, {make_f32({2, 3, 4}, x)}, {{DType::kFloat32, {2, 3, 4}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({2, 3, 4}, naive_softmax(x, 2, 3, 4, false))));
  // Each (outer, inner) column along axis 1 sums to 1.
  const float* y = (*out)[0].data_as<float>();
  for (int o = 0; o < 2; ++o) {
    for (int i = 0; i < 4; ++i) {
      float s = 0;
      for (int k = 0; k < 3; ++k) s += y[(o * 3 + k) * 4 + i];
      EXPECT_NEAR(s, 1.0f, 1e-5f);
    }
  }
  // Default axis is -1.
  out = run_cpu_kernel(make_node("Softmax", 13), {make_f32({2, 3, 4}, x)},
                       {{DType::kFloat32, {2, 3, 4}}});
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({2, 3, 4}, naive_softmax(x, 6, 4, 1, false))));
}

TEST(NormOpsKernel, SoftmaxCoercedTo2dBeforeOpset13) {
  std::vector<float> x = ramp(24, 0.7f, 0.5f);
  // Default axis 1: rows of 12 elements.
  auto out = run_cpu_kernel(make_node("Softmax", 11), {make_f32({2, 3, 4}, x)},
                            {{DType::kFloat32, {2, 3, 4}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(
      testing::all_close((*out)[0], make_f32({2, 3, 4}, naive_softmax(x, 2, 12, 1, false))));
  const float* y = (*out)[0].data_as<float>();
  float s = 0;
  for (int k = 0; k < 12; ++k) s += y[k];
  EXPECT_NEAR(s, 1.0f, 1e-5f);
  // And it differs from the opset-13 result for the same attribute.
  ir::Node n13 = make_node("Softmax", 13);
  set_int(n13, "axis", 1);
  auto out13 = run_cpu_kernel(n13, {make_f32({2, 3, 4}, x)}, {{DType::kFloat32, {2, 3, 4}}});
  ASSERT_TRUE(out13.ok());
  EXPECT_FALSE(testing::all_close((*out)[0], (*out13)[0]));
}

TEST(NormOpsKernel, LogSoftmaxBothSemantics) {
  std::vector<float> x = ramp(30, 1.3f, -1.0f);
  ir::Node n13 = make_node("LogSoftmax", 13);
  set_int(n13, "axis", 0);
  auto out = run_cpu_kernel(n13, {make_f32({5, 6}, x)}, {{DType::kFloat32, {5, 6}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({5, 6}, naive_softmax(x, 1, 5, 6, true))));
  ir::Node n11 = make_node("LogSoftmax", 11);
  set_int(n11, "axis", 0);
  out = run_cpu_kernel(n11, {make_f32({5, 6}, x)}, {{DType::kFloat32, {5, 6}}});
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({5, 6}, naive_softmax(x, 1, 30, 1, true))));
}

TEST(NormOpsKernel, SoftmaxFloat16) {
  std::vector<float> x = {1.0f, 2.0f, 3.0f, -1.0f, 0.0f, 1.0f};
  std::vector<uint16_t> h;
  for (float v : x) h.push_back(float_to_half(v));
  Tensor xh = Tensor::from_vector(DType::kFloat16, {2, 3}, h);
  auto out = run_cpu_kernel(make_node("Softmax", 13), {xh}, {{DType::kFloat16, {2, 3}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  std::vector<float> e = naive_softmax(x, 2, 3, 1, false);
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(half_to_float((*out)[0].data_as<uint16_t>()[i]), e[i], 2e-3) << i;
  }
}

// Naive layer norm over rows of n (scale/bias full-size or null), in double.
std::vector<float> naive_layer_norm(const std::vector<float>& x, int64_t n, const float* scale,
                                    const float* bias, float eps, std::vector<float>* mean,
                                    std::vector<float>* inv) {
  std::vector<float> y(x.size());
  for (size_t o = 0; o < x.size() / n; ++o) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < n; ++j) m += x[o * n + j];
    m /= double(n);
    for (int64_t j = 0; j < n; ++j) v += (x[o * n + j] - m) * (x[o * n + j] - m);
    v /= double(n);
    double is = 1.0 / std::sqrt(v + eps);
    for (int64_t j = 0; j < n; ++j) {
      y[o * n + j] = float((x[o * n + j] - m) * is * scale[j] + (bias ? bias[j] : 0.0f));
    }
    if (mean) mean->push_back(float(m));
    if (inv) inv->push_back(float(is));
  }
  return y;
}

TEST(NormOpsKernel, LayerNormWithAndWithoutBias) {
  std::vector<float> x = ramp(2 * 3 * 8, 0.37f, 100.0f);  // large offset: two-pass matters
  std::vector<float> scale = ramp(8, 1.1f, 1.0f), bias = ramp(8, 0.5f, -0.3f);
  ir::Node n = make_node("LayerNormalization", 17);
  set_float(n, "epsilon", 1e-5f);
  auto out = run_cpu_kernel(
      n, {make_f32({2, 3, 8}, x), make_f32({8}, scale), make_f32({8}, bias)},
      {{DType::kFloat32, {2, 3, 8}}, {DType::kFloat32, {2, 3, 1}}, {DType::kFloat32, {2, 3, 1}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  std::vector<float> mean, inv;
  auto e = naive_layer_norm(x, 8, scale.data(), bias.data(), 1e-5f, &mean, &inv);
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({2, 3, 8}, e)));
  EXPECT_TRUE(testing::all_close((*out)[1], make_f32({2, 3, 1}, mean)));
  EXPECT_TRUE(testing::all_close((*out)[2], make_f32({2, 3, 1}, inv)));

  out = run_cpu_kernel(n, {make_f32({2, 3, 8}, x), make_f32({8}, scale)},
                       {{DType::kFloat32, {2, 3, 8}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  e = naive_layer_norm(x, 8, scale.data(), nullptr, 1e-5f, nullptr, nullptr);
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({2, 3, 8}, e)));

  // axis=1 normalizes over 24 elements; Scale of shape [1, 8] broadcasts over the 3 rows.
  set_int(n, "axis", 1);
  out = run_cpu_kernel(n, {make_f32({2, 3, 8}, x), make_f32({1, 8}, scale)},
                       {{DType::kFloat32, {2, 3, 8}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  std::vector<float> scale24;
  for (int r = 0; r < 3; ++r) scale24.insert(scale24.end(), scale.begin(), scale.end());
  e = naive_layer_norm(x, 24, scale24.data(), nullptr, 1e-5f, nullptr, nullptr);
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({2, 3, 8}, e)));
}

TEST(NormOpsKernel, BatchNormInference) {
  std::vector<float> x = ramp(2 * 3 * 4, 0.9f, 0.2f);
  std::vector<float> scale = {1.5f, -0.5f, 2.0f}, bias = {0.1f, 0.2f, -0.3f};
  std::vector<float> mean = {0.5f, -1.0f, 0.0f}, var = {1.0f, 4.0f, 0.25f};
  ir::Node n = make_node("BatchNormalization", 15);
  set_float(n, "epsilon", 1e-3f);
  auto out = run_cpu_kernel(n,
                            {make_f32({2, 3, 2, 2}, x), make_f32({3}, scale), make_f32({3}, bias),
                             make_f32({3}, mean), make_f32({3}, var)},
                            {{DType::kFloat32, {2, 3, 2, 2}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  std::vector<float> e(x.size());
  for (int b = 0; b < 2; ++b) {
    for (int c = 0; c < 3; ++c) {
      for (int i = 0; i < 4; ++i) {
        int k = (b * 3 + c) * 4 + i;
        e[k] = (x[k] - mean[c]) / std::sqrt(var[c] + 1e-3f) * scale[c] + bias[c];
      }
    }
  }
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({2, 3, 2, 2}, e)));
}

TEST(NormOpsKernel, EmptyInputIsFine) {
  auto out =
      run_cpu_kernel(make_node("Softmax", 13), {make_f32({0, 4}, {})}, {{DType::kFloat32, {0, 4}}});
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  ir::Node n = make_node("LayerNormalization", 17);
  out = run_cpu_kernel(n, {make_f32({0, 4}, {}), make_f32({4}, {1, 1, 1, 1})},
                       {{DType::kFloat32, {0, 4}}});
  EXPECT_TRUE(out.ok()) << out.status().to_string();
}


// ---- RMS/Group/Instance/Lp/MeanVariance normalization, LRN ----

TEST(NormOpsInfer, GroupNormChecksGroupsAndParams) {
  ir::Node n = make_node("GroupNormalization", 21);
  set_int(n, "num_groups", 2);
  auto r = infer(n, {In{DType::kFloat32, {kB, 4, 3}}, In{DType::kFloat32, {4}}, In{DType::kFloat32, {4}}}, 1);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outs[0].shape[0], kB);
  set_int(n, "num_groups", 3);
  EXPECT_FALSE(infer(n, {In{DType::kFloat32, {kB, 4, 3}}, In{DType::kFloat32, {4}}, In{DType::kFloat32, {4}}}, 1)
                   .status.ok());
}

TEST(NormOpsKernel, RmsNormMatchesFormula) {
  std::vector<float> x = ramp(8, 0.9f, 0.2f);
  std::vector<float> w = {0.5f, 1.f, 1.5f, 2.f};
  ir::Node n = make_node("RMSNormalization", 23);
  auto out = run_cpu_kernel(n, {make_f32({2, 4}, x), make_f32({4}, w)}, {{DType::kFloat32, {2, 4}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  std::vector<float> want(8);
  for (int r = 0; r < 2; ++r) {
    double sq = 0;
    for (int j = 0; j < 4; ++j) sq += double(x[r * 4 + j]) * x[r * 4 + j];
    double inv = 1.0 / std::sqrt(sq / 4 + 1e-5);
    for (int j = 0; j < 4; ++j) want[r * 4 + j] = float(x[r * 4 + j] * inv * w[j]);
  }
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({2, 4}, want)));
}

TEST(NormOpsKernel, InstanceNormZeroMeanUnitVariance) {
  std::vector<float> x = ramp(12, 0.7f, 1.0f);
  ir::Node n = make_node("InstanceNormalization", 22);
  set_float(n, "epsilon", 0.f);
  auto out = run_cpu_kernel(n, {make_f32({1, 2, 6}, x), make_f32({2}, {1, 1}), make_f32({2}, {0, 0})},
                            {{DType::kFloat32, {1, 2, 6}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const float* y = (*out)[0].data_as<float>();
  for (int c = 0; c < 2; ++c) {
    double s = 0, sq = 0;
    for (int i = 0; i < 6; ++i) {
      s += y[c * 6 + i];
      sq += double(y[c * 6 + i]) * y[c * 6 + i];
    }
    EXPECT_NEAR(s / 6, 0.0, 1e-5);
    EXPECT_NEAR(sq / 6, 1.0, 1e-4);
  }
}

TEST(NormOpsKernel, GroupNormEqualsInstanceNormWithOneChannelPerGroup) {
  std::vector<float> x = ramp(24, 0.3f, -0.5f);
  Tensor sc = make_f32({4}, {1, 2, 3, 4}), bi = make_f32({4}, {0.1f, 0.2f, 0.3f, 0.4f});
  ir::Node g = make_node("GroupNormalization", 21);
  set_int(g, "num_groups", 4);
  auto a = run_cpu_kernel(g, {make_f32({1, 4, 6}, x), sc, bi}, {{DType::kFloat32, {1, 4, 6}}});
  auto b = run_cpu_kernel(make_node("InstanceNormalization", 22), {make_f32({1, 4, 6}, x), sc, bi},
                          {{DType::kFloat32, {1, 4, 6}}});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(testing::all_close((*a)[0], (*b)[0]));
  // Two groups normalize over two channels at once, which differs.
  set_int(g, "num_groups", 2);
  auto c = run_cpu_kernel(g, {make_f32({1, 4, 6}, x), sc, bi}, {{DType::kFloat32, {1, 4, 6}}});
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(testing::all_close((*a)[0], (*c)[0]));
}

TEST(NormOpsKernel, LpNormalizationAndLrn) {
  auto out = run_cpu_kernel(make_node("LpNormalization", 22), {make_f32({2, 2}, {3, 4, 0, 0})},
                            {{DType::kFloat32, {2, 2}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({2, 2}, {0.6f, 0.8f, 0, 0})));
  ir::Node lrn = make_node("LRN", 13);
  set_int(lrn, "size", 3);
  set_float(lrn, "alpha", 3.f);
  set_float(lrn, "beta", 1.f);
  set_float(lrn, "bias", 1.f);
  // Channels [1, 2, 3] at one pixel: window sums of squares 5, 14, 13.
  out = run_cpu_kernel(lrn, {make_f32({1, 3, 1, 1}, {1, 2, 3})}, {{DType::kFloat32, {1, 3, 1, 1}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({1, 3, 1, 1}, {1.f / 6, 2.f / 15, 3.f / 14})));
}

}  // namespace
}  // namespace kiln
