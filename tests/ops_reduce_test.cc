// Reduce op family: symbolic shape inference (attribute and input axes, keepdims,
// noop_with_empty_axes, folding of shape values) and the CPU reference kernels against naive loops.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "op_harness.h"
#include "typed_values.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::all_close;
using testing::constant;
using testing::f32;
using testing::infer_node;
using testing::initializer;
using testing::make_f32;
using testing::make_i64;
using testing::op;
using testing::run_case;
using testing::typed;
using testing::with_value;

// Axes and TopK's K: constants the builder reads, so initializers.
testing::CaseInput i64s(std::vector<int64_t> v) {
  return initializer(make_i64({int64_t(v.size())}, v));
}

const Dim kB = Dim::symbol("b");
const Dim kS = Dim::symbol("s");

TEST(ReduceOpsInfer, AxesFromInputKeepdims) {
  auto r = infer_node(op("ReduceMean", 18), {f32({kB, kS, 64}), constant(make_i64({1}, {-1}))});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, s, 1]");
  r = infer_node(op("ReduceMean", 18).i("keepdims", 0),
                 {f32({kB, kS, 64}), constant(make_i64({2}, {0, 2}))});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[s]");
}

TEST(ReduceOpsInfer, AxesAttributeInOlderOpsets) {
  auto r = infer_node(op("ReduceMax", 13).ints("axes", {1}), {f32({kB, kS, 64})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 1, 64]");
  // No axes: everything is reduced, unless noop_with_empty_axes.
  r = infer_node(op("ReduceSum", 13).i("keepdims", 0), {f32({kB, kS, 64})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[]");
  r = infer_node(op("ReduceSum", 13).i("keepdims", 0).i("noop_with_empty_axes", 1),
                 {f32({kB, kS, 64})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.shape(), "[b, s, 64]");
}

TEST(ReduceOpsInfer, Errors) {
  auto n = op("ReduceSum", 13).named("r0");
  // Axes known only at run time.
  auto r = infer_node(n, {f32({kB, 4}), typed(DType::kInt64, {1})});
  EXPECT_EQ(r.code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status.message().find("r0"), std::string::npos);
  r = infer_node(n, {f32({kB, 4}), constant(make_i64({1}, {2}))});
  EXPECT_EQ(r.code(), StatusCode::kInvalidModel);
  r = infer_node(n, {f32({kB, 4}), constant(make_i64({2}, {1, -1}))});
  EXPECT_EQ(r.code(), StatusCode::kInvalidModel);  // repeated axis
  r = infer_node(n, {typed(DType::kBool, {kB, 4})});
  EXPECT_FALSE(r.ok());
}

// Opset 28 dropped the integer types of ReduceLogSum and ReduceLogSumExp.
TEST(ReduceOpsInfer, LogReductionsTakeFloatsFromOpset28) {
  for (const char* name : {"ReduceLogSum", "ReduceLogSumExp"}) {
    EXPECT_TRUE(infer_node(op(name, 18), {typed(DType::kInt32, {kB, 4})}).ok()) << name;
    auto r = infer_node(op(name, 28), {typed(DType::kInt32, {kB, 4})});
    EXPECT_EQ(r.code(), StatusCode::kInvalidModel) << name;
    EXPECT_NE(r.status.message().find("opset 28"), std::string::npos) << r.status.message();
    r = infer_node(op(name, 28), {typed(DType::kBFloat16, {kB, 4})});
    ASSERT_TRUE(r.ok()) << r.status.to_string();
    EXPECT_EQ(r.shape(), "[1, 1]");
  }
  // The other reductions keep their integers.
  EXPECT_TRUE(infer_node(op("ReduceSum", 28), {typed(DType::kInt32, {kB, 4})}).ok());
}

TEST(ReduceOpsInfer, FoldsShapeValues) {
  // ReduceProd(Shape(x)) over [b, s, 4] is the symbolic element count.
  auto r = infer_node(op("ReduceProd", 13).i("keepdims", 0),
                      {with_value(DType::kInt64, {3}, {kB, kS, 4})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  ASSERT_TRUE(r.outputs[0].value.has_value());
  ASSERT_EQ(r.outputs[0].value->size(), 1u);
  EXPECT_EQ((*r.outputs[0].value)[0], kB * kS * 4);
  r = infer_node(op("ReduceMax", 13), {with_value(DType::kInt64, {2}, {kB + 1, kB})});
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r.outputs[0].value.has_value());
  EXPECT_EQ((*r.outputs[0].value)[0], kB + 1);
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
        std::vector<testing::CaseInput> ins = {make_f32({2, 3, 4}, x)};
        if (!axes.empty()) ins.push_back(i64s(axes));
        auto out = run_case(op(c.op, 18).i("keepdims", keep), ins);
        ASSERT_TRUE(out.ok()) << c.op << ": " << out.status().to_string();
        EXPECT_TRUE(all_close((*out)[0], make_f32(out_shape, ef)))
            << c.op << " axes " << shape_to_string(axes) << " keepdims " << keep;
        // The same through the pre-opset-18 attribute (ReduceSum moved to inputs at 13).
        auto old = op(c.op, 11).i("keepdims", keep);
        if (!axes.empty()) old.ints("axes", axes);
        out = run_case(old, {make_f32({2, 3, 4}, x)});
        ASSERT_TRUE(out.ok()) << out.status().to_string();
        EXPECT_TRUE(all_close((*out)[0], make_f32(out_shape, ef)))
            << c.op << " (attribute) axes " << shape_to_string(axes) << " keepdims " << keep;
      }
    }
  }
}

// A channels-last GlobalAveragePool ([N, H, W, C] over H and W, C past one 32-wide block) and its
// Max/Min/Sum, in float32 and as the precision pass leaves it (float16), against the loops.
TEST(ReduceOpsKernel, ChannelsLastPoolingAxes) {
  const Shape shape = {3, 7, 9, 40};
  std::vector<float> x(size_t(shape_numel(shape)));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(float(i) * 0.37f) * 2.0f + 0.01f * float(i % 13);
  const std::pair<const char*, double (*)(double, double)> ops[] = {
      {"ReduceMean", [](double a, double b) { return a + b; }},
      {"ReduceSum", [](double a, double b) { return a + b; }},
      {"ReduceMax", [](double a, double b) { return std::max(a, b); }},
      {"ReduceMin", [](double a, double b) { return std::min(a, b); }}};
  for (const auto& [name, fn] : ops) {
    std::string op_name = name;
    double init = op_name == "ReduceMax" ? -INFINITY : op_name == "ReduceMin" ? INFINITY : 0.0;
    std::vector<float> ef(3 * 40);
    for (int64_t n = 0; n < 3; ++n) {
      for (int64_t c = 0; c < 40; ++c) {
        double acc = init;
        for (int64_t p = 0; p < 7 * 9; ++p) acc = fn(acc, x[size_t((n * 63 + p) * 40 + c)]);
        ef[size_t(n * 40 + c)] = float(op_name == "ReduceMean" ? acc / 63 : acc);
      }
    }
    std::vector<testing::CaseInput> ins = {make_f32(shape, x), i64s({1, 2})};
    auto out = run_case(op(name, 18).i("keepdims", 1), ins);
    ASSERT_TRUE(out.ok()) << name << ": " << out.status().to_string();
    EXPECT_TRUE(all_close((*out)[0], make_f32({3, 1, 1, 40}, ef))) << name;
    auto half = testing::run_reduced_case(
        {.node = op(name, 18).i("keepdims", 1), .inputs = ins, .expect_support = true},
        DType::kFloat16, {1});
    ASSERT_TRUE(half.ok()) << name << " float16: " << half.status().to_string();
  }
}

// A global average pool in NCHW ([N, C, H, W] over H and W): float32 rows summed in double over
// partial sums and split over threads. Against the loop in double, rows of 49 (a tail past the
// 16-wide blocks) and 3136 elements, enough of them to run on several threads, and the same bits on
// one thread and on three.
TEST(ReduceOpsKernel, FloatRowsOverThreadsMatchTheLoop) {
  for (const Shape& shape : {Shape{2, 576, 7, 7}, Shape{1, 40, 56, 56}}) {
    const int64_t rows = shape[0] * shape[1], n = shape[2] * shape[3];
    std::vector<float> x(size_t(rows * n));
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = std::sin(float(i) * 0.61f) * 3.0f + 0.02f * float(i % 11);
    for (const char* name : {"ReduceMean", "ReduceSum"}) {
      const bool mean = std::string(name) == "ReduceMean";
      std::vector<float> ef(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        double acc = 0;
        for (int64_t p = 0; p < n; ++p) acc += x[size_t(r * n + p)];
        ef[size_t(r)] = float(mean ? acc / double(n) : acc);
      }
      std::vector<testing::CaseInput> ins = {make_f32(shape, x), i64s({2, 3})};
      std::vector<float> bits[2];
      for (int threads : {1, 3}) {
        backends::cpu::ScopedThreadLimit limit(threads);
        auto out = run_case(op(name, 18).i("keepdims", 1), ins);
        ASSERT_TRUE(out.ok()) << name << ": " << out.status().to_string();
        EXPECT_TRUE(all_close((*out)[0], make_f32({shape[0], shape[1], 1, 1}, ef)))
            << name << " " << shape_to_string(shape) << " threads " << threads;
        const float* p = (*out)[0].data_as<const float>();
        bits[threads == 3].assign(p, p + rows);
      }
      EXPECT_EQ(bits[0], bits[1]) << name << " " << shape_to_string(shape);
    }
  }
}

TEST(ReduceOpsKernel, NoopWithEmptyAxesCopies) {
  std::vector<float> x = {1, -2, 3, 4.5f, 5, 6};
  auto out =
      run_case(op("ReduceSum", 13).i("noop_with_empty_axes", 1), {make_f32({2, 3}, x), i64s({})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({2, 3}, x)));
  // Without the flag an empty axes list reduces everything.
  out = run_case(op("ReduceSum", 13), {make_f32({2, 3}, x), i64s({})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ((*out)[0].shape(), (Shape{1, 1}));
  EXPECT_FLOAT_EQ((*out)[0].data_as<float>()[0], 17.5f);
}

TEST(ReduceOpsKernel, IntegerTypes) {
  auto out = run_case(op("ReduceMax", 18).i("keepdims", 0),
                      {make_i64({2, 3}, {5, -7, 9, int64_t(1) << 40, 2, 3}), i64s({1})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].data_as<int64_t>()[0], 9);
  EXPECT_EQ((*out)[0].data_as<int64_t>()[1], int64_t(1) << 40);
  Tensor xi = Tensor::from_vector(DType::kInt32, {2, 2}, std::vector<int32_t>{1, 2, 3, -10});
  out = run_case(op("ReduceSum", 13).i("keepdims", 0), {xi, i64s({0})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].data_as<int32_t>()[0], 4);
  EXPECT_EQ((*out)[0].data_as<int32_t>()[1], -8);
  out = run_case(op("ReduceMin", 13), {xi});
  ASSERT_TRUE(out.ok());
  ASSERT_EQ((*out)[0].shape(), (Shape{1, 1}));
  EXPECT_EQ((*out)[0].data_as<int32_t>()[0], -10);
}

TEST(ReduceOpsKernel, NanPropagatesAndEmptyReductions) {
  auto out = run_case(op("ReduceMax", 13).i("keepdims", 0).ints("axes", {1}),
                      {make_f32({2, 2}, {1, NAN, 2, 3})});
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(std::isnan((*out)[0].data_as<float>()[0]));
  EXPECT_EQ((*out)[0].data_as<float>()[1], 3.0f);
  // Reducing a zero-length axis gives the identity of the reduction.
  out = run_case(op("ReduceSum", 11).ints("axes", {1}).i("keepdims", 0), {make_f32({2, 0}, {})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].data_as<float>()[0], 0.0f);
  out = run_case(op("ReduceProd", 11).ints("axes", {1}).i("keepdims", 0), {make_f32({2, 0}, {})});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0].data_as<float>()[1], 1.0f);
}

// ---- ReduceL1/L2/LogSum/LogSumExp/SumSquare, ArgMax/ArgMin, Hardmax, TopK ----

TEST(ReduceOpsKernel, NewReductionsAgainstHandValues) {
  // x = [[1, -2], [3, 4]] reduced over axis 1 with keepdims=0.
  Tensor x = make_f32({2, 2}, {1, -2, 3, 4});
  auto run = [&](const char* name) {
    auto out = run_case(op(name, 18).i("keepdims", 0), {x, i64s({1})});
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    return out.ok()
               ? std::vector<float>{(*out)[0].data_as<float>()[0], (*out)[0].data_as<float>()[1]}
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
  auto out = run_case(op("ReduceLogSumExp", 18), {make_f32({2}, {1000.f, 1000.f})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_NEAR((*out)[0].data_as<float>()[0], 1000.f + std::log(2.f), 1e-3f);
}

TEST(ReduceOpsInfer, ArgMaxShapeAndDtype) {
  auto r =
      infer_node(op("ArgMax", 13).i("axis", -1).i("keepdims", 0), {f32({Dim::symbol("b"), 3, 5})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.dtype(), DType::kInt64);
  ASSERT_EQ(r.dims().size(), 2u);
  EXPECT_EQ(r.dims()[1], Dim(3));
  EXPECT_FALSE(infer_node(op("ArgMax", 13).i("axis", 3).i("keepdims", 0), {f32({2, 3, 5})}).ok());
}

TEST(ReduceOpsKernel, ArgMaxArgMinSelectLastIndex) {
  Tensor x = make_f32({2, 3}, {1, 5, 5, 2, 2, 0});
  auto out = run_case(op("ArgMax", 13).i("axis", 1), {x});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ((*out)[0].shape(), (Shape{2, 1}));
  EXPECT_EQ((*out)[0].data_as<int64_t>()[0], 1);
  EXPECT_EQ((*out)[0].data_as<int64_t>()[1], 0);
  out = run_case(op("ArgMax", 13).i("axis", 1).i("select_last_index", 1), {x});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0].data_as<int64_t>()[0], 2);
  EXPECT_EQ((*out)[0].data_as<int64_t>()[1], 1);
  out = run_case(op("ArgMin", 13).i("axis", 0), {x});
  ASSERT_TRUE(out.ok());
  ASSERT_EQ((*out)[0].shape(), (Shape{1, 3}));
  EXPECT_EQ((*out)[0].data_as<int64_t>()[0], 0);
  EXPECT_EQ((*out)[0].data_as<int64_t>()[1], 1);
  EXPECT_EQ((*out)[0].data_as<int64_t>()[2], 1);
}

TEST(ReduceOpsKernel, ArgMaxArgMinMiddleAxisNoKeepdimsIntegersAndNan) {
  // [2, 3, 2] over axis 1 (strided lines), keepdims 0: output [2, 2].
  Tensor x = make_f32({2, 3, 2}, {1, 9, 7, 2, 7, 3, -1, -2, -3, -2, 0, -2});
  auto out = run_case(op("ArgMax", 13).i("axis", -2).i("keepdims", 0), {x});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_i64({2, 2}, {1, 0, 2, 0}), 0, 0));
  out = run_case(op("ArgMin", 13).i("axis", 1).i("keepdims", 0).i("select_last_index", 1), {x});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_i64({2, 2}, {0, 1, 1, 2}), 0, 0));
  // int32 data, and a NaN wins the line it is in.
  Tensor xi =
      Tensor::from_vector(DType::kInt32, {2, 3}, std::vector<int32_t>{4, -7, 4, 0, 100, -100});
  out = run_case(op("ArgMin", 13).i("axis", 1).i("keepdims", 0), {xi});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_i64({2}, {1, 2}), 0, 0));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  out = run_case(op("ArgMax", 13).i("axis", 1).i("keepdims", 0),
                 {make_f32({2, 3}, {1, nan, 5, 3, 2, 1})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_i64({2}, {1, 0}), 0, 0));
}

