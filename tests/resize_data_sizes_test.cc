// Output sizes read from tensors computed at run time: torchvision's detection transform resizes
// an image by a scale computed in float32 from its shape, then pads it to a multiple of 32, also in
// float. The Resize's output dims become data-dependent dims bounded by a value-range analysis of
// the sizes (ops/value_range.h); the padding of a symbolic size to a multiple of 32 is exact float
// math, so the Pad's dims stay formulas (ceil_div); sizes with no finite bound are refused with the
// reason. The numbers are checked against float32 arithmetic done here and against the same Resize
// with constant sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ir/text.h"
#include "kiln.h"
#include "plan/plan.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

// sizes = floor(float(h|w) * min(320 * (1 / float(min(h, w))), 640 * (1 / float(max(h, w))))), as
// GeneralizedRCNNTransform exports; the resized image is padded to multiples of 32 computed as
// int64(ceil(float(dim) / 32) * 32) - dim.
const char* kModel = R"(graph g(%x: float32[1, 3, h, w]) -> (%y: float32[?], %p: float32[?]) {
  %c0: int64[1] = dense<[0]>
  %c2: int64[1] = dense<[2]>
  %c4: int64[1] = dense<[4]>
  %i2: int64[] = dense<2>
  %i3: int64[] = dense<3>
  %nc: int64[2] = dense<[1, 3]>
  %f320: float32[] = dense<320.0>
  %f640: float32[] = dense<640.0>
  %f32: float32[] = dense<32.0>
  %zeros: int64[6] = dense<[0, 0, 0, 0, 0, 0]>
  %s: int64[4] = Shape(%x)
  %hw: int64[2] = Slice(%s, %c2, %c4, %c0)
  %mn: int64[] = ReduceMin(%hw) {keepdims=0}
  %mx: int64[] = ReduceMax(%hw) {keepdims=0}
  %mnf: float32[] = Cast(%mn) {to=1}
  %mxf: float32[] = Cast(%mx) {to=1}
  %rmn: float32[] = Reciprocal(%mnf)
  %a: float32[] = Mul(%rmn, %f320)
  %rmx: float32[] = Reciprocal(%mxf)
  %b: float32[] = Mul(%rmx, %f640)
  %scale: float32[] = Min(%a, %b)
  %h: int64[] = Gather(%s, %i2) {axis=0}
  %w: int64[] = Gather(%s, %i3) {axis=0}
  %hf: float32[] = Cast(%h) {to=1}
  %wf: float32[] = Cast(%w) {to=1}
  %hs: float32[] = Mul(%hf, %scale)
  %ws: float32[] = Mul(%wf, %scale)
  %hfl: float32[] = Floor(%hs)
  %wfl: float32[] = Floor(%ws)
  %hu: float32[1] = Unsqueeze(%hfl, %c0)
  %wu: float32[1] = Unsqueeze(%wfl, %c0)
  %hwf: float32[2] = Concat(%hu, %wu) {axis=0}
  %hwi: int64[2] = Cast(%hwf) {to=7}
  %sizes: int64[4] = Concat(%nc, %hwi) {axis=0}
  %y: float32[?] = Resize(%x, _, _, %sizes) {mode="linear", coordinate_transformation_mode="half_pixel"}  # resize
  %ys: int64[4] = Shape(%y)
  %yh: int64[] = Gather(%ys, %i2) {axis=0}
  %yw: int64[] = Gather(%ys, %i3) {axis=0}
  %yhf: float32[] = Cast(%yh) {to=1}
  %ywf: float32[] = Cast(%yw) {to=1}
  %dh: float32[] = Div(%yhf, %f32)
  %dw: float32[] = Div(%ywf, %f32)
  %ch: float32[] = Ceil(%dh)
  %cw: float32[] = Ceil(%dw)
  %mh: float32[] = Mul(%ch, %f32)
  %mw: float32[] = Mul(%cw, %f32)
  %th: int64[] = Cast(%mh) {to=7}
  %tw: int64[] = Cast(%mw) {to=7}
  %ph: int64[] = Sub(%th, %yh)
  %pw: int64[] = Sub(%tw, %yw)
  %phu: int64[1] = Unsqueeze(%ph, %c0)
  %pwu: int64[1] = Unsqueeze(%pw, %c0)
  %pads: int64[8] = Concat(%zeros, %phu, %pwu) {axis=0}
  %p: float32[?] = Pad(%y, %pads) {mode="constant"}  # pad
}
)";

