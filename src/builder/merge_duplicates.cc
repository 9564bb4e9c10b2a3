// Pass merge_duplicates: nodes that compute the same thing (same op, domain, opset, attributes and
// input values) run once; the readers of a duplicate's outputs read the first node's. Exporters
// repeat work per layer: transformers' BERT recomputes its attention mask (Where on the expanded
// padding mask, then a Cast under --fp16) in each of its 12 layers. Left alone: ops with random
// or otherwise non-repeatable results, nodes with tensor or graph attributes (subgraphs, and
// constants, which folding has taken already), and duplicates whose outputs are engine outputs
// (their names are the engine's IO). Runs after shape inference and folding; small constant inputs
// compare by content (each layer's copy of the mask's fill values), other inputs by value.
#include <map>
#include <set>
#include <string>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "ir/rewrite.h"
#include "plan/loops.h"

namespace kiln::builder {
namespace {

bool repeatable(const ir::Node& n) {
  static const char* const kRandom[] = {
      "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
      "Bernoulli",    "Multinomial",   "Dropout"};
  if (n.domain.empty()) {
    for (const char* op : kRandom) {
      if (n.op_type == op) return false;
    }
  }
  for (const auto& [name, a] : n.attrs.all()) {
    if (a.type == ir::AttrType::kTensor || a.type == ir::AttrType::kTensors ||
        a.type == ir::AttrType::kGraph || a.type == ir::AttrType::kGraphs) {
      return false;
    }
  }
  const ops::OpKind kind = ops::find_op(n.domain, n.op_type);
  if (kind == ops::OpKind::kLoopBegin || kind == ops::OpKind::kLoopEnd)
    return false;  // a loop of its own
  return !n.outputs.empty();
}

// A small constant's bytes, by which two constants of equal content (exporters write one per
// layer) compare equal; larger values compare by index.
constexpr size_t kMaxKeyedConstantBytes = 256;

// Everything that decides what the node computes, as text.
std::string key_of(const ir::Graph& g, const ir::Node& n, int loop) {
  std::string k =
      std::to_string(loop) + "|" + n.domain + "|" + n.op_type + "|" + std::to_string(n.opset) + "|";
  for (int v : n.inputs) {
    const ir::Value* val = v >= 0 ? &g.values[size_t(v)] : nullptr;
    if (val && val->constant && val->constant->nbytes() <= kMaxKeyedConstantBytes) {
      const Tensor& t = *val->constant;
      k += "c" + std::to_string(int(t.dtype())) + "[";
      for (int64_t d : t.shape()) k += std::to_string(d) + " ";
      k += "]";
      const unsigned char* b = static_cast<const unsigned char*>(t.data());
      for (size_t i = 0; i < t.nbytes(); ++i) {
        static const char kHex[] = "0123456789abcdef";
        k += kHex[b[i] >> 4];
        k += kHex[b[i] & 15];
      }
      k += ",";
    } else {
      k += std::to_string(v) + ",";
    }
  }
  k += "|" + std::to_string(n.outputs.size());
  // Nodes of different If branches (or one in a branch, one outside) are not the same work.
  for (const ir::Guard& gd : n.guards) k += "|g" + std::to_string(gd.cond) + (gd.when ? "t" : "f");
  // A name's length first: names are the model's text, so "|" or "=" in one must not make two
  // attribute sets read alike (attribute_text's values delimit themselves).
  for (const auto& [name, a] : n.attrs.all()) {
    k += "|" + std::to_string(name.size()) + "#" + name + "=" + attribute_text(a);
  }
  return k;
}

bool any_graph_output(const ir::Graph& g, const ir::Node& n) {
  for (int v : n.outputs) {
    if (v >= 0 && is_graph_output(g, v)) return true;
  }
  return false;
}

}  // namespace

Status merge_duplicates(ir::Graph* g, const std::vector<ir::DataDependentDim>& data_dependent) {
  std::map<std::string, int> first;  // key -> node index
  bool any = false;
  // Nodes of a run-time loop are not the same work as nodes outside it (or in another loop): the
  // loop may run no iteration, and its values are rewritten by each.
  KILN_ASSIGN_OR_RETURN(const std::vector<plan::LoopRegion> loops, plan::find_loops(*g));
  const std::vector<int> loop_of = plan::loop_of_nodes(*g, loops);
  for (size_t n = 0; n < g->nodes.size(); ++n) {
    const ir::Node& node = g->nodes[n];
    // A node that makes a data-dependent dim: its readers' shapes name that dim, so another
    // node's output cannot stand in for its own.
    if (!repeatable(node) || ir::makes_data_dependent(*g, node, data_dependent)) continue;
    auto [it, fresh] = first.emplace(key_of(*g, node, loop_of[n]), int(n));
    if (fresh || any_graph_output(*g, node)) continue;
    const ir::Node& kept = g->nodes[size_t(it->second)];
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      if (node.outputs[i] < 0) continue;
      if (kept.outputs[i] < 0) break;  // the kept node leaves that output out: keep both
      KILN_RETURN_IF_ERROR(ir::replace_all_uses(g, node.outputs[i], kept.outputs[i]));
      any = true;
    }
  }
  if (any) ir::remove_dead_nodes(g);
  return ok_status();
}

Status merge_duplicates(BuildState& s) { return merge_duplicates(&s.graph, s.data_dependent); }

}  // namespace kiln::builder
