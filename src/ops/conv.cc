// Schemas of the conv op family: Conv (and ConvInteger, QLinearConv, DeformConv), ConvTranspose,
// Col2Im and the pools (MaxPool, AveragePool, LpPool, GlobalAveragePool, GlobalMaxPool,
// MaxUnpool), sharing the spatial attribute checks and the symbolic output-size formula.
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
                                                    std::to_string(out->size()) +
                                                    " values, expected " + std::to_string(n));
  }
  for (int64_t v : *out) {
    if (v < min_value) {
      return ctx.error(StatusCode::kInvalidModel, "attribute " + name + " has value " +
                                                      std::to_string(v) +
                                                      ", expected >= " + std::to_string(min_value));
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
    return ctx.error(StatusCode::kInvalidModel,
                     "attribute auto_pad has unknown value '" + auto_pad + "'");
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
    // Pads and dilations are the model's numbers: a huge one must not wrap to a small dim.
    const std::string what = "input dim " + std::to_string(2 + i) + " with pads";
    KILN_ASSIGN_OR_RETURN(Dim padded, ctx.add_dims(in, Dim(pb), what));
    KILN_ASSIGN_OR_RETURN(padded, ctx.add_dims(padded, Dim(pe), what));
    KILN_ASSIGN_OR_RETURN(Dim eff, ctx.mul_dims(Dim(dil), k - 1,
                                                "dilation " + std::to_string(dil) +
                                                    " times kernel dim " + std::to_string(2 + i)));
    eff = eff + 1;
    Dim num = padded - eff;
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
    return ctx.error(
        StatusCode::kUnsupported,
        "only 1-D, 2-D and 3-D spatial inputs are supported, got rank " + std::to_string(r));
  }
  return size_t(r - 2);
}

// The output shape of a convolution of input xi by weights wi (bias bi, -1 for none), shared by
// Conv, ConvInteger and QLinearConv, which differ only in where X, W and B sit and in dtypes.
StatusOr<std::vector<Dim>> conv_output_shape(InferContext& ctx, int xi, int wi, int bi) {
  const auto& x = ctx.input_shape(xi);
  const auto& w = ctx.input_shape(wi);
  size_t n = x.size() - 2;
  if (w.size() != x.size()) {
    return ctx.error(StatusCode::kInvalidModel,
                     "input " + std::to_string(wi) + " (W) has rank " + std::to_string(w.size()) +
                         ", expected the rank of input " + std::to_string(xi) + " (" +
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
                                             "input " + std::to_string(wi) + " (W) dim " +
                                                 std::to_string(2 + i) + " matches kernel_shape[" +
                                                 std::to_string(i) + "]"));
    }
  }
  KILN_RETURN_IF_ERROR(ctx.require_equal(
      x[1], w[1] * group,
      "input " + std::to_string(xi) + " dim 1 (channels) equals input " + std::to_string(wi) +
          " (W) dim 1 times group (" + std::to_string(group) + ")"));
  KILN_RETURN_IF_ERROR(ctx.require_divisible(
      w[0], Dim(group),
      "input " + std::to_string(wi) + " (W) dim 0 (output channels) is divisible by group (" +
          std::to_string(group) + ")"));
  if (bi >= 0 && ctx.has_input(bi)) {
    const auto& b = ctx.input_shape(bi);
    if (b.size() != 1) {
      return ctx.error(
          StatusCode::kInvalidModel,
          "input " + std::to_string(bi) + " (B) must be 1-D, got rank " + std::to_string(b.size()));
    }
    KILN_RETURN_IF_ERROR(ctx.require_equal(
        b[0], w[0],
        "input " + std::to_string(bi) + " (B) dim 0 equals the output channels (W dim 0)"));
  }
  std::vector<Dim> out = {x[0], w[0]};
  for (size_t i = 0; i < n; ++i) {
    KILN_ASSIGN_OR_RETURN(Dim d, spatial_out(ctx, s, i, x[2 + i], w[2 + i]));
    out.push_back(d);
  }
  return out;
}

Status infer_conv(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(spatial_rank(ctx).status());
  for (int i = 0; i < 3; ++i) {
    if (ctx.has_input(i)) KILN_RETURN_IF_ERROR(require_float_input(ctx, i));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> out, conv_output_shape(ctx, 0, 1, 2));
  ctx.set_output(0, ctx.input_dtype(0), std::move(out));
  return ok_status();
}

bool is_8bit(DType t) { return t == DType::kInt8 || t == DType::kUInt8; }

