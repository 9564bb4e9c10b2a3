// Reduce op family: symbolic shape inference (attribute and input axes, keepdims,
// noop_with_empty_axes, folding of shape values) and the CPU reference kernels against naive loops.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include "ops/schema.h"
#include "test_util.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::make_f32;
using testing::make_i64;
using testing::run_cpu_kernel;

struct In {
  DType dtype;
  std::vector<Dim> shape;
  std::optional<Tensor> constant;
  std::optional<std::vector<Dim>> sym_value;
};

struct Inferred {
  Status status;
  std::vector<ops::InferContext::Output> outs;
};

Inferred infer(ir::Node node, const std::vector<std::optional<In>>& inputs) {
  ir::Graph g;
  node.inputs.clear();
  node.outputs.clear();
  for (const auto& in : inputs) {
    if (!in) {
      node.inputs.push_back(-1);
      continue;
    }
    int v = g.add_value("in" + std::to_string(g.values.size()));
    g.values[v].dtype = in->dtype;
    g.values[v].shape = in->shape;
    g.values[v].constant = in->constant;
    g.values[v].sym_value = in->sym_value;
    node.inputs.push_back(v);
  }
  node.outputs.push_back(g.add_value("out"));
  g.nodes.push_back(node);
  std::vector<ops::Constraint> constraints;
  ops::InferContext ctx(g, g.nodes[0], 0, &constraints);
  const ops::OpSchema* schema = ops::find_schema(g.nodes[0]);
  if (!schema) return {internal_error("no schema for " + node.op_type), {}};
  Status s = schema->infer(ctx);
  return {s, ctx.outputs()};
}

ir::Node make_node(const std::string& op, int opset) {
  ir::Node n;
  n.name = "r0";
  n.op_type = op;
  n.opset = opset;
  return n;
}

void set_int(ir::Node& n, const std::string& name, int64_t v) {
  ir::Attribute a;
  a.type = ir::AttrType::kInt;
  a.i = v;
  n.attrs.set(name, a);
}

void set_ints(ir::Node& n, const std::string& name, std::vector<int64_t> v) {
  ir::Attribute a;
  a.type = ir::AttrType::kInts;
  a.ints = std::move(v);
  n.attrs.set(name, a);
}

const Dim kB = Dim::symbol("b");
const Dim kS = Dim::symbol("s");

TEST(ReduceOpsInfer, AxesFromInputKeepdims) {
  ir::Node n = make_node("ReduceMean", 18);
  auto r =
      infer(n, {In{DType::kFloat32, {kB, kS, 64}}, In{DType::kInt64, {1}, make_i64({1}, {-1})}});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(ir::dims_to_string(r.outs[0].shape), "[b, s, 1]");
  set_int(n, "keepdims", 0);
  r = infer(n, {In{DType::kFloat32, {kB, kS, 64}}, In{DType::kInt64, {2}, make_i64({2}, {0, 2})}});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(ir::dims_to_string(r.outs[0].shape), "[s]");
}

TEST(ReduceOpsInfer, AxesAttributeInOlderOpsets) {
  ir::Node n = make_node("ReduceMax", 13);
  set_ints(n, "axes", {1});
  auto r = infer(n, {In{DType::kFloat32, {kB, kS, 64}}});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(ir::dims_to_string(r.outs[0].shape), "[b, 1, 64]");
  // No axes: everything is reduced, unless noop_with_empty_axes.
  ir::Node all = make_node("ReduceSum", 13);
  set_int(all, "keepdims", 0);
  r = infer(all, {In{DType::kFloat32, {kB, kS, 64}}});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(ir::dims_to_string(r.outs[0].shape), "[]");
  set_int(all, "noop_with_empty_axes", 1);
  r = infer(all, {In{DType::kFloat32, {kB, kS, 64}}});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(ir::dims_to_string(r.outs[0].shape), "[b, s, 64]");
}

