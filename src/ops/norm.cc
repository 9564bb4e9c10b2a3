// Schemas of the norm op family: LayerNormalization, BatchNormalization (inference), Softmax and
// LogSoftmax (both the opset-13 single-axis and the older coerce-to-2-D semantics).
#include "ops/schema.h"

namespace kiln::ops {
namespace {

Status require_float_input(InferContext& ctx, int i) {
  if (!is_float(ctx.input_dtype(i))) {
    return ctx.error(StatusCode::kInvalidModel, "input " + std::to_string(i) + " has dtype " +
                                                    std::string(dtype_name(ctx.input_dtype(i))) +
                                                    "; a float type is required");
  }
  return ok_status();
}

Status infer_layer_norm(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_float_input(ctx, 0));
  const auto& x = ctx.input_shape(0);
  int rank = int(x.size());
  if (rank == 0) return ctx.error(StatusCode::kInvalidModel, "input 0 must have rank >= 1");
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, ctx.attrs().get_int("axis", -1));
  KILN_ASSIGN_OR_RETURN(int axis, ctx.normalize_axis(axis_attr, rank, "attribute 'axis'"));
  KILN_ASSIGN_OR_RETURN(float eps, ctx.attrs().get_float("epsilon", 1e-5f));
  if (!(eps >= 0)) return ctx.error(StatusCode::kInvalidModel, "attribute 'epsilon' must be >= 0");
  KILN_ASSIGN_OR_RETURN(int64_t stash, ctx.attrs().get_int("stash_type", 1));
  DType stash_dtype = dtype_from_onnx(int32_t(stash));
  if (!is_float(stash_dtype)) {
    return ctx.error(StatusCode::kInvalidModel,
                     "attribute 'stash_type' " + std::to_string(stash) + " is not a float type");
  }
  if (!ctx.has_input(1)) return ctx.error(StatusCode::kInvalidModel, "input 1 (Scale) is required");
  // Scale and B broadcast unidirectionally onto the normalized dims X[axis:].
  for (int i = 1; i <= 2; ++i) {
    if (!ctx.has_input(i)) continue;
    if (ctx.input_dtype(i) != ctx.input_dtype(0)) {
      return ctx.error(StatusCode::kInvalidModel,
                       "input " + std::to_string(i) + " dtype differs from input 0");
    }
    const auto& s = ctx.input_shape(i);
    int norm_rank = rank - axis;
    if (int(s.size()) > norm_rank) {
      return ctx.error(StatusCode::kInvalidModel,
                       "input " + std::to_string(i) + " has rank " + std::to_string(s.size()) +
                           ", more than the " + std::to_string(norm_rank) + " normalized dims");
    }
    for (size_t d = 0; d < s.size(); ++d) {
      if (s[d].is_const() && s[d].value() == 1) continue;
      int xd = rank - int(s.size()) + int(d);
      KILN_RETURN_IF_ERROR(ctx.require_equal(s[d], x[xd],
                                             "input " + std::to_string(i) + " dim " +
                                                 std::to_string(d) + " matches input 0 dim " +
                                                 std::to_string(xd)));
    }
  }
  ctx.set_output(0, ctx.input_dtype(0), x);
  std::vector<ir::Dim> stat_shape(x.begin(), x.end());
  for (int d = axis; d < rank; ++d) stat_shape[d] = 1;
  if (ctx.has_output(1)) ctx.set_output(1, stash_dtype, stat_shape);
  if (ctx.has_output(2)) ctx.set_output(2, stash_dtype, stat_shape);
  return ok_status();
}

Status infer_batch_norm(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_float_input(ctx, 0));
  const auto& x = ctx.input_shape(0);
  if (x.size() < 2) {
    return ctx.error(StatusCode::kInvalidModel, "input 0 must have rank >= 2 (N, C, ...)");
  }
  KILN_ASSIGN_OR_RETURN(int64_t training, ctx.attrs().get_int("training_mode", 0));
  if (training != 0) {
    return ctx.error(StatusCode::kUnsupported, "training_mode=1 is not supported (inference only)");
  }
  KILN_ASSIGN_OR_RETURN(int64_t spatial, ctx.attrs().get_int("spatial", 1));
  if (spatial != 1) {
    return ctx.error(StatusCode::kUnsupported,
                     "spatial=0 (per-element statistics) is not supported");
  }
  KILN_ASSIGN_OR_RETURN(float eps, ctx.attrs().get_float("epsilon", 1e-5f));
  if (!(eps >= 0)) return ctx.error(StatusCode::kInvalidModel, "attribute 'epsilon' must be >= 0");
  static constexpr const char* kNames[] = {"X", "scale", "B", "input_mean", "input_var"};
  for (int i = 1; i < 5; ++i) {
    if (!ctx.has_input(i)) {
      return ctx.error(StatusCode::kInvalidModel,
                       "input " + std::to_string(i) + " (" + kNames[i] + ") is required");
    }
    KILN_RETURN_IF_ERROR(require_float_input(ctx, i));
    const auto& s = ctx.input_shape(i);
    if (s.size() != 1) {
      return ctx.error(StatusCode::kInvalidModel,
                       "input " + std::to_string(i) + " (" + kNames[i] + ") must have rank 1");
    }
    KILN_RETURN_IF_ERROR(ctx.require_equal(
        s[0], x[1], "input " + std::to_string(i) + " (" + kNames[i] + ") length matches channels"));
  }
  for (int o = 1; o < ctx.num_outputs(); ++o) {
    if (ctx.has_output(o)) {
      return ctx.error(StatusCode::kUnsupported,
                       "output " + std::to_string(o) + " exists only in training mode");
    }
  }
  ctx.set_output(0, ctx.input_dtype(0), x);
  return ok_status();
}

// Opset >= 13 normalizes along one axis (default -1); older opsets flatten to 2-D at `axis`
// (default 1). Both keep the shape, but the axis still has to be valid.
Status infer_softmax(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_float_input(ctx, 0));
  const auto& x = ctx.input_shape(0);
  int rank = int(x.size());
  bool single_axis = ctx.opset() <= 0 || ctx.opset() >= 13;
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.attrs().get_int("axis", single_axis ? -1 : 1));
  // Older opsets also accept axis == rank: the 2-D view is then [numel, 1].
  if (single_axis || axis != rank) {
    KILN_RETURN_IF_ERROR(ctx.normalize_axis(axis, rank, "attribute 'axis'").status());
  }
  ctx.set_output(0, ctx.input_dtype(0), x);
  return ok_status();
}

}  // namespace

void register_norm_ops(OpRegistry& r) {
  r.add(OpSchema{OpKind::kLayerNormalization, 2, 3, 1, 3, &infer_layer_norm});
  r.add(OpSchema{OpKind::kBatchNormalization, 5, 5, 1, 5, &infer_batch_norm});
  r.add(OpSchema{OpKind::kSoftmax, 1, 1, 1, 1, &infer_softmax});
  r.add(OpSchema{OpKind::kLogSoftmax, 1, 1, 1, 1, &infer_softmax});
}

}  // namespace kiln::ops
