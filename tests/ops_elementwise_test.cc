// Elementwise ops: symbolic broadcasting and dtype rules, folding of small integer values, and the
// CPU reference kernels (broadcast paths, dtypes, zero-size tensors) against hand-computed results.
#include <gtest/gtest.h>

#include <cmath>
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

// A one-node graph whose node is inferred with the real schema.
struct InferCase {
  ir::Graph g;
  std::vector<ops::Constraint> constraints;
  std::vector<ops::InferContext::Output> outputs;

  int input(DType dt, std::vector<Dim> shape,
            std::optional<std::vector<Dim>> value = std::nullopt) {
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
  Status run(const std::string& op, std::vector<int> inputs, ir::Attributes attrs = {},
             int opset = 17) {
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
  std::string value() const {
    return outputs.at(0).value ? ir::dims_to_string(*outputs.at(0).value) : "unknown";
  }
};

ir::Attribute int_attr(int64_t v) {
  ir::Attribute a;
  a.type = ir::AttrType::kInt;
  a.i = v;
  return a;
}
ir::Attribute float_attr(float v) {
  ir::Attribute a;
  a.type = ir::AttrType::kFloat;
  a.f = v;
  return a;
}
ir::Attribute string_attr(std::string v) {
  ir::Attribute a;
  a.type = ir::AttrType::kString;
  a.s = std::move(v);
  return a;
}

ir::Node make_node(const std::string& op, ir::Attributes attrs = {}) {
  ir::Node n;
  n.name = "k";
  n.op_type = op;
  n.opset = 17;
  n.attrs = std::move(attrs);
  return n;
}

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
  {
    InferCase c;
    int x = c.input(DType::kFloat32, {b, 197, 192});
    int y = c.input(DType::kFloat32, {192});
    ASSERT_TRUE(c.run("Add", {x, y}).ok());
    EXPECT_EQ(c.shape(), "[b, 197, 192]");
    EXPECT_EQ(c.outputs[0].dtype, DType::kFloat32);
    EXPECT_EQ(c.value(), "unknown");
  }
  {
    InferCase c;
    int x = c.input(DType::kFloat32, {b, 1});
    int y = c.input(DType::kFloat32, {1, s});
    ASSERT_TRUE(c.run("Mul", {x, y}).ok());
    EXPECT_EQ(c.shape(), "[b, s]");
  }
  {
    InferCase c;
    int x = c.input(DType::kFloat32, {b, 4, s, s});
    int y = c.input(DType::kFloat32, {1, 1, s, s});
    ASSERT_TRUE(c.run("Add", {x, y}).ok());
    EXPECT_EQ(c.shape(), "[b, 4, s, s]");
    EXPECT_TRUE(c.constraints.empty());  // equal dims need no runtime proof
  }
  {
    InferCase c;  // b vs s must be proven compatible over the profile
    int x = c.input(DType::kFloat32, {b});
    int y = c.input(DType::kFloat32, {s});
    ASSERT_TRUE(c.run("Sub", {x, y}).ok());
    EXPECT_EQ(c.constraints.size(), 1u);
  }
}

TEST(ElementwiseInfer, IncompatibleConstantsFail) {
  InferCase c;
  int x = c.input(DType::kFloat32, {3});
  int y = c.input(DType::kFloat32, {4});
  Status s = c.run("Add", {x, y});
  EXPECT_EQ(s.code(), StatusCode::kInvalidModel);
  EXPECT_NE(s.message().find("n0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("broadcast"), std::string::npos) << s.message();
}

TEST(ElementwiseInfer, DtypeRules) {
  {
    InferCase c;
    int x = c.input(DType::kFloat32, {2});
    int y = c.input(DType::kInt64, {2});
    Status s = c.run("Add", {x, y});
    EXPECT_EQ(s.code(), StatusCode::kInvalidModel);
    EXPECT_NE(s.message().find("input 1"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("int64"), std::string::npos) << s.message();
  }
  {
    InferCase c;
    int x = c.input(DType::kFloat16, {Dim::symbol("n")});
    int y = c.input(DType::kFloat16, {1});
    ASSERT_TRUE(c.run("Less", {x, y}).ok());
    EXPECT_EQ(c.outputs[0].dtype, DType::kBool);
    EXPECT_EQ(c.shape(), "[n]");
  }
  {
    InferCase c;
    int x = c.input(DType::kFloat32, {2});
    ASSERT_TRUE(c.run("IsInf", {x}).ok());
    EXPECT_EQ(c.outputs[0].dtype, DType::kBool);
  }
  {
    InferCase c;
    int x = c.input(DType::kFloat32, {2});
    int y = c.input(DType::kFloat32, {2});
    EXPECT_EQ(c.run("And", {x, y}).code(), StatusCode::kInvalidModel);
  }
  {
    InferCase c;
    int x = c.input(DType::kInt64, {2});
    EXPECT_EQ(c.run("Sqrt", {x}).code(), StatusCode::kInvalidModel);
  }
  {
    InferCase c;  // Pow's exponent may have another dtype; the output follows the base
    int x = c.input(DType::kFloat32, {2, 3});
    int y = c.input(DType::kInt64, {});
    ASSERT_TRUE(c.run("Pow", {x, y}).ok());
    EXPECT_EQ(c.outputs[0].dtype, DType::kFloat32);
    EXPECT_EQ(c.shape(), "[2, 3]");
  }
  {
    InferCase c;
    int cond = c.input(DType::kBool, {Dim::symbol("b"), 1});
    int x = c.input(DType::kFloat32, {1, 5});
    int y = c.input(DType::kFloat32, {});
    ASSERT_TRUE(c.run("Where", {cond, x, y}).ok());
    EXPECT_EQ(c.shape(), "[b, 5]");
    EXPECT_EQ(c.outputs[0].dtype, DType::kFloat32);
  }
  {
    InferCase c;
    int cond = c.input(DType::kInt64, {2});
    int x = c.input(DType::kFloat32, {2});
    EXPECT_EQ(c.run("Where", {cond, x, x}).code(), StatusCode::kInvalidModel);
  }
  {
    InferCase c;
    int x = c.input(DType::kFloat32, {2});
    // Floats need fmod=1 before opset 28.
    EXPECT_EQ(c.run("Mod", {x, x}).code(), StatusCode::kInvalidModel);
  }
}

TEST(ElementwiseInfer, CastAndClip) {
  {
    InferCase c;
    int x = c.input(DType::kFloat32, {Dim::symbol("b"), 3});
    ir::Attributes a;
    a.set("to", int_attr(7));
    ASSERT_TRUE(c.run("Cast", {x}, a).ok());
    EXPECT_EQ(c.outputs[0].dtype, DType::kInt64);
    EXPECT_EQ(c.shape(), "[b, 3]");
  }
  {
    InferCase c;
    int x = c.input(DType::kFloat32, {3});
    EXPECT_EQ(c.run("Cast", {x}).code(), StatusCode::kInvalidModel);  // `to` is required
  }
  {
    InferCase c;
    int x = c.input(DType::kFloat32, {3});
    ir::Attributes a;
    a.set("to", int_attr(8));  // string
    EXPECT_EQ(c.run("Cast", {x}, a).code(), StatusCode::kUnsupported);
  }
  {
    InferCase c;
    int x = c.input(DType::kFloat32, {Dim::symbol("b"), 3});
    int lo = c.input(DType::kFloat32, {});
    int hi = c.input(DType::kFloat32, {1});
    ASSERT_TRUE(c.run("Clip", {x, lo, hi}).ok());
    EXPECT_EQ(c.shape(), "[b, 3]");
  }
  {
    InferCase c;
    int x = c.input(DType::kFloat32, {3});
    int lo = c.input(DType::kFloat32, {2});
    EXPECT_EQ(c.run("Clip", {x, lo}).code(), StatusCode::kInvalidModel);
  }
}

// ---------------------------------------------------------------- symbolic folding

TEST(ElementwiseFold, ArithmeticOnShapeValues) {
  Dim b = Dim::symbol("b");
  {
    InferCase c;
    int x = c.input(DType::kInt64, {2}, std::vector<Dim>{b, 3});
    int y = c.constant(make_i64({2}, {1, 2}));
    ASSERT_TRUE(c.run("Mul", {x, y}).ok());
    EXPECT_EQ(c.value(), "[b, 6]");
  }
  {
    InferCase c;  // broadcasting a scalar over a shape value
    int x = c.input(DType::kInt64, {3}, std::vector<Dim>{b, 4, 5});
    int y = c.constant(make_i64({}, {1}));
    ASSERT_TRUE(c.run("Add", {x, y}).ok());
    EXPECT_EQ(c.value(), "[b + 1, 5, 6]");
  }
  {
    InferCase c;  // integer Div truncates toward zero; a symbolic numerator >= 0 floors
    int x = c.input(DType::kInt64, {3}, std::vector<Dim>{b * 4, 7, -7});
    int y = c.constant(make_i64({1}, {2}));
    ASSERT_TRUE(c.run("Div", {x, y}).ok());
    EXPECT_EQ(c.value(), "[2*b, 3, -3]");
  }
  {
    InferCase c;  // a symbolic numerator over a negative divisor is left to run time
    int x = c.input(DType::kInt64, {1}, std::vector<Dim>{b});
    int y = c.constant(make_i64({1}, {-2}));
    ASSERT_TRUE(c.run("Div", {x, y}).ok());
    EXPECT_EQ(c.value(), "unknown");
  }
  {
    InferCase c;  // Mod with fmod=0 takes the divisor's sign
    int x = c.input(DType::kInt64, {3}, std::vector<Dim>{-7, 7, b * 3 + 4});
    int y = c.constant(make_i64({1}, {3}));
    ASSERT_TRUE(c.run("Mod", {x, y}).ok());
    ASSERT_TRUE(c.outputs[0].value.has_value());
    EXPECT_EQ((*c.outputs[0].value)[0], Dim(2));
    EXPECT_EQ((*c.outputs[0].value)[1], Dim(1));
    EXPECT_EQ((*c.outputs[0].value)[2], Dim(1));
  }
  {
    InferCase c;
    int x = c.constant(make_i64({2}, {-7, 7}));
    int y = c.constant(make_i64({1}, {3}));
    ir::Attributes a;
    a.set("fmod", int_attr(1));
    ASSERT_TRUE(c.run("Mod", {x, y}, a).ok());
    EXPECT_EQ(c.value(), "[-1, 1]");
  }
  {
    InferCase c;
    int x = c.input(DType::kInt64, {2}, std::vector<Dim>{b, 3});
    int y = c.input(DType::kInt64, {2}, std::vector<Dim>{b + 2, 1});
    int z = c.constant(make_i64({1}, {2}));
    ASSERT_TRUE(c.run("Max", {x, y, z}).ok());
    EXPECT_EQ(c.value(), "[b + 2, 3]");
  }
  {
    InferCase c;
    int x = c.input(DType::kInt64, {2}, std::vector<Dim>{b, -3});
    ASSERT_TRUE(c.run("Abs", {x}).ok());
    EXPECT_EQ(c.value(), "[b, 3]");
  }
}

TEST(ElementwiseFold, ComparisonsDecideWhenProvable) {
  Dim b = Dim::symbol("b");
  {
    InferCase c;  // b >= 0, so b == -1 is false
    int x = c.input(DType::kInt64, {1}, std::vector<Dim>{b});
    int y = c.constant(make_i64({1}, {-1}));
    ASSERT_TRUE(c.run("Equal", {x, y}).ok());
    EXPECT_EQ(c.outputs[0].dtype, DType::kBool);
    EXPECT_EQ(c.value(), "[0]");
  }
  {
    InferCase c;  // b == 3 depends on b
    int x = c.input(DType::kInt64, {1}, std::vector<Dim>{b});
    int y = c.constant(make_i64({1}, {3}));
    ASSERT_TRUE(c.run("Equal", {x, y}).ok());
    EXPECT_EQ(c.value(), "unknown");
  }
  {
    InferCase c;
    int x = c.input(DType::kInt64, {3}, std::vector<Dim>{b, b, b + 1});
    int y = c.input(DType::kInt64, {3}, std::vector<Dim>{b + 1, b, b});
    ASSERT_TRUE(c.run("Less", {x, y}).ok());
    EXPECT_EQ(c.value(), "[1, 0, 0]");
    InferCase d;
    x = d.input(DType::kInt64, {3}, std::vector<Dim>{b, b, b + 1});
    y = d.input(DType::kInt64, {3}, std::vector<Dim>{b + 1, b, b});
    ASSERT_TRUE(d.run("GreaterOrEqual", {x, y}).ok());
    EXPECT_EQ(d.value(), "[0, 1, 1]");
  }
}

TEST(ElementwiseFold, WhereLogicCast) {
  Dim b = Dim::symbol("b"), s = Dim::symbol("s");
  {
    InferCase c;
    int cond = c.constant(make_bool({2}, {1, 0}));
    int x = c.input(DType::kInt64, {2}, std::vector<Dim>{b, 2});
    int y = c.input(DType::kInt64, {2}, std::vector<Dim>{7, s});
    ASSERT_TRUE(c.run("Where", {cond, x, y}).ok());
    EXPECT_EQ(c.value(), "[b, s]");
  }
  {
    InferCase c;  // Where(Equal(shape, -1), 1, shape): the reshape-target idiom
    int cond = c.input(DType::kBool, {2}, std::vector<Dim>{0, 1});
    int x = c.constant(make_i64({}, {1}));
    int y = c.input(DType::kInt64, {2}, std::vector<Dim>{b, -1});
    ASSERT_TRUE(c.run("Where", {cond, x, y}).ok());
    EXPECT_EQ(c.value(), "[b, 1]");
  }
  {
    InferCase c;
    int x = c.input(DType::kBool, {2}, std::vector<Dim>{0, 1});
    ASSERT_TRUE(c.run("Not", {x}).ok());
    EXPECT_EQ(c.value(), "[1, 0]");
  }
  {
    InferCase c;
    int x = c.input(DType::kInt64, {3}, std::vector<Dim>{b, 0, b + 1});
    ir::Attributes a;
    a.set("to", int_attr(9));  // bool
    ASSERT_TRUE(c.run("Cast", {x}, a).ok());
    EXPECT_EQ(c.value(), "unknown");  // b may be 0
    InferCase d;
    x = d.input(DType::kInt64, {2}, std::vector<Dim>{b + 1, 0});
    ASSERT_TRUE(d.run("Cast", {x}, a).ok());
    EXPECT_EQ(d.value(), "[1, 0]");
  }
  {
    InferCase c;  // int64 -> int32 passes values through
    int x = c.input(DType::kInt64, {2}, std::vector<Dim>{b, 4});
    ir::Attributes a;
    a.set("to", int_attr(6));
    ASSERT_TRUE(c.run("Cast", {x}, a).ok());
    EXPECT_EQ(c.value(), "[b, 4]");
  }
  {
    InferCase c;  // never a float value
    int x = c.input(DType::kInt64, {2}, std::vector<Dim>{b, 4});
    ir::Attributes a;
    a.set("to", int_attr(1));
    ASSERT_TRUE(c.run("Cast", {x}, a).ok());
    EXPECT_EQ(c.outputs[0].dtype, DType::kFloat32);
    EXPECT_EQ(c.value(), "unknown");
  }
  {
    InferCase c;  // a symbolic output shape is never folded
    int x = c.input(DType::kInt64, {b});
    int y = c.constant(make_i64({1}, {1}));
    ASSERT_TRUE(c.run("Add", {x, y}).ok());
    EXPECT_EQ(c.value(), "unknown");
  }
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
  for (const char* op : {"Add", "Mul", "Sub"}) {
    for (const auto& c : cases) {
      int64_t na = shape_numel(c.a), nb = shape_numel(c.b), no = shape_numel(c.out);
      Tensor a = make_f32(c.a, iota(na, 1.0f, 0.5f));
      Tensor b = make_f32(c.b, iota(nb, -2.0f, 0.25f));
      std::vector<float> want(static_cast<size_t>(no));
      for (int64_t i = 0; i < no; ++i) {
        float x = a.data_as<float>()[bcast_index(c.out, c.a, i)];
        float y = b.data_as<float>()[bcast_index(c.out, c.b, i)];
        std::string o = op;
        want[size_t(i)] = o == "Add" ? x + y : o == "Mul" ? x * y : x - y;
      }
      auto got = run_cpu_kernel(make_node(op), {a, b}, {{DType::kFloat32, c.out}});
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      EXPECT_TRUE(all_close((*got)[0], make_f32(c.out, want)))
          << op << " " << shape_to_string(c.a) << " " << shape_to_string(c.b);
    }
  }
}

TEST(ElementwiseKernel, IntegerArithmetic) {
  {
    auto got = run_cpu_kernel(make_node("Div"),
                              {make_i64({4}, {7, -7, 7, 5}), make_i64({4}, {2, 2, -2, 0})},
                              {{DType::kInt64, {4}}});
    ASSERT_TRUE(got.ok());
    EXPECT_EQ((*got)[0].int_at(0), 3);
    EXPECT_EQ((*got)[0].int_at(1), -3);  // toward zero
    EXPECT_EQ((*got)[0].int_at(2), -3);
    EXPECT_EQ((*got)[0].int_at(3), 0);  // division by zero does not trap
  }
  {
    auto got = run_cpu_kernel(make_node("Mod"), {make_i64({3}, {-7, 7, 6}), make_i64({}, {3})},
                              {{DType::kInt64, {3}}});
    ASSERT_TRUE(got.ok());
    EXPECT_EQ((*got)[0].int_at(0), 2);
    EXPECT_EQ((*got)[0].int_at(1), 1);
    EXPECT_EQ((*got)[0].int_at(2), 0);
    ir::Attributes a;
    a.set("fmod", int_attr(1));
    got = run_cpu_kernel(make_node("Mod", a), {make_i64({2}, {-7, 7}), make_i64({1}, {3})},
                         {{DType::kInt64, {2}}});
    ASSERT_TRUE(got.ok());
    EXPECT_EQ((*got)[0].int_at(0), -1);
    EXPECT_EQ((*got)[0].int_at(1), 1);
  }
  {
    auto got = run_cpu_kernel(make_node("Add"),
                              {make_i32({2, 2}, {1, 2, 3, 4}), make_i32({2, 1}, {10, 20})},
                              {{DType::kInt32, {2, 2}}});
    ASSERT_TRUE(got.ok());
    const int32_t* o = (*got)[0].data_as<int32_t>();
    EXPECT_EQ(o[0], 11);
    EXPECT_EQ(o[1], 12);
    EXPECT_EQ(o[2], 23);
    EXPECT_EQ(o[3], 24);
  }
  {
    Tensor a = Tensor::from_vector(DType::kUInt8, {3}, std::vector<uint8_t>{250, 3, 7});
    Tensor b = Tensor::from_vector(DType::kUInt8, {1}, std::vector<uint8_t>{10});
    auto got = run_cpu_kernel(make_node("Add"), {a, b}, {{DType::kUInt8, {3}}});
    ASSERT_TRUE(got.ok());
    EXPECT_EQ((*got)[0].int_at(0), 4);  // wraps
    EXPECT_EQ((*got)[0].int_at(1), 13);
  }
  {
    auto got =
        run_cpu_kernel(make_node("Pow"), {make_i64({3}, {2, -3, 5}), make_i64({3}, {10, 3, 0})},
                       {{DType::kInt64, {3}}});
    ASSERT_TRUE(got.ok());
    EXPECT_EQ((*got)[0].int_at(0), 1024);
    EXPECT_EQ((*got)[0].int_at(1), -27);
    EXPECT_EQ((*got)[0].int_at(2), 1);
  }
}

TEST(ElementwiseKernel, PowFloatWithMixedExponent) {
  auto got = run_cpu_kernel(make_node("Pow"), {make_f32({2, 2}, {1, 2, 3, 4}), make_i64({}, {2})},
                            {{DType::kFloat32, {2, 2}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 2}, {1, 4, 9, 16})));
  got = run_cpu_kernel(make_node("Pow"), {make_f32({2}, {4, 9}), make_f32({2}, {0.5f, -1})},
                       {{DType::kFloat32, {2}}});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_f32({2}, {2, 1.0f / 9})));
}

TEST(ElementwiseKernel, VariadicMaxMin) {
  auto got =
      run_cpu_kernel(make_node("Max"),
                     {make_f32({2, 2}, {1, 5, -3, 0}), make_f32({2}, {2, 2}), make_f32({}, {-1})},
                     {{DType::kFloat32, {2, 2}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 2}, {2, 5, 2, 2})));
  got = run_cpu_kernel(make_node("Min"), {make_f32({3}, {1, NAN, -3})}, {{DType::kFloat32, {3}}});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_f32({3}, {1, NAN, -3})));
  got = run_cpu_kernel(make_node("Min"), {make_i64({3}, {1, 9, -3}), make_i64({1}, {0})},
                       {{DType::kInt64, {3}}});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].int_at(0), 0);
  EXPECT_EQ((*got)[0].int_at(1), 0);
  EXPECT_EQ((*got)[0].int_at(2), -3);
}

