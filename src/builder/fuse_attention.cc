// Pass fuse_attention: scaled dot-product attention becomes one ONNX Attention node (opset 23),
// which the CUDA backend runs as one fused kernel (cuDNN's flash attention for float16/bfloat16)
// instead of two batched GEMMs, the score tensor written and read by each of scale, mask, softmax
// and NaN guard, and the transposes around the heads. One rule on the rewriter (rewriter.h), after
// canonicalize has composed the exporters' transposes and reshapes; what it matches:
//
//   S = MatMul(Q', K')        Q' = Q times scalars; K' = Transpose(K times scalars) times scalars
//   S = S * c | S / c ...     scalar constants, before the mask
//   S = S * h                 a constant per head ([.., H, 1, 1]: Swin-V2's cosine attention,
//                             exp of the clamped logit scale): Mul(Q, h) goes in before the
//                             Attention, which scales Q's rows as the scores' were
//   S = Add(S, M) | Add(M, S) an additive mask broadcasting onto S (M need not be constant), or
//   S = Where(C, S, fill)     a boolean mask, fill a large negative scalar (-inf, the dtype's
//     | Where(C, fill, S)     lowest, -1e4 or below): the additive mask Where(C, 0, fill) in its
//                             place, folded at build time when C is a constant
//   P = Softmax(S) over the last axis
//   P = Where(IsNaN(P), 0, P) the guard the exporters put after softmax (optional)
//   Y = MatMul(P, V)
//
// The scalars' product becomes the attribute scale (whether the model scales Q, K, both by the
// root of the scale as the dynamo exporter does, or the scores); Attention's K is K' transposed
// back (the Transpose's permutation with its last two axes exchanged: none where that is the
// identity). A constant mask that is 0 on and below the diagonal of square scores and large and
// negative above it (a causal mask, as GPT-2's exports fold to) becomes is_causal=1, so the kernel
// skips the masked half instead of reading a mask. Q, K, V and Y have rank 4 ([batch, heads, seq,
// head]) or rank 3 (one head). Where Q, K and V are each split into heads as Transpose(Reshape(x,
// [B, S, H, D]), [0, 2, 1, 3]) of a [B, S, H*D] tensor and Y is merged back the same way
// (Transpose [0, 2, 1, 3], Reshape to [B, S, H*D]), the node takes the [B, S, H*D] tensors
// themselves (its 3-D form, q_num_heads and kv_num_heads) and writes the merged output: the
// kernel reads the heads with strides and the four transposes go.
//
// Grouped-query attention's K and V heads, repeated for the query heads (Unsqueeze, Expand,
// Reshape: transformers' repeat_kv), are read by the node as they are, fewer than Q's; this also
// for an Attention the exporter wrote.
//
// One difference, in rows where every key is masked: unfused, softmax gives NaN there (0 with the
// guard); Attention gives 0 either way, as ONNX's Attention and every flash kernel do.
//
// On CUDA only where the build may run it in float16 or bfloat16 (--fp16, --bf16): there it has a
// fused kernel; in float32 the batched GEMMs on tensor cores are faster than the reference
// Attention kernel, so a strict or TF32 CUDA build keeps the graph as it is. On the CPU always:
// float32 Attention runs attention_f32's GEMM kernel (backends/cpu/attention_f32.h), which does
// the unfused graph's two GEMMs and softmax without its transposes and score passes. Runs before
// fuse_matmul_bias (which would take the score product and a constant mask, Swin's relative
// position bias, as a GEMM with a bias) and before assign_precision, which then gives the whole
// node the reduced type (it accumulates in float).
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "builder/build_state.h"
#include "builder/causal_mask.h"
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
using rw::scalar;
using rw::scalar_eq;
using rw::scaled;

const Dims* shape_of(const ir::Graph& g, int v) {
  if (v < 0) return nullptr;
  const ir::Value& val = g.values[size_t(v)];
  return val.shape ? &*val.shape : nullptr;
}

