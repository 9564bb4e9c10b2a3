// Index ops: Slice clamping on symbolic dims (checked against the concrete ONNX rule for many dim
// values), Gather values and index checks, and the CPU kernels including out-of-range indices.
#include <gtest/gtest.h>

#include <algorithm>
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

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

struct Case {
  ir::Graph g;
  std::vector<ops::Constraint> constraints;
  std::vector<ops::InferContext::Output> outputs;

  int input(DType dt, std::vector<Dim> shape, std::optional<std::vector<Dim>> value = std::nullopt) {
    int v = g.add_value("in" + std::to_string(g.values.size()));
    g.values[v].dtype = dt;
    g.values[v].shape = std::move(shape);
    g.values[v].sym_value = std::move(value);
    return v;
  }
  int ints(std::vector<int64_t> v) {
    Tensor t = make_i64({int64_t(v.size())}, v);
    int id = input(DType::kInt64, {int64_t(v.size())});
    g.values[id].constant = t;
    return id;
  }
  int scalar(int64_t v) {
    int id = input(DType::kInt64, {});
    g.values[id].constant = make_i64({}, {v});
    return id;
  }
  Status run(const std::string& op, std::vector<int> inputs, ir::Attributes attrs = {}, int opset = 18) {
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
  const std::vector<Dim>& dims() const { return outputs.at(0).shape; }
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
ir::Attribute ints_attr(std::vector<int64_t> v) {
  ir::Attribute a;
  a.type = ir::AttrType::kInts;
  a.ints = std::move(v);
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

TEST(IndexOpsInfer, SliceToInt64MaxOnSymbolicDim) {
  Case c;
  int x = c.input(DType::kFloat32, {b, s, 8});
  ASSERT_TRUE(c.run("Slice", {x, c.ints({0}), c.ints({kMax}), c.ints({1})}).ok());
  EXPECT_EQ(c.shape(), "[b, s, 8]");
  ASSERT_TRUE(c.run("Slice", {x, c.ints({0, 2}), c.ints({kMax, -2}), c.ints({1, 2})}).ok());
  EXPECT_EQ(c.dims()[1], s);
  EXPECT_EQ(c.dims()[2], Dim(4));
  // Opset 1 attributes.
  ASSERT_TRUE(c.run("Slice", {x}, attrs({{"starts", ints_attr({1})}, {"ends", ints_attr({3})}}), 9).ok());
  EXPECT_EQ(c.dims()[0].eval({{"b", 5}}), 2);
  EXPECT_EQ(c.dims()[0].eval({{"b", 2}}), 1);
  EXPECT_EQ(c.dims()[0].eval({{"b", 1}}), 0);
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
    Case c;
    int x = c.input(DType::kFloat32, {s});
    ASSERT_TRUE(c.run("Slice", {x, c.ints({w.start}), c.ints({w.end})}).ok());
    EXPECT_EQ(c.shape(), w.shape) << w.start << ":" << w.end;
    EXPECT_EQ(c.constraints.size(), w.constraints) << w.start << ":" << w.end;
    for (const auto& k : c.constraints) {
      EXPECT_EQ(k.kind, ops::Constraint::Kind::kGreaterEqual);
      EXPECT_NE(k.what.find("axis 0 (s)"), std::string::npos) << k.what;
      EXPECT_GE(*k.a.eval({{"s", 1}}), *k.b.eval({{"s", 1}})) << k.what;
      EXPECT_LT(*k.a.eval({{"s", 0}}), *k.b.eval({{"s", 0}})) << k.what;
    }
  }
}

TEST(IndexOpsInfer, SliceWithSymbolicStartsResolvesClamps) {
  Case c;
  // starts = s, ends = s + 1 on a dim of size s + 1 (a KV-cache read of the last position).
  int x = c.input(DType::kFloat32, {b, s + 1, 64});
  int st = c.input(DType::kInt64, {1}, std::vector<Dim>{s});
  int en = c.input(DType::kInt64, {1}, std::vector<Dim>{s + 1});
  ASSERT_TRUE(c.run("Slice", {x, st, en, c.ints({1})}).ok());
  EXPECT_EQ(c.shape(), "[b, 1, 64]");
  EXPECT_TRUE(c.constraints.empty());
  // Ends given as a symbolic value past the dim clamp to it.
  int big = c.input(DType::kInt64, {1}, std::vector<Dim>{s + 5});
  ASSERT_TRUE(c.run("Slice", {x, c.ints({0}), big, c.ints({1})}).ok());
  EXPECT_EQ(c.shape(), "[b, s + 1, 64]");
}

TEST(IndexOpsInfer, SliceLengthMatchesSpecForEveryDim) {
  struct Params {
    int64_t start, end, step;
  };
  std::vector<Params> params = {
      {0, kMax, 1},   {1, kMax, 1},   {-1, kMax, 1}, {-3, -1, 1},  {0, 3, 1},     {2, 5, 2},
      {-1, kMin, -1}, {kMax, kMin, -2}, {-2, 0, -1}, {3, 1, -1},   {1, -1, 3},    {0, -100, 1},
      {-100, 2, 1},   {5, kMax, 1},   {-1, -2, -1},  {0, kMax, 4}, {kMin, kMax, 1}, {4, 4, 1}};
  for (const auto& p : params) {
    Case c;
    int x = c.input(DType::kFloat32, {s});
    Status st = c.run("Slice", {x, c.ints({p.start}), c.ints({p.end}), c.ints({0}), c.ints({p.step})});
    ASSERT_TRUE(st.ok()) << st.to_string();
    const Dim& len = c.dims()[0];
    for (int64_t d = 0; d <= 12; ++d) {
      // Either the formula is right at d, or a recorded constraint rules d out of every profile.
      bool ruled_out = false;
      for (const auto& k : c.constraints) {
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
  Case c;
  int x = c.input(DType::kFloat32, {b, 4});
  EXPECT_EQ(c.run("Slice", {x, c.ints({0}), c.ints({1}), c.ints({0}), c.ints({0})}).code(),
            StatusCode::kInvalidModel);
  EXPECT_EQ(c.run("Slice", {x, c.ints({0}), c.ints({1}), c.ints({2})}).code(), StatusCode::kInvalidModel);
  EXPECT_EQ(c.run("Slice", {x, c.ints({0, 0}), c.ints({1}), c.ints({0})}).code(), StatusCode::kInvalidModel);
  int dyn = c.input(DType::kInt64, {1});
  EXPECT_EQ(c.run("Slice", {x, dyn, c.ints({1})}).code(), StatusCode::kUnsupported);
  // Slicing a shape vector: [b, s, 3, 4][1:-1] -> [s, 3]; reversed with step -2 -> [4, s].
  int v = c.input(DType::kInt64, {4}, std::vector<Dim>{b, s, 3, 4});
  ASSERT_TRUE(c.run("Slice", {v, c.ints({1}), c.ints({-1})}).ok());
  EXPECT_EQ(c.value(), "[s, 3]");
  ASSERT_TRUE(c.run("Slice", {v, c.ints({-1}), c.ints({kMin}), c.ints({0}), c.ints({-2})}).ok());
  EXPECT_EQ(c.value(), "[4, s]");
}

TEST(IndexOpsInfer, GatherShapesValuesAndChecks) {
  Case c;
  int data = c.input(DType::kFloat32, {b, 5, 8});
  int idx = c.input(DType::kInt64, {s, 2});
  ASSERT_TRUE(c.run("Gather", {data, idx}, attrs({{"axis", int_attr(1)}})).ok());
  EXPECT_EQ(c.shape(), "[b, s, 2, 8]");
  ASSERT_TRUE(c.run("Gather", {data, c.scalar(-1)}, attrs({{"axis", int_attr(-1)}})).ok());
  EXPECT_EQ(c.shape(), "[b, 5]");
  EXPECT_EQ(c.run("Gather", {data, c.scalar(5)}, attrs({{"axis", int_attr(1)}})).code(),
            StatusCode::kInvalidModel);
  // On a symbolic axis a known index becomes a constraint for the profile.
  size_t before = c.constraints.size();
  ASSERT_TRUE(c.run("Gather", {data, c.scalar(3)}).ok());
  ASSERT_EQ(c.constraints.size(), before + 1);
  EXPECT_EQ(c.constraints.back().kind, ops::Constraint::Kind::kGreaterEqual);
  // Values: gathering from a known shape vector, negative indices included.
  int v = c.input(DType::kInt64, {4}, std::vector<Dim>{b, 3, 224, s});
  ASSERT_TRUE(c.run("Gather", {v, c.scalar(0)}).ok());
  EXPECT_EQ(c.shape(), "[]");
  EXPECT_EQ(c.value(), "[b]");
  ASSERT_TRUE(c.run("Gather", {v, c.ints({-1, 1})}).ok());
  EXPECT_EQ(c.value(), "[s, 3]");
}

TEST(IndexOpsInfer, GatherNDGatherElementsCumSum) {
  Case c;
  int data = c.input(DType::kFloat32, {b, 4, 5, 6});
  int idx = c.input(DType::kInt64, {b, 7, 2});
  ASSERT_TRUE(c.run("GatherND", {data, idx}, attrs({{"batch_dims", int_attr(1)}})).ok());
  EXPECT_EQ(c.shape(), "[b, 7, 6]");
  ASSERT_TRUE(c.run("GatherND", {data, c.input(DType::kInt64, {3, 4})}).ok());
  EXPECT_EQ(c.shape(), "[3]");
  EXPECT_EQ(c.run("GatherND", {data, c.input(DType::kInt64, {3, 5})}).code(), StatusCode::kInvalidModel);
  ASSERT_TRUE(c.run("GatherElements", {data, c.input(DType::kInt64, {b, 9, 5, 6})},
                    attrs({{"axis", int_attr(1)}}))
                  .ok());
  EXPECT_EQ(c.shape(), "[b, 9, 5, 6]");
  EXPECT_FALSE(c.run("GatherElements", {data, c.input(DType::kInt64, {b, 9})}).ok());
  ASSERT_TRUE(c.run("CumSum", {data, c.scalar(-1)}).ok());
  EXPECT_EQ(c.shape(), "[b, 4, 5, 6]");
  EXPECT_EQ(c.run("CumSum", {data, c.scalar(4)}).code(), StatusCode::kInvalidModel);
}

// ---- kernels ----

TEST(IndexOpsKernel, SliceWithStepsAndClamps) {
  Tensor x = make_f32({3, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  auto got = run_cpu_kernel(make_node("Slice"),
                            {x, make_i64({2}, {kMax, 1}), make_i64({2}, {kMin, kMax}),
                             make_i64({2}, {0, 1}), make_i64({2}, {-2, 2})},
                            {{DType::kFloat32, {2, 2}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 2}, {10, 12, 2, 4}), 0, 0));
  // Attribute form, int32 data.
  Tensor y = Tensor::from_vector(DType::kInt32, {5}, std::vector<int32_t>{1, 2, 3, 4, 5});
  got = run_cpu_kernel(make_node("Slice", attrs({{"starts", ints_attr({-3})}, {"ends", ints_attr({100})}})),
                       {y}, {{DType::kInt32, {3}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ((*got)[0].int_at(0), 3);
  EXPECT_EQ((*got)[0].int_at(2), 5);
  // Empty result, and a mismatched preallocated output is an error, not a write out of bounds.
  got = run_cpu_kernel(make_node("Slice"), {x, make_i64({1}, {3}), make_i64({1}, {1})},
                       {{DType::kFloat32, {0, 4}}});
  EXPECT_TRUE(got.ok());
  got = run_cpu_kernel(make_node("Slice"), {x, make_i64({1}, {0}), make_i64({1}, {1})},
                       {{DType::kFloat32, {2, 4}}});
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
}

TEST(IndexOpsKernel, GatherIndicesAndErrors) {
  Tensor x = make_f32({3, 2}, {1, 2, 3, 4, 5, 6});
  auto got = run_cpu_kernel(make_node("Gather"), {x, make_i64({2, 2}, {2, 0, -1, 1})},
                            {{DType::kFloat32, {2, 2, 2}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 2, 2}, {5, 6, 1, 2, 5, 6, 3, 4}), 0, 0));
  Tensor i32 = Tensor::from_vector(DType::kInt32, {}, std::vector<int32_t>{1});
  got = run_cpu_kernel(make_node("Gather", attrs({{"axis", int_attr(1)}})), {x, i32},
                       {{DType::kFloat32, {3}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({3}, {2, 4, 6}), 0, 0));
  got = run_cpu_kernel(make_node("Gather"), {x, make_i64({2}, {0, 3})}, {{DType::kFloat32, {2, 2}}});
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("Gather"), std::string::npos);
  EXPECT_NE(got.status().message().find("index 3"), std::string::npos) << got.status().message();
  got = run_cpu_kernel(make_node("Gather"), {x, make_i64({1}, {-4})}, {{DType::kFloat32, {1, 2}}});
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  // Zero-size indices and zero-size data with no indices.
  got = run_cpu_kernel(make_node("Gather"), {x, make_i64({0}, {})}, {{DType::kFloat32, {0, 2}}});
  EXPECT_TRUE(got.ok());
  got = run_cpu_kernel(make_node("Gather"), {make_f32({0, 2}, {}), make_i64({1}, {0})},
                       {{DType::kFloat32, {1, 2}}});
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
}

TEST(IndexOpsKernel, GatherNDAndGatherElements) {
  // ONNX example 5: batch_dims = 1.
  Tensor data = make_f32({2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  auto got = run_cpu_kernel(make_node("GatherND", attrs({{"batch_dims", int_attr(1)}})),
                            {data, make_i64({2, 1}, {1, 0})}, {{DType::kFloat32, {2, 2}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 2}, {2, 3, 4, 5}), 0, 0));
  // ONNX example 2: full index tuples into a 2x2.
  got = run_cpu_kernel(make_node("GatherND"), {make_f32({2, 2}, {0, 1, 2, 3}), make_i64({2, 2}, {0, 0, 1, 1})},
                       {{DType::kFloat32, {2}}});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_f32({2}, {0, 3}), 0, 0));
  got = run_cpu_kernel(make_node("GatherND"), {make_f32({2, 2}, {0, 1, 2, 3}), make_i64({1, 2}, {0, 2})},
                       {{DType::kFloat32, {1}}});
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  // GatherElements, ONNX example 1 (axis 1) and example 2 (axis 0, negative index).
  got = run_cpu_kernel(make_node("GatherElements", attrs({{"axis", int_attr(1)}})),
                       {make_f32({2, 2}, {1, 2, 3, 4}), make_i64({2, 2}, {0, 0, 1, 0})},
                       {{DType::kFloat32, {2, 2}}});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 2}, {1, 1, 4, 3}), 0, 0));
  got = run_cpu_kernel(make_node("GatherElements"),
                       {make_f32({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9}), make_i64({2, 3}, {1, 2, 0, 2, 0, -3})},
                       {{DType::kFloat32, {2, 3}}});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 3}, {4, 8, 3, 7, 2, 3}), 0, 0));
  got = run_cpu_kernel(make_node("GatherElements"), {make_f32({2}, {1, 2}), make_i64({1}, {2})},
                       {{DType::kFloat32, {1}}});
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
    auto got = run_cpu_kernel(
        make_node("CumSum", attrs({{"exclusive", int_attr(v.exclusive)}, {"reverse", int_attr(v.reverse)}})),
        {x, make_i64({}, {v.axis})}, {{DType::kFloat32, {2, 3}}});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(all_close((*got)[0], make_f32({2, 3}, v.want), 0, 0))
        << "axis " << v.axis << " exclusive " << v.exclusive << " reverse " << v.reverse;
  }
  Tensor i = Tensor::from_vector(DType::kInt32, {3}, std::vector<int32_t>{1, 2, 3});
  auto got = run_cpu_kernel(make_node("CumSum"), {i, make_i64({}, {0})}, {{DType::kInt32, {3}}});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].int_at(2), 6);
  got = run_cpu_kernel(make_node("CumSum"), {make_f32({0, 3}, {}), make_i64({}, {0})},
                       {{DType::kFloat32, {0, 3}}});
  EXPECT_TRUE(got.ok());
}

