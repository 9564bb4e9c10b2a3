// Pass eliminate_dead_nodes: keeps the nodes that must run. A value that is constant, or whose
// elements are known as formulas (shape arithmetic), needs no node: the runtime evaluates it.
#include "builder/build_state.h"

namespace kiln::builder {

static bool known_without_running(const ir::Value& v) { return v.constant || v.sym_value; }

Status eliminate_dead_nodes(BuildState& s) {
  const ir::Graph& g = s.graph;
  std::vector<char> needed(g.values.size(), 0);
  for (int v : g.outputs) needed[v] = 1;
  std::vector<char> runs(g.nodes.size(), 0);
  for (int n = int(g.nodes.size()) - 1; n >= 0; --n) {
    const ir::Node& node = g.nodes[n];
    for (int v : node.outputs) {
      if (v >= 0 && needed[v] && !known_without_running(g.values[v])) runs[n] = 1;
    }
    if (!runs[n]) continue;
    for (int v : node.inputs) {
      if (v >= 0) needed[v] = 1;
    }
  }
  s.runtime_nodes.clear();
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    if (runs[n]) s.runtime_nodes.push_back(int(n));
  }
  return ok_status();
}

}  // namespace kiln::builder