StatusOr<Engine> build(const char* text, Shape min, Shape opt, Shape max) {
  Network net;
  KILN_ASSIGN_OR_RETURN(net.graph, ir::parse_text(text, {}));
  BuilderConfig config;
  OptimizationProfile p;
  KILN_RETURN_IF_ERROR(p.set_dimensions("x", min, opt, max));
  config.add_profile(p);
  return Builder(Device::kCPU).build(net, config);
}

// The sizes as ONNX Runtime computes them: every step in float32.
std::pair<int64_t, int64_t> float32_sizes(int64_t h, int64_t w) {
  volatile float mn = float(std::min(h, w)), mx = float(std::max(h, w));
  volatile float a = (1.0f / mn) * 320.0f, b = (1.0f / mx) * 640.0f;
  volatile float scale = std::min(a, b);
  volatile float hs = float(h) * scale, ws = float(w) * scale;
  return {int64_t(std::floor(hs)), int64_t(std::floor(ws))};
}

Tensor image(int64_t h, int64_t w) {
  std::vector<float> v(size_t(3 * h * w));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float((i * 37) % 101) / 7.0f - 3.0f;
  return make_f32({1, 3, h, w}, v);
}

// The same Resize with its sizes constant.
Tensor resized_by_constant_sizes(const Tensor& x, int64_t oh, int64_t ow) {
  const std::string text = "graph g(%x: float32[1, 3, " + std::to_string(x.shape()[2]) + ", " +
                           std::to_string(x.shape()[3]) + "]) -> (%y: float32[?]) {\n" +
                           "  %sizes: int64[4] = dense<[1, 3, " + std::to_string(oh) + ", " +
                           std::to_string(ow) + "]>\n" +
                           "  %y: float32[?] = Resize(%x, _, _, %sizes) {mode=\"linear\", "
                           "coordinate_transformation_mode=\"half_pixel\"}\n}\n";
  auto engine = build(text.c_str(), x.shape(), x.shape(), x.shape());
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  if (!engine.ok()) return Tensor();
  auto ctx = engine->create_execution_context();
  auto out = (*ctx)->run({{"x", x}});
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? out->at("y") : Tensor();
}

TEST(ResizeDataSizes, FloatScaledSizesAreDataDependentAndThePadStaysAFormula) {
  auto engine = build(kModel, {1, 3, 240, 240}, {1, 3, 320, 320}, {1, 3, 640, 640});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  // The resized dims are data-dependent with a finite bound; the padded ones are formulas of them.
  const auto& dd = engine->plan().data_dependent;
  ASSERT_EQ(dd.size(), 2u);
  for (const auto& d : dd) {
    ASSERT_TRUE(d.bound.is_const()) << d.bound.to_string();
    // floor(640 * 320/240), the interval bound (the true largest size is 640).
    EXPECT_GE(d.bound.value(), 640);
    EXPECT_LE(d.bound.value(), 854);
    // And the least size the analysis proves: floor(240 * min(320/640, 640/640)) = 120, widened by
    // float rounding. The profile proof starts the dim there (a stride-2 conv on it needs >= 1).
    ASSERT_TRUE(d.lower.is_const()) << d.lower.to_string();
    EXPECT_GE(d.lower.value(), 100);
    EXPECT_LE(d.lower.value(), 120);
    for (const auto& prof : engine->plan().profiles)
      EXPECT_EQ(prof.symbols.at(d.symbol).lo, d.lower.value());
  }
  const std::string y = ir::dims_to_string(*engine->tensor_symbolic_shape("y"));
  EXPECT_EQ(y, "[1, 3, " + dd[0].symbol + ", " + dd[1].symbol + "]");
  const auto p = *engine->tensor_symbolic_shape("p");
  ASSERT_EQ(p.size(), 4u);
  for (int k : {2, 3}) {
    // 32 * ceil(r / 32), not a data-dependent dim of its own.
    EXPECT_FALSE(p[size_t(k)].is_symbol()) << p[size_t(k)].to_string();
    ir::SymbolValues at{{dd[0].symbol, 300}, {dd[1].symbol, 417}};
    EXPECT_EQ(p[size_t(k)].eval(at), k == 2 ? 320 : 448) << p[size_t(k)].to_string();
  }
  for (const LayerInfo& l : engine->layers())
    EXPECT_EQ(l.data_dependent, l.name == "resize") << l.name;

  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  for (auto [h, w] :
       {std::pair<int64_t, int64_t>{240, 400}, {480, 320}, {320, 320}, {241, 639}, {640, 240}}) {
    const std::string where = std::to_string(h) + "x" + std::to_string(w);
    const Tensor x = image(h, w);
    auto out = (*ctx)->run({{"x", x}});
    ASSERT_TRUE(out.ok()) << where << ": " << out.status().to_string();
    const auto [oh, ow] = float32_sizes(h, w);
    ASSERT_EQ(out->at("y").shape(), (Shape{1, 3, oh, ow})) << where;
    const int64_t ph = (oh + 31) / 32 * 32, pw = (ow + 31) / 32 * 32;
    ASSERT_EQ(out->at("p").shape(), (Shape{1, 3, ph, pw})) << where;
    const Tensor want = resized_by_constant_sizes(x, oh, ow);
    EXPECT_TRUE(all_close(out->at("y"), want, 0, 0)) << where;
    // The pad keeps the image at the top left and fills the rest with 0.
    const float* py = out->at("p").data_as<float>();
    const float* wy = want.data_as<float>();
    bool same = true;
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t i = 0; i < ph; ++i) {
        for (int64_t j = 0; j < pw; ++j) {
          const float got = py[(c * ph + i) * pw + j];
          const float expect = i < oh && j < ow ? wy[(c * oh + i) * ow + j] : 0.f;
          same = same && got == expect;
        }
      }
    }
    EXPECT_TRUE(same) << where;
  }
}

