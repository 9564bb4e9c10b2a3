// Graph helpers: attribute access, verification, topological order. The text form: ir/text.h.
#include "ir/graph.h"

#include <algorithm>
#include <unordered_map>

namespace kiln::ir {
namespace {

const char* attr_type_name(AttrType t) {
  switch (t) {
    case AttrType::kFloat:
      return "float";
    case AttrType::kInt:
      return "int";
    case AttrType::kString:
      return "string";
    case AttrType::kTensor:
      return "tensor";
    case AttrType::kGraph:
      return "graph";
    case AttrType::kFloats:
      return "floats";
    case AttrType::kInts:
      return "ints";
    case AttrType::kStrings:
      return "strings";
    case AttrType::kTensors:
      return "tensors";
    case AttrType::kGraphs:
      return "graphs";
  }
  return "?";
}

Status wrong_type(const std::string& name, AttrType got, const char* want) {
  return invalid_model("attribute '" + name + "' has type " + attr_type_name(got) + ", expected " +
                       want);
}

}  // namespace

const Attribute* Attributes::find(const std::string& name) const {
  auto it = map_.find(name);
  return it == map_.end() ? nullptr : &it->second;
}

StatusOr<int64_t> Attributes::get_int(const std::string& name,
                                      std::optional<int64_t> fallback) const {
  const Attribute* a = find(name);
  if (!a) {
    if (fallback) return *fallback;
    return invalid_model("missing required attribute '" + name + "'");
  }
  if (a->type != AttrType::kInt) return wrong_type(name, a->type, "int");
  return a->i;
}

StatusOr<float> Attributes::get_float(const std::string& name,
                                      std::optional<float> fallback) const {
  const Attribute* a = find(name);
  if (!a) {
    if (fallback) return *fallback;
    return invalid_model("missing required attribute '" + name + "'");
  }
  if (a->type == AttrType::kInt) return float(a->i);
  if (a->type != AttrType::kFloat) return wrong_type(name, a->type, "float");
  return a->f;
}

StatusOr<std::string> Attributes::get_string(const std::string& name,
                                             std::optional<std::string> fallback) const {
  const Attribute* a = find(name);
  if (!a) {
    if (fallback) return *fallback;
    return invalid_model("missing required attribute '" + name + "'");
  }
  if (a->type != AttrType::kString) return wrong_type(name, a->type, "string");
  return a->s;
}

StatusOr<std::vector<int64_t>> Attributes::get_ints(
    const std::string& name, std::optional<std::vector<int64_t>> fallback) const {
  const Attribute* a = find(name);
  if (!a) {
    if (fallback) return *fallback;
    return invalid_model("missing required attribute '" + name + "'");
  }
  if (a->type == AttrType::kInt) return std::vector<int64_t>{a->i};
  if (a->type != AttrType::kInts) return wrong_type(name, a->type, "ints");
  return a->ints;
}

StatusOr<std::vector<float>> Attributes::get_floats(
    const std::string& name, std::optional<std::vector<float>> fallback) const {
  const Attribute* a = find(name);
  if (!a) {
    if (fallback) return *fallback;
    return invalid_model("missing required attribute '" + name + "'");
  }
  if (a->type != AttrType::kFloats) return wrong_type(name, a->type, "floats");
  return a->floats;
}

StatusOr<Tensor> Attributes::get_tensor(const std::string& name) const {
  const Attribute* a = find(name);
  if (!a) return invalid_model("missing required attribute '" + name + "'");
  if (a->type != AttrType::kTensor) return wrong_type(name, a->type, "tensor");
  return a->t;
}

std::string Node::describe() const {
  std::string s = "node '" + name + "' (";
  if (!domain.empty()) s += domain + "::";
  return s + op_type + ")";
}

int Graph::add_value(std::string value_name) {
  Value v;
  v.name = std::move(value_name);
  values.push_back(std::move(v));
  return int(values.size()) - 1;
}

int Graph::find_value(const std::string& value_name) const {
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i].name == value_name) return int(i);
  }
  return -1;
}

std::vector<std::vector<int>> Graph::consumers() const {
  std::vector<std::vector<int>> c(values.size());
  for (size_t n = 0; n < nodes.size(); ++n) {
    for (int v : nodes[n].inputs) {
      if (v >= 0 && (c[v].empty() || c[v].back() != int(n))) c[v].push_back(int(n));
    }
  }
  return c;
}

bool makes_data_dependent(const Graph& g, const Node& node,
                          const std::vector<DataDependentDim>& dd) {
  if (dd.empty()) return false;
  std::set<std::string> in, out;
  for (int v : node.inputs) {
    if (v >= 0 && g.values[size_t(v)].shape)
      for (const auto& d : *g.values[size_t(v)].shape) d.collect_symbols(&in);
  }
  for (int v : node.outputs) {
    if (v >= 0 && g.values[size_t(v)].shape)
      for (const auto& d : *g.values[size_t(v)].shape) d.collect_symbols(&out);
  }
  for (const DataDependentDim& d : dd) {
    if (out.count(d.symbol) && !in.count(d.symbol)) return true;
  }
  return false;
}