TEST(ReduceOpsKernel, HardmaxMarksFirstMaximum) {
  auto out = run_case(op("Hardmax", 13), {make_f32({2, 3}, {1, 3, 3, -1, -5, -2})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({2, 3}, {0, 1, 0, 1, 0, 0})));
}

TEST(ReduceOpsInfer, TopKWithKKnownOrFromData) {
  auto r = infer_node(op("TopK", 11), {f32({4, 6}), constant(make_i64({1}, {2}))}, 2);
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.dims()[1], Dim(2));
  EXPECT_EQ(r.dtype(), DType::kFloat32);
  // K larger than the axis is an error; a runtime K makes the axis a data-dependent dim up to 6.
  EXPECT_FALSE(infer_node(op("TopK", 11), {f32({4, 6}), constant(make_i64({1}, {7}))}, 2).ok());
  auto rt = infer_node(op("TopK", 11), {f32({4, 6}), typed(DType::kInt64, {1})}, 2);
  ASSERT_TRUE(rt.ok()) << rt.status.to_string();
  EXPECT_EQ(rt.shape(0), "[4, topk]");
  ASSERT_EQ(rt.data_dependent.size(), 1u);
  EXPECT_EQ(rt.data_dependent[0].bound, Dim(6));
  EXPECT_FALSE(infer_node(op("TopK", 11), {f32({4, 6}), typed(DType::kFloat32, {1})}, 2).ok());
}

