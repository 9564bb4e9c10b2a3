// Shape ops: symbolic shape inference (Reshape -1 and divisibility, Concat, Expand, Range, ...),
// symbolic value chains (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) and the CPU kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "op_harness.h"
#include "typed_values.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::all_close;
using testing::CaseInput;
using testing::const_ints;
using testing::constant;
using testing::f32;
using testing::infer_node;
using testing::Inferred;
using testing::initializer;
using testing::kNoInput;
using testing::make_f32;
using testing::make_i64;
using testing::NodeInput;
using testing::op;
using testing::run_case;
using testing::run_cpu_kernel;
using testing::shape_of;
using testing::typed;
using testing::with_value;

const Dim b = Dim::symbol("b");
const Dim s = Dim::symbol("s");

// What one node inferred, as the input of the next: chains of shape arithmetic
// (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) carry their symbolic values along.
NodeInput out_of(const Inferred& r, size_t i = 0) {
  NodeInput in;
  in.dtype = r.dtype(i);
  in.shape = r.dims(i);
  in.value = r.outputs.at(i).value;
  return in;
}

NodeInput i64_scalar(int64_t v) { return constant(make_i64({}, {v})); }

// ---- shape inference ----

TEST(ShapeOpsInfer, ReshapeMinusOneWithSymbolicBatch) {
  const NodeInput x = f32({b, 197, 576});
  auto r = infer_node(op("Reshape", 18), {x, const_ints({-1, 197, 3, 3, 64})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, 197, 3, 3, 64]");
  EXPECT_TRUE(r.constraints.empty()) << r.constraints.size() << " constraints recorded";
  // The same target with the batch taken from a symbolic value and -1 elsewhere.
  r = infer_node(op("Reshape", 18), {x, with_value(DType::kInt64, {5}, {b, -1, 3, 3, 64})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, 197, 3, 3, 64]");
  EXPECT_TRUE(r.constraints.empty()) << r.constraints.size() << " constraints recorded";
}

TEST(ShapeOpsInfer, ReshapeRecordsDivisibility) {
  auto r = infer_node(op("Reshape", 18), {f32({b, 6}), const_ints({-1, 12})});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.constraints.size(), 1u);
  const ops::Constraint& k = r.constraints[0];
  EXPECT_EQ(k.kind, ops::Constraint::Kind::kDivisible);
  EXPECT_EQ(k.a, b * 6);
  EXPECT_EQ(k.b, Dim(12));
  EXPECT_NE(k.what.find("divide"), std::string::npos) << k.what;
  // The inferred dim is 6*b/12: 2 at b = 4.
  EXPECT_EQ(r.dims()[0].eval({{"b", 4}}), 2);
  EXPECT_EQ(r.dims()[1], Dim(12));
  // On constants the check is decided at once.
  EXPECT_EQ(infer_node(op("Reshape", 18), {f32({5, 6}), const_ints({-1, 12})}).code(),
            StatusCode::kInvalidModel);
}

TEST(ShapeOpsInfer, ReshapeZeroCopiesUnlessAllowzero) {
  const NodeInput x = f32({b, 4, 5});
  auto r = infer_node(op("Reshape", 18), {x, const_ints({0, 20})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, 20]");
  const NodeInput e = f32({0, 4});
  r = infer_node(op("Reshape", 18).i("allowzero", 1), {e, const_ints({4, 0})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[4, 0]");
  // Without allowzero the 0 copies dim 1 (4): 16 elements from 0 is invalid.
  EXPECT_EQ(infer_node(op("Reshape", 18), {e, const_ints({4, 0})}).code(),
            StatusCode::kInvalidModel);
  // allowzero forbids 0 together with -1.
  EXPECT_FALSE(infer_node(op("Reshape", 18).i("allowzero", 1), {e, const_ints({0, -1})}).ok());
  EXPECT_FALSE(infer_node(op("Reshape", 18), {x, const_ints({-1, -1})}).ok());
  // A shape known only at run time is refused with a clear message.
  r = infer_node(op("Reshape", 18), {x, typed(DType::kInt64, {2})});
  EXPECT_EQ(r.code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status.message().find("shape"), std::string::npos);
}

TEST(ShapeOpsInfer, ConcatAddsAxisDims) {
  const NodeInput x = f32({b, s, 8});
  auto r = infer_node(op("Concat", 18).i("axis", 1), {x, f32({b, 1, 8})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, s + 1, 8]");
  EXPECT_TRUE(r.constraints.empty());
  EXPECT_EQ(infer_node(op("Concat", 18).i("axis", 1), {x, f32({b, 1, 4})}).code(),
            StatusCode::kInvalidModel);
  // Different symbols must be proven equal over the profile: recorded.
  r = infer_node(op("Concat", 18).i("axis", -2), {x, f32({Dim::symbol("c"), 2, 8})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, s + 2, 8]");
  ASSERT_EQ(r.constraints.size(), 1u);
  EXPECT_EQ(r.constraints[0].kind, ops::Constraint::Kind::kEqual);
}

TEST(ShapeOpsInfer, RangeLengthFromSymbolicValues) {
  const NodeInput zero = i64_scalar(0), one = i64_scalar(1);
  const NodeInput seq = with_value(DType::kInt64, {}, {s});
  auto r = infer_node(op("Range", 18), {zero, seq, one});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[s]");
  r = infer_node(op("Range", 18), {zero, seq, i64_scalar(2)});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.dims()[0].eval({{"s", 7}}), 4);
  // Counting down from s to 0: ceil(s / 3) elements.
  const NodeInput minus3 = i64_scalar(-3);
  r = infer_node(op("Range", 18), {seq, zero, minus3});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.dims()[0].eval({{"s", 7}}), 3);
  // Constant ranges carry their values.
  r = infer_node(op("Range", 18), {i64_scalar(10), zero, minus3});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[4]");
  EXPECT_EQ(r.value(), "[10, 7, 4, 1]");
  r = infer_node(op("Range", 18), {i64_scalar(5), zero, one});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[0]");
  r = infer_node(op("Range", 18), {constant(make_f32({}, {0})), constant(make_f32({}, {1})),
                                   constant(make_f32({}, {0.3f}))});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[4]");
  EXPECT_EQ(infer_node(op("Range", 18), {zero, seq, i64_scalar(0)}).code(),
            StatusCode::kInvalidModel);
}

TEST(ShapeOpsInfer, SqueezeUnsqueezeFlatten) {
  const NodeInput x = f32({b, 1, s, 1});
  auto r = infer_node(op("Squeeze", 18), {x, const_ints({1, -1})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, s]");
  // Attribute form of older opsets.
  r = infer_node(op("Squeeze", 11).ints("axes", {3}), {x});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, 1, s]");
  r = infer_node(op("Squeeze", 18), {x, const_ints({2})});
  EXPECT_EQ(r.ok(), true);  // s must be 1: recorded
  ASSERT_FALSE(r.constraints.empty());
  EXPECT_EQ(r.constraints.back().kind, ops::Constraint::Kind::kEqual);
  EXPECT_EQ(infer_node(op("Squeeze", 18), {x, const_ints({5})}).code(), StatusCode::kInvalidModel);
  // No axes, symbolic dims.
  EXPECT_EQ(infer_node(op("Squeeze", 18), {x}).code(), StatusCode::kUnsupported);
  const NodeInput y = f32({b, s});
  r = infer_node(op("Unsqueeze", 18), {y, const_ints({0, -1})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[1, b, s, 1]");
  r = infer_node(op("Unsqueeze", 11).ints("axes", {1}), {y});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, 1, s]");
  EXPECT_FALSE(infer_node(op("Unsqueeze", 18), {y, const_ints({1, 1})}).ok());
  const NodeInput z = f32({b, 3, s, 4});
  r = infer_node(op("Flatten", 18), {z});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, 12*s]");
  r = infer_node(op("Flatten", 18).i("axis", -1), {z});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[3*b*s, 4]");
  r = infer_node(op("Flatten", 18).i("axis", 0), {z});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[1, 12*b*s]");
}

TEST(ShapeOpsInfer, ShapeSizeAndSymbolicChain) {
  const NodeInput x = f32({b, 3, 224, 224});
  auto r = infer_node(op("Shape", 18), {x});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.dtype(), DType::kInt64);
  EXPECT_EQ(r.shape(), "[4]");
  EXPECT_EQ(r.value(), "[b, 3, 224, 224]");
  r = infer_node(op("Gather", 18), {out_of(r), i64_scalar(0)});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[]");
  EXPECT_EQ(r.value(), "[b]");
  r = infer_node(op("Unsqueeze", 18), {out_of(r), const_ints({0})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[1]");
  EXPECT_EQ(r.value(), "[b]");
  r = infer_node(op("Concat", 18).i("axis", 0), {out_of(r), const_ints({-1, 192})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[3]");
  EXPECT_EQ(r.value(), "[b, -1, 192]");
  r = infer_node(op("Reshape", 18), {f32({b, 197, 768}), out_of(r)});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, 788, 192]");
  // Shape with start/end, then Size.
  r = infer_node(op("Shape", 18).i("start", -2), {x});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[224, 224]");
  r = infer_node(op("Shape", 18).i("start", 1).i("end", -1), {x});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[3, 224]");
  r = infer_node(op("Size", 18), {x});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[]");
  EXPECT_EQ(r.value(), "[150528*b]");
  // Squeeze of a one-element Shape keeps the value.
  r = infer_node(op("Shape", 18), {f32({s})});
  ASSERT_TRUE(r.ok());
  r = infer_node(op("Squeeze", 18), {out_of(r)});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[]");
  EXPECT_EQ(r.value(), "[s]");
}

TEST(ShapeOpsInfer, ExpandTileTranspose) {
  const NodeInput x = f32({b, 1, 8});
  auto r = infer_node(op("Expand", 18), {x, with_value(DType::kInt64, {3}, {1, s, 1})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, s, 8]");
  r = infer_node(op("Expand", 18), {x, const_ints({2, 1, 1, 1})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[2, b, 1, 8]");
  EXPECT_EQ(infer_node(op("Expand", 18), {x, const_ints({3, 4})}).code(),
            StatusCode::kInvalidModel);
  // Values: Expand and Tile of a known shape vector.
  r = infer_node(op("Expand", 18), {with_value(DType::kInt64, {1}, {s}), const_ints({3})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[s, s, s]");
  r = infer_node(op("Tile", 18), {with_value(DType::kInt64, {2}, {b, 7}), const_ints({2})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[b, 7, b, 7]");
  r = infer_node(op("Tile", 18), {x, const_ints({1, 3, 2})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, 3, 16]");
  const NodeInput y = f32({b, 197, 3, 3, 64});
  r = infer_node(op("Transpose", 18).ints("perm", {2, 0, 3, 1, 4}), {y});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[3, b, 3, 197, 64]");
  r = infer_node(op("Transpose", 18), {y});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[64, 3, 3, 197, b]");
  EXPECT_FALSE(infer_node(op("Transpose", 18).ints("perm", {0, 0, 1, 2, 3}), {y}).ok());
  r = infer_node(op("Transpose", 18), {with_value(DType::kInt64, {2, 2}, {1, 2, 3, 4})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[1, 3, 2, 4]");
}

TEST(ShapeOpsInfer, ConstantOfShapeAndConstant) {
  auto r = infer_node(op("ConstantOfShape", 18), {with_value(DType::kInt64, {2}, {b, 4})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, 4]");
  EXPECT_EQ(r.dtype(), DType::kFloat32);
  r = infer_node(op("ConstantOfShape", 18).tensor("value", make_i64({1}, {7})), {const_ints({3})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.dtype(), DType::kInt64);
  EXPECT_EQ(r.value(), "[7, 7, 7]");
  EXPECT_EQ(infer_node(op("ConstantOfShape", 18), {const_ints({-2})}).code(),
            StatusCode::kInvalidModel);
  r = infer_node(op("Constant", 18).ints("value_ints", {4, 5}), {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[2]");
  EXPECT_EQ(r.value(), "[4, 5]");
  r = infer_node(op("Constant", 18).tensor("value", make_f32({2, 3}, {1, 2, 3, 4, 5, 6})), {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[2, 3]");
  EXPECT_EQ(r.value(), "unknown");
  EXPECT_EQ(infer_node(op("Constant", 18), {}).code(), StatusCode::kUnsupported);
}

TEST(ShapeOpsInfer, SplitVariants) {
  const NodeInput x = f32({b, 12});
  auto r = infer_node(op("Split", 18).i("axis", 1), {x, const_ints({4, 8})}, 2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(0), "[b, 4]");
  EXPECT_EQ(r.shape(1), "[b, 8]");
  EXPECT_EQ(infer_node(op("Split", 18).i("axis", 1), {x, const_ints({4, 4})}, 2).code(),
            StatusCode::kInvalidModel);
  r = infer_node(op("Split", 11).i("axis", 1).ints("split", {2, 10}), {x}, 2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(1), "[b, 10]");
  r = infer_node(op("Split", 18).i("axis", -1), {x}, 3);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(2), "[b, 4]");
  const NodeInput y = f32({10});
  r = infer_node(op("Split", 18).i("num_outputs", 3), {y}, 3);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(0), "[4]");
  EXPECT_EQ(r.shape(2), "[2]");
  // 10 / 3 uneven.
  EXPECT_EQ(infer_node(op("Split", 18), {y}, 3).code(), StatusCode::kInvalidModel);
  // Values of a split shape vector.
  r = infer_node(op("Split", 18), {with_value(DType::kInt64, {3}, {b, s, 5}), const_ints({1, 2})},
                 2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(0), "[b]");
  EXPECT_EQ(r.value(1), "[s, 5]");
}

TEST(ShapeOpsInfer, PadAndTrilu) {
  const NodeInput x = f32({b, 3, s});
  auto r = infer_node(op("Pad", 18), {x, const_ints({0, 1, 2, 0, 1, 3})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, 5, s + 5]");
  r = infer_node(op("Pad", 18),
                 {x, const_ints({1, 1}), constant(make_f32({}, {0})), const_ints({-1})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, 3, s + 2]");
  r = infer_node(op("Pad", 2).ints("pads", {0, 0, 0, 0, -1, 0}), {x});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, 2, s]");
  EXPECT_EQ(infer_node(op("Pad", 18), {x, const_ints({1, 1})}).code(), StatusCode::kInvalidModel);
  EXPECT_EQ(infer_node(op("Pad", 18), {x, const_ints({0, -4, 0, 0, 0, 0})}).code(),
            StatusCode::kInvalidModel);
  EXPECT_EQ(infer_node(op("Pad", 18).s("mode", "foo"), {x, const_ints({0, 0, 0, 0, 0, 0})}).code(),
            StatusCode::kUnsupported);
  r = infer_node(op("Trilu", 18), {x});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, 3, s]");
  EXPECT_FALSE(infer_node(op("Trilu", 18), {f32({4})}).ok());
}

// ---- kernels ----

Tensor iota_f32(Shape shape) {
  std::vector<float> v(size_t(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) + 1;
  return make_f32(std::move(shape), v);
}

// out[o] = in[perm-mapped index], by plain loops.
Tensor transpose_reference(const Tensor& x, const std::vector<int64_t>& perm) {
  int r = x.rank();
  Shape os(size_t(r), 0);
  for (int k = 0; k < r; ++k) os[k] = x.shape()[perm[k]];
  std::vector<int64_t> stride(size_t(r), 1);
  for (int k = r - 2; k >= 0; --k) stride[k] = stride[k + 1] * x.shape()[k + 1];
  std::vector<float> out;
  std::vector<int64_t> idx(size_t(r), 0);
  for (int64_t o = 0; o < shape_numel(os); ++o) {
    int64_t src = 0;
    for (int k = 0; k < r; ++k) src += idx[k] * stride[perm[k]];
    out.push_back(float(x.float_at(src)));
    for (int k = r - 1; k >= 0; --k) {
      if (++idx[k] < os[k]) break;
      idx[k] = 0;
    }
  }
  return make_f32(os, out);
}

TEST(ShapeOpsKernel, TransposeMatchesLoops) {
  for (auto [shape, perm] :
       std::vector<std::pair<Shape, std::vector<int64_t>>>{{{2, 3, 4, 5}, {0, 2, 1, 3}},
                                                           {{3, 40, 50}, {0, 2, 1}},
                                                           {{2, 7, 3, 3, 4}, {2, 0, 3, 1, 4}},
                                                           {{2, 1, 3}, {2, 1, 0}},
                                                           {{5, 6}, {1, 0}},
                                                           {{4, 1, 6, 1}, {3, 1, 0, 2}},
                                                           // NCHW <-> NHWC and a 2-D transpose of
                                                           // sizes no multiple of the CUDA tile
                                                           {{2, 19, 9, 37}, {0, 2, 3, 1}},
                                                           {{2, 9, 37, 19}, {0, 3, 1, 2}},
                                                           {{70, 33}, {1, 0}},
                                                           // rows of 16-byte multiples moved as
                                                           // vectors: a head split and merge
                                                           {{2, 5, 3, 8}, {0, 2, 1, 3}},
                                                           {{2, 3, 5, 12}, {0, 2, 1, 3}},
                                                           {{3, 2, 4, 4}, {2, 0, 1, 3}}}) {
    Tensor x = iota_f32(shape);
    Tensor want = transpose_reference(x, perm);
    auto got = run_case(op("Transpose", 18).ints("perm", perm), {x});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(all_close((*got)[0], want, 0, 0)) << shape_to_string(shape);
  }
  // Another element size: int64 with the default (reversed) perm.
  auto got = run_case(op("Transpose", 18), {make_i64({2, 3}, {1, 2, 3, 4, 5, 6})});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_i64({3, 2}, {1, 4, 2, 5, 3, 6}), 0, 0));
  // Zero-size.
  got = run_case(op("Transpose", 18), {make_f32({0, 3}, {})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ((*got)[0].shape(), (Shape{3, 0}));
}

TEST(ShapeOpsKernel, ConcatSplitAcrossDtypes) {
  Tensor a = make_f32({2, 1}, {1, 2});
  Tensor b2 = make_f32({2, 2}, {3, 4, 5, 6});
  Tensor empty = make_f32({2, 0}, {});
  auto got = run_case(op("Concat", 18).i("axis", 1), {a, empty, b2});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 3}, {1, 3, 4, 2, 5, 6}), 0, 0));
  // uint8 along axis 0.
  Tensor u = Tensor::from_vector(DType::kUInt8, {2}, std::vector<uint8_t>{7, 8});
  Tensor v = Tensor::from_vector(DType::kUInt8, {1}, std::vector<uint8_t>{9});
  got = run_case(op("Concat", 18).i("axis", 0), {u, v});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].int_at(2), 9);
  EXPECT_EQ((*got)[0].int_at(1), 8);
  // Split [2, 3] into [2, 1] and [2, 2] along axis 1.
  got = run_case(op("Split", 18).i("axis", 1),
                 {make_f32({2, 3}, {1, 2, 3, 4, 5, 6}), initializer(make_i64({2}, {1, 2}))}, 2);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 1}, {1, 4}), 0, 0));
  EXPECT_TRUE(all_close((*got)[1], make_f32({2, 2}, {2, 3, 5, 6}), 0, 0));
}

TEST(ShapeOpsKernel, ExpandAndTile) {
  auto got = run_case(op("Expand", 18),
                      {make_f32({3, 1}, {1, 2, 3}), initializer(make_i64({3}, {2, 1, 2}))});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(
      all_close((*got)[0], make_f32({2, 3, 2}, {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}), 0, 0));
  got = run_case(op("Tile", 18),
                 {make_i64({2, 2}, {1, 2, 3, 4}), initializer(make_i64({2}, {2, 2}))});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0],
                        make_i64({4, 4}, {1, 2, 1, 2, 3, 4, 3, 4, 1, 2, 1, 2, 3, 4, 3, 4}), 0, 0));
  // A bool tensor (1-byte elements) and a zero-size expand.
  Tensor t = Tensor::from_vector(DType::kBool, {1, 2}, std::vector<uint8_t>{1, 0});
  got = run_case(op("Expand", 18), {t, initializer(make_i64({2}, {3, 1}))});
  ASSERT_TRUE(got.ok());
  ASSERT_EQ((*got)[0].shape(), (Shape{3, 2}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ((*got)[0].int_at(i), i % 2 == 0 ? 1 : 0);
  got = run_case(op("Expand", 18), {make_f32({1}, {5}), initializer(make_i64({2}, {0, 1}))});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ((*got)[0].shape(), (Shape{0, 1}));
}

TEST(ShapeOpsKernel, PadModesMatchNumpy) {
  Tensor x = make_f32({3}, {1, 2, 3});
  std::vector<std::pair<std::string, std::vector<float>>> cases = {
      {"constant", {9, 9, 1, 2, 3, 9, 9}},
      {"reflect", {3, 2, 1, 2, 3, 2, 1}},
      {"edge", {1, 1, 1, 2, 3, 3, 3}},
      {"wrap", {2, 3, 1, 2, 3, 1, 2}},
  };
  // Pads and axes fix the output shape (initializers); the constant value is read at run time.
  for (const auto& [mode, want] : cases) {
    auto got = run_case(op("Pad", 18).s("mode", mode),
                        {x, initializer(make_i64({2}, {2, 2})), make_f32({}, {9})});
    ASSERT_TRUE(got.ok()) << mode << ": " << got.status().to_string();
    EXPECT_TRUE(all_close((*got)[0], make_f32({7}, want), 0, 0)) << mode;
  }
  // 2-D with a negative (cropping) pad and an axes input.
  auto got = run_case(op("Pad", 18),
                      {make_f32({2, 3}, {1, 2, 3, 4, 5, 6}), initializer(make_i64({2}, {1, -1})),
                       kNoInput, initializer(make_i64({1}, {1}))});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 3}, {0, 1, 2, 0, 4, 5}), 0, 0));
  // Padding an empty tensor with a constant.
  got = run_case(op("Pad", 18),
                 {make_f32({0}, {}), initializer(make_i64({2}, {1, 1})), make_f32({}, {4})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2}, {4, 4}), 0, 0));
}

TEST(ShapeOpsKernel, TriluRangeConstants) {
  Tensor m = iota_f32({3, 4});
  auto got = run_case(op("Trilu", 18), {m});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_f32({3, 4}, {1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12}), 0, 0));
  got = run_case(op("Trilu", 18).i("upper", 0), {m, make_i64({}, {-1})});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_f32({3, 4}, {0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0}), 0, 0));
  got = run_case(op("Trilu", 18), {m, make_i64({}, {std::numeric_limits<int64_t>::max()})});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].float_at(3), 0);  // everything cleared, no overflow

  // Range's inputs fix its length: initializers (the builder folds these; the limit from a
  // runtime shape makes the kernel run).
  auto i64 = [](int64_t v) { return initializer(make_i64({}, {v})); };
  auto f = [](float v) { return initializer(make_f32({}, {v})); };
  got = run_case(op("Range", 18), {i64(10), i64(0), i64(-3)});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_i64({4}, {10, 7, 4, 1}), 0, 0));
  got = run_case(op("Range", 18), {i64(1), shape_of({10}), i64(3)});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_i64({3}, {1, 4, 7}), 0, 0));
  got = run_case(op("Range", 18), {f(0.5f), f(2), f(0.5f)});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_f32({3}, {0.5f, 1, 1.5f}), 0, 0));

  got = run_case(op("ConstantOfShape", 18).tensor("value", make_i64({1}, {3})), {shape_of({2, 2})});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_i64({2, 2}, {3, 3, 3, 3}), 0, 0));
  got = run_case(op("Constant", 18).ints("value_ints", {4, 5, 6}), {});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_i64({3}, {4, 5, 6}), 0, 0));
}

