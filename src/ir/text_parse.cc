// The IR text parser: reads exactly what text_print.cc writes (format: ir/text.h), with errors
// that name the line and column.
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/text.h"
#include "ir/text_lexer.h"
#include "ir/text_syntax.h"

namespace kiln::ir {
namespace {

using text::Element;

constexpr int kMaxGraphDepth = 64;
// Marks a make_tensor key as an attribute's ("\x01attr"), whose node name is not known yet.
constexpr char kAttrKey = '\x01';

struct Dense {
  enum class Kind { kList, kSplat, kElided } kind = Kind::kList;
  std::vector<Element> elements;
  size_t pos = 0;
};

// One graph being parsed: names resolve to value indices once defined; a use before the
// definition is recorded as pending (encoded as index -2 - k) and resolved when the graph ends.
struct GraphState {
  Graph g;
  const GraphState* outer = nullptr;
  std::unordered_map<std::string, int> defined;
  std::unordered_map<int, size_t> def_pos;  // value -> where it was defined
  struct Pending {
    std::string name;
    size_t pos;
  };
  std::vector<Pending> pending;
  std::vector<Pending> nested_uses;  // names nested graphs read from this one or further out
  std::vector<int> explicit_opset;   // per node: the `@N` version, or -1
};

class Parser : text::Lexer {
 public:
  Parser(std::string_view s, const TextParseOptions& options) : Lexer(s), options_(options) {}

  StatusOr<Graph> parse() {
    skip();
    if (!keyword("graph")) return error(pos_, "expected 'graph'");
    std::vector<GraphState::Pending> free;
    KILN_ASSIGN_OR_RETURN(Graph g, graph(nullptr, 0, &free));
    skip();
    if (pos_ != s_.size()) return error(pos_, "unexpected text after the graph");
    return g;
  }

 private:
  // ---- types ----
  struct Type {
    DType dtype = DType::kUndefined;
    std::optional<std::vector<Dim>> shape;
  };

  // "[d, d, ...]": dims in Dim's syntax, split at top-level commas. `allow_unknown`: "[?]".
  StatusOr<std::optional<std::vector<Dim>>> dims(bool allow_unknown) {
    KILN_RETURN_IF_ERROR(expect("["));
    std::vector<Dim> out;
    size_t piece = pos_;
    int depth = 0;
    bool unknown = false;
    for (;; ++pos_) {
      if (pos_ >= s_.size()) return error(piece, "unterminated dims, expected ']'");
      char c = s_[pos_];
      if (c == '(') ++depth;
      if (c == ')') --depth;
      if (depth > 0 || (c != ',' && c != ']')) continue;
      std::string_view text = s_.substr(piece, pos_ - piece);
      size_t lead = text.find_first_not_of(" \t\r\n");
      size_t tail = text.find_last_not_of(" \t\r\n");
      std::string_view trimmed =
          lead == std::string_view::npos ? std::string_view() : text.substr(lead, tail - lead + 1);
      size_t at = piece + (lead == std::string_view::npos ? 0 : lead);
      if (trimmed.empty()) {
        if (c == ']' && out.empty() && !unknown) break;  // "[]": rank 0
        return error(at, "expected a dim");
      }
      if (trimmed == "?") {
        if (!allow_unknown || !out.empty() || c != ']') {
          return error(at, "'?' is only allowed alone, as dtype[?] (rank unknown)");
        }
        unknown = true;
      } else {
        auto d = Dim::parse(trimmed);
        if (!d) return error(at, "'" + std::string(trimmed) + "' is not a dim expression");
        out.push_back(*d);
      }
      if (c == ']') break;
      piece = pos_ + 1;
    }
    ++pos_;  // ']'
    if (unknown) return std::optional<std::vector<Dim>>();
    return std::optional<std::vector<Dim>>(std::move(out));
  }

  StatusOr<Type> type() {
    skip();
    size_t at = pos_;
    KILN_ASSIGN_OR_RETURN(std::string dt, ident("a dtype", false));
    auto d = text::dtype_from_name(dt);
    if (!d) return error(at, "unknown dtype '" + dt + "'");
    Type t;
    t.dtype = *d;
    KILN_ASSIGN_OR_RETURN(t.shape, dims(true));
    return t;
  }

