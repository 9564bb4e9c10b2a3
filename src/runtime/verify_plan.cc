// verify_plan: run on every plan an Engine is made from (a loaded file, a deserialized buffer,
// from_plan, a fresh build), it re-establishes each invariant the runtime relies on, as a bytecode
// verifier does. The file's checksums are public (FNV-1a), so an edited plan behind recomputed
// checksums must be refused here, with a message naming the invariant, rather than crash a kernel.
#include <algorithm>
#include <limits>
#include <set>

#include "core/checked.h"
#include "ops/attribute_domains.h"
#include "ops/loop_end.h"
#include "ops/schema.h"
#include "plan/loops.h"
#include "runtime/engine_data.h"

namespace kiln {
namespace {

// Above this many symbols the 2^k corners of a profile's box are too many; the verifier then
// takes the all-min and all-max corners and each single symbol flipped from them.
constexpr size_t kMaxFullCornerSymbols = 10;
// ONNX's highest opset is in the twenties; anything far above is an edited file, not a new model.
constexpr int kMaxPlausibleOpset = 1000;
constexpr int64_t kArenaAlign = 64;  // the runtime arena's slot alignment

Status violation(const std::string& invariant, const std::string& details) {
  return invalid_argument("engine plan violates invariant '" + invariant + "': " + details);
}

std::string corner_str(const ir::SymbolValues& c) {
  std::string s;
  for (const auto& [name, v] : c) s += (s.empty() ? "" : ", ") + name + "=" + std::to_string(v);
  return s.empty() ? "(no symbols)" : s;
}

// The points the verifier evaluates formulas at: the corners of every profile's symbol box.
std::vector<ir::SymbolValues> profile_corners(const plan::Plan& p) {
  std::vector<ir::SymbolValues> out;
  for (const plan::Profile& prof : p.profiles) {
    std::vector<std::pair<std::string, ir::Interval>> syms(prof.symbols.begin(),
                                                           prof.symbols.end());
    ir::SymbolValues lo, hi;
    for (const auto& [name, r] : syms) lo[name] = r.lo, hi[name] = r.hi;
    if (syms.size() <= kMaxFullCornerSymbols) {
      for (uint32_t mask = 0; mask < (1u << syms.size()); ++mask) {
        ir::SymbolValues c;
        for (size_t i = 0; i < syms.size(); ++i) {
          c[syms[i].first] = mask >> i & 1 ? syms[i].second.hi : syms[i].second.lo;
        }
        out.push_back(std::move(c));
      }
      continue;
    }
    out.push_back(lo);
    out.push_back(hi);
    for (const auto& [name, r] : syms) {
      ir::SymbolValues a = lo, b = hi;
      a[name] = r.hi;
      b[name] = r.lo;
      out.push_back(std::move(a));
      out.push_back(std::move(b));
    }
  }
  if (out.empty()) out.emplace_back();  // a static engine: formulas are constants
  return out;
}

class Verifier {
 public:
  explicit Verifier(const EngineData& data)
      : data_(data), p_(data.plan), g_(data.plan.graph), corners_(profile_corners(data.plan)) {}

  Status run() {
    KILN_RETURN_IF_ERROR(check_tables());
    KILN_RETURN_IF_ERROR(check_io());
    KILN_RETURN_IF_ERROR(check_profiles());
    KILN_RETURN_IF_ERROR(check_shape_values());
    KILN_RETURN_IF_ERROR(check_data_dependent());
    KILN_RETURN_IF_ERROR(check_values());
    KILN_RETURN_IF_ERROR(check_slots());
    KILN_RETURN_IF_ERROR(check_loops());
    KILN_RETURN_IF_ERROR(check_lifetimes());
    ws_total_.assign(corners_.size(), 0);
    for (size_t n = 0; n < g_.nodes.size(); ++n) KILN_RETURN_IF_ERROR(check_node(n));
    KILN_RETURN_IF_ERROR(check_arena_bound());
    KILN_RETURN_IF_ERROR(check_outputs_unguarded());
    return check_producers_write();
  }

