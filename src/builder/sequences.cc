// Sequences and optionals, laid out at build time. A sequence value is a list of tensor values the
// build knows (its length is fixed when the engine is built), an optional a tensor or sequence that
// is there or not; neither exists at run time:
// - expand_sequence_inputs (a pass, before bind_profiles): a sequence input `s` of the length the
//   config gives becomes the tensor inputs "s[0]" .. "s[n-1]", each element with dims of its own;
//   an optional input is a tensor input, or nothing where the config says it is absent.
// - expand_sequence_op (infer_shapes, node by node): SequenceConstruct, SequenceInsert/Erase/At/
//   Length, SplitToSequence, ConcatFromSequence, SequenceMap and the Optional ops become the tensor
//   nodes they stand for (Split, Concat, Identity, a copy of SequenceMap's body per element) or
//   nothing (a sequence built from values is a list of them); positions must be known at build
//   time. Identity and kiln::SelectBranch (an If on data) pass sequences on element by element.
// - expand_sequence_outputs (infer_shapes, at the end): a sequence output `y` becomes the tensor
//   outputs "y[0]" .. "y[n-1]"; an empty optional output has none.
// The names follow BuilderConfig::set_sequence_length's contract (config.h).
#include <algorithm>
#include <set>

#include "builder/build_state.h"
#include "builder/builder.h"
#include "builder/expansion.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

bool is_sequence_op(ops::OpKind k) {
  switch (k) {
    case ops::OpKind::kSequenceEmpty:
    case ops::OpKind::kSequenceConstruct:
    case ops::OpKind::kSequenceInsert:
    case ops::OpKind::kSequenceErase:
    case ops::OpKind::kSequenceAt:
    case ops::OpKind::kSequenceLength:
    case ops::OpKind::kSplitToSequence:
    case ops::OpKind::kConcatFromSequence:
    case ops::OpKind::kSequenceMap:
    case ops::OpKind::kOptional:
    case ops::OpKind::kOptionalHasElement:
    case ops::OpKind::kOptionalGetElement:
      return true;
    default:
      return false;
  }
}

std::string describe(const Composite& c) {
  if (!c.present) return "an empty optional";
  return c.sequence ? "a sequence of " + std::to_string(c.elements.size()) + " tensors"
                    : "an optional tensor";
}

ir::ValueKind kind_of(const Composite& c) {
  return c.sequence ? ir::ValueKind::kSequence : ir::ValueKind::kOptionalTensor;
}

// The dims of element i of a sequence input: each element has dims of its own, so symbol `h` of
// the declared element type is `h_<i>` for element i (made unique among `taken`).
std::vector<ir::Dim> element_dims(const std::vector<ir::Dim>& dims, int64_t i,
                                  std::set<std::string>* taken) {
  std::map<std::string, std::string> renamed;
  std::vector<ir::Dim> out;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k].is_const()) {
      out.push_back(dims[k]);
      continue;
    }
    const std::string base = dims[k].is_symbol() ? dims[k].to_string() : "d" + std::to_string(k);
    auto it = renamed.find(base);
    if (it == renamed.end())
      it = renamed.emplace(base, ir::unique_symbol(base + "_" + std::to_string(i), taken)).first;
    out.push_back(ir::Dim::symbol(it->second));
  }
  return out;
}

// The error for input `i` of `node` (`what` it is) whose value the layout needs at build time and
// only the run knows; a graph input is told it can be a shape-value input (the same words as
// InferContext::require_value's, which the node-test runner and kiln.backend look for).
std::string needs_value_text(const ir::Graph& g, const ir::Node& node, size_t i,
                             const std::string& what) {
  const ir::Value& v = g.values[size_t(node.inputs[i])];
  const bool graph_input = v.producer < 0 && !v.constant;
  return std::string("input ") + std::to_string(i) + " ('" + v.name + "', the " + what +
         ") is computed from tensor data at run time; kiln lays sequences and optionals out at "
         "build "
         "time, so it must be known then (a constant or a function of input shapes)" +
         (graph_input
              ? "; as a model input it can take shape values: give their range in the profile "
                "(OptimizationProfile::set_shape_values; kiln --minShapes=" +
                    v.name + ":v1xv2 ...)"
              : std::string());
}

Status needs_value(const ir::Graph& g, const ir::Node& node, size_t i, const std::string& what) {
  return unsupported(node.describe() + ": " + needs_value_text(g, node, i, what));
}