// Range-27: float16/bfloat16 ranges compute start + i * delta in the stash type (float by
// default, or double), not by adding delta in the half type, where 2048 + 1 == 2048 forever.
TEST(ShapeOpsKernel, SplitNumOutputsAttributeInputAndDtypes) {
  // Opset 18 num_outputs 3 over 7 columns: 3, 3 and 1.
  auto got = run_case(op("Split", 18).i("axis", 1).i("num_outputs", 3), {iota_f32({2, 7})}, 3);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), 3u);
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 3}, {1, 2, 3, 8, 9, 10}), 0, 0));
  EXPECT_TRUE(all_close((*got)[1], make_f32({2, 3}, {4, 5, 6, 11, 12, 13}), 0, 0));
  EXPECT_TRUE(all_close((*got)[2], make_f32({2, 1}, {7, 14}), 0, 0));
  // Opset 11 split attribute along axis 0 of int64 rows.
  got = run_case(op("Split", 11).ints("split", {1, 3}),
                 {make_i64({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8})}, 2);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_i64({1, 2}, {1, 2}), 0, 0));
  EXPECT_TRUE(all_close((*got)[1], make_i64({3, 2}, {3, 4, 5, 6, 7, 8}), 0, 0));
  // Opset 2, no split: equal parts of the last axis; int8 elements.
  Tensor x8 =
      Tensor::from_vector(DType::kInt8, {2, 4}, std::vector<int8_t>{1, -2, 3, -4, 5, -6, 7, -8});
  got = run_case(op("Split", 2).i("axis", -1), {x8}, 2);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ((*got)[1].shape(), (Shape{2, 2}));
  EXPECT_EQ((*got)[0].int_at(1), -2);
  EXPECT_EQ((*got)[1].int_at(0), 3);
  EXPECT_EQ((*got)[1].int_at(3), -8);
  // Opset 13 split input with an empty part, on the middle axis of a 3-D tensor.
  got = run_case(op("Split", 13).i("axis", 1),
                 {iota_f32({2, 3, 2}), initializer(make_i64({3}, {2, 0, 1}))}, 3);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 2, 2}, {1, 2, 3, 4, 7, 8, 9, 10}), 0, 0));
  EXPECT_EQ((*got)[1].shape(), (Shape{2, 0, 2}));
  EXPECT_TRUE(all_close((*got)[2], make_f32({2, 1, 2}, {5, 6, 11, 12}), 0, 0));
}

