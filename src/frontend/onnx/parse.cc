// ModelProto -> ir::Graph: opsets, graph inputs with symbolic dims, initializers, nodes with all
// attribute kinds (subgraphs parsed recursively), Constant nodes folded into constant values.
#include "frontend/onnx/parse.h"

#include <climits>
#include <filesystem>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/checked.h"
#include "core/hash.h"
#include "frontend/onnx/tensor_proto.h"
#include "onnx/onnx-data.pb.h"

namespace kiln::onnx {
namespace {

// Protobuf's own recursion limit stops deeper messages first; this bounds our recursion anyway.
constexpr int kMaxGraphDepth = 64;
// Opset 6 is the oldest form PyTorch's first exporter wrote. Its broadcast attributes, PRelu's
// per-channel slope and the is_test flags are upgraded (or refused) by the builder's
// infer_shapes (upgrade_opset6); opsets 1-5 also carry consumed_inputs and are refused here.
constexpr int64_t kMinOpset = 6;
// Opset 28 is onnx 1.23's newest. The schemas of the ops whose meaning changed in opsets 25-28
// check the node's opset: Attention 25 (windows), Range 27 (stash_type), Mod 28 (fmod=0 on
// floats), BitShift 28 (signed types), SpaceToDepth 28 (mode); the rest only added dtypes.
constexpr int64_t kMaxOpset = 28;

// Names each enclosing graph defines, innermost last: a subgraph may read any of them.
using Scope = std::vector<const std::unordered_set<std::string>*>;

struct ModelContext {
  std::string model_dir;
  std::map<std::string, int> opsets;
  std::set<std::string> symbols_taken;                // so fresh symbols never alias real ones
  std::map<std::string, std::string> fresh_for_text;  // unparsable dim_param -> its symbol
};

std::string normalize_domain(const std::string& d) { return d == "ai.onnx" ? std::string() : d; }

std::string sanitize_symbol(std::string_view text) {
  std::string s;
  for (char c : text) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    s += ok ? c : '_';
  }
  if (s.empty()) s = "sym";
  if (s[0] >= '0' && s[0] <= '9') s = "_" + s;  // keeps the printed dim parseable
  return s;
}

std::string fresh_symbol(ModelContext& ctx, std::string_view text) {
  const std::string base = sanitize_symbol(text);
  std::string name = base;
  for (int k = 2; ctx.symbols_taken.count(name); ++k) name = base + "_" + std::to_string(k);
  ctx.symbols_taken.insert(name);
  return name;
}

// The type inside an optional, a sequence or an optional sequence (`type` itself otherwise), and
// the kind those wrappers make (builder/sequences.cc lays them out as tensors).
const ::onnx::TypeProto& element_type(const ::onnx::TypeProto& type, ir::ValueKind* kind) {
  const ::onnx::TypeProto* t = &type;
  *kind = ir::ValueKind::kTensor;
  if (t->has_optional_type()) {
    t = &t->optional_type().elem_type();
    *kind = ir::ValueKind::kOptionalTensor;
  }
  if (t->has_sequence_type()) {
    t = &t->sequence_type().elem_type();
    *kind = *kind == ir::ValueKind::kOptionalTensor ? ir::ValueKind::kOptionalSequence
                                                    : ir::ValueKind::kSequence;
  }
  return *t;
}

// Symbols that parsed dim_params use, collected before any fresh symbol is named.
void reserve_symbols(const ::onnx::GraphProto& gp, ModelContext& ctx) {
  for (const auto& vi : gp.input()) {
    ir::ValueKind kind;
    const ::onnx::TypeProto* type = &element_type(vi.type(), &kind);
    if (!type->has_tensor_type()) continue;
    for (const auto& d : type->tensor_type().shape().dim()) {
      if (!d.has_dim_param()) continue;
      if (auto dim = ir::Dim::parse(d.dim_param())) dim->collect_symbols(&ctx.symbols_taken);
    }
  }
}

Status with_context(Status s, const std::string& context) {
  s.with_context(context);
  return s;
}

// Reads a ValueInfoProto's element type (and shape, when with_shape) into v.
Status read_value_type(const ::onnx::ValueInfoProto& vi, const std::string& label, bool require,
                       bool with_shape, ModelContext& ctx, ir::Value* v) {
  if (!vi.has_type()) {
    if (require) return invalid_model(label + " has no type");
    return ok_status();
  }
  // A sequence of tensors, an optional tensor or an optional sequence of tensors: the kind, and the
  // elements' type below.
  const ::onnx::TypeProto* type = &element_type(vi.type(), &v->kind);
  const char* within =
      v->kind == ir::ValueKind::kTensor ? "" : " within its sequence or optional type";
  switch (type->value_case()) {
    case ::onnx::TypeProto::kTensorType:
      break;
    case ::onnx::TypeProto::kSequenceType:
    case ::onnx::TypeProto::kOptionalType:
      return unsupported(label + " has a sequence or optional type nested" + within +
                         "; kiln supports sequences of tensors and optionals of a tensor or of a "
                         "sequence of tensors");
    case ::onnx::TypeProto::kMapType:
      return unsupported(label + " has a map type" + within +
                         "; kiln supports tensors, sequences and optionals");
    case ::onnx::TypeProto::kSparseTensorType:
      return unsupported(label + " has a sparse tensor type" + within +
                         "; kiln supports dense tensors only");
    default:
      if (require) return invalid_model(label + " has no type" + within);
      return ok_status();
  }
  const auto& tt = type->tensor_type();
  if (tt.elem_type() == 0) {
    if (require) return invalid_model(label + " has no element type");
    return ok_status();
  }
  const DType dtype = dtype_from_onnx(tt.elem_type());
  if (dtype == DType::kUndefined) {
    return unsupported(label + " has element type " + onnx_type_name(tt.elem_type()) +
                       ", which kiln does not support");
  }
  v->dtype = dtype;
  if (!with_shape || !tt.has_shape()) return ok_status();
  std::vector<ir::Dim> dims;
  dims.reserve(tt.shape().dim_size());
  for (int i = 0; i < tt.shape().dim_size(); ++i) {
    const auto& d = tt.shape().dim(i);
    if (d.has_dim_value()) {
      if (d.dim_value() < 0) {
        return invalid_model(label + " has negative dim " + std::to_string(d.dim_value()) +
                             " at axis " + std::to_string(i));
      }
      dims.push_back(ir::Dim(d.dim_value()));
    } else if (d.has_dim_param() && !d.dim_param().empty()) {
      const std::string& text = d.dim_param();
      if (auto parsed = ir::Dim::parse(text)) {
        if (parsed->is_const() && parsed->value() < 0) {
          return invalid_model(label + " has dim '" + text + "' at axis " + std::to_string(i) +
                               ", which is negative");
        }
        parsed->collect_symbols(&ctx.symbols_taken);
        dims.push_back(*parsed);
        continue;
      }
      auto it = ctx.fresh_for_text.find(text);
      if (it == ctx.fresh_for_text.end()) {
        it = ctx.fresh_for_text.emplace(text, fresh_symbol(ctx, text)).first;
      }
      dims.push_back(ir::Dim::symbol(it->second));
    } else {
      dims.push_back(ir::Dim::symbol(fresh_symbol(ctx, vi.name() + "_d" + std::to_string(i))));
    }
  }
  // Later passes multiply static dims unchecked (element counts, byte sizes), so a static shape
  // whose byte size overflows int64 is refused here, where the model's own words can name it.
  std::optional<int64_t> bytes = int64_t(dtype_size(dtype));
  for (const auto& d : dims) {
    if (bytes && d.is_const()) bytes = checked_mul(*bytes, d.value());
  }
  if (!bytes) {
    return invalid_model(label + " has shape " + ir::dims_to_string(dims) +
                         ", whose size in bytes overflows int64");
  }
  v->shape = std::move(dims);
  return ok_status();
}

void set_constant(ir::Value* v, Tensor t) {
  v->dtype = t.dtype();
  v->shape = std::vector<ir::Dim>(t.shape().begin(), t.shape().end());
  v->constant = std::move(t);
}

Status parse_graph(const ::onnx::GraphProto& gp, ModelContext& ctx, int depth, const Scope& outer,
                   ir::Graph* g);

// ONNX writers before type discriminators existed left `type` unset; infer it from the field set.
int attribute_type(const ::onnx::AttributeProto& ap) {
  using A = ::onnx::AttributeProto;
  if (ap.type() != A::UNDEFINED) return ap.type();
  if (ap.has_t()) return A::TENSOR;
  if (ap.has_g()) return A::GRAPH;
  if (ap.has_sparse_tensor()) return A::SPARSE_TENSOR;
  if (ap.has_s()) return A::STRING;
  if (ap.has_i()) return A::INT;
  if (ap.has_f()) return A::FLOAT;
  if (ap.floats_size()) return A::FLOATS;
  if (ap.ints_size()) return A::INTS;
  if (ap.strings_size()) return A::STRINGS;
  if (ap.tensors_size()) return A::TENSORS;
  if (ap.graphs_size()) return A::GRAPHS;
  if (ap.sparse_tensors_size()) return A::SPARSE_TENSORS;
  return A::UNDEFINED;
}

StatusOr<ir::Attribute> convert_attribute(const ::onnx::AttributeProto& ap, ModelContext& ctx,
                                          int depth, const Scope& scope) {
  using A = ::onnx::AttributeProto;
  const std::string label = "attribute '" + ap.name() + "'";
  if (!ap.ref_attr_name().empty()) {
    return unsupported(label + " refers to function attribute '" + ap.ref_attr_name() +
                       "'; kiln does not expand ONNX functions");
  }
  ir::Attribute a;
  auto subgraph = [&](const ::onnx::GraphProto& sub) -> StatusOr<std::shared_ptr<ir::Graph>> {
    auto sg = std::make_shared<ir::Graph>();
    Status s = parse_graph(sub, ctx, depth + 1, scope, sg.get());
    if (!s.ok()) return with_context(s, label + ", graph '" + sub.name() + "'");
    return sg;
  };
  auto tensor = [&](const ::onnx::TensorProto& tp) -> StatusOr<Tensor> {
    auto t = decode_tensor(tp, ctx.model_dir);
    if (!t.ok()) return with_context(t.status(), label);
    return t;
  };
  switch (attribute_type(ap)) {
    case A::FLOAT:
      a.type = ir::AttrType::kFloat;
      a.f = ap.f();
      break;
    case A::INT:
      a.type = ir::AttrType::kInt;
      a.i = ap.i();
      break;
    case A::STRING:
      a.type = ir::AttrType::kString;
      a.s = ap.s();
      break;
    case A::TENSOR: {
      a.type = ir::AttrType::kTensor;
      KILN_ASSIGN_OR_RETURN(a.t, tensor(ap.t()));
      break;
    }
    case A::GRAPH: {
      a.type = ir::AttrType::kGraph;
      KILN_ASSIGN_OR_RETURN(a.g, subgraph(ap.g()));
      break;
    }
    case A::FLOATS:
      a.type = ir::AttrType::kFloats;
      a.floats.assign(ap.floats().begin(), ap.floats().end());
      break;
    case A::INTS:
      a.type = ir::AttrType::kInts;
      a.ints.assign(ap.ints().begin(), ap.ints().end());
      break;
    case A::STRINGS:
      a.type = ir::AttrType::kStrings;
      a.strings.assign(ap.strings().begin(), ap.strings().end());
      break;
    case A::TENSORS:
      a.type = ir::AttrType::kTensors;
      for (const auto& tp : ap.tensors()) {
        KILN_ASSIGN_OR_RETURN(Tensor t, tensor(tp));
        a.tensors.push_back(std::move(t));
      }
      break;
    case A::GRAPHS:
      a.type = ir::AttrType::kGraphs;
      for (const auto& sub : ap.graphs()) {
        KILN_ASSIGN_OR_RETURN(auto sg, subgraph(sub));
        a.graphs.push_back(std::move(sg));
      }
      break;
    case A::SPARSE_TENSOR:
    case A::SPARSE_TENSORS:
      return unsupported(label + " holds a sparse tensor, which kiln does not support");
    case A::TYPE_PROTO: {
      // Optional's `type` (the type of an empty optional), kept as text: "tensor(float32)",
      // "seq(tensor(float32))"; the build reads whether it is a sequence.
      const ::onnx::TypeProto* t = &ap.tp();
      std::string text;
      int closing = 0;
      for (int level = 0; level < 4; ++level, ++closing) {
        if (t->has_optional_type()) {
          text += "optional(";
          t = &t->optional_type().elem_type();
        } else if (t->has_sequence_type()) {
          text += "seq(";
          t = &t->sequence_type().elem_type();
        } else {
          break;
        }
      }
      if (!t->has_tensor_type())
        return unsupported(label + " holds a type other than a tensor, a sequence or an optional");
      text += std::string("tensor(") + onnx_type_name(t->tensor_type().elem_type()) + ")" +
              std::string(size_t(closing), ')');
      a.type = ir::AttrType::kString;
      a.s = text;
      break;
    }
    case A::TYPE_PROTOS:
      return unsupported(label + " holds a list of types, which kiln does not support");
    case A::UNDEFINED:
      return invalid_model(label + " has no type and no value");
    default:
      return invalid_model(label + " has unknown type " + std::to_string(int(ap.type())));
  }
  return a;
}

// An ai.onnx Constant node becomes the constant content of its output value.
StatusOr<Tensor> fold_constant(const ir::Node& node) {
  const auto& attrs = node.attrs.all();
  if (attrs.size() != 1) {
    return invalid_model(node.describe() + ": Constant needs exactly one attribute, has " +
                         std::to_string(attrs.size()));
  }
  // Named references rather than a structured binding: clang 14 (the fuzz build) cannot capture
  // a binding in a lambda.
  const std::string& name = attrs.begin()->first;
  const ir::Attribute& a = attrs.begin()->second;
  auto wrong = [&](const char* want) {
    return invalid_model(node.describe() + ": attribute '" + name + "' must be " + want);
  };
  if (name == "value") {
    if (a.type != ir::AttrType::kTensor) return wrong("a tensor");
    return a.t;
  }
  if (name == "value_float") {
    if (a.type != ir::AttrType::kFloat) return wrong("a float");
    return Tensor::from_vector<float>(DType::kFloat32, {}, {a.f});
  }
  if (name == "value_floats") {
    if (a.type != ir::AttrType::kFloats) return wrong("a list of floats");
    return Tensor::from_vector<float>(DType::kFloat32, {int64_t(a.floats.size())}, a.floats);
  }
  if (name == "value_int") {
    if (a.type != ir::AttrType::kInt) return wrong("an int");
    return Tensor::from_vector<int64_t>(DType::kInt64, {}, {a.i});
  }
  if (name == "value_ints") {
    if (a.type != ir::AttrType::kInts) return wrong("a list of ints");
    return Tensor::from_vector<int64_t>(DType::kInt64, {int64_t(a.ints.size())}, a.ints);
  }
  if (name == "value_string" || name == "value_strings" || name == "sparse_value") {
    return unsupported(node.describe() + ": attribute '" + name +
                       "' (string or sparse constants) " + "is not supported");
  }
  return invalid_model(node.describe() + ": unknown Constant attribute '" + name + "'");
}

Status parse_graph(const ::onnx::GraphProto& gp, ModelContext& ctx, int depth, const Scope& outer,
                   ir::Graph* g) {
  if (depth > kMaxGraphDepth) {
    return invalid_model("subgraphs are nested deeper than " + std::to_string(kMaxGraphDepth) +
                         " levels");
  }
  const bool is_main = depth == 0;
  const std::string graph_label = is_main ? "main graph" : "subgraph '" + gp.name() + "'";
  g->name = gp.name();
  g->opsets = ctx.opsets;
  if (gp.sparse_initializer_size() > 0) {
    return unsupported(graph_label + " has sparse initializers, which kiln does not support");
  }
  reserve_symbols(gp, ctx);

  std::unordered_map<std::string, int> index;
  auto value_of = [&](const std::string& name) {
    auto it = index.find(name);
    if (it != index.end()) return it->second;
    int v = g->add_value(name);
    index.emplace(name, v);
    return v;
  };

  // Every name this graph defines, visible to its subgraphs wherever they appear.
  std::unordered_set<std::string> defined;
  for (const auto& tp : gp.initializer()) defined.insert(tp.name());
  for (const auto& vi : gp.input()) defined.insert(vi.name());
  for (const auto& np : gp.node()) {
    for (const auto& o : np.output()) {
      if (!o.empty()) defined.insert(o);
    }
  }
  Scope inner = outer;
  inner.push_back(&defined);

  for (const auto& tp : gp.initializer()) {
    if (tp.name().empty()) return invalid_model(graph_label + ": an initializer has no name");
    if (index.count(tp.name())) {
      return invalid_model(graph_label + ": initializer '" + tp.name() + "' is defined twice");
    }
    KILN_ASSIGN_OR_RETURN(Tensor t, decode_tensor(tp, ctx.model_dir));
    set_constant(&g->values[value_of(tp.name())], std::move(t));
  }

  std::unordered_set<int> input_set;
  for (const auto& vi : gp.input()) {
    if (vi.name().empty()) return invalid_model(graph_label + ": a graph input has no name");
    auto it = index.find(vi.name());
    if (it != index.end()) {
      // IR < 4 lists initializers among the inputs; they stay constants.
      if (g->values[it->second].constant) continue;
      return invalid_model(graph_label + ": graph input '" + vi.name() + "' is listed twice");
    }
    const int v = value_of(vi.name());
    KILN_RETURN_IF_ERROR(read_value_type(vi, "graph input '" + vi.name() + "'", is_main,
                                         /*with_shape=*/true, ctx, &g->values[v]));
    g->inputs.push_back(v);
    input_set.insert(v);
  }

  for (int n = 0; n < gp.node_size(); ++n) {
    const auto& np = gp.node(n);
    ir::Node node;
    node.op_type = np.op_type();
    node.domain = normalize_domain(np.domain());
    node.name = np.name().empty() ? np.op_type() + "_" + std::to_string(n) : np.name();
    if (node.op_type.empty()) {
      return invalid_model(graph_label + ": node " + std::to_string(n) + " ('" + node.name +
                           "') has no op_type");
    }
    auto opset = ctx.opsets.find(node.domain);
    if (opset == ctx.opsets.end()) {
      return invalid_model(node.describe() + ": domain '" +
                           (node.domain.empty() ? std::string("ai.onnx") : node.domain) +
                           "' is not in the model's opset_import");
    }
    node.opset = opset->second;
    for (const auto& ap : np.attribute()) {
      if (ap.name().empty()) return invalid_model(node.describe() + ": an attribute has no name");
      if (node.attrs.has(ap.name())) {
        return invalid_model(node.describe() + ": attribute '" + ap.name() + "' appears twice");
      }
      auto a = convert_attribute(ap, ctx, depth, inner);
      if (!a.ok()) return with_context(a.status(), node.describe());
      node.attrs.set(ap.name(), std::move(a).value());
    }

    if (node.domain.empty() && node.op_type == "Constant") {
      if (np.output_size() != 1) {
        return invalid_model(node.describe() + ": Constant must have exactly one output");
      }
      KILN_ASSIGN_OR_RETURN(Tensor t, fold_constant(node));
      if (np.output(0).empty()) continue;  // an unused constant
      const int v = value_of(np.output(0));
      if (g->values[v].constant || input_set.count(v)) {
        return invalid_model(node.describe() + ": output '" + np.output(0) +
                             "' is already defined (ONNX graphs assign each value once)");
      }
      set_constant(&g->values[v], std::move(t));
      continue;
    }
    for (const auto& i : np.input()) node.inputs.push_back(i.empty() ? -1 : value_of(i));
    for (const auto& o : np.output()) {
      if (o.empty()) {
        node.outputs.push_back(-1);
        continue;
      }
      const int v = value_of(o);
      if (g->values[v].constant || input_set.count(v)) {
        return invalid_model(node.describe() + ": output '" + o +
                             "' is already defined as a graph input or initializer (ONNX graphs "
                             "assign each value once)");
      }
      node.outputs.push_back(v);
    }
    // Upsample (opsets 7 to 9; gone since 10) is Resize as opset 10 defines it: input X and the
    // scales, the same modes, asymmetric coordinates. Upsample-7 gives the scales as an attribute,
    // which becomes a constant input.
    if (node.domain.empty() && node.op_type == "Upsample") {
      if (node.inputs.size() < 2) {
        auto scales = node.attrs.get_floats("scales", std::nullopt);
        if (!scales.ok()) return with_context(scales.status(), node.describe());
        std::string name = node.name + "::scales";
        while (index.count(name)) name += "_";
        const int v = value_of(name);
        set_constant(&g->values[v],
                     Tensor::from_vector(DType::kFloat32, {int64_t(scales->size())}, *scales));
        node.inputs.push_back(v);
      }
      node.op_type = "Resize";
      node.opset = 10;
    }
    g->nodes.push_back(std::move(node));
  }

  std::vector<char> is_defined(g->values.size(), 0);
  for (int v : g->inputs) is_defined[v] = 1;
  for (size_t v = 0; v < g->values.size(); ++v) {
    if (g->values[v].constant) is_defined[v] = 1;
  }
  for (const auto& node : g->nodes) {
    for (int v : node.outputs) {
      if (v >= 0) is_defined[v] = 1;
    }
  }
  auto in_outer = [&](const std::string& name) {
    for (const auto* names : outer) {
      if (names->count(name)) return true;
    }
    return false;
  };
  // Values a subgraph reads from enclosing graphs: left unresolved, by name.
  std::vector<int> outer_values;
  for (const auto& node : g->nodes) {
    for (int v : node.inputs) {
      if (v < 0 || is_defined[v]) continue;
      if (!in_outer(g->values[v].name)) {
        return invalid_model(node.describe() + ": input '" + g->values[v].name +
                             "' is not produced by any node, initializer or graph input");
      }
      is_defined[v] = 1;
      outer_values.push_back(v);
    }
  }

  for (const auto& vi : gp.output()) {
    if (vi.name().empty()) return invalid_model(graph_label + ": a graph output has no name");
    const std::string label = "graph output '" + vi.name() + "'";
    auto it = index.find(vi.name());
    int v = -1;
    if (it != index.end() && is_defined[it->second]) {
      v = it->second;
    } else if (in_outer(vi.name())) {
      v = value_of(vi.name());
      is_defined.resize(g->values.size(), 0);
      is_defined[v] = 1;
      outer_values.push_back(v);
    } else {
      return invalid_model(graph_label + ": " + label +
                           " is not produced by any node, initializer or graph input");
    }
    // Shapes are inferred by the builder; only the declared element type and kind are taken here.
    ir::Value declared;
    KILN_RETURN_IF_ERROR(
        read_value_type(vi, label, /*require=*/false, /*with_shape=*/false, ctx, &declared));
    if (g->values[v].dtype == DType::kUndefined) g->values[v].dtype = declared.dtype;
    if (vi.has_type() && g->values[v].kind == ir::ValueKind::kTensor)
      g->values[v].kind = declared.kind;  // an input's own stays
    g->outputs.push_back(v);
  }

  // Outer values count as defined while sorting, then go back to being plain names.
  const size_t num_inputs = g->inputs.size();
  g->inputs.insert(g->inputs.end(), outer_values.begin(), outer_values.end());
  Status sorted = ir::sort_topologically(g);
  g->inputs.resize(num_inputs);
  if (!sorted.ok()) return with_context(sorted, graph_label);
  return ok_status();
}

StatusOr<Network> parse_model(std::span<const uint8_t> bytes, const std::string& model_dir,
                              const std::string& path) {
  const std::string what = path.empty() ? std::string("model") : "model '" + path + "'";
  if (bytes.size() > kMaxProtoBytes) {
    return invalid_model(what + " is " + std::to_string(bytes.size()) +
                         " bytes; protobuf files are limited to 2 GiB (store weights as external "
                         "data next to the model)");
  }
  ::onnx::ModelProto model;
  if (!model.ParseFromArray(bytes.data(), int(bytes.size())) || !model.has_ir_version()) {
    return invalid_model(what + " is not a valid ONNX ModelProto");
  }
  if (!model.has_graph()) return invalid_model(what + " has no graph");

  ModelContext ctx;
  ctx.model_dir = model_dir;
  for (const auto& op : model.opset_import()) {
    const std::string domain = normalize_domain(op.domain());
    const std::string shown = domain.empty() ? std::string("ai.onnx") : domain;
    if (ctx.opsets.count(domain)) {
      return invalid_model(what + " imports domain '" + shown + "' twice");
    }
    if (op.version() < 1 || op.version() > INT_MAX) {
      return invalid_model(what + " imports domain '" + shown + "' with invalid version " +
                           std::to_string(op.version()));
    }
    if (domain.empty() && (op.version() < kMinOpset || op.version() > kMaxOpset)) {
      return unsupported(what + " uses ai.onnx opset " + std::to_string(op.version()) +
                         "; kiln supports opsets " + std::to_string(kMinOpset) + " to " +
                         std::to_string(kMaxOpset) + " (convert it with onnx.version_converter)");
    }
    ctx.opsets[domain] = int(op.version());
  }

  Network net;
  net.model_hash = fnv1a64(bytes);
  net.path = path;
  net.ir_version = model.ir_version();
  net.producer = model.producer_name();
  Status s = parse_graph(model.graph(), ctx, 0, {}, &net.graph);
  if (!s.ok()) return s;
  return net;
}

std::string folder_of(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? std::string(".") : dir;
}

StatusOr<Tensor> parse_tensor(std::span<const uint8_t> bytes, const std::string& dir,
                              const std::string& what) {
  if (bytes.size() > kMaxProtoBytes) return invalid_model(what + " is larger than 2 GiB");
  ::onnx::TensorProto tp;
  if (!tp.ParseFromArray(bytes.data(), int(bytes.size()))) {
    return invalid_model(what + " is not a valid ONNX TensorProto");
  }
  auto t = decode_tensor(tp, dir);
  if (!t.ok()) return with_context(t.status(), what);
  return t;
}

// The tensors of a SequenceProto: tensor elements only.
StatusOr<std::vector<Tensor>> sequence_tensors(const ::onnx::SequenceProto& sp,
                                               const std::string& dir, const std::string& what) {
  if (sp.sparse_tensor_values_size() || sp.sequence_values_size() || sp.map_values_size() ||
      sp.optional_values_size()) {
    return unsupported(what + " holds a sequence of other than tensors");
  }
  std::vector<Tensor> out;
  for (int i = 0; i < sp.tensor_values_size(); ++i) {
    auto t = decode_tensor(sp.tensor_values(i), dir);
    if (!t.ok()) return with_context(t.status(), what + ", element " + std::to_string(i));
    out.push_back(std::move(*t));
  }
  return out;
}

}  // namespace

