// Schemas of the shape op family: Shape, Size, Reshape, Squeeze, Unsqueeze, Flatten, Concat,
// Expand, Transpose, Range, ConstantOfShape, Constant, Split, Tile, Pad, Trilu. Ops that move shape
// tensors also carry their symbolic values so Shape -> Gather -> Concat -> Reshape chains fold.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "core/checked.h"
#include "ops/schema.h"
#include "ops/value_range.h"

namespace kiln::ops {
namespace {

using ir::Dim;
using Dims = std::vector<Dim>;

constexpr int kVariadic = 1 << 20;

Status attr_error(const InferContext& ctx, const Status& s) { return ctx.error(s.code(), s.message()); }

Dim product(const Dims& dims, size_t begin, size_t end) {
  Dim p = 1;
  for (size_t i = begin; i < end && i < dims.size(); ++i) p = p * dims[i];
  return p;
}

// The shape as integers when every dim is a constant.
std::optional<Shape> const_shape(const Dims& dims) {
  Shape out;
  for (const Dim& d : dims) {
    if (!d.is_const() || d.value() < 0) return std::nullopt;
    out.push_back(d.value());
  }
  return out;
}

// Whether an output of this dtype and shape may carry a symbolic value.
bool can_carry(DType dtype, const Dims& shape) {
  // Float values are exact integers (ops/elementwise.cc); moving them keeps them exact.
  if (!is_integer(dtype) && dtype != DType::kBool && exact_integer_limit(dtype) == 0) return false;
  auto s = const_shape(shape);
  if (!s) return false;
  auto n = checked_numel(*s);
  return n && *n <= kMaxSymbolicElements;
}

// Proves a <= b for every assignment of the (non-negative) symbols.
bool provably_le(const Dim& a, const Dim& b) {
  Dim d = b - a;
  if (d.is_const()) return d.value() >= 0;
  return d.bounds({}).lo >= 0;
}

Dim sym_max(const Dim& a, const Dim& b) {
  if (provably_le(b, a)) return a;
  if (provably_le(a, b)) return b;
  return Dim::max(a, b);
}

std::string label(const InferContext& ctx, int i) {
  return "input " + std::to_string(i) + " ('" + ctx.input(i).name + "')";
}

// Integers from a known value; symbolic elements are an error naming `what`.
StatusOr<std::vector<int64_t>> const_ints(const InferContext& ctx, const Dims& v,
                                          std::string_view what) {
  std::vector<int64_t> out;
  for (const Dim& d : v) {
    if (!d.is_const()) {
      return ctx.error(StatusCode::kUnsupported, "the " + std::string(what) + " element " +
                                                     d.to_string() + " must be a constant");
    }
    out.push_back(d.value());
  }
  return out;
}

// Axes from an attribute (older opsets) or from an input (newer ones); nullopt when neither is given.
StatusOr<std::optional<std::vector<int64_t>>> axes_from(const InferContext& ctx, int input) {
  if (ctx.attrs().has("axes")) {
    auto a = ctx.attrs().get_ints("axes", std::nullopt);
    if (!a.ok()) return attr_error(ctx, a.status());
    return std::optional<std::vector<int64_t>>(*a);
  }
  if (ctx.has_input(input)) {
    KILN_ASSIGN_OR_RETURN(Dims v, ctx.require_value(input, "axes"));
    KILN_ASSIGN_OR_RETURN(auto ints, const_ints(ctx, v, "axes"));
    return std::optional<std::vector<int64_t>>(std::move(ints));
  }
  return std::optional<std::vector<int64_t>>();
}

// Passes input 0's value to output 0 unchanged (the element order is preserved by the op).
void pass_value(InferContext& ctx, DType dtype, const Dims& out_shape) {
  if (!can_carry(dtype, out_shape)) return;
  auto v = ctx.input_value(0);
  if (v && int64_t(v->size()) == checked_numel(*const_shape(out_shape)).value_or(-1)) {
    ctx.set_output_value(0, std::move(*v));
  }
}

// Computes out[o] = in[maps(o)] over constant shapes, for values of Expand and Tile.
template <typename MapFn>
Dims remap_values(const Dims& in, const Shape& in_shape, const Shape& out_shape, MapFn map_axis) {
  int r = int(out_shape.size());
  int off = r - int(in_shape.size());
  int64_t n = shape_numel(out_shape);
  Dims out;
  out.reserve(size_t(n));
  std::vector<int64_t> idx(size_t(r), 0);
  for (int64_t o = 0; o < n; ++o) {
    int64_t src = 0;
    for (int k = off; k < r; ++k) src = src * in_shape[k - off] + map_axis(k, idx[k], in_shape[k - off]);
    out.push_back(in[size_t(src)]);
    for (int k = r - 1; k >= 0; --k) {
      if (++idx[k] < out_shape[k]) break;
      idx[k] = 0;
    }
  }
  return out;
}

Status infer_shape(InferContext& ctx) {
  const Dims& in = ctx.input_shape(0);
  int64_t r = int64_t(in.size());
  auto start = ctx.attrs().get_int("start", 0);
  auto end = ctx.attrs().get_int("end", r);
  if (!start.ok()) return attr_error(ctx, start.status());
  if (!end.ok()) return attr_error(ctx, end.status());
  auto clamp = [r](int64_t v) { return std::clamp(v < 0 ? v + r : v, int64_t(0), r); };
  int64_t s = clamp(*start), e = std::max(clamp(*end), s);
  Dims value(in.begin() + s, in.begin() + e);
  ctx.set_output(0, DType::kInt64, {Dim(e - s)});
  ctx.set_output_value(0, std::move(value));
  return ok_status();
}

Status infer_size(InferContext& ctx) {
  ctx.set_output(0, DType::kInt64, {});
  ctx.set_output_value(0, {product(ctx.input_shape(0), 0, ctx.input_shape(0).size())});
  return ok_status();
}

Status infer_reshape(InferContext& ctx) {
  const Dims& in = ctx.input_shape(0);
  Dims target;
  if (ctx.has_input(1)) {
    if (ctx.input_rank(1) != 1) {
      return ctx.error(StatusCode::kInvalidModel, label(ctx, 1) + " (the shape) must be 1-D");
    }
    KILN_ASSIGN_OR_RETURN(target, ctx.require_value(1, "shape"));
  } else if (ctx.attrs().has("shape")) {
    auto s = ctx.attrs().get_ints("shape", std::nullopt);
    if (!s.ok()) return attr_error(ctx, s.status());
    target.assign(s->begin(), s->end());
  } else {
    return ctx.error(StatusCode::kInvalidModel, "Reshape needs a shape input");
  }
  auto allowzero = ctx.attrs().get_int("allowzero", 0);
  if (!allowzero.ok()) return attr_error(ctx, allowzero.status());
  Dims out;
  int infer_at = -1;
  bool has_zero = false;
  Dim known = 1;
  for (size_t i = 0; i < target.size(); ++i) {
    const Dim& t = target[i];
    if (t.is_const() && t.value() == -1) {
      if (infer_at >= 0) {
        return ctx.error(StatusCode::kInvalidModel, "the shape " + ir::dims_to_string(target) +
                                                        " has more than one -1");
      }
      infer_at = int(i);
      out.push_back(0);
      continue;
    }
    if (t.is_const() && t.value() < -1) {
      return ctx.error(StatusCode::kInvalidModel,
                       "the shape " + ir::dims_to_string(target) + " has a negative dim");
    }
    if (t.is_const() && t.value() == 0 && *allowzero == 0) {
      if (i >= in.size()) {
        return ctx.error(StatusCode::kInvalidModel,
                         "shape element " + std::to_string(i) + " is 0 (copy the input dim) but the " +
                             "input " + ir::dims_to_string(in) + " has no dim " + std::to_string(i));
      }
      out.push_back(in[i]);
    } else {
      if (t.is_const() && t.value() == 0) has_zero = true;
      out.push_back(t);
    }
    known = known * out.back();
  }
  if (has_zero && infer_at >= 0) {
    return ctx.error(StatusCode::kInvalidModel, "with allowzero=1 the shape " +
                                                    ir::dims_to_string(target) +
                                                    " cannot hold both 0 and -1");
  }
  Dim total = product(in, 0, in.size());
  if (infer_at >= 0) {
    if (known.is_const() && known.value() == 0) {
      return ctx.error(StatusCode::kInvalidModel, "cannot infer the -1 in " +
                                                      ir::dims_to_string(target) +
                                                      ": the other dims multiply to 0");
    }
    KILN_RETURN_IF_ERROR(ctx.require_divisible(
        total, known,
        "the input's " + total.to_string() + " elements divide into the known output dims (" +
            known.to_string() + ") of the shape " + ir::dims_to_string(out)));
    out[size_t(infer_at)] = Dim::floor_div(total, known);
  } else {
    KILN_RETURN_IF_ERROR(ctx.require_equal(known, total,
                                           "the output " + ir::dims_to_string(out) +
                                               " has as many elements as the input " +
                                               ir::dims_to_string(in)));
  }
  ctx.set_output(0, ctx.input_dtype(0), out);
  pass_value(ctx, ctx.input_dtype(0), out);
  return ok_status();
}

Status infer_squeeze(InferContext& ctx) {
  const Dims& in = ctx.input_shape(0);
  int r = int(in.size());
  KILN_ASSIGN_OR_RETURN(auto axes, axes_from(ctx, 1));
  std::vector<bool> drop(size_t(r), false);
  if (!axes) {
    for (int k = 0; k < r; ++k) {
      if (!in[k].is_const()) {
        return ctx.error(StatusCode::kUnsupported,
                         "Squeeze without axes on the symbolic dim " + in[k].to_string() +
                             " of " + ir::dims_to_string(in) +
                             " depends on its run-time value; give the axes explicitly");
      }
      drop[k] = in[k].value() == 1;
    }
  } else {
    for (int64_t a : *axes) {
      KILN_ASSIGN_OR_RETURN(int k, ctx.normalize_axis(a, r, "axis"));
      if (drop[k]) return ctx.error(StatusCode::kInvalidModel, "axis " + std::to_string(a) + " repeats");
      drop[k] = true;
      KILN_RETURN_IF_ERROR(ctx.require_equal(
          in[k], 1, "squeezed dim " + std::to_string(k) + " of " + ir::dims_to_string(in) + " is 1"));
    }
  }
  Dims out;
  for (int k = 0; k < r; ++k) {
    if (!drop[k]) out.push_back(in[k]);
  }
  ctx.set_output(0, ctx.input_dtype(0), out);
  pass_value(ctx, ctx.input_dtype(0), out);
  return ok_status();
}

Status infer_unsqueeze(InferContext& ctx) {
  const Dims& in = ctx.input_shape(0);
  KILN_ASSIGN_OR_RETURN(auto axes, axes_from(ctx, 1));
  if (!axes) return ctx.error(StatusCode::kInvalidModel, "Unsqueeze needs axes");
  int r = int(in.size() + axes->size());
  std::vector<bool> inserted(size_t(r), false);
  for (int64_t a : *axes) {
    KILN_ASSIGN_OR_RETURN(int k, ctx.normalize_axis(a, r, "axis"));
    if (inserted[k]) return ctx.error(StatusCode::kInvalidModel, "axis " + std::to_string(a) + " repeats");
    inserted[k] = true;
  }
  Dims out;
  size_t next = 0;
  for (int k = 0; k < r; ++k) out.push_back(inserted[k] ? Dim(1) : in[next++]);
  ctx.set_output(0, ctx.input_dtype(0), out);
  pass_value(ctx, ctx.input_dtype(0), out);
  return ok_status();
}

Status infer_flatten(InferContext& ctx) {
  const Dims& in = ctx.input_shape(0);
  int64_t r = int64_t(in.size());
  auto axis = ctx.attrs().get_int("axis", 1);
  if (!axis.ok()) return attr_error(ctx, axis.status());
  if (*axis < -r || *axis > r) {
    return ctx.error(StatusCode::kInvalidModel,
                     "axis " + std::to_string(*axis) + " is out of range for rank " + std::to_string(r));
  }
  size_t a = size_t(*axis < 0 ? *axis + r : *axis);
  Dims out = {product(in, 0, a), product(in, a, in.size())};
  ctx.set_output(0, ctx.input_dtype(0), out);
  pass_value(ctx, ctx.input_dtype(0), out);
  return ok_status();
}

Status infer_concat(InferContext& ctx) {
  const Dims& first = ctx.input_shape(0);
  int r = int(first.size());
  auto axis_attr = ctx.attrs().get_int("axis", std::nullopt);
  if (!axis_attr.ok()) return attr_error(ctx, axis_attr.status());
  if (r == 0) return ctx.error(StatusCode::kInvalidModel, "Concat inputs must have rank >= 1");
  KILN_ASSIGN_OR_RETURN(int axis, ctx.normalize_axis(*axis_attr, r, "axis"));
  DType dtype = ctx.input_dtype(0);
  Dims out = first;
  out[axis] = 0;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) return ctx.error(StatusCode::kInvalidModel, "Concat inputs cannot be omitted");
    const Dims& s = ctx.input_shape(i);
    if (ctx.input_dtype(i) != dtype) {
      return ctx.error(StatusCode::kInvalidModel, label(ctx, i) + " has dtype " +
                                                      std::string(dtype_name(ctx.input_dtype(i))) +
                                                      ", input 0 has " + std::string(dtype_name(dtype)));
    }
    if (int(s.size()) != r) {
      return ctx.error(StatusCode::kInvalidModel, label(ctx, i) + " has rank " +
                                                      std::to_string(s.size()) + ", input 0 has rank " +
                                                      std::to_string(r));
    }
    for (int k = 0; k < r; ++k) {
      if (k == axis) continue;
      KILN_RETURN_IF_ERROR(ctx.require_equal(s[k], first[k],
                                             "input " + std::to_string(i) + " dim " + std::to_string(k) +
                                                 " (" + s[k].to_string() + ") matches input 0 dim " +
                                                 std::to_string(k) + " (" + first[k].to_string() + ")"));
    }
    // One input listed many times adds up past int64 without any input being large.
    KILN_ASSIGN_OR_RETURN(out[axis], ctx.add_dims(out[axis], s[axis],
                                                  "dim " + std::to_string(axis) + " of inputs 0.." +
                                                      std::to_string(i)));
  }
  ctx.set_output(0, dtype, out);
  if (!can_carry(dtype, out)) return ok_status();
  // Values: for each outer index, each input contributes its axis slab in turn.
  std::vector<Dims> values;
  std::vector<int64_t> slab;
  Shape out_shape = *const_shape(out);
  int64_t inner = shape_numel(std::span<const int64_t>(out_shape).subspan(size_t(axis) + 1));
  int64_t outer = shape_numel(std::span<const int64_t>(out_shape).subspan(0, size_t(axis)));
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    auto v = ctx.input_value(i);
    auto s = const_shape(ctx.input_shape(i));
    if (!v || !s || int64_t(v->size()) != shape_numel(*s)) return ok_status();
    values.push_back(std::move(*v));
    slab.push_back((*s)[axis] * inner);
  }
  Dims result;
  for (int64_t o = 0; o < outer; ++o) {
    for (size_t i = 0; i < values.size(); ++i) {
      auto b = values[i].begin() + o * slab[i];
      result.insert(result.end(), b, b + slab[i]);
    }
  }
  ctx.set_output_value(0, std::move(result));
  return ok_status();
}

