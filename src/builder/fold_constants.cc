// Constant folding: a node whose inputs are all constant runs once at build time on the reference
// kernels, so each op's meaning lives in one place.
#include "backends/kernel_registry.h"
#include "builder/build_state.h"

namespace kiln::builder {

Status fold_node(ir::Graph& g, int node_index) {
  const ir::Node& node = g.nodes[node_index];
  std::vector<const ir::Value*> in, out;
  std::vector<TensorView> in_views, out_views;
  std::vector<Tensor> outputs;
  for (int v : node.inputs) {
    in.push_back(v >= 0 ? &g.values[v] : nullptr);
    in_views.push_back(v >= 0 ? g.values[v].constant->view() : TensorView{});
  }
  for (int v : node.outputs) {
    out.push_back(v >= 0 ? &g.values[v] : nullptr);
    if (v < 0) {
      outputs.emplace_back();
      continue;
    }
    Shape shape;
    for (const auto& d : *g.values[v].shape) {
      if (!d.is_const()) {
        return internal_error(node.describe() + ": output '" + g.values[v].name +
                              "' of constant inputs has a symbolic shape");
      }
      shape.push_back(d.value());
    }
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(g.values[v].dtype, shape));
    outputs.push_back(std::move(t));
  }
  for (const auto& t : outputs) out_views.push_back(t.empty() ? TensorView{} : t.view());
  backends::KernelQuery query{node, in, out};
  KILN_ASSIGN_OR_RETURN(auto kernel, backends::create_reference_kernel(query));
  // The reference kernel checks the constants' values (MelWeightMatrix's edges, Range's length):
  // its refusal is about this node.
  Status run = kernel->execute(in_views, out_views);
  if (!run.ok()) return run.with_context(node.describe());
  for (size_t o = 0; o < node.outputs.size(); ++o) {
    if (node.outputs[o] >= 0) g.values[node.outputs[o]].constant = std::move(outputs[o]);
  }
  return ok_status();
}

}  // namespace kiln::builder