TEST(ReduceOpsInfer, Errors) {
  ir::Node n = make_node("ReduceSum", 13);
  // Axes known only at run time.
  auto r = infer(n, {In{DType::kFloat32, {kB, 4}}, In{DType::kInt64, {1}}});
  EXPECT_EQ(r.status.code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status.message().find("r0"), std::string::npos);
  r = infer(n, {In{DType::kFloat32, {kB, 4}}, In{DType::kInt64, {1}, make_i64({1}, {2})}});
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidModel);
  r = infer(n, {In{DType::kFloat32, {kB, 4}}, In{DType::kInt64, {2}, make_i64({2}, {1, -1})}});
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidModel);  // repeated axis
  r = infer(n, {In{DType::kBool, {kB, 4}}});
  EXPECT_FALSE(r.status.ok());
}

// Opset 28 dropped the integer types of ReduceLogSum and ReduceLogSumExp.
TEST(ReduceOpsInfer, LogReductionsTakeFloatsFromOpset28) {
  for (const char* op : {"ReduceLogSum", "ReduceLogSumExp"}) {
    ir::Node n = make_node(op, 18);
    EXPECT_TRUE(infer(n, {In{DType::kInt32, {kB, 4}}}).status.ok()) << op;
    n.opset = 28;
    auto r = infer(n, {In{DType::kInt32, {kB, 4}}});
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidModel) << op;
    EXPECT_NE(r.status.message().find("opset 28"), std::string::npos) << r.status.message();
    r = infer(n, {In{DType::kBFloat16, {kB, 4}}});
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_EQ(ir::dims_to_string(r.outs[0].shape), "[1, 1]");
  }
  ir::Node sum = make_node("ReduceSum", 28);  // the other reductions keep their integers
  EXPECT_TRUE(infer(sum, {In{DType::kInt32, {kB, 4}}}).status.ok());
}

TEST(ReduceOpsInfer, FoldsShapeValues) {
  // ReduceProd(Shape(x)) over [b, s, 4] is the symbolic element count.
  ir::Node n = make_node("ReduceProd", 13);
  set_int(n, "keepdims", 0);
  auto r = infer(n, {In{DType::kInt64, {3}, std::nullopt, std::vector<Dim>{kB, kS, 4}}});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  ASSERT_TRUE(r.outs[0].value.has_value());
  ASSERT_EQ(r.outs[0].value->size(), 1u);
  EXPECT_EQ((*r.outs[0].value)[0], kB * kS * 4);
  ir::Node mx = make_node("ReduceMax", 13);
  r = infer(mx, {In{DType::kInt64, {2}, std::nullopt, std::vector<Dim>{kB + 1, kB}}});
  ASSERT_TRUE(r.status.ok());
  ASSERT_TRUE(r.outs[0].value.has_value());
  EXPECT_EQ((*r.outs[0].value)[0], kB + 1);
}

// Naive reduction of a [2, 3, 4] tensor over a set of axes, with keepdims semantics left to
// the caller (the element order is the same either way).
std::vector<double> naive_reduce(const std::vector<float>& x, std::vector<bool> red,
                                 const std::function<double(double, double)>& op, double init,
                                 bool mean) {
  const int64_t dims[3] = {2, 3, 4};
  int64_t od[3];
  for (int d = 0; d < 3; ++d) od[d] = red[d] ? 1 : dims[d];
  std::vector<double> acc(size_t(od[0] * od[1] * od[2]), init);
  std::vector<int64_t> cnt(acc.size(), 0);
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 3; ++j) {
      for (int64_t k = 0; k < 4; ++k) {
        int64_t o = ((red[0] ? 0 : i) * od[1] + (red[1] ? 0 : j)) * od[2] + (red[2] ? 0 : k);
        acc[o] = op(acc[o], x[(i * 3 + j) * 4 + k]);
        ++cnt[o];
      }
    }
  }
  if (mean) {
    for (size_t o = 0; o < acc.size(); ++o) acc[o] /= double(cnt[o]);
  }
  return acc;
}

struct ReduceCase {
  const char* op;
  std::function<double(double, double)> fn;
  double init;
  bool mean;
};

