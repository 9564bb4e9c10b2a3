// Kernel cases for the ops with a CUDA implementation whose family test files do not run them
// through the op harness yet (elementwise, reduce, resize, shape): each checks the CPU reference
// against values computed here and runs every backend present against the reference, and a device
// present that refuses one fails (expect_support). op_coverage_test.cc counts on these.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numbers>
#include <vector>

#include "op_harness.h"

namespace kiln {
namespace {

using testing::initializer;
using testing::KernelCase;
using testing::make_f32;
using testing::make_i64;
using testing::op;
using testing::OpNode;
using testing::shape_of;

// Runs a case that every device present must support; the reference must match `expected`.
void expect_case(OpNode node, std::vector<testing::CaseInput> inputs,
                 std::vector<Tensor> expected) {
  KernelCase c{.node = std::move(node),
               .inputs = std::move(inputs),
               .expected = std::move(expected),
               .expect_support = true};
  auto r = testing::run_case(c);
  EXPECT_TRUE(r.ok()) << c.node.node.describe() << ": " << r.status().to_string();
}

// 24 values in (-2.7, 2.7), none zero, none a rounding tie.
std::vector<float> signed_values() {
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[i] = float((i - 11.5) * 0.23);
  return v;
}

Tensor map_f32(const Shape& shape, const std::vector<float>& x,
               const std::function<double(double)>& f) {
  std::vector<float> y;
  for (float v : x) y.push_back(float(f(v)));
  return make_f32(shape, y);
}

Tensor bools(Shape shape, std::vector<uint8_t> v) {
  return Tensor::from_vector(DType::kBool, std::move(shape), v);
}

TEST(CudaCoverage, UnaryElementwise) {
  const Shape shape = {2, 3, 4};
  const std::vector<float> x = signed_values();
  std::vector<float> pos;
  for (float v : x) pos.push_back(std::fabs(v) + 0.05f);
  struct Unary {
    OpNode node;
    bool positive;
    std::function<double(double)> f;
  };
  auto sigmoid = [](double v) { return 1 / (1 + std::exp(-v)); };
  std::vector<Unary> cases = {
      {op("Neg", 18), false, [](double v) { return -v; }},
      {op("Abs", 18), false, [](double v) { return std::fabs(v); }},
      {op("Reciprocal", 18), false, [](double v) { return 1 / v; }},
      {op("Sqrt", 18), true, [](double v) { return std::sqrt(v); }},
      {op("Exp", 18), false, [](double v) { return std::exp(v); }},
      {op("Log", 18), true, [](double v) { return std::log(v); }},
      {op("Erf", 18), false, [](double v) { return std::erf(v); }},
      {op("Relu", 18), false, [](double v) { return v > 0 ? v : 0; }},
      {op("Sigmoid", 18), false, sigmoid},
      {op("Tanh", 18), false, [](double v) { return std::tanh(v); }},
      {op("HardSigmoid", 18).f("alpha", 0.25f).f("beta", 0.4f), false,
       [](double v) { return std::clamp(0.25 * v + 0.4, 0.0, 1.0); }},
      {op("HardSwish", 18), false, [](double v) { return v * std::clamp(v / 6 + 0.5, 0.0, 1.0); }},
      {op("Sin", 18), false, [](double v) { return std::sin(v); }},
      {op("Cos", 18), false, [](double v) { return std::cos(v); }},
      {op("Floor", 18), false, [](double v) { return std::floor(v); }},
      {op("Ceil", 18), false, [](double v) { return std::ceil(v); }},
      {op("Round", 18), false, [](double v) { return std::nearbyint(v); }},
      {op("Sign", 18), false, [](double v) { return double(v > 0) - double(v < 0); }},
      {op("LeakyRelu", 18).f("alpha", 0.1f), false, [](double v) { return v < 0 ? 0.1 * v : v; }},
      {op("Elu", 18).f("alpha", 0.7f), false,
       [](double v) { return v < 0 ? 0.7 * std::expm1(v) : v; }},
      {op("Softplus", 18), false, [](double v) { return std::log1p(std::exp(v)); }},
      {op("Gelu", 20), false,
       [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }},
      {op("Gelu", 20).s("approximate", "tanh"), false,
       [](double v) {
         return 0.5 * v *
                (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
       }},
      {op("Identity", 18), false, [](double v) { return v; }},
  };
  for (const Unary& u : cases) {
    const std::vector<float>& in = u.positive ? pos : x;
    expect_case(u.node, {make_f32(shape, in)}, {map_f32(shape, in, u.f)});
  }
}

TEST(CudaCoverage, ClassifyNotCastAndClip) {
  const float inf = std::numeric_limits<float>::infinity(),
              nan = std::numeric_limits<float>::quiet_NaN();
  Tensor special = make_f32({6}, {1.5f, -inf, nan, inf, 0.f, -2.f});
  expect_case(op("IsNaN", 20), {special}, {bools({6}, {0, 0, 1, 0, 0, 0})});
  expect_case(op("IsInf", 20), {special}, {bools({6}, {0, 1, 0, 1, 0, 0})});
  expect_case(op("IsInf", 20).i("detect_negative", 0), {special}, {bools({6}, {0, 0, 0, 1, 0, 0})});
  expect_case(op("Not", 18), {bools({4}, {1, 0, 0, 1})}, {bools({4}, {0, 1, 1, 0})});

  // Cast: float32 -> int64 truncates toward zero, int64 -> float32, float32 -> float16 rounds.
  Tensor f = make_f32({2, 3}, {1.75f, -2.5f, 3.f, -0.25f, 100.5f, 7.f});
  expect_case(op("Cast", 18).i("to", 7), {f}, {make_i64({2, 3}, {1, -2, 3, 0, 100, 7})});
  expect_case(op("Cast", 18).i("to", 1), {make_i64({3}, {-4, 0, 1 << 20})},
              {make_f32({3}, {-4, 0, 1 << 20})});
  std::vector<uint16_t> h;
  for (float v : {1.75f, -2.5f, 3.f, -0.25f, 100.5f, 7.f}) h.push_back(float_to_half(v));
  expect_case(op("Cast", 18).i("to", 10), {f}, {Tensor::from_vector(DType::kFloat16, {2, 3}, h)});

  // Clip with min/max inputs (opset 13) and with one bound omitted.
  const std::vector<float> x = signed_values();
  expect_case(
      op("Clip", 13),
      {make_f32({24}, x), initializer(make_f32({}, {-1.f})), initializer(make_f32({}, {0.5f}))},
      {map_f32({24}, x, [](double v) { return std::clamp(v, -1.0, 0.5); })});
  expect_case(op("Clip", 13),
              {make_f32({24}, x), testing::kNoInput, initializer(make_f32({}, {0.5f}))},
              {map_f32({24}, x, [](double v) { return std::min(v, 0.5); })});
}

TEST(CudaCoverage, BinaryElementwiseWithBroadcast) {
  const std::vector<float> x = signed_values();
  std::vector<float> pos;
  for (float v : x) pos.push_back(std::fabs(v) + 0.1f);
  const std::vector<float> b = {0.7f, -1.3f, 2.1f};  // [3, 1]: broadcasts over [2, 3, 4]
  auto apply = [&](const std::vector<float>& a, const std::function<double(double, double)>& f) {
    std::vector<float> y(24);
    for (int i = 0; i < 24; ++i) y[i] = float(f(a[i], b[(i / 4) % 3]));
    return make_f32({2, 3, 4}, y);
  };
  struct Binary {
    const char* op;
    std::function<double(double, double)> f;
  };
  for (const Binary& c :
       std::vector<Binary>{{"Add", [](double p, double q) { return p + q; }},
                           {"Sub", [](double p, double q) { return p - q; }},
                           {"Mul", [](double p, double q) { return p * q; }},
                           {"Div", [](double p, double q) { return p / q; }},
                           {"Max", [](double p, double q) { return std::max(p, q); }},
                           {"Min", [](double p, double q) { return std::min(p, q); }}}) {
    expect_case(op(c.op, 18), {make_f32({2, 3, 4}, x), make_f32({3, 1}, b)}, {apply(x, c.f)});
  }
  // Pow of a positive base; float Mod with fmod = 1 (the C fmod: the dividend's sign).
  expect_case(op("Pow", 18), {make_f32({2, 3, 4}, pos), make_f32({3, 1}, b)},
              {apply(pos, [](double p, double q) { return std::pow(p, q); })});
  expect_case(op("Mod", 18).i("fmod", 1), {make_f32({2, 3, 4}, x), make_f32({3, 1}, b)},
              {apply(x, [](double p, double q) { return std::fmod(p, q); })});
  // Integer Mod (fmod = 0) takes the divisor's sign, as Python does.
  expect_case(op("Mod", 18),
              {make_i64({6}, {7, -7, 7, -7, 0, 9}), make_i64({6}, {3, 3, -3, -3, 5, 4})},
              {make_i64({6}, {1, 2, -2, -1, 0, 1})});

  // Comparisons, with ties, into bool.
  Tensor p = make_i64({2, 3}, {1, 5, 3, 4, 2, 6}), q = make_i64({3}, {1, 2, 6});
  expect_case(op("Equal", 18), {p, q}, {bools({2, 3}, {1, 0, 0, 0, 1, 1})});
  expect_case(op("Less", 18), {p, q}, {bools({2, 3}, {0, 0, 1, 0, 0, 0})});
  expect_case(op("LessOrEqual", 18), {p, q}, {bools({2, 3}, {1, 0, 1, 0, 1, 1})});
  expect_case(op("Greater", 18), {p, q}, {bools({2, 3}, {0, 1, 0, 1, 0, 0})});
  expect_case(op("GreaterOrEqual", 18), {p, q}, {bools({2, 3}, {1, 1, 0, 1, 1, 1})});
  Tensor fp = make_f32({4}, {0.5f, -1.f, 2.f, 3.f}), fq = make_f32({4}, {0.5f, 1.f, 1.f, 3.5f});
  expect_case(op("Less", 18), {fp, fq}, {bools({4}, {0, 1, 0, 1})});
  // Logic.
  Tensor l = bools({4}, {0, 0, 1, 1}), r = bools({4}, {0, 1, 0, 1});
  expect_case(op("And", 18), {l, r}, {bools({4}, {0, 0, 0, 1})});
  expect_case(op("Or", 18), {l, r}, {bools({4}, {0, 1, 1, 1})});
  expect_case(op("Xor", 18), {l, r}, {bools({4}, {0, 1, 1, 0})});
}

TEST(CudaCoverage, WhereAndExpand) {
  Tensor cond = bools({2, 1, 3}, {1, 0, 1, 0, 1, 0});
  Tensor x = make_f32({2, 2, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  expect_case(op("Where", 18), {cond, x, make_f32({}, {-1})},
              {make_f32({2, 2, 3}, {1, -1, 3, 4, -1, 6, -1, 8, -1, -1, 11, -1})});
  // [3, 1] -> [2, 3, 4]: each row value repeated along the last axis, twice over.
  std::vector<float> e;
  for (int n = 0; n < 2; ++n) {
    for (float v : {1.f, 2.f, 3.f}) e.insert(e.end(), 4, v);
  }
  expect_case(op("Expand", 18),
              {make_f32({3, 1}, {1, 2, 3}), initializer(make_i64({3}, {2, 1, 4}))},
              {make_f32({2, 3, 4}, e)});
  expect_case(op("Expand", 18), {make_i64({1}, {7}), initializer(make_i64({2}, {2, 2}))},
              {make_i64({2, 2}, {7, 7, 7, 7})});
}

// The views run a copy when their output is an engine output, as in a one-node engine.
TEST(CudaCoverage, ViewsCopyIntoTheEngineOutput) {
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[i] = float(i) - 7.5f;
  Tensor x = make_f32({2, 3, 4}, v);
  expect_case(op("Reshape", 18), {x, initializer(make_i64({2}, {4, -1}))}, {make_f32({4, 6}, v)});
  expect_case(op("Flatten", 18).i("axis", 2), {x}, {make_f32({6, 4}, v)});
  expect_case(op("Unsqueeze", 18), {x, initializer(make_i64({2}, {0, -1}))},
              {make_f32({1, 2, 3, 4, 1}, v)});
  expect_case(op("Squeeze", 18), {make_f32({2, 1, 12}, v), initializer(make_i64({1}, {1}))},
              {make_f32({2, 12}, v)});
  expect_case(op("Identity", 18), {make_i64({3}, {1, -2, 3})}, {make_i64({3}, {1, -2, 3})});
}

// Shape arithmetic: Range and ConstantOfShape run only when their inputs are symbolic (here, the
// dims of an engine input); Shape and Size always fold into formulas.
TEST(CudaCoverage, ShapeOpsRangeAndConstantOfShape) {
  expect_case(op("Range", 18),
              {initializer(make_i64({}, {2})), shape_of({9}), initializer(make_i64({}, {3}))},
              {make_i64({3}, {2, 5, 8})});
  expect_case(op("Range", 18),
              {initializer(make_i64({}, {10})), shape_of({4}), initializer(make_i64({}, {-2}))},
              {make_i64({3}, {10, 8, 6})});
  expect_case(op("ConstantOfShape", 18).tensor("value", make_f32({1}, {1.5f})), {shape_of({2, 3})},
              {make_f32({2, 3}, std::vector<float>(6, 1.5f))});
  expect_case(op("ConstantOfShape", 18).tensor("value", make_i64({1}, {-3})), {shape_of({4})},
              {make_i64({4}, {-3, -3, -3, -3})});
  Tensor x = make_f32({2, 3, 4}, std::vector<float>(24, 1.f));
  expect_case(op("Shape", 18), {x}, {make_i64({3}, {2, 3, 4})});
  expect_case(op("Shape", 18).i("start", 1).i("end", -1), {x}, {make_i64({1}, {3})});
  expect_case(op("Size", 18), {x}, {make_i64({}, {24})});
}

TEST(CudaCoverage, Reductions) {
  const std::vector<float> x = signed_values();  // [2, 3, 4]
  auto reduce = [&](const std::vector<int>& axes, const std::function<double(double, double)>& f,
                    double init, bool mean) {
    // Output over the kept axes, in row-major order of [2, 3, 4].
    std::vector<double> acc;
    std::vector<int> count;
    int dims[3] = {2, 3, 4};
    auto kept = [&](int d) { return std::find(axes.begin(), axes.end(), d) == axes.end(); };
    for (int i = 0; i < 24; ++i) {
      int idx[3] = {i / 12, (i / 4) % 3, i % 4}, o = 0;
      for (int d = 0; d < 3; ++d) {
        if (kept(d)) o = o * dims[d] + idx[d];
      }
      if (size_t(o) >= acc.size()) acc.resize(o + 1, init), count.resize(o + 1, 0);
      acc[o] = f(acc[o], x[i]);
      ++count[o];
    }
    std::vector<float> out;
    for (size_t o = 0; o < acc.size(); ++o) out.push_back(float(mean ? acc[o] / count[o] : acc[o]));
    return out;
  };
  auto sum = [](double a, double v) { return a + v; };
  auto mx = [](double a, double v) { return std::max(a, v); };
  auto mn = [](double a, double v) { return std::min(a, v); };
  const double inf = std::numeric_limits<double>::infinity();
  Tensor in = make_f32({2, 3, 4}, x);
  auto axes = [](std::vector<int64_t> a) { return initializer(make_i64({int64_t(a.size())}, a)); };
  expect_case(op("ReduceSum", 18), {in, axes({1})},
              {make_f32({2, 1, 4}, reduce({1}, sum, 0, false))});
  expect_case(op("ReduceMean", 18).i("keepdims", 0), {in, axes({0, 2})},
              {make_f32({3}, reduce({0, 2}, sum, 0, true))});
  expect_case(op("ReduceMax", 18).i("keepdims", 0), {in, axes({-1})},
              {make_f32({2, 3}, reduce({2}, mx, -inf, false))});
  expect_case(op("ReduceMin", 18), {in}, {make_f32({1, 1, 1}, reduce({0, 1, 2}, mn, inf, false))});
  // Integer sums stay exact.
  expect_case(op("ReduceSum", 18).i("keepdims", 0), {make_i64({2, 2}, {1, 2, 3, 4}), axes({0})},
              {make_i64({2}, {4, 6})});
}

TEST(CudaCoverage, DataMovement) {
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[i] = float(i);
  Tensor x = make_f32({2, 3, 4}, v);
  // Transpose perm [2, 0, 1]: y[k][i][j] = x[i][j][k].
  std::vector<float> t;
  for (int k = 0; k < 4; ++k) {
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 3; ++j) t.push_back(v[(i * 3 + j) * 4 + k]);
    }
  }
  expect_case(op("Transpose", 18).ints("perm", {2, 0, 1}), {x}, {make_f32({4, 2, 3}, t)});
  // An RGB image going channels last, [2, 3, 5, 9] -> [2, 5, 9, 3] (fewer than 8 rows per batch:
  // the CUDA few-rows kernel), in float32 and float16.
  std::vector<float> img(2 * 3 * 45), nhwc(img.size());
  for (size_t i = 0; i < img.size(); ++i) img[i] = float(i) * 0.25f - 40.f;
  for (int n = 0; n < 2; ++n) {
    for (int c = 0; c < 3; ++c) {
      for (int p = 0; p < 45; ++p)
        nhwc[size_t((n * 45 + p) * 3 + c)] = img[size_t((n * 3 + c) * 45 + p)];
    }
  }
  OpNode to_nhwc = op("Transpose", 18).ints("perm", {0, 2, 3, 1});
  expect_case(to_nhwc, {make_f32({2, 3, 5, 9}, img)}, {make_f32({2, 5, 9, 3}, nhwc)});
  auto half = testing::run_reduced_case({.node = to_nhwc,
                                         .inputs = {make_f32({2, 3, 5, 9}, img)},
                                         .expect_support = true,
                                         .label = "Transpose to NHWC, 3 channels"},
                                        DType::kFloat16);
  ASSERT_TRUE(half.ok()) << half.status().to_string();
  // Concat along axis 1 of [2, 3, 4], [2, 1, 4] and [2, 2, 4].
  std::vector<float> one(8, -1.f), two(16, -2.f), cat;
  for (int n = 0; n < 2; ++n) {
    cat.insert(cat.end(), v.begin() + n * 12, v.begin() + n * 12 + 12);
    cat.insert(cat.end(), 4, -1.f);
    cat.insert(cat.end(), 8, -2.f);
  }
  expect_case(op("Concat", 18).i("axis", 1),
              {x, make_f32({2, 1, 4}, one), make_f32({2, 2, 4}, two)}, {make_f32({2, 6, 4}, cat)});
  // DepthToSpace, blocksize 2, on [1, 4, 1, 2]: DCR takes the channel as (block row, block col, c),
  // CRD as (c, block row, block col); with one output channel both give the same order.
  Tensor d = make_f32({1, 4, 1, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  Tensor want = make_f32({1, 1, 2, 4}, {0, 2, 1, 3, 4, 6, 5, 7});
  expect_case(op("DepthToSpace", 18).i("blocksize", 2), {d}, {want});
  expect_case(op("DepthToSpace", 18).i("blocksize", 2).s("mode", "CRD"), {d}, {want});
  // Two output channels: DCR and CRD differ.
  Tensor d8 = make_f32({1, 8, 1, 1}, {0, 1, 2, 3, 4, 5, 6, 7});
  expect_case(op("DepthToSpace", 18).i("blocksize", 2), {d8},
              {make_f32({1, 2, 2, 2}, {0, 2, 4, 6, 1, 3, 5, 7})});
  expect_case(op("DepthToSpace", 18).i("blocksize", 2).s("mode", "CRD"), {d8},
              {make_f32({1, 2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7})});
}

TEST(CudaCoverage, ResizeNearestAndLinear) {
  Tensor x = make_f32({1, 1, 2, 2}, {1, 2, 3, 4});
  auto scales = initializer(make_f32({4}, {1, 1, 2, 2}));
  // Nearest, asymmetric, floor: each pixel becomes a 2x2 block.
  expect_case(
      op("Resize", 19).s("coordinate_transformation_mode", "asymmetric").s("nearest_mode", "floor"),
      {x, testing::kNoInput, scales},
      {make_f32({1, 1, 4, 4}, {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4})});
  // Linear, align_corners, [1, 1, 1, 2] -> sizes [1, 1, 1, 3]: the midpoint appears.
  expect_case(
      op("Resize", 19).s("mode", "linear").s("coordinate_transformation_mode", "align_corners"),
      {make_f32({1, 1, 1, 2}, {2, 6}), testing::kNoInput, testing::kNoInput,
       initializer(make_i64({4}, {1, 1, 1, 3}))},
      {make_f32({1, 1, 1, 3}, {2, 4, 6})});
  // Linear, half_pixel (the default), x2: the corners clamp, the inner samples interpolate.
  expect_case(op("Resize", 19).s("mode", "linear"), {x, testing::kNoInput, scales},
              {make_f32({1, 1, 4, 4}, {1, 1.25f, 1.75f, 2, 1.5f, 1.75f, 2.25f, 2.5f, 2.5f, 2.75f,
                                       3.25f, 3.5f, 3, 3.25f, 3.75f, 4})});
}

}  // namespace
}  // namespace kiln
