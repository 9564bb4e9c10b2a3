// Control flow the build expands in place (called by infer_shapes as it reaches each node, once the
// node's inputs have shapes and whatever values are known):
// - If with a condition known at build time: the branch it takes.
// - Loop with a trip count known at build time and a condition that stays true (the body passes
//   it through, as exporters write a `for`), unrolled: one copy of the body per iteration, its
//   loop-carried values threaded from one to the next (their shapes may change per iteration:
//   each copy is inferred on its own), scan outputs stacked along a new axis 0.
// - Scan over a scan axis of known length, unrolled the same way (slices in, in either direction;
//   scan outputs stacked on their axes), opset 8's batched form once per batch row.
// - If whose condition only the run knows: both branches, each node running under its branch's
//   condition (ir::Node::guards), and a kiln::SelectBranch for the If's outputs.
// - Loop whose trip count or condition is data (or changes with the input shapes), or too long to
//   unroll, and a Scan over a length only the run knows: one copy of the body between a
//   kiln::LoopBegin and a kiln::LoopEnd, which the run repeats (plan/loops.h). Carried values keep
//   their shapes, or grow by a constant along some dims (regrow_loop lays the loop out again with
//   those dims data-dependent); scan outputs are stacked where the input shapes decide the trip
//   count.
#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <memory>

#include "builder/build_state.h"
#include "builder/expansion.h"
#include "core/checked.h"
#include "ir/rewrite.h"
#include "ops/loop_end.h"
#include "plan/loops.h"

