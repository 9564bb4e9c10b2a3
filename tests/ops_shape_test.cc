// Shape ops: symbolic shape inference (Reshape -1 and divisibility, Concat, Expand, Range, ...),
// symbolic value chains (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) and the CPU kernels.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "ir/graph.h"
#include "ops/schema.h"
#include "test_util.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::all_close;
using testing::make_f32;
using testing::make_i64;
using testing::run_cpu_kernel;

// A graph that nodes are inferred into one at a time; outputs are written back to their values so
// later nodes see the earlier nodes' shapes and symbolic values.
struct Chain {
  ir::Graph g;
  std::vector<ops::Constraint> constraints;
  std::vector<int> outs;  // output value ids of the last node

  int input(DType dt, std::vector<Dim> shape, std::optional<std::vector<Dim>> value = std::nullopt) {
    int v = g.add_value("in" + std::to_string(g.values.size()));
    g.values[v].dtype = dt;
    g.values[v].shape = std::move(shape);
    g.values[v].sym_value = std::move(value);
    return v;
  }
  int constant(Tensor t) {
    int v = input(t.dtype(), std::vector<Dim>(t.shape().begin(), t.shape().end()));
    g.values[v].constant = t;
    return v;
  }
  int ints(std::vector<int64_t> v) { return constant(make_i64({int64_t(v.size())}, v)); }
  Status run(const std::string& op, std::vector<int> inputs, ir::Attributes attrs = {},
             int num_outputs = 1, int opset = 18) {
    ir::Node n;
    n.name = "n" + std::to_string(g.nodes.size());
    n.op_type = op;
    n.opset = opset;
    n.inputs = std::move(inputs);
    for (int i = 0; i < num_outputs; ++i) n.outputs.push_back(g.add_value(n.name + "_out"));
    n.attrs = std::move(attrs);
    g.nodes.push_back(n);
    const ops::OpSchema* schema = ops::find_schema(g.nodes.back());
    if (!schema) return not_found("no schema for " + op);
    ops::InferContext ctx(g, g.nodes.back(), int(g.nodes.size()) - 1, &constraints);
    KILN_RETURN_IF_ERROR(schema->infer(ctx));
    outs = g.nodes.back().outputs;
    for (size_t i = 0; i < outs.size(); ++i) {
      const auto& o = ctx.outputs()[i];
      if (!o.set) return internal_error("output " + std::to_string(i) + " was not set");
      ir::Value& v = g.values[outs[i]];
      v.dtype = o.dtype;
      v.shape = o.shape;
      v.sym_value = o.value;
    }
    return ok_status();
  }
  int out(int i = 0) const { return outs.at(i); }
  std::string shape(int i = 0) const { return ir::dims_to_string(*g.values[outs.at(i)].shape); }
  std::string value(int i = 0) const {
    const auto& v = g.values[outs.at(i)].sym_value;
    return v ? ir::dims_to_string(*v) : "unknown";
  }
  DType dtype(int i = 0) const { return g.values[outs.at(i)].dtype; }
};

ir::Attribute int_attr(int64_t v) {
  ir::Attribute a;
  a.type = ir::AttrType::kInt;
  a.i = v;
  return a;
}
ir::Attribute ints_attr(std::vector<int64_t> v) {
  ir::Attribute a;
  a.type = ir::AttrType::kInts;
  a.ints = std::move(v);
  return a;
}
ir::Attribute string_attr(std::string v) {
  ir::Attribute a;
  a.type = ir::AttrType::kString;
  a.s = std::move(v);
  return a;
}
ir::Attribute tensor_attr(Tensor t) {
  ir::Attribute a;
  a.type = ir::AttrType::kTensor;
  a.t = std::move(t);
  return a;
}
ir::Attributes attrs(std::initializer_list<std::pair<const char*, ir::Attribute>> list) {
  ir::Attributes out;
  for (const auto& [k, v] : list) out.set(k, v);
  return out;
}

ir::Node make_node(const std::string& op, ir::Attributes a = {}) {
  ir::Node n;
  n.name = "k";
  n.op_type = op;
  n.opset = 18;
  n.attrs = std::move(a);
  return n;
}

