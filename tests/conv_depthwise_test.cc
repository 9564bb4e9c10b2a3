// Channels-last depthwise kiln::FusedConv (cuda.FusedConv, conv_depthwise.cu, where CUDA is
// present; the CPU reference everywhere) against a naive loop in double: MobileNetV3's 3x3 and
// 5x5 filters at strides 1 and 2, SAME padding, a 7x7 dilated filter with uneven padding (the
// kernel's generic path), 3x3 and 5x5 filters at stride 2 and 5x5 and 7x7 at stride 1 (the strip
// kernel; ConvNeXt's 7x7), each activation, float16 and bfloat16 as the precision pass leaves
// them, a MobileNet-sized layer (8x56x56x72: 1.8 million outputs), and input_activation (the tile
// kernel's alone). Each tactic that fits a case is forced in turn.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model_util.h"
#include "op_harness.h"
#include "test_util.h"

namespace kiln {
namespace {

using testing::initializer;
using testing::make_f32;
using testing::op;
using testing::OpNode;
using testing::run_case;

double act(const std::string& a, double y) {
  if (a == "relu") return std::max(y, 0.0);
  if (a == "hardswish") return y * std::clamp(y / 6 + 0.5, 0.0, 1.0);
  if (a == "silu") return y / (1 + std::exp(-y));
  if (a == "gelu") return 0.5 * y * (1 + std::erf(y / std::sqrt(2.0)));
  return y;
}

struct Case {
  int64_t n, h, w, c, k, stride, dilation;
  std::vector<int64_t> pads;  // top, left, bottom, right; empty with auto_pad
  std::string auto_pad, activation;
  bool bias;
  std::string input_activation = "none";  // applied to X before the convolution
};

int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t d, int64_t before, int64_t after) {
  return (in + before + after - (k - 1) * d - 1) / s + 1;
}

// Y[n, oh, ow, c] = act(B[c] + sum over the taps of X[n, ih, iw, c] * W[c, a, b, 0]).
Tensor naive(const Tensor& x, const Tensor& w, const Tensor* b, const Case& z, int64_t pt,
             int64_t pl, int64_t oh, int64_t ow) {
  std::vector<float> y(size_t(z.n * oh * ow * z.c));
  for (int64_t n = 0; n < z.n; ++n) {
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        for (int64_t c = 0; c < z.c; ++c) {
          double s = b ? b->float_at(c) : 0.0;
          for (int64_t a = 0; a < z.k; ++a) {
            const int64_t ih = i * z.stride - pt + a * z.dilation;
            if (ih < 0 || ih >= z.h) continue;
            for (int64_t e = 0; e < z.k; ++e) {
              const int64_t iw = j * z.stride - pl + e * z.dilation;
              if (iw < 0 || iw >= z.w) continue;
              s += act(z.input_activation, x.float_at(((n * z.h + ih) * z.w + iw) * z.c + c)) *
                   w.float_at((c * z.k + a) * z.k + e);
            }
          }
          y[size_t(((n * oh + i) * ow + j) * z.c + c)] = float(act(z.activation, s));
        }
      }
    }
  }
  return make_f32({z.n, oh, ow, z.c}, y);
}

