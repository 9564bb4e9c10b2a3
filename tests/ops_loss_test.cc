// Loss op family: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss kernels (every backend)
// over reductions, class weights, ignore_index, extra spatial dims, dtypes and log_prob.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "op_harness.h"

namespace kiln {
namespace {

using testing::make_f32;
using testing::make_i64;
using testing::op;
using testing::run_case;

std::vector<float> ramp(int64_t n, float scale, float offset) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = std::sin(float(i) * scale) * 2.0f + offset;
  return v;
}

TEST(LossKernel, NllReductionsWeightsAndIgnoreIndex) {
  // [N=3, C=4]: the loss of sample b is -x[b, t_b] * w[t_b]; sample 2 is ignored.
  std::vector<float> x = ramp(12, 0.7f, -0.5f), w = {0.5f, 1.0f, 2.0f, 1.5f};
  std::vector<int64_t> t = {1, 3, 2};
  auto n = [](const char* r) {
    return op("NegativeLogLikelihoodLoss", 22).s("reduction", r).i("ignore_index", 2);
  };
  auto out = run_case(n("none"), {make_f32({3, 4}, x), make_i64({3}, t), make_f32({4}, w)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const float* y = (*out)[0].data_as<float>();
  EXPECT_FLOAT_EQ(y[0], -x[1] * w[1]);
  EXPECT_FLOAT_EQ(y[1], -x[7] * w[3]);
  EXPECT_EQ(y[2], 0.0f);
  out = run_case(n("mean"), {make_f32({3, 4}, x), make_i64({3}, t), make_f32({4}, w)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_NEAR((*out)[0].data_as<float>()[0], (-x[1] * w[1] - x[7] * w[3]) / (w[1] + w[3]), 1e-6);
  out = run_case(n("sum"), {make_f32({3, 4}, x), make_i64({3}, t)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_NEAR((*out)[0].data_as<float>()[0], -x[1] - x[7], 1e-6);
  // Spatial dims [N=2, C=3, 2, 2], int32 targets, unweighted mean.
  std::vector<int32_t> t32 = {0, 1, 2, 1, 2, 2, 0, 1};
  out = run_case(op("NegativeLogLikelihoodLoss", 22),
                 {make_f32({2, 3, 2, 2}, ramp(24, 0.3f, 0.1f)),
                  Tensor::from_vector(DType::kInt32, {2, 2, 2}, t32)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].numel(), 1);
}

TEST(LossKernel, SoftmaxCrossEntropyWithLogProbAndDtypes) {
  // [N=2, C=3, d=2] with log_prob: each (b, e) column of log_prob log-sum-exps to 0.
  std::vector<float> x = ramp(12, 0.9f, 0.2f);
  auto out = run_case(op("SoftmaxCrossEntropyLoss", 13).s("reduction", "none"),
                      {make_f32({2, 3, 2}, x), make_i64({2, 2}, {0, 2, 1, 1})}, 2);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const float* lp = (*out)[1].data_as<float>();
  double s = 0;
  for (int k = 0; k < 3; ++k) s += std::exp(double(lp[k * 2]));
  EXPECT_NEAR(s, 1.0, 1e-6);
  EXPECT_FLOAT_EQ((*out)[0].data_as<float>()[1], -lp[2 * 2 + 1]);  // (b 0, e 1) picks class 2
  // Weighted mean with ignore_index, float64.
  std::vector<double> xd(x.begin(), x.end()), wd = {1.0, 0.25, 3.0};
  out = run_case(op("SoftmaxCrossEntropyLoss", 13).i("ignore_index", 1),
                 {Tensor::from_vector(DType::kFloat64, {2, 3, 2}, xd),
                  make_i64({2, 2}, {0, 2, 1, 1}), Tensor::from_vector(DType::kFloat64, {3}, wd)},
                 2);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].dtype(), DType::kFloat64);
  // Many classes (several passes of a block), sum.
  out = run_case(op("SoftmaxCrossEntropyLoss", 13).s("reduction", "sum"),
                 {make_f32({2, 1000}, ramp(2000, 0.013f, 0.0f)), make_i64({2}, {999, 3})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_GT((*out)[0].data_as<float>()[0], 0.0f);
}

}  // namespace
}  // namespace kiln
