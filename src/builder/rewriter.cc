// The pattern rewriter: matching a pattern tree upwards from a root node, and the fixed-point
// driver.
#include "builder/rewriter.h"

#include <algorithm>
#include <utility>

#include "builder/graph_match.h"
#include "ir/rewrite.h"

namespace kiln::builder::rw {

// ---- use lists ----

void Uses::rebuild(const ir::Graph& g) {
  readers_.assign(g.values.size(), {});
  output_.assign(g.values.size(), 0);
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    for (int v : g.nodes[n].inputs) {
      if (v < 0 || size_t(v) >= readers_.size()) continue;
      std::vector<int>& r = readers_[size_t(v)];
      if (r.empty() || r.back() != int(n)) r.push_back(int(n));
    }
    // A node's guards read their conditions as inputs do.
    for (const ir::Guard& gd : g.nodes[n].guards) {
      if (gd.cond < 0 || size_t(gd.cond) >= readers_.size()) continue;
      std::vector<int>& r = readers_[size_t(gd.cond)];
      if (r.empty() || r.back() != int(n)) r.push_back(int(n));
    }
  }
  for (int o : g.outputs) {
    if (o >= 0 && size_t(o) < output_.size()) output_[size_t(o)] = 1;
  }
}

std::span<const int> Uses::readers(int v) const {
  if (v < 0 || size_t(v) >= readers_.size()) return {};
  return readers_[size_t(v)];
}

int Uses::sole_reader(int v) const {
  if (is_output(v)) return -1;
  std::span<const int> r = readers(v);
  return r.size() == 1 ? r[0] : -1;
}

// ---- bindings ----

int Match::value(std::string_view name) const {
  auto it = values.find(name);
  return it == values.end() ? -1 : it->second;
}

int Match::node(std::string_view name) const {
  auto it = nodes.find(name);
  return it == nodes.end() ? -1 : it->second;
}

double Match::factor(std::string_view name) const {
  auto it = factors.find(name);
  return it == factors.end() ? 1.0 : it->second;
}

const std::vector<ir::Dim>* Context::shape(int v) const {
  if (v < 0) return nullptr;
  const ir::Value& val = graph->values[size_t(v)];
  return val.shape ? &*val.shape : nullptr;
}

std::optional<double> Context::scalar(int v) const {
  if (v < 0) return std::nullopt;
  const ir::Value& val = graph->values[size_t(v)];
  if (!val.constant || val.constant->numel() != 1) return std::nullopt;
  return val.constant->float_at(0);
}

// ---- patterns ----

struct PatNode {
  enum class Kind { kAny, kOptional, kConstant, kScalar, kScalarEq, kOp, kEither, kScaled };
  Kind kind = Kind::kAny;
  std::string name;      // the value (leaves, scaled: the factor) or node (op) it binds
  std::string out_name;  // op: the output value it binds
  std::string op_type, domain;
  int output = 0;
  std::vector<Pat> inputs;  // op: its inputs; either: the alternatives; scaled: the inner pattern
  bool commutative = false, keep = false;
  bool any_inputs = false;  // op: whatever its inputs (node_of)
  double eq = 0;
  std::vector<std::function<bool(const Context&, const Match&, int)>> node_preds, value_preds;
};

std::shared_ptr<PatNode> Pat::mutable_copy() const { return std::make_shared<PatNode>(*p_); }

Pat Pat::as(std::string node_name) const {
  auto p = mutable_copy();
  p->name = std::move(node_name);
  return Pat(p);
}
Pat Pat::out(std::string value_name) const {
  auto p = mutable_copy();
  p->out_name = std::move(value_name);
  return Pat(p);
}
Pat Pat::commutative() const {
  auto p = mutable_copy();
  p->commutative = true;
  return Pat(p);
}
Pat Pat::keep() const {
  auto p = mutable_copy();
  p->keep = true;
  return Pat(p);
}
Pat Pat::when(std::function<bool(const Context&, const Match&, int)> pred) const {
  auto p = mutable_copy();
  p->node_preds.push_back(std::move(pred));
  return Pat(p);
}
Pat Pat::where(std::function<bool(const Context&, const Match&, int)> pred) const {
  auto p = mutable_copy();
  p->value_preds.push_back(std::move(pred));
  return Pat(p);
}

