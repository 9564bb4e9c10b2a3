// Pass fuse_matmul_bias: a MatMul, the bias Add after it and the activation after that become
// one kiln::MatMulBias (ops/kiln_ops.cc), whose CUDA kernel applies bias and activation in one
// pass after the GEMM, the sum and the activation in float, instead of a pass per op. Matched,
// each intermediate read by nothing else and no engine output:
//   MatMul [-> Add(., bias) | Add(bias, .)] -> Relu | Gelu (erf or tanh)
//   MatMul [-> Add(., bias)] -> Add(., residual) | Add(residual, .)
// GELU written out op by op, in whichever order an exporter writes it, is one Gelu by then
// (canonicalize). A residual is a computed tensor of the product's shape (a transformer's skip
// connection; cuBLASLt adds it as its C in the GEMM's pass), a bias anything else that broadcasts
// to it. A residual is taken only by a linear layer (a constant B): a product of two computed
// tensors keeps its Add. The bias must leave the product's shape as it is (it broadcasts from
// the right). A MatMul and a constant bias without an activation become a MatMulBias only where
// no elementwise op reads the sum: otherwise the elementwise pass fuses the Add with what follows
// it (a residual), which a MatMulBias would split. Runs after fuse_attention (which takes the
// score products and their masks first) and before assign_precision (the fused op is a
// compute-bound one).
#include <optional>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

struct Activation {
  const char* name;
  std::vector<int> nodes;
  int output;
};

std::optional<Activation> activation_of(const ir::Graph& g, int v) {
  const int n = sole_reader(g, v);
  if (n < 0) return std::nullopt;
  const ir::Node& node = g.nodes[size_t(n)];
  if (node.inputs.empty() || node.inputs[0] != v || node.outputs.size() != 1) return std::nullopt;
  if (is_onnx(node, "Relu")) return Activation{"relu", {n}, node.outputs[0]};
  if (is_onnx(node, "Gelu")) {
    auto approx = node.attrs.get_string("approximate", "none");
    if (!approx.ok()) return std::nullopt;
    if (*approx == "none") return Activation{"gelu_erf", {n}, node.outputs[0]};
    if (*approx == "tanh") return Activation{"gelu_tanh", {n}, node.outputs[0]};
  }
  return std::nullopt;
}

