// Pass fuse_attention: scaled dot-product attention as exporters write it becomes one ONNX
// Attention node (opset 23), which the CUDA backend runs as one fused kernel (cuDNN's flash
// attention for float16/bfloat16) instead of two batched GEMMs, the score tensor written and read
// by each of scale, mask, softmax and NaN guard, and the transposes around the heads. Matched,
// each intermediate read by nothing else and no engine output:
//
//   S = MatMul(Q', K')        Q' = Q times scalars; K' = Transpose(K) times scalars, with
//                             reshapes that keep the shape anywhere on that path
//   S = S * c | S / c ...     scalar constants, before the mask
//   S = Add(S, M) | Add(M, S) an additive mask broadcasting onto S (M need not be constant)
//   P = Softmax(S) over the last axis
//   P = Where(IsNaN(P), 0, P) the guard newer exporters put after softmax (optional)
//   Y = MatMul(P, V)
//
// The scalars' product becomes the attribute scale; Attention's K is K' transposed back (the
// matched Transpose's permutation with its last two axes exchanged: none at all where that is the
// identity). Q, K, V and Y have rank 4 ([batch, heads, seq, head]) or rank 3 (one head).
// Where Q, K and V are each split into heads as Transpose(Reshape(x, [B, S, H, D]), [0, 2, 1, 3])
// of a [B, S, H*D] tensor and Y is merged back the same way (Transpose [0, 2, 1, 3], Reshape to
// [B, S, H*D]), the node takes the [B, S, H*D] tensors themselves (its 3-D form, q_num_heads and
// kv_num_heads) and writes the merged output: the kernel reads the heads with strides and the
// four transposes go.
//
// One difference, in rows where every key is masked by -inf: unfused, softmax gives NaN there
// (0 with the guard); Attention gives 0 either way, as ONNX's Attention and every flash kernel do.
//
// CUDA only, and only where the build may run it in float16 or bfloat16 (--fp16, --bf16): there
// it has a fused kernel; in float32 the batched GEMMs on tensor cores are faster than the
// reference Attention kernel, so a strict or TF32 build keeps the graph as it is. Runs before
// assign_precision, which then gives the whole node the reduced type (it accumulates in float).
#include <cmath>
#include <optional>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

using ir::Dim;
using Dims = std::vector<Dim>;

const Dims* shape_of(const ir::Graph& g, int v) {
  if (v < 0) return nullptr;
  const ir::Value& val = g.values[size_t(v)];
  return val.shape ? &*val.shape : nullptr;
}

// The factor of a scalar step reading `x`: Mul(x, c) or Mul(c, x) gives c, Div(x, c) gives 1/c.
std::optional<double> scalar_factor(const ir::Graph& g, const ir::Node& n, int x) {
  if (n.inputs.size() != 2 || n.outputs.size() != 1) return std::nullopt;
  if (is_onnx(n, "Mul")) {
    if (auto c = other_constant(g, n, x)) return double(*c);
  }
  if (is_onnx(n, "Div") && n.inputs[0] == x) {
    auto c = scalar_constant(g, n, 1);
    if (c && *c != 0.f) return 1.0 / double(*c);
  }
  return std::nullopt;
}

// A scalar step: the tensor it scales and the factor.
struct Step {
  int x;
  double f;
};
std::optional<Step> scalar_step(const ir::Graph& g, const ir::Node& n) {
  for (size_t i = 0; i < n.inputs.size() && i < 2; ++i) {
    if (auto f = scalar_factor(g, n, n.inputs[i])) return Step{n.inputs[i], *f};
  }
  return std::nullopt;
}

// The producer of `v` when `v` is read only by `reader` (and is no engine output); else -1.
int producer_for(const ir::Graph& g, int v, int reader) {
  if (v < 0 || sole_reader(g, v) != reader) return -1;
  return g.values[size_t(v)].producer;
}

