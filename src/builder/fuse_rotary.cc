// Pass fuse_rotary: rotary position embeddings as transformers' apply_rotary_pos_emb writes them
// and both exporters keep them,
//   y = x * cos + rotate_half(x) * sin,   rotate_half(x) = Concat(-x[..., D/2:], x[..., :D/2])
// for x [B, H, S, D] and cos, sin [b, 1, S, D] (b = 1 or B), become one ONNX RotaryEmbedding
// (opset 23), one kernel where the ops ran as two slices, a negation, a concatenation and a fused
// multiply-add (a Llama-style decoder: 0.07 ms a layer for Q and K at batch 32, and 0.23 ms of
// slice and concat copies in all, on an H200). RotaryEmbedding's caches hold D/2 angles: the rule
// takes cos and sin only where their two halves are equal by construction (Cos or Sin of
// Concat(f, f), through Unsqueeze, Cast and scalar Mul/Div, as transformers' rotary embedding
// computes them) or in their data (a constant). The caches are cos[..., :D/2] viewed as [b, S,
// D/2] (b = 1 serves every batch row). Where x is split into heads by Transpose(z, [0, 2, 1, 3])
// of z [B, S, H, D], as Q and K always are, the node rotates z viewed as [B, S, H*D] (the op's 3-D
// form) and the heads are split after it: fuse_attention then finds Q, K and V each split from a
// [B, S, H*D] tensor and reads them in place (a Llama-style decoder's 16 head transposes at batch
// 32, 0.15 ms on an H200, went so). On every device (the CPU then packs the attention too: a
// llama_tiny engine went from 118 layers to 92).
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

// The ints of a constant, or nullopt.
std::optional<std::vector<int64_t>> ints_of(const Context& ctx, int v) {
  if (v < 0 || !ctx.value(v).constant) return std::nullopt;
  const Tensor& t = *ctx.value(v).constant;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.int_at(i));
  return out;
}

// Slice node n takes x[..., from:to] along the last axis of a rank-`rank` x (step 1), `to` clamped.
bool slices_last_axis(const Context& ctx, int n, int64_t rank, int64_t d, int64_t from,
                      int64_t to) {
  const ir::Node& s = ctx.node(n);
  auto starts = ints_of(ctx, s.inputs[1]), ends = ints_of(ctx, s.inputs[2]);
  auto axes = s.inputs.size() > 3 && s.inputs[3] >= 0 ? ints_of(ctx, s.inputs[3])
                                                      : std::vector<int64_t>{rank - 1};
  auto steps =
      s.inputs.size() > 4 && s.inputs[4] >= 0 ? ints_of(ctx, s.inputs[4]) : std::vector<int64_t>{1};
  if (!starts || !ends || !axes || !steps || starts->size() != 1 || ends->size() != 1 ||
      axes->size() != 1 || steps->size() != 1 || (*steps)[0] != 1) {
    return false;
  }
  const int64_t axis = (*axes)[0] < 0 ? (*axes)[0] + rank : (*axes)[0];
  const int64_t b = (*starts)[0] < 0 ? (*starts)[0] + d : (*starts)[0];
  const int64_t e = std::min((*ends)[0] < 0 ? (*ends)[0] + d : (*ends)[0], d);
  return axis == rank - 1 && b == from && e == to;
}

