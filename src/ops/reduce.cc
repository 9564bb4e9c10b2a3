// Schemas of the reduce op family: ReduceMean/Sum/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare
// with keepdims and noop_with_empty_axes (axes from the attribute or input 1), ArgMax/ArgMin,
// Hardmax and TopK.
#include <algorithm>

#include "core/checked.h"
#include "ops/schema.h"

namespace kiln::ops {
namespace {

// The reduced axes, normalized and sorted; an empty list with *noop set means "identity".
Status reduce_axes(InferContext& ctx, int rank, std::vector<int>* axes, bool* noop) {
  std::vector<int64_t> raw;
  if (ctx.has_input(1)) {
    KILN_ASSIGN_OR_RETURN(std::vector<ir::Dim> v, ctx.require_value(1, "axes"));
    for (size_t k = 0; k < v.size(); ++k) {
      if (!v[k].is_const()) {
        return ctx.error(StatusCode::kUnsupported, "input 1 (axes) element " + std::to_string(k) +
                                                       " is symbolic (" + v[k].to_string() + ")");
      }
      raw.push_back(v[k].value());
    }
  } else {
    KILN_ASSIGN_OR_RETURN(raw, ctx.attrs().get_ints("axes", std::vector<int64_t>{}));
  }
  KILN_ASSIGN_OR_RETURN(int64_t noop_attr, ctx.attrs().get_int("noop_with_empty_axes", 0));
  *noop = raw.empty() && noop_attr != 0;
  axes->clear();
  if (raw.empty()) {
    if (!*noop) {
      for (int d = 0; d < rank; ++d) axes->push_back(d);
    }
    return ok_status();
  }
  for (int64_t a : raw) {
    KILN_ASSIGN_OR_RETURN(int d, ctx.normalize_axis(a, rank, "reduce axis"));
    if (rank == 0) return ctx.error(StatusCode::kInvalidModel, "reduce axis given for a scalar");
    if (std::find(axes->begin(), axes->end(), d) != axes->end()) {
      return ctx.error(StatusCode::kInvalidModel, "reduce axis " + std::to_string(a) + " repeats");
    }
    axes->push_back(d);
  }
  std::sort(axes->begin(), axes->end());
  return ok_status();
}

ir::Dim combine(OpKind kind, const ir::Dim& acc, const ir::Dim& x) {
  switch (kind) {
    case OpKind::kReduceMax:
      return ir::Dim::max(acc, x);
    case OpKind::kReduceMin:
      return ir::Dim::min(acc, x);
    case OpKind::kReduceProd:
      return acc * x;
    default:
      return acc + x;
  }
}

// Folds a reduction over a known small integer tensor (ReduceProd of a Shape is common in
// exported shape subgraphs).
void fold_value(InferContext& ctx, OpKind kind, const std::vector<ir::Dim>& in_shape,
                const std::vector<int>& axes, int64_t out_numel) {
  auto value = ctx.input_value(0);
  // A float's known elements are exact integers (elementwise.cc): its max and min are among them.
  const bool picks = kind == OpKind::kReduceMax || kind == OpKind::kReduceMin;
  if (!value ||
      !(is_integer(ctx.input_dtype(0)) || (picks && exact_integer_limit(ctx.input_dtype(0)) != 0)))
    return;
  int rank = int(in_shape.size());
  std::vector<int64_t> dims(rank);
  for (int d = 0; d < rank; ++d) {
    if (!in_shape[d].is_const()) return;
    dims[d] = in_shape[d].value();
  }
  auto numel = checked_numel(dims);
  if (!numel || *numel != int64_t(value->size())) return;
  std::vector<bool> reduced(rank, false);
  for (int a : axes) reduced[a] = true;
  std::vector<std::optional<ir::Dim>> acc(out_numel);
  std::vector<int64_t> count(out_numel, 0);
  std::vector<int64_t> idx(rank, 0);
  for (size_t e = 0; e < value->size(); ++e) {
    int64_t o = 0;
    for (int d = 0; d < rank; ++d) {
      if (!reduced[d]) o = o * dims[d] + idx[d];
    }
    acc[o] = acc[o] ? combine(kind, *acc[o], (*value)[e]) : (*value)[e];
    ++count[o];
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[d] < dims[d]) break;
      idx[d] = 0;
    }
  }
  std::vector<ir::Dim> out;
  for (int64_t o = 0; o < out_numel; ++o) {
    // Empty reductions have no integer identity for max/min; leave those to run time.
    if (!acc[o]) {
      if (kind == OpKind::kReduceSum) {
        out.push_back(0);
        continue;
      }
      if (kind == OpKind::kReduceProd) {
        out.push_back(1);
        continue;
      }
      return;
    }
    out.push_back(kind == OpKind::kReduceMean ? ir::Dim::floor_div(*acc[o], count[o]) : *acc[o]);
  }
  ctx.set_output_value(0, std::move(out));
}