// A fill that masks: softmax gives its entries a weight of 0 (exp(-1e4) underflows float, and
// float16's lowest is -65504).
bool masks(double fill) { return fill <= -1e4; }

// The Softmax node n normalizes over the last axis (opset 13's meaning, or an older opset's with
// axis = rank - 1, where flattening changes nothing).
bool softmax_over_last_axis(const Context& ctx, const Match&, int n) {
  const ir::Node& node = ctx.node(n);
  const Dims* s = ctx.shape(node.inputs[0]);
  if (!s || node.outputs.size() != 1) return false;
  auto axis = node.attrs.get_int("axis", node.opset > 0 && node.opset < 13 ? 1 : -1);
  return axis.ok() && (*axis == -1 || *axis == int64_t(s->size()) - 1);
}

// A [B, S, H*D] tensor and its H where `v` is Transpose(Reshape(x, [B, S, H, D]), [0, 2, 1, 3])
// (or that Reshape's output under `perm`, when the Transpose is taken already).
struct Heads {
  int x = -1;
  int64_t heads = 0;
};

std::optional<Heads> split_heads(const ir::Graph& g, int v, std::vector<int64_t> perm) {
  if (is_identity_perm(perm)) {
    const int p = g.values[size_t(v)].producer;
    if (p < 0 || !is_onnx(g.nodes[size_t(p)], "Transpose")) return std::nullopt;
    perm = perm_of(g, g.nodes[size_t(p)]).value_or(std::vector<int64_t>{});
    v = g.nodes[size_t(p)].inputs[0];
  }
  if (perm != std::vector<int64_t>{0, 2, 1, 3}) return std::nullopt;
  const int r = g.values[size_t(v)].producer;
  if (r < 0 || !is_onnx(g.nodes[size_t(r)], "Reshape")) return std::nullopt;
  const int x = g.nodes[size_t(r)].inputs[0];
  const Dims *xs = shape_of(g, x), *vs = shape_of(g, v);
  if (!xs || !vs || xs->size() != 3 || vs->size() != 4 || !(*vs)[2].is_const()) return std::nullopt;
  if ((*xs)[0] != (*vs)[0] || (*xs)[1] != (*vs)[1] || (*xs)[2] != (*vs)[2] * (*vs)[3])
    return std::nullopt;
  return Heads{x, (*vs)[2].value()};
}

// Whether the constant additive mask `m` ([..., S, S], leading dims of 1) is causal: 0 on and
// below the diagonal, a masking fill above.
bool is_causal_mask(const ir::Value& m) {
  if (!m.constant || !m.shape || m.shape->size() < 2) return false;
  const Dims& s = *m.shape;
  const size_t r = s.size();
  for (size_t i = 0; i + 2 < r; ++i) {
    if (s[i] != Dim(1)) return false;
  }
  if (!s[r - 1].is_const() || s[r - 2] != s[r - 1]) return false;
  const int64_t n = s[r - 1].value();
  if (n < 2 || m.constant->numel() != n * n) return false;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const double x = m.constant->float_at(i * n + j);
      if (j <= i ? x != 0.0 : !masks(x)) return false;
    }
  }
  return true;
}

// Whether mask value `m` spans the scores' last two axes [.., S, S] as they are (no broadcast
// there).
bool causal_over(const Context& ctx, int m, const Dims& scores) {
  const Dims* ms = ctx.shape(m);
  const size_t r = scores.size();
  return ms && ms->size() >= 2 && ms->size() <= r && (*ms)[ms->size() - 1] == scores[r - 1] &&
         (*ms)[ms->size() - 2] == scores[r - 2];
}

