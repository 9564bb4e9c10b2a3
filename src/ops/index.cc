// Schemas of the index op family: Slice, Gather, GatherND, GatherElements, CumSum, Scatter*,
// OneHot, ReverseSequence, TensorScatter. Slice clamps its starts and ends per the ONNX spec on
// symbolic dims, proving each clamp from bounds where it can.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <string>

#include "core/checked.h"
#include "ops/schema.h"

namespace kiln::ops {
namespace {

using ir::Dim;
using Dims = std::vector<Dim>;

// Starts/ends at or beyond this magnitude mean "to the end" (exporters write INT64_MAX, INT32_MAX).
constexpr int64_t kHuge = std::numeric_limits<int32_t>::max();

Status attr_error(const InferContext& ctx, const Status& s) {
  return ctx.error(s.code(), s.message());
}

std::string label(const InferContext& ctx, int i) {
  return "input " + std::to_string(i) + " ('" + ctx.input(i).name + "')";
}

std::optional<Shape> const_shape(const Dims& dims) {
  Shape out;
  for (const Dim& d : dims) {
    if (!d.is_const() || d.value() < 0) return std::nullopt;
    out.push_back(d.value());
  }
  return out;
}

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

// Decides comparisons for Slice's clamps. Symbols are only known to be >= 0, which leaves x[-1:] on
// an axis of size s as min(1, s). Profiles almost never allow empty dims, so when assuming every
// symbol >= 1 decides a comparison, the comparison itself is recorded for the profile checker and
// taken as true: the shape reads 1, and a profile that allows s = 0 fails naming this slice.
class Prover {
 public:
  Prover(InferContext& ctx, std::string where) : ctx_(ctx), where_(std::move(where)) {}

  StatusOr<bool> le(const Dim& a, const Dim& b) {
    if (provably_le(a, b)) return true;
    Dim d = b - a;
    std::set<std::string> symbols;
    d.collect_symbols(&symbols);
    ir::SymbolRanges ranges;
    for (const auto& name : symbols) ranges[name] = ir::Interval{1, ir::Interval::kInf};
    if (d.bounds(ranges).lo < 0) return false;
    KILN_RETURN_IF_ERROR(ctx_.require_ge(
        b, a, "the slice on " + where_ + " needs " + a.to_string() + " <= " + b.to_string()));
    return true;
  }
  StatusOr<Dim> min(const Dim& a, const Dim& b) {
    KILN_ASSIGN_OR_RETURN(bool ab, le(a, b));
    if (ab) return a;
    KILN_ASSIGN_OR_RETURN(bool ba, le(b, a));
    if (ba) return b;
    return Dim::min(a, b);
  }
  StatusOr<Dim> max(const Dim& a, const Dim& b) {
    KILN_ASSIGN_OR_RETURN(bool ba, le(b, a));
    if (ba) return a;
    KILN_ASSIGN_OR_RETURN(bool ab, le(a, b));
    if (ab) return b;
    return Dim::max(a, b);
  }

