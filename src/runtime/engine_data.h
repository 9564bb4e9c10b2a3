// EngineData: the immutable state an Engine shares with its execution contexts.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/kernel_registry.h"
#include "plan/loops.h"
#include "plan/plan.h"

namespace kiln {

struct EngineData {
  plan::Plan plan;
  const backends::Backend* backend = nullptr;
  std::vector<int> io_values;    // plan value index of each IO tensor: inputs, then outputs
  std::vector<int> io_of_value;  // per plan value: its IO index, or -1
  int num_inputs = 0;
  std::map<std::string, int, std::less<>> io_by_name;

  // The IO index of a tensor name; kNotFound listing every IO tensor when the name is unknown.
  StatusOr<int> find_io(const std::string& name) const {
    auto it = io_by_name.find(name);
    if (it != io_by_name.end()) return it->second;
    std::string names;
    for (const auto& [n, i] : io_by_name) names += (names.empty() ? "" : ", ") + n;
    return not_found("no IO tensor named '" + name + "'; this engine's IO tensors are: " + names);
  }
  // For each engine input dim: how its value binds a symbol (dim = coeff*symbol + offset).
  struct DimBinding {
    bool fixed = true;
    int64_t value = 0;  // when fixed
    std::string symbol;
    int64_t coeff = 1, offset = 0;
  };
  std::vector<std::vector<DimBinding>> input_bindings;
  // Per engine input: its index in plan.shape_values, or -1 for an input read as a tensor.
  std::vector<int> shape_value_of_input;
  // Data-dependent dims (plan.data_dependent): per plan value, whether its shape or symbolic value
  // names one (its shape is then known only once the node that sizes it has run), and per node,
  // whether it makes one (its kernel reports the sizes: on a device the run waits for them there).
  std::vector<char> value_data_dependent;
  std::vector<char> shape_data_dependent;  // per plan value: its shape names one (an output
                                           // needs an allocator then)
  std::vector<char> node_makes_data_dependent;
  // Whether some node runs under a condition (an If whose condition is data): runs then read each
  // condition as they reach it and skip the other branch, so they are never captured as a graph.
  bool has_guards = false;
  std::vector<char> node_selects_branch;  // per plan node: a kiln::SelectBranch
  // Loops that run at run time (plan/loops.h), and per plan node the loop whose LoopBegin or
  // LoopEnd it is (-1 for any other node). Their runs read conditions and counts as they reach
  // them, so they are never captured as a graph either.
  std::vector<plan::LoopRegion> loops;
  std::vector<int> loop_at_node;
  // Per loop: the carried dims that grow (its LoopBegin's `grow`), each a data-dependent symbol the
  // run binds at the start and after every iteration, and the values whose shapes or symbolic
  // values name those symbols (resolved again at each binding).
  struct LoopGrowth {
    size_t carried = 0, dim = 0;
    std::string symbol;
  };
  std::vector<std::vector<LoopGrowth>> loop_growth;
  std::vector<std::vector<int>> loop_values;
  // Backends whose kernels cannot read host memory get each constant uploaded once per engine;
  // indexed by plan value (nullptr for non-constants and on the CPU).
  std::vector<void*> device_constants;
  // Per plan node: the implementation the plan names (nullptr for an alias, which runs nothing),
  // found by id when the engine is made, and the state it prepared once for this engine.
  std::vector<const backends::KernelImpl*> impls;
  std::vector<std::shared_ptr<const backends::PreparedNode>> prepared;

  // The query an implementation sees for plan node n: its values, the engine's policy, and the
  // precision and tactic the plan recorded.
  backends::KernelQuery query(size_t n) const {
    const ir::Graph& g = plan.graph;
    const ir::Node& node = g.nodes[n];
    backends::KernelQuery q{node,
                            {},
                            {},
                            PrecisionPolicy::from_flags(plan.builder_flags),
                            plan.nodes[n].precision,
                            plan.nodes[n].tactic};
    for (int v : node.inputs) q.inputs.push_back(v >= 0 ? &g.values[v] : nullptr);
    for (int v : node.outputs) q.outputs.push_back(v >= 0 ? &g.values[v] : nullptr);
    return q;
  }

  EngineData() = default;
  EngineData(const EngineData&) = delete;
  EngineData& operator=(const EngineData&) = delete;
  ~EngineData() {
    prepared.clear();  // prepared state may hold device memory of the backend
    for (void* p : device_constants) {
      if (p) backend->deallocate(p);
    }
  }
};

// The symbol ranges activation memory is sized over at input symbols `at`: each input symbol the
// point it is bound to, each data-dependent dim [0, the upper end of its bound] (bounds may name
// earlier data-dependent dims). kInvalidArgument naming the dim when a bound has no finite end.
StatusOr<ir::SymbolRanges> size_ranges(const plan::Plan& plan, const ir::SymbolValues& at);
// A formula's value at `at`, or, where it names a data-dependent dim not bound in `at`, its upper
// end over `ranges`. nullopt on overflow, an unknown symbol or no finite upper end.
std::optional<int64_t> value_or_upper(const ir::Dim& d, const ir::SymbolValues& at,
                                      const ir::SymbolRanges& ranges);

// Refuses a plan that breaks an invariant the runtime relies on (storage kinds against the graph's
// IO, constants' bytes, op arity and inference, arena and workspace slots at every profile corner),
// naming the invariant, the node or value and the numbers. Runs before anything else reads the
// plan.
Status verify_plan(const EngineData& data);
// Uploads the plan's constants for a device backend (a no-op on host-accessible backends).
Status upload_constants(EngineData& data);
// Finds each node's implementation by the id the plan records and lets it prepare its constant
// state once for this engine; refuses a plan naming an implementation this build lacks.
Status prepare_implementations(EngineData& data);

}  // namespace kiln