TEST(ReduceOpsKernel, TopKLargestAndSmallestStable) {
  Tensor x = make_f32({1, 5}, {3, 1, 3, 7, 1});
  auto out = run_case(op("TopK", 11), {x, i64s({3})}, 2);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 3}, {7, 3, 3})));
  const int64_t* idx = (*out)[1].data_as<int64_t>();
  EXPECT_EQ(idx[0], 3);
  EXPECT_EQ(idx[1], 0);  // ties keep the lower index first
  EXPECT_EQ(idx[2], 2);
  out = run_case(op("TopK", 11).i("largest", 0), {x, i64s({2})}, 2);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[1].data_as<int64_t>()[0], 1);
  EXPECT_EQ((*out)[1].data_as<int64_t>()[1], 4);
}

// ---- every reduction, dtype, Hardmax and TopK on every device (CUDA: reduce.cu) ----

// A case every device present must run; the reference must match `expected` when given.
void expect_case(testing::OpNode node, std::vector<testing::CaseInput> inputs, int num_outputs = 1,
                 std::vector<Tensor> expected = {}) {
  testing::KernelCase c{.node = std::move(node),
                        .inputs = std::move(inputs),
                        .num_outputs = num_outputs,
                        .expected = std::move(expected),
                        .expect_support = true};
  auto r = testing::run_case(c);
  EXPECT_TRUE(r.ok()) << c.node.node.describe() << ": " << r.status().to_string();
}

