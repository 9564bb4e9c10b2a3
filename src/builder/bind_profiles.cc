// Pass bind_profiles: gives every dynamic input dim a symbol and, per profile, a range for each
// symbol. A dim written c*s + k (exporters write "4*h") bounds s to the values whose dim lies in
// [min, max]; any other dynamic expression becomes a fresh symbol of its own.
#include <algorithm>
#include <map>
#include <set>

#include "builder/build_state.h"

namespace kiln::builder {
namespace {

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

std::string describe_inputs(const ir::Graph& g) {
  std::string s;
  for (int v : g.inputs) {
    const ir::Value& val = g.values[v];
    bool dynamic = false;
    for (const auto& d : *val.shape) dynamic |= !d.is_const();
    if (dynamic) s += "\n  " + val.name + ": " + ir::dims_to_string(*val.shape);
  }
  return s;
}

int64_t floor_mod(int64_t a, int64_t b) { return a - floor_div(a, b) * b; }

// Steps (OptimizationProfile::set_dimensions with steps): a symbol whose dim a profile steps by k
// takes only the values on that lattice. It is replaced in every input dim by m*t + r, t a new
// symbol "<s>_step<m>", so shape inference and the profile proof see exactly those values (an
// FPN's 2*floor(h/2) = h holds for h = 32*t) and the runtime's c*symbol + k binding refuses the
// others by name. Every profile must step a symbol the same way: the engine has one formula per
// input dim.
Status apply_steps(ir::Graph& g, const std::vector<OptimizationProfile>& profiles,
                   const BuilderConfig::ShapeLog& log) {
  struct Lattice {
    int64_t m, r;
    std::string where;
  };
  std::map<std::string, Lattice> lattice;
  auto describe = [&](size_t p, const ir::Value& val, size_t d) {
    return "profile " + std::to_string(p) + ": input '" + val.name + "' dim " + std::to_string(d) + " (" +
           (*val.shape)[d].to_string() + ")";
  };
  // The lattice each profile's steps give, per symbol: (m, r) for dims c*s + k stepped by c*m.
  for (size_t p = 0; p < profiles.size(); ++p) {
    for (int v : g.inputs) {
      const ir::Value& val = g.values[size_t(v)];
      auto it = profiles[p].inputs().find(val.name);
      if (it == profiles[p].inputs().end() || it->second.steps.size() != val.shape->size()) continue;
      const OptimizationProfile::Dims& dims = it->second;
      for (size_t d = 0; d < dims.steps.size(); ++d) {
        const int64_t step = dims.steps[d];
        if (step == 1) continue;
        const std::string where = describe(p, val, d);
        const ir::Dim& dim = (*val.shape)[d];
        if (dim.is_const()) {
          return invalid_argument(where + " is fixed by the model; it takes no step (give 1)");
        }
        std::string sym;
        int64_t c = 1, k = 0;
        dim.as_linear(&sym, &c, &k);
        if (step % c != 0 || (dims.min[d] - k) % c != 0) {
          return invalid_argument(where + ": a step of " + std::to_string(step) + " from min " +
                                  std::to_string(dims.min[d]) + " is not a whole number of steps of " + sym);
        }
        const int64_t m = step / c, r = floor_mod((dims.min[d] - k) / c, m);
        auto [li, inserted] = lattice.emplace(sym, Lattice{m, r, where});
        if (!inserted && (li->second.m != m || li->second.r != r)) {
          return invalid_argument(where + " steps " + sym + " by " + std::to_string(m) + " from " +
                                  std::to_string(r) + ", but " + li->second.where + " steps it by " +
                                  std::to_string(li->second.m) + " from " + std::to_string(li->second.r) +
                                  "; every profile must give a symbol the same steps");
        }
      }
    }
  }
  if (lattice.empty()) return ok_status();
  // A profile that leaves a stepped symbol's dim unstepped would have it take every value.
  for (size_t p = 0; p < profiles.size(); ++p) {
    for (int v : g.inputs) {
      const ir::Value& val = g.values[size_t(v)];
      auto it = profiles[p].inputs().find(val.name);
      if (it == profiles[p].inputs().end()) continue;
      for (size_t d = 0; d < val.shape->size(); ++d) {
        std::string sym;
        int64_t c = 1, k = 0;
        if (!(*val.shape)[d].as_linear(&sym, &c, &k)) continue;
        auto li = lattice.find(sym);
        if (li == lattice.end()) continue;
        const auto& steps = it->second.steps;
        const int64_t step = d < steps.size() ? steps[d] : 1;
        if (step != c * li->second.m) {
          return invalid_argument(describe(p, val, d) + " has step " + std::to_string(step) + ", but " +
                                  li->second.where + " steps " + sym + " by " + std::to_string(li->second.m) +
                                  "; every profile must give a symbol the same steps");
        }
      }
    }
  }
  std::set<std::string> taken;
  for (int v : g.inputs) {
    for (const ir::Dim& dim : *g.values[size_t(v)].shape) dim.collect_symbols(&taken);
  }
  for (const auto& [sym, l] : lattice) {
    const std::string name = sym + "_step" + std::to_string(l.m);
    if (taken.count(name)) {
      return invalid_argument("the model already has a symbol '" + name + "', the name the steps of " + sym +
                              " (" + l.where + ") would take");
    }
  }
  for (int v : g.inputs) {
    for (ir::Dim& dim : *g.values[size_t(v)].shape) {
      std::string sym;
      int64_t c = 1, k = 0;
      if (dim.is_const() || !dim.as_linear(&sym, &c, &k)) continue;
      auto li = lattice.find(sym);
      if (li == lattice.end()) continue;
      const ir::Dim t = ir::Dim::symbol(sym + "_step" + std::to_string(li->second.m));
      dim = ir::Dim(c) * (ir::Dim(li->second.m) * t + li->second.r) + k;
    }
  }
  if (log) {
    for (const auto& [sym, l] : lattice) {
      log("steps: " + sym + " = " + (ir::Dim(l.m) * ir::Dim::symbol(sym + "_step" + std::to_string(l.m)) + l.r).to_string() +
          " (from " + l.where + ")");
    }
  }
  return ok_status();
}

}  // namespace

Status bind_profiles(BuildState& s) {
  ir::Graph& g = s.graph;
  std::set<std::string> dynamic_inputs;
  for (int v : g.inputs) {
    ir::Value& val = g.values[v];
    if (!val.shape) return invalid_model("graph input '" + val.name + "' has no shape");
    for (size_t d = 0; d < val.shape->size(); ++d) {
      ir::Dim& dim = (*val.shape)[d];
      if (dim.is_const()) continue;
      dynamic_inputs.insert(val.name);
      std::string sym;
      int64_t c, k;
      if (!dim.as_linear(&sym, &c, &k) || c <= 0) {
        dim = ir::Dim::symbol(val.name + "_d" + std::to_string(d));
      }
    }
  }
  const auto& profiles = s.config.profiles();
  KILN_RETURN_IF_ERROR(apply_steps(g, profiles, s.config.shape_log()));
  if (profiles.empty() && !dynamic_inputs.empty()) {
    return invalid_argument("the model has dynamic inputs but the config has no optimization profile; "
                            "add one with min/opt/max shapes for:" + describe_inputs(g));
  }
  for (size_t p = 0; p < std::max<size_t>(profiles.size(), 1); ++p) {
    plan::Profile out;
    std::string where = "profile " + std::to_string(p);
    std::set<std::string> missing;
    if (!profiles.empty()) {
      for (const auto& [name, dims] : profiles[p].inputs()) {
        bool found = false;
        for (int v : g.inputs) found |= g.values[v].name == name;
        if (!found) {
          return invalid_argument(where + " sets shapes for '" + name + "', which is not an input of the model");
        }
      }
    }
    for (int v : g.inputs) {
      const ir::Value& val = g.values[v];
      const auto& shape = *val.shape;
      const OptimizationProfile::Dims* dims = nullptr;
      if (!profiles.empty()) {
        auto it = profiles[p].inputs().find(val.name);
        if (it != profiles[p].inputs().end()) dims = &it->second;
      }
      if (!dims) {
        if (dynamic_inputs.count(val.name)) missing.insert(val.name);
        continue;
      }
      if (dims->min.size() != shape.size()) {
        return invalid_argument(where + ": input '" + val.name + "' has rank " + std::to_string(shape.size()) +
                                " (" + ir::dims_to_string(shape) + ") but the profile gives rank " +
                                std::to_string(dims->min.size()));
      }
      out.inputs.push_back({val.name, dims->min, dims->opt, dims->max});
      for (size_t d = 0; d < shape.size(); ++d) {
        std::string dim_where = where + ": input '" + val.name + "' dim " + std::to_string(d) + " (" +
                                shape[d].to_string() + ")";
        if (shape[d].is_const()) {
          int64_t c = shape[d].value();
          if (dims->min[d] != c || dims->max[d] != c || dims->opt[d] != c) {
            return invalid_argument(dim_where + " is fixed at " + std::to_string(c) + " by the model, but the profile gives min " +
                                    std::to_string(dims->min[d]) + ", opt " + std::to_string(dims->opt[d]) +
                                    ", max " + std::to_string(dims->max[d]));
          }
          continue;
        }
        std::string sym;
        int64_t c = 1, k = 0;
        shape[d].as_linear(&sym, &c, &k);
        ir::Interval r{ceil_div(dims->min[d] - k, c), floor_div(dims->max[d] - k, c)};
        auto [it, inserted] = out.symbols.emplace(sym, r);
        if (!inserted) it->second = {std::max(it->second.lo, r.lo), std::min(it->second.hi, r.hi)};
        if (it->second.lo > it->second.hi || it->second.hi < 0) {
          return invalid_argument(dim_where + ": no value of " + sym + " gives a dim in [" +
                                  std::to_string(dims->min[d]) + ", " + std::to_string(dims->max[d]) +
                                  "] consistent with the model's other dims that use " + sym);
        }
        // An opt that no symbol value reaches is a user error worth naming now.
        int64_t opt_rest = dims->opt[d] - k;
        if (opt_rest % c != 0) {
          return invalid_argument(dim_where + ": opt " + std::to_string(dims->opt[d]) + " is not of the form " +
                                  shape[d].to_string());
        }
        if (p == 0) s.opt_symbols[sym] = opt_rest / c;
      }
    }
    if (!missing.empty()) {
      std::string list;
      for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
      return invalid_argument(where + " gives no shapes for dynamic input(s) " + list +
                              "; every dynamic input needs min/opt/max shapes:" + describe_inputs(g));
    }
    if (p == 0) {
      for (const auto& [sym, range] : out.symbols) s.min_symbols[sym] = range.lo;
    }
    if (const auto& log = s.config.shape_log()) {
      std::string ranges;
      for (const auto& [sym, range] : out.symbols) {
        ranges += (ranges.empty() ? "" : ", ") + sym + " in [" + std::to_string(range.lo) + ", " +
                  std::to_string(range.hi) + "]";
      }
      log(where + ": " + (ranges.empty() ? std::string("no dynamic dims") : ranges));
    }
    s.profiles.push_back(std::move(out));
  }
  return ok_status();
}

}  // namespace kiln::builder
