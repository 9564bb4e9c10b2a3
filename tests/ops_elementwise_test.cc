// Elementwise ops: symbolic broadcasting and dtype rules, folding of small integer values, and the
// CPU reference kernels (broadcast paths, dtypes, zero-size tensors) against hand-computed results.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "op_harness.h"
#include "typed_values.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::all_close;
using testing::constant;
using testing::f32;
using testing::infer_node;
using testing::make_f32;
using testing::make_i64;
using testing::op;
using testing::OpNode;
using testing::run_case;
using testing::run_cpu_kernel;
using testing::typed;
using testing::with_value;

// Elementwise nodes default to opset 17; later ones (Gelu 20, the opset-28 changes) say theirs.
OpNode ew(const char* name, int opset = 17) { return op(name, opset); }

Tensor make_bool(Shape shape, std::vector<uint8_t> v) {
  return Tensor::from_vector(DType::kBool, shape, v);
}
Tensor make_i32(Shape shape, std::vector<int32_t> v) {
  return Tensor::from_vector(DType::kInt32, shape, v);
}

// Independent broadcast indexing for expected values: flat output index -> operand flat index.
int64_t bcast_index(const Shape& out, const Shape& in, int64_t flat) {
  int64_t idx = 0, stride = 1;
  for (size_t d = out.size(); d-- > 0;) {
    int64_t coord = flat % out[d];
    flat /= out[d];
    size_t off = out.size() - in.size();
    if (d >= off) {
      int64_t dim = in[d - off];
      if (dim != 1) idx += coord * stride;
      stride *= dim;
    }
  }
  return idx;
}

std::vector<float> iota(int64_t n, float start, float step) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = start + step * float(i);
  return v;
}

// ---------------------------------------------------------------- shape inference