const DType kSweepTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                             DType::kInt8,    DType::kUInt8,   DType::kInt16,   DType::kUInt16,
                             DType::kInt32,   DType::kUInt32,  DType::kInt64,   DType::kUInt64};

TEST(ReduceOpsKernel, EveryReductionEveryDtype) {
  const char* ops[] = {"ReduceSum",       "ReduceMean",     "ReduceMax", "ReduceMin",
                       "ReduceProd",      "ReduceL1",       "ReduceL2",  "ReduceLogSum",
                       "ReduceLogSumExp", "ReduceSumSquare"};
  for (DType dt : kSweepTypes) {
    for (const char* name : ops) {
      bool log_op = std::string(name).starts_with("ReduceLog");
      std::vector<double> v(24);
      for (int i = 0; i < 24; ++i) {
        if (is_float(dt)) {
          v[i] = log_op && std::string(name) == "ReduceLogSum" ? 0.25 * (i % 5 + 1)
                                                               : 0.25 * (i % 7 - 3);
        } else {
          v[i] = testing::signed_int(dt) && !log_op ? i % 5 - 2 : i % 4 + 1;
        }
      }
      Tensor x = testing::make_typed(dt, {2, 3, 4}, v);
      for (const std::vector<int64_t>& axes :
           {std::vector<int64_t>{1}, std::vector<int64_t>{0, 2}}) {
        SCOPED_TRACE(std::string(name) + " " + std::string(dtype_name(dt)) + " axes " +
                     shape_to_string(axes));
        expect_case(op(name, 18), {x, i64s(axes)});
        expect_case(op(name, 18).i("keepdims", 0), {x, i64s(axes)});
      }
    }
  }
}

