// Pass patchify_conv: a vision transformer's patch embedding, a Conv whose stride equals its
// kernel (no padding, dilation or groups) flattened to tokens,
//   Y = Conv(X [B, C, H, W], W [E, C, P, Q], b)        [B, E, H/P, W/Q]
//   T = Transpose(Reshape(Y, [B, E, N]), [0, 2, 1])    [B, N, E], N = (H/P)(W/Q)
// becomes the GEMM it is: the patches laid out as rows, times the weight as a [C*P*Q, E] matrix,
//   T = MatMulBias(Reshape(Transpose(Reshape(X, [B, C, H/P, P, W/Q, Q]), [0, 2, 4, 1, 3, 5]),
//                          [B, N, C*P*Q]), W^T, b)
// one transpose of the input and one GEMM where the convolution took a cast to NHWC, a channel
// pad to 8, cuDNN's convolution and two transposes back (ViT-B/16 at batch 64: 380 us, of which
// the convolution was 263 us at 56 TFLOPS). CUDA only (the CPU keeps its Conv); H and W constant.
#include <optional>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

using ir::Dim;

bool all_equal(const StatusOr<std::vector<int64_t>>& v, std::vector<int64_t> want) {
  return v.ok() && *v == want;
}

// The one node reading v that runs (shape-only readers, folded, aside); -1 otherwise.
int running_reader(const ir::Graph& g, int v) {
  if (is_graph_output(g, v)) return -1;
  const std::vector<int> r = running_readers(g, v);
  return r.size() == 1 ? r[0] : -1;
}