// The engine file keeps the bound and the exact float formulas.
TEST(ResizeDataSizes, TheEngineFileKeepsThem) {
  auto engine = build(kModel, {1, 3, 240, 240}, {1, 3, 320, 320}, {1, 3, 640, 640});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<uint8_t> bytes = engine->serialize();
  auto loaded = Engine::deserialize(bytes);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  auto ctx = loaded->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  auto out = (*ctx)->run({{"x", image(300, 500)}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const auto [oh, ow] = float32_sizes(300, 500);
  EXPECT_EQ(out->at("p").shape(), (Shape{1, 3, (oh + 31) / 32 * 32, (ow + 31) / 32 * 32}));
}

// Sizes from data whose range has no finite bound (a division by a value that may be 0) are
// refused with the reason; so is a Pad whose pads come from the image's values.
TEST(ResizeDataSizes, SizesWithoutAFiniteBoundAreRefused) {
  const char* unbounded = R"(graph g(%x: float32[1, 1, h, w]) -> (%y: float32[?]) {
  %c0: int64[1] = dense<[0]>
  %i2: int64[] = dense<2>
  %one: int64[1] = dense<[1]>
  %f100: float32[] = dense<100.0>
  %s: int64[4] = Shape(%x)
  %h: int64[] = Gather(%s, %i2) {axis=0}
  %hm: int64[] = Sub(%h, %i2)
  %hf: float32[] = Cast(%hm) {to=1}
  %q: float32[] = Div(%f100, %hf)
  %qi: int64[] = Cast(%q) {to=7}
  %qu: int64[1] = Unsqueeze(%qi, %c0)
  %sizes: int64[4] = Concat(%one, %one, %qu, %qu) {axis=0}
  %y: float32[?] = Resize(%x, _, _, %sizes) {mode="nearest"}  # up
}
)";
  auto engine = build(unbounded, {1, 1, 1, 4}, {1, 1, 4, 4}, {1, 1, 8, 4});
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(engine.status().message().find(
                "sizes element 2 ('sizes') is computed from tensor data at run time and "
                "has no upper bound"),
            std::string::npos)
      << engine.status().to_string();
  // h >= 3 keeps the divisor positive: 100 / (h - 2) <= 100 bounds it.
  auto bounded = build(unbounded, {1, 1, 3, 4}, {1, 1, 4, 4}, {1, 1, 8, 4});
  ASSERT_TRUE(bounded.ok()) << bounded.status().to_string();
  auto ctx = bounded->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  auto out = (*ctx)->run({{"x", make_f32({1, 1, 6, 4}, std::vector<float>(24, 1.f))}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->at("y").shape(), (Shape{1, 1, 25, 25}));

  const char* data_pads = R"(graph g(%x: float32[1, 4], %n: float32[2]) -> (%y: float32[?]) {
  %ni: int64[2] = Cast(%n) {to=7}
  %zeros: int64[2] = dense<[0, 0]>
  %pads: int64[4] = Concat(%zeros, %ni) {axis=0}
  %y: float32[?] = Pad(%x, %pads) {mode="constant"}  # pad
}
)";
  auto pad = build(data_pads, {1, 4}, {1, 4}, {1, 4});
  ASSERT_FALSE(pad.ok());
  EXPECT_NE(pad.status().message().find(
                "is computed from tensor data at run time and has no upper bound"),
            std::string::npos)
      << pad.status().to_string();
}