// Whether v's two halves along its last axis are equal by construction or in its data.
bool equal_halves(const Context& ctx, int v, int depth = 0) {
  if (v < 0 || depth > 16) return false;
  const ir::Value& val = ctx.value(v);
  if (!val.shape || val.shape->empty() || !val.shape->back().is_const() ||
      val.shape->back().value() % 2)
    return false;
  const int64_t d = val.shape->back().value();
  if (val.constant) {
    const Tensor& t = *val.constant;
    if (!is_float(t.dtype())) return false;
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (i % d < d / 2 && t.float_at(i) != t.float_at(i + d / 2)) return false;
    }
    return true;
  }
  const int p = val.producer;
  if (p < 0) return false;
  const ir::Node& n = ctx.node(p);
  if (!n.domain.empty() || n.inputs.empty()) return false;
  const std::string& t = n.op_type;
  if (t == "Cos" || t == "Sin" || t == "Cast" || t == "Identity" || t == "Neg")
    return equal_halves(ctx, n.inputs[0], depth + 1);
  if (t == "Unsqueeze") {
    // Axes that leave the last axis last.
    auto axes = n.inputs.size() > 1 ? ints_of(ctx, n.inputs[1]) : std::nullopt;
    const int64_t rank = int64_t(val.shape->size());
    if (!axes) return false;
    for (int64_t a : *axes) {
      if (a == -1 || a == rank - 1) return false;
    }
    return equal_halves(ctx, n.inputs[0], depth + 1);
  }
  if ((t == "Mul" || t == "Div") && n.inputs.size() == 2) {
    if (ctx.scalar(n.inputs[1])) return equal_halves(ctx, n.inputs[0], depth + 1);
    if (t == "Mul" && ctx.scalar(n.inputs[0])) return equal_halves(ctx, n.inputs[1], depth + 1);
    return false;
  }
  if (t == "Concat" && n.inputs.size() == 2 && n.inputs[0] == n.inputs[1]) {
    auto axis = n.attrs.get_int("axis", 0);
    const int64_t rank = int64_t(val.shape->size());
    return axis.ok() && (*axis == -1 || *axis == rank - 1);
  }
  return false;
}

Pat slice_of(Pat x, const char* name) {
  return either({op("Slice", {x, any(), any()}).as(name),
                 op("Slice", {x, any(), any(), rw::optional()}).as(name),
                 op("Slice", {x, any(), any(), rw::optional(), rw::optional()}).as(name)});
}

// The [B, S, H, D] tensor that x [B, H, S, D] is Transpose(., [0, 2, 1, 3]) of, or nullopt.
std::optional<int> head_split_input(const Context& ctx, int x) {
  const int p = ctx.value(x).producer;
  if (p < 0 || !is_onnx(ctx.node(p), "Transpose")) return std::nullopt;
  if (perm_of(*ctx.graph, ctx.node(p)) != std::vector<int64_t>{0, 2, 1, 3}) return std::nullopt;
  const int z = ctx.node(p).inputs[0];
  const Dims *zs = ctx.shape(z), *xs = ctx.shape(x);
  if (!zs || !xs || zs->size() != 4 || (*zs)[1] != (*xs)[2] || (*zs)[2] != (*xs)[1])
    return std::nullopt;
  return z;
}