namespace kiln::builder {
namespace {

// At most this many nodes an unrolled Loop or Scan adds (the body's nodes times its iterations).
constexpr int64_t kMaxUnrolledNodes = 20000;

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

namespace {

Status check_size(const ir::Node& node, int64_t iterations, const ir::Graph& body) {
  // Checked: a trip count near 2^61 from a hostile model wrapped the product and unrolled forever.
  const std::optional<int64_t> added = checked_mul(iterations, int64_t(body.nodes.size() + 4));
  if (!added || *added > kMaxUnrolledNodes) {
    return unsupported(node.describe() + ": unrolling its " + std::to_string(iterations) +
                       " iterations of " + std::to_string(body.nodes.size()) +
                       " nodes would add more than " + std::to_string(kMaxUnrolledNodes) +
                       " nodes");
  }
  return ok_status();
}

// An If whose condition only the run knows: both branches inlined, each node of a branch running
// under the condition (ir::Node::guards: the run skips the other branch's nodes), then a
// kiln::SelectBranch that gives the If's outputs from the branch that ran. Branch nodes are
// inferred, proven and planned like any others (a branch the data never takes must still build for
// the profile); an output whose dims differ between the branches gets data-dependent dims.
StatusOr<bool> inline_if_on_data(ir::Graph& g, size_t n,
                                 const std::map<std::string, int>& carriers) {
  const ir::Node node = g.nodes[n];
  const int cond = node.inputs[0];
  const ir::Value& c = g.values[size_t(cond)];
  if (c.dtype != DType::kBool || !c.shape || c.shape->size() > 1 ||
      (c.shape->size() == 1 && (*c.shape)[0] != ir::Dim(1))) {
    return invalid_model(node.describe() + ": its condition '" + c.name +
                         "' must be one bool, not " + ir::type_to_string(c));
  }
  const std::string prefix = node.name.empty() ? std::string("if") : node.name;
  std::vector<ir::Node> nodes;
  std::vector<int> select_inputs = {cond};
  for (const char* which : {"then_branch", "else_branch"}) {
    const ir::Graph* b = graph_attr(node, which);
    if (!b) return invalid_model(node.describe() + ": it has no graph attribute " + which);
    if (b->outputs.size() != node.outputs.size()) {
      return invalid_model(node.describe() + ": its " + which + " has " +
                           std::to_string(b->outputs.size()) + " outputs, the If has " +
                           std::to_string(node.outputs.size()));
    }
    const std::string where = prefix + "/" + (which[0] == 't' ? "then" : "else");
    std::vector<int> targets;
    for (int bv : b->outputs) {
      targets.push_back(ir::add_unique_value(&g, where + "/" + b->values[size_t(bv)].name,
                                             DType::kUndefined, std::nullopt));
    }
    KILN_ASSIGN_OR_RETURN(BodyCopy copy, copy_body(g, n, *b, {}, targets, where, carriers, which));
    for (ir::Node& bn : copy.nodes) bn.guards.push_back(ir::Guard{cond, which[0] == 't'});
    nodes.insert(nodes.end(), std::make_move_iterator(copy.nodes.begin()),
                 std::make_move_iterator(copy.nodes.end()));
    select_inputs.insert(select_inputs.end(), targets.begin(), targets.end());
  }
  ir::Node select;
  select.name = ir::unique_node_name(g, prefix);
  select.op_type = "SelectBranch";
  select.domain = "kiln";
  select.opset = 1;
  select.inputs = std::move(select_inputs);
  select.outputs = node.outputs;
  nodes.push_back(std::move(select));
  splice(g, n, std::move(nodes));
  return true;
}

StatusOr<bool> inline_if(ir::Graph& g, size_t n, const std::map<std::string, int>& carriers) {
  const ir::Node node = g.nodes[n];
  if (node.inputs.empty() || node.inputs[0] < 0) return false;
  const std::optional<int64_t> cond = known_scalar(g.values[size_t(node.inputs[0])]);
  if (!cond) return inline_if_on_data(g, n, carriers);
  const char* which = *cond != 0 ? "then_branch" : "else_branch";
  const ir::Graph* b = graph_attr(node, which);
  if (!b) return invalid_model(node.describe() + ": it has no graph attribute " + which);
  if (b->outputs.size() != node.outputs.size()) {
    return invalid_model(node.describe() + ": its " + which + " has " +
                         std::to_string(b->outputs.size()) + " outputs, the If has " +
                         std::to_string(node.outputs.size()));
  }
  const std::string prefix = node.name.empty() ? std::string("if") : node.name;
  std::vector<int> targets = node.outputs;
  for (size_t k = 0; k < targets.size(); ++k) {
    if (targets[k] < 0) {
      targets[k] = ir::add_unique_value(&g, prefix + "/" + b->values[size_t(b->outputs[k])].name,
                                        DType::kUndefined, std::nullopt);
    }
  }
  KILN_ASSIGN_OR_RETURN(BodyCopy copy, copy_body(g, n, *b, {}, targets, prefix, carriers, which));
  splice(g, n, std::move(copy.nodes));
  return true;
}

// The parts of a run-time loop (ops/kiln_ops.cc, plan/loops.h) laid out into `nodes`: a
// kiln::LoopBegin over `trips`, `cond` and `inits` (-1: omitted), then `bind`'s nodes (which read
// the counter and the carried values: a Scan's slices) giving the body's inputs, one copy of body
// `b`, and a kiln::LoopEnd. The body's outputs are [cond_out if `cond_output`, next values, scan
// values]; `keeps`: the body passes the condition through (the run then reads none per
// iteration). Scan outputs are stacked by the run, one row per iteration, which needs `trips` as a
// formula of the input shapes (LoopEnd's inference checks). Returns the LoopEnd's outputs: the
// final carried values, then the stacked scan values, into `outputs` where those are >= 0.
using BindBody = std::function<std::vector<int>(Emitter& e, int counter, int cond_in,
                                                const std::vector<int>& carried)>;
StatusOr<std::vector<int>> emit_run_time_loop(ir::Graph& g, size_t n, const ir::Graph& b, int trips,
                                              int cond, const std::vector<int>& inits,
                                              bool cond_output, bool keeps,
                                              const std::vector<int>& outputs, const BindBody& bind,
                                              const std::string& prefix,
                                              const std::map<std::string, int>& carriers,
                                              std::vector<ir::Node>* nodes) {
  const size_t k = inits.size();
  const size_t first = cond_output ? 1 : 0;
  const size_t q = b.outputs.size() - first - k;
  auto kiln_node = [&](const char* op, const std::string& name) {
    ir::Node nd;
    nd.name = ir::unique_node_name(g, prefix + "/" + name);
    nd.op_type = op;
    nd.domain = "kiln";
    nd.opset = 1;
    return nd;
  };
  ir::Node begin = kiln_node("LoopBegin", "begin");
  begin.inputs = {trips, cond};
  begin.inputs.insert(begin.inputs.end(), inits.begin(), inits.end());
  // Named as the body names them (a Scan's body has no counter or condition).
  auto body_name = [&](size_t i, const char* fallback) {
    return i < b.inputs.size() ? b.values[size_t(b.inputs[i])].name : std::string(fallback);
  };
  begin.outputs.push_back(ir::add_unique_value(
      &g, prefix + "/" + (cond_output ? body_name(0, "i") : "i"), DType::kUndefined, std::nullopt));
  begin.outputs.push_back(
      ir::add_unique_value(&g, prefix + "/" + (cond_output ? body_name(1, "cond") : "cond"),
                           DType::kUndefined, std::nullopt));
  for (size_t j = 0; j < k; ++j) {
    begin.outputs.push_back(
        ir::add_unique_value(&g, prefix + "/" + body_name((cond_output ? 2 : 0) + j, "carried"),
                             DType::kUndefined, std::nullopt));
  }
  const std::vector<int> carried(begin.outputs.begin() + 2, begin.outputs.end());
  const int counter = begin.outputs[0], cond_in = begin.outputs[1];
  nodes->push_back(begin);
  Emitter e(g, prefix, nodes);
  const std::vector<int> bound = bind(e, counter, cond_in, carried);
  KILN_ASSIGN_OR_RETURN(
      BodyCopy copy,
      copy_body(g, n, b, bound, std::vector<int>(b.outputs.size(), -1), prefix, carriers, "body"));
  nodes->insert(nodes->end(), std::make_move_iterator(copy.nodes.begin()),
                std::make_move_iterator(copy.nodes.end()));
  ir::Node end = kiln_node("LoopEnd", "end");
  end.inputs = {cond_output && !keeps ? copy.outputs[0] : -1, q > 0 ? trips : -1};
  end.inputs.insert(end.inputs.end(), copy.outputs.begin() + std::ptrdiff_t(first),
                    copy.outputs.end());
  end.inputs.insert(end.inputs.end(), begin.outputs.begin(), begin.outputs.end());
  for (size_t j = 0; j < k + q; ++j) {
    int out = j < outputs.size() ? outputs[j] : -1;
    if (out < 0)
      out = ir::add_unique_value(&g, prefix + (j < k ? "/final" : "/stacked"), DType::kUndefined,
                                 std::nullopt);
    end.outputs.push_back(out);
  }
  nodes->push_back(end);
  return end.outputs;
}

// Why a loop cannot run at run time, or ok: it carries a sequence or optional (laid out at build
// time), or its scan outputs lack a trip count the input shapes decide.
Status check_run_time_loop(const ir::Graph& g, const ir::Node& node, const std::vector<int>& inits,
                           size_t n_scan, bool shaped_trips, const std::string& why) {
  const std::string unroll =
      "which needs a trip count known at build time (a constant, a function of input shapes, or "
      "a shape-value input) and a body that passes the condition through";
  for (int v : inits) {
    if (v >= 0 && g.values[size_t(v)].kind != ir::ValueKind::kTensor) {
      return unsupported(node.describe() + ": " + why + ", and it carries '" +
                         g.values[size_t(v)].name +
                         "', a sequence or optional; kiln lays those out at build time, so it "
                         "unrolls such a loop, " +
                         unroll);
    }
  }
  if (n_scan > 0 && !shaped_trips) {
    return unsupported(
        node.describe() + ": " + why + ", and its body has " + std::to_string(n_scan) +
        " scan output(s); kiln stacks scan outputs at run time only over a trip count the input "
        "shapes "
        "decide with a body that passes the condition through, and otherwise unrolls the loop, " +
        unroll);
  }
  return ok_status();
}

// A Loop the build cannot unroll (its trip count or condition is data or changes with the input
// shapes, or it is too long): run at run time, `why` saying which where that fails too.
StatusOr<bool> loop_at_run_time(ir::Graph& g, size_t n, const std::map<std::string, int>& carriers,
                                std::map<std::string, ir::Node>* run_time_loops, bool keeps,
                                const std::string& why) {
  const ir::Node node = g.nodes[n];
  const ir::Graph* b = graph_attr(node, "body");
  const size_t n_carried = node.inputs.size() - 2;
  const size_t n_scan = b->outputs.size() - 1 - n_carried;
  const std::vector<int> inits(node.inputs.begin() + 2, node.inputs.end());
  const int m = node.inputs[0], cond = node.inputs[1];
  const bool shaped =
      m >= 0 &&
      (known_scalar(g.values[size_t(m)]) ||
       (g.values[size_t(m)].sym_value && g.values[size_t(m)].sym_value->size() == 1)) &&
      keeps && (cond < 0 || known_scalar(g.values[size_t(cond)]).value_or(0) != 0);
  KILN_RETURN_IF_ERROR(check_run_time_loop(g, node, inits, n_scan, shaped, why));
  std::vector<ir::Node> nodes;
  auto bind = [](Emitter&, int counter, int cond_in, const std::vector<int>& carried) {
    std::vector<int> bound = {counter, cond_in};
    bound.insert(bound.end(), carried.begin(), carried.end());
    return bound;
  };
  KILN_RETURN_IF_ERROR(emit_run_time_loop(g, n, *b, m, cond, inits, true, keeps, node.outputs, bind,
                                          node.name.empty() ? std::string("loop") : node.name,
                                          carriers, &nodes)
                           .status());
  // A Loop laid out again because a carried dim grows (regrow_loop) says which in kiln_grow.
  ir::Node& begin = nodes.front();
  if (const ir::Attribute* grow = node.attrs.find("kiln_grow")) begin.attrs.set("grow", *grow);
  (*run_time_loops)[begin.name] = node;
  splice(g, n, std::move(nodes));
  return true;
}

StatusOr<bool> unroll_loop(ir::Graph& g, size_t n, const std::map<std::string, int>& carriers,
                           std::map<std::string, ir::Node>* run_time_loops) {
  const ir::Node node = g.nodes[n];
  const ir::Graph* b = graph_attr(node, "body");
  if (!b) return invalid_model(node.describe() + ": it has no graph attribute body");
  if (node.inputs.size() < 2)
    return invalid_model(node.describe() +
                         ": a Loop takes M and cond before its loop-carried values");
  const size_t n_carried = node.inputs.size() - 2;
  if (b->inputs.size() != n_carried + 2 || b->outputs.size() < n_carried + 1 ||
      node.outputs.size() > b->outputs.size() - 1) {
    return invalid_model(node.describe() + ": its body has " + std::to_string(b->inputs.size()) +
                         " inputs and " + std::to_string(b->outputs.size()) + " outputs for " +
                         std::to_string(n_carried) + " loop-carried values and " +
                         std::to_string(node.outputs.size()) + " outputs");
  }
  const size_t n_scan = b->outputs.size() - 1 - n_carried;
  // The body must keep the condition true to unroll: pass cond_in through, or give a true constant.
  const int cond_out = b->outputs[0];
  bool keeps = cond_out == b->inputs[1];
  const ir::Value& co = b->values[size_t(cond_out)];
  if (co.constant && co.constant->numel() == 1) keeps = co.constant->int_at(0) != 0;
  for (const ir::Node& bn : b->nodes) {
    if (bn.outputs.size() == 1 && bn.outputs[0] == cond_out && bn.op_type == "Identity" &&
        bn.domain.empty() && bn.inputs.size() == 1 && bn.inputs[0] == b->inputs[1]) {
      keeps = true;
    }
  }
  if (node.inputs[0] < 0)
    return loop_at_run_time(g, n, carriers, run_time_loops, keeps, "it has no trip count (M)");
  const std::optional<int64_t> trips = known_scalar(g.values[size_t(node.inputs[0])]);
  if (!trips) {
    const ir::Value& m = g.values[size_t(node.inputs[0])];
    return loop_at_run_time(
        g, n, carriers, run_time_loops, keeps,
        m.sym_value ? "its trip count ('" + m.name + "' = " + ir::dims_to_string(*m.sym_value) +
                          ") changes with the input shapes"
                    : "its trip count ('" + m.name + "') is computed from tensor data at run time");
  }
  std::optional<int64_t> cond = int64_t(1);
  if (node.inputs[1] >= 0) cond = known_scalar(g.values[size_t(node.inputs[1])]);
  if (!cond) {
    return loop_at_run_time(g, n, carriers, run_time_loops, keeps,
                            "its condition ('" + g.values[size_t(node.inputs[1])].name +
                                "') is computed from tensor data at run time");
  }
  if (!keeps) {
    return loop_at_run_time(g, n, carriers, run_time_loops, keeps,
                            "its body computes the loop's condition ('" + co.name +
                                "'), so the number of iterations is known only at run time");
  }
  const int64_t iterations = *cond != 0 ? std::max<int64_t>(*trips, 0) : 0;
  if (!check_size(node, iterations, *b).ok())
    return loop_at_run_time(g, n, carriers, run_time_loops, keeps, "it is too long to unroll");
  if (iterations == 0 && n_scan > 0) {
    return unsupported(
        node.describe() +
        ": it runs no iteration, and the shapes of its scan outputs are then unknown");
  }
  const std::string prefix = node.name.empty() ? std::string("loop") : node.name;
  std::vector<ir::Node> nodes;
  Emitter e(g, prefix, &nodes);
  std::vector<int> carried(node.inputs.begin() + 2, node.inputs.end());
  std::vector<std::vector<int>> scans(n_scan);
  for (int64_t i = 0; i < iterations; ++i) {
    std::vector<int> bound = {e.constant_i64({i}, true), e.constant_true()};
    bound.insert(bound.end(), carried.begin(), carried.end());
    KILN_ASSIGN_OR_RETURN(BodyCopy copy,
                          copy_body(g, n, *b, bound, std::vector<int>(b->outputs.size(), -1),
                                    prefix + "/" + std::to_string(i), carriers, "body"));
    nodes.insert(nodes.end(), std::make_move_iterator(copy.nodes.begin()),
                 std::make_move_iterator(copy.nodes.end()));
    carried.assign(copy.outputs.begin() + 1, copy.outputs.begin() + 1 + std::ptrdiff_t(n_carried));
    for (size_t k = 0; k < n_scan; ++k) scans[k].push_back(copy.outputs[1 + n_carried + k]);
  }
  for (size_t j = 0; j < node.outputs.size(); ++j) {
    if (node.outputs[j] < 0) continue;
    if (j < n_carried) {
      e.node("Identity", {carried[j]}, node.outputs[j]);
    } else {
      e.stack(scans[j - n_carried], 0, node.outputs[j]);
    }
  }
  splice(g, n, std::move(nodes));
  return true;
}

// A Scan (opset 9 on) over a length only the run knows, or too long to unroll: a run-time loop
// over the first scan input's length whose body reads slice i of each scan input (Gather; from
// the end for a reverse direction), its scan outputs stacked by the LoopEnd along axis 0, then
// reversed (a Slice of step -1) and moved to their axes (a Transpose) as the attributes say.
StatusOr<bool> scan_at_run_time(ir::Graph& g, size_t n, const std::map<std::string, int>& carriers,
                                size_t n_state, const std::vector<int64_t>& in_axes,
                                const std::vector<int64_t>& in_dirs,
                                const std::vector<int64_t>& out_axes,
                                const std::vector<int64_t>& out_dirs, const std::string& why) {
  const ir::Node node = g.nodes[n];
  const ir::Graph* b = graph_attr(node, "body");
  const std::vector<int> states(node.inputs.begin(), node.inputs.begin() + std::ptrdiff_t(n_state));
  const std::vector<int> xs(node.inputs.begin() + std::ptrdiff_t(n_state), node.inputs.end());
  const size_t n_out = b->outputs.size() - n_state;
  KILN_RETURN_IF_ERROR(check_run_time_loop(g, node, states, n_out, true, why));
  // A scan output moved off axis 0 needs its rank: the body's declaration of it.
  std::vector<int64_t> ranks(n_out, -1);
  for (size_t k = 0; k < n_out; ++k) {
    const ir::Value& bv = b->values[size_t(b->outputs[n_state + k])];
    if (bv.shape) ranks[k] = int64_t(bv.shape->size()) + 1;
    if (out_axes[k] != 0 && ranks[k] < 0) {
      return unsupported(node.describe() + ": " + why + ", and its scan output " +
                         std::to_string(k) + " ('" + bv.name + "') goes to axis " +
                         std::to_string(out_axes[k]) +
                         " but its body does not declare its rank; kiln stacks it at run time "
                         "along an axis it can place");
    }
    if (ranks[k] >= 0 && (out_axes[k] < -ranks[k] || out_axes[k] >= ranks[k])) {
      return invalid_model(node.describe() + ": scan output " + std::to_string(k) + " of rank " +
                           std::to_string(ranks[k]) + " has no axis " +
                           std::to_string(out_axes[k]));
    }
  }
  const std::string prefix = node.name.empty() ? std::string("scan") : node.name;
  std::vector<ir::Node> nodes;
  Emitter pre(g, prefix, &nodes);
  // The trip count, read off the first scan input's shape (a formula of the input shapes).
  const int length =
      pre.node("Gather", {pre.node("Shape", {xs[0]}, -1), pre.constant_i64({in_axes[0]}, true)}, -1,
               Emitter::int_attr("axis", 0));
  const int last = pre.node("Sub", {length, pre.constant_i64({1}, true)}, -1);
  auto bind = [&](Emitter& e, int counter, int, const std::vector<int>& carried) {
    std::vector<int> bound = carried;
    for (size_t j = 0; j < xs.size(); ++j) {
      const int at = in_dirs[j] ? e.node("Sub", {last, counter}, -1) : counter;
      bound.push_back(e.node("Gather", {xs[j], at}, -1, Emitter::int_attr("axis", in_axes[j])));
    }
    return bound;
  };
  // The LoopEnd writes the final states, and a scan output that needs no reversing or moving,
  // straight into the Scan's outputs.
  auto in_place = [&](size_t k) {
    return out_dirs[k] == 0 && out_axes[k] == 0 && n_state + k < node.outputs.size();
  };
  std::vector<int> targets;
  for (size_t j = 0; j < n_state + n_out; ++j) {
    const bool direct = j < n_state || in_place(j - n_state);
    targets.push_back(direct && j < node.outputs.size() ? node.outputs[j] : -1);
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int> outs,
                        emit_run_time_loop(g, n, *b, length, -1, states, false, true, targets, bind,
                                           prefix, carriers, &nodes));
  Emitter post(g, prefix, &nodes);
  for (size_t k = 0; k < n_out && n_state + k < node.outputs.size(); ++k) {
    if (node.outputs[n_state + k] < 0 || in_place(k)) continue;
    int v = outs[n_state + k];
    if (out_dirs[k]) {
      v = post.node("Slice",
                    {v, post.constant_i64({-1}, false),
                     post.constant_i64({std::numeric_limits<int64_t>::min()}, false),
                     post.constant_i64({0}, false), post.constant_i64({-1}, false)},
                    -1);
    }
    const int64_t axis = out_axes[k] < 0 ? out_axes[k] + ranks[k] : out_axes[k];
    if (axis != 0) {
      std::vector<int64_t> perm;
      for (int64_t d = 1; d <= axis; ++d) perm.push_back(d);
      perm.push_back(0);
      for (int64_t d = axis + 1; d < ranks[k]; ++d) perm.push_back(d);
      ir::Attributes a;
      ir::Attribute at;
      at.type = ir::AttrType::kInts;
      at.ints = perm;
      a.set("perm", at);
      v = post.node("Transpose", {v}, -1, a);
    }
    post.node("Identity", {v}, node.outputs[n_state + k]);
  }
  splice(g, n, std::move(nodes));
  return true;
}

StatusOr<bool> unroll_scan(ir::Graph& g, size_t n, const std::map<std::string, int>& carriers) {
  const ir::Node node = g.nodes[n];
  const ir::Graph* b = graph_attr(node, "body");
  if (!b) return invalid_model(node.describe() + ": it has no graph attribute body");
  auto ints = [&](const char* name, std::vector<int64_t> fallback) {
    return node.attrs.get_ints(name, fallback);
  };
  KILN_ASSIGN_OR_RETURN(int64_t num_scan, node.attrs.get_int("num_scan_inputs", std::nullopt));
  const bool batched =
      node.opset > 0 && node.opset < 9;  // opset 8: a batch axis 0, an optional sequence_lens first
  const size_t first = batched ? 1 : 0;
  if (num_scan < 1 || size_t(num_scan) + first > node.inputs.size()) {
    return invalid_model(node.describe() + ": num_scan_inputs=" + std::to_string(num_scan) +
                         " for " + std::to_string(node.inputs.size()) + " inputs");
  }
  if (batched && node.inputs[0] >= 0) {
    return unsupported(node.describe() +
                       ": opset 8's sequence_lens (a length per batch row) is not supported");
  }
  const size_t n_state = node.inputs.size() - first - size_t(num_scan);
  if (b->inputs.size() != n_state + size_t(num_scan) || b->outputs.size() < n_state ||
      node.outputs.size() > b->outputs.size()) {
    return invalid_model(node.describe() + ": its body has " + std::to_string(b->inputs.size()) +
                         " inputs and " + std::to_string(b->outputs.size()) + " outputs for " +
                         std::to_string(n_state) + " states and " + std::to_string(num_scan) +
                         " scan inputs");
  }
  const size_t n_out = b->outputs.size() - n_state;
  KILN_ASSIGN_OR_RETURN(auto in_axes,
                        ints("scan_input_axes", std::vector<int64_t>(size_t(num_scan), 0)));
  KILN_ASSIGN_OR_RETURN(auto in_dirs, ints(batched ? "directions" : "scan_input_directions",
                                           std::vector<int64_t>(size_t(num_scan), 0)));
  KILN_ASSIGN_OR_RETURN(auto out_axes, ints("scan_output_axes", std::vector<int64_t>(n_out, 0)));
  KILN_ASSIGN_OR_RETURN(auto out_dirs,
                        ints("scan_output_directions", std::vector<int64_t>(n_out, 0)));
  if (in_axes.size() != size_t(num_scan) || in_dirs.size() != size_t(num_scan) ||
      out_axes.size() != n_out || out_dirs.size() != n_out ||
      (batched && (node.attrs.has("scan_input_axes") || node.attrs.has("scan_output_axes")))) {
    return invalid_model(node.describe() + ": its scan axes and directions do not match its " +
                         std::to_string(num_scan) + " scan inputs and " + std::to_string(n_out) +
                         " scan outputs");
  }
  // The scan length: every scan input's dim at its axis, known at build time (else the scan runs
  // at run time, over the first input's dim, which the others must equal).
  int64_t length = -1;
  std::optional<ir::Dim> dynamic;
  for (size_t j = 0; j < size_t(num_scan); ++j) {
    const ir::Value& x = g.values[size_t(node.inputs[first + n_state + j])];
    const int64_t rank = int64_t(x.shape->size());
    int64_t axis = in_axes[j] < 0 ? in_axes[j] + rank : in_axes[j];
    if (batched) axis = 1;
    if (axis < 0 || axis >= rank) {
      return invalid_model(node.describe() + ": scan input '" + x.name + "' of rank " +
                           std::to_string(rank) + " has no axis " + std::to_string(in_axes[j]));
    }
    in_axes[j] = axis;
    const ir::Dim& d = (*x.shape)[size_t(axis)];
    if (!d.is_const() || dynamic) {
      if (batched) {
        return unsupported(
            node.describe() + ": it scans '" + x.name + "' over dim " + std::to_string(axis) +
            " (" + d.to_string() +
            "), which changes at run time; kiln unrolls opset 8's batched Scan, whose "
            "length must be known at build time");
      }
      if (j > 0 && !(dynamic ? *dynamic == d : ir::Dim(length) == d)) {
        return unsupported(node.describe() + ": its scan inputs have lengths " +
                           (dynamic ? dynamic->to_string() : std::to_string(length)) + " and " +
                           d.to_string() + ", which kiln cannot prove equal");
      }
      dynamic = d;
      continue;
    }
    if (length >= 0 && d.value() != length) {
      return invalid_model(node.describe() + ": its scan inputs have lengths " +
                           std::to_string(length) + " and " + std::to_string(d.value()));
    }
    length = d.value();
  }
  if (dynamic) {
    return scan_at_run_time(
        g, n, carriers, n_state, in_axes, in_dirs, out_axes, out_dirs,
        "it scans over a length that changes at run time (" + dynamic->to_string() + ")");
  }
  int64_t rows = 1;
  if (batched) {
    const ir::Value& x = g.values[size_t(node.inputs[first + n_state])];
    if (!(*x.shape)[0].is_const()) {
      return unsupported(node.describe() + ": opset 8's batch dim (" + (*x.shape)[0].to_string() +
                         ") changes at run time");
    }
    rows = (*x.shape)[0].value();
  }
  // length * rows saturates: a product past int64 is too long to unroll either way.
  const int64_t steps = checked_mul(length, rows).value_or(std::numeric_limits<int64_t>::max());
  if (!batched && !check_size(node, steps, *b).ok()) {
    return scan_at_run_time(g, n, carriers, n_state, in_axes, in_dirs, out_axes, out_dirs,
                            "it is too long to unroll");
  }
  KILN_RETURN_IF_ERROR(check_size(node, steps, *b));
  if (length == 0 && n_out > 0) {
    return unsupported(
        node.describe() +
        ": it scans no element, and the shapes of its scan outputs are then unknown");
  }
  const std::string prefix = node.name.empty() ? std::string("scan") : node.name;
  std::vector<ir::Node> nodes;
  Emitter e(g, prefix, &nodes);
  // One scan over `states` and `xs` (their scan axes in_axes): the final states and stacked
  // outputs.
  auto scan =
      [&](std::vector<int> states, const std::vector<int>& xs, const std::vector<int64_t>& axes,
          const std::string& where) -> StatusOr<std::pair<std::vector<int>, std::vector<int>>> {
    std::vector<std::vector<int>> outs(n_out);
    for (int64_t t = 0; t < length; ++t) {
      std::vector<int> bound = states;
      for (size_t j = 0; j < xs.size(); ++j)
        bound.push_back(e.slice(xs[j], in_dirs[j] ? length - 1 - t : t, axes[j]));
      KILN_ASSIGN_OR_RETURN(BodyCopy copy,
                            copy_body(g, n, *b, bound, std::vector<int>(b->outputs.size(), -1),
                                      where + "/" + std::to_string(t), carriers, "body"));
      nodes.insert(nodes.end(), std::make_move_iterator(copy.nodes.begin()),
                   std::make_move_iterator(copy.nodes.end()));
      states.assign(copy.outputs.begin(), copy.outputs.begin() + std::ptrdiff_t(n_state));
      for (size_t k = 0; k < n_out; ++k) outs[k].push_back(copy.outputs[n_state + k]);
    }
    std::vector<int> stacked;
    for (size_t k = 0; k < n_out; ++k) {
      if (out_dirs[k]) std::reverse(outs[k].begin(), outs[k].end());
      stacked.push_back(e.stack(outs[k], out_axes[k], -1));
    }
    return std::make_pair(states, stacked);
  };
  std::vector<int> states(node.inputs.begin() + std::ptrdiff_t(first),
                          node.inputs.begin() + std::ptrdiff_t(first + n_state));
  std::vector<int> xs(node.inputs.begin() + std::ptrdiff_t(first + n_state), node.inputs.end());
  std::vector<int> final_states, outputs;
  if (!batched) {
    KILN_ASSIGN_OR_RETURN(auto r, scan(states, xs, in_axes, prefix));
    final_states = r.first, outputs = r.second;
  } else {
    // Each batch row scanned on its own (its scan axis is then 0), the rows stacked again.
    std::vector<std::vector<int>> per_state(n_state), per_out(n_out);
    for (int64_t row = 0; row < rows; ++row) {
      std::vector<int> s_row, x_row;
      for (int s : states) s_row.push_back(e.slice(s, row, 0));
      for (int x : xs) x_row.push_back(e.slice(x, row, 0));
      KILN_ASSIGN_OR_RETURN(auto r, scan(s_row, x_row, std::vector<int64_t>(xs.size(), 0),
                                         prefix + "/row" + std::to_string(row)));
      for (size_t k = 0; k < n_state; ++k) per_state[k].push_back(r.first[k]);
      for (size_t k = 0; k < n_out; ++k) per_out[k].push_back(r.second[k]);
    }
    for (auto& parts : per_state) final_states.push_back(e.stack(parts, 0, -1));
    for (auto& parts : per_out) outputs.push_back(e.stack(parts, 0, -1));
  }
  for (size_t j = 0; j < node.outputs.size(); ++j) {
    if (node.outputs[j] < 0) continue;
    e.node("Identity", {j < n_state ? final_states[j] : outputs[j - n_state]}, node.outputs[j]);
  }
  splice(g, n, std::move(nodes));
  return true;
}

}  // namespace

// A node a pass put on an edge out of an If's branch (a Cast, a layout Transpose) reads a value
// only that branch computes: it runs under the branch's conditions too. Every node gains the
// conditions of the nodes whose outputs it reads; kiln::SelectBranch, which reads both branches
// and picks the one that ran, is the exception.
Status settle_guards(BuildState& s) {
  ir::Graph& g = s.graph;
  for (ir::Node& node : g.nodes) {
    if (ops::find_op(node.domain, node.op_type) == ops::OpKind::kSelectBranch) continue;
    for (int v : node.inputs) {
      const int p = v >= 0 ? g.values[size_t(v)].producer : -1;
      if (p < 0) continue;
      for (const ir::Guard& gd : g.nodes[size_t(p)].guards) {
        if (std::find(node.guards.begin(), node.guards.end(), gd) == node.guards.end())
          node.guards.push_back(gd);
      }
    }
  }
  return ok_status();
}

// The loops the run repeats are well formed after the passes (plan/loops.h: a pass that moved a
// node across a LoopBegin or LoopEnd is a bug), and no node of a loop makes a data-dependent dim:
// its size would change per iteration, and memory is planned once per run.
Status check_loops(BuildState& s) {
  const ir::Graph& g = s.graph;
  auto loops = plan::find_loops(g);
  if (!loops.ok()) return internal_error("after the graph passes: " + loops.status().message());
  const std::vector<int> loop_of = plan::loop_of_nodes(g, *loops);
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    // A LoopBegin's growing dims are the loop's own: the run binds them per iteration.
    if (ops::find_op(g.nodes[n].domain, g.nodes[n].op_type) == ops::OpKind::kLoopBegin) continue;
    if (loop_of[n] < 0 || !ir::makes_data_dependent(g, g.nodes[n], s.data_dependent)) continue;
    const ir::Node& begin = g.nodes[size_t((*loops)[size_t(loop_of[n])].begin)];
    return unsupported(g.nodes[n].describe() +
                       " gives an output whose size its data decides, inside the loop of " +
                       begin.describe() +
                       ", which runs at run time; kiln runs such a loop only when every size in "
                       "its body follows from the input shapes");
  }
  return ok_status();
}

StatusOr<std::optional<size_t>> regrow_loop(BuildState& s, size_t n) {
  ir::Graph& g = s.graph;
  const ir::Node& end = g.nodes[n];
  const auto l = ops::LoopEndLayout::of(end.inputs.size(), end.outputs.size());
  // Its inference says what is wrong with a malformed one; stacked rows must all have one size.
  if (!l || l->q > 0) return std::optional<size_t>();
  const int counter = end.inputs[l->begin_outputs()];
  const int b = counter >= 0 ? g.values[size_t(counter)].producer : -1;
  if (b < 0 || ops::find_op(g.nodes[size_t(b)].domain, g.nodes[size_t(b)].op_type) !=
                   ops::OpKind::kLoopBegin) {
    return std::optional<size_t>();
  }
  const ir::Node& begin = g.nodes[size_t(b)];
  auto original = s.run_time_loops.find(begin.name);
  if (begin.attrs.has("grow") || original == s.run_time_loops.end()) return std::optional<size_t>();
  std::vector<int64_t> grow;  // triples: carried value, dim, step
  for (size_t j = 0; j < l->k; ++j) {
    const ir::Value& v = g.values[size_t(end.inputs[l->carried(j)])];
    const ir::Value& next = g.values[size_t(end.inputs[l->next(j)])];
    if (!v.shape || !next.shape || v.shape->size() != next.shape->size() || v.dtype != next.dtype)
      continue;
    for (size_t d = 0; d < v.shape->size(); ++d) {
      const ir::Dim step = (*next.shape)[d] - (*v.shape)[d];
      if (step.is_const() && step.value() > 0)
        grow.insert(grow.end(), {int64_t(j), int64_t(d), step.value()});
    }
  }
  if (grow.empty()) return std::optional<size_t>();
  ir::Node again = original->second;
  ir::Attribute a;
  a.type = ir::AttrType::kInts;
  a.ints = grow;
  again.attrs.set("kiln_grow", a);
  s.run_time_loops.erase(original);
  // The loop's nodes, from its LoopBegin to this LoopEnd, give way to the Loop node again.
  for (size_t m = size_t(b); m <= n; ++m) {
    for (int v : g.nodes[m].outputs) {
      if (v >= 0) g.values[size_t(v)].producer = -1;
    }
  }
  g.nodes.erase(g.nodes.begin() + b, g.nodes.begin() + std::ptrdiff_t(n) + 1);
  g.nodes.insert(g.nodes.begin() + b, std::move(again));
  for (size_t m = size_t(b); m < g.nodes.size(); ++m) {
    for (int v : g.nodes[m].outputs) {
      if (v >= 0) g.values[size_t(v)].producer = int(m);
    }
  }
  return std::optional<size_t>(size_t(b));
}

StatusOr<bool> expand_control_flow(ir::Graph& g, size_t n,
                                   const std::map<std::string, int>& carriers,
                                   std::map<std::string, ir::Node>* run_time_loops) {
  const ir::Node& node = g.nodes[n];
  switch (ops::find_op(node.domain, node.op_type)) {
    case ops::OpKind::kIf:
      return inline_if(g, n, carriers);
    case ops::OpKind::kLoop:
      return unroll_loop(g, n, carriers, run_time_loops);
    case ops::OpKind::kScan:
      return unroll_scan(g, n, carriers);
    default:
      return false;
  }
}

}  // namespace kiln::builder
