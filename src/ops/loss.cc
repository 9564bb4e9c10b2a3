// Schemas of the loss op family: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, which
// inference graphs exported from training code still carry.
#include <string>

#include "ops/schema.h"

namespace kiln::ops {
namespace {

// Both ops: input (N, C, d1..dk), target (N, d1..dk) of int32/int64, optional weight (C).
Status infer_loss(InferContext& ctx) {
  const bool sce =
      find_op(ctx.node().domain, ctx.node().op_type) == OpKind::kSoftmaxCrossEntropyLoss;
  DType dt = ctx.input_dtype(0);
  if (!is_float(dt)) {
    return ctx.error(StatusCode::kInvalidModel, "input 0 has dtype " + std::string(dtype_name(dt)) +
                                                    "; the loss takes float tensors");
  }
  DType tt = ctx.input_dtype(1);
  if (tt != DType::kInt32 && tt != DType::kInt64) {
    return ctx.error(StatusCode::kInvalidModel,
                     "input 1 (target) must be int32 or int64, not " + std::string(dtype_name(tt)));
  }
  auto reduction = ctx.attrs().get_string("reduction", "mean");
  if (!reduction.ok()) return ctx.error(reduction.status().code(), reduction.status().message());
  if (*reduction != "none" && *reduction != "sum" && *reduction != "mean") {
    return ctx.error(
        StatusCode::kInvalidModel,
        "attribute reduction must be 'none', 'sum' or 'mean', got '" + *reduction + "'");
  }
  auto ignore = ctx.attrs().get_int("ignore_index", 0);
  if (!ignore.ok()) return ctx.error(ignore.status().code(), ignore.status().message());
  const auto& x = ctx.input_shape(0);
  const auto& t = ctx.input_shape(1);
  if (x.size() < 2 || t.size() + 1 != x.size()) {
    return ctx.error(StatusCode::kInvalidModel,
                     "input 0 must be (N, C, d1..dk) and input 1 (N, d1..dk); got ranks " +
                         std::to_string(x.size()) + " and " + std::to_string(t.size()));
  }
  KILN_RETURN_IF_ERROR(ctx.require_equal(t[0], x[0], "target dim 0 matches input dim 0 (N)"));
  for (size_t d = 1; d < t.size(); ++d) {
    KILN_RETURN_IF_ERROR(ctx.require_equal(
        t[d], x[d + 1],
        "target dim " + std::to_string(d) + " matches input dim " + std::to_string(d + 1)));
  }
  if (ctx.has_input(2)) {
    if (ctx.input_dtype(2) != dt || ctx.input_rank(2) != 1) {
      return ctx.error(StatusCode::kInvalidModel,
                       "input 2 (weight) must be a 1-D tensor of " + std::string(dtype_name(dt)));
    }
    KILN_RETURN_IF_ERROR(
        ctx.require_equal(ctx.input_shape(2)[0], x[1], "weight length matches C (input dim 1)"));
  }
  if (*reduction == "none") {
    ctx.set_output(0, dt, t);
  } else {
    ctx.set_output(0, dt, {});
  }
  if (sce && ctx.has_output(1)) ctx.set_output(1, dt, x);
  return ok_status();
}

}  // namespace

void register_loss_ops(OpRegistry& r) {
  r.add(OpSchema{OpKind::kNegativeLogLikelihoodLoss, 2, 3, 1, 1, &infer_loss, false, false});
  r.add(OpSchema{OpKind::kSoftmaxCrossEntropyLoss, 2, 3, 1, 2, &infer_loss, false, false});
}

}  // namespace kiln::ops