template <OpKind kKind>
Status infer_reduce(InferContext& ctx) {
  DType dt = ctx.input_dtype(0);
  bool bool_ok = kKind == OpKind::kReduceMax || kKind == OpKind::kReduceMin;
  if (!is_float(dt) && !is_integer(dt) && !(bool_ok && dt == DType::kBool)) {
    return ctx.error(StatusCode::kInvalidModel,
                     "input 0 dtype " + std::string(dtype_name(dt)) + " is not numeric");
  }
  constexpr bool kLog = kKind == OpKind::kReduceLogSum || kKind == OpKind::kReduceLogSumExp;
  if (kLog && is_integer(dt) && ctx.opset() >= 28) {
    return ctx.error(StatusCode::kInvalidModel, "input 0 dtype " + std::string(dtype_name(dt)) +
                                                    ": " + ctx.node().op_type +
                                                    " takes floating-point tensors from opset 28");
  }
  const auto& x = ctx.input_shape(0);
  int rank = int(x.size());
  std::vector<int> axes;
  bool noop = false;
  KILN_RETURN_IF_ERROR(reduce_axes(ctx, rank, &axes, &noop));
  KILN_ASSIGN_OR_RETURN(int64_t keepdims, ctx.attrs().get_int("keepdims", 1));
  if (noop) {
    ctx.set_output(0, dt, x);
    if (auto v = ctx.input_value(0)) ctx.set_output_value(0, *v);
    return ok_status();
  }
  std::vector<ir::Dim> out;
  for (int d = 0; d < rank; ++d) {
    bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!reduced) {
      out.push_back(x[d]);
    } else if (keepdims != 0) {
      out.push_back(1);
    }
  }
  int64_t out_numel = 1;
  bool const_out = true;
  for (const auto& d : out) {
    if (!d.is_const()) {
      const_out = false;
      break;
    }
    auto m = checked_mul(out_numel, d.value());
    if (!m) {
      const_out = false;
      break;
    }
    out_numel = *m;
  }
  ctx.set_output(0, dt, out);
  bool foldable = kKind == OpKind::kReduceMean || kKind == OpKind::kReduceSum ||
                  kKind == OpKind::kReduceMax || kKind == OpKind::kReduceMin ||
                  kKind == OpKind::kReduceProd;
  if (foldable && const_out && out_numel <= kMaxSymbolicElements) {
    fold_value(ctx, kKind, x, axes, out_numel);
  }
  return ok_status();
}

// ArgMax/ArgMin: int64 indices along one axis, which keepdims keeps as 1.
Status infer_arg(InferContext& ctx) {
  DType dt = ctx.input_dtype(0);
  if (!is_float(dt) && !is_integer(dt)) {
    return ctx.error(StatusCode::kInvalidModel,
                     "input 0 dtype " + std::string(dtype_name(dt)) + " is not numeric");
  }
  const auto& x = ctx.input_shape(0);
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, ctx.attrs().get_int("axis", 0));
  KILN_ASSIGN_OR_RETURN(int64_t keepdims, ctx.attrs().get_int("keepdims", 1));
  KILN_ASSIGN_OR_RETURN(int64_t last, ctx.attrs().get_int("select_last_index", 0));
  if (last != 0 && last != 1) {
    return ctx.error(StatusCode::kInvalidModel, "attribute 'select_last_index' must be 0 or 1");
  }
  if (x.empty()) return ctx.error(StatusCode::kInvalidModel, "input 0 must have rank >= 1");
  KILN_ASSIGN_OR_RETURN(int axis, ctx.normalize_axis(axis_attr, int(x.size()), "attribute 'axis'"));
  KILN_RETURN_IF_ERROR(
      ctx.require_ge(x[axis], ir::Dim(1),
                     "input 0 dim " + std::to_string(axis) + " (the reduced axis) is not empty"));
  std::vector<ir::Dim> out;
  for (int d = 0; d < int(x.size()); ++d) {
    if (d != axis) {
      out.push_back(x[d]);
    } else if (keepdims != 0) {
      out.push_back(1);
    }
  }
  ctx.set_output(0, DType::kInt64, std::move(out));
  return ok_status();
}

// Hardmax keeps the shape. Before opset 13 the input is flattened to 2-D at `axis` (default 1),
// which agrees with the single-axis form only when axis is the last dim.
Status infer_hardmax(InferContext& ctx) {
  DType dt = ctx.input_dtype(0);
  if (!is_float(dt)) {
    return ctx.error(StatusCode::kInvalidModel,
                     "input 0 dtype " + std::string(dtype_name(dt)) + " is not a float type");
  }
  const auto& x = ctx.input_shape(0);
  int rank = int(x.size());
  bool single_axis = ctx.opset() <= 0 || ctx.opset() >= 13;
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, ctx.attrs().get_int("axis", single_axis ? -1 : 1));
  KILN_ASSIGN_OR_RETURN(int axis, ctx.normalize_axis(axis_attr, rank, "attribute 'axis'"));
  if (!single_axis && axis != rank - 1) {
    return ctx.error(StatusCode::kUnsupported,
                     "Hardmax before opset 13 with axis other than the last is not supported");
  }
  ctx.set_output(0, dt, x);
  return ok_status();
}

