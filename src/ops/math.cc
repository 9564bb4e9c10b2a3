// Schemas of the math op family: elementwise ops beyond the core set (trigonometry, activations
// with parameters, SwiGLU, bitwise and shift ops, variadic Sum/Mean, PRelu) and inference-mode
// Dropout.
#include <string>

#include "ops/schema.h"

namespace kiln::ops {
namespace {

using ir::Dim;

std::string input_label(const InferContext& ctx, int i) {
  return "input " + std::to_string(i) + " ('" + ctx.input(i).name + "')";
}

Status require_dtype(const InferContext& ctx, int i, bool ok, std::string_view allowed) {
  if (ok) return ok_status();
  return ctx.error(StatusCode::kInvalidModel, input_label(ctx, i) + " has dtype " +
                                                  std::string(dtype_name(ctx.input_dtype(i))) +
                                                  "; " + ctx.node().op_type + " takes " +
                                                  std::string(allowed));
}

Status check_float_attrs(const InferContext& ctx, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    auto f = ctx.attrs().get_float(name, 0.0f);
    if (!f.ok()) return ctx.error(f.status().code(), f.status().message());
  }
  return ok_status();
}

bool is_unsigned(DType d) {
  return d == DType::kUInt8 || d == DType::kUInt16 || d == DType::kUInt32 || d == DType::kUInt64;
}

// The broadcast of every present input; all must share input 0's dtype.
StatusOr<std::vector<Dim>> broadcast_all(InferContext& ctx) {
  std::vector<std::vector<Dim>> shapes;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) {
      return ctx.error(StatusCode::kInvalidModel, "input " + std::to_string(i) + " is missing");
    }
    if (ctx.input_dtype(i) != ctx.input_dtype(0)) {
      return ctx.error(StatusCode::kInvalidModel, input_label(ctx, i) + " has dtype " +
                                                      std::string(dtype_name(ctx.input_dtype(i))) +
                                                      " but input 0 has " +
                                                      std::string(dtype_name(ctx.input_dtype(0))));
    }
    shapes.push_back(ctx.input_shape(i));
  }
  return ctx.broadcast_shapes(shapes);
}

// Unary float ops: Tan, Asin, ..., Selu, Celu, Mish, ThresholdedRelu, Softsign, Swish.
Status infer_float_unary(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_dtype(ctx, 0, is_float(ctx.input_dtype(0)), "float tensors"));
  KILN_RETURN_IF_ERROR(check_float_attrs(ctx, {"alpha", "gamma"}));
  ctx.set_output(0, ctx.input_dtype(0), ctx.input_shape(0));
  return ok_status();
}

Status infer_shrink(InferContext& ctx) {
  DType dt = ctx.input_dtype(0);
  KILN_RETURN_IF_ERROR(require_dtype(ctx, 0, is_float(dt) || is_integer(dt), "numeric tensors"));
  KILN_RETURN_IF_ERROR(check_float_attrs(ctx, {"bias", "lambd"}));
  ctx.set_output(0, dt, ctx.input_shape(0));
  return ok_status();
}

// Sum, Mean: numeric inputs of one dtype, broadcast together.
Status infer_variadic(InferContext& ctx) {
  DType dt = ctx.input_dtype(0);
  KILN_RETURN_IF_ERROR(require_dtype(ctx, 0, is_float(dt) || is_integer(dt), "numeric tensors"));
  if (find_op(ctx.node().domain, ctx.node().op_type) == OpKind::kMean) {
    KILN_RETURN_IF_ERROR(require_dtype(ctx, 0, is_float(dt), "float tensors"));
  }
  KILN_ASSIGN_OR_RETURN(auto shape, broadcast_all(ctx));
  ctx.set_output(0, dt, shape);
  return ok_status();
}