Status require_8bit(InferContext& ctx, int i) {
  if (ctx.has_input(i) && !is_8bit(ctx.input_dtype(i))) {
    return ctx.error(StatusCode::kInvalidModel, "input " + std::to_string(i) + " has dtype " +
                                                    std::string(dtype_name(ctx.input_dtype(i))) +
                                                    ", expected int8 or uint8");
  }
  return ok_status();
}

// ConvInteger: x, w (8-bit), optional zero points; int32 output.
Status infer_conv_integer(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(spatial_rank(ctx).status());
  for (int i = 0; i < 4; ++i) KILN_RETURN_IF_ERROR(require_8bit(ctx, i));
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> out, conv_output_shape(ctx, 0, 1, -1));
  ctx.set_output(0, DType::kInt32, std::move(out));
  return ok_status();
}

// QLinearConv: x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B (int32); output y_zp's dtype.
Status infer_qlinear_conv(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(spatial_rank(ctx).status());
  for (int i : {0, 2, 3, 5, 7}) KILN_RETURN_IF_ERROR(require_8bit(ctx, i));
  for (int i : {1, 4, 6}) {
    if (!is_float(ctx.input_dtype(i))) {
      return ctx.error(StatusCode::kInvalidModel,
                       "input " + std::to_string(i) + " (a scale) must be a float type");
    }
  }
  if (ctx.has_input(8) && ctx.input_dtype(8) != DType::kInt32) {
    return ctx.error(StatusCode::kInvalidModel, "input 8 (B) must be int32");
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> out, conv_output_shape(ctx, 0, 3, 8));
  ctx.set_output(0, ctx.input_dtype(ctx.has_input(7) ? 7 : 0), std::move(out));
  return ok_status();
}

