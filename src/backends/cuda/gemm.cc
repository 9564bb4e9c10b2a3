// MatMul and Gemm on cuBLASLt. Row-major C = A*B is computed as column-major C^T = B^T * A^T.
// Float32 tensors compute in what the plan assigned the node: strict FP32 (CUBLAS_COMPUTE_32F),
// TF32 (CUBLAS_COMPUTE_32F_FAST_TF32), or FP16/BF16 inputs (activations converted per run into the
// kernel's workspace, constant weights once per engine by prepare_gemm) with FP32 accumulation and
// FP32 output. Float16 and bfloat16 tensors run natively with FP32 accumulation, float64 tensors
// in CUBLAS_COMPUTE_64F; such a problem cuBLASLt has no algorithm for runs on gemm_fallback.cu's
// kernel. Gemm's bias vector runs as the BIAS epilogue on float32 tensors. The tactic is the
// cuBLASLt algorithm the builder ranked first at the opt shapes, recorded in the plan.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>

#include "backends/cuda/cublaslt.h"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;

// The math mode of a GEMM node: the plan's for float32 tensors; other dtypes compute as they are
// stored (the plan assigns them no reduced precision).
MathMode gemm_mode(const KernelQuery& q) {
  return q.input_dtype(0) == DType::kFloat32 ? math_mode(q) : MathMode::kFp32;
}

// The node's tensors' dtype when its inputs (the first `n_inputs` present ones) and output share
// one that the kernel handles; else why not.
StatusOr<DType> gemm_dtype(const KernelQuery& q, const char* impl, size_t n_inputs) {
  const DType t = q.input_dtype(0);
  if (!gemm_dtype_ok(t)) {
    return unsupported(q.node.describe() + ": " + impl +
                       " takes float32, float16, bfloat16 or float64 tensors; input 0 is " +
                       std::string(dtype_name(t)));
  }
  for (size_t i = 1; i < n_inputs && i < q.inputs.size(); ++i) {
    DType u = q.input_dtype(i);
    if (u != DType::kUndefined && u != t) {
      return unsupported(q.node.describe() + ": " + impl + " takes one dtype; input " +
                         std::to_string(i) + " is " + std::string(dtype_name(u)) + ", input 0 " +
                         std::string(dtype_name(t)));
    }
  }
  if (q.output_dtype(0) != t) {
    return unsupported(q.node.describe() + ": " + impl + " takes one dtype; output 0 is " +
                       std::string(dtype_name(q.output_dtype(0))) + ", input 0 " +
                       std::string(dtype_name(t)));
  }
  return t;
}

// An operand in the GEMM's input precision: the tensor itself (any dtype computed as stored), the
// FP16/BF16 copy the engine prepared once for a float32 constant (prepare_gemm), or a per-run
// conversion for a float32 activation into the kernel's workspace.
class LowPrecisionOperand {
 public:
  explicit LowPrecisionOperand(const void* prepared) : prepared_(prepared) {}
  // Workspace this operand takes for n elements.
  size_t scratch_bytes(int64_t n, MathMode mode) const {
    if (mode != MathMode::kFp16 && mode != MathMode::kBf16) return 0;
    return prepared_ ? 0 : workspace_piece(size_t(n) * 2);
  }
  StatusOr<const void*> get(const void* src, int64_t n, MathMode mode, void* scratch,
                            cudaStream_t s) const {
    if (mode != MathMode::kFp16 && mode != MathMode::kBf16) return src;
    if (prepared_) return prepared_;
    const float* f = static_cast<const float*>(src);
    if (mode == MathMode::kFp16) {
      KILN_RETURN_IF_ERROR(convert_f32_to_f16(f, scratch, n, s));
    } else {
      KILN_RETURN_IF_ERROR(convert_f32_to_bf16(f, scratch, n, s));
    }
    return static_cast<const void*>(scratch);
  }

 private:
  const void* prepared_;
};

