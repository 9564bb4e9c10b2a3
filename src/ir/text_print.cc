// The IR text printer (format: ir/text.h).
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "ir/text.h"
#include "ir/text_syntax.h"

namespace kiln::ir {
namespace {

using text::format_float;
using text::name_text;

bool is_ident(std::string_view s, bool allow_dot) {
  if (s.empty()) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || (allow_dot && c == '.');
    if (!ok) return false;
  }
  return true;
}

std::string ident_text(std::string_view s, bool allow_dot) {
  return is_ident(s, allow_dot) ? std::string(s) : text::quote(s);
}

std::string element_text(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kFloat32:
      return format_float(t.data_as<float>()[i], false);
    case DType::kFloat64:
      return format_float(t.data_as<double>()[i], true);
    case DType::kFloat16:
      return format_float(half_to_float(t.data_as<uint16_t>()[i]), false);
    case DType::kBFloat16:
      return format_float(bf16_to_float(t.data_as<uint16_t>()[i]), false);
    case DType::kBool:
      return t.data_as<uint8_t>()[i] ? "true" : "false";
    case DType::kUInt64:
      return std::to_string(t.data_as<uint64_t>()[i]);
    default:
      return std::to_string(t.int_at(i));
  }
}

bool is_splat(const Tensor& t) {
  const size_t es = dtype_size(t.dtype());
  const auto* p = static_cast<const unsigned char*>(t.data());
  for (int64_t i = 1; i < t.numel(); ++i) {
    if (std::memcmp(p, p + size_t(i) * es, es) != 0) return false;
  }
  return true;
}

std::string tensor_type_text(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) +
         dims_to_string(std::vector<Dim>(t.shape().begin(), t.shape().end()));
}

class Printer {
 public:
  explicit Printer(const TextPrintOptions& options) : options_(options) {}

  std::string dense(const Tensor& t) const {
    if (t.empty()) return "dense<[]>";
    const int64_t n = t.numel();
    if (n >= 2 && is_splat(t)) return "dense<" + element_text(t, 0) + ">";
    if (options_.max_inline_elements >= 0 && n > options_.max_inline_elements) return "dense<...>";
    std::string s = "dense<[";
    for (int64_t i = 0; i < n; ++i) s += (i ? ", " : "") + element_text(t, i);
    return s + "]>";
  }

  std::string tensor_attr(const Tensor& t) const {
    return dense(t) + " : " + (t.empty() ? std::string("undefined[]") : tensor_type_text(t));
  }

  std::string attr(const Attribute& a, int indent) const {
    auto list = [&](const auto& xs, const char* empty, auto&& item) {
      if (xs.empty()) return std::string(empty) + "[]";
      std::string s = "[";
      for (size_t i = 0; i < xs.size(); ++i) s += (i ? ", " : "") + item(xs[i]);
      return s + "]";
    };
    switch (a.type) {
      case AttrType::kFloat:
        return format_float(a.f, false);
      case AttrType::kInt:
        return std::to_string(a.i);
      case AttrType::kString:
        return text::quote(a.s);
      case AttrType::kTensor:
        return tensor_attr(a.t);
      case AttrType::kGraph:
        return a.g ? graph(*a.g, indent) : "graph \"\"() -> () {}";
      case AttrType::kFloats:
        return list(a.floats, "floats", [](float f) { return format_float(f, false); });
      case AttrType::kInts:
        return list(a.ints, "ints", [](int64_t i) { return std::to_string(i); });
      case AttrType::kStrings:
        return list(a.strings, "strings", [](const std::string& s) { return text::quote(s); });
      case AttrType::kTensors:
        return list(a.tensors, "tensors", [&](const Tensor& t) { return tensor_attr(t); });
      case AttrType::kGraphs:
        return list(a.graphs, "graphs", [&](const std::shared_ptr<Graph>& g) {
          return g ? graph(*g, indent) : std::string("graph \"\"() -> () {}");
        });
    }
    return "?";
  }

  static std::string decl(const Value& v) {
    std::string s = "%" + name_text(v.name) + ": " + type_to_string(v);
    if (v.sym_value) s += " = " + dims_to_string(*v.sym_value);
    return s;
  }