TEST(ElementwiseKernel, ComparisonsAndLogic) {
  auto got =
      run_cpu_kernel(make_node("Less"), {make_f32({2, 2}, {1, 2, 3, 4}), make_f32({2, 1}, {2, 3})},
                     {{DType::kBool, {2, 2}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  std::vector<int64_t> want = {1, 0, 0, 0};
  for (int i = 0; i < 4; ++i) EXPECT_EQ((*got)[0].int_at(i), want[i]) << i;
  got = run_cpu_kernel(make_node("Equal"), {make_i64({3}, {1, 2, 3}), make_i64({}, {2})},
                       {{DType::kBool, {3}}});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].int_at(0), 0);
  EXPECT_EQ((*got)[0].int_at(1), 1);
  got =
      run_cpu_kernel(make_node("Xor"), {make_bool({4}, {0, 0, 1, 1}), make_bool({4}, {0, 1, 0, 1})},
                     {{DType::kBool, {4}}});
  ASSERT_TRUE(got.ok());
  want = {0, 1, 1, 0};
  for (int i = 0; i < 4; ++i) EXPECT_EQ((*got)[0].int_at(i), want[i]) << i;
  got = run_cpu_kernel(make_node("Not"), {make_bool({2}, {0, 1})}, {{DType::kBool, {2}}});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].int_at(0), 1);
  EXPECT_EQ((*got)[0].int_at(1), 0);
  // Bool is not an arithmetic type for these kernels.
  EXPECT_EQ(run_cpu_kernel(make_node("Add"), {make_bool({1}, {1}), make_bool({1}, {1})},
                           {{DType::kBool, {1}}})
                .status()
                .code(),
            StatusCode::kUnsupported);
}