TEST(ReduceOpsKernel, EachOpEachAxisSetKeepdims) {
  std::vector<float> x(24);
  for (int i = 0; i < 24; ++i) x[i] = std::cos(float(i) * 1.7f) * 1.5f + 0.2f * float(i % 5);
  std::vector<ReduceCase> cases = {
      {"ReduceSum", [](double a, double b) { return a + b; }, 0.0, false},
      {"ReduceMean", [](double a, double b) { return a + b; }, 0.0, true},
      {"ReduceMax", [](double a, double b) { return std::max(a, b); }, -INFINITY, false},
      {"ReduceMin", [](double a, double b) { return std::min(a, b); }, INFINITY, false},
      {"ReduceProd", [](double a, double b) { return a * b; }, 1.0, false},
  };
  std::vector<std::vector<int64_t>> axis_sets = {{0}, {1}, {2}, {-1}, {0, 2}, {0, 1}, {1, 2}, {}};
  for (const auto& c : cases) {
    for (const auto& axes : axis_sets) {
      for (int keep = 0; keep <= 1; ++keep) {
        std::vector<bool> red(3, axes.empty());
        for (int64_t a : axes) red[a < 0 ? a + 3 : a] = true;
        Shape out_shape;
        const int64_t dims[3] = {2, 3, 4};
        for (int d = 0; d < 3; ++d) {
          if (!red[d]) {
            out_shape.push_back(dims[d]);
          } else if (keep) {
            out_shape.push_back(1);
          }
        }
        std::vector<double> e = naive_reduce(x, red, c.fn, c.init, c.mean);
        std::vector<float> ef(e.begin(), e.end());
        ir::Node n = make_node(c.op, 18);
        set_int(n, "keepdims", keep);
        std::vector<Tensor> ins = {make_f32({2, 3, 4}, x)};
        if (!axes.empty()) ins.push_back(make_i64({int64_t(axes.size())}, axes));
        auto out = run_cpu_kernel(n, ins, {{DType::kFloat32, out_shape}});
        ASSERT_TRUE(out.ok()) << c.op << ": " << out.status().to_string();
        EXPECT_TRUE(testing::all_close((*out)[0], make_f32(out_shape, ef)))
            << c.op << " axes " << shape_to_string(axes) << " keepdims " << keep;
        // The same through the pre-opset-18 attribute (ReduceSum moved to inputs at 13).
        ir::Node old = make_node(c.op, 11);
        set_int(old, "keepdims", keep);
        if (!axes.empty()) set_ints(old, "axes", axes);
        out = run_cpu_kernel(old, {make_f32({2, 3, 4}, x)}, {{DType::kFloat32, out_shape}});
        ASSERT_TRUE(out.ok()) << out.status().to_string();
        EXPECT_TRUE(testing::all_close((*out)[0], make_f32(out_shape, ef)))
            << c.op << " (attribute) axes " << shape_to_string(axes) << " keepdims " << keep;
      }
    }
  }
}

