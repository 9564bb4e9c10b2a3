// Engine descriptions for kiln build and kiln inspect. Everything here is read from the public
// Engine API; nothing is recomputed.
#include "describe.h"

#include <algorithm>
#include <map>

#include "engine_source.h"
#include "flags.h"

namespace kiln::cli {
namespace {

constexpr OptProfileSelector kSelectors[] = {OptProfileSelector::kMIN, OptProfileSelector::kOPT,
                                             OptProfileSelector::kMAX};
constexpr const char* kSelectorNames[] = {"min", "opt", "max"};

std::string pad(std::string s, size_t n) {
  if (s.size() < n) s.resize(n, ' ');
  return s;
}

std::string interval_to_string(const ir::Interval& r) {
  return "[" + std::to_string(r.lo) + ", " + std::to_string(r.hi) + "]";
}

}  // namespace

std::string describe_io(const Engine& engine) {
  std::string in, out;
  size_t width = 0;
  for (int i = 0; i < engine.num_io_tensors(); ++i)
    width = std::max(width, engine.io_tensor_name(i).size());
  for (int i = 0; i < engine.num_io_tensors(); ++i) {
    std::string n = engine.io_tensor_name(i);
    auto dims = engine.tensor_symbolic_shape(n);
    std::string line = "  " + pad(n, width) + "  " +
                       pad(std::string(dtype_name(*engine.tensor_dtype(n))), 8) + "  " +
                       (dims.ok() ? ir::dims_to_string(*dims) : "?") + "\n";
    if (engine.is_shape_inference_io(n)) {
      // Its elements: the symbols they bind, or the numbers the engine was built for.
      std::string elements;
      for (const auto& sv : engine.plan().shape_values) {
        if (sv.name != n) continue;
        const bool ints = is_integer(sv.fixed.dtype()) || sv.fixed.dtype() == DType::kBool;
        for (size_t e = 0; e < sv.symbols.size(); ++e) {
          std::string x = !sv.symbols[e].empty() ? sv.symbols[e]
                          : ints                 ? std::to_string(sv.fixed.int_at(int64_t(e)))
                                                 : "fixed";
          elements += (e ? ", " : "") + x;
        }
      }
      line.pop_back();
      line += "  shape values (host memory): [" + elements + "]\n";
    }
    (engine.tensor_mode(n) == TensorIOMode::kINPUT ? in : out) += line;
  }
  // Dims only the data decides: each is known once the layer that makes it has run.
  std::string dd;
  for (const auto& d : engine.plan().data_dependent) {
    dd += "  " + d.symbol + " in [" +
          (d.lower == 0 ? std::string("0") : "max(0, " + d.lower.to_string() + ")") + ", " +
          d.bound.to_string() + "]\n";
  }
  if (!dd.empty())
    dd = "data-dependent dims (sized by their layers when the run reaches them):\n" + dd;
  return "inputs:\n" + in + "outputs (shape formulas over the input symbols):\n" + out + dd;
}

std::string describe_profiles(const Engine& engine) {
  std::string s = "profiles:\n";
  const auto& profiles = engine.plan().profiles;
  for (size_t p = 0; p < profiles.size(); ++p) {
    s += "  " + std::to_string(p) + ":";
    if (profiles[p].inputs.empty() && profiles[p].values.empty()) s += " (static shapes)";
    for (const auto& r : profiles[p].inputs) {
      s += " " + r.name + " min " + dims_to_spec(r.min) + " opt " + dims_to_spec(r.opt) + " max " +
           dims_to_spec(r.max);
    }
    for (const auto& r : profiles[p].values) {
      s += " " + r.name + " values min " + dims_to_spec(r.min) + " opt " + dims_to_spec(r.opt) +
           " max " + dims_to_spec(r.max);
    }
    std::string syms;
    for (const auto& [name, range] : profiles[p].symbols) {
      syms += (syms.empty() ? "" : ", ") + name + " in " + interval_to_string(range);
    }
    if (!syms.empty()) s += "   (" + syms + ")";
    s += "\n";
  }
  return s;
}

std::string describe_layers(const Engine& engine, bool each) {
  auto layers = engine.layers();
  std::map<std::string, int> by_op, by_kernel;
  for (const auto& l : layers) by_op[l.op_type]++, by_kernel[l.kernel]++;
  std::string s = "layers: " + std::to_string(layers.size()) + "\n  by op:";
  for (const auto& [op, n] : by_op) s += " " + op + " " + std::to_string(n);
  s += "\n  by kernel:";
  for (const auto& [k, n] : by_kernel) s += " " + k + " " + std::to_string(n);
  s += "\n";
  if (each) {
    size_t wn = 4, wo = 2, wk = 6;
    for (const auto& l : layers) {
      wn = std::max(wn, l.name.size()), wo = std::max(wo, l.op_type.size()),
      wk = std::max(wk, l.kernel.size());
    }
    wn = std::min<size_t>(wn, 48);
    // A layout column only where some layer computes channels last (CUDA FP16/BF16 convolutions).
    const bool layouts =
        std::any_of(layers.begin(), layers.end(), [](const auto& l) { return !l.layout.empty(); });
    s += "  " + pad("#", 5) + pad("node", wn + 2) + pad("op", wo + 2) + pad("kernel", wk + 2) +
         pad("precision", 11) + (layouts ? pad("layout", 8) : "") + "tactic\n";
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto& l = layers[i];
      // A view runs nothing: its output is another tensor's bytes, which the table names.
      std::string tactic = !l.alias_of.empty() ? "view of " + l.alias_of : l.tactic;
      // Its output sizes come from its data: the run waits for them here.
      if (l.data_dependent) {
        if (!tactic.empty()) tactic += "; ";
        tactic += "sizes from data (the run waits for them)";
      }
      // A layer of an If's branch: the run skips it unless its conditions hold.
      for (size_t k = 0; k < l.runs_when.size(); ++k) {
        tactic += k ? ", " : tactic.empty() ? "runs when " : "; runs when ";
        tactic += l.runs_when[k].first + (l.runs_when[k].second ? " is true" : " is false");
      }
      // A layer of a run-time loop: once per iteration.
      if (!l.repeats_in.empty())
        tactic +=
            (tactic.empty() ? "" : "; ") + std::string("repeats per iteration of ") + l.repeats_in;
      std::string line = "  " + pad(std::to_string(i), 5) + pad(l.name, wn + 2) +
                         pad(l.op_type, wo + 2) + pad(l.kernel, wk + 2) + pad(l.precision, 11) +
                         (layouts ? pad(l.layout.empty() ? "-" : l.layout, 8) : "") + tactic;
      while (!line.empty() && line.back() == ' ') line.pop_back();
      s += line + "\n";
    }
    // What each fused layer runs in place of: the model's nodes, by op type.
    size_t fused = 0;
    for (const auto& l : layers) fused += !l.replaced.empty();
    if (fused > 0) {
      s +=
          "fused layers: " + std::to_string(fused) + " (each with the model's nodes it replaced)\n";
      for (size_t i = 0; i < layers.size(); ++i) {
        if (layers[i].replaced.empty()) continue;
        int64_t total = 0;
        std::string ops;
        for (const auto& [op, n] : layers[i].replaced) {
          total += n;
          ops += (ops.empty() ? "" : ", ") + op + (n > 1 ? " x" + std::to_string(n) : "");
        }
        s += "  " + pad(std::to_string(i), 5) + pad(layers[i].op_type, wo + 2) +
             std::to_string(total) + (total == 1 ? " node: " : " nodes: ") + ops + "\n";
      }
    }
  }
  return s;
}

