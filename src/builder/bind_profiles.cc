// Pass bind_profiles: gives every dynamic input dim a symbol and, per profile, a range for each
// symbol. A dim written c*s + k (exporters write "4*h") bounds s to the values whose dim lies in
// [min, max]; any other dynamic expression becomes a fresh symbol of its own.
#include <algorithm>
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
