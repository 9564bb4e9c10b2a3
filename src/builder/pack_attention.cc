// Pass pack_attention: an Attention node whose Q, K and V are views of 3-D tensors [X0, X1, N]
// (heads side by side on the last axis), and whose output is merged back into that layout,
// becomes a kiln::PackedAttention (ops/kiln_ops.cc) that reads those tensors in place and writes
// the merged output: the views between, and the copies each of them is at run time, go.
//
// nn.MultiheadAttention as exported (torchvision's ViT) is the case it was made for. One packed
// projection [S, B, 3E] is split by Reshape, Unsqueeze, Transpose, Squeeze and three Gathers,
// then each third by Reshape [S, B*H, D], Transpose and Reshape into [B, H, S, D] heads, and the
// output is permuted back to [S, B, H, D]: at batch 64 those copies took 210 us of the 770 us of
// each encoder layer. GPT-2's Split of a [B, S, 3E] projection is the same in batch-first form.
//
// How: each of Q, K and V is traced up through view ops (Reshape, Squeeze, Unsqueeze, Flatten,
// Transpose, Identity, Gather of a constant index, Slice with constant bounds, Split) to a base
// tensor, and the view is computed as strides of that base, symbolically (ir::Dim), so it holds
// for every shape of the profile. A dim merged from parts of unequal stride (the [S, B*H, D] step
// above) is kept as its parts until a later Reshape splits it again. The views must land on
// PackedAttention's layout: head dim stride 1, heads one head size apart from a constant offset,
// batch and sequence the base's first two dims (either order, the same for Q, K, V and Y).
//
// BERT's Q, K and V, three GEMMs of one input read by an Attention in its 3-D form, become one
// GEMM whose output a PackedAttention reads at three offsets (merge_projections_at below).
//
// Rules on the rewriter (rewriter.h), each rooted at an Attention (or, for the batch-first step,
// a PackedAttention) whose rewrite traces the views from it. CPU builds, and CUDA builds with
// --fp16 or --bf16 (as fuse_attention; a float32 CUDA build has no Attention nodes of its making),
// after fuse_attention, before assign_precision, which gives the node the reduced type.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <iterator>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "builder/rewriter.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

using ir::Dim;
using Dims = std::vector<Dim>;

// One dim of a view: its parts, outermost first, each an extent and an element stride of the
// base. A dim of one part is a plain strided dim.
struct Part {
  Dim extent, stride;
};
struct View {
  std::vector<std::vector<Part>> dims;
  Dim offset = Dim(0);
};

bool is_one(const Dim& d) { return d.is_const() && d.value() == 1; }

View contiguous(const Dims& shape) {
  View v;
  v.dims.resize(shape.size());
  Dim stride(1);
  for (size_t i = shape.size(); i-- > 0;) {
    v.dims[i] = {Part{shape[i], stride}};
    stride = stride * shape[i];
  }
  return v;
}

// Orders products of symbols: each symbol takes a distinct prime, so a dim's value there says
// which of two products is larger for the grouping below. Every equality it leads to is checked
// symbolically; a wrong guess only makes the trace fail.
class Sampler {
 public:
  std::optional<int64_t> at(const Dim& d) {
    std::set<std::string> symbols;
    d.collect_symbols(&symbols);
    for (const std::string& s : symbols) {
      if (values_.count(s)) continue;
      if (next_ >= std::size(kPrimes)) return std::nullopt;
      values_[s] = kPrimes[next_++];
    }
    return d.eval(values_);
  }

 private:
  static constexpr int64_t kPrimes[] = {1009, 1013, 1019, 1021, 1031, 1033, 1039, 1049};
  ir::SymbolValues values_;
  size_t next_ = 0;
};

// Adjacent parts (e1, s1), (e2, s2) with s1 == e2 * s2 are one part (e1 * e2, s2).
std::vector<Part> merged(std::vector<Part> parts) {
  std::vector<Part> out;
  for (Part& p : parts) {
    if (is_one(p.extent)) continue;
    if (!out.empty() && out.back().stride == p.extent * p.stride) {
      out.back() = Part{out.back().extent * p.extent, p.stride};
    } else {
      out.push_back(std::move(p));
    }
  }
  if (out.empty()) out.push_back(Part{Dim(1), Dim(0)});
  return out;
}

