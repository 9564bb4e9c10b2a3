// The helpers of expansion.h that control_flow.cc and sequences.cc share: copying a body into
// the graph (its captures renamed), splicing nodes in place of one, reading build-time scalars.
#include "builder/expansion.h"

#include <map>
#include <memory>

#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

void rename_in_subgraphs(ir::Node& n, const std::map<std::string, std::string>& renamed);

// A copy of subgraph `sub` whose reads of enclosing values (values it neither takes as inputs, nor
// computes, nor holds as constants) are renamed by `renamed`, through its own subgraphs too.
std::shared_ptr<ir::Graph> rename_captures(const ir::Graph& sub,
                                           const std::map<std::string, std::string>& renamed) {
  auto out = std::make_shared<ir::Graph>(sub);
  std::vector<char> local(sub.values.size(), 0);
  for (int v : sub.inputs) local[size_t(v)] = 1;
  for (const ir::Node& n : sub.nodes) {
    for (int v : n.outputs) {
      if (v >= 0) local[size_t(v)] = 1;
    }
  }
  std::map<std::string, std::string> inner = renamed;
  for (size_t v = 0; v < sub.values.size(); ++v) {
    if (local[v] || sub.values[v].constant) {
      inner.erase(sub.values[v].name);  // shadowed below this graph
      continue;
    }
    auto it = renamed.find(sub.values[v].name);
    if (it != renamed.end()) out->values[v].name = it->second;
  }
  for (ir::Node& n : out->nodes) rename_in_subgraphs(n, inner);
  return out;
}

// Node n's graph attributes, their reads of enclosing values renamed by `renamed`.
void rename_in_subgraphs(ir::Node& n, const std::map<std::string, std::string>& renamed) {
  for (const auto& [attr_name, a] : n.attrs.all()) {
    if (a.type != ir::AttrType::kGraph && a.type != ir::AttrType::kGraphs) continue;
    ir::Attribute copy = a;
    if (a.g) copy.g = rename_captures(*a.g, renamed);
    for (auto& sg : copy.graphs) sg = rename_captures(*sg, renamed);
    n.attrs.set(attr_name, std::move(copy));
  }
}

}  // namespace

StatusOr<BodyCopy> copy_body(ir::Graph& g, size_t n, const ir::Graph& b,
                             const std::vector<int>& bound, const std::vector<int>& targets,
                             const std::string& prefix, const std::map<std::string, int>& carriers,
                             const std::string& what) {
  const std::string owner = g.nodes[n].describe();
  if (bound.size() != b.inputs.size()) {
    return invalid_model(owner + ": its " + what + " takes " + std::to_string(b.inputs.size()) +
                         " inputs, " + std::to_string(bound.size()) + " given");
  }
  std::vector<char> produced(b.values.size(), 0);
  for (const ir::Node& bn : b.nodes) {
    for (int v : bn.outputs) {
      if (v >= 0) produced[size_t(v)] = 1;
    }
  }
  std::vector<int> map(b.values.size(), -1);
  for (size_t i = 0; i < b.inputs.size(); ++i) map[size_t(b.inputs[i])] = bound[i];
  std::vector<std::pair<int, int>> copies;  // (body value, target)
  for (size_t k = 0; k < b.outputs.size(); ++k) {
    const int bv = b.outputs[k];
    if (k >= targets.size() || targets[k] < 0) continue;
    if (produced[size_t(bv)] && map[size_t(bv)] < 0) {
      map[size_t(bv)] = targets[k];
    } else {
      copies.push_back({bv, targets[k]});
    }
  }
  for (size_t v = 0; v < b.values.size(); ++v) {
    const ir::Value& bval = b.values[v];
    if (map[v] >= 0) continue;
    if (produced[v]) {
      map[v] = ir::add_unique_value(&g, prefix + "/" + bval.name, DType::kUndefined, std::nullopt);
    } else if (bval.constant) {
      map[v] = ir::add_unique_value(&g, prefix + "/" + bval.name, bval.dtype, bval.shape);
      g.values[size_t(map[v])].constant = bval.constant;
    } else {
      auto carried = carriers.find(bval.name);
      const int outer = carried != carriers.end() ? carried->second : g.find_value(bval.name);
      if (outer < 0 || g.values[size_t(outer)].producer >= int(n)) {
        return unsupported(owner + ": its " + what + " reads '" + bval.name + "', which " +
                           (outer < 0 ? "no enclosing graph defines" : "is computed after it"));
      }
      map[v] = outer;
    }
  }
  // A nested subgraph reads the body's values by name: those names follow the renaming.
  std::map<std::string, std::string> renamed;
  for (size_t v = 0; v < b.values.size(); ++v) {
    if (map[v] >= 0 && g.values[size_t(map[v])].name != b.values[v].name) {
      renamed[b.values[v].name] = g.values[size_t(map[v])].name;
    }
  }
  BodyCopy out;
  for (const ir::Node& bn : b.nodes) {
    ir::Node copy = bn;
    rename_in_subgraphs(copy, renamed);
    copy.name = ir::unique_node_name(g, prefix + "/" + (bn.name.empty() ? bn.op_type : bn.name));
    for (int& v : copy.inputs) v = v < 0 ? v : map[size_t(v)];
    for (int& v : copy.outputs) v = v < 0 ? v : map[size_t(v)];
    out.nodes.push_back(std::move(copy));
  }
  for (const auto& [bv, target] : copies) {
    ir::Node id;
    id.name = ir::unique_node_name(g, prefix + "/output");
    id.op_type = "Identity";
    id.opset = 13;
    id.inputs = {map[size_t(bv)]};
    id.outputs = {target};
    out.nodes.push_back(std::move(id));
  }
  for (size_t k = 0; k < b.outputs.size(); ++k) {
    out.outputs.push_back(k < targets.size() && targets[k] >= 0 ? targets[k]
                                                                : map[size_t(b.outputs[k])]);
  }
  return out;
}

void splice(ir::Graph& g, size_t n, std::vector<ir::Node> nodes) {
  const std::vector<ir::Guard> outer = g.nodes[n].guards;
  for (ir::Node& nd : nodes) nd.guards.insert(nd.guards.begin(), outer.begin(), outer.end());
  g.nodes.erase(g.nodes.begin() + std::ptrdiff_t(n));
  g.nodes.insert(g.nodes.begin() + std::ptrdiff_t(n), std::make_move_iterator(nodes.begin()),
                 std::make_move_iterator(nodes.end()));
  for (size_t m = n; m < g.nodes.size(); ++m) {
    for (int v : g.nodes[m].outputs) {
      if (v >= 0) g.values[size_t(v)].producer = int(m);
    }
  }
}

std::optional<int64_t> known_scalar(const ir::Value& v) {
  if (v.constant && v.constant->numel() == 1 && dtype_size(v.constant->dtype()) > 0) {
    if (is_integer(v.constant->dtype()) || v.constant->dtype() == DType::kBool)
      return v.constant->int_at(0);
  }
  if (v.sym_value && v.sym_value->size() == 1 && (*v.sym_value)[0].is_const())
    return (*v.sym_value)[0].value();
  return std::nullopt;
}

const ir::Graph* graph_attr(const ir::Node& node, const char* name) {
  const ir::Attribute* a = node.attrs.find(name);
  return a && a->type == ir::AttrType::kGraph && a->g ? a->g.get() : nullptr;
}

}  // namespace kiln::builder
