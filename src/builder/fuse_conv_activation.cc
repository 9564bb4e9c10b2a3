// Pass fuse_conv_activation: a Conv, the residual Add after it and the activation after that
// become one kiln::FusedConv (ops/kiln_ops.cc), whose kernels apply bias, residual and activation
// in the convolution's epilogue instead of a pass over memory each. Matched, each intermediate
// read by nothing else and no engine output:
//   Conv [-> Add(., Z)] [-> Relu | Clip(min, max constant) | HardSwish | HardSigmoid | LeakyRelu
//                          | Sigmoid | x * Sigmoid(x) (SiLU)]
// with at least one of the two after the Conv. Runs after fold_batch_norm (Conv + BatchNorm is a
// Conv by then) and before assign_precision (the fused op is a compute-bound one).
#include <cmath>
#include <optional>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

bool same_type(const ir::Value& a, const ir::Value& b) {
  return a.dtype == b.dtype && a.shape && b.shape && *a.shape == *b.shape;
}

struct Activation {
  std::string name = "none";
  std::vector<float> params;
  std::vector<int> nodes;  // the nodes it replaces
  int output = -1;
};

// The activation applied to `v` by the nodes reading it, if they form one.
std::optional<Activation> activation_of(const ir::Graph& g, int v) {
  if (is_graph_output(g, v)) return std::nullopt;
  std::vector<int> r = readers_of(g, v);
  Activation a;
  if (r.size() == 2) {  // SiLU: Mul(v, Sigmoid(v)), in either order
    for (int k = 0; k < 2; ++k) {
      const ir::Node& sig = g.nodes[size_t(r[k])];
      const ir::Node& mul = g.nodes[size_t(r[1 - k])];
      if (!is_onnx(sig, "Sigmoid") || !is_onnx(mul, "Mul") || sig.outputs.size() != 1) continue;
      int s = sig.outputs[0];
      if (sole_reader(g, s) != r[1 - k] || mul.inputs.size() != 2) continue;
      if (!((mul.inputs[0] == v && mul.inputs[1] == s) || (mul.inputs[0] == s && mul.inputs[1] == v))) continue;
      a.name = "silu";
      a.nodes = {r[k], r[1 - k]};
      a.output = mul.outputs[0];
      return a;
    }
    return std::nullopt;
  }
  if (r.size() != 1) return std::nullopt;
  const ir::Node& n = g.nodes[size_t(r[0])];
  if (!n.domain.empty() || n.outputs.size() != 1 || n.inputs.empty() || n.inputs[0] != v) return std::nullopt;
  a.nodes = {r[0]};
  a.output = n.outputs[0];
  auto f = [&](const char* name, float fallback) {
    auto x = n.attrs.get_float(name, fallback);
    return x.ok() ? *x : fallback;
  };
  if (n.op_type == "Relu") {
    a.name = "relu";
  } else if (n.op_type == "HardSwish") {
    a.name = "hardswish";
  } else if (n.op_type == "Sigmoid") {
    a.name = "sigmoid";
  } else if (n.op_type == "HardSigmoid") {
    a.name = "hardsigmoid";
    a.params = {f("alpha", 0.2f), f("beta", 0.5f)};
  } else if (n.op_type == "LeakyRelu") {
    a.name = "leaky_relu";
    a.params = {f("alpha", 0.01f)};
  } else if (n.op_type == "Clip" && n.opset >= 11) {
    auto lo = n.inputs.size() > 1 && n.inputs[1] >= 0 ? scalar_constant(g, n, 1) : std::optional<float>(-INFINITY);
    auto hi = n.inputs.size() > 2 && n.inputs[2] >= 0 ? scalar_constant(g, n, 2) : std::optional<float>(INFINITY);
    if (!lo || !hi) return std::nullopt;
    a.name = "clip";
    a.params = {*lo, *hi};
  } else {
    return std::nullopt;
  }
  return a;
}

StatusOr<bool> fuse_at(ir::Graph* g, int conv_index, const SupportsFn& supports) {
  const ir::Node& conv = g->nodes[size_t(conv_index)];
  if (!is_onnx(conv, "Conv") || conv.outputs.size() != 1 || conv.outputs[0] < 0) return false;
  const int c = conv.outputs[0];
  std::vector<int> matched = {conv_index};
  int z = -1, cur = c;
  int add = sole_reader(*g, c);
  if (add >= 0 && is_onnx(g->nodes[size_t(add)], "Add") && g->nodes[size_t(add)].inputs.size() == 2) {
    const ir::Node& a = g->nodes[size_t(add)];
    int other = a.inputs[0] == c ? a.inputs[1] : a.inputs[0];
    int out = a.outputs.empty() ? -1 : a.outputs[0];
    // The residual has the convolution's type and shape exactly (no broadcast), and is computed
    // without the convolution (a Z that depends on C would make a cycle).
    if (other >= 0 && other != c && out >= 0 && same_type(g->values[size_t(other)], g->values[size_t(c)]) &&
        same_type(g->values[size_t(out)], g->values[size_t(c)])) {
      z = other;
      cur = out;
      matched.push_back(add);
    }
  }
  std::optional<Activation> act = activation_of(*g, cur);
  if (!act && z < 0) return false;
  ir::Node fused = conv;
  fused.replaced.clear();  // replace_nodes counts the Conv among the matched nodes
  fused.domain = "kiln";
  fused.op_type = "FusedConv";
  fused.opset = 1;
  fused.inputs.resize(3, -1);
  fused.inputs.push_back(z);
  if (z < 0) fused.inputs.pop_back();
  set_string(&fused, "activation", act ? act->name : "none");
  if (act && !act->params.empty()) set_floats(&fused, "activation_params", act->params);
  if (act) matched.insert(matched.end(), act->nodes.begin(), act->nodes.end());
  fused.outputs = {act ? act->output : cur};
  // Unfused where the backend has no kernel, or where the residual depends on the convolution.
  return replace_if_supported(g, matched, std::move(fused), supports);
}

}  // namespace

Status fuse_conv_activation(ir::Graph* g, const SupportsFn& supports) {
  for (size_t n = 0; n < g->nodes.size();) {
    KILN_ASSIGN_OR_RETURN(bool fused, fuse_at(g, int(n), supports));
    if (!fused) ++n;
  }
  return ok_status();
}

Status fuse_conv_activation(BuildState& s) { return fuse_conv_activation(&s.graph, backend_supports(s)); }

}  // namespace kiln::builder