// Whether the additive mask `m` over square scores is causal: a constant one, or one the model
// computes as Where(C, 0, fill) of a causal C (or Where(C, fill, 0) of its complement), as
// transformers' masks are built at run time from position comparisons.
bool causal_additive(const Context& ctx, int m, const Dims& scores) {
  if (!causal_over(ctx, m, scores)) return false;
  if (is_causal_mask(ctx.value(m))) return true;
  const int p = ctx.value(m).producer;
  if (p < 0 || !is_onnx(ctx.node(p), "Where") || ctx.node(p).inputs.size() != 3) return false;
  const ir::Node& w = ctx.node(p);
  const std::optional<double> a = ctx.scalar(w.inputs[1]), b = ctx.scalar(w.inputs[2]);
  if (!a || !b || !causal_over(ctx, w.inputs[0], scores)) return false;
  const MaskKind k = mask_kind(*ctx.graph, w.inputs[0]);
  return (*a == 0.0 && masks(*b) && k == MaskKind::kCausal) ||
         (masks(*a) && *b == 0.0 && k == MaskKind::kStrictlyUpper);
}

// The additive mask of a boolean one: Where(cond, 0, fill) (or Where(cond, fill, 0) for a cond
// that marks what is masked), as a constant when cond is one, else as a node the caller inserts.
struct AdditiveMask {
  int value = -1;
  std::optional<ir::Node> node;
};
std::optional<AdditiveMask> additive_mask(Context& ctx, int cond, double fill, bool fill_where_true,
                                          DType t, const std::string& base) {
  // Copies: adding values below moves the graph's values.
  if (ctx.value(cond).dtype != DType::kBool || !ctx.value(cond).shape) return std::nullopt;
  const Dims cond_shape = *ctx.value(cond).shape;
  const std::optional<Tensor> cond_data = ctx.value(cond).constant;
  const float f = std::isinf(fill) ? -std::numeric_limits<float>::infinity() : float(fill);
  auto scalar_of = [&](float x) {
    auto tensor = Tensor::zeros(t, {});
    if (!tensor.ok()) return -1;
    tensor->set_float_at(0, x);
    return add_constant(ctx.graph, base + "_fill", std::move(*tensor));
  };
  if (cond_data) {
    Shape shape;
    for (const Dim& d : cond_shape) shape.push_back(d.value());
    auto tensor = Tensor::zeros(t, shape);
    if (!tensor.ok()) return std::nullopt;
    for (int64_t i = 0; i < tensor->numel(); ++i) {
      const bool on = cond_data->int_at(i) != 0;
      tensor->set_float_at(i, on == fill_where_true ? f : 0.f);
    }
    return AdditiveMask{add_constant(ctx.graph, base, std::move(*tensor)), std::nullopt};
  }
  const int zero = scalar_of(0.f), fv = scalar_of(f);
  if (zero < 0 || fv < 0) return std::nullopt;
  const int out = ir::add_unique_value(ctx.graph, base, t, cond_shape);
  ir::Node where =
      rw::make_node(*ctx.graph, "Where", base,
                    {cond, fill_where_true ? fv : zero, fill_where_true ? zero : fv}, {out});
  return AdditiveMask{out, std::move(where)};
}