// The view reshaped to `shape` (row-major, as Reshape, Squeeze, Unsqueeze and Flatten).
std::optional<View> reshape(const View& in, const Dims& shape, Sampler& sm) {
  std::deque<Part> parts;
  for (const auto& d : in.dims) {
    for (const Part& p : d) {
      if (!is_one(p.extent)) parts.push_back(p);
    }
  }
  View out;
  out.offset = in.offset;
  for (const Dim& e : shape) {
    std::vector<Part> group;
    Dim prod(1);
    while (prod != e) {
      if (parts.empty()) return std::nullopt;
      const Part a = parts.front();
      auto taken = sm.at(prod * a.extent), want = sm.at(e), have = sm.at(prod);
      if (!taken || !want || !have || *have <= 0) return std::nullopt;
      if (*taken <= *want) {
        group.push_back(a);
        prod = prod * a.extent;
        parts.pop_front();
        continue;
      }
      // The part is split: its outer factor f completes e, a constant here.
      if (*want % *have != 0) return std::nullopt;
      const Dim f(*want / *have);
      const Dim g = Dim::floor_div(a.extent, f);
      if (f * prod != e || g * f != a.extent) return std::nullopt;
      group.push_back(Part{f, g * a.stride});
      parts.front() = Part{g, a.stride};
      prod = e;
    }
    out.dims.push_back(merged(std::move(group)));
  }
  if (!parts.empty()) return std::nullopt;
  return out;
}

// A plain dim of the view and its constant extent (for index arithmetic), or nullopt.
std::optional<int64_t> plain_extent(const View& v, size_t axis) {
  if (axis >= v.dims.size() || v.dims[axis].size() != 1 || !v.dims[axis][0].extent.is_const()) {
    return std::nullopt;
  }
  return v.dims[axis][0].extent.value();
}

std::optional<size_t> axis_of(int64_t axis, size_t rank) {
  if (axis < -int64_t(rank) || axis >= int64_t(rank)) return std::nullopt;
  return size_t(axis < 0 ? axis + int64_t(rank) : axis);
}

// Whether node n is a view op this pass sees through (its data is input 0).
bool is_view_op(const ir::Node& n) {
  for (const char* op : {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Identity",
                         "Gather", "Slice", "Split"}) {
    if (is_onnx(n, op)) return true;
  }
  return false;
}

// The view of node n's output `out` given the view of its input 0.
std::optional<View> apply(const ir::Graph& g, const ir::Node& n, int out, const View& in,
                          Sampler& sm) {
  const auto& shape = g.values[size_t(out)].shape;
  if (!shape) return std::nullopt;
  const size_t rank = in.dims.size();
  if (is_onnx(n, "Reshape") || is_onnx(n, "Squeeze") || is_onnx(n, "Unsqueeze") ||
      is_onnx(n, "Flatten") || is_onnx(n, "Identity")) {
    return reshape(in, *shape, sm);
  }
  if (is_onnx(n, "Transpose")) {
    auto perm = perm_of(g, n);
    if (!perm || perm->size() != rank) return std::nullopt;
    View v;
    v.offset = in.offset;
    for (int64_t p : *perm) {
      if (p < 0 || p >= int64_t(rank)) return std::nullopt;
      v.dims.push_back(in.dims[size_t(p)]);
    }
    return v;
  }
  if (is_onnx(n, "Gather")) {
    auto idx = ints_of(g, n, 1);
    auto ax = n.attrs.get_int("axis", 0);
    if (!idx || idx->size() != 1 || !ax.ok()) return std::nullopt;
    auto axis = axis_of(*ax, rank);
    if (!axis) return std::nullopt;
    auto extent = plain_extent(in, *axis);
    const int64_t i = (*idx)[0] < 0 && extent ? (*idx)[0] + *extent : (*idx)[0];
    if (!extent || i < 0 || i >= *extent) return std::nullopt;
    View v = in;
    v.offset = v.offset + Dim(i) * in.dims[*axis][0].stride;
    const auto& ishape = g.values[size_t(n.inputs[1])].shape;
    if (!ishape) return std::nullopt;
    if (ishape->empty()) {
      v.dims.erase(v.dims.begin() + std::ptrdiff_t(*axis));
    } else {
      v.dims[*axis] = {Part{Dim(1), Dim(0)}};
      if (ishape->size() != 1) return std::nullopt;
    }
    return v;
  }
  if (is_onnx(n, "Slice")) {
    auto starts = ints_of(g, n, 1);
    std::optional<std::vector<int64_t>> axes =
        n.inputs.size() > 3 && n.inputs[3] >= 0 ? ints_of(g, n, 3) : std::nullopt;
    std::optional<std::vector<int64_t>> steps =
        n.inputs.size() > 4 && n.inputs[4] >= 0 ? ints_of(g, n, 4) : std::nullopt;
    if (!starts || (n.inputs.size() > 3 && n.inputs[3] >= 0 && !axes) ||
        (n.inputs.size() > 4 && n.inputs[4] >= 0 && !steps) || shape->size() != rank) {
      return std::nullopt;
    }
    View v = in;
    for (size_t k = 0; k < starts->size(); ++k) {
      auto axis = axis_of(axes ? (*axes)[k] : int64_t(k), rank);
      const int64_t step = steps ? (*steps)[k] : 1;
      if (!axis || step <= 0 || (axes && axes->size() != starts->size()) ||
          (steps && steps->size() != starts->size())) {
        return std::nullopt;
      }
      auto extent = plain_extent(in, *axis);
      if (!extent) return std::nullopt;
      const int64_t start =
          std::clamp((*starts)[k] < 0 ? (*starts)[k] + *extent : (*starts)[k], int64_t(0), *extent);
      const Part& p = in.dims[*axis][0];
      v.offset = v.offset + Dim(start) * p.stride;
      v.dims[*axis] = {Part{(*shape)[*axis], p.stride * Dim(step)}};
    }
    return v;
  }
  if (is_onnx(n, "Split")) {
    auto ax = n.attrs.get_int("axis", 0);
    if (!ax.ok()) return std::nullopt;
    auto axis = axis_of(*ax, rank);
    if (!axis || in.dims[*axis].size() != 1) return std::nullopt;
    Dim before(0);
    for (int o : n.outputs) {
      if (o == out) break;
      const auto& os = o >= 0 ? g.values[size_t(o)].shape : std::nullopt;
      if (!os || os->size() != rank) return std::nullopt;
      before = before + (*os)[*axis];
    }
    View v = in;
    v.offset = v.offset + before * in.dims[*axis][0].stride;
    v.dims[*axis] = {Part{(*shape)[*axis], in.dims[*axis][0].stride}};
    return v;
  }
  return std::nullopt;
}

