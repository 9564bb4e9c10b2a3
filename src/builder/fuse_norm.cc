// Pass fuse_norm: LayerNorm and RMSNorm as exporters write them out op by op become the ONNX op,
// one kernel that reads x once and accumulates in FP32, where the ops ran as two reductions and
// an elementwise chain with the statistics stored between them. Rules on the rewriter
// (rewriter.h), after canonicalize (which has dropped no-op Casts and made Div(1, s) a
// Reciprocal):
//
//   s = Sqrt(Add(ReduceMean(Pow(d, 2) | Mul(d, d)), eps))        either operand order
//   y = Div(d, s) | Mul(d, Reciprocal(s))                        [Mul(y, gamma)] [Add(., beta)]
//   d = Sub(x, ReduceMean(x)), read by nothing else  -> LayerNormalization(x, gamma, beta)
//                                                       {axis=-1, epsilon=eps} (opset 17)
//   d = x otherwise                                  -> RMSNormalization(x, gamma) (opset 23)
//
// Matched over the last axis only (the ReduceMeans' axes [-1] or [rank-1], as an attribute or the
// opset-18 input, keepdims), every intermediate read by nothing else and no engine output; gamma
// and beta constants of the normalized size (leading ones allowed), of x's dtype; beta only after
// a LayerNorm's gamma. Without gamma the scale is ones (float32 x only). The rules are rooted at
// the last node the normalization can take: a shorter match declines where the longer one's
// next node follows, so the driver reaches it. On every device: the CPU's float32 LayerNorm and
// RMSNorm kernels take a row in one vector pass each (backends/cpu/vector_math.h).
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "builder/rewriter.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

using rw::any;
using rw::Context;
using rw::either;
using rw::Match;
using rw::op;
using rw::Pat;
using rw::scalar;
using rw::scalar_eq;

// Whether ReduceMean node n averages its input over the last axis alone and keeps it.
bool mean_of_last_axis(const Context& ctx, const Match&, int n) {
  const ir::Node& r = ctx.node(n);
  const auto* shape = ctx.shape(r.inputs.empty() ? -1 : r.inputs[0]);
  if (!shape || shape->empty()) return false;
  auto keep = r.attrs.get_int("keepdims", 1);
  if (!keep.ok() || *keep != 1) return false;
  std::vector<int64_t> axes;
  if (r.opset >= 18) {
    if (r.inputs.size() < 2 || r.inputs[1] < 0 || !ctx.value(r.inputs[1]).constant) return false;
    const Tensor& a = *ctx.value(r.inputs[1]).constant;
    for (int64_t i = 0; i < a.numel(); ++i) axes.push_back(a.int_at(i));
  } else {
    auto attr = r.attrs.get_ints("axes", std::vector<int64_t>{});
    if (!attr.ok()) return false;
    axes = *attr;
  }
  const int64_t rank = int64_t(shape->size());
  return axes.size() == 1 && (axes[0] == -1 || axes[0] == rank - 1);
}

// ReduceMean(in) over the last axis, with its axes as an attribute or (opset 18) an input; the
// node bound as `name` where one is given.
Pat mean_of(Pat in, const std::string& name = "") {
  return either({op("ReduceMean", {in}).when(mean_of_last_axis).as(name),
                 op("ReduceMean", {in, rw::constant()}).when(mean_of_last_axis).as(name)});
}

// A constant of x's dtype whose elements lie along the normalized axis ([C], or [1, ..., C]), as a
// [C] tensor; nullopt otherwise.
std::optional<Tensor> per_channel(const Context& ctx, int v, DType dtype, int64_t c) {
  if (v < 0) return std::nullopt;
  const ir::Value& val = ctx.value(v);
  if (!val.constant || val.constant->dtype() != dtype || val.constant->numel() != c)
    return std::nullopt;
  const Shape& s = val.constant->shape();
  if (s.empty() || s.back() != c) return std::nullopt;
  auto t = Tensor::zeros(dtype, {c});
  if (!t.ok()) return std::nullopt;
  std::memcpy(t->data(), val.constant->data(), t->nbytes());
  return std::move(t).value();
}

// The other operand of the one node reading `v` when it is `op_type` of two inputs and v is no
// engine output; -1 otherwise.
int other_at_sole_reader(const Context& ctx, int v, const char* op_type) {
  const int r = ctx.uses->sole_reader(v);
  if (r < 0 || !is_onnx(ctx.node(r), op_type) || ctx.node(r).inputs.size() != 2) return -1;
  const ir::Node& n = ctx.node(r);
  return n.inputs[0] == v ? n.inputs[1] : n.inputs[0];
}

