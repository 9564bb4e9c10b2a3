// Pass select_kernels: for every node that runs, the first implementation in the registry's order
// for the target device that supports it; the plan records its id, precision, default tactic (the
// implementation ranks its tactics at the first profile's opt shapes) and workspace formula.
// Where later implementations support the node too and two or more of them (the first among them)
// time their tactics on the device (KernelImpl::timed_tactics: cuDNN's graph convolution and our
// depthwise kernels), the builder weighs their fastest tactics instead (weigh_rivals): the one with
// the smallest time at the opt shapes relative to the best there, plus the same at the min shapes
// where each timed those, wins (TensorRT times at the opt shapes alone; a profile also runs its
// smaller batches, where a kernel tiled for the opt batch can lose by a third). With a timing cache
// in the config, a node whose key (timing_cache_key) is cached takes the cached tactic without
// asking the implementation (whose tactics() may time candidates on the device); otherwise the
// implementation's first tactic is taken and recorded in the cache. A weighed node's key names
// every rival and its entry the winner ("<impl id>\n<tactic>"). Views (Reshape, Flatten, Squeeze,
// Unsqueeze, Identity) become aliases that run nothing, unless their output is an engine output
// (which the caller's buffer must receive). Nodes that no implementation supports are all listed in
// one error, each with every implementation's reason.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <optional>
#include <utility>
#include <vector>

#include "backends/kernel_registry.h"
#include "builder/build_state.h"
#include "core/hash.h"
#include "ir/text.h"
#include "ir/text_syntax.h"
#include "plan/loops.h"