namespace {

Pat leaf(PatNode::Kind kind, std::string name, double eq = 0) {
  auto p = std::make_shared<PatNode>();
  p->kind = kind;
  p->name = std::move(name);
  p->eq = eq;
  return Pat(p);
}

}  // namespace

Pat any(std::string name) { return leaf(PatNode::Kind::kAny, std::move(name)); }
Pat optional(std::string name) { return leaf(PatNode::Kind::kOptional, std::move(name)); }
Pat constant(std::string name) { return leaf(PatNode::Kind::kConstant, std::move(name)); }
Pat scalar(std::string name) { return leaf(PatNode::Kind::kScalar, std::move(name)); }
Pat scalar_eq(double v) { return leaf(PatNode::Kind::kScalarEq, "", v); }

Pat node_of(std::string op_type) {
  Pat p = op(std::move(op_type), {});
  auto n = std::make_shared<PatNode>(*p.get());
  n->any_inputs = true;
  return Pat(n);
}

Pat op(std::string op_type, std::vector<Pat> inputs, int output) {
  auto p = std::make_shared<PatNode>();
  p->kind = PatNode::Kind::kOp;
  const size_t sep = op_type.find("::");
  if (sep != std::string::npos) {
    p->domain = op_type.substr(0, sep);
    p->op_type = op_type.substr(sep + 2);
  } else {
    p->op_type = std::move(op_type);
  }
  p->inputs = std::move(inputs);
  p->output = output;
  return Pat(p);
}

Pat either(std::vector<Pat> alternatives) {
  auto p = std::make_shared<PatNode>();
  p->kind = PatNode::Kind::kEither;
  p->inputs = std::move(alternatives);
  return Pat(p);
}

Pat scaled(Pat inner, std::string name) {
  auto p = std::make_shared<PatNode>();
  p->kind = PatNode::Kind::kScaled;
  p->name = std::move(name);
  p->inputs = {std::move(inner)};
  return Pat(p);
}

// ---- matching ----

