// Pass infer_shapes: runs each op's type and symbolic shape inference in topological order,
// records the constraints the profile checker must prove, turns fully known symbolic values into
// constants, and folds nodes whose inputs are all constant and whose outputs are small enough to
// hold at build time (see fold_constants.cc).
//
// The lowering steps run in the same walk, at each node n before its inference, in this order
// (named here; `--dumpIR` and the pipeline table know the walk as infer_shapes):
//   lower_control_flow  (control_flow.cc) an If whose condition is now known becomes its branch;
//                       a Loop or Scan the build can lay out is unrolled, or else becomes a
//                       run-time loop (kiln::LoopBegin .. kiln::LoopEnd)
//   lower_sequences     (sequences.cc) a sequence op whose elements are now known becomes ops on
//                       the tensors themselves
//   regrow_loop         a run-time loop is laid out again once its body shows a carried dim
//                       that grows, and the walk goes back to its start
//   upgrade_opset6      opset 6's broadcast=1/axis and PRelu's per-channel slope become numpy
//                       broadcasting (a constant given trailing ones); training-mode
//                       BatchNormalization and Dropout are refused
//   infer               the op's schema: types, symbolic shapes, symbolic values, constraints
//   fold_constants      a node of constant inputs becomes constants (at most 4 GiB)
//   lower_sequence_outputs (at the end) graph outputs that are sequences or optionals become
//                       tensors through nodes appended to the graph, which the walk then reaches
// They are one walk, not passes of their own, because each needs what inference has learned about
// every node before n and gives inference what it needs for the nodes after: an If's condition is
// known only once the nodes computing it are inferred and folded, and the nodes after an If, a
// Loop or a sequence op are inferred from what its expansion produces. As separate passes they
// would run to a fixed point over the whole graph, once per level of control flow.
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
    return internal_error("symbolic value of '" + v.name + "' has " +
                          std::to_string(v.sym_value->size()) + " elements for shape " +
                          shape_to_string(shape));
  }
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(v.dtype, shape));
  for (size_t i = 0; i < v.sym_value->size(); ++i) {
    const int64_t x = (*v.sym_value)[i].value();
    // Integer tensors, and float32/float64 ones whose elements are exact integers
    // (ops/elementwise.cc).
    if (v.dtype == DType::kFloat32) {
      t.data_as<float>()[i] = float(x);
    } else if (v.dtype == DType::kFloat64) {
      t.data_as<double>()[i] = double(x);
    } else if (!t.set_int_at(int64_t(i), x)) {
      return std::optional<Tensor>();
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
  if ((kind == ops::OpKind::kBatchNormalization || kind == ops::OpKind::kDropout) &&
      flag("is_test", 0) != 1) {
    return unsupported(
        node.describe() + ": opset " + std::to_string(node.opset) + " " + node.op_type +
        " without is_test=1 runs in training mode; kiln runs inference (export the model in eval "
        "mode)");
  }
  if (kind == ops::OpKind::kBatchNormalization && flag("spatial", 1) != 1) {
    return unsupported(node.describe() +
                       ": spatial=0 (statistics per element, not per channel) is not supported");
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
      return invalid_model(node.describe() + ": broadcast axis " + std::to_string(flag("axis", 0)) +
                           " puts input 1 " + ir::dims_to_string(b) + " outside input 0 " +
                           ir::dims_to_string(a));
    }
    why = "broadcast from axis " + std::to_string(axis);
  }
  if (trailing == 0) return ok_status();
  const ir::Value& in = g.values[size_t(node.inputs[1])];
  if (!in.constant) {
    return unsupported(node.describe() + ": opset " + std::to_string(node.opset) + " " + why +
                       " aligns input 1 " + ir::dims_to_string(b) + " with input 0 " +
                       ir::dims_to_string(a) +
                       " by its leading dims, which kiln follows only for a constant; re-export at "
                       "opset 7 or later");
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

}  // namespace

Status infer_shapes(BuildState& s) {
  ir::Graph& g = s.graph;
  ir::SymbolRanges hull = plan::symbol_hull(s.profiles);
  for (size_t n = 0;; ++n) {
    if (n == g.nodes.size()) {
      // Graph outputs that are sequences or optionals become tensors through nodes appended here.
      KILN_ASSIGN_OR_RETURN(bool appended, expand_sequence_outputs(s));
      if (!appended) break;
    }
    const ir::Node& node = g.nodes[n];
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      int v = node.inputs[i];
      if (v >= 0 && !s.composites.count(v) &&
          (!g.values[v].shape || g.values[v].dtype == DType::kUndefined)) {
        return internal_error(node.describe() + ": input " + std::to_string(i) + " '" +
                              g.values[v].name + "' has no inferred type");
      }
    }
    KILN_ASSIGN_OR_RETURN(bool inlined,
                          expand_control_flow(g, n, s.shape_value_carriers, &s.run_time_loops));
    if (!inlined) {
      KILN_ASSIGN_OR_RETURN(inlined, expand_sequence_op(s, n));
    }
    if (inlined) {
      --n;  // the expansion's first node is at n now (wraps to the loop's ++ for n = 0)
      continue;
    }
    if (ops::find_op(node.domain, node.op_type) == ops::OpKind::kLoopEnd) {
      KILN_ASSIGN_OR_RETURN(std::optional<size_t> again, regrow_loop(s, n));
      if (again) {
        n = *again - 1;  // wraps to the loop's ++ for 0
        continue;
      }
    }
    KILN_RETURN_IF_ERROR(upgrade_opset6(g, n));
    // check_supported saw the main graph; a node a subgraph brought in (a loop's body, a branch)
    // is checked here, before its inference reads its inputs.
    const ops::OpSchema* schema = ops::find_schema(node);
    if (!schema) {
      return unsupported(node.describe() + " in domain '" +
                         (node.domain.empty() ? "ai.onnx" : node.domain) + "' opset " +
                         std::to_string(node.opset) +
                         " (from a subgraph) uses an op kiln does not support");
    }
    if (const std::vector<std::string> wrong = arity_problems(node, *schema); !wrong.empty()) {
      return invalid_model(wrong.front() + " (a node of a subgraph)");
    }
    ops::InferContext ctx(g, node, int(n), &s.constraints);
    const size_t known_dims = s.data_dependent.size();
    ctx.set_data_dependent(&s.data_dependent, true);
    ctx.set_symbol_ranges(&hull);
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
      dd.lower = dd.lower.simplify(hull);
      ir::Interval all{ir::Interval::kInf, 0};
      for (plan::Profile& p : s.profiles) {
        const ir::Interval b = dd.bound.bounds(p.symbols);
        if (b.hi >= ir::Interval::kInf) {
          return invalid_model(node.describe() + ": the size of its output, " + dd.symbol +
                               ", is bounded by " + dd.bound.to_string() +
                               ", which has no finite bound over the profile");
        }
        p.symbols[dd.symbol] = ir::data_dependent_range(dd, p.symbols);
        all.lo = std::min(all.lo, p.symbols[dd.symbol].lo);
        all.hi = std::max(all.hi, b.hi);
      }
      if (all.lo > all.hi) all.lo = 0;
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
      if (!out.set)
        return internal_error(node.describe() + ": inference left output " + std::to_string(o) +
                              " unset");
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
    // A run-time loop's LoopBegin and LoopEnd stay nodes: the run repeats what lies between.
    const ops::OpKind kind = ops::find_op(node.domain, node.op_type);
    const bool control = kind == ops::OpKind::kLoopBegin || kind == ops::OpKind::kLoopEnd;
    if (all_inputs_constant && !all_outputs_constant && outputs_foldable && !control) {
      Status fold = fold_node(g, int(n));
      // A node of an If's branch may fail on constants the branch never sees at run time (the
      // other branch's case): it stays a node, which runs only when its branch is taken.
      if (!fold.ok() && g.nodes[n].guards.empty()) return fold.with_context("pass fold_constants");
    }
  }
  for (int v : g.outputs) {
    if (!g.values[v].shape)
      return internal_error("graph output '" + g.values[v].name + "' has no shape");
  }
  if (const auto& log = s.config.shape_log()) {
    log("shapes after inference (constants folded away are not listed):");
    auto list = [&](const std::vector<int>& values) {
      std::string out;
      for (int v : values) {
        out += out.empty() ? "" : ", ";
        out +=
            v < 0 ? "_"
                  : g.values[size_t(v)].name + " " + ir::dims_to_string(*g.values[size_t(v)].shape);
      }
      return out;
    };
    for (const ir::Node& node : g.nodes) {
      bool folded = !node.outputs.empty();
      for (int v : node.outputs) folded = folded && (v < 0 || g.values[size_t(v)].constant);
      if (!folded)
        log("  " + node.describe() + ": " + list(node.inputs) + " -> " + list(node.outputs));
    }
  }
  return ok_status();
}

}  // namespace kiln::builder
