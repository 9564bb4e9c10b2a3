// Pass gather_views: a chain of data-movement ops (Transpose, Concat, Slice, Gather by constant
// indices, Reshape, Squeeze, Unsqueeze, Flatten) from one tensor that copies the data more than
// once becomes one Gather of rows (a rule on the rewriter, rooted at the chain's last node). Swin
// is the case. torch.roll is two Slice/Slice/Concat steps and the window partition a
// Reshape/Transpose/Reshape, so each shifted block copied its [B, H, W, C] activation seven times
// on the way into attention and seven on the way out (every Slice and Concat is a copy; the
// Concats ran at about 1.3 TB/s on an H200, 30 us each at batch 32 in stage 1). Each patch
// merging's four strided slices and channel Concat copied seven times too (118 us in stage 1),
// and each shifted window attention split its packed Q, K and V with a Transpose of the whole
// projection and three Gathers (the Transpose 44 us in stage 1): now three Gathers alone.
// Whatever the chain, it moves whole rows of the source's last dim (or of a divisor of it) to
// fixed places, the same in every batch row: so the pass runs the chain once at build time on the
// positions of one batch row (and of two, to check that the second row's positions are the
// first's plus one row), reads off which source row each output row comes from, and writes
//   Reshape(Gather(Reshape(x, [batch, N/R, R]), rows, axis=1), the chain's output shape)
// where the two Reshapes are views: one copy. Left as they are: a chain with at most one copy
// (Transpose, Concat or Slice: no work saved), one whose inner values other nodes read, one whose
// source has a symbolic dim other than its first (a multiple of the batch), and one whose rows
// would be under 8 elements (an element-wise gather).
#include <algorithm>
#include <iterator>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "builder/rewriter.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

using ir::Dim;

// A Gather by constant indices (the split of a packed Q, K and V) moves data as the others do.
constexpr const char* kMovementOps[] = {"Transpose", "Concat",  "Slice",     "Gather",
                                        "Reshape",   "Squeeze", "Unsqueeze", "Flatten"};

bool is_movement(const ir::Graph& g, const ir::Node& n) {
  if (!n.domain.empty()) return false;
  if (n.op_type == "Gather") {
    return n.inputs.size() == 2 && n.inputs[1] >= 0 && g.values[size_t(n.inputs[1])].constant &&
           is_integer(g.values[size_t(n.inputs[1])].dtype);
  }
  return std::find(std::begin(kMovementOps), std::end(kMovementOps), n.op_type) !=
         std::end(kMovementOps);
}

// The inputs of a movement node that carry data (the others are parameters: shapes, axes, starts).
std::vector<int> data_inputs(const ir::Node& n) {
  if (n.op_type == "Concat") return n.inputs;
  return {n.inputs.empty() ? -1 : n.inputs[0]};
}

// The most elements a chain's tensors may have at the batch the pass runs it at (2): 32 MB of
// positions each, a few alive at once (Swin-T's largest, stage 1 at batch 2, has 602,112; Swin-L's
// 1,204,224; a 384-pixel Swin-B's 2,359,296).
constexpr int64_t kMaxPositions = int64_t(1) << 22;

// A tensor of positions (int64) with concrete dims.
struct Positions {
  std::vector<int64_t> dims;
  std::vector<int64_t> at;
};

// The elements of `dims`, or -1 past kMaxPositions (no overflow on the way).
int64_t bounded_numel(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0 || (d > 0 && n > kMaxPositions / d)) return -1;
    n *= d;
  }
  return n;
}

std::vector<int64_t> strides_of(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) s[i - 1] = s[i] * dims[i];
  return s;
}