const Dim b = Dim::symbol("b");
const Dim s = Dim::symbol("s");

// ---- shape inference ----

TEST(ShapeOpsInfer, ReshapeMinusOneWithSymbolicBatch) {
  Chain c;
  int x = c.input(DType::kFloat32, {b, 197, 576});
  ASSERT_TRUE(c.run("Reshape", {x, c.ints({-1, 197, 3, 3, 64})}).ok());
  EXPECT_EQ(c.shape(), "[b, 197, 3, 3, 64]");
  // The same target with the batch taken from a symbolic value and -1 elsewhere.
  int target = c.input(DType::kInt64, {5}, std::vector<Dim>{b, -1, 3, 3, 64});
  ASSERT_TRUE(c.run("Reshape", {x, target}).ok());
  EXPECT_EQ(c.shape(), "[b, 197, 3, 3, 64]");
  EXPECT_TRUE(c.constraints.empty()) << c.constraints.size() << " constraints recorded";
}

TEST(ShapeOpsInfer, ReshapeRecordsDivisibility) {
  Chain c;
  int x = c.input(DType::kFloat32, {b, 6});
  ASSERT_TRUE(c.run("Reshape", {x, c.ints({-1, 12})}).ok());
  ASSERT_EQ(c.constraints.size(), 1u);
  const ops::Constraint& k = c.constraints[0];
  EXPECT_EQ(k.kind, ops::Constraint::Kind::kDivisible);
  EXPECT_EQ(k.a, b * 6);
  EXPECT_EQ(k.b, Dim(12));
  EXPECT_NE(k.what.find("divide"), std::string::npos) << k.what;
  // The inferred dim is 6*b/12: 2 at b = 4.
  EXPECT_EQ(c.g.values[c.out()].shape->at(0).eval({{"b", 4}}), 2);
  EXPECT_EQ(c.g.values[c.out()].shape->at(1), Dim(12));
  // On constants the check is decided at once.
  int y = c.input(DType::kFloat32, {5, 6});
  EXPECT_EQ(c.run("Reshape", {y, c.ints({-1, 12})}).code(), StatusCode::kInvalidModel);
}

TEST(ShapeOpsInfer, ReshapeZeroCopiesUnlessAllowzero) {
  Chain c;
  int x = c.input(DType::kFloat32, {b, 4, 5});
  ASSERT_TRUE(c.run("Reshape", {x, c.ints({0, 20})}).ok());
  EXPECT_EQ(c.shape(), "[b, 20]");
  int e = c.input(DType::kFloat32, {0, 4});
  ASSERT_TRUE(c.run("Reshape", {e, c.ints({4, 0})}, attrs({{"allowzero", int_attr(1)}})).ok());
  EXPECT_EQ(c.shape(), "[4, 0]");
  // Without allowzero the 0 copies dim 1 (4): 16 elements from 0 is invalid.
  EXPECT_EQ(c.run("Reshape", {e, c.ints({4, 0})}).code(), StatusCode::kInvalidModel);
  // allowzero forbids 0 together with -1.
  EXPECT_FALSE(c.run("Reshape", {e, c.ints({0, -1})}, attrs({{"allowzero", int_attr(1)}})).ok());
  EXPECT_FALSE(c.run("Reshape", {x, c.ints({-1, -1})}).ok());
  // A shape known only at run time is refused with a clear message.
  int dyn = c.input(DType::kInt64, {2});
  Status st = c.run("Reshape", {x, dyn});
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("shape"), std::string::npos);
}

TEST(ShapeOpsInfer, ConcatAddsAxisDims) {
  Chain c;
  int x = c.input(DType::kFloat32, {b, s, 8});
  int y = c.input(DType::kFloat32, {b, 1, 8});
  ASSERT_TRUE(c.run("Concat", {x, y}, attrs({{"axis", int_attr(1)}})).ok());
  EXPECT_EQ(c.shape(), "[b, s + 1, 8]");
  EXPECT_TRUE(c.constraints.empty());
  int z = c.input(DType::kFloat32, {b, 1, 4});
  EXPECT_EQ(c.run("Concat", {x, z}, attrs({{"axis", int_attr(1)}})).code(), StatusCode::kInvalidModel);
  // Different symbols must be proven equal over the profile: recorded.
  int w = c.input(DType::kFloat32, {Dim::symbol("c"), 2, 8});
  ASSERT_TRUE(c.run("Concat", {x, w}, attrs({{"axis", int_attr(-2)}})).ok());
  EXPECT_EQ(c.shape(), "[b, s + 2, 8]");
  ASSERT_EQ(c.constraints.size(), 1u);
  EXPECT_EQ(c.constraints[0].kind, ops::Constraint::Kind::kEqual);
}

