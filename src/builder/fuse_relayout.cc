// Pass fuse_relayout: the conversions in front of a channels-last convolution stack become one
// kiln::Relayout (ops/kiln_ops.cc), a single pass over memory. assign_precision casts a float32
// image input to the engine's float16 (Cast), assign_layout moves it channels last (Transpose)
// and pads its 3 channels to 4 or 8 (Pad): three kernels, 85 us of MobileNetV3-L's 1.23 ms at
// batch 64 on an H200. Three rules on the rewriter (rewriter.h), applied to a fixed point:
//
//   Transpose(Cast(x))            -> Relayout(x) {perm, to}
//   Pad(Transpose(x), pads[, 0])  -> Relayout(x) {perm, to = x's dtype, pad_last}
//   Pad(Relayout(x), pads[, 0])   -> Relayout(x) {..., pad_last grown}
//
// where the Pad is constant mode, its value absent or 0, and its pads constant and zero but after
// the last axis's end (what assign_layout writes). The Cast and the Transpose are read only by the
// next node of the chain (the rewriter's single-use rule); x of any dtype. Each rewrite asks the
// backend: CUDA's kernel takes NCHW -> NHWC of at most 32 channels out between float32, float16 and
// bfloat16, so other chains keep their nodes. CUDA only: the CPU casts nothing and pads no
// channels (assign_layout's CPU options), and its Transpose is the faster kernel there.
#include <cstdint>
#include <string>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "builder/rewriter.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

using rw::any;
using rw::constant;
using rw::Context;
using rw::Match;
using rw::op;
using rw::Pat;

// The zero elements the Pad node n appends to its last axis, or -1 where it does anything else
// (another mode, another axis, a nonzero value, pads that are not constant, cropping, axes).
int64_t pad_after_last(const Context& ctx, int n) {
  const ir::Node& pad = ctx.node(n);
  auto mode = pad.attrs.get_string("mode", "constant");
  if (!mode.ok() || *mode != "constant" || pad.inputs.size() < 2 || pad.inputs.size() > 3 ||
      pad.outputs.size() != 1) {
    return -1;
  }
  if (pad.inputs.size() == 3 && pad.inputs[2] >= 0) {
    auto value = ctx.scalar(pad.inputs[2]);
    if (!value || *value != 0.0) return -1;
  }
  const auto* shape = ctx.shape(pad.inputs[0]);
  const ir::Value& pads = ctx.value(pad.inputs[1]);
  if (!shape || shape->empty() || !pads.constant || pads.constant->dtype() != DType::kInt64 ||
      pads.constant->numel() != int64_t(2 * shape->size())) {
    return -1;
  }
  const auto* p = pads.constant->data_as<int64_t>();
  const int64_t k = pads.constant->numel();
  for (int64_t i = 0; i + 1 < k; ++i) {
    if (p[i] != 0) return -1;
  }
  return p[k - 1] >= 0 ? p[k - 1] : -1;
}

bool pads_last(const Context& ctx, const Match&, int n) { return pad_after_last(ctx, n) >= 0; }

// A Pad of `inner` with its pads (and, with a value, `inputs` 3) as inputs.
Pat pad_of(const Pat& inner, int inputs) {
  std::vector<Pat> in = {inner, constant()};
  if (inputs == 3) in.push_back(any());
  return op("Pad", std::move(in)).when(pads_last);
}

// Transpose's perm: its attribute, or the reversed axes of the input's rank.
std::vector<int64_t> perm_of(const Context& ctx, const ir::Node& t) {
  const auto* shape = ctx.shape(t.inputs[0]);
  std::vector<int64_t> def;
  for (int64_t d = shape ? int64_t(shape->size()) - 1 : -1; d >= 0; --d) def.push_back(d);
  auto perm = t.attrs.get_ints("perm", def);
  return perm.ok() ? *perm : std::vector<int64_t>{};
}

ir::Node relayout(const ir::Node& root, int x, std::vector<int64_t> perm, DType to, int64_t pad) {
  ir::Node fused = root;
  fused.replaced.clear();  // replace_nodes counts the root among the matched nodes
  fused.domain = "kiln";
  fused.op_type = "Relayout";
  fused.opset = 1;
  fused.attrs = ir::Attributes{};
  set_ints(&fused, "perm", std::move(perm));
  set_int(&fused, "to", int64_t(to));  // DType's codes are ONNX's
  if (pad > 0) set_int(&fused, "pad_last", pad);
  fused.inputs = {x};
  return fused;
}

StatusOr<bool> cast_transpose(Context& ctx, const Match& m) {
  const ir::Node& t = ctx.node(m.matched[0]);
  if (t.outputs.size() != 1 || t.outputs[0] < 0) return false;
  std::vector<int64_t> perm = perm_of(ctx, t);
  if (perm.empty()) return false;
  const DType to = ctx.value(t.outputs[0]).dtype;
  return rw::replace(ctx, m, relayout(t, m.value("x"), std::move(perm), to, 0));
}

StatusOr<bool> transpose_pad(Context& ctx, const Match& m) {
  const ir::Node& pad = ctx.node(m.matched[0]);
  const ir::Node& t = ctx.node(m.node("t"));
  std::vector<int64_t> perm = perm_of(ctx, t);
  if (perm.empty()) return false;
  const int x = m.value("x");
  return rw::replace(
      ctx, m,
      relayout(pad, x, std::move(perm), ctx.value(x).dtype, pad_after_last(ctx, m.matched[0])));
}

StatusOr<bool> relayout_pad(Context& ctx, const Match& m) {
  const ir::Node& pad = ctx.node(m.matched[0]);
  const ir::Node& r = ctx.node(m.node("r"));
  auto perm = r.attrs.get_ints("perm", std::nullopt);
  auto to = r.attrs.get_int("to", std::nullopt);
  auto had = r.attrs.get_int("pad_last", 0);
  if (!perm.ok() || !to.ok() || !had.ok()) return false;
  return rw::replace(ctx, m,
                     relayout(pad, m.value("x"), std::move(*perm), DType(*to),
                              *had + pad_after_last(ctx, m.matched[0])));
}

std::vector<rw::Rule> make_rules() {
  const Pat cast = op("Cast", {any("x")}).as("cast");
  const Pat transpose = op("Transpose", {any("x")}).as("t");
  const Pat moved = op("kiln::Relayout", {any("x")}).as("r");
  return {{"cast_transpose", op("Transpose", {cast}), cast_transpose},
          {"transpose_pad", pad_of(transpose, 2), transpose_pad},
          {"transpose_pad_value", pad_of(transpose, 3), transpose_pad},
          {"relayout_pad", pad_of(moved, 2), relayout_pad},
          {"relayout_pad_value", pad_of(moved, 3), relayout_pad}};
}

}  // namespace

Status fuse_relayout(ir::Graph* g, const SupportsFn& supports) {
  static const std::vector<rw::Rule> rules = make_rules();
  return rw::apply(g, rules, supports).status();
}

Status fuse_relayout(BuildState& s) { return fuse_relayout(&s.graph, backend_supports(s)); }

}  // namespace kiln::builder
