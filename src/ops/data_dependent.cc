// Schemas of ops whose output sizes only their input data decides: NonZero, Compress, Unique and
// NonMaxSuppression. Each such size is a data-dependent dim (InferContext::data_dependent_dim): a
// symbol bounded by a formula over the input shapes, which the runtime binds once the node has
// run. Everything downstream is ordinary symbolic inference over it.
#include <algorithm>
#include <string>

#include "ops/schema.h"

namespace kiln::ops {
namespace {

using ir::Dim;
using Dims = std::vector<Dim>;

Status attr_error(const InferContext& ctx, const Status& s) {
  return ctx.error(s.code(), s.message());
}

Dim numel(const Dims& shape) {
  Dim n = 1;
  for (const Dim& d : shape) n = n * d;
  return n;
}

// NonZero(X) -> int64 [rank, n]: the indices of the nonzero elements, one column each. A scalar
// is read as a one-element vector (numpy and ONNX Runtime do the same).
Status infer_nonzero(InferContext& ctx) {
  const Dims& x = ctx.input_shape(0);
  KILN_ASSIGN_OR_RETURN(Dim n, ctx.data_dependent_dim(0, 1, "nonzero", numel(x)));
  ctx.set_output(0, DType::kInt64, {Dim(std::max<int64_t>(int64_t(x.size()), 1)), n});
  return ok_status();
}

// Compress(input, condition[, axis]) -> the slices (or, without axis, the elements of the
// flattened input) where the 1-D bool condition is true. A condition shorter than the axis selects
// among its first entries.
Status infer_compress(InferContext& ctx) {
  const Dims& x = ctx.input_shape(0);
  const Dims& cond = ctx.input_shape(1);
  if (ctx.input_dtype(1) != DType::kBool) {
    return ctx.error(StatusCode::kInvalidModel, "input 1 (condition) must be bool, not " +
                                                    std::string(dtype_name(ctx.input_dtype(1))));
  }
  if (cond.size() != 1) {
    return ctx.error(StatusCode::kInvalidModel,
                     "input 1 (condition) must have rank 1, not " + std::to_string(cond.size()));
  }
  if (!ctx.attrs().has("axis")) {
    KILN_ASSIGN_OR_RETURN(Dim c,
                          ctx.data_dependent_dim(0, 0, "compressed", Dim::min(cond[0], numel(x))));
    ctx.set_output(0, ctx.input_dtype(0), {c});
    return ok_status();
  }
  auto axis_attr = ctx.attrs().get_int("axis", 0);
  if (!axis_attr.ok()) return attr_error(ctx, axis_attr.status());
  if (x.empty()) return ctx.error(StatusCode::kInvalidModel, "axis given for a scalar input");
  KILN_ASSIGN_OR_RETURN(int axis, ctx.normalize_axis(*axis_attr, int(x.size()), "axis"));
  Dims out = x;
  KILN_ASSIGN_OR_RETURN(out[axis],
                        ctx.data_dependent_dim(0, axis, "compressed", Dim::min(cond[0], x[axis])));
  ctx.set_output(0, ctx.input_dtype(0), out);
  return ok_status();
}

// Unique(X) -> Y (the unique elements, or slices along axis), indices (first occurrence of each),
// inverse_indices (for each element or slice of X, its entry in Y) and counts.
Status infer_unique(InferContext& ctx) {
  const Dims& x = ctx.input_shape(0);
  auto sorted = ctx.attrs().get_int("sorted", 1);
  if (!sorted.ok()) return attr_error(ctx, sorted.status());
  if (*sorted != 0 && *sorted != 1) {
    return ctx.error(StatusCode::kInvalidModel,
                     "attribute sorted must be 0 or 1, not " + std::to_string(*sorted));
  }
  Dims y;
  Dim rows, u;
  if (ctx.attrs().has("axis")) {
    auto axis_attr = ctx.attrs().get_int("axis", 0);
    if (!axis_attr.ok()) return attr_error(ctx, axis_attr.status());
    if (x.empty()) return ctx.error(StatusCode::kInvalidModel, "axis given for a scalar input");
    KILN_ASSIGN_OR_RETURN(int axis, ctx.normalize_axis(*axis_attr, int(x.size()), "axis"));
    rows = x[axis];
    KILN_ASSIGN_OR_RETURN(u, ctx.data_dependent_dim(0, axis, "unique", rows));
    y = x;
    y[axis] = u;
  } else {
    rows = numel(x);
    KILN_ASSIGN_OR_RETURN(u, ctx.data_dependent_dim(0, 0, "unique", rows));
    y = {u};
  }
  ctx.set_output(0, ctx.input_dtype(0), y);
  ctx.set_output(1, DType::kInt64, {u});
  ctx.set_output(2, DType::kInt64, {rows});
  ctx.set_output(3, DType::kInt64, {u});
  return ok_status();
}

// NonMaxSuppression(boxes [B, N, 4], scores [B, C, N][, max_output_boxes_per_class,
// iou_threshold, score_threshold]) -> int64 [S, 3] rows (batch, class, box). S is at most
// B * C * min(N, max_output_boxes_per_class) when that is known at build time, else B * C * N.
Status infer_nms(InferContext& ctx) {
  const Dims& boxes = ctx.input_shape(0);
  const Dims& scores = ctx.input_shape(1);
  if (boxes.size() != 3 || scores.size() != 3) {
    return ctx.error(StatusCode::kInvalidModel,
                     "boxes must be [batches, boxes, 4] and scores [batches, classes, "
                     "boxes]; got ranks " +
                         std::to_string(boxes.size()) + " and " + std::to_string(scores.size()));
  }
  if (ctx.input_dtype(0) != DType::kFloat32 || ctx.input_dtype(1) != DType::kFloat32) {
    return ctx.error(StatusCode::kInvalidModel, "boxes and scores must be float32");
  }
  KILN_RETURN_IF_ERROR(ctx.require_equal(boxes[2], Dim(4), "boxes dim 2 is 4 (one box's corners)"));
  KILN_RETURN_IF_ERROR(
      ctx.require_equal(boxes[0], scores[0], "boxes and scores have one batch size"));
  KILN_RETURN_IF_ERROR(ctx.require_equal(boxes[1], scores[2], "scores dim 2 counts the boxes"));
  auto center = ctx.attrs().get_int("center_point_box", 0);
  if (!center.ok()) return attr_error(ctx, center.status());
  if (*center != 0 && *center != 1) {
    return ctx.error(StatusCode::kInvalidModel,
                     "attribute center_point_box must be 0 or 1, not " + std::to_string(*center));
  }
  for (int i = 2; i < 5; ++i) {
    if (!ctx.has_input(i)) continue;
    const DType want = i == 2 ? DType::kInt64 : DType::kFloat32;
    if (ctx.input_dtype(i) != want || ctx.input_rank(i) > 1) {
      return ctx.error(StatusCode::kInvalidModel, "input " + std::to_string(i) + " must be a " +
                                                      std::string(dtype_name(want)) + " scalar");
    }
  }
  Dim per_class = boxes[1];
  if (ctx.has_input(2)) {
    auto k = ctx.input_value(2);
    if (k && k->size() == 1 && (*k)[0].is_const())
      per_class = Dim::min(boxes[1], Dim(std::max<int64_t>((*k)[0].value(), 0)));
  } else {
    per_class = 0;  // the default keeps no box
  }
  KILN_ASSIGN_OR_RETURN(
      Dim s, ctx.data_dependent_dim(0, 0, "nms_selected", scores[0] * scores[1] * per_class));
  ctx.set_output(0, DType::kInt64, {s, Dim(3)});
  return ok_status();
}

// If reaches inference only when its condition is data: the builder runs an If whose condition it
// knows (a constant, or a function of shapes) as the branch it takes (infer_shapes inlines it).
Status infer_if(InferContext& ctx) {
  return ctx.error(
      StatusCode::kUnsupported,
      "its condition ('" + ctx.input(0).name +
          "') is computed from tensor data at run time; kiln runs an If only where its condition "
          "is known at build time (a constant or a function of input shapes), as the branch it "
          "takes");
}

// Loop and Scan are unrolled by the builder (builder/control_flow.cc), which names what it cannot
// lay out; a node reaching inference is one no build expanded.
Status infer_unrolled(InferContext& ctx) {
  return ctx.error(
      StatusCode::kUnsupported,
      "kiln runs a Loop or Scan by unrolling it at build time, and this one was not unrolled");
}

// Sequence and optional ops are laid out by the builder (builder/sequences.cc): a sequence is a
// list of tensor values known at build time, an optional a value or none. A node reaching inference
// is one the build did not lay out.
Status infer_sequence_op(InferContext& ctx) {
  return ctx.error(
      StatusCode::kUnsupported,
      "kiln lays sequences and optionals out at build time, and this node was not laid out");
}

}  // namespace

void register_data_dependent_ops(OpRegistry& r) {
  r.add(OpSchema{OpKind::kSequenceEmpty, 0, 0, 1, 1, &infer_sequence_op});
  r.add(OpSchema{OpKind::kSequenceConstruct, 1, 1 << 20, 1, 1, &infer_sequence_op,
                 OpTraits{.inputs_required = true}});
  r.add(OpSchema{OpKind::kSequenceInsert, 2, 3, 1, 1, &infer_sequence_op});
  r.add(OpSchema{OpKind::kSequenceErase, 1, 2, 1, 1, &infer_sequence_op});
  r.add(OpSchema{OpKind::kSequenceAt, 2, 2, 1, 1, &infer_sequence_op});
  r.add(OpSchema{OpKind::kSequenceLength, 1, 1, 1, 1, &infer_sequence_op});
  r.add(OpSchema{OpKind::kSplitToSequence, 1, 2, 1, 1, &infer_sequence_op});
  r.add(OpSchema{OpKind::kConcatFromSequence, 1, 1, 1, 1, &infer_sequence_op});
  r.add(OpSchema{OpKind::kSequenceMap, 1, 1 << 20, 1, 1 << 20, &infer_sequence_op,
                 OpTraits{.inputs_required = true}});
  r.add(OpSchema{OpKind::kOptional, 0, 1, 1, 1, &infer_sequence_op});
  r.add(OpSchema{OpKind::kOptionalHasElement, 0, 1, 1, 1, &infer_sequence_op});
  r.add(OpSchema{OpKind::kOptionalGetElement, 1, 1, 1, 1, &infer_sequence_op});
  r.add(OpSchema{OpKind::kIf, 1, 1, 1, 1 << 20, &infer_if});
  r.add(OpSchema{OpKind::kLoop, 0, 1 << 20, 1, 1 << 20,
                 &infer_unrolled});  // M and cond may be omitted
  r.add(OpSchema{OpKind::kScan, 0, 1 << 20, 1, 1 << 20,
                 &infer_unrolled});  // opset 8 may omit input 0
  r.add(OpSchema{OpKind::kNonZero, 1, 1, 1, 1, &infer_nonzero});
  r.add(OpSchema{OpKind::kCompress, 2, 2, 1, 1, &infer_compress});
  r.add(OpSchema{OpKind::kUnique, 1, 1, 1, 4, &infer_unique});
  r.add(OpSchema{OpKind::kNonMaxSuppression, 2, 5, 1, 1, &infer_nms});
}

}  // namespace kiln::ops
