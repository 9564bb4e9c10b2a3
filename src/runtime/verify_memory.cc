// The plan verifier's memory checks: each value's storage, the arena slots, the lifetimes of values
// sharing a slot, and the bound on the arena a file may ask for.
#include <algorithm>
#include <limits>

#include "core/checked.h"
#include "ops/loop_end.h"
#include "runtime/plan_verifier.h"

namespace kiln {
namespace verifier {

Status Verifier::check_values() {
  used_.assign(g_.values.size(), 0);
  for (const ir::Node& node : g_.nodes) {
    for (const auto* list : {&node.inputs, &node.outputs}) {
      for (int v : *list) {
        if (v >= 0) used_[v] = 1;
      }
    }
  }
  for (size_t v = 0; v < g_.values.size(); ++v) {
    const int vi = int(v);
    const ir::Value& val = g_.values[v];
    const plan::ValuePlan& vp = p_.values[v];
    if (!used_[v] && !is_input_[v] && !is_output_[v]) continue;
    if (!val.shape || val.dtype == DType::kUndefined || dtype_size(val.dtype) == 0) {
      return violation("every value the runtime touches has a dtype and shape",
                       vname(vi) + " has none");
    }
    switch (vp.storage) {
      case plan::Storage::kConstant: {
        if (!val.constant) {
          return violation("constants have data", vname(vi) + " has constant storage but no data");
        }
        const Tensor& t = *val.constant;
        auto numel = checked_numel(t.shape());
        auto want = numel ? checked_mul(*numel, int64_t(dtype_size(val.dtype))) : std::nullopt;
        if (t.dtype() != val.dtype || !want || int64_t(t.nbytes()) != *want) {
          return violation("constant data is dtype_size*numel bytes of the value's dtype",
                           vname(vi) + " is " + std::string(dtype_name(val.dtype)) +
                               " but its data is " + std::string(dtype_name(t.dtype())) + " " +
                               shape_to_string(t.shape()) + " of " + std::to_string(t.nbytes()) +
                               " bytes");
        }
        if (t.shape().size() != val.shape->size()) {
          return violation("constant data matches the value's shape",
                           vname(vi) + " has shape " + ir::dims_to_string(*val.shape) +
                               " but data of shape " + shape_to_string(t.shape()));
        }
        for (size_t d = 0; d < t.shape().size(); ++d) {
          const ir::Dim& dim = (*val.shape)[d];
          if (!dim.is_const() || dim.value() != t.shape()[d]) {
            return violation("constant data matches the value's shape",
                             vname(vi) + " has shape " + ir::dims_to_string(*val.shape) +
                                 " but data of shape " + shape_to_string(t.shape()));
          }
        }
        break;
      }
      case plan::Storage::kSymbolic: {
        const DType dt = val.dtype;
        if (!val.sym_value || !(dt == DType::kInt64 || dt == DType::kInt32 || dt == DType::kBool ||
                                dt == DType::kUInt8 || dt == DType::kInt8 ||
                                dt == DType::kFloat32 || dt == DType::kFloat64)) {
          return violation("symbolic values are small integer (or exact float) formulas",
                           vname(vi) + " has symbolic storage with dtype " +
                               std::string(dtype_name(dt)) +
                               (val.sym_value ? "" : " and no formulas"));
        }
        if (vp.slot < 0) {
          return violation("stored values have an arena slot", vname(vi) + " has slot -1");
        }
        for (const auto& c : corners_) {
          KILN_ASSIGN_OR_RETURN(int64_t bytes, value_bytes(vi, c));
          const int64_t written = int64_t(val.sym_value->size()) * int64_t(dtype_size(dt));
          if (written != bytes) {
            return violation("symbolic values have one formula per element",
                             vname(vi) + " has " + std::to_string(val.sym_value->size()) +
                                 " formulas for " + std::to_string(bytes) + " bytes at " +
                                 corner_str(c));
          }
        }
        break;
      }
      case plan::Storage::kActivation:
        if (vp.slot < 0) {
          return violation("stored values have an arena slot", vname(vi) + " has slot -1");
        }
        if (val.producer < 0) {
          return violation("activations are produced", vname(vi) + " has no producer");
        }
        break;
      case plan::Storage::kOutput:
        if (val.producer < 0) {
          return violation("activations are produced", vname(vi) + " has no producer");
        }
        if (ir::names_data_dependent(*val.shape, p_.data_dependent)) {
          // The caller's buffer is only given once the run knows the size.
          return violation("outputs of data-dependent size are written into the arena",
                           vname(vi) + " " + ir::dims_to_string(*val.shape) +
                               " is stored as the caller's output");
        }
        break;
      case plan::Storage::kAlias: {
        // Only a view's output may be an alias: any other node would write into (and past)
        // the bytes of the value it aliases.
        if (val.producer < 0 || p_.nodes[val.producer].impl != plan::kAliasImpl) {
          return violation("aliases are produced by views",
                           vname(vi) + " is stored as an alias, but no view produces it");
        }
        const int root = vp.alias_of;
        if (root < 0 || p_.values[root].storage == plan::Storage::kAlias ||
            g_.values[root].dtype != val.dtype || !g_.values[root].shape) {
          return violation("aliases view a non-alias of the same dtype",
                           vname(vi) + " aliases value " + std::to_string(root));
        }
        for (const auto& c : corners_) {
          KILN_ASSIGN_OR_RETURN(int64_t a, value_bytes(vi, c));
          KILN_ASSIGN_OR_RETURN(int64_t b, value_bytes(root, c));
          if (a != b) {
            return violation("aliases have their root's byte size",
                             vname(vi) + " is " + std::to_string(a) + " bytes but its root " +
                                 vname(root) + " is " + std::to_string(b) + " at " + corner_str(c));
          }
        }
        break;
      }
      case plan::Storage::kInput:
        break;
    }
    for (const auto& c : corners_) KILN_RETURN_IF_ERROR(value_bytes(vi, c).status());
  }
  return ok_status();
}

Status Verifier::check_slots() {
  arena_total_.clear();
  for (const auto& c : corners_) {
    int64_t total = 0;
    for (size_t k = 0; k < p_.slot_bytes.size(); ++k) {
      KILN_ASSIGN_OR_RETURN(int64_t bytes, slot_bytes(int(k), c));
      auto aligned = checked_add(bytes, kArenaAlign - 1);
      auto sum = aligned ? checked_add(total, *aligned / kArenaAlign * kArenaAlign) : std::nullopt;
      if (bytes < 0 || !sum) {
        return violation("arena slots are non-negative and the arena fits int64",
                         "arena slot " + std::to_string(k) + " = " + p_.slot_bytes[k].to_string() +
                             " is " + std::to_string(bytes) + " bytes at " + corner_str(c));
      }
      total = *sum;
    }
    arena_total_.push_back(total);
  }
  for (size_t v = 0; v < g_.values.size(); ++v) {
    const plan::ValuePlan& vp = p_.values[v];
    if (vp.storage != plan::Storage::kActivation && vp.storage != plan::Storage::kSymbolic) {
      continue;
    }
    if (!used_[v] && !is_output_[v]) continue;
    for (const auto& c : corners_) {
      KILN_ASSIGN_OR_RETURN(int64_t need, value_bytes(int(v), c));
      KILN_ASSIGN_OR_RETURN(int64_t have, slot_bytes(vp.slot, c));
      if (have < need) {
        return violation("a value's arena slot holds its bytes",
                         vname(int(v)) + " needs " + std::to_string(need) +
                             " bytes but arena slot " + std::to_string(vp.slot) + " holds " +
                             std::to_string(have) + " at " + corner_str(c));
      }
    }
  }
  return ok_status();
}

// Values that share an arena slot are never live at once, or one would overwrite the other.
// A value is live from the node that writes it to its last reader (an alias's readers read its
// root); a graph output's bytes are copied out after the last node, a symbolic value is written
// before the first, and a workspace lives while its node runs. One overlap is allowed: node n
// writing its output 0 over the input its kernel overwrites in place (KernelImpl::in_place_input,
// asked of the registry, not of the file), n that input's last reader and no other input of n
// reading it (plan_memory's hand-over).
Status Verifier::check_lifetimes() {
  struct Use {
    int from, to;
    std::string who;
    int value = -1;
  };
  const int end = int(g_.nodes.size());
  auto root = [&](int v) { return root_of(v); };
  std::vector<int> last(g_.values.size(), -1);
  for (size_t v = 0; v < g_.values.size(); ++v) last[v] = g_.values[v].producer;
  for (int n = 0; n < end; ++n) {
    for (int v : g_.nodes[n].inputs) {
      if (v >= 0) last[root(v)] = std::max(last[root(v)], n);
    }
  }
  for (int v : g_.outputs) last[root(v)] = end;
  plan::extend_over_loops(g_, loops_, root, &last);
  // A loop's stacked outputs are written from its first iteration on (plan_memory's rule).
  std::vector<int> first(g_.values.size());
  for (size_t v = 0; v < g_.values.size(); ++v) first[v] = g_.values[v].producer;
  for (const plan::LoopRegion& r : loops_) {
    const ir::Node& end = g_.nodes[size_t(r.end)];
    const ops::LoopEndLayout l = *ops::LoopEndLayout::of(end.inputs.size(), end.outputs.size());
    for (size_t j = 0; j < l.q; ++j) {
      const int v = end.outputs[l.stacked(j)];
      if (v < 0) continue;
      first[size_t(v)] = r.begin;
      last[size_t(v)] = std::max(last[size_t(v)], r.end);
    }
  }
  std::vector<std::vector<Use>> uses(p_.slot_bytes.size());
  for (size_t v = 0; v < g_.values.size(); ++v) {
    const plan::ValuePlan& vp = p_.values[v];
    if (!used_[v] && !is_output_[v]) continue;
    if (vp.storage == plan::Storage::kActivation) {
      uses[vp.slot].push_back({first[v], last[v], vname(int(v)), int(v)});
    } else if (vp.storage == plan::Storage::kSymbolic) {
      uses[vp.slot].push_back({-1, end, vname(int(v))});
    }
  }
  for (int n = 0; n < end; ++n) {
    const int ws = p_.nodes[n].workspace_slot;
    if (ws >= 0) uses[ws].push_back({n, n, "the workspace of " + g_.nodes[n].describe()});
  }
  auto hands_over = [&](const Use& before, const Use& after) {
    const int n = after.from;
    if (before.value < 0 || after.value < 0 || before.to != n || n < 0 || n >= end) return false;
    const ir::Node& node = g_.nodes[size_t(n)];
    if (node.outputs.empty() || node.outputs[0] != after.value) return false;
    const backends::KernelImpl* impl = backends::kernel_registry().find(p_.nodes[size_t(n)].impl);
    const int k = impl ? impl->in_place_input() : -1;
    if (k < 0 || size_t(k) >= node.inputs.size() || node.inputs[size_t(k)] < 0 ||
        root(node.inputs[size_t(k)]) != before.value) {
      return false;
    }
    for (size_t j = 0; j < node.inputs.size(); ++j) {
      if (int(j) != k && node.inputs[j] >= 0 && root(node.inputs[j]) == before.value) return false;
    }
    return true;
  };
  for (size_t k = 0; k < uses.size(); ++k) {
    std::vector<Use>& u = uses[k];
    std::sort(u.begin(), u.end(), [](const Use& a, const Use& b) { return a.from < b.from; });
    size_t longest = 0;  // of the uses so far, the one live the latest
    for (size_t i = 1; i < u.size(); ++i) {
      if (u[i].from <= u[longest].to &&
          !(u[i].from == u[longest].to && hands_over(u[longest], u[i]))) {
        auto span = [](const Use& x) {
          return x.who + " (live at nodes " + std::to_string(x.from) + ".." + std::to_string(x.to) +
                 ")";
        };
        return violation(
            "values sharing an arena slot are never live at once",
            span(u[longest]) + " and " + span(u[i]) + " share arena slot " + std::to_string(k));
      }
      if (u[i].to > u[longest].to) longest = i;
    }
  }
  return ok_status();
}

void Verifier::add_workspace(size_t corner, int64_t bytes) {
  auto sum = checked_add(ws_total_[corner], bytes);
  ws_total_[corner] = sum ? *sum : std::numeric_limits<int64_t>::max();
}

// The arena is no larger than what its users need: plan_memory sizes each slot as the largest
// value or workspace it holds, so all slots together never pass the sum of every value with a
// slot and every node's workspace (slots aligned to 64 bytes). An engine file whose slots claim
// more (a 2.5 KB file asking for 4 GB of activation memory, found by engine_load_fuzz) would
// make every run allocate it: refused at load. The bound is twice that sum plus 64 MiB, so a
// library whose workspace query answers less on this machine than on the builder's (cuBLASLt,
// cuDNN) never refuses a good engine; what a file can make kiln allocate stays bounded by it.
Status Verifier::check_arena_bound() const {
  constexpr int64_t kSlack = int64_t(64) << 20;
  for (size_t ci = 0; ci < corners_.size(); ++ci) {
    const ir::SymbolValues& c = corners_[ci];
    std::optional<int64_t> need = ws_total_[ci];
    for (size_t v = 0; v < g_.values.size() && need; ++v) {
      if (p_.values[v].slot < 0) continue;
      StatusOr<int64_t> bytes = value_bytes(int(v), c);
      if (bytes.ok() && *bytes > 0) need = checked_add(*need, *bytes);
    }
    std::optional<int64_t> bound = need ? checked_add(*need, *need) : std::nullopt;
    if (bound) bound = checked_add(*bound, int64_t(p_.slot_bytes.size()) * kArenaAlign + kSlack);
    const int64_t total = arena_total_[ci];
    if (bound && total > *bound) {
      return violation("the arena holds no more than its values and workspaces need",
                       "its slots total " + std::to_string(total) + " bytes at " + corner_str(c) +
                           ", past " + std::to_string(*bound) + " bytes (twice the " +
                           std::to_string(*need) +
                           " bytes of every value with a slot and every workspace, and 64 MiB)");
    }
  }
  return ok_status();
}

// Every graph output is written on every path the guards allow: its producer runs under no
// guard (an If's result leaves its branches through a kiln::SelectBranch, which runs always). An
// output only a guarded node writes would be the arena's stale bytes whenever its branch is not
// taken.
Status Verifier::check_outputs_unguarded() const {
  for (int v : g_.outputs) {
    const int p = v >= 0 ? g_.values[size_t(v)].producer : -1;
    if (p < 0 || g_.nodes[size_t(p)].guards.empty()) continue;
    const ir::Guard& gd = g_.nodes[size_t(p)].guards[0];
    return violation("graph outputs are written whichever way the run goes",
                     "graph output " + vname(v) + " is written only by " +
                         g_.nodes[size_t(p)].describe() + ", which runs only when '" +
                         g_.values[size_t(gd.cond)].name + "' is " + (gd.when ? "true" : "false"));
  }
  return ok_status();
}

// The recorded producer writes the value (check_node saw the converse: a node writes only values
// recording it): a value whose producer no longer lists it, such as an engine output no node
// writes, would be read as whatever the arena held. With the storage checks (activations,
// outputs and views are produced), every value the run reads is written. Last, so the more
// specific invariants above name an edit first.
Status Verifier::check_producers_write() const {
  for (size_t v = 0; v < g_.values.size(); ++v) {
    const int producer = g_.values[v].producer;
    if (producer < 0) continue;
    const std::vector<int>& outs = g_.nodes[size_t(producer)].outputs;
    if (std::find(outs.begin(), outs.end(), int(v)) == outs.end()) {
      return violation("every value is written by the node recorded as its producer",
                       vname(int(v)) + " is written by no node (its recorded producer, " +
                           g_.nodes[size_t(producer)].describe() + ", does not write it)");
    }
  }
  return ok_status();
}

}  // namespace verifier

}  // namespace kiln