 private:
  InferContext& ctx_;
  std::string where_;
};

bool is_index_dtype(DType d) { return d == DType::kInt64 || d == DType::kInt32; }

// min(max(x, lo), hi), keeping the clamps that bounds could not resolve apart so that the slice
// length can distribute over them (d - max(d - 1, 0) reads better as min(1, d)).
struct Clamped {
  Dim x, lo, hi;
  bool lo_open = false, hi_open = false;
  bool resolved() const { return !lo_open && !hi_open; }
  Dim dim() const {
    Dim v = lo_open ? Dim::max(x, lo) : x;
    return hi_open ? Dim::min(v, hi) : v;
  }
};

StatusOr<Clamped> clamp(Prover& p, const Dim& x, const Dim& lo, const Dim& hi) {
  Clamped c{x, lo, hi};
  KILN_ASSIGN_OR_RETURN(bool x_le_lo, p.le(x, lo));
  if (x_le_lo) {
    c.x = lo;
  } else {
    KILN_ASSIGN_OR_RETURN(bool lo_le_x, p.le(lo, x));
    c.lo_open = !lo_le_x;
  }
  KILN_ASSIGN_OR_RETURN(bool hi_le_x, p.le(hi, c.x));
  if (hi_le_x) {
    // max(x, lo) >= x >= hi, so both clamps end at hi.
    c.x = hi;
    c.lo_open = false;
    return c;
  }
  KILN_ASSIGN_OR_RETURN(bool x_le_hi, p.le(c.x, hi));
  bool lo_le_hi = true;
  if (c.lo_open) {
    KILN_ASSIGN_OR_RETURN(lo_le_hi, p.le(lo, hi));
  }
  c.hi_open = !x_le_hi || !lo_le_hi;
  return c;
}

// One slice axis: the output length, and the first index and step when they are constants.
struct SliceAxis {
  Dim length;
  std::optional<int64_t> first;
};

StatusOr<SliceAxis> slice_axis(InferContext& ctx, const Dim& d, const Dim& start, const Dim& end,
                               int64_t step, int axis) {
  std::string where = "axis " + std::to_string(axis) + " (" + d.to_string() + ")";
  Prover prover(ctx, where);
  // Per the spec: negative values count from the end, then starts clamp to [0, d] and ends to
  // [0, d] for positive steps; [0, d - 1] and [-1, d - 1] for negative ones.
  auto normalize = [&](const Dim& v, bool is_end) -> StatusOr<Clamped> {
    Dim lo = step > 0 ? Dim(0) : Dim(is_end ? -1 : 0);
    Dim hi = step > 0 ? d : d - 1;
    std::string name = is_end ? "end" : "start";
    if (v.is_const() && (v.value() >= kHuge || v.value() <= -kHuge)) {
      bool up = v.value() > 0;
      if (!d.is_const() && v.value() < ir::Interval::kInf && v.value() > -ir::Interval::kInf) {
        KILN_RETURN_IF_ERROR(ctx.require_ge(
            Dim(up ? v.value() : -v.value()), d,
            "slice " + name + " " + std::to_string(v.value()) + " lies beyond " + where));
      }
      return clamp(prover, up ? hi : lo, lo, hi);
    }
    ir::Interval b = v.bounds({});
    Dim x;
    if (b.lo >= 0) {
      x = v;
    } else if (b.hi < 0) {
      x = v + d;
    } else {
      return ctx.error(StatusCode::kUnsupported, "the slice " + name + " " + v.to_string() +
                                                     " on " + where +
                                                     " may or may not be negative");
    }
    return clamp(prover, x, lo, hi);
  };
  KILN_ASSIGN_OR_RETURN(Clamped s, normalize(start, false));
  KILN_ASSIGN_OR_RETURN(Clamped e, normalize(end, true));
  // length = max(0, ceil((u - l) / |step|)) with u the upper and l the lower side.
  const Clamped& u = step > 0 ? e : s;
  const Clamped& l = step > 0 ? s : e;
  int64_t mag = step > 0 ? step : -step;
  auto ceil_div = [mag](const Dim& x) { return mag == 1 ? x : Dim::ceil_div(x, Dim(mag)); };
  Dim length;
  bool min_form = (!u.lo_open) && (!l.hi_open);  // u - l is a min over the open clamps
  bool max_form = (!u.hi_open) && (!l.lo_open);  // u - l is a max over the open clamps
  Dims us = {u.x}, ls = {l.x};
  if (min_form) {
    if (u.hi_open) us.push_back(u.hi);
    if (l.lo_open) ls.push_back(l.lo);
  } else if (max_form) {
    if (u.lo_open) us.push_back(u.lo);
    if (l.hi_open) ls.push_back(l.hi);
  }
  if (min_form || max_form) {
    std::optional<Dim> acc;
    for (const Dim& a : us) {
      for (const Dim& b : ls) {
        Dim c = ceil_div(a - b);
        if (!acc) {
          acc = c;
        } else if (min_form) {
          KILN_ASSIGN_OR_RETURN(acc, prover.min(*acc, c));
        } else {
          KILN_ASSIGN_OR_RETURN(acc, prover.max(*acc, c));
        }
      }
    }
    KILN_ASSIGN_OR_RETURN(length, prover.max(*acc, Dim(0)));
  } else {
    KILN_ASSIGN_OR_RETURN(length, prover.max(ceil_div(u.dim() - l.dim()), Dim(0)));
  }
  SliceAxis out{length, std::nullopt};
  if (s.resolved() && s.x.is_const()) out.first = s.x.value();
  return out;
}

// Slice parameters from attributes (opset < 10) or inputs, as dims.
struct SliceParams {
  Dims starts, ends, axes, steps;
};

StatusOr<SliceParams> slice_params(InferContext& ctx) {
  SliceParams p;
  const ir::Attributes& a = ctx.attrs();
  if (a.has("starts")) {
    for (auto [name, dst] :
         {std::pair{"starts", &p.starts}, std::pair{"ends", &p.ends}, std::pair{"axes", &p.axes}}) {
      if (!a.has(name)) continue;
      auto v = a.get_ints(name, std::nullopt);
      if (!v.ok()) return attr_error(ctx, v.status());
      dst->assign(v->begin(), v->end());
    }
  } else {
    const char* names[] = {"", "starts", "ends", "axes", "steps"};
    Dims* dsts[] = {nullptr, &p.starts, &p.ends, &p.axes, &p.steps};
    for (int i = 1; i <= 4; ++i) {
      if (!ctx.has_input(i)) {
        if (i <= 2)
          return ctx.error(StatusCode::kInvalidModel, std::string("Slice needs ") + names[i]);
        continue;
      }
      if (!is_index_dtype(ctx.input_dtype(i))) {
        return ctx.error(StatusCode::kInvalidModel,
                         label(ctx, i) + " (" + names[i] + ") must be int32 or int64");
      }
      KILN_ASSIGN_OR_RETURN(*dsts[i], ctx.require_value(i, names[i]));
    }
  }
  size_t n = p.starts.size();
  if (p.ends.size() != n || (!p.axes.empty() && p.axes.size() != n) ||
      (!p.steps.empty() && p.steps.size() != n)) {
    return ctx.error(StatusCode::kInvalidModel, "starts, ends, axes and steps differ in length");
  }
  return p;
}

Status infer_slice(InferContext& ctx) {
  const Dims& in = ctx.input_shape(0);
  int r = int(in.size());
  // normalize_axis lets axis 0 through at rank 0; a scalar has no axis to slice.
  if (r == 0)
    return ctx.error(StatusCode::kInvalidModel, "input 0 is a scalar; Slice needs rank 1 or more");
  KILN_ASSIGN_OR_RETURN(SliceParams p, slice_params(ctx));
  Dims out = in;
  std::vector<bool> seen(size_t(r), false);
  std::vector<int64_t> firsts(size_t(r), 0), steps(size_t(r), 1);
  bool firsts_known = true;
  for (size_t i = 0; i < p.starts.size(); ++i) {
    int64_t axis_v = int64_t(i);
    if (!p.axes.empty()) {
      if (!p.axes[i].is_const()) {
        return ctx.error(StatusCode::kUnsupported, "slice axes must be constants");
      }
      axis_v = p.axes[i].value();
    }
    KILN_ASSIGN_OR_RETURN(int axis, ctx.normalize_axis(axis_v, r, "axis"));
    if (seen[axis])
      return ctx.error(StatusCode::kInvalidModel, "axis " + std::to_string(axis) + " repeats");
    seen[axis] = true;
    int64_t step = 1;
    if (!p.steps.empty()) {
      if (!p.steps[i].is_const()) {
        return ctx.error(StatusCode::kUnsupported,
                         "slice step " + p.steps[i].to_string() + " must be a constant");
      }
      step = p.steps[i].value();
    }
    if (step == 0) return ctx.error(StatusCode::kInvalidModel, "slice step is 0");
    // |step| is taken below; INT64_MIN has no magnitude in int64.
    if (step == std::numeric_limits<int64_t>::min()) {
      return ctx.error(
          StatusCode::kUnsupported,
          "slice step " + std::to_string(step) + " on axis " + std::to_string(axis) +
              " has no int64 magnitude (-4611686018427387904, or any step longer than the axis, "
              "selects the same one element)");
    }
    KILN_ASSIGN_OR_RETURN(SliceAxis sa,
                          slice_axis(ctx, in[axis], p.starts[i], p.ends[i], step, axis));
    out[axis] = sa.length;
    steps[axis] = step;
    if (sa.first) {
      firsts[axis] = *sa.first;
    } else {
      firsts_known = false;
    }
  }
  ctx.set_output(0, ctx.input_dtype(0), out);
  // Values of small tensors (shape vectors, a [3, 2] table of pads reversed by step -1):
  // out[j_0, ...] = in[first_0 + j_0 * step_0, ...].
  auto v = ctx.input_value(0);
  auto is = const_shape(in);
  if (firsts_known && can_carry(ctx.input_dtype(0), out) && v && is &&
      int64_t(v->size()) == shape_numel(*is)) {
    const Shape os = *const_shape(out);
    Dims value;
    for (int64_t o = 0; o < shape_numel(os); ++o) {
      int64_t rem = o, src = 0, stride = 1;
      for (int d = r - 1; d >= 0; --d) {
        const int64_t j = rem % os[size_t(d)];
        rem /= os[size_t(d)];
        const int64_t k = firsts[size_t(d)] + j * steps[size_t(d)];
        if (k < 0 || k >= (*is)[size_t(d)]) return ok_status();
        src += k * stride;
        stride *= (*is)[size_t(d)];
      }
      value.push_back((*v)[size_t(src)]);
    }
    ctx.set_output_value(0, std::move(value));
  }
  return ok_status();
}

Status infer_gather(InferContext& ctx) {
  const Dims& data = ctx.input_shape(0);
  const Dims& idx = ctx.input_shape(1);
  int r = int(data.size());
  if (r < 1) return ctx.error(StatusCode::kInvalidModel, "Gather data must have rank >= 1");
  if (!is_index_dtype(ctx.input_dtype(1))) {
    return ctx.error(StatusCode::kInvalidModel,
                     label(ctx, 1) + " (indices) must be int32 or int64");
  }
  auto axis_attr = ctx.attrs().get_int("axis", 0);
  if (!axis_attr.ok()) return attr_error(ctx, axis_attr.status());
  KILN_ASSIGN_OR_RETURN(int axis, ctx.normalize_axis(*axis_attr, r, "axis"));
  Dims out(data.begin(), data.begin() + axis);
  out.insert(out.end(), idx.begin(), idx.end());
  out.insert(out.end(), data.begin() + axis + 1, data.end());
  ctx.set_output(0, ctx.input_dtype(0), out);

  auto iv = ctx.input_value(1);
  if (!iv) return ok_status();
  // Known indices: check them against the axis now (or record the check for the profile).
  const Dim& d = data[axis];
  std::vector<int64_t> norm;
  for (const Dim& i : *iv) {
    if (!i.is_const()) return ok_status();
    int64_t k = i.value();
    // No axis reaches 2^62 (Interval::kInf), and beyond it Dim(k) + 1 or Dim(-k) would wrap.
    if (k > ir::Interval::kInf || k < -ir::Interval::kInf) {
      return ctx.error(StatusCode::kInvalidModel,
                       "index " + std::to_string(k) + " is out of range for axis " +
                           std::to_string(axis) + " (" + d.to_string() + ")");
    }
    std::string what = "index " + std::to_string(k) + " is within axis " + std::to_string(axis) +
                       " (" + d.to_string() + ")";
    if (k >= 0) {
      KILN_RETURN_IF_ERROR(ctx.require_ge(d, Dim(k) + 1, what));
    } else {
      KILN_RETURN_IF_ERROR(ctx.require_ge(d, Dim(-k), what));
    }
    if (d.is_const()) norm.push_back(k < 0 ? k + d.value() : k);
  }
  if (!can_carry(ctx.input_dtype(0), out)) return ok_status();
  auto dv = ctx.input_value(0);
  auto ds = const_shape(data);
  if (!dv || !ds || int64_t(dv->size()) != shape_numel(*ds) || norm.size() != iv->size()) {
    return ok_status();
  }
  int64_t outer = shape_numel(std::span<const int64_t>(*ds).subspan(0, size_t(axis)));
  int64_t inner = shape_numel(std::span<const int64_t>(*ds).subspan(size_t(axis) + 1));
  int64_t n = d.value();
  Dims value;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t k : norm) {
      auto b = dv->begin() + (o * n + k) * inner;
      value.insert(value.end(), b, b + inner);
    }
  }
  ctx.set_output_value(0, std::move(value));
  return ok_status();
}

