// Norm op family: symbolic shape inference and kernels on every backend (LayerNormalization,
// BatchNormalization, Softmax and LogSoftmax in both axis semantics, RMS/Group/Instance/Lp,
// MeanVariance, LRN).
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "op_harness.h"
#include "typed_values.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::BuildPrecision;
using testing::CaseInput;
using testing::f32;
using testing::infer_node;
using testing::initializer;
using testing::make_f32;
using testing::op;
using testing::OpNode;
using testing::run_case;
using testing::typed;

std::vector<float> ramp(int64_t n, float scale, float offset) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(float(i) * scale) * 3.0f + offset;
  return v;
}

const Dim kB = Dim::symbol("b");
const Dim kS = Dim::symbol("s");

TEST(NormOpsInfer, LayerNormKeepsShapeAndShapesStatistics) {
  OpNode n = op("LayerNormalization", 17);
  auto r = infer_node(n, {f32({kB, kS, 64}), f32({64}), f32({64})}, 3);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(ir::dims_to_string(r.outputs[0].shape), "[b, s, 64]");
  EXPECT_EQ(ir::dims_to_string(r.outputs[1].shape), "[b, s, 1]");
  EXPECT_EQ(r.outputs[2].dtype, DType::kFloat32);
  n.i("axis", 1);
  r = infer_node(n, {typed(DType::kFloat16, {kB, kS, 64}), typed(DType::kFloat16, {kS, 64})}, 2);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outputs[0].dtype, DType::kFloat16);
  EXPECT_EQ(ir::dims_to_string(r.outputs[1].shape), "[b, 1, 1]");
  EXPECT_EQ(r.outputs[1].dtype, DType::kFloat32);  // stash_type 1
}

TEST(NormOpsInfer, LayerNormRejectsBadScaleAndAxis) {
  OpNode n = op("LayerNormalization", 17);
  auto r = infer_node(n, {f32({kB, kS, 64}), f32({32})}, 1);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidModel);
  EXPECT_NE(r.status.message().find("n0"), std::string::npos) << r.status.message();
  n.i("axis", 3);
  r = infer_node(n, {f32({kB, kS, 64}), f32({64})}, 1);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidModel);
  r = infer_node(op("LayerNormalization", 17),
                 {typed(DType::kInt64, {kB, 64}), typed(DType::kInt64, {64})}, 1);
  EXPECT_FALSE(r.status.ok());
}

TEST(NormOpsInfer, BatchNormChecksChannelsAndMode) {
  OpNode n = op("BatchNormalization", 15);
  std::vector<testing::NodeInput> ins = {f32({kB, 8, kS, kS})};
  for (int i = 0; i < 4; ++i) ins.push_back(f32({8}));
  auto r = infer_node(n, ins, 1);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(ir::dims_to_string(r.outputs[0].shape), "[b, 8, s, s]");
  ins[3] = f32({4});
  EXPECT_EQ(infer_node(n, ins, 1).status.code(), StatusCode::kInvalidModel);
  ins[3] = f32({8});
  // Outputs 1 and 2 (running mean and variance) exist only in training mode.
  EXPECT_EQ(infer_node(n, ins, 3).status.code(), StatusCode::kUnsupported);
  n.i("training_mode", 1);
  r = infer_node(n, ins, 3);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(ir::dims_to_string(r.outputs[0].shape), "[b, 8, s, s]");
  EXPECT_EQ(ir::dims_to_string(r.outputs[1].shape), "[8]");
  EXPECT_EQ(ir::dims_to_string(r.outputs[2].shape), "[8]");
  // training_mode is opset 14's.
  OpNode old = op("BatchNormalization", 9);
  old.i("training_mode", 1);
  EXPECT_FALSE(infer_node(old, ins, 1).status.ok());
}

TEST(NormOpsKernel, BatchNormTrainingModeUsesTheBatchStatistics) {
  // X [2, 2, 1]: channel 0 holds {1, 3} (mean 2, variance 1), channel 1 {2, 6} (mean 4, variance
  // 4). scale {1, 2}, B {0, 1}, epsilon 0: Y = {-1, 1} and {-1, 3}. Running statistics with
  // momentum 0.5 from input mean {0, 10} and variance {1, 1}: mean {1, 7}, variance {1, 2.5}.
  OpNode n = op("BatchNormalization", 15).i("training_mode", 1).f("epsilon", 0).f("momentum", 0.5f);
  auto got = run_case(n,
                      {make_f32({2, 2, 1}, {1, 2, 3, 6}), make_f32({2}, {1, 2}),
                       make_f32({2}, {0, 1}), make_f32({2}, {0, 10}), make_f32({2}, {1, 1})},
                      3);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(testing::all_close((*got)[0], make_f32({2, 2, 1}, {-1, -1, 1, 3}), 1e-6, 0));
  EXPECT_TRUE(testing::all_close((*got)[1], make_f32({2}, {1, 7}), 1e-6, 0));
  EXPECT_TRUE(testing::all_close((*got)[2], make_f32({2}, {1, 2.5f}), 1e-6, 0));
  // Y alone, with the default momentum: the same Y.
  got = run_case(n.f("momentum", 0.9f),
                 {make_f32({2, 2, 1}, {1, 2, 3, 6}), make_f32({2}, {1, 2}), make_f32({2}, {0, 1}),
                  make_f32({2}, {0, 10}), make_f32({2}, {1, 1})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(testing::all_close((*got)[0], make_f32({2, 2, 1}, {-1, -1, 1, 3}), 1e-6, 0));
}

TEST(NormOpsInfer, SoftmaxAxisPerOpset) {
  OpNode n = op("Softmax", 13);
  auto r = infer_node(n, {f32({kB, kS, 10})}, 1);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(ir::dims_to_string(r.outputs[0].shape), "[b, s, 10]");
  n.i("axis", 3);
  EXPECT_EQ(infer_node(n, {f32({kB, kS, 10})}, 1).status.code(), StatusCode::kInvalidModel);
  // Opset 11 flattens at axis, and axis == rank is a valid (trivial) split.
  OpNode old = op("LogSoftmax", 11);
  old.i("axis", 3);
  EXPECT_TRUE(infer_node(old, {f32({kB, kS, 10})}, 1).status.ok());
  old.i("axis", 4);
  EXPECT_FALSE(infer_node(old, {f32({kB, kS, 10})}, 1).status.ok());
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
  OpNode n = op("Softmax", 13);
  n.i("axis", 1);
  auto out = run_case(n, {make_f32({2, 3, 4}, x)});
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
  out = run_case(op("Softmax", 13), {make_f32({2, 3, 4}, x)});
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({2, 3, 4}, naive_softmax(x, 6, 4, 1, false))));
}

