// Index ops: Slice clamping on symbolic dims (checked against the concrete ONNX rule for many dim
// values), Gather values and index checks, and the kernels (every backend) including out-of-range
// indices.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "op_harness.h"
#include "typed_values.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::all_close;
using testing::const_ints;
using testing::const_scalar;
using testing::f32;
using testing::infer_node;
using testing::initializer;
using testing::make_f32;
using testing::make_i64;
using testing::NodeInput;
using testing::op;
using testing::OpNode;
using testing::run_case;
using testing::run_cpu_kernel;
using testing::typed;
using testing::with_value;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

const Dim b = Dim::symbol("b");
const Dim s = Dim::symbol("s");

// The ONNX slice length for concrete values, written straight from the spec.
int64_t slice_length(int64_t d, int64_t start, int64_t end, int64_t step) {
  if (start < 0) start += d;
  if (end < 0) end += d;
  auto clamp = [](int64_t v, int64_t lo, int64_t hi) { return std::min(std::max(v, lo), hi); };
  if (step > 0) {
    start = clamp(start, 0, d);
    end = clamp(end, 0, d);
  } else {
    start = clamp(start, 0, d - 1);
    end = clamp(end, -1, d - 1);
  }
  int64_t n = 0;
  for (int64_t i = start; step > 0 ? i < end : i > end; i += step) ++n;
  return n;
}

// ---- shape inference ----

OpNode slice() { return op("Slice", 18); }

