// Pass fuse_squeeze_excite: a squeeze-and-excitation gate (MobileNetV3, EfficientNet) becomes one
// kiln::SqueezeExcite, one kernel where there were a pool, two tiny convolutions (cuDNN calls on
// 1x1 images) and, for HardSigmoid, an epilogue pass. Matched, each intermediate read by nothing
// else and no engine output:
//   NCHW: GlobalAveragePool(X) or ReduceMean(X, axes [2, 3], keepdims) -> FusedConv 1x1 (act1)
//         -> FusedConv 1x1 (act2)
//   NHWC: ReduceMean(X, axes [1, 2], keepdims) -> FusedConv{layout=NHWC} 1x1 (act1)
//         -> FusedConv{layout=NHWC} 1x1 (act2)
// each FusedConv with constant W and B, no residual, group 1, stride 1, no padding. The Mul that
// applies the gate to X is left as it is: the channel-broadcast binary kernel reads X once there.
// Meant to run after assign_layout (the NHWC form is what a half-precision stack becomes), on CUDA
// builds. It is NOT in the pipeline: measured on MobileNetV3-Large FP16 on an H100 (2026-11-27,
// .gpu_models/exp2.sh: two engine builds, with and without the pass, each timed twice, the
// depthwise kernel at one pixel a thread), 0.371-0.377 ms against 0.348-0.351 at batch 1 and
// 1.448-1.449 against 1.331-1.340 at batch 64. Its first kernel (one block per image) was far
// slower still (0.981 ms at batch 1). cuda.SqueezeExcite now spreads both products over the
// grid, but ncu (exp.sh) shows its hidden-unit kernel at 11-16 us at batch 1 and its gate kernel
// at up to 23 us at batch 64: more than the launches it saves. It goes in once its kernels beat
// the pool and GEMMs it replaces (or once the gate's Mul folds in, saving another pass over X).
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

// Attribute values with their defaults; a malformed attribute reads as a value no match takes.
std::string str_attr(const ir::Node& n, const char* name, const char* dflt) {
  auto r = n.attrs.get_string(name, dflt);
  return r.ok() ? *r : std::string("?");
}
int64_t int_attr(const ir::Node& n, const char* name, int64_t dflt) {
  auto r = n.attrs.get_int(name, dflt);
  return r.ok() ? *r : -999;
}
std::optional<std::vector<int64_t>> ints_attr(const ir::Node& n, const char* name) {
  auto r = n.attrs.get_ints(name, std::vector<int64_t>{});
  if (!r.ok()) return std::nullopt;
  return *r;
}
std::vector<float> floats_attr(const ir::Node& n, const char* name) {
  auto r = n.attrs.get_floats(name, std::vector<float>{});
  return r.ok() ? *r : std::vector<float>{};
}

bool all_equal(const std::optional<std::vector<int64_t>>& v, int64_t want) {  // empty: the default
  if (!v) return false;
  for (int64_t x : *v) {
    if (x != want) return false;
  }
  return true;
}

// A FusedConv of `layout` that is a 1x1 product over channels with constant W and B: its input,
// or -1.
int pointwise_fused_conv(const ir::Graph& g, const ir::Node& n, const std::string& layout) {
  if (n.domain != "kiln" || n.op_type != "FusedConv" || n.inputs.size() != 3 ||
      n.outputs.size() != 1) {
    return -1;
  }
  if (str_attr(n, "layout", "NCHW") != layout || int_attr(n, "group", 1) != 1) return -1;
  const std::string pad = str_attr(n, "auto_pad", "NOTSET");
  if (pad != "NOTSET" && pad != "VALID") return -1;
  if (!all_equal(ints_attr(n, "strides"), 1) || !all_equal(ints_attr(n, "dilations"), 1) ||
      !all_equal(ints_attr(n, "pads"), 0)) {
    return -1;
  }
  for (int i : {1, 2}) {
    if (n.inputs[size_t(i)] < 0 || !g.values[size_t(n.inputs[size_t(i)])].constant) return -1;
  }
  const ir::Value& w = g.values[size_t(n.inputs[1])];
  if (!w.shape || w.shape->size() != 4) return -1;
  const bool nhwc = layout == "NHWC";
  for (int a : nhwc ? std::vector<int>{1, 2} : std::vector<int>{2, 3}) {
    if ((*w.shape)[size_t(a)] != ir::Dim(1)) return -1;
  }
  return n.inputs[0];
}