Status infer_pool(InferContext& ctx, bool is_max) {
  KILN_ASSIGN_OR_RETURN(size_t n, spatial_rank(ctx));
  // MaxPool also takes int8 and uint8 (opset 12 on); the other pools average or take norms.
  const DType t = ctx.input_dtype(0);
  if (!(is_max && (t == DType::kInt8 || t == DType::kUInt8))) {
    KILN_RETURN_IF_ERROR(require_float_input(ctx, 0));
  }
  if (!ctx.attrs().has("kernel_shape")) {
    return ctx.error(StatusCode::kInvalidModel, "attribute kernel_shape is required");
  }
  Spatial s;
  KILN_RETURN_IF_ERROR(read_ints(ctx, "kernel_shape", n, 1, 1, &s.kernel));
  // AveragePool has dilations since opset 19.
  KILN_RETURN_IF_ERROR(read_spatial(ctx, n, /*has_dilations=*/true, /*has_ceil=*/true, &s));
  if (is_max) {
    KILN_ASSIGN_OR_RETURN(int64_t storage_order, ctx.attrs().get_int("storage_order", 0));
    if (storage_order != 0 && storage_order != 1) {
      return ctx.error(StatusCode::kInvalidModel,
                       "attribute storage_order is " + std::to_string(storage_order) +
                           ", expected 0 (row-major) or 1 (column-major)");
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
Status infer_lp_pool(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t p, ctx.attrs().get_int("p", 2));
  if (p < 1) return ctx.error(StatusCode::kInvalidModel, "attribute p must be >= 1");
  return infer_pool(ctx, false);
}
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

// ConvTranspose: X [N, C, in...], W [C, M/group, k...] -> Y [N, M, out...] with
// out = stride*(in-1) + output_padding + dilation*(k-1) + 1 - pads, or output_shape when given,
// or in*stride under SAME_* (the kernel derives the pads from the output size).
Status infer_conv_transpose(InferContext& ctx) {
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
  std::vector<int64_t> out_pad;
  KILN_RETURN_IF_ERROR(read_ints(ctx, "output_padding", n, 0, 0, &out_pad));
  if (ctx.attrs().has("kernel_shape")) {
    std::vector<int64_t> ks;
    KILN_RETURN_IF_ERROR(read_ints(ctx, "kernel_shape", n, 1, 1, &ks));
    for (size_t i = 0; i < n; ++i) {
      KILN_RETURN_IF_ERROR(ctx.require_equal(w[2 + i], Dim(ks[i]),
                                             "input 1 (W) dim " + std::to_string(2 + i) +
                                                 " matches kernel_shape[" + std::to_string(i) +
                                                 "]"));
    }
  }
  KILN_RETURN_IF_ERROR(
      ctx.require_equal(w[0], x[1], "input 1 (W) dim 0 equals input 0 dim 1 (input channels)"));
  KILN_RETURN_IF_ERROR(ctx.require_divisible(
      x[1], Dim(group),
      "input 0 dim 1 (channels) is divisible by group (" + std::to_string(group) + ")"));
  KILN_ASSIGN_OR_RETURN(Dim m, ctx.mul_dims(w[1], group, "input 1 (W) dim 1 times group"));
  if (ctx.has_input(2)) {
    const auto& b = ctx.input_shape(2);
    if (b.size() != 1) {
      return ctx.error(StatusCode::kInvalidModel,
                       "input 2 (B) must be 1-D, got rank " + std::to_string(b.size()));
    }
    KILN_RETURN_IF_ERROR(ctx.require_equal(b[0], m, "input 2 (B) dim 0 equals output channels"));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> output_shape,
                        ctx.attrs().get_ints("output_shape", std::vector<int64_t>{}));
  if (!output_shape.empty() && output_shape.size() != n && output_shape.size() != n + 2) {
    return ctx.error(StatusCode::kInvalidModel, "attribute output_shape has " +
                                                    std::to_string(output_shape.size()) +
                                                    " values, expected " + std::to_string(n));
  }
  std::vector<Dim> out = {x[0], m};
  for (size_t i = 0; i < n; ++i) {
    Dim d;
    if (!output_shape.empty()) {
      d = Dim(output_shape[output_shape.size() - n + i]);
    } else if (s.auto_pad == AutoPad::kSameUpper || s.auto_pad == AutoPad::kSameLower) {
      KILN_ASSIGN_OR_RETURN(d,
                            ctx.mul_dims(x[2 + i], s.strides[i],
                                         "input dim " + std::to_string(2 + i) + " times stride"));
    } else {
      // Strides, pads, output_padding and dilations are the model's numbers: checked, as a huge
      // one would overflow int64 or wrap the dim to a small one.
      const std::string what = "output dim " + std::to_string(2 + i);
      Dim pads = 0;
      if (s.auto_pad == AutoPad::kNotSet) {
        KILN_ASSIGN_OR_RETURN(pads, ctx.add_dims(s.pads[i], s.pads[n + i], what + " pads"));
      }
      KILN_ASSIGN_OR_RETURN(Dim strided,
                            ctx.mul_dims(x[2 + i] - 1, s.strides[i], what + " stride"));
      KILN_ASSIGN_OR_RETURN(Dim dilated,
                            ctx.mul_dims(w[2 + i] - 1, s.dilations[i], what + " dilation"));
      KILN_ASSIGN_OR_RETURN(d, ctx.add_dims(strided, out_pad[i], what + " output_padding"));
      KILN_ASSIGN_OR_RETURN(d, ctx.add_dims(d, dilated, what + " kernel extent"));
      d = d + 1 - pads;
    }
    KILN_RETURN_IF_ERROR(
        ctx.require_ge(d, Dim(1), "output dim " + std::to_string(2 + i) + " is at least 1"));
    out.push_back(d);
  }
  ctx.set_output(0, ctx.input_dtype(0), std::move(out));
  return ok_status();
}

// MaxUnpool: scatters X into a zero tensor at the flat Indices MaxPool produced. Its size is
// output_shape (input 2, needed at build time) or the inverse of the pool's size formula.
Status infer_max_unpool(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(size_t n, spatial_rank(ctx));
  KILN_RETURN_IF_ERROR(require_float_input(ctx, 0));
  if (ctx.input_dtype(1) != DType::kInt64) {
    return ctx.error(StatusCode::kInvalidModel, "input 1 (I) must be int64");
  }
  const auto& x = ctx.input_shape(0);
  const auto& idx = ctx.input_shape(1);
  if (idx.size() != x.size()) {
    return ctx.error(StatusCode::kInvalidModel, "input 1 (I) must have the shape of input 0");
  }
  for (size_t d = 0; d < x.size(); ++d) {
    KILN_RETURN_IF_ERROR(ctx.require_equal(
        idx[d], x[d], "input 1 (I) dim " + std::to_string(d) + " matches input 0"));
  }
  if (ctx.has_input(2)) {
    KILN_ASSIGN_OR_RETURN(std::vector<Dim> shape, ctx.require_value(2, "output_shape"));
    if (shape.size() != x.size()) {
      return ctx.error(StatusCode::kInvalidModel, "input 2 (output_shape) must have " +
                                                      std::to_string(x.size()) + " elements");
    }
    ctx.set_output(0, ctx.input_dtype(0), std::move(shape));
    return ok_status();
  }
  if (!ctx.attrs().has("kernel_shape")) {
    return ctx.error(StatusCode::kInvalidModel, "attribute kernel_shape is required");
  }
  std::vector<int64_t> kernel, strides, pads;
  KILN_RETURN_IF_ERROR(read_ints(ctx, "kernel_shape", n, 1, 1, &kernel));
  KILN_RETURN_IF_ERROR(read_ints(ctx, "strides", n, 1, 1, &strides));
  KILN_RETURN_IF_ERROR(read_ints(ctx, "pads", 2 * n, 0, 0, &pads));
  std::vector<Dim> out = {x[0], x[1]};
  for (size_t i = 0; i < n; ++i) {
    // The model's strides, kernel and pads: a huge one must not wrap to a small dim.
    const std::string what = "output dim " + std::to_string(2 + i);
    KILN_ASSIGN_OR_RETURN(Dim d, ctx.mul_dims(x[2 + i] - 1, strides[i], what + " stride"));
    KILN_ASSIGN_OR_RETURN(d, ctx.add_dims(d, kernel[i], what + " kernel_shape"));
    KILN_ASSIGN_OR_RETURN(Dim p, ctx.add_dims(pads[i], pads[n + i], what + " pads"));
    out.push_back(d - p);
  }
  ctx.set_output(0, ctx.input_dtype(0), std::move(out));
  return ok_status();
}

// DeformConv (2-D): a Conv whose kernel taps sit at learned offsets from the regular grid.
// offset [N, offset_group*kH*kW*2, oH, oW] holds (dy, dx) per tap, mask [N, offset_group*kH*kW,
// oH, oW] (optional) scales each tap; the output is Conv's [N, oC, oH, oW].
Status infer_deform_conv(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(size_t n, spatial_rank(ctx));
  if (n != 2) {
    return ctx.error(
        StatusCode::kUnsupported,
        "only 2-D DeformConv ([N, C, H, W]) is supported, got rank " + std::to_string(n + 2));
  }
  for (int i = 0; i < 5; ++i) {
    if (ctx.has_input(i)) KILN_RETURN_IF_ERROR(require_float_input(ctx, i));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> out, conv_output_shape(ctx, 0, 1, 3));
  KILN_ASSIGN_OR_RETURN(int64_t offset_group, ctx.attrs().get_int("offset_group", 1));
  if (offset_group < 1) {
    return ctx.error(
        StatusCode::kInvalidModel,
        "attribute offset_group is " + std::to_string(offset_group) + ", expected >= 1");
  }
  const auto& x = ctx.input_shape(0);
  const auto& w = ctx.input_shape(1);
  KILN_RETURN_IF_ERROR(
      ctx.require_divisible(x[1], Dim(offset_group),
                            "input 0 dim 1 (channels) is divisible by offset_group (" +
                                std::to_string(offset_group) + ")"));
  const Dim taps = w[2] * w[3] * offset_group;
  for (int i : {2, 4}) {
    if (!ctx.has_input(i)) continue;
    const std::string name = i == 2 ? "input 2 (offset)" : "input 4 (mask)";
    const auto& o = ctx.input_shape(i);
    if (o.size() != 4) {
      return ctx.error(StatusCode::kInvalidModel,
                       name + " must have rank 4, got " + std::to_string(o.size()));
    }
    KILN_RETURN_IF_ERROR(ctx.require_equal(o[0], x[0], name + " dim 0 equals the batch"));
    KILN_RETURN_IF_ERROR(
        ctx.require_equal(o[1], i == 2 ? taps * 2 : taps,
                          name + " dim 1 equals offset_group * kH * kW" + (i == 2 ? " * 2" : "")));
    for (int d = 2; d < 4; ++d) {
      KILN_RETURN_IF_ERROR(
          ctx.require_equal(o[size_t(d)], out[size_t(d)],
                            name + " dim " + std::to_string(d) + " equals the output's"));
    }
  }
  ctx.set_output(0, ctx.input_dtype(0), std::move(out));
  return ok_status();
}

// Col2Im: input [N, C*prod(block_shape), L] holds sliding blocks (im2col's columns); the output
// [N, C, image_shape...] sums each block element into its image position. image_shape and
// block_shape are inputs, needed at build time; L must equal the number of blocks.
Status infer_col2im(InferContext& ctx) {
  const DType dt = ctx.input_dtype(0);
  if (!is_float(dt) && !is_integer(dt)) {
    return ctx.error(StatusCode::kInvalidModel, "input 0 has dtype " + std::string(dtype_name(dt)) +
                                                    ", expected a numeric type");
  }
  const auto& x = ctx.input_shape(0);
  if (x.size() != 3) {
    return ctx.error(
        StatusCode::kInvalidModel,
        "input 0 must have rank 3 ([N, C*prod(block_shape), L]), got " + std::to_string(x.size()));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> image, ctx.require_value(1, "image_shape"));
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> block, ctx.require_value(2, "block_shape"));
  const size_t n = image.size();
  if (n == 0 || block.size() != n) {
    return ctx.error(StatusCode::kInvalidModel, "input 1 (image_shape) has " + std::to_string(n) +
                                                    " elements and input 2 (block_shape) " +
                                                    std::to_string(block.size()) +
                                                    "; they must match and be at least 1");
  }
  std::vector<int64_t> strides, dilations, pads;
  KILN_RETURN_IF_ERROR(read_ints(ctx, "strides", n, 1, 1, &strides));
  KILN_RETURN_IF_ERROR(read_ints(ctx, "dilations", n, 1, 1, &dilations));
  KILN_RETURN_IF_ERROR(read_ints(ctx, "pads", 2 * n, 0, 0, &pads));
  Dim block_size = 1, blocks = 1;
  std::vector<Dim> out = {x[0], Dim(0)};
  for (size_t i = 0; i < n; ++i) {
    const std::string at = "[" + std::to_string(i) + "]";
    if (!block[i].is_const() || block[i].value() < 1) {
      return ctx.error(StatusCode::kInvalidModel, "input 2 (block_shape)" + at + " is " +
                                                      block[i].to_string() +
                                                      ", expected a positive constant");
    }
    KILN_RETURN_IF_ERROR(ctx.require_ge(image[i], Dim(1), "image_shape" + at + " >= 1"));
    KILN_ASSIGN_OR_RETURN(block_size, ctx.mul_dims(block_size, block[i], "prod(block_shape)"));
    // Blocks along axis i: floor((image + pads - dilation*(block-1) - 1) / stride) + 1.
    const std::string what = "image_shape" + at + " with pads";
    KILN_ASSIGN_OR_RETURN(Dim padded, ctx.add_dims(image[i], Dim(pads[i]), what));
    KILN_ASSIGN_OR_RETURN(padded, ctx.add_dims(padded, Dim(pads[n + i]), what));
    KILN_ASSIGN_OR_RETURN(
        Dim eff, ctx.mul_dims(Dim(dilations[i]), block[i] - 1, "dilation times block_shape" + at));
    Dim count = Dim::floor_div(padded - eff - 1, Dim(strides[i])) + 1;
    KILN_RETURN_IF_ERROR(ctx.require_ge(
        count, Dim(1), "the blocks along axis " + std::to_string(i) + " number >= 1"));
    blocks = blocks * count;
    out.push_back(image[i]);
  }
  KILN_RETURN_IF_ERROR(ctx.require_divisible(
      x[1], block_size,
      "input 0 dim 1 is divisible by prod(block_shape) (" + block_size.to_string() + ")"));
  KILN_RETURN_IF_ERROR(
      ctx.require_equal(x[2], blocks, "input 0 dim 2 (L) equals the number of sliding blocks"));
  out[1] = Dim::floor_div(x[1], block_size);
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
  r.add(OpSchema{OpKind::kLpPool, 1, 1, 1, 1, &infer_lp_pool});
  r.add(OpSchema{OpKind::kConvTranspose, 2, 3, 1, 1, &infer_conv_transpose});
  r.add(OpSchema{OpKind::kMaxUnpool, 2, 3, 1, 1, &infer_max_unpool});
  r.add(OpSchema{OpKind::kConvInteger, 2, 4, 1, 1, &infer_conv_integer});
  r.add(OpSchema{OpKind::kQLinearConv, 8, 9, 1, 1, &infer_qlinear_conv});
  r.add(OpSchema{OpKind::kDeformConv, 3, 5, 1, 1, &infer_deform_conv});
  r.add(OpSchema{OpKind::kCol2Im, 3, 3, 1, 1, &infer_col2im});
}

}  // namespace kiln::ops
