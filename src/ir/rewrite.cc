// Graph-editing helpers (policy: ir/rewrite.h). Each edit is applied, then settled: producers
// recomputed, nodes re-sorted only when out of order, the graph verified; a failed edit is undone.
#include "ir/rewrite.h"

#include <algorithm>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace kiln::ir {
namespace {

bool is_ordered(const Graph& g) {
  std::vector<char> done(g.values.size(), 0);
  std::vector<char> produced(g.values.size(), 0);
  for (const Node& n : g.nodes) {
    for (int v : n.outputs) {
      if (v >= 0) produced[v] = 1;
    }
  }
  for (const Node& n : g.nodes) {
    for (int v : n.inputs) {
      if (v >= 0 && produced[v] && !done[v]) return false;
    }
    for (const Guard& gd : n.guards) {
      if (gd.cond >= 0 && size_t(gd.cond) < produced.size() && produced[gd.cond] && !done[gd.cond])
        return false;
    }
    for (int v : n.outputs) {
      if (v >= 0) done[v] = 1;
    }
  }
  return true;
}

// The state an edit may change, to undo it.
struct Snapshot {
  explicit Snapshot(const Graph& g)
      : nodes(g.nodes), outputs(g.outputs), num_values(g.values.size()) {}
  std::vector<Node> nodes;
  std::vector<int> outputs;
  size_t num_values;
};

Status settle(Graph* g, Snapshot&& before) {
  set_producers(g);
  Status st = is_ordered(*g) ? verify(*g) : sort_topologically(g);
  if (st.ok()) return st;
  g->nodes = std::move(before.nodes);
  g->outputs = std::move(before.outputs);
  g->values.resize(before.num_values);
  set_producers(g);
  return st;
}

int find_node(const Graph& g, const std::string& name, const std::vector<int>& outputs) {
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    if (g.nodes[n].name == name && g.nodes[n].outputs == outputs) return int(n);
  }
  return -1;
}

bool valid_value(const Graph& g, int v) { return v >= 0 && v < int(g.values.size()); }

void fill_defaults(const Graph& g, Node* n) {
  if (n->name.empty()) n->name = unique_node_name(g, n->op_type);
  if (n->opset == 0) {
    auto it = g.opsets.find(n->domain);
    if (it != g.opsets.end()) n->opset = it->second;
  }
}

// A fresh output: in range, and not yet a graph input, a node's output or a constant.
Status check_fresh(const Graph& g, int v, const std::vector<char>& produced, const char* what) {
  if (!valid_value(g, v))
    return invalid_argument(std::string(what) + ": output index out of range");
  if (produced[v] || g.values[v].constant ||
      std::find(g.inputs.begin(), g.inputs.end(), v) != g.inputs.end()) {
    return invalid_argument(std::string(what) + ": output '" + g.values[v].name +
                            "' is already defined");
  }
  return ok_status();
}

void collect_nested_names(const Graph& g, std::set<std::string>* out) {
  for (const Node& n : g.nodes) {
    for (int v : n.inputs) {
      if (v >= 0) out->insert(g.values[v].name);
    }
    for (const auto& [k, a] : n.attrs.all()) {
      if (a.g) collect_nested_names(*a.g, out);
      for (const auto& sg : a.graphs) {
        if (sg) collect_nested_names(*sg, out);
      }
    }
  }
  for (int v : g.outputs) out->insert(g.values[v].name);
}

}  // namespace

int add_unique_value(Graph* g, std::string_view base, DType dtype,
                     std::optional<std::vector<Dim>> shape) {
  std::unordered_set<std::string_view> taken;
  for (const Value& v : g->values) taken.insert(v.name);
  std::string name(base);
  for (int k = 1; taken.count(name); ++k) name = std::string(base) + "_" + std::to_string(k);
  int v = g->add_value(std::move(name));
  g->values[v].dtype = dtype;
  g->values[v].shape = std::move(shape);
  return v;
}

std::string unique_node_name(const Graph& g, std::string_view base) {
  std::unordered_set<std::string_view> taken;
  for (const Node& n : g.nodes) taken.insert(n.name);
  std::string name(base);
  for (int k = 1; taken.count(name); ++k) name = std::string(base) + "_" + std::to_string(k);
  return name;
}

std::string unique_symbol(std::string base, std::set<std::string>* taken) {
  while (taken->count(base)) base += "_";
  taken->insert(base);
  return base;
}

void add_replaced(Node* into, const Node& from) {
  if (from.replaced.empty()) {
    ++into->replaced[from.op_type];
  } else {
    for (const auto& [op, count] : from.replaced) into->replaced[op] += count;
  }
}