// The workspace of a GEMM node: FP16/BF16 copies of its non-constant float32 A and B.
ir::Dim gemm_workspace(const KernelQuery& q) {
  MathMode mode = gemm_mode(q);
  if (mode != MathMode::kFp16 && mode != MathMode::kBf16) return 0;
  ir::Dim total = 0;
  for (size_t i = 0; i < 2; ++i) {
    if (!q.input_is_constant(i) && i < q.inputs.size())
      total = total + workspace_piece(q.inputs[i], 2);
  }
  return total;
}

// MatMul's GEMM for shapes a x b: the cuBLAS problem and how batches map onto it.
struct MatMulShape {
  Problem p;
  enum class Kind { kFolded, kBatched, kSharedA, kBroadcast } kind = Kind::kFolded;
  int64_t M = 0, N = 0, K = 0, nout = 1;
  std::vector<int64_t> ab, bb, ob;  // batch dims of A, B and the output, right-aligned
};

StatusOr<MatMulShape> matmul_shape(std::span<const int64_t> a, std::span<const int64_t> b) {
  if (a.size() < 1 || b.size() < 1) return invalid_argument("MatMul: inputs must have rank >= 1");
  MatMulShape s;
  const size_t ra = a.size(), rb = b.size();
  s.M = ra == 1 ? 1 : a[ra - 2];
  s.K = a[ra - 1];
  s.N = rb == 1 ? 1 : b[rb - 1];
  int64_t Kb = rb == 1 ? b[0] : b[rb - 2];
  if (s.K != Kb) {
    return invalid_argument("MatMul: inner dims differ: " + shape_to_string(a) + " x " +
                            shape_to_string(b));
  }
  s.ab.assign(a.begin(), a.end() - std::min<size_t>(ra, 2));
  s.bb.assign(b.begin(), b.end() - std::min<size_t>(rb, 2));
  size_t r = std::max(s.ab.size(), s.bb.size());
  s.ab.insert(s.ab.begin(), r - s.ab.size(), 1);
  s.bb.insert(s.bb.begin(), r - s.bb.size(), 1);
  int64_t na = 1, nb = 1;
  s.ob.resize(r);
  for (size_t d = 0; d < r; ++d) {
    if (s.ab[d] != s.bb[d] && s.ab[d] != 1 && s.bb[d] != 1) {
      return invalid_argument("MatMul: batch dims do not broadcast: " + shape_to_string(a) + " x " +
                              shape_to_string(b));
    }
    s.ob[d] = std::max(s.ab[d], s.bb[d]);
    na *= s.ab[d], nb *= s.bb[d], s.nout *= s.ob[d];
  }
  // cuBLAS "A" is our B (n x k, ld N), cuBLAS "B" is our A (k x m, ld K); D is N x M, ld N.
  Problem& p = s.p;
  p.m = s.N, p.k = s.K, p.lda = s.N, p.ldb = s.K, p.ldc = s.N;
  if (nb == 1) {
    p.n = s.M * na;  // B shared by every batch: fold A's batches into its rows
  } else if (na == nb && s.ab == s.bb) {
    s.kind = MatMulShape::Kind::kBatched;
    p.n = s.M, p.batch = int(nb);
    p.stride_a = s.K * s.N, p.stride_b = s.M * s.K, p.stride_c = s.M * s.N;
  } else if (na == 1) {
    s.kind = MatMulShape::Kind::kSharedA;
    p.n = s.M, p.batch = int(nb);
    p.stride_a = s.K * s.N, p.stride_b = 0, p.stride_c = s.M * s.N;
  } else {
    s.kind = MatMulShape::Kind::kBroadcast;  // one GEMM per output batch
    p.n = s.M;
  }
  return s;
}

