// Spatial ops: GridSample, AffineGrid, CenterCropPad, Einsum, DFT and BitCast shape inference
// (symbolic dims, errors) and one CPU kernel value check each.
#include <gtest/gtest.h>

#include <cmath>

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

struct Case {
  ir::Graph g;
  std::vector<ops::Constraint> constraints;
  std::vector<ops::InferContext::Output> outputs;

  int input(DType dt, std::vector<Dim> shape) {
    int v = g.add_value("in" + std::to_string(g.values.size()));
    g.values[v].dtype = dt;
    g.values[v].shape = std::move(shape);
    return v;
  }
  int ints(std::vector<int64_t> v) {
    int id = input(DType::kInt64, {int64_t(v.size())});
    g.values[id].constant = make_i64({int64_t(v.size())}, v);
    return id;
  }
  Status run(const std::string& op, std::vector<int> inputs, ir::Attributes attrs = {},
             int opset = 20) {
    ir::Node n;
    n.name = "n0";
    n.op_type = op;
    n.opset = opset;
    n.inputs = std::move(inputs);
    n.outputs = {g.add_value("out")};
    n.attrs = std::move(attrs);
    g.nodes.push_back(n);
    const ops::OpSchema* schema = ops::find_schema(g.nodes.back());
    if (!schema) return not_found("no schema for " + op);
    ops::InferContext ctx(g, g.nodes.back(), 0, &constraints);
    KILN_RETURN_IF_ERROR(schema->infer(ctx));
    outputs = ctx.outputs();
    return ok_status();
  }
  std::string shape() const { return ir::dims_to_string(outputs.at(0).shape); }
};

ir::Attribute int_attr(int64_t v) {
  ir::Attribute a;
  a.type = ir::AttrType::kInt;
  a.i = v;
  return a;
}
ir::Attribute str_attr(std::string v) {
  ir::Attribute a;
  a.type = ir::AttrType::kString;
  a.s = std::move(v);
  return a;
}
ir::Attributes attrs(std::initializer_list<std::pair<const char*, ir::Attribute>> list) {
  ir::Attributes out;
  for (const auto& [k, v] : list) out.set(k, v);
  return out;
}
ir::Node make_node(const std::string& op, ir::Attributes a = {}, int opset = 20) {
  ir::Node n;
  n.name = "k";
  n.op_type = op;
  n.opset = opset;
  n.attrs = std::move(a);
  return n;
}

TEST(SpatialOps, GridSampleShapeAndBilinear) {
  Case c;
  Dim n = Dim::symbol("N");
  int x = c.input(DType::kFloat32, {n, 3, 4, 5});
  int grid = c.input(DType::kFloat32, {n, 6, 7, 2});
  ASSERT_TRUE(c.run("GridSample", {x, grid}).ok());
  EXPECT_EQ(c.shape(), "[N, 3, 6, 7]");
  Case bad;
  int x2 = bad.input(DType::kFloat32, {1, 1, 4, 4});
  int g2 = bad.input(DType::kFloat32, {1, 2, 2, 3});
  EXPECT_FALSE(bad.run("GridSample", {x2, g2}).ok());  // last grid dim must be 2

  // align_corners=1: (-1,-1) is pixel (0,0), (1,1) is (1,1), (0,0) the mean of all four.
  Tensor img = make_f32({1, 1, 2, 2}, {1, 2, 3, 4});
  Tensor g = make_f32({1, 1, 3, 2}, {-1, -1, 1, 1, 0, 0});
  auto got = run_cpu_kernel(make_node("GridSample", attrs({{"align_corners", int_attr(1)}})),
                            {img, g}, {{DType::kFloat32, {1, 1, 1, 3}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({1, 1, 1, 3}, {1, 4, 2.5f}), 1e-6, 0));
  // Zeros padding: far outside reads 0.
  got = run_cpu_kernel(make_node("GridSample", attrs({{"mode", str_attr("nearest")}})),
                       {img, make_f32({1, 1, 1, 2}, {5, 5})}, {{DType::kFloat32, {1, 1, 1, 1}}});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_f32({1, 1, 1, 1}, {0}), 0, 0));
}

