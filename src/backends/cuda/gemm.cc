// MatMul and Gemm on cuBLASLt. Row-major C = A*B is computed as column-major C^T = B^T * A^T.
// Precision is what the plan assigned the node: strict FP32 (CUBLAS_COMPUTE_32F), TF32
// (CUBLAS_COMPUTE_32F_FAST_TF32), or FP16/BF16 inputs (activations converted per run, constant
// weights once per engine by prepare_gemm) with FP32 accumulation and FP32 output. Gemm's bias vector runs as the BIAS epilogue.
#include <algorithm>

#include "backends/cuda/cuda_common.h"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;

#define KILN_LT_CHECK(expr, what)                                                                  \
  do {                                                                                             \
    cublasStatus_t kiln_s_ = (expr);                                                               \
    if (kiln_s_ != CUBLAS_STATUS_SUCCESS) {                                                        \
      return internal_error(std::string(what) + ": cuBLASLt status " + std::to_string(int(kiln_s_))); \
    }                                                                                              \
  } while (0)

int alignment_of(const void* p, int64_t batch_stride_bytes) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p) | uintptr_t(batch_stride_bytes) | 256;
  return int(a & (~a + 1));
}

// One GEMM problem in cuBLAS terms (column-major): D[m x n] = alpha * op(A) op(B) + beta * C.
struct Problem {
  bool trans_a = false, trans_b = false;  // of the cuBLAS operands
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  bool bias = false;
  int align_a = 256, align_b = 256, align_c = 256;
  bool operator==(const Problem&) const = default;
};

class LtGemm {
 public:
  explicit LtGemm(MathMode mode) : mode_(mode) {}
  ~LtGemm() { release(); }

  // D = alpha*op(A)op(B) + beta*C (C == D), plus bias[m] when given.
  Status run(const Problem& p, const void* a, const void* b, float* d, const float* bias, float alpha, float beta,
             StreamResources* res) {
    if (!(p == key_) || !ready_) KILN_RETURN_IF_ERROR(plan(p, res));
    if (p.bias) {
      KILN_LT_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
                    "setting the bias pointer");
    }
    KILN_LT_CHECK(cublasLtMatmul(res->lt, desc_, &alpha, a, la_, b, lb_, &beta, d, lc_, d, lc_, &algo_,
                                 res->workspace, res->workspace_bytes, res->stream),
                  "cublasLtMatmul");
    return ok_status();
  }

 private:
  void release() {
    if (desc_) cublasLtMatmulDescDestroy(desc_);
    if (la_) cublasLtMatrixLayoutDestroy(la_);
    if (lb_) cublasLtMatrixLayoutDestroy(lb_);
    if (lc_) cublasLtMatrixLayoutDestroy(lc_);
    desc_ = nullptr, la_ = lb_ = lc_ = nullptr;
    ready_ = false;
  }

  Status layout(cublasLtMatrixLayout_t* l, cudaDataType t, int64_t rows, int64_t cols, int64_t ld, int batch,
                int64_t stride) {
    KILN_LT_CHECK(cublasLtMatrixLayoutCreate(l, t, uint64_t(rows), uint64_t(cols), ld), "creating a layout");
    if (batch > 1) {
      int32_t bc = batch;
      KILN_LT_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)), "batch");
      KILN_LT_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                     sizeof(stride)),
                    "batch stride");
    }
    return ok_status();
  }

  Status plan(const Problem& p, StreamResources* res) {
    release();
    cublasComputeType_t ct = mode_ == MathMode::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cudaDataType in_t = mode_ == MathMode::kFp16 ? CUDA_R_16F : mode_ == MathMode::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
    KILN_LT_CHECK(cublasLtMatmulDescCreate(&desc_, ct, CUDA_R_32F), "creating the matmul descriptor");
    cublasOperation_t ta = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    KILN_LT_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
    KILN_LT_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
    if (p.bias) {
      cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      KILN_LT_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)), "epilogue");
    }
    // Stored shapes (column-major): op(A) is m x k, op(B) is k x n.
    KILN_RETURN_IF_ERROR(layout(&la_, in_t, p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k, p.lda, p.batch, p.stride_a));
    KILN_RETURN_IF_ERROR(layout(&lb_, in_t, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, p.ldb, p.batch, p.stride_b));
    KILN_RETURN_IF_ERROR(layout(&lc_, CUDA_R_32F, p.m, p.n, p.ldc, p.batch, p.stride_c));
    cublasLtMatmulPreference_t pref = nullptr;
    KILN_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref), "creating a preference");
    uint64_t ws = res->workspace_bytes;
    uint32_t aa = uint32_t(p.align_a), ab = uint32_t(p.align_b), ac = uint32_t(p.align_c);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof(ab));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof(ac));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof(ac));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(res->lt, desc_, la_, lb_, lc_, lc_, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      return unsupported("cuBLASLt has no algorithm for a " + std::to_string(p.m) + "x" + std::to_string(p.n) + "x" +
                         std::to_string(p.k) + " GEMM (batch " + std::to_string(p.batch) + ", status " +
                         std::to_string(int(st)) + ")");
    }
    algo_ = result.algo;
    key_ = p;
    ready_ = true;
    return ok_status();
  }

  MathMode mode_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, lc_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  Problem key_;
  bool ready_ = false;
};