// Upwards from input `slot` of node `reader` through scalar steps (their nodes into *nodes, their
// factors into *scale); with allow_transpose, also through one Transpose (into *transpose) and
// reshapes that keep the shape. Returns the value at the top.
int walk_up(const ir::Graph& g, int reader, size_t slot, bool allow_transpose,
            std::vector<int>* nodes, double* scale, int* transpose) {
  int v = g.nodes[size_t(reader)].inputs[slot];
  int at = reader;
  for (;;) {
    const int p = producer_for(g, v, at);
    if (p < 0) return v;
    const ir::Node& n = g.nodes[size_t(p)];
    if (n.inputs.empty() || n.outputs.size() != 1 || n.outputs[0] != v) return v;
    const int x = n.inputs[0];
    int next = -1;
    if (auto step = scalar_step(g, n)) {
      *scale *= step->f;
      next = step->x;
    } else if (allow_transpose && is_onnx(n, "Transpose") && *transpose < 0) {
      *transpose = p;
      next = x;
    } else if (allow_transpose && is_onnx(n, "Reshape")) {
      const Dims *in = shape_of(g, x), *out = shape_of(g, v);
      if (!in || !out || *in != *out) return v;
      next = x;
    } else {
      return v;
    }
    if (p != *transpose) nodes->push_back(p);
    v = next;
    at = p;
  }
}

bool is_identity(const std::vector<int64_t>& p) {
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != int64_t(i)) return false;
  }
  return true;
}

// The Softmax node n normalizes over the last axis (opset 13's meaning, or an older opset's with
// axis = rank - 1, where flattening changes nothing).
bool softmax_over_last_axis(const ir::Node& n, size_t rank) {
  if (!is_onnx(n, "Softmax") || n.inputs.size() != 1 || n.outputs.size() != 1) return false;
  auto axis = n.attrs.get_int("axis", n.opset > 0 && n.opset < 13 ? 1 : -1);
  return axis.ok() && (*axis == -1 || *axis == int64_t(rank) - 1);
}

// A [B, S, H*D] tensor and its H where `v` is Transpose(Reshape(x, [B, S, H, D]), [0, 2, 1, 3])
// (or that Reshape's output under `perm`, when the Transpose is taken already).
struct Heads {
  int x = -1;
  int64_t heads = 0;
};

