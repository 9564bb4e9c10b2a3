// Pass fuse_norm: LayerNorm and RMSNorm as exporters write them out op by op become the ONNX op,
// one kernel that reads x once and accumulates in FP32, where the ops ran as two reductions and
// an elementwise chain with the statistics stored between them.
//
//   LayerNorm (exporters before opset 17, and models that write it by hand):
//     d = Sub(x, ReduceMean(x)); v = ReduceMean(Pow(d, 2))
//     y = Div(d, Sqrt(Add(v, eps)))                     [Mul(y, gamma)] [Add(., beta)]
//     -> LayerNormalization(x, gamma, beta) {axis=-1, epsilon=eps}  (opset 17)
//   RMSNorm (transformers' LlamaRMSNorm and its kin; T5's):
//     v = ReduceMean(Pow(x, 2))
//     y = Mul(x, Reciprocal(Sqrt(Add(v, eps)))) or Div(x, Sqrt(Add(v, eps)))   [Mul(y, gamma)]
//     -> RMSNormalization(x, gamma) {axis=-1, epsilon=eps}  (opset 23)
//
// Matched over the last axis only (the ReduceMeans' axes [-1] or [rank-1], keepdims), Pow by 2
// or Mul(d, d), every Mul and Add in either operand order, every intermediate read by nothing
// else and no engine output; gamma and beta constants of the normalized size (leading ones
// allowed), of x's dtype. Without gamma the scale is ones (float32 x only). CUDA only, as the
// other fusions: a CPU engine runs the model's own ops.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

// Whether ReduceMean node r averages its input over the last axis alone and keeps it.
bool mean_of_last_axis(const ir::Graph& g, const ir::Node& r) {
  if (r.inputs.empty() || r.inputs[0] < 0) return false;
  const auto& shape = g.values[size_t(r.inputs[0])].shape;
  if (!shape || shape->empty()) return false;
  auto keep = r.attrs.get_int("keepdims", 1);
  if (!keep.ok() || *keep != 1) return false;
  std::vector<int64_t> axes;
  if (r.opset >= 18) {
    if (r.inputs.size() < 2 || r.inputs[1] < 0) return false;
    const ir::Value& a = g.values[size_t(r.inputs[1])];
    if (!a.constant) return false;
    for (int64_t i = 0; i < a.constant->numel(); ++i) axes.push_back(a.constant->int_at(i));
  } else {
    auto attr = r.attrs.get_ints("axes", std::vector<int64_t>{});
    if (!attr.ok()) return false;
    axes = *attr;
  }
  const int64_t rank = int64_t(shape->size());
  return axes.size() == 1 && (axes[0] == -1 || axes[0] == rank - 1);
}

// A constant of x's dtype whose elements lie along the normalized axis ([C], or [1, ..., C]), as a
// [C] tensor; nullopt otherwise.
std::optional<Tensor> per_channel(const ir::Graph& g, int v, DType dtype, int64_t c) {
  if (v < 0) return std::nullopt;
  const ir::Value& val = g.values[size_t(v)];
  if (!val.constant || val.constant->dtype() != dtype || val.constant->numel() != c) return std::nullopt;
  const Shape& s = val.constant->shape();
  if (s.empty() || s.back() != c) return std::nullopt;
  auto t = Tensor::zeros(dtype, {c});
  if (!t.ok()) return std::nullopt;
  std::memcpy(t->data(), val.constant->data(), t->nbytes());
  return std::move(t).value();
}