std::string describe_memory(const Engine& engine) {
  std::string s = "activation memory: " + engine.activation_bytes_formula().to_string() +
                  " bytes (before 64-byte slot alignment)\n";
  for (int p = 0; p < std::max(engine.num_profiles(), 1); ++p) {
    s += "  profile " + std::to_string(p) + ":";
    for (int k = 0; k < 3; ++k) {
      auto b = engine.activation_bytes(p, kSelectors[k]);
      s += std::string(k ? "," : "") + " " + kSelectorNames[k] + " " +
           (b.ok() ? format_bytes(*b) : "? (" + b.status().message() + ")");
    }
    s += "\n";
  }
  return s;
}

void engine_json(JsonWriter& j, const Engine& engine) {
  j.key("device").value(std::string(device_name(engine.device())));
  j.key("builder_flags").value(flags_to_string(engine.plan().builder_flags));
  j.key("io").begin_array();
  for (int i = 0; i < engine.num_io_tensors(); ++i) {
    std::string n = engine.io_tensor_name(i);
    auto dims = engine.tensor_symbolic_shape(n);
    j.begin_object();
    j.key("name").value(n);
    j.key("mode").value(engine.tensor_mode(n) == TensorIOMode::kINPUT ? "input" : "output");
    j.key("dtype").value(std::string(dtype_name(*engine.tensor_dtype(n))));
    j.key("shape").begin_array();
    if (dims.ok()) {
      for (const auto& d : *dims) {
        if (d.is_const())
          j.value(d.value());
        else
          j.value(d.to_string());
      }
    }
    j.end_array();
    j.end_object();
  }
  j.end_array();
  j.key("profiles").begin_array();
  const auto& profiles = engine.plan().profiles;
  for (size_t p = 0; p < profiles.size(); ++p) {
    j.begin_object();
    for (const auto& [key, ranges] : {std::pair<const char*, const std::vector<plan::InputRange>*>{
                                          "inputs", &profiles[p].inputs},
                                      {"shape_values", &profiles[p].values}}) {
      j.key(key).begin_array();
      for (const auto& r : *ranges) {
        j.begin_object().key("name").value(r.name);
        j.key("min").array(r.min).key("opt").array(r.opt).key("max").array(r.max);
        j.end_object();
      }
      j.end_array();
    }
    j.key("symbols").begin_object();
    for (const auto& [name, range] : profiles[p].symbols) {
      j.key(name).begin_array().value(range.lo).value(range.hi).end_array();
    }
    j.end_object();
    j.key("activation_bytes").begin_object();
    for (int k = 0; k < 3; ++k) {
      auto b = engine.activation_bytes(int(p), kSelectors[k]);
      j.key(kSelectorNames[k]);
      if (b.ok())
        j.value(*b);
      else
        j.null();
    }
    j.end_object();
    j.end_object();
  }
  j.end_array();
  j.key("activation_bytes_formula").value(engine.activation_bytes_formula().to_string());
  j.key("layers").begin_array();
  for (const auto& l : engine.layers()) {
    j.begin_object().key("name").value(l.name).key("op").value(l.op_type).key("kernel").value(
        l.kernel);
    j.key("tactic").value(l.tactic);
    if (!l.alias_of.empty()) j.key("alias_of").value(l.alias_of);
    if (!l.layout.empty()) j.key("layout").value(l.layout);
    if (l.data_dependent) j.key("data_dependent").value(true);
    if (!l.repeats_in.empty()) j.key("repeats_in").value(l.repeats_in);
    if (!l.runs_when.empty()) {
      j.key("runs_when").begin_array();
      for (const auto& [cond, when] : l.runs_when)
        j.begin_object().key("condition").value(cond).key("is").value(when).end_object();
      j.end_array();
    }
    if (!l.replaced.empty()) {
      j.key("replaced").begin_object();
      for (const auto& [op, n] : l.replaced) j.key(op).value(n);
      j.end_object();
    }
    j.key("precision").value(l.precision).end_object();
  }
  j.end_array();
}

}  // namespace kiln::cli