// An operand in the GEMM's input precision: the FP32 tensor itself, the FP16/BF16 copy the engine
// prepared once for a constant (prepare_gemm), or a per-run conversion for an activation.
class LowPrecisionOperand {
 public:
  explicit LowPrecisionOperand(const void* prepared) : prepared_(prepared) {}
  StatusOr<const void*> get(const float* src, int64_t n, MathMode mode, cudaStream_t s) {
    if (mode != MathMode::kFp16 && mode != MathMode::kBf16) return static_cast<const void*>(src);
    if (prepared_) return prepared_;
    KILN_RETURN_IF_ERROR(buf_.reserve(size_t(std::max<int64_t>(n, 1)) * 2));
    if (mode == MathMode::kFp16) {
      KILN_RETURN_IF_ERROR(convert_f32_to_f16(src, buf_.data(), n, s));
    } else {
      KILN_RETURN_IF_ERROR(convert_f32_to_bf16(src, buf_.data(), n, s));
    }
    return static_cast<const void*>(buf_.data());
  }

 private:
  const void* prepared_;
  DeviceBuffer buf_;
};

size_t in_elem(MathMode m) { return m == MathMode::kFp16 || m == MathMode::kBf16 ? 2 : 4; }

class MatMulKernel final : public CudaKernel {
 public:
  MatMulKernel(MathMode mode, const void* prepared_a, const void* prepared_b)
      : CudaKernel(std::string("cuda.MatMul(cublasLt,") + math_mode_name(mode) + ")"), mode_(mode), gemm_(mode),
        a_op_(prepared_a), b_op_(prepared_b) {}

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &a = in[0], &b = in[1], &y = out[0];
    if (a.dtype != DType::kFloat32 || b.dtype != DType::kFloat32 || y.dtype != DType::kFloat32) {
      return unsupported(name_ + ": float32 only on CUDA");
    }
    if (a.rank() < 1 || b.rank() < 1) return invalid_argument("MatMul: inputs must have rank >= 1");
    if (y.numel() == 0) return ok_status();
    int64_t M = a.rank() == 1 ? 1 : a.shape[a.rank() - 2];
    int64_t K = a.shape[a.rank() - 1];
    int64_t N = b.rank() == 1 ? 1 : b.shape[b.rank() - 1];
    int64_t Kb = b.rank() == 1 ? b.shape[0] : b.shape[b.rank() - 2];
    if (K != Kb) {
      return invalid_argument("MatMul: inner dims differ: " + shape_to_string(a.shape) + " x " + shape_to_string(b.shape));
    }
    std::vector<int64_t> ab(a.shape.begin(), a.shape.end() - std::min(a.rank(), 2));
    std::vector<int64_t> bb(b.shape.begin(), b.shape.end() - std::min(b.rank(), 2));
    size_t r = std::max(ab.size(), bb.size());
    ab.insert(ab.begin(), r - ab.size(), 1);
    bb.insert(bb.begin(), r - bb.size(), 1);
    int64_t na = 1, nb = 1, nout = 1;
    std::vector<int64_t> ob(r);
    for (size_t d = 0; d < r; ++d) {
      if (ab[d] != bb[d] && ab[d] != 1 && bb[d] != 1) {
        return invalid_argument("MatMul: batch dims do not broadcast: " + shape_to_string(a.shape) + " x " +
                                shape_to_string(b.shape));
      }
      ob[d] = std::max(ab[d], bb[d]);
      na *= ab[d], nb *= bb[d], nout *= ob[d];
    }
    if (nout * M * N != y.numel()) return invalid_argument("MatMul: the output shape does not match the inputs");
    KILN_ASSIGN_OR_RETURN(StreamResources * res, resources());
    KILN_ASSIGN_OR_RETURN(const void* pa, a_op_.get(a.as<const float>(), a.numel(), mode_, stream_));
    KILN_ASSIGN_OR_RETURN(const void* pb, b_op_.get(b.as<const float>(), b.numel(), mode_, stream_));
    size_t es = in_elem(mode_);
    // cuBLAS "A" is our B (n x k, ld N), cuBLAS "B" is our A (k x m, ld K); D is N x M, ld N.
    Problem p;
    p.m = N, p.k = K, p.lda = N, p.ldb = K, p.ldc = N;
    float* d = y.as<float>();
    if (nb == 1) {
      p.n = M * na;  // B shared by every batch: fold A's batches into its rows
    } else if (na == nb && ab == bb) {
      p.n = M, p.batch = int(nb);
      p.stride_a = K * N, p.stride_b = M * K, p.stride_c = M * N;
    } else if (na == 1) {
      p.n = M, p.batch = int(nb);
      p.stride_a = K * N, p.stride_b = 0, p.stride_c = M * N;
    } else {
      // General broadcast: one GEMM per output batch.
      p.n = M;
      std::vector<int64_t> as(r, 0), bs(r, 0);
      int64_t sa = M * K, sb = K * N;
      for (size_t d2 = r; d2-- > 0;) {
        as[d2] = ab[d2] == 1 ? 0 : sa;
        bs[d2] = bb[d2] == 1 ? 0 : sb;
        sa *= ab[d2], sb *= bb[d2];
      }
      for (int64_t o = 0; o < nout; ++o) {
        int64_t rem = o, oa = 0, obb = 0;
        for (size_t d2 = r; d2-- > 0;) {
          int64_t c = rem % ob[d2];
          rem /= ob[d2];
          oa += c * as[d2], obb += c * bs[d2];
        }
        const char* xa = static_cast<const char*>(pa) + oa * es;
        const char* xb = static_cast<const char*>(pb) + obb * es;
        Problem q = p;
        q.align_a = alignment_of(xb, 0), q.align_b = alignment_of(xa, 0), q.align_c = alignment_of(d + o * M * N, 0);
        KILN_RETURN_IF_ERROR(gemm_.run(q, xb, xa, d + o * M * N, nullptr, 1.f, 0.f, res));
      }
      return ok_status();
    }
    p.align_a = alignment_of(pb, p.stride_a * es), p.align_b = alignment_of(pa, p.stride_b * es);
    p.align_c = alignment_of(d, p.stride_c * 4);
    return gemm_.run(p, pb, pa, d, nullptr, 1.f, 0.f, res);
  }

 private:
  MathMode mode_;
  LtGemm gemm_;
  LowPrecisionOperand a_op_, b_op_;
};