Status infer_gather_nd(InferContext& ctx) {
  const Dims& data = ctx.input_shape(0);
  const Dims& idx = ctx.input_shape(1);
  int r = int(data.size()), q = int(idx.size());
  if (ctx.input_dtype(1) != DType::kInt64) {
    return ctx.error(StatusCode::kInvalidModel, label(ctx, 1) + " (indices) must be int64");
  }
  auto b_attr = ctx.attrs().get_int("batch_dims", 0);
  if (!b_attr.ok()) return attr_error(ctx, b_attr.status());
  int64_t b = *b_attr;
  if (r < 1 || q < 1 || b < 0 || b >= std::min(r, q)) {
    return ctx.error(StatusCode::kInvalidModel,
                     "GatherND needs data and indices of rank >= 1 and "
                     "batch_dims below both ranks");
  }
  const Dim& last = idx.back();
  if (!last.is_const()) {
    return ctx.error(StatusCode::kUnsupported, "the last indices dim " + last.to_string() +
                                                   " must be a constant (it sets the output rank)");
  }
  int64_t m = last.value();
  if (m < 1 || m > r - b) {
    return ctx.error(StatusCode::kInvalidModel, "the last indices dim " + std::to_string(m) +
                                                    " must be in [1, " + std::to_string(r - b) +
                                                    "]");
  }
  for (int64_t k = 0; k < b; ++k) {
    KILN_RETURN_IF_ERROR(ctx.require_equal(
        idx[k], data[k],
        "indices batch dim " + std::to_string(k) + " matches data dim " + std::to_string(k)));
  }
  Dims out(idx.begin(), idx.end() - 1);
  out.insert(out.end(), data.begin() + b + m, data.end());
  ctx.set_output(0, ctx.input_dtype(0), out);
  return ok_status();
}