// Node n run on positions: `in` are its data inputs', `out_dims` its output's dims. nullopt for a
// form this evaluator does not take (the pass then leaves the chain alone).
std::optional<Positions> run(const ir::Graph& g, const ir::Node& n,
                             const std::vector<const Positions*>& in,
                             const std::vector<int64_t>& out_dims) {
  const Positions& x = *in[0];
  const int64_t numel = bounded_numel(out_dims);
  if (numel < 0) return std::nullopt;
  Positions y{out_dims, std::vector<int64_t>(size_t(numel))};
  const int rank = int(out_dims.size());
  if (n.op_type == "Reshape" || n.op_type == "Squeeze" || n.op_type == "Unsqueeze" ||
      n.op_type == "Flatten") {
    if (int64_t(x.at.size()) != numel) return std::nullopt;
    y.at = x.at;
    return y;
  }
  const std::vector<int64_t> os = strides_of(out_dims);
  if (n.op_type == "Transpose") {
    auto perm = perm_of(g, n);
    if (!perm || int(perm->size()) != rank || int(x.dims.size()) != rank) return std::nullopt;
    const std::vector<int64_t> is = strides_of(x.dims);
    for (int64_t e = 0; e < numel; ++e) {
      int64_t src = 0, rest = e;
      for (int a = 0; a < rank; ++a) {
        src += (rest / os[size_t(a)]) * is[size_t((*perm)[size_t(a)])];
        rest %= os[size_t(a)];
      }
      y.at[size_t(e)] = x.at[size_t(src)];
    }
    return y;
  }
  if (n.op_type == "Slice") {
    auto starts = ints_of(g, n, 1), axes = ints_of(g, n, 3), steps = ints_of(g, n, 4);
    if (!starts || int(x.dims.size()) != rank ||
        (n.inputs.size() > 3 && n.inputs[3] >= 0 && !axes) ||
        (n.inputs.size() > 4 && n.inputs[4] >= 0 && !steps)) {
      return std::nullopt;
    }
    std::vector<int64_t> first(size_t(rank), 0), step(size_t(rank), 1);
    for (size_t i = 0; i < starts->size(); ++i) {
      int64_t a = axes ? (*axes)[i] : int64_t(i);
      if (a < 0) a += rank;
      if (a < 0 || a >= rank) return std::nullopt;
      const int64_t d = x.dims[size_t(a)], st = steps ? (*steps)[i] : 1;
      if (st == 0) return std::nullopt;
      int64_t s = (*starts)[i];
      if (s < 0) s += d;
      s = st > 0 ? std::clamp<int64_t>(s, 0, d) : std::clamp<int64_t>(s, 0, d - 1);
      first[size_t(a)] = s, step[size_t(a)] = st;
    }
    const std::vector<int64_t> is = strides_of(x.dims);
    for (int64_t e = 0; e < numel; ++e) {
      int64_t src = 0, rest = e;
      for (int a = 0; a < rank; ++a) {
        const int64_t o = rest / os[size_t(a)];
        rest %= os[size_t(a)];
        const int64_t p = first[size_t(a)] + o * step[size_t(a)];
        if (p < 0 || p >= x.dims[size_t(a)]) return std::nullopt;
        src += p * is[size_t(a)];
      }
      y.at[size_t(e)] = x.at[size_t(src)];
    }
    return y;
  }
  if (n.op_type == "Gather") {
    auto idx = ints_of(g, n, 1);
    auto axis = n.attrs.get_int("axis", 0);
    const int xr = int(x.dims.size());
    if (!idx || !axis.ok() || xr < 1) return std::nullopt;
    const int64_t a = *axis < 0 ? *axis + xr : *axis;
    if (a < 0 || a >= xr) return std::nullopt;
    const int64_t d = x.dims[size_t(a)], k = int64_t(idx->size());
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < a; ++i) outer *= x.dims[size_t(i)];
    for (int64_t i = a + 1; i < xr; ++i) inner *= x.dims[size_t(i)];
    if (outer * k * inner != numel) return std::nullopt;
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t j = 0; j < k; ++j) {
        int64_t r = (*idx)[size_t(j)];
        if (r < 0) r += d;
        if (r < 0 || r >= d) return std::nullopt;
        for (int64_t i = 0; i < inner; ++i)
          y.at[size_t((o * k + j) * inner + i)] = x.at[size_t((o * d + r) * inner + i)];
      }
    }
    return y;
  }
  if (n.op_type == "Concat") {
    auto axis = n.attrs.get_int("axis", 0);
    if (!axis.ok()) return std::nullopt;
    const int64_t a = *axis < 0 ? *axis + rank : *axis;
    if (a < 0 || a >= rank) return std::nullopt;
    // Output index e: outer (before the axis), position along it, inner.
    const int64_t inner = os[size_t(a)], outer = numel / (inner * out_dims[size_t(a)]);
    int64_t offset = 0;
    for (const Positions* p : in) {
      if (int(p->dims.size()) != rank) return std::nullopt;
      const int64_t len = p->dims[size_t(a)];
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t k = 0; k < len; ++k) {
          for (int64_t i = 0; i < inner; ++i) {
            y.at[size_t((o * out_dims[size_t(a)] + offset + k) * inner + i)] =
                p->at[size_t((o * len + k) * inner + i)];
          }
        }
      }
      offset += len;
    }
    if (offset != out_dims[size_t(a)]) return std::nullopt;
    return y;
  }
  return std::nullopt;
}