 private:
  std::string vname(int v) const { return "value '" + g_.values[v].name + "'"; }
  // The value whose bytes v is: its root for an alias (check_values has checked alias_of).
  int root_of(int v) const {
    return p_.values[v].storage == plan::Storage::kAlias ? p_.values[v].alias_of : v;
  }

  // The recorded producer writes the value (check_node saw the converse: a node writes only values
  // recording it): a value whose producer no longer lists it, such as an engine output no node
  // writes, would be read as whatever the arena held. With the storage checks (activations,
  // outputs and views are produced), every value the run reads is written. Last, so the more
  // specific invariants above name an edit first.
  // Every graph output is written on every path the guards allow: its producer runs under no
  // guard (an If's result leaves its branches through a kiln::SelectBranch, which runs always). An
  // output only a guarded node writes would be the arena's stale bytes whenever its branch is not
  // taken.
  Status check_outputs_unguarded() const {
    for (int v : g_.outputs) {
      const int p = v >= 0 ? g_.values[size_t(v)].producer : -1;
      if (p < 0 || g_.nodes[size_t(p)].guards.empty()) continue;
      const ir::Guard& gd = g_.nodes[size_t(p)].guards[0];
      return violation("graph outputs are written whichever way the run goes",
                       "graph output " + vname(v) + " is written only by " +
                           g_.nodes[size_t(p)].describe() + ", which runs only when '" +
                           g_.values[size_t(gd.cond)].name + "' is " +
                           (gd.when ? "true" : "false"));
    }
    return ok_status();
  }

