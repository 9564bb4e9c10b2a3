// Control flow the build expands in place: an If inlined (the branch it takes, or both under
// guards), a Loop or Scan unrolled where it can be (else control_flow_run_time.cc makes it a
// loop the run repeats), and the guards of nodes placed on edges out of a branch.
#include <algorithm>
#include <limits>
#include <map>

#include "builder/build_state.h"
#include "builder/control_flow_run_time.h"
#include "builder/expansion.h"
#include "core/checked.h"

namespace kiln::builder {
namespace {

// At most this many nodes an unrolled Loop or Scan adds (the body's nodes times its iterations).
constexpr int64_t kMaxUnrolledNodes = 20000;

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