Status verify(const Graph& g) {
  const int nv = int(g.values.size());
  // Who defines each value: a graph input, a node, or (when neither) its constant data. A folded
  // node output keeps its producer and has data too.
  std::vector<int> producer(nv, -1);
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node& node = g.nodes[n];
    for (int v : node.outputs) {
      if (v < -1 || v >= nv) return internal_error(node.describe() + ": output index out of range");
      if (v < 0) continue;
      if (producer[v] >= 0) {
        return invalid_model(node.describe() + ": output '" + g.values[v].name +
                             "' is already defined by " + g.nodes[producer[v]].describe() +
                             " (ONNX graphs assign each value once)");
      }
      producer[v] = int(n);
    }
  }
  std::vector<char> defined(nv, 0);
  for (int v : g.inputs) {
    if (v < 0 || v >= nv) return internal_error("graph input index out of range");
    if (defined[v]) return invalid_model("graph input '" + g.values[v].name + "' is listed twice");
    if (producer[v] >= 0) {
      return invalid_model("graph input '" + g.values[v].name + "' is also produced by " +
                           g.nodes[producer[v]].describe());
    }
    defined[v] = 1;
  }
  for (int v = 0; v < nv; ++v) {
    if (g.values[v].constant && producer[v] < 0) defined[v] = 1;
    if (g.values[v].producer != producer[v]) {
      return internal_error("value '" + g.values[v].name + "' records producer " +
                            std::to_string(g.values[v].producer) + " but " +
                            (producer[v] < 0 ? std::string("no node produces it")
                                             : "node " + std::to_string(producer[v]) + " does"));
    }
  }
  std::vector<char> live(nv, 0);
  for (const Node& n : g.nodes) {
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      int v = n.inputs[i];
      if (v < -1 || v >= nv) return internal_error(n.describe() + ": input index out of range");
      if (v < 0) continue;
      live[v] = 1;
      if (!defined[v]) {
        return invalid_model(n.describe() + ": input " + std::to_string(i) + " '" +
                             g.values[v].name +
                             "' is used before any node or graph input defines it");
      }
    }
    for (const Guard& gd : n.guards) {
      if (gd.cond < 0 || gd.cond >= nv)
        return internal_error(n.describe() + ": guard index out of range");
      live[gd.cond] = 1;
      if (!defined[gd.cond]) {
        return internal_error(n.describe() + ": it runs under '" + g.values[gd.cond].name +
                              "', which is used before any node or graph input defines it");
      }
    }
    for (int v : n.outputs) {
      if (v >= 0) defined[v] = live[v] = 1;
    }
  }
  for (int v : g.outputs) {
    if (v < 0 || v >= nv) return internal_error("graph output index out of range");
    if (!defined[v])
      return invalid_model("graph output '" + g.values[v].name + "' is never produced");
    live[v] = 1;
  }
  for (int v : g.inputs) live[v] = 1;
  // Tensor names are the API's handles and the text form's references: live ones are unique.
  std::unordered_map<std::string_view, int> names;
  for (int v = 0; v < nv; ++v) {
    if (!live[v]) continue;
    auto [it, inserted] = names.emplace(g.values[v].name, v);
    if (!inserted) return invalid_model("two values are named '" + g.values[v].name + "'");
  }
  return ok_status();
}

void set_producers(Graph* g) {
  for (Value& v : g->values) v.producer = -1;
  for (size_t n = 0; n < g->nodes.size(); ++n) {
    for (int v : g->nodes[n].outputs) {
      if (v >= 0 && size_t(v) < g->values.size()) g->values[size_t(v)].producer = int(n);
    }
  }
}

Status sort_topologically(Graph* g) {
  const int nv = int(g->values.size());
  std::vector<int> producer(nv, -1);
  for (size_t n = 0; n < g->nodes.size(); ++n) {
    for (int v : g->nodes[n].outputs) {
      if (v < 0) continue;
      if (producer[v] >= 0) {
        return invalid_model(g->nodes[n].describe() + ": output '" + g->values[v].name +
                             "' is also produced by " + g->nodes[producer[v]].describe());
      }
      producer[v] = int(n);
    }
  }
  std::vector<int> state(g->nodes.size(), 0);  // 0 new, 1 on stack, 2 done
  std::vector<int> order;
  order.reserve(g->nodes.size());
  // Iterative DFS so that a hostile, deep graph cannot overflow the stack.
  for (size_t root = 0; root < g->nodes.size(); ++root) {
    if (state[root]) continue;
    std::vector<std::pair<int, size_t>> stack{{int(root), 0}};
    state[root] = 1;
    while (!stack.empty()) {
      auto& [n, next] = stack.back();
      const Node& node = g->nodes[n];
      if (next < node.inputs.size() + node.guards.size()) {
        const size_t k = next++;
        int v = k < node.inputs.size() ? node.inputs[k] : node.guards[k - node.inputs.size()].cond;
        if (v < 0 || producer[v] < 0) continue;
        int p = producer[v];
        if (state[p] == 1) {
          return invalid_model("the graph has a cycle through " + g->nodes[p].describe());
        }
        if (state[p] == 0) {
          state[p] = 1;
          stack.push_back({p, 0});
        }
      } else {
        state[n] = 2;
        order.push_back(n);
        stack.pop_back();
      }
    }
  }
  std::vector<Node> sorted;
  sorted.reserve(order.size());
  for (int n : order) sorted.push_back(std::move(g->nodes[n]));
  g->nodes = std::move(sorted);
  set_producers(g);
  return verify(*g);
}

}  // namespace kiln::ir