TEST(ShapeOpsInfer, RangeLengthFromSymbolicValues) {
  Chain c;
  int zero = c.constant(make_i64({}, {0}));
  int one = c.constant(make_i64({}, {1}));
  int seq = c.input(DType::kInt64, {}, std::vector<Dim>{s});
  ASSERT_TRUE(c.run("Range", {zero, seq, one}).ok());
  EXPECT_EQ(c.shape(), "[s]");
  int two = c.constant(make_i64({}, {2}));
  ASSERT_TRUE(c.run("Range", {zero, seq, two}).ok());
  EXPECT_EQ(c.g.values[c.out()].shape->at(0).eval({{"s", 7}}), 4);
  // Counting down from s to 0: ceil(s / 3) elements.
  int minus3 = c.constant(make_i64({}, {-3}));
  ASSERT_TRUE(c.run("Range", {seq, zero, minus3}).ok());
  EXPECT_EQ(c.g.values[c.out()].shape->at(0).eval({{"s", 7}}), 3);
  // Constant ranges carry their values.
  ASSERT_TRUE(c.run("Range", {c.constant(make_i64({}, {10})), zero, minus3}).ok());
  EXPECT_EQ(c.shape(), "[4]");
  EXPECT_EQ(c.value(), "[10, 7, 4, 1]");
  ASSERT_TRUE(c.run("Range", {c.constant(make_i64({}, {5})), zero, one}).ok());
  EXPECT_EQ(c.shape(), "[0]");
  ASSERT_TRUE(c.run("Range", {c.constant(make_f32({}, {0})), c.constant(make_f32({}, {1})),
                              c.constant(make_f32({}, {0.3f}))})
                  .ok());
  EXPECT_EQ(c.shape(), "[4]");
  EXPECT_EQ(c.run("Range", {zero, seq, c.constant(make_i64({}, {0}))}).code(),
            StatusCode::kInvalidModel);
}

TEST(ShapeOpsInfer, SqueezeUnsqueezeFlatten) {
  Chain c;
  int x = c.input(DType::kFloat32, {b, 1, s, 1});
  ASSERT_TRUE(c.run("Squeeze", {x, c.ints({1, -1})}).ok());
  EXPECT_EQ(c.shape(), "[b, s]");
  // Attribute form of older opsets.
  ASSERT_TRUE(c.run("Squeeze", {x}, attrs({{"axes", ints_attr({3})}}), 1, 11).ok());
  EXPECT_EQ(c.shape(), "[b, 1, s]");
  EXPECT_EQ(c.run("Squeeze", {x, c.ints({2})}).ok(), true);  // s must be 1: recorded
  EXPECT_EQ(c.constraints.back().kind, ops::Constraint::Kind::kEqual);
  EXPECT_EQ(c.run("Squeeze", {x, c.ints({5})}).code(), StatusCode::kInvalidModel);
  EXPECT_EQ(c.run("Squeeze", {x}).code(), StatusCode::kUnsupported);  // no axes, symbolic dims
  int y = c.input(DType::kFloat32, {b, s});
  ASSERT_TRUE(c.run("Unsqueeze", {y, c.ints({0, -1})}).ok());
  EXPECT_EQ(c.shape(), "[1, b, s, 1]");
  ASSERT_TRUE(c.run("Unsqueeze", {y}, attrs({{"axes", ints_attr({1})}}), 1, 11).ok());
  EXPECT_EQ(c.shape(), "[b, 1, s]");
  EXPECT_FALSE(c.run("Unsqueeze", {y, c.ints({1, 1})}).ok());
  int z = c.input(DType::kFloat32, {b, 3, s, 4});
  ASSERT_TRUE(c.run("Flatten", {z}).ok());
  EXPECT_EQ(c.shape(), "[b, 12*s]");
  ASSERT_TRUE(c.run("Flatten", {z}, attrs({{"axis", int_attr(-1)}})).ok());
  EXPECT_EQ(c.shape(), "[3*b*s, 4]");
  ASSERT_TRUE(c.run("Flatten", {z}, attrs({{"axis", int_attr(0)}})).ok());
  EXPECT_EQ(c.shape(), "[1, 12*b*s]");
}