std::optional<Heads> split_heads(const ir::Graph& g, int v, std::vector<int64_t> perm) {
  if (is_identity(perm)) {
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

// Whether `v`, read only by `reader`, is a MatMul's output under scalar steps.
bool leads_to_matmul(const ir::Graph& g, int v, int reader) {
  for (;;) {
    const int p = producer_for(g, v, reader);
    if (p < 0) return false;
    const ir::Node& n = g.nodes[size_t(p)];
    if (is_onnx(n, "MatMul")) return true;
    auto step = scalar_step(g, n);
    if (!step) return false;
    v = step->x;
    reader = p;
  }
}

StatusOr<bool> fuse_at(ir::Graph* g, int sm, const SupportsFn& supports) {
  const ir::Node& softmax = g->nodes[size_t(sm)];
  const Dims* score_shape = softmax.inputs.empty() ? nullptr : shape_of(*g, softmax.inputs[0]);
  if (!score_shape || (score_shape->size() != 3 && score_shape->size() != 4)) return false;
  const size_t rank = score_shape->size();
  if (!softmax_over_last_axis(softmax, rank)) return false;
  std::vector<int> matched = {sm};
  // Up from the softmax: the mask, then scalars, to the first MatMul.
  double scale = 1.0;
  int mask = -1, v = softmax.inputs[0], at = sm, qk = -1;
  for (;;) {
    const int p = producer_for(*g, v, at);
    if (p < 0) return false;
    const ir::Node& n = g->nodes[size_t(p)];
    if (is_onnx(n, "MatMul") && n.inputs.size() == 2) {
      qk = p;
      break;
    }
    if (mask < 0 && is_onnx(n, "Add") && n.inputs.size() == 2 && scale == 1.0) {
      // The mask is the operand that does not come from the product.
      const int a = n.inputs[0], b = n.inputs[1];
      const int s = leads_to_matmul(*g, a, p) ? a : leads_to_matmul(*g, b, p) ? b : -1;
      if (s < 0 || !shape_of(*g, s) || *shape_of(*g, s) != *score_shape) return false;
      mask = s == a ? b : a;
      matched.push_back(p);
      v = s;
      at = p;
      continue;
    }
    auto step = scalar_step(*g, n);
    if (!step) return false;
    scale *= step->f;
    matched.push_back(p);
    v = step->x;
    at = p;
  }
  // Down from the softmax: the optional NaN guard, then the MatMul with V.
  int probs = softmax.outputs[0];
  if (is_graph_output(*g, probs)) return false;
  std::vector<int> readers = readers_of(*g, probs);
  if (readers.size() == 2) {
    int isnan = -1, where = -1;
    for (int r : readers) {
      const ir::Node& n = g->nodes[size_t(r)];
      if (is_onnx(n, "IsNaN")) isnan = r;
      if (is_onnx(n, "Where")) where = r;
    }
    if (isnan < 0 || where < 0) return false;
    const ir::Node &in = g->nodes[size_t(isnan)], &wn = g->nodes[size_t(where)];
    auto zero = scalar_constant(*g, wn, 1);
    if (wn.inputs.size() != 3 || wn.inputs[0] != in.outputs[0] || wn.inputs[2] != probs || !zero ||
        *zero != 0.f || sole_reader(*g, in.outputs[0]) != where) {
      return false;
    }
    matched.push_back(isnan);
    matched.push_back(where);
    probs = wn.outputs[0];
    readers = {sole_reader(*g, probs)};
  }
  if (readers.size() != 1 || readers[0] < 0) return false;
  const int pv = readers[0];
  const ir::Node& pv_node = g->nodes[size_t(pv)];
  if (!is_onnx(pv_node, "MatMul") || pv_node.inputs.size() != 2 || pv_node.inputs[0] != probs)
    return false;
  matched.push_back(qk);
  matched.push_back(pv);
  // Q and K above the first MatMul.
  int k_transpose = -1, no_transpose = -1;
  const int q = walk_up(*g, qk, 0, false, &matched, &scale, &no_transpose);
  const int k_top = walk_up(*g, qk, 1, true, &matched, &scale, &k_transpose);
  const int vv = pv_node.inputs[1], y = pv_node.outputs[0];
  if (k_transpose < 0) return false;
  const ir::Node& kt = g->nodes[size_t(k_transpose)];
  const Dims *qs = shape_of(*g, q), *kts = shape_of(*g, g->nodes[size_t(qk)].inputs[1]),
             *vs = shape_of(*g, vv), *ys = shape_of(*g, y), *ms = shape_of(*g, mask);
  if (!qs || !kts || !vs || !ys || qs->size() != rank || kts->size() != rank ||
      vs->size() != rank || ys->size() != rank || (mask >= 0 && (!ms || ms->size() > rank))) {
    return false;
  }
  // Batch dims equal (no broadcasting between Q, K and V), K' = [.., D, L], V = [.., L, Dv].
  for (size_t i = 0; i + 2 < rank; ++i) {
    if ((*kts)[i] != (*qs)[i] || (*vs)[i] != (*qs)[i] || (*ys)[i] != (*qs)[i]) return false;
  }
  if ((*kts)[rank - 2] != (*qs)[rank - 1] || (*vs)[rank - 2] != (*kts)[rank - 1]) return false;
  // A rank-3 mask over rank-3 scores would meet Attention's [B, heads, S, L] as [1, B, S, L].
  if (rank == 3 && mask >= 0 && ms->size() == 3 && (*ms)[0] != Dim(1)) return false;
  const DType t = g->values[size_t(q)].dtype;
  for (int x : {k_top, vv, y, mask}) {
    if (x >= 0 && g->values[size_t(x)].dtype != t) return false;
  }
  if (!is_float(t)) return false;
  // Attention's K: K' without the Transpose's last two axes exchanged.
  std::vector<int64_t> perm = perm_of(*g, kt).value_or(std::vector<int64_t>{});
  if (perm.size() != rank) return false;
  std::swap(perm[rank - 2], perm[rank - 1]);

  ir::Node fused;
  fused.name = g->nodes[size_t(qk)].name;
  fused.op_type = "Attention";
  fused.opset = 23;
  set_float(&fused, "scale", float(scale));
  // The 3-D form where every operand is split into heads and the output merged back.
  std::optional<Heads> hq, hk, hv;
  int merge_t = -1, merge_r = -1;
  if (rank == 4) {
    hq = split_heads(*g, q, {0, 1, 2, 3});
    hk = split_heads(*g, k_top, perm);
    hv = split_heads(*g, vv, {0, 1, 2, 3});
    merge_t = sole_reader(*g, y);
    if (merge_t >= 0 && is_onnx(g->nodes[size_t(merge_t)], "Transpose") &&
        perm_of(*g, g->nodes[size_t(merge_t)]) == std::vector<int64_t>{0, 2, 1, 3}) {
      merge_r = sole_reader(*g, g->nodes[size_t(merge_t)].outputs[0]);
    }
    if (merge_r >= 0 && !is_onnx(g->nodes[size_t(merge_r)], "Reshape")) merge_r = -1;
    const Dims* rs = merge_r >= 0 ? shape_of(*g, g->nodes[size_t(merge_r)].outputs[0]) : nullptr;
    if (!rs || rs->size() != 3 || (*rs)[0] != (*ys)[0] || (*rs)[1] != (*ys)[2] ||
        (*rs)[2] != (*ys)[1] * (*ys)[3]) {
      merge_r = -1;
    }
  }
  if (hq && hk && hv && merge_r >= 0) {
    fused.inputs = {hq->x, hk->x, hv->x};
    set_int(&fused, "q_num_heads", hq->heads);
    set_int(&fused, "kv_num_heads", hk->heads);
    if (mask >= 0) fused.inputs.push_back(mask);
    fused.outputs = {g->nodes[size_t(merge_r)].outputs[0]};
    matched.push_back(k_transpose);
    matched.push_back(merge_t);
    matched.push_back(merge_r);
    return replace_if_supported(g, matched, std::move(fused), supports);
  }
  fused.outputs = {y};
  if (rank == 3) {  // [N, S, D] is Attention's 3-D form with one head
    set_int(&fused, "q_num_heads", 1);
    set_int(&fused, "kv_num_heads", 1);
  }
  if (is_identity(perm)) {
    fused.inputs = {q, k_top, vv};
    if (mask >= 0) fused.inputs.push_back(mask);
    matched.push_back(k_transpose);
    return replace_if_supported(g, matched, std::move(fused), supports);
  }
  // The matched Transpose becomes K's: it reads the top of K's path with the permutation above.
  // Undone when the backend says no.
  ir::Node& tn = g->nodes[size_t(k_transpose)];
  const ir::Node saved = tn;
  const int k = tn.outputs[0];
  const Dims saved_shape = *g->values[size_t(k)].shape;
  Dims k_shape = saved_shape;
  std::swap(k_shape[rank - 2], k_shape[rank - 1]);
  tn.inputs[0] = k_top;
  set_ints(&tn, "perm", perm);
  g->values[size_t(k)].shape = k_shape;
  fused.inputs = {q, k, vv};
  if (mask >= 0) fused.inputs.push_back(mask);
  const int k_node = k_transpose;
  if (replace_if_supported(g, matched, std::move(fused), supports)) return true;
  g->nodes[size_t(k_node)] = saved;
  g->values[size_t(k)].shape = saved_shape;
  return false;
}

}  // namespace

Status fuse_attention(ir::Graph* g, const SupportsFn& supports) {
  bool any = false;
  for (size_t n = 0; n < g->nodes.size();) {
    KILN_ASSIGN_OR_RETURN(bool fused, fuse_at(g, int(n), supports));
    any = any || fused;
    if (!fused) ++n;
  }
  // The head splits and merges the 3-D form no longer reads.
  if (any) ir::remove_dead_nodes(g);
  return ok_status();
}

Status fuse_attention(BuildState& s) {
  if (s.backend.device() != Device::kCUDA) return ok_status();
  if (s.config.precision().reduced_float() == DType::kFloat32) return ok_status();
  return fuse_attention(&s.graph, backend_supports(s));
}

}  // namespace kiln::builder
