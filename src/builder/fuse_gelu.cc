// Pass fuse_gelu: GELU's tanh approximation as exporters write it out op by op (transformers'
// NewGELUActivation, GPT-2's "gelu_new"),
//   0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * Pow(x, 3))))
// becomes one ONNX Gelu (opset 20) {approximate="tanh"}: its definition exactly, one kernel and
// one pass over x, where the eight ops ran as one fused elementwise program too long for the
// vectorized kernel (GPT-2's [4096, 3072] MLP activation at batch 8: 285 us, half of each layer).
// fuse_matmul_bias then takes the Gelu into a linear layer's epilogue where one precedes it.
// Matched in either operand order of each Mul and Add, the halving before or after the product,
// each intermediate read by nothing else and no engine output. CUDA only, as the other fusions:
// a CPU engine runs the model's own ops.
#include <cmath>
#include <optional>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

bool near(std::optional<float> v, double want) {
  return v && std::fabs(double(*v) - want) <= 1e-4 * std::fabs(want);
}

StatusOr<bool> fuse_at(ir::Graph* g, int tn, const SupportsFn& supports) {
  const ir::Node& tanh = g->nodes[size_t(tn)];
  if (!is_onnx(tanh, "Tanh") || tanh.inputs.size() != 1 || tanh.outputs.size() != 1) return false;
  std::vector<int> matched = {tn};
  // Inside: Mul(s, sqrt(2/pi)), s = Add(x, Mul(Pow(x, 3), 0.044715)).
  const int m2 = producer_of(*g, tanh.inputs[0], "Mul", tn);
  if (m2 < 0) return false;
  const ir::Node& mul2 = g->nodes[size_t(m2)];
  int s = -1;
  for (int v : mul2.inputs) {
    if (near(other_constant(*g, mul2, v), std::sqrt(2.0 / M_PI))) s = v;
  }
  const int add = producer_of(*g, s, "Add", m2);
  if (add < 0) return false;
  const ir::Node& sum = g->nodes[size_t(add)];
  int x = -1, m1 = -1, pw = -1;
  for (int v : sum.inputs) {
    const int m = producer_of(*g, v, "Mul", add);
    if (m < 0) continue;
    const ir::Node& cube_mul = g->nodes[size_t(m)];
    for (int c : cube_mul.inputs) {
      if (!near(other_constant(*g, cube_mul, c), 0.044715)) continue;
      const int p = producer_of(*g, c, "Pow", m);
      if (p < 0 || !near(scalar_constant(*g, g->nodes[size_t(p)], 1), 3.0)) continue;
      const int base = g->nodes[size_t(p)].inputs[0];
      if (other_of(sum, v) != base) continue;
      x = base, m1 = m, pw = p;
    }
  }
  if (x < 0) return false;
  matched.insert(matched.end(), {m2, add, m1, pw});
  // Outside: u = Add(Tanh, 1); then Mul(Mul(x, 0.5), u) or Mul(Mul(x, u), 0.5).
  const int t = tanh.outputs[0];
  const int un = sole_reader(*g, t);
  if (un < 0 || !is_onnx(g->nodes[size_t(un)], "Add") || !near(other_constant(*g, g->nodes[size_t(un)], t), 1.0)) {
    return false;
  }
  const int u = g->nodes[size_t(un)].outputs[0];
  const int last = sole_reader(*g, u);
  if (last < 0 || !is_onnx(g->nodes[size_t(last)], "Mul")) return false;
  const ir::Node& lm = g->nodes[size_t(last)];
  const int a = other_of(lm, u);
  int out = -1;
  std::vector<int> tail = {un, last};
  const int half = producer_of(*g, a, "Mul", last);
  if (half >= 0 && other_of(g->nodes[size_t(half)], x) >= 0 &&
      near(other_constant(*g, g->nodes[size_t(half)], x), 0.5)) {
    out = lm.outputs[0];  // Mul(Mul(x, 0.5), u)
    tail.push_back(half);
  } else if (a == x) {
    const int h2 = sole_reader(*g, lm.outputs[0]);  // Mul(Mul(x, u), 0.5)
    if (h2 < 0 || !is_onnx(g->nodes[size_t(h2)], "Mul") ||
        !near(other_constant(*g, g->nodes[size_t(h2)], lm.outputs[0]), 0.5)) {
      return false;
    }
    out = g->nodes[size_t(h2)].outputs[0];
    tail.push_back(h2);
  } else {
    return false;
  }
  matched.insert(matched.end(), tail.begin(), tail.end());
  const ir::Value &xv = g->values[size_t(x)], &ov = g->values[size_t(out)];
  if (!is_float(xv.dtype) || ov.dtype != xv.dtype || !xv.shape || !ov.shape || *xv.shape != *ov.shape) return false;
  ir::Node gelu;
  gelu.name = tanh.name;
  gelu.op_type = "Gelu";
  gelu.opset = 20;
  set_string(&gelu, "approximate", "tanh");
  gelu.inputs = {x};
  gelu.outputs = {out};
  return replace_if_supported(g, matched, std::move(gelu), supports);
}

}  // namespace

Status fuse_gelu(ir::Graph* g, const SupportsFn& supports) {
  return fuse_at_every_node(g, [&](int n) { return fuse_at(g, n, supports); });
}

Status fuse_gelu(BuildState& s) {
  if (s.backend.device() != Device::kCUDA) return ok_status();
  return fuse_gelu(&s.graph, backend_supports(s));
}

}  // namespace kiln::builder