TEST(ShapeOpsInfer, ShapeSizeAndSymbolicChain) {
  Chain c;
  int x = c.input(DType::kFloat32, {b, 3, 224, 224});
  ASSERT_TRUE(c.run("Shape", {x}).ok());
  EXPECT_EQ(c.dtype(), DType::kInt64);
  EXPECT_EQ(c.shape(), "[4]");
  EXPECT_EQ(c.value(), "[b, 3, 224, 224]");
  int shape = c.out();
  ASSERT_TRUE(c.run("Gather", {shape, c.constant(make_i64({}, {0}))}).ok());
  EXPECT_EQ(c.shape(), "[]");
  EXPECT_EQ(c.value(), "[b]");
  ASSERT_TRUE(c.run("Unsqueeze", {c.out(), c.ints({0})}).ok());
  EXPECT_EQ(c.shape(), "[1]");
  EXPECT_EQ(c.value(), "[b]");
  ASSERT_TRUE(c.run("Concat", {c.out(), c.ints({-1, 192})}, attrs({{"axis", int_attr(0)}})).ok());
  EXPECT_EQ(c.shape(), "[3]");
  EXPECT_EQ(c.value(), "[b, -1, 192]");
  int target = c.out();
  int tokens = c.input(DType::kFloat32, {b, 197, 768});
  ASSERT_TRUE(c.run("Reshape", {tokens, target}).ok());
  EXPECT_EQ(c.shape(), "[b, 788, 192]");
  // Shape with start/end, then Size.
  ASSERT_TRUE(c.run("Shape", {x}, attrs({{"start", int_attr(-2)}})).ok());
  EXPECT_EQ(c.value(), "[224, 224]");
  ASSERT_TRUE(c.run("Shape", {x}, attrs({{"start", int_attr(1)}, {"end", int_attr(-1)}})).ok());
  EXPECT_EQ(c.value(), "[3, 224]");
  ASSERT_TRUE(c.run("Size", {x}).ok());
  EXPECT_EQ(c.shape(), "[]");
  EXPECT_EQ(c.value(), "[150528*b]");
  // Squeeze of a one-element Shape keeps the value.
  int v = c.input(DType::kFloat32, {s});
  ASSERT_TRUE(c.run("Shape", {v}).ok());
  ASSERT_TRUE(c.run("Squeeze", {c.out()}).ok());
  EXPECT_EQ(c.shape(), "[]");
  EXPECT_EQ(c.value(), "[s]");
}

TEST(ShapeOpsInfer, ExpandTileTranspose) {
  Chain c;
  int x = c.input(DType::kFloat32, {b, 1, 8});
  int target = c.input(DType::kInt64, {3}, std::vector<Dim>{1, s, 1});
  ASSERT_TRUE(c.run("Expand", {x, target}).ok());
  EXPECT_EQ(c.shape(), "[b, s, 8]");
  ASSERT_TRUE(c.run("Expand", {x, c.ints({2, 1, 1, 1})}).ok());
  EXPECT_EQ(c.shape(), "[2, b, 1, 8]");
  EXPECT_EQ(c.run("Expand", {x, c.ints({3, 4})}).code(), StatusCode::kInvalidModel);
  // Values: Expand and Tile of a known shape vector.
  int v = c.input(DType::kInt64, {2}, std::vector<Dim>{b, 7});
  ASSERT_TRUE(c.run("Expand", {c.input(DType::kInt64, {1}, std::vector<Dim>{s}), c.ints({3})}).ok());
  EXPECT_EQ(c.value(), "[s, s, s]");
  ASSERT_TRUE(c.run("Tile", {v, c.ints({2})}).ok());
  EXPECT_EQ(c.value(), "[b, 7, b, 7]");
  ASSERT_TRUE(c.run("Tile", {x, c.ints({1, 3, 2})}).ok());
  EXPECT_EQ(c.shape(), "[b, 3, 16]");
  int y = c.input(DType::kFloat32, {b, 197, 3, 3, 64});
  ASSERT_TRUE(c.run("Transpose", {y}, attrs({{"perm", ints_attr({2, 0, 3, 1, 4})}})).ok());
  EXPECT_EQ(c.shape(), "[3, b, 3, 197, 64]");
  ASSERT_TRUE(c.run("Transpose", {y}).ok());
  EXPECT_EQ(c.shape(), "[64, 3, 3, 197, b]");
  EXPECT_FALSE(c.run("Transpose", {y}, attrs({{"perm", ints_attr({0, 0, 1, 2, 3})}})).ok());
  int m = c.input(DType::kInt64, {2, 2}, std::vector<Dim>{1, 2, 3, 4});
  ASSERT_TRUE(c.run("Transpose", {m}).ok());
  EXPECT_EQ(c.value(), "[1, 3, 2, 4]");
}