// A maximal chain ending at node `root`: its nodes in graph order, its one source value, and the
// nodes the rewrite removes. An inner value that other movement ops read too (the Transpose of a
// packed Q, K and V that three Gathers split) stays in the chain but is kept, with what makes it,
// for those other chains: each becomes a Gather from the source of its own, and the shared nodes
// die with the last of them.
struct Chain {
  std::vector<int> nodes;
  std::vector<int> removed;
  int source = -1;
};

std::optional<Chain> chain_at(const ir::Graph& g, const rw::Uses& uses, int root) {
  std::set<int> stop;  // values taken as the chain's edge: read outside it by other ops
  for (int attempt = 0; attempt < 16; ++attempt) {
    std::set<int> nodes, leaves;
    std::vector<int> todo = {root};
    while (!todo.empty()) {
      const int n = todo.back();
      todo.pop_back();
      if (!g.nodes[size_t(n)].guards.empty()) return std::nullopt;  // runs under an If's branch
      if (!nodes.insert(n).second) continue;
      for (int v : data_inputs(g.nodes[size_t(n)])) {
        if (v < 0) return std::nullopt;
        const int p = g.values[size_t(v)].producer;
        if (stop.count(v) || p < 0 || !is_movement(g, g.nodes[size_t(p)]) || uses.is_output(v)) {
          leaves.insert(v);
        } else {
          todo.push_back(p);
        }
      }
    }
    // An inner value read outside the chain by anything but a movement op stays computed: the
    // chain starts there.
    bool again = false;
    std::set<int> kept;
    for (int n : nodes) {
      if (n == root) continue;
      const int v = g.nodes[size_t(n)].outputs[0];
      for (int r : uses.readers(v)) {
        if (nodes.count(r)) continue;
        if (is_movement(g, g.nodes[size_t(r)])) {
          kept.insert(n);
        } else {
          stop.insert(v);
          again = true;
        }
      }
    }
    if (again) continue;
    if (leaves.size() != 1) return std::nullopt;
    // What a kept node reads is kept too (graph order: producers first, so walk it backwards).
    for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
      if (!kept.count(*it)) continue;
      for (int v : data_inputs(g.nodes[size_t(*it)])) {
        const int p = g.values[size_t(v)].producer;
        if (p >= 0 && nodes.count(p)) kept.insert(p);
      }
    }
    Chain c;
    c.nodes.assign(nodes.begin(), nodes.end());
    for (int n : c.nodes) {
      if (!kept.count(n)) c.removed.push_back(n);
    }
    c.source = *leaves.begin();
    return c;
  }
  return std::nullopt;
}

int copies(const ir::Graph& g, const Chain& c) {
  int k = 0;
  for (int n : c.nodes) {
    const std::string& op = g.nodes[size_t(n)].op_type;
    k += op == "Transpose" || op == "Concat" || op == "Slice" || op == "Gather";
  }
  return k;
}