TEST(ReduceOpsKernel, LongRowsEmptyAxesAndIntegerExtremes) {
  // 1000-element rows: several warps and strided loops per block.
  std::vector<float> x(3000);
  for (int i = 0; i < 3000; ++i) x[i] = std::sin(float(i) * 0.37f);
  for (const char* name : {"ReduceSum", "ReduceMax", "ReduceL2", "ReduceLogSumExp", "ReduceMean"}) {
    expect_case(op(name, 18).i("keepdims", 0), {make_f32({3, 1000}, x), i64s({1})});
    expect_case(op(name, 18).i("keepdims", 0), {make_f32({3, 1000}, x), i64s({0})});
  }
  std::vector<double> xd(x.begin(), x.end());
  expect_case(op("ReduceSum", 18), {testing::make_typed(DType::kFloat64, {3, 1000}, xd)});
  // An empty axis gives the identity: -inf for Max, the type's largest value for an integer Min.
  expect_case(op("ReduceMax", 18).i("keepdims", 0), {make_f32({2, 0}, {}), i64s({1})}, 1,
              {make_f32({2}, {-INFINITY, -INFINITY})});
  expect_case(
      op("ReduceMin", 18).i("keepdims", 0),
      {Tensor::from_vector(DType::kInt32, {2, 0}, std::vector<int32_t>{}), i64s({1})}, 1,
      {Tensor::from_vector(DType::kInt32, {2}, std::vector<int32_t>{INT32_MAX, INT32_MAX})});
  expect_case(op("ReduceLogSumExp", 18).i("keepdims", 0), {make_f32({2, 0}, {}), i64s({1})}, 1,
              {make_f32({2}, {-INFINITY, -INFINITY})});
  // uint64 beyond int64's range compares as unsigned; int64 extremes as signed.
  Tensor u =
      Tensor::from_vector(DType::kUInt64, {3}, std::vector<uint64_t>{1, ~uint64_t(0) - 5, 7});
  expect_case(op("ReduceMax", 18).i("keepdims", 0), {u}, 1,
              {Tensor::from_vector(DType::kUInt64, {}, std::vector<uint64_t>{~uint64_t(0) - 5})});
  Tensor s = make_i64({3}, {INT64_MIN, 5, INT64_MAX});
  expect_case(op("ReduceMin", 18).i("keepdims", 0), {s}, 1, {make_i64({}, {INT64_MIN})});
  // NaN wins Max and Min, on float16 too.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  expect_case(op("ReduceMin", 18).i("keepdims", 0),
              {testing::make_typed(DType::kFloat16, {2, 3}, {1, nan, -4, 2, 3, -1}), i64s({1})});
}