// X when node `p` averages it over H and W with keepdims (GlobalAveragePool, or ReduceMean over
// the spatial axes of `layout`); else -1.
int spatial_mean_of(const ir::Graph& g, const ir::Node& p, bool nhwc) {
  if (p.outputs.size() != 1 || p.inputs.empty() || p.inputs[0] < 0) return -1;
  const ir::Value& x = g.values[size_t(p.inputs[0])];
  if (!x.shape || x.shape->size() != 4) return -1;
  if (is_onnx(p, "GlobalAveragePool")) return nhwc ? -1 : p.inputs[0];
  if (!is_onnx(p, "ReduceMean") || int_attr(p, "keepdims", 1) != 1) return -1;
  std::vector<int64_t> axes;
  if (p.inputs.size() > 1 && p.inputs[1] >= 0) {
    const ir::Value& a = g.values[size_t(p.inputs[1])];
    if (!a.constant) return -1;
    for (int64_t i = 0; i < a.constant->numel(); ++i) axes.push_back(a.constant->int_at(i));
  } else {
    auto attr = ints_attr(p, "axes");
    if (!attr) return -1;
    axes = *attr;
  }
  for (int64_t& a : axes) a = a < 0 ? a + 4 : a;
  std::ranges::sort(axes);
  const std::vector<int64_t> want = nhwc ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{2, 3};
  return axes == want ? p.inputs[0] : -1;
}

StatusOr<bool> fuse_at(ir::Graph* g, int n2, const SupportsFn& supports) {
  const ir::Node& f2 = g->nodes[size_t(n2)];
  if (f2.domain != "kiln" || f2.op_type != "FusedConv") return false;
  const std::string layout = str_attr(f2, "layout", "NCHW");
  const int a = pointwise_fused_conv(*g, f2, layout);
  if (a < 0 || sole_reader(*g, a) != n2) return false;
  const int n1 = g->values[size_t(a)].producer;
  if (n1 < 0) return false;
  const ir::Node& f1 = g->nodes[size_t(n1)];
  const int s = pointwise_fused_conv(*g, f1, layout);
  if (s < 0 || sole_reader(*g, s) != n1) return false;
  const int np = g->values[size_t(s)].producer;
  if (np < 0) return false;
  const int x = spatial_mean_of(*g, g->nodes[size_t(np)], layout == "NHWC");
  if (x < 0) return false;
  const DType t = g->values[size_t(x)].dtype;
  for (int v : {f1.inputs[1], f1.inputs[2], f2.inputs[1], f2.inputs[2], f2.outputs[0]}) {
    if (g->values[size_t(v)].dtype != t) return false;
  }
  ir::Node se;
  se.domain = "kiln";
  se.op_type = "SqueezeExcite";
  se.opset = 1;
  se.name = f2.name + "_se";
  set_string(&se, "layout", layout);
  set_string(&se, "activation1", str_attr(f1, "activation", "none"));
  set_floats(&se, "activation1_params", floats_attr(f1, "activation_params"));
  set_string(&se, "activation2", str_attr(f2, "activation", "none"));
  set_floats(&se, "activation2_params", floats_attr(f2, "activation_params"));
  se.inputs = {x, f1.inputs[1], f1.inputs[2], f2.inputs[1], f2.inputs[2]};
  se.outputs = {f2.outputs[0]};
  return replace_if_supported(g, {np, n1, n2}, std::move(se), supports);
}

}  // namespace

Status fuse_squeeze_excite(ir::Graph* g, const SupportsFn& supports) {
  return fuse_at_every_node(g, [&](int n) { return fuse_at(g, n, supports); });
}

Status fuse_squeeze_excite(BuildState& s) {
  return fuse_squeeze_excite(&s.graph, backend_supports(s));
}

}  // namespace kiln::builder