Status infer_gather_elements(InferContext& ctx) {
  const Dims& data = ctx.input_shape(0);
  const Dims& idx = ctx.input_shape(1);
  int r = int(data.size());
  if (!is_index_dtype(ctx.input_dtype(1))) {
    return ctx.error(StatusCode::kInvalidModel,
                     label(ctx, 1) + " (indices) must be int32 or int64");
  }
  if (r < 1 || int(idx.size()) != r) {
    return ctx.error(StatusCode::kInvalidModel,
                     "GatherElements data and indices must have the same "
                     "rank >= 1");
  }
  auto axis_attr = ctx.attrs().get_int("axis", 0);
  if (!axis_attr.ok()) return attr_error(ctx, axis_attr.status());
  KILN_ASSIGN_OR_RETURN(int axis, ctx.normalize_axis(*axis_attr, r, "axis"));
  for (int k = 0; k < r; ++k) {
    if (k == axis) continue;
    KILN_RETURN_IF_ERROR(ctx.require_ge(
        data[k], idx[k],
        "indices dim " + std::to_string(k) + " fits in data dim " + std::to_string(k)));
  }
  ctx.set_output(0, ctx.input_dtype(0), idx);
  return ok_status();
}

Status infer_cumsum(InferContext& ctx) {
  DType dtype = ctx.input_dtype(0);
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64 && dtype != DType::kInt32 &&
      dtype != DType::kInt64) {
    return ctx.error(
        StatusCode::kUnsupported,
        ctx.node().op_type + " on " + std::string(dtype_name(dtype)) + " is not supported");
  }
  if (!is_index_dtype(ctx.input_dtype(1))) {
    return ctx.error(StatusCode::kInvalidModel, label(ctx, 1) + " (axis) must be int32 or int64");
  }
  KILN_ASSIGN_OR_RETURN(Dims axis, ctx.require_value(1, "axis"));
  if (axis.size() != 1 || !axis[0].is_const()) {
    return ctx.error(StatusCode::kInvalidModel, "the axis must be one constant");
  }
  KILN_RETURN_IF_ERROR(ctx.normalize_axis(axis[0].value(), ctx.input_rank(0), "axis").status());
  ctx.set_output(0, dtype, ctx.input_shape(0));
  return ok_status();
}