TEST(IndexOpsInfer, OneHotInsertsTheDepthAxis) {
  {
    Case c;
    int idx = c.input(DType::kInt64, {b, 3});
    int depth = c.input(DType::kFloat32, {});
    c.g.values[depth].constant = make_f32({}, {10.0f});  // a float depth is cast to int64
    int values = c.input(DType::kInt32, {2});
    ASSERT_TRUE(c.run("OneHot", {idx, depth, values}, attrs({{"axis", int_attr(1)}}), 11).ok());
    EXPECT_EQ(c.shape(), "[b, 10, 3]");
    EXPECT_EQ(c.outputs[0].dtype, DType::kInt32);
  }
  {
    Case c;  // an integer depth from a shape: a symbolic size, default axis -1
    int idx = c.input(DType::kFloat32, {b});
    int depth = c.input(DType::kInt64, {1}, std::vector<Dim>{s});
    int values = c.input(DType::kFloat32, {2});
    ASSERT_TRUE(c.run("OneHot", {idx, depth, values}, {}, 11).ok());
    EXPECT_EQ(c.shape(), "[b, s]");
  }
  {
    Case c;  // a depth known only at run time
    int idx = c.input(DType::kInt64, {3});
    int depth = c.input(DType::kFloat32, {});
    int values = c.input(DType::kFloat32, {2});
    Status st = c.run("OneHot", {idx, depth, values}, {}, 11);
    EXPECT_EQ(st.code(), StatusCode::kUnsupported);
    EXPECT_NE(st.message().find("at run time"), std::string::npos) << st.message();
  }
  {
    Case c;
    int idx = c.input(DType::kInt64, {3});
    int values = c.input(DType::kFloat32, {3});
    EXPECT_EQ(c.run("OneHot", {idx, c.scalar(4), values}, {}, 11).code(),
              StatusCode::kInvalidModel);  // values must be [off, on]
    Case d;
    int i2 = d.input(DType::kInt64, {3});
    int v2 = d.input(DType::kFloat32, {2});
    EXPECT_EQ(d.run("OneHot", {i2, d.scalar(0), v2}, {}, 11).code(), StatusCode::kInvalidModel);
  }
}