TEST(ShapeOpsKernel, TileThreeDAndBool) {
  Tensor x = iota_f32({2, 1, 3});
  auto got = run_case(op("Tile", 13), {x, initializer(make_i64({3}, {1, 3, 2}))});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  std::vector<float> want;
  for (int a = 0; a < 2; ++a) {
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 6; ++c) want.push_back(float(a * 3 + c % 3 + 1));
    }
  }
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 3, 6}, want), 0, 0));
  Tensor t = Tensor::from_vector(DType::kBool, {2}, std::vector<uint8_t>{1, 0});
  got = run_case(op("Tile", 13), {t, initializer(make_i64({1}, {3}))});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ((*got)[0].shape(), (Shape{6}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ((*got)[0].int_at(i), i % 2 == 0 ? 1 : 0) << i;
}

// Pad by loops, for the 4-D cases: the source index of each axis as numpy's pad modes.
Tensor pad_reference(const Tensor& x, const std::vector<int64_t>& pads, const std::string& mode,
                     float fill) {
  int r = x.rank();
  Shape out(size_t(r), 0);
  for (int k = 0; k < r; ++k) out[k] = x.shape()[k] + pads[k] + pads[r + k];
  auto source = [&](int64_t j, int64_t begin, int64_t d) -> int64_t {
    int64_t s = j - begin;
    if (s >= 0 && s < d) return s;
    if (mode == "constant") return -1;
    if (mode == "edge") return s < 0 ? 0 : d - 1;
    if (mode == "wrap") return ((s % d) + d) % d;
    if (d == 1) return 0;
    while (s < 0 || s >= d) s = s < 0 ? -s : 2 * (d - 1) - s;  // reflect
    return s;
  };
  std::vector<float> y;
  std::vector<int64_t> c(size_t(r), 0);
  const float* xp = x.data_as<float>();
  for (int64_t i = 0; i < shape_numel(out); ++i) {
    int64_t off = 0;
    bool inside = true;
    for (int k = 0; k < r; ++k) {
      int64_t s = source(c[k], pads[k], x.shape()[k]);
      inside = inside && s >= 0;
      off = off * x.shape()[k] + std::max<int64_t>(s, 0);
    }
    y.push_back(inside ? xp[off] : fill);
    for (int k = r - 1; k >= 0; --k) {
      if (++c[k] < out[k]) break;
      c[k] = 0;
    }
  }
  return make_f32(out, y);
}

TEST(ShapeOpsKernel, PadNchwModesShapeFormulaPadsAndOldOpsets) {
  Tensor x = iota_f32({1, 2, 3, 4});
  const std::vector<int64_t> pads = {0, 0, 1, 2, 0, 0, 2, 1};  // asymmetric on H and W
  for (std::string mode : {"constant", "reflect", "edge", "wrap"}) {
    auto got = run_case(op("Pad", 19).s("mode", mode),
                        {x, initializer(make_i64({8}, pads)), make_f32({}, {-3})});
    ASSERT_TRUE(got.ok()) << mode << ": " << got.status().to_string();
    EXPECT_TRUE(all_close((*got)[0], pad_reference(x, pads, mode, -3), 0, 0)) << mode;
  }
  // Pads a shape formula computes (known on the host at run time), default constant 0.
  Tensor y = iota_f32({2, 3});
  auto got = run_case(op("Pad", 18), {y, shape_of({0, 1, 2, 0})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], pad_reference(y, {0, 1, 2, 0}, "constant", 0), 0, 0));
  // Opset 2: pads and value attributes.
  got = run_case(op("Pad", 2).ints("pads", {1, 0, 0, 1}).f("value", 1.5f),
                 {make_f32({1, 2}, {7, 8})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 3}, {1.5f, 1.5f, 1.5f, 7, 8, 1.5f}), 0, 0));
  // Opset 11 edge on int64 data.
  got = run_case(op("Pad", 11).s("mode", "edge"),
                 {make_i64({3}, {4, 5, 6}), initializer(make_i64({2}, {2, 1}))});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_i64({6}, {4, 4, 4, 5, 6, 6}), 0, 0));
}

