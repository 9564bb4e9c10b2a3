// Pass unflatten_gemm: a linear layer written as a 2-D Gemm between reshapes (transformers'
// Conv1D, GPT-2's every projection: addmm on x.view(-1, K), then .view(..., N)),
//   Y = Reshape(Gemm(Reshape(X [..., K], [M, K]), W, c), [..., N])
// becomes the MatMul it is on X itself (X [..., H, D] with H*D = K viewed as [..., K] first),
// with the bias Add after it,
//   Y = Add(MatMul(X, W or W^T), c)
// so that fuse_matmul_bias sees the linear layer as BERT's look: the bias, a following GELU and a
// residual Add go into one MatMulBias (cuBLASLt's epilogue and C) instead of a Gemm, a separate
// activation and a separate Add. Matched: alpha 1, beta 1, transA 0, W a 2-D constant, c a
// constant of N elements or absent, Y's leading dims X's own. CUDA only, before fuse_matmul_bias.
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

using ir::Dim;

StatusOr<bool> unflatten_at(ir::Graph* g, int gn, const SupportsFn& supports) {
  const ir::Node& gemm = g->nodes[size_t(gn)];
  if (!is_onnx(gemm, "Gemm") || gemm.inputs.size() < 2 || gemm.outputs.size() != 1) return false;
  auto alpha = gemm.attrs.get_float("alpha", 1.f), beta = gemm.attrs.get_float("beta", 1.f);
  auto ta = gemm.attrs.get_int("transA", 0), tb = gemm.attrs.get_int("transB", 0);
  if (!alpha.ok() || !beta.ok() || !ta.ok() || !tb.ok() || *alpha != 1.f || *beta != 1.f || *ta != 0) return false;
  const int a = gemm.inputs[0], w = gemm.inputs[1], c = gemm.inputs.size() > 2 ? gemm.inputs[2] : -1;
  const ir::Value& wv = g->values[size_t(w)];
  if (!wv.constant || wv.constant->shape().size() != 2) return false;
  const int64_t n = *tb ? wv.constant->shape()[0] : wv.constant->shape()[1];
  if (c >= 0) {
    const ir::Value& cv = g->values[size_t(c)];
    if (!cv.constant || cv.constant->numel() != n || !cv.shape || cv.shape->size() > 1) return false;
  }
  // A = Reshape(X, [M, K]) and Y = Reshape(G, [..., N]) with Y's leading dims X's.
  const int r1 = g->values[size_t(a)].producer;
  if (r1 < 0 || !is_onnx(g->nodes[size_t(r1)], "Reshape")) return false;
  const int x = g->nodes[size_t(r1)].inputs[0];
  const int gout = gemm.outputs[0];
  const std::vector<int> r2s = running_readers(*g, gout);
  if (r2s.size() != 1 || readers_of(*g, gout).size() != 1 || is_graph_output(*g, gout) ||
      !is_onnx(g->nodes[size_t(r2s[0])], "Reshape")) {
    return false;
  }
  int r2 = r2s[0];
  const int y = g->nodes[size_t(r2)].outputs[0];
  if (is_graph_output(*g, y)) return false;  // the bias Add would go on the edge to its readers
  // Copies: adding values below moves the graph's values.
  const std::optional<std::vector<Dim>> xs = g->values[size_t(x)].shape, ys = g->values[size_t(y)].shape;
  const int64_t k = *tb ? wv.constant->shape()[1] : wv.constant->shape()[0];
  if (!xs || !ys || ys->size() < 3 || xs->size() < ys->size() || ys->back() != Dim(n)) return false;
  // X's leading dims are Y's; its trailing ones hold K (one dim, or heads merged: [B, S, H, D]
  // flattened to [B*S, H*D], as the dynamo exporter writes attention's output projection).
  const size_t lead = ys->size() - 1;
  Dim trailing(1);
  for (size_t d = 0; d < xs->size(); ++d) {
    if (d < lead && (*xs)[d] != (*ys)[d]) return false;
    if (d >= lead) trailing = trailing * (*xs)[d];
  }
  if (trailing != Dim(k)) return false;
  const bool merge_heads = xs->size() > ys->size();
  // Heads merged batch-first only (X = Transpose(attention, [0, 2, 1, 3])): torchvision's
  // sequence-first merge ([2, 0, 1, 3]) is pack_attention's, which reads it in place.
  if (merge_heads) {
    const int t = g->values[size_t(x)].producer;
    if (t < 0 || !is_onnx(g->nodes[size_t(t)], "Transpose") ||
        perm_of(*g, g->nodes[size_t(t)]) != std::vector<int64_t>{0, 2, 1, 3}) {
      return false;
    }
  }
  // W as [K, N]: the constant itself, or (transB) a transposed copy.
  std::optional<Tensor> wt;
  if (*tb) {
    wt = transposed_2d(*wv.constant);
    if (!wt) return false;
  }
  const std::string name = gemm.name, wname = wv.name;
  ir::Graph saved = *g;
  const int wk = wt ? add_constant(g, wname + "_kn", std::move(*wt)) : w;
  int x3 = x;
  if (merge_heads) {
    // X viewed as [..., K] (a Reshape copying the leading dims by 0), for the flattening Reshape.
    std::vector<int64_t> target(lead, 0);
    target.push_back(k);
    std::vector<Dim> shape(ys->begin(), ys->end() - 1);
    shape.push_back(Dim(k));
    const std::string xname = g->values[size_t(x)].name;
    const int t = add_constant(g, xname + "_merged_shape", Tensor::from_vector(DType::kInt64, {int64_t(target.size())}, target));
    x3 = ir::add_unique_value(g, xname + "_merged", g->values[size_t(x)].dtype, std::move(shape));
    ir::Node view;
    view.name = ir::unique_node_name(*g, xname + "_merged");
    view.op_type = "Reshape";
    view.inputs = {x, t};
    view.outputs = {x3};
    auto r0 = ir::insert_on_edge(g, x, std::move(view), std::vector<int>{r1});
    if (!r0.ok()) {
      *g = std::move(saved);
      return false;
    }
    gn = g->values[size_t(gout)].producer;
    r2 = g->values[size_t(y)].producer;
  }
  ir::Node mm;
  mm.name = name;
  mm.op_type = "MatMul";
  mm.inputs = {x3, wk};
  mm.outputs = {y};
  // MatMul writes Y; the bias Add goes between Y and its readers.
  auto r = ir::replace_nodes(g, std::vector<int>{gn, r2}, std::move(mm));
  if (!r.ok()) {
    *g = std::move(saved);
    return false;
  }
  if (c >= 0) {
    const ir::Value& yv = g->values[size_t(y)];
    const int sum = ir::add_unique_value(g, yv.name + "_bias", yv.dtype, yv.shape);
    ir::Node add;
    add.name = ir::unique_node_name(*g, name + "_bias");
    add.op_type = "Add";
    add.inputs = {y, c};
    add.outputs = {sum};
    if (!ir::insert_on_edge(g, y, std::move(add)).ok()) {
      *g = std::move(saved);
      return false;
    }
  }
  // The backend must run the MatMul (it runs the Add wherever it ran the Gemm).
  if (!node_supported(*g, g->nodes[size_t(g->values[size_t(y)].producer)], supports)) {
    *g = std::move(saved);
    return false;
  }
  return true;
}

}  // namespace

Status unflatten_gemm(ir::Graph* g, const SupportsFn& supports) {
  bool any = false;
  for (size_t n = 0; n < g->nodes.size();) {
    KILN_ASSIGN_OR_RETURN(bool done, unflatten_at(g, int(n), supports));
    any = any || done;
    if (!done) ++n;
  }
  if (any) ir::remove_dead_nodes(g);  // the flattening Reshapes nothing reads any more
  return ok_status();
}

Status unflatten_gemm(BuildState& s) {
  return unflatten_gemm(&s.graph, backend_supports(s));
}

}  // namespace kiln::builder