// Contiguous rows of every length class the CUDA warp-per-row kernel has (up to 128, 256, 512,
// 1024 elements) and past it (the block-per-row kernel), Softmax and LogSoftmax, float32 and the
// reduced types, each device against the reference; a row of -inf stays NaN as the reference.
TEST(NormOpsKernel, SoftmaxRowsOfEveryLength) {
  for (int64_t n : {1, 7, 128, 197, 300, 1000, 1500}) {
    std::vector<float> x = ramp(size_t(3 * n), 0.37f, -4.0f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::fmod(x[i], 9.0f);
    for (const char* name : {"Softmax", "LogSoftmax"}) {
      OpNode node = op(name, 13);
      auto out = run_case(node, {make_f32({3, n}, x)});
      ASSERT_TRUE(out.ok()) << name << " n=" << n << ": " << out.status().to_string();
      EXPECT_TRUE(testing::all_close(
          (*out)[0],
          make_f32({3, n}, naive_softmax(x, 3, n, 1, std::string(name) == "LogSoftmax"))))
          << name << " n=" << n;
      for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
        auto h = testing::run_reduced_case(
            {.node = node, .inputs = {make_f32({3, n}, x)}, .label = name}, dt);
        ASSERT_TRUE(h.ok()) << name << " n=" << n << " " << dtype_name(dt) << ": "
                            << h.status().to_string();
      }
    }
  }
  std::vector<float> masked(8, -INFINITY);
  auto out = run_case(op("Softmax", 13), {make_f32({2, 4}, masked)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(std::isnan((*out)[0].float_at(0)));
}

TEST(NormOpsKernel, SoftmaxCoercedTo2dBeforeOpset13) {
  std::vector<float> x = ramp(24, 0.7f, 0.5f);
  // Default axis 1: rows of 12 elements.
  auto out = run_case(op("Softmax", 11), {make_f32({2, 3, 4}, x)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(
      testing::all_close((*out)[0], make_f32({2, 3, 4}, naive_softmax(x, 2, 12, 1, false))));
  const float* y = (*out)[0].data_as<float>();
  float s = 0;
  for (int k = 0; k < 12; ++k) s += y[k];
  EXPECT_NEAR(s, 1.0f, 1e-5f);
  // And it differs from the opset-13 result for the same attribute.
  OpNode n13 = op("Softmax", 13);
  n13.i("axis", 1);
  auto out13 = run_case(n13, {make_f32({2, 3, 4}, x)});
  ASSERT_TRUE(out13.ok());
  EXPECT_FALSE(testing::all_close((*out)[0], (*out13)[0]));
}

TEST(NormOpsKernel, LogSoftmaxBothSemantics) {
  std::vector<float> x = ramp(30, 1.3f, -1.0f);
  OpNode n13 = op("LogSoftmax", 13);
  n13.i("axis", 0);
  auto out = run_case(n13, {make_f32({5, 6}, x)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({5, 6}, naive_softmax(x, 1, 5, 6, true))));
  OpNode n11 = op("LogSoftmax", 11);
  n11.i("axis", 0);
  out = run_case(n11, {make_f32({5, 6}, x)});
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({5, 6}, naive_softmax(x, 1, 30, 1, true))));
}

TEST(NormOpsKernel, SoftmaxFloat16) {
  std::vector<float> x = {1.0f, 2.0f, 3.0f, -1.0f, 0.0f, 1.0f};
  std::vector<uint16_t> h;
  for (float v : x) h.push_back(float_to_half(v));
  Tensor xh = Tensor::from_vector(DType::kFloat16, {2, 3}, h);
  auto out = run_case(op("Softmax", 13), {xh});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  std::vector<float> e = naive_softmax(x, 2, 3, 1, false);
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(half_to_float((*out)[0].data_as<uint16_t>()[i]), e[i], 2e-3) << i;
  }
}

// Softmax and LogSoftmax on float16, bfloat16 and float64 inputs (the expanded attention models
// run them so): rows longer than a CUDA block along a strided axis, short contiguous rows, the
// pre-13 coercion to 2-D, and -inf entries (masked scores). A device must accept them.
TEST(NormOpsKernel, SoftmaxAndLogSoftmaxOnHalfAndDoubleInputs) {
  const int64_t outer = 2, n = 300, inner = 3;
  std::vector<float> x = ramp(outer * n * inner, 0.37f, 0.2f);
  x[5] = -INFINITY;
  x[3 * 100 + 1] = -INFINITY;
  const std::vector<double> xd(x.begin(), x.end());
  struct Case {
    int opset;
    int64_t axis;
    int64_t outer, n, inner;  // of the naive softmax
  };
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    const testing::Tolerance tol = testing::op_tolerance(dt);
    Tensor xt = testing::make_typed(dt, {outer, n, inner}, xd);
    // The naive softmax reads the inputs as stored (rounded to float16/bfloat16).
    std::vector<float> stored(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      stored[i] = dt == DType::kFloat16    ? half_to_float(xt.data_as<uint16_t>()[i])
                  : dt == DType::kBFloat16 ? bf16_to_float(xt.data_as<uint16_t>()[i])
                                           : float(xt.data_as<double>()[i]);
    }
    for (const char* name : {"Softmax", "LogSoftmax"}) {
      const bool log = std::string(name) == "LogSoftmax";
      for (const Case& c : {Case{13, 1, outer, n, inner}, Case{13, -1, outer * n, inner, 1},
                            Case{11, 1, outer, n * inner, 1}}) {
        const std::string label = std::string(name) + "-" + std::to_string(c.opset) + " axis " +
                                  std::to_string(c.axis) + " on " + std::string(dtype_name(dt));
        testing::KernelCase kc{.node = op(name, c.opset).i("axis", c.axis),
                               .inputs = {xt},
                               .expect_support = true,
                               .label = label};
        auto out = run_case(kc);
        ASSERT_TRUE(out.ok()) << label << ": " << out.status().to_string();
        ASSERT_EQ((*out)[0].dtype(), dt) << label;
        if (dt == DType::kFloat64)
          continue;  // the naive softmax is float; the harness checks float64
        std::vector<float> e = naive_softmax(stored, c.outer, c.n, c.inner, log);
        Tensor expected =
            testing::make_typed(dt, {outer, n, inner}, std::vector<double>(e.begin(), e.end()));
        EXPECT_TRUE(testing::all_close((*out)[0], expected, tol.atol, tol.rtol)) << label;
      }
    }
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
  OpNode n = op("LayerNormalization", 17);
  n.f("epsilon", 1e-5f);
  auto out = run_case(
      n,
      {make_f32({2, 3, 8}, x), initializer(make_f32({8}, scale)), initializer(make_f32({8}, bias))},
      3);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  std::vector<float> mean, inv;
  auto e = naive_layer_norm(x, 8, scale.data(), bias.data(), 1e-5f, &mean, &inv);
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({2, 3, 8}, e)));
  EXPECT_TRUE(testing::all_close((*out)[1], make_f32({2, 3, 1}, mean)));
  EXPECT_TRUE(testing::all_close((*out)[2], make_f32({2, 3, 1}, inv)));

  out = run_case(n, {make_f32({2, 3, 8}, x), initializer(make_f32({8}, scale))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  e = naive_layer_norm(x, 8, scale.data(), nullptr, 1e-5f, nullptr, nullptr);
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({2, 3, 8}, e)));

  // axis=1 normalizes over 24 elements; Scale of shape [1, 8] broadcasts over the 3 rows.
  n.i("axis", 1);
  out = run_case(n, {make_f32({2, 3, 8}, x), initializer(make_f32({1, 8}, scale))});
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
  OpNode n = op("BatchNormalization", 15);
  n.f("epsilon", 1e-3f);
  auto out = run_case(n, {make_f32({2, 3, 2, 2}, x), initializer(make_f32({3}, scale)),
                          initializer(make_f32({3}, bias)), initializer(make_f32({3}, mean)),
                          initializer(make_f32({3}, var))});
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

