// Math op family kernel cases over every dtype each op takes: trigonometry and parameterized
// activations, Shrink, PRelu, bitwise ops and BitShift, variadic Sum/Mean/Max/Min, Dropout, and
// CastLike/Clip of the elementwise family. Each runs the CPU reference and every device present,
// which must support it (expect_support); some also check the reference against values here.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "op_harness.h"
#include "typed_values.h"

namespace kiln {
namespace {

using testing::make_f32;
using testing::make_i64;
using testing::make_typed;
using testing::op;
using testing::OpNode;

void expect_case(OpNode node, std::vector<testing::CaseInput> inputs, int num_outputs = 1,
                 std::vector<Tensor> expected = {}) {
  testing::KernelCase c{.node = std::move(node),
                        .inputs = std::move(inputs),
                        .num_outputs = num_outputs,
                        .expected = std::move(expected),
                        .expect_support = true};
  auto r = testing::run_case(c);
  EXPECT_TRUE(r.ok()) << c.node.node.describe() << ": " << r.status().to_string();
}

const DType kFloatTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
const DType kIntTypes[] = {DType::kInt8,  DType::kUInt8,  DType::kInt16, DType::kUInt16,
                           DType::kInt32, DType::kUInt32, DType::kInt64, DType::kUInt64};

// n values spread over [lo, hi].
std::vector<double> spread(int n, double lo, double hi) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back(lo + (hi - lo) * (i + 0.5) / n);
  return v;
}

TEST(MathKernel, UnaryFloatOpsEveryFloatDtype) {
  struct U {
    OpNode node;
    double lo, hi;  // the op's domain
  };
  std::vector<U> cases = {
      {op("Tan", 22), -1.2, 1.2},
      {op("Asin", 22), -0.95, 0.95},
      {op("Acos", 22), -0.95, 0.95},
      {op("Atan", 22), -4, 4},
      {op("Sinh", 22), -3, 3},
      {op("Cosh", 22), -3, 3},
      {op("Asinh", 22), -4, 4},
      {op("Acosh", 22), 1.05, 6},
      {op("Atanh", 22), -0.9, 0.9},
      {op("Softsign", 22), -4, 4},
      {op("Selu", 22), -3, 3},
      {op("Selu", 22).f("alpha", 2.0f).f("gamma", 0.5f), -3, 3},
      {op("Celu", 22), -3, 3},
      {op("Celu", 22).f("alpha", 2.0f), -3, 3},
      {op("Mish", 22), -5, 5},
      {op("ThresholdedRelu", 22), -3, 3},
      {op("ThresholdedRelu", 22).f("alpha", 0.3f), -3, 3},
      {op("Swish", 24), -5, 5},
      {op("Swish", 24).f("alpha", 0.5f), -5, 5},
      {op("Shrink", 9), -2, 2},
      {op("Shrink", 9).f("lambd", 1.1f).f("bias", 0.3f), -2, 2},
  };
  for (const U& u : cases) {
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(u.node.node.op_type + " " + std::string(dtype_name(dt)));
      expect_case(u.node, {make_typed(dt, {2, 3, 5}, spread(30, u.lo, u.hi))});
    }
  }
  // Hand values: Selu, Celu, Shrink.
  expect_case(op("Selu", 22), {make_f32({2}, {-1, 2})}, 1,
              {make_f32({2}, {float(1.0507009873554805 * 1.6732632423543772 * std::expm1(-1.0)),
                              float(1.0507009873554805 * 2)})});
  expect_case(op("Shrink", 9).f("lambd", 1.5f).f("bias", 1.0f), {make_f32({3}, {-2, 1, 3})}, 1,
              {make_f32({3}, {-1, 0, 2})});
}

TEST(MathKernel, ShrinkIntegersAndBitwiseNot) {
  for (DType dt : kIntTypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    std::vector<double> v = testing::signed_int(dt) ? spread(12, -6, 6) : spread(12, 0, 12);
    for (double& e : v) e = std::floor(e);
    Tensor x = make_typed(dt, {3, 4}, v);
    expect_case(op("Shrink", 9).f("lambd", 2.0f).f("bias", 1.0f), {x});
    expect_case(op("BitwiseNot", 18), {x});
  }
  expect_case(op("BitwiseNot", 18), {make_i64({2}, {0, -6})}, 1, {make_i64({2}, {-1, 5})});
}

TEST(MathKernel, PReluBroadcastsTheSlope) {
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                   DType::kInt32, DType::kInt64, DType::kInt8}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Tensor x = make_typed(dt, {2, 3, 4}, spread(24, -6, 6));
    expect_case(op("PRelu", 16), {x, make_typed(dt, {3, 1}, {0, 2, -1})});
    expect_case(op("PRelu", 16), {x, make_typed(dt, {4}, {1, 2, 3, 0})});
  }
  expect_case(op("PRelu", 16), {make_f32({4}, {-2, -1, 1, 2}), make_f32({1}, {0.25f})}, 1,
              {make_f32({4}, {-0.5f, -0.25f, 1, 2})});
}

