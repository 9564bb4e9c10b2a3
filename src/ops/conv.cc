// Schemas of the conv op family: Conv and the pools (MaxPool, AveragePool, GlobalAveragePool,
// GlobalMaxPool), sharing the spatial attribute checks and the symbolic output-size formula.
#include <string>
#include <vector>

#include "ops/schema.h"

namespace kiln::ops {
namespace {

using ir::Dim;

enum class AutoPad { kNotSet, kSameUpper, kSameLower, kValid };

struct Spatial {
  std::vector<int64_t> kernel;  // pools only; Conv reads its kernel from W
  std::vector<int64_t> strides, dilations, pads;
  AutoPad auto_pad = AutoPad::kNotSet;
  bool ceil_mode = false;
};

// Reads an int list attribute of length n (default `fallback` for every element) whose elements
// must be >= min_value.
Status read_ints(InferContext& ctx, const std::string& name, size_t n, int64_t fallback,
                 int64_t min_value, std::vector<int64_t>* out) {
  KILN_ASSIGN_OR_RETURN(*out, ctx.attrs().get_ints(name, std::vector<int64_t>(n, fallback)));
  if (out->size() != n) {
    return ctx.error(StatusCode::kInvalidModel, "attribute " + name + " has " +
                                                    std::to_string(out->size()) + " values, expected " +
                                                    std::to_string(n));
  }
  for (int64_t v : *out) {
    if (v < min_value) {
      return ctx.error(StatusCode::kInvalidModel, "attribute " + name + " has value " +
                                                      std::to_string(v) + ", expected >= " +
                                                      std::to_string(min_value));
    }
  }
  return ok_status();
}

Status read_spatial(InferContext& ctx, size_t n, bool has_dilations, bool has_ceil, Spatial* s) {
  KILN_RETURN_IF_ERROR(read_ints(ctx, "strides", n, 1, 1, &s->strides));
  if (has_dilations) {
    KILN_RETURN_IF_ERROR(read_ints(ctx, "dilations", n, 1, 1, &s->dilations));
  } else {
    s->dilations.assign(n, 1);
  }
  KILN_RETURN_IF_ERROR(read_ints(ctx, "pads", 2 * n, 0, 0, &s->pads));
  KILN_ASSIGN_OR_RETURN(std::string auto_pad, ctx.attrs().get_string("auto_pad", "NOTSET"));
  if (auto_pad == "NOTSET") {
    s->auto_pad = AutoPad::kNotSet;
  } else if (auto_pad == "SAME_UPPER") {
    s->auto_pad = AutoPad::kSameUpper;
  } else if (auto_pad == "SAME_LOWER") {
    s->auto_pad = AutoPad::kSameLower;
  } else if (auto_pad == "VALID") {
    s->auto_pad = AutoPad::kValid;
  } else {
    return ctx.error(StatusCode::kInvalidModel, "attribute auto_pad has unknown value '" + auto_pad +
                                                    "'");
  }
  if (has_ceil) {
    KILN_ASSIGN_OR_RETURN(int64_t ceil_mode, ctx.attrs().get_int("ceil_mode", 0));
    s->ceil_mode = ceil_mode != 0;
  }
  return ok_status();
}

// Output size along spatial axis i (input dim 2 + i):
// floor((in + pad_begin + pad_end - dilation*(k-1) - 1) / stride) + 1, or ceil(in / stride) for
// SAME_*. With ceil_mode a last window that would start in the end padding is dropped (as ONNX's
// reference and PyTorch do).
StatusOr<Dim> spatial_out(InferContext& ctx, const Spatial& s, size_t i, const Dim& in,
                          const Dim& k) {
  int64_t stride = s.strides[i], dil = s.dilations[i];
  size_t n = s.strides.size();
  Dim out;
  if (s.auto_pad == AutoPad::kSameUpper || s.auto_pad == AutoPad::kSameLower) {
    out = Dim::ceil_div(in, Dim(stride));
  } else {
    int64_t pb = 0, pe = 0;
    if (s.auto_pad == AutoPad::kNotSet) {
      pb = s.pads[i];
      pe = s.pads[n + i];
    }
    Dim eff = Dim(dil) * (k - 1) + 1;
    Dim num = in + pb + pe - eff;
    out = (s.ceil_mode ? Dim::ceil_div(num, Dim(stride)) : Dim::floor_div(num, Dim(stride))) + 1;
    if (s.ceil_mode) {
      Dim last_start = (out - 1) * stride;
      Dim slack = last_start - (in + pb);  // >= 0: the last window starts in the end padding
      if (slack.is_const()) {
        if (slack.value() >= 0) out = out - 1;
      } else if (!(pe == 0 && eff.is_const() && stride <= eff.value())) {
        // Without end padding and with stride <= window the last window always starts inside.
        return ctx.error(StatusCode::kUnsupported,
                         "ceil_mode with end padding or stride > kernel on symbolic input dim " +
                             std::to_string(2 + i) + " (" + in.to_string() + ")");
      }
    }
  }
  KILN_RETURN_IF_ERROR(ctx.require_ge(
      out, Dim(1),
      "output dim " + std::to_string(2 + i) + " is at least 1 (input dim " + std::to_string(2 + i) +
          " = " + in.to_string() + " is large enough for the kernel, pads and stride)"));
  return out;
}

Status require_float_input(InferContext& ctx, int i) {
  DType t = ctx.input_dtype(i);
  if (!is_float(t)) {
    return ctx.error(StatusCode::kInvalidModel, "input " + std::to_string(i) + " has dtype " +
                                                    std::string(dtype_name(t)) +
                                                    ", expected a float type");
  }
  if (i > 0 && t != ctx.input_dtype(0)) {
    return ctx.error(StatusCode::kInvalidModel,
                     "input " + std::to_string(i) + " has dtype " + std::string(dtype_name(t)) +
                         " but input 0 has " + std::string(dtype_name(ctx.input_dtype(0))));
  }
  return ok_status();
}

// Rank >= 3 ([N, C, spatial...]) and at most 3 spatial dims; returns the spatial count.
StatusOr<size_t> spatial_rank(InferContext& ctx) {
  int r = ctx.input_rank(0);
  if (r < 3) {
    return ctx.error(StatusCode::kInvalidModel,
                     "input 0 must have rank >= 3 ([N, C, spatial...]), got " + std::to_string(r));
  }
  if (r > 5) {
    return ctx.error(StatusCode::kUnsupported,
                     "only 1-D, 2-D and 3-D spatial inputs are supported, got rank " + std::to_string(r));
  }
  return size_t(r - 2);
}

Status infer_conv(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(size_t n, spatial_rank(ctx));
  for (int i = 0; i < 3; ++i) {
    if (ctx.has_input(i)) KILN_RETURN_IF_ERROR(require_float_input(ctx, i));
  }
  const auto& x = ctx.input_shape(0);
  const auto& w = ctx.input_shape(1);
  if (w.size() != x.size()) {
    return ctx.error(StatusCode::kInvalidModel, "input 1 (W) has rank " + std::to_string(w.size()) +
                                                    ", expected the rank of input 0 (" +
                                                    std::to_string(x.size()) + ")");
  }
  KILN_ASSIGN_OR_RETURN(int64_t group, ctx.attrs().get_int("group", 1));
  if (group < 1) {
    return ctx.error(StatusCode::kInvalidModel,
                     "attribute group is " + std::to_string(group) + ", expected >= 1");
  }
  Spatial s;
  KILN_RETURN_IF_ERROR(read_spatial(ctx, n, /*has_dilations=*/true, /*has_ceil=*/false, &s));
  if (ctx.attrs().has("kernel_shape")) {
    std::vector<int64_t> ks;
    KILN_RETURN_IF_ERROR(read_ints(ctx, "kernel_shape", n, 1, 1, &ks));
    for (size_t i = 0; i < n; ++i) {
      KILN_RETURN_IF_ERROR(ctx.require_equal(w[2 + i], Dim(ks[i]),
                                             "input 1 (W) dim " + std::to_string(2 + i) +
                                                 " matches kernel_shape[" + std::to_string(i) + "]"));
    }
  }
  KILN_RETURN_IF_ERROR(ctx.require_equal(
      x[1], w[1] * group,
      "input 0 dim 1 (channels) equals input 1 (W) dim 1 times group (" + std::to_string(group) +
          ")"));
  KILN_RETURN_IF_ERROR(ctx.require_divisible(
      w[0], Dim(group),
      "input 1 (W) dim 0 (output channels) is divisible by group (" + std::to_string(group) + ")"));
  if (ctx.has_input(2)) {
    const auto& b = ctx.input_shape(2);
    if (b.size() != 1) {
      return ctx.error(StatusCode::kInvalidModel,
                       "input 2 (B) must be 1-D, got rank " + std::to_string(b.size()));
    }
    KILN_RETURN_IF_ERROR(
        ctx.require_equal(b[0], w[0], "input 2 (B) dim 0 equals input 1 (W) dim 0 (output channels)"));
  }
  std::vector<Dim> out = {x[0], w[0]};
  for (size_t i = 0; i < n; ++i) {
    KILN_ASSIGN_OR_RETURN(Dim d, spatial_out(ctx, s, i, x[2 + i], w[2 + i]));
    out.push_back(d);
  }
  ctx.set_output(0, ctx.input_dtype(0), std::move(out));
  return ok_status();
}

Status infer_pool(InferContext& ctx, bool is_max) {
  KILN_ASSIGN_OR_RETURN(size_t n, spatial_rank(ctx));
  KILN_RETURN_IF_ERROR(require_float_input(ctx, 0));
  if (!ctx.attrs().has("kernel_shape")) {
    return ctx.error(StatusCode::kInvalidModel, "attribute kernel_shape is required");
  }
  Spatial s;
  KILN_RETURN_IF_ERROR(read_ints(ctx, "kernel_shape", n, 1, 1, &s.kernel));
  // AveragePool has dilations since opset 19.
  KILN_RETURN_IF_ERROR(read_spatial(ctx, n, /*has_dilations=*/true, /*has_ceil=*/true, &s));
  if (is_max) {
    KILN_ASSIGN_OR_RETURN(int64_t storage_order, ctx.attrs().get_int("storage_order", 0));
    if (storage_order != 0 && ctx.has_output(1)) {
      return ctx.error(StatusCode::kUnsupported,
                       "MaxPool Indices with storage_order=1 (column-major) are not supported");
    }
  } else {
    KILN_RETURN_IF_ERROR(ctx.attrs().get_int("count_include_pad", 0).status());
  }
  const auto& x = ctx.input_shape(0);
  std::vector<Dim> out = {x[0], x[1]};
  for (size_t i = 0; i < n; ++i) {
    KILN_ASSIGN_OR_RETURN(Dim d, spatial_out(ctx, s, i, x[2 + i], Dim(s.kernel[i])));
    out.push_back(d);
  }
  ctx.set_output(0, ctx.input_dtype(0), out);
  if (is_max && ctx.has_output(1)) ctx.set_output(1, DType::kInt64, out);
  return ok_status();
}

Status infer_max_pool(InferContext& ctx) { return infer_pool(ctx, true); }
Status infer_average_pool(InferContext& ctx) { return infer_pool(ctx, false); }

Status infer_global_pool(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(spatial_rank(ctx).status());
  KILN_RETURN_IF_ERROR(require_float_input(ctx, 0));
  const auto& x = ctx.input_shape(0);
  std::vector<Dim> out(x.size(), Dim(1));
  out[0] = x[0];
  out[1] = x[1];
  ctx.set_output(0, ctx.input_dtype(0), std::move(out));
  return ok_status();
}

}  // namespace

void register_conv_ops(OpRegistry& r) {
  r.add(OpSchema{OpKind::kConv, 2, 3, 1, 1, &infer_conv});
  r.add(OpSchema{OpKind::kMaxPool, 1, 1, 1, 2, &infer_max_pool});
  r.add(OpSchema{OpKind::kAveragePool, 1, 1, 1, 1, &infer_average_pool});
  r.add(OpSchema{OpKind::kGlobalAveragePool, 1, 1, 1, 1, &infer_global_pool});
  r.add(OpSchema{OpKind::kGlobalMaxPool, 1, 1, 1, 1, &infer_global_pool});
}

}  // namespace kiln::ops