TEST(ShapeOpsInfer, ConstantOfShapeAndConstant) {
  Chain c;
  ASSERT_TRUE(c.run("ConstantOfShape", {c.input(DType::kInt64, {2}, std::vector<Dim>{b, 4})}).ok());
  EXPECT_EQ(c.shape(), "[b, 4]");
  EXPECT_EQ(c.dtype(), DType::kFloat32);
  ASSERT_TRUE(c.run("ConstantOfShape", {c.ints({3})},
                    attrs({{"value", tensor_attr(make_i64({1}, {7}))}}))
                  .ok());
  EXPECT_EQ(c.dtype(), DType::kInt64);
  EXPECT_EQ(c.value(), "[7, 7, 7]");
  EXPECT_EQ(c.run("ConstantOfShape", {c.ints({-2})}).code(), StatusCode::kInvalidModel);
  ASSERT_TRUE(c.run("Constant", {}, attrs({{"value_ints", ints_attr({4, 5})}})).ok());
  EXPECT_EQ(c.shape(), "[2]");
  EXPECT_EQ(c.value(), "[4, 5]");
  ASSERT_TRUE(c.run("Constant", {}, attrs({{"value", tensor_attr(make_f32({2, 3}, {1, 2, 3, 4, 5, 6}))}}))
                  .ok());
  EXPECT_EQ(c.shape(), "[2, 3]");
  EXPECT_EQ(c.value(), "unknown");
  EXPECT_EQ(c.run("Constant", {}).code(), StatusCode::kUnsupported);
}

TEST(ShapeOpsInfer, SplitVariants) {
  Chain c;
  int x = c.input(DType::kFloat32, {b, 12});
  ASSERT_TRUE(c.run("Split", {x, c.ints({4, 8})}, attrs({{"axis", int_attr(1)}}), 2).ok());
  EXPECT_EQ(c.shape(0), "[b, 4]");
  EXPECT_EQ(c.shape(1), "[b, 8]");
  EXPECT_EQ(c.run("Split", {x, c.ints({4, 4})}, attrs({{"axis", int_attr(1)}}), 2).code(),
            StatusCode::kInvalidModel);
  ASSERT_TRUE(c.run("Split", {x}, attrs({{"axis", int_attr(1)}, {"split", ints_attr({2, 10})}}), 2, 11)
                  .ok());
  EXPECT_EQ(c.shape(1), "[b, 10]");
  ASSERT_TRUE(c.run("Split", {x}, attrs({{"axis", int_attr(-1)}}), 3).ok());
  EXPECT_EQ(c.shape(2), "[b, 4]");
  int y = c.input(DType::kFloat32, {10});
  ASSERT_TRUE(c.run("Split", {y}, attrs({{"num_outputs", int_attr(3)}}), 3).ok());
  EXPECT_EQ(c.shape(0), "[4]");
  EXPECT_EQ(c.shape(2), "[2]");
  EXPECT_EQ(c.run("Split", {y}, {}, 3).code(), StatusCode::kInvalidModel);  // 10 / 3 uneven
  // Values of a split shape vector.
  ASSERT_TRUE(c.run("Split", {c.input(DType::kInt64, {3}, std::vector<Dim>{b, s, 5}), c.ints({1, 2})}, {}, 2)
                  .ok());
  EXPECT_EQ(c.value(0), "[b]");
  EXPECT_EQ(c.value(1), "[s, 5]");
}