// ScatterElements (and Scatter, its deprecated name): data, indices and updates of one rank.
Status infer_scatter_elements(InferContext& ctx) {
  const Dims& data = ctx.input_shape(0);
  const Dims& idx = ctx.input_shape(1);
  const Dims& upd = ctx.input_shape(2);
  int r = int(data.size());
  if (!is_index_dtype(ctx.input_dtype(1))) {
    return ctx.error(StatusCode::kInvalidModel,
                     label(ctx, 1) + " (indices) must be int32 or int64");
  }
  if (ctx.input_dtype(2) != ctx.input_dtype(0)) {
    return ctx.error(StatusCode::kInvalidModel, "updates and data must have the same dtype");
  }
  if (r < 1 || int(idx.size()) != r || int(upd.size()) != r) {
    return ctx.error(StatusCode::kInvalidModel,
                     "data, indices and updates must have the same rank >= 1");
  }
  auto axis_attr = ctx.attrs().get_int("axis", 0);
  if (!axis_attr.ok()) return attr_error(ctx, axis_attr.status());
  KILN_RETURN_IF_ERROR(ctx.normalize_axis(*axis_attr, r, "axis").status());
  for (int k = 0; k < r; ++k) {
    KILN_RETURN_IF_ERROR(ctx.require_equal(
        idx[k], upd[k],
        "updates dim " + std::to_string(k) + " matches indices dim " + std::to_string(k)));
  }
  auto red = ctx.attrs().get_string("reduction", "none");
  if (!red.ok()) return attr_error(ctx, red.status());
  if (*red != "none" && *red != "add" && *red != "mul" && *red != "max" && *red != "min") {
    return ctx.error(StatusCode::kInvalidModel, "unknown reduction '" + *red + "'");
  }
  ctx.set_output(0, ctx.input_dtype(0), data);
  return ok_status();
}