  StatusOr<Shape> concrete_shape(const Type& t, size_t pos) const {
    if (!t.shape) return error(pos, "a tensor needs a known shape, not [?]");
    Shape s;
    for (const Dim& d : *t.shape) {
      if (!d.is_const() || d.value() < 0) {
        return error(pos, "a tensor's dims must be non-negative integers, got " + d.to_string());
      }
      s.push_back(d.value());
    }
    return s;
  }

  // ---- tensors ----
  StatusOr<Dense> dense() {  // after the `dense` keyword
    Dense d;
    d.pos = pos_;
    KILN_RETURN_IF_ERROR(expect("<"));
    if (eat("...")) {
      d.kind = Dense::Kind::kElided;
    } else if (eat("[")) {
      if (!eat("]")) {
        do {
          skip();
          size_t at = pos_;
          d.elements.push_back({number_token(), at});
          if (d.elements.back().text.empty())
            return error(at, "expected a tensor element" + found());
        } while (eat(","));
        KILN_RETURN_IF_ERROR(expect("]"));
      }
    } else {
      d.kind = Dense::Kind::kSplat;
      skip();
      size_t at = pos_;
      d.elements.push_back({number_token(), at});
      if (d.elements.back().text.empty()) return error(at, "expected a tensor element" + found());
    }
    KILN_RETURN_IF_ERROR(expect(">"));
    return d;
  }

  StatusOr<Tensor> fetch(const std::string& key, DType dtype, const Shape& shape,
                         size_t pos) const {
    auto t = options_.elided(key, dtype, shape);
    if (!t.ok()) return error(pos, "no data for '" + key + "': " + t.status().message());
    if (t->dtype() != dtype || t->shape() != shape) {
      return error(pos, "the data supplied for '" + key + "' is " +
                            std::string(dtype_name(t->dtype())) + shape_to_string(t->shape()) +
                            ", expected " + std::string(dtype_name(dtype)) +
                            shape_to_string(shape));
    }
    return std::move(t).value();
  }

  StatusOr<Tensor> make_tensor(const Dense& d, const Type& type, size_t type_pos,
                               const std::string& key) {
    if (type.dtype == DType::kUndefined) {
      if (d.kind == Dense::Kind::kList && d.elements.empty()) return Tensor();
      return error(type_pos, "a tensor needs a dtype");
    }
    KILN_ASSIGN_OR_RETURN(Shape shape, concrete_shape(type, type_pos));
    if (d.kind == Dense::Kind::kElided) {
      const bool is_attr = !key.empty() && key[0] == kAttrKey;
      const std::string shown = is_attr ? key.substr(1) : key;
      if (!options_.elided) {
        return error(d.pos,
                     "the data of '" + shown +
                         "' is elided (dense<...>); pass TextParseOptions::elided to supply it");
      }
      if (is_attr) {
        // The node's name comes at the end of its line: fetched by resolve_elided_attrs.
        elided_attrs_.push_back({d.pos, shown, type.dtype, shape});
        return Tensor();
      }
      KILN_ASSIGN_OR_RETURN(Tensor t, fetch(key, type.dtype, shape, d.pos));
      return t;
    }
    auto z = Tensor::zeros(type.dtype, shape);
    if (!z.ok()) return error(type_pos, z.status().message());
    Tensor t = std::move(z).value();
    const int64_t n = t.numel();
    if (d.kind == Dense::Kind::kList && int64_t(d.elements.size()) != n) {
      return error(d.pos, "dense<[...]> has " + std::to_string(d.elements.size()) +
                              " elements but its type has " + std::to_string(n));
    }
    for (int64_t i = 0; i < n; ++i) {
      KILN_RETURN_IF_ERROR(store(t, i, d.elements[d.kind == Dense::Kind::kSplat ? 0 : size_t(i)]));
    }
    return t;
  }

  // ---- values ----
  struct Decl {
    std::string name;
    Type type;
    std::optional<std::vector<Dim>> sym_value;
    size_t pos;
  };