// Where an Attention operand's [B, heads, seq, head] elements lie in a base tensor [X0, X1, N].
struct Operand {
  int base = -1;
  int64_t offset = 0, heads = 0, head = 0;
  bool seq_first = false;
};

// The [B, heads, seq, head] view `v` of `base` as an Operand, when it has the packed layout.
std::optional<Operand> as_operand(const ir::Graph& g, int base, const View& v) {
  const auto& bs = g.values[size_t(base)].shape;
  if (!bs || bs->size() != 3 || !(*bs)[2].is_const() || v.dims.size() != 4) return std::nullopt;
  for (const auto& d : v.dims) {
    if (d.size() != 1) return std::nullopt;
  }
  const Part &b = v.dims[0][0], &h = v.dims[1][0], &s = v.dims[2][0], &d = v.dims[3][0];
  const Dim& n = (*bs)[2];
  const Dim& row1 = n;  // the stride of dim 1 in rows of n
  const Dim row0 = (*bs)[1] * n;
  if (!d.extent.is_const() || !h.extent.is_const() || !v.offset.is_const()) return std::nullopt;
  if (!is_one(d.extent) && d.stride != Dim(1)) return std::nullopt;
  if (!is_one(h.extent) && h.stride != d.extent) return std::nullopt;
  Operand op{base, v.offset.value(), h.extent.value(), d.extent.value(), false};
  if (op.offset < 0 || op.offset + op.heads * op.head > n.value()) return std::nullopt;
  auto fits = [&](const Part& p, const Dim& extent, const Dim& stride) {
    return p.extent == extent && (is_one(p.extent) || p.stride == stride);
  };
  if (fits(b, (*bs)[0], row0) && fits(s, (*bs)[1], row1)) return op;
  if (fits(b, (*bs)[1], row1) && fits(s, (*bs)[0], row0)) {
    op.seq_first = true;
    return op;
  }
  return std::nullopt;
}

// Attention operand `v` ([B, heads, seq, head], or 3-D [B, seq, heads*head] with `heads`) traced
// up through view ops to the farthest base whose view has the packed layout.
std::optional<Operand> trace(const ir::Graph& g, int v, int64_t heads) {
  const auto& vs = g.values[size_t(v)].shape;
  if (!vs || (vs->size() != 3 && vs->size() != 4)) return std::nullopt;
  // The chain of view nodes above v, nearest first, and the value each reads.
  std::vector<std::pair<int, int>> chain;  // (node, its output on the path)
  int x = v;
  while (chain.size() < 64) {
    const int p = g.values[size_t(x)].producer;
    if (p < 0 || !is_view_op(g.nodes[size_t(p)]) || g.nodes[size_t(p)].inputs.empty()) break;
    chain.emplace_back(p, x);
    x = g.nodes[size_t(p)].inputs[0];
  }
  for (size_t top = chain.size() + 1; top-- > 0;) {
    const int base = top == 0 ? v : g.nodes[size_t(chain[top - 1].first)].inputs[0];
    const auto& bs = g.values[size_t(base)].shape;
    if (!bs) continue;
    Sampler sm;
    std::optional<View> view = contiguous(*bs);
    for (size_t k = top; k-- > 0 && view;) {
      view = apply(g, g.nodes[size_t(chain[k].first)], chain[k].second, *view, sm);
    }
    if (!view) continue;
    if (vs->size() == 3) {  // [B, S, H*D] -> [B, H, S, D]
      if (heads <= 0 || !(*vs)[2].is_const() || (*vs)[2].value() % heads != 0) return std::nullopt;
      view = reshape(*view, {(*vs)[0], (*vs)[1], Dim(heads), Dim((*vs)[2].value() / heads)}, sm);
      if (!view) continue;
      std::swap(view->dims[1], view->dims[2]);
    }
    if (auto op = as_operand(g, base, *view)) return op;
  }
  return std::nullopt;
}