StatusOr<bool> patchify_at(ir::Graph* g, int cn, const SupportsFn& supports) {
  const ir::Node& conv = g->nodes[size_t(cn)];
  if (!is_onnx(conv, "Conv") || conv.inputs.size() < 2 || conv.outputs.size() != 1) return false;
  const int x = conv.inputs[0], w = conv.inputs[1], b = conv.inputs.size() > 2 ? conv.inputs[2] : -1;
  const ir::Value &xv = g->values[size_t(x)], &wv = g->values[size_t(w)];
  if (!xv.shape || xv.shape->size() != 4 || !wv.constant || wv.constant->shape().size() != 4 ||
      xv.dtype != wv.dtype || !is_float(xv.dtype)) {
    return false;
  }
  if (b >= 0 && !g->values[size_t(b)].constant) return false;
  // Copies: the edits below grow the graph's vectors, which moves their elements.
  const Shape ws = wv.constant->shape();
  const int64_t e = ws[0], c = ws[1], p = ws[2], q = ws[3];
  const std::vector<Dim> xs = *xv.shape;
  const DType dtype = xv.dtype;
  const Tensor weight = *wv.constant;
  if (!xs[1].is_const() || !xs[2].is_const() || !xs[3].is_const() || xs[1].value() != c) return false;
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
  const int y = conv.outputs[0];
  const int r = running_reader(*g, y);
  if (r < 0 || !is_onnx(g->nodes[size_t(r)], "Reshape")) return false;
  const int rv = g->nodes[size_t(r)].outputs[0];
  const int t = running_reader(*g, rv);
  if (t < 0 || !is_onnx(g->nodes[size_t(t)], "Transpose") ||
      perm_of(*g, g->nodes[size_t(t)]) != std::vector<int64_t>{0, 2, 1}) {
    return false;
  }
  const int64_t hp = h / p, wp = wd / q, n = hp * wp, k = c * p * q;
  const auto &rs = g->values[size_t(rv)].shape, &ts = g->values[size_t(g->nodes[size_t(t)].outputs[0])].shape;
  if (!rs || rs->size() != 3 || (*rs)[0] != xs[0] || (*rs)[1] != Dim(e) || (*rs)[2] != Dim(n) || !ts) return false;
  // Readers of Y or the Reshape's output other than the chain (shape-only ones) would lose them.
  if (readers_of(*g, y).size() != 1 || readers_of(*g, rv).size() != 1) return false;
  // W [E, C, P, Q], read as [E, C*P*Q], transposed: the [C*P*Q, E] matrix.
  std::optional<Tensor> wt = transposed_2d(Tensor::wrap(dtype, {e, k}, weight.data(), nullptr));
  if (!wt) return false;
  const std::string base = g->values[size_t(x)].name, wname = g->values[size_t(w)].name;
  auto shape_const = [&](const char* suffix, std::vector<int64_t> dims) {
    const int64_t rank = int64_t(dims.size());
    return add_constant(g, base + suffix, Tensor::from_vector<int64_t>(DType::kInt64, {rank}, dims));
  };
  ir::Graph saved = *g;
  const std::string name = g->nodes[size_t(cn)].name;
  auto node = [&](const char* op, std::vector<int> inputs, int out) {
    ir::Node nd;
    nd.name = ir::unique_node_name(*g, name + "_" + op);
    nd.op_type = op;
    nd.inputs = std::move(inputs);
    nd.outputs = {out};
    return nd;
  };
  // Each step goes on the edge from X to the Conv, which the last replacement then removes.
  const int x6 = ir::add_unique_value(g, base + "_patches6", dtype,
                                      std::vector<Dim>{xs[0], Dim(c), Dim(hp), Dim(p), Dim(wp), Dim(q)});
  const int x6t = ir::add_unique_value(g, base + "_patches6t", dtype,
                                       std::vector<Dim>{xs[0], Dim(hp), Dim(wp), Dim(c), Dim(p), Dim(q)});
  const int x3 = ir::add_unique_value(g, base + "_patches", dtype, std::vector<Dim>{xs[0], Dim(n), Dim(k)});
  const int s6 = shape_const("_patches6_shape", {-1, c, hp, p, wp, q});
  const int s3 = shape_const("_patches_shape", {-1, n, k});
  const int wtv = add_constant(g, wname + "_patch_matrix", std::move(*wt));
  auto conv_now = [&] { return g->values[size_t(y)].producer; };
  Status st = ok_status();
  auto step = [&](ir::Node nd, int from) {
    if (!st.ok()) return;
    const int consumer = conv_now();
    auto r2 = ir::insert_on_edge(g, from, std::move(nd), std::span<const int>(&consumer, 1));
    if (!r2.ok()) st = r2.status();
  };
  step(node("Reshape", {x, s6}, x6), x);
  ir::Node tr = node("Transpose", {x6}, x6t);
  set_ints(&tr, "perm", {0, 2, 4, 1, 3, 5});
  step(std::move(tr), x6);
  step(node("Reshape", {x6t, s3}, x3), x6t);
  if (!st.ok()) {
    *g = std::move(saved);
    return false;
  }
  ir::Node mm;
  mm.name = name;
  mm.domain = "kiln";
  mm.op_type = "MatMulBias";
  mm.opset = 1;
  set_string(&mm, "activation", "none");
  mm.inputs = {x3, wtv};
  if (b >= 0) mm.inputs.push_back(b);
  const int tnode = running_reader(*g, rv);  // the Transpose, at its index after the inserts
  mm.outputs = {g->nodes[size_t(tnode)].outputs[0]};
  const std::vector<int> matched = {conv_now(), g->values[size_t(rv)].producer, tnode};
  if (replace_if_supported(g, matched, std::move(mm), supports)) return true;
  *g = std::move(saved);
  return false;
}

}  // namespace

Status patchify_conv(ir::Graph* g, const SupportsFn& supports) {
  for (size_t n = 0; n < g->nodes.size(); ++n) {
    KILN_ASSIGN_OR_RETURN(bool done, patchify_at(g, int(n), supports));
    (void)done;
  }
  return ok_status();
}

Status patchify_conv(BuildState& s) {
  return patchify_conv(&s.graph, backend_supports(s));
}

}  // namespace kiln::builder
