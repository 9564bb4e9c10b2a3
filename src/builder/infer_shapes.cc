// Pass infer_shapes: runs each op's type and symbolic shape inference in topological order,
// records the constraints the profile checker must prove, turns fully known symbolic values into
// constants, and folds nodes whose inputs are all constant and whose outputs are small enough to
// hold at build time (see fold_constants.cc).
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include "builder/build_state.h"
#include "core/checked.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

std::string input_summary(const ir::Graph& g, const ir::Node& n) {
  std::string s;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (i) s += ", ";
    s += n.inputs[i] < 0 ? "_" : ir::type_to_string(g.values[n.inputs[i]]);
  }
  return s;
}

// A symbolic value whose elements are all constants becomes a constant tensor.
StatusOr<std::optional<Tensor>> constant_from_value(const ir::Value& v) {
  if (!v.sym_value || !v.shape) return std::optional<Tensor>();
  Shape shape;
  for (const auto& d : *v.shape) {
    if (!d.is_const()) return std::optional<Tensor>();
    shape.push_back(d.value());
  }
  for (const auto& e : *v.sym_value) {
    if (!e.is_const()) return std::optional<Tensor>();
  }
  if (shape_numel(shape) != int64_t(v.sym_value->size())) {
    return internal_error("symbolic value of '" + v.name + "' has " + std::to_string(v.sym_value->size()) +
                          " elements for shape " + shape_to_string(shape));
  }
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(v.dtype, shape));
  for (size_t i = 0; i < v.sym_value->size(); ++i) {
    int64_t x = (*v.sym_value)[i].value();
    switch (v.dtype) {
      case DType::kInt64: t.data_as<int64_t>()[i] = x; break;
      case DType::kInt32: t.data_as<int32_t>()[i] = int32_t(x); break;
      case DType::kInt16: t.data_as<int16_t>()[i] = int16_t(x); break;
      case DType::kInt8: t.data_as<int8_t>()[i] = int8_t(x); break;
      case DType::kUInt8: t.data_as<uint8_t>()[i] = uint8_t(x); break;
      case DType::kBool: t.data_as<uint8_t>()[i] = x != 0; break;
      case DType::kUInt16: t.data_as<uint16_t>()[i] = uint16_t(x); break;
      case DType::kUInt32: t.data_as<uint32_t>()[i] = uint32_t(x); break;
      case DType::kUInt64: t.data_as<uint64_t>()[i] = uint64_t(x); break;
      default: return std::optional<Tensor>();  // symbolic values are integer tensors only
    }
  }
  return std::optional<Tensor>(std::move(t));
}

// Folding materializes a node's outputs in build memory; larger ones stay nodes that run at run
// time (a ConstantOfShape of a [2^40, 1] input's shape would ask for 4 TiB). 4 GiB holds a 2 GiB
// protobuf weight widened from fp16 to fp32, the largest a folded weight grows in practice.
constexpr int64_t kMaxFoldedBytes = int64_t(4) << 30;

// The byte size of a value whose dims are all constants; nullopt for symbolic shapes. Inference
// multiplies dims unchecked, so an overflow is caught here, once per value.
StatusOr<std::optional<int64_t>> static_bytes(const ir::Node& node, const ir::Value& v) {
  std::optional<int64_t> bytes = int64_t(dtype_size(v.dtype));
  for (const auto& d : *v.shape) {
    if (!d.is_const()) return std::optional<int64_t>();
    if (d.value() < 0) {
      return invalid_model(node.describe() + ": output '" + v.name + "' has negative dim " +
                           std::to_string(d.value()));
    }
    if (bytes) bytes = checked_mul(*bytes, d.value());
  }
  if (!bytes) {
    return invalid_model(node.describe() + ": output '" + v.name + "' has shape " +
                         ir::dims_to_string(*v.shape) + ", whose size in bytes overflows int64");
  }
  return bytes;
}