// An ONNX Attention these rewrites take: Q, K, V and an optional mask, one output, and no
// attribute beyond the scale, causality and head counts.
bool plain_attention(const ir::Node& att) {
  if (!is_onnx(att, "Attention") || att.inputs.size() < 3 || att.inputs.size() > 4 ||
      att.outputs.size() != 1) {
    return false;
  }
  for (const auto& [name, a] : att.attrs.all()) {
    if (name != "scale" && name != "is_causal" && name != "q_num_heads" && name != "kv_num_heads")
      return false;
  }
  return true;
}

// The Attention's scale: its attribute, else 1/sqrt(head size); nullopt when unreadable.
std::optional<float> scale_of(const ir::Node& att, int64_t head) {
  if (!att.attrs.has("scale")) return 1.f / std::sqrt(float(head));
  auto s = att.attrs.get_float("scale", std::nullopt);
  if (!s.ok()) return std::nullopt;
  return *s;
}

StatusOr<bool> pack_at(ir::Graph* g, int an, const SupportsFn& supports) {
  const ir::Node& att = g->nodes[size_t(an)];
  if (!plain_attention(att)) return false;
  const int y = att.outputs[0];
  const auto& ys = g->values[size_t(y)].shape;
  if (!ys) return false;
  auto qh = att.attrs.get_int("q_num_heads", 0), kh = att.attrs.get_int("kv_num_heads", 0);
  auto causal = att.attrs.get_int("is_causal", 0);
  if (!qh.ok() || !kh.ok() || !causal.ok()) return false;
  auto q = trace(*g, att.inputs[0], *qh), k = trace(*g, att.inputs[1], *kh),
       v = trace(*g, att.inputs[2], *kh);
  if (!q || !k || !v || q->seq_first != k->seq_first || q->seq_first != v->seq_first ||
      k->heads != v->heads || q->head != k->head || k->heads <= 0 || q->heads % k->heads != 0) {
    return false;
  }
  // Y: 3-D [B, S, H*Dv] is the batch-first layout; 4-D [B, H, S, Dv] must be merged by its only
  // reader, a Transpose to [B, S, H, Dv] or [S, B, H, Dv].
  std::vector<int> matched = {an};
  int out = y, out_rank = 3;
  bool out_seq_first = false;
  if (ys->size() == 4) {
    const int t = sole_reader(*g, y);
    if (t < 0 || !is_onnx(g->nodes[size_t(t)], "Transpose")) return false;
    auto perm = perm_of(*g, g->nodes[size_t(t)]);
    if (perm == std::vector<int64_t>{2, 0, 1, 3}) {
      out_seq_first = true;
    } else if (perm != std::vector<int64_t>{0, 2, 1, 3}) {
      return false;
    }
    matched.push_back(t);
    out = g->nodes[size_t(t)].outputs[0];
    out_rank = 4;
  }
  if (out_seq_first != q->seq_first) return false;
  // Nothing to gain where every operand is the node's own input and Y is already merged.
  if (q->base == att.inputs[0] && k->base == att.inputs[1] && v->base == att.inputs[2] &&
      out == y) {
    return false;
  }
  const std::optional<float> scale = scale_of(att, q->head);
  if (!scale) return false;
  ir::Node fused;
  fused.name = att.name;
  fused.domain = "kiln";
  fused.op_type = "PackedAttention";
  fused.opset = 1;
  fused.inputs = {q->base, k->base, v->base};
  if (att.inputs.size() > 3 && att.inputs[3] >= 0) fused.inputs.push_back(att.inputs[3]);
  fused.outputs = {out};
  set_int(&fused, "q_num_heads", q->heads);
  set_int(&fused, "kv_num_heads", k->heads);
  set_int(&fused, "head_size", q->head);
  set_int(&fused, "v_head_size", v->head);
  set_int(&fused, "q_offset", q->offset);
  set_int(&fused, "k_offset", k->offset);
  set_int(&fused, "v_offset", v->offset);
  set_int(&fused, "seq_first", q->seq_first ? 1 : 0);
  set_float(&fused, "scale", *scale);
  if (*causal != 0) set_int(&fused, "is_causal", 1);
  if (out_rank == 4) set_int(&fused, "output_rank", 4);
  return replace_if_supported(g, matched, std::move(fused), supports);
}