TEST(IndexOpsKernel, OneHotWrapsNegativeIndicesAndSkipsOutOfRange) {
  // depth 4, axis 0: output [4, 3]; index -1 is 3, 4 and -5 are out of range (all off).
  auto got = run_cpu_kernel(make_node("OneHot", attrs({{"axis", int_attr(0)}})),
                            {make_i64({3}, {1, -1, 4}), make_f32({}, {4}), make_f32({2}, {-1, 7})},
                            {{DType::kFloat32, {4, 3}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(
      all_close((*got)[0], make_f32({4, 3}, {-1, -1, -1, 7, -1, -1, -1, -1, -1, -1, 7, -1}), 0, 0));
  // Float indices and the default axis (last); bf16 values move as bytes.
  std::vector<uint16_t> v = {float_to_bf16(0.f), float_to_bf16(2.5f)};
  got = run_cpu_kernel(make_node("OneHot"),
                       {make_f32({2}, {2.0f, -5.0f}), make_i64({}, {3}),
                        Tensor::from_vector(DType::kBFloat16, {2}, v)},
                       {{DType::kBFloat16, {2, 3}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  const uint16_t* o = (*got)[0].data_as<uint16_t>();
  const float want[] = {0, 0, 2.5f, 0, 0, 0};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(bf16_to_float(o[i]), want[i]) << i;
}

TEST(IndexOpsInfer, ReverseSequenceAxes) {
  Case c;
  int x = c.input(DType::kFloat32, {s, b, 8});
  int lens = c.input(DType::kInt64, {b});
  ASSERT_TRUE(c.run("ReverseSequence", {x, lens}, {}, 10).ok());
  EXPECT_EQ(c.shape(), "[s, b, 8]");
  EXPECT_TRUE(c.constraints.empty());
  Case d;
  int x2 = d.input(DType::kFloat32, {4, 3});
  int l2 = d.input(DType::kInt64, {4});
  EXPECT_EQ(d.run("ReverseSequence", {x2, l2}, {}, 10).code(), StatusCode::kInvalidModel);
  ASSERT_TRUE(d.run("ReverseSequence", {x2, l2},
                    attrs({{"batch_axis", int_attr(0)}, {"time_axis", int_attr(1)}}), 10)
                  .ok());
  EXPECT_EQ(d.run("ReverseSequence", {x2, l2},
                  attrs({{"batch_axis", int_attr(0)}, {"time_axis", int_attr(0)}}), 10)
                .code(),
            StatusCode::kInvalidModel);
}

TEST(IndexOpsKernel, ReverseSequenceMatchesTheSpecExamples) {
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[size_t(i)] = float(i);
  // Example 2 of the spec: batch_axis 0, time_axis 1, lengths 1..4.
  auto got = run_cpu_kernel(
      make_node("ReverseSequence",
                attrs({{"batch_axis", int_attr(0)}, {"time_axis", int_attr(1)}})),
      {make_f32({4, 4}, x), make_i64({4}, {1, 2, 3, 4})}, {{DType::kFloat32, {4, 4}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close(
      (*got)[0], make_f32({4, 4}, {0, 1, 2, 3, 5, 4, 6, 7, 10, 9, 8, 11, 15, 14, 13, 12}), 0, 0));
  // Example 1: time_axis 0, batch_axis 1 (the defaults), x transposed.
  std::vector<float> xt(16);
  for (int t = 0; t < 4; ++t) {
    for (int bb = 0; bb < 4; ++bb) xt[size_t(t * 4 + bb)] = float(bb * 4 + t);
  }
  got = run_cpu_kernel(make_node("ReverseSequence"),
                       {make_f32({4, 4}, xt), make_i64({4}, {4, 3, 2, 1})},
                       {{DType::kFloat32, {4, 4}}});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close(
      (*got)[0], make_f32({4, 4}, {3, 6, 9, 12, 2, 5, 8, 13, 1, 4, 10, 14, 0, 7, 11, 15}), 0, 0));
  // Lengths come from data: one past the time axis is an error, not a read out of bounds.
  got = run_cpu_kernel(make_node("ReverseSequence"),
                       {make_f32({4, 4}, xt), make_i64({4}, {5, 1, 1, 1})},
                       {{DType::kFloat32, {4, 4}}});
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln
