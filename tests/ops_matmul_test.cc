// MatMul and Gemm: numpy-style shape inference with symbolic batch dims, the shared SGEMM against a
// naive double-precision loop (odd sizes, transposes, alpha/beta, leading dims), and the kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backends/cpu/gemm.h"
#include "ir/graph.h"
#include "ops/schema.h"
#include "test_util.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::all_close;
using testing::make_f32;
using testing::run_cpu_kernel;

struct InferCase {
  ir::Graph g;
  std::vector<ops::Constraint> constraints;
  std::vector<ops::InferContext::Output> outputs;

  int input(DType dt, std::vector<Dim> shape) {
    int v = g.add_value("in" + std::to_string(g.values.size()));
    g.values[v].dtype = dt;
    g.values[v].shape = std::move(shape);
    return v;
  }
  Status run(const std::string& op, std::vector<int> inputs, ir::Attributes attrs = {}) {
    ir::Node n;
    n.name = "mm0";
    n.op_type = op;
    n.opset = 17;
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
ir::Attribute float_attr(float v) {
  ir::Attribute a;
  a.type = ir::AttrType::kFloat;
  a.f = v;
  return a;
}

// Deterministic values in [-1, 1).
std::vector<float> random_values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = float(s >> 8) / float(1 << 23) - 1.f;
  }
  return v;
}

const Dim kB = Dim::symbol("b");
const Dim kS = Dim::symbol("s");

TEST(MatMulInfer, BatchBroadcastAndPromotion) {
  {
    InferCase c;
    int a = c.input(DType::kFloat32, {kB, kS, 768});
    int w = c.input(DType::kFloat32, {768, 3072});
    ASSERT_TRUE(c.run("MatMul", {a, w}).ok());
    EXPECT_EQ(c.shape(), "[b, s, 3072]");
    EXPECT_EQ(c.outputs[0].dtype, DType::kFloat32);
    EXPECT_TRUE(c.constraints.empty());
  }
  {
    InferCase c;  // attention scores: [b,h,s,d] x [b,h,d,s] and a broadcast batch dim
    int q = c.input(DType::kFloat32, {kB, 12, kS, 64});
    int k = c.input(DType::kFloat32, {1, 12, 64, kS});
    ASSERT_TRUE(c.run("MatMul", {q, k}).ok());
    EXPECT_EQ(c.shape(), "[b, 12, s, s]");
  }
  {
    InferCase c;  // 1-D on both sides: a scalar
    int a = c.input(DType::kFloat32, {5});
    int b = c.input(DType::kFloat32, {5});
    ASSERT_TRUE(c.run("MatMul", {a, b}).ok());
    EXPECT_EQ(c.shape(), "[]");
  }
  {
    InferCase c;  // 1-D A is promoted and the dim dropped; batch dims come from B
    int a = c.input(DType::kFloat32, {7});
    int b = c.input(DType::kFloat32, {kB, 7, 3});
    ASSERT_TRUE(c.run("MatMul", {a, b}).ok());
    EXPECT_EQ(c.shape(), "[b, 3]");
  }
  {
    InferCase c;  // 1-D B
    int a = c.input(DType::kFloat32, {kB, 4, 7});
    int b = c.input(DType::kFloat32, {7});
    ASSERT_TRUE(c.run("MatMul", {a, b}).ok());
    EXPECT_EQ(c.shape(), "[b, 4]");
  }
}

TEST(MatMulInfer, SymbolicKIsRecordedAndConstantMismatchFails) {
  {
    InferCase c;
    int a = c.input(DType::kFloat32, {kB, kS});
    int b = c.input(DType::kFloat32, {Dim::symbol("t"), 8});
    ASSERT_TRUE(c.run("MatMul", {a, b}).ok());
    ASSERT_EQ(c.constraints.size(), 1u);
    EXPECT_EQ(c.constraints[0].kind, ops::Constraint::Kind::kEqual);
    EXPECT_NE(c.constraints[0].what.find("(K)"), std::string::npos);
  }
  {
    InferCase c;
    int a = c.input(DType::kFloat32, {2, 3});
    int b = c.input(DType::kFloat32, {4, 5});
    Status s = c.run("MatMul", {a, b});
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kInvalidModel);
    EXPECT_NE(s.message().find("mm0"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("K"), std::string::npos) << s.message();
  }
  {
    InferCase c;  // batch dims 2 and 3 do not broadcast
    int a = c.input(DType::kFloat32, {2, 4, 5});
    int b = c.input(DType::kFloat32, {3, 5, 6});
    EXPECT_FALSE(c.run("MatMul", {a, b}).ok());
  }
  {
    InferCase c;
    int a = c.input(DType::kFloat32, {2, 4});
    int b = c.input(DType::kFloat64, {4, 6});
    EXPECT_FALSE(c.run("MatMul", {a, b}).ok());
  }
}

TEST(GemmInfer, TransposesAndBias) {
  {
    InferCase c;
    int a = c.input(DType::kFloat32, {kB, 768});
    int w = c.input(DType::kFloat32, {1000, 768});
    int bias = c.input(DType::kFloat32, {1000});
    ir::Attributes at;
    at.set("transB", int_attr(1));
    ASSERT_TRUE(c.run("Gemm", {a, w, bias}, at).ok());
    EXPECT_EQ(c.shape(), "[b, 1000]");
  }
  {
    InferCase c;
    int a = c.input(DType::kFloat32, {6, kB});
    int w = c.input(DType::kFloat32, {6, 9});
    ir::Attributes at;
    at.set("transA", int_attr(1));
    ASSERT_TRUE(c.run("Gemm", {a, w}, at).ok());
    EXPECT_EQ(c.shape(), "[b, 9]");
  }
  {
    InferCase c;  // K mismatch with transB
    int a = c.input(DType::kFloat32, {3, 768});
    int w = c.input(DType::kFloat32, {768, 1000});
    ir::Attributes at;
    at.set("transB", int_attr(1));
    Status s = c.run("Gemm", {a, w}, at);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("mm0"), std::string::npos) << s.message();
  }
  {
    InferCase c;  // C of length 7 cannot broadcast to N = 1000
    int a = c.input(DType::kFloat32, {3, 8});
    int w = c.input(DType::kFloat32, {8, 1000});
    int bias = c.input(DType::kFloat32, {7});
    EXPECT_FALSE(c.run("Gemm", {a, w, bias}).ok());
  }
  {
    InferCase c;  // A must be 2-D
    int a = c.input(DType::kFloat32, {2, 3, 8});
    int w = c.input(DType::kFloat32, {8, 4});
    EXPECT_FALSE(c.run("Gemm", {a, w}).ok());
  }
}

// C = alpha * op(A) * op(B) + beta * C in double, the oracle for the SGEMM.
void naive_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                const std::vector<float>& a, int64_t lda, const std::vector<float>& b, int64_t ldb,
                double beta, std::vector<double>* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        acc += double(ta ? a[p * lda + i] : a[i * lda + p]) * double(tb ? b[j * ldb + p] : b[p * ldb + j]);
      }
      double& y = (*c)[i * ldc + j];
      y = alpha * acc + (beta == 0 ? 0.0 : beta * y);
    }
  }
}

struct GemmCase {
  int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
  int64_t pad;  // extra leading-dim elements, to test ld != width
};

void check_sgemm(const GemmCase& g) {
  int64_t lda = (g.ta ? g.m : g.k) + g.pad, ldb = (g.tb ? g.k : g.n) + g.pad, ldc = g.n + g.pad;
  int64_t a_rows = g.ta ? g.k : g.m, b_rows = g.tb ? g.n : g.k;
  auto a = random_values(size_t(a_rows * lda), 1);
  auto b = random_values(size_t(b_rows * ldb), 2);
  auto c0 = random_values(size_t(g.m * ldc), 3);
  std::vector<float> c = c0;
  std::vector<double> e(c0.begin(), c0.end());
  backends::cpu::sgemm(g.ta, g.tb, g.m, g.n, g.k, g.alpha, a.data(), lda, b.data(), ldb, g.beta,
                       c.data(), ldc);
  naive_gemm(g.ta, g.tb, g.m, g.n, g.k, g.alpha, a, lda, b, ldb, g.beta, &e, ldc);
  int64_t bad = 0;
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      size_t x = size_t(i * ldc + j);
      // Padding columns beyond n must be left alone.
      double expect = j < g.n ? e[x] : double(c0[x]);
      if (std::fabs(c[x] - expect) > 1e-4 + 1e-3 * std::fabs(expect)) {
        if (bad++ < 3) {
          ADD_FAILURE() << g.m << "x" << g.n << "x" << g.k << " ta=" << g.ta << " tb=" << g.tb
                        << " at (" << i << "," << j << "): got " << c[x] << ", expected " << expect;
        }
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(Sgemm, OddSizesTransposesAlphaBeta) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      check_sgemm({1, 1, 1, ta, tb, 1.f, 0.f, 0});
      check_sgemm({7, 13, 5, ta, tb, 1.f, 0.f, 0});
      check_sgemm({7, 13, 5, ta, tb, 0.5f, 2.f, 3});
      check_sgemm({130, 67, 259, ta, tb, 1.f, 0.f, 0});
      check_sgemm({130, 67, 259, ta, tb, -1.5f, 0.25f, 5});
      check_sgemm({33, 47, 300, ta, tb, 1.f, 1.f, 1});
      check_sgemm({1, 300, 700, ta, tb, 1.f, 0.f, 0});  // matrix-vector paths
      check_sgemm({300, 1, 700, ta, tb, 0.5f, 2.f, 2});
      check_sgemm({1, 45, 37, ta, tb, 1.f, 1.f, 3});
    }
  }
}

TEST(Sgemm, CrossesEveryBlockBoundary) {
  check_sgemm({197, 40, 530, false, false, 1.f, 0.f, 0});  // K > 2 blocks, M > 2 blocks
  check_sgemm({5, 3100, 9, false, true, 1.f, 0.f, 0});     // N > one panel
  check_sgemm({3, 5, 5000, false, false, 1.f, 0.f, 0});    // long K, accumulated in float
  check_sgemm({64, 64, 5000, true, false, 1.f, 0.f, 0});
}

TEST(Sgemm, BetaZeroIgnoresNanAndKZeroScales) {
  std::vector<float> a(12, 1.f), b(12, 1.f);
  std::vector<float> c(9, std::numeric_limits<float>::quiet_NaN());
  backends::cpu::sgemm(false, false, 3, 3, 4, 1.f, a.data(), 4, b.data(), 3, 0.f, c.data(), 3);
  for (float v : c) EXPECT_EQ(v, 4.f);
  backends::cpu::sgemm(false, false, 3, 3, 0, 1.f, a.data(), 4, b.data(), 3, 0.5f, c.data(), 3);
  for (float v : c) EXPECT_EQ(v, 2.f);
}

ir::Node make_node(const std::string& op, ir::Attributes attrs = {}) {
  ir::Node n;
  n.name = "mm0";
  n.op_type = op;
  n.opset = 17;
  n.attrs = std::move(attrs);
  return n;
}

// Batched matmul of row-major tensors with numpy broadcasting, in double.
Tensor naive_matmul(const Tensor& a, const Tensor& b, const Shape& out) {
  Shape as = a.shape(), bs = b.shape();
  int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  size_t nb = out.size() - 2;
  int64_t batches = 1;
  for (size_t d = 0; d < nb; ++d) batches *= out[d];
  std::vector<float> y(size_t(batches * m * n));
  for (int64_t t = 0; t < batches; ++t) {
    // Decompose t into output batch indices, then map through broadcasting.
    int64_t ao = 0, bo = 0, rem = t, sa = m * k, sb = k * n;
    for (int d = int(nb) - 1; d >= 0; --d) {
      int64_t i = rem % out[d];
      rem /= out[d];
      int da = d - int(nb) + int(as.size()) - 2, db = d - int(nb) + int(bs.size()) - 2;
      int64_t dima = da >= 0 ? as[da] : 1, dimb = db >= 0 ? bs[db] : 1;
      ao += (dima == 1 ? 0 : i) * sa;
      bo += (dimb == 1 ? 0 : i) * sb;
      sa *= dima;
      sb *= dimb;
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p) {
          acc += double(a.data_as<float>()[ao + i * k + p]) * b.data_as<float>()[bo + p * n + j];
        }
        y[size_t((t * m + i) * n + j)] = float(acc);
      }
    }
  }
  return make_f32(out, y);
}