StatusOr<bool> fuse_at(ir::Graph* g, int rn, const SupportsFn& supports) {
  // The variance: ReduceMean(Pow(d, 2)) or ReduceMean(Mul(d, d)).
  const ir::Node& var = g->nodes[size_t(rn)];
  if (!is_onnx(var, "ReduceMean") || var.outputs.size() != 1 || !mean_of_last_axis(*g, var)) return false;
  std::vector<int> matched = {rn};
  const int sq = var.inputs[0];
  int d = -1, sqn = producer_of(*g, sq, "Pow", rn);
  if (sqn >= 0) {
    const auto e = scalar_constant(*g, g->nodes[size_t(sqn)], 1);
    if (!e || *e != 2.f) return false;
    d = g->nodes[size_t(sqn)].inputs[0];
  } else if ((sqn = producer_of(*g, sq, "Mul", rn)) >= 0) {
    const ir::Node& m = g->nodes[size_t(sqn)];
    if (m.inputs.size() != 2 || m.inputs[0] != m.inputs[1]) return false;
    d = m.inputs[0];
  } else {
    return false;
  }
  matched.push_back(sqn);
  // Add(v, eps), Sqrt, then Div(d, s) or Mul(d, Reciprocal(s)).
  const int an = reader_of(*g, var.outputs[0], "Add");
  if (an < 0) return false;
  const auto eps = other_constant(*g, g->nodes[size_t(an)], var.outputs[0]);
  if (!eps || !(*eps >= 0.f)) return false;
  const int sn = reader_of(*g, g->nodes[size_t(an)].outputs[0], "Sqrt");
  if (sn < 0) return false;
  matched.insert(matched.end(), {an, sn});
  const int s = g->nodes[size_t(sn)].outputs[0];
  int nn = reader_of(*g, s, "Div");
  if (nn >= 0) {
    const ir::Node& div = g->nodes[size_t(nn)];
    if (div.inputs.size() != 2 || div.inputs[0] != d || div.inputs[1] != s) return false;
  } else {
    const int rc = reader_of(*g, s, "Reciprocal");
    if (rc < 0) return false;
    const int r = g->nodes[size_t(rc)].outputs[0];
    nn = reader_of(*g, r, "Mul");
    if (nn < 0 || other_of(g->nodes[size_t(nn)], r) != d) return false;
    matched.push_back(rc);
  }
  matched.push_back(nn);
  // d = Sub(x, ReduceMean(x)) makes it a LayerNorm, read by the square and the normalization
  // alone; otherwise d is x itself, an RMSNorm.
  int x = d;
  bool layer_norm = false;
  if (const int sub = d < 0 ? -1 : g->values[size_t(d)].producer;
      sub >= 0 && is_onnx(g->nodes[size_t(sub)], "Sub") && g->nodes[size_t(sub)].inputs.size() == 2) {
    const ir::Node& sb = g->nodes[size_t(sub)];
    const int mn = producer_of(*g, sb.inputs[1], "ReduceMean", sub);
    if (mn >= 0 && g->nodes[size_t(mn)].inputs[0] == sb.inputs[0] && mean_of_last_axis(*g, g->nodes[size_t(mn)])) {
      std::vector<int> readers = readers_of(*g, d);
      std::sort(readers.begin(), readers.end());
      std::vector<int> want = {sqn, nn};
      std::sort(want.begin(), want.end());
      if (readers != want || is_graph_output(*g, d)) return false;
      x = sb.inputs[0];
      layer_norm = true;
      matched.insert(matched.end(), {sub, mn});
    }
  }
  const ir::Value& xv = g->values[size_t(x)];
  if (!is_float(xv.dtype) || !xv.shape || xv.shape->empty() || !xv.shape->back().is_const()) return false;
  const DType dtype = xv.dtype;
  const int64_t c = xv.shape->back().value();
  // The affine tail: Mul(., gamma), then (LayerNorm) Add(., beta).
  int out = g->nodes[size_t(nn)].outputs[0];
  std::optional<Tensor> gamma, beta;
  if (const int mul = reader_of(*g, out, "Mul"); mul >= 0) {
    if ((gamma = per_channel(*g, other_of(g->nodes[size_t(mul)], out), dtype, c))) {
      matched.push_back(mul);
      out = g->nodes[size_t(mul)].outputs[0];
    }
  }
  if (layer_norm) {
    if (const int add = reader_of(*g, out, "Add"); add >= 0) {
      if ((beta = per_channel(*g, other_of(g->nodes[size_t(add)], out), dtype, c))) {
        matched.push_back(add);
        out = g->nodes[size_t(add)].outputs[0];
      }
    }
  }
  const ir::Value& ov = g->values[size_t(out)];
  if (ov.dtype != dtype || !ov.shape || *ov.shape != *xv.shape) return false;
  if (!gamma) {
    if (dtype != DType::kFloat32) return false;
    gamma = Tensor::from_vector(DType::kFloat32, {c}, std::vector<float>(size_t(c), 1.f));
  }
  const std::string name = g->nodes[size_t(rn)].name;
  ir::Graph saved = *g;
  ir::Node norm;
  norm.name = name;
  norm.op_type = layer_norm ? "LayerNormalization" : "RMSNormalization";
  norm.opset = layer_norm ? 17 : 23;
  set_int(&norm, "axis", -1);
  set_float(&norm, "epsilon", *eps);
  norm.inputs = {x, add_constant(g, name + (layer_norm ? "_ln_scale" : "_rms_scale"), std::move(*gamma))};
  if (beta) norm.inputs.push_back(add_constant(g, name + "_ln_bias", std::move(*beta)));
  norm.outputs = {out};
  if (replace_if_supported(g, matched, std::move(norm), supports)) return true;
  *g = std::move(saved);
  return false;
}

}  // namespace

Status fuse_norm(ir::Graph* g, const SupportsFn& supports) {
  return fuse_at_every_node(g, [&](int n) { return fuse_at(g, n, supports); });
}

Status fuse_norm(BuildState& s) {
  return fuse_norm(&s.graph, backend_supports(s));
}

}  // namespace kiln::builder
