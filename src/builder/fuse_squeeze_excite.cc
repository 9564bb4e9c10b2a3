// Pass fuse_squeeze_excite: a squeeze-and-excitation gate (MobileNetV3, EfficientNet) becomes one
// kiln::SqueezeExcite, one kernel where there were a pool, two tiny convolutions (cuDNN calls on
// 1x1 images) and, for HardSigmoid, an epilogue pass. One rule on the rewriter (rewriter.h),
// rooted at the second FusedConv, each intermediate read by nothing else and no engine output:
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
#include "builder/rewriter.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

using rw::any;
using rw::constant;
using rw::Context;
using rw::Match;
using rw::op;
using rw::Pat;

// Attribute values with their defaults (str_attr: graph_match.h); a malformed attribute reads as
// a value no match takes.
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

// A FusedConv that is a 1x1 product over channels: one output, group 1, stride and dilation 1, no
// padding, W of rank 4 with 1x1 spatial dims in its layout (NCHW unless NHWC), and no
// input_activation (SqueezeExcite has none to apply).
bool pointwise(const Context& ctx, const Match&, int node) {
  const ir::Node& n = ctx.node(node);
  if (n.outputs.size() != 1 || int_attr(n, "group", 1) != 1) return false;
  if (str_attr(n, "input_activation", "none") != "none") return false;
  const std::string pad = str_attr(n, "auto_pad", "NOTSET");
  if (pad != "NOTSET" && pad != "VALID") return false;
  if (!all_equal(ints_attr(n, "strides"), 1) || !all_equal(ints_attr(n, "dilations"), 1) ||
      !all_equal(ints_attr(n, "pads"), 0)) {
    return false;
  }
  const std::vector<ir::Dim>* w = ctx.shape(n.inputs[1]);
  if (!w || w->size() != 4) return false;
  const bool nhwc = str_attr(n, "layout", "NCHW") == "NHWC";
  for (int a : nhwc ? std::vector<int>{1, 2} : std::vector<int>{2, 3}) {
    if ((*w)[size_t(a)] != ir::Dim(1)) return false;
  }
  return true;
}

// Whether node `p` averages its input X over H and W of `layout` with keepdims
// (GlobalAveragePool in NCHW, or ReduceMean over the spatial axes), X of rank 4.
bool spatial_mean(const Context& ctx, const ir::Node& p, const std::string& layout) {
  const bool nhwc = layout == "NHWC";
  const std::vector<ir::Dim>* x = ctx.shape(p.inputs[0]);
  if (p.outputs.size() != 1 || !x || x->size() != 4) return false;
  if (is_onnx(p, "GlobalAveragePool")) return !nhwc;
  if (int_attr(p, "keepdims", 1) != 1) return false;
  std::vector<int64_t> axes;
  if (p.inputs.size() > 1 && p.inputs[1] >= 0) {
    const ir::Value& a = ctx.value(p.inputs[1]);
    if (!a.constant) return false;
    for (int64_t i = 0; i < a.constant->numel(); ++i) axes.push_back(a.constant->int_at(i));
  } else {
    auto attr = ints_attr(p, "axes");
    if (!attr) return false;
    axes = *attr;
  }
  for (int64_t& a : axes) a = a < 0 ? a + 4 : a;
  std::ranges::sort(axes);
  return axes == (nhwc ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{2, 3});
}

// The gate's layout is the second FusedConv's; the first and the pool must agree with it.
bool one_layout(const Context& ctx, const Match& m, int node) {
  const std::string layout = str_attr(ctx.node(node), "layout", "NCHW");
  return str_attr(ctx.node(m.node("f1")), "layout", "NCHW") == layout &&
         spatial_mean(ctx, ctx.node(m.node("pool")), layout);
}

StatusOr<bool> fuse(Context& ctx, const Match& m) {
  const ir::Node& f1 = ctx.node(m.node("f1"));
  const ir::Node& f2 = ctx.node(m.matched[0]);
  const int x = m.value("x");
  const DType t = ctx.value(x).dtype;
  for (int v : {f1.inputs[1], f1.inputs[2], f2.inputs[1], f2.inputs[2], f2.outputs[0]}) {
    if (ctx.value(v).dtype != t) return false;
  }
  ir::Node se;
  se.domain = "kiln";
  se.op_type = "SqueezeExcite";
  se.opset = 1;
  se.name = f2.name + "_se";
  set_string(&se, "layout", str_attr(f2, "layout", "NCHW"));
  set_string(&se, "activation1", str_attr(f1, "activation", "none"));
  set_floats(&se, "activation1_params", floats_attr(f1, "activation_params"));
  set_string(&se, "activation2", str_attr(f2, "activation", "none"));
  set_floats(&se, "activation2_params", floats_attr(f2, "activation_params"));
  se.inputs = {x, f1.inputs[1], f1.inputs[2], f2.inputs[1], f2.inputs[2]};
  se.outputs = {f2.outputs[0]};
  // Unfused where the backend has no kernel.
  return rw::replace(ctx, m, std::move(se));
}

std::vector<rw::Rule> make_rules() {
  const Pat mean = rw::either({op("GlobalAveragePool", {any("x")}).as("pool"),
                               op("ReduceMean", {any("x")}).as("pool"),
                               op("ReduceMean", {any("x"), rw::optional()}).as("pool")});
  auto conv1x1 = [](Pat in) {
    return op("kiln::FusedConv", {std::move(in), constant(), constant()}).when(pointwise);
  };
  return {{"squeeze_excite", conv1x1(conv1x1(mean).as("f1")).when(one_layout), fuse}};
}

}  // namespace

Status fuse_squeeze_excite(ir::Graph* g, const SupportsFn& supports) {
  static const std::vector<rw::Rule> rules = make_rules();
  return rw::apply(g, rules, supports).status();
}

Status fuse_squeeze_excite(BuildState& s) {
  return fuse_squeeze_excite(&s.graph, backend_supports(s));
}

}  // namespace kiln::builder