// Swin's shifted windows: the scores [B*W, H, N, L] viewed as [B, W, H, N, L] (W windows), a
// constant mask [1, W, 1|H, N, L] added and viewed back, after the relative position bias (a
// constant broadcasting to [1, H, N, L], or none). No mask broadcasting onto [B*W, H, N, L] says
// that (it repeats every W rows), but with the windows taken as heads it is one constant: Q, K
// and V [B*W, H, ., D] are [B, W*H, ., D] (a view), the mask [1, W*H, N, L], and the output
// [B, W*H, N, Dv] is [B*W, H, N, Dv] again. The window count and that constant, or nullopt.
struct Windows {
  int64_t count = 0;
  Tensor mask;  // [1, W*H, N, L]
};
std::optional<Windows> window_mask(const Context& ctx, const Match& m, int scores, int bias,
                                   DType t) {
  const int split = m.node("window_split"), merge = m.node("window_merge");
  const int m5 = m.value("window_mask");
  const Dims* ss = ctx.shape(scores);
  const Dims* vs = ctx.shape(ctx.node(split).outputs[0]);
  const Dims* ms = ctx.shape(m5);
  const Dims* os = ctx.shape(ctx.node(merge).outputs[0]);
  if (!ss || !vs || !ms || !os || ss->size() != 4 || vs->size() != 5 || ms->size() != 5 ||
      *os != *ss)
    return std::nullopt;
  if ((*vs)[0] * (*vs)[1] != (*ss)[0] || (*vs)[2] != (*ss)[1] || (*vs)[3] != (*ss)[2] ||
      (*vs)[4] != (*ss)[3]) {
    return std::nullopt;
  }
  for (size_t i = 1; i < 5; ++i) {
    if (!(*vs)[i].is_const()) return std::nullopt;
  }
  const int64_t w = (*vs)[1].value(), h = (*vs)[2].value(), n = (*vs)[3].value(),
                l = (*vs)[4].value();
  if ((*ms)[0] != Dim(1) || (*ms)[1] != Dim(w) || ((*ms)[2] != Dim(1) && (*ms)[2] != Dim(h)) ||
      (*ms)[3] != Dim(n) || (*ms)[4] != Dim(l)) {
    return std::nullopt;
  }
  const ir::Value& mv = ctx.value(m5);
  if (!mv.constant || !is_float(mv.dtype)) return std::nullopt;
  const Tensor* bias_data = nullptr;
  if (bias >= 0) {
    const ir::Value& bv = ctx.value(bias);
    if (!bv.constant || !bv.shape || bv.constant->numel() != h * n * l) return std::nullopt;
    for (size_t i = 0; i + 3 < bv.shape->size(); ++i) {
      if ((*bv.shape)[i] != Dim(1)) return std::nullopt;
    }
    bias_data = &*bv.constant;
  }
  auto sum = Tensor::zeros(t, {1, w * h, n, l});
  if (!sum.ok()) return std::nullopt;
  const int64_t mh = (*ms)[2].value();
  for (int64_t wi = 0; wi < w; ++wi) {
    for (int64_t hi = 0; hi < h; ++hi) {
      for (int64_t k = 0; k < n * l; ++k) {
        double x = mv.constant->float_at((wi * mh + (mh == 1 ? 0 : hi)) * n * l + k);
        if (bias_data) x += bias_data->float_at(hi * n * l + k);
        sum->set_float_at((wi * h + hi) * n * l + k, x);
      }
    }
  }
  return Windows{w, std::move(*sum)};
}

// A Reshape of `x` to [-1, dims...] (a view), its output of shape `shape`, for `into`.
int add_view(Context& ctx, int x, std::vector<int64_t> dims, Dims shape, const std::string& base,
             std::vector<ir::Node>* into) {
  dims.insert(dims.begin(), -1);
  const int target = add_constant(ctx.graph, base + "_shape",
                                  Tensor::from_vector(DType::kInt64, {int64_t(dims.size())}, dims));
  const DType t = ctx.value(x).dtype;
  const int out = ir::add_unique_value(ctx.graph, base, t, std::move(shape));
  ir::Node r =
      rw::make_node(*ctx.graph, "Reshape", base + std::to_string(into->size()), {x, target}, {out});
  into->push_back(std::move(r));
  return out;
}