StatusOr<bool> fuse(Context& ctx, const Match& m) {
  ir::Graph* g = ctx.graph;
  const int x = m.value("x"), cos = m.value("cos"), sin = m.value("sin");
  const int y = ctx.node(m.matched[0]).outputs[0];
  const Dims *xs = ctx.shape(x), *cs = ctx.shape(cos), *ss = ctx.shape(sin), *ys = ctx.shape(y);
  if (!xs || !cs || !ss || !ys || xs->size() != 4 || *ys != *xs || *cs != *ss || cs->size() != 4)
    return false;
  if (!(*xs)[1].is_const() || !(*xs)[3].is_const() || (*xs)[3].value() % 2) return false;
  const int64_t h = (*xs)[1].value(), d = (*xs)[3].value(), half = d / 2;
  // cos, sin: [b, 1, S, D], b = 1 or x's batch.
  const bool shared = (*cs)[0] == Dim(1);
  if (!(shared || (*cs)[0] == (*xs)[0]) || (*cs)[1] != Dim(1) || (*cs)[2] != (*xs)[2] ||
      (*cs)[3] != (*xs)[3])
    return false;
  const DType t = ctx.value(x).dtype;
  if (!is_float(t) || ctx.value(cos).dtype != t || ctx.value(sin).dtype != t) return false;
  if (!slices_last_axis(ctx, m.node("lo"), 4, d, 0, half) ||
      !slices_last_axis(ctx, m.node("hi"), 4, d, half, d))
    return false;
  auto axis = ctx.node(m.node("rot")).attrs.get_int("axis", 0);
  if (!axis.ok() || (*axis != -1 && *axis != 3)) return false;
  if (!equal_halves(ctx, cos) || !equal_halves(ctx, sin)) return false;

  // Copies: adding values moves the graph's values.
  const Dims x_shape = *xs, c_shape = *cs;
  const std::string base = ctx.node(m.matched[0]).name + "_rotary";
  std::vector<ir::Node> pre;
  auto i64 = [&](const std::string& name, std::vector<int64_t> v) {
    const int64_t n = int64_t(v.size());
    return add_constant(g, base + name, Tensor::from_vector<int64_t>(DType::kInt64, {n}, v));
  };
  // The caches of one cos or sin, made once for every rotation reading it (Q's and K's).
  auto cache = [&](int from, const char* what) {
    const std::string name = ctx.value(from).name + "_rotary_cache";
    if (const int found = g->find_value(name); found >= 0 && ctx.value(found).producer >= 0)
      return found;
    const int sliced = ir::add_unique_value(g, base + "_" + what + "_half", t,
                                            Dims{c_shape[0], Dim(1), c_shape[2], Dim(half)});
    pre.push_back(rw::make_node(*g, "Slice", base + "_" + what + "_slice",
                                {from, i64("_zero", {0}), i64("_half", {half}), i64("_last", {3})},
                                {sliced}));
    const int viewed = ir::add_unique_value(g, name, t, Dims{c_shape[0], c_shape[2], Dim(half)});
    pre.push_back(rw::make_node(*g, "Reshape", base + "_" + what + "_view",
                                {sliced, i64("_cache_shape", {shared ? 1 : 0, -1, half})},
                                {viewed}));
    return viewed;
  };
  const int cc = cache(cos, "cos"), sc = cache(sin, "sin");
  const std::string name = ctx.node(m.matched[0]).name;
  // x split into heads from [B, S, H, D] (Transpose [0, 2, 1, 3], as every attention does): the
  // node rotates that tensor as [B, S, H*D] (RotaryEmbedding's 3-D form) and the heads are split
  // after it, so that fuse_attention finds Q and K split as V is and reads all three in place.
  const std::optional<int> z = head_split_input(ctx, x);
  if (!z) {
    ir::Node fused = rw::make_node(*g, "RotaryEmbedding", name, {x, cc, sc}, {y});
    fused.opset = 23;
    fused.name = name;
    return rw::replace_with(ctx, m.matched, std::move(pre), std::move(fused));
  }
  const Dim& s = x_shape[2];
  const Dim hd = Dim(h * d);
  const int flat = ir::add_unique_value(g, base + "_in", t, Dims{x_shape[0], s, hd});
  pre.push_back(rw::make_node(*g, "Reshape", base + "_in_view",
                              {*z, i64("_flat_shape", {0, 0, h * d})}, {flat}));
  const int rotated = ir::add_unique_value(g, base + "_out", t, Dims{x_shape[0], s, hd});
  ir::Node rope = rw::make_node(*g, "RotaryEmbedding", name, {flat, cc, sc}, {rotated});
  rope.opset = 23;
  set_int(&rope, "num_heads", h);
  pre.push_back(std::move(rope));
  const int heads =
      ir::add_unique_value(g, base + "_heads", t, Dims{x_shape[0], s, Dim(h), Dim(d)});
  pre.push_back(rw::make_node(*g, "Reshape", base + "_heads_view",
                              {rotated, i64("_heads_shape", {0, 0, h, d})}, {heads}));
  ir::Node back = rw::make_node(*g, "Transpose", base + "_split", {heads}, {y});
  set_ints(&back, "perm", {0, 2, 1, 3});
  return rw::replace_with(ctx, m.matched, std::move(pre), std::move(back));
}

std::vector<rw::Rule> make_rules() {
  const Pat rotated =
      op("Concat", {op("Neg", {slice_of(any("x"), "hi")}), slice_of(any("x"), "lo")}).as("rot");
  const Pat root = op("Add", {op("Mul", {any("x"), any("cos")}).commutative(),
                              op("Mul", {rotated, any("sin")}).commutative()})
                       .commutative();
  return {{"rotary_embedding", root, fuse}};
}

}  // namespace

Status fuse_rotary(ir::Graph* g, const SupportsFn& supports) {
  static const std::vector<rw::Rule> rules = make_rules();
  return rw::apply(g, rules, supports).status();
}

Status fuse_rotary(BuildState& s) { return fuse_rotary(&s.graph, backend_supports(s)); }

}  // namespace kiln::builder