std::vector<std::string> matmul_tactics(const KernelQuery& q) {
  std::optional<Problem> p;
  auto a = q.opt_shape(q.inputs.size() > 0 ? q.inputs[0] : nullptr);
  auto b = q.opt_shape(q.inputs.size() > 1 ? q.inputs[1] : nullptr);
  if (a && b) {
    auto s = matmul_shape(*a, *b);
    if (s.ok() && s->M * s->N * s->K > 0) p = s->p;
  }
  return rank_tactics(p, gemm_types(q.input_dtype(0), gemm_mode(q)));
}

// The kernel's name: the math mode of float32 tensors, else the tensors' dtype.
std::string gemm_kernel_name(const char* op, DType data, MathMode mode) {
  const std::string what =
      data == DType::kFloat32 ? math_mode_name(mode) : std::string(dtype_name(data)) + " tensors";
  return std::string("cuda.") + op + "(cublasLt," + what + ")";
}

class MatMulKernel : public CudaKernel {
 public:
  MatMulKernel(DType data, MathMode mode, std::optional<AlgoConfig> tactic, const void* prepared_a,
               const void* prepared_b, const char* op = "MatMul")
      : CudaKernel(gemm_kernel_name(op, data, mode)),
        mode_(mode),
        types_(gemm_types(data, mode)),
        gemm_(types_, tactic),
        a_op_(prepared_a),
        b_op_(prepared_b) {}

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    return run(in, out, nullptr, false);
  }

 protected:
  // The product, plus bias[N] and a ReLU or GELU in cuBLASLt's epilogue when `bias` is given
  // (never for a kBroadcast product: the caller checks epilogue_ok first), plus `residual` (Y's
  // shape and dtype) as cuBLASLt's C when given.
  static bool epilogue_ok(const MatMulShape& s) { return s.kind != MatMulShape::Kind::kBroadcast; }
  Status run(std::span<const TensorView> in, std::span<const TensorView> out, const void* bias,
             bool relu, bool gelu = false, const void* residual = nullptr) {
    const TensorView &a = in[0], &b = in[1], &y = out[0];
    KILN_ASSIGN_OR_RETURN(MatMulShape s, matmul_shape(a.shape, b.shape));
    if (s.nout * s.M * s.N != y.numel())
      return invalid_argument("MatMul: the output shape does not match the inputs");
    if (y.numel() == 0) return ok_status();
    const size_t a_bytes = a_op_.scratch_bytes(a.numel(), mode_);
    KILN_RETURN_IF_ERROR(check_workspace(a_bytes + b_op_.scratch_bytes(b.numel(), mode_), name_));
    char* ws = static_cast<char*>(workspace_);
    KILN_ASSIGN_OR_RETURN(StreamResources * res, resources());
    KILN_ASSIGN_OR_RETURN(const void* pa, a_op_.get(a.data, a.numel(), mode_, ws, stream_));
    KILN_ASSIGN_OR_RETURN(const void* pb,
                          b_op_.get(b.data, b.numel(), mode_, ws + a_bytes, stream_));
    const size_t es = types_.ab_size, os = types_.cd_size;
    Problem p = s.p;
    char* d = static_cast<char*>(y.data);
    const int64_t M = s.M, N = s.N, K = s.K;
    if (s.kind == MatMulShape::Kind::kBroadcast) {
      // The residual copied into Y, then each product added to it (C = D, beta 1).
      if (residual) {
        KILN_CUDA_CHECK(cudaMemcpyAsync(d, residual, y.nbytes(), cudaMemcpyDeviceToDevice, stream_),
                        "copying the residual");
      }
      const double beta = residual ? 1.0 : 0.0;
      const size_t r = s.ob.size();
      std::vector<int64_t> as(r, 0), bs(r, 0);
      int64_t sa = M * K, sb = K * N;
      for (size_t d2 = r; d2-- > 0;) {
        as[d2] = s.ab[d2] == 1 ? 0 : sa;
        bs[d2] = s.bb[d2] == 1 ? 0 : sb;
        sa *= s.ab[d2], sb *= s.bb[d2];
      }
      for (int64_t o = 0; o < s.nout; ++o) {
        int64_t rem = o, oa = 0, obb = 0;
        for (size_t d2 = r; d2-- > 0;) {
          int64_t c = rem % s.ob[d2];
          rem /= s.ob[d2];
          oa += c * as[d2], obb += c * bs[d2];
        }
        const char* xa = static_cast<const char*>(pa) + oa * es;
        const char* xb = static_cast<const char*>(pb) + obb * es;
        char* xd = d + o * M * N * int64_t(os);
        Problem q = p;
        q.align_a = alignment_of(xb, 0), q.align_b = alignment_of(xa, 0),
        q.align_c = alignment_of(xd, 0);
        KILN_RETURN_IF_ERROR(gemm_.run(q, xb, xa, xd, nullptr, 1.0, beta, res));
      }
      return ok_status();
    }
    p.align_a = alignment_of(pb, p.stride_a * es), p.align_b = alignment_of(pa, p.stride_b * es);
    p.align_c = std::min(alignment_of(d, p.stride_c * os),
                         residual ? alignment_of(residual, p.stride_c * os) : 256);
    p.bias = bias != nullptr, p.relu = bias != nullptr && relu, p.gelu = bias != nullptr && gelu;
    return gemm_.run(p, pb, pa, d, bias, 1.0, residual ? 1.0 : 0.0, res, residual);
  }

 private:
  MathMode mode_;
  GemmTypes types_;
  LtGemm gemm_;
  LowPrecisionOperand a_op_, b_op_;
};