// A constant Pad of the innermost axis alone (an NHWC stem's 3 -> 8 channels) has its own CUDA
// kernel: rows written 16 bytes at a time where the padded row is a multiple of that, element by
// element otherwise; cropping begins, a runtime fill, an axes input, 2- and 8-byte elements.
TEST(ShapeOpsKernel, PadOfTheLastAxisOnly) {
  struct Case {
    Shape x;
    int64_t begin, end;
    const char* label;
  };
  const Case cases[] = {
      {{2, 5, 7, 3}, 0, 5, "stem 3 -> 8 (vector)"},
      {{3, 4, 3}, 1, 1, "3 -> 5 (scalar)"},
      {{2, 3, 7}, 2, -1, "crop the end, 7 -> 8 (vector)"},
      {{4, 4}, -1, 2, "crop the begin, 4 -> 5 (scalar)"},
      {{64, 3}, 3, 10, "3 -> 16 (vector)"},
  };
  for (const Case& c : cases) {
    const int r = int(c.x.size());
    std::vector<int64_t> pads(size_t(2 * r), 0);
    pads[size_t(r - 1)] = c.begin;
    pads[size_t(2 * r - 1)] = c.end;
    const Tensor x = iota_f32(c.x);
    const Tensor want = pad_reference(x, pads, "constant", -3);
    const testing::KernelCase k{
        .node = op("Pad", 19),
        .inputs = {x, initializer(make_i64({int64_t(pads.size())}, pads)), make_f32({}, {-3})},
        .expected = {want},
        .expect_support = true,
        .label = c.label};
    auto got = run_case(k);
    ASSERT_TRUE(got.ok()) << c.label << ": " << got.status().to_string();
    auto half = testing::run_reduced_case(
        {.node = k.node, .inputs = k.inputs, .expect_support = true, .label = c.label},
        DType::kFloat16);
    ASSERT_TRUE(half.ok()) << c.label << " float16: " << half.status().to_string();
    EXPECT_EQ((*half)[0].shape(), want.shape()) << c.label;
  }
  // Only the last axis named by an axes input, the default fill 0.
  Tensor x = iota_f32({2, 2, 3});
  auto got = run_case({.node = op("Pad", 19),
                       .inputs = {x, initializer(make_i64({2}, {2, 3})), kNoInput,
                                  initializer(make_i64({1}, {-1}))},
                       .expected = {pad_reference(x, {0, 0, 2, 0, 0, 3}, "constant", 0)},
                       .expect_support = true,
                       .label = "axes [-1]"});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  // int64 (8-byte elements, 2 per 16 bytes): 3 -> 6 by 1 and 2.
  got = run_case({.node = op("Pad", 19),
                  .inputs = {make_i64({2, 3}, {1, 2, 3, 4, 5, 6}),
                             initializer(make_i64({4}, {0, 1, 0, 2})), make_i64({}, {7})},
                  .expected = {make_i64({2, 6}, {7, 1, 2, 3, 7, 7, 7, 4, 5, 6, 7, 7})},
                  .expect_support = true,
                  .label = "int64"});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
}