StatusOr<int> replace_nodes(Graph* g, std::span<const int> matched, Node replacement) {
  const int nn = int(g->nodes.size());
  if (matched.empty()) return invalid_argument("replace_nodes: no nodes to replace");
  std::vector<char> in_match(size_t(nn), 0);
  int last = -1;
  for (int n : matched) {
    if (n < 0 || n >= nn) return invalid_argument("replace_nodes: node index out of range");
    if (in_match[n])
      return invalid_argument("replace_nodes: node " + std::to_string(n) + " listed twice");
    in_match[n] = 1;
    last = std::max(last, n);
  }
  std::vector<char> by_match(g->values.size(), 0), produced(g->values.size(), 0);
  for (int n = 0; n < nn; ++n) {
    for (int v : g->nodes[n].outputs) {
      if (v < 0) continue;
      produced[v] = 1;
      if (in_match[n]) by_match[v] = 1;
    }
  }
  const std::string what = "replace_nodes (" + replacement.op_type + ")";
  for (int v : replacement.inputs) {
    if (v < -1 || v >= int(g->values.size()))
      return invalid_argument(what + ": input index out of range");
    if (v >= 0 && by_match[v]) {
      return invalid_argument(what + ": input '" + g->values[v].name +
                              "' is produced by a node being replaced");
    }
  }
  std::vector<char> kept(g->values.size(), 0);
  for (int v : replacement.outputs) {
    if (v < 0) continue;
    if (valid_value(*g, v) && by_match[v]) {
      kept[v] = 1;
      continue;
    }
    KILN_RETURN_IF_ERROR(check_fresh(*g, v, produced, what.c_str()));
  }
  // Every value the match produces and something else reads must survive.
  auto require_kept = [&](int v, const std::string& reader) -> Status {
    if (v >= 0 && by_match[v] && !kept[v]) {
      return invalid_argument(what + ": '" + g->values[v].name + "' is read by " + reader +
                              " but is not an output of the replacement");
    }
    return ok_status();
  };
  for (int n = 0; n < nn; ++n) {
    if (in_match[n]) continue;
    for (int v : g->nodes[n].inputs) KILN_RETURN_IF_ERROR(require_kept(v, g->nodes[n].describe()));
    for (const Guard& gd : g->nodes[n].guards)
      KILN_RETURN_IF_ERROR(require_kept(gd.cond, g->nodes[n].describe()));
  }
  for (int v : g->outputs) KILN_RETURN_IF_ERROR(require_kept(v, "a graph output"));
  // The replacement runs under every condition a matched node ran under. That is exact when the
  // nodes that ran under fewer only fed the others; one whose result is also read elsewhere
  // (a value outside an If's branch that the branch fuses with) would then go missing.
  std::vector<Guard> guards;
  for (int n : matched) {
    for (const Guard& gd : g->nodes[size_t(n)].guards) {
      if (std::find(guards.begin(), guards.end(), gd) == guards.end()) guards.push_back(gd);
    }
  }
  for (int n : matched) {
    if (g->nodes[size_t(n)].guards.size() == guards.size()) continue;
    for (int v : g->nodes[size_t(n)].outputs) {
      if (v >= 0 && kept[v]) {
        return invalid_argument(
            what + ": " + g->nodes[size_t(n)].describe() +
            " runs outside a branch the other matched nodes run in, and its output '" +
            g->values[v].name + "' is read elsewhere");
      }
    }
  }
  replacement.guards = std::move(guards);

  Snapshot before(*g);
  fill_defaults(*g, &replacement);
  for (int n : matched) add_replaced(&replacement, g->nodes[size_t(n)]);
  const std::string name = replacement.name;
  const std::vector<int> outs = replacement.outputs;
  std::vector<Node> next;
  next.reserve(size_t(nn) - matched.size() + 1);
  for (int n = 0; n < nn; ++n) {
    if (!in_match[n]) next.push_back(std::move(g->nodes[n]));
    if (n == last) next.push_back(std::move(replacement));  // NOLINT(bugprone-use-after-move): once
  }
  g->nodes = std::move(next);
  KILN_RETURN_IF_ERROR(settle(g, std::move(before)));
  return find_node(*g, name, outs);
}