TEST(ShapeOpsInfer, PadAndTrilu) {
  Chain c;
  int x = c.input(DType::kFloat32, {b, 3, s});
  ASSERT_TRUE(c.run("Pad", {x, c.ints({0, 1, 2, 0, 1, 3})}).ok());
  EXPECT_EQ(c.shape(), "[b, 5, s + 5]");
  ASSERT_TRUE(c.run("Pad", {x, c.ints({1, 1}), c.constant(make_f32({}, {0})), c.ints({-1})}).ok());
  EXPECT_EQ(c.shape(), "[b, 3, s + 2]");
  ASSERT_TRUE(c.run("Pad", {x}, attrs({{"pads", ints_attr({0, 0, 0, 0, -1, 0})}}), 1, 2).ok());
  EXPECT_EQ(c.shape(), "[b, 2, s]");
  EXPECT_EQ(c.run("Pad", {x, c.ints({1, 1})}).code(), StatusCode::kInvalidModel);
  EXPECT_EQ(c.run("Pad", {x, c.ints({0, -4, 0, 0, 0, 0})}).code(), StatusCode::kInvalidModel);
  EXPECT_EQ(c.run("Pad", {x, c.ints({0, 0, 0, 0, 0, 0})}, attrs({{"mode", string_attr("foo")}})).code(),
            StatusCode::kUnsupported);
  ASSERT_TRUE(c.run("Trilu", {x}).ok());
  EXPECT_EQ(c.shape(), "[b, 3, s]");
  EXPECT_FALSE(c.run("Trilu", {c.input(DType::kFloat32, {4})}).ok());
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
  for (auto [shape, perm] : std::vector<std::pair<Shape, std::vector<int64_t>>>{
           {{2, 3, 4, 5}, {0, 2, 1, 3}},
           {{3, 40, 50}, {0, 2, 1}},
           {{2, 7, 3, 3, 4}, {2, 0, 3, 1, 4}},
           {{2, 1, 3}, {2, 1, 0}},
           {{5, 6}, {1, 0}},
           {{4, 1, 6, 1}, {3, 1, 0, 2}}}) {
    Tensor x = iota_f32(shape);
    Tensor want = transpose_reference(x, perm);
    auto got = run_cpu_kernel(make_node("Transpose", attrs({{"perm", ints_attr(perm)}})), {x},
                              {{DType::kFloat32, want.shape()}});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(all_close((*got)[0], want, 0, 0)) << shape_to_string(shape);
  }
  // Another element size: int64 with the default (reversed) perm.
  auto got = run_cpu_kernel(make_node("Transpose"), {make_i64({2, 3}, {1, 2, 3, 4, 5, 6})},
                            {{DType::kInt64, {3, 2}}});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_i64({3, 2}, {1, 4, 2, 5, 3, 6}), 0, 0));
  // Zero-size.
  got = run_cpu_kernel(make_node("Transpose"), {make_f32({0, 3}, {})}, {{DType::kFloat32, {3, 0}}});
  EXPECT_TRUE(got.ok());
}

TEST(ShapeOpsKernel, ConcatSplitAcrossDtypes) {
  Tensor a = make_f32({2, 1}, {1, 2});
  Tensor b2 = make_f32({2, 2}, {3, 4, 5, 6});
  Tensor empty = make_f32({2, 0}, {});
  auto got = run_cpu_kernel(make_node("Concat", attrs({{"axis", int_attr(1)}})), {a, empty, b2},
                            {{DType::kFloat32, {2, 3}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 3}, {1, 3, 4, 2, 5, 6}), 0, 0));
  // uint8 along axis 0.
  Tensor u = Tensor::from_vector(DType::kUInt8, {2}, std::vector<uint8_t>{7, 8});
  Tensor v = Tensor::from_vector(DType::kUInt8, {1}, std::vector<uint8_t>{9});
  got = run_cpu_kernel(make_node("Concat", attrs({{"axis", int_attr(0)}})), {u, v}, {{DType::kUInt8, {3}}});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].int_at(2), 9);
  EXPECT_EQ((*got)[0].int_at(1), 8);
  // Split [2, 3] into [2, 1] and [2, 2] along axis 1.
  got = run_cpu_kernel(make_node("Split", attrs({{"axis", int_attr(1)}})),
                       {make_f32({2, 3}, {1, 2, 3, 4, 5, 6}), make_i64({2}, {1, 2})},
                       {{DType::kFloat32, {2, 1}}, {DType::kFloat32, {2, 2}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 1}, {1, 4}), 0, 0));
  EXPECT_TRUE(all_close((*got)[1], make_f32({2, 2}, {2, 3, 5, 6}), 0, 0));
}