namespace kiln::builder {
namespace {

bool is_graph_output(const ir::Graph& g, int v) {
  for (int o : g.outputs) {
    if (o == v) return true;
  }
  return false;
}

// A view whose input and output may share bytes: same dtype, one data input, output not an engine
// output (an engine output is written into the caller's buffer, so it needs its copy).
bool runs_as_alias(const ir::Graph& g, const ir::Node& node) {
  if (!ops::traits(node).is_view) return false;
  if (node.inputs.empty() || node.inputs[0] < 0 || node.outputs.size() != 1 ||
      node.outputs[0] < 0) {
    return false;
  }
  const ir::Value& in = g.values[node.inputs[0]];
  const ir::Value& out = g.values[node.outputs[0]];
  return in.dtype == out.dtype && !is_graph_output(g, node.outputs[0]);
}

// Quoted, with '"', '\\' and control characters escaped, so that every key line stays one line.
std::string quote_text(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

// Tensor and graph attributes enter the key as a digest: their full text could be megabytes per
// entry, and a digest collision would also need the same op, implementation and shapes.
std::string tensor_text(const Tensor& t) {
  return "tensor " + std::string(dtype_name(t.dtype())) + shape_to_string(t.shape()) + " fnv1a " +
         hex64(fnv1a64({static_cast<const uint8_t*>(t.data()), t.nbytes()}));
}

std::string graph_text(const ir::Graph& g) {
  const std::string text = ir::to_text(g, ir::TextPrintOptions{.max_inline_elements = -1});
  return "graph fnv1a " +
         hex64(fnv1a64({reinterpret_cast<const uint8_t*>(text.data()), text.size()}));
}

template <typename T, typename F>
std::string list_text(const std::vector<T>& items, F&& one) {
  std::string s = "[";
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + one(items[i]);
  return s + "]";
}

}  // namespace

std::string attribute_text(const ir::Attribute& a) {
  auto f = [](float v) { return ir::text::format_float(v, false); };
  switch (a.type) {
    case ir::AttrType::kFloat:
      return f(a.f);
    case ir::AttrType::kInt:
      return std::to_string(a.i);
    case ir::AttrType::kString:
      return quote_text(a.s);
    case ir::AttrType::kTensor:
      return tensor_text(a.t);
    case ir::AttrType::kGraph:
      return a.g ? graph_text(*a.g) : "graph none";
    case ir::AttrType::kFloats:
      return "floats" + list_text(a.floats, f);
    case ir::AttrType::kInts:
      return "ints" + list_text(a.ints, [](int64_t v) { return std::to_string(v); });
    case ir::AttrType::kStrings:
      return "strings" + list_text(a.strings, quote_text);
    case ir::AttrType::kTensors:
      return "tensors" + list_text(a.tensors, tensor_text);
    case ir::AttrType::kGraphs:
      return "graphs" + list_text(a.graphs, [](const std::shared_ptr<ir::Graph>& g) {
               return g ? graph_text(*g) : std::string("graph none");
             });
  }
  return "?";
}

namespace {

// "float32[8, 16] const": dims at the opt point; symbolic where they do not evaluate there.
std::string value_text(const backends::KernelQuery& q, const ir::Value* v) {
  if (!v) return "omitted";
  std::string s(dtype_name(v->dtype));
  if (auto shape = q.opt_shape(v)) {
    s += shape_to_string(*shape);
    // The min point too: an implementation may time a second choice for small problems there.
    auto min = q.min_shape(v);
    if (min && *min != *shape) s += " min" + shape_to_string(*min);
  } else {
    s += v->shape ? ir::dims_to_string(*v->shape) : "[?]";
  }
  return v->constant ? s + " const" : s;
}

}  // namespace

std::string timing_cache_key(std::string_view impl_id, const backends::KernelQuery& q,
                             std::string_view device_identity) {
  const ir::Node& node = q.node;
  std::string key = "impl=" + std::string(impl_id) + "\n";
  key += "op=" + (node.domain.empty() ? std::string("ai.onnx") : node.domain) +
         "::" + node.op_type + "@" + std::to_string(node.opset) + "\n";
  for (const auto& [name, attr] : node.attrs.all()) {  // a std::map: in name order
    key += "attr " + name + "=" + attribute_text(attr) + "\n";
  }
  for (size_t i = 0; i < q.inputs.size(); ++i) {
    key += "in" + std::to_string(i) + "=" + value_text(q, q.inputs[i]) + "\n";
  }
  for (size_t i = 0; i < q.outputs.size(); ++i) {
    key += "out" + std::to_string(i) + "=" + value_text(q, q.outputs[i]) + "\n";
  }
  key += "precision=" + q.precision.to_string() + "\n";
  key += "level=" + std::to_string(q.optimization_level) + "\n";
  key += "device=" + std::string(device_identity);
  return key;
}

std::optional<std::pair<size_t, std::string>> weigh_rivals(
    const std::vector<const backends::KernelImpl*>& rivals, backends::KernelQuery q) {
  std::vector<std::pair<size_t, backends::TimedTactic>> best;  // (rival, its fastest tactic)
  for (size_t i = 0; i < rivals.size(); ++i) {
    q.precision = rivals[i]->precision(q);
    std::vector<backends::TimedTactic> timed = rivals[i]->timed_tactics(q);
    if (!timed.empty() && timed.front().opt_ms >= 0) best.emplace_back(i, timed.front());
    if (i == 0 && best.empty()) return std::nullopt;  // the preferred one times nothing
  }
  double opt_best = -1, min_best = -1;
  bool at_min = true;
  for (const auto& [i, t] : best) {
    opt_best = opt_best < 0 ? t.opt_ms : std::min(opt_best, t.opt_ms);
    at_min = at_min && t.min_ms >= 0;
    if (t.min_ms >= 0) min_best = min_best < 0 ? t.min_ms : std::min(min_best, t.min_ms);
  }
  auto score = [&](const backends::TimedTactic& t) {
    const double opt = t.opt_ms / std::max(opt_best, 1e-9);
    return at_min ? opt + t.min_ms / std::max(min_best, 1e-9) : opt;
  };
  size_t win = 0;
  for (size_t k = 1; k < best.size(); ++k) {
    if (score(best[k].second) < score(best[win].second)) win = k;
  }
  return std::make_pair(best[win].first, best[win].second.tactic);
}

Status select_kernels(BuildState& s) {
  const ir::Graph& g = s.graph;
  const backends::KernelRegistry& registry = backends::kernel_registry();
  const Device device = s.backend.device();
  const PrecisionPolicy policy = s.config.precision();
  TimingCache* cache = s.config.timing_cache();
  const std::string device_identity = cache ? s.backend.device_identity() : "";
  std::string failures;
  int n_failed = 0;
  for (int n : s.runtime_nodes) {
    const ir::Node& node = g.nodes[n];
    if (runs_as_alias(g, node)) {
      s.plan.nodes.push_back({plan::kAliasImpl, "", {}, ""});
      s.in_place.push_back(-1);
      continue;
    }
    const ops::OpKind kind = ops::find_op(node.domain, node.op_type);
    if (kind == ops::OpKind::kLoopBegin ||
        kind == ops::OpKind::kLoopEnd) {  // the run's own copies and jumps
      s.plan.nodes.push_back({plan::kControlImpl, "", {}, ""});
      s.in_place.push_back(-1);
      continue;
    }
    backends::KernelQuery q{node, {}, {}, policy};
    q.opt_symbols = &s.opt_symbols;
    q.min_symbols = &s.min_symbols;
    q.optimization_level = s.config.builder_optimization_level();
    for (int v : node.inputs) q.inputs.push_back(v >= 0 ? &g.values[v] : nullptr);
    for (int v : node.outputs) q.outputs.push_back(v >= 0 ? &g.values[v] : nullptr);
    auto candidates = registry.candidates(kind, device);
    const backends::KernelImpl* chosen = nullptr;
    const backends::KernelImpl* declined = nullptr;  // the first that supports it but declines
    std::string reasons;
    for (const backends::KernelImpl* impl : candidates) {
      Status st = impl->supports(q);
      if (st.ok() && !declined && !impl->declines(q).ok()) {
        declined = impl;
        continue;
      }
      if (st.ok()) {
        chosen = impl;
        break;
      }
      reasons += "\n    " + impl->id() + ": " + st.message();
    }
    // The implementations after the chosen one that support the node too, none declining it.
    std::vector<const backends::KernelImpl*> rivals;
    if (chosen && q.optimization_level > 0) {
      rivals.push_back(chosen);
      bool after = false;
      for (const backends::KernelImpl* impl : candidates) {
        if (after && impl->supports(q).ok() && impl->declines(q).ok()) rivals.push_back(impl);
        after = after || impl == chosen;
      }
    }
    if (!chosen) chosen = declined;
    if (!chosen) {
      ++n_failed;
      failures += "\n  " + node.describe() + ": ";
      failures += candidates.empty() ? "the " + std::string(device_name(device)) +
                                           " backend has no implementation of " + node.op_type
                                     : "no implementation supports it:" + reasons;
      continue;
    }
    plan::NodePlan choice;
    std::optional<std::string> tactic;  // a weighed node's
    if (rivals.size() > 1) {
      std::string ids;
      for (const backends::KernelImpl* impl : rivals) ids += (ids.empty() ? "" : ",") + impl->id();
      q.precision = chosen->precision(q);
      const std::string key = cache ? timing_cache_key(ids, q, device_identity) : "";
      std::optional<std::string> cached = cache ? cache->lookup(key) : std::nullopt;
      const size_t cut = cached ? cached->find('\n') : std::string::npos;
      const backends::KernelImpl* hit =
          cut == std::string::npos ? nullptr : registry.find(cached->substr(0, cut));
      if (hit && std::find(rivals.begin(), rivals.end(), hit) != rivals.end()) {
        chosen = hit;
        tactic = cached->substr(cut + 1);
      } else if (auto won = weigh_rivals(rivals, q)) {
        chosen = rivals[won->first];
        tactic = std::move(won->second);
        if (cache) cache->insert(key, chosen->id() + "\n" + *tactic);
      }
    }
    choice.impl = chosen->id();
    choice.precision = chosen->precision(q);
    q.precision = choice.precision;  // tactics and workspace depend on what the node computes in
    const std::string key =
        cache && !tactic ? timing_cache_key(chosen->id(), q, device_identity) : "";
    std::optional<std::string> cached = cache && !tactic ? cache->lookup(key) : std::nullopt;
    if (tactic) {
      choice.tactic = std::move(*tactic);
    } else if (cached) {
      choice.tactic = std::move(*cached);
    } else {
      std::vector<std::string> tactics = chosen->tactics(q);  // the first is the default
      choice.tactic = tactics.empty() ? "" : tactics.front();
      if (cache) cache->insert(key, choice.tactic);
    }
    q.tactic = choice.tactic;
    choice.workspace = chosen->workspace_bytes(q);
    // A kiln op computing in another layout than ONNX's says so (assign_layout's NHWC convs).
    const ir::Attribute* layout = node.domain == "kiln" ? node.attrs.find("layout") : nullptr;
    if (layout && layout->type == ir::AttrType::kString && layout->s != "NCHW") {
      choice.layout = layout->s;
    }
    s.plan.nodes.push_back(std::move(choice));
    s.in_place.push_back(chosen->in_place_input());
  }
  if (n_failed) {
    return unsupported(std::to_string(n_failed) + " node(s) have no kernel on the " +
                       std::string(device_name(device)) + " backend:" + failures);
  }
  return ok_status();
}

}  // namespace kiln::builder
