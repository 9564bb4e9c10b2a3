// kiln::SqueezeExcite, the gate fuse_squeeze_excite makes of a pool and two 1x1 convolutions:
// kernel cases on every backend against a naive loop in double, both layouts, MobileNetV3-sized
// and odd channel counts, each activation pair, and float16/bfloat16 as the precision pass leaves
// them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "op_harness.h"

namespace kiln {
namespace {

using testing::make_f32;
using testing::op;
using testing::OpNode;
using testing::run_case;

std::vector<float> random_values(size_t n, uint32_t seed, float scale) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 11;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = scale * (float(s >> 8) / float(1 << 23) - 1.f);
  }
  return v;
}

double act(const std::string& a, double y) {
  if (a == "relu") return std::max(y, 0.0);
  if (a == "hardsigmoid") return std::clamp(y / 6 + 0.5, 0.0, 1.0);
  if (a == "sigmoid") return 1 / (1 + std::exp(-y));
  if (a == "hardswish") return y * std::clamp(y / 6 + 0.5, 0.0, 1.0);
  if (a == "silu") return y / (1 + std::exp(-y));
  return y;
}

std::vector<float> params(const std::string& a) {
  return a == "hardsigmoid" ? std::vector<float>{1.f / 6, 0.5f} : std::vector<float>{};
}

// G[n, c] = act2(B2 + W2 . act1(B1 + W1 . mean_hw(X[n, c])))
Tensor naive_gate(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                  const Tensor& b2, bool nhwc, const std::string& a1, const std::string& a2) {
  const Shape& s = x.shape();
  const int64_t n = s[0], c = nhwc ? s[3] : s[1], hw = nhwc ? s[1] * s[2] : s[2] * s[3],
                cs = b1.numel();
  std::vector<float> g(size_t(n * c));
  for (int64_t b = 0; b < n; ++b) {
    std::vector<double> mean(static_cast<size_t>(c)), hidden(static_cast<size_t>(cs));
    for (int64_t ch = 0; ch < c; ++ch) {
      double sum = 0;
      for (int64_t p = 0; p < hw; ++p) {
        sum += x.float_at(nhwc ? (b * hw + p) * c + ch : (b * c + ch) * hw + p);
      }
      mean[size_t(ch)] = sum / double(hw);
    }
    for (int64_t j = 0; j < cs; ++j) {
      double y = b1.float_at(j);
      for (int64_t ch = 0; ch < c; ++ch) y += w1.float_at(j * c + ch) * mean[size_t(ch)];
      hidden[size_t(j)] = act(a1, y);
    }
    for (int64_t ch = 0; ch < c; ++ch) {
      double y = b2.float_at(ch);
      for (int64_t j = 0; j < cs; ++j) y += w2.float_at(ch * cs + j) * hidden[size_t(j)];
      g[size_t(b * c + ch)] = float(act(a2, y));
    }
  }
  return make_f32(nhwc ? Shape{n, 1, 1, c} : Shape{n, c, 1, 1}, g);
}

TEST(SqueezeExciteKernel, BothLayoutsEverySizeAgainstANaiveLoop) {
  struct Size {
    int64_t n, c, cs, h, w;
  };
  // MobileNetV3-Large's largest gate (960 channels, 240 hidden, 7x7), a 28x28 one with fewer
  // channels than a block has threads, and odd sizes; up to 4 images the CUDA kernel pools in
  // its hidden-unit blocks, above that in a pool kernel of its own with 8 images a block (11 and
  // 9: a partial last group).
  const Size sizes[] = {{2, 960, 240, 7, 7}, {3, 72, 24, 28, 28},  {1, 5, 3, 7, 9},
                        {4, 33, 8, 1, 1},    {11, 960, 240, 7, 7}, {9, 72, 24, 28, 28},
                        {6, 33, 8, 3, 2}};
  const std::pair<const char*, const char*> acts[] = {
      {"relu", "hardsigmoid"}, {"silu", "sigmoid"}, {"hardswish", "none"}};
  uint32_t seed = 1;
  for (const Size& z : sizes) {
    for (bool nhwc : {false, true}) {
      for (const auto& [a1, a2] : acts) {
        const Shape xs = nhwc ? Shape{z.n, z.h, z.w, z.c} : Shape{z.n, z.c, z.h, z.w};
        const Tensor x = make_f32(xs, random_values(size_t(shape_numel(xs)), seed++, 2.f));
        const Shape w1s = nhwc ? Shape{z.cs, 1, 1, z.c} : Shape{z.cs, z.c, 1, 1};
        const Shape w2s = nhwc ? Shape{z.c, 1, 1, z.cs} : Shape{z.c, z.cs, 1, 1};
        const float s1 = 1.f / std::sqrt(float(z.c)), s2 = 1.f / std::sqrt(float(z.cs));
        const Tensor w1 = make_f32(w1s, random_values(size_t(z.cs * z.c), seed++, s1));
        const Tensor b1 = make_f32({z.cs}, random_values(size_t(z.cs), seed++, 0.5f));
        const Tensor w2 = make_f32(w2s, random_values(size_t(z.c * z.cs), seed++, s2));
        const Tensor b2 = make_f32({z.c}, random_values(size_t(z.c), seed++, 0.5f));
        OpNode node = op("SqueezeExcite", 1, "kiln")
                          .named("se0")
                          .s("layout", nhwc ? "NHWC" : "NCHW")
                          .s("activation1", a1)
                          .floats("activation1_params", params(a1))
                          .s("activation2", a2)
                          .floats("activation2_params", params(a2));
        const std::string label = std::string(nhwc ? "NHWC" : "NCHW") +
                                  " c=" + std::to_string(z.c) + " cs=" + std::to_string(z.cs) +
                                  " hw=" + std::to_string(z.h * z.w) + " " + a1 + "/" + a2;
        auto r = run_case({.node = node,
                           .inputs = {x, w1, b1, w2, b2},
                           .expected = {naive_gate(x, w1, b1, w2, b2, nhwc, a1, a2)},
                           .expect_support = true,
                           .label = label});
        ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
        for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
          auto h = testing::run_reduced_case(
              {.node = node, .inputs = {x, w1, b1, w2, b2}, .expect_support = true, .label = label},
              dt);
          ASSERT_TRUE(h.ok()) << label << " " << dtype_name(dt) << ": " << h.status().to_string();
          EXPECT_EQ((*h)[0].dtype(), dt) << label;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln
