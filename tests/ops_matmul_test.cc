// MatMul and Gemm: numpy-style shape inference with symbolic batch dims, the shared SGEMM against a
// naive double-precision loop (odd sizes, transposes, alpha/beta, leading dims), and the kernels on
// every backend, in strict FP32 and in TF32, FP16 and BF16, and on float16, bfloat16 and float64
// tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/gemm.h"
#include "backends/cpu/thread_pool.h"
#include "op_harness.h"
#include "typed_values.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::all_close;
using testing::BuildPrecision;
using testing::f32;
using testing::infer_node;
using testing::initializer;
using testing::make_f32;
using testing::op;
using testing::OpNode;
using testing::run_case;
using testing::typed;

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

OpNode matmul() { return op("MatMul", 17).named("mm0"); }
OpNode gemm() { return op("Gemm", 17).named("mm0"); }

TEST(MatMulInfer, BatchBroadcastAndPromotion) {
  auto r = infer_node(matmul(), {f32({kB, kS, 768}), f32({768, 3072})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, s, 3072]");
  EXPECT_EQ(r.dtype(), DType::kFloat32);
  EXPECT_TRUE(r.constraints.empty());
  // Attention scores: [b,h,s,d] x [b,h,d,s] and a broadcast batch dim.
  r = infer_node(matmul(), {f32({kB, 12, kS, 64}), f32({1, 12, 64, kS})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 12, s, s]");
  // 1-D on both sides: a scalar.
  r = infer_node(matmul(), {f32({5}), f32({5})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[]");
  // 1-D A is promoted and the dim dropped; batch dims come from B.
  r = infer_node(matmul(), {f32({7}), f32({kB, 7, 3})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 3]");
  // 1-D B.
  r = infer_node(matmul(), {f32({kB, 4, 7}), f32({7})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 4]");
}

TEST(MatMulInfer, SymbolicKIsRecordedAndConstantMismatchFails) {
  auto r = infer_node(matmul(), {f32({kB, kS}), f32({Dim::symbol("t"), 8})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  ASSERT_EQ(r.constraints.size(), 1u);
  EXPECT_EQ(r.constraints[0].kind, ops::Constraint::Kind::kEqual);
  EXPECT_NE(r.constraints[0].what.find("(K)"), std::string::npos);

  Status s = infer_node(matmul(), {f32({2, 3}), f32({4, 5})}).status;
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidModel);
  EXPECT_NE(s.message().find("mm0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("K"), std::string::npos) << s.message();
  // Batch dims 2 and 3 do not broadcast.
  EXPECT_FALSE(infer_node(matmul(), {f32({2, 4, 5}), f32({3, 5, 6})}).ok());
  EXPECT_FALSE(infer_node(matmul(), {f32({2, 4}), typed(DType::kFloat64, {4, 6})}).ok());
}

TEST(GemmInfer, TransposesAndBias) {
  auto r = infer_node(gemm().i("transB", 1), {f32({kB, 768}), f32({1000, 768}), f32({1000})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 1000]");
  r = infer_node(gemm().i("transA", 1), {f32({6, kB}), f32({6, 9})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 9]");
  // K mismatch with transB.
  Status s = infer_node(gemm().i("transB", 1), {f32({3, 768}), f32({768, 1000})}).status;
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("mm0"), std::string::npos) << s.message();
  // C of length 7 cannot broadcast to N = 1000.
  EXPECT_FALSE(infer_node(gemm(), {f32({3, 8}), f32({8, 1000}), f32({7})}).ok());
  // A must be 2-D.
  EXPECT_FALSE(infer_node(gemm(), {f32({2, 3, 8}), f32({8, 4})}).ok());
}

// C = alpha * op(A) * op(B) + beta * C in double, the oracle for the SGEMM.
void naive_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                const std::vector<float>& a, int64_t lda, const std::vector<float>& b, int64_t ldb,
                double beta, std::vector<double>* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        acc += double(ta ? a[p * lda + i] : a[i * lda + p]) *
               double(tb ? b[j * ldb + p] : b[p * ldb + j]);
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

// A few rows of A (a classifier head at batch 4, a projection at batch 8, every row count against
// B) against B and B^T, some large enough that the columns are split over threads: right against
// the naive loop, and bit for bit the same with one thread and with three.
TEST(Sgemm, FewRowsSplitOverThreadsMatchesOneThreadBitwise) {
  check_sgemm({4, 1000, 576, false, true, 1.f, 0.f, 0});
  check_sgemm({8, 1030, 300, false, false, 0.5f, 2.f, 3});
  check_sgemm({2, 4099, 700, false, true, -1.f, 1.f, 1});
  // Every row count of the register-blocked B form (1..8 rows), columns in a 32-block, a 16-block
  // and a tail of 5, alpha and beta (a decoder's projections at a few tokens).
  for (int64_t m = 1; m <= 8; ++m) check_sgemm({m, 53, 40, false, false, 0.75f, 0.5f, 2});
  for (bool tb : {false, true}) {
    const int64_t m = 5, n = 2051, k = 640;
    auto a = random_values(size_t(m * k), 7);
    auto b = random_values(size_t(n * k), 8);
    std::vector<float> c1(size_t(m * n)), c3(size_t(m * n));
    {
      backends::cpu::ScopedThreadLimit one(1);
      backends::cpu::sgemm(false, tb, m, n, k, 1.f, a.data(), k, b.data(), tb ? k : n, 0.f,
                           c1.data(), n);
    }
    {
      backends::cpu::ScopedThreadLimit three(3);
      backends::cpu::sgemm(false, tb, m, n, k, 1.f, a.data(), k, b.data(), tb ? k : n, 0.f,
                           c3.data(), n);
    }
    EXPECT_EQ(c1, c3) << "tb=" << tb;
  }
}

// sgemm_packed, B packed once (a layer's constant weights), gives sgemm's bits: B and B^T, a few
// rows (no packing on that path) and many, k over several 256-deep chunks, n over two 3072-wide
// panels with a partial sliver, ld wider than the row, alpha and beta, one thread and three.
TEST(Sgemm, PackedBGivesTheBitsOfSgemm) {
  struct Case {
    int64_t m, n, k;
    bool tb;
    float alpha, beta;
    int64_t pad;
  };
  for (const Case& g :
       {Case{197, 576, 192, false, 1.f, 0.f, 0}, Case{64, 3100, 600, false, 1.f, 0.f, 3},
        Case{130, 67, 259, true, -1.5f, 0.25f, 5}, Case{4, 1000, 576, true, 1.f, 0.f, 0},
        Case{1, 300, 700, false, 1.f, 1.f, 0}, Case{33, 47, 300, true, 0.5f, 2.f, 1}}) {
    const int64_t lda = g.k + g.pad, ldb = (g.tb ? g.k : g.n) + g.pad, ldc = g.n + g.pad;
    auto a = random_values(size_t(g.m * lda), 11);
    auto b = random_values(size_t((g.tb ? g.n : g.k) * ldb), 12);
    auto c0 = random_values(size_t(g.m * ldc), 13);
    const backends::cpu::PackedB packed(g.tb, g.k, g.n, b.data(), ldb);
    EXPECT_EQ(packed.k(), g.k);
    EXPECT_EQ(packed.n(), g.n);
    for (int threads : {1, 3}) {
      backends::cpu::ScopedThreadLimit limit(threads);
      std::vector<float> want = c0, got = c0;
      backends::cpu::sgemm(false, g.tb, g.m, g.n, g.k, g.alpha, a.data(), lda, b.data(), ldb,
                           g.beta, want.data(), ldc);
      backends::cpu::sgemm_packed(g.m, g.alpha, a.data(), lda, b.data(), ldb, packed, g.beta,
                                  got.data(), ldc);
      EXPECT_EQ(want, got) << g.m << "x" << g.n << "x" << g.k << " tb=" << g.tb << " threads "
                           << threads;
    }
  }
}

TEST(Sgemm, BetaZeroIgnoresNanAndKZeroScales) {
  std::vector<float> a(12, 1.f), b(12, 1.f);
  std::vector<float> c(9, std::numeric_limits<float>::quiet_NaN());
  backends::cpu::sgemm(false, false, 3, 3, 4, 1.f, a.data(), 4, b.data(), 3, 0.f, c.data(), 3);
  for (float v : c) EXPECT_EQ(v, 4.f);
  backends::cpu::sgemm(false, false, 3, 3, 0, 1.f, a.data(), 4, b.data(), 3, 0.5f, c.data(), 3);
  for (float v : c) EXPECT_EQ(v, 2.f);
}

// Element i of a float tensor (float32, float64, float16 or bfloat16) as a double.
double element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kFloat64:
      return t.data_as<double>()[i];
    case DType::kFloat16:
      return half_to_float(t.data_as<uint16_t>()[i]);
    case DType::kBFloat16:
      return bf16_to_float(t.data_as<uint16_t>()[i]);
    default:
      return t.data_as<float>()[i];
  }
}

// Batched matmul of row-major tensors (rank >= 2) with numpy broadcasting, in double, stored in
// a's dtype.
Tensor naive_matmul(const Tensor& a, const Tensor& b, const Shape& out) {
  Shape as = a.shape(), bs = b.shape();
  int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  size_t nb = out.size() - 2;
  int64_t batches = 1;
  for (size_t d = 0; d < nb; ++d) batches *= out[d];
  std::vector<double> y(size_t(batches * m * n));
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
          acc += element(a, ao + i * k + p) * element(b, bo + p * n + j);
        }
        y[size_t((t * m + i) * n + j)] = acc;
      }
    }
  }
  return testing::make_typed(a.dtype(), out, y);
}

TEST(MatMulKernel, HandComputed) {
  Tensor a = make_f32({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = make_f32({3, 2}, {7, 8, 9, 10, 11, 12});
  auto r = run_case(matmul(), {a, b});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_f32({2, 2}, {58, 64, 139, 154})));
  // 1-D x 1-D: the dot product, a scalar.
  auto d = run_case(matmul(), {make_f32({3}, {1, 2, 3}), make_f32({3}, {4, 5, 6})});
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
    auto r = run_case(matmul(), {a, b});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_TRUE(all_close((*r)[0], naive_matmul(a, b, c.out))) << shape_to_string(c.out);
  }
}

TEST(MatMulKernel, VectorOperandsAndZeroSize) {
  Tensor a = make_f32({2, 2, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  auto r = run_case(matmul(), {a, make_f32({3}, {1, 0, -1})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_f32({2, 2}, {-2, -2, -2, -2})));
  auto v = run_case(matmul(), {make_f32({2}, {1, 2}), make_f32({2, 3}, {1, 2, 3, 4, 5, 6})});
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_TRUE(all_close((*v)[0], make_f32({3}, {9, 12, 15})));
  auto z = run_case(matmul(), {make_f32({0, 3}, {}), make_f32({3, 4}, std::vector<float>(12, 1))});
  ASSERT_TRUE(z.ok()) << z.status().to_string();
  // K = 0 gives zeros, not garbage.
  auto k0 = run_case(matmul(), {make_f32({2, 0}, {}), make_f32({0, 3}, {})});
  ASSERT_TRUE(k0.ok()) << k0.status().to_string();
  for (int i = 0; i < 6; ++i) EXPECT_EQ((*k0)[0].data_as<float>()[i], 0.f);
}

TEST(MatMulKernel, Float64) {
  Tensor a = Tensor::from_vector(DType::kFloat64, {2, 2}, std::vector<double>{1, 2, 3, 4});
  Tensor b = Tensor::from_vector(DType::kFloat64, {2, 1}, std::vector<double>{1e-9, 1});
  auto r = run_case(matmul(), {a, b});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_DOUBLE_EQ((*r)[0].data_as<double>()[0], 2 + 1e-9);
  EXPECT_DOUBLE_EQ((*r)[0].data_as<double>()[1], 4 + 3e-9);
}

TEST(GemmKernel, AlphaBetaTransposesAndBroadcastC) {
  // A^T with A stored [K=2, M=3]; B^T with B stored [N=2, K=2].
  Tensor a = make_f32({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = make_f32({2, 2}, {1, 0, 1, 1});
  OpNode g = gemm().i("transA", 1).i("transB", 1).f("alpha", 2.f).f("beta", 0.5f);
  // op(A) = [[1,4],[2,5],[3,6]], op(B) = [[1,1],[0,1]] -> [[1,5],[2,7],[3,9]].
  Tensor row = make_f32({2}, {10, 20});
  auto r = run_case(g, {a, b, row});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_f32({3, 2}, {7, 20, 9, 24, 11, 28})));
  Tensor col = make_f32({3, 1}, {2, 4, 6});
  auto rc = run_case(g, {a, b, col});
  ASSERT_TRUE(rc.ok()) << rc.status().to_string();
  EXPECT_TRUE(all_close((*rc)[0], make_f32({3, 2}, {3, 11, 6, 16, 9, 21})));
  Tensor scalar = make_f32({}, {-2});
  auto rs = run_case(g, {a, b, scalar});
  ASSERT_TRUE(rs.ok()) << rs.status().to_string();
  EXPECT_TRUE(all_close((*rs)[0], make_f32({3, 2}, {1, 9, 3, 13, 5, 17})));
  auto none = run_case(g, {a, b});
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_TRUE(all_close((*none)[0], make_f32({3, 2}, {2, 10, 4, 14, 6, 18})));
}

TEST(GemmKernel, ViTSizedLinearAgainstNaive) {
  // A [2*197, 192] x W^T with W [384, 192] + bias.
  int64_t m = 394, k = 192, n = 384;
  Tensor a = make_f32({m, k}, random_values(size_t(m * k), 6));
  Tensor w = make_f32({n, k}, random_values(size_t(n * k), 7));
  Tensor bias = make_f32({n}, random_values(size_t(n), 8));
  auto r = run_case(gemm().i("transB", 1), {a, initializer(w), initializer(bias)});
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

// TF32, FP16 and BF16 engines against the FP32 reference, each held to the tolerance of what the
// node computed in (a backend that keeps FP32 is held to FP32).
TEST(MatMulKernel, ReducedPrecisionsAgainstTheFp32Reference) {
  Tensor a = make_f32({2, 33, 64}, random_values(2 * 33 * 64, 9));
  Tensor b = make_f32({64, 40}, random_values(64 * 40, 10));
  Tensor w = make_f32({40, 64}, random_values(40 * 64, 11));
  Tensor bias = make_f32({40}, random_values(40, 12));
  for (BuildPrecision p : {BuildPrecision::kTf32, BuildPrecision::kFp16, BuildPrecision::kBf16}) {
    testing::KernelCase mm{.node = matmul(), .inputs = {a, initializer(b)}, .precision = p};
    auto r = run_case(mm);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_TRUE(all_close((*r)[0], naive_matmul(a, b, {2, 33, 40})));
    testing::KernelCase linear{.node = gemm().i("transB", 1),
                               .inputs = {make_f32({33, 64}, random_values(33 * 64, 13)),
                                          initializer(w), initializer(bias)},
                               .precision = p};
    ASSERT_TRUE(run_case(linear).ok());
  }
}

std::vector<double> as_doubles(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

Tensor random_tensor(DType dt, const Shape& shape, uint32_t seed) {
  return testing::make_typed(dt, shape,
                             as_doubles(random_values(size_t(shape_numel(shape)), seed)));
}

// Float16, bfloat16 and float64 tensors compute as they are stored (FP32 accumulation for the half
// types): every way the CUDA MatMul maps batches onto GEMMs (A's batches folded into rows, strided
// batches, an A shared by B's batches, one GEMM per broadcast batch at odd element offsets), a
// constant B, and 1-D operands. A device must accept them (expect_support).
TEST(MatMulKernel, HalfAndDoubleTensorsInEveryShapeKind) {
  struct Case {
    Shape a, b, out;
    bool constant_b = false;
  };
  const std::vector<Case> cases = {
      {{2, 33, 64}, {64, 40}, {2, 33, 40}},       {{2, 33, 64}, {64, 40}, {2, 33, 40}, true},
      {{2, 4, 3, 8}, {2, 4, 8, 5}, {2, 4, 3, 5}}, {{5, 8}, {3, 8, 7}, {3, 5, 7}},
      {{1, 3, 5, 7}, {4, 1, 7, 3}, {4, 3, 5, 3}},
  };
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    const testing::Tolerance tol = testing::op_tolerance(dt);
    for (const Case& c : cases) {
      Tensor a = random_tensor(dt, c.a, 21), b = random_tensor(dt, c.b, 22);
      const std::string label = std::string(dtype_name(dt)) + " " + shape_to_string(c.a) + " x " +
                                shape_to_string(c.b) + (c.constant_b ? " (constant B)" : "");
      testing::KernelCase kc{.node = matmul(),
                             .inputs = {a, c.constant_b ? initializer(b) : testing::CaseInput(b)},
                             .expect_support = true,
                             .label = label};
      auto r = run_case(kc);
      ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
      EXPECT_EQ((*r)[0].dtype(), dt) << label;
      EXPECT_TRUE(all_close((*r)[0], naive_matmul(a, b, c.out), tol.atol, tol.rtol)) << label;
    }
    // A vector times a batch of matrices, a batch of matrices times a vector, a dot product.
    for (auto [sa, sb] :
         std::vector<std::pair<Shape, Shape>>{{{8}, {3, 8, 6}}, {{2, 3, 8}, {8}}, {{8}, {8}}}) {
      const std::string label =
          std::string(dtype_name(dt)) + " " + shape_to_string(sa) + " x " + shape_to_string(sb);
      testing::KernelCase kc{.node = matmul(),
                             .inputs = {random_tensor(dt, sa, 23), random_tensor(dt, sb, 24)},
                             .expect_support = true,
                             .label = label};
      auto r = run_case(kc);
      ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
      EXPECT_EQ((*r)[0].dtype(), dt) << label;
    }
  }
}

// Gemm on float16, bfloat16 and float64 tensors: transposes, alpha and beta, and C as a row vector
// (the bias epilogue's case on float32 tensors), a column, a scalar, a full matrix, or absent.
TEST(GemmKernel, HalfAndDoubleTensorsWithEveryFormOfC) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    Tensor a = random_tensor(dt, {6, 5}, 31);  // transA: M = 5, K = 6
    Tensor b = random_tensor(dt, {4, 6}, 32);  // transB: N = 4
    struct Case {
      const char* what;
      std::optional<Shape> c;
      float beta;
    };
    for (const Case& c : {Case{"row", Shape{4}, 1.f}, Case{"row, beta 2", Shape{1, 4}, 2.f},
                          Case{"column", Shape{5, 1}, 0.5f}, Case{"scalar", Shape{}, -1.f},
                          Case{"full", Shape{5, 4}, 1.f}, Case{"none", std::nullopt, 1.f}}) {
      std::vector<testing::CaseInput> in = {a, initializer(b)};
      if (c.c) in.push_back(random_tensor(dt, *c.c, 33));
      const std::string label = std::string(dtype_name(dt)) + " Gemm, C " + c.what;
      testing::KernelCase kc{
          .node = gemm().i("transA", 1).i("transB", 1).f("alpha", 0.5f).f("beta", c.beta),
          .inputs = in,
          .expect_support = true,
          .label = label};
      auto r = run_case(kc);
      ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
      EXPECT_EQ((*r)[0].dtype(), dt) << label;
      EXPECT_EQ((*r)[0].shape(), (Shape{5, 4})) << label;
    }
  }
}

TEST(GemmKernel, UnsupportedDtypeIsAnError) {
  Tensor a = Tensor::from_vector(DType::kInt8, {1, 1}, std::vector<int8_t>{1});
  auto r = run_case(gemm(), {a, a});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("Gemm"), std::string::npos);
}

TEST(GemmKernel, IntegerAndHalfDtypesWidenToDouble) {
  Tensor a = testing::make_i64({2, 2}, {1, 2, 3, 4});
  auto r = run_case(gemm(), {a, a});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const int64_t* y = (*r)[0].data_as<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(y, y + 4), (std::vector<int64_t>{7, 10, 15, 22}));
  std::vector<uint16_t> h = {float_to_half(1.f), float_to_half(2.f), float_to_half(3.f),
                             float_to_half(4.f)};
  Tensor ah = Tensor::from_vector(DType::kFloat16, {2, 2}, h);
  r = run_case(matmul(), {ah, ah});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(half_to_float((*r)[0].data_as<uint16_t>()[3]), 22.f);
}

// kiln::MatMulBias: act(MatMul(A, B) + bias) against a double-precision loop, for each activation
// and bias shape that broadcasts to the product from the right (a row of N, a column of M, a full
// [M, N] and none), with A batched; strict FP32 on every device (CUDA: cuBLASLt then one epilogue
// pass), and float16 and bfloat16 tensors as the precision pass leaves the layer.
// M = N: a [M, 1] bias has N elements, as a row vector does (cuBLASLt's epilogue takes only the
// latter).
TEST(MatMulBiasKernel, EveryActivationAndBiasShape) {
  const int64_t batch = 2, M = 8, K = 12, N = 8;
  Tensor a = make_f32({batch, M, K}, random_values(size_t(batch * M * K), 81));
  std::vector<float> wv = random_values(size_t(K * N), 82);
  for (float& x : wv) x *= 0.4f;
  Tensor w = make_f32({K, N}, wv);
  struct Act {
    const char* name;
    double (*f)(double);
  };
  const Act acts[] = {
      {"none", [](double y) { return y; }},
      {"relu", [](double y) { return std::max(y, 0.0); }},
      {"gelu_erf", [](double y) { return 0.5 * y * (1 + std::erf(y / std::sqrt(2.0))); }},
      {"gelu_tanh",
       [](double y) {
         return 0.5 * y * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (y + 0.044715 * y * y * y)));
       }},
  };
  const std::vector<std::vector<int64_t>> bias_shapes = {{N}, {1, N}, {M, 1}, {M, N}, {}};
  for (const Act& act : acts) {
    for (const auto& bs : bias_shapes) {
      const bool has_bias = !bs.empty();
      int64_t bn = 1;
      for (int64_t d : bs) bn *= d;
      Tensor bias = make_f32(bs, random_values(size_t(bn), 83));
      Tensor want = make_f32({batch, M, N}, std::vector<float>(size_t(batch * M * N)));
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = 0; n < N; ++n) {
            double v = 0;
            for (int64_t k = 0; k < K; ++k)
              v += double(a.data_as<float>()[(b * M + m) * K + k]) * wv[size_t(k * N + n)];
            if (has_bias) {
              // Right-aligned: [N] and [1, N] index n, [M, 1] index m, [M, N] both.
              const int64_t rows = bs.size() == 2 ? bs[0] : 1, cols = bs.back();
              v += bias.data_as<float>()[(rows == 1 ? 0 : m) * cols + (cols == 1 ? 0 : n)];
            }
            want.data_as<float>()[(b * M + m) * N + n] = float(act.f(v));
          }
        }
      }
      OpNode node = op("MatMulBias", 1, "kiln").named("mmb0").s("activation", act.name);
      std::vector<testing::CaseInput> inputs = {a, initializer(w)};
      if (has_bias) inputs.push_back(initializer(bias));
      const std::string label =
          std::string(act.name) + " bias " + (has_bias ? shape_to_string(bs) : "none");
      auto r = run_case({.node = node,
                         .inputs = inputs,
                         .expected = {want},
                         .expect_support = true,
                         .label = label});
      ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
      for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
        auto h = testing::run_reduced_case({.node = node,
                                            .inputs = inputs,
                                            .expect_support = true,
                                            .label = label + " " + std::string(dtype_name(dt))},
                                           dt);
        ASSERT_TRUE(h.ok()) << label << " " << dtype_name(dt) << ": " << h.status().to_string();
      }
      // A residual (input 3, the product's shape) is added last; CUDA adds it as cuBLASLt's C,
      // and takes it with no activation only.
      if (std::string(act.name) != "none") continue;
      Tensor res = make_f32({batch, M, N}, random_values(size_t(batch * M * N), 84));
      Tensor want_r = want;
      for (int64_t i = 0; i < batch * M * N; ++i)
        want_r.data_as<float>()[i] += res.data_as<float>()[i];
      std::vector<testing::CaseInput> rin = {a, initializer(w),
                                             has_bias ? initializer(bias) : testing::kNoInput, res};
      const std::string rlabel = label + " + residual";
      auto rr = run_case({.node = node,
                          .inputs = rin,
                          .expected = {want_r},
                          .expect_support = true,
                          .label = rlabel});
      ASSERT_TRUE(rr.ok()) << rlabel << ": " << rr.status().to_string();
      for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
        auto h = testing::run_reduced_case({.node = node,
                                            .inputs = rin,
                                            .expect_support = true,
                                            .label = rlabel + " " + std::string(dtype_name(dt))},
                                           dt);
        ASSERT_TRUE(h.ok()) << rlabel << " " << dtype_name(dt) << ": " << h.status().to_string();
      }
    }
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// ---- Det ----