TEST(ElementwiseInfer, BroadcastsSymbolicShapes) {
  Dim b = Dim::symbol("b"), s = Dim::symbol("s");
  auto r = infer_node(ew("Add"), {f32({b, 197, 192}), f32({192})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, 197, 192]");
  EXPECT_EQ(r.dtype(), DType::kFloat32);
  EXPECT_EQ(r.value(), "unknown");
  r = infer_node(ew("Mul"), {f32({b, 1}), f32({1, s})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, s]");
  r = infer_node(ew("Add"), {f32({b, 4, s, s}), f32({1, 1, s, s})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, 4, s, s]");
  EXPECT_TRUE(r.constraints.empty());  // equal dims need no runtime proof
  // b vs s must be proven compatible over the profile.
  r = infer_node(ew("Sub"), {f32({b}), f32({s})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.constraints.size(), 1u);
}

TEST(ElementwiseInfer, IncompatibleConstantsFail) {
  auto r = infer_node(ew("Add"), {f32({3}), f32({4})});
  EXPECT_EQ(r.code(), StatusCode::kInvalidModel);
  EXPECT_NE(r.status.message().find("n0"), std::string::npos) << r.status.message();
  EXPECT_NE(r.status.message().find("broadcast"), std::string::npos) << r.status.message();
}

TEST(ElementwiseInfer, DtypeRules) {
  auto r = infer_node(ew("Add"), {f32({2}), typed(DType::kInt64, {2})});
  EXPECT_EQ(r.code(), StatusCode::kInvalidModel);
  EXPECT_NE(r.status.message().find("input 1"), std::string::npos) << r.status.message();
  EXPECT_NE(r.status.message().find("int64"), std::string::npos) << r.status.message();
  r = infer_node(ew("Less"),
                 {typed(DType::kFloat16, {Dim::symbol("n")}), typed(DType::kFloat16, {1})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.dtype(), DType::kBool);
  EXPECT_EQ(r.shape(), "[n]");
  r = infer_node(ew("IsInf"), {f32({2})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.dtype(), DType::kBool);
  EXPECT_EQ(infer_node(ew("And"), {f32({2}), f32({2})}).code(), StatusCode::kInvalidModel);
  EXPECT_EQ(infer_node(ew("Sqrt"), {typed(DType::kInt64, {2})}).code(), StatusCode::kInvalidModel);
  // Pow's exponent may have another dtype; the output follows the base.
  r = infer_node(ew("Pow"), {f32({2, 3}), typed(DType::kInt64, {})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.dtype(), DType::kFloat32);
  EXPECT_EQ(r.shape(), "[2, 3]");
  r = infer_node(ew("Where"), {typed(DType::kBool, {Dim::symbol("b"), 1}), f32({1, 5}), f32({})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, 5]");
  EXPECT_EQ(r.dtype(), DType::kFloat32);
  EXPECT_EQ(infer_node(ew("Where"), {typed(DType::kInt64, {2}), f32({2}), f32({2})}).code(),
            StatusCode::kInvalidModel);
  // Floats need fmod=1 before opset 28.
  EXPECT_EQ(infer_node(ew("Mod"), {f32({2}), f32({2})}).code(), StatusCode::kInvalidModel);
}

TEST(ElementwiseInfer, CastAndClip) {
  auto r = infer_node(ew("Cast").i("to", 7), {f32({Dim::symbol("b"), 3})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.dtype(), DType::kInt64);
  EXPECT_EQ(r.shape(), "[b, 3]");
  // `to` is required.
  EXPECT_EQ(infer_node(ew("Cast"), {f32({3})}).code(), StatusCode::kInvalidModel);
  EXPECT_EQ(infer_node(ew("Cast").i("to", 8), {f32({3})}).code(),  // string
            StatusCode::kUnsupported);
  r = infer_node(ew("Clip"), {f32({Dim::symbol("b"), 3}), f32({}), f32({1})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, 3]");
  EXPECT_EQ(infer_node(ew("Clip"), {f32({3}), f32({2})}).code(), StatusCode::kInvalidModel);
}

// ---------------------------------------------------------------- symbolic folding

TEST(ElementwiseFold, ArithmeticOnShapeValues) {
  Dim b = Dim::symbol("b");
  auto r = infer_node(ew("Mul"),
                      {with_value(DType::kInt64, {2}, {b, 3}), constant(make_i64({2}, {1, 2}))});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[b, 6]");
  // Broadcasting a scalar over a shape value.
  r = infer_node(ew("Add"),
                 {with_value(DType::kInt64, {3}, {b, 4, 5}), constant(make_i64({}, {1}))});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[b + 1, 5, 6]");
  // Integer Div truncates toward zero; a symbolic numerator >= 0 floors.
  r = infer_node(ew("Div"),
                 {with_value(DType::kInt64, {3}, {b * 4, 7, -7}), constant(make_i64({1}, {2}))});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[2*b, 3, -3]");
  // A symbolic numerator over a negative divisor is left to run time.
  r = infer_node(ew("Div"), {with_value(DType::kInt64, {1}, {b}), constant(make_i64({1}, {-2}))});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "unknown");
  // Mod with fmod=0 takes the divisor's sign.
  r = infer_node(ew("Mod"), {with_value(DType::kInt64, {3}, {-7, 7, b * 3 + 4}),
                             constant(make_i64({1}, {3}))});
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r.outputs[0].value.has_value());
  EXPECT_EQ((*r.outputs[0].value)[0], Dim(2));
  EXPECT_EQ((*r.outputs[0].value)[1], Dim(1));
  EXPECT_EQ((*r.outputs[0].value)[2], Dim(1));
  r = infer_node(ew("Mod").i("fmod", 1),
                 {constant(make_i64({2}, {-7, 7})), constant(make_i64({1}, {3}))});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[-1, 1]");
  r = infer_node(ew("Max"),
                 {with_value(DType::kInt64, {2}, {b, 3}),
                  with_value(DType::kInt64, {2}, {b + 2, 1}), constant(make_i64({1}, {2}))});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[b + 2, 3]");
  r = infer_node(ew("Abs"), {with_value(DType::kInt64, {2}, {b, -3})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[b, 3]");
}

TEST(ElementwiseFold, ComparisonsDecideWhenProvable) {
  Dim b = Dim::symbol("b");
  // b >= 0, so b == -1 is false.
  auto r =
      infer_node(ew("Equal"), {with_value(DType::kInt64, {1}, {b}), constant(make_i64({1}, {-1}))});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.dtype(), DType::kBool);
  EXPECT_EQ(r.value(), "[0]");
  // b == 3 depends on b.
  r = infer_node(ew("Equal"), {with_value(DType::kInt64, {1}, {b}), constant(make_i64({1}, {3}))});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "unknown");
  const auto x = with_value(DType::kInt64, {3}, {b, b, b + 1});
  const auto y = with_value(DType::kInt64, {3}, {b + 1, b, b});
  r = infer_node(ew("Less"), {x, y});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[1, 0, 0]");
  r = infer_node(ew("GreaterOrEqual"), {x, y});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[0, 1, 1]");
}

TEST(ElementwiseFold, WhereLogicCast) {
  Dim b = Dim::symbol("b"), s = Dim::symbol("s");
  auto r = infer_node(ew("Where"),
                      {constant(make_bool({2}, {1, 0})), with_value(DType::kInt64, {2}, {b, 2}),
                       with_value(DType::kInt64, {2}, {7, s})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[b, s]");
  // Where(Equal(shape, -1), 1, shape): the reshape-target idiom.
  r = infer_node(ew("Where"), {with_value(DType::kBool, {2}, {0, 1}), constant(make_i64({}, {1})),
                               with_value(DType::kInt64, {2}, {b, -1})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[b, 1]");
  r = infer_node(ew("Not"), {with_value(DType::kBool, {2}, {0, 1})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[1, 0]");
  r = infer_node(ew("Cast").i("to", 9), {with_value(DType::kInt64, {3}, {b, 0, b + 1})});  // bool
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "unknown");  // b may be 0
  r = infer_node(ew("Cast").i("to", 9), {with_value(DType::kInt64, {2}, {b + 1, 0})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[1, 0]");
  // int64 -> int32 passes values through.
  r = infer_node(ew("Cast").i("to", 6), {with_value(DType::kInt64, {2}, {b, 4})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[b, 4]");
  // Never a float value.
  r = infer_node(ew("Cast").i("to", 1), {with_value(DType::kInt64, {2}, {b, 4})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.dtype(), DType::kFloat32);
  EXPECT_EQ(r.value(), "unknown");
  // CastLike folds input 0's elements whatever input 1 holds (only its dtype counts): the dynamo
  // exporter's CastLike(1, batch) of a Range's start, with the batch known only at run time.
  r = infer_node(ew("CastLike"),
                 {with_value(DType::kInt64, {2}, {b, 4}), typed(DType::kInt32, {})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.dtype(), DType::kInt32);
  EXPECT_EQ(r.value(), "[b, 4]");
  r = infer_node(ew("CastLike"),
                 {constant(make_i64({1}, {1})), typed(DType::kInt64, {Dim::symbol("n")})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[1]");
  // A symbolic output shape is never folded.
  r = infer_node(ew("Add"), {typed(DType::kInt64, {b}), constant(make_i64({1}, {1}))});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "unknown");
}

// ---------------------------------------------------------------- kernels

// Add and Mul over shapes that exercise every broadcast path, checked against direct indexing.
TEST(ElementwiseKernel, BroadcastPathsMatchDirectIndexing) {
  struct Case {
    Shape a, b, out;
  };
  std::vector<Case> cases = {
      {{2, 3}, {2, 3}, {2, 3}},     // same shape
      {{2, 3}, {}, {2, 3}},         // scalar
      {{}, {4}, {4}},               // scalar first
      {{3, 5, 4}, {4}, {3, 5, 4}},  // [b,197,192] + [192]
      {{2, 4, 3, 3}, {1, 1, 3, 3}, {2, 4, 3, 3}},
      {{3, 1}, {1, 4}, {3, 4}},  // outer product
      {{2, 3, 1, 5}, {3, 4, 1}, {2, 3, 4, 5}},
      {{4, 1, 2}, {1, 3, 1}, {4, 3, 2}},
  };
  for (const char* name : {"Add", "Mul", "Sub"}) {
    for (const auto& c : cases) {
      int64_t na = shape_numel(c.a), nb = shape_numel(c.b), no = shape_numel(c.out);
      Tensor a = make_f32(c.a, iota(na, 1.0f, 0.5f));
      Tensor b = make_f32(c.b, iota(nb, -2.0f, 0.25f));
      std::vector<float> want(static_cast<size_t>(no));
      for (int64_t i = 0; i < no; ++i) {
        float x = a.data_as<float>()[bcast_index(c.out, c.a, i)];
        float y = b.data_as<float>()[bcast_index(c.out, c.b, i)];
        std::string o = name;
        want[size_t(i)] = o == "Add" ? x + y : o == "Mul" ? x * y : x - y;
      }
      auto got = run_case(ew(name), {a, b});
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      EXPECT_TRUE(all_close((*got)[0], make_f32(c.out, want)))
          << name << " " << shape_to_string(c.a) << " " << shape_to_string(c.b);
    }
  }
}

TEST(ElementwiseKernel, IntegerArithmetic) {
  {
    auto got = run_case(ew("Div"), {make_i64({4}, {7, -7, 7, 5}), make_i64({4}, {2, 2, -2, 0})});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ((*got)[0].int_at(0), 3);
    EXPECT_EQ((*got)[0].int_at(1), -3);  // toward zero
    EXPECT_EQ((*got)[0].int_at(2), -3);
    EXPECT_EQ((*got)[0].int_at(3), 0);  // division by zero does not trap
  }
  {
    auto got = run_case(ew("Mod"), {make_i64({3}, {-7, 7, 6}), make_i64({}, {3})});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ((*got)[0].int_at(0), 2);
    EXPECT_EQ((*got)[0].int_at(1), 1);
    EXPECT_EQ((*got)[0].int_at(2), 0);
    got = run_case(ew("Mod").i("fmod", 1), {make_i64({2}, {-7, 7}), make_i64({1}, {3})});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ((*got)[0].int_at(0), -1);
    EXPECT_EQ((*got)[0].int_at(1), 1);
  }
  {
    auto got = run_case(ew("Add"), {make_i32({2, 2}, {1, 2, 3, 4}), make_i32({2, 1}, {10, 20})});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    const int32_t* o = (*got)[0].data_as<int32_t>();
    EXPECT_EQ(o[0], 11);
    EXPECT_EQ(o[1], 12);
    EXPECT_EQ(o[2], 23);
    EXPECT_EQ(o[3], 24);
  }
  {
    Tensor a = Tensor::from_vector(DType::kUInt8, {3}, std::vector<uint8_t>{250, 3, 7});
    Tensor b = Tensor::from_vector(DType::kUInt8, {1}, std::vector<uint8_t>{10});
    auto got = run_case(ew("Add"), {a, b});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ((*got)[0].int_at(0), 4);  // wraps
    EXPECT_EQ((*got)[0].int_at(1), 13);
  }
  {
    auto got = run_case(ew("Pow"), {make_i64({3}, {2, -3, 5}), make_i64({3}, {10, 3, 0})});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ((*got)[0].int_at(0), 1024);
    EXPECT_EQ((*got)[0].int_at(1), -27);
    EXPECT_EQ((*got)[0].int_at(2), 1);
  }
}

TEST(ElementwiseKernel, PowFloatWithMixedExponent) {
  auto got = run_case(ew("Pow"), {make_f32({2, 2}, {1, 2, 3, 4}), make_i64({}, {2})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 2}, {1, 4, 9, 16})));
  got = run_case(ew("Pow"), {make_f32({2}, {4, 9}), make_f32({2}, {0.5f, -1})});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_f32({2}, {2, 1.0f / 9})));
}

TEST(ElementwiseKernel, VariadicMaxMin) {
  auto got = run_case(ew("Max"),
                      {make_f32({2, 2}, {1, 5, -3, 0}), make_f32({2}, {2, 2}), make_f32({}, {-1})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 2}, {2, 5, 2, 2})));
  got = run_case(ew("Min"), {make_f32({3}, {1, NAN, -3})});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_f32({3}, {1, NAN, -3})));
  got = run_case(ew("Min"), {make_i64({3}, {1, 9, -3}), make_i64({1}, {0})});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].int_at(0), 0);
  EXPECT_EQ((*got)[0].int_at(1), 0);
  EXPECT_EQ((*got)[0].int_at(2), -3);
}

TEST(ElementwiseKernel, ComparisonsAndLogic) {
  auto got = run_case(ew("Less"), {make_f32({2, 2}, {1, 2, 3, 4}), make_f32({2, 1}, {2, 3})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  std::vector<int64_t> want = {1, 0, 0, 0};
  for (int i = 0; i < 4; ++i) EXPECT_EQ((*got)[0].int_at(i), want[i]) << i;
  got = run_case(ew("Equal"), {make_i64({3}, {1, 2, 3}), make_i64({}, {2})});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].int_at(0), 0);
  EXPECT_EQ((*got)[0].int_at(1), 1);
  got = run_case(ew("Xor"), {make_bool({4}, {0, 0, 1, 1}), make_bool({4}, {0, 1, 0, 1})});
  ASSERT_TRUE(got.ok());
  want = {0, 1, 1, 0};
  for (int i = 0; i < 4; ++i) EXPECT_EQ((*got)[0].int_at(i), want[i]) << i;
  got = run_case(ew("Not"), {make_bool({2}, {0, 1})});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].int_at(0), 1);
  EXPECT_EQ((*got)[0].int_at(1), 0);
  // Bool is not an arithmetic type for these kernels. Reference only: the schema refuses the node
  // before any engine could be built, so this checks the kernel's own guard.
  EXPECT_EQ(run_cpu_kernel(ew("Add").node, {make_bool({1}, {1}), make_bool({1}, {1})},
                           {{DType::kBool, {1}}})
                .status()
                .code(),
            StatusCode::kUnsupported);
}

TEST(ElementwiseKernel, HalfAndBfloat16ComputeInFloat) {
  std::vector<uint16_t> h = {float_to_half(1.5f), float_to_half(-2.0f), float_to_half(0.25f)};
  std::vector<uint16_t> hb = {float_to_half(0.5f)};
  auto got = run_case(ew("Add"), {Tensor::from_vector(DType::kFloat16, {3}, h),
                                  Tensor::from_vector(DType::kFloat16, {1}, hb)});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  const uint16_t* o = (*got)[0].data_as<uint16_t>();
  EXPECT_EQ(half_to_float(o[0]), 2.0f);
  EXPECT_EQ(half_to_float(o[1]), -1.5f);
  EXPECT_EQ(half_to_float(o[2]), 0.75f);

  std::vector<uint16_t> b = {float_to_bf16(-1.0f), float_to_bf16(0.0f), float_to_bf16(3.0f)};
  got = run_case(ew("Relu"), {Tensor::from_vector(DType::kBFloat16, {3}, b)});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  o = (*got)[0].data_as<uint16_t>();
  EXPECT_EQ(bf16_to_float(o[0]), 0.0f);
  EXPECT_EQ(bf16_to_float(o[2]), 3.0f);
}

// What a CNN's activations meet between its layers once the precision pass keeps them in
// float16/bfloat16: each op on rounded inputs against the float32 op on the same values.
TEST(ElementwiseKernel, CnnActivationsInFloat16AndBFloat16) {
  std::vector<float> v(24);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = float(i) * 0.37f - 4.1f;  // [-4.1, 4.4]: every HardSwish piece
  Tensor x = make_f32({2, 3, 4}, v);
  Tensor c = make_f32({3, 1}, {0.5f, -1.25f, 2.0f});
  Tensor cond = make_bool({2, 1, 4}, {1, 0, 0, 1, 0, 1, 1, 0});
  // Same-shape operands of 111 elements: whole 16-byte vectors and a tail on the CUDA fast path.
  std::vector<float> v2(111), w2(111);
  for (size_t i = 0; i < v2.size(); ++i)
    v2[i] = float(i % 23) * 0.4f - 4.3f, w2[i] = 1.5f - float(i % 7) * 0.3f;
  Tensor x2 = make_f32({3, 37}, v2), y2 = make_f32({3, 37}, w2);
  struct Case {
    OpNode node;
    std::vector<testing::CaseInput> inputs;
  };
  const std::vector<Case> cases = {
      {ew("Add", 14), {x, c}},
      {ew("Add", 14), {x, testing::initializer(c)}},
      {ew("Mul", 14), {x, c}},
      {ew("Sub", 14), {c, x}},
      {ew("Div", 14), {x, c}},
      {ew("Relu", 14), {x}},
      {ew("LeakyRelu", 16).f("alpha", 0.1f), {x}},
      {ew("Sigmoid", 13), {x}},
      {ew("Tanh", 13), {x}},
      {ew("HardSwish", 14), {x}},
      {ew("HardSigmoid", 6).f("alpha", 0.25f).f("beta", 0.4f), {x}},
      // ReLU6 as exported: min and max float16 constants, or run-time scalars, or max alone.
      {ew("Clip", 13),
       {x, testing::initializer(make_f32({}, {0})), testing::initializer(make_f32({}, {6}))}},
      {ew("Clip", 13), {x, make_f32({}, {-1.5f}), make_f32({}, {2.25f})}},
      {ew("Clip", 13), {x, testing::kNoInput, testing::initializer(make_f32({}, {1.0f}))}},
      {ew("Where", 16), {cond, x, c}},
      {ew("Add", 14), {x2, y2}},
      {ew("Mul", 14), {x2, testing::initializer(y2)}},
      {ew("Relu", 14), {x2}},
      {ew("HardSwish", 14), {x2}},
  };
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    for (const Case& k : cases) {
      auto r = testing::run_reduced_case(
          {.node = k.node, .inputs = k.inputs, .expect_support = true}, dt);
      ASSERT_TRUE(r.ok()) << k.node.node.op_type << ": " << r.status().to_string();
      EXPECT_EQ((*r)[0].dtype(), dt) << k.node.node.op_type;
    }
  }
  // The casts at the precision boundaries: float32 <-> float16/bfloat16, float16 <-> bfloat16.
  Tensor h = testing::as_dtype(x, DType::kFloat16), bh = testing::as_dtype(x, DType::kBFloat16);
  const std::vector<std::pair<Tensor, std::pair<int64_t, Tensor>>> casts = {
      {x, {10, h}},
      {x, {16, bh}},
      {h, {1, testing::as_dtype(h, DType::kFloat32)}},
      {bh, {1, testing::as_dtype(bh, DType::kFloat32)}},
      {h, {16, testing::as_dtype(h, DType::kBFloat16)}},
      {bh, {10, testing::as_dtype(bh, DType::kFloat16)}},
  };
  for (const auto& [in, to] : casts) {
    auto r = run_case({.node = ew("Cast", 19).i("to", to.first),
                       .inputs = {in},
                       .expected = {to.second},
                       .expect_support = true});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ((*r)[0].dtype(), to.second.dtype());
  }
}

// Mul, Add, Sub and Div of a tensor of the output's shape `full` and a broadcast `gate`, in both
// operand orders (so Sub and Div show that the order is kept), against direct indexing in float32
// and the float32 node on rounded values in float16 and bfloat16.
void check_gate_broadcast(const Shape& full_shape, const Shape& gate_shape) {
  const int64_t nf = shape_numel(full_shape), ng = shape_numel(gate_shape);
  // Positive and away from zero, so Div in either order is well conditioned.
  std::vector<float> fv(static_cast<size_t>(nf)), gv(static_cast<size_t>(ng));
  for (int64_t i = 0; i < nf; ++i) fv[size_t(i)] = 0.5f + float(i % 17) * 0.1f;
  for (int64_t i = 0; i < ng; ++i) gv[size_t(i)] = 0.75f + float(i % 13) * 0.125f;
  const Tensor full = make_f32(full_shape, fv), gate = make_f32(gate_shape, gv);
  for (const char* name : {"Mul", "Add", "Sub", "Div"}) {
    for (bool gate_first : {false, true}) {
      std::vector<float> want(static_cast<size_t>(nf));
      for (int64_t i = 0; i < nf; ++i) {
        const float f = fv[size_t(i)], g = gv[size_t(bcast_index(full_shape, gate_shape, i))];
        const float a = gate_first ? g : f, b = gate_first ? f : g;
        const std::string o = name;
        want[size_t(i)] = o == "Mul" ? a * b : o == "Add" ? a + b : o == "Sub" ? a - b : a / b;
      }
      const std::string label = std::string(name) + " " + shape_to_string(full_shape) + " " +
                                shape_to_string(gate_shape) + (gate_first ? " gate first" : "");
      std::vector<testing::CaseInput> inputs = {full, gate};
      if (gate_first) std::swap(inputs[0], inputs[1]);
      auto got = run_case({.node = ew(name, 14),
                           .inputs = inputs,
                           .expected = {make_f32(full_shape, want)},
                           .expect_support = true,
                           .label = label});
      ASSERT_TRUE(got.ok()) << label << ": " << got.status().to_string();
      for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
        auto r = testing::run_reduced_case(
            {.node = ew(name, 14), .inputs = inputs, .expect_support = true, .label = label}, dt);
        ASSERT_TRUE(r.ok()) << label << " " << dtype_name(dt) << ": " << r.status().to_string();
        EXPECT_EQ((*r)[0].dtype(), dt) << label;
      }
    }
  }
}

// A channels-last gate: one operand of the output's shape, the other [N, 1, ..., 1, C],
// [1, ..., 1, C], [C] or [1, ..., 1, D, ..., C] (the CUDA kernels' channel-broadcast path: 16-byte
// vectors where C is a multiple of 8 float16/bfloat16 or 4 float32 elements, one element
// otherwise).
TEST(ElementwiseKernel, ChannelsLastGateBroadcastBothOrders) {
  const std::pair<Shape, Shape> cases[] = {
      {{2, 3, 5, 16}, {2, 1, 1, 16}},  // squeeze-excitation: vectors in every dtype
      {{2, 3, 5, 12}, {2, 1, 1, 12}},  // vectors in float32 only
      {{2, 4, 3, 6}, {2, 1, 1, 6}},    // one element per thread
      {{1, 3, 3, 8}, {1, 1, 1, 8}},    // batch 1: the gate is per channel
      {{3, 5, 8}, {8}},                // a per-channel bias of lower rank
      {{2, 7, 8}, {1, 1, 8}},
      {{4, 24}, {1, 24}},
      {{3, 5, 8}, {1, 5, 8}},     // a position embedding: the gate's period is 5 * 8
      {{2, 3, 5, 6}, {3, 5, 6}},  // leading ones implied by rank; odd period
  };
  for (const auto& [full, gate] : cases) check_gate_broadcast(full, gate);
}

// A gate constant over the trailing plane: [N, C, 1, 1] (squeeze-excitation channels first),
// [1, C, 1, 1] and [C, 1, 1] (a per-channel scale or bias), and other runs of the output's dims
// followed by ones (the CUDA kernels' plane-broadcast path: 16-byte vectors where the plane is a
// multiple of 8 float16/bfloat16 or 4 float32 elements, one element otherwise).
TEST(ElementwiseKernel, ChannelsFirstGateBroadcastBothOrders) {
  const std::pair<Shape, Shape> cases[] = {
      {{2, 16, 8, 8}, {2, 16, 1, 1}},  // squeeze-excitation: vectors in every dtype
      {{2, 16, 8, 8}, {1, 16, 1, 1}},  // per channel
      {{2, 16, 8, 8}, {16, 1, 1}},     // per channel, leading one implied by rank
      {{2, 6, 7, 7}, {2, 6, 1, 1}},    // a 7x7 plane: one element per thread
      {{1, 6, 7, 7}, {1, 6, 1, 1}},
      {{2, 6, 2, 6}, {1, 6, 1, 1}},  // a plane of 12: vectors in float32 only
      {{3, 4, 5, 8}, {3, 4, 5, 1}},  // the plane is the last axis alone
      {{2, 3, 4, 8}, {2, 1, 1, 1}},  // per sample
      {{2, 3, 4, 8}, {1, 3, 4, 1}},  // a run of two axes in the middle
      {{2, 5, 3, 3, 2}, {5, 1, 1, 1}},
  };
  for (const auto& [full, gate] : cases) check_gate_broadcast(full, gate);
}

TEST(ElementwiseKernel, UnaryMath) {
  Tensor x = make_f32({6}, {-3.0f, -0.5f, 0.0f, 0.5f, 1.0f, 4.0f});
  auto run1 = [&](const OpNode& n) {
    auto r = run_case(n, {x});
    EXPECT_TRUE(r.ok()) << n.node.op_type << ": " << r.status().to_string();
    return r.ok() ? (*r)[0] : Tensor();
  };
  auto expect = [&](const OpNode& n, double (*f)(double)) {
    std::vector<float> want;
    for (int i = 0; i < 6; ++i) want.push_back(float(f(x.data_as<float>()[i])));
    EXPECT_TRUE(all_close(run1(n), make_f32({6}, want))) << n.node.op_type;
  };
  expect(ew("Sigmoid"), [](double v) { return 1.0 / (1.0 + std::exp(-v)); });
  expect(ew("Tanh"), [](double v) { return std::tanh(v); });
  expect(ew("Erf"), [](double v) { return std::erf(v); });
  expect(ew("Exp"), [](double v) { return std::exp(v); });
  expect(ew("Sin"), [](double v) { return std::sin(v); });
  expect(ew("Neg"), [](double v) { return -v; });
  expect(ew("Abs"), [](double v) { return std::fabs(v); });
  expect(ew("Sign"), [](double v) { return double((v > 0) - (v < 0)); });
  expect(ew("Softplus"), [](double v) { return std::log(1.0 + std::exp(v)); });
  expect(ew("HardSwish"), [](double v) { return v * std::min(1.0, std::max(0.0, v / 6 + 0.5)); });
  // Gelu is an opset-20 op.
  expect(ew("Gelu", 20), [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); });
  expect(ew("Gelu", 20).s("approximate", "tanh"), [](double v) {
    return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  });
  expect(ew("LeakyRelu").f("alpha", 0.1f), [](double v) { return v < 0 ? 0.1 * v : v; });
  expect(ew("Elu"), [](double v) { return v < 0 ? std::exp(v) - 1 : v; });
  expect(ew("HardSigmoid"), [](double v) { return std::min(1.0, std::max(0.0, 0.2 * v + 0.5)); });

  auto r = run_case(ew("Round"), {make_f32({6}, {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 2.6f})});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(all_close((*r)[0], make_f32({6}, {0, 2, 2, 0, -2, 3}), 0, 0));  // halves to even
  // Reference only: the schema refuses Sqrt of int64 before an engine exists (ElementwiseInfer).
  EXPECT_EQ(
      run_cpu_kernel(ew("Sqrt").node, {make_i64({1}, {4})}, {{DType::kInt64, {1}}}).status().code(),
      StatusCode::kUnsupported);
}

TEST(ElementwiseKernel, IsNaNIsInfClip) {
  float inf = std::numeric_limits<float>::infinity();
  Tensor x = make_f32({4}, {NAN, inf, -inf, 1.0f});
  auto r = run_case(ew("IsNaN"), {x});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)[0].int_at(0), 1);
  EXPECT_EQ((*r)[0].int_at(1), 0);
  r = run_case(ew("IsInf").i("detect_negative", 0), {x});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)[0].int_at(1), 1);
  EXPECT_EQ((*r)[0].int_at(2), 0);  // negative infinity not detected
  EXPECT_EQ((*r)[0].int_at(3), 0);

  Tensor y = make_f32({5}, {-5, -1, 0, 1, 5});
  r = run_case(ew("Clip"), {y, make_f32({}, {-2}), make_f32({}, {3})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_f32({5}, {-2, -1, 0, 1, 3})));
  r = run_case(ew("Clip"), {y, testing::kNoInput, make_f32({1}, {0.5f})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();  // min omitted
  EXPECT_TRUE(all_close((*r)[0], make_f32({5}, {-5, -1, 0, 0.5f, 0.5f})));
  // The opset 6 spelling.
  r = run_case(ew("Clip", 6).f("min", 0.0f).f("max", 1.0f), {y});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_f32({5}, {0, 0, 0, 1, 1})));
  r = run_case(ew("Clip"), {make_i64({3}, {-9, 4, 9}), make_i64({}, {0}), make_i64({}, {6})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)[0].int_at(0), 0);
  EXPECT_EQ((*r)[0].int_at(1), 4);
  EXPECT_EQ((*r)[0].int_at(2), 6);
}

TEST(ElementwiseKernel, WhereBroadcasts) {
  Tensor cond = make_bool({2, 1}, {1, 0});
  Tensor x = make_f32({1, 3}, {1, 2, 3});
  Tensor y = make_f32({}, {-1});
  auto r = run_case(ew("Where"), {cond, x, y});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_f32({2, 3}, {1, 2, 3, -1, -1, -1})));
  r = run_case(ew("Where"),
               {make_bool({3}, {0, 1, 0}), make_i64({3}, {1, 2, 3}), make_i64({3}, {7, 8, 9})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)[0].int_at(0), 7);
  EXPECT_EQ((*r)[0].int_at(1), 2);
  EXPECT_EQ((*r)[0].int_at(2), 9);
}