StatusOr<bool> fuse(Context& ctx, const Match& m) {
  ir::Graph* g = ctx.graph;
  const int qk = m.node("qk"), pv = m.node("pv"), kt_node = m.node("kt");
  int q = m.value("q");
  const int k_top = m.value("k"), vv = m.value("v");
  const int y = ctx.node(pv).outputs[0];
  const int scores = ctx.node(qk).outputs[0];
  const Dims* score_shape = ctx.shape(scores);
  if (!score_shape || (score_shape->size() != 3 && score_shape->size() != 4)) return false;
  const size_t rank = score_shape->size();
  const DType t = ctx.value(q).dtype;
  if (!is_float(t)) return false;
  // The mask: additive, or boolean with a fill, or Swin's windowed one; the nodes that make it
  // from the model's values go in before the Attention.
  int mask = m.value("mask");
  std::vector<ir::Node> pre_nodes;
  // A causal mask, however computed, becomes is_causal (for square scores [B, H, S, S]).
  const bool square =
      rank == 4 && (*score_shape)[2] == (*score_shape)[3] && m.node("window_add") < 0;
  bool causal = square && mask >= 0 && causal_additive(ctx, mask, *score_shape);
  if (m.node("where") >= 0 || m.node("where_inv") >= 0) {
    const double fill = *ctx.scalar(m.value("fill"));
    if (!masks(fill)) return false;
    const bool inverted = m.node("where_inv") >= 0;
    const int cond = m.value("cond");
    causal = square && causal_over(ctx, cond, *score_shape) &&
             mask_kind(*g, cond) == (inverted ? MaskKind::kStrictlyUpper : MaskKind::kCausal);
    if (!causal) {
      auto am = additive_mask(ctx, cond, fill, inverted, t,
                              ctx.node(m.node(inverted ? "where_inv" : "where")).name + "_mask");
      if (!am) return false;
      mask = am->value;
      if (am->node) pre_nodes.push_back(std::move(*am->node));
    }
  }
  if (causal) mask = -1;
  // Swin-V2's cosine attention scales the scores by a constant per head (the clamped logit
  // scale's exp, [H, 1, 1]): the same factor on Q's rows, Mul(Q, c), before the Attention. A
  // scalar joins the scale attribute.
  double head_factor = 1.0;
  if (m.node("head_mul") >= 0) {
    const int c = m.value("head_scale");
    const ir::Value& cv = ctx.value(c);
    const Dims* cs = ctx.shape(c);
    if (!cv.constant || !cs || cv.dtype != t) return false;
    if (cv.constant->numel() == 1) {
      head_factor = cv.constant->float_at(0);
    } else {
      // Broadcast over the scores' rows and columns, and no wider than Q (a factor per batch
      // row, head or window, never per query or key).
      const Dims* qs0 = ctx.shape(q);
      if (!qs0 || cs->size() < 2 || cs->size() > rank || qs0->size() != rank) return false;
      if ((*cs)[cs->size() - 1] != Dim(1) || (*cs)[cs->size() - 2] != Dim(1)) return false;
      for (size_t i = 0; i + 2 < cs->size(); ++i) {
        const Dim& d = (*cs)[i];
        if (d != Dim(1) && d != (*qs0)[rank - cs->size() + i]) return false;
      }
      const int scaled_q = ir::add_unique_value(g, ctx.node(qk).name + "_q_head_scaled", t, *qs0);
      pre_nodes.push_back(
          rw::make_node(*g, "Mul", ctx.node(qk).name + "_q_head_scale", {q, c}, {scaled_q}));
      q = scaled_q;
    }
  }
  std::optional<Windows> windows;
  if (m.node("window_add") >= 0) {
    windows = window_mask(ctx, m, scores, mask, t);
    if (!windows) return false;
    mask = -1;  // in the windows' constant
  }
  const Dims *qs = ctx.shape(q), *kts = ctx.shape(ctx.node(qk).inputs[1]), *vs = ctx.shape(vv),
             *ys = ctx.shape(y), *ms = ctx.shape(mask);
  if (!qs || !kts || !vs || !ys || qs->size() != rank || kts->size() != rank ||
      vs->size() != rank || ys->size() != rank || (mask >= 0 && (!ms || ms->size() > rank))) {
    return false;
  }
  // K' is the Transpose's output scaled: the same shape.
  if (ctx.shape(ctx.node(kt_node).outputs[0]) == nullptr ||
      *ctx.shape(ctx.node(kt_node).outputs[0]) != *kts)
    return false;
  // Batch dims equal (no broadcasting between Q, K and V), K' = [.., D, L], V = [.., L, Dv].
  for (size_t i = 0; i + 2 < rank; ++i) {
    if ((*kts)[i] != (*qs)[i] || (*vs)[i] != (*qs)[i] || (*ys)[i] != (*qs)[i]) return false;
  }
  if ((*kts)[rank - 2] != (*qs)[rank - 1] || (*vs)[rank - 2] != (*kts)[rank - 1]) return false;
  // A rank-3 mask over rank-3 scores would meet Attention's [B, heads, S, L] as [1, B, S, L].
  if (rank == 3 && mask >= 0 && ms->size() == 3 && (*ms)[0] != Dim(1)) return false;
  for (int x : {k_top, vv, y}) {
    if (ctx.value(x).dtype != t) return false;
  }
  if (mask >= 0 && ctx.value(mask).dtype != t) return false;
  // Attention's K: K' without the Transpose's last two axes exchanged.
  std::vector<int64_t> perm = perm_of(*g, ctx.node(kt_node)).value_or(std::vector<int64_t>{});
  if (perm.size() != rank) return false;
  std::swap(perm[rank - 2], perm[rank - 1]);

  ir::Node fused;
  fused.name = ctx.node(qk).name;
  fused.op_type = "Attention";
  fused.opset = 23;
  set_float(&fused, "scale",
            float(m.factor("q_scale") * m.factor("k_scale") * m.factor("kt_scale") *
                  m.factor("s_scale") * head_factor));
  if (causal) set_int(&fused, "is_causal", 1);
  std::vector<int> matched = m.matched;
  // Mask nodes made here go in first; taken out again when the fusion does not happen.
  auto finish = [&](ir::Node node) -> StatusOr<bool> {
    if (mask >= 0) node.inputs.push_back(mask);
    return rw::replace_with(ctx, matched, std::move(pre_nodes), std::move(node));
  };
  if (windows) {
    // Windows as heads: views of Q, K (transposed back where K' is no plain swap) and V as
    // [B, W*H, ., D], the Attention with the windows' constant mask, and its output viewed as
    // [B*W, H, N, Dv] in the place of Y (the replacement; the rest go in before it).
    const int64_t w = windows->count;
    const Dims y_shape = *ys;  // a copy: adding values below moves the graph's values
    const Dim heads = (*qs)[1] * Dim(w), rows = Dim::floor_div((*qs)[0], Dim(w));
    if (rows * Dim(w) != (*qs)[0] || !heads.is_const()) return false;
    int k_att = k_top;
    const std::string base = fused.name + "_windows";
    if (!is_identity_perm(perm)) {
      Dims ks = *ctx.shape(k_top), kp;
      for (int64_t a : perm) kp.push_back(ks[size_t(a)]);
      k_att = ir::add_unique_value(g, base + "_k", t, kp);
      ir::Node tr = rw::make_node(*g, "Transpose", base + "_k_transpose", {k_top}, {k_att});
      set_ints(&tr, "perm", perm);
      pre_nodes.push_back(std::move(tr));
    }
    auto view = [&](int x, const char* what) {
      const Dims& xs = *ctx.shape(x);
      return add_view(ctx, x, {heads.value(), xs[2].value(), xs[3].value()},
                      {rows, heads, xs[2], xs[3]}, base + "_" + what, &pre_nodes);
    };
    for (int x : {q, k_att, vv}) {
      const Dims& xs = *ctx.shape(x);
      if (!xs[2].is_const() || !xs[3].is_const()) return false;
    }
    const int q4 = view(q, "q"), k4 = view(k_att, "k"), v4 = view(vv, "v");
    const int m4 = add_constant(g, base + "_mask", std::move(windows->mask));
    const int y4 =
        ir::add_unique_value(g, base + "_y", t, Dims{rows, heads, y_shape[2], y_shape[3]});
    fused.inputs = {q4, k4, v4, m4};
    fused.outputs = {y4};
    pre_nodes.push_back(fused);
    if (!y_shape[1].is_const() || !y_shape[2].is_const() || !y_shape[3].is_const()) return false;
    const std::vector<int64_t> back = {-1, y_shape[1].value(), y_shape[2].value(),
                                       y_shape[3].value()};
    const int back_shape =
        add_constant(g, base + "_merge_shape", Tensor::from_vector(DType::kInt64, {4}, back));
    ir::Node merge = rw::make_node(*g, "Reshape", base + "_merge", {y4, back_shape}, {y});
    mask = -1;
    return finish(std::move(merge));
  }
  // The 3-D form where every operand is split into heads and the output merged back.
  if (rank == 4) {
    std::optional<Heads> hq = split_heads(*g, q, {0, 1, 2, 3});
    std::optional<Heads> hk = split_heads(*g, k_top, perm);
    std::optional<Heads> hv = split_heads(*g, vv, {0, 1, 2, 3});
    int merge_t = ctx.uses->sole_reader(y), merge_r = -1;
    if (merge_t >= 0 && is_onnx(ctx.node(merge_t), "Transpose") &&
        perm_of(*g, ctx.node(merge_t)) == std::vector<int64_t>{0, 2, 1, 3}) {
      merge_r = ctx.uses->sole_reader(ctx.node(merge_t).outputs[0]);
    }
    if (merge_r >= 0 && !is_onnx(ctx.node(merge_r), "Reshape")) merge_r = -1;
    const Dims* rs = merge_r >= 0 ? ctx.shape(ctx.node(merge_r).outputs[0]) : nullptr;
    if (!rs || rs->size() != 3 || (*rs)[0] != (*ys)[0] || (*rs)[1] != (*ys)[2] ||
        (*rs)[2] != (*ys)[1] * (*ys)[3]) {
      merge_r = -1;
    }
    if (hq && hk && hv && merge_r >= 0) {
      fused.inputs = {hq->x, hk->x, hv->x};
      set_int(&fused, "q_num_heads", hq->heads);
      set_int(&fused, "kv_num_heads", hk->heads);
      fused.outputs = {ctx.node(merge_r).outputs[0]};
      matched.push_back(merge_t);
      matched.push_back(merge_r);
      return finish(std::move(fused));
    }
  }
  fused.outputs = {y};
  if (rank == 3) {  // [N, S, D] is Attention's 3-D form with one head
    set_int(&fused, "q_num_heads", 1);
    set_int(&fused, "kv_num_heads", 1);
  }
  if (is_identity_perm(perm)) {
    fused.inputs = {q, k_top, vv};
    return finish(std::move(fused));
  }
  // The matched Transpose becomes K's: it reads the top of K's path with the permutation above.
  // Undone when the fusion does not happen.
  ir::Node& tn = g->nodes[size_t(kt_node)];
  const ir::Node saved = tn;
  const int k = tn.outputs[0];
  const Dims saved_shape = *g->values[size_t(k)].shape;
  Dims k_shape = saved_shape;
  std::swap(k_shape[rank - 2], k_shape[rank - 1]);
  tn.inputs[0] = k_top;
  set_ints(&tn, "perm", perm);
  g->values[size_t(k)].shape = k_shape;
  matched.erase(std::find(matched.begin(), matched.end(), kt_node));
  fused.inputs = {q, k, vv};
  // Node indices shift where finish inserts a mask node; the Transpose is found by its output.
  KILN_ASSIGN_OR_RETURN(bool done, finish(std::move(fused)));
  if (done) return true;
  const int at = g->values[size_t(k)].producer;
  g->nodes[size_t(at)] = saved;
  g->values[size_t(k)].shape = saved_shape;
  return false;
}