  // "graph name(...) -> (...) {", the body indented by indent + 2, then "}" at `indent`.
  std::string graph(const Graph& g, int indent) const {
    const std::string pad(size_t(indent) + 2, ' ');
    std::string s = "graph " + name_text(g.name.empty() ? "main" : g.name) + "(";
    for (size_t i = 0; i < g.inputs.size(); ++i) s += (i ? ", " : "") + decl(g.values[g.inputs[i]]);
    s += ") -> (";
    for (size_t i = 0; i < g.outputs.size(); ++i)
      s += (i ? ", " : "") + decl(g.values[g.outputs[i]]);
    s += ") {\n";
    for (const auto& [domain, version] : g.opsets) {
      s += pad + "opset " + ident_text(domain.empty() ? "ai.onnx" : domain, true) + " " +
           std::to_string(version) + "\n";
    }
    for (int v : printed_constants(g)) {
      s += pad + decl(g.values[v]) + " = " + dense(*g.values[v].constant) + "\n";
    }
    for (const Node& n : g.nodes) s += pad + node(g, n, indent + 2) + "\n";
    return s + std::string(size_t(indent), ' ') + "}";
  }

  std::string node(const Graph& g, const Node& n, int indent) const {
    std::string s;
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      s += i ? ", " : "";
      s += n.outputs[i] < 0 ? "_" : decl(g.values[n.outputs[i]]);
    }
    s += n.outputs.empty() ? "= " : " = ";
    if (!n.domain.empty()) s += ident_text(n.domain, true) + "::";
    s += ident_text(n.op_type, false);
    auto imported = g.opsets.find(n.domain);
    if (n.opset != (imported == g.opsets.end() ? 0 : imported->second)) {
      s += "@" + std::to_string(n.opset);
    }
    s += "(";
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      s += i ? ", " : "";
      s += n.inputs[i] < 0 ? "_" : "%" + name_text(g.values[n.inputs[i]].name);
    }
    s += ")";
    if (!n.attrs.all().empty()) {
      s += " {";
      bool first = true;
      for (const auto& [k, a] : n.attrs.all()) {
        s += (first ? "" : ", ") + ident_text(k, false) + "=" + attr(a, indent);
        first = false;
      }
      s += "}";
    }
    return s + "  # " + name_text(n.name);
  }

 private:
  // Constants no node produces, in value order, that a node, a graph output or a nested graph
  // reads. Unread initializers and orphans a rewrite left behind are not shown.
  static std::vector<int> printed_constants(const Graph& g) {
    std::vector<char> read(g.values.size(), 0), produced(g.values.size(), 0);
    std::set<std::string> nested_names;
    for (const Node& n : g.nodes) {
      for (int v : n.inputs) {
        if (v >= 0) read[v] = 1;
      }
      for (int v : n.outputs) {
        if (v >= 0) produced[v] = 1;
      }
      for (const auto& [k, a] : n.attrs.all()) {
        if (a.g) collect_names(*a.g, &nested_names);
        for (const auto& sg : a.graphs) {
          if (sg) collect_names(*sg, &nested_names);
        }
      }
    }
    for (int v : g.outputs) read[v] = 1;
    for (int v : g.inputs) produced[v] = 1;
    std::vector<int> out;
    for (size_t v = 0; v < g.values.size(); ++v) {
      if (!g.values[v].constant || produced[v]) continue;
      if (read[v] || nested_names.count(g.values[v].name)) out.push_back(int(v));
    }
    return out;
  }

  static void collect_names(const Graph& g, std::set<std::string>* out) {
    for (const Node& n : g.nodes) {
      for (int v : n.inputs) {
        if (v >= 0) out->insert(g.values[v].name);
      }
      for (const auto& [k, a] : n.attrs.all()) {
        if (a.g) collect_names(*a.g, out);
        for (const auto& sg : a.graphs) {
          if (sg) collect_names(*sg, out);
        }
      }
    }
    for (int v : g.outputs) out->insert(g.values[v].name);
  }

  TextPrintOptions options_;
};

}  // namespace

std::string type_to_string(const Value& v) {
  std::string s(dtype_name(v.dtype));
  s += v.shape ? dims_to_string(*v.shape) : std::string("[?]");
  switch (v.kind) {
    case ValueKind::kTensor:
      return s;
    case ValueKind::kSequence:
      return "seq(" + s + ")";
    case ValueKind::kOptionalTensor:
      return "optional(" + s + ")";
    case ValueKind::kOptionalSequence:
      return "optional(seq(" + s + "))";
  }
  return s;
}

std::string to_text(const Graph& graph, const TextPrintOptions& options) {
  return Printer(options).graph(graph, 0) + "\n";
}

std::string to_text(const Graph& graph) { return to_text(graph, TextPrintOptions{}); }

}  // namespace kiln::ir
