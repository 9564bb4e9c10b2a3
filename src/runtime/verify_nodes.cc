// The plan verifier's per-node checks: ops and attributes, guards and branch selection, run-time
// loops, inference against the stored shapes, and the kernel and its workspace.
#include <algorithm>

#include "core/checked.h"
#include "ops/attribute_domains.h"
#include "ops/loop_end.h"
#include "runtime/plan_verifier.h"

namespace kiln {
namespace verifier {

Status Verifier::check_node(size_t n) {
  const ir::Node& node = g_.nodes[n];
  const plan::NodePlan& np = p_.nodes[n];
  const ops::OpSchema* schema = ops::find_schema(node);
  if (!schema || !schema->infer) {
    return violation("every node's op is known", node.describe() + " in domain '" + node.domain +
                                                     "' is not an op this kiln knows");
  }
  if (node.opset < 0 || node.opset > kMaxPlausibleOpset) {
    return violation("opsets are plausible",
                     node.describe() + " has opset " + std::to_string(node.opset));
  }
  if (auto wrong = ops::attribute_domain_problems(node); !wrong.empty()) {
    return violation("attribute values are in ONNX's domains", wrong[0]);
  }
  const int ni = int(node.inputs.size()), no = int(node.outputs.size());
  if (ni < schema->min_inputs || ni > schema->max_inputs || no < schema->min_outputs ||
      no > schema->max_outputs) {
    return violation("arity within the op's schema",
                     node.describe() + " has " + std::to_string(ni) + " inputs and " +
                         std::to_string(no) + " outputs; its schema allows " +
                         std::to_string(schema->min_inputs) + ".." +
                         std::to_string(schema->max_inputs) + " inputs and " +
                         std::to_string(schema->min_outputs) + ".." +
                         std::to_string(schema->max_outputs) + " outputs");
  }
  // Inputs before min_inputs are required, and inference reads them without looking (the
  // builder's check_supported refuses an omitted one in a model).
  for (int i = 0; i < ni; ++i) {
    if (node.inputs[i] < 0 && (i < schema->min_inputs || schema->traits.inputs_required)) {
      return violation(
          "required inputs are present",
          node.describe() + " input " + std::to_string(i) + " is omitted, but " +
              (schema->traits.inputs_required
                   ? std::string("none of its inputs may be")
                   : "its first " + std::to_string(schema->min_inputs) + " input(s) are required"));
    }
  }
  for (int v : node.inputs) {
    if (v < 0) continue;
    const ir::Value& val = g_.values[v];
    if (val.producer >= int(n) ||
        (val.producer < 0 && p_.values[v].storage == plan::Storage::kActivation)) {
      return violation("values are produced before they are read",
                       node.describe() + " (node " + std::to_string(n) + ") reads " + vname(v) +
                           ", produced by node " + std::to_string(val.producer));
    }
  }
  KILN_RETURN_IF_ERROR(check_guards(n));
  for (int v : node.outputs) {
    if (v < 0) continue;
    const plan::Storage st = p_.values[v].storage;
    if (g_.values[v].producer != int(n) || st == plan::Storage::kInput ||
        st == plan::Storage::kConstant || st == plan::Storage::kSymbolic) {
      return violation("a node writes only values it produces into writable storage",
                       node.describe() + " writes " + vname(v) + " (producer " +
                           std::to_string(g_.values[v].producer) + ", storage " +
                           std::to_string(int(st)) + ")");
    }
  }
  KILN_RETURN_IF_ERROR(check_inference(n, *schema));
  if (np.impl == plan::kControlImpl) return check_control(n);
  if (np.impl == plan::kAliasImpl) {
    if (!schema->traits.is_view || no != 1 || node.outputs[0] < 0 ||
        p_.values[node.outputs[0]].storage != plan::Storage::kAlias) {
      return violation(
          "alias nodes are views stored as aliases",
          node.describe() +
              " is planned as an alias but is not a view whose output is stored as one");
    }
    const int in = node.inputs.empty() ? -1 : node.inputs[0];
    const int root = in >= 0 ? root_of(in) : in;
    const int out = node.outputs[0];
    if (p_.values[out].alias_of != root) {
      return violation("a view's output aliases its input's bytes",
                       node.describe() + ": its output aliases '" +
                           g_.values[p_.values[out].alias_of].name + "', not its input's bytes");
    }
    return ok_status();
  }
  return check_kernel(n);
}

// Run-time loops pair up, nest, and keep their values inside (plan/loops.h).
Status Verifier::check_loops() {
  auto loops = plan::find_loops(g_);
  if (!loops.ok()) {
    return violation("run-time loops pair up, nest and keep their values inside",
                     loops.status().message());
  }
  loops_ = std::move(loops).value();
  return ok_status();
}

// The execution context runs only loop boundaries itself. A LoopEnd where some carried value's
// next value is a view of another carried value copies through its workspace, which must hold
// every carried value (plan_memory's rule), or the copies would read what they overwrote.
Status Verifier::check_control(size_t n) {
  const ir::Node& node = g_.nodes[n];
  const ops::OpKind kind = ops::find_op(node.domain, node.op_type);
  if (kind == ops::OpKind::kLoopBegin) return ok_status();
  if (kind != ops::OpKind::kLoopEnd) {
    return violation("the run itself runs only loop boundaries",
                     node.describe() + " is planned as '" + plan::kControlImpl +
                         "' but is not a kiln::LoopBegin or kiln::LoopEnd");
  }
  const ops::LoopEndLayout l =
      *ops::LoopEndLayout::of(node.inputs.size(), node.outputs.size());  // find_loops checked
  const size_t k = l.k;
  bool crossed = false;
  for (size_t j = 0; j < k; ++j) {
    for (size_t m = 0; m < k; ++m) {
      if (m != j && root_of(node.inputs[l.next(j)]) == root_of(node.inputs[l.carried(m)]))
        crossed = true;
    }
  }
  if (!crossed) return ok_status();
  const int ws = p_.nodes[n].workspace_slot;
  for (size_t ci = 0; ci < corners_.size(); ++ci) {
    const ir::SymbolValues& c = corners_[ci];
    int64_t need = 0;
    for (size_t j = 0; j < k; ++j) {
      KILN_ASSIGN_OR_RETURN(int64_t bytes, value_bytes(node.inputs[l.carried(j)], c));
      auto sum = checked_add(
          need, (bytes + plan::kLoopCopyAlign - 1) / plan::kLoopCopyAlign * plan::kLoopCopyAlign);
      if (!sum)
        return violation("value sizes fit int64",
                         node.describe() + "'s carried values at " + corner_str(c));
      need = *sum;
    }
    add_workspace(ci, need);
    int64_t have = 0;
    if (ws >= 0) {
      KILN_ASSIGN_OR_RETURN(have, slot_bytes(ws, c));
    }
    if (have < need) {
      return violation(
          "a loop whose next values view each other copies through a workspace that holds them",
          node.describe() + " needs " + std::to_string(need) + " bytes of workspace but slot " +
              std::to_string(ws) + " holds " + std::to_string(have) + " at " + corner_str(c));
    }
  }
  return ok_status();
}

// A node's guards name bool scalars computed before it, and a node reads a branch's values only
// where it runs in that branch too (kiln::SelectBranch, which picks the branch that ran, aside):
// otherwise it could read what the run never wrote.
Status Verifier::check_guards(size_t n) const {
  const ir::Node& node = g_.nodes[n];
  for (const ir::Guard& gd : node.guards) {
    if (gd.cond < 0 || size_t(gd.cond) >= g_.values.size()) {
      return violation("guards name values", node.describe() + " has a guard index out of range");
    }
    const ir::Value& c = g_.values[size_t(gd.cond)];
    if (c.dtype != DType::kBool || !c.shape || c.shape->size() > 1 ||
        (c.shape->size() == 1 && (*c.shape)[0] != ir::Dim(1)) || c.producer >= int(n) ||
        (c.producer < 0 && p_.values[size_t(gd.cond)].storage == plan::Storage::kActivation)) {
      return violation("a guard is a bool scalar computed before the node",
                       node.describe() + " runs under " + vname(gd.cond) + " (" +
                           ir::type_to_string(c) + ", produced by node " +
                           std::to_string(c.producer) + ")");
    }
  }
  if (ops::find_op(node.domain, node.op_type) == ops::OpKind::kSelectBranch)
    return check_select_inputs(n);
  for (int v : node.inputs) {
    const int p = v >= 0 ? g_.values[size_t(v)].producer : -1;
    if (p < 0 || p >= int(n)) continue;
    for (const ir::Guard& gd : g_.nodes[size_t(p)].guards) {
      if (std::find(node.guards.begin(), node.guards.end(), gd) == node.guards.end()) {
        return violation("a node reads a branch's values only inside that branch",
                         node.describe() + " reads " + vname(v) + ", which only runs when '" +
                             g_.values[size_t(gd.cond)].name + "' is " +
                             (gd.when ? "true" : "false") +
                             ", without running under that condition");
      }
    }
  }
  return ok_status();
}

// kiln::SelectBranch(cond, then..., else...) takes each output's two values from the branch that
// computes it: a then-value may run under its own guards and cond = true, an else-value under
// them and cond = false. Swapped (or taken from elsewhere in a branch), the output would be read
// from a node that did not run.
Status Verifier::check_select_inputs(size_t n) const {
  const ir::Node& node = g_.nodes[n];
  const size_t k = node.outputs.size();
  if (node.inputs.size() != 1 + 2 * k || node.inputs[0] < 0)
    return ok_status();  // check_inference names it
  const int cond = node.inputs[0];
  for (size_t i = 1; i < node.inputs.size(); ++i) {
    const int v = node.inputs[i];
    const int p = v >= 0 ? g_.values[size_t(v)].producer : -1;
    if (p < 0 || p >= int(n)) continue;
    const bool then = i <= k;
    for (const ir::Guard& gd : g_.nodes[size_t(p)].guards) {
      const bool own = gd.cond == cond && gd.when == then;
      if (own || std::find(node.guards.begin(), node.guards.end(), gd) != node.guards.end())
        continue;
      return violation(
          "a SelectBranch takes each value from the branch that computes it",
          node.describe() + " takes " + vname(v) + " as its " + (then ? "then" : "else") +
              "-value " + std::to_string(then ? i - 1 : i - 1 - k) + ", but it runs only when '" +
              g_.values[size_t(gd.cond)].name + "' is " + (gd.when ? "true" : "false"));
    }
  }
  return ok_status();
}

// The stored types and shapes are what the op's own inference gives on the stored inputs, so a
// kernel sized by them cannot read or write past a buffer (a changed op type, a dropped input).
Status Verifier::check_inference(size_t n, const ops::OpSchema& schema) {
  const ir::Node& node = g_.nodes[n];
  std::vector<ops::Constraint> constraints;  // proven by the builder over the profile box
  ops::InferContext ctx(g_, node, int(n), &constraints);
  ctx.set_data_dependent(&data_dependent_, false);
  ctx.set_symbol_ranges(&hull_);
  Status st = schema.infer(ctx);
  if (!st.ok()) {
    return violation("stored types follow from op inference",
                     node.describe() + ": " + st.message());
  }
  for (size_t o = 0; o < node.outputs.size(); ++o) {
    const int v = node.outputs[o];
    if (v < 0) continue;
    const auto& out = ctx.outputs()[o];
    const ir::Value& val = g_.values[v];
    if (!out.set || out.dtype != val.dtype || out.shape.size() != val.shape->size()) {
      return violation("stored types follow from op inference",
                       node.describe() + " output " + std::to_string(o) + " " + vname(v) +
                           " is stored as " + ir::type_to_string(val) + " but inference gives " +
                           std::string(dtype_name(out.dtype)) + " " +
                           ir::dims_to_string(out.shape));
    }
    for (size_t d = 0; d < out.shape.size(); ++d) {
      for (const auto& c : corners_) {
        auto want = out.shape[d].eval(c);
        auto have = (*val.shape)[d].eval(c);
        if (want ? (!have || *have != *want) : !(out.shape[d] == (*val.shape)[d])) {
          return violation("stored shapes follow from op inference",
                           node.describe() + " output " + std::to_string(o) + " " + vname(v) +
                               " dim " + std::to_string(d) + " is stored as " +
                               (*val.shape)[d].to_string() + " but inference gives " +
                               out.shape[d].to_string() + " at " + corner_str(c));
        }
      }
    }
  }
  return ok_status();
}

// The kernel the plan names exists for this device and op, and its workspace fits its slot.
Status Verifier::check_kernel(size_t n) {
  const ir::Node& node = g_.nodes[n];
  const std::string& id = p_.nodes[n].impl;
  const backends::KernelRegistry& registry = backends::kernel_registry();
  const backends::KernelImpl* impl = registry.find(id);
  if (!impl) {
    return unsupported(
        node.describe() + ": the engine uses kernel '" + id +
        "', which this build of kiln does not have; rebuild the engine with this kiln");
  }
  if (impl->device() != data_.backend->device()) {
    return invalid_argument(node.describe() + ": kernel '" + id + "' is for " +
                            std::string(device_name(impl->device())) + ", but the engine is for " +
                            std::string(device_name(data_.backend->device())));
  }
  // An edited file could pair a node with another op's kernel, which would misread its inputs
  // (and its workspace formula, asked below, would too).
  auto candidates = registry.candidates(ops::find_op(node.domain, node.op_type), impl->device());
  if (std::find(candidates.begin(), candidates.end(), impl) == candidates.end()) {
    return invalid_argument(node.describe() + ": kernel '" + id + "' does not implement " +
                            node.op_type);
  }
  const ir::Dim need = impl->workspace_bytes(data_.query(n));
  const int ws = p_.nodes[n].workspace_slot;
  for (size_t ci = 0; ci < corners_.size(); ++ci) {
    const ir::SymbolValues& c = corners_[ci];
    KILN_ASSIGN_OR_RETURN(int64_t bytes, eval(need, c, node.describe() + " workspace"));
    if (bytes <= 0) continue;
    add_workspace(ci, bytes);
    int64_t have = 0;
    if (ws >= 0) {
      KILN_ASSIGN_OR_RETURN(have, slot_bytes(ws, c));
    }
    if (have < bytes) {
      return violation("a kernel's workspace slot holds its workspace",
                       node.describe() + " needs " + std::to_string(bytes) +
                           " bytes of workspace but slot " + std::to_string(ws) + " holds " +
                           std::to_string(have) + " at " + corner_str(c));
    }
  }
  return ok_status();
}

}  // namespace verifier

}  // namespace kiln
