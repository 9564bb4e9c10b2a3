// Pass select_kernels: asks the target backend for a kernel (tactic) for every node that runs and
// records its name and precision; nodes no kernel accepts are all listed in one error.
#include "builder/build_state.h"

namespace kiln::builder {

Status select_kernels(BuildState& s) {
  const ir::Graph& g = s.graph;
  std::string failures;
  int n_failed = 0;
  for (int n : s.runtime_nodes) {
    const ir::Node& node = g.nodes[n];
    backends::KernelQuery q{node, {}, {}, s.config.flags()};
    for (int v : node.inputs) q.inputs.push_back(v >= 0 ? &g.values[v] : nullptr);
    for (int v : node.outputs) q.outputs.push_back(v >= 0 ? &g.values[v] : nullptr);
    auto kernel = s.backend.create_kernel(q);
    if (!kernel.ok()) {
      ++n_failed;
      failures += "\n  " + kernel.status().message();
      continue;
    }
    s.plan.kernels.push_back((*kernel)->name());
    if (std::string p = (*kernel)->precision(); !p.empty()) {
      s.plan.precisions.push_back(p);
      continue;
    }
    DType dt = node.outputs.empty() || node.outputs[0] < 0 ? DType::kUndefined : g.values[node.outputs[0]].dtype;
    s.plan.precisions.push_back(std::string(dtype_name(dt)));
  }
  if (n_failed) {
    return unsupported(std::to_string(n_failed) + " node(s) have no kernel on the " +
                       std::string(device_name(s.backend.device())) + " backend:" + failures);
  }
  return ok_status();
}

}  // namespace kiln::builder