// Whether activation `act` on a Y of dtype `y` runs as cuBLASLt's GELU epilogue, which computes
// GELU's tanh form: exactly gelu_tanh; gelu_erf only where Y is float16 or bfloat16, whose
// rounding (up to 2^-11 and 2^-8 of the value) exceeds the two forms' largest difference, 4.7e-4
// absolute (at x = +-2.7, where a float16 step is 2e-3). A float32 Y keeps erf, in the pass
// after the GEMM. ViT-B/16's [12608, 3072] MLP GEMM at batch 64: the pass took 80 us of 167.
bool gelu_epilogue(MatMulActivation act, DType y) {
  return act == MatMulActivation::kGeluTanh ||
         (act == MatMulActivation::kGeluErf && (y == DType::kFloat16 || y == DType::kBFloat16));
}

// kiln::MatMulBias: the MatMul above on inputs 0 and 1 (the same tactics, prepared weights and
// workspace), with a bias of Y's last dim (and a ReLU) in cuBLASLt's epilogue; otherwise (GELU,
// a bias of another shape, a broadcast product) act(Y + bias) in one pass over Y after it
// (matmul_bias_epilogue).
class MatMulBiasKernel final : public MatMulKernel {
 public:
  MatMulBiasKernel(DType data, MathMode mode, std::optional<AlgoConfig> tactic,
                   const void* prepared_a, const void* prepared_b, MatMulActivation act)
      : MatMulKernel(data, mode, tactic, prepared_a, prepared_b, "MatMulBias"), act_(act) {}

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    if (in.size() < 2 || out.size() != 1)
      return invalid_argument(name_ + ": needs A, B (and bias) and one output");
    const TensorView& y = out[0];
    const bool has_bias = in.size() > 2 && present(in[2]);
    // Y is float32 for float32 tensors in every math mode (FP16/BF16 inputs, FP32 output).
    if (has_bias && in[2].dtype != y.dtype) {
      return invalid_argument(name_ + ": bias is " + std::string(dtype_name(in[2].dtype)) + ", Y " +
                              std::string(dtype_name(y.dtype)));
    }
    // A bias of Y's last dim alone, with no activation, a ReLU or a GELU cuBLASLt's epilogue
    // computes (gelu_epilogue_): the epilogue adds it to the float accumulator and applies the
    // activation before the one rounding to Y, with no pass over Y.
    bool last_dim = has_bias && y.rank() >= 1 && in[2].rank() >= 1 &&
                    in[2].shape.back() == y.shape.back() &&
                    in[2].numel() == y.shape.back();  // [N] or [1, ..., 1, N], not [N, 1]
    // A residual (only with no activation: make_matmul_bias) is cuBLASLt's C, added to the
    // accumulator in the same pass.
    const TensorView* residual = in.size() > 3 && present(in[3]) ? &in[3] : nullptr;
    if (residual && (residual->dtype != y.dtype || residual->numel() != y.numel())) {
      return invalid_argument(name_ + ": the residual differs from Y in dtype or size");
    }
    const void* r = residual ? residual->data : nullptr;
    const bool gelu = gelu_epilogue(act_, y.dtype);
    if (last_dim && (act_ == MatMulActivation::kNone || act_ == MatMulActivation::kRelu || gelu) &&
        in[2].dtype == y.dtype) {
      auto s = matmul_shape(in[0].shape, in[1].shape);
      if (s.ok() && epilogue_ok(*s)) {
        return run(in.first(2), out, in[2].data, act_ == MatMulActivation::kRelu, gelu, r);
      }
    }
    KILN_RETURN_IF_ERROR(run(in.first(2), out, nullptr, false, false, r));
    return matmul_bias_epilogue(y.dtype, y.data, y.shape, has_bias ? in[2].data : nullptr,
                                has_bias ? in[2].shape : std::span<const int64_t>{}, act_, stream_);
  }

 private:
  MatMulActivation act_;
};