  StatusOr<Decl> decl() {
    skip();
    Decl d;
    d.pos = pos_;
    KILN_RETURN_IF_ERROR(expect("%"));
    KILN_ASSIGN_OR_RETURN(d.name, name("a value name"));
    KILN_RETURN_IF_ERROR(expect(":"));
    KILN_ASSIGN_OR_RETURN(d.type, type());
    size_t save = pos_;
    if (eat("=") && peek('[')) {
      KILN_ASSIGN_OR_RETURN(d.sym_value, dims(false));
    } else {
      pos_ = save;
    }
    return d;
  }

  StatusOr<int> define(GraphState& st, const Decl& d) {
    auto [it, inserted] = st.defined.emplace(d.name, int(st.g.values.size()));
    if (!inserted) {
      return error(d.pos, "value %" + d.name + " is defined twice (first " +
                              location(st.def_pos[it->second]) + ")");
    }
    int v = st.g.add_value(d.name);
    st.def_pos[v] = d.pos;
    Value& val = st.g.values[v];
    val.dtype = d.type.dtype;
    val.shape = d.type.shape;
    val.sym_value = d.sym_value;
    return v;
  }

  std::string location(size_t pos) const {
    std::string m = error(pos, "").message();
    return "at " + m.substr(0, m.size() - 2);
  }

  int use(GraphState& st, const std::string& value_name, size_t pos) {
    auto it = st.defined.find(value_name);
    if (it != st.defined.end()) return it->second;
    st.pending.push_back({value_name, pos});
    return -2 - int(st.pending.size() - 1);
  }

  // ---- attributes ----
  StatusOr<Attribute> attr_value(GraphState& st, const std::string& key, int depth) {
    skip();
    size_t at = pos_;
    Attribute a;
    if (peek('"')) {
      a.type = AttrType::kString;
      KILN_ASSIGN_OR_RETURN(a.s, quoted());
      return a;
    }
    static constexpr std::pair<const char*, AttrType> kEmpty[] = {{"ints", AttrType::kInts},
                                                                  {"floats", AttrType::kFloats},
                                                                  {"strings", AttrType::kStrings},
                                                                  {"tensors", AttrType::kTensors},
                                                                  {"graphs", AttrType::kGraphs}};
    for (const auto& [kw, t] : kEmpty) {
      if (keyword(kw)) {
        KILN_RETURN_IF_ERROR(expect("["));
        KILN_RETURN_IF_ERROR(expect("]"));
        a.type = t;
        return a;
      }
    }
    if (keyword("dense")) {
      KILN_ASSIGN_OR_RETURN(Dense d, dense());
      KILN_RETURN_IF_ERROR(expect(":"));
      skip();
      size_t type_pos = pos_;
      KILN_ASSIGN_OR_RETURN(Type t, type());
      a.type = AttrType::kTensor;
      KILN_ASSIGN_OR_RETURN(a.t, make_tensor(d, t, type_pos, key));
      return a;
    }
    if (keyword("graph")) {
      std::vector<GraphState::Pending> free;
      KILN_ASSIGN_OR_RETURN(Graph g, graph(&st, depth + 1, &free));
      for (auto& f : free) st.nested_uses.push_back(std::move(f));
      a.type = AttrType::kGraph;
      a.g = std::make_shared<Graph>(std::move(g));
      return a;
    }
    if (eat("[")) {
      std::vector<Attribute> items;
      if (peek(']'))
        return error(at, "an empty list needs its type: ints[], floats[], strings[], ...");
      do {
        std::string item_key = key + "[" + std::to_string(items.size()) + "]";
        KILN_ASSIGN_OR_RETURN(Attribute item, attr_value(st, item_key, depth));
        if (item.type != AttrType::kInt && item.type != AttrType::kFloat &&
            item.type != AttrType::kString && item.type != AttrType::kTensor &&
            item.type != AttrType::kGraph) {
          return error(at, "lists cannot nest");
        }
        items.push_back(std::move(item));
      } while (eat(","));
      KILN_RETURN_IF_ERROR(expect("]"));
      return make_list(items, at);
    }
    std::string tok = number_token();
    if (tok.empty()) return error(at, "expected an attribute value" + found());
    if (looks_float(tok)) {
      a.type = AttrType::kFloat;
      KILN_ASSIGN_OR_RETURN(a.f, parse_float<float>(tok, at));
    } else {
      a.type = AttrType::kInt;
      KILN_ASSIGN_OR_RETURN(a.i, parse_int(tok, at));
    }
    return a;
  }

