// Conv and the pools: symbolic output sizes (4*h stride 2 -> 2*h, SAME, ceil_mode), channel and
// group checks, and the kernels (1x1, im2col, depthwise, pools; every backend, strict FP32 and
// TF32/FP16/BF16) against naive loops.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "backends/kernel_registry.h"
#include "op_harness.h"
#include "ops/conv_activation.h"
#include "typed_values.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::all_close;
using testing::BuildPrecision;
using testing::f32;
using testing::infer_node;
using testing::initializer;
using testing::make_f32;
using testing::op;
using testing::OpNode;
using testing::run_case;
using testing::run_cpu_kernel;
using testing::typed;

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 7;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = float(s >> 8) / float(1 << 23) - 1.f;
  }
  return v;
}

const Dim kB = Dim::symbol("b");
const Dim kH = Dim::symbol("h");
const Dim kW = Dim::symbol("w");

OpNode conv() { return op("Conv", 17).named("conv0"); }

TEST(ConvInfer, StrideTwoOnFourHGivesTwoH) {
  auto r = infer_node(
      conv().ints("strides", {2, 2}).ints("pads", {1, 1, 1, 1}).ints("kernel_shape", {3, 3}),
      {f32({kB, 3, kH * 4, kW * 4}), f32({16, 3, 3, 3}), f32({16})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 16, 2*h, 2*w]");
  EXPECT_EQ(r.dims()[2], kH * 2);
  // Output >= 1 is recorded for the profile checker (h could be 0).
  bool has_ge = false;
  for (const auto& k : r.constraints) has_ge |= k.kind == ops::Constraint::Kind::kGreaterEqual;
  EXPECT_TRUE(has_ge);
}

TEST(ConvInfer, ConstantSizesDilationAndOneD) {
  // floor((10 + 0 + 1 - 2*2 - 1)/2) + 1 = 4
  auto r = infer_node(conv().ints("strides", {2}).ints("pads", {0, 1}).ints("dilations", {2}),
                      {f32({1, 4, 10}), f32({8, 4, 3})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[1, 8, 4]");
  // 3-D
  r = infer_node(conv(), {f32({kB, 2, 5, 6, 7}), f32({4, 2, 3, 3, 3})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 4, 3, 4, 5]");
}

TEST(ConvInfer, SamePaddingAndDepthwise) {
  auto r = infer_node(conv().i("group", 32).ints("strides", {2, 2}).s("auto_pad", "SAME_UPPER"),
                      {f32({kB, 32, kH, kW}), f32({32, 1, 5, 5})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  auto out = r.dims();
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[1], Dim(32));
  EXPECT_EQ(out[2], Dim::ceil_div(kH, Dim(2)));
  EXPECT_EQ(out[2].eval({{"h", 7}}), 4);
}

TEST(ConvInfer, InvalidChannelsNameTheNode) {
  Status s = infer_node(conv(), {f32({1, 3, 8, 8}), f32({16, 4, 3, 3})}).status;
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidModel);
  EXPECT_NE(s.message().find("conv0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("channels"), std::string::npos) << s.message();
  // group 2: C_in must be 2 * W.C
  EXPECT_FALSE(infer_node(conv().i("group", 2), {f32({1, 6, 8, 8}), f32({4, 6, 3, 3})}).ok());
  // M = 5 not divisible by group 2
  EXPECT_FALSE(infer_node(conv().i("group", 2), {f32({1, 6, 8, 8}), f32({5, 3, 3, 3})}).ok());
  // kernel larger than the input
  s = infer_node(conv(), {f32({1, 3, 2, 2}), f32({4, 3, 3, 3})}).status;
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("conv0"), std::string::npos);
  // symbolic channels are recorded, not rejected
  auto r = infer_node(conv(), {f32({1, Dim::symbol("c"), 8, 8}), f32({4, 3, 3, 3})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_FALSE(r.constraints.empty());
  // bad pads length
  EXPECT_FALSE(
      infer_node(conv().ints("pads", {1, 1}), {f32({1, 3, 8, 8}), f32({4, 3, 3, 3})}).ok());
}

TEST(PoolInfer, CeilModeSameAndGlobal) {
  // floor((112 + 2 - 3)/2) + 1 = 56
  auto r = infer_node(op("MaxPool", 17)
                          .ints("kernel_shape", {3, 3})
                          .ints("strides", {2, 2})
                          .ints("pads", {1, 1, 1, 1}),
                      {f32({kB, 64, 112, 112})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 64, 56, 56]");
  // ceil((6 - 3)/2) + 1 = 3 (floor would give 2)
  r = infer_node(
      op("AveragePool", 17).ints("kernel_shape", {3, 3}).ints("strides", {2, 2}).i("ceil_mode", 1),
      {f32({1, 1, 6, 6})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[1, 1, 3, 3]");
  // ceil mode on 4*h: ceil((4h - 2)/2) + 1 = 2h
  r = infer_node(
      op("MaxPool", 17).ints("kernel_shape", {2, 2}).ints("strides", {2, 2}).i("ceil_mode", 1),
      {f32({1, 1, kH * 4, 8})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[1, 1, 2*h, 4]");
  r = infer_node(op("MaxPool", 17)
                     .ints("kernel_shape", {2, 2})
                     .ints("strides", {2, 2})
                     .s("auto_pad", "SAME_LOWER"),
                 {f32({kB, 3, kH, 9})}, 2);
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.dims(0)[3], Dim(5));
  EXPECT_EQ(r.dtype(1), DType::kInt64);
  r = infer_node(op("GlobalAveragePool", 17), {f32({kB, 3, kH, kW})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 3, 1, 1]");
  // kernel_shape is required
  Status s = infer_node(op("MaxPool", 17), {f32({1, 3, 8, 8})}).status;
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("kernel_shape"), std::string::npos);
}

// ---- naive references ----

struct ConvSpec {
  int64_t n, c, m, group;
  std::vector<int64_t> in, k, stride, dil, pads;  // pads: begins then ends
  bool bias;
};

std::vector<int64_t> conv_out_dims(const ConvSpec& s) {
  std::vector<int64_t> out;
  size_t ns = s.in.size();
  for (size_t i = 0; i < ns; ++i) {
    out.push_back(
        (s.in[i] + s.pads[i] + s.pads[ns + i] - s.dil[i] * (s.k[i] - 1) - 1) / s.stride[i] + 1);
  }
  return out;
}

// Straightforward nested loops over 3 spatial axes (unused ones have size 1).
Tensor naive_conv(const ConvSpec& s, const Tensor& x, const Tensor& w, const Tensor* b) {
  size_t ns = s.in.size();
  auto o = conv_out_dims(s);
  auto pad3 = [&](const std::vector<int64_t>& v, int64_t fill, size_t off) {
    std::vector<int64_t> r(3, fill);
    for (size_t i = 0; i < ns; ++i) r[3 - ns + i] = v[off + i];
    return r;
  };
  auto in = pad3(s.in, 1, 0), k = pad3(s.k, 1, 0), st = pad3(s.stride, 1, 0),
       dl = pad3(s.dil, 1, 0), pb = pad3(s.pads, 0, 0), out = pad3(o, 1, 0);
  int64_t cg = s.c / s.group, mg = s.m / s.group;
  Shape shape = {s.n, s.m};
  shape.insert(shape.end(), o.begin(), o.end());
  std::vector<float> y(size_t(shape_numel(shape)));
  const float* xp = x.data_as<float>();
  const float* wp = w.data_as<float>();
  size_t yi = 0;
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t m = 0; m < s.m; ++m) {
      int64_t g = m / mg;
      for (int64_t od = 0; od < out[0]; ++od) {
        for (int64_t oh = 0; oh < out[1]; ++oh) {
          for (int64_t ow = 0; ow < out[2]; ++ow) {
            double acc = b ? b->data_as<float>()[m] : 0.0;
            for (int64_t c = 0; c < cg; ++c) {
              for (int64_t kd = 0; kd < k[0]; ++kd) {
                for (int64_t kh = 0; kh < k[1]; ++kh) {
                  for (int64_t kw = 0; kw < k[2]; ++kw) {
                    int64_t id = od * st[0] - pb[0] + kd * dl[0];
                    int64_t ih = oh * st[1] - pb[1] + kh * dl[1];
                    int64_t iw = ow * st[2] - pb[2] + kw * dl[2];
                    if (id < 0 || id >= in[0] || ih < 0 || ih >= in[1] || iw < 0 || iw >= in[2])
                      continue;
                    double xv =
                        xp[(((n * s.c + g * cg + c) * in[0] + id) * in[1] + ih) * in[2] + iw];
                    double wv = wp[(((m * cg + c) * k[0] + kd) * k[1] + kh) * k[2] + kw];
                    acc += xv * wv;
                  }
                }
              }
            }
            y[yi++] = float(acc);
          }
        }
      }
    }
  }
  return make_f32(shape, y);
}

void check_conv(const ConvSpec& s, const std::string& label) {
  Shape xs = {s.n, s.c}, ws = {s.m, s.c / s.group};
  xs.insert(xs.end(), s.in.begin(), s.in.end());
  ws.insert(ws.end(), s.k.begin(), s.k.end());
  Tensor x = make_f32(xs, random_values(size_t(shape_numel(xs)), 11));
  Tensor w = make_f32(ws, random_values(size_t(shape_numel(ws)), 12));
  Tensor b = make_f32({s.m}, random_values(size_t(s.m), 13));
  OpNode node = conv()
                    .i("group", s.group)
                    .ints("strides", s.stride)
                    .ints("dilations", s.dil)
                    .ints("pads", s.pads)
                    .ints("kernel_shape", s.k);
  std::vector<testing::CaseInput> inputs = {x, initializer(w)};
  if (s.bias) inputs.push_back(initializer(b));
  auto r = run_case({.node = node, .inputs = inputs, .label = label});
  ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], naive_conv(s, x, w, s.bias ? &b : nullptr))) << label;
}

// Convolutions whose im2col the CPU kernel splits into several tiles of output rows (512 KB of
// patches each), the last one partial: 2-D with stride and padding, grouped, 3-D with tiles that
// cross depth slices, and few output channels (UNet's 24 -> 8 layer).
TEST(ConvKernel, Im2colTilesCoverEveryOutputRowOnce) {
  check_conv({2, 16, 8, 1, {40, 64}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true},
             "16 -> 8 3x3 40x64, 3 tiles");
  check_conv({1, 24, 8, 1, {70, 90}, {3, 3}, {2, 1}, {1, 2}, {1, 2, 0, 2}, false},
             "24 -> 8 3x3 strided, dilated, uneven pads");
  check_conv({2, 16, 12, 2, {41, 64}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true},
             "grouped 16 -> 12, 2 groups");
  check_conv({1, 8, 4, 1, {5, 12, 32}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, true},
             "3-D 8 -> 4 3x3x3 5x12x32: tiles cross depth slices");
}

// Depthwise convolutions at strides 2 and 3 (the CPU runs them through phase planes): 3x3 and 5x5
// filters, odd sizes, uneven and zero pads, a 1-pixel output, and a dilated one (row by row).
TEST(ConvKernel, StridedDepthwiseThroughPhasePlanes) {
  check_conv({2, 5, 5, 5, {14, 14}, {5, 5}, {2, 2}, {1, 1}, {2, 2, 2, 2}, true}, "5x5 s2 14x14");
  check_conv({1, 4, 4, 4, {11, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 0, 0, 1}, false},
             "3x3 s2 11x9 uneven pads");
  check_conv({1, 3, 3, 3, {13, 10}, {3, 5}, {3, 2}, {1, 1}, {1, 2, 1, 2}, true}, "3x5 s3x2 13x10");
  check_conv({1, 2, 2, 2, {5, 5}, {5, 5}, {2, 2}, {1, 1}, {0, 0, 0, 0}, true}, "one output pixel");
  check_conv({2, 64, 64, 64, {28, 28}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, true},
             "64 channels over the thread pool");
  check_conv({1, 3, 3, 3, {12, 12}, {3, 3}, {2, 2}, {2, 2}, {2, 2, 2, 2}, true}, "dilated 3x3 s2");
}

// Convolutions of few taps (input channels x kernel rows x columns <= 64, or <= 1024 for <= 16
// outputs; group 1, undilated, strides 1 and 2: the CPU computes them directly, conv_direct.h): an
// RGB stem at 224x224 (16 outputs, two blocks of 8), output channels that are no multiple of 8 and
// fewer than 8, widths under, at and past a block of 16 columns, uneven pads, mixed strides, 64
// taps exactly, no bias, and 65 taps (im2col + GEMM again), batches over the thread pool.
TEST(ConvKernel, FewTapsDirectly) {
  // n, c, m, group, in, k, stride, dil, pads, bias
  check_conv({1, 3, 16, 1, {224, 224}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, true},
             "RGB stem 3 -> 16 3x3 s2 224x224");
  check_conv({3, 3, 13, 1, {17, 33}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true},
             "3 -> 13 3x3 s1, 33 wide");
  check_conv({2, 2, 5, 1, {9, 16}, {5, 5}, {2, 1}, {1, 1}, {2, 0, 1, 3}, false},
             "2 -> 5 5x5 strides 2x1, uneven pads");
  check_conv({1, 4, 9, 1, {12, 7}, {4, 4}, {1, 2}, {1, 1}, {0, 3, 2, 0}, true},
             "4 -> 9 4x4 = 64 taps, strides 1x2");
  check_conv({2, 1, 3, 1, {6, 40}, {7, 7}, {2, 2}, {1, 1}, {3, 3, 3, 3}, true},
             "1 -> 3 7x7 s2, 49 taps");
  check_conv({1, 5, 8, 1, {10, 10}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true},
             "5 -> 8 3x3: 45 taps");
  check_conv({1, 65, 4, 1, {5, 5}, {1, 1}, {2, 2}, {1, 1}, {0, 0, 0, 0}, true},
             "65 taps: im2col + GEMM");
  check_conv({8, 3, 24, 1, {32, 48}, {3, 3}, {2, 2}, {1, 1}, {0, 0, 1, 1}, true},
             "batch 8 over the thread pool");
  // Few outputs with many taps (UNet's 24 -> 8 layer), directly up to 16 outputs and 1024 taps.
  check_conv({2, 24, 8, 1, {40, 50}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true},
             "24 -> 8 3x3: 216 taps, 8 outputs");
  check_conv({1, 40, 16, 1, {9, 21}, {5, 5}, {2, 1}, {1, 1}, {2, 1, 2, 3}, false},
             "40 -> 16 5x5 = 1000 taps, strides 2x1");
  check_conv({1, 8, 17, 1, {12, 12}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true},
             "72 taps, 17 outputs: im2col + GEMM");
}

TEST(ConvKernel, HandComputed) {
  // 1x1x3x3 input, 2x2 kernel of ones, bias 1: window sums + 1.
  Tensor x = make_f32({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor w = make_f32({1, 1, 2, 2}, {1, 1, 1, 1});
  Tensor b = make_f32({1}, {1});
  auto r = run_case(conv(), {x, initializer(w), initializer(b)});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_f32({1, 1, 2, 2}, {13, 17, 25, 29})));
}

TEST(ConvKernel, AgainstNaive) {
  // n, c, m, group, in, k, stride, dil, pads, bias
  check_conv({2, 8, 16, 1, {5, 7}, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, true}, "1x1");
  check_conv({1, 8, 6, 1, {9, 9}, {1, 1}, {2, 2}, {1, 1}, {0, 0, 0, 0}, false}, "1x1 stride 2");
  check_conv({2, 3, 16, 1, {15, 14}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, true}, "3x3 s2 stem");
  check_conv({1, 6, 9, 3, {11, 10}, {3, 2}, {1, 2}, {2, 1}, {2, 0, 1, 1}, true}, "groups dilated");
  check_conv({2, 16, 16, 16, {13, 13}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true},
             "depthwise 3x3");
  check_conv({1, 24, 24, 24, {14, 15}, {5, 5}, {2, 2}, {1, 1}, {2, 2, 2, 2}, true},
             "depthwise 5x5 s2");
  check_conv({1, 4, 4, 4, {40, 37}, {3, 3}, {1, 1}, {2, 3}, {2, 1, 3, 0}, false},
             "depthwise dilated");
  check_conv({1, 4, 8, 4, {9, 9}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true}, "depthwise x2");
  check_conv({2, 5, 7, 1, {20}, {4}, {3}, {2}, {3, 1}, true}, "1-D");
  check_conv({1, 4, 6, 2, {5, 6, 7}, {3, 2, 3}, {1, 2, 1}, {1, 1, 2}, {1, 0, 1, 1, 1, 0}, true},
             "3-D");
  check_conv({1, 64, 32, 1, {28, 28}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true}, "K = 576");
  check_conv({1, 560, 2, 1, {4, 4}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, false}, "K = 5040");
}

TEST(ConvKernel, AutoPadSameLowerMatchesExplicitPads) {
  // in 6, k 3, stride 2: out 3, total pad (3-1)*2 + 3 - 6 = 1; SAME_LOWER puts it at the start.
  Shape xs = {1, 2, 6, 6};
  Tensor x = make_f32(xs, random_values(72, 21));
  Tensor w = make_f32({3, 2, 3, 3}, random_values(54, 22));
  auto r =
      run_case(conv().ints("strides", {2, 2}).s("auto_pad", "SAME_LOWER"), {x, initializer(w)});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ConvSpec s{1, 2, 3, 1, {6, 6}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 0, 0}, false};
  EXPECT_TRUE(all_close((*r)[0], naive_conv(s, x, w, nullptr)));
}

TEST(ConvKernel, ReusesScratchAcrossShapesAndRejectsBadShapes) {
  ir::Node node = conv().ints("pads", {1, 1, 1, 1}).node;
  ir::Graph g;
  for (int i = 0; i < 3; ++i) g.add_value("v" + std::to_string(i));
  backends::KernelQuery q{node, {&g.values[0], &g.values[1]}, {&g.values[2]}};
  auto kernel = backends::create_reference_kernel(q);
  ASSERT_TRUE(kernel.ok()) << kernel.status().to_string();
  for (int64_t h : {8, 4, 12}) {
    ConvSpec s{1, 3, 5, 1, {h, h}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, false};
    Tensor x = make_f32({1, 3, h, h}, random_values(size_t(3 * h * h), 30));
    Tensor w = make_f32({5, 3, 3, 3}, random_values(135, 31));
    Tensor y = Tensor::zeros(DType::kFloat32, {1, 5, h, h}).value();
    std::vector<TensorView> in = {x.view(), w.view()}, out = {y.view()};
    ASSERT_TRUE((*kernel)->execute(in, out).ok());
    EXPECT_TRUE(all_close(y, naive_conv(s, x, w, nullptr))) << "h = " << h;
  }
  // A channel mismatch at run time is an error, not a crash.
  Tensor x = make_f32({1, 4, 5, 5}, random_values(100, 1));
  Tensor w = make_f32({5, 3, 3, 3}, random_values(135, 2));
  Tensor y = Tensor::zeros(DType::kFloat32, {1, 5, 5, 5}).value();
  std::vector<TensorView> in = {x.view(), w.view()}, out = {y.view()};
  Status s = (*kernel)->execute(in, out);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST(ConvKernel, ZeroBatch) {
  auto r = run_case(conv(), {make_f32({0, 2, 4, 4}, {}),
                             initializer(make_f32({3, 2, 3, 3}, random_values(54, 1)))});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)[0].shape(), (Shape{0, 3, 2, 2}));
}

// TF32, FP16 and BF16 engines against the FP32 reference, each held to the tolerance of what the
// node computed in (a backend that keeps FP32 is held to FP32).
TEST(ConvKernel, ReducedPrecisionsAgainstTheFp32Reference) {
  ConvSpec s{2, 8, 12, 1, {9, 10}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true};
  Tensor x = make_f32({2, 8, 9, 10}, random_values(2 * 8 * 90, 41));
  Tensor w = make_f32({12, 8, 3, 3}, random_values(12 * 72, 42));
  Tensor b = make_f32({12}, random_values(12, 43));
  for (BuildPrecision p : {BuildPrecision::kTf32, BuildPrecision::kFp16, BuildPrecision::kBf16}) {
    auto r = run_case({.node = conv().ints("pads", {1, 1, 1, 1}),
                       .inputs = {x, initializer(w), initializer(b)},
                       .precision = p});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_TRUE(all_close((*r)[0], naive_conv(s, x, w, &b)));
  }
}

// ---- float16/bfloat16 tensors: what the precision pass keeps a CNN's activations in ----

Tensor as_type(DType dt, const Tensor& t) { return testing::as_dtype(t, dt); }
Tensor as_f32(const Tensor& t) { return testing::as_dtype(t, DType::kFloat32); }
Tensor scaled(const Tensor& t, float k) {
  Tensor out = as_f32(t);
  for (int64_t i = 0; i < out.numel(); ++i) out.data_as<float>()[i] *= k;
  return out;
}

// X, W, B and Y all in dt; the expected output is the naive loop over the rounded operands,
// rounded once. The filter is scaled so that outputs stay below 2, where one unit of float16 is
// under the tolerance: the device rounds the convolution before adding the bias.
void check_half_conv(const ConvSpec& s, DType dt, BuildPrecision p, bool constant_w,
                     const std::string& label) {
  Shape xs = {s.n, s.c}, ws = {s.m, s.c / s.group};
  xs.insert(xs.end(), s.in.begin(), s.in.end());
  ws.insert(ws.end(), s.k.begin(), s.k.end());
  Tensor x = as_type(dt, make_f32(xs, random_values(size_t(shape_numel(xs)), 21)));
  Tensor w = as_type(dt, scaled(make_f32(ws, random_values(size_t(shape_numel(ws)), 22)),
                                0.5f / std::sqrt(float(shape_numel(ws) / s.m))));
  Tensor b = as_type(dt, make_f32({s.m}, random_values(size_t(s.m), 23)));
  Tensor xf = as_f32(x), wf = as_f32(w), bf = as_f32(b);
  Tensor want = as_type(dt, naive_conv(s, xf, wf, s.bias ? &bf : nullptr));
  OpNode node = conv()
                    .i("group", s.group)
                    .ints("strides", s.stride)
                    .ints("dilations", s.dil)
                    .ints("pads", s.pads)
                    .ints("kernel_shape", s.k);
  std::vector<testing::CaseInput> inputs = {x, constant_w ? initializer(w) : testing::CaseInput(w)};
  if (s.bias) inputs.push_back(initializer(b));
  auto r = run_case({.node = node,
                     .inputs = inputs,
                     .expected = {want},
                     .precision = p,
                     .expect_support = true,
                     .label = label});
  ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
  EXPECT_EQ((*r)[0].dtype(), dt) << label;
}

TEST(ConvKernel, Float16AndBFloat16Tensors) {
  const ConvSpec k3{2, 8, 12, 1, {9, 10}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true};
  const ConvSpec depthwise{1, 6, 6, 6, {7, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, true};
  const ConvSpec one_d{2, 4, 5, 1, {11}, {3}, {1}, {2}, {2, 2}, false};
  const ConvSpec pointwise{1, 16, 8, 1, {5, 6}, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, true};
  const ConvSpec grouped{1, 8, 8, 2, {6, 6}, {3, 3}, {2, 2}, {1, 1}, {0, 0, 0, 0}, true};
  for (const auto& [spec, name] :
       {std::pair{k3, "3x3"}, std::pair{depthwise, "depthwise s2"}, std::pair{one_d, "1-D dilated"},
        std::pair{pointwise, "1x1"}, std::pair{grouped, "groups"}}) {
    check_half_conv(spec, DType::kFloat16, BuildPrecision::kFp32, true,
                    std::string("float16 ") + name);
  }
  check_half_conv(k3, DType::kBFloat16, BuildPrecision::kFp32, true, "bfloat16 3x3");
  // A filter computed at run time, and the --fp16 build of float16 tensors (already reduced, no
  // weight to prepare).
  check_half_conv(k3, DType::kFloat16, BuildPrecision::kFp32, false, "float16 runtime W");
  check_half_conv(k3, DType::kFloat16, BuildPrecision::kFp16, true, "float16 at --fp16");
  check_half_conv(depthwise, DType::kBFloat16, BuildPrecision::kBf16, true, "bfloat16 at --bf16");
}

struct PoolSpec {
  std::vector<int64_t> in, k, stride, dil, pads;
  bool ceil_mode;
  bool include_pad;
};

// Output size with ONNX's ceil_mode rule (a window starting in the end padding is dropped).
std::vector<int64_t> pool_out_dims(const PoolSpec& s) {
  std::vector<int64_t> out;
  size_t ns = s.in.size();
  for (size_t i = 0; i < ns; ++i) {
    double v =
        double(s.in[i] + s.pads[i] + s.pads[ns + i] - s.dil[i] * (s.k[i] - 1) - 1) / s.stride[i];
    int64_t o = int64_t(s.ceil_mode ? std::ceil(v) : std::floor(v)) + 1;
    if (s.ceil_mode && (o - 1) * s.stride[i] >= s.in[i] + s.pads[i]) --o;
    out.push_back(o);
  }
  return out;
}

// 2-D naive pools over [1, C, H, W]; returns max (with flat indices) or average.
void naive_pool_2d(const PoolSpec& s, const Tensor& x, int64_t c, bool is_max,
                   std::vector<float>* y, std::vector<int64_t>* idx) {
  auto o = pool_out_dims(s);
  const float* xp = x.data_as<float>();
  int64_t H = s.in[0], W = s.in[1];
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t oh = 0; oh < o[0]; ++oh) {
      for (int64_t ow = 0; ow < o[1]; ++ow) {
        float best = -std::numeric_limits<float>::infinity();
        int64_t best_i = -1, count = 0, padded = 0;
        double sum = 0;
        for (int64_t kh = 0; kh < s.k[0]; ++kh) {
          for (int64_t kw = 0; kw < s.k[1]; ++kw) {
            int64_t ih = oh * s.stride[0] - s.pads[0] + kh * s.dil[0];
            int64_t iw = ow * s.stride[1] - s.pads[1] + kw * s.dil[1];
            if (ih < H + s.pads[2] && iw < W + s.pads[3]) ++padded;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            int64_t i = (ch * H + ih) * W + iw;
            if (xp[i] > best) {
              best = xp[i];
              best_i = i;
            }
            sum += xp[i];
            ++count;
          }
        }
        if (is_max) {
          y->push_back(best);
          idx->push_back(best_i);
        } else {
          y->push_back(float(sum / double(s.include_pad ? padded : count)));
        }
      }
    }
  }
}

// A MaxPool or AveragePool node "pool0" (opset 19) with these windows; the caller adds
// count_include_pad.
OpNode pool_node(const std::string& kind, const std::vector<int64_t>& k,
                 const std::vector<int64_t>& stride, const std::vector<int64_t>& dil,
                 const std::vector<int64_t>& pads, bool ceil_mode) {
  return op(kind, 19)
      .named("pool0")
      .ints("kernel_shape", k)
      .ints("strides", stride)
      .ints("dilations", dil)
      .ints("pads", pads)
      .i("ceil_mode", ceil_mode);
}

void check_pool(const PoolSpec& s, const std::string& label) {
  int64_t c = 3;
  Shape xs = {1, c, s.in[0], s.in[1]};
  Tensor x = make_f32(xs, random_values(size_t(shape_numel(xs)), 41));
  auto o = pool_out_dims(s);
  Shape ys = {1, c, o[0], o[1]};
  for (bool is_max : {true, false}) {
    OpNode node =
        pool_node(is_max ? "MaxPool" : "AveragePool", s.k, s.stride, s.dil, s.pads, s.ceil_mode);
    if (!is_max) node.i("count_include_pad", s.include_pad);
    auto r = run_case({.node = node, .inputs = {x}, .num_outputs = is_max ? 2 : 1, .label = label});
    ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
    ASSERT_EQ((*r)[0].shape(), ys) << label;
    std::vector<float> e;
    std::vector<int64_t> ei;
    naive_pool_2d(s, x, c, is_max, &e, &ei);
    EXPECT_TRUE(all_close((*r)[0], make_f32(ys, e))) << label << (is_max ? " max" : " avg");
    if (is_max) {
      const int64_t* got = (*r)[1].data_as<int64_t>();
      for (size_t i = 0; i < ei.size(); ++i) ASSERT_EQ(got[i], ei[i]) << label << " index " << i;
    }
  }
}

TEST(PoolKernel, AgainstNaive) {
  // in, k, stride, dil, pads, ceil_mode, count_include_pad
  check_pool({{8, 8}, {2, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}, false, false}, "2x2 s2");
  check_pool({{9, 11}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, false, false}, "3x3 s2 pad");
  check_pool({{9, 11}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, false, true}, "include pad");
  check_pool({{6, 7}, {3, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}, true, false}, "ceil");
  check_pool({{7, 7}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, true, true}, "ceil include pad");
  check_pool({{5, 5}, {2, 2}, {3, 3}, {1, 1}, {0, 0, 1, 1}, true, false}, "ceil drops last");
  check_pool({{10, 9}, {2, 3}, {1, 2}, {2, 2}, {1, 0, 2, 1}, false, true}, "dilated");
}

TEST(PoolKernel, HandComputedAndGlobal) {
  Tensor x = make_f32({1, 1, 2, 4}, {1, 5, 2, 0, -1, 3, 8, 7});
  OpNode mp = op("MaxPool", 17).named("pool0").ints("kernel_shape", {2, 2}).ints("strides", {2, 2});
  auto r = run_case(mp, {x});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_f32({1, 1, 1, 2}, {5, 8})));

  OpNode ap = mp;
  ap.node.op_type = "AveragePool";
  auto a = run_case(ap, {x});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_TRUE(all_close((*a)[0], make_f32({1, 1, 1, 2}, {2, 4.25f})));

  Tensor g = make_f32({2, 2, 3}, {1, 2, 3, -4, -5, -6, 0, 0, 9, 1, 1, 1});
  auto ga = run_case(op("GlobalAveragePool", 17).named("gap0"), {g});
  ASSERT_TRUE(ga.ok()) << ga.status().to_string();
  EXPECT_TRUE(all_close((*ga)[0], make_f32({2, 2, 1}, {2, -5, 3, 1})));
  auto gm = run_case(op("GlobalMaxPool", 17).named("gap0"), {g});
  ASSERT_TRUE(gm.ok()) << gm.status().to_string();
  EXPECT_TRUE(all_close((*gm)[0], make_f32({2, 2, 1}, {3, -4, 9, 1})));
}

TEST(PoolKernel, WrongOutputShapeIsAnError) {
  ir::Node mp = op("MaxPool", 17).named("pool0").ints("kernel_shape", {2, 2}).node;
  auto r = run_cpu_kernel(mp, {make_f32({1, 1, 3, 3}, std::vector<float>(9, 1))},
                          {{DType::kFloat32, {1, 1, 3, 3}}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("MaxPool"), std::string::npos);
}

// The pools on float16/bfloat16 X against the float32 pools of the rounded input (MaxPool's
// values and Indices exactly).
TEST(PoolKernel, Float16AndBFloat16Tensors) {
  Tensor x = make_f32({2, 3, 9, 11}, random_values(2 * 3 * 99, 31));
  auto pool = [](const char* kind, int opset) { return op(kind, opset).named("pool0"); };
  const std::vector<std::pair<OpNode, int>> cases = {
      {pool("MaxPool", 12)
           .ints("kernel_shape", {3, 3})
           .ints("strides", {2, 2})
           .ints("pads", {1, 1, 1, 1}),
       2},
      {pool("MaxPool", 12).ints("kernel_shape", {2, 2}).ints("strides", {2, 2}).i("ceil_mode", 1),
       1},
      {pool("AveragePool", 19)
           .ints("kernel_shape", {3, 3})
           .ints("strides", {2, 2})
           .ints("pads", {1, 1, 1, 1})
           .i("count_include_pad", 1)
           .i("ceil_mode", 1),
       1},
      {pool("AveragePool", 19).ints("kernel_shape", {2, 3}).ints("pads", {0, 1, 1, 0}), 1},
      {pool("LpPool", 18).ints("kernel_shape", {2, 2}).ints("strides", {2, 2}), 1},
      {pool("GlobalAveragePool", 1), 1},
      {pool("GlobalMaxPool", 1), 1},
  };
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    for (const auto& [node, outputs] : cases) {
      auto r = testing::run_reduced_case(
          {.node = node, .inputs = {x}, .num_outputs = outputs, .expect_support = true}, dt);
      ASSERT_TRUE(r.ok()) << node.node.op_type << ": " << r.status().to_string();
      EXPECT_EQ((*r)[0].dtype(), dt) << node.node.op_type;
    }
  }
}

// ---- ConvTranspose, LpPool, MaxUnpool, ConvInteger ----

TEST(ConvTransposeInfer, StridesPadsOutputPaddingAndOutputShape) {
  OpNode ct = op("ConvTranspose", 17).named("conv0");
  auto r = infer_node(OpNode(ct)
                          .ints("strides", {2, 2})
                          .ints("pads", {1, 1, 1, 1})
                          .ints("output_padding", {1, 0})
                          .i("group", 2),
                      {f32({kB, 4, kH, 5}), f32({4, 3, 3, 3})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  // (in-1)*2 + out_pad + 3 - 2; channels W[1]*group.
  EXPECT_EQ(r.dims()[1], Dim(6));
  EXPECT_EQ(r.dims()[2], (kH - 1) * 2 + 2);
  EXPECT_EQ(r.dims()[3], Dim(9));
  r = infer_node(OpNode(ct).ints("output_shape", {10, 8}).ints("strides", {3, 2}),
                 {f32({1, 4, 3, 3}), f32({4, 1, 3, 3})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[1, 1, 10, 8]");
  // W dim 0 must equal the input channels.
  EXPECT_FALSE(infer_node(ct, {f32({1, 4, 3, 3}), f32({2, 1, 3, 3})}).ok());
}

TEST(ConvTransposeKernel, ScattersThroughTheKernel) {
  // 1-D: x = [1, 2], w = [1, 10, 100], stride 2 -> y[0..4] = [1, 10, 102, 20, 200].
  OpNode n = op("ConvTranspose", 17).named("ct").ints("strides", {2});
  Tensor x = make_f32({1, 1, 2}, {1, 2});
  auto w = initializer(make_f32({1, 1, 3}, {1, 10, 100}));
  auto out = run_case(n, {x, w});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 5}, {1, 10, 102, 20, 200})));
  // pads [1, 1] crop one element from each end.
  n.ints("pads", {1, 1});
  out = run_case(n, {x, w});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 3}, {10, 102, 20})));
}