// Pads and scales computed from an input's values, capped by Min and Max with constants, bound
// their dims; each run pads and scales by what it gives.
TEST(ResizeDataSizes, PadsAndScalesFromBoundedData) {
  const char* pads_model =
      R"(graph g(%x: float32[1, n], %v: float32[2]) -> (%y: float32[?], %z: float32[?]) {
  %f3: float32[] = dense<3.0>
  %f0: float32[] = dense<0.0>
  %f1: float32[1] = dense<[1.0]>
  %c0: int64[1] = dense<[0]>
  %c1: int64[1] = dense<[1]>
  %capped: float32[2] = Min(%v, %f3)
  %nonneg: float32[2] = Max(%capped, %f0)
  %vi: int64[2] = Cast(%nonneg) {to=7}
  %zeros: int64[2] = dense<[0, 0]>
  %pads: int64[4] = Concat(%zeros, %vi) {axis=0}
  %y: float32[?] = Pad(%x, %pads) {mode="edge"}  # pad
  %s1: float32[1] = Slice(%nonneg, %c0, %c1, %c0)
  %s2: float32[1] = Add(%s1, %f1)
  %scales: float32[2] = Concat(%f1, %s2) {axis=0}
  %z: float32[?] = Resize(%x, _, %scales) {mode="nearest"}  # scaled
}
)";
  Network net;
  auto g = ir::parse_text(pads_model, {});
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  net.graph = std::move(*g);
  BuilderConfig config;
  OptimizationProfile p;
  ASSERT_TRUE(p.set_dimensions("x", {1, 2}, {1, 4}, {1, 8}).ok());
  config.add_profile(p);
  auto engine = Builder(Device::kCPU).build(net, config);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  // Pad: dim 0 at most 1 + 3, dim 1 at most n + 3; Resize: dim 1 at most about 4 * n.
  const auto& dd = engine->plan().data_dependent;
  ASSERT_EQ(dd.size(), 3u);
  EXPECT_EQ(dd[0].bound.to_string(), "4");
  EXPECT_EQ(dd[1].bound.to_string(), "n + 3");
  EXPECT_EQ(dd[2].bound.eval({{"n", 8}}), 32) << dd[2].bound.to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  const Tensor x = make_f32({1, 3}, {1.f, 2.f, 3.f});
  auto out = (*ctx)->run({{"x", x}, {"v", make_f32({2}, {7.f, 2.f})}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  // pads [0, 0, 3, 2]: dim 0's end by 3 and dim 1's by 2, repeating the edge.
  EXPECT_TRUE(all_close(
      out->at("y"), make_f32({4, 5}, {1, 2, 3, 3, 3, 1, 2, 3, 3, 3, 1, 2, 3, 3, 3, 1, 2, 3, 3, 3}),
      0, 0));
  // scales [1, 4]: each element four times.
  EXPECT_TRUE(
      all_close(out->at("z"), make_f32({1, 12}, {1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}), 0, 0));
  out = (*ctx)->run({{"x", x}, {"v", make_f32({2}, {0.f, 1.f})}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close(out->at("y"), make_f32({1, 4}, {1, 2, 3, 3}), 0, 0));
  EXPECT_TRUE(all_close(out->at("z"), make_f32({1, 3}, {1, 2, 3}), 0, 0));
}

}  // namespace
}  // namespace kiln::testing
