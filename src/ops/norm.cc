// Schemas of the norm op family: LayerNormalization, RMSNormalization, BatchNormalization
// (inference), Instance/Group/Lp/MeanVariance normalization, LRN, and Softmax/LogSoftmax (both the
// opset-13 single-axis and the older coerce-to-2-D semantics).
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
  // training_mode (opset 14 on) normalizes with the batch's statistics and may output the updated
  // running mean and variance (outputs 1 and 2).
  KILN_ASSIGN_OR_RETURN(int64_t training, ctx.attrs().get_int("training_mode", 0));
  if (training != 0 && ctx.opset() < 14) {
    return ctx.error(StatusCode::kInvalidModel, "attribute training_mode exists from opset 14 on");
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
    if (!ctx.has_output(o)) continue;
    if (training == 0 || o > 2) {
      return ctx.error(StatusCode::kUnsupported,
                       "output " + std::to_string(o) +
                           (training == 0 ? " exists only in training mode"
                                          : " is not an output of opset 14's training mode"));
    }
    // running_mean and running_var take input_mean's and input_var's dtype.
    ctx.set_output(o, ctx.input_dtype(o + 2), {x[1]});
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

// Scale (and bias) of shape broadcastable onto the normalized dims X[axis:], as in
// LayerNormalization; shared by RMSNormalization.
Status check_trailing_param(InferContext& ctx, int i, int axis) {
  const auto& x = ctx.input_shape(0);
  int rank = int(x.size());
  if (ctx.input_dtype(i) != ctx.input_dtype(0)) {
    return ctx.error(StatusCode::kInvalidModel,
                     "input " + std::to_string(i) + " dtype differs from input 0");
  }
  const auto& s = ctx.input_shape(i);
  int norm_rank = rank - axis;
  if (int(s.size()) > norm_rank) {
    return ctx.error(StatusCode::kInvalidModel, "input " + std::to_string(i) + " has rank " +
                                                    std::to_string(s.size()) + ", more than the " +
                                                    std::to_string(norm_rank) + " normalized dims");
  }
  for (size_t d = 0; d < s.size(); ++d) {
    if (s[d].is_const() && s[d].value() == 1) continue;
    int xd = rank - int(s.size()) + int(d);
    KILN_RETURN_IF_ERROR(ctx.require_equal(s[d], x[xd],
                                           "input " + std::to_string(i) + " dim " +
                                               std::to_string(d) + " matches input 0 dim " +
                                               std::to_string(xd)));
  }
  return ok_status();
}

Status infer_rms_norm(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_float_input(ctx, 0));
  const auto& x = ctx.input_shape(0);
  int rank = int(x.size());
  if (rank == 0) return ctx.error(StatusCode::kInvalidModel, "input 0 must have rank >= 1");
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, ctx.attrs().get_int("axis", -1));
  KILN_ASSIGN_OR_RETURN(int axis, ctx.normalize_axis(axis_attr, rank, "attribute 'axis'"));
  KILN_ASSIGN_OR_RETURN(float eps, ctx.attrs().get_float("epsilon", 1e-5f));
  if (!(eps >= 0)) return ctx.error(StatusCode::kInvalidModel, "attribute 'epsilon' must be >= 0");
  KILN_RETURN_IF_ERROR(check_trailing_param(ctx, 1, axis));
  ctx.set_output(0, ctx.input_dtype(0), x);
  return ok_status();
}

// A per-channel parameter: rank 1 with `channels` elements.
Status check_channel_param(InferContext& ctx, int i, const ir::Dim& channels, const char* what) {
  KILN_RETURN_IF_ERROR(require_float_input(ctx, i));
  const auto& s = ctx.input_shape(i);
  if (s.size() != 1) {
    return ctx.error(StatusCode::kInvalidModel,
                     "input " + std::to_string(i) + " (" + what + ") must have rank 1");
  }
  return ctx.require_equal(
      s[0], channels, "input " + std::to_string(i) + " (" + what + ") length matches channels");
}

Status infer_instance_norm(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_float_input(ctx, 0));
  const auto& x = ctx.input_shape(0);
  if (x.size() < 2) return ctx.error(StatusCode::kInvalidModel, "input 0 must have rank >= 2");
  KILN_ASSIGN_OR_RETURN(float eps, ctx.attrs().get_float("epsilon", 1e-5f));
  if (!(eps >= 0)) return ctx.error(StatusCode::kInvalidModel, "attribute 'epsilon' must be >= 0");
  KILN_RETURN_IF_ERROR(check_channel_param(ctx, 1, x[1], "scale"));
  KILN_RETURN_IF_ERROR(check_channel_param(ctx, 2, x[1], "B"));
  ctx.set_output(0, ctx.input_dtype(0), x);
  return ok_status();
}