StatusOr<bool> fuse_at(ir::Graph* g, int mm, const SupportsFn& supports) {
  const ir::Node& matmul = g->nodes[size_t(mm)];
  if (!is_onnx(matmul, "MatMul") || matmul.inputs.size() != 2 || matmul.outputs.size() != 1) return false;
  const int y = matmul.outputs[0];
  const ir::Value& yv = g->values[size_t(y)];
  if (!yv.shape || !is_float(yv.dtype)) return false;
  std::vector<int> matched = {mm};
  // The Add reading `v` alone, its other operand and its output, when the sum keeps v's shape and
  // dtype; {-1, -1, -1} otherwise.
  struct Sum {
    int node = -1, other = -1, out = -1;
  };
  auto sum_of = [&](int v) {
    const int add = sole_reader(*g, v);
    if (add < 0 || !is_onnx(g->nodes[size_t(add)], "Add") || g->nodes[size_t(add)].inputs.size() != 2) return Sum{};
    const ir::Node& a = g->nodes[size_t(add)];
    const int other = a.inputs[0] == v ? a.inputs[1] : a.inputs[0];
    const int out = a.outputs.empty() ? -1 : a.outputs[0];
    if (other < 0 || other == v || out < 0) return Sum{};
    const ir::Value &ov = g->values[size_t(out)], &bv = g->values[size_t(other)];
    if (ov.dtype != yv.dtype || bv.dtype != yv.dtype || !ov.shape || *ov.shape != *yv.shape || !bv.shape ||
        bv.shape->size() > yv.shape->size()) {
      return Sum{};
    }
    return Sum{add, other, out};
  };
  // A residual: a computed operand of the product's own shape (a skip connection), not a bias.
  auto is_residual = [&](int v) {
    const ir::Value& r = g->values[size_t(v)];
    return !r.constant && r.shape && *r.shape == *yv.shape;
  };
  int bias = -1, residual = -1, cur = y;
  Sum first = sum_of(y);
  if (first.node >= 0 && !is_residual(first.other)) {
    bias = first.other;
    cur = first.out;
    matched.push_back(first.node);
  }
  std::optional<Activation> act = activation_of(*g, cur);
  if (!act) {
    // (bias +) residual, as linear layers before a skip connection have it: cuBLASLt adds the
    // residual as its C in the GEMM's own pass.
    const Sum r = bias >= 0 ? sum_of(cur) : first;
    if (r.node >= 0 && is_residual(r.other) && g->values[size_t(matmul.inputs[1])].constant) {
      residual = r.other;
      cur = r.out;
      matched.push_back(r.node);
      act = Activation{"none", {}, cur};
    }
  }
  if (!act) {
    // A constant bias alone (a linear layer's, not attention's mask): fused where no elementwise
    // op reads the sum (the elementwise pass would take the Add with that op; here it would run
    // alone), e.g. attention's Q, K and V projections.
    if (bias < 0 || !g->values[size_t(bias)].constant) return false;
    for (int r : readers_of(*g, cur)) {
      if (ops::traits(g->nodes[size_t(r)]).elementwise) return false;
    }
    act = Activation{"none", {}, cur};
  }
  // An activation with no bias (the dynamo exporter drops a zero bias; models without one): a
  // zero bias of Y's last dim, so the kernel runs the activation in cuBLASLt's bias epilogue
  // (the one its tactics are timed with) and not in a pass over Y after the GEMM: GPT-2's
  // [8192, 3072] MLP GEMM at batch 32, 98 us with the pass against 72 us in the epilogue (H200).
  if (bias < 0 && residual < 0 && act->nodes.size() == 1) {
    const ir::Value& b = g->values[size_t(matmul.inputs[1])];
    if (b.constant && b.constant->rank() >= 1 && !yv.shape->empty() && yv.shape->back().is_const() &&
        b.constant->shape().back() == yv.shape->back().value() && is_float(yv.dtype)) {
      KILN_ASSIGN_OR_RETURN(Tensor zeros, Tensor::zeros(yv.dtype, {b.constant->shape().back()}));
      bias = add_constant(g, g->values[size_t(y)].name + "_zero_bias", std::move(zeros));
    }
  }
  ir::Node fused = matmul;
  fused.replaced.clear();  // replace_nodes counts the MatMul among the matched nodes
  fused.domain = "kiln";
  fused.op_type = "MatMulBias";
  fused.opset = 1;
  fused.attrs = ir::Attributes{};
  set_string(&fused, "activation", act->name);
  if (bias >= 0 || residual >= 0) fused.inputs.push_back(bias);  // -1: no bias
  if (residual >= 0) fused.inputs.push_back(residual);
  fused.outputs = {act->output};
  matched.insert(matched.end(), act->nodes.begin(), act->nodes.end());
  // Unfused where the backend has no kernel, or where the bias depends on the product.
  return replace_if_supported(g, matched, std::move(fused), supports);
}

}  // namespace

Status fuse_matmul_bias(ir::Graph* g, const SupportsFn& supports) {
  for (size_t n = 0; n < g->nodes.size();) {
    KILN_ASSIGN_OR_RETURN(bool fused, fuse_at(g, int(n), supports));
    if (!fused) ++n;
  }
  return ok_status();
}

// CUDA only (pipeline.cc): the CPU runs the same reference kernels either way.
Status fuse_matmul_bias(BuildState& s) {
  return fuse_matmul_bias(&s.graph, backend_supports(s));
}

}  // namespace kiln::builder