// Reductions over contiguous rows (CUDA: row_reduce_kernel, a warp per row or a block per row
// when rows are few and long, 16-byte loads after each row's unaligned head): global average
// pooling over H, W and the last axis of a transformer, rows of 63, 37 (no multiple of 8) and 3136
// elements, keepdims 0 and 1. Float32 against the loop in double; float16 and bfloat16 against the
// float32 node.
TEST(ReduceOpsKernel, ContiguousRowsEveryFloatType) {
  const std::pair<Shape, std::vector<int64_t>> cases[] = {
      {{2, 3, 7, 9}, {2, 3}}, {{2, 5, 56, 56}, {2, 3}}, {{3, 5, 768}, {-1}}, {{4, 37}, {-1}}};
  for (const auto& [shape, axes] : cases) {
    const int64_t n = axes.size() == 2 ? shape[2] * shape[3] : shape.back();
    const int64_t rows = shape_numel(shape) / n;
    std::vector<float> x(size_t(rows * n));
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = std::sin(float(i) * 0.73f) * 1.5f + 0.03f * float(i % 7);
    for (const char* name : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"}) {
      const std::string op_name = name;
      std::vector<float> ef(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        double acc = op_name == "ReduceMax" ? -INFINITY : op_name == "ReduceMin" ? INFINITY : 0.0;
        for (int64_t j = 0; j < n; ++j) {
          const double v = x[size_t(r * n + j)];
          acc = op_name == "ReduceMax"   ? std::max(acc, v)
                : op_name == "ReduceMin" ? std::min(acc, v)
                                         : acc + v;
        }
        ef[size_t(r)] = float(op_name == "ReduceMean" ? acc / double(n) : acc);
      }
      for (int64_t keep : {0, 1}) {
        Shape out = shape;
        if (keep) {
          for (int64_t a : axes) out[size_t(a < 0 ? a + int64_t(shape.size()) : a)] = 1;
        } else {
          out.resize(shape.size() - axes.size());
        }
        const std::string l =
            op_name + " " + shape_to_string(shape) + " keepdims " + std::to_string(keep);
        std::vector<testing::CaseInput> ins = {make_f32(shape, x), i64s(axes)};
        auto r = run_case({.node = op(name, 18).i("keepdims", keep),
                           .inputs = ins,
                           .expect_support = true,
                           .label = l});
        ASSERT_TRUE(r.ok()) << l << ": " << r.status().to_string();
        EXPECT_TRUE(all_close((*r)[0], make_f32(out, ef))) << l;
        for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
          auto h = testing::run_reduced_case({.node = op(name, 18).i("keepdims", keep),
                                              .inputs = ins,
                                              .expect_support = true,
                                              .label = l},
                                             dt);
          ASSERT_TRUE(h.ok()) << l << " " << dtype_name(dt) << ": " << h.status().to_string();
        }
      }
    }
  }
  // NaN wins Max and Min wherever it lies in a row (rows start at 0, 4 and 12 bytes past 16).
  std::vector<float> x(4 * 37, 0.5f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  x[1] = nan, x[37 + 20] = nan, x[3 * 37 + 36] = nan;
  for (const char* name : {"ReduceMax", "ReduceMin"}) {
    expect_case(op(name, 18).i("keepdims", 0), {make_f32({4, 37}, x), i64s({1})}, 1,
                {make_f32({4}, {nan, nan, 0.5f, nan})});
  }
}