  StatusOr<Attribute> make_list(std::vector<Attribute>& items, size_t at) const {
    Attribute a;
    AttrType first = items[0].type;
    bool numeric = true, same = true;
    for (const auto& it : items) {
      numeric &= it.type == AttrType::kInt || it.type == AttrType::kFloat;
      same &= it.type == first;
    }
    if (numeric && !same) first = AttrType::kFloat;  // [1, 2.5] is a list of floats
    if (!numeric && !same) return error(at, "a list mixes kinds of values");
    switch (first) {
      case AttrType::kInt:
        a.type = AttrType::kInts;
        for (const auto& it : items) a.ints.push_back(it.i);
        break;
      case AttrType::kFloat:
        a.type = AttrType::kFloats;
        for (const auto& it : items)
          a.floats.push_back(it.type == AttrType::kInt ? float(it.i) : it.f);
        break;
      case AttrType::kString:
        a.type = AttrType::kStrings;
        for (auto& it : items) a.strings.push_back(std::move(it.s));
        break;
      case AttrType::kTensor:
        a.type = AttrType::kTensors;
        for (auto& it : items) a.tensors.push_back(std::move(it.t));
        break;
      default:
        a.type = AttrType::kGraphs;
        for (auto& it : items) a.graphs.push_back(std::move(it.g));
        break;
    }
    return a;
  }

  // ---- graphs ----
  // After the `graph` keyword. `free` receives the names this graph reads but does not define
  // (nested graphs only: the top level reports them as errors).
  StatusOr<Graph> graph(const GraphState* outer, int depth,
                        std::vector<GraphState::Pending>* free) {
    if (depth > kMaxGraphDepth) return error(pos_, "graphs nest too deeply");
    GraphState st;
    st.outer = outer;
    KILN_ASSIGN_OR_RETURN(st.g.name, name("a graph name"));
    KILN_RETURN_IF_ERROR(expect("("));
    if (!peek(')')) {
      do {
        KILN_ASSIGN_OR_RETURN(Decl d, decl());
        KILN_ASSIGN_OR_RETURN(int v, define(st, d));
        st.g.inputs.push_back(v);
      } while (eat(","));
    }
    KILN_RETURN_IF_ERROR(expect(")"));
    KILN_RETURN_IF_ERROR(expect("->"));
    KILN_RETURN_IF_ERROR(expect("("));
    std::vector<Decl> outputs;
    if (!peek(')')) {
      do {
        KILN_ASSIGN_OR_RETURN(Decl d, decl());
        outputs.push_back(std::move(d));
      } while (eat(","));
    }
    KILN_RETURN_IF_ERROR(expect(")"));
    KILN_RETURN_IF_ERROR(expect("{"));
    while (!eat("}")) {
      if (pos_ >= s_.size()) return error(pos_, "expected '}' to close graph " + st.g.name);
      KILN_RETURN_IF_ERROR(line(st, depth));
    }
    KILN_RETURN_IF_ERROR(finish(st, outputs, free));
    return std::move(st.g);
  }