// ---- nn.MultiheadAttention's sequence-first tensors made batch first ----
//
// After packing, torchvision's encoder layer still transposes twice: its input [B, S, E] to
// [S, B, E] before the QKV projection, and the output projection's [S, B, E] back after it
//   T = Transpose(X, [1, 0, 2]); P = MatMulBias(T, W, b)            [S, B, 3E]
//   Y = PackedAttention(P, P, P) {seq_first=1, output_rank=4}        [S, B, H, D]
//   Z = Transpose(Reshape(Gemm(Reshape(Y, [S*B, E]), Wo, bo), [S, B, E]), [1, 0, 2])
//   [R = Add(Z, residual)]
// (readers of these tensors' shapes alone, folded by shape inference, aside)
// Both projections act on rows alone, so they commute with the row permutation: the same layer is
//   P = MatMulBias(X, W, b)                                          [B, S, 3E]
//   Y = PackedAttention(P, P, P) {seq_first=0}                       [B, S, E]
//   R = MatMulBias(Y, Wo^T, bo, residual)                            [B, S, E]
// with the two transposes gone and the residual added in the output projection's GEMM.

// The one running reader of v when it is the ONNX op `op` and v is no engine output; else -1.
int sole_onnx_reader(const ir::Graph& g, int v, const char* op) {
  if (is_graph_output(g, v)) return -1;
  const std::vector<int> r = running_readers(g, v);
  return r.size() == 1 && is_onnx(g.nodes[size_t(r[0])], op) ? r[0] : -1;
}

bool swaps_first_two(const ir::Graph& g, int node) {
  return node >= 0 && perm_of(g, g.nodes[size_t(node)]) == std::vector<int64_t>{1, 0, 2};
}

// An int or float attribute, or `bad` where it is present and of another type.
int64_t int_attr(const ir::Node& n, const char* name, int64_t def, int64_t bad) {
  auto v = n.attrs.get_int(name, def);
  return v.ok() ? *v : bad;
}
float float_attr(const ir::Node& n, const char* name, float def, float bad) {
  auto v = n.attrs.get_float(name, def);
  return v.ok() ? *v : bad;
}

