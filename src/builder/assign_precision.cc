// Pass assign_precision: with --fp16 (or --bf16) on a device backend, activations stay in the
// reduced type between layers. Walking the graph in order, a node runs in the reduced type when its
// precision class allows it (ops/precision_classes.cc: compute-bound ops always; ops that follow
// their inputs when a float input already arrives reduced; the normalizations and softmax, whose
// kernels accumulate in FP32, likewise) and an implementation of the backend supports it so typed;
// its FP32 inputs are cast (constants converted at build time) and its FP32 outputs become reduced.
// Any other node gets its inputs back in their original types. Engine inputs and outputs keep
// their types: casts sit only at the IO and at precision boundaries, and each is a node of its own
// that `kiln inspect` lists.
#include <map>
#include <set>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

using ops::OpKind;

// FP32-class ops whose kernels take reduced-precision data and accumulate in FP32 inside: they
// follow a reduced input like the kFollow ops. The rest of the class (Pow, Exp, Log, sums, losses)
// stays FP32, as under PyTorch's autocast.
bool accumulates_in_float(OpKind k) {
  switch (k) {
    case OpKind::kSoftmax:
    case OpKind::kLogSoftmax:
    case OpKind::kBiasSoftmax:
    case OpKind::kLayerNormalization:
    case OpKind::kRMSNormalization:
    case OpKind::kGroupNormalization:
    case OpKind::kInstanceNormalization:
    case OpKind::kReduceMean:
      return true;
    default:
      return false;
  }
}

bool has_subgraph(const ir::Node& n) {
  for (const auto& [name, a] : n.attrs.all()) {
    if (a.g || !a.graphs.empty()) return true;
  }
  return false;
}

const char* suffix(DType t) {
  switch (t) {
    case DType::kFloat16:
      return "_fp16";
    case DType::kBFloat16:
      return "_bf16";
    default:
      return "_fp32";
  }
}

StatusOr<Tensor> convert(const Tensor& t, DType to) {
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::zeros(to, t.shape()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    float x = float(t.float_at(i));
    if (to == DType::kFloat16) {
      out.data_as<uint16_t>()[i] = float_to_half(x);
    } else if (to == DType::kBFloat16) {
      out.data_as<uint16_t>()[i] = float_to_bf16(x);
    } else {
      out.data_as<float>()[i] = x;
    }
  }
  return out;
}

class Assigner {
 public:
  Assigner(ir::Graph* g, DType reduced, const SupportsFn& supports)
      : g_(*g), reduced_(reduced), supports_(supports) {
    for (const ir::Value& v : g_.values) original_.push_back(v.dtype);
  }

