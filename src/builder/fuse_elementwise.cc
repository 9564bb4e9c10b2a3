// Pass fuse_elementwise: chains of elementwise ONNX ops become one kiln::Elementwise, whose
// kernel reads the chain's inputs once and writes its result once instead of a pass over memory
// per op (GELU's Div, Erf, Add, Mul, Mul; a bias Add before it; the casts precision assignment
// put at a chain's ends). Runs after assign_precision and assign_layout, on values as typed and
// laid out as they will run, for both backends: the CPU evaluates a float32 program a chunk of 256
// elements at a time in cache (run_float32_program) with each op's reference arithmetic, so its
// engines compute the unfused chain's bits in one pass.
//
// Groups grow backwards from a root (walking the nodes last to first): a producer joins when it
// is fusible and every reader of its output is in the group and that output is no engine output,
// so the group has exactly one result, the root's. Fusible: an op the program holds
// (ops/elementwise_program.h), float32/float16/bfloat16 values of known shape, at most 8 distinct
// inputs and 24 instructions per group. A group of one op stays as it is.
#include <algorithm>
#include <set>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "ir/rewrite.h"
#include "ops/elementwise_program.h"

namespace kiln::builder {
namespace {

// The instruction node `n` would be (operands left for the caller to fill), when it is fusible.
std::optional<ops::EwInstruction> instruction_of(const ir::Graph& g, const ir::Node& n) {
  if (!n.domain.empty() || n.outputs.size() != 1 || n.outputs[0] < 0) return std::nullopt;
  auto approximate = n.attrs.get_string("approximate", "none");
  ops::EwOp op;
  if (!approximate.ok() || !ops::ew_op_of(n.op_type, *approximate, &op)) return std::nullopt;
  const size_t arity = ops::ew_is_binary(op) ? 2 : 1;
  if (n.inputs.size() != arity) return std::nullopt;
  for (int v : n.inputs) {
    if (v < 0) return std::nullopt;
  }
  for (int v : {n.inputs[0], n.inputs.back(), n.outputs[0]}) {
    const ir::Value& val = g.values[size_t(v)];
    if (!ops::ew_dtype_ok(val.dtype) || !val.shape || val.shape->size() > 8) return std::nullopt;
  }
  ops::EwInstruction ins{op, n.op_type};
  ins.to = g.values[size_t(n.outputs[0])].dtype;
  auto f = [&](const char* name, float fallback) {
    auto x = n.attrs.get_float(name, fallback);
    return x.ok() ? std::optional<float>(*x) : std::nullopt;
  };
  std::optional<float> alpha = 0.0f, beta = 0.0f;
  if (op == ops::EwOp::kLeakyRelu) alpha = f("alpha", 0.01f);
  if (op == ops::EwOp::kHardSigmoid) alpha = f("alpha", 0.2f), beta = f("beta", 0.5f);
  if (!alpha || !beta) return std::nullopt;
  ins.alpha = *alpha;
  ins.beta = *beta;
  return ins;
}

// The values the nodes `group` read that none of them produces, in first-use order.
std::vector<int> external_inputs(const ir::Graph& g, const std::vector<int>& group) {
  std::set<int> produced;
  for (int n : group) produced.insert(g.nodes[size_t(n)].outputs[0]);
  std::vector<int> out;
  for (int n : group) {
    for (int v : g.nodes[size_t(n)].inputs) {
      if (!produced.count(v) && std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
    }
  }
  return out;
}

// Grows a group back from `root`; empty when it stays a single op.
std::vector<int> grow_group(const ir::Graph& g, int root) {
  std::vector<int> group{root};
  for (bool grew = true; grew && int(group.size()) < ops::kMaxElementwiseInstructions;) {
    grew = false;
    for (size_t m = 0; m < group.size() && !grew; ++m) {
      for (int v : g.nodes[size_t(group[m])].inputs) {
        const int p = g.values[size_t(v)].producer;
        if (p < 0 || std::find(group.begin(), group.end(), p) != group.end()) continue;
        if (is_graph_output(g, v) || !instruction_of(g, g.nodes[size_t(p)])) continue;
        std::vector<int> readers = readers_of(g, v);
        bool inside = std::all_of(readers.begin(), readers.end(), [&](int r) {
          return std::find(group.begin(), group.end(), r) != group.end();
        });
        if (!inside) continue;
        std::vector<int> bigger = group;
        bigger.push_back(p);
        if (int(external_inputs(g, bigger).size()) > ops::kMaxElementwiseInputs) continue;
        group = std::move(bigger);
        grew = true;
        break;
      }
    }
  }
  if (group.size() < 2) return {};
  std::sort(group.begin(), group.end());  // node order is topological
  return group;
}

StatusOr<bool> fuse_at(ir::Graph* g, int root, const SupportsFn& supports) {
  if (!instruction_of(*g, g->nodes[size_t(root)])) return false;
  std::vector<int> group = grow_group(*g, root);
  if (group.empty()) return false;
  const std::vector<int> inputs = external_inputs(*g, group);
  ops::ElementwiseProgram program;
  program.num_inputs = int(inputs.size());
  std::vector<int> reg_of_value(g->values.size(), -1);
  for (size_t i = 0; i < inputs.size(); ++i) reg_of_value[size_t(inputs[i])] = int(i);
  for (int n : group) {
    const ir::Node& node = g->nodes[size_t(n)];
    ops::EwInstruction ins = *instruction_of(*g, node);
    ins.a = reg_of_value[size_t(node.inputs[0])];
    ins.b = node.inputs.size() > 1 ? reg_of_value[size_t(node.inputs[1])] : -1;
    reg_of_value[size_t(node.outputs[0])] = program.num_inputs + int(program.code.size());
    program.code.push_back(std::move(ins));
  }
  const ir::Node& last = g->nodes[size_t(group.back())];
  ir::Node fused;
  fused.name = last.name;
  fused.domain = "kiln";
  fused.op_type = "Elementwise";
  fused.opset = 1;
  fused.inputs = inputs;
  fused.outputs = {last.outputs[0]};
  fused.attrs = ops::elementwise_attributes(program);
  return replace_if_supported(g, group, std::move(fused), supports);
}

}  // namespace

Status fuse_elementwise(ir::Graph* g, const SupportsFn& supports) {
  // Roots from the last node back; after a fusion the indices move, so the walk starts over
  // (the fused node is no ONNX op and is never a root again).
  for (int n = int(g->nodes.size()) - 1; n >= 0;) {
    KILN_ASSIGN_OR_RETURN(bool fused, fuse_at(g, n, supports));
    n = fused ? std::min(n, int(g->nodes.size()) - 1) : n - 1;
  }
  return ok_status();
}

Status fuse_elementwise(BuildState& s) { return fuse_elementwise(&s.graph, backend_supports(s)); }

}  // namespace kiln::builder