// ScatterND: indices (..., k) address slices of data; updates = indices[:-1] + data[k:].
Status infer_scatter_nd(InferContext& ctx) {
  const Dims& data = ctx.input_shape(0);
  const Dims& idx = ctx.input_shape(1);
  const Dims& upd = ctx.input_shape(2);
  if (ctx.input_dtype(1) != DType::kInt64) {
    return ctx.error(StatusCode::kInvalidModel, label(ctx, 1) + " (indices) must be int64");
  }
  if (ctx.input_dtype(2) != ctx.input_dtype(0)) {
    return ctx.error(StatusCode::kInvalidModel, "updates and data must have the same dtype");
  }
  if (idx.empty() || !idx.back().is_const()) {
    return ctx.error(StatusCode::kInvalidModel, "the last dim of indices must be a constant");
  }
  int64_t k = idx.back().value();
  int r = int(data.size()), q = int(idx.size());
  if (k < 1 || k > r || int(upd.size()) != q - 1 + r - int(k)) {
    return ctx.error(StatusCode::kInvalidModel,
                     "updates must have rank q + r - k - 1 with 1 <= k <= r");
  }
  for (int d = 0; d < q - 1; ++d) {
    KILN_RETURN_IF_ERROR(ctx.require_equal(upd[d], idx[d], "updates dim matches indices dim"));
  }
  for (int d = int(k); d < r; ++d) {
    KILN_RETURN_IF_ERROR(
        ctx.require_equal(upd[q - 1 + d - int(k)], data[d], "updates dim matches data dim"));
  }
  auto red = ctx.attrs().get_string("reduction", "none");
  if (!red.ok()) return attr_error(ctx, red.status());
  if (*red != "none" && *red != "add" && *red != "mul" && *red != "max" && *red != "min") {
    return ctx.error(StatusCode::kInvalidModel, "unknown reduction '" + *red + "'");
  }
  ctx.set_output(0, ctx.input_dtype(0), data);
  return ok_status();
}