Status infer_expand(InferContext& ctx) {
  if (ctx.input_rank(1) != 1) {
    return ctx.error(StatusCode::kInvalidModel, label(ctx, 1) + " (the shape) must be 1-D");
  }
  KILN_ASSIGN_OR_RETURN(Dims target, ctx.require_value(1, "shape"));
  const Dims& in = ctx.input_shape(0);
  std::vector<Dims> shapes = {in, target};
  KILN_ASSIGN_OR_RETURN(Dims out, ctx.broadcast_shapes(shapes));
  ctx.set_output(0, ctx.input_dtype(0), out);
  if (can_carry(ctx.input_dtype(0), out)) {
    auto v = ctx.input_value(0);
    auto s = const_shape(in);
    if (v && s && int64_t(v->size()) == shape_numel(*s)) {
      ctx.set_output_value(0, remap_values(*v, *s, *const_shape(out),
                                           [](int, int64_t o, int64_t d) { return d == 1 ? 0 : o; }));
    }
  }
  return ok_status();
}

Status infer_transpose(InferContext& ctx) {
  const Dims& in = ctx.input_shape(0);
  int r = int(in.size());
  std::vector<int64_t> def(static_cast<size_t>(r));
  for (int k = 0; k < r; ++k) def[k] = r - 1 - k;
  auto perm = ctx.attrs().get_ints("perm", def);
  if (!perm.ok()) return attr_error(ctx, perm.status());
  if (int(perm->size()) != r) {
    return ctx.error(StatusCode::kInvalidModel, "perm has " + std::to_string(perm->size()) +
                                                    " entries for rank " + std::to_string(r));
  }
  std::vector<bool> seen(size_t(r), false);
  Dims out;
  for (int64_t p : *perm) {
    if (p < 0 || p >= r || seen[p]) {
      return ctx.error(StatusCode::kInvalidModel, "perm is not a permutation of 0.." + std::to_string(r - 1));
    }
    seen[p] = true;
    out.push_back(in[p]);
  }
  ctx.set_output(0, ctx.input_dtype(0), out);
  if (can_carry(ctx.input_dtype(0), out)) {
    auto v = ctx.input_value(0);
    Shape s = *const_shape(in), os = *const_shape(out);
    if (v && int64_t(v->size()) == shape_numel(s)) {
      std::vector<int64_t> stride(size_t(r), 1);
      for (int k = r - 2; k >= 0; --k) stride[k] = stride[k + 1] * s[k + 1];
      Dims result;
      std::vector<int64_t> idx(size_t(r), 0);
      for (int64_t o = 0; o < shape_numel(os); ++o) {
        int64_t src = 0;
        for (int k = 0; k < r; ++k) src += idx[k] * stride[(*perm)[k]];
        result.push_back((*v)[size_t(src)]);
        for (int k = r - 1; k >= 0; --k) {
          if (++idx[k] < os[k]) break;
          idx[k] = 0;
        }
      }
      ctx.set_output_value(0, std::move(result));
    }
  }
  return ok_status();
}

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
      return ctx.error(StatusCode::kInvalidModel, "the Range length ceil((limit - start) / delta) is not "
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
    return ctx.error(StatusCode::kUnsupported, "the Range delta " + v[2].to_string() +
                                                   " must be a constant at build time");
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
    KILN_RETURN_IF_ERROR(ctx.require_ge(shape[k], 0, "output dim " + std::to_string(k) + " (" +
                                                         shape[k].to_string() + ") is not negative"));
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
  DType dt = *odt >= INT32_MIN && *odt <= INT32_MAX ? dtype_from_onnx(int32_t(*odt))
                                                     : DType::kUndefined;
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

Status infer_split(InferContext& ctx) {
  const Dims& in = ctx.input_shape(0);
  int r = int(in.size());
  // normalize_axis lets axis 0 through on a scalar, which has no dim to split.
  if (r < 1)
    return ctx.error(StatusCode::kInvalidModel,
                     label(ctx, 0) + " is a scalar; Split needs rank >= 1");
  auto axis_attr = ctx.attrs().get_int("axis", 0);
  if (!axis_attr.ok()) return attr_error(ctx, axis_attr.status());
  KILN_ASSIGN_OR_RETURN(int axis, ctx.normalize_axis(*axis_attr, r, "axis"));
  int n = ctx.num_outputs();
  const Dim& d = in[axis];
  Dims sizes;
  if (ctx.has_input(1)) {
    KILN_ASSIGN_OR_RETURN(sizes, ctx.require_value(1, "split"));
  } else if (ctx.attrs().has("split")) {
    auto s = ctx.attrs().get_ints("split", std::nullopt);
    if (!s.ok()) return attr_error(ctx, s.status());
    sizes.assign(s->begin(), s->end());
  }
  if (!sizes.empty() || ctx.has_input(1)) {
    if (int(sizes.size()) != n) {
      return ctx.error(StatusCode::kInvalidModel, "split has " + std::to_string(sizes.size()) +
                                                      " entries for " + std::to_string(n) + " outputs");
    }
    Dim sum = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      KILN_RETURN_IF_ERROR(ctx.require_ge(sizes[i], 0, "split entry " + std::to_string(i) +
                                                           " is not negative"));
      sum = sum + sizes[i];
    }
    KILN_RETURN_IF_ERROR(ctx.require_equal(sum, d, "the split sizes add up to dim " +
                                                       std::to_string(axis) + " (" + d.to_string() +
                                                       ")"));
  } else {
    bool has_num = ctx.attrs().has("num_outputs");
    auto num = ctx.attrs().get_int("num_outputs", int64_t(n));
    if (!num.ok()) return attr_error(ctx, num.status());
    if (*num != n) {
      return ctx.error(StatusCode::kInvalidModel, "num_outputs is " + std::to_string(*num) +
                                                      " but the node has " + std::to_string(n) +
                                                      " outputs");
    }
    if (n < 1) return ctx.error(StatusCode::kInvalidModel, "Split needs an output");
    if (has_num) {
      // Opset 18: chunks of ceil(d / n), the last one smaller.
      Dim chunk = Dim::ceil_div(d, Dim(n));
      Dim last = d - chunk * Dim(n - 1);
      KILN_RETURN_IF_ERROR(ctx.require_ge(last, 0, "dim " + std::to_string(axis) + " (" +
                                                       d.to_string() + ") fills " +
                                                       std::to_string(n) + " chunks"));
      sizes.assign(size_t(n - 1), chunk);
      sizes.push_back(last);
    } else {
      KILN_RETURN_IF_ERROR(ctx.require_divisible(
          d, Dim(n), "dim " + std::to_string(axis) + " (" + d.to_string() + ") splits into " +
                         std::to_string(n) + " equal parts"));
      sizes.assign(size_t(n), Dim::floor_div(d, Dim(n)));
    }
  }
  auto v = ctx.input_value(0);
  Dim offset = 0;
  for (int i = 0; i < n; ++i) {
    Dims out = in;
    out[axis] = sizes[i];
    ctx.set_output(i, ctx.input_dtype(0), out);
    if (v && r == 1 && offset.is_const() && sizes[i].is_const() &&
        can_carry(ctx.input_dtype(0), out) &&
        offset.value() + sizes[i].value() <= int64_t(v->size())) {
      auto b = v->begin() + offset.value();
      ctx.set_output_value(i, Dims(b, b + sizes[i].value()));
    }
    offset = offset + sizes[i];
  }
  return ok_status();
}

