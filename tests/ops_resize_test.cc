// Resize op family: symbolic shape inference (scales, sizes, axes, DepthToSpace/SpaceToDepth) and
// the CPU reference kernels against hand-computed values and naive loops written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "op_harness.h"
#include "typed_values.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::all_close;
using testing::CaseInput;
using testing::constant;
using testing::f32;
using testing::infer_node;
using testing::initializer;
using testing::KernelCase;
using testing::kNoInput;
using testing::kOmitted;
using testing::make_f32;
using testing::make_i64;
using testing::NodeInput;
using testing::op;
using testing::OpNode;
using testing::run_case;
using testing::run_reduced_case;
using testing::typed;
using testing::with_value;

NodeInput scales_in(std::vector<float> s) { return constant(make_f32({int64_t(s.size())}, s)); }

// Scales and sizes fix the output shape, so the builder needs them: initializers.
CaseInput scales(std::vector<float> s) { return initializer(make_f32({int64_t(s.size())}, s)); }
CaseInput sizes(std::vector<int64_t> s) { return initializer(make_i64({int64_t(s.size())}, s)); }

OpNode resize(int opset) { return op("Resize", opset).named("rs0"); }

const Dim kN = Dim::symbol("n");
const Dim kH = Dim::symbol("h");
const Dim kW = Dim::symbol("w");

