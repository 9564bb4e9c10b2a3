// Pass patchify_conv: a vision transformer's patch embedding, a Conv whose stride equals its
// kernel (no padding, dilation or groups) flattened to tokens,
//   Y = Conv(X [B, C, H, W], W [E, C, P, Q], b)        [B, E, H/P, W/Q]
//   T = Transpose(Reshape(Y, [B, E, N]), [0, 2, 1])    [B, N, E], N = (H/P)(W/Q)
// becomes the GEMM it is: the patches laid out as rows, times the weight as a [C*P*Q, E] matrix,
//   T = MatMulBias(Reshape(Transpose(Reshape(X, [B, C, H/P, P, W/Q, Q]), [0, 2, 4, 1, 3, 5]),
//                          [B, N, C*P*Q]), W^T, b)
// one transpose of the input and one GEMM where the convolution took a cast to NHWC, a channel
// pad to 8, cuDNN's convolution and two transposes back (ViT-B/16 at batch 64: 380 us, of which
// the convolution was 263 us at 56 TFLOPS). The CPU too: ViT-tiny's patch Conv and its token
// Transpose took 1.94 ms at batch 4 on two threads, the GEMM and the input's Transpose 1.47. H and
// W constant. One rule on the rewriter (rewriter.h).
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

bool all_equal(const StatusOr<std::vector<int64_t>>& v, std::vector<int64_t> want) {
  return v.ok() && *v == want;
}

StatusOr<bool> patchify(Context& ctx, const Match& m) {
  ir::Graph* g = ctx.graph;
  const ir::Node& conv = ctx.node(m.node("conv"));
  const int x = m.value("x"), w = m.value("w"), b = m.value("b");
  const ir::Value &xv = ctx.value(x), &wv = ctx.value(w);
  if (!xv.shape || xv.shape->size() != 4 || !wv.constant || wv.constant->shape().size() != 4 ||
      xv.dtype != wv.dtype || !is_float(xv.dtype)) {
    return false;
  }
  if (b >= 0 && !ctx.value(b).constant) return false;
  // Copies: the edits below grow the graph's vectors, which moves their elements.
  const Shape ws = wv.constant->shape();
  const int64_t e = ws[0], c = ws[1], p = ws[2], q = ws[3];
  const Dims xs = *xv.shape;
  const DType dtype = xv.dtype;
  if (!xs[1].is_const() || !xs[2].is_const() || !xs[3].is_const() || xs[1].value() != c)
    return false;
  const int64_t h = xs[2].value(), wd = xs[3].value();
  if (p <= 1 || q <= 1 || h % p != 0 || wd % q != 0) return false;
  const auto& at = conv.attrs;
  if (!all_equal(at.get_ints("strides", std::vector<int64_t>{1, 1}), {p, q}) ||
      !all_equal(at.get_ints("kernel_shape", std::vector<int64_t>{p, q}), {p, q}) ||
      !all_equal(at.get_ints("pads", std::vector<int64_t>{0, 0, 0, 0}), {0, 0, 0, 0}) ||
      !all_equal(at.get_ints("dilations", std::vector<int64_t>{1, 1}), {1, 1}) ||
      !at.get_int("group", 1).ok() || *at.get_int("group", 1) != 1) {
    return false;
  }
  auto pad = at.get_string("auto_pad", "NOTSET");
  if (!pad.ok() || (*pad != "NOTSET" && *pad != "VALID")) return false;
  // Y -> Reshape [B, E, N] -> Transpose [0, 2, 1].
  const int64_t hp = h / p, wp = wd / q, n = hp * wp, k = c * p * q;
  const Dims* rs = ctx.shape(ctx.node(m.node("flatten")).outputs[0]);
  if (!rs || rs->size() != 3 || (*rs)[0] != xs[0] || (*rs)[1] != Dim(e) || (*rs)[2] != Dim(n))
    return false;
  // W [E, C, P, Q], read as [E, C*P*Q], transposed: the [C*P*Q, E] matrix.
  std::optional<Tensor> wt =
      transposed_2d(Tensor::wrap(dtype, {e, k}, wv.constant->data(), nullptr));
  if (!wt) return false;
  const std::string base = xv.name, wname = wv.name, name = conv.name;
  const int tokens = ctx.node(m.matched[0]).outputs[0];
  auto shape_const = [&](const char* suffix, std::vector<int64_t> dims) {
    const int64_t rank = int64_t(dims.size());
    return add_constant(g, base + suffix,
                        Tensor::from_vector<int64_t>(DType::kInt64, {rank}, dims));
  };
  const int x6 = ir::add_unique_value(g, base + "_patches6", dtype,
                                      Dims{xs[0], Dim(c), Dim(hp), Dim(p), Dim(wp), Dim(q)});
  const int x6t = ir::add_unique_value(g, base + "_patches6t", dtype,
                                       Dims{xs[0], Dim(hp), Dim(wp), Dim(c), Dim(p), Dim(q)});
  const int x3 = ir::add_unique_value(g, base + "_patches", dtype, Dims{xs[0], Dim(n), Dim(k)});
  const int s6 = shape_const("_patches6_shape", {-1, c, hp, p, wp, q});
  const int s3 = shape_const("_patches_shape", {-1, n, k});
  const int wtv = add_constant(g, wname + "_patch_matrix", std::move(*wt));
  std::vector<ir::Node> pre;
  pre.push_back(rw::make_node(*g, "Reshape", name + "_Reshape", {x, s6}, {x6}));
  ir::Node tr = rw::make_node(*g, "Transpose", name + "_Transpose", {x6}, {x6t});
  set_ints(&tr, "perm", {0, 2, 4, 1, 3, 5});
  pre.push_back(std::move(tr));
  pre.push_back(rw::make_node(*g, "Reshape", name + "_Reshape", {x6t, s3}, {x3}));
  std::vector<int> inputs = {x3, wtv};
  if (b >= 0) inputs.push_back(b);
  ir::Node mm = rw::make_node(*g, "MatMulBias", name, std::move(inputs), {tokens}, "kiln");
  mm.name = name;
  mm.opset = 1;
  set_string(&mm, "activation", "none");
  return rw::replace_with(ctx, m.matched, std::move(pre), std::move(mm));
}

std::vector<rw::Rule> make_rules() {
  const Pat conv =
      either({op("Conv", {any("x"), rw::constant("w")}).as("conv"),
              op("Conv", {any("x"), rw::constant("w"), rw::optional("b")}).as("conv")});
  const Pat root = op("Transpose", {op("Reshape", {conv, any()}).as("flatten")})
                       .when([](const Context& ctx, const Match&, int n) {
                         return perm_of(*ctx.graph, ctx.node(n)) == std::vector<int64_t>{0, 2, 1};
                       });
  return {{"patchify_conv", root, patchify}};
}

}  // namespace

Status patchify_conv(ir::Graph* g, const SupportsFn& supports) {
  static const std::vector<rw::Rule> rules = make_rules();
  return rw::apply(g, rules, supports).status();
}

Status patchify_conv(BuildState& s) { return patchify_conv(&s.graph, backend_supports(s)); }

}  // namespace kiln::builder