StatusOr<bool> batch_first_at(ir::Graph* g, int an, const SupportsFn& supports) {
  const ir::Node& att = g->nodes[size_t(an)];
  if (att.domain != "kiln" || att.op_type != "PackedAttention" || att.inputs.size() < 3)
    return false;
  if (int_attr(att, "seq_first", 0, 0) != 1 || int_attr(att, "output_rank", 3, 3) != 4 ||
      att.inputs[0] != att.inputs[1] || att.inputs[0] != att.inputs[2]) {
    return false;
  }
  const int p = att.inputs[0], y = att.outputs[0];
  if (is_graph_output(*g, p) || running_readers(*g, p) != std::vector<int>{an}) return false;
  // Input side: P = MatMulBias|MatMul(Transpose(X, [1, 0, 2]), constant 2-D W [, b]).
  const int m1 = g->values[size_t(p)].producer;
  if (m1 < 0) return false;
  const ir::Node& mm = g->nodes[size_t(m1)];
  const bool is_mmb = mm.domain == "kiln" && mm.op_type == "MatMulBias";
  if (!(is_mmb || is_onnx(mm, "MatMul")) || mm.inputs.size() < 2 ||
      (is_mmb && mm.inputs.size() > 3))
    return false;
  const ir::Value& w = g->values[size_t(mm.inputs[1])];
  if (!w.constant || !w.shape || w.shape->size() != 2) return false;
  const int t1 = g->values[size_t(mm.inputs[0])].producer;
  if (t1 < 0 || !is_onnx(g->nodes[size_t(t1)], "Transpose") || !swaps_first_two(*g, t1) ||
      running_readers(*g, mm.inputs[0]) != std::vector<int>{m1}) {
    return false;
  }
  const int x = g->nodes[size_t(t1)].inputs[0];
  const auto &xs = g->values[size_t(x)].shape, &ps = g->values[size_t(p)].shape;
  if (!xs || xs->size() != 3 || !ps || ps->size() != 3 || (*ps)[0] != (*xs)[1] ||
      (*ps)[1] != (*xs)[0])
    return false;
  // Output side: Reshape to [S*B, E], Gemm, Reshape to [S, B, E'], Transpose [1, 0, 2].
  const int r2 = sole_onnx_reader(*g, y, "Reshape");
  const int gm = r2 < 0 ? -1 : sole_onnx_reader(*g, g->nodes[size_t(r2)].outputs[0], "Gemm");
  const int r3 = gm < 0 ? -1 : sole_onnx_reader(*g, g->nodes[size_t(gm)].outputs[0], "Reshape");
  const int t2 = r3 < 0 ? -1 : sole_onnx_reader(*g, g->nodes[size_t(r3)].outputs[0], "Transpose");
  if (t2 < 0 || !swaps_first_two(*g, t2)) return false;
  const ir::Node& gemm = g->nodes[size_t(gm)];
  const auto& ys = g->values[size_t(y)].shape;
  const auto &r2s = g->values[size_t(g->nodes[size_t(r2)].outputs[0])].shape,
             &r3s = g->values[size_t(g->nodes[size_t(r3)].outputs[0])].shape;
  if (!ys || ys->size() != 4 || !r2s || r2s->size() != 2 || (*r2s)[1] != (*ys)[2] * (*ys)[3] ||
      !r3s || r3s->size() != 3 || (*r3s)[0] != (*xs)[1] || (*r3s)[1] != (*xs)[0]) {
    return false;
  }
  if (float_attr(gemm, "alpha", 1.f, 0.f) != 1.f || float_attr(gemm, "beta", 1.f, 0.f) != 1.f ||
      int_attr(gemm, "transA", 0, 1) != 0 || gemm.inputs.size() < 2) {
    return false;
  }
  const ir::Value& wo = g->values[size_t(gemm.inputs[1])];
  const int c = gemm.inputs.size() > 2 ? gemm.inputs[2] : -1;
  if (!wo.constant || !wo.shape || wo.shape->size() != 2) return false;
  if (c >= 0) {
    const auto& cs = g->values[size_t(c)].shape;
    if (!g->values[size_t(c)].constant || !cs || cs->size() != 1 || (*cs)[0] != (*r3s)[2])
      return false;
  }
  std::optional<Tensor> wt = *wo.constant;
  const int64_t trans_b = int_attr(gemm, "transB", 0, -1);
  if (trans_b < 0) return false;
  if (trans_b != 0) wt = transposed_2d(*wo.constant);
  if (!wt) return false;
  // The residual Add after it, when there is one. The Transpose (and the Add) are replaced; the
  // Reshape-Gemm-Reshape above, read by nothing that runs any more, go unless folded shape
  // arithmetic reads them (then they stay in the graph and never run).
  const int z = g->nodes[size_t(t2)].outputs[0];
  int out = z, residual = -1;
  std::vector<int> matched = {t2};
  if (const int add = sole_onnx_reader(*g, z, "Add");
      add >= 0 && g->nodes[size_t(add)].inputs.size() == 2) {
    const ir::Node& a = g->nodes[size_t(add)];
    const int other = a.inputs[0] == z ? a.inputs[1] : a.inputs[0];
    const ir::Value& ov = g->values[size_t(other)];
    if (other != z && !ov.constant && ov.shape && ov.shape == g->values[size_t(z)].shape &&
        ov.dtype == g->values[size_t(z)].dtype) {
      residual = other;
      out = a.outputs[0];
      matched.push_back(add);
    }
  }
  // Rewire: the projection reads X, the attention runs batch first and writes [B, S, H*Dv].
  ir::Graph saved = *g;
  ir::Node& m = g->nodes[size_t(m1)];
  m.inputs[0] = x;
  g->values[size_t(p)].shape = std::vector<Dim>{(*xs)[0], (*xs)[1], (*ps)[2]};
  ir::Node& a = g->nodes[size_t(an)];
  set_int(&a, "seq_first", 0);
  set_int(&a, "output_rank", 3);
  g->values[size_t(y)].shape = std::vector<Dim>{(*xs)[0], (*xs)[1], (*ys)[2] * (*ys)[3]};
  ir::Node fused;
  fused.name = g->nodes[size_t(gm)].name;
  fused.domain = "kiln";
  fused.op_type = "MatMulBias";
  fused.opset = 1;
  set_string(&fused, "activation", "none");
  const int wv = add_constant(g, g->values[size_t(gemm.inputs[1])].name + "_t", std::move(*wt));
  fused.inputs = {y, wv, c};
  if (residual >= 0) fused.inputs.push_back(residual);
  fused.outputs = {out};
  // It stands for the Reshape-Gemm-Reshape it leaves unread as well as for what it replaces.
  for (int k : {r2, gm, r3}) ir::add_replaced(&fused, g->nodes[size_t(k)]);
  if (replace_if_supported(g, matched, std::move(fused), supports)) return true;
  *g = std::move(saved);
  return false;
}