TEST(SpatialOps, AffineGridShapeAndIdentity) {
  Case c;
  int theta = c.input(DType::kFloat32, {2, 2, 3});
  int size = c.ints({2, 3, 4, 5});
  ASSERT_TRUE(c.run("AffineGrid", {theta, size}).ok());
  EXPECT_EQ(c.shape(), "[2, 4, 5, 2]");
  Case bad;
  EXPECT_FALSE(bad.run("AffineGrid", {bad.input(DType::kFloat32, {2, 3, 4}),
                                      bad.ints({2, 3, 4, 5})}).ok());

  Tensor id = make_f32({1, 2, 3}, {1, 0, 0, 0, 1, 0});
  auto got = run_cpu_kernel(make_node("AffineGrid", attrs({{"align_corners", int_attr(1)}})),
                            {id, make_i64({4}, {1, 1, 2, 2})}, {{DType::kFloat32, {1, 2, 2, 2}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({1, 2, 2, 2}, {-1, -1, 1, -1, -1, 1, 1, 1}), 1e-6, 0));
}

TEST(SpatialOps, CenterCropPadShapeAndValues) {
  Case c;
  Dim b = Dim::symbol("B");
  int x = c.input(DType::kFloat32, {b, 10, 7});
  ir::Attribute axes;
  axes.type = ir::AttrType::kInts;
  axes.ints = {-2, -1};
  ASSERT_TRUE(c.run("CenterCropPad", {x, c.ints({5, 9})}, attrs({{"axes", axes}}), 18).ok());
  EXPECT_EQ(c.shape(), "[B, 5, 9]");
  Case bad;
  EXPECT_FALSE(bad.run("CenterCropPad", {bad.input(DType::kFloat32, {4, 4}), bad.ints({2})}, {},
                       18).ok());  // one shape value for two axes

  // Crop 4 -> 2 along dim 0 (start 1), pad 1 -> 3 along dim 1 (one zero each side).
  auto got = run_cpu_kernel(make_node("CenterCropPad", {}, 18),
                            {make_f32({4, 1}, {1, 2, 3, 4}), make_i64({2}, {2, 3})},
                            {{DType::kFloat32, {2, 3}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 3}, {0, 2, 0, 0, 3, 0}), 0, 0));
}

TEST(SpatialOps, EinsumShapesAndValues) {
  Case c;
  Dim n = Dim::symbol("N");
  int a = c.input(DType::kFloat32, {n, 2, 3});
  int b = c.input(DType::kFloat32, {n, 3, 4});
  ASSERT_TRUE(c.run("Einsum", {a, b}, attrs({{"equation", str_attr("...ij,...jk->...ik")}})).ok());
  EXPECT_EQ(c.shape(), "[N, 2, 4]");
  Case implicit;
  int m = implicit.input(DType::kFloat32, {3, 5});
  ASSERT_TRUE(implicit.run("Einsum", {m}, attrs({{"equation", str_attr("ji")}})).ok());
  EXPECT_EQ(implicit.shape(), "[5, 3]");  // implicit output: letters in alphabetical order
  Case bad;
  int p = bad.input(DType::kFloat32, {2, 3});
  int q = bad.input(DType::kFloat32, {4, 5});
  EXPECT_FALSE(bad.run("Einsum", {p, q}, attrs({{"equation", str_attr("ij,jk")}})).ok());

  // Batch diagonal and a matmul.
  auto got = run_cpu_kernel(make_node("Einsum", attrs({{"equation", str_attr("...ii->...i")}})),
                            {make_f32({1, 2, 2}, {1, 2, 3, 4})}, {{DType::kFloat32, {1, 2}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({1, 2}, {1, 4}), 0, 0));
  got = run_cpu_kernel(make_node("Einsum", attrs({{"equation", str_attr("ij,jk->ik")}})),
                       {make_f32({1, 2}, {1, 2}), make_f32({2, 2}, {1, 2, 3, 4})},
                       {{DType::kFloat32, {1, 2}}});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_f32({1, 2}, {7, 10}), 0, 0));
}

TEST(SpatialOps, DftShapesAndValues) {
  Case c;
  Dim n = Dim::symbol("N");
  int x = c.input(DType::kFloat32, {n, 8, 1});
  ASSERT_TRUE(c.run("DFT", {x}, attrs({{"onesided", int_attr(1)}}), 17).ok());
  EXPECT_EQ(c.shape(), "[N, 5, 2]");
  Case axis20;
  int y = axis20.input(DType::kFloat32, {3, 8, 6, 2});
  ASSERT_TRUE(axis20.run("DFT", {y, -1, axis20.ints({1})}, {}, 20).ok());
  EXPECT_EQ(axis20.shape(), "[3, 8, 6, 2]");
  Case bad;
  EXPECT_FALSE(bad.run("DFT", {bad.input(DType::kFloat32, {4, 3})}, {}, 17).ok());

  // DFT of [1, 0, 0, 0] is all ones; of [1, 1, 1, 1] is [4, 0, 0, 0].
  auto got = run_cpu_kernel(make_node("DFT", {}, 17),
                            {make_f32({2, 4, 1}, {1, 0, 0, 0, 1, 1, 1, 1})},
                            {{DType::kFloat32, {2, 4, 2}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0],
                        make_f32({2, 4, 2}, {1, 0, 1, 0, 1, 0, 1, 0, 4, 0, 0, 0, 0, 0, 0, 0}),
                        1e-6, 0));
}

TEST(SpatialOps, BitCast) {
  Case c;
  int x = c.input(DType::kFloat32, {Dim::symbol("N")});
  ASSERT_TRUE(c.run("BitCast", {x}, attrs({{"to", int_attr(6)}})).ok());  // int32
  EXPECT_EQ(c.outputs.at(0).dtype, DType::kInt32);
  Case bad;
  EXPECT_FALSE(bad.run("BitCast", {bad.input(DType::kFloat32, {2})},
                       attrs({{"to", int_attr(7)}})).ok());  // int64: size differs
  auto got = run_cpu_kernel(make_node("BitCast", attrs({{"to", int_attr(6)}})),
                            {make_f32({1}, {1.0f})}, {{DType::kInt32, {1}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ((*got)[0].data_as<int32_t>()[0], 0x3f800000);
}

}  // namespace
}  // namespace kiln