TEST(DetInfer, DropsTheMatrixDims) {
  const Dim b = Dim::symbol("b"), m = Dim::symbol("m");
  auto r = testing::infer_node(testing::op("Det", 22), {testing::f32({b, 2, m, m})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 2]");
  EXPECT_EQ(testing::infer_node(testing::op("Det", 22), {testing::f32({3, 3})}).shape(), "[]");
  EXPECT_FALSE(testing::infer_node(testing::op("Det", 22), {testing::f32({2, 3})}).ok());
  EXPECT_FALSE(testing::infer_node(testing::op("Det", 22), {testing::f32({3})}).ok());
  EXPECT_FALSE(
      testing::infer_node(testing::op("Det", 22), {testing::typed(DType::kInt32, {2, 2})}).ok());
}

TEST(DetKernel, HandComputedWithPivotsAndSingular) {
  // [[1,2],[3,4]] = -2; [[0,1,2],[1,0,3],[4,-3,8]] (a zero first pivot: rows swap) = -2 by
  // cofactors: -1*(8-12) + 2*(-3) ; [[1,2],[2,4]] is singular.
  auto got = testing::run_case(testing::op("Det", 22),
                               {testing::make_f32({2, 2, 2}, {1, 2, 3, 4, 1, 2, 2, 4})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(testing::all_close((*got)[0], testing::make_f32({2}, {-2, 0}), 1e-6, 0));
  got = testing::run_case(testing::op("Det", 22),
                          {testing::make_f32({3, 3}, {0, 1, 2, 1, 0, 3, 4, -3, 8})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(testing::all_close((*got)[0], testing::make_f32({}, {-2}), 1e-6, 0));
  // A 4x4 permutation of diag(1, 2, 3, 4) with one swap (rows 0 and 3): -24.
  got = testing::run_case(
      testing::op("Det", 22),
      {testing::make_f32({4, 4}, {0, 0, 0, 4, 0, 2, 0, 0, 0, 0, 3, 0, 1, 0, 0, 0})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(testing::all_close((*got)[0], testing::make_f32({}, {-24}), 1e-5, 0));
}

}  // namespace
}  // namespace kiln