struct GemmAttrs {
  float alpha = 1, beta = 1;
  bool ta = false, tb = false;
};

StatusOr<GemmAttrs> gemm_attrs(const ir::Node& node) {
  const ir::Attributes& at = node.attrs;
  GemmAttrs g;
  KILN_ASSIGN_OR_RETURN(g.alpha, at.get_float("alpha", 1.0f));
  KILN_ASSIGN_OR_RETURN(g.beta, at.get_float("beta", 1.0f));
  KILN_ASSIGN_OR_RETURN(int64_t ta, at.get_int("transA", 0));
  KILN_ASSIGN_OR_RETURN(int64_t tb, at.get_int("transB", 0));
  g.ta = ta != 0, g.tb = tb != 0;
  return g;
}

// Gemm's cuBLAS problem for A and B of these (2-D) shapes; bias: C runs as the BIAS epilogue.
StatusOr<Problem> gemm_problem(const GemmAttrs& g, std::span<const int64_t> a,
                               std::span<const int64_t> b, bool bias) {
  if (a.size() != 2 || b.size() != 2) return invalid_argument("Gemm: A and B must be 2-D");
  int64_t M = g.ta ? a[1] : a[0], K = g.ta ? a[0] : a[1];
  int64_t N = g.tb ? b[0] : b[1], Kb = g.tb ? b[1] : b[0];
  if (K != Kb)
    return invalid_argument("Gemm: inner dims differ: " + shape_to_string(a) + " x " +
                            shape_to_string(b));
  Problem p;
  p.m = N, p.n = M, p.k = K, p.ldc = N;
  p.trans_a =
      g.tb;  // our B as stored: row-major [K,N] (col-major N x K, ld N) or [N,K] when transB
  p.lda = g.tb ? K : N;
  p.trans_b = g.ta;  // our A: row-major [M,K] (col-major K x M, ld K) or [K,M] when transA
  p.ldb = g.ta ? M : K;
  p.bias = bias;
  return p;
}

// C runs as the bias epilogue when it is a row vector of N and beta is 1, for float32, float16 and
// bfloat16 tensors (the bias in D's type; float64 adds C through beta). Otherwise C is copied into
// Y, broadcast, before the product: a pass over Y (ViT-B/16's float16 attention output
// projection at batch 64, [12608, 768]: 80 us with the copy).
bool bias_epilogue(const GemmAttrs& g, std::span<const int64_t> c, int64_t N, DType data) {
  if (data != DType::kFloat32 && data != DType::kFloat16 && data != DType::kBFloat16) return false;
  int64_t cn = 1;
  for (int64_t d : c) cn *= d;
  bool row_vector = cn == N && (c.size() == 1 || (c.size() == 2 && c[0] == 1));
  return row_vector && g.beta == 1.f;
}