TEST(ResizeOpsInfer, IntegerScaleStaysExact) {
  // The UNet decoder: floor(2*h * 2.0) must be 4*h, not an opaque floor.
  auto r = infer_node(resize(18).s("mode", "linear"),
                      {f32({kN, 8, kH * 2, kW * 2}), kOmitted, scales_in({1, 1, 2, 2})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[n, 8, 4*h, 4*w]");
}

TEST(ResizeOpsInfer, DyadicAndOtherScales) {
  auto r = infer_node(resize(13), {f32({kN, 3, kH, 10}), kOmitted, scales_in({1, 1, 0.5f, 1.5f})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.dims()[2].eval({{"h", 7}}), 3);
  EXPECT_EQ(r.dims()[3], Dim(15));
  // 0.6 is not exact in binary: fine on a constant dim (floor(10 * 0.6f) = 6) ...
  r = infer_node(resize(13), {f32({kN, 3, 10, 10}), kOmitted, scales_in({1, 1, 0.6f, 1})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.dims()[2], Dim(6));
  // ... but unsupported on a symbolic one.
  r = infer_node(resize(13), {f32({kN, 3, kH, 10}), kOmitted, scales_in({1, 1, 0.6f, 1})});
  EXPECT_EQ(r.code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status.message().find("rs0"), std::string::npos);
}

TEST(ResizeOpsInfer, SizesAndAxes) {
  auto r = infer_node(resize(13), {f32({kN, 8, kH, kW}), kOmitted, kOmitted,
                                   with_value(DType::kInt64, {4}, {kN, 8, kH * 2, kW * 3})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[n, 8, 2*h, 3*w]");
  r = infer_node(resize(18).ints("axes", {-1, 2}),
                 {f32({kN, 8, kH, kW}), kOmitted, kOmitted, constant(make_i64({2}, {5, 7}))});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[n, 8, 7, 5]");
  r = infer_node(resize(18).ints("axes", {-1, 2}).s("keep_aspect_ratio_policy", "not_larger"),
                 {f32({1, 1, 4, 8}), kOmitted, kOmitted, constant(make_i64({2}, {4, 4}))});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[1, 1, 2, 4]");  // scale min(4/8, 4/4) = 0.5
}

TEST(ResizeOpsInfer, Errors) {
  const NodeInput x = f32({kN, 8, kH, kW});
  const NodeInput sz = constant(make_i64({4}, {1, 8, 4, 4}));
  EXPECT_EQ(infer_node(resize(13), {x, kOmitted, scales_in({1, 1, 2, 2}), sz}).code(),
            StatusCode::kInvalidModel);                                      // both
  EXPECT_EQ(infer_node(resize(13), {x}).code(), StatusCode::kInvalidModel);  // neither
  EXPECT_EQ(infer_node(resize(13), {x, kOmitted, scales_in({2, 2})}).code(),
            StatusCode::kInvalidModel);
  EXPECT_EQ(infer_node(resize(13), {x, kOmitted, scales_in({1, 1, 0, 2})}).code(),
            StatusCode::kInvalidModel);
  // Scales computed at run time.
  EXPECT_EQ(infer_node(resize(13), {x, kOmitted, f32({4})}).code(), StatusCode::kUnsupported);
  // Sizes computed at run time.
  EXPECT_EQ(infer_node(resize(13), {x, kOmitted, kOmitted, typed(DType::kInt64, {4})}).code(),
            StatusCode::kUnsupported);
  EXPECT_EQ(
      infer_node(resize(13).s("mode", "bicubic"), {x, kOmitted, scales_in({1, 1, 2, 2})}).code(),
      StatusCode::kInvalidModel);
  EXPECT_EQ(infer_node(resize(18).s("mode", "linear").i("antialias", 2),
                       {x, kOmitted, scales_in({1, 1, 0.5f, 0.5f})})
                .code(),
            StatusCode::kInvalidModel);
}

TEST(ResizeOpsInfer, AntialiasDownsamplingKeepsTheShape) {
  auto r = infer_node(resize(18).s("mode", "linear").i("antialias", 1),
                      {f32({kN, 3, 8, 10}), kOmitted, scales_in({1, 1, 0.5f, 0.6f})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[n, 3, 4, 6]");
  r = infer_node(resize(18).s("mode", "cubic").i("antialias", 1),
                 {f32({1, 3, 8, 10}), kOmitted, kOmitted, constant(make_i64({4}, {1, 3, 3, 5}))});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[1, 3, 3, 5]");
}

TEST(ResizeOpsInfer, DepthToSpaceAndBack) {
  const OpNode d = op("DepthToSpace", 13).i("blocksize", 2);
  auto r = infer_node(d, {f32({kN, 12, kH, kW})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[n, 3, 2*h, 2*w]");
  EXPECT_EQ(infer_node(d, {f32({kN, 10, kH, kW})}).code(), StatusCode::kInvalidModel);
  // Symbolic channels: the divisibility is recorded for the profile checker.
  Dim c = Dim::symbol("c");
  r = infer_node(d, {f32({kN, c, kH, kW})});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.constraints.size(), 1u);
  EXPECT_EQ(r.constraints[0].kind, ops::Constraint::Kind::kDivisible);
  const OpNode s = op("SpaceToDepth", 13).i("blocksize", 2);
  r = infer_node(s, {f32({kN, 3, kH * 2, kW * 2})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[n, 12, h, w]");
  EXPECT_EQ(infer_node(s, {f32({kN, 3, 5, 4})}).code(), StatusCode::kInvalidModel);
  EXPECT_EQ(infer_node(op("DepthToSpace", 13), {f32({kN, 12, kH, kW})}).code(),
            StatusCode::kInvalidModel);  // blocksize is required
}

std::vector<float> iota_values(int64_t n, float start = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = start + float(i);
  return v;
}

// Naive bilinear, half_pixel, integer scale, over the last two axes of NCHW.
std::vector<float> naive_bilinear(const std::vector<float>& x, int64_t nc, int64_t h, int64_t w,
                                  int64_t s) {
  std::vector<float> y;
  for (int64_t p = 0; p < nc; ++p) {
    for (int64_t oy = 0; oy < h * s; ++oy) {
      for (int64_t ox = 0; ox < w * s; ++ox) {
        double sy = std::min(std::max((oy + 0.5) / double(s) - 0.5, 0.0), double(h - 1));
        double sx = std::min(std::max((ox + 0.5) / double(s) - 0.5, 0.0), double(w - 1));
        int64_t y0 = int64_t(sy), x0 = int64_t(sx);
        int64_t y1 = std::min(y0 + 1, h - 1), x1 = std::min(x0 + 1, w - 1);
        double ly = sy - double(y0), lx = sx - double(x0);
        auto at = [&](int64_t yy, int64_t xx) { return double(x[(p * h + yy) * w + xx]); };
        double top = at(y0, x0) * (1 - lx) + at(y0, x1) * lx;
        double bot = at(y1, x0) * (1 - lx) + at(y1, x1) * lx;
        y.push_back(float(top * (1 - ly) + bot * ly));
      }
    }
  }
  return y;
}

TEST(ResizeOpsKernel, BilinearHalfPixel2xNchw) {
  const OpNode n = resize(18).s("mode", "linear");
  std::vector<float> x(2 * 3 * 5 * 7);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 0.91f) * 2.0f + 0.1f;
  auto out = run_case(n, {make_f32({2, 3, 5, 7}, x), kNoInput, scales({1, 1, 2, 2})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({2, 3, 10, 14}, naive_bilinear(x, 6, 5, 7, 2))));
  // ONNX's resize_upsample_scales_linear: [[1, 2], [3, 4]] x2.
  out = run_case(n, {make_f32({1, 1, 2, 2}, {1, 2, 3, 4}), kNoInput, scales({1, 1, 2, 2})});
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(
      all_close((*out)[0], make_f32({1, 1, 4, 4}, {1, 1.25f, 1.75f, 2, 1.5f, 1.75f, 2.25f, 2.5f,
                                                   2.5f, 2.75f, 3.25f, 3.5f, 3, 3.25f, 3.75f, 4})));
}

TEST(ResizeOpsKernel, NearestModes) {
  // 8 -> 3 with half_pixel: source coordinates 0.833, 3.5, 6.167.
  std::vector<float> x = iota_values(8, 0.0f);
  struct Case {
    const char* mode;
    std::vector<float> expect;
  };
  for (const Case& c : {Case{"round_prefer_floor", {1, 3, 6}}, Case{"round_prefer_ceil", {1, 4, 6}},
                        Case{"floor", {0, 3, 6}}, Case{"ceil", {1, 4, 7}}}) {
    auto out = run_case(resize(13).s("nearest_mode", c.mode),
                        {make_f32({8}, x), kNoInput, kNoInput, sizes({3})});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_TRUE(all_close((*out)[0], make_f32({3}, c.expect))) << c.mode;
  }
  // asymmetric + floor, up and down.
  const OpNode n =
      resize(13).s("coordinate_transformation_mode", "asymmetric").s("nearest_mode", "floor");
  auto out = run_case(n, {make_f32({1, 4}, {1, 2, 3, 4}), kNoInput, scales({1, 0.5f})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 2}, {1, 3})));
  out = run_case(n, {make_f32({1, 2}, {5, 6}), kNoInput, scales({2, 2})});
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(all_close((*out)[0], make_f32({2, 4}, {5, 5, 6, 6, 5, 5, 6, 6})));
  // ONNX's resize_upsample_scales_nearest (half_pixel, round_prefer_floor), scales 2 and 3.
  out =
      run_case(resize(13), {make_f32({1, 1, 2, 2}, {1, 2, 3, 4}), kNoInput, scales({1, 1, 2, 3})});
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 4, 6}, {1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2,
                                                           3, 3, 3, 4, 4, 4, 3, 3, 3, 4, 4, 4})));
  // Integer tensors resize with nearest too.
  out = run_case(resize(13), {make_i64({1, 2}, {7, -9}), kNoInput, scales({1, 2})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ((*out)[0].shape(), (Shape{1, 4}));
  EXPECT_EQ((*out)[0].data_as<int64_t>()[1], 7);
  EXPECT_EQ((*out)[0].data_as<int64_t>()[2], -9);
}

TEST(ResizeOpsKernel, Opset10UsesAsymmetricAndCeilWhenDownsampling) {
  // ONNX's opset-10 resize_downsample_nearest: scales 0.6 on [[1, 2, 3, 4], [5, 6, 7, 8]].
  auto out =
      run_case(resize(10), {make_f32({1, 1, 2, 4}, iota_values(8)), scales({1, 1, 0.6f, 0.6f})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 1, 2}, {1, 3})));
}

TEST(ResizeOpsKernel, LinearAlignCorners) {
  auto out =
      run_case(resize(13).s("mode", "linear").s("coordinate_transformation_mode", "align_corners"),
               {make_f32({1, 1, 2, 2}, {1, 2, 3, 4}), kNoInput, scales({1, 1, 2, 2})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  std::vector<float> e;
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 4; ++x) e.push_back(1.0f + 2.0f * float(y) / 3.0f + float(x) / 3.0f);
  }
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 4, 4}, e)));
  EXPECT_NEAR((*out)[0].data_as<float>()[1], 1.3333333f, 1e-6);
}

