// Pass plan_memory: writes the Plan's graph (only the nodes that run and the values they touch)
// and assigns activations to arena slots. Slot sizes are formulas over the input symbols, so the
// runtime sizes the arena for the actual shapes, never for the profile's max. The output of a view
// that select_kernels made an alias is stored as its root value's bytes: no slot, no copy, and the
// root stays live until the alias's last reader has run. A kernel's workspace takes a slot for the
// one node that runs it. An output the kernel may write over one of its inputs
// (KernelImpl::in_place_input: cuBLASLt's residual, C == D) takes that input's slot where the node
// is its last reader.
#include <algorithm>
#include <map>

#include "builder/build_state.h"
#include "ops/loop_end.h"
#include "plan/loops.h"

namespace kiln::builder {
namespace {

ir::Dim bytes_of(const ir::Value& v) {
  ir::Dim n(int64_t(dtype_size(v.dtype)));
  for (const auto& d : *v.shape) n = n * d;
  return n;
}

}  // namespace

Status plan_memory(BuildState& s) {
  const ir::Graph& g = s.graph;
  plan::Plan& p = s.plan;
  std::vector<int> remap(g.values.size(), -1);
  auto keep = [&](int v) {
    if (v < 0) return -1;
    if (remap[v] < 0) {
      remap[v] = int(p.graph.values.size());
      ir::Value copy = g.values[v];
      copy.producer = -1;
      p.graph.values.push_back(std::move(copy));
      p.values.push_back({});
    }
    return remap[v];
  };
  p.graph.name = g.name;
  p.graph.opsets = g.opsets;
  for (int v : g.inputs) p.graph.inputs.push_back(keep(v));
  for (int v : g.outputs) p.graph.outputs.push_back(keep(v));
  for (int n : s.runtime_nodes) {
    ir::Node node = g.nodes[n];
    for (int& v : node.inputs) v = keep(v);
    for (int& v : node.outputs) v = keep(v);
    for (ir::Guard& gd : node.guards) gd.cond = keep(gd.cond);
    for (int v : node.outputs) {
      if (v >= 0) p.graph.values[v].producer = int(p.graph.nodes.size());
    }
    p.graph.nodes.push_back(std::move(node));
  }

  // Storage of every value.
  const int nv = int(p.graph.values.size());
  std::vector<char> is_output(nv, 0), is_input(nv, 0);
  for (int v : p.graph.outputs) is_output[v] = 1;
  for (int v : p.graph.inputs) is_input[v] = 1;
  for (int v = 0; v < nv; ++v) {
    const ir::Value& val = p.graph.values[v];
    plan::Storage st;
    if (is_input[v]) {
      st = plan::Storage::kInput;
    } else if (val.constant) {
      st = plan::Storage::kConstant;
    } else if (val.producer >= 0) {
      // An output whose size its data decides is written into the arena at its bound and copied
      // out once the run knows the size (the caller's allocator is asked for it then).
      const bool sized_by_data = ir::names_data_dependent(*val.shape, s.data_dependent);
      st = is_output[v] && !sized_by_data ? plan::Storage::kOutput : plan::Storage::kActivation;
    } else if (val.sym_value) {
      st = plan::Storage::kSymbolic;
    } else {
      return internal_error("value '" + val.name +
                            "' is neither an input, a constant, a formula nor produced");
    }
    p.values[v].storage = st;
  }
  if (p.nodes.size() != p.graph.nodes.size()) {
    return internal_error("select_kernels chose " + std::to_string(p.nodes.size()) +
                          " kernels for " + std::to_string(p.graph.nodes.size()) + " nodes");
  }
  // Views: the output is the (root of the) input's bytes. Nodes run in order, so a view's input is
  // resolved to its root before the view itself is seen.
  std::vector<int> root(nv);
  for (int v = 0; v < nv; ++v) root[v] = v;
  for (size_t n = 0; n < p.graph.nodes.size(); ++n) {
    if (p.nodes[n].impl != plan::kAliasImpl) continue;
    const ir::Node& node = p.graph.nodes[n];
    int out = node.outputs[0], in = root[node.inputs[0]];
    root[out] = in;
    p.values[out].storage = plan::Storage::kAlias;
    p.values[out].alias_of = in;
  }

  // Last use of each value's bytes, in node positions: reading an alias reads its root.
  std::vector<int> last_use(nv, -1);
  for (size_t n = 0; n < p.graph.nodes.size(); ++n) {
    for (int v : p.graph.nodes[n].inputs) {
      if (v >= 0) last_use[root[v]] = int(n);
    }
  }
  // Bytes copied to an output after the last node (an output in the arena, or a view of one) live
  // to the end.
  for (int v : p.graph.outputs) last_use[root[v]] = int(p.graph.nodes.size());
  // A value a loop reads from before it is read again by each iteration: live to its LoopEnd.
  KILN_ASSIGN_OR_RETURN(const std::vector<plan::LoopRegion> loops, plan::find_loops(p.graph));
  plan::extend_over_loops(
      p.graph, loops, [&](int v) { return root[size_t(v)]; }, &last_use);
  // Per node: the values whose slots it takes beside its outputs. A LoopEnd's stacked outputs are
  // written row by row from the first iteration on: they take their slots at the LoopBegin.
  std::vector<std::vector<int>> written_from(p.graph.nodes.size());
  for (const plan::LoopRegion& r : loops) {
    const ir::Node& end = p.graph.nodes[size_t(r.end)];
    const ops::LoopEndLayout l = *ops::LoopEndLayout::of(end.inputs.size(), end.outputs.size());
    for (size_t j = 0; j < l.q; ++j) {
      const int v = end.outputs[l.stacked(j)];
      if (v < 0) continue;
      written_from[size_t(r.begin)].push_back(v);
      last_use[size_t(v)] = std::max(last_use[size_t(v)], r.end);  // written until the LoopEnd
    }
    // A LoopEnd copies each next_j into v_j before the next iteration. Where some next_j is a view
    // of another carried value v_m, copying in order would read v_m after overwriting it: the run
    // then copies through the LoopEnd's workspace, one aligned part per carried value.
    bool crossed = false;
    for (size_t j = 0; j < l.k; ++j) {
      for (size_t m = 0; m < l.k; ++m) {
        if (m != j && root[size_t(end.inputs[l.next(j)])] == root[size_t(end.inputs[l.carried(m)])])
          crossed = true;
      }
    }
    if (!crossed) continue;
    ir::Dim bytes(0);
    for (size_t j = 0; j < l.k; ++j) {
      const ir::Dim align(plan::kLoopCopyAlign);
      bytes = bytes +
              ir::Dim::ceil_div(bytes_of(p.graph.values[size_t(end.inputs[l.carried(j)])]), align) *
                  align;
    }
    p.nodes[size_t(r.end)].workspace = bytes;
  }
  // Symbolic values get slots of their own for the whole run: they are written once per shape.
  for (int v = 0; v < nv; ++v) {
    if (p.values[v].storage == plan::Storage::kSymbolic) {
      p.values[v].slot = int(p.slot_bytes.size());
      p.slot_bytes.push_back(bytes_of(p.graph.values[v]));
    }
  }
  // Greedy slot reuse in execution order: a slot is free once its value's last reader ran.
  std::vector<int> slot_owner;  // value currently holding each reusable slot, -1 when free
  std::vector<int> slot_index;  // position in p.slot_bytes
  // A slot free now for `bytes` (one of the same size if any), grown or added as needed.
  auto take_slot = [&](const ir::Dim& bytes) {
    int chosen = -1;
    for (size_t k = 0; k < slot_owner.size(); ++k) {
      if (slot_owner[k] >= 0) continue;
      if (chosen < 0 || p.slot_bytes[slot_index[k]] == bytes) chosen = int(k);
      if (p.slot_bytes[slot_index[k]] == bytes) break;
    }
    if (chosen < 0) {
      chosen = int(slot_owner.size());
      slot_owner.push_back(-1);
      slot_index.push_back(int(p.slot_bytes.size()));
      p.slot_bytes.push_back(bytes);
    } else {
      ir::Dim& sz = p.slot_bytes[slot_index[chosen]];
      sz = ir::Dim::max(sz, bytes);
    }
    return chosen;
  };
  // The slot output 0 of node n may take over from the input its kernel overwrites in place
  // (KernelImpl::in_place_input): that input's root holds a slot, n is its last reader, no other
  // input of n reads it, and it has the output's bytes. -1: none.
  auto in_place_slot = [&](size_t n, int v) {
    const ir::Node& node = p.graph.nodes[n];
    const int k = n < s.in_place.size() ? s.in_place[n] : -1;
    if (k < 0 || size_t(k) >= node.inputs.size() || node.inputs[size_t(k)] < 0 ||
        node.outputs[0] != v)
      return -1;
    const int in = root[node.inputs[size_t(k)]];
    if (p.values[in].storage != plan::Storage::kActivation || last_use[in] != int(n)) return -1;
    for (size_t j = 0; j < node.inputs.size(); ++j) {
      if (int(j) != k && node.inputs[j] >= 0 && root[node.inputs[j]] == in) return -1;
    }
    if (!(bytes_of(p.graph.values[in]) == bytes_of(p.graph.values[v]))) return -1;
    for (size_t slot = 0; slot < slot_owner.size(); ++slot) {
      if (slot_owner[slot] == in) return int(slot);
    }
    return -1;
  };
  for (size_t n = 0; n < p.graph.nodes.size(); ++n) {
    std::vector<int> written = p.graph.nodes[n].outputs;
    written.insert(written.end(), written_from[n].begin(), written_from[n].end());
    for (int v : written) {
      if (v < 0 || p.values[v].storage != plan::Storage::kActivation || p.values[v].slot >= 0)
        continue;
      int chosen = in_place_slot(n, v);
      if (chosen < 0) chosen = take_slot(bytes_of(p.graph.values[v]));
      slot_owner[chosen] = v;
      p.values[v].slot = slot_index[chosen];
    }
    // The kernel's workspace lives while the node runs: beside its inputs and outputs, free after.
    plan::NodePlan& np = p.nodes[n];
    if (!(np.workspace.is_const() && np.workspace.value() == 0)) {
      int chosen = take_slot(np.workspace);
      np.workspace_slot = slot_index[chosen];
    }
    // Release slots whose value is not read after this node (or never read at all).
    for (size_t k = 0; k < slot_owner.size(); ++k) {
      int v = slot_owner[k];
      if (v >= 0 && last_use[v] <= int(n)) slot_owner[k] = -1;
    }
  }
  return ok_status();
}

}  // namespace kiln::builder