StatusOr<int> insert_on_edge(Graph* g, int value, Node node, std::span<const int> consumers) {
  const std::string what = "insert_on_edge (" + node.op_type + ")";
  if (!valid_value(*g, value)) return invalid_argument(what + ": value index out of range");
  if (node.outputs.size() != 1) return invalid_argument(what + ": the node must have one output");
  if (std::find(node.inputs.begin(), node.inputs.end(), value) == node.inputs.end()) {
    return invalid_argument(what + ": the node does not read '" + g->values[value].name + "'");
  }
  std::vector<char> produced(g->values.size(), 0);
  for (const Node& n : g->nodes) {
    for (int v : n.outputs) {
      if (v >= 0) produced[v] = 1;
    }
  }
  const int out = node.outputs[0];
  KILN_RETURN_IF_ERROR(check_fresh(*g, out, produced, what.c_str()));
  for (int v : node.inputs) {
    if (v < -1 || v >= int(g->values.size()) || v == out) {
      return invalid_argument(what + ": bad input index");
    }
  }
  std::vector<int> targets(consumers.begin(), consumers.end());
  if (targets.empty()) {
    for (size_t n = 0; n < g->nodes.size(); ++n) {
      const auto& ins = g->nodes[n].inputs;
      if (std::find(ins.begin(), ins.end(), value) != ins.end()) targets.push_back(int(n));
    }
    if (targets.empty()) {
      return invalid_argument(what + ": no node reads '" + g->values[value].name +
                              "' (a graph output keeps its value; insert before its producer)");
    }
  }
  int first = int(g->nodes.size());
  for (int n : targets) {
    if (n < 0 || n >= int(g->nodes.size()))
      return invalid_argument(what + ": consumer index out of range");
    const auto& ins = g->nodes[n].inputs;
    if (std::find(ins.begin(), ins.end(), value) == ins.end()) {
      return invalid_argument(what + ": " + g->nodes[n].describe() + " does not read '" +
                              g->values[value].name + "'");
    }
    first = std::min(first, n);
  }

  // The new node runs where the value exists and is read: under its producer's conditions, or
  // under those of its readers where they all share them.
  const int producer = g->values[size_t(value)].producer;
  if (producer >= 0 && !g->nodes[size_t(producer)].guards.empty()) {
    node.guards = g->nodes[size_t(producer)].guards;
  } else {
    node.guards = g->nodes[size_t(targets[0])].guards;
    for (int n : targets) {
      if (g->nodes[size_t(n)].guards != node.guards) node.guards.clear();
    }
  }
  Snapshot before(*g);
  fill_defaults(*g, &node);
  const std::string name = node.name;
  const std::vector<int> outs = node.outputs;
  for (int n : targets) {
    for (int& v : g->nodes[n].inputs) {
      if (v == value) v = out;
    }
  }
  g->nodes.insert(g->nodes.begin() + first, std::move(node));
  KILN_RETURN_IF_ERROR(settle(g, std::move(before)));
  return find_node(*g, name, outs);
}

namespace {

// Inserts `op_type` with one attribute on the edge from `value` to `consumers`, writing a new value
// named after `base`; the new value is removed again when the insertion fails.
StatusOr<int> insert_unary(Graph* g, int value, const char* op_type, const std::string& base,
                           DType dtype, std::optional<std::vector<Dim>> shape,
                           const char* attr_name, Attribute attr, std::span<const int> consumers) {
  const size_t num_values = g->values.size();
  int out = add_unique_value(g, base, dtype, std::move(shape));
  Node node;
  node.op_type = op_type;
  node.name = unique_node_name(*g, g->values[out].name);
  node.inputs = {value};
  node.outputs = {out};
  node.attrs.set(attr_name, std::move(attr));
  auto n = insert_on_edge(g, value, std::move(node), consumers);
  if (!n.ok()) g->values.resize(num_values);
  return n;
}

}  // namespace

StatusOr<int> insert_cast(Graph* g, int value, DType to, std::span<const int> consumers) {
  if (!valid_value(*g, value)) return invalid_argument("insert_cast: value index out of range");
  Attribute a;
  a.type = AttrType::kInt;
  a.i = int64_t(to);  // DType numbers are ONNX's TensorProto codes
  return insert_unary(g, value, "Cast", g->values[value].name + "_" + std::string(dtype_name(to)),
                      to, g->values[value].shape, "to", std::move(a), consumers);
}

StatusOr<int> insert_layout_transform(Graph* g, int value, std::vector<int64_t> perm,
                                      std::span<const int> consumers) {
  if (!valid_value(*g, value))
    return invalid_argument("insert_layout_transform: value index out of range");
  std::vector<char> seen(perm.size(), 0);
  for (int64_t p : perm) {
    if (p < 0 || p >= int64_t(perm.size()) || seen[size_t(p)]) {
      return invalid_argument("insert_layout_transform: perm is not a permutation");
    }
    seen[size_t(p)] = 1;
  }
  const auto& shape = g->values[value].shape;
  std::optional<std::vector<Dim>> out_shape;
  if (shape) {
    if (shape->size() != perm.size()) {
      return invalid_argument("insert_layout_transform: perm has " + std::to_string(perm.size()) +
                              " axes but '" + g->values[value].name + "' has rank " +
                              std::to_string(shape->size()));
    }
    out_shape.emplace();
    for (int64_t p : perm) out_shape->push_back((*shape)[size_t(p)]);
  }
  Attribute a;
  a.type = AttrType::kInts;
  a.ints = std::move(perm);
  return insert_unary(g, value, "Transpose", g->values[value].name + "_layout",
                      g->values[value].dtype, std::move(out_shape), "perm", std::move(a),
                      consumers);
}