TEST(ShapeOpsKernel, TriluBatchedIntegersAndK) {
  std::vector<int64_t> v(18);
  for (int i = 0; i < 18; ++i) v[size_t(i)] = i + 1;
  Tensor m = make_i64({2, 3, 3}, v);
  for (int64_t upper : {0, 1}) {
    for (int64_t k : {-1, 1}) {
      auto got = run_case(op("Trilu", 14).i("upper", upper), {m, initializer(make_i64({}, {k}))});
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      std::vector<int64_t> want(18);
      for (int i = 0; i < 18; ++i) {
        int64_t row = (i / 3) % 3, col = i % 3;
        bool keep = upper ? col - row >= k : col - row <= k;
        want[size_t(i)] = keep ? v[size_t(i)] : 0;
      }
      EXPECT_TRUE(all_close((*got)[0], make_i64({2, 3, 3}, want), 0, 0)) << upper << " " << k;
    }
  }
}

TEST(ShapeOpsKernel, RangeHalfUsesTheStashType) {
  auto h = [](float f) {
    return Tensor::from_vector(DType::kFloat16, {}, std::vector<uint16_t>{float_to_half(f)});
  };
  for (int64_t stash : {int64_t(1), int64_t(11)}) {
    auto got = run_case(op("Range", 18).i("stash_type", stash),
                        {initializer(h(2048)), initializer(h(2052)), initializer(h(1))});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ((*got)[0].shape(), (Shape{4}));
    const uint16_t* o = (*got)[0].data_as<uint16_t>();
    // 2049 and 2051 are not float16 values; each rounds to even, once.
    const float want[] = {2048, 2048, 2050, 2052};
    for (int i = 0; i < 4; ++i) EXPECT_EQ(half_to_float(o[i]), want[i]) << stash << " " << i;
  }
  const NodeInput start = constant(h(0)), limit = constant(h(3)), delta = constant(h(1));
  auto r = infer_node(op("Range", 27), {start, limit, delta});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[3]");
  EXPECT_EQ(r.dtype(), DType::kFloat16);
  EXPECT_EQ(infer_node(op("Range", 27).i("stash_type", 10), {start, limit, delta}).code(),
            StatusCode::kInvalidModel);
}

