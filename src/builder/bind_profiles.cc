// Pass bind_profiles: gives every dynamic input dim a symbol and, per profile, a range for each
// symbol. A dim written c*s + k (exporters write "4*h") bounds s to the values whose dim lies in
// [min, max]; any other dynamic expression becomes a fresh symbol of its own.
#include <algorithm>
#include <cctype>
#include <climits>
#include <cstring>
#include <map>
#include <set>

#include "builder/build_state.h"
#include "ir/rewrite.h"

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
    return "profile " + std::to_string(p) + ": input '" + val.name + "' dim " + std::to_string(d) +
           " (" + (*val.shape)[d].to_string() + ")";
  };
  // The lattice each profile's steps give, per symbol: (m, r) for dims c*s + k stepped by c*m.
  for (size_t p = 0; p < profiles.size(); ++p) {
    for (int v : g.inputs) {
      const ir::Value& val = g.values[size_t(v)];
      auto it = profiles[p].inputs().find(val.name);
      if (it == profiles[p].inputs().end() || it->second.steps.size() != val.shape->size())
        continue;
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
                                  std::to_string(dims.min[d]) +
                                  " is not a whole number of steps of " + sym);
        }
        const int64_t m = step / c, r = floor_mod((dims.min[d] - k) / c, m);
        auto [li, inserted] = lattice.emplace(sym, Lattice{m, r, where});
        if (!inserted && (li->second.m != m || li->second.r != r)) {
          return invalid_argument(where + " steps " + sym + " by " + std::to_string(m) + " from " +
                                  std::to_string(r) + ", but " + li->second.where +
                                  " steps it by " + std::to_string(li->second.m) + " from " +
                                  std::to_string(li->second.r) +
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
          return invalid_argument(describe(p, val, d) + " has step " + std::to_string(step) +
                                  ", but " + li->second.where + " steps " + sym + " by " +
                                  std::to_string(li->second.m) +
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
      return invalid_argument("the model already has a symbol '" + name +
                              "', the name the steps of " + sym + " (" + l.where + ") would take");
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
      log("steps: " + sym + " = " +
          (ir::Dim(l.m) * ir::Dim::symbol(sym + "_step" + std::to_string(l.m)) + l.r).to_string() +
          " (from " + l.where + ")");
    }
  }
  return ok_status();
}

// A symbol name from a tensor name: the formula text keeps letters, digits, '_' and '.', and starts
// with a letter or '_'.
std::string symbol_base(const std::string& name) {
  std::string out;
  for (char c : name)
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.') ? c : '_';
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out[0])) || out[0] == '.')
    out = "_" + out;
  return out;
}

// The range of values an element of `dtype` holds, for the profile's checks.
ir::Interval dtype_range(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return {0, 1};
    case DType::kInt8:
      return {INT8_MIN, INT8_MAX};
    case DType::kUInt8:
      return {0, UINT8_MAX};
    case DType::kInt16:
      return {INT16_MIN, INT16_MAX};
    case DType::kUInt16:
      return {0, UINT16_MAX};
    case DType::kInt32:
      return {INT32_MIN, INT32_MAX};
    case DType::kUInt32:
      return {0, UINT32_MAX};
    default:
      return {-ir::Interval::kInf, ir::Interval::kInf};
  }
}