void set_composite(BuildState& s, int v, Composite c) {
  if (v < 0) return;
  ir::Value& val = s.graph.values[size_t(v)];
  val.kind = kind_of(c);
  val.producer = -1;
  s.composites[v] = std::move(c);
}

void set_scalar_constant(ir::Graph& g, int v, DType dtype, int64_t x) {
  if (v < 0) return;
  ir::Value& val = g.values[size_t(v)];
  val.dtype = dtype;
  val.shape = std::vector<ir::Dim>{};
  val.constant =
      dtype == DType::kBool
          ? Tensor::from_vector(DType::kBool, Shape{}, std::vector<uint8_t>{uint8_t(x != 0)})
          : Tensor::from_vector(DType::kInt64, Shape{}, std::vector<int64_t>{x});
  val.producer = -1;
}

// kiln::SelectBranch (an If on data) whose branches give sequences or optionals: one pair of
// inputs per element. The branches must agree on the structure: whether an optional holds a value
// and a sequence's length are fixed when the engine is built.
StatusOr<bool> expand_select(BuildState& s, size_t n) {
  ir::Graph& g = s.graph;
  const ir::Node node = g.nodes[n];
  const size_t k = node.outputs.size();
  if (node.inputs.size() != 1 + 2 * k) return false;  // its inference names the mismatch
  std::vector<int> then_in, else_in, outs;
  std::vector<std::pair<int, Composite>> made;
  for (size_t j = 0; j < k; ++j) {
    const int t = node.inputs[1 + j], e = node.inputs[1 + k + j];
    auto ct = s.composites.find(t), ce = s.composites.find(e);
    const bool is_t = ct != s.composites.end(), is_e = ce != s.composites.end();
    if (!is_t && !is_e) {
      then_in.push_back(t), else_in.push_back(e), outs.push_back(node.outputs[j]);
      continue;
    }
    const std::string out_name =
        node.outputs[j] >= 0 ? g.values[size_t(node.outputs[j])].name : "#" + std::to_string(j);
    if (!is_t || !is_e) {
      return invalid_model(node.describe() + ": for output '" + out_name +
                           "' one branch gives a tensor and the other " +
                           describe(is_t ? ct->second : ce->second));
    }
    const Composite a = ct->second, b = ce->second;
    if (a.present != b.present || a.sequence != b.sequence ||
        a.elements.size() != b.elements.size()) {
      return unsupported(node.describe() + ": its output '" + out_name + "' is " + describe(a) +
                         " in one branch and " + describe(b) + " in the other, and its " +
                         needs_value_text(g, node, 0, "If's condition"));
    }
    Composite oc{a.sequence, a.present, {}};
    for (size_t i = 0; i < a.elements.size(); ++i) {
      if (node.outputs[j] < 0) break;
      const int o = ir::add_unique_value(&g, out_name + "/" + std::to_string(i), DType::kUndefined,
                                         std::nullopt);
      then_in.push_back(a.elements[i]), else_in.push_back(b.elements[i]), outs.push_back(o);
      oc.elements.push_back(o);
    }
    made.push_back({node.outputs[j], std::move(oc)});
  }
  std::vector<ir::Node> nodes;
  if (!outs.empty()) {
    ir::Node sel = node;
    sel.guards.clear();  // splice gives back node n's
    sel.inputs = {node.inputs[0]};
    sel.inputs.insert(sel.inputs.end(), then_in.begin(), then_in.end());
    sel.inputs.insert(sel.inputs.end(), else_in.begin(), else_in.end());
    sel.outputs = outs;
    nodes.push_back(std::move(sel));
  }
  splice(g, n, std::move(nodes));
  for (auto& [v, c] : made) set_composite(s, v, std::move(c));
  return true;
}

}  // namespace