Status infer_tile(InferContext& ctx) {
  const Dims& in = ctx.input_shape(0);
  KILN_ASSIGN_OR_RETURN(Dims reps, ctx.require_value(1, "repeats"));
  if (reps.size() != in.size()) {
    return ctx.error(StatusCode::kInvalidModel, "repeats has " + std::to_string(reps.size()) +
                                                    " entries for rank " + std::to_string(in.size()));
  }
  Dims out;
  for (size_t k = 0; k < in.size(); ++k) {
    KILN_RETURN_IF_ERROR(ctx.require_ge(reps[k], 0, "repeat " + std::to_string(k) + " is not negative"));
    KILN_ASSIGN_OR_RETURN(Dim d, ctx.mul_dims(in[k], reps[k],
                                              "dim " + std::to_string(k) + " times " +
                                                  label(ctx, 1) + " element " + std::to_string(k)));
    out.push_back(std::move(d));
  }
  ctx.set_output(0, ctx.input_dtype(0), out);
  if (can_carry(ctx.input_dtype(0), out)) {
    auto v = ctx.input_value(0);
    auto s = const_shape(in);
    if (v && s && int64_t(v->size()) == shape_numel(*s)) {
      ctx.set_output_value(0, remap_values(*v, *s, *const_shape(out),
                                           [](int, int64_t o, int64_t d) { return o % d; }));
    }
  }
  return ok_status();
}