class GemmKernel final : public CudaKernel {
 public:
  GemmKernel(DType data, MathMode mode, std::optional<AlgoConfig> tactic, GemmAttrs g,
             const void* prepared_a, const void* prepared_b)
      : CudaKernel(gemm_kernel_name("Gemm", data, mode)),
        data_(data),
        mode_(mode),
        types_(gemm_types(data, mode)),
        gemm_(types_, tactic),
        g_(g),
        a_op_(prepared_a),
        b_op_(prepared_b) {}

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &a = in[0], &b = in[1], &y = out[0];
    bool has_c = in.size() > 2 && present(in[2]) && in[2].numel() > 0 && g_.beta != 0.f;
    const TensorView* c = has_c ? &in[2] : nullptr;
    KILN_ASSIGN_OR_RETURN(Problem p, gemm_problem(g_, a.shape, b.shape, false));
    const int64_t M = p.n, N = p.m;
    if (y.numel() != M * N)
      return invalid_argument("Gemm: the output shape does not match the inputs");
    if (y.numel() == 0) return ok_status();
    float beta = 0.f;
    if (c) {
      if (c->dtype == y.dtype && bias_epilogue(g_, c->shape, N, data_)) {
        p.bias = true;
      } else {
        KILN_RETURN_IF_ERROR(
            broadcast_copy(c->data, c->shape, y.data, y.shape, types_.cd_size, stream_));
        beta = g_.beta;
      }
    }
    const size_t a_bytes = a_op_.scratch_bytes(a.numel(), mode_);
    KILN_RETURN_IF_ERROR(check_workspace(a_bytes + b_op_.scratch_bytes(b.numel(), mode_), name_));
    char* ws = static_cast<char*>(workspace_);
    KILN_ASSIGN_OR_RETURN(StreamResources * res, resources());
    KILN_ASSIGN_OR_RETURN(const void* pa, a_op_.get(a.data, a.numel(), mode_, ws, stream_));
    KILN_ASSIGN_OR_RETURN(const void* pb,
                          b_op_.get(b.data, b.numel(), mode_, ws + a_bytes, stream_));
    p.align_a = alignment_of(pb, 0), p.align_b = alignment_of(pa, 0),
    p.align_c = alignment_of(y.data, 0);
    return gemm_.run(p, pb, pa, y.data, p.bias ? c->data : nullptr, double(g_.alpha), double(beta),
                     res);
  }

 private:
  DType data_;
  MathMode mode_;
  GemmTypes types_;
  LtGemm gemm_;
  GemmAttrs g_;
  LowPrecisionOperand a_op_, b_op_;
};

std::vector<std::string> gemm_tactics(const KernelQuery& q) {
  std::optional<Problem> p;
  auto g = gemm_attrs(q.node);
  auto a = q.opt_shape(q.inputs.size() > 0 ? q.inputs[0] : nullptr);
  auto b = q.opt_shape(q.inputs.size() > 1 ? q.inputs[1] : nullptr);
  if (g.ok() && a && b) {
    auto c = q.opt_shape(q.inputs.size() > 2 ? q.inputs[2] : nullptr);
    auto shape = gemm_problem(*g, *a, *b, false);
    if (shape.ok() && shape->m * shape->n * shape->k > 0) {
      shape->bias = c && g->beta != 0.f && bias_epilogue(*g, *c, shape->m, q.input_dtype(0));
      p = *shape;
    }
  }
  return rank_tactics(p, gemm_types(q.input_dtype(0), gemm_mode(q)));
}