// The dims of value v with `sym` bound to b (nullopt if another symbol remains).
std::optional<std::vector<int64_t>> dims_at(const ir::Graph& g, int v, const std::string& sym,
                                            int64_t b) {
  const auto& shape = g.values[size_t(v)].shape;
  if (!shape) return std::nullopt;
  ir::SymbolValues values;
  if (!sym.empty()) values[sym] = b;
  std::vector<int64_t> out;
  for (const Dim& d : *shape) {
    auto e = d.eval(values);
    if (!e || *e < 0) return std::nullopt;
    out.push_back(*e);
  }
  return out;
}

// The chain run on the positions of a source with `sym` = b: the output's positions.
std::optional<Positions> evaluate(const ir::Graph& g, const Chain& c, const std::string& sym,
                                  int64_t b) {
  std::map<int, Positions> at;
  auto src_dims = dims_at(g, c.source, sym, b);
  if (!src_dims) return std::nullopt;
  Positions src{*src_dims, {}};
  const int64_t n = bounded_numel(*src_dims);
  if (n < 0) return std::nullopt;
  src.at.resize(size_t(n));
  std::iota(src.at.begin(), src.at.end(), int64_t(0));
  at[c.source] = std::move(src);
  // Reads left of each value, so a value's positions are dropped after its last reader ran.
  std::map<int, int> reads;
  for (int idx : c.nodes) {
    for (int v : data_inputs(g.nodes[size_t(idx)])) ++reads[v];
  }
  for (int idx : c.nodes) {  // graph order is topological
    const ir::Node& node = g.nodes[size_t(idx)];
    std::vector<const Positions*> in;
    for (int v : data_inputs(node)) {
      auto it = at.find(v);
      if (it == at.end()) return std::nullopt;
      in.push_back(&it->second);
    }
    auto dims = dims_at(g, node.outputs[0], sym, b);
    if (!dims) return std::nullopt;
    auto y = run(g, node, in, *dims);
    if (!y) return std::nullopt;
    for (int v : data_inputs(node)) {
      if (--reads[v] == 0) at.erase(v);
    }
    at[node.outputs[0]] = std::move(*y);
  }
  return at[g.nodes[size_t(c.nodes.back())].outputs[0]];
}