TEST(MatMulKernel, HandComputed) {
  Tensor a = make_f32({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = make_f32({3, 2}, {7, 8, 9, 10, 11, 12});
  auto r = run_cpu_kernel(make_node("MatMul"), {a, b}, {{DType::kFloat32, {2, 2}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_f32({2, 2}, {58, 64, 139, 154})));
  // 1-D x 1-D: the dot product, a scalar.
  auto d = run_cpu_kernel(make_node("MatMul"), {make_f32({3}, {1, 2, 3}), make_f32({3}, {4, 5, 6})},
                          {{DType::kFloat32, {}}});
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_TRUE(all_close((*d)[0], make_f32({}, {32})));
}

TEST(MatMulKernel, BroadcastBatchesAgainstNaive) {
  struct Case {
    Shape a, b, out;
  };
  for (const Case& c : std::vector<Case>{{{2, 197, 64}, {64, 96}, {2, 197, 96}},
                                         {{2, 3, 17, 8}, {2, 3, 8, 19}, {2, 3, 17, 19}},
                                         {{1, 3, 5, 8}, {4, 1, 8, 6}, {4, 3, 5, 6}},
                                         {{5, 8}, {3, 8, 7}, {3, 5, 7}}}) {
    Tensor a = make_f32(c.a, random_values(size_t(shape_numel(c.a)), 4));
    Tensor b = make_f32(c.b, random_values(size_t(shape_numel(c.b)), 5));
    auto r = run_cpu_kernel(make_node("MatMul"), {a, b}, {{DType::kFloat32, c.out}});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_TRUE(all_close((*r)[0], naive_matmul(a, b, c.out))) << shape_to_string(c.out);
  }
}

TEST(MatMulKernel, VectorOperandsAndZeroSize) {
  Tensor a = make_f32({2, 2, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  auto r = run_cpu_kernel(make_node("MatMul"), {a, make_f32({3}, {1, 0, -1})},
                          {{DType::kFloat32, {2, 2}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_f32({2, 2}, {-2, -2, -2, -2})));
  auto v = run_cpu_kernel(make_node("MatMul"), {make_f32({2}, {1, 2}), make_f32({2, 3}, {1, 2, 3, 4, 5, 6})},
                          {{DType::kFloat32, {3}}});
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_TRUE(all_close((*v)[0], make_f32({3}, {9, 12, 15})));
  auto z = run_cpu_kernel(make_node("MatMul"), {make_f32({0, 3}, {}), make_f32({3, 4}, std::vector<float>(12, 1))},
                          {{DType::kFloat32, {0, 4}}});
  ASSERT_TRUE(z.ok()) << z.status().to_string();
  // K = 0 gives zeros, not garbage.
  auto k0 = run_cpu_kernel(make_node("MatMul"), {make_f32({2, 0}, {}), make_f32({0, 3}, {})},
                           {{DType::kFloat32, {2, 3}}});
  ASSERT_TRUE(k0.ok()) << k0.status().to_string();
  for (int i = 0; i < 6; ++i) EXPECT_EQ((*k0)[0].data_as<float>()[i], 0.f);
}

TEST(MatMulKernel, Float64) {
  Tensor a = Tensor::from_vector(DType::kFloat64, {2, 2}, std::vector<double>{1, 2, 3, 4});
  Tensor b = Tensor::from_vector(DType::kFloat64, {2, 1}, std::vector<double>{1e-9, 1});
  auto r = run_cpu_kernel(make_node("MatMul"), {a, b}, {{DType::kFloat64, {2, 1}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_DOUBLE_EQ((*r)[0].data_as<double>()[0], 2 + 1e-9);
  EXPECT_DOUBLE_EQ((*r)[0].data_as<double>()[1], 4 + 3e-9);
}

TEST(GemmKernel, AlphaBetaTransposesAndBroadcastC) {
  // A^T with A stored [K=2, M=3]; B^T with B stored [N=2, K=2].
  Tensor a = make_f32({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = make_f32({2, 2}, {1, 0, 1, 1});
  ir::Attributes at;
  at.set("transA", int_attr(1));
  at.set("transB", int_attr(1));
  at.set("alpha", float_attr(2.f));
  at.set("beta", float_attr(0.5f));
  // op(A) = [[1,4],[2,5],[3,6]], op(B) = [[1,1],[0,1]] -> [[1,5],[2,7],[3,9]].
  Tensor row = make_f32({2}, {10, 20});
  auto r = run_cpu_kernel(make_node("Gemm", at), {a, b, row}, {{DType::kFloat32, {3, 2}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_f32({3, 2}, {7, 20, 9, 24, 11, 28})));
  Tensor col = make_f32({3, 1}, {2, 4, 6});
  auto rc = run_cpu_kernel(make_node("Gemm", at), {a, b, col}, {{DType::kFloat32, {3, 2}}});
  ASSERT_TRUE(rc.ok()) << rc.status().to_string();
  EXPECT_TRUE(all_close((*rc)[0], make_f32({3, 2}, {3, 11, 6, 16, 9, 21})));
  Tensor scalar = make_f32({}, {-2});
  auto rs = run_cpu_kernel(make_node("Gemm", at), {a, b, scalar}, {{DType::kFloat32, {3, 2}}});
  ASSERT_TRUE(rs.ok()) << rs.status().to_string();
  EXPECT_TRUE(all_close((*rs)[0], make_f32({3, 2}, {1, 9, 3, 13, 5, 17})));
  auto none = run_cpu_kernel(make_node("Gemm", at), {a, b}, {{DType::kFloat32, {3, 2}}});
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_TRUE(all_close((*none)[0], make_f32({3, 2}, {2, 10, 4, 14, 6, 18})));
}

TEST(GemmKernel, ViTSizedLinearAgainstNaive) {
  // A [2*197, 192] x W^T with W [384, 192] + bias.
  int64_t m = 394, k = 192, n = 384;
  Tensor a = make_f32({m, k}, random_values(size_t(m * k), 6));
  Tensor w = make_f32({n, k}, random_values(size_t(n * k), 7));
  Tensor bias = make_f32({n}, random_values(size_t(n), 8));
  ir::Attributes at;
  at.set("transB", int_attr(1));
  auto r = run_cpu_kernel(make_node("Gemm", at), {a, w, bias}, {{DType::kFloat32, {m, n}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::vector<float> e(size_t(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = bias.data_as<float>()[j];
      for (int64_t p = 0; p < k; ++p) {
        acc += double(a.data_as<float>()[i * k + p]) * w.data_as<float>()[j * k + p];
      }
      e[size_t(i * n + j)] = float(acc);
    }
  }
  EXPECT_TRUE(all_close((*r)[0], make_f32({m, n}, e)));
}

TEST(GemmKernel, UnsupportedDtypeIsAnError) {
  Tensor a = Tensor::from_vector(DType::kInt8, {1, 1}, std::vector<int8_t>{1});
  auto r = run_cpu_kernel(make_node("Gemm"), {a, a}, {{DType::kInt8, {1, 1}}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("Gemm"), std::string::npos);
}

TEST(GemmKernel, IntegerAndHalfDtypesWidenToDouble) {
  Tensor a = testing::make_i64({2, 2}, {1, 2, 3, 4});
  auto r = run_cpu_kernel(make_node("Gemm"), {a, a}, {{DType::kInt64, {2, 2}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const int64_t* y = (*r)[0].data_as<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(y, y + 4), (std::vector<int64_t>{7, 10, 15, 22}));
  std::vector<uint16_t> h = {float_to_half(1.f), float_to_half(2.f), float_to_half(3.f),
                             float_to_half(4.f)};
  Tensor ah = Tensor::from_vector(DType::kFloat16, {2, 2}, h);
  r = run_cpu_kernel(make_node("MatMul"), {ah, ah}, {{DType::kFloat16, {2, 2}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(half_to_float((*r)[0].data_as<uint16_t>()[3]), 22.f);
}

}  // namespace
}  // namespace kiln