TEST(ShapeOpsKernel, ExpandAndTile) {
  auto got = run_cpu_kernel(make_node("Expand"), {make_f32({3, 1}, {1, 2, 3}), make_i64({3}, {2, 1, 2})},
                            {{DType::kFloat32, {2, 3, 2}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 3, 2}, {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}), 0, 0));
  got = run_cpu_kernel(make_node("Tile"), {make_i64({2, 2}, {1, 2, 3, 4}), make_i64({2}, {2, 2})},
                       {{DType::kInt64, {4, 4}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_i64({4, 4}, {1, 2, 1, 2, 3, 4, 3, 4, 1, 2, 1, 2, 3, 4, 3, 4}), 0, 0));
  // A bool tensor (1-byte elements) and a zero-size expand.
  Tensor t = Tensor::from_vector(DType::kBool, {1, 2}, std::vector<uint8_t>{1, 0});
  got = run_cpu_kernel(make_node("Expand"), {t, make_i64({2}, {3, 1})}, {{DType::kBool, {3, 2}}});
  ASSERT_TRUE(got.ok());
  for (int i = 0; i < 6; ++i) EXPECT_EQ((*got)[0].int_at(i), i % 2 == 0 ? 1 : 0);
  got = run_cpu_kernel(make_node("Expand"), {make_f32({1}, {5}), make_i64({2}, {0, 1})},
                       {{DType::kFloat32, {0, 1}}});
  EXPECT_TRUE(got.ok());
}

TEST(ShapeOpsKernel, PadModesMatchNumpy) {
  Tensor x = make_f32({3}, {1, 2, 3});
  std::vector<std::pair<std::string, std::vector<float>>> cases = {
      {"constant", {9, 9, 1, 2, 3, 9, 9}},
      {"reflect", {3, 2, 1, 2, 3, 2, 1}},
      {"edge", {1, 1, 1, 2, 3, 3, 3}},
      {"wrap", {2, 3, 1, 2, 3, 1, 2}},
  };
  for (const auto& [mode, want] : cases) {
    auto got = run_cpu_kernel(make_node("Pad", attrs({{"mode", string_attr(mode)}})),
                              {x, make_i64({2}, {2, 2}), make_f32({}, {9})}, {{DType::kFloat32, {7}}});
    ASSERT_TRUE(got.ok()) << mode << ": " << got.status().to_string();
    EXPECT_TRUE(all_close((*got)[0], make_f32({7}, want), 0, 0)) << mode;
  }
  // 2-D with a negative (cropping) pad and an axes input.
  auto got = run_cpu_kernel(make_node("Pad"),
                            {make_f32({2, 3}, {1, 2, 3, 4, 5, 6}), make_i64({2}, {1, -1}), Tensor(),
                             make_i64({1}, {1})},
                            {{DType::kFloat32, {2, 3}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 3}, {0, 1, 2, 0, 4, 5}), 0, 0));
  // Padding an empty tensor with a constant.
  got = run_cpu_kernel(make_node("Pad"), {make_f32({0}, {}), make_i64({2}, {1, 1}), make_f32({}, {4})},
                       {{DType::kFloat32, {2}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2}, {4, 4}), 0, 0));
}