// Opset 6 and older (the oldest kiln reads is 6): a binary op's `broadcast=1, axis=k` aligns input
// 1's dims with input 0's from dim k, and PRelu's [C] slope is per channel (dim 1), where numpy
// broadcasting (opset 7 on, and kiln's kernels) aligns trailing dims. A constant input 1 is given
// the trailing ones that make the two agree; a computed one is refused. BatchNormalization and
// Dropout run in training mode unless is_test=1, which kiln refuses. Runs before node n's
// inference, when its inputs' shapes are known.
Status upgrade_opset6(ir::Graph& g, size_t n) {
  ir::Node& node = g.nodes[n];
  if (node.opset <= 0 || node.opset >= 7 || !node.domain.empty()) return ok_status();
  const ops::OpKind kind = ops::find_op(node.domain, node.op_type);
  auto flag = [&](const char* name, int64_t dflt) {
    auto v = node.attrs.get_int(name, dflt);
    return v.ok() ? *v : dflt;
  };
  if ((kind == ops::OpKind::kBatchNormalization || kind == ops::OpKind::kDropout) && flag("is_test", 0) != 1) {
    return unsupported(node.describe() + ": opset " + std::to_string(node.opset) + " " + node.op_type +
                       " without is_test=1 runs in training mode; kiln runs inference (export the model in eval "
                       "mode)");
  }
  if (kind == ops::OpKind::kBatchNormalization && flag("spatial", 1) != 1) {
    return unsupported(node.describe() + ": spatial=0 (statistics per element, not per channel) is not supported");
  }
  if (node.inputs.size() != 2 || node.inputs[0] < 0 || node.inputs[1] < 0) return ok_status();
  const auto& a = *g.values[size_t(node.inputs[0])].shape;
  const auto& b = *g.values[size_t(node.inputs[1])].shape;
  int64_t trailing = 0;  // ones input 1 needs after its dims
  std::string why;
  if (kind == ops::OpKind::kPRelu) {
    if (b.size() == 1 && a.size() >= 3 && !(b[0].is_const() && b[0].value() == 1)) {
      trailing = int64_t(a.size()) - 2;
      why = "a per-channel slope";
    }
  } else if (ops::is_elementwise(kind) && flag("broadcast", 0) == 1 && node.attrs.has("axis")) {
    int64_t axis = flag("axis", 0);
    if (axis < 0) axis += int64_t(a.size());
    trailing = int64_t(a.size()) - axis - int64_t(b.size());
    if (axis < 0 || trailing < 0) {
      return invalid_model(node.describe() + ": broadcast axis " + std::to_string(flag("axis", 0)) + " puts input 1 " +
                           ir::dims_to_string(b) + " outside input 0 " + ir::dims_to_string(a));
    }
    why = "broadcast from axis " + std::to_string(axis);
  }
  if (trailing == 0) return ok_status();
  const ir::Value& in = g.values[size_t(node.inputs[1])];
  if (!in.constant) {
    return unsupported(node.describe() + ": opset " + std::to_string(node.opset) + " " + why + " aligns input 1 " +
                       ir::dims_to_string(b) + " with input 0 " + ir::dims_to_string(a) +
                       " by its leading dims, which kiln follows only for a constant; re-export at opset 7 or later");
  }
  Shape shape = in.constant->shape();
  shape.insert(shape.end(), size_t(trailing), 1);
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(in.dtype, shape));
  if (t.nbytes()) std::memcpy(t.data(), in.constant->data(), t.nbytes());
  std::vector<ir::Dim> dims(shape.begin(), shape.end());
  const int v = ir::add_unique_value(&g, in.name + "_opset7", in.dtype, dims);
  g.values[size_t(v)].constant = std::move(t);
  g.nodes[n].inputs[1] = v;
  return ok_status();
}