// Naive 2-D cubic (Keys, coefficient a), half_pixel, edge-clamped neighbours.
std::vector<float> naive_cubic(const std::vector<float>& x, int64_t h, int64_t w, int64_t oh,
                               int64_t ow, double a, bool exclude_outside) {
  auto kernel = [a](double t) {
    t = std::fabs(t);
    if (t <= 1) return (a + 2) * t * t * t - (a + 3) * t * t + 1;
    if (t < 2) return a * t * t * t - 5 * a * t * t + 8 * a * t - 4 * a;
    return 0.0;
  };
  auto weights = [&](double src, int64_t n, int64_t idx[4], double wt[4]) {
    double f = std::floor(src);
    double sum = 0;
    for (int k = 0; k < 4; ++k) {
      int64_t i = int64_t(f) - 1 + k;
      wt[k] = kernel(src - double(i));
      if (exclude_outside && (i < 0 || i >= n)) wt[k] = 0;
      sum += wt[k];
      idx[k] = std::min(std::max<int64_t>(i, 0), n - 1);
    }
    if (exclude_outside) {
      for (int k = 0; k < 4; ++k) wt[k] /= sum;
    }
  };
  std::vector<float> y;
  for (int64_t oy = 0; oy < oh; ++oy) {
    for (int64_t ox = 0; ox < ow; ++ox) {
      int64_t iy[4], ix[4];
      double wy[4], wx[4];
      weights((oy + 0.5) * double(h) / double(oh) - 0.5, h, iy, wy);
      weights((ox + 0.5) * double(w) / double(ow) - 0.5, w, ix, wx);
      double v = 0;
      for (int r = 0; r < 4; ++r) {
        for (int c = 0; c < 4; ++c) v += wy[r] * wx[c] * x[iy[r] * w + ix[c]];
      }
      y.push_back(float(v));
    }
  }
  return y;
}

TEST(ResizeOpsKernel, CubicHalfPixel) {
  std::vector<float> x = iota_values(16);
  auto out = run_case(resize(13).s("mode", "cubic").f("cubic_coeff_a", -0.75f),
                      {make_f32({1, 1, 4, 4}, x), kNoInput, scales({1, 1, 2, 2})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(
      all_close((*out)[0], make_f32({1, 1, 8, 8}, naive_cubic(x, 4, 4, 8, 8, -0.75, false))));
  // ONNX's resize_upsample_scales_cubic starts with 0.47265625.
  EXPECT_NEAR((*out)[0].data_as<float>()[0], 0.47265625f, 1e-6);
  // exclude_outside renormalizes the in-range weights; downsample 4x4 -> 3x3 via sizes.
  std::vector<float> z(16);
  for (int i = 0; i < 16; ++i) z[i] = float((i * 7) % 11) - 3.0f;
  out = run_case(resize(13).s("mode", "cubic").i("exclude_outside", 1).f("cubic_coeff_a", -0.5f),
                 {make_f32({1, 1, 4, 4}, z), kNoInput, kNoInput, sizes({1, 1, 3, 3})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 3, 3}, naive_cubic(z, 4, 4, 3, 3, -0.5, true))));
}

