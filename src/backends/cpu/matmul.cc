// CPU reference kernels of the matmul op family: MatMul (numpy broadcasting) and Gemm, on the
// shared SGEMM (float32) or a plain loop (float64; other dtypes widen to it), and Det.
#include "backends/cpu/matmul.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/numeric.h"

namespace kiln::backends::cpu {
namespace {

void dgemm_loop(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
                int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        acc += (trans_a ? a[p * lda + i] : a[i * lda + p]) *
               (trans_b ? b[j * ldb + p] : b[p * ldb + j]);
      }
      double& y = c[i * ldc + j];
      y = beta == 0 ? alpha * acc : alpha * acc + beta * y;
    }
  }
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc) {
  dgemm_loop(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// float32 and float64 run natively; float16/bfloat16 and the integer types run through float64
// copies (exact for the products of int32 and small int64 values the node tests use).
bool is_native(DType t) { return t == DType::kFloat32 || t == DType::kFloat64; }

bool is_widened(DType t) {
  return t == DType::kFloat16 || t == DType::kBFloat16 || t == DType::kInt32 ||
         t == DType::kInt64 || t == DType::kUInt32 || t == DType::kUInt64;
}

Status check_dtype(const char* op, const KernelArgs& args, int n) {
  DType t = args.in[0].dtype;
  if (!is_native(t) && !is_widened(t)) {
    return unsupported(std::string(op) + ": the CPU kernel does not support " +
                       std::string(dtype_name(t)));
  }
  for (int i = 0; i < n; ++i) {
    if (present(args.in[i]) && args.in[i].dtype != t) {
      return invalid_argument(std::string(op) + ": input " + std::to_string(i) + " has dtype " +
                              std::string(dtype_name(args.in[i].dtype)) + ", expected " +
                              std::string(dtype_name(t)));
    }
  }
  if (args.out[0].dtype != t) return invalid_argument(std::string(op) + ": output dtype mismatch");
  return ok_status();
}

// Runs fn on float64 copies of the inputs and output, then narrows the output back.
template <typename Fn>
Status run_widened(const KernelArgs& args, Fn&& fn) {
  std::vector<std::vector<double>> ins(args.in.size());
  std::vector<TensorView> in_views(args.in.size());
  for (size_t i = 0; i < args.in.size(); ++i) {
    in_views[i] = args.in[i];
    if (!present(args.in[i])) continue;
    ins[i] = to_f64(args.in[i]);
    in_views[i].data = ins[i].data();
    in_views[i].dtype = DType::kFloat64;
  }
  std::vector<double> out(size_t(args.out[0].numel()));
  TensorView out_view = args.out[0];
  out_view.data = out.data();
  out_view.dtype = DType::kFloat64;
  KILN_RETURN_IF_ERROR(
      fn(KernelArgs{args.attrs, in_views, std::span<const TensorView>(&out_view, 1)}));
  for (int64_t e = 0; e < args.out[0].numel(); ++e) store_f64(args.out[0], e, out[size_t(e)]);
  return ok_status();
}

// A constant float32 B packed once for the engine (sgemm_packed), for a float32 A: a layer's
// weights, whether MatMul's [K, N] or Gemm's with transB.
struct PackedWeights final : PreparedNode {
  explicit PackedWeights(PackedB b) : packed(std::move(b)) {}
  PackedB packed;
};

StatusOr<std::shared_ptr<const PreparedNode>> pack_constant_b(const KernelQuery& q, bool trans_b) {
  if (q.input_dtype(0) != DType::kFloat32 || !q.input_is_constant(1))
    return std::shared_ptr<const PreparedNode>();
  const Tensor& b = *q.inputs[1]->constant;
  if (b.dtype() != DType::kFloat32 || b.rank() != 2 || b.numel() == 0)
    return std::shared_ptr<const PreparedNode>();
  const int64_t rows = b.shape()[0], cols = b.shape()[1];
  return std::shared_ptr<const PreparedNode>(std::make_shared<PackedWeights>(PackedB(
      trans_b, trans_b ? cols : rows, trans_b ? rows : cols, b.data_as<const float>(), cols)));
}

StatusOr<std::shared_ptr<const PreparedNode>> prepare_gemm(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(int64_t trans_b, q.node.attrs.get_int("transB", 0));
  return pack_constant_b(q, trans_b != 0);
}

// The packed B of `args` when it was packed for exactly this B (k x n, trans_b), else nullptr.
const PackedB* packed_b(const KernelArgs& args, bool trans_b, int64_t k, int64_t n) {
  const auto* w = dynamic_cast<const PackedWeights*>(args.prepared);
  if (!w || w->packed.trans_b() != trans_b || w->packed.k() != k || w->packed.n() != n)
    return nullptr;
  return &w->packed;
}

// bias_row (float32 only): Y's rows start as it and the GEMMs accumulate onto them.
template <typename T>
Status matmul_typed(const KernelArgs& args, const T* bias_row = nullptr) {
  const TensorView& av = args.in[0];
  const TensorView& bv = args.in[1];
  const TensorView& yv = args.out[0];
  int ra = av.rank(), rb = bv.rank(), ry = yv.rank();
  if (ra == 0 || rb == 0) return invalid_argument("MatMul: inputs must have rank >= 1");
  int64_t m = ra > 1 ? av.shape[ra - 2] : 1;
  int64_t k = av.shape[ra - 1];
  int64_t kb = rb > 1 ? bv.shape[rb - 2] : bv.shape[0];
  int64_t n = rb > 1 ? bv.shape[rb - 1] : 1;
  int nb_y = ry - (ra > 1) - (rb > 1);  // batch dims of Y
  int nb_a = std::max(ra - 2, 0), nb_b = std::max(rb - 2, 0);
  if (k != kb || nb_y < 0 || nb_y != std::max(nb_a, nb_b)) {
    return invalid_argument("MatMul: shapes " + shape_to_string(av.shape) + " x " +
                            shape_to_string(bv.shape) + " -> " + shape_to_string(yv.shape) +
                            " are inconsistent");
  }
  if (yv.numel() == 0) return ok_status();
  const T* a = av.as<const T>();
  const T* b = bv.as<const T>();
  T* y = yv.as<T>();
  const T beta = bias_row ? T(1) : T(0);
  if (bias_row) {
    for (int64_t r = 0, rows = yv.numel() / n; r < rows; ++r) {
      std::copy(bias_row, bias_row + n, y + r * n);
    }
  }
  if (nb_b == 0) {
    // B is one matrix shared by every batch: fold A's batch dims into M, one large GEMM.
    int64_t rows = av.numel() / std::max<int64_t>(k, 1);
    if (k == 0) rows = yv.numel() / n;
    if constexpr (std::is_same_v<T, float>) {
      if (const PackedB* p = rb == 2 && k > 0 ? packed_b(args, false, k, n) : nullptr) {
        sgemm_packed(rows, 1.f, a, k, b, n, *p, beta, y, n);
        return ok_status();
      }
    }
    gemm(false, false, rows, n, k, T(1), a, k, b, n, beta, y, n);
    return ok_status();
  }
  // Broadcast the batch dims: walk Y's batch index and map it into A's and B's.
  std::vector<int64_t> idx(nb_y, 0), a_stride(nb_y, 0), b_stride(nb_y, 0);
  int64_t batches = 1;
  {
    int64_t sa = m * k, sb = k * n;
    for (int d = nb_y - 1; d >= 0; --d) {
      int da = d - (nb_y - nb_a), db = d - (nb_y - nb_b);
      int64_t ya = da >= 0 ? av.shape[da] : 1, yb = db >= 0 ? bv.shape[db] : 1;
      int64_t yd = yv.shape[d];
      if ((ya != yd && ya != 1) || (yb != yd && yb != 1)) {
        return invalid_argument("MatMul: batch dims of " + shape_to_string(av.shape) + " and " +
                                shape_to_string(bv.shape) + " do not broadcast to " +
                                shape_to_string(yv.shape));
      }
      a_stride[d] = ya == 1 ? 0 : sa;
      b_stride[d] = yb == 1 ? 0 : sb;
      sa *= ya;
      sb *= yb;
      batches *= yd;
    }
  }
  int64_t lda = k, ldb = n;
  for (int64_t t = 0; t < batches; ++t) {
    int64_t ao = 0, bo = 0;
    for (int d = 0; d < nb_y; ++d) {
      ao += idx[d] * a_stride[d];
      bo += idx[d] * b_stride[d];
    }
    gemm(false, false, m, n, k, T(1), a + ao, lda, b + bo, ldb, beta, y + t * m * n, n);
    for (int d = nb_y - 1; d >= 0; --d) {
      if (++idx[d] < yv.shape[d]) break;
      idx[d] = 0;
    }
  }
  return ok_status();
}

Status matmul_kernel(const KernelArgs& args) {
  KILN_RETURN_IF_ERROR(check_dtype("MatMul", args, 2));
  if (!is_native(args.in[0].dtype))
    return run_widened(args, [](const KernelArgs& w) { return matmul_typed<double>(w); });
  if (args.in[0].dtype == DType::kFloat64) return matmul_typed<double>(args);
  return matmul_typed<float>(args);
}

template <typename T>
Status gemm_typed(const KernelArgs& args, bool trans_a, bool trans_b, float alpha, float beta) {
  const TensorView& av = args.in[0];
  const TensorView& bv = args.in[1];
  const TensorView& yv = args.out[0];
  if (av.rank() != 2 || bv.rank() != 2 || yv.rank() != 2) {
    return invalid_argument("Gemm: A, B and Y must be 2-D");
  }
  int64_t m = trans_a ? av.shape[1] : av.shape[0];
  int64_t k = trans_a ? av.shape[0] : av.shape[1];
  int64_t kb = trans_b ? bv.shape[1] : bv.shape[0];
  int64_t n = trans_b ? bv.shape[0] : bv.shape[1];
  if (k != kb || yv.shape[0] != m || yv.shape[1] != n) {
    return invalid_argument("Gemm: shapes " + shape_to_string(av.shape) + " x " +
                            shape_to_string(bv.shape) + " -> " + shape_to_string(yv.shape) +
                            " are inconsistent with transA/transB");
  }
  T* y = yv.as<T>();
  bool has_c = args.in.size() > 2 && present(args.in[2]) && beta != 0.f;
  if (has_c) {
    const TensorView& cv = args.in[2];
    int rc = cv.rank();
    int64_t cm = rc == 2 ? cv.shape[0] : 1;
    int64_t cn = rc >= 1 ? cv.shape[rc - 1] : 1;
    if (rc > 2 || (cm != m && cm != 1) || (cn != n && cn != 1)) {
      return invalid_argument("Gemm: C of shape " + shape_to_string(cv.shape) +
                              " does not broadcast to " + shape_to_string(yv.shape));
    }
    const T* c = cv.as<const T>();
    for (int64_t i = 0; i < m; ++i) {
      const T* crow = c + (cm == 1 ? 0 : i * cn);
      T* yrow = y + i * n;
      if (cn == 1) {
        for (int64_t j = 0; j < n; ++j) yrow[j] = crow[0];
      } else {
        for (int64_t j = 0; j < n; ++j) yrow[j] = crow[j];
      }
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    if (const PackedB* p = !trans_a && k > 0 ? packed_b(args, trans_b, k, n) : nullptr) {
      sgemm_packed(m, alpha, av.as<const T>(), av.shape[1], bv.as<const T>(), bv.shape[1], *p,
                   has_c ? beta : 0.f, y, n);
      return ok_status();
    }
  }
  gemm(trans_a, trans_b, m, n, k, T(alpha), av.as<const T>(), av.shape[1], bv.as<const T>(),
       bv.shape[1], has_c ? T(beta) : T(0), y, n);
  return ok_status();
}

Status gemm_kernel(const KernelArgs& args) {
  KILN_RETURN_IF_ERROR(check_dtype("Gemm", args, int(args.in.size())));
  KILN_ASSIGN_OR_RETURN(int64_t trans_a, args.attrs.get_int("transA", 0));
  KILN_ASSIGN_OR_RETURN(int64_t trans_b, args.attrs.get_int("transB", 0));
  KILN_ASSIGN_OR_RETURN(float alpha, args.attrs.get_float("alpha", 1.f));
  KILN_ASSIGN_OR_RETURN(float beta, args.attrs.get_float("beta", 1.f));
  if (!is_native(args.in[0].dtype)) {
    return run_widened(args, [&](const KernelArgs& wide) {
      return gemm_typed<double>(wide, trans_a != 0, trans_b != 0, alpha, beta);
    });
  }
  if (args.in[0].dtype == DType::kFloat64) {
    return gemm_typed<double>(args, trans_a != 0, trans_b != 0, alpha, beta);
  }
  return gemm_typed<float>(args, trans_a != 0, trans_b != 0, alpha, beta);
}

// Det: LU factorization with partial pivoting, in double, per matrix of the last two dims. A zero
// pivot column makes the determinant 0; each row swap flips its sign.
Status det_kernel(const KernelArgs& args) {
  if (args.in.empty() || args.out.empty()) return invalid_argument("Det: expected an input");
  const TensorView& x = args.in[0];
  const TensorView& y = args.out[0];
  const int r = x.rank();
  if (r < 2 || x.shape[r - 1] != x.shape[r - 2] ||
      y.numel() * x.shape[r - 1] * x.shape[r - 1] != x.numel()) {
    return invalid_argument("Det: input " + shape_to_string(x.shape) + " and output " +
                            shape_to_string(y.shape) + " are not [..., M, M] and [...]");
  }
  const int64_t n = x.shape[r - 1], count = y.numel();
  std::vector<double> a(static_cast<size_t>(n * n));
  for (int64_t m = 0; m < count; ++m) {
    for (int64_t e = 0; e < n * n; ++e) a[size_t(e)] = load_f64(x, m * n * n + e);
    double det = 1;
    for (int64_t k = 0; k < n && det != 0; ++k) {
      int64_t p = k;
      for (int64_t i = k + 1; i < n; ++i) {
        if (std::fabs(a[size_t(i * n + k)]) > std::fabs(a[size_t(p * n + k)])) p = i;
      }
      const double pivot = a[size_t(p * n + k)];
      if (pivot == 0) {
        det = 0;
        break;
      }
      if (p != k) {
        for (int64_t j = 0; j < n; ++j) std::swap(a[size_t(k * n + j)], a[size_t(p * n + j)]);
        det = -det;
      }
      det *= pivot;
      for (int64_t i = k + 1; i < n; ++i) {
        const double f = a[size_t(i * n + k)] / pivot;
        for (int64_t j = k + 1; j < n; ++j) a[size_t(i * n + j)] -= f * a[size_t(k * n + j)];
      }
    }
    store_f64(y, m, det);
  }
  return ok_status();
}

}  // namespace

StatusOr<std::shared_ptr<const PreparedNode>> prepare_matmul(const KernelQuery& q) {
  return pack_constant_b(q, false);
}

StatusOr<bool> matmul_onto_row_bias(const KernelArgs& args, const TensorView& bias) {
  if (args.in.size() != 2 || args.out.size() != 1) return false;
  const TensorView &a = args.in[0], &b = args.in[1], &y = args.out[0];
  if (a.dtype != DType::kFloat32 || b.dtype != DType::kFloat32 || y.dtype != DType::kFloat32 ||
      bias.dtype != DType::kFloat32 || y.rank() == 0) {
    return false;
  }
  const int64_t n = y.shape[y.rank() - 1];
  if (bias.numel() != n || (bias.rank() > 0 && bias.shape[bias.rank() - 1] != n)) return false;
  KILN_RETURN_IF_ERROR(matmul_typed<float>(args, bias.as<const float>()));
  return true;
}

void register_matmul_kernels(KernelRegistry& r) {
  r.add(ops::OpKind::kMatMul, &matmul_kernel, &prepare_matmul);
  r.add(ops::OpKind::kGemm, &gemm_kernel, &prepare_gemm);
  r.add(ops::OpKind::kDet, &det_kernel);
}

}  // namespace kiln::backends::cpu
