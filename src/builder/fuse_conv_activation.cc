// Pass fuse_conv_activation: a Conv, the residual Add after it and the activation after that
// become one kiln::FusedConv (ops/kiln_ops.cc), whose kernels apply bias, residual and activation
// in the convolution's epilogue instead of a pass over memory each. Rules on the rewriter
// (rewriter.h), each rooted at the last node it takes, every intermediate read by nothing else and
// no engine output:
//   ACT(Conv [+ Z])    ACT one of Relu, Clip(x, min, max) (constant bounds, either omitted),
//                      HardSwish, HardSigmoid, LeakyRelu, Sigmoid, Gelu (erf or tanh; canonicalize
//                      makes the written-out forms one Gelu), and SiLU as x * Sigmoid(x)
//   Conv + Z           where no activation follows (it is a longer rule's root then)
// Z, the residual, has the convolution's type and shape exactly (no broadcast), in either operand
// order, and is computed without the convolution (else the rewrite would make a cycle and is
// declined). Runs after fold_batch_norm (Conv + BatchNorm is a Conv by then) and before
// assign_precision (the fused op is a compute-bound one).
#include <cmath>
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
using rw::Context;
using rw::either;
using rw::Match;
using rw::op;
using rw::Pat;

bool same_type(const ir::Value& a, const ir::Value& b) {
  return a.dtype == b.dtype && a.shape && b.shape && *a.shape == *b.shape;
}

// The activations a FusedConv applies, by the op that computes it alone.
const char* activation_name(const ir::Node& n) {
  if (!n.domain.empty()) return nullptr;
  if (n.op_type == "Relu") return "relu";
  if (n.op_type == "HardSwish") return "hardswish";
  if (n.op_type == "Sigmoid") return "sigmoid";
  if (n.op_type == "HardSigmoid") return "hardsigmoid";
  if (n.op_type == "LeakyRelu") return "leaky_relu";
  if (n.op_type == "Clip" && n.opset >= 11) return "clip";
  if (n.op_type == "Gelu") {  // canonicalize makes the written-out forms this op
    auto approx = n.attrs.get_string("approximate", "none");
    if (approx.ok() && *approx == "none") return "gelu";
    if (approx.ok() && *approx == "tanh") return "gelu_tanh";
  }
  return nullptr;
}

// Whether an activation a rule takes reads `v` (alone, or as SiLU's Sigmoid and Mul): the Add
// before it is then that rule's to take.
bool activation_follows(const Context& ctx, int v) {
  auto readers = ctx.uses->readers(v);
  if (ctx.uses->is_output(v)) return false;
  if (readers.size() == 1) return activation_name(ctx.node(readers[0])) != nullptr;
  if (readers.size() != 2) return false;
  const ir::Node &a = ctx.node(readers[0]), &b = ctx.node(readers[1]);
  return (is_onnx(a, "Sigmoid") && is_onnx(b, "Mul")) ||
         (is_onnx(a, "Mul") && is_onnx(b, "Sigmoid"));
}

StatusOr<bool> fuse(Context& ctx, const Match& m, const std::string& act,
                    std::vector<float> params) {
  const ir::Node& conv = ctx.node(m.node("conv"));
  const int c = conv.outputs[0];
  const int z = m.value("z");
  if (z >= 0) {
    const int sum = ctx.node(m.node("add")).outputs[0];
    if (z == c || !same_type(ctx.value(z), ctx.value(c)) ||
        !same_type(ctx.value(sum), ctx.value(c)))
      return false;
  }
  ir::Node fused = conv;
  fused.replaced.clear();  // replace_nodes counts the Conv among the matched nodes
  fused.domain = "kiln";
  fused.op_type = "FusedConv";
  fused.opset = 1;
  fused.inputs.resize(3, -1);
  if (z >= 0) fused.inputs.push_back(z);
  set_string(&fused, "activation", act);
  if (!params.empty()) set_floats(&fused, "activation_params", std::move(params));
  fused.outputs = {ctx.node(m.matched[0]).outputs[0]};
  // Unfused where the backend has no kernel, or where the residual depends on the convolution.
  return rw::replace(ctx, m, std::move(fused));
}

StatusOr<bool> fuse_activation(Context& ctx, const Match& m) {
  const ir::Node& n = ctx.node(m.matched[0]);
  if (n.outputs.size() != 1) return false;
  const char* name = activation_name(n);
  if (!name) return false;
  auto f = [&](const char* attr, float fallback) {
    auto x = n.attrs.get_float(attr, fallback);
    return x.ok() ? *x : fallback;
  };
  std::vector<float> params;
  const std::string act = name;
  if (act == "hardsigmoid") params = {f("alpha", 0.2f), f("beta", 0.5f)};
  if (act == "leaky_relu") params = {f("alpha", 0.01f)};
  if (act == "clip") {
    const int lo = m.value("lo"), hi = m.value("hi");
    auto l = lo >= 0 ? ctx.scalar(lo) : std::optional<double>(-INFINITY);
    auto h = hi >= 0 ? ctx.scalar(hi) : std::optional<double>(INFINITY);
    if (!l || !h) return false;
    params = {float(*l), float(*h)};
  }
  return fuse(ctx, m, act, std::move(params));
}

StatusOr<bool> fuse_silu(Context& ctx, const Match& m) { return fuse(ctx, m, "silu", {}); }

StatusOr<bool> fuse_residual(Context& ctx, const Match& m) {
  if (activation_follows(ctx, ctx.node(m.matched[0]).outputs[0])) return false;
  return fuse(ctx, m, "none", {});
}

std::vector<rw::Rule> make_rules() {
  const Pat conv =
      either({op("Conv", {any(), any()}).as("conv"), op("Conv", {any(), any(), any()}).as("conv")});
  const Pat residual = op("Add", {conv, any("z")}).commutative().as("add");
  const Pat pre = either({residual, conv});
  std::vector<rw::Rule> rules;
  for (const char* type : {"Relu", "HardSwish", "Sigmoid", "HardSigmoid", "LeakyRelu", "Gelu"}) {
    rules.push_back({std::string("conv_") + type, op(type, {pre}), fuse_activation});
  }
  rules.push_back({"conv_clip", op("Clip", {pre}), fuse_activation});
  rules.push_back({"conv_clip_min", op("Clip", {pre, rw::optional("lo")}), fuse_activation});
  rules.push_back({"conv_clip_min_max", op("Clip", {pre, rw::optional("lo"), rw::optional("hi")}),
                   fuse_activation});
  // SiLU: the convolution (with its residual) read by the Sigmoid and the Mul, both in the match.
  rules.push_back({"conv_silu", op("Mul", {pre, op("Sigmoid", {pre})}).commutative(), fuse_silu});
  rules.push_back({"conv_residual", residual, fuse_residual});
  return rules;
}

}  // namespace

Status fuse_conv_activation(ir::Graph* g, const SupportsFn& supports) {
  static const std::vector<rw::Rule> rules = make_rules();
  return rw::apply(g, rules, supports).status();
}

Status fuse_conv_activation(BuildState& s) {
  return fuse_conv_activation(&s.graph, backend_supports(s));
}

}  // namespace kiln::builder