TEST(ResizeOpsKernel, TfCropAndResizeWithExtrapolation) {
  const OpNode n =
      resize(13).s("mode", "linear").s("coordinate_transformation_mode", "tf_crop_and_resize");
  // The roi is read at run time: a plain input.
  auto out = run_case(
      n, {make_f32({1, 1, 4, 4}, iota_values(16)),
          make_f32({8}, {0, 0, 0.4f, 0.6f, 1, 1, 0.6f, 0.8f}), kNoInput, sizes({1, 1, 3, 3})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 3, 3}, {7.6f, 7.9f, 8.2f, 8.8f, 9.1f, 9.4f,
                                                           10.0f, 10.3f, 10.6f})));
  out = run_case(
      OpNode(n).f("extrapolation_value", 10.0f),
      {make_f32({1, 1, 4, 4}, iota_values(16)), make_f32({8}, {0, 0, 0.4f, 0.6f, 1, 1, 1.2f, 1.7f}),
       kNoInput, sizes({1, 1, 3, 3})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(
      all_close((*out)[0], make_f32({1, 1, 3, 3}, {7.6f, 10, 10, 12.4f, 10, 10, 10, 10, 10})));
}

// A float32 resize over the spatial axes alone runs plane by plane, each input row interpolated
// along W once (resize.cc's resize_planes_f32); one that also resizes N takes the general path.
// Where N's linear taps are (1, 0), output planes 0 and 3 of [2, 1, H, W] -> [4, 1, ...] are input
// planes 0 and 1: the general path's bits there are the plane path's on the same planes, including
// rows and columns outside a tf_crop_and_resize roi (the extrapolation value).
TEST(ResizeOpsKernel, PlanesAloneGiveTheGeneralPathsBits) {
  std::vector<float> x(2 * 7 * 9);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 1.37f) * 3.0f + 0.25f;
  const Tensor input = make_f32({2, 1, 7, 9}, x);
  struct Mode {
    const char* coord;
    std::vector<float> roi;  // empty: none
  };
  for (const Mode& m : {Mode{"half_pixel", {}}, Mode{"align_corners", {}},
                        Mode{"tf_crop_and_resize", {0, 0, -0.2f, 0.1f, 1, 1, 1.3f, 1.15f}}}) {
    const OpNode n = resize(13)
                         .s("mode", "linear")
                         .s("coordinate_transformation_mode", m.coord)
                         .f("extrapolation_value", -7.5f);
    // N's roi is [0, 1]: output 0 and 3 read input 0 and 1 exactly.
    const CaseInput roi = m.roi.empty() ? kNoInput : CaseInput(make_f32({8}, m.roi));
    auto general = run_case(n, {input, roi, scales({2, 1, 1.75f, 2.5f})});
    auto planes = run_case(n, {input, roi, scales({1, 1, 1.75f, 2.5f})});
    ASSERT_TRUE(general.ok()) << m.coord << ": " << general.status().to_string();
    ASSERT_TRUE(planes.ok()) << m.coord << ": " << planes.status().to_string();
    const Tensor& g = (*general)[0];
    const Tensor& p = (*planes)[0];
    // 7x9 by 1.75x2.5: 12x22, or 18x23 over tf_crop_and_resize's roi (1.5 and 1.05 of the axes).
    const int64_t h = m.roi.empty() ? 12 : 18, w = m.roi.empty() ? 22 : 23, plane = h * w;
    ASSERT_EQ(g.shape(), (Shape{4, 1, h, w})) << m.coord;
    ASSERT_EQ(p.shape(), (Shape{2, 1, h, w})) << m.coord;
    for (auto [gi, pi] : {std::pair<int64_t, int64_t>{0, 0}, {3, 1}}) {
      for (int64_t e = 0; e < plane; ++e) {
        const float a = g.data_as<float>()[gi * plane + e], b = p.data_as<float>()[pi * plane + e];
        ASSERT_EQ(std::memcmp(&a, &b, 4), 0)
            << m.coord << " plane " << gi << " element " << e << ": " << a << " vs " << b;
      }
    }
    if (!m.roi.empty()) {  // the roi reaches outside: some outputs are the extrapolation value
      const float* v = p.data_as<float>();
      EXPECT_GT(std::count(v, v + 2 * plane, -7.5f), 0) << m.coord;
    }
  }
}