// TopK: K known at build time (a constant or a function of shapes) sizes the outputs; K from data
// makes the size a data-dependent dim bounded by the axis.
Status infer_topk(InferContext& ctx) {
  DType dt = ctx.input_dtype(0);
  if (!is_float(dt) && !is_integer(dt)) {
    return ctx.error(StatusCode::kInvalidModel,
                     "input 0 dtype " + std::string(dtype_name(dt)) + " is not numeric");
  }
  const auto& x = ctx.input_shape(0);
  int rank = int(x.size());
  if (rank == 0) return ctx.error(StatusCode::kInvalidModel, "input 0 must have rank >= 1");
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, ctx.attrs().get_int("axis", -1));
  KILN_ASSIGN_OR_RETURN(int axis, ctx.normalize_axis(axis_attr, rank, "attribute 'axis'"));
  ir::Dim k;
  if (ctx.opset() > 0 && ctx.opset() < 10) {
    KILN_ASSIGN_OR_RETURN(int64_t kattr, ctx.attrs().get_int("k", std::nullopt));
    k = ir::Dim(kattr);
  } else {
    if (!ctx.has_input(1)) return ctx.error(StatusCode::kInvalidModel, "input 1 (K) is required");
    if (!ctx.input_value(1)) {
      if (!is_integer(ctx.input_dtype(1)) || ctx.input_rank(1) > 1) {
        return ctx.error(StatusCode::kInvalidModel,
                         "input 1 (K) must be an int64 scalar or one-element tensor");
      }
      std::vector<ir::Dim> out = x;
      KILN_ASSIGN_OR_RETURN(out[axis], ctx.data_dependent_dim(0, axis, "topk", x[axis]));
      ctx.set_output(0, dt, out);
      ctx.set_output(1, DType::kInt64, out);
      return ok_status();
    }
    KILN_ASSIGN_OR_RETURN(std::vector<ir::Dim> kv, ctx.require_value(1, "K"));
    if (kv.size() != 1) {
      return ctx.error(StatusCode::kInvalidModel, "input 1 (K) must have exactly one element");
    }
    k = kv[0];
  }
  KILN_RETURN_IF_ERROR(ctx.require_ge(k, ir::Dim(0), "K >= 0"));
  KILN_RETURN_IF_ERROR(ctx.require_ge(x[axis], k, "input 0 dim " + std::to_string(axis) + " >= K"));
  std::vector<ir::Dim> out = x;
  out[axis] = k;
  ctx.set_output(0, dt, out);
  ctx.set_output(1, DType::kInt64, out);
  return ok_status();
}

}  // namespace

void register_reduce_ops(OpRegistry& r) {
  r.add(OpSchema{OpKind::kReduceMean, 1, 2, 1, 1, &infer_reduce<OpKind::kReduceMean>});
  r.add(OpSchema{OpKind::kReduceSum, 1, 2, 1, 1, &infer_reduce<OpKind::kReduceSum>});
  r.add(OpSchema{OpKind::kReduceMax, 1, 2, 1, 1, &infer_reduce<OpKind::kReduceMax>});
  r.add(OpSchema{OpKind::kReduceMin, 1, 2, 1, 1, &infer_reduce<OpKind::kReduceMin>});
  r.add(OpSchema{OpKind::kReduceProd, 1, 2, 1, 1, &infer_reduce<OpKind::kReduceProd>});
  r.add(OpSchema{OpKind::kReduceL1, 1, 2, 1, 1, &infer_reduce<OpKind::kReduceL1>});
  r.add(OpSchema{OpKind::kReduceL2, 1, 2, 1, 1, &infer_reduce<OpKind::kReduceL2>});
  r.add(OpSchema{OpKind::kReduceLogSum, 1, 2, 1, 1, &infer_reduce<OpKind::kReduceLogSum>});
  r.add(OpSchema{OpKind::kReduceLogSumExp, 1, 2, 1, 1, &infer_reduce<OpKind::kReduceLogSumExp>});
  r.add(OpSchema{OpKind::kReduceSumSquare, 1, 2, 1, 1, &infer_reduce<OpKind::kReduceSumSquare>});
  r.add(OpSchema{OpKind::kArgMax, 1, 1, 1, 1, &infer_arg});
  r.add(OpSchema{OpKind::kArgMin, 1, 1, 1, 1, &infer_arg});
  r.add(OpSchema{OpKind::kHardmax, 1, 1, 1, 1, &infer_hardmax});
  r.add(OpSchema{OpKind::kTopK, 1, 2, 2, 2, &infer_topk});
}

}  // namespace kiln::ops