TEST(ReduceOpsKernel, NoopWithEmptyAxesCopies) {
  std::vector<float> x = {1, -2, 3, 4.5f, 5, 6};
  ir::Node n = make_node("ReduceSum", 13);
  set_int(n, "noop_with_empty_axes", 1);
  auto out =
      run_cpu_kernel(n, {make_f32({2, 3}, x), make_i64({0}, {})}, {{DType::kFloat32, {2, 3}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({2, 3}, x)));
  // Without the flag an empty axes list reduces everything.
  ir::Node all = make_node("ReduceSum", 13);
  out = run_cpu_kernel(all, {make_f32({2, 3}, x), make_i64({0}, {})}, {{DType::kFloat32, {1, 1}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_FLOAT_EQ((*out)[0].data_as<float>()[0], 17.5f);
}

TEST(ReduceOpsKernel, IntegerTypes) {
  ir::Node n = make_node("ReduceMax", 18);
  set_int(n, "keepdims", 0);
  auto out =
      run_cpu_kernel(n, {make_i64({2, 3}, {5, -7, 9, int64_t(1) << 40, 2, 3}), make_i64({1}, {1})},
                     {{DType::kInt64, {2}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].data_as<int64_t>()[0], 9);
  EXPECT_EQ((*out)[0].data_as<int64_t>()[1], int64_t(1) << 40);
  ir::Node s = make_node("ReduceSum", 13);
  set_int(s, "keepdims", 0);
  Tensor xi = Tensor::from_vector(DType::kInt32, {2, 2}, std::vector<int32_t>{1, 2, 3, -10});
  out = run_cpu_kernel(s, {xi, make_i64({1}, {0})}, {{DType::kInt32, {2}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].data_as<int32_t>()[0], 4);
  EXPECT_EQ((*out)[0].data_as<int32_t>()[1], -8);
  ir::Node m = make_node("ReduceMin", 13);
  out = run_cpu_kernel(m, {xi}, {{DType::kInt32, {1, 1}}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0].data_as<int32_t>()[0], -10);
}

TEST(ReduceOpsKernel, NanPropagatesAndEmptyReductions) {
  ir::Node n = make_node("ReduceMax", 13);
  set_int(n, "keepdims", 0);
  set_ints(n, "axes", {1});
  auto out = run_cpu_kernel(n, {make_f32({2, 2}, {1, NAN, 2, 3})}, {{DType::kFloat32, {2}}});
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(std::isnan((*out)[0].data_as<float>()[0]));
  EXPECT_EQ((*out)[0].data_as<float>()[1], 3.0f);
  // Reducing a zero-length axis gives the identity of the reduction.
  ir::Node s = make_node("ReduceSum", 11);
  set_ints(s, "axes", {1});
  set_int(s, "keepdims", 0);
  out = run_cpu_kernel(s, {make_f32({2, 0}, {})}, {{DType::kFloat32, {2}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].data_as<float>()[0], 0.0f);
  ir::Node p = make_node("ReduceProd", 11);
  set_ints(p, "axes", {1});
  set_int(p, "keepdims", 0);
  out = run_cpu_kernel(p, {make_f32({2, 0}, {})}, {{DType::kFloat32, {2}}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0].data_as<float>()[1], 1.0f);
}


// ---- ReduceL1/L2/LogSum/LogSumExp/SumSquare, ArgMax/ArgMin, Hardmax, TopK ----

TEST(ReduceOpsKernel, NewReductionsAgainstHandValues) {
  // x = [[1, -2], [3, 4]] reduced over axis 1 with keepdims=0.
  Tensor x = make_f32({2, 2}, {1, -2, 3, 4});
  Tensor axes = make_i64({1}, {1});
  auto run = [&](const char* op) {
    ir::Node n = make_node(op, 18);
    set_int(n, "keepdims", 0);
    auto out = run_cpu_kernel(n, {x, axes}, {{DType::kFloat32, {2}}});
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    return out.ok() ? std::vector<float>{(*out)[0].data_as<float>()[0], (*out)[0].data_as<float>()[1]}
                    : std::vector<float>{};
  };
  EXPECT_EQ(run("ReduceL1"), (std::vector<float>{3, 7}));
  EXPECT_EQ(run("ReduceSumSquare"), (std::vector<float>{5, 25}));
  auto l2 = run("ReduceL2");
  EXPECT_NEAR(l2[0], std::sqrt(5.f), 1e-6f);
  EXPECT_NEAR(l2[1], 5.f, 1e-6f);
  auto ls = run("ReduceLogSum");
  EXPECT_TRUE(std::isnan(ls[0]));  // log(-1)
  EXPECT_NEAR(ls[1], std::log(7.f), 1e-6f);
  auto lse = run("ReduceLogSumExp");
  EXPECT_NEAR(lse[0], std::log(std::exp(1.f) + std::exp(-2.f)), 1e-6f);
  EXPECT_NEAR(lse[1], std::log(std::exp(3.f) + std::exp(4.f)), 1e-6f);
}

TEST(ReduceOpsKernel, LogSumExpIsStableForLargeInputs) {
  ir::Node n = make_node("ReduceLogSumExp", 18);
  auto out = run_cpu_kernel(n, {make_f32({2}, {1000.f, 1000.f})}, {{DType::kFloat32, {1}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_NEAR((*out)[0].data_as<float>()[0], 1000.f + std::log(2.f), 1e-3f);
}

TEST(ReduceOpsInfer, ArgMaxShapeAndDtype) {
  ir::Node n = make_node("ArgMax", 13);
  set_int(n, "axis", -1);
  set_int(n, "keepdims", 0);
  auto r = infer(n, {In{DType::kFloat32, {Dim::symbol("b"), 3, 5}}});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outs[0].dtype, DType::kInt64);
  ASSERT_EQ(r.outs[0].shape.size(), 2u);
  EXPECT_EQ(r.outs[0].shape[1], Dim(3));
  set_int(n, "axis", 3);
  EXPECT_FALSE(infer(n, {In{DType::kFloat32, {2, 3, 5}}}).status.ok());
}

TEST(ReduceOpsKernel, ArgMaxArgMinSelectLastIndex) {
  Tensor x = make_f32({2, 3}, {1, 5, 5, 2, 2, 0});
  ir::Node n = make_node("ArgMax", 13);
  set_int(n, "axis", 1);
  auto out = run_cpu_kernel(n, {x}, {{DType::kInt64, {2, 1}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].data_as<int64_t>()[0], 1);
  EXPECT_EQ((*out)[0].data_as<int64_t>()[1], 0);
  set_int(n, "select_last_index", 1);
  out = run_cpu_kernel(n, {x}, {{DType::kInt64, {2, 1}}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0].data_as<int64_t>()[0], 2);
  EXPECT_EQ((*out)[0].data_as<int64_t>()[1], 1);
  ir::Node m = make_node("ArgMin", 13);
  set_int(m, "axis", 0);
  out = run_cpu_kernel(m, {x}, {{DType::kInt64, {1, 3}}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0].data_as<int64_t>()[0], 0);
  EXPECT_EQ((*out)[0].data_as<int64_t>()[1], 1);
  EXPECT_EQ((*out)[0].data_as<int64_t>()[2], 1);
}

TEST(ReduceOpsKernel, HardmaxMarksFirstMaximum) {
  auto out = run_cpu_kernel(make_node("Hardmax", 13), {make_f32({2, 3}, {1, 3, 3, -1, -5, -2})},
                            {{DType::kFloat32, {2, 3}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({2, 3}, {0, 1, 0, 1, 0, 0})));
}

TEST(ReduceOpsInfer, TopKNeedsKAtBuildTime) {
  ir::Node n = make_node("TopK", 11);
  auto r = infer(n, {In{DType::kFloat32, {4, 6}}, In{DType::kInt64, {1}, make_i64({1}, {2})}});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outs[0].shape[1], Dim(2));
  EXPECT_EQ(r.outs[0].dtype, DType::kFloat32);
  // K larger than the axis is an error; a runtime K is unsupported with a clear reason.
  EXPECT_FALSE(infer(n, {In{DType::kFloat32, {4, 6}}, In{DType::kInt64, {1}, make_i64({1}, {7})}})
                   .status.ok());
  auto rt = infer(n, {In{DType::kFloat32, {4, 6}}, In{DType::kInt64, {1}}});
  EXPECT_EQ(rt.status.code(), StatusCode::kUnsupported);
}

TEST(ReduceOpsKernel, TopKLargestAndSmallestStable) {
  Tensor x = make_f32({1, 5}, {3, 1, 3, 7, 1});
  ir::Node n = make_node("TopK", 11);
  auto out = run_cpu_kernel(n, {x, make_i64({1}, {3})}, {{DType::kFloat32, {1, 3}}, {DType::kInt64, {1, 3}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({1, 3}, {7, 3, 3})));
  const int64_t* idx = (*out)[1].data_as<int64_t>();
  EXPECT_EQ(idx[0], 3);
  EXPECT_EQ(idx[1], 0);  // ties keep the lower index first
  EXPECT_EQ(idx[2], 2);
  set_int(n, "largest", 0);
  out = run_cpu_kernel(n, {x, make_i64({1}, {2})}, {{DType::kFloat32, {1, 2}}, {DType::kInt64, {1, 2}}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[1].data_as<int64_t>()[0], 1);
  EXPECT_EQ((*out)[1].data_as<int64_t>()[1], 4);
}

}  // namespace
}  // namespace kiln