// Opset 21 takes per-channel scale and bias; opset 18 took them per group.
Status infer_group_norm(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_float_input(ctx, 0));
  const auto& x = ctx.input_shape(0);
  if (x.size() < 2) return ctx.error(StatusCode::kInvalidModel, "input 0 must have rank >= 2");
  KILN_ASSIGN_OR_RETURN(int64_t groups, ctx.attrs().get_int("num_groups", std::nullopt));
  if (groups <= 0)
    return ctx.error(StatusCode::kInvalidModel, "attribute 'num_groups' must be > 0");
  KILN_ASSIGN_OR_RETURN(float eps, ctx.attrs().get_float("epsilon", 1e-5f));
  if (!(eps >= 0)) return ctx.error(StatusCode::kInvalidModel, "attribute 'epsilon' must be >= 0");
  KILN_RETURN_IF_ERROR(
      ctx.require_divisible(x[1], ir::Dim(groups), "channels divisible by num_groups"));
  ir::Dim param_len = ctx.opset() > 0 && ctx.opset() < 21 ? ir::Dim(groups) : x[1];
  KILN_RETURN_IF_ERROR(check_channel_param(ctx, 1, param_len, "scale"));
  KILN_RETURN_IF_ERROR(check_channel_param(ctx, 2, param_len, "bias"));
  ctx.set_output(0, ctx.input_dtype(0), x);
  return ok_status();
}

Status infer_lp_norm(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_float_input(ctx, 0));
  const auto& x = ctx.input_shape(0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.attrs().get_int("axis", -1));
  KILN_RETURN_IF_ERROR(ctx.normalize_axis(axis, int(x.size()), "attribute 'axis'").status());
  KILN_ASSIGN_OR_RETURN(int64_t p, ctx.attrs().get_int("p", 2));
  if (p != 1 && p != 2) return ctx.error(StatusCode::kInvalidModel, "attribute 'p' must be 1 or 2");
  ctx.set_output(0, ctx.input_dtype(0), x);
  return ok_status();
}

Status infer_mvn(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_float_input(ctx, 0));
  const auto& x = ctx.input_shape(0);
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> axes,
                        ctx.attrs().get_ints("axes", std::vector<int64_t>{0, 2, 3}));
  for (int64_t a : axes) {
    KILN_RETURN_IF_ERROR(ctx.normalize_axis(a, int(x.size()), "axes element").status());
  }
  ctx.set_output(0, ctx.input_dtype(0), x);
  return ok_status();
}

Status infer_lrn(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_float_input(ctx, 0));
  const auto& x = ctx.input_shape(0);
  if (x.size() < 2) return ctx.error(StatusCode::kInvalidModel, "input 0 must have rank >= 2");
  KILN_ASSIGN_OR_RETURN(int64_t size, ctx.attrs().get_int("size", std::nullopt));
  if (size <= 0) return ctx.error(StatusCode::kInvalidModel, "attribute 'size' must be > 0");
  ctx.set_output(0, ctx.input_dtype(0), x);
  return ok_status();
}

}  // namespace

void register_norm_ops(OpRegistry& r) {
  r.add(OpSchema{OpKind::kLayerNormalization, 2, 3, 1, 3, &infer_layer_norm});
  r.add(OpSchema{OpKind::kBatchNormalization, 5, 5, 1, 5, &infer_batch_norm});
  r.add(OpSchema{OpKind::kSoftmax, 1, 1, 1, 1, &infer_softmax});
  r.add(OpSchema{OpKind::kLogSoftmax, 1, 1, 1, 1, &infer_softmax});
  r.add(OpSchema{OpKind::kRMSNormalization, 2, 2, 1, 1, &infer_rms_norm});
  r.add(OpSchema{OpKind::kInstanceNormalization, 3, 3, 1, 1, &infer_instance_norm});
  r.add(OpSchema{OpKind::kGroupNormalization, 3, 3, 1, 1, &infer_group_norm});
  r.add(OpSchema{OpKind::kLpNormalization, 1, 1, 1, 1, &infer_lp_norm});
  r.add(OpSchema{OpKind::kMeanVarianceNormalization, 1, 1, 1, 1, &infer_mvn});
  r.add(OpSchema{OpKind::kLRN, 1, 1, 1, 1, &infer_lrn});
}

}  // namespace kiln::ops