TEST(ShapeOpsKernel, ShapeSizeAndReshapeCopies) {
  Tensor x = iota_f32({2, 3, 4});
  auto got = run_case(op("Shape", 18).i("start", 1), {x});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_i64({2}, {3, 4}), 0, 0));
  got = run_case(op("Size", 18), {x});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].int_at(0), 24);
  got = run_case(op("Reshape", 18), {x, initializer(make_i64({2}, {6, -1}))});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], iota_f32({6, 4}), 0, 0));
  // A wrong preallocated output is an error (reference only: an engine sizes its own outputs).
  got = run_cpu_kernel(op("Flatten", 18).node, {x}, {{DType::kFloat32, {2, 10}}});
  EXPECT_FALSE(got.ok());  // 20 elements cannot hold 24
}

// EyeLike over dtypes and diagonals, k past either edge included (CUDA: generators.cu).
TEST(ShapeKernel, EyeLikeDtypesAndDiagonals) {
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kInt32, DType::kInt64,
                   DType::kUInt8, DType::kBool}) {
    for (int64_t k : {0, 1, -2, 5, -9}) {
      testing::KernelCase c{.node = testing::op("EyeLike", 22).i("k", k),
                            .inputs = {testing::make_typed(dt, {3, 5}, std::vector<double>(15, 0))},
                            .expect_support = true};
      auto r = testing::run_case(c);
      EXPECT_TRUE(r.ok()) << dtype_name(dt) << " k " << k << ": " << r.status().to_string();
    }
  }
  testing::KernelCase c{.node = testing::op("EyeLike", 22).i("k", 1).i("dtype", 1),
                        .inputs = {testing::make_i64({2, 3}, {0, 0, 0, 0, 0, 0})},
                        .expected = {testing::make_f32({2, 3}, {0, 1, 0, 0, 0, 1})},
                        .expect_support = true};
  auto r = testing::run_case(c);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The data movement between a CNN's float16/bfloat16 layers: exact, on any element type.