TEST(MathKernel, BitwiseAndBitShiftEveryIntegerDtype) {
  for (DType dt : kIntTypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    bool s = testing::signed_int(dt);
    std::vector<double> a, b, counts;
    for (int i = 0; i < 24; ++i) {
      a.push_back(s ? (i * 37) % 120 - 60 : (i * 37) % 250);
      b.push_back((i * 11) % 100);
      counts.push_back(s ? i % 12 - 2 : i % 12);  // negative and past-the-width counts on int8
    }
    Tensor x = make_typed(dt, {2, 3, 4}, a);
    Tensor y = make_typed(dt, {3, 4}, std::vector<double>(b.begin(), b.begin() + 12));
    for (const char* name : {"BitwiseAnd", "BitwiseOr", "BitwiseXor"})
      expect_case(op(name, 18), {x, y});
    Tensor c = make_typed(dt, {2, 3, 4}, counts);
    for (const char* dir : {"LEFT", "RIGHT"}) {
      expect_case(op("BitShift", 28).s("direction", dir), {x, c});
      expect_case(op("BitShift", 28).s("direction", dir), {x, make_typed(dt, {1}, {3})});
    }
  }
  Tensor u = Tensor::from_vector(DType::kUInt8, {3}, std::vector<uint8_t>{0xF0, 0x0F, 0x55});
  Tensor m = Tensor::from_vector(DType::kUInt8, {1}, std::vector<uint8_t>{0x3C});
  expect_case(op("BitwiseAnd", 18), {u, m}, 1,
              {Tensor::from_vector(DType::kUInt8, {3}, std::vector<uint8_t>{0x30, 0x0C, 0x14})});
  expect_case(op("BitShift", 11).s("direction", "LEFT"),
              {u, Tensor::from_vector(DType::kUInt8, {1}, std::vector<uint8_t>{2})}, 1,
              {Tensor::from_vector(DType::kUInt8, {3}, std::vector<uint8_t>{0xC0, 0x3C, 0x54})});
}

TEST(MathKernel, VariadicSumMeanMaxMin) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                   DType::kInt32, DType::kUInt64, DType::kInt8}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    bool flt = is_float(dt);
    Tensor a = make_typed(dt, {2, 3, 4}, flt ? spread(24, -3, 3) : spread(24, 0, 48));
    Tensor b = make_typed(dt, {3, 1}, {5, 1, 2});
    Tensor c = make_typed(dt, {4}, {1, 7, 3, 0});
    for (const char* name : {"Sum", "Mean", "Max", "Min"}) {
      if (!flt && std::string(name) == "Mean") continue;
      expect_case(op(name, 13), {a});
      expect_case(op(name, 13), {a, b});
      expect_case(op(name, 13), {c, b, a});
    }
  }
  expect_case(op("Mean", 13), {make_f32({2}, {1, 2}), make_f32({2}, {3, 5}), make_f32({1}, {2})}, 1,
              {make_f32({2}, {2, 3})});
  expect_case(op("Max", 13), {make_f32({3}, {1, nan, 2}), make_f32({3}, {nan, 0, 3})}, 1,
              {make_f32({3}, {nan, nan, 3})});
  // uint64 beyond int64's range compares as unsigned.
  Tensor big = Tensor::from_vector(DType::kUInt64, {2}, std::vector<uint64_t>{~uint64_t(0), 1});
  Tensor one = Tensor::from_vector(DType::kUInt64, {1}, std::vector<uint64_t>{2});
  expect_case(op("Min", 13), {big, one}, 1,
              {Tensor::from_vector(DType::kUInt64, {2}, std::vector<uint64_t>{2, 1})});
}

TEST(MathKernel, DropoutIsIdentityWithAllTrueMask) {
  Tensor x = make_f32({2, 3}, {1, -2, 3, 4, 5, -6});
  expect_case(op("Dropout", 13), {x}, 1, {x});
  Tensor mask = Tensor::from_vector(DType::kBool, {2, 3}, std::vector<uint8_t>(6, 1));
  expect_case(op("Dropout", 13), {x}, 2, {x, mask});
  Tensor h = make_typed(DType::kFloat16, {2, 3}, {1, 2, 3, 4, 5, 6});
  expect_case(op("Dropout", 13), {h}, 2, {h, mask});
}

TEST(MathKernel, CastLikeAmongDtypesAndClipWithCrossedBounds) {
  std::vector<double> v = {-2.75, -1.5, -0.25, 0, 0.5, 1.25, 3.5, 100.75};
  std::vector<std::pair<DType, DType>> pairs = {
      {DType::kFloat32, DType::kFloat16}, {DType::kBFloat16, DType::kFloat32},
      {DType::kFloat64, DType::kFloat32}, {DType::kFloat16, DType::kFloat64},
      {DType::kFloat32, DType::kInt32},   {DType::kFloat32, DType::kBFloat16},
      {DType::kInt64, DType::kFloat64},   {DType::kFloat32, DType::kBool},
      {DType::kInt32, DType::kInt8}};
  for (auto [from, to] : pairs) {
    SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to)));
    expect_case(op("CastLike", 19), {make_typed(from, {8}, v), make_typed(to, {1}, {0})});
  }
  // min > max: every element becomes max.
  expect_case(op("Clip", 13), {make_f32({3}, {-1, 0.5f, 9}), make_f32({}, {2}), make_f32({}, {1})},
              1, {make_f32({3}, {1, 1, 1})});
}

}  // namespace
}  // namespace kiln