// ---- N-D pools, auto_pad, LpPool, large global pools (every backend against loops) ----

struct PoolNd {
  Shape x;  // [N, C, spatial...]
  std::vector<int64_t> k, stride, dil, pads;
  bool ceil_mode = false;
};

// Max (with flat indices), average (count_include_pad) or Lp pooling by loops over 1..3 axes.
Tensor naive_pool_nd(const PoolNd& s, const Tensor& x, const std::string& kind, bool include_pad,
                     double p, std::vector<int64_t>* indices) {
  size_t ns = s.x.size() - 2;
  Shape out = {s.x[0], s.x[1]};
  for (size_t i = 0; i < ns; ++i) {
    int64_t eff = s.dil[i] * (s.k[i] - 1) + 1, num = s.x[2 + i] + s.pads[i] + s.pads[ns + i] - eff;
    int64_t o = s.ceil_mode ? (num + s.stride[i] - 1) / s.stride[i] + 1 : num / s.stride[i] + 1;
    if (s.ceil_mode && (o - 1) * s.stride[i] >= s.x[2 + i] + s.pads[i]) --o;
    out.push_back(o);
  }
  int64_t in_sp = 1, out_sp = 1, kk = 1;
  std::vector<int64_t> in_stride(ns, 1);
  for (size_t i = 0; i < ns; ++i) in_sp *= s.x[2 + i], out_sp *= out[2 + i], kk *= s.k[i];
  for (int64_t i = int64_t(ns) - 2; i >= 0; --i)
    in_stride[size_t(i)] = in_stride[size_t(i) + 1] * s.x[3 + i];
  const float* xp = x.data_as<float>();
  std::vector<float> y;
  for (int64_t plane = 0; plane < s.x[0] * s.x[1]; ++plane) {
    for (int64_t o = 0; o < out_sp; ++o) {
      std::vector<int64_t> oc(ns);
      for (int64_t r = o, i = int64_t(ns) - 1; i >= 0; --i)
        oc[size_t(i)] = r % out[2 + i], r /= out[2 + i];
      float best = -std::numeric_limits<float>::infinity();
      int64_t best_i = -1, count = 0, padded = 0;
      double sum = 0;
      for (int64_t t = 0; t < kk; ++t) {
        int64_t off = 0;
        bool inside = true, in_padded = true;
        for (int64_t r = t, i = int64_t(ns) - 1; i >= 0; --i) {
          int64_t kc = r % s.k[size_t(i)];
          r /= s.k[size_t(i)];
          int64_t c =
              oc[size_t(i)] * s.stride[size_t(i)] - s.pads[size_t(i)] + kc * s.dil[size_t(i)];
          inside = inside && c >= 0 && c < s.x[2 + i];
          in_padded = in_padded && c < s.x[2 + i] + s.pads[ns + size_t(i)];
          off += c * in_stride[size_t(i)];
        }
        if (in_padded) ++padded;
        if (!inside) continue;
        float v = xp[plane * in_sp + off];
        if (v > best || best_i < 0) best = v, best_i = plane * in_sp + off;
        sum += kind == "LpPool" ? std::pow(std::fabs(double(v)), p) : double(v);
        ++count;
      }
      if (kind == "MaxPool") {
        y.push_back(best);
        indices->push_back(best_i);
      } else if (kind == "AveragePool") {
        int64_t d = include_pad ? padded : count;
        y.push_back(d > 0 ? float(sum / double(d)) : 0.f);
      } else {
        y.push_back(float(std::pow(sum, 1.0 / p)));
      }
    }
  }
  return make_f32(out, y);
}