TEST(DepthwiseConvNhwc, EveryShapeAndPrecisionAgainstANaiveLoop) {
  const Case cases[] = {
      {2, 11, 13, 72, 3, 1, 1, {1, 1, 1, 1}, "NOTSET", "relu", true},
      {3, 14, 14, 16, 3, 2, 1, {1, 1, 1, 1}, "NOTSET", "hardswish", true},
      {2, 9, 10, 40, 5, 2, 1, {2, 2, 2, 2}, "NOTSET", "hardswish", true},
      {1, 7, 7, 960, 5, 1, 1, {}, "SAME_UPPER", "hardswish", true},
      {2, 12, 9, 24, 5, 2, 1, {}, "SAME_LOWER", "silu", true},
      // Stride 2 with uneven pads and odd sizes (the strip's last strip part outside Y).
      {2, 15, 13, 32, 3, 2, 1, {0, 1, 1, 0}, "NOTSET", "relu", true},
      {1, 14, 14, 672, 5, 2, 1, {2, 2, 2, 2}, "NOTSET", "hardswish", true},
      {2, 10, 11, 8, 7, 1, 2, {3, 5, 6, 4}, "NOTSET", "none", false},
      {8, 56, 56, 72, 3, 1, 1, {1, 1, 1, 1}, "NOTSET", "relu", true},
      // Stride 1, 5x5 and 7x7: the strip kernel (4 output pixels a thread); widths that are and
      // are not a multiple of 4, narrower than a strip, uneven pads, ConvNeXt's 7x7 pad 3.
      {2, 13, 17, 96, 7, 1, 1, {3, 3, 3, 3}, "NOTSET", "none", true},
      {4, 28, 28, 192, 7, 1, 1, {3, 3, 3, 3}, "NOTSET", "gelu", true},
      {2, 9, 10, 16, 7, 1, 1, {1, 3, 4, 2}, "NOTSET", "relu", true},
      {1, 5, 3, 8, 7, 1, 1, {3, 3, 3, 3}, "NOTSET", "none", false},
      {2, 11, 6, 24, 5, 1, 1, {2, 2, 2, 2}, "NOTSET", "silu", true},
      // The tile kernel alone: an input_activation (EfficientNet's SiLU after the 1x1
      // expansion), at strides 1 and 2, tiles that do and do not divide the output, channel
      // counts under, at and past a block's 64, EfficientNetV2's 12x12x1536 and 24x24x960.
      {2, 13, 11, 24, 3, 1, 1, {1, 1, 1, 1}, "NOTSET", "silu", true, "silu"},
      {3, 15, 17, 72, 3, 2, 1, {1, 1, 1, 1}, "NOTSET", "silu", true, "silu"},
      {2, 9, 10, 40, 5, 2, 1, {2, 2, 2, 2}, "NOTSET", "hardswish", true, "hardswish"},
      {1, 7, 7, 136, 5, 1, 1, {}, "SAME_UPPER", "none", false, "relu"},
      {2, 12, 12, 1536, 3, 1, 1, {1, 1, 1, 1}, "NOTSET", "silu", true, "silu"},
      {2, 24, 24, 960, 3, 1, 1, {1, 1, 1, 1}, "NOTSET", "silu", true, "silu"},
      {2, 20, 19, 64, 7, 1, 1, {3, 3, 3, 3}, "NOTSET", "gelu", true, "gelu"},
  };
  uint64_t seed = 1;
  for (const Case& z : cases) {
    int64_t pt = 0, pl = 0, pb = 0, pr = 0;
    if (!z.pads.empty()) {
      pt = z.pads[0], pl = z.pads[1], pb = z.pads[2], pr = z.pads[3];
    } else {
      auto same = [&](int64_t in, int64_t* before, int64_t* after) {
        const int64_t total = std::max<int64_t>(
            ((in + z.stride - 1) / z.stride - 1) * z.stride + (z.k - 1) * z.dilation + 1 - in, 0);
        *before = z.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
        *after = total - *before;
      };
      same(z.h, &pt, &pb);
      same(z.w, &pl, &pr);
    }
    const int64_t oh = out_size(z.h, z.k, z.stride, z.dilation, pt, pb);
    const int64_t ow = out_size(z.w, z.k, z.stride, z.dilation, pl, pr);
    // X in [-2, 2), W and B in [-0.5, 0.5).
    auto scaled = [](Tensor t, float k) {
      for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] *= k;
      return t;
    };
    const Tensor x = scaled(testing::random_f32({z.n, z.h, z.w, z.c}, seed++), 2.f);
    const Tensor w = scaled(testing::random_f32({z.c, z.k, z.k, 1}, seed++), 0.5f);
    const Tensor b = scaled(testing::random_f32({z.c}, seed++), 0.5f);
    OpNode node = op("FusedConv", 1, "kiln")
                      .named("dw")
                      .s("layout", "NHWC")
                      .i("group", z.c)
                      .ints("kernel_shape", {z.k, z.k})
                      .ints("strides", {z.stride, z.stride})
                      .ints("dilations", {z.dilation, z.dilation})
                      .s("activation", z.activation);
    if (z.input_activation != "none") node.s("input_activation", z.input_activation);
    if (z.pads.empty()) {
      node.s("auto_pad", z.auto_pad);
    } else {
      node.ints("pads", z.pads);
    }
    const std::string label = "n=" + std::to_string(z.n) + " " + std::to_string(z.h) + "x" +
                              std::to_string(z.w) + "x" + std::to_string(z.c) +
                              " k=" + std::to_string(z.k) + " s=" + std::to_string(z.stride) +
                              " d=" + std::to_string(z.dilation) + " " + z.activation +
                              (z.input_activation != "none" ? " in " + z.input_activation : "");
    std::vector<testing::CaseInput> inputs = {x, initializer(w)};
    if (z.bias) inputs.push_back(initializer(b));
    // cuDNN (the float32 node) pads symmetrically only and applies no input_activation; the
    // uneven cases are for this kernel, whose refusal the coverage check below would catch.
    const bool even = pt == pb && pl == pr;
    const bool in_act = z.input_activation != "none";
    // Each of cuda.FusedConv's tactics that fits, whichever the build timed faster: the strip and
    // the tile at strides 1 and 2 (7x7 at 1), one pixel a thread everywhere but where an
    // input_activation leaves the tile alone.
    const bool square = z.dilation == 1 && (z.k == 3 || z.k == 5 || z.k == 7);
    const bool strided = square && (z.stride == 1 || (z.stride == 2 && z.k <= 5));
    std::vector<std::string> tactics;
    if (!in_act) tactics.push_back("pixel");
    if (!in_act && strided) tactics.push_back("strip4");
    if (strided) tactics.push_back("tile");
    auto r = run_case({.node = node,
                       .inputs = inputs,
                       .expected = {naive(x, w, z.bias ? &b : nullptr, z, pt, pl, oh, ow)},
                       .expect_support = even && !in_act,
                       .label = label});
    ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
    for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
      auto h = testing::run_reduced_case({.node = node,
                                          .inputs = inputs,
                                          .expect_support = even,
                                          .label = label,
                                          .tactics_of = "cuda.FusedConv",
                                          .tactics = tactics,
                                          .tactics_over = {"cuda.cudnn_graph.FusedConv"}},
                                         dt);
      ASSERT_TRUE(h.ok()) << label << " " << dtype_name(dt) << ": " << h.status().to_string();
      EXPECT_EQ((*h)[0].dtype(), dt) << label;
    }
  }
  // Where CUDA ran the cases, the half-precision ones ran on this kernel (each forced tactic),
  // whichever implementation the builder weighed faster (cuDNN's graph convolution runs the even
  // cases too: select_kernels times both).
  const auto& cov = testing::recorded_coverage();
  auto op_it = cov.find(ops::OpKind::kFusedConv);
  ASSERT_NE(op_it, cov.end());
  auto dev = op_it->second.devices.find(Device::kCUDA);
  if (dev == op_it->second.devices.end() || dev->second.with_kernel == 0) {
    std::printf(
        "[ skipped ] cuda: no CUDA device ran the cases, so cuda.FusedConv was not checked\n");
    return;
  }
  EXPECT_EQ(dev->second.impls.count("cuda.FusedConv"), 1u)
      << "implementations that ran FusedConv on CUDA: "
      << ::testing::PrintToString(dev->second.impls);
}

}  // namespace
}  // namespace kiln