// A copy of subgraph `sub` whose reads of enclosing values (values it neither takes as inputs, nor
// computes, nor holds as constants) are renamed by `renamed`, through its own subgraphs too.
std::shared_ptr<ir::Graph> rename_captures(const ir::Graph& sub, const std::map<std::string, std::string>& renamed) {
  auto out = std::make_shared<ir::Graph>(sub);
  std::vector<char> local(sub.values.size(), 0);
  for (int v : sub.inputs) local[size_t(v)] = 1;
  for (const ir::Node& n : sub.nodes) {
    for (int v : n.outputs) {
      if (v >= 0) local[size_t(v)] = 1;
    }
  }
  std::map<std::string, std::string> inner = renamed;
  for (size_t v = 0; v < sub.values.size(); ++v) {
    if (local[v] || sub.values[v].constant) {
      inner.erase(sub.values[v].name);  // shadowed below this graph
      continue;
    }
    auto it = renamed.find(sub.values[v].name);
    if (it != renamed.end()) out->values[v].name = it->second;
  }
  for (ir::Node& n : out->nodes) {
    for (const auto& [attr_name, a] : n.attrs.all()) {
      if (a.type != ir::AttrType::kGraph && a.type != ir::AttrType::kGraphs) continue;
      ir::Attribute copy = a;
      if (a.g) copy.g = rename_captures(*a.g, inner);
      for (auto& sg : copy.graphs) sg = rename_captures(*sg, inner);
      n.attrs.set(attr_name, std::move(copy));
    }
  }
  return out;
}

// An If whose condition is known at build time (a constant, or a function of shapes: exporters
// branch on a tensor's rank or size) runs as the branch it takes: the branch's nodes replace it at
// position n, its values renamed apart, its outputs written to the If's outputs (by an Identity
// where the branch passes an outer value or a constant straight through). true when it inlined.
StatusOr<bool> inline_known_if(ir::Graph& g, size_t n, const std::map<std::string, int>& carriers) {
  const ir::Node& node = g.nodes[n];
  if (ops::find_op(node.domain, node.op_type) != ops::OpKind::kIf || node.inputs.empty() || node.inputs[0] < 0) {
    return false;
  }
  const ir::Value& c = g.values[size_t(node.inputs[0])];
  std::optional<bool> cond;
  if (c.constant && c.constant->numel() == 1) {
    cond = c.constant->int_at(0) != 0;
  } else if (c.sym_value && c.sym_value->size() == 1 && (*c.sym_value)[0].is_const()) {
    cond = (*c.sym_value)[0].value() != 0;
  }
  if (!cond) return false;
  const char* which = *cond ? "then_branch" : "else_branch";
  const ir::Attribute* attr = node.attrs.find(which);
  if (!attr || attr->type != ir::AttrType::kGraph || !attr->g) {
    return invalid_model(node.describe() + ": it has no graph attribute " + which);
  }
  const ir::Graph& b = *attr->g;
  if (b.outputs.size() != node.outputs.size()) {
    return invalid_model(node.describe() + ": its " + which + " has " + std::to_string(b.outputs.size()) +
                         " outputs, the If has " + std::to_string(node.outputs.size()));
  }
  const std::string prefix = node.name.empty() ? std::string("if") : node.name;
  std::vector<char> produced(b.values.size(), 0);
  for (const ir::Node& bn : b.nodes) {
    for (int v : bn.outputs) {
      if (v >= 0) produced[size_t(v)] = 1;
    }
  }
  std::vector<int> map(b.values.size(), -1);
  std::vector<ir::Node> inlined;
  // The branch's outputs are the If's: a value the branch computes takes the If output's place; a
  // value passed through (or computed twice as outputs) is copied by an Identity.
  std::vector<std::pair<int, int>> copies;  // (branch value, If output)
  for (size_t k = 0; k < b.outputs.size(); ++k) {
    const int bv = b.outputs[k];
    int out = node.outputs[k];
    if (out < 0) out = ir::add_unique_value(&g, prefix + "/" + b.values[size_t(bv)].name, DType::kUndefined, std::nullopt);
    if (produced[size_t(bv)] && map[size_t(bv)] < 0) {
      map[size_t(bv)] = out;
    } else {
      copies.push_back({bv, out});
    }
  }
  for (size_t v = 0; v < b.values.size(); ++v) {
    const ir::Value& bval = b.values[v];
    if (map[v] >= 0) continue;
    if (produced[v]) {
      map[v] = ir::add_unique_value(&g, prefix + "/" + bval.name, DType::kUndefined, std::nullopt);
    } else if (bval.constant) {
      map[v] = ir::add_unique_value(&g, prefix + "/" + bval.name, bval.dtype, bval.shape);
      g.values[size_t(map[v])].constant = bval.constant;
    } else {
      // A value of the enclosing graph, read by name: it must be computed before the If. A
      // shape-value input is read through the value that carries its elements.
      auto carried = carriers.find(bval.name);
      const int outer = carried != carriers.end() ? carried->second : g.find_value(bval.name);
      if (outer < 0 || g.values[size_t(outer)].producer >= int(n)) {
        return unsupported(g.nodes[n].describe() + ": its " + which + " reads '" + bval.name + "', which " +
                           (outer < 0 ? "no enclosing graph defines" : "is computed after the If"));
      }
      map[v] = outer;
    }
  }
  // A nested subgraph (an If in the branch) reads the branch's values by name: those names follow
  // the renaming, in a copy of the subgraph.
  std::map<std::string, std::string> renamed;
  for (size_t v = 0; v < b.values.size(); ++v) {
    if (map[v] >= 0 && g.values[size_t(map[v])].name != b.values[v].name) renamed[b.values[v].name] = g.values[size_t(map[v])].name;
  }
  for (const ir::Node& bn : b.nodes) {
    ir::Node copy = bn;
    for (const auto& [attr_name, a] : bn.attrs.all()) {
      if (a.type != ir::AttrType::kGraph && a.type != ir::AttrType::kGraphs) continue;
      ir::Attribute renamed_attr = a;
      if (a.g) renamed_attr.g = rename_captures(*a.g, renamed);
      for (auto& sg : renamed_attr.graphs) sg = rename_captures(*sg, renamed);
      copy.attrs.set(attr_name, std::move(renamed_attr));
    }
    copy.name = ir::unique_node_name(g, prefix + "/" + (bn.name.empty() ? bn.op_type : bn.name));
    for (int& v : copy.inputs) v = v < 0 ? v : map[size_t(v)];
    for (int& v : copy.outputs) v = v < 0 ? v : map[size_t(v)];
    inlined.push_back(std::move(copy));
  }
  for (const auto& [bv, out] : copies) {
    ir::Node id;
    id.name = ir::unique_node_name(g, prefix + "/output");
    id.op_type = "Identity";
    id.opset = g.nodes[n].opset;
    id.inputs = {map[size_t(bv)]};
    id.outputs = {out};
    inlined.push_back(std::move(id));
  }
  g.nodes.erase(g.nodes.begin() + std::ptrdiff_t(n));
  g.nodes.insert(g.nodes.begin() + std::ptrdiff_t(n), inlined.begin(), inlined.end());
  for (size_t m = n; m < g.nodes.size(); ++m) {
    for (int v : g.nodes[m].outputs) {
      if (v >= 0) g.values[size_t(v)].producer = int(m);
    }
  }
  return true;
}

}  // namespace