TEST(IndexOpsInfer, SliceToInt64MaxOnSymbolicDim) {
  NodeInput x = f32({b, s, 8});
  auto r = infer_node(slice(), {x, const_ints({0}), const_ints({kMax}), const_ints({1})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, s, 8]");
  r = infer_node(slice(), {x, const_ints({0, 2}), const_ints({kMax, -2}), const_ints({1, 2})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.dims()[1], s);
  EXPECT_EQ(r.dims()[2], Dim(4));
  // Opset 1 attributes.
  r = infer_node(op("Slice", 9).ints("starts", {1}).ints("ends", {3}), {x});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.dims()[0].eval({{"b", 5}}), 2);
  EXPECT_EQ(r.dims()[0].eval({{"b", 2}}), 1);
  EXPECT_EQ(r.dims()[0].eval({{"b", 1}}), 0);
}

TEST(IndexOpsInfer, SliceLengthsReadWell) {
  // x[1:], x[-1:] and x[:3] on a symbolic axis: each clamp is kept only where it can bind.
  // Clamps that only bind on an empty axis are resolved and the condition is recorded instead
  // (x[-1:] is 1 once s >= 1); one that binds inside any profile stays a min.
  struct Want {
    int64_t start, end;
    std::string shape;
    size_t constraints;
  };
  for (const Want& w : std::vector<Want>{{1, kMax, "[s - 1]", 2},
                                         {-1, kMax, "[1]", 1},
                                         {0, 3, "[min(3, s)]", 0},
                                         {0, kMax, "[s]", 0}}) {
    auto r = infer_node(slice(), {f32({s}), const_ints({w.start}), const_ints({w.end})});
    ASSERT_TRUE(r.ok()) << r.status.to_string();
    EXPECT_EQ(r.shape(), w.shape) << w.start << ":" << w.end;
    EXPECT_EQ(r.constraints.size(), w.constraints) << w.start << ":" << w.end;
    for (const auto& k : r.constraints) {
      EXPECT_EQ(k.kind, ops::Constraint::Kind::kGreaterEqual);
      EXPECT_NE(k.what.find("axis 0 (s)"), std::string::npos) << k.what;
      EXPECT_GE(*k.a.eval({{"s", 1}}), *k.b.eval({{"s", 1}})) << k.what;
      EXPECT_LT(*k.a.eval({{"s", 0}}), *k.b.eval({{"s", 0}})) << k.what;
    }
  }
}

TEST(IndexOpsInfer, SliceWithSymbolicStartsResolvesClamps) {
  // starts = s, ends = s + 1 on a dim of size s + 1 (a KV-cache read of the last position).
  NodeInput x = f32({b, s + 1, 64});
  NodeInput st = with_value(DType::kInt64, {1}, {s});
  NodeInput en = with_value(DType::kInt64, {1}, {s + 1});
  auto r = infer_node(slice(), {x, st, en, const_ints({1})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 1, 64]");
  EXPECT_TRUE(r.constraints.empty());
  // Ends given as a symbolic value past the dim clamp to it.
  NodeInput big = with_value(DType::kInt64, {1}, {s + 5});
  r = infer_node(slice(), {x, const_ints({0}), big, const_ints({1})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, s + 1, 64]");
}

TEST(IndexOpsInfer, SliceLengthMatchesSpecForEveryDim) {
  struct Params {
    int64_t start, end, step;
  };
  std::vector<Params> params = {
      {0, kMax, 1},   {1, kMax, 1},     {-1, kMax, 1}, {-3, -1, 1},  {0, 3, 1},       {2, 5, 2},
      {-1, kMin, -1}, {kMax, kMin, -2}, {-2, 0, -1},   {3, 1, -1},   {1, -1, 3},      {0, -100, 1},
      {-100, 2, 1},   {5, kMax, 1},     {-1, -2, -1},  {0, kMax, 4}, {kMin, kMax, 1}, {4, 4, 1}};
  for (const auto& p : params) {
    auto r = infer_node(slice(), {f32({s}), const_ints({p.start}), const_ints({p.end}),
                                  const_ints({0}), const_ints({p.step})});
    ASSERT_TRUE(r.ok()) << r.status.to_string();
    const Dim& len = r.dims()[0];
    for (int64_t d = 0; d <= 12; ++d) {
      // Either the formula is right at d, or a recorded constraint rules d out of every profile.
      bool ruled_out = false;
      for (const auto& k : r.constraints) {
        ASSERT_EQ(k.kind, ops::Constraint::Kind::kGreaterEqual) << k.what;
        if (*k.a.eval({{"s", d}}) < *k.b.eval({{"s", d}})) ruled_out = true;
      }
      if (ruled_out) {
        EXPECT_EQ(d, 0) << "only empty axes may be ruled out";
        continue;
      }
      EXPECT_EQ(len.eval({{"s", d}}), slice_length(d, p.start, p.end, p.step))
          << "slice [" << p.start << ":" << p.end << ":" << p.step << "] of " << d << " -> "
          << len.to_string();
    }
  }
}

TEST(IndexOpsInfer, SliceErrorsAndValues) {
  NodeInput x = f32({b, 4});
  EXPECT_EQ(
      infer_node(slice(), {x, const_ints({0}), const_ints({1}), const_ints({0}), const_ints({0})})
          .code(),
      StatusCode::kInvalidModel);
  EXPECT_EQ(infer_node(slice(), {x, const_ints({0}), const_ints({1}), const_ints({2})}).code(),
            StatusCode::kInvalidModel);
  EXPECT_EQ(infer_node(slice(), {x, const_ints({0, 0}), const_ints({1}), const_ints({0})}).code(),
            StatusCode::kInvalidModel);
  NodeInput dyn = typed(DType::kInt64, {1});
  EXPECT_EQ(infer_node(slice(), {x, dyn, const_ints({1})}).code(), StatusCode::kUnsupported);
  // Slicing a shape vector: [b, s, 3, 4][1:-1] -> [s, 3]; reversed with step -2 -> [4, s].
  NodeInput v = with_value(DType::kInt64, {4}, {b, s, 3, 4});
  auto r = infer_node(slice(), {v, const_ints({1}), const_ints({-1})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.value(), "[s, 3]");
  r = infer_node(slice(),
                 {v, const_ints({-1}), const_ints({kMin}), const_ints({0}), const_ints({-2})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.value(), "[4, s]");
}

TEST(IndexOpsInfer, GatherShapesValuesAndChecks) {
  NodeInput data = f32({b, 5, 8});
  auto r = infer_node(op("Gather", 18).i("axis", 1), {data, typed(DType::kInt64, {s, 2})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, s, 2, 8]");
  r = infer_node(op("Gather", 18).i("axis", -1), {data, const_scalar(-1)});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 5]");
  EXPECT_EQ(infer_node(op("Gather", 18).i("axis", 1), {data, const_scalar(5)}).code(),
            StatusCode::kInvalidModel);
  // On a symbolic axis a known index becomes a constraint for the profile.
  r = infer_node(op("Gather", 18), {data, const_scalar(3)});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  ASSERT_EQ(r.constraints.size(), 1u);
  EXPECT_EQ(r.constraints.back().kind, ops::Constraint::Kind::kGreaterEqual);
  // Values: gathering from a known shape vector, negative indices included.
  NodeInput v = with_value(DType::kInt64, {4}, {b, 3, 224, s});
  r = infer_node(op("Gather", 18), {v, const_scalar(0)});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[]");
  EXPECT_EQ(r.value(), "[b]");
  r = infer_node(op("Gather", 18), {v, const_ints({-1, 1})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.value(), "[s, 3]");
}

TEST(IndexOpsInfer, GatherNDGatherElementsCumSum) {
  NodeInput data = f32({b, 4, 5, 6});
  auto r =
      infer_node(op("GatherND", 18).i("batch_dims", 1), {data, typed(DType::kInt64, {b, 7, 2})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 7, 6]");
  r = infer_node(op("GatherND", 18), {data, typed(DType::kInt64, {3, 4})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[3]");
  EXPECT_EQ(infer_node(op("GatherND", 18), {data, typed(DType::kInt64, {3, 5})}).code(),
            StatusCode::kInvalidModel);
  r = infer_node(op("GatherElements", 18).i("axis", 1), {data, typed(DType::kInt64, {b, 9, 5, 6})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 9, 5, 6]");
  EXPECT_FALSE(infer_node(op("GatherElements", 18), {data, typed(DType::kInt64, {b, 9})}).ok());
  r = infer_node(op("CumSum", 18), {data, const_scalar(-1)});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 4, 5, 6]");
  EXPECT_EQ(infer_node(op("CumSum", 18), {data, const_scalar(4)}).code(),
            StatusCode::kInvalidModel);
}

// ---- kernels ----

// Int64 constants of a node (Slice starts/ends/axes/steps, CumSum's axis): initializers.
testing::CaseInput i64s(std::vector<int64_t> v) {
  return initializer(make_i64({int64_t(v.size())}, v));
}

TEST(IndexOpsKernel, SliceWithStepsAndClamps) {
  Tensor x = make_f32({3, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  auto got =
      run_case(slice(), {x, i64s({kMax, 1}), i64s({kMin, kMax}), i64s({0, 1}), i64s({-2, 2})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 2}, {10, 12, 2, 4}), 0, 0));
  // Attribute form (opset 9), int32 data.
  Tensor y = Tensor::from_vector(DType::kInt32, {5}, std::vector<int32_t>{1, 2, 3, 4, 5});
  got = run_case(op("Slice", 9).ints("starts", {-3}).ints("ends", {100}), {y});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ((*got)[0].int_at(0), 3);
  EXPECT_EQ((*got)[0].int_at(2), 5);
  // Empty result, and a mismatched preallocated output is an error, not a write out of bounds.
  got = run_case(slice(), {x, i64s({3}), i64s({1})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ((*got)[0].shape(), (Shape{0, 4}));
  got = run_cpu_kernel(slice().node, {x, make_i64({1}, {0}), make_i64({1}, {1})},
                       {{DType::kFloat32, {2, 4}}});
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
}

TEST(IndexOpsKernel, GatherIndicesAndErrors) {
  Tensor x = make_f32({3, 2}, {1, 2, 3, 4, 5, 6});
  auto got = run_case(op("Gather", 18), {x, make_i64({2, 2}, {2, 0, -1, 1})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 2, 2}, {5, 6, 1, 2, 5, 6, 3, 4}), 0, 0));
  Tensor i32 = Tensor::from_vector(DType::kInt32, {}, std::vector<int32_t>{1});
  got = run_case(op("Gather", 18).i("axis", 1), {x, i32});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({3}, {2, 4, 6}), 0, 0));
  got = run_case(op("Gather", 18), {x, make_i64({2}, {0, 3})});
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("Gather"), std::string::npos);
  EXPECT_NE(got.status().message().find("index 3"), std::string::npos) << got.status().message();
  got = run_case(op("Gather", 18), {x, make_i64({1}, {-4})});
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  // Zero-size indices and zero-size data with no indices.
  got = run_case(op("Gather", 18), {x, make_i64({0}, {})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ((*got)[0].shape(), (Shape{0, 2}));
  got = run_case(op("Gather", 18), {make_f32({0, 2}, {}), make_i64({1}, {0})});
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
}

TEST(IndexOpsKernel, GatherNDAndGatherElements) {
  // ONNX example 5: batch_dims = 1.
  Tensor data = make_f32({2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  auto got = run_case(op("GatherND", 18).i("batch_dims", 1), {data, make_i64({2, 1}, {1, 0})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 2}, {2, 3, 4, 5}), 0, 0));
  // ONNX example 2: full index tuples into a 2x2.
  got = run_case(op("GatherND", 18),
                 {make_f32({2, 2}, {0, 1, 2, 3}), make_i64({2, 2}, {0, 0, 1, 1})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2}, {0, 3}), 0, 0));
  got = run_case(op("GatherND", 18), {make_f32({2, 2}, {0, 1, 2, 3}), make_i64({1, 2}, {0, 2})});
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  // GatherElements, ONNX example 1 (axis 1) and example 2 (axis 0, negative index).
  got = run_case(op("GatherElements", 18).i("axis", 1),
                 {make_f32({2, 2}, {1, 2, 3, 4}), make_i64({2, 2}, {0, 0, 1, 0})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 2}, {1, 1, 4, 3}), 0, 0));
  got = run_case(op("GatherElements", 18), {make_f32({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9}),
                                            make_i64({2, 3}, {1, 2, 0, 2, 0, -3})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 3}, {4, 8, 3, 7, 2, 3}), 0, 0));
  got = run_case(op("GatherElements", 18), {make_f32({2}, {1, 2}), make_i64({1}, {2})});
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
}

TEST(IndexOpsKernel, CumSumVariants) {
  Tensor x = make_f32({2, 3}, {1, 2, 3, 4, 5, 6});
  struct V {
    int64_t axis, exclusive, reverse;
    std::vector<float> want;
  };
  for (const V& v : std::vector<V>{{1, 0, 0, {1, 3, 6, 4, 9, 15}},
                                   {1, 1, 0, {0, 1, 3, 0, 4, 9}},
                                   {1, 0, 1, {6, 5, 3, 15, 11, 6}},
                                   {1, 1, 1, {5, 3, 0, 11, 6, 0}},
                                   {0, 0, 0, {1, 2, 3, 5, 7, 9}},
                                   {-2, 1, 0, {0, 0, 0, 1, 2, 3}}}) {
    auto got = run_case(op("CumSum", 18).i("exclusive", v.exclusive).i("reverse", v.reverse),
                        {x, initializer(make_i64({}, {v.axis}))});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(all_close((*got)[0], make_f32({2, 3}, v.want), 0, 0))
        << "axis " << v.axis << " exclusive " << v.exclusive << " reverse " << v.reverse;
  }
  Tensor i = Tensor::from_vector(DType::kInt32, {3}, std::vector<int32_t>{1, 2, 3});
  auto got = run_case(op("CumSum", 18), {i, initializer(make_i64({}, {0}))});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ((*got)[0].int_at(2), 6);
  got = run_case(op("CumSum", 18), {make_f32({0, 3}, {}), initializer(make_i64({}, {0}))});
  EXPECT_TRUE(got.ok()) << got.status().to_string();
}

TEST(IndexOpsInfer, OneHotInsertsTheDepthAxis) {
  // A float depth is cast to int64.
  auto r = infer_node(op("OneHot", 11).i("axis", 1),
                      {typed(DType::kInt64, {b, 3}), testing::constant(make_f32({}, {10.0f})),
                       typed(DType::kInt32, {2})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 10, 3]");
  EXPECT_EQ(r.dtype(), DType::kInt32);
  // An integer depth from a shape: a symbolic size, default axis -1.
  r = infer_node(op("OneHot", 11), {f32({b}), with_value(DType::kInt64, {1}, {s}), f32({2})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, s]");
  // A depth known only at run time.
  r = infer_node(op("OneHot", 11), {typed(DType::kInt64, {3}), f32({}), f32({2})});
  EXPECT_EQ(r.code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status.message().find("at run time"), std::string::npos) << r.status.message();
  // values must be [off, on]; depth must be positive.
  r = infer_node(op("OneHot", 11), {typed(DType::kInt64, {3}), const_scalar(4), f32({3})});
  EXPECT_EQ(r.code(), StatusCode::kInvalidModel);
  r = infer_node(op("OneHot", 11), {typed(DType::kInt64, {3}), const_scalar(0), f32({2})});
  EXPECT_EQ(r.code(), StatusCode::kInvalidModel);
}

TEST(IndexOpsKernel, OneHotWrapsNegativeIndicesAndSkipsOutOfRange) {
  // depth 4, axis 0: output [4, 3]; index -1 is 3, 4 and -5 are out of range (all off).
  auto got =
      run_case(op("OneHot", 11).i("axis", 0),
               {make_i64({3}, {1, -1, 4}), initializer(make_f32({}, {4})), make_f32({2}, {-1, 7})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(
      all_close((*got)[0], make_f32({4, 3}, {-1, -1, -1, 7, -1, -1, -1, -1, -1, -1, 7, -1}), 0, 0));
  // Float indices and the default axis (last); bf16 values move as bytes.
  std::vector<uint16_t> v = {float_to_bf16(0.f), float_to_bf16(2.5f)};
  got = run_case(op("OneHot", 11), {make_f32({2}, {2.0f, -5.0f}), initializer(make_i64({}, {3})),
                                    Tensor::from_vector(DType::kBFloat16, {2}, v)});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ((*got)[0].shape(), (Shape{2, 3}));
  const uint16_t* o = (*got)[0].data_as<uint16_t>();
  const float want[] = {0, 0, 2.5f, 0, 0, 0};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(bf16_to_float(o[i]), want[i]) << i;
}

TEST(IndexOpsKernel, GatherElementsThreeDInt32IndicesAndOtherDtypes) {
  // [2, 3, 2] data, gather along axis 1 with int32 indices of shape [2, 2, 2] (smaller on axis 1).
  std::vector<float> d(12);
  for (int i = 0; i < 12; ++i) d[size_t(i)] = float(i);
  Tensor idx =
      Tensor::from_vector(DType::kInt32, {2, 2, 2}, std::vector<int32_t>{2, 0, -1, 1, 0, 0, 1, 2});
  auto got = run_case(op("GatherElements", 13).i("axis", 1), {make_f32({2, 3, 2}, d), idx});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  // out[b, i, j] = data[b, idx[b, i, j], j]
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 2, 2}, {4, 1, 4, 3, 6, 7, 8, 11}), 0, 0));
  // int64 data, last axis.
  got = run_case(op("GatherElements", 13).i("axis", -1),
                 {make_i64({2, 3}, {10, 11, 12, 13, 14, 15}), make_i64({2, 1}, {2, 0})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_i64({2, 1}, {12, 13}), 0, 0));
}

TEST(IndexOpsKernel, ScatterElementsReductionsApplyDuplicatesInOrder) {
  // ONNX example 2 (axis 1), with a duplicate index: "none" keeps the later update.
  Tensor data = make_f32({1, 5}, {1, 2, 3, 4, 5});
  Tensor idx = make_i64({1, 3}, {1, 3, 1});
  Tensor upd = make_f32({1, 3}, {1.5f, 2.5f, 4});
  struct V {
    const char* reduction;
    std::vector<float> want;
  };
  for (const V& v : std::vector<V>{{"none", {1, 4, 3, 2.5f, 5}},
                                   {"add", {1, 7.5f, 3, 6.5f, 5}},
                                   {"mul", {1, 12, 3, 10, 5}},
                                   {"max", {1, 4, 3, 4, 5}},
                                   {"min", {1, 1.5f, 3, 2.5f, 5}}}) {
    auto got = run_case(op("ScatterElements", 18).i("axis", 1).s("reduction", v.reduction),
                        {data, idx, upd});
    ASSERT_TRUE(got.ok()) << v.reduction << ": " << got.status().to_string();
    EXPECT_TRUE(all_close((*got)[0], make_f32({1, 5}, v.want), 0, 0)) << v.reduction;
  }
  // Axis 0 over a [3, 3] with negative indices (ONNX example 1), and int64 data with add.
  auto got =
      run_case(op("ScatterElements", 13),
               {make_f32({3, 3}, std::vector<float>(9, 0)), make_i64({2, 3}, {1, 0, 2, 0, 2, -2}),
                make_f32({2, 3}, {1.0f, 1.1f, 1.2f, 2.0f, 2.1f, 2.2f})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(
      all_close((*got)[0], make_f32({3, 3}, {2.0f, 1.1f, 0, 1.0f, 0, 2.2f, 0, 2.1f, 1.2f}), 0, 0));
  got = run_case(op("ScatterElements", 18).i("axis", 0).s("reduction", "add"),
                 {make_i64({2, 2}, {1, 2, 3, 4}), make_i64({3, 2}, {0, 1, 0, 1, 1, 0}),
                  make_i64({3, 2}, {10, 20, 30, 40, 50, 60})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_i64({2, 2}, {41, 62, 53, 64}), 0, 0));
  // An index past the axis is an error of the reference.
  got = run_case(op("ScatterElements", 18), {data, make_i64({1, 1}, {5}), make_f32({1, 1}, {0})});
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
}

TEST(IndexOpsKernel, OneHotMiddleAxisInt32IndicesInt64Values) {
  // indices [2, 2] int32, depth 3 at axis 1: output [2, 3, 2].
  Tensor idx = Tensor::from_vector(DType::kInt32, {2, 2}, std::vector<int32_t>{0, 2, -1, 1});
  auto got = run_case(op("OneHot", 11).i("axis", 1),
                      {idx, initializer(make_i64({1}, {3})), initializer(make_i64({2}, {5, 9}))});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(
      all_close((*got)[0], make_i64({2, 3, 2}, {9, 5, 5, 5, 5, 9, 5, 5, 5, 9, 9, 5}), 0, 0));
}

TEST(IndexOpsInfer, ReverseSequenceAxes) {
  auto r = infer_node(op("ReverseSequence", 10), {f32({s, b, 8}), typed(DType::kInt64, {b})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[s, b, 8]");
  EXPECT_TRUE(r.constraints.empty());
  const NodeInput x2 = f32({4, 3}), l2 = typed(DType::kInt64, {4});
  EXPECT_EQ(infer_node(op("ReverseSequence", 10), {x2, l2}).code(), StatusCode::kInvalidModel);
  EXPECT_TRUE(
      infer_node(op("ReverseSequence", 10).i("batch_axis", 0).i("time_axis", 1), {x2, l2}).ok());
  EXPECT_EQ(
      infer_node(op("ReverseSequence", 10).i("batch_axis", 0).i("time_axis", 0), {x2, l2}).code(),
      StatusCode::kInvalidModel);
}

TEST(IndexOpsKernel, ReverseSequenceMatchesTheSpecExamples) {
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[size_t(i)] = float(i);
  // Example 2 of the spec: batch_axis 0, time_axis 1, lengths 1..4.
  auto got = run_case(op("ReverseSequence", 10).i("batch_axis", 0).i("time_axis", 1),
                      {make_f32({4, 4}, x), make_i64({4}, {1, 2, 3, 4})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close(
      (*got)[0], make_f32({4, 4}, {0, 1, 2, 3, 5, 4, 6, 7, 10, 9, 8, 11, 15, 14, 13, 12}), 0, 0));
  // Example 1: time_axis 0, batch_axis 1 (the defaults), x transposed.
  std::vector<float> xt(16);
  for (int t = 0; t < 4; ++t) {
    for (int bb = 0; bb < 4; ++bb) xt[size_t(t * 4 + bb)] = float(bb * 4 + t);
  }
  got = run_case(op("ReverseSequence", 10), {make_f32({4, 4}, xt), make_i64({4}, {4, 3, 2, 1})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close(
      (*got)[0], make_f32({4, 4}, {3, 6, 9, 12, 2, 5, 8, 13, 1, 4, 10, 14, 0, 7, 11, 15}), 0, 0));
  // Lengths come from data: one past the time axis is an error, not a read out of bounds.
  got = run_case(op("ReverseSequence", 10), {make_f32({4, 4}, xt), make_i64({4}, {5, 1, 1, 1})});
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument) << got.status().to_string();
}

// CumProd on every dtype the reference takes, each axis, exclusive and reverse (CUDA: data.cu).
TEST(IndexKernel, CumProdDtypesAxesExclusiveReverse) {
  std::vector<double> v(24);
  for (int i = 0; i < 24; ++i) v[i] = (i % 5) * 0.5 - 0.75;
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
    std::vector<double> w = v;
    if (!is_float(dt)) {
      for (int i = 0; i < 24; ++i) w[i] = i % 4 - 1;
    }
    Tensor x = testing::make_typed(dt, {2, 3, 4}, w);
    for (int64_t axis : {0, 1, -1}) {
      for (int ex = 0; ex <= 1; ++ex) {
        for (int rev = 0; rev <= 1; ++rev) {
          testing::KernelCase c{
              .node = testing::op("CumProd", 26).i("exclusive", ex).i("reverse", rev),
              .inputs = {x, testing::initializer(testing::make_i64({}, {axis}))},
              .expect_support = true};
          auto r = testing::run_case(c);
          EXPECT_TRUE(r.ok()) << dtype_name(dt) << " axis " << axis << ": "
                              << r.status().to_string();
        }
      }
    }
  }
  testing::KernelCase c{.node = testing::op("CumProd", 26),
                        .inputs = {testing::make_f32({4}, {1, 2, 3, 4}),
                                   testing::initializer(testing::make_i64({}, {0}))},
                        .expected = {testing::make_f32({4}, {1, 2, 6, 24})},
                        .expect_support = true};
  EXPECT_TRUE(testing::run_case(c).ok());
}

TEST(IndexOpsKernel, ScatterNdReductionsSlicesAndDuplicates) {
  // data [4, 3]: tuples of one index replace whole rows; row 1 is named twice.
  Tensor data = make_f32({4, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  Tensor idx = make_i64({3, 1}, {1, -1, 1});
  Tensor upd = make_f32({3, 3}, {10, 20, 30, 1, 1, 1, 2, 3, 4});
  struct Want {
    const char* reduction;
    float row1[3];
  };
  for (Want w : {Want{"none", {2, 3, 4}}, Want{"add", {16, 28, 40}}, Want{"mul", {80, 300, 720}},
                 Want{"max", {10, 20, 30}}, Want{"min", {2, 3, 4}}}) {
    auto got = run_case(op("ScatterND", 18).s("reduction", w.reduction), {data, idx, upd});
    ASSERT_TRUE(got.ok()) << w.reduction << ": " << got.status().to_string();
    const float* y = (*got)[0].data_as<float>();
    for (int j = 0; j < 3; ++j) EXPECT_EQ(y[3 + j], w.row1[j]) << w.reduction << " " << j;
    EXPECT_EQ(y[0], 1.0f);
  }
  // Full-rank tuples into int64 data: single elements.
  auto got = run_case(
      op("ScatterND", 16).s("reduction", "add"),
      {make_i64({2, 2}, {1, 2, 3, 4}), make_i64({2, 2}, {0, 1, 0, 1}), make_i64({2}, {5, 7})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ((*got)[0].data_as<int64_t>()[1], 14);
}

TEST(IndexOpsKernel, ScatterOpset9IsScatterElements) {
  auto got = run_case(op("Scatter", 9).i("axis", 1),
                      {make_f32({2, 3}, {0, 0, 0, 0, 0, 0}), make_i64({2, 2}, {2, 0, 1, 1}),
                       make_f32({2, 2}, {1, 2, 3, 4})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(testing::all_close((*got)[0], make_f32({2, 3}, {2, 0, 1, 0, 4, 0})));
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(IndexKernel, GatherInFloat16AndBFloat16) {
  std::vector<float> v(3 * 4 * 5);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.13f - 4.0f;
  Tensor x = make_f32({3, 4, 5}, v);
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    for (int64_t axis : {0, 1, -1}) {
      auto r = testing::run_reduced_case({.node = op("Gather", 13).i("axis", axis),
                                          .inputs = {x, make_i64({2, 2}, {2, 0, -1, 1})},
                                          .expect_support = true},
                                         dt);
      ASSERT_TRUE(r.ok()) << "axis " << axis << ": " << r.status().to_string();
      EXPECT_EQ((*r)[0].dtype(), dt);
    }
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// ---- TensorScatter ----

TEST(IndexInfer, TensorScatterKeepsTheCacheShape) {
  const Dim b = Dim::symbol("b"), s = Dim::symbol("s");
  auto r = testing::infer_node(
      testing::op("TensorScatter", 24),
      {testing::f32({b, 2, 8, 4}), testing::f32({b, 2, s, 4}), testing::typed(DType::kInt64, {b})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 2, 8, 4]");
  auto two = [](testing::OpNode n, std::vector<Dim> cache, std::vector<Dim> upd) {
    return testing::infer_node(n, {testing::f32(cache), testing::f32(upd)});
  };
  // The batch axis, a mismatched head dim, an update longer than the cache, an unknown mode.
  EXPECT_FALSE(two(testing::op("TensorScatter", 24).i("axis", 0), {2, 8}, {2, 8}).ok());
  EXPECT_FALSE(two(testing::op("TensorScatter", 24), {2, 2, 8, 4}, {2, 3, 1, 4}).ok());
  EXPECT_FALSE(two(testing::op("TensorScatter", 24), {2, 2, 8, 4}, {2, 2, 9, 4}).ok());
  EXPECT_FALSE(two(testing::op("TensorScatter", 24).s("mode", "ring"), {2, 8, 4}, {2, 1, 4}).ok());
}

TEST(IndexKernel, TensorScatterWritesAtEachBatchsIndex) {
  using testing::make_f32;
  using testing::make_i64;
  // Cache [2, 4, 1] holding 0..7, update [2, 2, 1] of 100+; axis 1 (-2).
  Tensor cache = make_f32({2, 4, 1}, {0, 1, 2, 3, 4, 5, 6, 7});
  Tensor upd = make_f32({2, 2, 1}, {100, 101, 110, 111});
  auto node = testing::op("TensorScatter", 24);
  // Linear: batch 0 at 1..2, batch 1 at 2..3.
  auto got = testing::run_case(node, {cache, upd, make_i64({2}, {1, 2})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(
      testing::all_close((*got)[0], make_f32({2, 4, 1}, {0, 100, 101, 3, 4, 5, 110, 111}), 0, 0));
  // Without write_indices both batches write at 0.
  got = testing::run_case(node, {cache, upd});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(
      testing::all_close((*got)[0], make_f32({2, 4, 1}, {100, 101, 2, 3, 110, 111, 6, 7}), 0, 0));
  // Circular: batch 0 from 3 wraps to 0; batch 1 from 5 is 1..2.
  got = testing::run_case(testing::op("TensorScatter", 24).s("mode", "circular"),
                          {cache, upd, make_i64({2}, {3, 5})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(
      testing::all_close((*got)[0], make_f32({2, 4, 1}, {101, 1, 2, 100, 4, 110, 111, 7}), 0, 0));
  // Any dtype, and axis 2 of a rank-4 cache [1, 2, 3, 2] (heads, seq 3, 2 features).
  std::vector<int64_t> c(12, 0);
  got = testing::run_case(
      testing::op("TensorScatter", 24).i("axis", 2),
      {make_i64({1, 2, 3, 2}, c), make_i64({1, 2, 1, 2}, {1, 2, 3, 4}), make_i64({1}, {2})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(testing::all_close(
      (*got)[0], make_i64({1, 2, 3, 2}, {0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 3, 4}), 0, 0));
  // Linear writes past the cache's end, or before its start, are errors, not writes.
  for (int64_t w : {3, -1}) {
    got = testing::run_case(node, {cache, upd, make_i64({2}, {0, w})});
    ASSERT_FALSE(got.ok()) << w;
    EXPECT_NE(got.status().message().find("write_indices[1]"), std::string::npos)
        << got.status().to_string();
  }
}

}  // namespace
}  // namespace kiln
