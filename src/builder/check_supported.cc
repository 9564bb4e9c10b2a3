// Pass check_supported: every node whose op kiln does not know, whose arity is wrong, or that omits
// an input its schema requires is listed in one error, so a user sees the whole list instead of
// fixing one op at a time; a graph output listed twice is refused before anything is inferred.
#include <algorithm>
#include <unordered_set>

#include "builder/build_state.h"
#include "ops/attribute_domains.h"

namespace kiln::builder {

std::vector<std::string> arity_problems(const ir::Node& node, const ops::OpSchema& schema) {
  std::vector<std::string> out;
  const int ni = int(node.inputs.size()), no = int(node.outputs.size());
  if (ni < schema.min_inputs || ni > schema.max_inputs) {
    out.push_back(node.describe() + " has " + std::to_string(ni) + " inputs, expected " +
                  std::to_string(schema.min_inputs) + ".." + std::to_string(schema.max_inputs));
  }
  if (no < schema.min_outputs || no > schema.max_outputs) {
    out.push_back(node.describe() + " has " + std::to_string(no) + " outputs, expected " +
                  std::to_string(schema.min_outputs) + ".." + std::to_string(schema.max_outputs));
  }
  // Inputs before min_inputs are required; an ONNX "" there reaches inference, which reads
  // required inputs without looking, as a missing value.
  for (int i = 0; i < std::min(ni, schema.min_inputs); ++i) {
    if (node.inputs[size_t(i)] < 0) {
      out.push_back(node.describe() + " input " + std::to_string(i) +
                    " is omitted (\"\"), but its first " + std::to_string(schema.min_inputs) +
                    " input(s) are required");
    }
  }
  if (schema.traits.inputs_required) {
    for (int i = schema.min_inputs; i < ni; ++i) {
      if (node.inputs[size_t(i)] < 0) {
        out.push_back(node.describe() + " input " + std::to_string(i) +
                      " is omitted (\"\"), but none of its inputs may be");
      }
    }
  }
  return out;
}

namespace {

// Attribute values outside ONNX's enumerations, in g's nodes and their subgraphs' (a Scan in a
// Loop's body is lowered later, after this pass).
void domain_problems(const ir::Graph& g, std::string* list) {
  for (const ir::Node& node : g.nodes) {
    for (const std::string& wrong : ops::attribute_domain_problems(node)) *list += "\n  " + wrong;
    for (const auto& [name, a] : node.attrs.all()) {
      if (a.g) domain_problems(*a.g, list);
      for (const auto& sub : a.graphs) {
        if (sub) domain_problems(*sub, list);
      }
    }
  }
}

}  // namespace

Status check_supported(BuildState& s) {
  // Two IO bindings of one name would share a buffer the runtime frees once per binding; TensorRT
  // refuses ambiguous IO names too.
  std::unordered_set<int> outputs;
  for (int v : s.graph.outputs) {
    if (!outputs.insert(v).second) {
      return invalid_model("graph output '" + s.graph.values[v].name + "' is listed twice");
    }
  }
  std::string unsupported_list, invalid_list;
  int n_unsupported = 0;
  for (const ir::Node& node : s.graph.nodes) {
    const ops::OpSchema* schema = ops::find_schema(node);
    if (!schema) {
      ++n_unsupported;
      unsupported_list += "\n  " + node.op_type + "  node '" + node.name + "'  domain '" +
                          (node.domain.empty() ? "ai.onnx" : node.domain) + "'  opset " +
                          std::to_string(node.opset) + "  reason: " +
                          (ops::find_op(node.domain, node.op_type) == ops::OpKind::kUnknown
                               ? "kiln has no schema for this op"
                               : "op known but not implemented yet");
      continue;
    }
    for (const std::string& wrong : arity_problems(node, *schema)) invalid_list += "\n  " + wrong;
  }
  if (n_unsupported) {
    return unsupported(std::to_string(n_unsupported) +
                       " node(s) use ops kiln does not support:" + unsupported_list);
  }
  if (!invalid_list.empty()) {
    return invalid_model(
        "nodes with a wrong number of inputs or outputs, or an omitted required input:" +
        invalid_list);
  }
  std::string domain_list;
  domain_problems(s.graph, &domain_list);
  if (!domain_list.empty())
    return invalid_model("attribute values ONNX does not allow:" + domain_list);
  return ok_status();
}

}  // namespace kiln::builder
