// Pass fuse_matmul_bias: a MatMul, the bias Add after it and the activation after that become
// one kiln::MatMulBias (ops/kiln_ops.cc), whose CUDA kernel applies bias and activation in one
// pass after the GEMM, the sum and the activation in float, instead of a pass per op (erf GELU
// as exporters write it is five). Matched, each intermediate read by nothing else and no engine
// output:
//   MatMul [-> Add(., bias) | Add(bias, .)] -> Relu | Gelu | x * 0.5 * (1 + Erf(x / sqrt(2)))
//   MatMul [-> Add(., bias)] -> Add(., residual) | Add(residual, .)
// where a residual is a computed tensor of the product's shape (a transformer's skip connection;
// cuBLASLt adds it as its C in the GEMM's pass), a bias anything else that broadcasts to it. A
// residual is taken only by a linear layer (a constant B): attention's score product keeps its
// mask Add for fuse_attention.
// in the orders the TorchScript exporter and transformers write the last (Div by sqrt(2) or Mul
// by 1/sqrt(2); the halving before or after the product). The bias must leave the product's
// shape as it is (it broadcasts from the right). A MatMul and a constant bias without an
// activation become a MatMulBias only where no elementwise op reads the sum: otherwise the elementwise pass fuses the
// Add with what follows it (a residual), which a MatMulBias would split. Runs before
// assign_precision (the fused op is a compute-bound one).
#include <cmath>
#include <optional>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

bool near(std::optional<float> v, double want) { return v && std::fabs(double(*v) - want) <= 1e-5 * std::fabs(want); }

struct Activation {
  const char* name;
  std::vector<int> nodes;
  int output;
};

// x * 0.5 * (1 + Erf(x / sqrt(2))) over `v`, as the nodes reading v compute it.
std::optional<Activation> gelu_erf_of(const ir::Graph& g, int v) {
  std::vector<int> r = readers_of(g, v);
  if (r.size() != 2 || is_graph_output(g, v)) return std::nullopt;
  for (int k = 0; k < 2; ++k) {
    const ir::Node& scale = g.nodes[size_t(r[k])];
    const ir::Node& mul = g.nodes[size_t(r[1 - k])];
    const bool div = is_onnx(scale, "Div") && scale.inputs.size() == 2 && scale.inputs[0] == v &&
                     near(scalar_constant(g, scale, 1), std::sqrt(2.0));
    const bool mul_scale = is_onnx(scale, "Mul") && near(other_constant(g, scale, v), std::sqrt(0.5));
    if (!(div || mul_scale) || !is_onnx(mul, "Mul") || mul.inputs.size() != 2) continue;
    const int erf_n = sole_reader(g, scale.outputs[0]);
    if (erf_n < 0 || !is_onnx(g.nodes[size_t(erf_n)], "Erf")) continue;
    const int e = g.nodes[size_t(erf_n)].outputs[0];
    const int add_n = sole_reader(g, e);
    if (add_n < 0 || !is_onnx(g.nodes[size_t(add_n)], "Add") || !near(other_constant(g, g.nodes[size_t(add_n)], e), 1.0)) {
      continue;
    }
    const int p = g.nodes[size_t(add_n)].outputs[0];
    const int m = mul.outputs[0];
    const int last_n = sole_reader(g, m);
    if (last_n < 0 || !is_onnx(g.nodes[size_t(last_n)], "Mul")) continue;
    const ir::Node& last = g.nodes[size_t(last_n)];
    // (a) Mul(v, p) then Mul(., 0.5); (b) Mul(v, 0.5) then Mul(., p).
    const bool a = (mul.inputs[0] == p || mul.inputs[1] == p) && (mul.inputs[0] == v || mul.inputs[1] == v) &&
                   near(other_constant(g, last, m), 0.5);
    const bool b = near(other_constant(g, mul, v), 0.5) && sole_reader(g, p) == last_n &&
                   last.inputs.size() == 2 && (last.inputs[0] == p || last.inputs[1] == p);
    if (!a && !b) continue;
    if (a && sole_reader(g, p) != r[1 - k]) continue;
    return Activation{"gelu_erf", {r[k], erf_n, add_n, r[1 - k], last_n}, last.outputs[0]};
  }
  return std::nullopt;
}

std::optional<Activation> activation_of(const ir::Graph& g, int v) {
  if (auto gelu = gelu_erf_of(g, v)) return gelu;
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