StatusOr<bool> rewrite(ir::Graph* g, const rw::Uses& uses, const SupportsFn& supports, int root) {
  auto chain = chain_at(*g, uses, root);
  if (!chain || copies(*g, *chain) < 2) return false;
  const ir::Value& x = g->values[size_t(chain->source)];
  const int y = g->nodes[size_t(root)].outputs[0];
  if (!x.shape || x.shape->size() < 2 || !g->values[size_t(y)].shape) return false;
  // The source's first dim may be a multiple of a symbol (the batch); every other dim is a number.
  std::string sym;
  const Dim& d0 = (*x.shape)[0];
  if (!d0.is_const()) {
    // c * batch: one batch row of the chain is c source rows (Swin's windows: 64 * batch).
    int64_t coeff = 0, offset = 0;
    if (!d0.as_linear(&sym, &coeff, &offset) || coeff < 1 || offset != 0) return false;
  }
  for (size_t i = 1; i < x.shape->size(); ++i) {
    if (!(*x.shape)[i].is_const()) return false;
  }
  auto one = evaluate(*g, *chain, sym, 1);
  if (!one || one->at.empty()) return false;
  auto x1 = dims_at(*g, chain->source, sym, 1);
  const int64_t per_in = std::accumulate(x1->begin(), x1->end(), int64_t(1), std::multiplies<>());
  const int64_t per_out = int64_t(one->at.size());
  if (!sym.empty()) {
    // Batch row 2 moves as row 1 does, one batch row of the source further on.
    auto two = evaluate(*g, *chain, sym, 2);
    if (!two || int64_t(two->at.size()) != 2 * per_out) return false;
    for (int64_t e = 0; e < per_out; ++e) {
      if (two->at[size_t(e)] != one->at[size_t(e)] ||
          two->at[size_t(per_out + e)] != one->at[size_t(e)] + per_in) {
        return false;
      }
    }
  }
  // The longest rows (a divisor of the source's last dim) that move whole.
  const int64_t last = x1->back();
  int64_t rows = 0;
  for (int64_t r = last; r >= 8; --r) {
    if (last % r || per_out % r || per_in % r) continue;
    bool whole = true;
    for (int64_t k = 0; k < per_out && whole; k += r) {
      whole = one->at[size_t(k)] % r == 0;
      for (int64_t i = 1; i < r && whole; ++i)
        whole = one->at[size_t(k + i)] == one->at[size_t(k)] + i;
    }
    if (whole) {
      rows = r;
      break;
    }
  }
  if (rows == 0) return false;
  // The output's shape for the last Reshape: numbers, and -1 for its one symbolic dim.
  std::vector<int64_t> target;
  int symbolic = 0;
  for (const Dim& d : *g->values[size_t(y)].shape) {
    if (d.is_const() && d.value() <= 0) return false;  // a 0 would copy the Gather's dim
    target.push_back(d.is_const() ? d.value() : -1);
    symbolic += !d.is_const();
  }
  if (symbolic > 1 || (symbolic == 1 && sym.empty())) return false;
  std::vector<int64_t> table;
  for (int64_t k = 0; k < per_out; k += rows) table.push_back(one->at[size_t(k)] / rows);
  const int64_t nin = per_in / rows, nout = per_out / rows;
  // Copies: the values below are added to g->values, which may move it.
  const std::string base = g->values[size_t(y)].name, xname = x.name;
  const DType xtype = x.dtype, ytype = g->values[size_t(y)].dtype;
  const Dim batch = sym.empty() ? Dim(1) : Dim::symbol(sym);
  const int view_shape = add_constant(
      g, base + "_rows_shape", Tensor::from_vector<int64_t>(DType::kInt64, {3}, {-1, nin, rows}));
  const int index =
      add_constant(g, base + "_rows", Tensor::from_vector<int64_t>(DType::kInt64, {nout}, table));
  const int out_shape =
      add_constant(g, base + "_shape",
                   Tensor::from_vector<int64_t>(DType::kInt64, {int64_t(target.size())}, target));
  const int xv =
      ir::add_unique_value(g, xname + "_rows", xtype, std::vector<Dim>{batch, Dim(nin), Dim(rows)});
  const int gv = ir::add_unique_value(g, base + "_gathered", ytype,
                                      std::vector<Dim>{batch, Dim(nout), Dim(rows)});
  ir::Node view =
      rw::make_node(*g, "Reshape", base + "_rows_view", {chain->source, view_shape}, {xv});
  ir::Node gather = rw::make_node(*g, "Gather", base + "_rows_gather", {xv, index}, {gv});
  set_int(&gather, "axis", 1);
  ir::Node out = rw::make_node(*g, "Reshape", base + "_view", {gv, out_shape}, {y});
  rw::Context ctx{g, &uses, &supports};
  return rw::replace_with(ctx, chain->removed, {std::move(view), std::move(gather)},
                          std::move(out));
}

// The rules, on the rewriter: at each movement node that ends a chain (read by something that is
// not a movement op, or a graph output), the chain up from it.
std::vector<rw::Rule> make_rules() {
  auto at_end = [](rw::Context& ctx, const rw::Match& m) -> StatusOr<bool> {
    const int n = m.matched[0];
    const ir::Node& node = ctx.node(n);
    if (!is_movement(*ctx.graph, node) || node.outputs.size() != 1 || node.outputs[0] < 0)
      return false;
    const int v = node.outputs[0];
    bool end = ctx.uses->is_output(v);
    for (int r : ctx.uses->readers(v)) end = end || !is_movement(*ctx.graph, ctx.node(r));
    if (!end) return false;
    return rewrite(ctx.graph, *ctx.uses, *ctx.supports, n);
  };
  std::vector<rw::Rule> rules;
  for (const char* op : kMovementOps) {
    rules.push_back({std::string("gather_views_") + op, rw::node_of(op), at_end});
  }
  return rules;
}

}  // namespace

Status gather_views(ir::Graph* g, const SupportsFn& supports) {
  static const std::vector<rw::Rule> rules = make_rules();
  return rw::apply(g, rules, supports).status();
}

Status gather_views(BuildState& s) { return gather_views(&s.graph, backend_supports(s)); }

}  // namespace kiln::builder