// Grouped-query attention's K or V: each of Hk heads repeated g times for the Hk*g query heads,
// as transformers' repeat_kv writes it (x[:, :, None].expand(B, Hk, g, L, D).reshape(B, Hk*g, L,
// D)) and both exporters keep it: Reshape(Expand(Unsqueeze(x, [2]), .), .). The kernels read the
// Hk heads themselves (Attention takes K and V with fewer heads than Q, each serving Hq/Hk query
// heads in order), so the copies go. The [B, Hk, L, D] input x, or -1.
int repeated_kv(const Context& ctx, int root, int v) {
  static const Pat repeat = op(
      "Reshape", {op("Expand", {op("Unsqueeze", {any("x"), any()}), any()}).as("expand"), any()});
  const int producer = ctx.value(v).producer;
  if (producer < 0 || ctx.uses->sole_reader(v) != root) return -1;
  std::optional<Match> m = rw::match_at(ctx, repeat, producer);
  if (!m) return -1;
  const Dims *x = ctx.shape(m->value("x")), *e = ctx.shape(ctx.node(m->node("expand")).outputs[0]),
             *y = ctx.shape(v);
  if (!x || !e || !y || x->size() != 4 || e->size() != 5 || y->size() != 4) return -1;
  const Dims want_e = {(*x)[0], (*x)[1], (*e)[2], (*x)[2], (*x)[3]};
  const Dims want_y = {(*x)[0], (*x)[1] * (*e)[2], (*x)[2], (*x)[3]};
  if (!(*e)[2].is_const() || *e != want_e || *y != want_y) return -1;
  return m->value("x");
}

