// Schemas of the matmul op family: MatMul (numpy semantics), Gemm and Det.
#include <string>
#include <vector>

#include "ops/schema.h"

namespace kiln::ops {
namespace {

using ir::Dim;

bool is_matmul_dtype(DType t) {
  return is_float(t) || t == DType::kInt32 || t == DType::kInt64 || t == DType::kUInt32 ||
         t == DType::kUInt64;
}

Status check_dtypes(InferContext& ctx, int n) {
  DType t = ctx.input_dtype(0);
  if (!is_matmul_dtype(t)) {
    return ctx.error(StatusCode::kUnsupported,
                     "input 0 has dtype " + std::string(dtype_name(t)) + ", expected a float type");
  }
  for (int i = 1; i < n; ++i) {
    if (ctx.has_input(i) && ctx.input_dtype(i) != t) {
      return ctx.error(StatusCode::kInvalidModel, "input " + std::to_string(i) + " has dtype " +
                                                      std::string(dtype_name(ctx.input_dtype(i))) +
                                                      " but input 0 has " +
                                                      std::string(dtype_name(t)));
    }
  }
  return ok_status();
}

// numpy matmul: 1-D operands are promoted (A to [1,K], B to [K,1]) and the added dim dropped from
// the result; leading dims broadcast.
Status infer_matmul(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_dtypes(ctx, 2));
  int ra = ctx.input_rank(0), rb = ctx.input_rank(1);
  if (ra == 0 || rb == 0) {
    return ctx.error(StatusCode::kInvalidModel, "MatMul inputs must have rank >= 1, got ranks " +
                                                    std::to_string(ra) + " and " +
                                                    std::to_string(rb));
  }
  std::vector<Dim> a = ctx.input_shape(0), b = ctx.input_shape(1);
  if (ra == 1) a.insert(a.begin(), Dim(1));
  if (rb == 1) b.push_back(Dim(1));
  const Dim& k_a = a[a.size() - 1];
  const Dim& k_b = b[b.size() - 2];
  KILN_RETURN_IF_ERROR(ctx.require_equal(k_b, k_a,
                                         "input 1 dim " + std::to_string(int(b.size()) - 2) +
                                             " (K) matches input 0 dim " + std::to_string(ra - 1) +
                                             " (K)"));
  std::vector<std::vector<Dim>> batches = {std::vector<Dim>(a.begin(), a.end() - 2),
                                           std::vector<Dim>(b.begin(), b.end() - 2)};
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> out, ctx.broadcast_shapes(batches));
  if (ra > 1) out.push_back(a[a.size() - 2]);
  if (rb > 1) out.push_back(b[b.size() - 1]);
  ctx.set_output(0, ctx.input_dtype(0), std::move(out));
  return ok_status();
}

// Gemm: Y = alpha * op(A) * op(B) + beta * C, with C unidirectionally broadcast to [M, N].
Status infer_gemm(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_dtypes(ctx, 3));
  const auto& attrs = ctx.attrs();
  KILN_ASSIGN_OR_RETURN(int64_t trans_a, attrs.get_int("transA", 0));
  KILN_ASSIGN_OR_RETURN(int64_t trans_b, attrs.get_int("transB", 0));
  KILN_RETURN_IF_ERROR(attrs.get_float("alpha", 1.f).status());
  KILN_RETURN_IF_ERROR(attrs.get_float("beta", 1.f).status());
  if (ctx.input_rank(0) != 2 || ctx.input_rank(1) != 2) {
    return ctx.error(StatusCode::kInvalidModel, "Gemm inputs A and B must be 2-D, got ranks " +
                                                    std::to_string(ctx.input_rank(0)) + " and " +
                                                    std::to_string(ctx.input_rank(1)));
  }
  const auto& a = ctx.input_shape(0);
  const auto& b = ctx.input_shape(1);
  Dim m = trans_a ? a[1] : a[0];
  Dim k = trans_a ? a[0] : a[1];
  Dim k_b = trans_b ? b[1] : b[0];
  Dim n = trans_b ? b[0] : b[1];
  KILN_RETURN_IF_ERROR(ctx.require_equal(k_b, k,
                                         std::string("input 1 dim ") + (trans_b ? "1" : "0") +
                                             " (K) matches input 0 dim " + (trans_a ? "0" : "1") +
                                             " (K)"));
  if (ctx.has_input(2)) {
    const auto& c = ctx.input_shape(2);
    if (c.size() > 2) {
      return ctx.error(StatusCode::kInvalidModel,
                       "Gemm input C must have rank <= 2, got " + std::to_string(c.size()));
    }
    const Dim target[2] = {m, n};
    for (size_t d = 0; d < c.size(); ++d) {
      size_t td = 2 - c.size() + d;
      const Dim& t = target[td];
      if (c[d].is_const() && c[d].value() == 1) continue;
      KILN_RETURN_IF_ERROR(ctx.require_equal(
          c[d], t,
          "input 2 (C) dim " + std::to_string(d) + " broadcasts to " + (td == 0 ? "M" : "N")));
    }
  }
  ctx.set_output(0, ctx.input_dtype(0), {m, n});
  return ok_status();
}

// Det: the determinant of each square matrix in the last two dims; the output drops them.
Status infer_det(InferContext& ctx) {
  const DType t = ctx.input_dtype(0);
  if (!is_float(t)) {
    return ctx.error(StatusCode::kInvalidModel,
                     "input 0 has dtype " + std::string(dtype_name(t)) + ", expected a float type");
  }
  const auto& x = ctx.input_shape(0);
  if (x.size() < 2) {
    return ctx.error(StatusCode::kInvalidModel,
                     "input 0 must have rank >= 2 ([..., M, M]), got " + std::to_string(x.size()));
  }
  KILN_RETURN_IF_ERROR(ctx.require_equal(x[x.size() - 2], x.back(),
                                         "input 0's last two dims are equal (square matrices)"));
  ctx.set_output(0, t, std::vector<Dim>(x.begin(), x.end() - 2));
  return ok_status();
}

}  // namespace

void register_matmul_ops(OpRegistry& r) {
  r.add(OpSchema{OpKind::kMatMul, 2, 2, 1, 1, &infer_matmul});
  r.add(OpSchema{OpKind::kGemm, 2, 3, 1, 1, &infer_gemm});
  r.add(OpSchema{OpKind::kDet, 1, 1, 1, 1, &infer_det});
}

}  // namespace kiln::ops