// ---- Q, K and V projections of one input as one GEMM ----
//
// BERT's attention as fuse_attention leaves it reads three projections of one input, each its own
// GEMM: Attention(MatMulBias(X, Wq, bq), MatMulBias(X, Wk, bk), MatMulBias(X, Wv, bv)), 3-D.
// One MatMulBias(X, [Wq Wk Wv], [bq bk bv]) computes all three at once (one launch, and a GEMM
// three times as wide, which runs closer to the tensor cores' peak), and a PackedAttention reads
// its output at three offsets. Each projection must be read by the attention alone, with no
// activation and no residual; the three then go (unread).

// Constant 2-D tensors [K, N_i] of one dtype side by side: [K, sum N_i].
std::optional<Tensor> concat_columns(const std::vector<const Tensor*>& parts) {
  const int64_t k = parts[0]->shape()[0];
  int64_t n = 0;
  for (const Tensor* t : parts) n += t->shape()[1];
  auto out = Tensor::zeros(parts[0]->dtype(), {k, n});
  if (!out.ok()) return std::nullopt;
  const size_t es = dtype_size(parts[0]->dtype());
  auto* dst = static_cast<unsigned char*>(out->data());
  for (int64_t r = 0; r < k; ++r) {
    for (const Tensor* t : parts) {
      const size_t row = size_t(t->shape()[1]) * es;
      std::memcpy(dst, static_cast<const unsigned char*>(t->data()) + size_t(r) * row, row);
      dst += row;
    }
  }
  return std::move(out).value();
}

StatusOr<bool> merge_projections_at(ir::Graph* g, int an, const SupportsFn& supports) {
  const ir::Node& att = g->nodes[size_t(an)];
  if (!plain_attention(att)) return false;
  auto qh = att.attrs.get_int("q_num_heads", 0), kh = att.attrs.get_int("kv_num_heads", 0);
  auto causal = att.attrs.get_int("is_causal", 0);
  if (!qh.ok() || !kh.ok() || !causal.ok() || *qh <= 0 || *kh <= 0 || *qh % *kh != 0) return false;
  const int y = att.outputs[0];
  const auto& ys = g->values[size_t(y)].shape;
  if (!ys || ys->size() != 3) return false;
  int x = -1;
  Dims xs;
  std::vector<int> proj;
  std::vector<const Tensor*> ws, bs;
  std::vector<int64_t> n;
  for (int i = 0; i < 3; ++i) {
    const int v = att.inputs[size_t(i)];
    if (v < 0 || std::count(att.inputs.begin(), att.inputs.begin() + 3, v) != 1 ||
        is_graph_output(*g, v) || running_readers(*g, v) != std::vector<int>{an}) {
      return false;
    }
    const int p = g->values[size_t(v)].producer;
    if (p < 0) return false;
    const ir::Node& mm = g->nodes[size_t(p)];
    if (mm.domain != "kiln" || mm.op_type != "MatMulBias" || mm.inputs.size() != 3 ||
        mm.inputs[2] < 0 || mm.attrs.all().size() != 1) {
      return false;
    }
    if (auto act = mm.attrs.get_string("activation", std::string()); !act.ok() || *act != "none")
      return false;
    const ir::Value &w = g->values[size_t(mm.inputs[1])], &b = g->values[size_t(mm.inputs[2])];
    const auto& vs = g->values[size_t(v)].shape;
    if (!w.constant || w.constant->rank() != 2 || !b.constant || b.constant->rank() != 1 ||
        b.constant->shape()[0] != w.constant->shape()[1] ||
        b.constant->dtype() != w.constant->dtype() || !vs || vs->size() != 3 ||
        !(*vs)[2].is_const() || (*vs)[2].value() != w.constant->shape()[1]) {
      return false;
    }
    if (i == 0) {
      x = mm.inputs[0];
      xs = *vs;
    } else if (mm.inputs[0] != x || w.constant->shape()[0] != ws[0]->shape()[0] ||
               w.constant->dtype() != ws[0]->dtype() || (*vs)[0] != xs[0] || (*vs)[1] != xs[1] ||
               g->values[size_t(v)].dtype != g->values[size_t(att.inputs[0])].dtype) {
      return false;
    }
    proj.push_back(p);
    ws.push_back(&*w.constant);
    bs.push_back(&*b.constant);
    n.push_back(w.constant->shape()[1]);
  }
  if (n[0] % *qh != 0 || n[1] % *kh != 0 || n[2] % *kh != 0 || n[0] / *qh != n[1] / *kh)
    return false;
  const std::optional<float> scale = scale_of(att, n[0] / *qh);
  if (!scale) return false;
  // The biases side by side are the columns of [1, N_i] rows.
  std::vector<Tensor> rows;
  for (const Tensor* b : bs)
    rows.push_back(Tensor::wrap(b->dtype(), {1, b->shape()[0]}, b->data(), nullptr));
  std::optional<Tensor> wcat = concat_columns(ws),
                        bcat = concat_columns({&rows[0], &rows[1], &rows[2]});
  if (!wcat || !bcat) return false;
  auto bias = Tensor::zeros(bcat->dtype(), {bcat->numel()});  // [1, N] as [N]
  if (!bias.ok()) return false;
  std::memcpy(bias->data(), bcat->data(), bcat->nbytes());
  const std::string att_name = att.name, qname = g->values[size_t(att.inputs[0])].name;
  const DType dtype = g->values[size_t(att.inputs[0])].dtype;

  ir::Graph saved = *g;
  const int64_t ntot = n[0] + n[1] + n[2];
  const std::string wname = g->values[size_t(g->nodes[size_t(proj[0])].inputs[1])].name + "_qkv";
  const int wv = add_constant(g, wname, std::move(*wcat));
  const int bv = add_constant(g, wname + "_bias", std::move(bias).value());
  const int pv = ir::add_unique_value(g, qname + "_qkv", dtype, Dims{xs[0], xs[1], Dim(ntot)});
  ir::Node gemm;
  gemm.name = ir::unique_node_name(*g, att_name + "_qkv_projection");
  gemm.domain = "kiln";
  gemm.op_type = "MatMulBias";
  gemm.opset = 1;
  set_string(&gemm, "activation", "none");
  gemm.inputs = {x, wv, bv};
  gemm.outputs = {pv};
  for (int p : proj) ir::add_replaced(&gemm, g->nodes[size_t(p)]);
  if (!node_supported(*g, gemm, supports)) {
    *g = std::move(saved);
    return false;
  }
  // On the edge from X to the first projection, which then reads P: it is unread once the
  // attention below is replaced, and pack_attention removes it with the other two.
  const int first = proj[0];
  if (!ir::insert_on_edge(g, x, std::move(gemm), std::span<const int>(&first, 1)).ok()) {
    *g = std::move(saved);
    return false;
  }
  const int at = g->values[size_t(y)].producer;
  const ir::Node& a = g->nodes[size_t(at)];
  ir::Node fused;
  fused.name = att_name;
  fused.domain = "kiln";
  fused.op_type = "PackedAttention";
  fused.opset = 1;
  fused.inputs = {pv, pv, pv};
  if (a.inputs.size() > 3 && a.inputs[3] >= 0) fused.inputs.push_back(a.inputs[3]);
  fused.outputs = {y};
  set_int(&fused, "q_num_heads", *qh);
  set_int(&fused, "kv_num_heads", *kh);
  set_int(&fused, "head_size", n[0] / *qh);
  set_int(&fused, "v_head_size", n[2] / *kh);
  set_int(&fused, "q_offset", 0);
  set_int(&fused, "k_offset", n[0]);
  set_int(&fused, "v_offset", n[0] + n[1]);
  set_int(&fused, "seq_first", 0);
  set_float(&fused, "scale", *scale);
  if (*causal != 0) set_int(&fused, "is_causal", 1);
  if (replace_if_supported(g, std::vector<int>{at}, std::move(fused), supports)) return true;
  *g = std::move(saved);
  return false;
}