// Shape-value inputs (OptimizationProfile::set_shape_values): each element of such an input is a
// symbol ranged by the profiles (or the number every profile fixes it at), and the model's
// consumers read a value that carries those elements: an Identity of the input whose symbolic
// value they are (the runtime writes it from the symbols, as any shape arithmetic), or a constant
// where every element is fixed. The input itself stays an engine input, read on the host.
Status bind_shape_values(BuildState& s) {
  ir::Graph& g = s.graph;
  const auto& profiles = s.config.profiles();
  std::set<std::string> names;
  for (const auto& p : profiles) {
    for (const auto& [name, values] : p.shape_values()) names.insert(name);
  }
  if (names.empty()) return ok_status();
  std::set<std::string> taken;
  for (int v : g.inputs) {
    for (const ir::Dim& dim : *g.values[size_t(v)].shape) dim.collect_symbols(&taken);
  }
  for (const std::string& name : names) {
    int v = -1;
    for (int in : g.inputs) {
      if (g.values[size_t(in)].name == name) v = in;
    }
    if (v < 0) {
      return invalid_argument("a profile gives shape values for '" + name +
                              "', which is not an input of the model");
    }
    const DType dtype = g.values[size_t(v)].dtype;
    const std::vector<ir::Dim> dims = *g.values[size_t(v)].shape;
    Shape shape;
    for (const ir::Dim& d : dims) {
      if (!d.is_const()) {
        return invalid_argument(
            "input '" + name +
            "' takes shape values (set_shape_values), so the model must fix its shape; it is " +
            ir::dims_to_string(dims));
      }
      shape.push_back(d.value());
    }
    const int64_t numel = shape_numel(shape);
    std::vector<const OptimizationProfile::Values*> per(profiles.size(), nullptr);
    for (size_t p = 0; p < profiles.size(); ++p) {
      auto it = profiles[p].shape_values().find(name);
      if (it == profiles[p].shape_values().end()) {
        return invalid_argument(
            "profile " + std::to_string(p) + " gives no shape values for input '" + name +
            "', which another profile gives; every profile gives values for the same inputs");
      }
      per[p] = &it->second;
      if (it->second.fixed.has_value() != per[0]->fixed.has_value()) {
        return invalid_argument(
            "profiles 0 and " + std::to_string(p) + " give input '" + name +
            "' one a fixed value, the other a range; give it the same kind in each");
      }
    }
    plan::ShapeValueInput sv;
    sv.name = name;
    sv.symbols.assign(size_t(numel), "");
    std::vector<ir::Dim> elements(static_cast<size_t>(numel), ir::Dim(0));
    if (per[0]->fixed) {
      const Tensor& t = *per[0]->fixed;
      if (t.dtype() != dtype || t.shape() != shape) {
        return invalid_argument(
            "the shape value given for input '" + name + "' is " +
            std::string(dtype_name(t.dtype())) +
            ir::dims_to_string(std::vector<ir::Dim>(t.shape().begin(), t.shape().end())) +
            "; the input is " + std::string(dtype_name(dtype)) + ir::dims_to_string(dims));
      }
      for (size_t p = 1; p < per.size(); ++p) {
        const Tensor& o = *per[p]->fixed;
        if (o.dtype() != t.dtype() || o.shape() != t.shape() ||
            std::memcmp(o.data(), t.data(), t.nbytes()) != 0) {
          return invalid_argument(
              "profiles 0 and " + std::to_string(p) + " fix input '" + name +
              "' at different values; an input given one value takes it in every profile");
        }
      }
      sv.fixed = t;
    } else {
      if (!is_integer(dtype) && dtype != DType::kBool) {
        return invalid_argument(
            "input '" + name + "' is " + std::string(dtype_name(dtype)) +
            ": a range of shape values is for integer and bool inputs; give a " +
            std::string(dtype_name(dtype)) +
            " input its one value (set_shape_values with a tensor)");
      }
      if (numel > ops::kMaxSymbolicElements) {
        return invalid_argument("input '" + name + "' has " + std::to_string(numel) +
                                " elements; a shape-value input has at most " +
                                std::to_string(ops::kMaxSymbolicElements));
      }
      const ir::Interval held = dtype_range(dtype);
      KILN_ASSIGN_OR_RETURN(sv.fixed, Tensor::zeros(dtype, shape));
      for (size_t p = 0; p < per.size(); ++p) {
        if (int64_t(per[p]->min.size()) != numel) {
          return invalid_argument("profile " + std::to_string(p) + " gives " +
                                  std::to_string(per[p]->min.size()) + " shape values for input '" +
                                  name + "', which has " + std::to_string(numel) + " elements " +
                                  ir::dims_to_string(dims));
        }
        for (int64_t i = 0; i < numel; ++i) {
          for (int64_t x : {per[p]->min[size_t(i)], per[p]->max[size_t(i)]}) {
            if (!held.contains(x)) {
              return invalid_argument("profile " + std::to_string(p) + ": input '" + name +
                                      "' element " + std::to_string(i) + " value " +
                                      std::to_string(x) + " does not fit its dtype " +
                                      std::string(dtype_name(dtype)));
            }
          }
        }
        s.profiles[p].values.push_back({name, per[p]->min, per[p]->opt, per[p]->max});
      }
      for (int64_t i = 0; i < numel; ++i) {
        bool fixed = true;
        const int64_t x = per[0]->min[size_t(i)];
        for (const auto* vals : per)
          fixed = fixed && vals->min[size_t(i)] == x && vals->max[size_t(i)] == x;
        if (fixed) {
          elements[size_t(i)] = ir::Dim(x);
          if (!sv.fixed.set_int_at(i, x)) {
            return internal_error("input '" + name + "': no integer storage for " +
                                  std::string(dtype_name(dtype)));
          }
          continue;
        }
        const std::string sym = ir::unique_symbol(
            symbol_base(name) + (numel == 1 && shape.empty() ? "" : "_" + std::to_string(i)),
            &taken);
        sv.symbols[size_t(i)] = sym;
        elements[size_t(i)] = ir::Dim::symbol(sym);
        for (size_t p = 0; p < per.size(); ++p) {
          s.profiles[p].symbols[sym] = ir::Interval{per[p]->min[size_t(i)], per[p]->max[size_t(i)]};
          if (p == 0) {
            s.opt_symbols[sym] = per[p]->opt[size_t(i)];
            s.min_symbols[sym] = per[p]->min[size_t(i)];
          }
        }
      }
    }
    // The consumers read the elements: a constant when all are fixed, else an Identity of the
    // input that carries them as its symbolic value.
    bool all_fixed = true;
    for (const std::string& sym : sv.symbols) all_fixed = all_fixed && sym.empty();
    const int carrier = ir::add_unique_value(&g, name + "_values", dtype, dims);
    if (all_fixed) {
      KILN_ASSIGN_OR_RETURN(Tensor copy, Tensor::zeros(sv.fixed.dtype(), sv.fixed.shape()));
      if (copy.nbytes()) std::memcpy(copy.data(), sv.fixed.data(), copy.nbytes());
      g.values[size_t(carrier)].constant = std::move(copy);
    } else {
      g.values[size_t(v)].sym_value = elements;
      ir::Node id;
      id.name = ir::unique_node_name(g, name + "_values");
      id.op_type = "Identity";
      id.opset = g.opsets.count("") ? g.opsets.at("") : 13;
      id.inputs = {v};
      id.outputs = {carrier};
      g.nodes.insert(g.nodes.begin(), std::move(id));
    }
    s.shape_value_carriers[name] = carrier;
    for (ir::Node& node : g.nodes) {
      if (node.outputs.size() == 1 && node.outputs[0] == carrier) continue;
      for (int& in : node.inputs) {
        if (in == v) in = carrier;
      }
    }
    for (size_t n = 0; n < g.nodes.size(); ++n) {
      for (int o : g.nodes[n].outputs) {
        if (o >= 0) g.values[size_t(o)].producer = int(n);
      }
    }
    if (const auto& log = s.config.shape_log()) {
      std::string text;
      for (const ir::Dim& e : elements) text += (text.empty() ? "" : ", ") + e.to_string();
      log("shape values: input '" + name + "' = [" +
          (per[0]->fixed ? std::string("a fixed ") + std::string(dtype_name(dtype)) + " value"
                         : text) +
          "]");
    }
    s.plan.shape_values.push_back(std::move(sv));
  }
  // In engine input order.
  std::vector<plan::ShapeValueInput> ordered;
  for (int in : g.inputs) {
    for (auto& sv : s.plan.shape_values) {
      if (sv.name == g.values[size_t(in)].name) ordered.push_back(std::move(sv));
    }
  }
  s.plan.shape_values = std::move(ordered);
  return ok_status();
}

}  // namespace