// An Attention of 4-D operands whose K and V are repeated_kv(): the same node on the Hk heads.
StatusOr<bool> grouped_query(Context& ctx, const Match& m) {
  const int root = m.matched[0];
  ir::Node fused = ctx.node(root);
  if (fused.attrs.has("q_num_heads") || fused.attrs.has("kv_num_heads"))
    return false;  // the 3-D form
  const int k = repeated_kv(ctx, root, fused.inputs[1]),
            v = repeated_kv(ctx, root, fused.inputs[2]);
  if (k < 0 || v < 0) return false;
  const Dims *ks = ctx.shape(k), *vs = ctx.shape(v);
  if ((*ks)[1] != (*vs)[1]) return false;
  fused.replaced.clear();
  fused.inputs[1] = k;
  fused.inputs[2] = v;
  return rw::replace(ctx, m, std::move(fused));
}

std::vector<rw::Rule> make_rules() {
  const Pat qk =
      op("MatMul", {scaled(any("q"), "q_scale"),
                    scaled(op("Transpose", {scaled(any("k"), "k_scale")}).as("kt"), "kt_scale")})
          .as("qk");
  // The scores times scalars, then perhaps by a constant per head (Swin-V2).
  const Pat s = either(
      {op("Mul", {scaled(qk, "s_scale"), rw::constant("head_scale")}).commutative().as("head_mul"),
       scaled(qk, "s_scale")});
  // Swin's shifted windows: a view as [B, W, H, N, N], a constant mask added, the view back.
  const Pat windowed =
      op("Reshape",
         {op("Add", {op("Reshape", {either({op("Add", {s, any("mask")}).commutative(), s}), any()})
                         .as("window_split"),
                     rw::constant("window_mask")})
              .commutative()
              .as("window_add"),
          any()})
          .as("window_merge");
  const Pat masked = either({windowed, op("Add", {s, any("mask")}).commutative().as("add"),
                             op("Where", {any("cond"), s, scalar("fill")}).as("where"),
                             op("Where", {any("cond"), scalar("fill"), s}).as("where_inv"), s});
  const Pat softmax = op("Softmax", {masked}).as("softmax").out("p").when(softmax_over_last_axis);
  const Pat probs =
      either({op("Where", {op("IsNaN", {softmax}), scalar_eq(0), any("p")}), softmax});
  return {{"attention", op("MatMul", {probs, any("v")}).as("pv"), fuse},
          {"grouped_query", op("Attention", {any("q"), any("k"), any("v")}), grouped_query},
          {"grouped_query_masked", op("Attention", {any("q"), any("k"), any("v"), any("mask")}),
           grouped_query}};
}

}  // namespace

Status fuse_attention(ir::Graph* g, const SupportsFn& supports) {
  static const std::vector<rw::Rule> rules = make_rules();
  return rw::apply(g, rules, supports).status();
}

Status fuse_attention(BuildState& s) {
  if (s.backend.device() == Device::kCUDA &&
      s.config.precision().reduced_float() == DType::kFloat32) {
    return ok_status();
  }
  return fuse_attention(&s.graph, backend_supports(s));
}

}  // namespace kiln::builder