  Status run() {
    std::vector<ir::Node> nodes = std::move(g_.nodes);
    g_.nodes.clear();
    for (ir::Node& node : nodes) {
      KILN_ASSIGN_OR_RETURN(bool reduced, try_reduced(node));
      if (!reduced) {
        for (int& v : node.inputs) {
          if (v >= 0) {
            KILN_ASSIGN_OR_RETURN(v, value_as(v, original_[size_t(v)]));
          }
        }
      }
      g_.nodes.push_back(std::move(node));
    }
    // Engine outputs keep their types: a reduced one is renamed and cast back under its own name.
    for (int& out : g_.outputs) {
      if (g_.values[size_t(out)].dtype == original_[size_t(out)]) continue;
      int inner = ir::add_unique_value(&g_, g_.values[size_t(out)].name + suffix(reduced_),
                                       reduced_, g_.values[size_t(out)].shape);
      for (ir::Node& n : g_.nodes) {
        for (int& v : n.inputs) v = v == out ? inner : v;
        for (int& v : n.outputs) v = v == out ? inner : v;
      }
      g_.values[size_t(out)].dtype = original_[size_t(out)];
      g_.nodes.push_back(cast_node(inner, out));
    }
    for (ir::Value& v : g_.values) v.producer = -1;
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      for (int v : g_.nodes[n].outputs) {
        if (v >= 0) g_.values[size_t(v)].producer = int(n);
      }
    }
    return ir::verify(g_);
  }

 private:
  bool is_float32_value(int v) const { return v >= 0 && original_[size_t(v)] == DType::kFloat32; }
  bool arrives_reduced(int v) const { return v >= 0 && g_.values[size_t(v)].dtype == reduced_; }

  // Whether `node` runs in the reduced type; when it does, its inputs are rewired and outputs
  // retyped.
  StatusOr<bool> try_reduced(ir::Node& node) {
    if (has_subgraph(node)) return false;
    // A node folded at build time (infer_shapes gave every output its data; eliminate_dead_nodes
    // drops it later) runs nothing: its outputs keep the type their data has. Swin-V2's position
    // bias MLP is one, a MatMul on constants, and retyping its output left FP32 data under an
    // FP16 value.
    bool folded = !node.outputs.empty();
    for (int v : node.outputs) folded = folded && (v < 0 || g_.values[size_t(v)].constant);
    if (folded) return false;
    OpKind kind = ops::find_op(node.domain, node.op_type);
    bool any_float = false, any_reduced = false, float_activation = false;
    for (int v : node.inputs) {
      any_float |= is_float32_value(v);
      any_reduced |= arrives_reduced(v);
      float_activation |= is_float32_value(v) && !g_.values[size_t(v)].constant;
    }
    for (int v : node.outputs) any_float |= is_float32_value(v);
    if (!any_float) return false;
    switch (ops::precision_class(kind)) {
      case ops::PrecisionClass::kReduced:
        break;
      case ops::PrecisionClass::kFollow:
        // A node whose float data are all constants (an embedding table read by a Gather of
        // token ids, rotary caches sliced by a position, a mask's fill values) follows them into
        // the reduced type too: they convert at build time, no cast runs, and what it makes
        // arrives reduced. A Llama-style decoder's embedding Gather, RMSNorm and casts ran in
        // FP32 before (0.17 ms a run at batch 32 on an H200).
        if (!any_reduced && float_activation) return false;
        break;
      case ops::PrecisionClass::kFloat32:
        if (!any_reduced || !accumulates_in_float(kind)) return false;
        break;
      default:
        return false;
    }
    // The node as it would be: FP32 inputs and outputs in the reduced type.
    ir::Node trial = node;
    std::vector<ir::Value> in, out;
    std::vector<const ir::Value*> in_ptr, out_ptr;
    in.reserve(node.inputs.size());
    out.reserve(node.outputs.size());
    for (int v : node.inputs) {
      if (v < 0) {
        in_ptr.push_back(nullptr);
        continue;
      }
      in.push_back(g_.values[size_t(v)]);
      if (is_float32_value(v)) {
        in.back().dtype = reduced_;
        if (in.back().constant) {
          KILN_ASSIGN_OR_RETURN(in.back().constant, converted(v));
        }
      }
      in_ptr.push_back(&in.back());
    }
    for (int v : node.outputs) {
      if (v < 0) {
        out_ptr.push_back(nullptr);
        continue;
      }
      out.push_back(g_.values[size_t(v)]);
      if (is_float32_value(v)) out.back().dtype = reduced_;
      out_ptr.push_back(&out.back());
    }
    if (!supports_(trial, in_ptr, out_ptr)) return false;
    for (int& v : node.inputs) {
      if (is_float32_value(v)) {
        KILN_ASSIGN_OR_RETURN(v, value_as(v, reduced_));
      }
    }
    for (int v : node.outputs) {
      if (is_float32_value(v)) g_.values[size_t(v)].dtype = reduced_;
    }
    return true;
  }

  StatusOr<Tensor> converted(int v) {
    auto it = converted_.find(v);
    if (it != converted_.end()) return it->second;
    KILN_ASSIGN_OR_RETURN(Tensor t, convert(*g_.values[size_t(v)].constant, reduced_));
    converted_.emplace(v, t);
    return t;
  }

  ir::Node cast_node(int from, int to) {
    ir::Node n;
    n.op_type = "Cast";
    n.opset = g_.opsets.count("") ? g_.opsets.at("") : 19;
    n.name = ir::unique_node_name(g_, g_.values[size_t(to)].name + "_cast");
    set_int(&n, "to", onnx_type(g_.values[size_t(to)].dtype));
    n.inputs = {from};
    n.outputs = {to};
    return n;
  }

  static int64_t onnx_type(DType t) {
    switch (t) {
      case DType::kFloat16:
        return 10;
      case DType::kBFloat16:
        return 16;
      default:
        return 1;
    }
  }

  // `v` in type `t`: itself, a converted constant, or the output of a Cast emitted here (one per
  // value and type).
  StatusOr<int> value_as(int v, DType t) {
    const ir::Value& val = g_.values[size_t(v)];
    if (val.dtype == t) return v;
    auto key = std::make_pair(v, t);
    auto it = casts_.find(key);
    if (it != casts_.end()) return it->second;
    int nv = ir::add_unique_value(&g_, g_.values[size_t(v)].name + suffix(t), t,
                                  g_.values[size_t(v)].shape);
    if (g_.values[size_t(v)].constant) {
      if (t == reduced_) {
        KILN_ASSIGN_OR_RETURN(g_.values[size_t(nv)].constant, converted(v));
      } else {
        KILN_ASSIGN_OR_RETURN(g_.values[size_t(nv)].constant,
                              convert(*g_.values[size_t(v)].constant, t));
      }
    } else {
      g_.nodes.push_back(cast_node(v, nv));
    }
    casts_.emplace(key, nv);
    return nv;
  }

  ir::Graph& g_;
  DType reduced_;
  const SupportsFn& supports_;
  std::vector<DType> original_;
  std::map<std::pair<int, DType>, int> casts_;
  std::map<int, Tensor> converted_;
};

}  // namespace

Status assign_precision(ir::Graph* g, DType reduced, const SupportsFn& supports) {
  return Assigner(g, reduced, supports).run();
}

Status assign_precision(BuildState& s) {
  const PrecisionPolicy policy = s.config.precision();
  if (!(policy.fp16 || policy.bf16)) return ok_status();
  const DType reduced = policy.fp16 ? DType::kFloat16 : DType::kBFloat16;
  return assign_precision(&s.graph, reduced, backend_supports(s));
}

}  // namespace kiln::builder