Status infer_pad(InferContext& ctx) {
  const Dims& in = ctx.input_shape(0);
  int r = int(in.size());
  auto mode = ctx.attrs().get_string("mode", std::string("constant"));
  if (!mode.ok()) return attr_error(ctx, mode.status());
  if (*mode != "constant" && *mode != "reflect" && *mode != "edge" && *mode != "wrap") {
    return ctx.error(StatusCode::kUnsupported, "Pad mode '" + *mode + "' is not supported");
  }
  Dims pads;
  std::string pads_from;  // names the attribute or input in errors
  for (const char* name : {"pads", "paddings"}) {
    if (!ctx.attrs().has(name)) continue;
    auto p = ctx.attrs().get_ints(name, std::nullopt);
    if (!p.ok()) return attr_error(ctx, p.status());
    pads.assign(p->begin(), p->end());
    pads_from = std::string("attribute ") + name;
    break;
  }
  // Pads computed at run time: each element's range (ops/value_range.h); an inexact one makes its
  // dim data-dependent, bounded by the input dim plus the pads' upper bounds.
  std::vector<ElementRange> pad_ranges;
  if (pads.empty() && ctx.has_input(1)) {
    pads_from = label(ctx, 1) + " (pads)";
    if (auto v = ctx.input_value(1)) {
      pads = std::move(*v);
    } else {
      // A model input has no producer to bound it: the profile can range its values instead.
      auto r = value_range(ctx.graph(), ctx.node().inputs[1], ctx.symbol_ranges());
      if (!r || ctx.input(1).producer < 0) KILN_RETURN_IF_ERROR(ctx.require_value(1, "pads").status());
      pad_ranges = std::move(*r);
      for (const ElementRange& e : pad_ranges) pads.push_back(e.exact ? *e.exact : Dim(0));
    }
  }
  std::vector<int> axes;
  if (ctx.has_input(3)) {
    KILN_ASSIGN_OR_RETURN(Dims av, ctx.require_value(3, "axes"));
    KILN_ASSIGN_OR_RETURN(auto ai, const_ints(ctx, av, "axes"));
    for (int64_t a : ai) {
      KILN_ASSIGN_OR_RETURN(int k, ctx.normalize_axis(a, r, "axis"));
      axes.push_back(k);
    }
  } else {
    for (int k = 0; k < r; ++k) axes.push_back(k);
  }
  if (pads.size() != 2 * axes.size()) {
    return ctx.error(StatusCode::kInvalidModel, "pads has " + std::to_string(pads.size()) +
                                                    " entries; expected " +
                                                    std::to_string(2 * axes.size()));
  }
  Dims out = in;
  size_t na = axes.size();
  for (size_t i = 0; i < na; ++i) {
    int k = axes[i];
    const Dim& b = pads[i];
    const Dim& e = pads[i + na];
    const std::string padded = "dim " + std::to_string(k) + " padded by " + pads_from +
                               " elements " + std::to_string(i) + " and " + std::to_string(i + na);
    if (!pad_ranges.empty() && (!pad_ranges[i].exact || !pad_ranges[i + na].exact)) {
      const ElementRange &rb = pad_ranges[i], &re = pad_ranges[i + na];
      std::optional<Dim> bound;
      const double limit = double(ir::Interval::kInf);
      if (rb.hi < limit && re.hi < limit && rb.hi > -limit && re.hi > -limit) {
        KILN_ASSIGN_OR_RETURN(Dim grown, ctx.add_dims(in[k], Dim(int64_t(std::floor(rb.hi))), padded));
        KILN_ASSIGN_OR_RETURN(bound, ctx.add_dims(grown, Dim(int64_t(std::floor(re.hi))), padded));
      }
      // The least size: the input's dim plus the least pads (the proof starts the dim there).
      Dim lower = 0;
      if (rb.lo > -limit && re.lo > -limit && rb.lo < limit && re.lo < limit) {
        lower = in[k] + Dim(int64_t(std::ceil(rb.lo))) + Dim(int64_t(std::ceil(re.lo)));
      }
      KILN_ASSIGN_OR_RETURN(out[k], ctx.range_bounded_dim(0, k, "padded", bound,
                                                          padded + " is computed from tensor data at run time and "
                                                                   "has no upper bound kiln can prove from the "
                                                                   "profile's shapes; kiln sizes memory by such a "
                                                                   "bound",
                                                          lower));
      if (*mode != "constant" && !(rb.hi <= 0 && re.hi <= 0)) {
        KILN_RETURN_IF_ERROR(ctx.require_ge(in[k], 1, "dim " + std::to_string(k) +
                                                          " is not empty when padding in " + *mode + " mode"));
      }
      continue;
    }
    KILN_ASSIGN_OR_RETURN(Dim with_begin, ctx.add_dims(in[k], b, padded));
    KILN_ASSIGN_OR_RETURN(out[k], ctx.add_dims(with_begin, e, padded));
    KILN_RETURN_IF_ERROR(ctx.require_ge(out[k], 0, "padded dim " + std::to_string(k) + " (" +
                                                       out[k].to_string() + ") is not negative"));
    if (*mode != "constant") {
      bool pads_something = !(b.is_const() && b.value() <= 0 && e.is_const() && e.value() <= 0);
      if (pads_something) {
        KILN_RETURN_IF_ERROR(ctx.require_ge(in[k], 1, "dim " + std::to_string(k) +
                                                          " is not empty when padding in " + *mode +
                                                          " mode"));
      }
    }
  }
  ctx.set_output(0, ctx.input_dtype(0), out);
  return ok_status();
}

