// Pass fold_batch_norm: an inference BatchNormalization reading a Conv's output that nothing else
// reads, with constant weights and statistics, folds into the Conv as TensorRT does: per output
// channel c, W'[c] = W[c] * s[c] and B'[c] = (B[c] - mean[c]) * s[c] + beta[c], with
// s = scale / sqrt(var + epsilon), computed in double and stored in the weights' dtype. One rule
// on the rewriter (rewriter.h), rooted at the BatchNormalization:
//   BatchNormalization(Conv(X, W [, B]), scale, beta, mean, var)
// W a float32 or float64 constant of rank 3 or more, B (when given) and the statistics float32
// or float64 constants of one element per output channel, no training outputs read.
#include <cmath>
#include <string>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "builder/rewriter.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

using rw::any;
using rw::constant;
using rw::Context;
using rw::Match;
using rw::op;
using rw::Pat;

bool is_wide_float(DType t) { return t == DType::kFloat32 || t == DType::kFloat64; }

// A constant the fold reads as doubles and computes the folded constants from.
bool wide_filter(const Context& ctx, const Match&, int v) {
  const Tensor& w = *ctx.value(v).constant;
  return w.rank() >= 3 && is_wide_float(w.dtype());
}
bool wide_vector(const Context& ctx, const Match&, int v) {
  const Tensor& t = *ctx.value(v).constant;
  return t.rank() == 1 && is_wide_float(t.dtype());
}

// A new constant of `dtype` (float32 or float64) and `shape` holding `values`.
StatusOr<int> add_folded(ir::Graph* g, const std::string& name, DType dtype, Shape shape,
                         const std::vector<double>& values) {
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(dtype, shape));
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kFloat32) {
      t.data_as<float>()[i] = float(values[size_t(i)]);
    } else {
      t.data_as<double>()[i] = values[size_t(i)];
    }
  }
  return add_constant(g, name, std::move(t));
}

StatusOr<bool> fold(Context& ctx, const Match& m) {
  const ir::Node& bn = ctx.node(m.matched[0]);
  for (size_t k = 1; k < bn.outputs.size(); ++k) {
    if (bn.outputs[k] >= 0) return false;  // training outputs (running statistics) are read
  }
  KILN_ASSIGN_OR_RETURN(int64_t training, bn.attrs.get_int("training_mode", 0));
  const int conv_index = m.node("conv");
  if (training != 0 || ctx.node(conv_index).outputs.size() != 1) return false;
  const Tensor& w = *ctx.value(m.value("w")).constant;
  const int bias = m.value("b");
  if (bias >= 0 && !ctx.value(bias).constant) return false;  // a bias computed at run time
  const Tensor* b = bias >= 0 ? &*ctx.value(bias).constant : nullptr;
  const int64_t channels = w.shape()[0];
  const Tensor* p[4];
  int k = 0;
  for (const char* name : {"scale", "beta", "mean", "var"}) {
    p[k] = &*ctx.value(m.value(name)).constant;
    if (p[k++]->numel() != channels) return false;
  }
  if (b && (b->rank() != 1 || b->numel() != channels)) return false;
  KILN_ASSIGN_OR_RETURN(float epsilon, bn.attrs.get_float("epsilon", 1e-5f));
  std::vector<double> s(static_cast<size_t>(channels)), shift(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) {
    const size_t i = size_t(c);
    s[i] = p[0]->float_at(c) / std::sqrt(p[3]->float_at(c) + double(epsilon));
    shift[i] = ((b ? b->float_at(c) : 0.0) - p[2]->float_at(c)) * s[i] + p[1]->float_at(c);
  }
  const int64_t per_channel = w.numel() / channels;
  std::vector<double> weights(size_t(w.numel()));
  for (int64_t i = 0; i < w.numel(); ++i) {
    weights[size_t(i)] = w.float_at(i) * s[size_t(i / per_channel)];
  }
  // The first new constant may move the graph's values, w among them.
  const DType dtype = w.dtype();
  const Shape shape = w.shape();
  const ir::Node& conv = ctx.node(conv_index);
  const std::string base = conv.name.empty() ? "conv" : conv.name;
  ir::Graph* g = ctx.graph;
  KILN_ASSIGN_OR_RETURN(int w2, add_folded(g, base + "_bn_weight", dtype, shape, weights));
  KILN_ASSIGN_OR_RETURN(int b2, add_folded(g, base + "_bn_bias", dtype, {channels}, shift));
  ir::Node folded = ctx.node(conv_index);
  folded.replaced.clear();  // replace_nodes counts the Conv among the matched nodes
  folded.inputs = {folded.inputs[0], w2, b2};
  folded.outputs = {ctx.node(m.matched[0]).outputs[0]};
  // A Conv where there was one: no kernel to ask the backend for.
  const int matched[] = {conv_index, m.matched[0]};
  KILN_RETURN_IF_ERROR(ir::replace_nodes(g, matched, std::move(folded)).status());
  return true;
}

std::vector<rw::Rule> make_rules() {
  const Pat w = constant("w").where(wide_filter);
  const Pat conv = rw::either(
      {op("Conv", {any(), w}).as("conv"), op("Conv", {any(), w, rw::optional("b")}).as("conv")});
  auto stat = [](const char* name) { return constant(name).where(wide_vector); };
  return {{"conv_batch_norm",
           op("BatchNormalization", {conv, stat("scale"), stat("beta"), stat("mean"), stat("var")}),
           fold}};
}

}  // namespace

// The folded node is a Conv, as before: `supports` is asked nothing.
Status fold_batch_norm(ir::Graph* g, const SupportsFn& supports) {
  static const std::vector<rw::Rule> rules = make_rules();
  return rw::apply(g, rules, supports).status();
}

Status fold_batch_norm(BuildState& s) { return fold_batch_norm(&s.graph, backend_supports(s)); }

}  // namespace kiln::builder