// OneHot: indices of any numeric dtype, a one-element depth (its value sets the output's size, so
// it must be known at build time), values [off, on]; the depth axis is inserted at `axis`.
Status infer_one_hot(InferContext& ctx) {
  const DType idt = ctx.input_dtype(0), vdt = ctx.input_dtype(2);
  if (!is_integer(idt) && !is_float(idt)) {
    return ctx.error(StatusCode::kInvalidModel, label(ctx, 0) + " (indices) must be numeric");
  }
  if (!is_integer(ctx.input_dtype(1)) && !is_float(ctx.input_dtype(1))) {
    return ctx.error(StatusCode::kInvalidModel, label(ctx, 1) + " (depth) must be numeric");
  }
  if (!is_integer(vdt) && !is_float(vdt) && vdt != DType::kBool) {
    return ctx.error(StatusCode::kInvalidModel,
                     label(ctx, 2) + " (values) must be numeric or bool");
  }
  const auto& values = ctx.input_shape(2);
  if (values.size() != 1) {
    return ctx.error(StatusCode::kInvalidModel, label(ctx, 2) + " (values) must be [off, on]");
  }
  KILN_RETURN_IF_ERROR(ctx.require_equal(values[0], Dim(2), "values holds [off, on]"));
  Dim depth;
  if (const Tensor* t = ctx.input_constant(1)) {
    if (t->numel() != 1) {
      return ctx.error(StatusCode::kInvalidModel, label(ctx, 1) + " (depth) must hold one value");
    }
    // A float depth is cast to int64 (the spec); a huge or NaN one is refused.
    const double d = is_float(t->dtype()) ? t->float_at(0) : double(t->int_at(0));
    if (!(d >= 1 && d < double(int64_t(1) << 40))) {
      return ctx.error(StatusCode::kInvalidModel,
                       label(ctx, 1) + " (depth) is " + std::to_string(d) + "; it must be >= 1");
    }
    depth = Dim(int64_t(d));
  } else {
    KILN_ASSIGN_OR_RETURN(Dims v, ctx.require_value(1, "depth"));
    if (v.size() != 1) {
      return ctx.error(StatusCode::kInvalidModel, label(ctx, 1) + " (depth) must hold one value");
    }
    KILN_RETURN_IF_ERROR(ctx.require_ge(v[0], Dim(1), "OneHot depth >= 1"));
    depth = v[0];
  }
  auto axis = ctx.attrs().get_int("axis", -1);
  if (!axis.ok()) return attr_error(ctx, axis.status());
  const int rank = ctx.input_rank(0);
  KILN_ASSIGN_OR_RETURN(int a, ctx.normalize_axis(*axis, rank + 1, "axis"));
  Dims out = ctx.input_shape(0);
  out.insert(out.begin() + a, depth);
  ctx.set_output(0, vdt, std::move(out));
  return ok_status();
}

// ReverseSequence: reverses the first sequence_lens[b] steps of each batch entry along the time
// axis; batch and time axes are 0 and 1 in either order.
Status infer_reverse_sequence(InferContext& ctx) {
  if (ctx.input_rank(0) < 2) {
    return ctx.error(StatusCode::kInvalidModel, label(ctx, 0) + " must have rank >= 2");
  }
  if (ctx.input_dtype(1) != DType::kInt64 || ctx.input_rank(1) != 1) {
    return ctx.error(StatusCode::kInvalidModel,
                     label(ctx, 1) + " (sequence_lens) must be a 1-D int64 tensor");
  }
  auto batch = ctx.attrs().get_int("batch_axis", 1);
  if (!batch.ok()) return attr_error(ctx, batch.status());
  auto time = ctx.attrs().get_int("time_axis", 0);
  if (!time.ok()) return attr_error(ctx, time.status());
  if (!((*batch == 0 && *time == 1) || (*batch == 1 && *time == 0))) {
    return ctx.error(StatusCode::kInvalidModel,
                     "batch_axis and time_axis must be 0 and 1 in some order, got " +
                         std::to_string(*batch) + " and " + std::to_string(*time));
  }
  KILN_RETURN_IF_ERROR(ctx.require_equal(ctx.input_shape(1)[0], ctx.input_shape(0)[*batch],
                                         "sequence_lens has one length per batch entry"));
  ctx.set_output(0, ctx.input_dtype(0), ctx.input_shape(0));
  return ok_status();
}