// The CUDA backend's two-axis kernel (nearest and linear, at most two axes resized, float data):
// channels-last images (C a whole number of 16-byte vectors: a vector of channels a thread), NCHW
// planes whose output width is a multiple of 4 (four outputs along W a thread) and not (one), and
// one axis alone; each in float32, float16 and bfloat16 against the reference.
TEST(ResizeOpsKernel, TwoAxesInEveryLayoutAndDtype) {
  struct Case {
    const char* mode;
    const char* coord;
    Shape shape;
    std::vector<float> scale;
  };
  const Case cases[] = {
      {"nearest", "asymmetric", {2, 3, 6, 8}, {1, 1, 2, 2}},             // NCHW, W out 16
      {"linear", "half_pixel", {2, 3, 5, 7}, {1, 1, 2, 2}},              // NCHW, W out 14
      {"linear", "pytorch_half_pixel", {1, 2, 6, 10}, {1, 1, 1.5f, 2}},  // NCHW, W out 20
      {"linear", "align_corners", {2, 5, 7, 16}, {1, 2, 2, 1}},          // NHWC, 16 channels
      {"nearest", "half_pixel", {2, 5, 7, 16}, {1, 0.6f, 2, 1}},         // NHWC, H down
      {"linear", "half_pixel", {2, 4, 9}, {1, 1, 2.5f}},                 // the last axis alone
      {"linear", "asymmetric", {2, 5, 7, 3}, {1, 2, 2, 1}},              // NHWC, 3 channels
      // More rows than the launch has threads along them (each thread walks several rows).
      {"linear", "half_pixel", {4, 64, 40, 24}, {1, 1, 2, 2}},
      {"nearest", "asymmetric", {3, 40, 30, 8}, {1, 2, 2, 1}},
      {"linear", "half_pixel", {64, 40, 24}, {1, 1, 2}},        // W alone: 2560 planes
      {"linear", "align_corners", {2, 6, 3, 8}, {1, 2, 1, 2}},  // H and W apart: B = 3
  };
  for (const Case& c : cases) {
    int64_t n = 1;
    for (int64_t d : c.shape) n *= d;
    std::vector<float> x(static_cast<size_t>(n));
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 0.77f) * 2.5f + 0.3f;
    const KernelCase k{
        .node = resize(18).s("mode", c.mode).s("coordinate_transformation_mode", c.coord),
        .inputs = {make_f32(c.shape, x), kNoInput, scales(c.scale)},
        .expect_support = true,
        .label = std::string(c.mode) + " " + c.coord};
    auto out = run_case(k);
    ASSERT_TRUE(out.ok()) << k.label << ": " << out.status().to_string();
    for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
      auto reduced = run_reduced_case(k, dt, {2});  // the scales stay float32
      ASSERT_TRUE(reduced.ok()) << k.label << " " << dtype_name(dt) << ": "
                                << reduced.status().to_string();
    }
  }
}

// DepthToSpace and SpaceToDepth in both modes and two block sizes against the permutation written
// out per element, on tensors large enough to split over the CPU's threads; the round trip gives
// the input back.
TEST(ResizeOpsKernel, DepthToSpaceAndSpaceToDepthAgainstThePermutation) {
  for (const char* mode : {"DCR", "CRD"}) {
    for (int64_t b : {2, 3}) {
      const int64_t n = 2, c = 16, h = 60 / b * 2, w = 36 / b * 2;  // deep [n, c*b*b, h, w]
      std::vector<float> x(size_t(n * c * b * b * h * w));
      for (size_t i = 0; i < x.size(); ++i) x[i] = float(i) * 0.5f - 7.f;
      std::vector<float> want(x.size());
      for (int64_t in = 0; in < n; ++in) {
        for (int64_t ic = 0; ic < c; ++ic) {
          for (int64_t oh = 0; oh < h * b; ++oh) {
            for (int64_t ow = 0; ow < w * b; ++ow) {
              const int64_t i = oh % b, j = ow % b;
              const int64_t ch =
                  std::string(mode) == "CRD" ? ic * b * b + i * b + j : (i * b + j) * c + ic;
              want[size_t(((in * c + ic) * h * b + oh) * w * b + ow)] =
                  x[size_t(((in * c * b * b + ch) * h + oh / b) * w + ow / b)];
            }
          }
        }
      }
      const std::string label = std::string(mode) + " blocksize " + std::to_string(b);
      auto wide = run_case(op("DepthToSpace", 13).i("blocksize", b).s("mode", mode),
                           {make_f32({n, c * b * b, h, w}, x)});
      ASSERT_TRUE(wide.ok()) << label << ": " << wide.status().to_string();
      EXPECT_TRUE(all_close((*wide)[0], make_f32({n, c, h * b, w * b}, want), 0, 0)) << label;
      auto deep = run_case(op("SpaceToDepth", 28).i("blocksize", b).s("mode", mode),
                           {make_f32({n, c, h * b, w * b}, want)});
      ASSERT_TRUE(deep.ok()) << label << ": " << deep.status().to_string();
      EXPECT_TRUE(all_close((*deep)[0], make_f32({n, c * b * b, h, w}, x), 0, 0)) << label;
    }
  }
}