  Status line(GraphState& st, int depth) {
    skip();
    const size_t start = pos_;
    if (keyword("opset")) {
      KILN_ASSIGN_OR_RETURN(std::string domain, ident("a domain", true));
      skip();
      size_t at = pos_;
      KILN_ASSIGN_OR_RETURN(int64_t version, parse_int(number_token(), at));
      if (domain == "ai.onnx") domain.clear();
      if (!st.g.opsets.emplace(domain, int(version)).second) {
        return error(start, "opset of domain '" + domain + "' given twice");
      }
      return ok_status();
    }
    std::vector<Decl> outs;
    std::vector<bool> omitted;
    if (!peek('=')) {
      do {
        skip();
        if (s_.substr(pos_, 1) == "_" &&
            !(pos_ + 1 < s_.size() && text::is_name_char(s_[pos_ + 1]))) {
          ++pos_;
          outs.push_back({});
          omitted.push_back(true);
          continue;
        }
        KILN_ASSIGN_OR_RETURN(Decl d, decl());
        outs.push_back(std::move(d));
        omitted.push_back(false);
      } while (eat(","));
    }
    KILN_RETURN_IF_ERROR(expect("="));
    skip();
    if (s_.substr(pos_, 6) == "dense<") {
      keyword("dense");
      if (outs.size() != 1 || omitted[0])
        return error(start, "a constant defines exactly one value");
      KILN_ASSIGN_OR_RETURN(Dense d, dense());
      KILN_ASSIGN_OR_RETURN(Tensor t, make_tensor(d, outs[0].type, outs[0].pos, outs[0].name));
      KILN_ASSIGN_OR_RETURN(int v, define(st, outs[0]));
      st.g.values[v].constant = std::move(t);
      return ok_status();
    }
    Node n;
    KILN_ASSIGN_OR_RETURN(std::string first, ident("an op name", true));
    if (eat("::")) {
      n.domain = first == "ai.onnx" ? "" : first;
      KILN_ASSIGN_OR_RETURN(n.op_type, ident("an op name", false));
    } else {
      n.op_type = std::move(first);
    }
    int opset = -1;
    if (eat("@")) {
      skip();
      size_t at = pos_;
      KILN_ASSIGN_OR_RETURN(int64_t v, parse_int(number_token(), at));
      opset = int(v);
    }
    KILN_RETURN_IF_ERROR(expect("("));
    if (!peek(')')) {
      do {
        skip();
        size_t at = pos_;
        if (eat("%")) {
          KILN_ASSIGN_OR_RETURN(std::string v, name("a value name"));
          n.inputs.push_back(use(st, v, at));
        } else if (eat("_")) {
          n.inputs.push_back(-1);
        } else {
          return error(at, "expected %value or _" + found());
        }
      } while (eat(","));
    }
    KILN_RETURN_IF_ERROR(expect(")"));
    const size_t first_elided = elided_attrs_.size();
    if (eat("{")) {
      if (!peek('}')) {
        do {
          skip();
          size_t at = pos_;
          KILN_ASSIGN_OR_RETURN(std::string k, ident("an attribute name", false));
          KILN_RETURN_IF_ERROR(expect("="));
          KILN_ASSIGN_OR_RETURN(Attribute a, attr_value(st, std::string(1, kAttrKey) + k, depth));
          if (n.attrs.has(k)) return error(at, "attribute '" + k + "' given twice");
          n.attrs.set(k, std::move(a));
        } while (eat(","));
      }
      KILN_RETURN_IF_ERROR(expect("}"));
    }
    if (eat("#")) {
      KILN_ASSIGN_OR_RETURN(n.name, name("a node name"));
    } else {
      n.name = n.op_type + "_" + std::to_string(st.g.nodes.size());
    }
    KILN_RETURN_IF_ERROR(resolve_elided_attrs(&n, first_elided));
    for (size_t i = 0; i < outs.size(); ++i) {
      if (omitted[i]) {
        n.outputs.push_back(-1);
        continue;
      }
      KILN_ASSIGN_OR_RETURN(int v, define(st, outs[i]));
      n.outputs.push_back(v);
    }
    st.g.nodes.push_back(std::move(n));
    st.explicit_opset.push_back(opset);
    return ok_status();
  }

  // Elided tensor attributes of this node (those recorded since `first`; a nested graph's nodes
  // took theirs already) get their data now that the node's name is known.
  Status resolve_elided_attrs(Node* n, size_t first) {
    for (size_t e = first; e < elided_attrs_.size(); ++e) {
      const ElidedAttr& ea = elided_attrs_[e];
      KILN_ASSIGN_OR_RETURN(Tensor t, fetch(n->name + "/" + ea.key, ea.dtype, ea.shape, ea.pos));
      // key is "attr" or "attr[i]" (an element of a tensors list).
      size_t bracket = ea.key.rfind('[');
      const bool in_list = !ea.key.empty() && ea.key.back() == ']' && bracket != std::string::npos;
      std::string attr_name = in_list ? ea.key.substr(0, bracket) : ea.key;
      Attribute a = *n->attrs.find(attr_name);
      if (in_list) {
        a.tensors[std::stoul(ea.key.substr(bracket + 1))] = std::move(t);
      } else {
        a.t = std::move(t);
      }
      n->attrs.set(attr_name, std::move(a));
    }
    elided_attrs_.resize(first);
    return ok_status();
  }