class GemmKernel final : public CudaKernel {
 public:
  GemmKernel(MathMode mode, float alpha, float beta, bool ta, bool tb, const void* prepared_a,
             const void* prepared_b)
      : CudaKernel(std::string("cuda.Gemm(cublasLt,") + math_mode_name(mode) + ")"), mode_(mode), gemm_(mode),
        alpha_(alpha), beta_(beta), ta_(ta), tb_(tb), a_op_(prepared_a), b_op_(prepared_b) {}

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &a = in[0], &b = in[1], &y = out[0];
    if (a.rank() != 2 || b.rank() != 2) return invalid_argument("Gemm: A and B must be 2-D");
    if (a.dtype != DType::kFloat32 || b.dtype != DType::kFloat32) return unsupported(name_ + ": float32 only on CUDA");
    int64_t M = ta_ ? a.shape[1] : a.shape[0], K = ta_ ? a.shape[0] : a.shape[1];
    int64_t N = tb_ ? b.shape[0] : b.shape[1], Kb = tb_ ? b.shape[1] : b.shape[0];
    if (K != Kb) return invalid_argument("Gemm: inner dims differ: " + shape_to_string(a.shape) + " x " + shape_to_string(b.shape));
    if (y.numel() != M * N) return invalid_argument("Gemm: the output shape does not match the inputs");
    if (y.numel() == 0) return ok_status();
    bool has_c = in.size() > 2 && present(in[2]) && in[2].numel() > 0 && beta_ != 0.f;
    const TensorView* c = has_c ? &in[2] : nullptr;
    bool bias_epilogue = false;
    float beta = 0.f;
    if (c) {
      int64_t cn = c->numel();
      bool row_vector = cn == N && (c->rank() == 1 || (c->rank() == 2 && c->shape[0] == 1));
      if (row_vector && beta_ == 1.f) {
        bias_epilogue = true;
      } else {
        KILN_RETURN_IF_ERROR(broadcast_copy(c->data, c->shape, y.data, y.shape, 4, stream_));
        beta = beta_;
      }
    }
    KILN_ASSIGN_OR_RETURN(StreamResources * res, resources());
    KILN_ASSIGN_OR_RETURN(const void* pa, a_op_.get(a.as<const float>(), a.numel(), mode_, stream_));
    KILN_ASSIGN_OR_RETURN(const void* pb, b_op_.get(b.as<const float>(), b.numel(), mode_, stream_));
    Problem p;
    p.m = N, p.n = M, p.k = K, p.ldc = N;
    p.trans_a = tb_;  // our B as stored: row-major [K,N] (col-major N x K, ld N) or [N,K] when transB
    p.lda = tb_ ? K : N;
    p.trans_b = ta_;  // our A: row-major [M,K] (col-major K x M, ld K) or [K,M] when transA
    p.ldb = ta_ ? M : K;
    p.bias = bias_epilogue;
    p.align_a = alignment_of(pb, 0), p.align_b = alignment_of(pa, 0), p.align_c = alignment_of(y.data, 0);
    return gemm_.run(p, pb, pa, y.as<float>(), bias_epilogue ? c->as<const float>() : nullptr, alpha_, beta, res);
  }

 private:
  MathMode mode_;
  LtGemm gemm_;
  float alpha_, beta_;
  bool ta_, tb_;
  LowPrecisionOperand a_op_, b_op_;
};