TEST(ElementwiseKernel, CastAmongDtypes) {
  auto r = run_case(ew("Cast").i("to", 6), {make_f32({4}, {1.9f, -1.9f, 0.0f, NAN})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)[0].dtype(), DType::kInt32);
  EXPECT_EQ((*r)[0].int_at(0), 1);  // truncation toward zero
  EXPECT_EQ((*r)[0].int_at(1), -1);
  EXPECT_EQ((*r)[0].int_at(3), 0);
  r = run_case(ew("Cast").i("to", 9), {make_f32({3}, {0.0f, -0.1f, 2.0f})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)[0].int_at(0), 0);
  EXPECT_EQ((*r)[0].int_at(1), 1);
  EXPECT_EQ((*r)[0].int_at(2), 1);
  r = run_case(ew("Cast").i("to", 10), {make_i64({2}, {3, -1024})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(half_to_float((*r)[0].data_as<uint16_t>()[0]), 3.0f);
  EXPECT_EQ(half_to_float((*r)[0].data_as<uint16_t>()[1]), -1024.0f);
  r = run_case(ew("Cast").i("to", 1), {make_bool({2}, {1, 0})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_f32({2}, {1, 0})));
  r = run_case(ew("Cast").i("to", 2), {make_i64({2}, {257, -1})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)[0].int_at(0), 1);
  EXPECT_EQ((*r)[0].int_at(1), 255);
}

TEST(ElementwiseKernel, ZeroSizeTensors) {
  auto r = run_case(ew("Add"), {make_f32({0, 3}, {}), make_f32({3}, {1, 2, 3})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)[0].numel(), 0);
  r = run_case(ew("Where"), {make_bool({0}, {}), make_f32({1}, {1}), make_f32({0}, {})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  r = run_case(ew("Exp"), {make_f32({2, 0}, {})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  r = run_case(ew("Cast").i("to", 7), {make_f32({0}, {})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  r = run_case(ew("Max"), {make_f32({0, 2}, {}), make_f32({1, 2}, {1, 2}), make_f32({0, 1}, {})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)[0].shape(), (Shape{0, 2}));
}

// Reference only: these inputs fail shape inference (ElementwiseInfer), so no engine can hold
// them; the kernel must still refuse them rather than read out of bounds.
TEST(ElementwiseKernel, RejectsShapesThatDoNotBroadcast) {
  auto r = run_cpu_kernel(ew("Add").node, {make_f32({3}, {1, 2, 3}), make_f32({4}, {1, 2, 3, 4})},
                          {{DType::kFloat32, {4}}});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("Add"), std::string::npos) << r.status().message();
  r = run_cpu_kernel(ew("Add").node, {make_f32({2}, {1, 2}), make_i64({2}, {1, 2})},
                     {{DType::kFloat32, {2}}});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------- opset 25-28 changes

Tensor make_f64(Shape shape, std::vector<double> v) {
  return Tensor::from_vector(DType::kFloat64, shape, v);
}

TEST(ElementwiseInfer, ModFmod0OnFloatsFromOpset28) {
  for (int opset : {13, 27}) {
    auto r = infer_node(ew("Mod", opset), {f32({2}), f32({2})});
    EXPECT_EQ(r.code(), StatusCode::kInvalidModel) << opset;
    EXPECT_NE(r.status.message().find("opset 28"), std::string::npos) << r.status.message();
  }
  auto r = infer_node(ew("Mod", 28),
                      {typed(DType::kFloat16, {Dim::symbol("n")}), typed(DType::kFloat16, {1})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[n]");
  EXPECT_EQ(r.dtype(), DType::kFloat16);
}

// Mod-28 with fmod=0 on floats is A - floor(A / B) * B with the sign of B (numpy's mod),
// including the special cases the schema lists.
TEST(ElementwiseKernel, ModFloorOnFloats) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> x = {-4.5, 7.5, 5.0,  4.5, -7.5, 0.0,  -0.0, 0.0, -0.0, -4.0,
                           -3.0, 3.0, -1.0, 1.0, inf,  -inf, 1.0,  1.0, nan,  1.0};
  std::vector<double> y = {2.0, -3.0, 8.0,  -2.0, 3.0, -2.0, 2.0, 2.0,  -2.0, 2.0,
                           inf, inf,  -inf, -inf, 2.0, 2.0,  0.0, -0.0, 2.0,  nan};
  const int64_t n = int64_t(x.size());
  auto got = run_case(ew("Mod", 28), {make_f64({n}, x), make_f64({n}, y)});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  const double* o = (*got)[0].data_as<double>();
  const double want[] = {1.5, -1.5, 5.0, -1.5, 1.5, -0.0, 0.0,
                         0.0, -0.0, 0.0, inf,  3.0, -1.0, -inf};
  for (int i = 0; i < 14; ++i) {
    EXPECT_EQ(o[i], want[i]) << i;
    EXPECT_EQ(std::signbit(o[i]), std::signbit(want[i])) << i;  // zeros take B's sign
  }
  for (int i = 14; i < n; ++i) EXPECT_TRUE(std::isnan(o[i])) << i;  // inf A, zero B, NaN
  // fmod=1 keeps C's fmod: the sign of A.
  got = run_case(ew("Mod", 28).i("fmod", 1), {make_f64({2}, {-4.5, 4.5}), make_f64({2}, {2, -2})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ((*got)[0].data_as<double>()[0], -0.5);
  EXPECT_EQ((*got)[0].data_as<double>()[1], 0.5);
  // float16 computes in float: -4.3 mod 2.1 as numpy gives it for float16.
  std::vector<uint16_t> hx = {float_to_half(-4.3f)}, hy = {float_to_half(2.1f)};
  got = run_case(ew("Mod", 28), {Tensor::from_vector(DType::kFloat16, {1}, hx),
                                 Tensor::from_vector(DType::kFloat16, {1}, hy)});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  const float hxf = half_to_float(hx[0]), hyf = half_to_float(hy[0]);
  EXPECT_EQ(half_to_float((*got)[0].data_as<uint16_t>()[0]),
            half_to_float(float_to_half(std::fmod(hxf, hyf) + hyf)));
}

TEST(MathInfer, BitShiftTakesSignedIntegersFromOpset28) {
  auto r = infer_node(ew("BitShift", 11).s("direction", "RIGHT"),
                      {typed(DType::kInt32, {3}), typed(DType::kInt32, {3})});
  EXPECT_EQ(r.code(), StatusCode::kInvalidModel);
  EXPECT_NE(r.status.message().find("opset 28"), std::string::npos) << r.status.message();
  for (DType dt : {DType::kInt8, DType::kInt64, DType::kUInt16}) {
    r = infer_node(ew("BitShift", 28).s("direction", "RIGHT"),
                   {typed(dt, {Dim::symbol("n"), 3}), typed(dt, {3})});
    ASSERT_TRUE(r.ok()) << dtype_name(dt);
    EXPECT_EQ(r.dtype(), dt);
    EXPECT_EQ(r.shape(), "[n, 3]");
  }
  EXPECT_EQ(infer_node(ew("BitShift", 28).s("direction", "RIGHT"), {f32({3}), f32({3})}).code(),
            StatusCode::kInvalidModel);
}

// BitShift-28: arithmetic right shift of signed values; a shift count that is negative or at least
// the bit width gives what the sign extension alone gives (-1 right of a negative x, else 0).
TEST(MathKernel, BitShiftSignedAndOutOfRange) {
  auto i8 = [](std::vector<int8_t> v) {
    return Tensor::from_vector(DType::kInt8, {int64_t(v.size())}, v);
  };
  const OpNode right = ew("BitShift", 28).s("direction", "RIGHT");
  const OpNode left = ew("BitShift", 28).s("direction", "LEFT");
  auto got =
      run_case(right, {i8({-128, -7, 16, -1, -5, 5, -5, 5}), i8({1, 1, 2, 7, 8, 8, -1, -1})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  const int8_t* o = (*got)[0].data_as<int8_t>();
  const int8_t want_r[] = {-64, -4, 4, -1, -1, 0, -1, 0};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(o[i], want_r[i]) << i;
  got = run_case(left, {i8({1, 64, -1, 3, -3, 1}), i8({6, 1, 7, 8, -1, 100})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  o = (*got)[0].data_as<int8_t>();
  const int8_t want_l[] = {64, -128, -128, 0, 0, 0};  // bits past the sign bit are dropped
  for (int i = 0; i < 6; ++i) EXPECT_EQ(o[i], want_l[i]) << i;
  // int64 and unsigned: a count at the width gives 0; unsigned right shifts stay logical.
  got = run_case(right, {make_i64({2}, {-1024, int64_t(1) << 40}), make_i64({2}, {3, 64})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ((*got)[0].int_at(0), -128);
  EXPECT_EQ((*got)[0].int_at(1), 0);
  Tensor u = Tensor::from_vector(DType::kUInt8, {2}, std::vector<uint8_t>{200, 200});
  Tensor us = Tensor::from_vector(DType::kUInt8, {2}, std::vector<uint8_t>{1, 8});
  got = run_case(right, {u, us});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ((*got)[0].int_at(0), 100);
  EXPECT_EQ((*got)[0].int_at(1), 0);
}

TEST(MathInfer, SwiGLUNeedsEqualShapes) {
  Dim b = Dim::symbol("b"), s = Dim::symbol("s");
  auto r = infer_node(ew("SwiGLU", 28),
                      {typed(DType::kBFloat16, {b, 8}), typed(DType::kBFloat16, {b, 8})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, 8]");
  EXPECT_EQ(r.dtype(), DType::kBFloat16);
  EXPECT_TRUE(r.constraints.empty());
  // No broadcasting: a different dim fails, a symbolic one must be proven equal.
  EXPECT_EQ(infer_node(ew("SwiGLU", 28), {f32({b, 8}), f32({b, 1})}).code(),
            StatusCode::kInvalidModel);
  r = infer_node(ew("SwiGLU", 28), {f32({b, 8}), f32({s, 8})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.constraints.size(), 1u);
  EXPECT_EQ(infer_node(ew("SwiGLU", 28), {f32({4}), f32({1, 4})}).code(),
            StatusCode::kInvalidModel);
  EXPECT_EQ(
      infer_node(ew("SwiGLU", 28), {typed(DType::kInt32, {4}), typed(DType::kInt32, {4})}).code(),
      StatusCode::kInvalidModel);
}

TEST(MathKernel, SwiGLUIsSwishOfAGatingB) {
  std::vector<float> av = {1.0f, -2.0f, 3.0f, 0.5f}, bv = {0.5f, 1.0f, -1.0f, 2.0f};
  for (float alpha : {1.0f, 0.5f}) {
    OpNode n = ew("SwiGLU", 28);
    if (alpha != 1.0f) n.f("alpha", alpha);
    auto got = run_case(n, {make_f32({2, 2}, av), make_f32({2, 2}, bv)});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    std::vector<float> want;
    for (size_t i = 0; i < av.size(); ++i) {
      want.push_back(float(av[i] / (1 + std::exp(-double(alpha) * av[i])) * bv[i]));
    }
    EXPECT_TRUE(all_close((*got)[0], make_f32({2, 2}, want), 1e-6, 1e-6)) << alpha;
  }
  // Reference only: unequal shapes fail shape inference (MathInfer.SwiGLUNeedsEqualShapes).
  auto bad = run_cpu_kernel(ew("SwiGLU", 28).node, {make_f32({2}, {1, 2}), make_f32({1}, {1})},
                            {{DType::kFloat32, {2}}});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST(MathKernel, SwiGLUHalfAndBfloat16) {
  std::vector<uint16_t> a, b, ab, bb;
  for (int i = 0; i < 10; ++i) {
    a.push_back(float_to_half(float(i) * 0.7f - 3)),
        b.push_back(float_to_half(1.5f - float(i) * 0.2f));
    ab.push_back(float_to_bf16(float(i) * 0.7f - 3)),
        bb.push_back(float_to_bf16(1.5f - float(i) * 0.2f));
  }
  auto got = run_case(ew("SwiGLU", 28).f("alpha", 1.702f),
                      {Tensor::from_vector(DType::kFloat16, {2, 5}, a),
                       Tensor::from_vector(DType::kFloat16, {2, 5}, b)});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ((*got)[0].dtype(), DType::kFloat16);
  got = run_case(ew("SwiGLU", 28), {Tensor::from_vector(DType::kBFloat16, {10}, ab),
                                    Tensor::from_vector(DType::kBFloat16, {10}, bb)});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ((*got)[0].dtype(), DType::kBFloat16);
}

// Celu-28 added float16, bfloat16 and double; they compute as float does.
TEST(MathKernel, CeluOnDoubleAndHalf) {
  auto got = run_case(ew("Celu", 28), {make_f64({3}, {-1.0, 0.0, 2.0})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_DOUBLE_EQ((*got)[0].data_as<double>()[0], std::expm1(-1.0));
  EXPECT_EQ((*got)[0].data_as<double>()[2], 2.0);
  std::vector<uint16_t> h = {float_to_half(-1.0f), float_to_half(2.0f)};
  got = run_case(ew("Celu", 28), {Tensor::from_vector(DType::kFloat16, {2}, h)});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(half_to_float((*got)[0].data_as<uint16_t>()[0]),
            half_to_float(float_to_half(std::expm1(-1.0f))));
  auto r = infer_node(ew("Celu", 28), {typed(DType::kBFloat16, {2})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.dtype(), DType::kBFloat16);
}

}  // namespace
}  // namespace kiln