void check_pool_nd(const PoolNd& s, const std::string& label) {
  Tensor x = make_f32(s.x, random_values(size_t(shape_numel(s.x)), 29));
  for (std::string kind : {"MaxPool", "AveragePool", "LpPool"}) {
    for (bool include_pad : {false, true}) {
      if (kind != "AveragePool" && include_pad) continue;
      OpNode node = op(kind, kind == "LpPool" ? 18 : 19)
                        .named("pool0")
                        .ints("kernel_shape", s.k)
                        .ints("strides", s.stride)
                        .ints("pads", s.pads);
      if (kind != "LpPool") node.ints("dilations", s.dil).i("ceil_mode", s.ceil_mode);
      if (kind == "AveragePool") node.i("count_include_pad", include_pad);
      if (kind == "LpPool") node.i("p", 3);
      PoolNd spec = s;
      if (kind == "LpPool") spec.dil.assign(s.dil.size(), 1), spec.ceil_mode = false;
      std::vector<int64_t> want_idx;
      Tensor want = naive_pool_nd(spec, x, kind, include_pad, 3.0, &want_idx);
      std::string l = label + " " + kind + (include_pad ? " include pad" : "");
      auto r = run_case(
          {.node = node, .inputs = {x}, .num_outputs = kind == "MaxPool" ? 2 : 1, .label = l});
      ASSERT_TRUE(r.ok()) << l << ": " << r.status().to_string();
      EXPECT_TRUE(all_close((*r)[0], want)) << l;
      if (kind == "MaxPool") {
        ASSERT_EQ((*r)[1].numel(), int64_t(want_idx.size())) << l;
        for (size_t i = 0; i < want_idx.size(); ++i)
          ASSERT_EQ((*r)[1].data_as<int64_t>()[i], want_idx[i]) << l << " " << i;
      }
    }
  }
}