StatusOr<DataValue> parse_value_file(const std::string& path, ir::ValueKind kind) {
  KILN_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, read_file_bytes(path, kMaxProtoBytes, "value"));
  const std::string what = "value file '" + path + "'";
  const std::string dir = folder_of(path);
  DataValue out;
  out.kind = kind;
  switch (kind) {
    case ir::ValueKind::kTensor: {
      KILN_ASSIGN_OR_RETURN(Tensor t, parse_tensor(bytes, dir, what));
      out.tensors.push_back(std::move(t));
      return out;
    }
    case ir::ValueKind::kSequence: {
      ::onnx::SequenceProto sp;
      if (!sp.ParseFromArray(bytes.data(), int(bytes.size())))
        return invalid_model(what + " is not a valid ONNX SequenceProto");
      KILN_ASSIGN_OR_RETURN(out.tensors, sequence_tensors(sp, dir, what));
      return out;
    }
    case ir::ValueKind::kOptionalTensor:
    case ir::ValueKind::kOptionalSequence: {
      ::onnx::OptionalProto op;
      if (!op.ParseFromArray(bytes.data(), int(bytes.size())))
        return invalid_model(what + " is not a valid ONNX OptionalProto");
      if (op.has_tensor_value()) {
        auto t = decode_tensor(op.tensor_value(), dir);
        if (!t.ok()) return with_context(t.status(), what);
        out.tensors.push_back(std::move(*t));
      } else if (op.has_sequence_value()) {
        KILN_ASSIGN_OR_RETURN(out.tensors, sequence_tensors(op.sequence_value(), dir, what));
      } else if (op.has_sparse_tensor_value() || op.has_map_value() || op.has_optional_value()) {
        return unsupported(what + " holds an optional of other than a tensor or a sequence");
      } else {
        out.present = false;
      }
      return out;
    }
  }
  return internal_error(what + ": unknown kind");
}

StatusOr<Network> parse_file(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, read_file_bytes(path, kMaxProtoBytes, "model"));
  return parse_model(bytes, folder_of(path), path);
}

StatusOr<Network> parse_bytes(std::span<const uint8_t> bytes, const std::string& model_dir) {
  return parse_model(bytes, model_dir, "");
}

StatusOr<Tensor> parse_tensor_file(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes,
                        read_file_bytes(path, kMaxProtoBytes, "tensor"));
  return parse_tensor(bytes, folder_of(path), "tensor file '" + path + "'");
}

StatusOr<Tensor> tensor_from_bytes(std::span<const uint8_t> bytes) {
  return parse_tensor(bytes, "", "tensor bytes");
}

}  // namespace kiln::onnx