Status expand_sequence_inputs(BuildState& s) {
  ir::Graph& g = s.graph;
  auto input_named = [&](const std::string& name) {
    for (int v : g.inputs) {
      if (g.values[size_t(v)].name == name) return v;
    }
    return -1;
  };
  for (const auto& [name, length] : s.config.sequence_lengths()) {
    const int v = input_named(name);
    const ir::ValueKind k = v < 0 ? ir::ValueKind::kTensor : g.values[size_t(v)].kind;
    if (k != ir::ValueKind::kSequence && k != ir::ValueKind::kOptionalSequence) {
      return invalid_argument(
          "the build config gives a sequence length for '" + name + "', which is " +
          (v < 0 ? "not an input of the model"
                 : "a " + ir::type_to_string(g.values[size_t(v)]) + " input, not a sequence"));
    }
  }
  for (const auto& [name, present] : s.config.optional_present()) {
    const int v = input_named(name);
    const ir::ValueKind k = v < 0 ? ir::ValueKind::kTensor : g.values[size_t(v)].kind;
    if (k != ir::ValueKind::kOptionalTensor && k != ir::ValueKind::kOptionalSequence) {
      return invalid_argument(
          "the build config says whether '" + name + "' is present, but it is " +
          (v < 0 ? "not an input of the model"
                 : "a " + ir::type_to_string(g.values[size_t(v)]) + " input, not an optional"));
    }
  }
  std::set<std::string> taken;
  for (const ir::Value& v : g.values) {
    if (v.shape) {
      for (const ir::Dim& d : *v.shape) d.collect_symbols(&taken);
    }
  }
  std::vector<int> inputs;
  const std::vector<int> declared = g.inputs;
  for (int v : declared) {
    const ir::Value x = g.values[size_t(v)];
    if (x.kind == ir::ValueKind::kTensor) {
      inputs.push_back(v);
      continue;
    }
    const bool optional =
        x.kind == ir::ValueKind::kOptionalTensor || x.kind == ir::ValueKind::kOptionalSequence;
    auto p = s.config.optional_present().find(x.name);
    if (optional && p != s.config.optional_present().end() && !p->second) {
      set_composite(s, v, Composite{x.kind == ir::ValueKind::kOptionalSequence, false, {}});
      continue;
    }
    if (x.kind == ir::ValueKind::kOptionalTensor) {
      g.values[size_t(v)].kind = ir::ValueKind::kTensor;  // present: the tensor it holds
      inputs.push_back(v);
      continue;
    }
    auto len = s.config.sequence_lengths().find(x.name);
    if (len == s.config.sequence_lengths().end()) {
      return invalid_argument(
          "graph input '" + x.name + "' is a " + ir::type_to_string(x) +
          "; kiln lays sequences out at build time: give its length "
          "(BuilderConfig::set_sequence_length, `kiln build --sequenceLengths=" +
          x.name + ":N`)");
    }
    Composite c{true, true, {}};
    for (int64_t i = 0; i < len->second; ++i) {
      const std::string name = sequence_element_name(x.name, i);
      if (g.find_value(name) >= 0) {
        return invalid_model("sequence input '" + x.name + "': its element " + std::to_string(i) +
                             " would be the input '" + name + "', a name the model already uses");
      }
      const int e = g.add_value(name);
      g.values[size_t(e)].dtype = x.dtype;
      if (x.shape) g.values[size_t(e)].shape = element_dims(*x.shape, i, &taken);
      inputs.push_back(e);
      c.elements.push_back(e);
    }
    set_composite(s, v, std::move(c));
  }
  g.inputs = std::move(inputs);
  return ok_status();
}

std::vector<ir::Value> tensor_inputs(const ir::Graph& graph, const BuilderConfig& config) {
  std::vector<ir::Value> out;
  for (int v : graph.inputs) {
    ir::Value val = graph.values[size_t(v)];
    auto present = config.optional_present().find(val.name);
    if (present != config.optional_present().end() && !present->second) continue;
    if (val.kind != ir::ValueKind::kSequence && val.kind != ir::ValueKind::kOptionalSequence) {
      val.kind = ir::ValueKind::kTensor;
      out.push_back(std::move(val));
      continue;
    }
    auto length = config.sequence_lengths().find(val.name);
    for (int64_t i = 0; length != config.sequence_lengths().end() && i < length->second; ++i) {
      ir::Value element = val;
      element.name = sequence_element_name(val.name, i);
      element.kind = ir::ValueKind::kTensor;
      out.push_back(std::move(element));
    }
  }
  return out;
}