TEST(PoolKernel, OneDAndThreeDAgainstNaive) {
  check_pool_nd({{2, 3, 11}, {3}, {2}, {1}, {1, 2}, false}, "1-D asymmetric pads");
  check_pool_nd({{2, 2, 10}, {2}, {3}, {2}, {0, 1}, true}, "1-D dilated ceil");
  check_pool_nd({{1, 2, 5, 6, 7}, {2, 3, 2}, {2, 2, 3}, {1, 1, 1}, {1, 0, 1, 0, 1, 1}, true},
                "3-D ceil");
  check_pool_nd({{2, 1, 4, 5, 6}, {3, 2, 2}, {1, 2, 1}, {1, 2, 2}, {1, 1, 0, 1, 0, 1}, false},
                "3-D dilated");
}

TEST(PoolKernel, TwoDLpPoolAndAsymmetricPads) {
  check_pool_nd({{2, 3, 9, 8}, {3, 2}, {2, 2}, {1, 1}, {0, 1, 2, 0}, false}, "2-D asymmetric pads");
  check_pool_nd({{1, 4, 7, 7}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, true}, "2-D ceil");
}

TEST(PoolKernel, AutoPadMatchesExplicitPads) {
  // 7 rows and 8 columns, kernel 3 stride 2: SAME pads the rows (1, 1) and the columns by one,
  // at the end (SAME_UPPER) or the start (SAME_LOWER); VALID pads nothing.
  Tensor x = make_f32({1, 2, 7, 8}, random_values(112, 5));
  struct V {
    const char* auto_pad;
    std::vector<int64_t> pads;
  };
  for (const char* kind : {"MaxPool", "AveragePool"}) {
    for (const V& v : std::vector<V>{
             {"SAME_UPPER", {1, 0, 1, 1}}, {"SAME_LOWER", {1, 1, 1, 0}}, {"VALID", {0, 0, 0, 0}}}) {
      OpNode base =
          op(kind, 19).named("pool0").ints("kernel_shape", {3, 3}).ints("strides", {2, 2});
      auto a = run_case(OpNode(base).s("auto_pad", v.auto_pad), {x});
      auto b = run_case(OpNode(base).ints("pads", v.pads), {x});
      ASSERT_TRUE(a.ok() && b.ok()) << kind << " " << v.auto_pad;
      EXPECT_EQ((*a)[0].shape(), (*b)[0].shape()) << kind << " " << v.auto_pad;
      EXPECT_TRUE(all_close((*a)[0], (*b)[0], 0, 0)) << kind << " " << v.auto_pad;
    }
  }
}

TEST(PoolKernel, GlobalPoolsOverLargePlanesAndThreeD) {
  for (Shape shape : {Shape{2, 3, 17, 19}, Shape{1, 2, 3, 4, 5}}) {
    Tensor x = make_f32(shape, random_values(size_t(shape_numel(shape)), 3));
    int64_t planes = shape[0] * shape[1], size = shape_numel(shape) / planes;
    std::vector<float> mean, max;
    for (int64_t p = 0; p < planes; ++p) {
      double s = 0;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < size; ++i) {
        s += x.data_as<float>()[p * size + i];
        m = std::max(m, x.data_as<float>()[p * size + i]);
      }
      mean.push_back(float(s / double(size)));
      max.push_back(m);
    }
    Shape out(shape.size(), 1);
    out[0] = shape[0], out[1] = shape[1];
    auto a = run_case(op("GlobalAveragePool", 1).named("gap"), {x});
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_TRUE(all_close((*a)[0], make_f32(out, mean)));
    auto m = run_case(op("GlobalMaxPool", 1).named("gmp"), {x});
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_TRUE(all_close((*m)[0], make_f32(out, max), 0, 0));
  }
}

