// kiln::Pool, the channels-last 2-D MaxPool and AveragePool that assign_layout emits: shape
// inference (symbolic, errors) and kernel cases on every backend against a naive NHWC loop, with
// channel counts that take the CUDA kernel's 16-byte vector path (C % 8 == 0 for float16 and
// bfloat16, C % 4 == 0 for float32) and its scalar path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "op_harness.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::f32;
using testing::infer_node;
using testing::make_f32;
using testing::op;
using testing::OpNode;
using testing::run_case;

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 7;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = float(s >> 8) / float(1 << 23) - 1.f;
  }
  return v;
}

OpNode pool(const char* mode) { return op("Pool", 1, "kiln").named("pool0").s("mode", mode); }

TEST(PoolNhwcInfer, ChannelsLastShapeOfTheOnnxPool) {
  const Dim b = Dim::symbol("b"), h = Dim::symbol("h");
  // H: (4h + 1 + 1 - 3) / 2 + 1 = 2h, W: (9 - 2) / 2 + 1 = 4; C stays last.
  auto r = infer_node(pool("max")
                          .s("layout", "NHWC")
                          .ints("kernel_shape", {3, 2})
                          .ints("strides", {2, 2})
                          .ints("pads", {1, 0, 1, 0}),
                      {f32({b, h * 4, 9, 6})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 2*h, 4, 6]");
  // ceil_mode and count_include_pad as in AveragePool: (7 + 2 - 3) / 2 rounded up + 1 = 4.
  r = infer_node(pool("average")
                     .ints("kernel_shape", {3, 3})
                     .ints("strides", {2, 2})
                     .ints("pads", {1, 1, 1, 1})
                     .i("ceil_mode", 1)
                     .i("count_include_pad", 1),
                 {testing::typed(DType::kFloat16, {2, 7, 7, 3})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[2, 4, 4, 3]");
  EXPECT_EQ(r.dtype(), DType::kFloat16);
}

TEST(PoolNhwcInfer, RefusesWhatIsNoNhwcMaxOrAveragePool) {
  auto message = [](const OpNode& n, std::vector<Dim> shape) {
    Status s = infer_node(n, {f32(std::move(shape))}).status;
    EXPECT_EQ(s.code(), StatusCode::kInvalidModel) << s.to_string();
    return s.message();
  };
  auto has = [](const std::string& m, const char* what) {
    return m.find(what) != std::string::npos;
  };
  std::string m = message(pool("lp").ints("kernel_shape", {2, 2}), {1, 4, 4, 3});
  EXPECT_TRUE(has(m, "mode 'lp' is not one of max, average")) << m;
  m = message(pool("max").s("layout", "NCHW").ints("kernel_shape", {2, 2}), {1, 4, 4, 3});
  EXPECT_TRUE(has(m, "layout 'NCHW' is not NHWC")) << m;
  m = message(pool("max").ints("kernel_shape", {2}), {1, 4, 3});
  EXPECT_TRUE(has(m, "must have rank 4, got 3")) << m;
  m = message(pool("max").ints("kernel_shape", {2, 2}).i("storage_order", 0), {1, 4, 4, 3});
  EXPECT_TRUE(has(m, "unknown attribute 'storage_order'")) << m;
  m = message(pool("max").ints("kernel_shape", {2, 2}).i("count_include_pad", 1), {1, 4, 4, 3});
  EXPECT_TRUE(has(m, "count_include_pad is for mode average")) << m;
  // The ONNX pool's own checks, its dims numbered as in NCHW.
  m = message(pool("average").ints("kernel_shape", {2, 2, 2}), {1, 4, 4, 3});
  EXPECT_TRUE(has(m, "(layout NHWC; dims numbered as in NCHW)")) << m;
}

struct Spec {
  std::vector<int64_t> k, stride, dil, pads;  // pads: h_begin, w_begin, h_end, w_end
  bool ceil_mode = false, include_pad = false;
  const char* label;
};

int64_t out_dim(const Spec& s, int i, int64_t in) {
  const int64_t num = in + s.pads[i] + s.pads[2 + i] - s.dil[i] * (s.k[i] - 1) - 1;
  int64_t o = (s.ceil_mode ? (num + s.stride[i] - 1) / s.stride[i] : num / s.stride[i]) + 1;
  if (s.ceil_mode && (o - 1) * s.stride[i] >= in + s.pads[i]) --o;  // starts in the end padding
  return o;
}

// The pool of X [n, h, w, c] by direct loops over the window: ONNX's meaning, written for NHWC.
Tensor naive_nhwc_pool(const Spec& s, const Tensor& x, bool is_max) {
  const Shape& in = x.shape();
  const int64_t oh = out_dim(s, 0, in[1]), ow = out_dim(s, 1, in[2]), c = in[3];
  std::vector<float> y;
  const float* xp = x.data_as<float>();
  for (int64_t b = 0; b < in[0]; ++b) {
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        for (int64_t ch = 0; ch < c; ++ch) {
          float best = -std::numeric_limits<float>::infinity();
          double sum = 0;
          int64_t count = 0, padded = 0;
          for (int64_t u = 0; u < s.k[0]; ++u) {
            for (int64_t v = 0; v < s.k[1]; ++v) {
              const int64_t hh = i * s.stride[0] - s.pads[0] + u * s.dil[0];
              const int64_t ww = j * s.stride[1] - s.pads[1] + v * s.dil[1];
              if (hh < in[1] + s.pads[2] && ww < in[2] + s.pads[3]) ++padded;
              if (hh < 0 || hh >= in[1] || ww < 0 || ww >= in[2]) continue;
              const float e = xp[((b * in[1] + hh) * in[2] + ww) * c + ch];
              best = std::max(best, e);
              sum += e;
              ++count;
            }
          }
          y.push_back(is_max ? best : float(sum / double(s.include_pad ? padded : count)));
        }
      }
    }
  }
  return make_f32({in[0], oh, ow, c}, y);
}

// Every spec with channel counts on both CUDA paths, in float32 (strict) and as float16 and
// bfloat16 tensors.
TEST(PoolNhwcKernel, AgainstNaiveLoopsOnEveryPath) {
  const Spec specs[] = {
      {{3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, false, false, "3x3 s2 pad 1 (ResNet stem)"},
      {{2, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}, false, false, "2x2 s2"},
      {{3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, true, true, "ceil include pad"},
      {{3, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}, true, false, "ceil"},
      {{2, 2}, {3, 3}, {1, 1}, {0, 0, 1, 1}, true, false, "ceil drops the last window"},
      {{3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, false, true, "3x3 s1 include pad"},
      {{2, 3}, {1, 2}, {2, 2}, {1, 0, 2, 1}, false, true, "dilated asymmetric pads"},
  };
  // 8 and 16 take the vector path in every dtype, 12 only in float32, 3 and 6 none.
  for (int64_t c : {8, 3, 16, 12, 6}) {
    const Shape xs = {2, 9, 11, c};
    const Tensor x = make_f32(xs, random_values(size_t(shape_numel(xs)), uint32_t(c)));
    for (const Spec& s : specs) {
      for (bool is_max : {true, false}) {
        if (is_max && s.include_pad) continue;
        OpNode node = pool(is_max ? "max" : "average")
                          .s("layout", "NHWC")
                          .ints("kernel_shape", s.k)
                          .ints("strides", s.stride)
                          .ints("dilations", s.dil)
                          .ints("pads", s.pads)
                          .i("ceil_mode", s.ceil_mode);
        if (!is_max) node.i("count_include_pad", s.include_pad);
        const std::string label =
            std::string(s.label) + (is_max ? " max" : " average") + " C=" + std::to_string(c);
        auto r = run_case({.node = node,
                           .inputs = {x},
                           .expected = {naive_nhwc_pool(s, x, is_max)},
                           .expect_support = true,
                           .label = label});
        ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
        for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
          auto h = testing::run_reduced_case(
              {.node = node, .inputs = {x}, .expect_support = true, .label = label}, dt);
          ASSERT_TRUE(h.ok()) << label << " " << dtype_name(dt) << ": " << h.status().to_string();
          EXPECT_EQ((*h)[0].dtype(), dt) << label;
        }
      }
    }
  }
}

// The ResNet-50 stem's pool at a small batch: many blocks of the CUDA kernel, 64 channels; and
// auto_pad, which the kernel resolves from the shapes as the ONNX pools do.
TEST(PoolNhwcKernel, StemSizedAndAutoPad) {
  const Shape xs = {2, 56, 56, 64};
  const Tensor x = make_f32(xs, random_values(size_t(shape_numel(xs)), 5));
  OpNode stem =
      pool("max").ints("kernel_shape", {3, 3}).ints("strides", {2, 2}).ints("pads", {1, 1, 1, 1});
  const Spec s{{3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, false, false, "stem"};
  auto r = run_case({.node = stem,
                     .inputs = {x},
                     .expected = {naive_nhwc_pool(s, x, true)},
                     .expect_support = true,
                     .label = "stem"});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto h = testing::run_reduced_case(
      {.node = stem, .inputs = {x}, .expect_support = true, .label = "stem"}, DType::kFloat16);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  // SAME_UPPER on 9 x 10, stride 2: out 5 x 5, total pads 2 (1 each side) and 1 (at the end).
  const Shape ys = {2, 9, 10, 8};
  const Tensor y = make_f32(ys, random_values(size_t(shape_numel(ys)), 6));
  const Spec same{{3, 3}, {2, 2}, {1, 1}, {1, 0, 1, 1}, false, false, "same_upper"};
  for (bool is_max : {true, false}) {
    OpNode node = pool(is_max ? "max" : "average")
                      .ints("kernel_shape", {3, 3})
                      .ints("strides", {2, 2})
                      .s("auto_pad", "SAME_UPPER");
    auto a = run_case({.node = node,
                       .inputs = {y},
                       .expected = {naive_nhwc_pool(same, y, is_max)},
                       .expect_support = true,
                       .label = "same_upper"});
    ASSERT_TRUE(a.ok()) << a.status().to_string();
  }
}

// Max's rules, which the CUDA kernel keeps per channel of a vector: a NaN first in the window
// stays, a later one is passed over (the CPU scan's `v > best`), and -inf is a value like others.
TEST(PoolNhwcKernel, MaxKeepsTheReferenceNanRule) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // X [1, 1, 2, 8]: a 1x2 window over the two pixels; channel j of pixel 0 and pixel 1.
  std::vector<float> v = {nan, 1,   -inf, 2, 0.5f,  -1, 3,   -inf,  //
                          5,   nan, -inf, 1, 0.25f, -2, nan, -inf};
  const Tensor x = make_f32({1, 1, 2, 8}, v);
  const Tensor want = make_f32({1, 1, 1, 8}, {nan, 1, -inf, 2, 0.5f, -1, 3, -inf});
  auto r = run_case({.node = pool("max").ints("kernel_shape", {1, 2}),
                     .inputs = {x},
                     .expected = {want},
                     .expect_support = true,
                     .label = "nan"});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
}

}  // namespace
}  // namespace kiln
