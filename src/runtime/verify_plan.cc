// verify_plan: run on every plan an Engine is made from (a loaded file, a deserialized buffer,
// from_plan, a fresh build), it re-establishes each invariant the runtime relies on, as a bytecode
// verifier does. The file's checksums are public (FNV-1a), so an edited plan behind recomputed
// checksums must be refused here, with a message naming the invariant, rather than crash a kernel.
// This file: the entry point, the tables, IO, profiles, shape values and formulas
// (plan_verifier.h).
#include <set>

#include "core/checked.h"
#include "runtime/plan_verifier.h"

namespace kiln {
namespace verifier {

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

// The formula at a corner; overflow or an unbound symbol is an error, never a wrap.
StatusOr<int64_t> Verifier::eval(const ir::Dim& d, const ir::SymbolValues& c,
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
StatusOr<int64_t> Verifier::value_bytes(int v, const ir::SymbolValues& c) const {
  const ir::Value& val = g_.values[v];
  int64_t n = 1;
  for (size_t i = 0; i < val.shape->size(); ++i) {
    KILN_ASSIGN_OR_RETURN(int64_t d,
                          eval((*val.shape)[i], c, vname(v) + " dim " + std::to_string(i)));
    auto m = d < 0 ? std::nullopt : checked_mul(n, d);
    if (!m) {
      return violation("value sizes are non-negative and fit int64",
                       vname(v) + " dim " + std::to_string(i) + " = " + std::to_string(d) + " at " +
                           corner_str(c) + " gives no valid size");
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

// from_plan takes plans the file parser never saw, so the structural checks are repeated here.
Status Verifier::check_tables() {
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
      return violation("indices in range", vname(int(v)) + " has slot " + std::to_string(vp.slot) +
                                               " and alias_of " + std::to_string(vp.alias_of) +
                                               "; there are " +
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

Status Verifier::check_io() {
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
      return violation("only graph inputs have input storage",
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
Status Verifier::check_data_dependent() const {
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
                std::to_string(ir::data_dependent_range(dd, p_.profiles[pi].symbols).lo) + ", hi]");
      }
    }
    known.insert(dd.symbol);
  }
  return ok_status();
}

// Shape-value inputs: each names a static engine input, once, with a value of its dtype and shape
// and a symbol or fixed number per element; each symbol is new, and every profile ranges it with
// the same [min, max] the runtime checks the values against.
Status Verifier::check_shape_values() const {
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

Status Verifier::check_profiles() {
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
                           where + ": input '" + g_.values[v].name + "' dim " + std::to_string(d) +
                               " range [" + std::to_string(range->min[d]) + ", " +
                               std::to_string(range->max[d]) + "] puts " + sym + " outside [" +
                               std::to_string(box->second.lo) + ", " +
                               std::to_string(box->second.hi) + "]");
        }
      }
    }
  }
  return ok_status();
}

}  // namespace verifier

Status verify_plan(const EngineData& data) { return verifier::Verifier(data).run(); }

}  // namespace kiln