// MaxPool without Indices and AveragePool over NCHW 1-D and 2-D inputs (CUDA: pool2d_nchw_kernel,
// 3x3 and 2x2 windows unrolled, others by loops; odd sizes leave the last thread of a row one
// output): against the loops in float32, and float16/bfloat16 against the float32 node.
TEST(PoolKernel, NchwPoolsWithoutIndicesAgainstNaive) {
  const std::pair<PoolNd, const char*> cases[] = {
      {{{2, 4, 13, 11}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}}, "3x3 s2 p1"},
      {{{2, 3, 9, 7}, {2, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}}, "2x2 s2"},
      {{{2, 3, 9, 7}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}}, "3x3 s1 p1"},
      {{{1, 2, 9, 11}, {2, 2}, {2, 2}, {1, 1}, {0, 1, 1, 0}, true}, "2x2 s2 pads ceil"},
      {{{2, 3, 8, 9}, {3, 2}, {2, 1}, {2, 1}, {2, 0, 1, 1}, true}, "3x2 dilated ceil"},
      {{{2, 3, 17}, {3}, {2}, {1}, {1, 1}}, "1-D"},
      // Even widths: CUDA loads two columns at a time, from w0 (even pads) or w0 - 1 (odd).
      {{{2, 3, 10, 12}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}}, "3x3 s2 p1 even width"},
      {{{2, 3, 9, 8}, {2, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}}, "2x2 s2 even width"},
      {{{1, 2, 7, 10}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}}, "3x3 s1 p1 even width"},
      {{{1, 2, 7, 10}, {2, 2}, {2, 2}, {1, 1}, {1, 1, 0, 1}, true}, "2x2 s2 odd pads ceil"},
  };
  for (const auto& [s, label] : cases) {
    Tensor x = make_f32(s.x, random_values(size_t(shape_numel(s.x)), 23));
    for (std::string kind : {"MaxPool", "AveragePool"}) {
      for (bool include_pad : {false, true}) {
        if (kind == "MaxPool" && include_pad) continue;
        OpNode node = pool_node(kind, s.k, s.stride, s.dil, s.pads, s.ceil_mode);
        if (kind == "AveragePool") node.i("count_include_pad", include_pad);
        const std::string l = std::string(label) + " " + kind + (include_pad ? " include pad" : "");
        std::vector<int64_t> idx;
        Tensor want = naive_pool_nd(s, x, kind, include_pad, 1.0, &idx);
        auto r = run_case({.node = node, .inputs = {x}, .expect_support = true, .label = l});
        ASSERT_TRUE(r.ok()) << l << ": " << r.status().to_string();
        EXPECT_TRUE(all_close((*r)[0], want)) << l;
        for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
          auto h = testing::run_reduced_case(
              {.node = node, .inputs = {x}, .expect_support = true, .label = l}, dt);
          ASSERT_TRUE(h.ok()) << l << " " << dtype_name(dt) << ": " << h.status().to_string();
        }
      }
    }
  }
  // The first element of a window wins until a strictly greater one: a leading NaN stays, a
  // later one is passed over.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = make_f32({1, 1, 2, 4}, {nan, 1, 4, nan, 2, 3, 5, 6});
  auto r = run_case({.node = op("MaxPool", 12).ints("kernel_shape", {2, 2}).ints("strides", {2, 2}),
                     .inputs = {x},
                     .expected = {make_f32({1, 1, 1, 2}, {nan, 6})},
                     .expect_support = true});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
}

// ---- ConvTranspose against loops ----

struct TransposeSpec {
  Shape x, w;  // 1-D to 3-D: [N, C, (D, H,) W], [C, M/group, (kd, kh,) kw]
  int64_t group = 1;
  std::vector<int64_t> stride, dil, pads, out_pad, output_shape;
  std::string auto_pad = "NOTSET";
  bool bias = false;
};

// y[n, g*mg + m, o] += x[n, g*cg + c, i] * w[g*cg + c, m, k] with o = i*s + k*d - pad_begin.
Tensor naive_conv_transpose(const TransposeSpec& s, const Tensor& x, const Tensor& w,
                            const Tensor* b) {
  size_t ns = s.x.size() - 2;
  int64_t in[3] = {1, 1, 1}, k[3] = {1, 1, 1}, out[3] = {1, 1, 1}, st[3] = {1, 1, 1},
          dl[3] = {1, 1, 1}, pb[3] = {0, 0, 0};
  Shape ys = {s.x[0], s.w[1] * s.group};
  for (size_t i = 0; i < ns; ++i) {
    size_t j = 3 - ns + i;
    in[j] = s.x[2 + i], k[j] = s.w[2 + i], st[j] = s.stride[i], dl[j] = s.dil[i];
    int64_t full = st[j] * (in[j] - 1) + s.out_pad[i] + (k[j] - 1) * dl[j] + 1;
    if (!s.output_shape.empty()) {
      out[j] = s.output_shape[i];
    } else if (s.auto_pad == "NOTSET") {
      out[j] = full - s.pads[i] - s.pads[ns + i];
    } else if (s.auto_pad == "VALID") {
      out[j] = full;
    } else {
      out[j] = in[j] * st[j];
    }
    if (s.auto_pad == "NOTSET") {
      pb[j] = s.pads[i];
    } else if (s.auto_pad != "VALID") {
      int64_t total = full - out[j];
      pb[j] = s.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
    }
    ys.push_back(out[j]);
  }
  int64_t n = s.x[0], c = s.x[1], m = ys[1], cg = c / s.group, mg = m / s.group;
  int64_t in_sp = in[0] * in[1] * in[2], k_sp = k[0] * k[1] * k[2],
          out_sp = out[0] * out[1] * out[2];
  std::vector<double> y(size_t(shape_numel(ys)), 0.0);
  const float* xp = x.data_as<float>();
  const float* wp = w.data_as<float>();
  for (int64_t b0 = 0; b0 < n; ++b0) {
    for (int64_t ci = 0; ci < c; ++ci) {
      int64_t g = ci / cg;
      for (int64_t mo = 0; mo < mg; ++mo) {
        for (int64_t ii = 0; ii < in_sp; ++ii) {
          int64_t i0 = ii / (in[1] * in[2]), i1 = ii / in[2] % in[1], i2 = ii % in[2];
          double xv = xp[(b0 * c + ci) * in_sp + ii];
          for (int64_t kk = 0; kk < k_sp; ++kk) {
            int64_t k0 = kk / (k[1] * k[2]), k1 = kk / k[2] % k[1], k2 = kk % k[2];
            int64_t o0 = i0 * st[0] + k0 * dl[0] - pb[0], o1 = i1 * st[1] + k1 * dl[1] - pb[1],
                    o2 = i2 * st[2] + k2 * dl[2] - pb[2];
            if (o0 < 0 || o0 >= out[0] || o1 < 0 || o1 >= out[1] || o2 < 0 || o2 >= out[2])
              continue;
            double wv = wp[(ci * mg + mo) * k_sp + kk];
            y[size_t((b0 * m + g * mg + mo) * out_sp + (o0 * out[1] + o1) * out[2] + o2)] +=
                xv * wv;
          }
        }
      }
    }
  }
  std::vector<float> yf(y.size());
  for (size_t e = 0; e < y.size(); ++e) {
    yf[e] = float(y[e] + (b ? b->data_as<float>()[(int64_t(e) / out_sp) % m] : 0.0));
  }
  return make_f32(ys, yf);
}

void check_conv_transpose(TransposeSpec s, const std::string& label) {
  size_t ns = s.x.size() - 2;
  if (s.stride.empty()) s.stride.assign(ns, 1);
  if (s.dil.empty()) s.dil.assign(ns, 1);
  if (s.pads.empty()) s.pads.assign(2 * ns, 0);
  if (s.out_pad.empty()) s.out_pad.assign(ns, 0);
  Tensor x = make_f32(s.x, random_values(size_t(shape_numel(s.x)), 17));
  Tensor w = make_f32(s.w, random_values(size_t(shape_numel(s.w)), 18));
  Tensor b = make_f32({s.w[1] * s.group}, random_values(size_t(s.w[1] * s.group), 19));
  OpNode node = op("ConvTranspose", 11)
                    .named("ct0")
                    .i("group", s.group)
                    .ints("strides", s.stride)
                    .ints("dilations", s.dil)
                    .ints("output_padding", s.out_pad)
                    .s("auto_pad", s.auto_pad);
  if (s.auto_pad == "NOTSET") node.ints("pads", s.pads);
  if (!s.output_shape.empty()) node.ints("output_shape", s.output_shape);
  std::vector<testing::CaseInput> inputs = {x, initializer(w)};
  if (s.bias) inputs.push_back(initializer(b));
  // CUDA runs every case here (cuDNN with a window copy where the pads are asymmetric).
  auto r = run_case({.node = node, .inputs = inputs, .expect_support = true, .label = label});
  ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], naive_conv_transpose(s, x, w, s.bias ? &b : nullptr))) << label;
}

TEST(ConvTransposeKernel, AgainstNaive) {
  check_conv_transpose({.x = {2, 4, 5, 4},
                        .w = {4, 3, 3, 2},
                        .group = 2,
                        .stride = {2, 1},
                        .dil = {1, 2},
                        .pads = {1, 0, 1, 0},
                        .out_pad = {1, 0},
                        .bias = true},
                       "2-D groups strides dilations output_padding");
  check_conv_transpose(
      {.x = {1, 3, 4, 4}, .w = {3, 2, 3, 3}, .stride = {2, 2}, .pads = {1, 1, 0, 0}},
      "2-D pads differ by less than the stride");
  check_conv_transpose(
      {.x = {1, 2, 3, 3}, .w = {2, 2, 3, 3}, .stride = {2, 2}, .pads = {0, 1, 1, 0}},
      "2-D asymmetric pads cuDNN cannot express");
  check_conv_transpose(
      {.x = {1, 2, 3, 4}, .w = {2, 3, 3, 3}, .stride = {2, 2}, .output_shape = {8, 9}},
      "output_shape");
  check_conv_transpose(
      {.x = {1, 2, 4, 3}, .w = {2, 1, 3, 3}, .stride = {2, 2}, .auto_pad = "SAME_LOWER"},
      "SAME_LOWER");
  check_conv_transpose(
      {.x = {1, 2, 4, 3}, .w = {2, 1, 3, 3}, .stride = {2, 2}, .auto_pad = "SAME_UPPER"},
      "SAME_UPPER");
  check_conv_transpose({.x = {2, 3, 7},
                        .w = {3, 2, 4},
                        .stride = {3},
                        .dil = {2},
                        .pads = {2, 1},
                        .out_pad = {1},
                        .bias = true},
                       "1-D");
  check_conv_transpose({.x = {1, 6, 5, 5},
                        .w = {6, 1, 3, 3},
                        .group = 6,
                        .stride = {1, 1},
                        .pads = {1, 1, 1, 1},
                        .bias = true},
                       "depthwise");
}