// The hull of every profile's symbol ranges: a simplification true over it is true in each profile.
ir::SymbolRanges profile_hull(const std::vector<plan::Profile>& profiles) {
  ir::SymbolRanges hull;
  for (const auto& p : profiles) {
    for (const auto& [name, r] : p.symbols) {
      auto [it, inserted] = hull.emplace(name, r);
      if (!inserted) it->second = {std::min(it->second.lo, r.lo), std::max(it->second.hi, r.hi)};
    }
  }
  return hull;
}

Status infer_shapes(BuildState& s) {
  ir::Graph& g = s.graph;
  ir::SymbolRanges hull = profile_hull(s.profiles);
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const ir::Node& node = g.nodes[n];
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      int v = node.inputs[i];
      if (v >= 0 && (!g.values[v].shape || g.values[v].dtype == DType::kUndefined)) {
        return internal_error(node.describe() + ": input " + std::to_string(i) + " '" + g.values[v].name +
                              "' has no inferred type");
      }
    }
    KILN_ASSIGN_OR_RETURN(bool inlined, inline_known_if(g, n, s.shape_value_carriers));
    if (inlined) {
      --n;  // the branch's first node is at n now (wraps to the loop's ++ for n = 0)
      continue;
    }
    KILN_RETURN_IF_ERROR(upgrade_opset6(g, n));
    const ops::OpSchema* schema = ops::find_schema(node);
    ops::InferContext ctx(g, node, int(n), &s.constraints);
    const size_t known_dims = s.data_dependent.size();
    ctx.set_data_dependent(&s.data_dependent, true);
    Status st = schema->infer(ctx);
    if (!st.ok()) {
      std::string msg = st.message();
      if (msg.rfind("node '", 0) != 0) msg = node.describe() + ": " + msg;
      return Status(st.code(), msg + " (inputs: " + input_summary(g, node) + ")");
    }
    // New data-dependent dims range over [0, bound] in every profile, and tactics are ranked
    // at their bound.
    for (size_t k = known_dims; k < s.data_dependent.size(); ++k) {
      ir::DataDependentDim& dd = s.data_dependent[k];
      dd.bound = dd.bound.simplify(hull);
      ir::Interval all{0, 0};
      for (plan::Profile& p : s.profiles) {
        const ir::Interval b = dd.bound.bounds(p.symbols);
        if (b.hi >= ir::Interval::kInf) {
          return invalid_model(node.describe() + ": the size of its output, " + dd.symbol + ", is bounded by " +
                               dd.bound.to_string() + ", which has no finite bound over the profile");
        }
        p.symbols[dd.symbol] = ir::Interval{0, std::max<int64_t>(b.hi, 0)};
        all.hi = std::max(all.hi, b.hi);
      }
      hull[dd.symbol] = all;
      for (ir::SymbolValues* at : {&s.opt_symbols, &s.min_symbols}) {
        if (auto x = dd.bound.eval(*at)) (*at)[dd.symbol] = std::max<int64_t>(*x, 0);
      }
    }
    bool all_inputs_constant = true;
    for (int v : node.inputs) {
      if (v >= 0 && !g.values[v].constant) all_inputs_constant = false;
    }
    bool all_outputs_constant = true, outputs_foldable = true;
    for (size_t o = 0; o < node.outputs.size(); ++o) {
      int v = node.outputs[o];
      if (v < 0) continue;
      const auto& out = ctx.outputs()[o];
      if (!out.set) return internal_error(node.describe() + ": inference left output " + std::to_string(o) + " unset");
      ir::Value& val = g.values[v];
      val.dtype = out.dtype;
      val.shape = out.shape;
      for (auto& d : *val.shape) d = d.simplify(hull);
      val.sym_value = out.value;
      if (val.sym_value) {
        for (auto& d : *val.sym_value) d = d.simplify(hull);
      }
      KILN_ASSIGN_OR_RETURN(std::optional<int64_t> bytes, static_bytes(node, val));
      if (!bytes || *bytes > kMaxFoldedBytes) outputs_foldable = false;
      KILN_ASSIGN_OR_RETURN(auto c, constant_from_value(val));
      if (c) {
        val.constant = std::move(*c);
      } else {
        all_outputs_constant = false;
      }
    }
    if (all_inputs_constant && !all_outputs_constant && outputs_foldable) {
      Status fold = fold_node(g, int(n));
      if (!fold.ok()) return fold.with_context("pass fold_constants");
    }
  }
  for (int v : g.outputs) {
    if (!g.values[v].shape) return internal_error("graph output '" + g.values[v].name + "' has no shape");
  }
  if (const auto& log = s.config.shape_log()) {
    log("shapes after inference (constants folded away are not listed):");
    auto list = [&](const std::vector<int>& values) {
      std::string out;
      for (int v : values) {
        out += out.empty() ? "" : ", ";
        out += v < 0 ? "_" : g.values[size_t(v)].name + " " + ir::dims_to_string(*g.values[size_t(v)].shape);
      }
      return out;
    };
    for (const ir::Node& node : g.nodes) {
      bool folded = !node.outputs.empty();
      for (int v : node.outputs) folded = folded && (v < 0 || g.values[size_t(v)].constant);
      if (!folded) log("  " + node.describe() + ": " + list(node.inputs) + " -> " + list(node.outputs));
    }
  }
  return ok_status();
}

}  // namespace kiln::builder