StatusOr<bool> expand_sequence_op(BuildState& s, size_t n) {
  ir::Graph& g = s.graph;
  const ir::Node node = g.nodes[n];
  const ops::OpKind kind = ops::find_op(node.domain, node.op_type);
  auto composite = [&](size_t i) -> const Composite* {
    if (i >= node.inputs.size() || node.inputs[i] < 0) return nullptr;
    auto it = s.composites.find(node.inputs[i]);
    return it == s.composites.end() ? nullptr : &it->second;
  };
  bool reads = false;
  for (size_t i = 0; i < node.inputs.size(); ++i) reads = reads || composite(i);
  if (!is_sequence_op(kind) && !reads) return false;
  if (kind == ops::OpKind::kSelectBranch) return expand_select(s, n);
  // A node of a subgraph (a Loop's body, an If's branch) reaches here unchecked by check_supported.
  const ops::OpSchema* schema = ops::find_schema(node);
  if (is_sequence_op(kind) && schema) {
    const std::vector<std::string> wrong = arity_problems(node, *schema);
    if (!wrong.empty()) return invalid_model(wrong.front());
  }
  auto input_name = [&](size_t i) { return g.values[size_t(node.inputs[i])].name; };
  if (!is_sequence_op(kind) && kind != ops::OpKind::kIdentity) {
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      if (const Composite* c = composite(i)) {
        return unsupported(node.describe() + ": its input " + std::to_string(i) + " ('" +
                           input_name(i) + "') is " + describe(*c) + ", and " + node.op_type +
                           " takes tensors");
      }
    }
  }
  // Input i as a sequence (an optional sequence that holds one counts).
  auto sequence = [&](size_t i) -> StatusOr<const Composite*> {
    const Composite* c = composite(i);
    if (c && c->sequence && c->present) return c;
    return invalid_model(
        node.describe() + ": its input " + std::to_string(i) +
        (i < node.inputs.size() && node.inputs[i] >= 0 ? " ('" + input_name(i) + "')"
                                                       : std::string()) +
        " must be a sequence, and it is " + (c ? describe(*c) : std::string("a tensor")));
  };
  // Input i as a tensor.
  auto tensor = [&](size_t i) -> Status {
    if (const Composite* c = composite(i)) {
      return invalid_model(node.describe() + ": its input " + std::to_string(i) + " ('" +
                           input_name(i) + "') must be a tensor, and it is " + describe(*c));
    }
    return ok_status();
  };
  // A position into a sequence of `len` elements from input i (or `dflt` where it is omitted),
  // between lo and hi (negative ones counting from the end), made non-negative.
  auto position = [&](size_t i, int64_t len, int64_t dflt, int64_t lo,
                      int64_t hi) -> StatusOr<int64_t> {
    if (i >= node.inputs.size() || node.inputs[i] < 0) return dflt;
    KILN_RETURN_IF_ERROR(tensor(i));
    const std::optional<int64_t> p = known_scalar(g.values[size_t(node.inputs[i])]);
    if (!p) return needs_value(g, node, i, "position");
    if (*p < lo || *p > hi) {
      return invalid_model(node.describe() + ": position " + std::to_string(*p) + " is outside " +
                           std::to_string(lo) + ".." + std::to_string(hi) + " for a sequence of " +
                           std::to_string(len) + " elements");
    }
    return *p < 0 ? *p + len : *p;
  };
  // A dim every profile fixes to one value (a profile of min = max) counts as that number.
  auto known_dim = [&](const ir::Dim& d) -> std::optional<int64_t> {
    if (d.is_const()) return d.value();
    const ir::Interval b = d.bounds(plan::symbol_hull(s.profiles));
    if (b.is_point()) return b.lo;
    return std::nullopt;
  };
  const std::string prefix = node.name.empty() ? node.op_type : node.name;
  std::vector<ir::Node> nodes;
  Emitter e(g, prefix, &nodes);
  std::vector<std::pair<int, Composite>> made;  // outputs that are sequences or optionals
  const int out = node.outputs.empty() ? -1 : node.outputs[0];
  switch (kind) {
    case ops::OpKind::kIdentity:
      made.push_back({out, *composite(0)});
      break;
    case ops::OpKind::kSequenceEmpty:
      made.push_back({out, Composite{true, true, {}}});
      break;
    case ops::OpKind::kSequenceConstruct: {
      Composite c{true, true, {}};
      for (size_t i = 0; i < node.inputs.size(); ++i) {
        KILN_RETURN_IF_ERROR(tensor(i));
        if (node.inputs[i] < 0)
          return invalid_model(node.describe() + ": its input " + std::to_string(i) +
                               " is omitted");
        if (g.values[size_t(node.inputs[i])].dtype != g.values[size_t(node.inputs[0])].dtype) {
          return invalid_model(node.describe() + ": its inputs are " +
                               ir::type_to_string(g.values[size_t(node.inputs[0])]) + " and " +
                               ir::type_to_string(g.values[size_t(node.inputs[i])]) +
                               "; a sequence's elements share one dtype");
        }
        c.elements.push_back(node.inputs[i]);
      }
      made.push_back({out, std::move(c)});
      break;
    }
    case ops::OpKind::kSequenceInsert: {
      KILN_ASSIGN_OR_RETURN(const Composite* c, sequence(0));
      KILN_RETURN_IF_ERROR(tensor(1));
      const int64_t len = int64_t(c->elements.size());
      KILN_ASSIGN_OR_RETURN(int64_t at, position(2, len, len, -len, len));
      if (len > 0 &&
          g.values[size_t(node.inputs[1])].dtype != g.values[size_t(c->elements[0])].dtype) {
        return invalid_model(node.describe() + ": it inserts " +
                             ir::type_to_string(g.values[size_t(node.inputs[1])]) +
                             " into a sequence of " +
                             ir::type_to_string(g.values[size_t(c->elements[0])]));
      }
      Composite r = *c;
      r.elements.insert(r.elements.begin() + std::ptrdiff_t(at), node.inputs[1]);
      made.push_back({out, std::move(r)});
      break;
    }
    case ops::OpKind::kSequenceErase: {
      KILN_ASSIGN_OR_RETURN(const Composite* c, sequence(0));
      const int64_t len = int64_t(c->elements.size());
      if (len == 0) return invalid_model(node.describe() + ": it erases from an empty sequence");
      KILN_ASSIGN_OR_RETURN(int64_t at, position(1, len, len - 1, -len, len - 1));
      Composite r = *c;
      r.elements.erase(r.elements.begin() + std::ptrdiff_t(at));
      made.push_back({out, std::move(r)});
      break;
    }
    case ops::OpKind::kSequenceAt: {
      KILN_ASSIGN_OR_RETURN(const Composite* c, sequence(0));
      const int64_t len = int64_t(c->elements.size());
      if (len == 0) return invalid_model(node.describe() + ": it reads from an empty sequence");
      KILN_ASSIGN_OR_RETURN(int64_t at, position(1, len, 0, -len, len - 1));
      if (out >= 0) e.node("Identity", {c->elements[size_t(at)]}, out);
      break;
    }
    case ops::OpKind::kSequenceLength: {
      KILN_ASSIGN_OR_RETURN(const Composite* c, sequence(0));
      set_scalar_constant(g, out, DType::kInt64, int64_t(c->elements.size()));
      break;
    }
    case ops::OpKind::kSplitToSequence: {
      KILN_RETURN_IF_ERROR(tensor(0));
      const ir::Value& x = g.values[size_t(node.inputs[0])];
      const int64_t rank = int64_t(x.shape->size());
      KILN_ASSIGN_OR_RETURN(int64_t axis, node.attrs.get_int("axis", 0));
      KILN_ASSIGN_OR_RETURN(int64_t keepdims, node.attrs.get_int("keepdims", 1));
      if (axis < -rank || axis >= rank) {
        return invalid_model(node.describe() + ": axis " + std::to_string(axis) +
                             " is outside its input " + ir::type_to_string(x));
      }
      if (axis < 0) axis += rank;
      const bool has_split = node.inputs.size() > 1 && node.inputs[1] >= 0;
      if (has_split) KILN_RETURN_IF_ERROR(tensor(1));
      const ir::Value* split = has_split ? &g.values[size_t(node.inputs[1])] : nullptr;
      int split_input = -1;
      int64_t parts = 0;
      bool squeeze = false;
      if (split && split->shape->size() == 1) {
        const ir::Dim& count = (*split->shape)[0];
        const std::optional<int64_t> known = known_dim(count);
        if (!known) {
          return unsupported(node.describe() + ": its split ('" + split->name + "') has " +
                             count.to_string() +
                             " elements, which changes at run time; a sequence's length must be "
                             "known at build time");
        }
        parts = *known, split_input = node.inputs[1];
      } else {
        const ir::Dim& dim = (*x.shape)[size_t(axis)];
        const std::optional<int64_t> length = known_dim(dim);
        if (!length) {
          return unsupported(node.describe() + ": it splits dim " + std::to_string(axis) + " of '" +
                             x.name + "' (" + dim.to_string() +
                             "), which changes at run time; a sequence's length must be known at "
                             "build time (a profile that fixes the dim fixes it)");
        }
        const ir::Dim d(*length);
        int64_t chunk = 1;
        if (split) {
          if (split->shape->size() != 0) {
            return invalid_model(node.describe() + ": its split ('" + split->name +
                                 "') must be a scalar or 1-D, not " + ir::type_to_string(*split));
          }
          const std::optional<int64_t> k = known_scalar(*split);
          if (!k) return needs_value(g, node, 1, "split");
          if (*k <= 0)
            return invalid_model(node.describe() + ": its split is " + std::to_string(*k) +
                                 "; it must be positive");
          chunk = *k;
        } else {
          squeeze = keepdims == 0;
        }
        std::vector<int64_t> sizes;
        for (int64_t at = 0; at < d.value(); at += chunk)
          sizes.push_back(std::min(chunk, d.value() - at));
        parts = int64_t(sizes.size());
        if (parts > BuilderConfig::kMaxSequenceLength) {
          return unsupported(node.describe() + ": it makes a sequence of " + std::to_string(parts) +
                             " tensors; kiln lays out at most " +
                             std::to_string(BuilderConfig::kMaxSequenceLength));
        }
        if (parts > 0) split_input = e.constant_i64(sizes, false);
      }
      Composite c{true, true, {}};
      if (parts > 0) {
        std::vector<int> pieces;
        for (int64_t i = 0; i < parts; ++i) pieces.push_back(e.fresh("part"));
        e.nodes("Split", {node.inputs[0], split_input}, pieces, Emitter::int_attr("axis", axis));
        const int axes = squeeze ? e.constant_i64({axis}, false) : -1;
        for (int p : pieces) c.elements.push_back(squeeze ? e.node("Squeeze", {p, axes}, -1) : p);
      }
      made.push_back({out, std::move(c)});
      break;
    }
    case ops::OpKind::kConcatFromSequence: {
      KILN_ASSIGN_OR_RETURN(const Composite* c, sequence(0));
      KILN_ASSIGN_OR_RETURN(int64_t axis, node.attrs.get_int("axis", std::nullopt));
      KILN_ASSIGN_OR_RETURN(int64_t new_axis, node.attrs.get_int("new_axis", 0));
      if (c->elements.empty()) {
        return invalid_model(node.describe() +
                             ": it concatenates an empty sequence, which has no shape");
      }
      if (out < 0) break;
      if (new_axis != 0) {
        e.stack(c->elements, axis, out);
      } else if (c->elements.size() == 1) {
        e.node("Identity", {c->elements[0]}, out);
      } else {
        e.node("Concat", c->elements, out, Emitter::int_attr("axis", axis));
      }
      break;
    }
    case ops::OpKind::kSequenceMap: {
      const ir::Graph* body = graph_attr(node, "body");
      if (!body) return invalid_model(node.describe() + ": it has no graph attribute body");
      KILN_ASSIGN_OR_RETURN(const Composite* first, sequence(0));
      const size_t len = first->elements.size();
      for (size_t i = 1; i < node.inputs.size(); ++i) {
        const Composite* c = composite(i);
        if (c && (!c->sequence || !c->present || c->elements.size() != len)) {
          return invalid_model(node.describe() + ": its input " + std::to_string(i) + " ('" +
                               input_name(i) + "') is " + describe(*c) +
                               ", its input 0 a sequence of " + std::to_string(len) + " tensors");
        }
      }
      std::vector<Composite> outs(node.outputs.size(), Composite{true, true, {}});
      for (size_t t = 0; t < len; ++t) {
        std::vector<int> bound;
        for (size_t i = 0; i < node.inputs.size(); ++i) {
          const Composite* c = composite(i);
          bound.push_back(c ? c->elements[t] : node.inputs[i]);
        }
        KILN_ASSIGN_OR_RETURN(
            BodyCopy copy,
            copy_body(g, n, *body, bound, std::vector<int>(body->outputs.size(), -1),
                      prefix + "/" + std::to_string(t), s.shape_value_carriers, "body"));
        nodes.insert(nodes.end(), std::make_move_iterator(copy.nodes.begin()),
                     std::make_move_iterator(copy.nodes.end()));
        for (size_t k = 0; k < outs.size() && k < copy.outputs.size(); ++k)
          outs[k].elements.push_back(copy.outputs[k]);
      }
      for (size_t k = 0; k < outs.size(); ++k)
        made.push_back({node.outputs[k], std::move(outs[k])});
      break;
    }
    case ops::OpKind::kOptional: {
      if (node.inputs.empty() || node.inputs[0] < 0) {
        KILN_ASSIGN_OR_RETURN(std::string type,
                              node.attrs.get_string("type", std::string("tensor")));
        made.push_back({out, Composite{type.rfind("seq(", 0) == 0, false, {}}});
      } else if (const Composite* c = composite(0)) {
        if (!c->sequence || !c->present) {
          return invalid_model(node.describe() + ": its input ('" + input_name(0) + "') is " +
                               describe(*c) + "; an optional holds a tensor or a sequence");
        }
        made.push_back({out, *c});
      } else {
        made.push_back({out, Composite{false, true, {node.inputs[0]}}});
      }
      break;
    }
    case ops::OpKind::kOptionalHasElement: {
      const Composite* c = composite(0);
      const bool has = !node.inputs.empty() && node.inputs[0] >= 0 && (!c || c->present);
      set_scalar_constant(g, out, DType::kBool, has);
      break;
    }
    case ops::OpKind::kOptionalGetElement: {
      const Composite* c = composite(0);
      if (c && !c->present) {
        return invalid_model(
            node.describe() + ": its input ('" + input_name(0) +
            "') is an empty optional in the engine being built (an input the build config says is "
            "absent, or an Optional without a value)");
      }
      if (c && c->sequence) {
        made.push_back({out, *c});
      } else if (out >= 0) {
        e.node("Identity", {c ? c->elements[0] : node.inputs[0]}, out);
      }
      break;
    }
    default:
      return internal_error(node.describe() + ": not a sequence op");
  }
  splice(g, n, std::move(nodes));
  for (auto& [v, c] : made) set_composite(s, v, std::move(c));
  return true;
}