// Pads cuDNN's symmetric padding cannot express: the CUDA kernel runs cuDNN with the smaller pad
// into its workspace and copies Y's window out of it.
TEST(ConvTransposeKernel, AsymmetricPadsAgainstNaive) {
  check_conv_transpose(
      {.x = {1, 1, 3, 3}, .w = {1, 2, 3, 3}, .stride = {2, 2}, .auto_pad = "SAME_UPPER"},
      "SAME_UPPER pads 0 at the start and 1 at the end (test_convtranspose_autopad_same)");
  check_conv_transpose(
      {.x = {1, 1, 3, 3}, .w = {1, 2, 3, 3}, .stride = {2, 2}, .auto_pad = "SAME_LOWER"},
      "SAME_LOWER pads 1 at the start and 0 at the end");
  check_conv_transpose(
      {.x = {2, 2, 5}, .w = {2, 3, 2}, .stride = {3}, .auto_pad = "SAME_LOWER", .bias = true},
      "1-D SAME_LOWER with a negative total (stride above the kernel)");
  check_conv_transpose({.x = {1, 2, 4}, .w = {2, 2, 3}, .stride = {1}, .pads = {2, 0}},
                       "1-D pads 2 and 0");
  check_conv_transpose({.x = {1, 2, 4}, .w = {2, 2, 3}, .stride = {1}, .pads = {0, 2}},
                       "1-D pads 0 and 2");
  check_conv_transpose({.x = {1, 2, 3, 4},
                        .w = {2, 2, 3, 3},
                        .stride = {1, 2},
                        .dil = {2, 1},
                        .pads = {3, 0, 0, 1},
                        .out_pad = {0, 1},
                        .bias = true},
                       "2-D mixed: axis 2 through the window, axis 3 direct, output_padding");
  check_conv_transpose(
      {.x = {1, 2, 3, 3}, .w = {2, 1, 2, 2}, .stride = {2, 2}, .output_shape = {9, 8}},
      "output_shape beyond the full scatter (zeros at the end)");
  check_conv_transpose({.x = {1, 4, 3, 3},
                        .w = {4, 1, 3, 3},
                        .group = 2,
                        .stride = {2, 2},
                        .pads = {0, 2, 1, 1},
                        .out_pad = {1, 1},
                        .bias = true},
                       "groups with asymmetric pads and output_padding");
}

TEST(ConvTransposeKernel, ThreeDAgainstNaive) {
  check_conv_transpose({.x = {1, 1, 3, 4, 5}, .w = {1, 2, 3, 3, 3}}, "3-D (test_convtranspose_3d)");
  check_conv_transpose({.x = {2, 4, 3, 2, 3},
                        .w = {4, 1, 2, 3, 2},
                        .group = 2,
                        .stride = {2, 1, 3},
                        .dil = {1, 2, 1},
                        .pads = {1, 0, 1, 1, 1, 0},
                        .out_pad = {1, 0, 2},
                        .bias = true},
                       "3-D groups strides dilations pads output_padding");
  check_conv_transpose(
      {.x = {1, 2, 2, 3, 3}, .w = {2, 2, 3, 2, 3}, .stride = {2, 2, 2}, .pads = {2, 0, 0, 0, 1, 1}},
      "3-D asymmetric pads");
  check_conv_transpose({.x = {1, 2, 2, 3, 2},
                        .w = {2, 1, 3, 3, 2},
                        .stride = {2, 2, 2},
                        .auto_pad = "SAME_UPPER",
                        .bias = true},
                       "3-D SAME_UPPER");
  check_conv_transpose(
      {.x = {1, 2, 2, 3, 2}, .w = {2, 1, 3, 3, 2}, .stride = {2, 2, 2}, .auto_pad = "SAME_LOWER"},
      "3-D SAME_LOWER");
  check_conv_transpose(
      {.x = {1, 1, 2, 2, 2}, .w = {1, 1, 2, 2, 2}, .stride = {2, 2, 2}, .output_shape = {5, 4, 6}},
      "3-D output_shape");
}

TEST(PoolKernel, LpPoolP2IsTheWindowNorm) {
  OpNode n = op("LpPool", 18).named("lp").ints("kernel_shape", {2}).ints("strides", {2});
  auto out = run_case(n, {make_f32({1, 1, 4}, {3, -4, 1, 0})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 2}, {5, 1})));
}

TEST(PoolKernel, MaxUnpoolScattersByIndex) {
  OpNode n =
      op("MaxUnpool", 11).named("unpool").ints("kernel_shape", {2, 2}).ints("strides", {2, 2});
  Tensor idx = testing::make_i64({1, 1, 1, 2}, {1, 7});
  auto out = run_case(n, {make_f32({1, 1, 1, 2}, {5, 6}), idx});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 2, 4}, {0, 5, 0, 0, 0, 0, 0, 6})));
  // An index past the end is an error, not a write out of bounds.
  idx = testing::make_i64({1, 1, 1, 2}, {1, 8});
  EXPECT_FALSE(run_case(n, {make_f32({1, 1, 1, 2}, {5, 6}), idx}).ok());
}

TEST(PoolKernel, MaxUnpoolOutputShapePadsAndOneD) {
  // 2-D with pads and an output_shape larger than the unpooled 3x3: placed at the origin.
  OpNode n = op("MaxUnpool", 11)
                 .named("unpool")
                 .ints("kernel_shape", {2, 2})
                 .ints("strides", {2, 2})
                 .ints("pads", {1, 1, 0, 0});
  auto out = run_case(n, {make_f32({1, 2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8}),
                          testing::make_i64({1, 2, 2, 2}, {0, 2, 6, 8, 9, 11, 15, 17}),
                          initializer(testing::make_i64({4}, {1, 2, 4, 4}))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const float* y = (*out)[0].data_as<float>();
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[2], 2.0f);
  EXPECT_EQ(y[3], 0.0f);      // outside the 3x3 block
  EXPECT_EQ(y[4 * 2], 3.0f);  // (0, 2, 0)
  EXPECT_EQ(y[16], 5.0f);     // channel 1 starts at 16 in Y, at 9 in the unpooled tensor
  // 1-D.
  out = run_case(op("MaxUnpool", 11).named("unpool").ints("kernel_shape", {3}).ints("strides", {3}),
                 {make_f32({1, 1, 2}, {4, 5}), testing::make_i64({1, 1, 2}, {2, 3})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 6}, {0, 0, 4, 5, 0, 0})));
}

TEST(ConvIntegerInfer, Int32OutputWithConvShape) {
  auto r = infer_node(op("ConvInteger", 17).named("conv0").ints("pads", {1, 1, 1, 1}),
                      {typed(DType::kUInt8, {1, 1, kH, 3}), typed(DType::kUInt8, {2, 1, 2, 2})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.dtype(), DType::kInt32);
  EXPECT_EQ(r.dims()[3], Dim(4));
  EXPECT_FALSE(infer_node(op("ConvInteger", 17).named("conv0"),
                          {f32({1, 1, 3, 3}), typed(DType::kUInt8, {2, 1, 2, 2})})
                   .ok());
}

// ---- kiln::FusedConv: activation(Conv(X, W, B) + Z), made by fuse_conv_activation ----

// Every activation, with and without bias and residual, against the naive convolution with the
// epilogue applied in double; strict FP32 and, as the precision pass leaves the layer, float16.
TEST(FusedConvKernel, EveryActivationWithBiasAndResidual) {
  const ConvSpec s{2, 8, 16, 1, {6, 7}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true};
  Tensor x = make_f32({2, 8, 6, 7}, random_values(2 * 8 * 42, 61));
  Tensor w = scaled(make_f32({16, 8, 3, 3}, random_values(16 * 72, 62)), 0.2f);
  Tensor b = make_f32({16}, random_values(16, 63));
  Tensor z = make_f32({2, 16, 6, 7}, random_values(2 * 16 * 42, 64));
  struct Act {
    const char* name;
    std::vector<float> params;
    double (*f)(double, const std::vector<float>&);
  };
  const Act acts[] = {
      {"none", {}, [](double y, const std::vector<float>&) { return y; }},
      {"relu", {}, [](double y, const std::vector<float>&) { return std::max(y, 0.0); }},
      {"clip",
       {-0.5f, 0.75f},
       [](double y, const std::vector<float>& p) {
         return std::clamp(y, double(p[0]), double(p[1]));
       }},
      {"hardswish",
       {},
       [](double y, const std::vector<float>&) { return y * std::clamp(y / 6 + 0.5, 0.0, 1.0); }},
      {"hardsigmoid",
       {0.25f, 0.4f},
       [](double y, const std::vector<float>& p) { return std::clamp(p[0] * y + p[1], 0.0, 1.0); }},
      {"sigmoid", {}, [](double y, const std::vector<float>&) { return 1 / (1 + std::exp(-y)); }},
      {"silu", {}, [](double y, const std::vector<float>&) { return y / (1 + std::exp(-y)); }},
      {"leaky_relu",
       {0.1f},
       [](double y, const std::vector<float>& p) { return y >= 0 ? y : p[0] * y; }},
  };
  for (const Act& a : acts) {
    for (bool bias : {true, false}) {
      for (bool residual : {true, false}) {
        Tensor want = naive_conv(s, x, w, bias ? &b : nullptr);
        for (int64_t i = 0; i < want.numel(); ++i) {
          double v = want.data_as<float>()[i] + (residual ? z.data_as<float>()[i] : 0.f);
          want.data_as<float>()[i] = float(a.f(v, a.params));
        }
        OpNode node = op("FusedConv", 1, "kiln")
                          .named("fused0")
                          .ints("pads", {1, 1, 1, 1})
                          .s("activation", a.name);
        if (!a.params.empty()) node.floats("activation_params", a.params);
        std::vector<testing::CaseInput> inputs = {x, initializer(w),
                                                  bias ? initializer(b) : testing::kNoInput};
        if (residual) inputs.push_back(z);
        std::string label =
            std::string(a.name) + (bias ? " bias" : "") + (residual ? " residual" : "");
        auto r = run_case({.node = node,
                           .inputs = inputs,
                           .expected = {want},
                           .expect_support = true,
                           .label = label});
        ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
        auto h = testing::run_reduced_case(
            {.node = node, .inputs = inputs, .expect_support = true, .label = label + " float16"},
            DType::kFloat16);
        ASSERT_TRUE(h.ok()) << label << " float16: " << h.status().to_string();
      }
    }
  }
}

// Channels-last 1x1 FusedConv (assign_layout's form of a pointwise convolution), which CUDA runs as
// one cuBLASLt GEMM with bias, residual and ReLU in its epilogue and the other activations in a
// pass after it: each epilogue against the naive sum in double, in float32 and on float16/bfloat16
// tensors. 16 in and 24 out channels (rows of 16 bytes, as the GEMM path requires), 15 pixels.
TEST(FusedConvKernel, ChannelsLastPointwiseEveryEpilogue) {
  const int64_t n = 2, h = 5, w = 3, c = 16, k = 24, rows = n * h * w;
  Tensor x = make_f32({n, h, w, c}, random_values(rows * c, 71));
  Tensor wt = scaled(make_f32({k, 1, 1, c}, random_values(k * c, 72)), 0.3f);
  Tensor b = make_f32({k}, random_values(k, 73));
  Tensor z = make_f32({n, h, w, k}, random_values(rows * k, 74));
  struct Act {
    const char* name;
    std::vector<float> params;
    double (*f)(double, const std::vector<float>&);
  };
  const Act acts[] = {
      {"none", {}, [](double y, const std::vector<float>&) { return y; }},
      {"relu", {}, [](double y, const std::vector<float>&) { return std::max(y, 0.0); }},
      {"hardswish",
       {},
       [](double y, const std::vector<float>&) { return y * std::clamp(y / 6 + 0.5, 0.0, 1.0); }},
      {"leaky_relu",
       {0.1f},
       [](double y, const std::vector<float>& p) { return y >= 0 ? y : p[0] * y; }},
  };
  for (const Act& a : acts) {
    for (bool bias : {true, false}) {
      for (bool residual : {true, false}) {
        Tensor want = make_f32({n, h, w, k}, std::vector<float>(size_t(rows * k)));
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t o = 0; o < k; ++o) {
            double v = bias ? b.data_as<float>()[o] : 0.0;
            for (int64_t i = 0; i < c; ++i)
              v += double(x.data_as<float>()[r * c + i]) * wt.data_as<float>()[o * c + i];
            if (residual) v += z.data_as<float>()[r * k + o];
            want.data_as<float>()[r * k + o] = float(a.f(v, a.params));
          }
        }
        OpNode node =
            op("FusedConv", 1, "kiln").named("pw0").s("layout", "NHWC").s("activation", a.name);
        if (!a.params.empty()) node.floats("activation_params", a.params);
        std::vector<testing::CaseInput> inputs = {x, initializer(wt),
                                                  bias ? initializer(b) : testing::kNoInput};
        if (residual) inputs.push_back(z);
        std::string label = std::string("NHWC 1x1 ") + a.name + (bias ? " bias" : "") +
                            (residual ? " residual" : "");
        auto r = run_case({.node = node,
                           .inputs = inputs,
                           .expected = {want},
                           .expect_support = true,
                           .label = label});
        ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
        for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
          auto hr = testing::run_reduced_case({.node = node,
                                               .inputs = inputs,
                                               .expect_support = true,
                                               .label = label + " " + std::string(dtype_name(dt))},
                                              dt);
          ASSERT_TRUE(hr.ok()) << label << " " << dtype_name(dt) << ": " << hr.status().to_string();
        }
      }
    }
  }
}