// Float16/bfloat16 X and Y, as the precision pass keeps them between a CNN's or a transformer's
// layers, against the float32 node on the rounded values; parameters are initializers, in X's
// type or (inputs in keep_float32) float32.
void check_half_norm(const OpNode& n, DType dt, const std::vector<Tensor>& f32_inputs,
                     std::set<size_t> keep_float32, int num_outputs, const std::string& label,
                     BuildPrecision precision = BuildPrecision::kFp32) {
  std::vector<CaseInput> inputs;
  for (size_t i = 0; i < f32_inputs.size(); ++i) {
    inputs.push_back(i == 0 ? CaseInput(f32_inputs[i]) : initializer(f32_inputs[i]));
  }
  auto r = testing::run_reduced_case({.node = n,
                                      .inputs = inputs,
                                      .num_outputs = num_outputs,
                                      .precision = precision,
                                      .expect_support = true,
                                      .label = label},
                                     dt, keep_float32);
  ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
  EXPECT_EQ((*r)[0].dtype(), dt) << label;
}

TEST(NormOpsKernel, Float16AndBFloat16Tensors) {
  Tensor x = make_f32({2, 6, 5, 7}, ramp(2 * 6 * 35, 0.37f, 0.4f));
  Tensor scale = make_f32({6}, ramp(6, 1.1f, 1.0f)), bias = make_f32({6}, ramp(6, 0.5f, -0.3f));
  for (float& v : std::span(scale.data_as<float>(), 6)) v = 1.0f + v / 6;  // in [0.5, 1.5]
  for (float& v : std::span(bias.data_as<float>(), 6)) v /= 10;
  Tensor mean = make_f32({6}, {0.5f, -1.0f, 0.0f, 0.25f, 2.0f, -0.75f});
  Tensor var = make_f32({6}, {1.0f, 4.0f, 0.25f, 9.0f, 2.0f, 0.5f});
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    const std::string type(dtype_name(dt));
    OpNode bn = op("BatchNormalization", 15).f("epsilon", 1e-3f);
    check_half_norm(bn, dt, {x, scale, bias, mean, var}, {}, 1, type + " BatchNormalization");
    // Scale and B (T1) and mean and variance (T2) may stay float32.
    check_half_norm(bn, dt, {x, scale, bias, mean, var}, {1, 2, 3, 4}, 1,
                    type + " BatchNormalization, float32 parameters");
    check_half_norm(op("InstanceNormalization", 22), dt, {x, scale, bias}, {}, 1,
                    type + " InstanceNormalization");
    check_half_norm(op("GroupNormalization", 21).i("num_groups", 3), dt, {x, scale, bias}, {}, 1,
                    type + " GroupNormalization");
    // Per-group parameters (before opset 21).
    check_half_norm(op("GroupNormalization", 18).i("num_groups", 2), dt,
                    {x, make_f32({2}, {0.75f, 1.25f}), make_f32({2}, {0.1f, -0.2f})}, {}, 1,
                    type + " GroupNormalization-18");
  }
  // LayerNormalization over the last axis with its float32 statistics, and over the last two
  // without B; RMSNormalization.
  Tensor t = make_f32({2, 3, 40}, ramp(240, 0.21f, 0.5f));
  Tensor g = make_f32({40}, ramp(40, 0.3f, 0.f)), b = make_f32({40}, ramp(40, 0.7f, 0.f));
  for (float& v : std::span(g.data_as<float>(), 40)) v = 1.0f + v / 6;
  for (float& v : std::span(b.data_as<float>(), 40)) v /= 10;
  check_half_norm(op("LayerNormalization", 17), DType::kFloat16, {t, g, b}, {}, 3,
                  "float16 LayerNormalization");
  check_half_norm(op("LayerNormalization", 17).i("axis", 1), DType::kBFloat16,
                  {t, make_f32({3, 40}, ramp(120, 0.05f, 1.f))}, {}, 1,
                  "bfloat16 LayerNormalization axis 1");
  check_half_norm(op("LayerNormalization", 17), DType::kFloat16, {t, g, b}, {}, 1,
                  "float16 LayerNormalization at --fp16", BuildPrecision::kFp16);
  check_half_norm(op("RMSNormalization", 23), DType::kFloat16, {t, g}, {}, 1,
                  "float16 RMSNormalization");
}