TEST(ResizeOpsKernel, DtypesAntialiasUpsamplingAndUnroundedAlignCorners) {
  // float16 cubic, a non-integer scale (3 * 1.7 = 5.1 -> 5 outputs) with align_corners, which uses
  // the unrounded length 5.1.
  std::vector<uint16_t> h;
  for (float v : iota_values(6)) h.push_back(float_to_half(v * 0.5f));
  auto out = run_case(
      resize(13).s("mode", "cubic").s("coordinate_transformation_mode", "align_corners"),
      {Tensor::from_vector(DType::kFloat16, {1, 1, 2, 3}, h), kNoInput, scales({1, 1, 1, 1.7f})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].shape(), (Shape{1, 1, 2, 5}));
  EXPECT_EQ((*out)[0].dtype(), DType::kFloat16);
  // uint8 nearest.
  std::vector<uint8_t> u = {0, 50, 100, 250};
  out = run_case(resize(19).s("nearest_mode", "round_prefer_ceil"),
                 {Tensor::from_vector(DType::kUInt8, {1, 4}, u), kNoInput, scales({1, 1.5f})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].shape(), (Shape{1, 6}));
  EXPECT_EQ((*out)[0].data_as<uint8_t>()[5], 250);
  // antialias while upsampling is the plain linear resize (constant scales >= 1).
  auto plain = run_case(resize(18).s("mode", "linear"),
                        {make_f32({1, 1, 2, 2}, {1, 2, 3, 4}), kNoInput, scales({1, 1, 2, 1.5f})});
  out = run_case(resize(18).s("mode", "linear").i("antialias", 1),
                 {make_f32({1, 1, 2, 2}, {1, 2, 3, 4}), kNoInput, scales({1, 1, 2, 1.5f})});
  ASSERT_TRUE(out.ok() && plain.ok());
  EXPECT_TRUE(all_close((*out)[0], (*plain)[0]));
  // float64 cubic with exclude_outside from sizes under not_larger.
  std::vector<double> d(20);
  for (size_t i = 0; i < d.size(); ++i) d[i] = std::cos(double(i));
  out = run_case(
      resize(18)
          .s("mode", "cubic")
          .i("exclude_outside", 1)
          .s("keep_aspect_ratio_policy", "not_larger")
          .ints("axes", {2, 3}),
      {Tensor::from_vector(DType::kFloat64, {1, 1, 4, 5}, d), kNoInput, kNoInput, sizes({7, 7})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].dtype(), DType::kFloat64);
}

// ---- antialias ----

// One axis of an antialiased resize as a dense matrix, by the definition in the ONNX spec: output
// o samples x (half_pixel), and every input position i within the filter's reach contributes
// K((i - x) * s), K the triangle (linear) or Keys cubic kernel stretched by 1 / s, s = min(scale,
// 1); positions past the edge read the edge (or drop out under exclude_outside); rows sum to 1.
std::vector<std::vector<double>> antialias_matrix(int64_t in, int64_t out, double scale, bool cubic,
                                                  bool exclude_outside, double a) {
  const double s = std::min(scale, 1.0), reach = (cubic ? 2.0 : 1.0) / s;
  auto kernel = [&](double d) {
    d = std::fabs(d);
    if (!cubic) return std::max(0.0, 1 - d);
    if (d <= 1) return (a + 2) * d * d * d - (a + 3) * d * d + 1;
    if (d < 2) return a * d * d * d - 5 * a * d * d + 8 * a * d - 4 * a;
    return 0.0;
  };
  std::vector<std::vector<double>> m(size_t(out), std::vector<double>(size_t(in), 0.0));
  for (int64_t o = 0; o < out; ++o) {
    const double x = (double(o) + 0.5) / scale - 0.5;
    double norm = 0;
    for (int64_t i = int64_t(std::floor(x - reach)) - 1; i <= int64_t(std::ceil(x + reach)) + 1;
         ++i) {
      if (exclude_outside && (i < 0 || i >= in)) continue;
      const double w = kernel((double(i) - x) * s);
      m[size_t(o)][size_t(std::clamp<int64_t>(i, 0, in - 1))] += w;
      norm += w;
    }
    for (double& v : m[size_t(o)]) v /= norm;
  }
  return m;
}

struct AntialiasSpec {
  Shape x;  // [n, c, h, w]
  bool cubic = false;
  std::vector<float> scales;   // for h and w, or empty with sizes
  std::vector<int64_t> sizes;  // for h and w (through axes {2, 3})
  bool exclude_outside = false;
  float cubic_a = -0.75f;
  DType dtype = DType::kFloat32;
};

// Runs the case on every backend (CUDA must accept it) and checks the reference against the
// separable dense-matrix resize.
void check_antialias(const AntialiasSpec& s, const std::string& label) {
  const int64_t h = s.x[2], w = s.x[3];
  double sh, sw;
  int64_t oh, ow;
  if (s.sizes.empty()) {
    sh = s.scales[0], sw = s.scales[1];
    oh = int64_t(std::floor(double(h) * sh)), ow = int64_t(std::floor(double(w) * sw));
  } else {
    oh = s.sizes[0], ow = s.sizes[1];
    sh = double(oh) / double(h), sw = double(ow) / double(w);
  }
  std::vector<double> xv(size_t(shape_numel(s.x)));
  for (size_t i = 0; i < xv.size(); ++i) {
    xv[i] = testing::make_typed(s.dtype, {1}, {std::sin(0.37 * double(i)) * 4 + double(i % 7)})
                .float_at(0);
  }
  const auto mh = antialias_matrix(h, oh, sh, s.cubic, s.exclude_outside, s.cubic_a);
  const auto mw = antialias_matrix(w, ow, sw, s.cubic, s.exclude_outside, s.cubic_a);
  const int64_t planes = s.x[0] * s.x[1];
  std::vector<double> yv;
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        double acc = 0;
        for (int64_t u = 0; u < h; ++u) {
          for (int64_t v = 0; v < w; ++v) {
            acc += mh[size_t(i)][size_t(u)] * mw[size_t(j)][size_t(v)] *
                   xv[size_t((p * h + u) * w + v)];
          }
        }
        yv.push_back(acc);
      }
    }
  }
  OpNode node = resize(18).s("mode", s.cubic ? "cubic" : "linear").i("antialias", 1);
  if (s.exclude_outside) node.i("exclude_outside", 1);
  if (s.cubic) node.f("cubic_coeff_a", s.cubic_a);
  std::vector<CaseInput> in = {testing::make_typed(s.dtype, s.x, xv), kNoInput};
  if (s.sizes.empty()) {
    in.push_back(scales({1, 1, s.scales[0], s.scales[1]}));
  } else {
    node.ints("axes", {2, 3});
    in.push_back(kNoInput);
    in.push_back(sizes(s.sizes));
  }
  auto r =
      run_case({.node = node, .inputs = std::move(in), .expect_support = true, .label = label});
  ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
  const testing::Tolerance tol = testing::op_tolerance(s.dtype);
  EXPECT_TRUE(all_close((*r)[0], testing::make_typed(s.dtype, {s.x[0], s.x[1], oh, ow}, yv),
                        tol.atol, tol.rtol))
      << label;
}