namespace {

bool bind(std::map<std::string, int, std::less<>>* map, const std::string& name, int x) {
  if (name.empty()) return true;
  auto [it, fresh] = map->emplace(name, x);
  return fresh || it->second == x;
}

bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// A scalar step reading value x's producer p: the operand it scales and the factor.
std::optional<std::pair<int, double>> scalar_step(const Context& ctx, int p) {
  const ir::Node& n = ctx.node(p);
  if (!n.domain.empty() || n.inputs.size() != 2 || n.outputs.size() != 1) return std::nullopt;
  if (n.op_type == "Mul") {
    for (int i = 0; i < 2; ++i) {
      if (auto c = ctx.scalar(n.inputs[size_t(i)]); c && !ctx.scalar(n.inputs[size_t(1 - i)])) {
        return std::make_pair(n.inputs[size_t(1 - i)], *c);
      }
    }
  }
  if (n.op_type == "Div") {
    auto c = ctx.scalar(n.inputs[1]);
    if (c && *c != 0.0 && !ctx.scalar(n.inputs[0])) return std::make_pair(n.inputs[0], 1.0 / *c);
  }
  return std::nullopt;
}

// Matching enumerates: every way a pattern matches (each alternative of an either, both operand
// orders of a commutative op), in preference order, so a candidate that fails a check made only
// once the whole pattern matched (match_at's: consumed nodes read only inside the match) gives way
// to the next. Patterns are small and mismatches prune at the first op, so the lists stay short;
// kMaxCandidates bounds them all the same.
using Matches = std::vector<Match>;
constexpr size_t kMaxCandidates = 256;

Matches match_value(const Context& ctx, const PatNode& p, int v, int reader, const Match& m);

Matches match_op(const Context& ctx, const PatNode& p, int v, const Match& m) {
  const int n = ctx.value(v).producer;
  if (n < 0) return {};
  const ir::Node& node = ctx.node(n);
  if (node.op_type != p.op_type || node.domain != p.domain) return {};
  if (size_t(p.output) >= node.outputs.size() || node.outputs[size_t(p.output)] != v) return {};
  if (!p.any_inputs && node.inputs.size() != p.inputs.size()) return {};
  // A node reached a second time (a pattern that is a DAG) must be the one bound by name.
  if (contains(m.matched, n) || contains(m.kept, n)) {
    if (!p.name.empty() && m.node(p.name) == n) return {m};
    return {};
  }
  Match base = m;
  (p.keep ? base.kept : base.matched).push_back(n);
  if (!bind(&base.nodes, p.name, n)) return {};
  Matches out;
  const bool swap = p.commutative && p.inputs.size() == 2;
  for (bool swapped : {false, true}) {
    if (swapped && !swap) break;
    Matches cur = {base};
    for (size_t i = 0; i < p.inputs.size() && !cur.empty(); ++i) {
      const size_t j = swapped ? 1 - i : i;
      Matches next;
      for (const Match& c : cur) {
        for (Match& r : match_value(ctx, *p.inputs[i].get(), node.inputs[j], n, c)) {
          if (next.size() < kMaxCandidates) next.push_back(std::move(r));
        }
      }
      cur = std::move(next);
    }
    for (Match& c : cur) {
      bool ok = true;
      for (const auto& pred : p.node_preds) ok = ok && pred(ctx, c, n);
      if (ok && bind(&c.values, p.out_name, v) && out.size() < kMaxCandidates)
        out.push_back(std::move(c));
    }
  }
  return out;
}

Matches match_value(const Context& ctx, const PatNode& p, int v, int reader, const Match& m) {
  if (v < 0) return p.kind == PatNode::Kind::kOptional ? Matches{m} : Matches{};
  Matches out;
  auto leaf = [&](bool ok) {
    Match r = m;
    if (ok && bind(&r.values, p.name, v)) out.push_back(std::move(r));
  };
  switch (p.kind) {
    case PatNode::Kind::kAny:
    case PatNode::Kind::kOptional:
      leaf(true);
      break;
    case PatNode::Kind::kConstant:
      leaf(ctx.value(v).constant.has_value());
      break;
    case PatNode::Kind::kScalar:
      leaf(ctx.scalar(v).has_value());
      break;
    case PatNode::Kind::kScalarEq: {
      auto c = ctx.scalar(v);
      if (c && *c == p.eq) out.push_back(m);
      break;
    }
    case PatNode::Kind::kOp:
      out = match_op(ctx, p, v, m);
      break;
    case PatNode::Kind::kEither:
      for (const Pat& alt : p.inputs) {
        for (Match& r : match_value(ctx, *alt.get(), v, reader, m)) {
          if (out.size() < kMaxCandidates) out.push_back(std::move(r));
        }
      }
      break;
    case PatNode::Kind::kScaled: {
      // Greedy: each step's output read by nothing but the node above it.
      Match r = m;
      double f = 1.0;
      int at = reader;
      while (at >= 0 && ctx.uses->sole_reader(v) == at) {
        const int prod = ctx.value(v).producer;
        if (prod < 0) break;
        auto step = scalar_step(ctx, prod);
        if (!step) break;
        f *= step->second;
        r.matched.push_back(prod);
        at = prod;
        v = step->first;
      }
      out = match_value(ctx, *p.inputs[0].get(), v, at, r);
      if (!p.name.empty()) {
        for (Match& c : out) {
          auto [it, fresh] = c.factors.emplace(p.name, f);
          if (!fresh) it->second *= f;
        }
      }
      break;
    }
  }
  if (p.value_preds.empty()) return out;
  Matches kept;
  for (Match& c : out) {
    bool ok = true;
    for (const auto& pred : p.value_preds) ok = ok && pred(ctx, c, v);
    if (ok) kept.push_back(std::move(c));
  }
  return kept;
}

}  // namespace

std::optional<Match> match_at(const Context& ctx, const Pat& pattern, int n) {
  const PatNode& p = *pattern.get();
  const ir::Node& node = ctx.node(n);
  if (p.kind != PatNode::Kind::kOp || node.op_type != p.op_type || node.domain != p.domain)
    return std::nullopt;
  if (size_t(p.output) >= node.outputs.size() || node.outputs[size_t(p.output)] < 0)
    return std::nullopt;
  // The first candidate whose consumed nodes below the root are read only by consumed nodes and
  // are no graph outputs.
  for (Match& m : match_value(ctx, p, node.outputs[size_t(p.output)], -1, Match{})) {
    bool inside = true;
    for (size_t i = 1; i < m.matched.size() && inside; ++i) {
      for (int o : ctx.node(m.matched[i]).outputs) {
        if (o < 0) continue;
        if (ctx.uses->is_output(o)) inside = false;
        for (int r : ctx.uses->readers(o)) inside = inside && contains(m.matched, r);
      }
    }
    if (inside) return std::move(m);
  }
  return std::nullopt;
}