StatusOr<bool> expand_sequence_outputs(BuildState& s) {
  ir::Graph& g = s.graph;
  std::vector<int> outputs;
  std::vector<ir::Node> nodes;
  Emitter e(g, "output", &nodes);
  for (int v : g.outputs) {
    auto it = s.composites.find(v);
    const std::string name = g.values[size_t(v)].name;
    if (it == s.composites.end()) {
      const ir::ValueKind k = g.values[size_t(v)].kind;
      if (k == ir::ValueKind::kSequence || k == ir::ValueKind::kOptionalSequence) {
        return invalid_model("graph output '" + name +
                             "' is declared a sequence, and the model computes a tensor");
      }
      g.values[size_t(v)].kind = ir::ValueKind::kTensor;  // an optional tensor that holds one
      outputs.push_back(v);
      continue;
    }
    const Composite c = it->second;
    s.composites.erase(it);
    if (!c.present) continue;  // an empty optional: no tensor
    if (!c.sequence) {
      g.values[size_t(v)].kind = ir::ValueKind::kTensor;
      e.node("Identity", {c.elements[0]}, v);
      outputs.push_back(v);
      continue;
    }
    for (size_t i = 0; i < c.elements.size(); ++i) {
      const std::string element = sequence_element_name(name, int64_t(i));
      if (g.find_value(element) >= 0) {
        return invalid_model("graph output '" + name + "' is a sequence whose element " +
                             std::to_string(i) + " would be the output '" + element +
                             "', a name the model already uses");
      }
      const int o = g.add_value(element);
      e.node("Identity", {c.elements[i]}, o);
      outputs.push_back(o);
    }
  }
  g.outputs = std::move(outputs);
  if (nodes.empty()) return false;
  const size_t first = g.nodes.size();
  g.nodes.insert(g.nodes.end(), std::make_move_iterator(nodes.begin()),
                 std::make_move_iterator(nodes.end()));
  for (size_t m = first; m < g.nodes.size(); ++m) {
    for (int o : g.nodes[m].outputs) g.values[size_t(o)].producer = int(m);
  }
  return true;
}

}  // namespace kiln::builder
