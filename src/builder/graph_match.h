// Small queries the fusion passes match subgraphs with: who reads a value, whether it is an
// engine output, whether a node is a given ONNX op.
#pragma once

#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "builder/build_state.h"
#include "ir/graph.h"
#include "ir/rewrite.h"

namespace kiln::builder {

// The nodes reading `value`, each once, in node order.
inline std::vector<int> readers_of(const ir::Graph& g, int value) {
  std::vector<int> out;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    for (int v : g.nodes[n].inputs) {
      if (v == value) {
        out.push_back(int(n));
        break;
      }
    }
  }
  return out;
}

inline bool is_graph_output(const ir::Graph& g, int v) {
  for (int o : g.outputs) {
    if (o == v) return true;
  }
  return false;
}

// The one node reading `v`, when exactly one does and `v` is no engine output; else -1.
inline int sole_reader(const ir::Graph& g, int v) {
  if (is_graph_output(g, v)) return -1;
  std::vector<int> r = readers_of(g, v);
  return r.size() == 1 ? r[0] : -1;
}

inline bool is_onnx(const ir::Node& n, const char* op) {
  return n.domain.empty() && n.op_type == op;
}

// The producer of v when it is the ONNX op `op` with one output, read by nothing but `reader`; else
// -1.
inline int producer_of(const ir::Graph& g, int v, const char* op, int reader) {
  if (v < 0 || sole_reader(g, v) != reader) return -1;
  const int p = g.values[size_t(v)].producer;
  if (p < 0 || !is_onnx(g.nodes[size_t(p)], op) || g.nodes[size_t(p)].outputs.size() != 1)
    return -1;
  return p;
}

// The one reader of v when it is the ONNX op `op` with one output; else -1.
inline int reader_of(const ir::Graph& g, int v, const char* op) {
  const int r = sole_reader(g, v);
  if (r < 0 || !is_onnx(g.nodes[size_t(r)], op) || g.nodes[size_t(r)].outputs.size() != 1)
    return -1;
  return r;
}

// The operand of binary node n other than `x`, or -1.
inline int other_of(const ir::Node& n, int x) {
  if (n.inputs.size() != 2) return -1;
  return n.inputs[0] == x ? n.inputs[1] : n.inputs[1] == x ? n.inputs[0] : -1;
}

// Input i of n when it is a constant of one element, as a float.
inline std::optional<float> scalar_constant(const ir::Graph& g, const ir::Node& n, size_t i) {
  if (i >= n.inputs.size() || n.inputs[i] < 0) return std::nullopt;
  const ir::Value& v = g.values[size_t(n.inputs[i])];
  if (!v.constant || v.constant->numel() != 1) return std::nullopt;
  return float(v.constant->float_at(0));
}

// The scalar constant operand of binary node n other than input `x`, when there is one.
inline std::optional<float> other_constant(const ir::Graph& g, const ir::Node& n, int x) {
  if (n.inputs.size() != 2) return std::nullopt;
  if (n.inputs[0] == x) return scalar_constant(g, n, 1);
  if (n.inputs[1] == x) return scalar_constant(g, n, 0);
  return std::nullopt;
}

// The int64 elements of constant integer input i of n; nullopt when absent or not such a constant.
inline std::optional<std::vector<int64_t>> ints_of(const ir::Graph& g, const ir::Node& n,
                                                   size_t i) {
  if (i >= n.inputs.size() || n.inputs[i] < 0) return std::nullopt;
  const ir::Value& v = g.values[size_t(n.inputs[i])];
  if (!v.constant || !is_integer(v.constant->dtype())) return std::nullopt;
  std::vector<int64_t> out;
  for (int64_t k = 0; k < v.constant->numel(); ++k) out.push_back(v.constant->int_at(k));
  return out;
}

// A Transpose's permutation (ONNX's default reverses the axes); nullopt when unreadable or not of
// its input's rank.
inline std::optional<std::vector<int64_t>> perm_of(const ir::Graph& g, const ir::Node& t) {
  if (t.inputs.empty() || t.inputs[0] < 0) return std::nullopt;
  const auto& shape = g.values[size_t(t.inputs[0])].shape;
  if (!shape) return std::nullopt;
  std::vector<int64_t> reversed;
  for (size_t k = shape->size(); k-- > 0;) reversed.push_back(int64_t(k));
  auto perm = t.attrs.get_ints("perm", reversed);
  if (!perm.ok() || perm->size() != shape->size()) return std::nullopt;
  return *perm;
}

// Whether the permutation keeps every axis in place.
inline bool is_identity_perm(const std::vector<int64_t>& p) {
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != int64_t(i)) return false;
  }
  return true;
}