// LayerNormalization of half rows in every lane class of CUDA's warp kernel (4, 8, 16 lanes a row
// for rows of up to 16, 32, 64 vectors; a warp a row above), with row counts that leave part of
// the last block's rows past the end; RMSNormalization in two of them.
// The CUDA warp kernel's width classes (4-32 lanes a row, 1-8 vectors a lane, 8 halves or 4 floats
// a vector; rows past its limit take the block-per-row kernels) in float16, bfloat16 and float32.
TEST(NormOpsKernel, LayerNormRowsOfEveryWidthClassAndDtype) {
  for (int64_t n : {8, 96, 136, 192, 384, 520, 768, 1024, 2048}) {
    for (int64_t rows : {1, 37}) {
      Tensor t = make_f32({rows, n}, ramp(rows * n, 0.37f, 0.4f));
      Tensor g = make_f32({n}, ramp(n, 0.3f, 0.f)), b = make_f32({n}, ramp(n, 0.7f, 0.f));
      for (float& v : std::span(g.data_as<float>(), size_t(n))) v = 1.0f + v / 6;
      for (float& v : std::span(b.data_as<float>(), size_t(n))) v /= 10;
      const std::string label =
          "LayerNormalization " + std::to_string(rows) + "x" + std::to_string(n);
      for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
        check_half_norm(op("LayerNormalization", 17), dt, {t, g, b}, {}, 1,
                        label + " " + std::string(dtype_name(dt)), BuildPrecision::kFp16);
      }
      auto f32 = run_case({.node = op("LayerNormalization", 17),
                           .inputs = {t, g, b},
                           .expect_support = true,
                           .label = label + " float32"});
      ASSERT_TRUE(f32.ok()) << label << ": " << f32.status().to_string();
      if (n == 96 || n == 1024) {
        check_half_norm(op("RMSNormalization", 23), DType::kFloat16, {t, g}, {}, 1,
                        "RMSNormalization " + std::to_string(rows) + "x" + std::to_string(n),
                        BuildPrecision::kFp16);
        auto rms = run_case({.node = op("RMSNormalization", 23),
                             .inputs = {t, g},
                             .expect_support = true,
                             .label = "RMSNormalization float32"});
        ASSERT_TRUE(rms.ok()) << label << ": " << rms.status().to_string();
      }
    }
  }
}

