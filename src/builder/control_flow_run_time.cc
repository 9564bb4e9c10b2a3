// Loops the run repeats: a Loop or Scan the build cannot unroll laid out as one copy of its body
// between a kiln::LoopBegin and a kiln::LoopEnd; the checks on those loops after the passes, and
// regrow_loop, which lays a loop out again when a carried dim grows.
#include "builder/control_flow_run_time.h"

#include <functional>
#include <limits>
#include <map>

#include "builder/build_state.h"
#include "builder/expansion.h"
#include "ops/loop_end.h"
#include "plan/loops.h"

namespace kiln::builder {
namespace {

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

}  // namespace

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

}  // namespace kiln::builder