Status infer_trilu(InferContext& ctx) {
  if (ctx.input_rank(0) < 2) {
    return ctx.error(StatusCode::kInvalidModel, "Trilu needs an input of rank >= 2");
  }
  auto upper = ctx.attrs().get_int("upper", 1);
  if (!upper.ok()) return attr_error(ctx, upper.status());
  if (ctx.has_input(1) && ctx.input_dtype(1) != DType::kInt64) {
    return ctx.error(StatusCode::kInvalidModel, "Trilu's k must be int64");
  }
  ctx.set_output(0, ctx.input_dtype(0), ctx.input_shape(0));
  return ok_status();
}

}  // namespace

void register_shape_ops(OpRegistry& r) {
  r.add(OpSchema{OpKind::kShape, 1, 1, 1, 1, &infer_shape});
  r.add(OpSchema{OpKind::kSize, 1, 1, 1, 1, &infer_size});
  r.add(OpSchema{OpKind::kReshape, 1, 2, 1, 1, &infer_reshape, false, true});
  r.add(OpSchema{OpKind::kSqueeze, 1, 2, 1, 1, &infer_squeeze, false, true});
  r.add(OpSchema{OpKind::kUnsqueeze, 1, 2, 1, 1, &infer_unsqueeze, false, true});
  r.add(OpSchema{OpKind::kFlatten, 1, 1, 1, 1, &infer_flatten, false, true});
  r.add(OpSchema{OpKind::kConcat, 1, kVariadic, 1, 1, &infer_concat, OpTraits{.inputs_required = true}});
  r.add(OpSchema{OpKind::kExpand, 2, 2, 1, 1, &infer_expand});
  r.add(OpSchema{OpKind::kTranspose, 1, 1, 1, 1, &infer_transpose});
  r.add(OpSchema{OpKind::kRange, 3, 3, 1, 1, &infer_range});
  r.add(OpSchema{OpKind::kConstantOfShape, 1, 1, 1, 1, &infer_constant_of_shape});
  r.add(OpSchema{OpKind::kConstant, 0, 0, 1, 1, &infer_constant});
  r.add(OpSchema{OpKind::kSplit, 1, 2, 1, kVariadic, &infer_split});
  r.add(OpSchema{OpKind::kTile, 2, 2, 1, 1, &infer_tile});
  r.add(OpSchema{OpKind::kPad, 1, 4, 1, 1, &infer_pad});
  r.add(OpSchema{OpKind::kTrilu, 1, 2, 1, 1, &infer_trilu});
  r.add(OpSchema{OpKind::kHannWindow, 1, 1, 1, 1, &infer_window});
  r.add(OpSchema{OpKind::kHammingWindow, 1, 1, 1, 1, &infer_window});
  r.add(OpSchema{OpKind::kBlackmanWindow, 1, 1, 1, 1, &infer_window});
  r.add(OpSchema{OpKind::kEyeLike, 1, 1, 1, 1, &infer_eye_like});
}

}  // namespace kiln::ops
