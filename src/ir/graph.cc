// Graph helpers: attribute access, verification, topological order, and the text printer.
#include "ir/graph.h"

#include <algorithm>
#include <sstream>
#include <unordered_map>

namespace kiln::ir {
namespace {

const char* attr_type_name(AttrType t) {
  switch (t) {
    case AttrType::kFloat: return "float";
    case AttrType::kInt: return "int";
    case AttrType::kString: return "string";
    case AttrType::kTensor: return "tensor";
    case AttrType::kGraph: return "graph";
    case AttrType::kFloats: return "floats";
    case AttrType::kInts: return "ints";
    case AttrType::kStrings: return "strings";
    case AttrType::kTensors: return "tensors";
    case AttrType::kGraphs: return "graphs";
  }
  return "?";
}

Status wrong_type(const std::string& name, AttrType got, const char* want) {
  return invalid_model("attribute '" + name + "' has type " + attr_type_name(got) + ", expected " + want);
}

}  // namespace

const Attribute* Attributes::find(const std::string& name) const {
  auto it = map_.find(name);
  return it == map_.end() ? nullptr : &it->second;
}

StatusOr<int64_t> Attributes::get_int(const std::string& name, std::optional<int64_t> fallback) const {
  const Attribute* a = find(name);
  if (!a) {
    if (fallback) return *fallback;
    return invalid_model("missing required attribute '" + name + "'");
  }
  if (a->type != AttrType::kInt) return wrong_type(name, a->type, "int");
  return a->i;
}

StatusOr<float> Attributes::get_float(const std::string& name, std::optional<float> fallback) const {
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

StatusOr<std::vector<int64_t>> Attributes::get_ints(const std::string& name,
                                                    std::optional<std::vector<int64_t>> fallback) const {
  const Attribute* a = find(name);
  if (!a) {
    if (fallback) return *fallback;
    return invalid_model("missing required attribute '" + name + "'");
  }
  if (a->type == AttrType::kInt) return std::vector<int64_t>{a->i};
  if (a->type != AttrType::kInts) return wrong_type(name, a->type, "ints");
  return a->ints;
}

StatusOr<std::vector<float>> Attributes::get_floats(const std::string& name,
                                                    std::optional<std::vector<float>> fallback) const {
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

Status verify(const Graph& g) {
  const int nv = int(g.values.size());
  std::vector<char> defined(nv, 0);
  for (int v : g.inputs) {
    if (v < 0 || v >= nv) return internal_error("graph input index out of range");
    defined[v] = 1;
  }
  for (int v = 0; v < nv; ++v) {
    if (g.values[v].constant) defined[v] = 1;
  }
  for (const Node& n : g.nodes) {
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      int v = n.inputs[i];
      if (v < -1 || v >= nv) return internal_error(n.describe() + ": input index out of range");
      if (v >= 0 && !defined[v]) {
        return invalid_model(n.describe() + ": input " + std::to_string(i) + " '" + g.values[v].name +
                             "' is used before any node or graph input defines it");
      }
    }
    for (int v : n.outputs) {
      if (v < -1 || v >= nv) return internal_error(n.describe() + ": output index out of range");
      if (v < 0) continue;
      if (defined[v]) {
        return invalid_model(n.describe() + ": output '" + g.values[v].name +
                             "' is already defined (ONNX graphs assign each value once)");
      }
      defined[v] = 1;
    }
  }
  for (int v : g.outputs) {
    if (v < 0 || v >= nv) return internal_error("graph output index out of range");
    if (!defined[v]) return invalid_model("graph output '" + g.values[v].name + "' is never produced");
  }
  return ok_status();
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
      if (next < node.inputs.size()) {
        int v = node.inputs[next++];
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
  for (auto& v : g->values) v.producer = -1;
  for (size_t n = 0; n < g->nodes.size(); ++n) {
    for (int v : g->nodes[n].outputs) {
      if (v >= 0) g->values[v].producer = int(n);
    }
  }
  return verify(*g);
}

std::string type_to_string(const Value& v) {
  std::string s(dtype_name(v.dtype));
  if (!v.shape) return s + "[?]";
  return s + dims_to_string(*v.shape);
}

static std::string attr_to_text(const Attribute& a) {
  std::ostringstream os;
  auto list = [&](const auto& xs) {
    os << "[";
    for (size_t i = 0; i < xs.size(); ++i) os << (i ? ", " : "") << xs[i];
    os << "]";
  };
  switch (a.type) {
    case AttrType::kFloat: os << a.f; break;
    case AttrType::kInt: os << a.i; break;
    case AttrType::kString: os << '"' << a.s << '"'; break;
    case AttrType::kTensor: os << "tensor<" << dtype_name(a.t.dtype()) << shape_to_string(a.t.shape()) << ">"; break;
    case AttrType::kGraph: os << "graph"; break;
    case AttrType::kFloats: list(a.floats); break;
    case AttrType::kInts: list(a.ints); break;
    case AttrType::kStrings: list(a.strings); break;
    case AttrType::kTensors: os << "tensors(" << a.tensors.size() << ")"; break;
    case AttrType::kGraphs: os << "graphs(" << a.graphs.size() << ")"; break;
  }
  return os.str();
}

std::string to_text(const Graph& g) {
  std::ostringstream os;
  os << "graph " << (g.name.empty() ? "main" : g.name) << "(";
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const Value& v = g.values[g.inputs[i]];
    os << (i ? ", " : "") << "%" << v.name << ": " << type_to_string(v);
  }
  os << ") -> (";
  for (size_t i = 0; i < g.outputs.size(); ++i) {
    const Value& v = g.values[g.outputs[i]];
    os << (i ? ", " : "") << "%" << v.name << ": " << type_to_string(v);
  }
  os << ") {\n";
  for (const Node& n : g.nodes) {
    os << "  ";
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      os << (i ? ", " : "");
      if (n.outputs[i] < 0) {
        os << "_";
      } else {
        const Value& v = g.values[n.outputs[i]];
        os << "%" << v.name << ": " << type_to_string(v);
        if (v.sym_value) os << " = " << dims_to_string(*v.sym_value);
      }
    }
    os << " = " << (n.domain.empty() ? "" : n.domain + "::") << n.op_type << "(";
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      os << (i ? ", " : "");
      if (n.inputs[i] < 0) {
        os << "_";
      } else {
        os << "%" << g.values[n.inputs[i]].name;
      }
    }
    os << ")";
    if (!n.attrs.all().empty()) {
      os << " {";
      bool first = true;
      for (const auto& [k, a] : n.attrs.all()) {
        os << (first ? "" : ", ") << k << "=" << attr_to_text(a);
        first = false;
      }
      os << "}";
    }
    os << "  # " << n.name << "\n";
  }
  os << "}\n";
  return os.str();
}

}  // namespace kiln::ir
