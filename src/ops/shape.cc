// Schemas of the shape op family: Shape, Size, Reshape, Squeeze, Unsqueeze, Flatten, Concat,
// Expand, Transpose, Split, Tile, Pad, Trilu (the ops that make tensors from nothing or a shape are
// in generators.cc). Ops that move shape tensors also carry their symbolic values so Shape ->
// Gather -> Concat -> Reshape chains fold.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "core/checked.h"
#include "ops/schema.h"
#include "ops/shape_util.h"
#include "ops/value_range.h"

namespace kiln::ops {
namespace {

using shape_util::attr_error;
using shape_util::can_carry;
using shape_util::const_shape;
using shape_util::label;
using shape_util::product;

using ir::Dim;
using Dims = std::vector<Dim>;

constexpr int kVariadic = 1 << 20;

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

// Axes from an attribute (older opsets) or from an input (newer ones); nullopt when neither is
// given.
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
    for (int k = off; k < r; ++k)
      src = src * in_shape[k - off] + map_axis(k, idx[k], in_shape[k - off]);
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
        return ctx.error(StatusCode::kInvalidModel,
                         "the shape " + ir::dims_to_string(target) + " has more than one -1");
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
        return ctx.error(StatusCode::kInvalidModel, "shape element " + std::to_string(i) +
                                                        " is 0 (copy the input dim) but the " +
                                                        "input " + ir::dims_to_string(in) +
                                                        " has no dim " + std::to_string(i));
      }
      out.push_back(in[i]);
    } else {
      if (t.is_const() && t.value() == 0) has_zero = true;
      out.push_back(t);
    }
    known = known * out.back();
  }
  if (has_zero && infer_at >= 0) {
    return ctx.error(
        StatusCode::kInvalidModel,
        "with allowzero=1 the shape " + ir::dims_to_string(target) + " cannot hold both 0 and -1");
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
                         "Squeeze without axes on the symbolic dim " + in[k].to_string() + " of " +
                             ir::dims_to_string(in) +
                             " depends on its run-time value; give the axes explicitly");
      }
      drop[k] = in[k].value() == 1;
    }
  } else {
    for (int64_t a : *axes) {
      KILN_ASSIGN_OR_RETURN(int k, ctx.normalize_axis(a, r, "axis"));
      if (drop[k])
        return ctx.error(StatusCode::kInvalidModel, "axis " + std::to_string(a) + " repeats");
      drop[k] = true;
      KILN_RETURN_IF_ERROR(ctx.require_equal(
          in[k], 1,
          "squeezed dim " + std::to_string(k) + " of " + ir::dims_to_string(in) + " is 1"));
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
    if (inserted[k])
      return ctx.error(StatusCode::kInvalidModel, "axis " + std::to_string(a) + " repeats");
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
    return ctx.error(
        StatusCode::kInvalidModel,
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
    if (!ctx.has_input(i))
      return ctx.error(StatusCode::kInvalidModel, "Concat inputs cannot be omitted");
    const Dims& s = ctx.input_shape(i);
    if (ctx.input_dtype(i) != dtype) {
      return ctx.error(StatusCode::kInvalidModel,
                       label(ctx, i) + " has dtype " + std::string(dtype_name(ctx.input_dtype(i))) +
                           ", input 0 has " + std::string(dtype_name(dtype)));
    }
    if (int(s.size()) != r) {
      return ctx.error(StatusCode::kInvalidModel, label(ctx, i) + " has rank " +
                                                      std::to_string(s.size()) +
                                                      ", input 0 has rank " + std::to_string(r));
    }
    for (int k = 0; k < r; ++k) {
      if (k == axis) continue;
      KILN_RETURN_IF_ERROR(ctx.require_equal(
          s[k], first[k],
          "input " + std::to_string(i) + " dim " + std::to_string(k) + " (" + s[k].to_string() +
              ") matches input 0 dim " + std::to_string(k) + " (" + first[k].to_string() + ")"));
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
      ctx.set_output_value(0,
                           remap_values(*v, *s, *const_shape(out),
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
      return ctx.error(StatusCode::kInvalidModel,
                       "perm is not a permutation of 0.." + std::to_string(r - 1));
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
                                                      " entries for " + std::to_string(n) +
                                                      " outputs");
    }
    Dim sum = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      KILN_RETURN_IF_ERROR(
          ctx.require_ge(sizes[i], 0, "split entry " + std::to_string(i) + " is not negative"));
      sum = sum + sizes[i];
    }
    KILN_RETURN_IF_ERROR(ctx.require_equal(
        sum, d,
        "the split sizes add up to dim " + std::to_string(axis) + " (" + d.to_string() + ")"));
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
      KILN_RETURN_IF_ERROR(ctx.require_ge(last, 0,
                                          "dim " + std::to_string(axis) + " (" + d.to_string() +
                                              ") fills " + std::to_string(n) + " chunks"));
      sizes.assign(size_t(n - 1), chunk);
      sizes.push_back(last);
    } else {
      KILN_RETURN_IF_ERROR(ctx.require_divisible(d, Dim(n),
                                                 "dim " + std::to_string(axis) + " (" +
                                                     d.to_string() + ") splits into " +
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
                                                    " entries for rank " +
                                                    std::to_string(in.size()));
  }
  Dims out;
  for (size_t k = 0; k < in.size(); ++k) {
    KILN_RETURN_IF_ERROR(
        ctx.require_ge(reps[k], 0, "repeat " + std::to_string(k) + " is not negative"));
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
      if (!r || ctx.input(1).producer < 0)
        KILN_RETURN_IF_ERROR(ctx.require_value(1, "pads").status());
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
        KILN_ASSIGN_OR_RETURN(Dim grown,
                              ctx.add_dims(in[k], Dim(int64_t(std::floor(rb.hi))), padded));
        KILN_ASSIGN_OR_RETURN(bound, ctx.add_dims(grown, Dim(int64_t(std::floor(re.hi))), padded));
      }
      // The least size: the input's dim plus the least pads (the proof starts the dim there).
      Dim lower = 0;
      if (rb.lo > -limit && re.lo > -limit && rb.lo < limit && re.lo < limit) {
        lower = in[k] + Dim(int64_t(std::ceil(rb.lo))) + Dim(int64_t(std::ceil(re.lo)));
      }
      KILN_ASSIGN_OR_RETURN(
          out[k], ctx.range_bounded_dim(0, k, "padded", bound,
                                        padded + " is computed from tensor data at run time and "
                                                 "has no upper bound kiln can prove from the "
                                                 "profile's shapes; kiln sizes memory by such a "
                                                 "bound",
                                        lower));
      if (*mode != "constant" && !(rb.hi <= 0 && re.hi <= 0)) {
        KILN_RETURN_IF_ERROR(ctx.require_ge(
            in[k], 1,
            "dim " + std::to_string(k) + " is not empty when padding in " + *mode + " mode"));
      }
      continue;
    }
    KILN_ASSIGN_OR_RETURN(Dim with_begin, ctx.add_dims(in[k], b, padded));
    KILN_ASSIGN_OR_RETURN(out[k], ctx.add_dims(with_begin, e, padded));
    KILN_RETURN_IF_ERROR(ctx.require_ge(
        out[k], 0,
        "padded dim " + std::to_string(k) + " (" + out[k].to_string() + ") is not negative"));
    if (*mode != "constant") {
      bool pads_something = !(b.is_const() && b.value() <= 0 && e.is_const() && e.value() <= 0);
      if (pads_something) {
        KILN_RETURN_IF_ERROR(ctx.require_ge(
            in[k], 1,
            "dim " + std::to_string(k) + " is not empty when padding in " + *mode + " mode"));
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
  r.add(OpSchema{OpKind::kConcat, 1, kVariadic, 1, 1, &infer_concat,
                 OpTraits{.inputs_required = true}});
  r.add(OpSchema{OpKind::kExpand, 2, 2, 1, 1, &infer_expand});
  r.add(OpSchema{OpKind::kTranspose, 1, 1, 1, 1, &infer_transpose});
  r.add(OpSchema{OpKind::kSplit, 1, 2, 1, kVariadic, &infer_split});
  r.add(OpSchema{OpKind::kTile, 2, 2, 1, 1, &infer_tile});
  r.add(OpSchema{OpKind::kPad, 1, 4, 1, 1, &infer_pad});
  r.add(OpSchema{OpKind::kTrilu, 1, 2, 1, 1, &infer_trilu});
}

}  // namespace kiln::ops