TEST(ResizeOpsKernel, AntialiasAgainstTheDenseFilter) {
  struct Case {
    AntialiasSpec spec;
    const char* label;
  };
  const Case cases[] = {
      {{.x = {1, 1, 4, 4}, .scales = {0.6f, 0.6f}},
       "linear, scales (test_resize_downsample_scales_linear_antialias)"},
      {{.x = {1, 1, 4, 4}, .cubic = true, .scales = {0.6f, 0.6f}},
       "cubic, scales (test_resize_downsample_scales_cubic_antialias)"},
      {{.x = {1, 1, 4, 4}, .sizes = {3, 3}}, "linear, sizes (test_resize_downsample_sizes_*)"},
      {{.x = {2, 3, 9, 13}, .scales = {0.5f, 0.3f}}, "linear, wide filters, several planes"},
      {{.x = {1, 2, 7, 11}, .cubic = true, .sizes = {2, 4}}, "cubic, sizes shrink by 3"},
      {{.x = {1, 2, 6, 5},
        .cubic = true,
        .scales = {0.45f, 1.5f},
        .exclude_outside = true,
        .cubic_a = -0.5f},
       "cubic, exclude_outside, one axis up and one down"},
      {{.x = {1, 1, 8, 6}, .scales = {1.0f, 0.5f}}, "linear, only the width shrinks"},
      {{.x = {1, 2, 10, 10}, .scales = {0.4f, 0.7f}, .dtype = DType::kFloat16}, "float16"},
      {{.x = {1, 1, 9, 7}, .cubic = true, .sizes = {4, 3}, .dtype = DType::kFloat64}, "float64"},
  };
  for (const Case& c : cases) check_antialias(c.spec, c.label);
}

TEST(ResizeOpsKernel, AntialiasNearestAndCubicUpsamplingArePlain) {
  // Nearest ignores antialias; cubic upsampling is the plain cubic resize.
  Tensor x = make_f32({1, 1, 3, 4}, {1, 5, 2, 7, 3, 3, 0, 1, 9, 4, 6, 2});
  for (const char* mode : {"nearest", "cubic"}) {
    std::vector<float> sc = std::string(mode) == "nearest" ? std::vector<float>{1, 1, 0.5f, 0.5f}
                                                           : std::vector<float>{1, 1, 2, 1.5f};
    auto plain = run_case(resize(18).s("mode", mode), {x, kNoInput, scales(sc)});
    auto aa = run_case({.node = resize(18).s("mode", mode).i("antialias", 1),
                        .inputs = {x, kNoInput, scales(sc)},
                        .expect_support = true,
                        .label = mode});
    ASSERT_TRUE(plain.ok() && aa.ok()) << mode;
    EXPECT_TRUE(all_close((*aa)[0], (*plain)[0], 1e-6, 1e-6)) << mode;
  }
}

TEST(ResizeOpsKernel, AxesAttributeResizesOnlyListedAxes) {
  auto out = run_case(resize(18).s("mode", "linear").ints("axes", {1}),
                      {make_f32({2, 2}, {1, 2, 3, 4}), kNoInput, scales({2})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({2, 4}, {1, 1.25f, 1.75f, 2, 3, 3.25f, 3.75f, 4})));
}

// DepthToSpace by its definition: reshape to 6-D, transpose, reshape back.
std::vector<float> naive_depth_to_space(const std::vector<float>& x, int64_t n, int64_t c,
                                        int64_t h, int64_t w, int64_t b, bool crd) {
  int64_t cc = c / (b * b);
  std::vector<float> y(x.size());
  // DCR views x as [n, b1, b2, cc, h, w] and CRD as [n, cc, b1, b2, h, w]; both produce
  // [n, cc, h, b1, w, b2].
  for (int64_t i0 = 0; i0 < n; ++i0) {
    for (int64_t b1 = 0; b1 < b; ++b1) {
      for (int64_t b2 = 0; b2 < b; ++b2) {
        for (int64_t k = 0; k < cc; ++k) {
          for (int64_t yy = 0; yy < h; ++yy) {
            for (int64_t xx = 0; xx < w; ++xx) {
              int64_t src = crd ? ((((i0 * cc + k) * b + b1) * b + b2) * h + yy) * w + xx
                                : ((((i0 * b + b1) * b + b2) * cc + k) * h + yy) * w + xx;
              int64_t dst = ((((i0 * cc + k) * h + yy) * b + b1) * w + xx) * b + b2;
              y[dst] = x[src];
            }
          }
        }
      }
    }
  }
  return y;
}