Status bind_profiles(BuildState& s) {
  ir::Graph& g = s.graph;
  std::set<std::string> dynamic_inputs;
  std::set<std::string> taken;  // symbols in use, for inputs without a shape
  for (const ir::Value& v : g.values) {
    if (v.shape) {
      for (const ir::Dim& d : *v.shape) d.collect_symbols(&taken);
    }
  }
  for (int v : g.inputs) {
    ir::Value& val = g.values[v];
    if (!val.shape) {
      // The model gives no shape (ONNX allows it; a sequence's element type often has none): the
      // first profile gives the rank, each dim a symbol of its own.
      const OptimizationProfile::Dims* given = nullptr;
      if (!s.config.profiles().empty()) {
        auto it = s.config.profiles()[0].inputs().find(val.name);
        if (it != s.config.profiles()[0].inputs().end()) given = &it->second;
      }
      if (!given) {
        return invalid_model("graph input '" + val.name +
                             "' has no shape in the model; give its shapes in the "
                             "profile (the input's rank is then theirs)");
      }
      std::vector<ir::Dim> dims;
      for (size_t d = 0; d < given->min.size(); ++d) {
        dims.push_back(ir::Dim::symbol(
            ir::unique_symbol(symbol_base(val.name) + "_d" + std::to_string(d), &taken)));
      }
      val.shape = std::move(dims);
    }
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
    return invalid_argument(
        "the model has dynamic inputs but the config has no optimization profile; "
        "add one with min/opt/max shapes for:" +
        describe_inputs(g));
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
          return invalid_argument(where + " sets shapes for '" + name +
                                  "', which is not an input of the model");
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
        return invalid_argument(where + ": input '" + val.name + "' has rank " +
                                std::to_string(shape.size()) + " (" + ir::dims_to_string(shape) +
                                ") but the profile gives rank " + std::to_string(dims->min.size()));
      }
      out.inputs.push_back({val.name, dims->min, dims->opt, dims->max});
      for (size_t d = 0; d < shape.size(); ++d) {
        std::string dim_where = where + ": input '" + val.name + "' dim " + std::to_string(d) +
                                " (" + shape[d].to_string() + ")";
        if (shape[d].is_const()) {
          int64_t c = shape[d].value();
          if (dims->min[d] != c || dims->max[d] != c || dims->opt[d] != c) {
            return invalid_argument(
                dim_where + " is fixed at " + std::to_string(c) +
                " by the model, but the profile gives min " + std::to_string(dims->min[d]) +
                ", opt " + std::to_string(dims->opt[d]) + ", max " + std::to_string(dims->max[d]));
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
                                  std::to_string(dims->min[d]) + ", " +
                                  std::to_string(dims->max[d]) +
                                  "] consistent with the model's other dims that use " + sym);
        }
        // An opt that no symbol value reaches is a user error worth naming now.
        int64_t opt_rest = dims->opt[d] - k;
        if (opt_rest % c != 0) {
          return invalid_argument(dim_where + ": opt " + std::to_string(dims->opt[d]) +
                                  " is not of the form " + shape[d].to_string());
        }
        if (p == 0) s.opt_symbols[sym] = opt_rest / c;
      }
    }
    if (!missing.empty()) {
      std::string list;
      for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
      return invalid_argument(
          where + " gives no shapes for dynamic input(s) " + list +
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
  return bind_shape_values(s);
}

}  // namespace kiln::builder