Status replace_all_uses(Graph* g, int from, int to, bool include_graph_outputs) {
  if (!valid_value(*g, from) || !valid_value(*g, to)) {
    return invalid_argument("replace_all_uses: value index out of range");
  }
  if (from == to) return ok_status();
  DType a = g->values[from].dtype, b = g->values[to].dtype;
  if (a != DType::kUndefined && b != DType::kUndefined && a != b) {
    return invalid_argument("replace_all_uses: '" + g->values[from].name + "' is " +
                            std::string(dtype_name(a)) + " but '" + g->values[to].name + "' is " +
                            std::string(dtype_name(b)));
  }
  Snapshot before(*g);
  for (Node& n : g->nodes) {
    for (int& v : n.inputs) {
      if (v == from) v = to;
    }
    for (Guard& gd : n.guards) {
      if (gd.cond == from) gd.cond = to;
    }
  }
  if (include_graph_outputs) {
    for (int& v : g->outputs) {
      if (v == from) v = to;
    }
  }
  return settle(g, std::move(before));
}

int remove_dead_nodes(Graph* g) {
  std::vector<char> read(g->values.size(), 0);
  for (int v : g->outputs) read[v] = 1;
  std::unordered_map<std::string_view, int> by_name;  // for values nested graphs read by name
  for (size_t v = 0; v < g->values.size(); ++v) by_name.emplace(g->values[v].name, int(v));
  std::vector<char> keep(g->nodes.size(), 0);
  // Nodes are sorted: a node's readers come after it, so one backward sweep finds every live one.
  for (size_t n = g->nodes.size(); n-- > 0;) {
    const Node& node = g->nodes[n];
    for (int v : node.outputs) {
      if (v >= 0 && read[v]) keep[n] = 1;
    }
    if (!keep[n]) continue;
    for (int v : node.inputs) {
      if (v >= 0) read[v] = 1;
    }
    for (const Guard& gd : node.guards) read[gd.cond] = 1;
    std::set<std::string> nested;
    for (const auto& [k, a] : node.attrs.all()) {
      if (a.g) collect_nested_names(*a.g, &nested);
      for (const auto& sg : a.graphs) {
        if (sg) collect_nested_names(*sg, &nested);
      }
    }
    for (const std::string& name : nested) {
      auto it = by_name.find(name);
      if (it != by_name.end()) read[it->second] = 1;
    }
  }
  std::vector<Node> next;
  for (size_t n = 0; n < g->nodes.size(); ++n) {
    if (keep[n]) next.push_back(std::move(g->nodes[n]));
  }
  const int removed = int(g->nodes.size() - next.size());
  g->nodes = std::move(next);
  set_producers(g);
  return removed;
}

std::vector<int> compact(Graph* g) {
  std::vector<char> live(g->values.size(), 0);
  std::set<std::string> nested;
  for (int v : g->inputs) live[v] = 1;
  for (int v : g->outputs) live[v] = 1;
  for (const Node& n : g->nodes) {
    for (int v : n.inputs) {
      if (v >= 0) live[v] = 1;
    }
    for (int v : n.outputs) {
      if (v >= 0) live[v] = 1;
    }
    for (const Guard& gd : n.guards) live[gd.cond] = 1;
    for (const auto& [k, a] : n.attrs.all()) {
      if (a.g) collect_nested_names(*a.g, &nested);
      for (const auto& sg : a.graphs) {
        if (sg) collect_nested_names(*sg, &nested);
      }
    }
  }
  std::vector<int> map(g->values.size(), -1);
  std::vector<Value> kept;
  for (size_t v = 0; v < g->values.size(); ++v) {
    if (!live[v] && !nested.count(g->values[v].name)) continue;
    map[v] = int(kept.size());
    kept.push_back(std::move(g->values[v]));
  }
  g->values = std::move(kept);
  auto remap = [&](std::vector<int>& xs) {
    for (int& v : xs) {
      if (v >= 0) v = map[v];
    }
  };
  remap(g->inputs);
  remap(g->outputs);
  for (Node& n : g->nodes) {
    remap(n.inputs);
    remap(n.outputs);
    for (Guard& gd : n.guards) gd.cond = map[gd.cond];
  }
  return map;
}

}  // namespace kiln::ir
