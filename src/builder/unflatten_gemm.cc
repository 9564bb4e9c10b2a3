// Pass unflatten_gemm: a linear layer written as a 2-D Gemm between reshapes (transformers'
// Conv1D, GPT-2's every projection: addmm on x.view(-1, K), then .view(..., N)),
//   Y = Reshape(Gemm(Reshape(X [..., K], [M, K]), W, c), [..., N])
// becomes the MatMul it is on X itself (X [..., H, D] with H*D = K viewed as [..., K] first),
// with the bias Add after it,
//   Y = Add(MatMul(X, W or W^T), c)
// so that fuse_matmul_bias sees the linear layer as BERT's look: the bias, a following GELU and a
// residual Add go into one MatMulBias (cuBLASLt's epilogue and C) instead of a Gemm, a separate
// activation and a separate Add. Matched: alpha 1, beta 1, transA 0, W a 2-D constant, c a
// constant of N elements or absent, Y's leading dims X's own. One rule on the rewriter
// (rewriter.h). CUDA only, before fuse_matmul_bias.
#include <optional>
#include <string>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "builder/rewriter.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

using ir::Dim;
using Dims = std::vector<Dim>;
using rw::any;
using rw::Context;
using rw::either;
using rw::Match;
using rw::op;
using rw::Pat;

StatusOr<bool> unflatten(Context& ctx, const Match& m) {
  ir::Graph* g = ctx.graph;
  const ir::Node& gemm = ctx.node(m.node("gemm"));
  auto alpha = gemm.attrs.get_float("alpha", 1.f), beta = gemm.attrs.get_float("beta", 1.f);
  auto ta = gemm.attrs.get_int("transA", 0), tb = gemm.attrs.get_int("transB", 0);
  if (!alpha.ok() || !beta.ok() || !ta.ok() || !tb.ok() || *alpha != 1.f || *beta != 1.f ||
      *ta != 0)
    return false;
  const int x = m.value("x"), w = m.value("w"), c = m.value("c");
  const int y = ctx.node(m.matched[0]).outputs[0];
  const ir::Value& wv = ctx.value(w);
  if (!wv.constant || wv.constant->shape().size() != 2) return false;
  const int64_t n = *tb ? wv.constant->shape()[0] : wv.constant->shape()[1];
  const int64_t k = *tb ? wv.constant->shape()[1] : wv.constant->shape()[0];
  if (c >= 0) {
    const ir::Value& cv = ctx.value(c);
    if (!cv.constant || cv.constant->numel() != n || !cv.shape || cv.shape->size() > 1)
      return false;
  }
  // Copies: adding values below moves the graph's values.
  const Dims* xp = ctx.shape(x);
  const Dims* yp = ctx.shape(y);
  if (!xp || !yp) return false;
  const Dims xs = *xp, ys = *yp;
  if (ys.size() < 3 || xs.size() < ys.size() || ys.back() != Dim(n)) return false;
  // X's leading dims are Y's; its trailing ones hold K (one dim, or heads merged: [B, S, H, D]
  // flattened to [B*S, H*D], as the dynamo exporter writes attention's output projection).
  const size_t lead = ys.size() - 1;
  Dim trailing(1);
  for (size_t d = 0; d < xs.size(); ++d) {
    if (d < lead && xs[d] != ys[d]) return false;
    if (d >= lead) trailing = trailing * xs[d];
  }
  if (trailing != Dim(k)) return false;
  const bool merge_heads = xs.size() > ys.size();
  // Heads merged batch-first only (X = Transpose(attention, [0, 2, 1, 3])): torchvision's
  // sequence-first merge ([2, 0, 1, 3]) is pack_attention's, which reads it in place.
  if (merge_heads) {
    const int t = ctx.value(x).producer;
    if (t < 0 || !is_onnx(ctx.node(t), "Transpose") ||
        perm_of(*g, ctx.node(t)) != std::vector<int64_t>{0, 2, 1, 3}) {
      return false;
    }
  }
  // W as [K, N]: the constant itself, or (transB) a transposed copy.
  int wk = w;
  if (*tb) {
    std::optional<Tensor> wt = transposed_2d(*wv.constant);
    if (!wt) return false;
    wk = add_constant(g, ctx.value(w).name + "_kn", std::move(*wt));
  }
  const DType t = ctx.value(y).dtype;
  const std::string name = gemm.name, xname = ctx.value(x).name;
  std::vector<ir::Node> pre;
  int x3 = x;
  if (merge_heads) {
    // X viewed as [..., K] (a Reshape copying the leading dims by 0).
    std::vector<int64_t> target(lead, 0);
    target.push_back(k);
    Dims shape(ys.begin(), ys.end() - 1);
    shape.push_back(Dim(k));
    const int tv =
        add_constant(g, xname + "_merged_shape",
                     Tensor::from_vector(DType::kInt64, {int64_t(target.size())}, target));
    x3 = ir::add_unique_value(g, xname + "_merged", ctx.value(x).dtype, std::move(shape));
    pre.push_back(rw::make_node(*g, "Reshape", xname + "_merged", {x, tv}, {x3}));
  }
  // MatMul writes Y, or with a bias a value the bias Add reads to write Y.
  if (c < 0) {
    ir::Node mm = rw::make_node(*g, "MatMul", name, {x3, wk}, {y});
    mm.name = name;
    return rw::replace_with(ctx, m.matched, std::move(pre), std::move(mm));
  }
  const int product = ir::add_unique_value(g, ctx.value(y).name + "_product", t, ys);
  pre.push_back(rw::make_node(*g, "MatMul", name + "_matmul", {x3, wk}, {product}));
  ir::Node add = rw::make_node(*g, "Add", name + "_bias", {product, c}, {y});
  return rw::replace_with(ctx, m.matched, std::move(pre), std::move(add));
}

std::vector<rw::Rule> make_rules() {
  // The flattening Reshape may be read elsewhere too (its shape, by exporters' shape arithmetic):
  // kept, and gone with the rest once nothing reads it.
  const Pat flat = op("Reshape", {any("x"), any()}).keep();
  const Pat gemm = either({op("Gemm", {flat, rw::constant("w")}).as("gemm"),
                           op("Gemm", {flat, rw::constant("w"), any("c")}).as("gemm")});
  return {{"unflatten_gemm", op("Reshape", {gemm, any()}), unflatten}};
}

}  // namespace

Status unflatten_gemm(ir::Graph* g, const SupportsFn& supports) {
  static const std::vector<rw::Rule> rules = make_rules();
  return rw::apply(g, rules, supports).status();
}

Status unflatten_gemm(BuildState& s) { return unflatten_gemm(&s.graph, backend_supports(s)); }

}  // namespace kiln::builder