StatusOr<bool> fuse(Context& ctx, const Match& m) {
  const double eps = *ctx.scalar(m.value("eps"));
  if (!(eps >= 0)) return false;
  Match all = m;
  // d = Sub(x, ReduceMean(x)), read only by the square and the normalization: a LayerNorm.
  int x = m.value("d");
  bool layer_norm = false;
  static const Pat centered = op("Sub", {any("x"), mean_of(any("x"))});
  if (const int sub = ctx.value(x).producer; sub >= 0) {
    if (std::optional<Match> c = rw::match_at(ctx, centered, sub)) {
      std::vector<int> readers(ctx.uses->readers(x).begin(), ctx.uses->readers(x).end());
      std::vector<int> want = {m.node("square"), m.node("normed")};
      std::sort(readers.begin(), readers.end());
      std::sort(want.begin(), want.end());
      if (readers == want && !ctx.uses->is_output(x)) {
        x = c->value("x");
        layer_norm = true;
        all.matched.insert(all.matched.end(), c->matched.begin(), c->matched.end());
      }
    }
  }
  const ir::Value& xv = ctx.value(x);
  if (!is_float(xv.dtype) || !xv.shape || xv.shape->empty() || !xv.shape->back().is_const())
    return false;
  const DType dtype = xv.dtype;
  const int64_t c = xv.shape->back().value();
  const int out = ctx.node(m.matched[0]).outputs[0];
  std::optional<Tensor> gamma, beta;
  const int g = m.value("gamma"), b = m.value("beta");
  if (g >= 0 && !(gamma = per_channel(ctx, g, dtype, c))) return false;
  if (b >= 0 && (!layer_norm || !(beta = per_channel(ctx, b, dtype, c)))) return false;
  // A longer match follows: the driver takes it at its root.
  if (!beta && layer_norm && gamma &&
      per_channel(ctx, other_at_sole_reader(ctx, out, "Add"), dtype, c)) {
    return false;
  }
  if (!gamma && per_channel(ctx, other_at_sole_reader(ctx, out, "Mul"), dtype, c)) return false;
  const ir::Value& ov = ctx.value(out);
  if (ov.dtype != dtype || !ov.shape || *ov.shape != *xv.shape) return false;
  if (!gamma) {
    if (dtype != DType::kFloat32) return false;
    gamma = Tensor::from_vector(DType::kFloat32, {c}, std::vector<float>(size_t(c), 1.f));
  }
  const std::string name = ctx.node(m.node("var")).name;
  ir::Node norm = rw::make_node(*ctx.graph, layer_norm ? "LayerNormalization" : "RMSNormalization",
                                name, {}, {out});
  norm.name = name;
  norm.opset = layer_norm ? 17 : 23;
  set_int(&norm, "axis", -1);
  set_float(&norm, "epsilon", float(eps));
  // The constants are added only once the backend took the node: a declined rewrite leaves the
  // graph as it was.
  norm.inputs = {x, -1};
  if (beta) norm.inputs.push_back(-1);
  const ir::Value scale_v{
      .name = name + "_scale", .dtype = dtype, .shape = std::vector<ir::Dim>{ir::Dim(c)}};
  std::vector<const ir::Value*> in = {&xv, &scale_v};
  if (beta) in.push_back(&scale_v);
  if (!(*ctx.supports)(norm, in, {&ov})) return false;
  norm.inputs[1] =
      add_constant(ctx.graph, name + (layer_norm ? "_ln_scale" : "_rms_scale"), std::move(*gamma));
  if (beta) norm.inputs[2] = add_constant(ctx.graph, name + "_ln_bias", std::move(*beta));
  return rw::replace(ctx, all, std::move(norm));
}

std::vector<rw::Rule> make_rules() {
  const Pat square = either({op("Pow", {any("d"), scalar_eq(2)}).as("square"),
                             op("Mul", {any("d"), any("d")}).as("square")});
  const Pat var = mean_of(square, "var");
  const Pat root = op("Sqrt", {op("Add", {var, scalar("eps")}).commutative()});
  const Pat divided = op("Div", {any("d"), root}).as("normed");
  const Pat multiplied = op("Mul", {any("d"), op("Reciprocal", {root})}).commutative().as("normed");
  const Pat scaled =
      op("Mul", {either({divided, multiplied}), rw::constant("gamma")}).commutative();
  // A rule's root is an op: the bare normalization is two rules.
  return {{"norm_scaled_shifted", op("Add", {scaled, rw::constant("beta")}).commutative(), fuse},
          {"norm_scaled", scaled, fuse},
          {"norm_divided", divided, fuse},
          {"norm_multiplied", multiplied, fuse}};
}

}  // namespace

Status fuse_norm(ir::Graph* g, const SupportsFn& supports) {
  static const std::vector<rw::Rule> rules = make_rules();
  return rw::apply(g, rules, supports).status();
}

Status fuse_norm(BuildState& s) { return fuse_norm(&s.graph, backend_supports(s)); }

}  // namespace kiln::builder