TEST(ShapeOpsKernel, ConcatTransposeSliceInFloat16AndBFloat16) {
  std::vector<float> v(2 * 3 * 4 * 5), w(2 * 2 * 4 * 5);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.11f - 3.0f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = 2.0f - float(i) * 0.07f;
  Tensor x = make_f32({2, 3, 4, 5}, v), y = make_f32({2, 2, 4, 5}, w);
  std::vector<float> big(2 * 16 * 12 * 9);
  for (size_t i = 0; i < big.size(); ++i) big[i] = float(i % 97) * 0.25f - 12.0f;
  Tensor channels16 = make_f32({2, 16, 12, 9}, big);  // 2-byte tiles on CUDA
  struct Case {
    testing::OpNode node;
    std::vector<CaseInput> inputs;
  };
  const std::vector<Case> cases = {
      {op("Concat", 13).i("axis", 1), {x, y}},
      {op("Concat", 13).i("axis", 1), {x, testing::initializer(y)}},
      {op("Transpose", 13).ints("perm", {0, 2, 3, 1}), {x}},
      {op("Transpose", 13).ints("perm", {0, 2, 3, 1}), {channels16}},
      {op("Slice", 13),
       {x, testing::initializer(make_i64({2}, {1, 1})), testing::initializer(make_i64({2}, {3, 5})),
        testing::initializer(make_i64({2}, {1, 3})), testing::initializer(make_i64({2}, {1, 2}))}},
  };
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    for (const Case& c : cases) {
      auto r = testing::run_reduced_case(
          {.node = c.node, .inputs = c.inputs, .expect_support = true}, dt);
      ASSERT_TRUE(r.ok()) << c.node.node.op_type << ": " << r.status().to_string();
      EXPECT_EQ((*r)[0].dtype(), dt) << c.node.node.op_type;
    }
  }
}

// ---- the CUDA copy kernels' fast paths and their fallbacks (issue 38) ----