  Status finish(GraphState& st, const std::vector<Decl>& outputs,
                std::vector<GraphState::Pending>* free) {
    std::unordered_map<std::string, int> free_values;
    auto resolve = [&](const std::string& value_name, size_t pos) -> StatusOr<int> {
      auto it = st.defined.find(value_name);
      if (it != st.defined.end()) return it->second;
      if (!st.outer) return error(pos, "use of undefined value %" + value_name);
      // A nested graph reads a value of an enclosing graph: a plain value here, as the frontend
      // makes it; the enclosing graph checks the name.
      auto [f, inserted] = free_values.emplace(value_name, int(st.g.values.size()));
      if (inserted) {
        st.g.add_value(value_name);
        free->push_back({value_name, pos});
      }
      return f->second;
    };
    for (Node& n : st.g.nodes) {
      for (int& v : n.inputs) {
        if (v > -2) continue;
        const auto& p = st.pending[size_t(-2 - v)];
        KILN_ASSIGN_OR_RETURN(v, resolve(p.name, p.pos));
      }
    }
    for (const auto& p : st.nested_uses) KILN_RETURN_IF_ERROR(resolve(p.name, p.pos).status());
    for (const Decl& d : outputs) {
      KILN_ASSIGN_OR_RETURN(int v, resolve(d.name, d.pos));
      Value& val = st.g.values[v];
      const bool typed = val.dtype != DType::kUndefined || val.shape;
      Value declared;
      declared.dtype = d.type.dtype;
      declared.shape = d.type.shape;
      declared.sym_value = d.sym_value;
      if (!typed && !val.sym_value) {
        val.dtype = declared.dtype;
        val.shape = declared.shape;
        val.sym_value = declared.sym_value;
      } else if (type_to_string(val) != type_to_string(declared) ||
                 val.sym_value != declared.sym_value) {
        return error(d.pos, "graph output %" + d.name + " is declared " + type_to_string(declared) +
                                " but defined as " + type_to_string(val));
      }
      st.g.outputs.push_back(v);
    }
    for (size_t i = 0; i < st.g.nodes.size(); ++i) {
      Node& n = st.g.nodes[i];
      auto imported = st.g.opsets.find(n.domain);
      n.opset = st.explicit_opset[i] >= 0       ? st.explicit_opset[i]
                : imported == st.g.opsets.end() ? 0
                                                : imported->second;
      for (int v : n.outputs) {
        if (v >= 0) st.g.values[v].producer = int(i);
      }
    }
    return ok_status();
  }

  const TextParseOptions& options_;
  struct ElidedAttr {
    size_t pos;
    std::string key;  // "attr" or "attr[i]"
    DType dtype;
    Shape shape;
  };
  std::vector<ElidedAttr> elided_attrs_;
};

}  // namespace

StatusOr<Graph> parse_text(std::string_view text, const TextParseOptions& options) {
  return Parser(text, options).parse();
}

ElidedTensorFn elided_from(const Graph& source) {
  auto tensors = std::make_shared<std::unordered_map<std::string, Tensor>>();
  for (const Value& v : source.values) {
    if (v.constant) tensors->emplace(v.name, *v.constant);
  }
  for (const Node& n : source.nodes) {
    for (const auto& [k, a] : n.attrs.all()) {
      if (a.type == AttrType::kTensor) tensors->emplace(n.name + "/" + k, a.t);
      for (size_t i = 0; i < a.tensors.size(); ++i) {
        tensors->emplace(n.name + "/" + k + "[" + std::to_string(i) + "]", a.tensors[i]);
      }
    }
  }
  return [tensors](std::string_view key, DType dtype, const Shape& shape) -> StatusOr<Tensor> {
    auto it = tensors->find(std::string(key));
    if (it == tensors->end())
      return not_found("the source graph has no tensor '" + std::string(key) + "'");
    return it->second;
  };
}

}  // namespace kiln::ir
