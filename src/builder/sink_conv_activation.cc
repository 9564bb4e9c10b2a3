// Pass sink_conv_activation: the activation of a FusedConv that feeds a channels-last depthwise
// FusedConv moves into the depthwise node's input_activation. In an inverted-residual block
// (MobileNetV2/V3, EfficientNet) the 1x1 expansion then needs only its bias, which cuBLASLt's
// epilogue applies, and the depthwise kernel applies the activation once per element while it
// stages its input tile: the pass over the expanded tensor (its widest) that applied it goes.
// One rule on the rewriter (rewriter.h), rooted at the depthwise node D:
//   P = kiln::FusedConv{layout="NHWC", activation=A != "none"} (any kernel, with or without bias
//       and residual), its output read by D alone and no engine output
//   D = kiln::FusedConv{layout="NHWC", no input_activation}(P, W, B?, Z?), depthwise: group = C,
//       X's channel count, = K, W's dim 0, and W [K, kh, kw, 1]; D reads P's output as X only
//   -> P{activation="none"}, D{input_activation=A, input_activation_params=P's params}
// Exact: D's zero padding pads A(P's output), as input_activation's meaning says. Both rewritten
// nodes must have a kernel, else the graph stays as it was: on CUDA only the depthwise kernel's
// tile tactic applies an input activation (conv_depthwise.cu: the dtypes, filters, strides and
// channel counts it takes). Meant to run after assign_layout, which makes the channels-last
// stack, on CUDA builds. It is NOT in the pipeline: measured on an H200 (20th session, FP16,
// kiln bench), EfficientNetV2-S at batch 32 took 7.11 ms with it against 5.89 without, and
// MobileNetV3-Large at batch 64 1.57 against 1.26: the tile kernel it sends every such layer to
// took 65-198 us on 3x3 layers where the strip and one-pixel kernels took 34-80 us plus an
// epilogue pass of 13-26. It goes in once the tile kernel beats them (conv_depthwise.cu).
#include <string>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "builder/rewriter.h"
#include "ops/conv_activation.h"

namespace kiln::builder {
namespace {

using rw::any;
using rw::Context;
using rw::either;
using rw::Match;
using rw::op;
using rw::Pat;

// The producer: channels-last, one output, an activation of conv_activation.h other than none.
bool activated_producer(const Context& ctx, const Match&, int node) {
  const ir::Node& p = ctx.node(node);
  const ops::ConvActivationInfo* act = ops::find_conv_activation(str_attr(p, "activation", "none"));
  return p.outputs.size() == 1 && str_attr(p, "layout", "NCHW") == "NHWC" && act != nullptr &&
         act->kind != ops::ConvActivation::kNone;
}

// The consumer: channels-last, depthwise with one filter per channel, no input activation yet,
// reading the producer's output as X alone (as W or Z it would lose the activation there).
bool depthwise_consumer(const Context& ctx, const Match&, int node) {
  const ir::Node& d = ctx.node(node);
  if (d.outputs.size() != 1 || str_attr(d, "layout", "NCHW") != "NHWC" ||
      str_attr(d, "input_activation", "none") != "none") {
    return false;
  }
  const int x = d.inputs[0];
  for (size_t i = 1; i < d.inputs.size(); ++i) {
    if (d.inputs[i] == x) return false;
  }
  auto group = d.attrs.get_int("group", 1);
  const std::vector<ir::Dim>* xs = ctx.shape(x);
  const std::vector<ir::Dim>* ws = ctx.shape(d.inputs[1]);
  if (!group.ok() || !xs || !ws || xs->size() != 4 || ws->size() != 4) return false;
  const ir::Dim& c = (*xs)[3];
  return c == ir::Dim(*group) && (*ws)[0] == c && (*ws)[3] == ir::Dim(1);
}

StatusOr<bool> sink(Context& ctx, const Match& m) {
  const int d = m.matched[0], p = m.node("p");
  ir::Node producer = ctx.node(p);
  ir::Node consumer = ctx.node(d);
  auto params = producer.attrs.get_floats("activation_params", std::vector<float>{});
  if (!params.ok()) return false;
  set_string(&consumer, "input_activation", str_attr(producer, "activation", "none"));
  if (!params->empty()) set_floats(&consumer, "input_activation_params", *params);
  ir::Attributes attrs;
  for (const auto& [name, a] : producer.attrs.all()) {
    if (name != "activation_params") attrs.set(name, a);
  }
  producer.attrs = std::move(attrs);
  set_string(&producer, "activation", "none");
  // Both as rewritten, or neither: the values they read and write are unchanged, so the nodes
  // are edited in place and the use lists stay as they are.
  if (!node_supported(*ctx.graph, producer, *ctx.supports) ||
      !node_supported(*ctx.graph, consumer, *ctx.supports)) {
    return false;
  }
  ctx.graph->nodes[size_t(p)] = std::move(producer);
  ctx.graph->nodes[size_t(d)] = std::move(consumer);
  return true;
}

std::vector<rw::Rule> make_rules() {
  // The producer with or without B and Z (an omitted B before a Z reads as an omitted input).
  const Pat producer = either(
      {op("kiln::FusedConv", {any(), any()}).as("p").when(activated_producer),
       op("kiln::FusedConv", {any(), any(), rw::optional()}).as("p").when(activated_producer),
       op("kiln::FusedConv", {any(), any(), rw::optional(), rw::optional()})
           .as("p")
           .when(activated_producer)});
  return {
      {"sink_into_depthwise", op("kiln::FusedConv", {producer, any()}).when(depthwise_consumer),
       sink},
      {"sink_into_depthwise_bias",
       op("kiln::FusedConv", {producer, any(), rw::optional()}).when(depthwise_consumer), sink},
      {"sink_into_depthwise_residual",
       op("kiln::FusedConv", {producer, any(), rw::optional(), rw::optional()})
           .when(depthwise_consumer),
       sink},
  };
}

}  // namespace

Status sink_conv_activation(ir::Graph* g, const SupportsFn& supports) {
  static const std::vector<rw::Rule> rules = make_rules();
  return rw::apply(g, rules, supports).status();
}

Status sink_conv_activation(BuildState& s) {
  return sink_conv_activation(&s.graph, backend_supports(s));
}

}  // namespace kiln::builder
