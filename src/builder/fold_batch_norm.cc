// Pass fold_batch_norm: an inference BatchNormalization reading a Conv's output that nothing else
// reads, with constant weights and statistics, folds into the Conv as TensorRT does: per output
// channel c, W'[c] = W[c] * s[c] and B'[c] = (B[c] - mean[c]) * s[c] + beta[c], with
// s = scale / sqrt(var + epsilon), computed in double and stored in the weights' dtype.
#include <cmath>

#include "builder/build_state.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

const Tensor* constant_input(const ir::Graph& g, const ir::Node& n, size_t i) {
  if (i >= n.inputs.size() || n.inputs[i] < 0) return nullptr;
  const ir::Value& v = g.values[size_t(n.inputs[i])];
  return v.constant ? &*v.constant : nullptr;
}

int readers(const ir::Graph& g, int value) {
  int count = 0;
  for (const ir::Node& n : g.nodes) {
    for (int v : n.inputs) count += v == value;
  }
  for (int v : g.outputs) count += v == value;
  return count;
}

bool is_wide_float(DType t) { return t == DType::kFloat32 || t == DType::kFloat64; }

// A new constant value of `dtype` (float32 or float64) and `shape` whose element i is f(i).
template <typename Fn>
int add_constant(ir::Graph* g, const std::string& name, DType dtype, Shape shape, Fn f) {
  Tensor t = Tensor::zeros(dtype, shape).value();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kFloat32) {
      t.data_as<float>()[i] = float(f(i));
    } else {
      t.data_as<double>()[i] = f(i);
    }
  }
  std::vector<ir::Dim> dims;
  for (int64_t d : shape) dims.emplace_back(d);
  int v = ir::add_unique_value(g, name, dtype, dims);
  g->values[size_t(v)].constant = std::move(t);
  return v;
}

// Folds the BatchNormalization at `bn_index` into its Conv when it can; false when the pattern
// does not apply.
StatusOr<bool> fold_one(ir::Graph* g, int bn_index) {
  const ir::Node& bn = g->nodes[size_t(bn_index)];
  if (bn.op_type != "BatchNormalization" || !bn.domain.empty() || bn.inputs.size() != 5) return false;
  for (size_t k = 1; k < bn.outputs.size(); ++k) {
    if (bn.outputs[k] >= 0) return false;  // training outputs (running statistics) are read
  }
  KILN_ASSIGN_OR_RETURN(int64_t training, bn.attrs.get_int("training_mode", 0));
  if (training != 0 || bn.inputs[0] < 0 || bn.outputs.empty() || bn.outputs[0] < 0) return false;
  const int x = bn.inputs[0];
  const int conv_index = g->values[size_t(x)].producer;
  if (conv_index < 0) return false;
  const ir::Node& conv = g->nodes[size_t(conv_index)];
  if (conv.op_type != "Conv" || !conv.domain.empty() || conv.outputs.size() != 1 || readers(*g, x) != 1) {
    return false;
  }
  const Tensor* w = constant_input(*g, conv, 1);
  const Tensor* b = constant_input(*g, conv, 2);
  if (!w || w->rank() < 3 || !is_wide_float(w->dtype())) return false;
  if (conv.inputs.size() > 2 && conv.inputs[2] >= 0 && !b) return false;  // a bias computed at run time
  const int64_t channels = w->shape()[0];
  const Tensor* p[4];
  for (size_t k = 0; k < 4; ++k) {
    p[k] = constant_input(*g, bn, k + 1);
    if (!p[k] || !is_wide_float(p[k]->dtype()) || p[k]->rank() != 1 || p[k]->numel() != channels) return false;
  }
  if (b && (b->rank() != 1 || b->numel() != channels)) return false;
  KILN_ASSIGN_OR_RETURN(float epsilon, bn.attrs.get_float("epsilon", 1e-5f));
  std::vector<double> s(static_cast<size_t>(channels)), shift(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) {
    s[size_t(c)] = p[0]->float_at(c) / std::sqrt(p[3]->float_at(c) + double(epsilon));
    shift[size_t(c)] = ((b ? b->float_at(c) : 0.0) - p[2]->float_at(c)) * s[size_t(c)] + p[1]->float_at(c);
  }
  const int64_t per_channel = w->numel() / channels;
  const Tensor weights = *w;
  const std::string base = conv.name.empty() ? "conv" : conv.name;
  int w2 = add_constant(g, base + "_bn_weight", weights.dtype(), weights.shape(),
                        [&](int64_t i) { return weights.float_at(i) * s[size_t(i / per_channel)]; });
  int b2 = add_constant(g, base + "_bn_bias", weights.dtype(), Shape{channels},
                        [&](int64_t c) { return shift[size_t(c)]; });
  ir::Node fused = g->nodes[size_t(conv_index)];
  fused.replaced.clear();  // replace_nodes counts the Conv among the matched nodes
  fused.inputs = {fused.inputs[0], w2, b2};
  fused.outputs = {g->nodes[size_t(bn_index)].outputs[0]};
  const int matched[] = {conv_index, bn_index};
  KILN_RETURN_IF_ERROR(ir::replace_nodes(g, matched, std::move(fused)).status());
  return true;
}

}  // namespace

Status fold_batch_norm(BuildState& s) {
  ir::Graph& g = s.graph;
  for (size_t n = 0; n < g.nodes.size();) {
    KILN_ASSIGN_OR_RETURN(bool folded, fold_one(&g, int(n)));
    // replace_nodes may reorder nodes: look at this position again after a fold.
    if (!folded) ++n;
  }
  return ok_status();
}

}  // namespace kiln::builder