// PRelu: the slope broadcasts to X (unidirectionally); the output has X's shape.
Status infer_prelu(InferContext& ctx) {
  DType dt = ctx.input_dtype(0);
  KILN_RETURN_IF_ERROR(require_dtype(ctx, 0, is_float(dt) || is_integer(dt), "numeric tensors"));
  KILN_ASSIGN_OR_RETURN(auto shape, broadcast_all(ctx));
  const auto& x = ctx.input_shape(0);
  if (shape.size() != x.size()) {
    return ctx.error(StatusCode::kInvalidModel,
                     "the slope " + input_label(ctx, 1) + " has a higher rank than X");
  }
  for (size_t d = 0; d < x.size(); ++d) {
    KILN_RETURN_IF_ERROR(
        ctx.require_equal(shape[d], x[d], "slope broadcasts to X along dim " + std::to_string(d)));
  }
  ctx.set_output(0, dt, x);
  return ok_status();
}

// BitwiseAnd/Or/Xor/Not: integer tensors.
Status infer_bitwise(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_dtype(ctx, 0, is_integer(ctx.input_dtype(0)), "integer tensors"));
  KILN_ASSIGN_OR_RETURN(auto shape, broadcast_all(ctx));
  ctx.set_output(0, ctx.input_dtype(0), shape);
  return ok_status();
}

// BitShift: unsigned integers; opset 28 added signed ones (arithmetic right shift).
Status infer_bitshift(InferContext& ctx) {
  const DType dt = ctx.input_dtype(0);
  if (ctx.opset() > 0 && ctx.opset() < 28) {
    KILN_RETURN_IF_ERROR(require_dtype(ctx, 0, is_unsigned(dt),
                                       "unsigned integer tensors (signed ones from opset 28)"));
  }
  KILN_RETURN_IF_ERROR(require_dtype(ctx, 0, is_integer(dt), "integer tensors"));
  auto dir = ctx.attrs().get_string("direction", std::nullopt);
  if (!dir.ok()) return ctx.error(dir.status().code(), dir.status().message());
  if (*dir != "LEFT" && *dir != "RIGHT") {
    return ctx.error(StatusCode::kInvalidModel,
                     "attribute direction must be 'LEFT' or 'RIGHT', got '" + *dir + "'");
  }
  KILN_ASSIGN_OR_RETURN(auto shape, broadcast_all(ctx));
  ctx.set_output(0, ctx.input_dtype(0), shape);
  return ok_status();
}

// SwiGLU (opset 28): Y = Swish_alpha(A) * B, A and B float tensors of one shape (no broadcast).
Status infer_swiglu(InferContext& ctx) {
  const DType dt = ctx.input_dtype(0);
  KILN_RETURN_IF_ERROR(require_dtype(ctx, 0, is_float(dt), "float tensors"));
  KILN_RETURN_IF_ERROR(check_float_attrs(ctx, {"alpha"}));
  if (ctx.input_dtype(1) != dt) {
    return ctx.error(StatusCode::kInvalidModel, input_label(ctx, 1) + " has dtype " +
                                                    std::string(dtype_name(ctx.input_dtype(1))) +
                                                    " but input 0 has " +
                                                    std::string(dtype_name(dt)));
  }
  const auto& a = ctx.input_shape(0);
  const auto& b = ctx.input_shape(1);
  if (a.size() != b.size()) {
    return ctx.error(StatusCode::kInvalidModel, "A has rank " + std::to_string(a.size()) +
                                                    " and B rank " + std::to_string(b.size()) +
                                                    "; SwiGLU does not broadcast");
  }
  for (size_t d = 0; d < a.size(); ++d) {
    KILN_RETURN_IF_ERROR(
        ctx.require_equal(a[d], b[d], "B dim " + std::to_string(d) + " matches A's"));
  }
  ctx.set_output(0, dt, a);
  return ok_status();
}