TEST(ShapeOpsKernel, TriluRangeConstants) {
  Tensor m = iota_f32({3, 4});
  auto got = run_cpu_kernel(make_node("Trilu"), {m}, {{DType::kFloat32, {3, 4}}});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_f32({3, 4}, {1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12}), 0, 0));
  got = run_cpu_kernel(make_node("Trilu", attrs({{"upper", int_attr(0)}})), {m, make_i64({}, {-1})},
                       {{DType::kFloat32, {3, 4}}});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_f32({3, 4}, {0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0}), 0, 0));
  got = run_cpu_kernel(make_node("Trilu"), {m, make_i64({}, {std::numeric_limits<int64_t>::max()})},
                       {{DType::kFloat32, {3, 4}}});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].float_at(3), 0);  // everything cleared, no overflow

  got = run_cpu_kernel(make_node("Range"), {make_i64({}, {10}), make_i64({}, {0}), make_i64({}, {-3})},
                       {{DType::kInt64, {4}}});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_i64({4}, {10, 7, 4, 1}), 0, 0));
  got = run_cpu_kernel(make_node("Range"), {make_f32({}, {0.5f}), make_f32({}, {2}), make_f32({}, {0.5f})},
                       {{DType::kFloat32, {3}}});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_f32({3}, {0.5f, 1, 1.5f}), 0, 0));

  got = run_cpu_kernel(make_node("ConstantOfShape", attrs({{"value", tensor_attr(make_i64({1}, {3}))}})),
                       {make_i64({2}, {2, 2})}, {{DType::kInt64, {2, 2}}});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_i64({2, 2}, {3, 3, 3, 3}), 0, 0));
  got = run_cpu_kernel(make_node("Constant", attrs({{"value_ints", ints_attr({4, 5, 6})}})), {},
                       {{DType::kInt64, {3}}});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_i64({3}, {4, 5, 6}), 0, 0));
}

// Range-27: float16/bfloat16 ranges compute start + i * delta in the stash type (float by
// default, or double), not by adding delta in the half type, where 2048 + 1 == 2048 forever.
TEST(ShapeOpsKernel, RangeHalfUsesTheStashType) {
  auto h = [](float f) {
    return Tensor::from_vector(DType::kFloat16, {}, std::vector<uint16_t>{float_to_half(f)});
  };
  for (int64_t stash : {int64_t(1), int64_t(11)}) {
    auto got = run_cpu_kernel(make_node("Range", attrs({{"stash_type", int_attr(stash)}})),
                              {h(2048), h(2052), h(1)}, {{DType::kFloat16, {4}}});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    const uint16_t* o = (*got)[0].data_as<uint16_t>();
    // 2049 and 2051 are not float16 values; each rounds to even, once.
    const float want[] = {2048, 2048, 2050, 2052};
    for (int i = 0; i < 4; ++i) EXPECT_EQ(half_to_float(o[i]), want[i]) << stash << " " << i;
  }
  Chain c;
  int start = c.constant(h(0)), limit = c.constant(h(3)), delta = c.constant(h(1));
  ASSERT_TRUE(c.run("Range", {start, limit, delta}, {}, 1, 27).ok());
  EXPECT_EQ(c.shape(), "[3]");
  EXPECT_EQ(c.dtype(), DType::kFloat16);
  EXPECT_EQ(
      c.run("Range", {start, limit, delta}, attrs({{"stash_type", int_attr(10)}}), 1, 27).code(),
      StatusCode::kInvalidModel);
}

TEST(ShapeOpsKernel, ShapeSizeAndReshapeCopies) {
  Tensor x = iota_f32({2, 3, 4});
  auto got = run_cpu_kernel(make_node("Shape", attrs({{"start", int_attr(1)}})), {x}, {{DType::kInt64, {2}}});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_i64({2}, {3, 4}), 0, 0));
  got = run_cpu_kernel(make_node("Size"), {x}, {{DType::kInt64, {}}});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].int_at(0), 24);
  got = run_cpu_kernel(make_node("Reshape"), {x, make_i64({2}, {6, -1})}, {{DType::kFloat32, {6, 4}}});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], iota_f32({6, 4}), 0, 0));
  got = run_cpu_kernel(make_node("Flatten"), {x}, {{DType::kFloat32, {2, 10}}});
  EXPECT_FALSE(got.ok());  // 20 elements cannot hold 24
}

}  // namespace
}  // namespace kiln