TEST(NormOpsKernel, EmptyInputIsFine) {
  auto out = run_case(op("Softmax", 13), {make_f32({0, 4}, {})});
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  OpNode n = op("LayerNormalization", 17);
  out = run_case(n, {make_f32({0, 4}, {}), initializer(make_f32({4}, {1, 1, 1, 1}))});
  EXPECT_TRUE(out.ok()) << out.status().to_string();
}

// ---- RMS/Group/Instance/Lp/MeanVariance normalization, LRN ----

TEST(NormOpsInfer, GroupNormChecksGroupsAndParams) {
  OpNode n = op("GroupNormalization", 21);
  n.i("num_groups", 2);
  auto r = infer_node(n, {f32({kB, 4, 3}), f32({4}), f32({4})}, 1);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outputs[0].shape[0], kB);
  n.i("num_groups", 3);
  EXPECT_FALSE(infer_node(n, {f32({kB, 4, 3}), f32({4}), f32({4})}, 1).status.ok());
}

TEST(NormOpsKernel, RmsNormMatchesFormula) {
  std::vector<float> x = ramp(8, 0.9f, 0.2f);
  std::vector<float> w = {0.5f, 1.f, 1.5f, 2.f};
  OpNode n = op("RMSNormalization", 23);
  auto out = run_case(n, {make_f32({2, 4}, x), initializer(make_f32({4}, w))});
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

TEST(NormOpsKernel, RmsNormAxesBroadcastScaleAndDtypes) {
  // axis 1 over [2, 3, 4]: Scale [3, 1] broadcasts along the last normalized dim.
  std::vector<float> x = ramp(24, 0.7f, 0.3f);
  auto out = run_case(op("RMSNormalization", 23).i("axis", 1).f("epsilon", 1e-3f),
                      {make_f32({2, 3, 4}, x), make_f32({3, 1}, {0.5f, -1.f, 2.f})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  double sq = 0;
  for (int j = 0; j < 12; ++j) sq += double(x[j]) * x[j];
  EXPECT_NEAR((*out)[0].data_as<float>()[5], x[5] / std::sqrt(sq / 12 + 1e-3) * -1.0, 1e-5);
  // One-element Scale, float16 storage with stash_type 1.
  std::vector<uint16_t> h, one = {float_to_half(1.5f)};
  for (float f : x) h.push_back(float_to_half(f));
  out = run_case(op("RMSNormalization", 23).i("stash_type", 1),
                 {Tensor::from_vector(DType::kFloat16, {4, 6}, h),
                  Tensor::from_vector(DType::kFloat16, {1}, one)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].dtype(), DType::kFloat16);
  // float64, axis -2.
  std::vector<double> xd(x.begin(), x.end()), wd = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  out = run_case(op("RMSNormalization", 23).i("axis", -2),
                 {Tensor::from_vector(DType::kFloat64, {2, 3, 4}, xd),
                  Tensor::from_vector(DType::kFloat64, {3, 4}, wd)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_NEAR((*out)[0].data_as<double>()[0], xd[0] / std::sqrt(sq / 12 + 1e-5), 1e-9);
}

TEST(NormOpsKernel, InstanceNormZeroMeanUnitVariance) {
  std::vector<float> x = ramp(12, 0.7f, 1.0f);
  OpNode n = op("InstanceNormalization", 22);
  n.f("epsilon", 0.f);
  auto out = run_case(n, {make_f32({1, 2, 6}, x), make_f32({2}, {1, 1}), make_f32({2}, {0, 0})});
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
  OpNode g = op("GroupNormalization", 21);
  g.i("num_groups", 4);
  auto a = run_case(g, {make_f32({1, 4, 6}, x), sc, bi});
  auto b = run_case(op("InstanceNormalization", 22), {make_f32({1, 4, 6}, x), sc, bi});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(testing::all_close((*a)[0], (*b)[0]));
  // Two groups normalize over two channels at once, which differs.
  g.i("num_groups", 2);
  auto c = run_case(g, {make_f32({1, 4, 6}, x), sc, bi});
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(testing::all_close((*a)[0], (*c)[0]));
}

TEST(NormOpsKernel, LpNormalizationAndLrn) {
  auto out = run_case(op("LpNormalization", 22), {make_f32({2, 2}, {3, 4, 0, 0})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({2, 2}, {0.6f, 0.8f, 0, 0})));
  OpNode lrn = op("LRN", 13);
  lrn.i("size", 3);
  lrn.f("alpha", 3.f);
  lrn.f("beta", 1.f);
  lrn.f("bias", 1.f);
  // Channels [1, 2, 3] at one pixel: window sums of squares 5, 14, 13.
  out = run_case(lrn, {make_f32({1, 3, 1, 1}, {1, 2, 3})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({1, 3, 1, 1}, {1.f / 6, 2.f / 15, 3.f / 14})));
}

// ---- per-channel normalizations against the formulas, over sizes that span several warps ----

// (x - mean) / sqrt(var + eps) * scale[c] + bias[c] over groups of `cpg` channels of X [n, c, ...].
std::vector<float> grouped_norm_reference(const std::vector<float>& x, int64_t n, int64_t c,
                                          int64_t spatial, int64_t groups,
                                          const std::vector<float>& scale,
                                          const std::vector<float>& bias, double eps) {
  std::vector<float> y(x.size());
  int64_t cpg = c / groups, block = cpg * spatial;
  bool per_group = int64_t(scale.size()) != c;
  for (int64_t b = 0; b < n * groups; ++b) {
    double s = 0, sq = 0;
    for (int64_t j = 0; j < block; ++j) s += x[size_t(b * block + j)];
    double mean = s / double(block);
    for (int64_t j = 0; j < block; ++j)
      sq += (x[size_t(b * block + j)] - mean) * (x[size_t(b * block + j)] - mean);
    double inv = 1.0 / std::sqrt(sq / double(block) + eps);
    for (int64_t j = 0; j < block; ++j) {
      int64_t g = b % groups, pi = per_group ? g : g * cpg + j / spatial;
      y[size_t(b * block + j)] =
          float((x[size_t(b * block + j)] - mean) * inv * scale[size_t(pi)] + bias[size_t(pi)]);
    }
  }
  return y;
}

TEST(NormOpsKernel, BatchNormOpsets9And14RanksThreeAndFive) {
  std::vector<float> scale = {1.5f, -0.5f}, bias = {0.1f, 0.2f}, mean = {0.5f, -1.0f},
                     var = {1.0f, 4.0f};
  for (auto [opset, shape] :
       std::vector<std::pair<int, Shape>>{{9, {3, 2, 5}}, {14, {1, 2, 2, 3, 2}}}) {
    std::vector<float> x = ramp(shape_numel(shape), 0.37f, -2.f);
    OpNode n = op("BatchNormalization", opset);
    auto out =
        run_case(n, {make_f32(shape, x), initializer(make_f32({2}, scale)),
                     initializer(make_f32({2}, bias)), make_f32({2}, mean), make_f32({2}, var)});
    ASSERT_TRUE(out.ok()) << opset << ": " << out.status().to_string();
    int64_t spatial = shape_numel(shape) / (shape[0] * 2);
    std::vector<float> e(x.size());
    for (size_t k = 0; k < x.size(); ++k) {
      size_t c = size_t(int64_t(k) / spatial % 2);
      e[k] = float((x[k] - mean[c]) / std::sqrt(double(var[c]) + 1e-5) * scale[c] + bias[c]);
    }
    EXPECT_TRUE(testing::all_close((*out)[0], make_f32(shape, e))) << opset;
  }
  // Training mode normalizes with the batch's statistics, not the given ones: channel 0 holds
  // {1, 2} (mean 1.5, variance 0.25), channel 1 {3, 4} (mean 3.5, variance 0.25).
  OpNode t = op("BatchNormalization", 15);
  t.i("training_mode", 1);
  auto out = run_case(t, {make_f32({1, 2, 2}, {1, 2, 3, 4}), make_f32({2}, scale),
                          make_f32({2}, bias), make_f32({2}, mean), make_f32({2}, var)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  std::vector<float> e;
  for (int k = 0; k < 4; ++k) {
    const size_t c = size_t(k / 2);
    e.push_back(float((k + 1 - (c ? 3.5 : 1.5)) / std::sqrt(0.25 + 1e-5) * scale[c] + bias[c]));
  }
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({1, 2, 2}, e)));
}

TEST(NormOpsKernel, GroupAndInstanceNormOverManyElements) {
  // 2 samples, 6 channels, 300 spatial: groups of 900 elements, several warps per block.
  int64_t n = 2, c = 6, sp = 300;
  std::vector<float> x = ramp(n * c * sp, 0.013f, -1.7f);
  for (size_t i = 0; i < x.size(); i += 7) x[i] += 3.f;  // not a pure ramp
  std::vector<float> sc6 = {1, -2, 0.5f, 3, 1, 2}, bi6 = {0.1f, 0.2f, 0.3f, -0.4f, 0, 1};
  std::vector<float> sc3 = {2, -1, 0.5f}, bi3 = {-0.5f, 0, 0.25f};
  OpNode g21 = op("GroupNormalization", 21);
  g21.i("num_groups", 3);
  auto out = run_case(g21, {make_f32({n, c, sp}, x), initializer(make_f32({6}, sc6)),
                            initializer(make_f32({6}, bi6))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close(
      (*out)[0], make_f32({n, c, sp}, grouped_norm_reference(x, n, c, sp, 3, sc6, bi6, 1e-5))));
  // Opset 18: scale and bias per group.
  OpNode g18 = op("GroupNormalization", 18);
  g18.i("num_groups", 3);
  g18.f("epsilon", 1e-3f);
  out = run_case(g18, {make_f32({n, c, sp}, x), initializer(make_f32({3}, sc3)),
                       initializer(make_f32({3}, bi3))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close(
      (*out)[0],
      make_f32({n, c, sp}, grouped_norm_reference(x, n, c, sp, 3, sc3, bi3, double(1e-3f)))));
  out = run_case(op("InstanceNormalization", 6),
                 {make_f32({n, c, 15, 20}, x), make_f32({6}, sc6), make_f32({6}, bi6)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close(
      (*out)[0], make_f32({n, c, 15, 20}, grouped_norm_reference(x, n, c, sp, 6, sc6, bi6, 1e-5))));
}

// BatchNormalization, GroupNormalization and InstanceNormalization of NCHW X in every float dtype
// over sizes the CUDA fast paths take: BatchNorm's per-block factor table with 16-byte vectors
// ([2, 16, 8, 8]) and one element per thread (a 7x7 plane), GroupNorm's rows split over a
// thread-block cluster (8 groups of 4 channels of 16x16: 4 blocks a row; of 15x15: 8 blocks a row,
// one element per thread), with per-channel and (opset 18) per-group parameters, and X far from
// zero mean so that the statistics' precision shows.
TEST(NormOpsKernel, ChannelPlaneFastPathsInEveryFloatDtype) {
  auto params = [](int64_t c, float scale, float offset) {
    std::vector<float> v = ramp(c, scale, 0.f);
    for (float& e : v) e = offset + e / 6;
    return v;
  };
  for (Shape shape : std::vector<Shape>{{2, 16, 8, 8}, {3, 5, 7, 7}}) {
    const int64_t n = shape_numel(shape), c = shape[1], spatial = n / (shape[0] * c);
    std::vector<float> x = ramp(n, 0.37f, 0.4f), scale = params(c, 1.1f, 1.f),
                       bias = params(c, 0.5f, 0.f), mean = params(c, 0.9f, 0.2f),
                       var = params(c, 0.7f, 1.f);
    std::vector<float> e(x.size());
    for (size_t k = 0; k < x.size(); ++k) {
      const size_t ch = size_t(int64_t(k) / spatial % c);
      e[k] = float((x[k] - mean[ch]) / std::sqrt(double(var[ch]) + double(1e-3f)) * scale[ch] +
                   bias[ch]);
    }
    const std::string label = "BatchNormalization " + shape_to_string(shape);
    OpNode bn = op("BatchNormalization", 15).f("epsilon", 1e-3f);
    const std::vector<Tensor> in = {make_f32(shape, x), make_f32({c}, scale), make_f32({c}, bias),
                                    make_f32({c}, mean), make_f32({c}, var)};
    auto out = run_case({.node = bn,
                         .inputs = {in[0], initializer(in[1]), initializer(in[2]),
                                    initializer(in[3]), initializer(in[4])},
                         .expected = {make_f32(shape, e)},
                         .expect_support = true,
                         .label = label});
    ASSERT_TRUE(out.ok()) << label << ": " << out.status().to_string();
    for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
      check_half_norm(bn, dt, in, {}, 1, label + " " + std::string(dtype_name(dt)));
    }
  }
  struct GroupCase {
    Shape shape;
    int64_t groups;
    bool per_group;
    float offset;
  };
  for (const GroupCase& g :
       {GroupCase{{2, 32, 16, 16}, 8, false, 0.4f}, GroupCase{{2, 32, 15, 15}, 8, false, 10.f},
        GroupCase{{2, 32, 16, 16}, 8, true, -5.f}, GroupCase{{1, 4, 64, 64}, 4, false, 0.f}}) {
    const int64_t n = shape_numel(g.shape), c = g.shape[1], spatial = n / (g.shape[0] * c);
    std::vector<float> x = ramp(n, 0.013f, g.offset);
    for (size_t i = 0; i < x.size(); i += 7) x[i] += 1.5f;  // not a pure sine
    const int64_t pn = g.per_group ? g.groups : c;
    std::vector<float> scale = params(pn, 1.1f, 1.f), bias = params(pn, 0.5f, 0.f);
    OpNode gn = op("GroupNormalization", g.per_group ? 18 : 21).i("num_groups", g.groups);
    const std::string label = "GroupNormalization " + shape_to_string(g.shape) + " " +
                              std::to_string(g.groups) + " groups" +
                              (g.per_group ? " per group" : "");
    const std::vector<Tensor> in = {make_f32(g.shape, x), make_f32({pn}, scale),
                                    make_f32({pn}, bias)};
    auto out = run_case(
        {.node = gn,
         .inputs = {in[0], initializer(in[1]), initializer(in[2])},
         .expected = {make_f32(g.shape, grouped_norm_reference(x, g.shape[0], c, spatial, g.groups,
                                                               scale, bias, double(1e-5f)))},
         .expect_support = true,
         .label = label});
    ASSERT_TRUE(out.ok()) << label << ": " << out.status().to_string();
    for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
      check_half_norm(gn, dt, in, {}, 1, label + " " + std::string(dtype_name(dt)));
    }
    if (g.groups == c) {
      OpNode in_norm = op("InstanceNormalization", 22);
      auto r = run_case({.node = in_norm,
                         .inputs = {in[0], initializer(in[1]), initializer(in[2])},
                         .expect_support = true,
                         .label = "InstanceNormalization " + shape_to_string(g.shape)});
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      EXPECT_TRUE(testing::all_close((*r)[0], (*out)[0]));
    }
  }
}

TEST(NormOpsKernel, LpNormalizationL1AndMiddleAxis) {
  // [2, 3, 2], axis 1, p = 1: each (b, :, j) line divided by its absolute sum.
  std::vector<float> x = {1, -2, 3, 0, -4, 2, 0, 1, 0, 1, 0, -2};
  OpNode n = op("LpNormalization", 1);
  n.i("axis", 1);
  n.i("p", 1);
  auto out = run_case(n, {make_f32({2, 3, 2}, x)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  std::vector<float> e = {1.f / 8, -2.f / 4, 3.f / 8, 0,       -4.f / 8, 2.f / 4,
                          0,       1.f / 4,  0,       1.f / 4, 0,        -2.f / 4};
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({2, 3, 2}, e)));
  n.i("p", 2);
  out = run_case(n, {make_f32({2, 3, 2}, x)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  float r0 = std::sqrt(26.f), r1 = std::sqrt(8.f);
  EXPECT_NEAR((*out)[0].data_as<float>()[0], 1 / r0, 1e-6);
  EXPECT_NEAR((*out)[0].data_as<float>()[5], 2 / r1, 1e-6);
}

// ---- MeanVarianceNormalization and LRN over every float dtype (CUDA: channel_norm.cu) ----

const DType kFloatDtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64};

std::vector<double> wave(int64_t n, double scale, double offset) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = std::sin(double(i) * scale) * 2.0 + std::cos(double(i) * 0.37) + offset;
  return v;
}

void expect_supported(OpNode n, std::vector<testing::CaseInput> in) {
  testing::KernelCase c{.node = std::move(n), .inputs = std::move(in), .expect_support = true};
  auto r = run_case(c);
  EXPECT_TRUE(r.ok()) << c.node.node.describe() << ": " << r.status().to_string();
}

// The ONNX node test's input (test_mvn) against its formula: per channel over N, H and W.
TEST(NormOpsKernel, MeanVarianceNormalizationOnnxCase) {
  std::vector<float> x = {
      0.8439683f,  0.5665144f, 0.05836735f, 0.02916367f, 0.12964272f, 0.5060197f, 0.79538304f,
      0.9411346f,  0.9546573f, 0.17730942f, 0.46192095f, 0.26480448f, 0.6746842f, 0.01665257f,
      0.62473077f, 0.9240844f, 0.9722341f,  0.11965699f, 0.41356155f, 0.9129373f, 0.59330076f,
      0.81929934f, 0.7862604f, 0.11799799f, 0.69248444f, 0.54119414f, 0.07513223f};
  std::vector<float> y(x.size());
  for (int c = 0; c < 3; ++c) {
    double s = 0, sq = 0;
    for (int n = 0; n < 3; ++n) {
      for (int h = 0; h < 3; ++h) {
        double v = x[size_t((n * 3 + c) * 3 + h)];
        s += v, sq += v * v;
      }
    }
    double mean = s / 9, sd = std::sqrt(sq / 9 - mean * mean);
    for (int n = 0; n < 3; ++n) {
      for (int h = 0; h < 3; ++h)
        y[size_t((n * 3 + c) * 3 + h)] =
            float((x[size_t((n * 3 + c) * 3 + h)] - mean) / (sd + 1e-9));
    }
  }
  testing::KernelCase c{.node = op("MeanVarianceNormalization", 13),
                        .inputs = {make_f32({3, 3, 3, 1}, x)},
                        .expected = {make_f32({3, 3, 3, 1}, y)},
                        .expect_support = true};
  auto r = run_case(c);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
}

// Default and explicit axes (leading, middle, trailing, negative, all), reductions of a few to a
// few thousand elements (several passes of a block), in every float dtype.
TEST(NormOpsKernel, MeanVarianceNormalizationAxesAndDtypes) {
  for (DType dt : kFloatDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    auto mvn = [] { return op("MeanVarianceNormalization", 13); };
    expect_supported(mvn(), {testing::make_typed(dt, {2, 3, 4, 5}, wave(120, 0.3, 0.5))});
    expect_supported(mvn().ints("axes", {1}),
                     {testing::make_typed(dt, {2, 3, 4, 5}, wave(120, 0.7, -0.25))});
    expect_supported(mvn().ints("axes", {-1}), {testing::make_typed(dt, {6, 7}, wave(42, 1.1, 0))});
    expect_supported(mvn().ints("axes", {0, 1, 2, 3}),
                     {testing::make_typed(dt, {2, 3, 4, 5}, wave(120, 0.2, 1))});
    expect_supported(mvn().ints("axes", {0, 2}),
                     {testing::make_typed(dt, {3, 40, 30}, wave(3600, 0.013, 0.1))});
    expect_supported(mvn(), {testing::make_typed(dt, {2, 3, 40, 50}, wave(12000, 0.0021, -0.3))});
  }
}

// The ONNX cases' attributes (test_lrn, test_lrn_default), an even size (the window reaches one
// channel more above than below), a window wider than the channels, ranks 2 to 5, every float
// dtype.
TEST(NormOpsKernel, LrnSizesRanksAndDtypes) {
  for (DType dt : kFloatDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    auto x = [&](Shape shape, double scale) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      return testing::make_typed(dt, std::move(shape), wave(n, scale, 0.2));
    };
    expect_supported(op("LRN", 13).i("size", 3).f("alpha", 0.0002f).f("beta", 0.5f).f("bias", 2.f),
                     {x({5, 5, 5, 5}, 0.31)});
    expect_supported(op("LRN", 13).i("size", 3), {x({5, 5, 5, 5}, 0.17)});
    expect_supported(op("LRN", 13).i("size", 4).f("alpha", 2.f).f("beta", 0.75f),
                     {x({2, 6, 3, 4}, 0.23)});
    expect_supported(op("LRN", 13).i("size", 9).f("alpha", 0.5f).f("beta", 1.5f).f("bias", 0.5f),
                     {x({2, 5, 7}, 0.41)});
    expect_supported(op("LRN", 13).i("size", 1).f("alpha", 1.f), {x({3, 8}, 0.53)});
    expect_supported(op("LRN", 13).i("size", 5).f("alpha", 0.1f), {x({1, 7, 2, 3, 4}, 0.29)});
  }
}

}  // namespace
}  // namespace kiln