// Dropout in inference: Y = X and the mask is all true. Training mode with a nonzero ratio draws
// random numbers, which no reference output can match; it is refused with that reason.
Status infer_dropout(InferContext& ctx) {
  DType dt = ctx.input_dtype(0);
  KILN_RETURN_IF_ERROR(require_dtype(ctx, 0, is_float(dt), "float tensors"));
  if (ctx.opset() > 0 && ctx.opset() < 12 && ctx.num_inputs() > 1) {
    return ctx.error(StatusCode::kInvalidModel, "Dropout before opset 12 takes one input");
  }
  bool training = false;
  if (ctx.has_input(2)) {
    const Tensor* t = ctx.input_constant(2);
    if (t == nullptr) {
      return ctx.error(StatusCode::kUnsupported,
                       "input 2 ('" + ctx.input(2).name +
                           "', training_mode) is computed at run time; kiln needs it known at "
                           "build time");
    }
    if (t->dtype() != DType::kBool || t->numel() != 1) {
      return ctx.error(StatusCode::kInvalidModel, "training_mode must be one bool");
    }
    training = t->int_at(0) != 0;
  }
  if (training) {
    double ratio = 0.5;
    if (ctx.has_input(1)) {
      const Tensor* r = ctx.input_constant(1);
      if (r == nullptr) {
        return ctx.error(
            StatusCode::kUnsupported,
            "input 1 ('" + ctx.input(1).name +
                "', ratio) is computed at run time; kiln needs it known at build time");
      }
      if (!is_float(r->dtype()) || r->numel() != 1) {
        return ctx.error(StatusCode::kInvalidModel, "ratio must be one float");
      }
      ratio = r->float_at(0);
    }
    if (ratio != 0) {
      return ctx.error(StatusCode::kUnsupported,
                       "training-mode Dropout with a nonzero ratio draws random numbers; kiln "
                       "runs inference only");
    }
  }
  ctx.set_output(0, dt, ctx.input_shape(0));
  if (ctx.has_output(1)) ctx.set_output(1, DType::kBool, ctx.input_shape(0));
  return ok_status();
}

}  // namespace

void register_math_ops(OpRegistry& r) {
  for (OpKind k :
       {OpKind::kTan, OpKind::kAsin, OpKind::kAcos, OpKind::kAtan, OpKind::kSinh, OpKind::kCosh,
        OpKind::kAsinh, OpKind::kAcosh, OpKind::kAtanh, OpKind::kSoftsign, OpKind::kSelu,
        OpKind::kCelu, OpKind::kMish, OpKind::kThresholdedRelu, OpKind::kSwish}) {
    r.add(OpSchema{k, 1, 1, 1, 1, &infer_float_unary, true, false});
  }
  r.add(OpSchema{OpKind::kShrink, 1, 1, 1, 1, &infer_shrink, true, false});
  r.add(OpSchema{OpKind::kSum, 1, 1 << 30, 1, 1, &infer_variadic,
                 OpTraits{.elementwise = true, .inputs_required = true}});
  r.add(OpSchema{OpKind::kMean, 1, 1 << 30, 1, 1, &infer_variadic,
                 OpTraits{.elementwise = true, .inputs_required = true}});
  r.add(OpSchema{OpKind::kPRelu, 2, 2, 1, 1, &infer_prelu, true, false});
  for (OpKind k : {OpKind::kBitwiseAnd, OpKind::kBitwiseOr, OpKind::kBitwiseXor}) {
    r.add(OpSchema{k, 2, 2, 1, 1, &infer_bitwise, true, false});
  }
  r.add(OpSchema{OpKind::kBitwiseNot, 1, 1, 1, 1, &infer_bitwise, true, false});
  r.add(OpSchema{OpKind::kBitShift, 2, 2, 1, 1, &infer_bitshift, true, false});
  r.add(OpSchema{OpKind::kSwiGLU, 2, 2, 1, 1, &infer_swiglu, true, false});
  r.add(OpSchema{OpKind::kDropout, 1, 3, 1, 2, &infer_dropout, false, false});
}

}  // namespace kiln::ops