// The readers of v that run: not those whose every output is known without running them (shape
// arithmetic the builder folded, as the exporters' Shape-Gather-Concat chains: they read only v's
// shape, and eliminate_dead_nodes drops them).
inline std::vector<int> running_readers(const ir::Graph& g, int v) {
  std::vector<int> out;
  for (int r : readers_of(g, v)) {
    const ir::Node& n = g.nodes[size_t(r)];
    bool folded = !n.outputs.empty();
    for (int o : n.outputs) {
      folded = folded && o >= 0 && (g.values[size_t(o)].constant || g.values[size_t(o)].sym_value);
    }
    if (!folded) out.push_back(r);
  }
  return out;
}

// A new constant value holding `t`, named from `base` (made unique).
inline int add_constant(ir::Graph* g, const std::string& base, Tensor t) {
  std::vector<ir::Dim> shape;
  for (int64_t d : t.shape()) shape.push_back(ir::Dim(d));
  const int v = ir::add_unique_value(g, base, t.dtype(), std::move(shape));
  g->values[size_t(v)].constant = std::move(t);
  return v;
}

// The 2-D constant `w` transposed (any element size), or nullopt.
inline std::optional<Tensor> transposed_2d(const Tensor& w) {
  if (w.shape().size() != 2) return std::nullopt;
  const int64_t r = w.shape()[0], c = w.shape()[1];
  auto t = Tensor::zeros(w.dtype(), {c, r});
  if (!t.ok()) return std::nullopt;
  const size_t es = dtype_size(w.dtype());
  const auto* src = static_cast<const unsigned char*>(w.data());
  auto* dst = static_cast<unsigned char*>(t->data());
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t j = 0; j < c; ++j)
      std::memcpy(dst + size_t(j * r + i) * es, src + size_t(i * c + j) * es, es);
  }
  return std::move(*t);
}

// Attributes of the nodes the passes make.
inline void set_int(ir::Node* n, const char* name, int64_t v) {
  ir::Attribute a;
  a.type = ir::AttrType::kInt;
  a.i = v;
  n->attrs.set(name, std::move(a));
}
inline void set_float(ir::Node* n, const char* name, float v) {
  ir::Attribute a;
  a.type = ir::AttrType::kFloat;
  a.f = v;
  n->attrs.set(name, std::move(a));
}
inline void set_ints(ir::Node* n, const char* name, std::vector<int64_t> ints) {
  ir::Attribute a;
  a.type = ir::AttrType::kInts;
  a.ints = std::move(ints);
  n->attrs.set(name, std::move(a));
}
inline void set_floats(ir::Node* n, const char* name, std::vector<float> floats) {
  ir::Attribute a;
  a.type = ir::AttrType::kFloats;
  a.floats = std::move(floats);
  n->attrs.set(name, std::move(a));
}
// A string attribute with its default; a malformed one reads as "?", a value no match takes.
inline std::string str_attr(const ir::Node& n, const char* name, const char* dflt) {
  auto r = n.attrs.get_string(name, dflt);
  return r.ok() ? *r : std::string("?");
}

inline void set_string(ir::Node* n, const char* name, std::string s) {
  ir::Attribute a;
  a.type = ir::AttrType::kString;
  a.s = std::move(s);
  n->attrs.set(name, std::move(a));
}

// The fusion passes' last step: when the backend supports `fused` (a kiln op, typed by the values
// it reads and writes), it replaces the nodes `matched`; false, and the graph as it was, when the
// backend has no kernel for it or the replacement would make a cycle (an input computed from a
// matched node).
// Whether the backend has a kernel for node n, typed by the values of g it reads and writes (the
// node need not be in g yet; its values must be).
inline bool node_supported(const ir::Graph& g, const ir::Node& n, const SupportsFn& supports) {
  std::vector<const ir::Value*> in, out;
  for (int v : n.inputs) in.push_back(v >= 0 ? &g.values[size_t(v)] : nullptr);
  for (int v : n.outputs) out.push_back(v >= 0 ? &g.values[size_t(v)] : nullptr);
  return supports(n, in, out);
}

inline bool replace_if_supported(ir::Graph* g, const std::vector<int>& matched, ir::Node fused,
                                 const SupportsFn& supports) {
  if (!node_supported(*g, fused, supports)) return false;
  if (!ir::replace_nodes(g, matched, std::move(fused)).ok()) return false;
  g->opsets.emplace("kiln", 1);
  return true;
}

// Tries `fuse_at(n)` (a StatusOr<bool>: whether it fused) with every node n as the anchor. A match
// takes nodes before its anchor, so the nodes after it move up past n: after each fusion the walk
// starts over (the anchors are few, and a failed match ends at its first check).
template <typename F>
Status fuse_at_every_node(ir::Graph* g, F&& fuse_at) {
  for (size_t n = 0; n < g->nodes.size();) {
    KILN_ASSIGN_OR_RETURN(bool fused, fuse_at(int(n)));
    n = fused ? 0 : n + 1;
  }
  return ok_status();
}

}  // namespace kiln::builder