// ---- driver ----

StatusOr<int> apply(ir::Graph* g, std::span<const Rule> rules, const SupportsFn& supports) {
  Uses uses(*g);
  Context ctx{g, &uses, &supports};
  int count = 0;
  // Sweeps until one changes nothing. A rewrite only edits the root's node and those above it, so
  // the walk goes on from there; a later sweep catches what an edit enabled further up.
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t n = 0; n < g->nodes.size(); ++n) {
      for (const Rule& rule : rules) {
        const PatNode& root = *rule.pattern.get();
        const ir::Node& node = g->nodes[n];
        if (node.op_type != root.op_type || node.domain != root.domain) continue;
        // A node nothing reads is left for dead-node removal (an alias rewrite leaves such).
        bool read = false;
        for (int o : node.outputs)
          read = read || (o >= 0 && (uses.is_output(o) || !uses.readers(o).empty()));
        if (!read) continue;
        std::optional<Match> m = match_at(ctx, rule.pattern, int(n));
        if (!m) continue;
        KILN_ASSIGN_OR_RETURN(bool done, rule.rewrite(ctx, *m));
        if (!done) continue;
        if (++count > 1000000)
          return internal_error("rewriter: rule '" + rule.name + "' never reaches a fixed point");
        changed = true;
        uses.rebuild(*g);
        n = std::min<size_t>(size_t(*std::min_element(m->matched.begin(), m->matched.end())),
                             g->nodes.size());
        break;
      }
    }
  }
  if (count > 0) ir::remove_dead_nodes(g);
  return count;
}

StatusOr<bool> replace(Context& ctx, const Match& m, ir::Node fused) {
  if (!node_supported(*ctx.graph, fused, *ctx.supports)) return false;
  const bool kiln_op = fused.domain == "kiln";
  if (!ir::replace_nodes(ctx.graph, m.matched, std::move(fused)).ok()) return false;
  if (kiln_op) ctx.graph->opsets.emplace("kiln", 1);
  return true;
}

StatusOr<bool> replace_with(Context& ctx, std::vector<int> matched, std::vector<ir::Node> pre,
                            ir::Node fused) {
  ir::Graph* g = ctx.graph;
  if (matched.empty()) return false;
  for (const ir::Node& n : pre) {
    if (!node_supported(*g, n, *ctx.supports)) return false;
  }
  const size_t at = size_t(*std::max_element(matched.begin(), matched.end()));
  const std::ptrdiff_t count = std::ptrdiff_t(pre.size());
  g->nodes.insert(g->nodes.begin() + std::ptrdiff_t(at), std::make_move_iterator(pre.begin()),
                  std::make_move_iterator(pre.end()));
  for (int& n : matched) n += n >= int(at) ? int(count) : 0;
  ir::set_producers(g);
  if (replace_if_supported(g, matched, std::move(fused), *ctx.supports)) return true;
  g->nodes.erase(g->nodes.begin() + std::ptrdiff_t(at),
                 g->nodes.begin() + std::ptrdiff_t(at) + count);
  ir::set_producers(g);
  return false;
}

ir::Node make_node(const ir::Graph& g, std::string op_type, std::string_view base,
                   std::vector<int> inputs, std::vector<int> outputs, std::string domain) {
  ir::Node n;
  n.name = ir::unique_node_name(g, base);
  n.op_type = std::move(op_type);
  n.domain = std::move(domain);
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  // The graph's import of the domain, as replace_nodes gives a replacement (a node inserted beside
  // the replacement gets no such default).
  auto opset = g.opsets.find(n.domain);
  n.opset = opset == g.opsets.end() ? 0 : opset->second;
  return n;
}

}  // namespace kiln::builder::rw