StatusOr<std::unique_ptr<Kernel>> make_matmul(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(DType data, gemm_dtype(q, "cuda.cublaslt.MatMul", 2));
  KILN_ASSIGN_OR_RETURN(auto tactic, parse_lt_tactic(q.tactic));
  return std::unique_ptr<Kernel>(new MatMulKernel(data, gemm_mode(q), tactic,
                                                  PreparedOperands::operand(q, 0),
                                                  PreparedOperands::operand(q, 1)));
}

StatusOr<std::unique_ptr<Kernel>> make_matmul_bias(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(DType data, gemm_dtype(q, "cuda.cublaslt.MatMulBias", 4));
  KILN_ASSIGN_OR_RETURN(std::string act, q.node.attrs.get_string("activation", "none"));
  MatMulActivation a = MatMulActivation::kNone;
  if (act == "relu") {
    a = MatMulActivation::kRelu;
  } else if (act == "gelu_erf") {
    a = MatMulActivation::kGeluErf;
  } else if (act == "gelu_tanh") {
    a = MatMulActivation::kGeluTanh;
  } else if (act != "none") {
    return invalid_argument(q.node.describe() + ": activation '" + act +
                            "' is not one of none, relu, gelu_erf, gelu_tanh");
  }
  if (a != MatMulActivation::kNone && q.inputs.size() > 3 && q.inputs[3]) {
    return unsupported(q.node.describe() +
                       ": cuda.cublaslt.MatMulBias adds a residual only with no activation");
  }
  const ir::Value* y = q.outputs.empty() ? nullptr : q.outputs[0];
  const ir::Value* bias = q.inputs.size() > 2 ? q.inputs[2] : nullptr;
  if (y && y->shape &&
      (y->shape->size() > 8 || (bias && bias->shape && bias->shape->size() > y->shape->size()))) {
    return unsupported(q.node.describe() +
                       ": cuda.cublaslt.MatMulBias takes outputs of rank 8 or less");
  }
  KILN_ASSIGN_OR_RETURN(auto tactic, parse_lt_tactic(q.tactic));
  return std::unique_ptr<Kernel>(new MatMulBiasKernel(data, gemm_mode(q), tactic,
                                                      PreparedOperands::operand(q, 0),
                                                      PreparedOperands::operand(q, 1), a));
}

StatusOr<std::unique_ptr<Kernel>> make_gemm(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(DType data, gemm_dtype(q, "cuda.cublaslt.Gemm", 3));
  KILN_ASSIGN_OR_RETURN(GemmAttrs g, gemm_attrs(q.node));
  KILN_ASSIGN_OR_RETURN(auto tactic, parse_lt_tactic(q.tactic));
  return std::unique_ptr<Kernel>(new GemmKernel(data, gemm_mode(q), tactic, g,
                                                PreparedOperands::operand(q, 0),
                                                PreparedOperands::operand(q, 1)));
}

StatusOr<std::shared_ptr<const PreparedNode>> prepare_gemm(const KernelQuery& q) {
  return prepare_low_precision_operands(q, {0, 1});
}

}  // namespace

// Not float32_only: the factories take float32, float16, bfloat16 and float64 tensors of one dtype
// (gemm_dtype); only float32 ones compute in the policy's reduced precisions.
void register_gemm(Registry& r) {
  r.add(OpKind::kMatMul, &make_matmul,
        {.library = "cublaslt",
         .reduced_precision = true,
         .prepare = &prepare_gemm,
         .workspace = &gemm_workspace,
         .tactics = &matmul_tactics});
  r.add(OpKind::kMatMulBias, &make_matmul_bias,
        {.library = "cublaslt",
         .reduced_precision = true,
         .prepare = &prepare_gemm,
         .workspace = &gemm_workspace,
         .tactics = &matmul_tactics});
  r.add(OpKind::kGemm, &make_gemm,
        {.library = "cublaslt",
         .reduced_precision = true,
         .prepare = &prepare_gemm,
         .workspace = &gemm_workspace,
         .tactics = &gemm_tactics});
}

}  // namespace kiln::backends::cuda
