// Pass fuse_bias_softmax: Softmax over the last axis of Add(x, m), where m broadcasts to x without
// growing it, becomes one kiln::BiasSoftmax(x, m) (ops/kiln_ops.cc; ONNX Runtime's
// com.microsoft BiasSoftmax): the mask of an attention written out op by op ([N, 1, 1, T]
// padding, [1, 1, S, T] causal, [T]) is read in the softmax's own pass instead of an Add writing
// the whole scores tensor first. One rule on the rewriter (rewriter.h):
//
//   Softmax(Add(a, b)) {axis = -1, or rank - 1}    x: the operand of the sum's shape (a where
//                                                  both are), m: the other
//
// The Add's only reader is the Softmax and it is no engine output (the rewriter's single-use
// rule): a sum read elsewhere stays, and so does its Softmax. x, m and the sum of one float
// type; m of rank at most x's, each dim 1 or x's (a mask that would grow x keeps its Add). A
// scale on x (Softmax(Add(Mul(x, c), m))) is not taken: the CPU kernel gives the unfused graph's
// bits, and a Div by c is no multiply by 1/c. Runs after fuse_attention, which takes whole
// attentions with their masks first, and before fuse_matmul_bias, whose constant-bias rule would
// otherwise move a constant causal mask into the scores' GEMM (an extra pass over the scores on
// CUDA). On every device: on the CPU the fused kernel computes the Add's and the Softmax's bits.
#include <string>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "builder/rewriter.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

using rw::any;
using rw::Context;
using rw::Match;
using rw::op;
using rw::Pat;

// The Softmax node n normalizes over the last axis (opset 13's meaning, or an older opset's with
// axis = rank - 1, where flattening changes nothing).
bool over_last_axis(const Context& ctx, const Match&, int n) {
  const ir::Node& node = ctx.node(n);
  const auto* s = ctx.shape(node.inputs[0]);
  if (!s || s->empty() || node.outputs.size() != 1) return false;
  auto axis = node.attrs.get_int("axis", node.opset > 0 && node.opset < 13 ? 1 : -1);
  return axis.ok() && (*axis == -1 || *axis == int64_t(s->size()) - 1);
}

// Whether m broadcasts to the shape x without growing it: m's rank at most x's, each of its dims
// 1 or x's (aligned from the right).
bool broadcasts_into(const std::vector<ir::Dim>& m, const std::vector<ir::Dim>& x) {
  if (m.size() > x.size()) return false;
  for (size_t d = 0; d < m.size(); ++d) {
    const ir::Dim& md = m[d];
    if (!(md.is_const() && md.value() == 1) && md != x[x.size() - m.size() + d]) return false;
  }
  return true;
}

StatusOr<bool> fuse(Context& ctx, const Match& m) {
  const ir::Node& softmax = ctx.node(m.matched[0]);
  const int a = m.value("a"), b = m.value("b");
  const int sum = ctx.node(m.node("add")).outputs[0];
  const ir::Value &av = ctx.value(a), &bv = ctx.value(b), &sv = ctx.value(sum);
  const ir::Value& yv = ctx.value(softmax.outputs[0]);
  if (!is_float(sv.dtype) || av.dtype != sv.dtype || bv.dtype != sv.dtype || yv.dtype != sv.dtype ||
      !av.shape || !bv.shape || !sv.shape) {
    return false;
  }
  int x = a, mask = b;
  if (*av.shape != *sv.shape || !broadcasts_into(*bv.shape, *sv.shape)) {
    // The other order: the sum has b's shape and a broadcasts into it.
    if (*bv.shape != *sv.shape || !broadcasts_into(*av.shape, *sv.shape)) return false;
    x = b, mask = a;
  }
  ir::Node fused = softmax;
  fused.replaced.clear();  // replace_nodes counts the Softmax among the matched nodes
  fused.domain = "kiln";
  fused.op_type = "BiasSoftmax";
  fused.opset = 1;
  fused.attrs = ir::Attributes{};
  set_int(&fused, "axis", -1);
  fused.inputs = {x, mask};
  // Unfused where the backend has no kernel.
  return rw::replace(ctx, m, std::move(fused));
}

std::vector<rw::Rule> make_rules() {
  const Pat sum = op("Add", {any("a"), any("b")}).as("add");
  return {{"bias_softmax", op("Softmax", {sum}).when(over_last_axis), fuse}};
}

}  // namespace

Status fuse_bias_softmax(ir::Graph* g, const SupportsFn& supports) {
  static const std::vector<rw::Rule> rules = make_rules();
  return rw::apply(g, rules, supports).status();
}

Status fuse_bias_softmax(BuildState& s) { return fuse_bias_softmax(&s.graph, backend_supports(s)); }

}  // namespace kiln::builder