TEST(ElementwiseKernel, HalfAndBfloat16ComputeInFloat) {
  std::vector<uint16_t> h = {float_to_half(1.5f), float_to_half(-2.0f), float_to_half(0.25f)};
  std::vector<uint16_t> hb = {float_to_half(0.5f)};
  auto got = run_cpu_kernel(
      make_node("Add"),
      {Tensor::from_vector(DType::kFloat16, {3}, h), Tensor::from_vector(DType::kFloat16, {1}, hb)},
      {{DType::kFloat16, {3}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  const uint16_t* o = (*got)[0].data_as<uint16_t>();
  EXPECT_EQ(half_to_float(o[0]), 2.0f);
  EXPECT_EQ(half_to_float(o[1]), -1.5f);
  EXPECT_EQ(half_to_float(o[2]), 0.75f);

  std::vector<uint16_t> b = {float_to_bf16(-1.0f), float_to_bf16(0.0f), float_to_bf16(3.0f)};
  got = run_cpu_kernel(make_node("Relu"), {Tensor::from_vector(DType::kBFloat16, {3}, b)},
                       {{DType::kBFloat16, {3}}});
  ASSERT_TRUE(got.ok());
  o = (*got)[0].data_as<uint16_t>();
  EXPECT_EQ(bf16_to_float(o[0]), 0.0f);
  EXPECT_EQ(bf16_to_float(o[2]), 3.0f);
}

TEST(ElementwiseKernel, UnaryMath) {
  Tensor x = make_f32({6}, {-3.0f, -0.5f, 0.0f, 0.5f, 1.0f, 4.0f});
  auto run1 = [&](const char* op, ir::Attributes a = {}) {
    auto r = run_cpu_kernel(make_node(op, a), {x}, {{DType::kFloat32, {6}}});
    EXPECT_TRUE(r.ok()) << op << ": " << r.status().to_string();
    return r.ok() ? (*r)[0] : Tensor();
  };
  auto expect = [&](const char* op, double (*f)(double), ir::Attributes a = {}) {
    std::vector<float> want;
    for (int i = 0; i < 6; ++i) want.push_back(float(f(x.data_as<float>()[i])));
    EXPECT_TRUE(all_close(run1(op, a), make_f32({6}, want))) << op;
  };
  expect("Sigmoid", [](double v) { return 1.0 / (1.0 + std::exp(-v)); });
  expect("Tanh", [](double v) { return std::tanh(v); });
  expect("Erf", [](double v) { return std::erf(v); });
  expect("Exp", [](double v) { return std::exp(v); });
  expect("Sin", [](double v) { return std::sin(v); });
  expect("Neg", [](double v) { return -v; });
  expect("Abs", [](double v) { return std::fabs(v); });
  expect("Sign", [](double v) { return double((v > 0) - (v < 0)); });
  expect("Softplus", [](double v) { return std::log(1.0 + std::exp(v)); });
  expect("HardSwish", [](double v) { return v * std::min(1.0, std::max(0.0, v / 6 + 0.5)); });
  expect("Gelu", [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); });
  ir::Attributes tanh_gelu;
  tanh_gelu.set("approximate", string_attr("tanh"));
  expect(
      "Gelu",
      [](double v) {
        return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      },
      tanh_gelu);
  ir::Attributes leaky;
  leaky.set("alpha", float_attr(0.1f));
  expect(
      "LeakyRelu", [](double v) { return v < 0 ? 0.1 * v : v; }, leaky);
  expect("Elu", [](double v) { return v < 0 ? std::exp(v) - 1 : v; });
  expect("HardSigmoid", [](double v) { return std::min(1.0, std::max(0.0, 0.2 * v + 0.5)); });

  auto r =
      run_cpu_kernel(make_node("Round"), {make_f32({6}, {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 2.6f})},
                     {{DType::kFloat32, {6}}});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(all_close((*r)[0], make_f32({6}, {0, 2, 2, 0, -2, 3}), 0, 0));  // halves to even
  EXPECT_EQ(run_cpu_kernel(make_node("Sqrt"), {make_i64({1}, {4})}, {{DType::kInt64, {1}}})
                .status()
                .code(),
            StatusCode::kUnsupported);
}

TEST(ElementwiseKernel, IsNaNIsInfClip) {
  float inf = std::numeric_limits<float>::infinity();
  Tensor x = make_f32({4}, {NAN, inf, -inf, 1.0f});
  auto r = run_cpu_kernel(make_node("IsNaN"), {x}, {{DType::kBool, {4}}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].int_at(0), 1);
  EXPECT_EQ((*r)[0].int_at(1), 0);
  ir::Attributes a;
  a.set("detect_negative", int_attr(0));
  r = run_cpu_kernel(make_node("IsInf", a), {x}, {{DType::kBool, {4}}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].int_at(1), 1);
  EXPECT_EQ((*r)[0].int_at(2), 0);  // negative infinity not detected
  EXPECT_EQ((*r)[0].int_at(3), 0);

  Tensor y = make_f32({5}, {-5, -1, 0, 1, 5});
  r = run_cpu_kernel(make_node("Clip"), {y, make_f32({}, {-2}), make_f32({}, {3})},
                     {{DType::kFloat32, {5}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_f32({5}, {-2, -1, 0, 1, 3})));
  r = run_cpu_kernel(make_node("Clip"), {y, Tensor(), make_f32({1}, {0.5f})},
                     {{DType::kFloat32, {5}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();  // min omitted
  EXPECT_TRUE(all_close((*r)[0], make_f32({5}, {-5, -1, 0, 0.5f, 0.5f})));
  ir::Attributes old;  // opset 6 spelling
  old.set("min", float_attr(0.0f));
  old.set("max", float_attr(1.0f));
  r = run_cpu_kernel(make_node("Clip", old), {y}, {{DType::kFloat32, {5}}});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(all_close((*r)[0], make_f32({5}, {0, 0, 0, 1, 1})));
  r = run_cpu_kernel(make_node("Clip"),
                     {make_i64({3}, {-9, 4, 9}), make_i64({}, {0}), make_i64({}, {6})},
                     {{DType::kInt64, {3}}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].int_at(0), 0);
  EXPECT_EQ((*r)[0].int_at(1), 4);
  EXPECT_EQ((*r)[0].int_at(2), 6);
}

TEST(ElementwiseKernel, WhereBroadcasts) {
  Tensor cond = make_bool({2, 1}, {1, 0});
  Tensor x = make_f32({1, 3}, {1, 2, 3});
  Tensor y = make_f32({}, {-1});
  auto r = run_cpu_kernel(make_node("Where"), {cond, x, y}, {{DType::kFloat32, {2, 3}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_f32({2, 3}, {1, 2, 3, -1, -1, -1})));
  r = run_cpu_kernel(
      make_node("Where"),
      {make_bool({3}, {0, 1, 0}), make_i64({3}, {1, 2, 3}), make_i64({3}, {7, 8, 9})},
      {{DType::kInt64, {3}}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].int_at(0), 7);
  EXPECT_EQ((*r)[0].int_at(1), 2);
  EXPECT_EQ((*r)[0].int_at(2), 9);
}

TEST(ElementwiseKernel, CastAmongDtypes) {
  ir::Attributes to_i32;
  to_i32.set("to", int_attr(6));
  auto r = run_cpu_kernel(make_node("Cast", to_i32), {make_f32({4}, {1.9f, -1.9f, 0.0f, NAN})},
                          {{DType::kInt32, {4}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)[0].int_at(0), 1);  // truncation toward zero
  EXPECT_EQ((*r)[0].int_at(1), -1);
  EXPECT_EQ((*r)[0].int_at(3), 0);
  ir::Attributes to_bool;
  to_bool.set("to", int_attr(9));
  r = run_cpu_kernel(make_node("Cast", to_bool), {make_f32({3}, {0.0f, -0.1f, 2.0f})},
                     {{DType::kBool, {3}}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].int_at(0), 0);
  EXPECT_EQ((*r)[0].int_at(1), 1);
  EXPECT_EQ((*r)[0].int_at(2), 1);
  ir::Attributes to_f16;
  to_f16.set("to", int_attr(10));
  r = run_cpu_kernel(make_node("Cast", to_f16), {make_i64({2}, {3, -1024})},
                     {{DType::kFloat16, {2}}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(half_to_float((*r)[0].data_as<uint16_t>()[0]), 3.0f);
  EXPECT_EQ(half_to_float((*r)[0].data_as<uint16_t>()[1]), -1024.0f);
  ir::Attributes to_f32;
  to_f32.set("to", int_attr(1));
  r = run_cpu_kernel(make_node("Cast", to_f32), {make_bool({2}, {1, 0})}, {{DType::kFloat32, {2}}});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(all_close((*r)[0], make_f32({2}, {1, 0})));
  ir::Attributes to_u8;
  to_u8.set("to", int_attr(2));
  r = run_cpu_kernel(make_node("Cast", to_u8), {make_i64({2}, {257, -1})}, {{DType::kUInt8, {2}}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].int_at(0), 1);
  EXPECT_EQ((*r)[0].int_at(1), 255);
}

TEST(ElementwiseKernel, ZeroSizeTensors) {
  auto r = run_cpu_kernel(make_node("Add"), {make_f32({0, 3}, {}), make_f32({3}, {1, 2, 3})},
                          {{DType::kFloat32, {0, 3}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)[0].numel(), 0);
  r = run_cpu_kernel(make_node("Where"),
                     {make_bool({0}, {}), make_f32({1}, {1}), make_f32({0}, {})},
                     {{DType::kFloat32, {0}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  r = run_cpu_kernel(make_node("Exp"), {make_f32({2, 0}, {})}, {{DType::kFloat32, {2, 0}}});
  ASSERT_TRUE(r.ok());
  ir::Attributes to;
  to.set("to", int_attr(7));
  r = run_cpu_kernel(make_node("Cast", to), {make_f32({0}, {})}, {{DType::kInt64, {0}}});
  ASSERT_TRUE(r.ok());
  r = run_cpu_kernel(make_node("Max"),
                     {make_f32({0, 2}, {}), make_f32({1, 2}, {1, 2}), make_f32({0, 1}, {})},
                     {{DType::kFloat32, {0, 2}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
}

TEST(ElementwiseKernel, RejectsShapesThatDoNotBroadcast) {
  auto r = run_cpu_kernel(make_node("Add"), {make_f32({3}, {1, 2, 3}), make_f32({4}, {1, 2, 3, 4})},
                          {{DType::kFloat32, {4}}});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("Add"), std::string::npos) << r.status().message();
  r = run_cpu_kernel(make_node("Add"), {make_f32({2}, {1, 2}), make_i64({2}, {1, 2})},
                     {{DType::kFloat32, {2}}});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------- opset 25-28 changes

Tensor make_f64(Shape shape, std::vector<double> v) {
  return Tensor::from_vector(DType::kFloat64, shape, v);
}

TEST(ElementwiseInfer, ModFmod0OnFloatsFromOpset28) {
  for (int opset : {13, 27}) {
    InferCase c;
    int x = c.input(DType::kFloat32, {2});
    Status s = c.run("Mod", {x, x}, {}, opset);
    EXPECT_EQ(s.code(), StatusCode::kInvalidModel) << opset;
    EXPECT_NE(s.message().find("opset 28"), std::string::npos) << s.message();
  }
  InferCase c;
  int x = c.input(DType::kFloat16, {Dim::symbol("n")});
  int y = c.input(DType::kFloat16, {1});
  ASSERT_TRUE(c.run("Mod", {x, y}, {}, 28).ok());
  EXPECT_EQ(c.shape(), "[n]");
  EXPECT_EQ(c.outputs[0].dtype, DType::kFloat16);
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
  auto got = run_cpu_kernel(make_node("Mod"), {make_f64({n}, x), make_f64({n}, y)},
                            {{DType::kFloat64, {n}}});
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
  ir::Attributes a;
  a.set("fmod", int_attr(1));
  got = run_cpu_kernel(make_node("Mod", a), {make_f64({2}, {-4.5, 4.5}), make_f64({2}, {2, -2})},
                       {{DType::kFloat64, {2}}});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].data_as<double>()[0], -0.5);
  EXPECT_EQ((*got)[0].data_as<double>()[1], 0.5);
  // float16 computes in float: -4.3 mod 2.1 as numpy gives it for float16.
  std::vector<uint16_t> hx = {float_to_half(-4.3f)}, hy = {float_to_half(2.1f)};
  got = run_cpu_kernel(make_node("Mod"),
                       {Tensor::from_vector(DType::kFloat16, {1}, hx),
                        Tensor::from_vector(DType::kFloat16, {1}, hy)},
                       {{DType::kFloat16, {1}}});
  ASSERT_TRUE(got.ok());
  const float hxf = half_to_float(hx[0]), hyf = half_to_float(hy[0]);
  EXPECT_EQ(half_to_float((*got)[0].data_as<uint16_t>()[0]),
            half_to_float(float_to_half(std::fmod(hxf, hyf) + hyf)));
}

TEST(MathInfer, BitShiftTakesSignedIntegersFromOpset28) {
  ir::Attributes a;
  a.set("direction", string_attr("RIGHT"));
  {
    InferCase c;
    int x = c.input(DType::kInt32, {3});
    Status s = c.run("BitShift", {x, x}, a, 11);
    EXPECT_EQ(s.code(), StatusCode::kInvalidModel);
    EXPECT_NE(s.message().find("opset 28"), std::string::npos) << s.message();
  }
  for (DType dt : {DType::kInt8, DType::kInt64, DType::kUInt16}) {
    InferCase c;
    int x = c.input(dt, {Dim::symbol("n"), 3});
    int y = c.input(dt, {3});
    ASSERT_TRUE(c.run("BitShift", {x, y}, a, 28).ok()) << dtype_name(dt);
    EXPECT_EQ(c.outputs[0].dtype, dt);
    EXPECT_EQ(c.shape(), "[n, 3]");
  }
  InferCase c;
  int x = c.input(DType::kFloat32, {3});
  EXPECT_EQ(c.run("BitShift", {x, x}, a, 28).code(), StatusCode::kInvalidModel);
}

// BitShift-28: arithmetic right shift of signed values; a shift count that is negative or at least
// the bit width gives what the sign extension alone gives (-1 right of a negative x, else 0).
TEST(MathKernel, BitShiftSignedAndOutOfRange) {
  auto i8 = [](std::vector<int8_t> v) {
    return Tensor::from_vector(DType::kInt8, {int64_t(v.size())}, v);
  };
  ir::Attributes right, left;
  right.set("direction", string_attr("RIGHT"));
  left.set("direction", string_attr("LEFT"));
  auto got = run_cpu_kernel(make_node("BitShift", right),
                            {i8({-128, -7, 16, -1, -5, 5, -5, 5}), i8({1, 1, 2, 7, 8, 8, -1, -1})},
                            {{DType::kInt8, {8}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  const int8_t* o = (*got)[0].data_as<int8_t>();
  const int8_t want_r[] = {-64, -4, 4, -1, -1, 0, -1, 0};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(o[i], want_r[i]) << i;
  got =
      run_cpu_kernel(make_node("BitShift", left),
                     {i8({1, 64, -1, 3, -3, 1}), i8({6, 1, 7, 8, -1, 100})}, {{DType::kInt8, {6}}});
  ASSERT_TRUE(got.ok());
  o = (*got)[0].data_as<int8_t>();
  const int8_t want_l[] = {64, -128, -128, 0, 0, 0};  // bits past the sign bit are dropped
  for (int i = 0; i < 6; ++i) EXPECT_EQ(o[i], want_l[i]) << i;
  // int64 and unsigned: a count at the width gives 0; unsigned right shifts stay logical.
  got = run_cpu_kernel(make_node("BitShift", right),
                       {make_i64({2}, {-1024, int64_t(1) << 40}), make_i64({2}, {3, 64})},
                       {{DType::kInt64, {2}}});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].int_at(0), -128);
  EXPECT_EQ((*got)[0].int_at(1), 0);
  Tensor u = Tensor::from_vector(DType::kUInt8, {2}, std::vector<uint8_t>{200, 200});
  Tensor us = Tensor::from_vector(DType::kUInt8, {2}, std::vector<uint8_t>{1, 8});
  got = run_cpu_kernel(make_node("BitShift", right), {u, us}, {{DType::kUInt8, {2}}});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].int_at(0), 100);
  EXPECT_EQ((*got)[0].int_at(1), 0);
}

TEST(MathInfer, SwiGLUNeedsEqualShapes) {
  Dim b = Dim::symbol("b"), s = Dim::symbol("s");
  {
    InferCase c;
    int x = c.input(DType::kBFloat16, {b, 8});
    int y = c.input(DType::kBFloat16, {b, 8});
    ASSERT_TRUE(c.run("SwiGLU", {x, y}, {}, 28).ok());
    EXPECT_EQ(c.shape(), "[b, 8]");
    EXPECT_EQ(c.outputs[0].dtype, DType::kBFloat16);
    EXPECT_TRUE(c.constraints.empty());
  }
  {
    InferCase c;  // no broadcasting: a different dim fails, a symbolic one must be proven equal
    int x = c.input(DType::kFloat32, {b, 8});
    int y = c.input(DType::kFloat32, {b, 1});
    EXPECT_EQ(c.run("SwiGLU", {x, y}, {}, 28).code(), StatusCode::kInvalidModel);
  }
  {
    InferCase c;
    int x = c.input(DType::kFloat32, {b, 8});
    int y = c.input(DType::kFloat32, {s, 8});
    ASSERT_TRUE(c.run("SwiGLU", {x, y}, {}, 28).ok());
    EXPECT_EQ(c.constraints.size(), 1u);
  }
  {
    InferCase c;
    int x = c.input(DType::kFloat32, {4});
    int y = c.input(DType::kFloat32, {1, 4});
    EXPECT_EQ(c.run("SwiGLU", {x, y}, {}, 28).code(), StatusCode::kInvalidModel);
    InferCase d;
    int i = d.input(DType::kInt32, {4});
    EXPECT_EQ(d.run("SwiGLU", {i, i}, {}, 28).code(), StatusCode::kInvalidModel);
  }
}

TEST(MathKernel, SwiGLUIsSwishOfAGatingB) {
  std::vector<float> av = {1.0f, -2.0f, 3.0f, 0.5f}, bv = {0.5f, 1.0f, -1.0f, 2.0f};
  for (float alpha : {1.0f, 0.5f}) {
    ir::Attributes attrs;
    if (alpha != 1.0f) attrs.set("alpha", float_attr(alpha));
    auto got =
        run_cpu_kernel(make_node("SwiGLU", attrs), {make_f32({2, 2}, av), make_f32({2, 2}, bv)},
                       {{DType::kFloat32, {2, 2}}});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    std::vector<float> want;
    for (size_t i = 0; i < av.size(); ++i) {
      want.push_back(float(av[i] / (1 + std::exp(-double(alpha) * av[i])) * bv[i]));
    }
    EXPECT_TRUE(all_close((*got)[0], make_f32({2, 2}, want), 1e-6, 1e-6)) << alpha;
  }
  auto bad = run_cpu_kernel(make_node("SwiGLU"), {make_f32({2}, {1, 2}), make_f32({1}, {1})},
                            {{DType::kFloat32, {2}}});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

// Celu-28 added float16, bfloat16 and double; they compute as float does.
TEST(MathKernel, CeluOnDoubleAndHalf) {
  auto got = run_cpu_kernel(make_node("Celu"), {make_f64({3}, {-1.0, 0.0, 2.0})},
                            {{DType::kFloat64, {3}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_DOUBLE_EQ((*got)[0].data_as<double>()[0], std::expm1(-1.0));
  EXPECT_EQ((*got)[0].data_as<double>()[2], 2.0);
  std::vector<uint16_t> h = {float_to_half(-1.0f), float_to_half(2.0f)};
  got = run_cpu_kernel(make_node("Celu"), {Tensor::from_vector(DType::kFloat16, {2}, h)},
                       {{DType::kFloat16, {2}}});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(half_to_float((*got)[0].data_as<uint16_t>()[0]),
            half_to_float(float_to_half(std::expm1(-1.0f))));
  InferCase c;
  int x = c.input(DType::kBFloat16, {2});
  ASSERT_TRUE(c.run("Celu", {x}, {}, 28).ok());
  EXPECT_EQ(c.outputs[0].dtype, DType::kBFloat16);
}

}  // namespace
}  // namespace kiln