TEST(ReduceOpsKernel, HardmaxAndTopKDtypesAxesAndLongLines) {
  std::vector<double> v(60);
  for (int i = 0; i < 60; ++i) v[i] = (i * 7) % 11 - 5;  // ties on every line
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kInt32, DType::kInt64,
                   DType::kUInt8}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    std::vector<double> w = v;
    if (dt == DType::kUInt8) {
      for (double& e : w) e += 5;
    }
    Tensor x = testing::make_typed(dt, {3, 4, 5}, w);
    for (int64_t axis : {0, 1, -1}) {
      if (is_float(dt)) expect_case(op("Hardmax", 13).i("axis", axis), {x});
      for (int64_t largest : {0, 1}) {
        expect_case(op("TopK", 11).i("axis", axis).i("largest", largest), {x, i64s({2})}, 2);
      }
    }
    expect_case(op("TopK", 11).i("axis", 1), {x, i64s({4})}, 2);  // K = the whole axis
  }
  // A line of 700 (several tiles of the block) with many ties.
  std::vector<float> y(1400);
  for (int i = 0; i < 1400; ++i) y[i] = float((i * 37) % 101);
  expect_case(op("TopK", 11), {make_f32({2, 700}, y), i64s({50})}, 2);
  expect_case(op("TopK", 11).i("largest", 0).i("axis", 0), {make_f32({700, 2}, y), i64s({9})}, 2);
}

}  // namespace
}  // namespace kiln
