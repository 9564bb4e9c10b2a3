// Pass select_kernels: for every node that runs, the first implementation in the registry's order
// for the target device that supports it; the plan records its id, precision, default tactic (the
// implementation ranks its tactics at the first profile's opt shapes) and workspace formula.
// Views (Reshape, Flatten, Squeeze, Unsqueeze, Identity) become aliases that run nothing, unless
// their output is an engine output (which the caller's buffer must receive). Nodes that no
// implementation supports are all listed in one error, each with every implementation's reason.
#include "backends/kernel_registry.h"
#include "builder/build_state.h"

namespace kiln::builder {
namespace {

bool is_graph_output(const ir::Graph& g, int v) {
  for (int o : g.outputs) {
    if (o == v) return true;
  }
  return false;
}

// A view whose input and output may share bytes: same dtype, one data input, output not an engine
// output (an engine output is written into the caller's buffer, so it needs its copy).
bool runs_as_alias(const ir::Graph& g, const ir::Node& node) {
  if (!ops::traits(node).is_view) return false;
  if (node.inputs.empty() || node.inputs[0] < 0 || node.outputs.size() != 1 || node.outputs[0] < 0) {
    return false;
  }
  const ir::Value& in = g.values[node.inputs[0]];
  const ir::Value& out = g.values[node.outputs[0]];
  return in.dtype == out.dtype && !is_graph_output(g, node.outputs[0]);
}

}  // namespace

Status select_kernels(BuildState& s) {
  const ir::Graph& g = s.graph;
  const backends::KernelRegistry& registry = backends::kernel_registry();
  const Device device = s.backend.device();
  const PrecisionPolicy policy = s.config.precision();
  std::string failures;
  int n_failed = 0;
  for (int n : s.runtime_nodes) {
    const ir::Node& node = g.nodes[n];
    if (runs_as_alias(g, node)) {
      s.plan.nodes.push_back({plan::kAliasImpl, "", {}, ""});
      continue;
    }
    backends::KernelQuery q{node, {}, {}, policy};
    q.opt_symbols = &s.opt_symbols;
    for (int v : node.inputs) q.inputs.push_back(v >= 0 ? &g.values[v] : nullptr);
    for (int v : node.outputs) q.outputs.push_back(v >= 0 ? &g.values[v] : nullptr);
    ops::OpKind op = ops::find_op(node.domain, node.op_type);
    auto candidates = registry.candidates(op, device);
    const backends::KernelImpl* chosen = nullptr;
    std::string reasons;
    for (const backends::KernelImpl* impl : candidates) {
      Status st = impl->supports(q);
      if (st.ok()) {
        chosen = impl;
        break;
      }
      reasons += "\n    " + impl->id() + ": " + st.message();
    }
    if (!chosen) {
      ++n_failed;
      failures += "\n  " + node.describe() + ": ";
      failures += candidates.empty() ? "the " + std::string(device_name(device)) +
                                           " backend has no implementation of " + node.op_type
                                     : "no implementation supports it:" + reasons;
      continue;
    }
    plan::NodePlan choice;
    choice.impl = chosen->id();
    choice.precision = chosen->precision(q);
    q.precision = choice.precision;  // tactics and workspace depend on what the node computes in
    std::vector<std::string> tactics = chosen->tactics(q);  // the first is the default
    choice.tactic = tactics.empty() ? "" : tactics.front();
    q.tactic = choice.tactic;
    choice.workspace = chosen->workspace_bytes(q);
    // A kiln op computing in another layout than ONNX's says so (assign_layout's NHWC convs).
    const ir::Attribute* layout = node.domain == "kiln" ? node.attrs.find("layout") : nullptr;
    if (layout && layout->type == ir::AttrType::kString && layout->s != "NCHW") {
      choice.layout = layout->s;
    }
    s.plan.nodes.push_back(std::move(choice));
  }
  if (n_failed) {
    return unsupported(std::to_string(n_failed) + " node(s) have no kernel on the " +
                       std::string(device_name(device)) + " backend:" + failures);
  }
  return ok_status();
}

}  // namespace kiln::builder