  Status check_producers_write() const {
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

  // The formula at a corner; overflow or an unbound symbol is an error, never a wrap.
  StatusOr<int64_t> eval(const ir::Dim& d, const ir::SymbolValues& c,
                         const std::string& what) const {
    auto x = d.eval(c);
    if (!x) {
      return violation("formulas evaluate over every profile",
                       what + " = " + d.to_string() +
                           " cannot be evaluated (overflow or unknown symbol) at " + corner_str(c));
    }
    return *x;
  }

  // A value's size in bytes at a corner, with checked arithmetic.
  StatusOr<int64_t> value_bytes(int v, const ir::SymbolValues& c) const {
    const ir::Value& val = g_.values[v];
    int64_t n = 1;
    for (size_t i = 0; i < val.shape->size(); ++i) {
      KILN_ASSIGN_OR_RETURN(int64_t d,
                            eval((*val.shape)[i], c, vname(v) + " dim " + std::to_string(i)));
      auto m = d < 0 ? std::nullopt : checked_mul(n, d);
      if (!m) {
        return violation("value sizes are non-negative and fit int64",
                         vname(v) + " dim " + std::to_string(i) + " = " + std::to_string(d) +
                             " at " + corner_str(c) + " gives no valid size");
      }
      n = *m;
    }
    auto bytes = checked_mul(n, int64_t(dtype_size(val.dtype)));
    if (!bytes) {
      return violation(
          "value sizes are non-negative and fit int64",
          vname(v) + " has " + std::to_string(n) + " elements, too many bytes at " + corner_str(c));
    }
    return *bytes;
  }

  StatusOr<int64_t> slot_bytes(int slot, const ir::SymbolValues& c) const {
    return eval(p_.slot_bytes[slot], c, "arena slot " + std::to_string(slot));
  }

  // from_plan takes plans the file parser never saw, so the structural checks are repeated here.
  Status check_tables() {
    const int64_t nv = int64_t(g_.values.size()), nn = int64_t(g_.nodes.size());
    if (p_.values.size() != g_.values.size() || p_.nodes.size() != g_.nodes.size()) {
      return violation("plan tables parallel the graph",
                       std::to_string(p_.values.size()) + " value plans for " + std::to_string(nv) +
                           " values, " + std::to_string(p_.nodes.size()) + " node plans for " +
                           std::to_string(nn) + " nodes");
    }
    for (int64_t v = 0; v < nv; ++v) {
      const ir::Value& val = g_.values[v];
      const plan::ValuePlan& vp = p_.values[v];
      if (val.producer < -1 || val.producer >= nn) {
        return violation("indices in range",
                         vname(int(v)) + " has producer " + std::to_string(val.producer));
      }

      if (vp.slot < -1 || vp.slot >= int64_t(p_.slot_bytes.size()) || vp.alias_of < -1 ||
          vp.alias_of >= nv) {
        return violation("indices in range", vname(int(v)) + " has slot " +
                                                 std::to_string(vp.slot) + " and alias_of " +
                                                 std::to_string(vp.alias_of) + "; there are " +
                                                 std::to_string(p_.slot_bytes.size()) + " slots");
      }
      if (uint8_t(vp.storage) > uint8_t(plan::Storage::kAlias)) {
        return violation("storage kinds known",
                         vname(int(v)) + " has storage " + std::to_string(int(vp.storage)));
      }
    }
    for (int64_t n = 0; n < nn; ++n) {
      const ir::Node& node = g_.nodes[n];
      for (const auto* list : {&node.inputs, &node.outputs}) {
        for (int idx : *list) {
          if (idx < -1 || idx >= nv) {
            return violation("indices in range", node.describe() + " refers to value " +
                                                     std::to_string(idx) + "; there are " +
                                                     std::to_string(nv));
          }
        }
      }
      int ws = p_.nodes[n].workspace_slot;
      if (ws < -1 || ws >= int64_t(p_.slot_bytes.size())) {
        return violation("indices in range",
                         node.describe() + " has workspace slot " + std::to_string(ws));
      }
    }
    for (const auto* list : {&g_.inputs, &g_.outputs}) {
      for (int idx : *list) {
        if (idx < 0 || idx >= nv) {
          return violation("indices in range", "graph IO refers to value " + std::to_string(idx));
        }
      }
    }
    return ok_status();
  }

  Status check_io() {
    is_input_.assign(g_.values.size(), 0);
    is_output_.assign(g_.values.size(), 0);
    for (int v : g_.inputs) {
      if (is_input_[v]++) {
        return violation("graph inputs are distinct", vname(v) + " is listed twice");
      }
    }
    for (int v : g_.outputs) {
      // A graph output listed twice was bound to two output buffers of one value: the run freed
      // one while the other still pointed at it (a heap use-after-free); the ONNX path refused it.
      if (is_output_[v]++) {
        return violation("graph outputs are distinct", vname(v) + " is listed twice");
      }
    }
    for (size_t v = 0; v < g_.values.size(); ++v) {
      const int vi = int(v);
      const ir::Value& val = g_.values[v];
      const plan::Storage st = p_.values[v].storage;
      if (is_input_[v] != (st == plan::Storage::kInput)) {
        return violation(
            "only graph inputs have input storage",
            vname(vi) + (is_input_[v] ? " is a graph input but not stored as one"
                                      : " has input storage but is not a graph input"));
      }
      if (st == plan::Storage::kOutput && (!is_output_[v] || is_input_[v])) {
        return violation("only graph outputs have output storage",
                         vname(vi) + " has output storage but is " +
                             (is_input_[v] ? "a graph input" : "not a graph output"));
      }
      if ((is_input_[v] || is_output_[v]) && (!val.shape || val.dtype == DType::kUndefined)) {
        return violation("IO tensors have a dtype and shape",
                         vname(vi) + " is a graph IO tensor without one");
      }
      if (is_input_[v] && (val.producer >= 0 || val.constant)) {
        return violation("graph inputs are not computed",
                         vname(vi) + " is a graph input with a producer or data");
      }
    }
    return ok_status();
  }

  // The runtime checks input shapes only against the profile's input ranges and derives symbols
  // from them, so those ranges must stay inside the symbol boxes every other check is made over.
  // Data-dependent dims are no input's symbols, each profile ranges them over [0, hi], and their
  // bounds name only input symbols and earlier data-dependent dims (the runtime sizes them in
  // order).
  Status check_data_dependent() const {
    std::set<std::string> known;
    for (int v : g_.inputs) {
      for (const auto& d : *g_.values[v].shape) d.collect_symbols(&known);
    }
    for (const plan::ShapeValueInput& sv : p_.shape_values) {
      for (const std::string& sym : sv.symbols) {
        if (!sym.empty()) known.insert(sym);
      }
    }
    for (const ir::DataDependentDim& dd : p_.data_dependent) {
      if (known.count(dd.symbol)) {
        return violation(
            "data-dependent dims are new symbols",
            dd.symbol + " is already a symbol of the inputs or an earlier data-dependent dim");
      }
      std::set<std::string> in_bound;
      dd.bound.collect_symbols(&in_bound);
      dd.lower.collect_symbols(&in_bound);
      for (const std::string& x : in_bound) {
        if (!known.count(x)) {
          return violation("data-dependent bounds name earlier symbols",
                           "the bounds of " + dd.symbol + ", [" + dd.lower.to_string() + ", " +
                               dd.bound.to_string() + "], name " + x);
        }
      }
      // The proof took the dim from its lower bound: the profile must say the same, and the run
      // refuses a size below it.
      for (size_t pi = 0; pi < p_.profiles.size(); ++pi) {
        auto r = p_.profiles[pi].symbols.find(dd.symbol);
        if (r == p_.profiles[pi].symbols.end() ||
            r->second.lo != ir::data_dependent_range(dd, p_.profiles[pi].symbols).lo) {
          return violation(
              "profiles range data-dependent dims from their lower bound",
              "profile " + std::to_string(pi) + " gives " + dd.symbol + " no range [" +
                  std::to_string(ir::data_dependent_range(dd, p_.profiles[pi].symbols).lo) +
                  ", hi]");
        }
      }
      known.insert(dd.symbol);
    }
    return ok_status();
  }

  // Shape-value inputs: each names a static engine input, once, with a value of its dtype and shape
  // and a symbol or fixed number per element; each symbol is new, and every profile ranges it with
  // the same [min, max] the runtime checks the values against.
  Status check_shape_values() const {
    std::set<std::string> dims, seen_inputs, seen_symbols;
    for (int v : g_.inputs) {
      for (const auto& d : *g_.values[v].shape) d.collect_symbols(&dims);
    }
    for (const plan::ShapeValueInput& sv : p_.shape_values) {
      int v = -1;
      for (int in : g_.inputs) {
        if (g_.values[in].name == sv.name) v = in;
      }
      if (v < 0 || !seen_inputs.insert(sv.name).second) {
        return violation("shape-value inputs are engine inputs, listed once", "'" + sv.name + "'");
      }
      const ir::Value& val = g_.values[v];
      Shape shape;
      for (const auto& d : *val.shape) shape.push_back(d.is_const() ? d.value() : -1);
      if (sv.fixed.dtype() != val.dtype || sv.fixed.shape() != shape ||
          int64_t(sv.symbols.size()) != sv.fixed.numel()) {
        return violation("a shape-value input's value has its dtype and static shape",
                         "'" + sv.name + "' is " + std::string(dtype_name(val.dtype)) +
                             ir::dims_to_string(*val.shape) + ", its value " +
                             std::string(dtype_name(sv.fixed.dtype())) +
                             shape_to_string(sv.fixed.shape()) + " with " +
                             std::to_string(sv.symbols.size()) + " elements");
      }
      for (size_t i = 0; i < sv.symbols.size(); ++i) {
        const std::string& sym = sv.symbols[i];
        if (sym.empty()) continue;
        if (!is_integer(val.dtype) && val.dtype != DType::kBool) {
          return violation("only integer shape values are symbols",
                           "'" + sv.name + "' is " + std::string(dtype_name(val.dtype)));
        }
        if (dims.count(sym) || !seen_symbols.insert(sym).second) {
          return violation("shape-value symbols are new symbols", sym + " of '" + sv.name + "'");
        }
        for (size_t pi = 0; pi < p_.profiles.size(); ++pi) {
          const plan::Profile& prof = p_.profiles[pi];
          auto box = prof.symbols.find(sym);
          const plan::InputRange* range = nullptr;
          for (const auto& r : prof.values) {
            if (r.name == sv.name) range = &r;
          }
          if (box == prof.symbols.end() || !range || range->min.size() != sv.symbols.size() ||
              range->max.size() != sv.symbols.size() || range->opt.size() != sv.symbols.size() ||
              range->min[i] != box->second.lo || range->max[i] != box->second.hi ||
              range->opt[i] < range->min[i] || range->opt[i] > range->max[i]) {
            return violation("every profile ranges each shape value as its symbol",
                             "profile " + std::to_string(pi) + ", '" + sv.name + "' element " +
                                 std::to_string(i) + " (" + sym + ")");
          }
        }
      }
    }
    for (size_t pi = 0; pi < p_.profiles.size(); ++pi) {
      for (const auto& r : p_.profiles[pi].values) {
        if (!seen_inputs.count(r.name)) {
          return violation("profile values name shape-value inputs",
                           "profile " + std::to_string(pi) + " gives values for '" + r.name + "'");
        }
      }
    }
    return ok_status();
  }

  Status check_profiles() {
    for (size_t pi = 0; pi < p_.profiles.size(); ++pi) {
      const plan::Profile& prof = p_.profiles[pi];
      const std::string where = "profile " + std::to_string(pi);
      for (const plan::InputRange& r : prof.inputs) {
        int v = -1;
        for (int in : g_.inputs) {
          if (g_.values[in].name == r.name) v = in;
        }
        if (v < 0) {
          return violation("profiles name engine inputs",
                           where + " names '" + r.name + "', not an input");
        }
        const auto& shape = *g_.values[v].shape;
        if (r.min.size() != shape.size() || r.opt.size() != shape.size() ||
            r.max.size() != shape.size()) {
          return violation("profile ranks match inputs",
                           where + " gives input '" + r.name + "' rank " +
                               std::to_string(r.min.size()) + ", the input has rank " +
                               std::to_string(shape.size()));
        }
      }
      for (int v : g_.inputs) {
        const auto& shape = *g_.values[v].shape;
        const plan::InputRange* range = nullptr;
        for (const plan::InputRange& r : prof.inputs) {
          if (r.name == g_.values[v].name) range = &r;
        }
        for (size_t d = 0; d < shape.size(); ++d) {
          if (shape[d].is_const()) continue;
          std::string sym;
          int64_t coeff = 0, offset = 0;
          if (!shape[d].as_linear(&sym, &coeff, &offset) || coeff <= 0) {
            continue;  // make_engine_data names it
          }
          auto box = prof.symbols.find(sym);
          if (!range || box == prof.symbols.end()) {
            return violation("every dynamic input dim is bounded by every profile",
                             where + " bounds no range for input '" + g_.values[v].name + "' dim " +
                                 std::to_string(d) + " (" + shape[d].to_string() + ")");
          }
          // dim = coeff*sym + offset, and the runtime takes only dims where that sym is an
          // integer: the range admits sym in [ceil((min-offset)/coeff), floor((max-offset)/coeff)].
          int64_t a = 0, b = 0;
          const bool fits = !__builtin_sub_overflow(range->min[d], offset, &a) &&
                            !__builtin_sub_overflow(range->max[d], offset, &b);
          const int64_t sym_lo = a / coeff + (a % coeff > 0), sym_hi = b / coeff - (b % coeff < 0);
          if (!fits || (sym_lo <= sym_hi && (sym_lo < box->second.lo || sym_hi > box->second.hi))) {
            return violation("input ranges lie inside the profile's symbol box",
                             where + ": input '" + g_.values[v].name + "' dim " +
                                 std::to_string(d) + " range [" + std::to_string(range->min[d]) +
                                 ", " + std::to_string(range->max[d]) + "] puts " + sym +
                                 " outside [" + std::to_string(box->second.lo) + ", " +
                                 std::to_string(box->second.hi) + "]");
          }
        }
      }
    }
    return ok_status();
  }

  Status check_values() {
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
            return violation("constants have data",
                             vname(vi) + " has constant storage but no data");
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
          if (!val.sym_value || !(dt == DType::kInt64 || dt == DType::kInt32 ||
                                  dt == DType::kBool || dt == DType::kUInt8 || dt == DType::kInt8 ||
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
                                   vname(root) + " is " + std::to_string(b) + " at " +
                                   corner_str(c));
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

  Status check_slots() {
    arena_total_.clear();
    for (const auto& c : corners_) {
      int64_t total = 0;
      for (size_t k = 0; k < p_.slot_bytes.size(); ++k) {
        KILN_ASSIGN_OR_RETURN(int64_t bytes, slot_bytes(int(k), c));
        auto aligned = checked_add(bytes, kArenaAlign - 1);
        auto sum =
            aligned ? checked_add(total, *aligned / kArenaAlign * kArenaAlign) : std::nullopt;
        if (bytes < 0 || !sum) {
          return violation("arena slots are non-negative and the arena fits int64",
                           "arena slot " + std::to_string(k) + " = " +
                               p_.slot_bytes[k].to_string() + " is " + std::to_string(bytes) +
                               " bytes at " + corner_str(c));
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
  Status check_lifetimes() {
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
        if (int(j) != k && node.inputs[j] >= 0 && root(node.inputs[j]) == before.value)
          return false;
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
            return x.who + " (live at nodes " + std::to_string(x.from) + ".." +
                   std::to_string(x.to) + ")";
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

  Status check_node(size_t n) {
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
        return violation("required inputs are present",
                         node.describe() + " input " + std::to_string(i) + " is omitted, but " +
                             (schema->traits.inputs_required
                                  ? std::string("none of its inputs may be")
                                  : "its first " + std::to_string(schema->min_inputs) +
                                        " input(s) are required"));
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
  Status check_loops() {
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
  Status check_control(size_t n) {
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
  Status check_guards(size_t n) const {
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
  Status check_select_inputs(size_t n) const {
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
  Status check_inference(size_t n, const ops::OpSchema& schema) {
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

  void add_workspace(size_t corner, int64_t bytes) {
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
  Status check_arena_bound() const {
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

  // The kernel the plan names exists for this device and op, and its workspace fits its slot.
  Status check_kernel(size_t n) {
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
                              std::string(device_name(impl->device())) +
                              ", but the engine is for " +
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

  const EngineData& data_;
  const plan::Plan& p_;
  const ir::Graph& g_;
  const std::vector<ir::SymbolValues> corners_;
  std::vector<ir::DataDependentDim> data_dependent_ = p_.data_dependent;  // inference's copy
  ir::SymbolRanges hull_ = plan::symbol_hull(p_.profiles);  // as the builder simplified over
  std::vector<char> is_input_, is_output_, used_;
  std::vector<plan::LoopRegion> loops_;
  std::vector<int64_t> arena_total_;  // per corner: the slots' aligned bytes (check_slots)
  std::vector<int64_t> ws_total_;  // per corner: the workspaces check_node found the kernels need
};

}  // namespace

Status verify_plan(const EngineData& data) { return Verifier(data).run(); }

}  // namespace kiln