// The schema takes every activation of ops/conv_activation.h with exactly its parameter count and
// names the node, the attribute and the allowed values when it refuses one.
TEST(FusedConvInfer, ActivationNamesAndParameterCountsAreChecked) {
  auto infer = [](const std::string& act, size_t params) {
    OpNode node = op("FusedConv", 1, "kiln").named("fc0").s("activation", act);
    if (params > 0) node.floats("activation_params", std::vector<float>(params, 0.5f));
    return infer_node(node, {f32({1, 3, 8, 8}), f32({4, 3, 3, 3})});
  };
  for (const ops::ConvActivationInfo& a : ops::kConvActivations) {
    auto good = infer(a.name, size_t(a.params));
    EXPECT_TRUE(good.status.ok()) << a.name << ": " << good.status.to_string();
    auto bad = infer(a.name, size_t(a.params) + 1);
    ASSERT_FALSE(bad.status.ok()) << a.name << " with one parameter too many";
    EXPECT_NE(bad.status.message().find("takes " + std::to_string(a.params)), std::string::npos)
        << bad.status.to_string();
  }
  auto unknown = infer("swish", 0);
  ASSERT_FALSE(unknown.status.ok());
  for (const char* part : {"fc0", "activation 'swish'", "none, relu, clip", "gelu_tanh"}) {
    EXPECT_NE(unknown.status.message().find(part), std::string::npos)
        << part << " in " << unknown.status.to_string();
  }
}

// input_activation is checked as activation is, and its errors name it (not "activation"), its
// parameter attribute and the allowed values.
TEST(FusedConvInfer, InputActivationNamesAndParameterCountsAreChecked) {
  auto infer = [](const std::string& act, size_t params) {
    OpNode node = op("FusedConv", 1, "kiln").named("fc1").s("input_activation", act);
    if (params > 0) node.floats("input_activation_params", std::vector<float>(params, 0.5f));
    return infer_node(node, {f32({1, 3, 8, 8}), f32({4, 3, 3, 3})});
  };
  for (const ops::ConvActivationInfo& a : ops::kConvActivations) {
    auto good = infer(a.name, size_t(a.params));
    EXPECT_TRUE(good.status.ok()) << a.name << ": " << good.status.to_string();
    auto bad = infer(a.name, size_t(a.params) + 1);
    ASSERT_FALSE(bad.status.ok()) << a.name << " with one parameter too many";
    EXPECT_EQ(bad.code(), StatusCode::kInvalidModel) << bad.status.to_string();
    const std::string want = "input_activation '" + std::string(a.name) + "' takes " +
                             std::to_string(a.params) + " input_activation_params, not " +
                             std::to_string(a.params + 1);
    EXPECT_NE(bad.status.message().find(want), std::string::npos) << bad.status.to_string();
  }
  auto unknown = infer("swish", 0);
  ASSERT_FALSE(unknown.status.ok());
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidModel) << unknown.status.to_string();
  for (const char* part : {"fc1", "input_activation 'swish'", "none, relu, clip", "gelu_tanh"}) {
    EXPECT_NE(unknown.status.message().find(part), std::string::npos)
        << part << " in " << unknown.status.to_string();
  }
}

// A rank-4 float32 tensor with its axes permuted (Transpose's meaning): NCHW <-> NHWC.
Tensor permuted4(const Tensor& t, const std::array<int64_t, 4>& perm) {
  const Shape& in = t.shape();
  const int64_t stride[4] = {in[1] * in[2] * in[3], in[2] * in[3], in[3], 1};
  const Shape out = {in[size_t(perm[0])], in[size_t(perm[1])], in[size_t(perm[2])],
                     in[size_t(perm[3])]};
  std::vector<float> v;
  v.reserve(size_t(t.numel()));
  for (int64_t a = 0; a < out[0]; ++a) {
    for (int64_t b = 0; b < out[1]; ++b) {
      for (int64_t c = 0; c < out[2]; ++c) {
        for (int64_t d = 0; d < out[3]; ++d) {
          v.push_back(t.data_as<float>()[a * stride[perm[0]] + b * stride[perm[1]] +
                                         c * stride[perm[2]] + d * stride[perm[3]]]);
        }
      }
    }
  }
  return make_f32(out, v);
}

// input_activation applies to X before the convolution, in either layout, depthwise (the case
// sink_conv_activation makes) and dense, at stride 1 and 2, with the output's own activation
// after: against the naive convolution of X activated in double and rounded to float32. The
// padding pads the activated X with zeros: sigmoid, 0.5 at 0, shows it (a kernel that activated
// the padded plane would add half a tap's weight at every border output).
TEST(FusedConvKernel, InputActivationAppliesToXBeforeTheConvolution) {
  const int64_t n = 2, c = 8, h = 7, w = 6;
  const Tensor x = make_f32({n, c, h, w}, random_values(size_t(n * c * h * w), 91));
  const Tensor b = make_f32({c}, random_values(size_t(c), 92));
  struct Act {
    const char* name;
    std::vector<float> params;
    double (*f)(double, const std::vector<float>&);
  };
  const Act acts[] = {
      {"silu", {}, [](double v, const std::vector<float>&) { return v / (1 + std::exp(-v)); }},
      {"hardswish",
       {},
       [](double v, const std::vector<float>&) { return v * std::clamp(v / 6 + 0.5, 0.0, 1.0); }},
      {"relu", {}, [](double v, const std::vector<float>&) { return std::max(v, 0.0); }},
      {"sigmoid", {}, [](double v, const std::vector<float>&) { return 1 / (1 + std::exp(-v)); }},
      {"clip",
       {-0.25f, 0.5f},
       [](double v, const std::vector<float>& p) {
         return std::clamp(v, double(p[0]), double(p[1]));
       }},
  };
  for (const Act& a : acts) {
    std::vector<float> activated(size_t(x.numel()));
    for (int64_t i = 0; i < x.numel(); ++i)
      activated[size_t(i)] = float(a.f(double(x.data_as<float>()[i]), a.params));
    const Tensor xa = make_f32(x.shape(), activated);
    for (int64_t group : {c, int64_t(1)}) {
      const Tensor wt = scaled(
          make_f32({c, c / group, 3, 3}, random_values(size_t(c * (c / group) * 9), 93)), 0.3f);
      for (int64_t stride : {1, 2}) {
        ConvSpec s{n, c, c, group, {h, w}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true};
        s.stride = {stride, stride};
        Tensor want = naive_conv(s, xa, wt, &b);
        for (int64_t i = 0; i < want.numel(); ++i) {
          float& y = want.data_as<float>()[i];
          y = std::max(y, 0.f);  // the output's own relu, after
        }
        for (bool nhwc : {false, true}) {
          OpNode node = op("FusedConv", 1, "kiln")
                            .named("fc_in_act")
                            .i("group", group)
                            .ints("strides", {stride, stride})
                            .ints("pads", {1, 1, 1, 1})
                            .s("activation", "relu")
                            .s("input_activation", a.name);
          if (!a.params.empty()) node.floats("input_activation_params", a.params);
          if (nhwc) node.s("layout", "NHWC");
          const std::string label = std::string(a.name) + (nhwc ? " NHWC" : " NCHW") +
                                    (group == 1 ? " dense" : " depthwise") + " stride " +
                                    std::to_string(stride);
          auto r = run_case(
              {.node = node,
               .inputs = {nhwc ? permuted4(x, {0, 2, 3, 1}) : x,
                          initializer(nhwc ? permuted4(wt, {0, 2, 3, 1}) : wt), initializer(b)},
               .expected = {nhwc ? permuted4(want, {0, 2, 3, 1}) : want},
               .label = label});
          ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
        }
      }
    }
  }
}

// The float16 and bfloat16 references (the input activation computed in double and rounded once
// to X's dtype) against the float32 one, which the test above holds to the naive loop: a reduced
// path that skipped or misrounded the input activation fails here. Channels-last depthwise, as
// sink_conv_activation leaves it; CUDA's depthwise tile kernel runs these where it takes them.
TEST(FusedConvKernel, InputActivationOnFloat16AndBFloat16Depthwise) {
  const int64_t n = 2, h = 9, w = 7, c = 16;
  const Tensor x = make_f32({n, h, w, c}, random_values(size_t(n * h * w * c), 95));
  const Tensor wt = scaled(make_f32({c, 3, 3, 1}, random_values(size_t(c * 9), 96)), 0.3f);
  const Tensor b = make_f32({c}, random_values(size_t(c), 97));
  for (const char* act : {"silu", "hardswish"}) {
    for (int64_t stride : {1, 2}) {
      OpNode node = op("FusedConv", 1, "kiln")
                        .named("dw_in_act")
                        .s("layout", "NHWC")
                        .i("group", c)
                        .ints("strides", {stride, stride})
                        .ints("pads", {1, 1, 1, 1})
                        .s("activation", "none")
                        .s("input_activation", act);
      for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
        const std::string label = std::string(act) + " stride " + std::to_string(stride) + " " +
                                  std::string(dtype_name(dt));
        auto r = testing::run_reduced_case(
            {.node = node, .inputs = {x, initializer(wt), initializer(b)}, .label = label}, dt);
        ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
      }
    }
  }
}