StatusOr<std::unique_ptr<Kernel>> make_matmul(const KernelQuery& q) {
  return std::unique_ptr<Kernel>(
      new MatMulKernel(math_mode(q), PreparedOperands::operand(q, 0), PreparedOperands::operand(q, 1)));
}

StatusOr<std::unique_ptr<Kernel>> make_gemm(const KernelQuery& q) {
  const ir::Attributes& at = q.node.attrs;
  KILN_ASSIGN_OR_RETURN(float alpha, at.get_float("alpha", 1.0f));
  KILN_ASSIGN_OR_RETURN(float beta, at.get_float("beta", 1.0f));
  KILN_ASSIGN_OR_RETURN(int64_t ta, at.get_int("transA", 0));
  KILN_ASSIGN_OR_RETURN(int64_t tb, at.get_int("transB", 0));
  return std::unique_ptr<Kernel>(new GemmKernel(math_mode(q), alpha, beta, ta != 0, tb != 0,
                                                PreparedOperands::operand(q, 0), PreparedOperands::operand(q, 1)));
}

StatusOr<std::shared_ptr<const PreparedNode>> prepare_gemm(const KernelQuery& q) {
  return prepare_low_precision_operands(q, {0, 1});
}

}  // namespace

void register_gemm(Registry& r) {
  r.add(OpKind::kMatMul, &make_matmul, {.library = "cublaslt", .reduced_precision = true, .float32_only = true,
                                       .prepare = &prepare_gemm});
  r.add(OpKind::kGemm, &make_gemm,
        {.library = "cublaslt", .reduced_precision = true, .float32_only = true, .prepare = &prepare_gemm});
}

}  // namespace kiln::backends::cuda