// Integers exact in float16 (below 2048 in magnitude), neighbours 613 apart: an element moved to
// the wrong place fails even float16's tolerance.
Tensor scrambled_f32(Shape shape) {
  std::vector<float> v(size_t(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(int64_t(i * 613 % 2039) - 1019);
  return make_f32(std::move(shape), v);
}

Tensor as_i64(const Tensor& f) {
  std::vector<int64_t> v(size_t(f.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t(f.float_at(int64_t(i)));
  return make_i64(f.shape(), v);
}

// Concat by loops: each outer index takes every piece's row in turn.
Tensor concat_reference(const std::vector<Tensor>& xs, int axis) {
  Shape out = xs[0].shape();
  out[size_t(axis)] = 0;
  for (const Tensor& x : xs) out[size_t(axis)] += x.shape()[size_t(axis)];
  int64_t outer = 1;
  for (int k = 0; k < axis; ++k) outer *= out[size_t(k)];
  std::vector<float> y;
  for (int64_t o = 0; o < outer; ++o) {
    for (const Tensor& x : xs) {
      const int64_t row = x.numel() / outer;
      for (int64_t j = 0; j < row; ++j) y.push_back(float(x.float_at(o * row + j)));
    }
  }
  return make_f32(out, y);
}

// Runs `k` (float32 inputs and expected outputs) as float32, as float16 and, with every float
// converted, as int64: the byte-moving kernels' 4-, 2- and 8-byte elements.
void run_in_three_dtypes(const testing::KernelCase& k) {
  auto got = run_case(k);
  ASSERT_TRUE(got.ok()) << k.label << ": " << got.status().to_string();
  auto half = testing::run_reduced_case(
      {.node = k.node, .inputs = k.inputs, .num_outputs = k.num_outputs, .label = k.label},
      DType::kFloat16);
  ASSERT_TRUE(half.ok()) << k.label << " float16: " << half.status().to_string();
  testing::KernelCase wide = k;
  for (CaseInput& in : wide.inputs) {
    if (in.kind == CaseInput::Kind::kRuntime && in.tensor.dtype() == DType::kFloat32) {
      in.tensor = as_i64(in.tensor);
    }
  }
  for (Tensor& e : wide.expected) e = as_i64(e);
  wide.label += " int64";
  got = run_case(wide);
  ASSERT_TRUE(got.ok()) << wide.label << ": " << got.status().to_string();
}

// One kernel launch per up to 8 pieces, moving 16 bytes where every row and pointer allows, else
// 8, 4, 2 or 1: rows of 16-byte multiples and not, 2, 3 and 10 pieces (two launches), the last
// axis and axis 1 of 4-D.
TEST(ShapeOpsKernel, ConcatPiecesOfEveryWidth) {
  struct Case {
    std::vector<Shape> xs;
    int axis;
    const char* label;
  };
  std::vector<Case> cases = {
      {{{3, 5, 8}, {3, 5, 4}}, 2, "last axis, rows of 32 and 16 bytes"},
      {{{2, 3, 5}, {2, 3, 3}, {2, 3, 1}}, 2, "last axis, three odd rows"},
      {{{2, 3, 4, 5}, {2, 2, 4, 5}}, 1, "channels of 4-D"},
      {{{2, 1, 3, 3}, {2, 4, 3, 3}, {2, 2, 3, 3}}, 1, "channels of 4-D, three, odd planes"},
  };
  Case many{{}, 1, "ten pieces: two launches"};
  for (int64_t w = 1; w <= 10; ++w) many.xs.push_back({3, w});
  cases.push_back(many);
  for (const Case& c : cases) {
    std::vector<Tensor> xs;
    std::vector<CaseInput> inputs;
    for (size_t i = 0; i < c.xs.size(); ++i) {
      Tensor x = scrambled_f32(c.xs[i]);
      for (int64_t e = 0; e < x.numel(); ++e) x.set_float_at(e, x.float_at(e) + double(i));
      xs.push_back(x);
      inputs.push_back(x);
    }
    run_in_three_dtypes({.node = op("Concat", 13).i("axis", c.axis),
                         .inputs = inputs,
                         .expected = {concat_reference(xs, c.axis)},
                         .expect_support = true,
                         .label = c.label});
  }
}

// Split runs Concat's kernel the other way: unequal pieces, 16-byte rows and not.
TEST(ShapeOpsKernel, SplitIntoUnequalPieces) {
  struct Case {
    Shape x;
    int axis;
    std::vector<int64_t> split;
    const char* label;
  };
  const Case cases[] = {
      {{4, 6, 10}, 2, {2, 3, 5}, "last axis, odd rows"},
      {{3, 40}, 1, {8, 16, 16}, "last axis, rows of 16-byte multiples"},
      {{2, 5, 3, 4}, 1, {1, 4}, "channels of 4-D"},
  };
  for (const Case& c : cases) {
    const Tensor x = scrambled_f32(c.x);
    std::vector<Tensor> want;
    int64_t outer = 1, inner = 1, at = 0;
    for (int k = 0; k < c.axis; ++k) outer *= c.x[size_t(k)];
    for (size_t k = size_t(c.axis) + 1; k < c.x.size(); ++k) inner *= c.x[k];
    for (int64_t part : c.split) {
      Shape s = c.x;
      s[size_t(c.axis)] = part;
      std::vector<float> v;
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t j = 0; j < part * inner; ++j) {
          v.push_back(float(x.float_at((o * c.x[size_t(c.axis)] + at) * inner + j)));
        }
      }
      at += part;
      want.push_back(make_f32(s, v));
    }
    run_in_three_dtypes({.node = op("Split", 13).i("axis", c.axis),
                         .inputs = {x, initializer(make_i64({int64_t(c.split.size())}, c.split))},
                         .num_outputs = int(c.split.size()),
                         .expected = want,
                         .expect_support = true,
                         .label = c.label});
  }
}

// A constant Pad of outer axes runs as the output's rows after merging unpadded axes: a row is all
// fill or the input's row shifted (read as vectors where the shift and rows are whole vectors);
// NCHW's H and W, cropping pads, the last axis alone, padded channels and batch.
TEST(ShapeOpsKernel, PadConstantRows) {
  struct Case {
    Shape x;
    std::vector<int64_t> pads;
    const char* label;
  };
  const Case cases[] = {
      {{2, 3, 5, 7}, {0, 0, 1, 1, 0, 0, 1, 1}, "H and W by 1"},
      {{2, 3, 5, 7}, {0, 0, 2, 1, 0, 0, 1, 3}, "H and W, asymmetric"},
      {{2, 3, 5, 7}, {0, 0, -1, 2, 0, 0, 1, -2}, "H and W, cropping"},
      {{2, 3, 5, 7}, {0, 0, 0, 1, 0, 0, 0, 2}, "the last axis only"},
      {{2, 3, 5, 8}, {0, 1, 1, 0, 0, 2, 0, 0}, "C and H, rows kept whole (vector reads)"},
      {{2, 3, 4}, {1, 0, 0, 1, 0, 0}, "batch, C and W merged into rows"},
      // Rows that do not split into 16-byte vectors (CUDA writes the flattened output): 7
      // elements a row, rows cropped, and rows shorter than a vector (several per thread).
      {{2, 4, 5, 5}, {0, 0, 1, 1, 0, 0, 1, 1}, "flattened, H and W by 1"},
      {{2, 4, 6, 7}, {0, 0, -1, 2, 0, 0, 1, -2}, "flattened, cropping"},
      {{2, 4, 4, 2}, {0, 0, 0, 1, 0, 0, 0, 1}, "flattened, rows of 4"},
  };
  for (const Case& c : cases) {
    const Tensor x = scrambled_f32(c.x);
    run_in_three_dtypes(
        {.node = op("Pad", 19),
         .inputs = {x, initializer(make_i64({int64_t(c.pads.size())}, c.pads)), make_f32({}, {-3})},
         .expected = {pad_reference(x, c.pads, "constant", -3)},
         .expect_support = true,
         .label = c.label});
  }
}

// NCHW -> NHWC through CUDA's shared-memory tile: 16-bit elements four or two to a vector and
// 32-bit ones two where rows and columns divide, one otherwise; partial tiles; int64 (the strided
// gather).
TEST(ShapeOpsKernel, TransposeChannelsLastTiles) {
  const Shape shapes[] = {{2, 33, 17, 9}, {1, 64, 32, 32}, {2, 34, 6, 5}, {2, 36, 4, 7}};
  for (const Shape& s : shapes) {
    const Tensor x = scrambled_f32(s);
    const std::vector<int64_t> perm = {0, 2, 3, 1};
    run_in_three_dtypes({.node = op("Transpose", 13).ints("perm", perm),
                         .inputs = {x},
                         .expected = {transpose_reference(x, perm)},
                         .expect_support = true,
                         .label = shape_to_string(s)});
  }
}

}  // namespace
}  // namespace kiln