// Channels-last FusedConv with a 3x3 filter (CUDA runs it on cuDNN's graph API), strided and
// padded, with and without bias and residual, on float16 and bfloat16 tensors against the CPU
// reference; a 4-channel input (a padded RGB stem) and a 16-channel one.
TEST(FusedConvKernel, ChannelsLastSpatialOnFloat16AndBFloat16) {
  for (int64_t c : {4, 16}) {
    Tensor x = make_f32({2, 9, 7, c}, random_values(2 * 9 * 7 * c, 81));
    Tensor wt = scaled(make_f32({8, 3, 3, c}, random_values(8 * 9 * c, 82)), 0.2f);
    Tensor b = make_f32({8}, random_values(8, 83));
    Tensor z = make_f32({2, 5, 4, 8}, random_values(2 * 5 * 4 * 8, 84));
    for (const char* act : {"relu", "hardswish"}) {
      for (bool residual : {false, true}) {
        OpNode node = op("FusedConv", 1, "kiln")
                          .named("spatial0")
                          .s("layout", "NHWC")
                          .s("activation", act)
                          .ints("strides", {2, 2})
                          .ints("pads", {1, 1, 1, 1});
        std::vector<testing::CaseInput> inputs = {x, initializer(wt), initializer(b)};
        if (residual) inputs.push_back(z);
        const std::string label =
            "NHWC 3x3 C=" + std::to_string(c) + " " + act + (residual ? " residual" : "");
        for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
          auto r = testing::run_reduced_case({.node = node,
                                              .inputs = inputs,
                                              .expect_support = true,
                                              .label = label + " " + std::string(dtype_name(dt))},
                                             dt);
          ASSERT_TRUE(r.ok()) << label << " " << dtype_name(dt) << ": " << r.status().to_string();
        }
      }
    }
  }
}

// ---- Col2Im ----

TEST(Col2ImInfer, ShapeFromImageAndBlockShape) {
  using testing::const_ints;
  // [N, C*2*3, L] with image 4x5, block 2x3, stride 1: 3*3 blocks.
  auto r = infer_node(op("Col2Im", 18), {f32({kB, 12, 9}), const_ints({4, 5}), const_ints({2, 3})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 2, 4, 5]");
  // L must be the number of blocks, channels divisible by the block size.
  auto bad = infer_node(op("Col2Im", 18).named("c2i"),
                        {f32({1, 12, 8}), const_ints({4, 5}), const_ints({2, 3})});
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status.message().find("c2i"), std::string::npos) << bad.status.to_string();
  EXPECT_FALSE(
      infer_node(op("Col2Im", 18), {f32({1, 10, 9}), const_ints({4, 5}), const_ints({2, 3})}).ok());
  // block_shape must be known at build time, and positive.
  auto runtime = infer_node(op("Col2Im", 18),
                            {f32({1, 12, 9}), const_ints({4, 5}), typed(DType::kInt64, {2})});
  EXPECT_FALSE(runtime.ok());
  EXPECT_NE(runtime.status.message().find("block_shape"), std::string::npos)
      << runtime.status.to_string();
  EXPECT_FALSE(
      infer_node(op("Col2Im", 18), {f32({1, 0, 9}), const_ints({4, 5}), const_ints({0, 3})}).ok());
}

TEST(Col2ImKernel, SumsOverlappingBlocks) {
  auto ints = [](std::vector<int64_t> v) {
    return initializer(testing::make_i64({int64_t(v.size())}, v));
  };
  // 1-D image of 3, blocks of 2 at stride 1: columns l=0 cover 0,1 and l=1 cover 1,2, so position
  // 1 sums block element 1 of column 0 and element 0 of column 1. Two channels.
  auto out = run_case(op("Col2Im", 18),
                      {make_f32({1, 4, 2}, {1, 2, 10, 20, 3, 4, 30, 40}), ints({3}), ints({2})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 2, 3}, {1, 12, 20, 3, 34, 40}), 0, 0));
  // Dilation 2: one column whose two elements land at 0 and 2.
  out = run_case(op("Col2Im", 18).ints("dilations", {2}),
                 {make_f32({1, 2, 1}, {5, 7}), ints({3}), ints({2})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 3}, {5, 0, 7}), 0, 0));
  // Pads 1 each side, stride 2, image 3, block 2: blocks start at -1 and 1, so the padded
  // positions -1 and 3 are dropped.
  out = run_case(op("Col2Im", 18).ints("pads", {1, 1}).ints("strides", {2}),
                 {make_f32({1, 2, 2}, {1, 2, 3, 4}), ints({3}), ints({2})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 3}, {3, 2, 4}), 0, 0));
  // 2-D: ONNX's example, 5x5 from 1x5 blocks (each column is one image row).
  std::vector<float> col(25);
  for (int k = 0; k < 5; ++k) {
    for (int l = 0; l < 5; ++l) col[size_t(k * 5 + l)] = float(l * 5 + k + 1);
  }
  std::vector<float> img(25);
  for (int i = 0; i < 25; ++i) img[size_t(i)] = float(i + 1);
  out = run_case(op("Col2Im", 18), {make_f32({1, 5, 5}, col), ints({5, 5}), ints({1, 5})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 5, 5}, img), 0, 0));
}

// ---- DeformConv ----

TEST(DeformConvInfer, ConvShapeAndOffsetChecks) {
  // X [b, 4, h, w], W [6, 2, 3, 3] (group 2), offset_group 2: offset has 2*9*2 = 36 channels.
  auto node = op("DeformConv", 19).i("group", 2).i("offset_group", 2).ints("pads", {1, 1, 1, 1});
  auto r = infer_node(node, {f32({kB, 4, 8, 8}), f32({6, 2, 3, 3}), f32({kB, 36, 8, 8}), f32({6}),
                             f32({kB, 18, 8, 8})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 6, 8, 8]");
  // Wrong offset channels, offset spatial size or mask channels.
  EXPECT_FALSE(infer_node(node, {f32({1, 4, 8, 8}), f32({6, 2, 3, 3}), f32({1, 18, 8, 8})}).ok());
  EXPECT_FALSE(infer_node(node, {f32({1, 4, 8, 8}), f32({6, 2, 3, 3}), f32({1, 36, 6, 6})}).ok());
  EXPECT_FALSE(infer_node(node, {f32({1, 4, 8, 8}), f32({6, 2, 3, 3}), f32({1, 36, 8, 8}),
                                 testing::kOmitted, f32({1, 36, 8, 8})})
                   .ok());
  // Only 2-D.
  auto r3 = infer_node(op("DeformConv", 19),
                       {f32({1, 1, 4, 4, 4}), f32({1, 1, 2, 2, 2}), f32({1, 24, 3, 3, 3})});
  EXPECT_EQ(r3.code(), StatusCode::kUnsupported) << r3.status.to_string();
}

TEST(DeformConvKernel, ZeroOffsetsAreConvAndOffsetsShiftTheTaps) {
  // X 3x3 = 1..9, W 2x2 of ones: with zero offsets each output is its window's sum.
  Tensor x = make_f32({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor w = make_f32({1, 1, 2, 2}, {1, 1, 1, 1});
  Tensor zero = make_f32({1, 8, 2, 2}, std::vector<float>(32, 0.0f));
  auto out = run_case(op("DeformConv", 19), {x, w, zero});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 2, 2}, {12, 16, 24, 28}), 1e-6, 0));
  // dy = +1 on every tap moves each window down a row; the bottom row's taps fall outside (0).
  // With bias 1 and mask 0.5: 0.5 * {24, 28, 15, 17} + 1.
  std::vector<float> down(32, 0.0f);
  for (int t = 0; t < 4; ++t) {
    for (int o = 0; o < 4; ++o) down[size_t(t * 2 * 4 + o)] = 1.0f;  // channel 2t is dy
  }
  out = run_case(op("DeformConv", 19), {x, w, make_f32({1, 8, 2, 2}, down), make_f32({1}, {1}),
                                        make_f32({1, 4, 2, 2}, std::vector<float>(16, 0.5f))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 2, 2}, {13, 15, 8.5f, 9.5f}), 1e-6, 0));
  // dx = +0.5: taps halfway between columns, a linear plane's mean: window (0,0) reads
  // 1.5 + 2.5 + 4.5 + 5.5 = 14; the right windows' last column is half outside (x = 2.5 reads
  // 0.5 * x[.., 2]).
  std::vector<float> right(32, 0.0f);
  for (int t = 0; t < 4; ++t) {
    for (int o = 0; o < 4; ++o) right[size_t((t * 2 + 1) * 4 + o)] = 0.5f;
  }
  out = run_case(op("DeformConv", 19), {x, w, make_f32({1, 8, 2, 2}, right)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close(
      (*out)[0], make_f32({1, 1, 2, 2}, {14, 2.5f + 1.5f + 5.5f + 3, 26, 5.5f + 3 + 8.5f + 4.5f}),
      1e-6, 0));
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// ---- MaxPool on 8-bit integers and column-major Indices ----

TEST(PoolKernel, MaxPoolOnInt8AndUInt8) {
  using testing::make_typed;
  auto pool = testing::op("MaxPool", 12).ints("kernel_shape", {2, 2});
  // [1, 1, 2, 3], two 2x2 windows (columns 0-1 and 1-2). uint8 above 127 stays unsigned; int8
  // windows of negatives only (the max must not start from 0).
  auto got =
      testing::run_case(pool, {make_typed(DType::kUInt8, {1, 1, 2, 3}, {1, 200, 3, 250, 5, 6})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(
      testing::all_close((*got)[0], make_typed(DType::kUInt8, {1, 1, 1, 2}, {250, 200}), 0, 0));
  got = testing::run_case(pool, {make_typed(DType::kInt8, {1, 1, 2, 3}, {-5, -8, -3, -7, -6, -9})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(
      testing::all_close((*got)[0], make_typed(DType::kInt8, {1, 1, 1, 2}, {-5, -3}), 0, 0));
  // AveragePool stays float-only.
  EXPECT_FALSE(testing::infer_node(testing::op("AveragePool", 19).ints("kernel_shape", {2, 2}),
                                   {testing::typed(DType::kUInt8, {1, 1, 2, 3})})
                   .ok());
}

TEST(PoolKernel, MaxPoolColumnMajorIndices) {
  // 1x1 windows over two 2x3 planes: each element is its own max. Column-major numbers (h, w) as
  // h + 2*w within a plane, plus the plane's offset (6).
  std::vector<float> x(12);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);
  auto pool = testing::op("MaxPool", 12).ints("kernel_shape", {1, 1}).i("storage_order", 1);
  auto got = testing::run_case(pool, {make_f32({1, 2, 2, 3}, x)}, 2);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(testing::all_close(
      (*got)[1], testing::make_i64({1, 2, 2, 3}, {0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11}), 0, 0));
  // A 2x2 window whose max sits at (0, 1): row-major 1, column-major 2.
  Tensor one = make_f32({1, 1, 2, 3}, {1, 9, 3, 4, 5, 6});
  auto two = testing::op("MaxPool", 12).ints("kernel_shape", {2, 2});
  got = testing::run_case(two, {one}, 2);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(testing::all_close((*got)[1], testing::make_i64({1, 1, 1, 2}, {1, 1}), 0, 0));
  got = testing::run_case(two.i("storage_order", 1), {one}, 2);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(testing::all_close((*got)[1], testing::make_i64({1, 1, 1, 2}, {2, 2}), 0, 0));
  // storage_order is 0 or 1.
  EXPECT_FALSE(testing::infer_node(
                   testing::op("MaxPool", 12).ints("kernel_shape", {1, 1}).i("storage_order", 2),
                   {f32({1, 1, 2, 3})}, 2)
                   .ok());
}

}  // namespace
}  // namespace kiln