TEST(ResizeOpsKernel, DepthToSpaceDcrVsCrdAndSpaceToDepth) {
  std::vector<float> x = iota_values(1 * 8 * 2 * 3, 0.0f);
  auto out = run_case(op("DepthToSpace", 13).i("blocksize", 2), {make_f32({1, 8, 2, 3}, x)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(
      all_close((*out)[0], make_f32({1, 2, 4, 6}, naive_depth_to_space(x, 1, 8, 2, 3, 2, false))));
  // Hand-checked: output (0, 0, 0, 1) comes from channel 2 (DCR: j=1 -> (0*2+1)*2 + 0).
  EXPECT_EQ((*out)[0].data_as<float>()[1], 12.0f);
  auto out_crd = run_case(op("DepthToSpace", 13).i("blocksize", 2).s("mode", "CRD"),
                          {make_f32({1, 8, 2, 3}, x)});
  ASSERT_TRUE(out_crd.ok());
  EXPECT_TRUE(all_close((*out_crd)[0],
                        make_f32({1, 2, 4, 6}, naive_depth_to_space(x, 1, 8, 2, 3, 2, true))));
  EXPECT_EQ((*out_crd)[0].data_as<float>()[1], 6.0f);  // CRD: channel 0*4 + 0*2 + 1 = 1
  // SpaceToDepth inverts DCR.
  auto back = run_case(op("SpaceToDepth", 13).i("blocksize", 2), {(*out)[0]});
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_TRUE(all_close((*back)[0], make_f32({1, 8, 2, 3}, x)));
}

// SpaceToDepth as onnx's reference defines it (opset 28): x viewed as [n, c, h/b, b1, w/b, b2] and
// transposed to [n, b1, b2, c, h/b, w/b] (DCR) or [n, c, b1, b2, h/b, w/b] (CRD).
std::vector<float> naive_space_to_depth(const std::vector<float>& x, int64_t n, int64_t c,
                                        int64_t h, int64_t w, int64_t b, bool crd) {
  const int64_t hb = h / b, wb = w / b;
  std::vector<float> y(x.size());
  for (int64_t i0 = 0; i0 < n; ++i0) {
    for (int64_t k = 0; k < c; ++k) {
      for (int64_t yy = 0; yy < hb; ++yy) {
        for (int64_t b1 = 0; b1 < b; ++b1) {
          for (int64_t xx = 0; xx < wb; ++xx) {
            for (int64_t b2 = 0; b2 < b; ++b2) {
              int64_t src = ((((i0 * c + k) * hb + yy) * b + b1) * wb + xx) * b + b2;
              int64_t ch = crd ? (k * b + b1) * b + b2 : (b1 * b + b2) * c + k;
              y[size_t(((i0 * c * b * b + ch) * hb + yy) * wb + xx)] = x[size_t(src)];
            }
          }
        }
      }
    }
  }
  return y;
}

TEST(ResizeOpsInfer, SpaceToDepthModeFromOpset28) {
  const NodeInput x = f32({kN, 3, kH * 2, kW * 2});
  auto r = infer_node(op("SpaceToDepth", 13).i("blocksize", 2).s("mode", "CRD"), {x});
  EXPECT_EQ(r.code(), StatusCode::kInvalidModel);  // no mode before opset 28
  EXPECT_NE(r.status.message().find("opset 28"), std::string::npos) << r.status.message();
  r = infer_node(op("SpaceToDepth", 28).i("blocksize", 2).s("mode", "CRD"), {x});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[n, 12, h, w]");
  EXPECT_EQ(infer_node(op("SpaceToDepth", 28).i("blocksize", 2).s("mode", "RCD"), {x}).code(),
            StatusCode::kInvalidModel);
}

TEST(ResizeOpsKernel, SpaceToDepthCrdInvertsDepthToSpaceCrd) {
  std::vector<float> x = iota_values(1 * 2 * 4 * 6, 0.0f);
  for (bool crd : {false, true}) {
    OpNode s2d = op("SpaceToDepth", 28).i("blocksize", 2);
    if (crd) s2d.s("mode", "CRD");
    auto deep = run_case(s2d, {make_f32({1, 2, 4, 6}, x)});
    ASSERT_TRUE(deep.ok()) << deep.status().to_string();
    EXPECT_TRUE(
        all_close((*deep)[0], make_f32({1, 8, 2, 3}, naive_space_to_depth(x, 1, 2, 4, 6, 2, crd))))
        << crd;
    // Hand-checked: channel 1 at (0, 0) is x[0, 1, 0, 0] = 24 in DCR (depth first) and
    // x[0, 0, 0, 1] = 1 in CRD (column first).
    EXPECT_EQ((*deep)[0].data_as<float>()[6], crd ? 1.0f : 24.0f);
    OpNode d2s = op("DepthToSpace", 28).i("blocksize", 2);
    if (crd) d2s.s("mode", "CRD");
    auto back = run_case(d2s, {(*deep)[0]});
    ASSERT_TRUE(back.ok());
    EXPECT_TRUE(all_close((*back)[0], make_f32({1, 2, 4, 6}, x))) << crd;
  }
}

TEST(ResizeOpsKernel, EmptyOutputIsFine) {
  auto out = run_case(resize(13), {make_f32({0, 2}, {}), kNoInput, scales({1, 2})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].shape(), (Shape{0, 4}));
}

}  // namespace
}  // namespace kiln