// The rules, on the rewriter: at each Attention, its operands traced to the tensors they view (or
// its three projections merged); then, once the views those leave unread are gone (the rewriter
// removes them after a rule set), at each sequence-first PackedAttention.
std::vector<rw::Rule> pack_rules() {
  auto pack = [](rw::Context& ctx, const rw::Match& m) -> StatusOr<bool> {
    KILN_ASSIGN_OR_RETURN(bool packed, pack_at(ctx.graph, m.matched[0], *ctx.supports));
    if (packed) return true;
    return merge_projections_at(ctx.graph, m.matched[0], *ctx.supports);
  };
  return {{"pack_attention", rw::node_of("Attention"), pack}};
}

std::vector<rw::Rule> batch_first_rules() {
  auto batch_first = [](rw::Context& ctx, const rw::Match& m) -> StatusOr<bool> {
    return batch_first_at(ctx.graph, m.matched[0], *ctx.supports);
  };
  return {{"batch_first", rw::node_of("kiln::PackedAttention"), batch_first}};
}

}  // namespace

Status pack_attention(ir::Graph* g, const SupportsFn& supports) {
  static const std::vector<rw::Rule> pack = pack_rules(), batch_first = batch_first_rules();
  KILN_ASSIGN_OR_RETURN(int packed, rw::apply(g, pack, supports));
  if (packed > 0) KILN_RETURN_IF_ERROR(rw::apply(g, batch_first, supports).status());
  return ok_status();
}

Status pack_attention(BuildState& s) {
  if (s.backend.device() == Device::kCUDA &&
      s.config.precision().reduced_float() == DType::kFloat32) {
    return ok_status();
  }
  return pack_attention(&s.graph, backend_supports(s));
}

}  // namespace kiln::builder
