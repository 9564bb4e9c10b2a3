// Schemas of the ops that make a tensor from nothing or from a shape: Range, ConstantOfShape,
// Constant, the Hann/Hamming/Blackman windows and EyeLike (the shape op family, shape.cc's
// helpers in shape_util.h). Range and ConstantOfShape carry their values as symbolic dims where
// they are small enough, so shape arithmetic built from them folds.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/checked.h"
#include "ops/schema.h"
#include "ops/shape_util.h"
#include "ops/value_range.h"

namespace kiln::ops {
namespace {

using ir::Dim;
using shape_util::attr_error;
using shape_util::can_carry;
using shape_util::const_shape;
using shape_util::label;
using shape_util::sym_max;
using Dims = std::vector<Dim>;

// A scalar input of Range: its value as a Dim (integer dtypes) or a double (float dtypes).
StatusOr<Dim> range_int_input(InferContext& ctx, int i, const char* what) {
  KILN_ASSIGN_OR_RETURN(Dims v, ctx.require_value(i, what));
  if (v.size() != 1) {
    return ctx.error(StatusCode::kInvalidModel, label(ctx, i) + " (" + what + ") must be a scalar");
  }
  return v[0];
}

Status infer_range(InferContext& ctx) {
  DType dtype = ctx.input_dtype(0);
  for (int i = 1; i < 3; ++i) {
    if (ctx.input_dtype(i) != dtype) {
      return ctx.error(StatusCode::kInvalidModel, "start, limit and delta must share one dtype");
    }
  }
  const char* names[] = {"start", "limit", "delta"};
  auto stash = ctx.attrs().get_int("stash_type", 1);
  if (!stash.ok()) return ctx.error(stash.status().code(), stash.status().message());
  if (*stash != 1 && *stash != 11) {  // opset 27: FLOAT or DOUBLE, for float16/bfloat16
    return ctx.error(StatusCode::kInvalidModel,
                     "stash_type " + std::to_string(*stash) + " must be 1 (float) or 11 (double)");
  }
  if (is_float(dtype)) {
    double v[3];
    for (int i = 0; i < 3; ++i) {
      const Tensor* t = ctx.input_constant(i);
      if (!t || t->numel() != 1) {
        return ctx.error(StatusCode::kUnsupported,
                         label(ctx, i) + " (" + names[i] +
                             ") of a floating-point Range must be a scalar constant at build time");
      }
      v[i] = t->float_at(0);
    }
    double n = std::ceil((v[1] - v[0]) / v[2]);
    if (v[2] == 0 || !std::isfinite(n) || n > double(int64_t(1) << 53)) {
      return ctx.error(StatusCode::kInvalidModel,
                       "the Range length ceil((limit - start) / delta) is not "
                       "a finite size");
    }
    ctx.set_output(0, dtype, {Dim(n > 0 ? int64_t(n) : 0)});  // a negative n may not fit int64
    return ok_status();
  }
  if (dtype != DType::kInt64 && dtype != DType::kInt32 && dtype != DType::kInt16) {
    return ctx.error(StatusCode::kInvalidModel,
                     "Range does not take dtype " + std::string(dtype_name(dtype)));
  }
  Dim v[3];
  for (int i = 0; i < 3; ++i) {
    KILN_ASSIGN_OR_RETURN(v[i], range_int_input(ctx, i, names[i]));
  }
  if (!v[2].is_const()) {
    return ctx.error(StatusCode::kUnsupported,
                     "the Range delta " + v[2].to_string() + " must be a constant at build time");
  }
  int64_t delta = v[2].value();
  if (delta == 0) return ctx.error(StatusCode::kInvalidModel, "the Range delta is 0");
  // The symbolic length divides by |delta|, which INT64_MIN lacks in int64.
  if (delta == std::numeric_limits<int64_t>::min()) {
    return ctx.error(StatusCode::kUnsupported,
                     "the Range delta " + std::to_string(delta) + " has no int64 magnitude");
  }
  Dim len;
  if (v[0].is_const() && v[1].is_const()) {
    __int128 diff = __int128(v[1].value()) - v[0].value();
    __int128 n = diff / delta;
    if (n * delta != diff && ((diff < 0) == (delta < 0))) ++n;  // ceil for same signs
    // Beyond 2^62 the length is no axis kiln can size (Interval::kInf), and past int64 it wraps.
    if (n > ir::Interval::kInf) {
      return ctx.error(StatusCode::kInvalidModel,
                       "the Range length ceil((" + std::to_string(v[1].value()) + " - " +
                           std::to_string(v[0].value()) + ") / " + std::to_string(delta) +
                           ") overflows the largest axis length 2^62");
    }
    len = Dim(int64_t(std::max<__int128>(n, 0)));
  } else {
    Dim diff = delta > 0 ? v[1] - v[0] : v[0] - v[1];
    int64_t mag = delta > 0 ? delta : -delta;
    len = sym_max(mag == 1 ? diff : Dim::ceil_div(diff, Dim(mag)), Dim(0));
  }
  ctx.set_output(0, dtype, {len});
  if (len.is_const() && len.value() <= kMaxSymbolicElements) {
    Dims value;
    // Dim arithmetic wraps, so start + i * delta lands on the element even where i * delta alone
    // leaves int64 (start INT64_MIN, delta 2^62).
    for (int64_t i = 0; i < len.value(); ++i) value.push_back(v[0] + Dim(i) * Dim(delta));
    ctx.set_output_value(0, std::move(value));
  }
  return ok_status();
}

Status infer_constant_of_shape(InferContext& ctx) {
  if (ctx.input_rank(0) != 1) {
    return ctx.error(StatusCode::kInvalidModel, label(ctx, 0) + " (the shape) must be 1-D");
  }
  KILN_ASSIGN_OR_RETURN(Dims shape, ctx.require_value(0, "shape"));
  DType dtype = DType::kFloat32;
  int64_t fill = 0;
  if (ctx.attrs().has("value")) {
    auto t = ctx.attrs().get_tensor("value");
    if (!t.ok()) return attr_error(ctx, t.status());
    if (t->numel() != 1) {
      return ctx.error(StatusCode::kInvalidModel, "the value attribute must hold one element");
    }
    dtype = t->dtype();
    if (is_integer(dtype) || dtype == DType::kBool) fill = t->int_at(0);
  }
  for (size_t k = 0; k < shape.size(); ++k) {
    KILN_RETURN_IF_ERROR(ctx.require_ge(
        shape[k], 0,
        "output dim " + std::to_string(k) + " (" + shape[k].to_string() + ") is not negative"));
  }
  ctx.set_output(0, dtype, shape);
  if (can_carry(dtype, shape) && (is_integer(dtype) || dtype == DType::kBool)) {
    ctx.set_output_value(0, Dims(size_t(shape_numel(*const_shape(shape))), Dim(fill)));
  }
  return ok_status();
}

// HannWindow, HammingWindow, BlackmanWindow (opset 17): a 1-D window of `size` elements, size a
// scalar known at build time, in the float dtype `output_datatype` names.
Status infer_window(InferContext& ctx) {
  if (ctx.input_rank(0) != 0 && ctx.input_rank(0) != 1) {
    return ctx.error(StatusCode::kInvalidModel, label(ctx, 0) + " (size) must be a scalar");
  }
  KILN_ASSIGN_OR_RETURN(Dims v, ctx.require_value(0, "size"));
  if (v.size() != 1) {
    return ctx.error(StatusCode::kInvalidModel, label(ctx, 0) + " (size) must hold one element");
  }
  auto odt = ctx.attrs().get_int("output_datatype", 1);
  if (!odt.ok()) return attr_error(ctx, odt.status());
  auto periodic = ctx.attrs().get_int("periodic", 1);
  if (!periodic.ok()) return attr_error(ctx, periodic.status());
  DType dt =
      *odt >= INT32_MIN && *odt <= INT32_MAX ? dtype_from_onnx(int32_t(*odt)) : DType::kUndefined;
  if (dt != DType::kFloat32 && dt != DType::kFloat64 && dt != DType::kFloat16 &&
      dt != DType::kBFloat16) {
    return ctx.error(StatusCode::kUnsupported,
                     "output_datatype " + std::to_string(*odt) + " is not a supported float dtype");
  }
  KILN_RETURN_IF_ERROR(
      ctx.require_ge(v[0], 0, "the window size (" + v[0].to_string() + ") is not negative"));
  ctx.set_output(0, dt, {v[0]});
  return ok_status();
}

// EyeLike: a 2-D tensor of the input's shape with ones on diagonal k, in `dtype` (default the
// input's dtype).
Status infer_eye_like(InferContext& ctx) {
  if (ctx.input_rank(0) != 2) {
    return ctx.error(StatusCode::kInvalidModel, label(ctx, 0) + " must be 2-D");
  }
  DType dt = ctx.input_dtype(0);
  if (ctx.attrs().has("dtype")) {
    auto d = ctx.attrs().get_int("dtype", std::nullopt);
    if (!d.ok()) return attr_error(ctx, d.status());
    dt = *d >= INT32_MIN && *d <= INT32_MAX ? dtype_from_onnx(int32_t(*d)) : DType::kUndefined;
    if (dt == DType::kUndefined) {
      return ctx.error(StatusCode::kUnsupported,
                       "attribute dtype " + std::to_string(*d) + " is not a supported dtype");
    }
  }
  auto k = ctx.attrs().get_int("k", 0);
  if (!k.ok()) return attr_error(ctx, k.status());
  ctx.set_output(0, dt, ctx.input_shape(0));
  return ok_status();
}

Status infer_constant(InferContext& ctx) {
  const ir::Attributes& a = ctx.attrs();
  Tensor t;
  if (a.has("value")) {
    auto v = a.get_tensor("value");
    if (!v.ok()) return attr_error(ctx, v.status());
    t = *v;
  } else if (a.has("value_float")) {
    auto v = a.get_float("value_float", std::nullopt);
    if (!v.ok()) return attr_error(ctx, v.status());
    t = Tensor::from_vector(DType::kFloat32, {}, std::vector<float>{*v});
  } else if (a.has("value_floats")) {
    auto v = a.get_floats("value_floats", std::nullopt);
    if (!v.ok()) return attr_error(ctx, v.status());
    t = Tensor::from_vector(DType::kFloat32, {int64_t(v->size())}, *v);
  } else if (a.has("value_int")) {
    auto v = a.get_int("value_int", std::nullopt);
    if (!v.ok()) return attr_error(ctx, v.status());
    t = Tensor::from_vector(DType::kInt64, {}, std::vector<int64_t>{*v});
  } else if (a.has("value_ints")) {
    auto v = a.get_ints("value_ints", std::nullopt);
    if (!v.ok()) return attr_error(ctx, v.status());
    t = Tensor::from_vector(DType::kInt64, {int64_t(v->size())}, *v);
  } else {
    return ctx.error(StatusCode::kUnsupported,
                     "Constant needs a value, value_float(s) or value_int(s) attribute (string and "
                     "sparse constants are not supported)");
  }
  if (t.dtype() == DType::kUndefined || dtype_size(t.dtype()) == 0) {
    return ctx.error(StatusCode::kUnsupported, "the constant's dtype is not supported");
  }
  Dims shape(t.shape().begin(), t.shape().end());
  ctx.set_output(0, t.dtype(), shape);
  if (can_carry(t.dtype(), shape) && (is_integer(t.dtype()) || t.dtype() == DType::kBool)) {
    Dims value;
    for (int64_t i = 0; i < t.numel(); ++i) value.push_back(Dim(t.int_at(i)));
    ctx.set_output_value(0, std::move(value));
  }
  return ok_status();
}

}  // namespace

void register_generator_ops(OpRegistry& r) {
  r.add(OpSchema{OpKind::kRange, 3, 3, 1, 1, &infer_range});
  r.add(OpSchema{OpKind::kConstantOfShape, 1, 1, 1, 1, &infer_constant_of_shape});
  r.add(OpSchema{OpKind::kConstant, 0, 0, 1, 1, &infer_constant});
  r.add(OpSchema{OpKind::kHannWindow, 1, 1, 1, 1, &infer_window});
  r.add(OpSchema{OpKind::kHammingWindow, 1, 1, 1, 1, &infer_window});
  r.add(OpSchema{OpKind::kBlackmanWindow, 1, 1, 1, 1, &infer_window});
  r.add(OpSchema{OpKind::kEyeLike, 1, 1, 1, 1, &infer_eye_like});
}

}  // namespace kiln::ops