// TensorScatter (a KV-cache write): update [batch, ..., seq, ...] lands in past_cache [batch, ...,
// max_seq, ...] along `axis` (not 0) at write_indices[batch] (0 when omitted), wrapping modulo
// max_seq in circular mode. The output is past_cache's shape.
Status infer_tensor_scatter(InferContext& ctx) {
  const Dims& cache = ctx.input_shape(0);
  const Dims& upd = ctx.input_shape(1);
  const int r = int(cache.size());
  if (ctx.input_dtype(1) != ctx.input_dtype(0)) {
    return ctx.error(StatusCode::kInvalidModel, "update and past_cache must have the same dtype");
  }
  if (r < 2 || int(upd.size()) != r) {
    return ctx.error(StatusCode::kInvalidModel,
                     "past_cache and update must have the same rank >= 2, got " +
                         std::to_string(r) + " and " + std::to_string(upd.size()));
  }
  auto axis_attr = ctx.attrs().get_int("axis", -2);
  if (!axis_attr.ok()) return attr_error(ctx, axis_attr.status());
  KILN_ASSIGN_OR_RETURN(int axis, ctx.normalize_axis(*axis_attr, r, "axis"));
  if (axis == 0) {
    return ctx.error(StatusCode::kInvalidModel, "attribute axis is the batch dim (0)");
  }
  auto mode = ctx.attrs().get_string("mode", "linear");
  if (!mode.ok()) return attr_error(ctx, mode.status());
  if (*mode != "linear" && *mode != "circular") {
    return ctx.error(StatusCode::kInvalidModel,
                     "attribute mode '" + *mode + "' is not linear or circular");
  }
  for (int d = 0; d < r; ++d) {
    if (d == axis) continue;
    KILN_RETURN_IF_ERROR(ctx.require_equal(
        upd[d], cache[d], "update dim " + std::to_string(d) + " matches past_cache"));
  }
  KILN_RETURN_IF_ERROR(ctx.require_ge(
      cache[axis], upd[axis],
      "past_cache's sequence dim (" + std::to_string(axis) + ") is at least update's"));
  if (ctx.has_input(2)) {
    if (ctx.input_dtype(2) != DType::kInt64 || ctx.input_rank(2) != 1) {
      return ctx.error(StatusCode::kInvalidModel,
                       label(ctx, 2) + " (write_indices) must be int64 of shape [batch]");
    }
    KILN_RETURN_IF_ERROR(
        ctx.require_equal(ctx.input_shape(2)[0], cache[0], "write_indices dim 0 equals the batch"));
  }
  ctx.set_output(0, ctx.input_dtype(0), cache);
  return ok_status();
}

}  // namespace

void register_index_ops(OpRegistry& r) {
  r.add(OpSchema{OpKind::kSlice, 1, 5, 1, 1, &infer_slice});
  r.add(OpSchema{OpKind::kGather, 2, 2, 1, 1, &infer_gather});
  r.add(OpSchema{OpKind::kGatherND, 2, 2, 1, 1, &infer_gather_nd});
  r.add(OpSchema{OpKind::kGatherElements, 2, 2, 1, 1, &infer_gather_elements});
  r.add(OpSchema{OpKind::kCumSum, 2, 2, 1, 1, &infer_cumsum});
  r.add(OpSchema{OpKind::kCumProd, 2, 2, 1, 1, &infer_cumsum});
  r.add(OpSchema{OpKind::kScatterElements, 3, 3, 1, 1, &infer_scatter_elements});
  r.add(OpSchema{OpKind::kScatter, 3, 3, 1, 1, &infer_scatter_elements});
  r.add(OpSchema{OpKind::kScatterND, 3, 3, 1, 1, &infer_scatter_nd});
  r.add(OpSchema{OpKind::kOneHot, 3, 3, 1, 1, &infer_one_hot});
  r.add(OpSchema{OpKind::kReverseSequence, 2, 2, 1, 1, &infer_reverse_sequence});
  r.add(OpSchema{OpKind::kTensorScatter, 2, 3, 1, 1, &infer_tensor_scatter});
}

}  // namespace kiln::ops
