// Channels last: kiln::FusedConv's layout "NHWC" (shape inference, errors, CPU reference against
// the NCHW one) and the passes on channels-last stacks (assign_layout, fuse_squeeze_excite,
// sink_conv_activation) on IR text, checked by the structure they leave and by engines of the
// rewritten graph against engines of the original on the CPU backend.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>

#include "backends/backend.h"
#include "builder/build_state.h"
#include "builder/builder.h"
#include "ir/rewrite.h"
#include "ir/text.h"
#include "kiln.h"
#include "model_util.h"
#include "op_harness.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using ir::Dim;

// A float32 tensor of rank 4 with its axes permuted (Transpose's meaning).
Tensor permute4(const Tensor& t, std::vector<int64_t> perm) {
  const Shape& in = t.shape();
  Shape out;
  for (int64_t p : perm) out.push_back(in[size_t(p)]);
  Tensor r = Tensor::zeros(DType::kFloat32, out).value();
  const int64_t stride[4] = {in[1] * in[2] * in[3], in[2] * in[3], in[3], 1};
  const float* src = t.data_as<float>();
  float* dst = r.data_as<float>();
  int64_t i = 0;
  for (int64_t a = 0; a < out[0]; ++a) {
    for (int64_t b = 0; b < out[1]; ++b) {
      for (int64_t c = 0; c < out[2]; ++c) {
        for (int64_t d = 0; d < out[3]; ++d) {
          dst[i++] = src[a * stride[perm[0]] + b * stride[perm[1]] + c * stride[perm[2]] +
                         d * stride[perm[3]]];
        }
      }
    }
  }
  return r;
}

// ---- kiln::FusedConv layout="NHWC" ----

OpNode fused_conv() { return op("FusedConv", 1, "kiln").named("fc"); }

TEST(FusedConvNhwc, InfersConvsShapeChannelsLast) {
  // X [b, H=8, W=10, C=6], W [K=8, kh=3, kw=1, C/group=3]: H (8 + 2 - 3) / 2 + 1 = 4, W (10 - 1) /
  // 2 + 1 = 5.
  OpNode node = fused_conv()
                    .s("layout", "NHWC")
                    .i("group", 2)
                    .ints("strides", {2, 2})
                    .ints("pads", {1, 0, 1, 0});
  auto r = infer_node(node, {f32({Dim::symbol("b"), 8, 10, 6}), f32({8, 3, 1, 3}), f32({8}),
                             f32({Dim::symbol("b"), 4, 5, 8})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[b, 4, 5, 8]");
  // The same convolution in NCHW: the same output, channels second.
  auto nchw =
      infer_node(fused_conv().i("group", 2).ints("strides", {2, 2}).ints("pads", {1, 0, 1, 0}),
                 {f32({Dim::symbol("b"), 6, 8, 10}), f32({8, 3, 3, 1})});
  ASSERT_TRUE(nchw.ok()) << nchw.status.to_string();
  EXPECT_EQ(nchw.shape(), "[b, 8, 4, 5]");
}

TEST(FusedConvNhwc, RefusesBadLayoutsAndShapes) {
  Status s =
      infer_node(fused_conv().s("layout", "NCWH"), {f32({1, 3, 4, 4}), f32({2, 3, 1, 1})}).status;
  EXPECT_EQ(s.code(), StatusCode::kInvalidModel);
  EXPECT_NE(s.message().find("layout 'NCWH' is not one of NCHW, NHWC"), std::string::npos)
      << s.message();
  // NHWC is 2-D only.
  s = infer_node(fused_conv().s("layout", "NHWC"), {f32({1, 4, 3}), f32({2, 1, 3})}).status;
  EXPECT_EQ(s.code(), StatusCode::kInvalidModel);
  EXPECT_NE(s.message().find("must have rank 4, got 3"), std::string::npos) << s.message();
  // Channels are X's last dim and W's last dim: 3 != 4, said in NCHW numbering.
  s = infer_node(fused_conv().s("layout", "NHWC"), {f32({1, 5, 5, 3}), f32({2, 1, 1, 4})}).status;
  EXPECT_EQ(s.code(), StatusCode::kInvalidModel);
  EXPECT_NE(s.message().find("(layout NHWC; dims numbered as in NCHW)"), std::string::npos)
      << s.message();
  // Z in NCHW order where Y is NHWC.
  s = infer_node(fused_conv().s("layout", "NHWC"),
                 {f32({1, 5, 6, 3}), f32({2, 1, 1, 3}), kOmitted, f32({1, 2, 5, 6})})
          .status;
  EXPECT_EQ(s.code(), StatusCode::kInvalidModel);
  EXPECT_NE(s.message().find("input 3 (Z)"), std::string::npos) << s.message();
}

TEST(FusedConvNhwc, CpuReferenceEqualsNchwTransposed) {
  // Grouped, strided, asymmetric padding, with bias, residual and activation: every part the
  // NHWC path routes differently.
  OpNode nchw = fused_conv()
                    .i("group", 2)
                    .ints("strides", {2, 1})
                    .ints("pads", {0, 1, 1, 0})
                    .s("activation", "leaky_relu")
                    .floats("activation_params", {0.1f});
  OpNode nhwc = nchw;
  nhwc.s("layout", "NHWC");
  Tensor x = random_f32({2, 4, 7, 6}, 1), w = random_f32({6, 2, 3, 2}, 2), b = random_f32({6}, 3);
  // H (7 + 1 - 3) / 2 + 1 = 3, W (6 + 1 - 2) + 1 = 6.
  Tensor z = random_f32({2, 6, 3, 6}, 4);
  auto ref = run_cpu_kernel(nchw.node, {x, w, b, z}, {{DType::kFloat32, {2, 6, 3, 6}}});
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  auto got = run_cpu_kernel(
      nhwc.node,
      {permute4(x, {0, 2, 3, 1}), permute4(w, {0, 2, 3, 1}), b, permute4(z, {0, 2, 3, 1})},
      {{DType::kFloat32, {2, 3, 6, 6}}});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ErrorStats e = error_stats(permute4(got->at(0), {0, 3, 1, 2}), ref->at(0));
  EXPECT_GT(e.ref_max_abs, 0.1);
  EXPECT_EQ(e.max_abs, 0.0);  // the same Conv on the same NCHW data: only the order changed
}

// ---- assign_layout ----

ir::Graph parse(const std::string& text) {
  auto g = ir::parse_text(text, {});
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  return g.ok() ? std::move(g).value() : ir::Graph{};
}

// Distinct pseudo-random values in every float constant of rank >= 1, so a filter or broadcast
// constant permuted the wrong way changes the result (the texts write splats for brevity).
ir::Graph randomized(const std::string& text) {
  ir::Graph g = parse(text);
  uint64_t seed = 100;
  for (ir::Value& v : g.values) {
    if (v.constant && v.constant->dtype() == DType::kFloat32 && v.constant->rank() > 0) {
      v.constant = random_f32(v.constant->shape(), seed++);
    }
  }
  return g;
}

// assign_layout on `g` with float32 convolutions accepted; the nodes named in `refuse` are not
// supported by the backend. Channel padding is off unless asked for: these graphs' 4 channels
// would each get a Pad (ChannelsNoMultipleOfEightArePadded tests it).
ir::Graph layout(ir::Graph g, std::set<std::string> refuse = {}, bool convert_float32 = true,
                 bool pad_channels = false) {
  auto supports = [&](const ir::Node& n, const std::vector<const ir::Value*>&,
                      const std::vector<const ir::Value*>&) { return !refuse.count(n.name); };
  Status st = builder::assign_layout(
      &g, supports,
      builder::LayoutOptions{.convert_float32 = convert_float32, .pad_channels = pad_channels});
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(ir::verify(g).ok()) << ir::verify(g).to_string();
  return g;
}

std::vector<const ir::Node*> nodes_of(const ir::Graph& g, const std::string& op_type) {
  std::vector<const ir::Node*> out;
  for (const ir::Node& n : g.nodes) {
    if (n.op_type == op_type) out.push_back(&n);
  }
  return out;
}

std::string layout_of(const ir::Node& n) {
  const ir::Attribute* a = n.attrs.find("layout");
  return a ? a->s : "NCHW";
}

const ir::Node* producer(const ir::Graph& g, int v) {
  int p = g.values[size_t(v)].producer;
  return p >= 0 ? &g.nodes[size_t(p)] : nullptr;
}

// Both graphs built as CPU engines over x's batch 1..3 and run at batch `batch`: the outputs agree.
void expect_same_outputs(const ir::Graph& original, const ir::Graph& rewritten, Shape x_shape) {
  Shape min = x_shape, max = x_shape;
  min[0] = 1;
  max[0] = 3;
  std::map<std::string, Tensor> outs[2];
  const ir::Graph* graphs[2] = {&original, &rewritten};
  Tensor x = random_f32(x_shape, 7);
  for (int k = 0; k < 2; ++k) {
    Network net;
    net.graph = *graphs[k];
    BuilderConfig config;
    OptimizationProfile p;
    ASSERT_TRUE(p.set_dimensions("x", min, max, max).ok());
    config.add_profile(p);
    auto engine = Builder().build(net, config);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string() << "\n" << ir::to_text(*graphs[k]);
    auto ctx = engine->create_execution_context();
    ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
    auto out = (*ctx)->run({{"x", x}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    outs[k] = std::move(out).value();
  }
  ASSERT_FALSE(outs[0].empty());
  for (const auto& [name, expected] : outs[0]) {
    ASSERT_EQ(outs[1].count(name), 1u) << name;
    EXPECT_EQ(outs[1].at(name).shape(), expected.shape()) << name;
    ErrorStats e = error_stats(outs[1].at(name), expected);
    EXPECT_GT(e.ref_max_abs, 1e-3) << name;  // not a trivially zero output
    EXPECT_LE(e.max_abs, 1e-5 * std::max(1.0, e.ref_max_abs)) << name << "\n"
                                                              << ir::to_text(rewritten);
  }
}

// Conv -> Relu -> Conv -> Add(the Relu's output) -> Relu: a residual block.
const char* kResidual = R"(graph g(%x: float32[n, 4, 6, 6]) -> (%y: float32[n, 4, 6, 6]) {
  opset ai.onnx 17
  %w1: float32[4, 4, 3, 3] = dense<0.1>
  %b1: float32[4] = dense<0.1>
  %w2: float32[4, 4, 3, 3] = dense<0.1>
  %c1: float32[n, 4, 6, 6] = Conv(%x, %w1, %b1) {pads=[1, 1, 1, 1]}  # conv1
  %r1: float32[n, 4, 6, 6] = Relu(%c1)  # relu1
  %c2: float32[n, 4, 6, 6] = Conv(%r1, %w2) {pads=[1, 1, 1, 1]}  # conv2
  %a: float32[n, 4, 6, 6] = Add(%c2, %r1)  # residual
  %y: float32[n, 4, 6, 6] = Relu(%a)  # relu2
}
)";

// Exactly two transposes, at the engine's input and output; every convolution NHWC.
void expect_nhwc_between_boundaries(const ir::Graph& g) {
  const std::string text = ir::to_text(g);
  auto transposes = nodes_of(g, "Transpose");
  ASSERT_EQ(transposes.size(), 2u) << text;
  EXPECT_EQ(transposes[0]->inputs[0], g.inputs[0]) << text;
  EXPECT_EQ(transposes[1]->outputs[0], g.outputs[0]) << text;
  EXPECT_TRUE(nodes_of(g, "Conv").empty()) << text;
  auto convs = nodes_of(g, "FusedConv");
  EXPECT_FALSE(convs.empty()) << text;
  for (const ir::Node* c : convs) EXPECT_EQ(layout_of(*c), "NHWC") << text;
}

// Whisper's stem: two 1-D convolutions with GELU between and after them (the second strided).
const char* kConv1d = R"(graph g(%x: float32[n, 4, 12]) -> (%y: float32[n, 8, 6]) {
  opset ai.onnx 20
  %w1: float32[8, 4, 3] = dense<0.1>
  %b1: float32[8] = dense<0.1>
  %w2: float32[8, 8, 3] = dense<0.1>
  %b2: float32[8] = dense<0.1>
  %c1: float32[n, 8, 12] = Conv(%x, %w1, %b1) {kernel_shape=[3], pads=[1, 1]}  # conv1
  %g1: float32[n, 8, 12] = Gelu(%c1)  # gelu1
  %c2: float32[n, 8, 6] = Conv(%g1, %w2, %b2) {kernel_shape=[3], pads=[1, 1], strides=[2]}  # conv2
  %y: float32[n, 8, 6] = Gelu(%c2)  # gelu2
}
)";

TEST(AssignLayout, OneDimensionalConvolutionsRunChannelsLastAsTwoDimensionalOnes) {
  ir::Graph original = randomized(kConv1d);
  ir::Graph g = layout(original);
  const std::string text = ir::to_text(g);
  EXPECT_TRUE(nodes_of(g, "Conv").empty()) << text;
  auto convs = nodes_of(g, "FusedConv");
  ASSERT_EQ(convs.size(), 2u) << text;
  for (const ir::Node* c : convs) {
    EXPECT_EQ(layout_of(*c), "NHWC") << text;
    EXPECT_EQ(g.values[size_t(c->inputs[1])].shape->size(), 4u) << text;
  }
  expect_same_outputs(original, g, {2, 4, 12});
}

TEST(AssignLayout, WhispersStemKeepsOneTransposeAfterItsGeluFuses) {
  // As the CUDA pipeline takes Whisper's stem: each Gelu joins its convolution
  // (fuse_conv_activation), the fused 1-D convolutions lift to 2-D NHWC ones, the views between
  // them cancel and so do the transposes around them, and the model's permute to [n, L, C] after
  // the last one reads the NHWC output as it is: a transpose of the input is all that moves data.
  std::string text = kConv1d;
  text.replace(text.find("-> (%y: float32[n, 8, 6])"), 25, "-> (%y: float32[n, 6, 8])");
  text.replace(text.find("%y: float32[n, 8, 6] = Gelu(%c2)"), 32,
               "%g2: float32[n, 8, 6] = Gelu(%c2)");
  text.replace(text.rfind("}"), 1,
               "  %y: float32[n, 6, 8] = Transpose(%g2) {perm=[0, 2, 1]}  # permute\n}");
  ir::Graph original = randomized(text);
  ir::Graph g = original;
  auto all = [](const ir::Node&, const std::vector<const ir::Value*>&,
                const std::vector<const ir::Value*>&) { return true; };
  ASSERT_TRUE(builder::fuse_conv_activation(&g, all).ok());
  g = layout(g);
  const std::string out = ir::to_text(g);
  auto transposes = nodes_of(g, "Transpose");
  ASSERT_EQ(transposes.size(), 1u) << out;
  EXPECT_EQ(g.values[size_t(transposes[0]->inputs[0])].shape->size(), 4u)
      << out;  // x viewed as 2-D
  EXPECT_TRUE(nodes_of(g, "Gelu").empty()) << out;
  auto convs = nodes_of(g, "FusedConv");
  ASSERT_EQ(convs.size(), 2u) << out;
  for (const ir::Node* c : convs) {
    EXPECT_EQ(layout_of(*c), "NHWC") << out;
    EXPECT_EQ(c->attrs.find("activation")->s, "gelu") << out;
  }
  const ir::Node* last = producer(g, g.outputs[0]);
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->op_type, "Reshape") << out;
  expect_same_outputs(original, g, {2, 4, 12});
}

TEST(AssignLayout, ResidualBlockIsNhwcBetweenTwoTransposes) {
  ir::Graph original = randomized(kResidual);
  ir::Graph g = layout(original);
  expect_nhwc_between_boundaries(g);
  EXPECT_EQ(nodes_of(g, "FusedConv").size(), 2u);
  // The Relus and the Add moved into NHWC: they compute on [n, 6, 6, 4].
  for (const char* op : {"Relu", "Add"}) {
    for (const ir::Node* n : nodes_of(g, op)) {
      EXPECT_EQ(ir::dims_to_string(*g.values[size_t(n->outputs[0])].shape), "[n, 6, 6, 4]") << op;
    }
  }
  // The filters are new constants in KRSC order: w1[k=1, c=2, r=0, s=1] is at [1, 0, 1, 2].
  const ir::Node* conv1 = nodes_of(g, "FusedConv")[0];
  const Tensor& w = *g.values[size_t(conv1->inputs[1])].constant;
  ASSERT_EQ(w.shape(), (Shape{4, 3, 3, 4}));
  const Tensor& w1 = *original.values[size_t(original.find_value("w1"))].constant;
  EXPECT_EQ(w.float_at(((1 * 3 + 0) * 3 + 1) * 4 + 2), w1.float_at(((1 * 4 + 2) * 3 + 0) * 3 + 1));
  expect_same_outputs(original, g, {2, 4, 6, 6});
}

TEST(AssignLayout, FusedConvsWithResidualsConvertToo) {
  // As the pipeline runs it: fuse_conv_activation first, so conv2 is a FusedConv reading the
  // residual as Z, which must be transposed (and then cancels with conv1's output transpose).
  ir::Graph original = randomized(kResidual);
  auto all = [](const ir::Node&, const std::vector<const ir::Value*>&,
                const std::vector<const ir::Value*>&) { return true; };
  ASSERT_TRUE(builder::fuse_conv_activation(&original, all).ok());
  ASSERT_EQ(nodes_of(original, "FusedConv").size(), 2u);
  ASSERT_EQ(nodes_of(original, "FusedConv")[1]->inputs.size(), 4u);  // the residual as Z
  ir::Graph g = layout(original);
  expect_nhwc_between_boundaries(g);
  const ir::Node* conv2 = nodes_of(g, "FusedConv")[1];
  EXPECT_EQ(producer(g, conv2->inputs[3]),
            producer(g, conv2->inputs[0]));  // Z is conv1's NHWC output
  EXPECT_EQ(nodes_of(g, "Relu").size(), 0u);
  expect_same_outputs(original, g, {3, 4, 6, 6});
}

TEST(AssignLayout, OnlyHalfPrecisionByDefaultAndNothingTheBackendRefuses) {
  // float32 convolutions stay NCHW without the option.
  ir::Graph f32_graph = randomized(kResidual);
  EXPECT_EQ(ir::to_text(layout(f32_graph, {}, /*convert_float32=*/false)), ir::to_text(f32_graph));
  // float16 ones convert by default.
  std::string half = kResidual;
  for (size_t at; (at = half.find("float32")) != std::string::npos;) half.replace(at, 7, "float16");
  ir::Graph h = layout(parse(half), {}, /*convert_float32=*/false);
  EXPECT_EQ(nodes_of(h, "FusedConv").size(), 2u) << ir::to_text(h);
  EXPECT_EQ(h.values[size_t(nodes_of(h, "FusedConv")[0]->inputs[1])].dtype, DType::kFloat16);
  // A refused conversion leaves the node NCHW; the other converts.
  ir::Graph original = randomized(kResidual);
  ir::Graph g = layout(original, {"conv2"});
  const std::string text = ir::to_text(g);
  ASSERT_EQ(nodes_of(g, "Conv").size(), 1u) << text;
  EXPECT_EQ(nodes_of(g, "Conv")[0]->name, "conv2");
  EXPECT_EQ(ir::dims_to_string(*g.values[size_t(nodes_of(g, "Conv")[0]->inputs[0])].shape),
            "[n, 4, 6, 6]");
  ASSERT_EQ(nodes_of(g, "FusedConv").size(), 1u) << text;
  EXPECT_EQ(nodes_of(g, "FusedConv")[0]->name, "conv1");
  expect_same_outputs(original, g, {2, 4, 6, 6});
  // Every conversion refused: the graph is unchanged.
  EXPECT_EQ(ir::to_text(layout(original, {"conv1", "conv2"})), ir::to_text(original));
}

// Two convolutions of the same input, and of the same weights, summed.
const char* kBranches = R"(graph g(%x: float32[n, 4, 5, 5]) -> (%y: float32[n, 4, 5, 5]) {
  opset ai.onnx 17
  %w1: float32[4, 4, 3, 3] = dense<0.1>
  %w2: float32[4, 4, 1, 1] = dense<0.1>
  %c1: float32[n, 4, 5, 5] = Conv(%x, %w1) {pads=[1, 1, 1, 1]}  # conv1
  %c2: float32[n, 4, 5, 5] = Conv(%x, %w1) {pads=[1, 1, 1, 1], strides=[1, 1]}  # conv2
  %c3: float32[n, 4, 5, 5] = Conv(%x, %w2)  # conv3
  %s: float32[n, 4, 5, 5] = Sum(%c1, %c2, %c3)  # sum
  %y: float32[n, 4, 5, 5] = Relu(%s)  # relu
}
)";

TEST(AssignLayout, SharedInputsAndFiltersAreConvertedOnce) {
  ir::Graph original = randomized(kBranches);
  ir::Graph g = layout(original);
  expect_nhwc_between_boundaries(g);  // one transpose of x for the three convolutions
  auto convs = nodes_of(g, "FusedConv");
  ASSERT_EQ(convs.size(), 3u);
  EXPECT_EQ(convs[0]->inputs[1], convs[1]->inputs[1]);  // w1 reordered once
  EXPECT_NE(convs[0]->inputs[1], convs[2]->inputs[1]);
  expect_same_outputs(original, g, {2, 4, 5, 5});
}

// Grouped, strided, asymmetrically padded and dilated convolutions around a MaxPool, then a
// product with a constant of rank 3 (broadcast over n, permuted to NHWC at build).
const char* kPooled = R"(graph g(%x: float32[n, 4, 6, 6]) -> (%y: float32[n, 6, 1, 2]) {
  opset ai.onnx 17
  %w1: float32[4, 2, 3, 3] = dense<0.1>
  %w2: float32[6, 4, 2, 2] = dense<0.1>
  %k: float32[6, 1, 2] = dense<0.1>
  %c1: float32[n, 4, 3, 5] = Conv(%x, %w1) {group=2, pads=[0, 1, 1, 0], strides=[2, 1]}  # conv1
  %p: float32[n, 4, 2, 4] = MaxPool(%c1) {kernel_shape=[2, 2]}  # pool
  %c2: float32[n, 6, 1, 2] = Conv(%p, %w2) {dilations=[1, 2]}  # conv2
  %s: float32[n, 6, 1, 2] = Mul(%c2, %k)  # scale
  %y: float32[n, 6, 1, 2] = Sigmoid(%s)  # sig
}
)";

// The pool of kPooled as `pool_text` (ending in its comment), the rest unchanged.
std::string with_pool(const std::string& pool_text) {
  std::string text = kPooled;
  const size_t at = text.find("MaxPool(%c1) {kernel_shape=[2, 2]}  # pool");
  text.replace(at, std::string("MaxPool(%c1) {kernel_shape=[2, 2]}  # pool").size(), pool_text);
  return text;
}

// The pool, its reading and its result inside the NHWC stack: kiln::Pool{layout="NHWC"} reads the
// first convolution's NHWC output and the second convolution reads its output, no transpose
// between; only x and y are transposed.
const ir::Node* expect_pool_inside_stack(const ir::Graph& g, const std::string& mode) {
  const std::string text = ir::to_text(g);
  EXPECT_EQ(nodes_of(g, "Transpose").size(), 2u) << text;
  EXPECT_TRUE(nodes_of(g, "MaxPool").empty()) << text;
  EXPECT_TRUE(nodes_of(g, "AveragePool").empty()) << text;
  auto pools = nodes_of(g, "Pool");
  EXPECT_EQ(pools.size(), 1u) << text;
  if (pools.size() != 1) return nullptr;
  const ir::Node* pool = pools[0];
  EXPECT_EQ(pool->domain, "kiln");
  EXPECT_EQ(layout_of(*pool), "NHWC") << text;
  EXPECT_EQ(pool->attrs.get_string("mode", "").value(), mode) << text;
  EXPECT_EQ(producer(g, pool->inputs[0])->op_type, "FusedConv") << text;
  EXPECT_EQ(ir::dims_to_string(*g.values[size_t(pool->outputs[0])].shape), "[n, 2, 4, 4]") << text;
  auto convs = nodes_of(g, "FusedConv");
  EXPECT_EQ(convs.size(), 2u) << text;
  for (const ir::Node* c : convs) EXPECT_EQ(layout_of(*c), "NHWC") << text;
  if (convs.size() == 2) EXPECT_EQ(convs[1]->inputs[0], pool->outputs[0]) << text;
  return pool;
}

TEST(AssignLayout, MaxPoolComputesNhwcInsideTheStack) {
  ir::Graph original = randomized(kPooled);
  ir::Graph g = layout(original);
  const std::string text = ir::to_text(g);
  const ir::Node* pool = expect_pool_inside_stack(g, "max");
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->name, "pool");
  EXPECT_EQ(pool->attrs.get_ints("kernel_shape", std::nullopt).value(),
            (std::vector<int64_t>{2, 2}));
  ASSERT_EQ(nodes_of(g, "Mul").size(), 1u) << text;
  const ir::Value& k = g.values[size_t(nodes_of(g, "Mul")[0]->inputs[1])];
  ASSERT_TRUE(k.constant) << text;
  EXPECT_EQ(k.constant->shape(), (Shape{1, 1, 2, 6})) << text;
  expect_same_outputs(original, g, {2, 4, 6, 6});
  // The plan records the layout each node computes in: NHWC for the convolutions and the pool.
  BuilderConfig config;
  OptimizationProfile p;
  ASSERT_TRUE(p.set_dimensions("x", {1, 4, 6, 6}, {2, 4, 6, 6}, {2, 4, 6, 6}).ok());
  config.add_profile(p);
  auto plan = builder::build_plan(g, 0, config, **backends::get_backend(Device::kCPU));
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  int nhwc = 0;
  for (const plan::NodePlan& np : plan->nodes) {
    nhwc += np.layout == "NHWC";
    EXPECT_TRUE(np.layout.empty() || np.layout == "NHWC") << np.layout;
  }
  EXPECT_EQ(nhwc, 3);
}

TEST(AssignLayout, AveragePoolComputesNhwcWithItsAttributes) {
  // ceil_mode, count_include_pad and asymmetric strides carried over: H (3 + 2 - 3) / 2 + 1 = 2,
  // W 5 - 2 + 1 = 4, the same output shape as kPooled's MaxPool.
  ir::Graph original = randomized(with_pool(
      "AveragePool(%c1) {kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 0], ceil_mode=1, "
      "count_include_pad=1}  # pool"));
  ir::Graph g = layout(original);
  const ir::Node* pool = expect_pool_inside_stack(g, "average");
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->attrs.get_int("count_include_pad", 0).value(), 1);
  EXPECT_EQ(pool->attrs.get_int("ceil_mode", 0).value(), 1);
  EXPECT_EQ(pool->attrs.get_ints("pads", std::nullopt).value(), (std::vector<int64_t>{1, 0, 1, 0}));
  expect_same_outputs(original, g, {3, 4, 6, 6});
}

TEST(AssignLayout, PoolsStayNchwWithIndicesOrWhereRefused) {
  // Indices number NCHW positions: that MaxPool keeps its transposes (x, the pool's input and
  // output, y).
  std::string text = kPooled;
  const std::string pool_line = "%p: float32[n, 4, 2, 4] = MaxPool(%c1) {kernel_shape=[2, 2]}";
  text.replace(text.find(pool_line), pool_line.size(),
               "%p: float32[n, 4, 2, 4], %i: int64[n, 4, 2, 4] = MaxPool(%c1) "
               "{kernel_shape=[2, 2]}");
  text.replace(text.find("-> (%y: float32[n, 6, 1, 2])"),
               std::string("-> (%y: float32[n, 6, 1, 2])").size(),
               "-> (%y: float32[n, 6, 1, 2], %i: int64[n, 4, 2, 4])");
  for (const auto& [label, g] : {std::pair{"indices", layout(randomized(text))},
                                 std::pair{"refused", layout(randomized(kPooled), {"pool"})}}) {
    const std::string out = ir::to_text(g);
    EXPECT_EQ(nodes_of(g, "Transpose").size(), 4u) << label << "\n" << out;
    EXPECT_TRUE(nodes_of(g, "Pool").empty()) << label << "\n" << out;
    ASSERT_EQ(nodes_of(g, "MaxPool").size(), 1u) << label << "\n" << out;
    const ir::Node* pool = nodes_of(g, "MaxPool")[0];
    EXPECT_EQ(producer(g, pool->inputs[0])->op_type, "Transpose") << label << "\n" << out;
    EXPECT_EQ(ir::dims_to_string(*g.values[size_t(pool->outputs[0])].shape), "[n, 4, 2, 4]")
        << label;
  }
  ir::Graph original = randomized(text);
  expect_same_outputs(original, layout(original), {2, 4, 6, 6});
}

// MobileNetV3's squeeze-excitation with 1x1 convolutions: GlobalAveragePool -> Conv -> Relu ->
// Conv -> HardSigmoid -> Mul(x, s), between two convolutions.
const char* kSqueezeExcite = R"(graph g(%x: float32[n, 8, 5, 5]) -> (%y: float32[n, 8, 5, 5]) {
  opset ai.onnx 17
  %w0: float32[8, 8, 3, 3] = dense<0.1>
  %w1: float32[4, 8, 1, 1] = dense<0.1>
  %b1: float32[4] = dense<0.1>
  %w2: float32[8, 4, 1, 1] = dense<0.1>
  %b2: float32[8] = dense<0.1>
  %w3: float32[8, 8, 1, 1] = dense<0.1>
  %c: float32[n, 8, 5, 5] = Conv(%x, %w0) {pads=[1, 1, 1, 1]}  # conv0
  %h: float32[n, 8, 5, 5] = HardSwish(%c)  # hswish
  %gap: float32[n, 8, 1, 1] = GlobalAveragePool(%h)  # gap
  %s1: float32[n, 4, 1, 1] = Conv(%gap, %w1, %b1)  # se1
  %s2: float32[n, 4, 1, 1] = Relu(%s1)  # se_relu
  %s3: float32[n, 8, 1, 1] = Conv(%s2, %w2, %b2)  # se2
  %s: float32[n, 8, 1, 1] = HardSigmoid(%s3) {alpha=0.1666667}  # se_gate
  %m: float32[n, 8, 5, 5] = Mul(%h, %s)  # se_scale
  %y: float32[n, 8, 5, 5] = Conv(%m, %w3)  # conv3
}
)";

TEST(AssignLayout, SqueezeExcitationKeepsTheTensorNhwc) {
  for (int opset : {17, 18}) {
    std::string text = kSqueezeExcite;
    text.replace(text.find("ai.onnx 17"), 10, "ai.onnx " + std::to_string(opset));
    ir::Graph original = randomized(text);
    ir::Graph g = layout(original);
    expect_nhwc_between_boundaries(g);
    EXPECT_EQ(nodes_of(g, "FusedConv").size(), 4u);
    // The pool is a ReduceMean over H and W of the NHWC tensor, axes where the opset takes them.
    EXPECT_TRUE(nodes_of(g, "GlobalAveragePool").empty());
    ASSERT_EQ(nodes_of(g, "ReduceMean").size(), 1u);
    const ir::Node* mean = nodes_of(g, "ReduceMean")[0];
    EXPECT_EQ(mean->inputs.size(), opset >= 18 ? 2u : 1u) << opset;
    EXPECT_EQ(mean->attrs.has("axes"), opset < 18) << opset;
    EXPECT_EQ(ir::dims_to_string(*g.values[size_t(mean->outputs[0])].shape), "[n, 1, 1, 8]");
    // The scale multiplies the NHWC tensor by an [n, 1, 1, 8] gate: no transpose on either.
    ASSERT_EQ(nodes_of(g, "Mul").size(), 1u);
    for (int v : nodes_of(g, "Mul")[0]->inputs) EXPECT_NE(producer(g, v)->op_type, "Transpose");
    expect_same_outputs(original, g, {2, 8, 5, 5});
  }
}

// The same block with a fully connected gate (Flatten -> Gemm -> Sigmoid -> Unsqueeze): the gate
// arrives as an NCHW [n, 8, 1, 1] value and the pool leaves through Flatten, so both hops between
// the layouts remain, as Reshapes.
const char* kGemmSqueezeExcite = R"(graph g(%x: float32[n, 8, 5, 5]) -> (%y: float32[n, 8, 5, 5]) {
  opset ai.onnx 17
  %w0: float32[8, 8, 3, 3] = dense<0.1>
  %wf: float32[8, 8] = dense<0.1>
  %bf: float32[8] = dense<0.1>
  %axes: int64[2] = dense<[2, 3]>
  %w3: float32[8, 8, 1, 1] = dense<0.1>
  %c: float32[n, 8, 5, 5] = Conv(%x, %w0) {pads=[1, 1, 1, 1]}  # conv0
  %gap: float32[n, 8, 1, 1] = GlobalAveragePool(%c)  # gap
  %f: float32[n, 8] = Flatten(%gap)  # flat
  %g1: float32[n, 8] = Gemm(%f, %wf, %bf) {transB=1}  # fc
  %sg: float32[n, 8] = Sigmoid(%g1)  # gate
  %s: float32[n, 8, 1, 1] = Unsqueeze(%sg, %axes)  # unsqueeze
  %m: float32[n, 8, 5, 5] = Mul(%c, %s)  # se_scale
  %y: float32[n, 8, 5, 5] = Conv(%m, %w3)  # conv3
}
)";

TEST(AssignLayout, UnitSpatialHopsBecomeReshapes) {
  ir::Graph original = randomized(kGemmSqueezeExcite);
  ir::Graph g = layout(original);
  expect_nhwc_between_boundaries(g);
  const std::string text = ir::to_text(g);
  auto reshapes = nodes_of(g, "Reshape");
  ASSERT_EQ(reshapes.size(), 2u) << text;
  // [n, 1, 1, 8] -> [n, 8, 1, 1] after the ReduceMean, [n, 8, 1, 1] -> [n, 1, 1, 8] for the gate;
  // the batch dim copied (0), so one shape serves every n.
  std::set<std::string> hops;
  for (const ir::Node* r : reshapes) {
    hops.insert(ir::dims_to_string(*g.values[size_t(r->inputs[0])].shape) + "->" +
                ir::dims_to_string(*g.values[size_t(r->outputs[0])].shape));
    const Tensor& shape = *g.values[size_t(r->inputs[1])].constant;
    ASSERT_EQ(shape.numel(), 4);
    EXPECT_EQ(shape.int_at(0), 0);
  }
  EXPECT_EQ(hops,
            (std::set<std::string>{"[n, 1, 1, 8]->[n, 8, 1, 1]", "[n, 8, 1, 1]->[n, 1, 1, 8]"}))
      << text;
  expect_same_outputs(original, g, {3, 8, 5, 5});
}

}  // namespace
// An RGB stem: 3 input channels become 4 (a Pad of the NHWC input, zero filter channels), which
// computes the same; a depthwise convolution (group = C) is left alone.
const char* kStem = R"(graph g(%x: float32[n, 3, 9, 9]) -> (%y: float32[n, 6, 5, 5]) {
  opset ai.onnx 17
  %w1: float32[6, 3, 3, 3] = dense<0.1>
  %b1: float32[6] = dense<0.1>
  %w2: float32[6, 1, 3, 3] = dense<0.1>
  %c1: float32[n, 6, 5, 5] = Conv(%x, %w1, %b1) {pads=[1, 1, 1, 1], strides=[2, 2]}  # stem
  %r1: float32[n, 6, 5, 5] = Relu(%c1)  # relu
  %y: float32[n, 6, 5, 5] = Conv(%r1, %w2) {group=6, pads=[1, 1, 1, 1]}  # depthwise
}
)";

TEST(AssignLayout, FewChannelsArePaddedToFour) {
  ir::Graph original = randomized(kStem);
  ir::Graph g = layout(original, {}, true, /*pad_channels=*/true);
  auto pads = nodes_of(g, "Pad");
  ASSERT_EQ(pads.size(), 1u) << ir::to_text(g);
  EXPECT_EQ(ir::dims_to_string(*g.values[size_t(pads[0]->outputs[0])].shape), "[n, 9, 9, 4]");
  auto convs = nodes_of(g, "FusedConv");
  ASSERT_EQ(convs.size(), 2u);
  EXPECT_EQ(convs[0]->inputs[0], pads[0]->outputs[0]);
  const Tensor& w = *g.values[size_t(convs[0]->inputs[1])].constant;
  ASSERT_EQ(w.shape(), (Shape{6, 3, 3, 4}));
  for (int64_t i = 0; i < w.numel(); ++i) {
    if (i % 4 >= 3) EXPECT_EQ(w.float_at(i), 0.0) << i;
  }
  EXPECT_EQ(g.values[size_t(convs[1]->inputs[1])].constant->shape(), (Shape{6, 3, 3, 1}));
  expect_same_outputs(original, g, {2, 3, 9, 9});
}

// An image given channels-last (kiln.torch's engine input for a channels-last module): the model's
// own Transpose to NCHW meets the one assign_layout puts in front of the stack and both go, on the
// CPU's form and on CUDA's, whose few channels are padded to four.
const char* kChannelsLastImage = R"(graph g(%x: float32[n, 9, 9, 3]) -> (%y: float32[n, 6, 5, 5]) {
  opset ai.onnx 17
  %w1: float32[6, 3, 3, 3] = dense<0.1>
  %b1: float32[6] = dense<0.1>
  %w2: float32[6, 1, 3, 3] = dense<0.1>
  %t: float32[n, 3, 9, 9] = Transpose(%x) {perm=[0, 3, 1, 2]}  # to_nchw
  %c1: float32[n, 6, 5, 5] = Conv(%t, %w1, %b1) {pads=[1, 1, 1, 1], strides=[2, 2]}  # stem
  %r1: float32[n, 6, 5, 5] = Relu(%c1)  # relu
  %y: float32[n, 6, 5, 5] = Conv(%r1, %w2) {group=6, pads=[1, 1, 1, 1]}  # depthwise
}
)";

TEST(AssignLayout, AChannelsLastImageNeedsNoTransposeIn) {
  ir::Graph original = randomized(kChannelsLastImage);
  for (bool pad : {false, true}) {
    ir::Graph g = layout(original, {}, true, pad);
    int in_transposes = 0;
    for (const ir::Node& n : g.nodes) {
      // The only Transpose left is the output's (NHWC -> NCHW after the depthwise conv).
      if (n.op_type == "Transpose" && n.inputs[0] == g.find_value("x")) ++in_transposes;
    }
    EXPECT_EQ(in_transposes, 0) << ir::to_text(g);
    EXPECT_EQ(nodes_of(g, "Transpose").size(), 1u) << ir::to_text(g);
    expect_same_outputs(original, g, {2, 9, 9, 3});
  }
}

// ---- fuse_squeeze_excite ----

// MobileNetV3's squeeze-and-excitation block after a convolution: the gate (pool, 1x1 conv, Relu,
// 1x1 conv, HardSigmoid) scales the conv's activations.
const char* kSqueezeExciteBlock = R"(graph g(%x: float32[n, 8, 6, 6]) -> (%y: float32[n, 8, 6, 6]) {
  opset ai.onnx 17
  %w0: float32[8, 8, 3, 3] = dense<0.1>
  %b0: float32[8] = dense<0.1>
  %w1: float32[4, 8, 1, 1] = dense<0.1>
  %b1: float32[4] = dense<0.1>
  %w2: float32[8, 4, 1, 1] = dense<0.1>
  %b2: float32[8] = dense<0.1>
  %c: float32[n, 8, 6, 6] = Conv(%x, %w0, %b0) {pads=[1, 1, 1, 1]}  # conv
  %a: float32[n, 8, 6, 6] = Relu(%c)  # relu
  %s: float32[n, 8, 1, 1] = GlobalAveragePool(%a)  # pool
  %f1: float32[n, 4, 1, 1] = Conv(%s, %w1, %b1)  # fc1
  %r1: float32[n, 4, 1, 1] = Relu(%f1)  # fc1_relu
  %f2: float32[n, 8, 1, 1] = Conv(%r1, %w2, %b2)  # fc2
  %g: float32[n, 8, 1, 1] = HardSigmoid(%f2) {alpha=0.1666667, beta=0.5}  # gate
  %y: float32[n, 8, 6, 6] = Mul(%a, %g)  # scale
}
)";

TEST(FuseSqueezeExcite, GateBecomesOneOpInEitherLayout) {
  auto all = [](const ir::Node&, const std::vector<const ir::Value*>&,
                const std::vector<const ir::Value*>&) { return true; };
  ir::Graph original = randomized(kSqueezeExciteBlock);
  ir::Graph fused = original;
  ASSERT_TRUE(builder::fuse_conv_activation(&fused, all).ok());
  ASSERT_EQ(nodes_of(fused, "FusedConv").size(), 3u) << ir::to_text(fused);
  // NCHW (float32 engines): GlobalAveragePool -> FusedConv -> FusedConv.
  ir::Graph nchw = fused;
  ASSERT_TRUE(builder::fuse_squeeze_excite(&nchw, all).ok());
  ASSERT_TRUE(ir::verify(nchw).ok()) << ir::verify(nchw).to_string();
  std::string text = ir::to_text(nchw);
  ASSERT_EQ(nodes_of(nchw, "SqueezeExcite").size(), 1u) << text;
  const ir::Node* se = nodes_of(nchw, "SqueezeExcite")[0];
  EXPECT_EQ(layout_of(*se), "NCHW");
  EXPECT_EQ(se->attrs.find("activation1")->s, "relu");
  EXPECT_EQ(se->attrs.find("activation2")->s, "hardsigmoid");
  EXPECT_EQ(nodes_of(nchw, "FusedConv").size(), 1u) << text;
  EXPECT_TRUE(nodes_of(nchw, "GlobalAveragePool").empty()) << text;
  EXPECT_EQ(se->replaced,
            (std::map<std::string, int64_t>{
                {"Conv", 2}, {"GlobalAveragePool", 1}, {"HardSigmoid", 1}, {"Relu", 1}}));
  expect_same_outputs(original, nchw, {2, 8, 6, 6});
  // NHWC, as assign_layout leaves a half-precision stack: ReduceMean over H and W -> NHWC 1x1s.
  ir::Graph nhwc = layout(fused);
  ASSERT_TRUE(builder::fuse_squeeze_excite(&nhwc, all).ok());
  ASSERT_TRUE(ir::verify(nhwc).ok()) << ir::verify(nhwc).to_string();
  text = ir::to_text(nhwc);
  ASSERT_EQ(nodes_of(nhwc, "SqueezeExcite").size(), 1u) << text;
  EXPECT_EQ(layout_of(*nodes_of(nhwc, "SqueezeExcite")[0]), "NHWC") << text;
  EXPECT_TRUE(nodes_of(nhwc, "ReduceMean").empty()) << text;
  EXPECT_EQ(nodes_of(nhwc, "FusedConv").size(), 1u) << text;
  expect_same_outputs(original, nhwc, {2, 8, 6, 6});
  // A backend without the kernel, or the pooled value read elsewhere: nothing fuses.
  ir::Graph refused = fused;
  auto none = [](const ir::Node& n, const std::vector<const ir::Value*>&,
                 const std::vector<const ir::Value*>&) { return n.op_type != "SqueezeExcite"; };
  ASSERT_TRUE(builder::fuse_squeeze_excite(&refused, none).ok());
  EXPECT_EQ(ir::to_text(refused), ir::to_text(fused));
  std::string shared = kSqueezeExciteBlock;
  shared.replace(shared.find("-> (%y: float32[n, 8, 6, 6])"), 28,
                 "-> (%y: float32[n, 8, 6, 6], %s: float32[n, 8, 1, 1])");
  ir::Graph sg = randomized(shared);
  ASSERT_TRUE(builder::fuse_conv_activation(&sg, all).ok());
  const std::string sg_before = ir::to_text(sg);
  ASSERT_TRUE(builder::fuse_squeeze_excite(&sg, all).ok());
  EXPECT_EQ(ir::to_text(sg), sg_before);
}

// ---- sink_conv_activation ----

// EfficientNet's inverted-residual block: a 1x1 expansion with SiLU (as x * Sigmoid(x)), a 3x3
// depthwise convolution at stride 2 with SiLU, a 1x1 projection.
const char* kInvertedResidual = R"(graph g(%x: float32[n, 4, 6, 6]) -> (%y: float32[n, 4, 3, 3]) {
  opset ai.onnx 17
  %we: float32[8, 4, 1, 1] = dense<0.1>
  %be: float32[8] = dense<0.1>
  %wd: float32[8, 1, 3, 3] = dense<0.1>
  %bd: float32[8] = dense<0.1>
  %wp: float32[4, 8, 1, 1] = dense<0.1>
  %bp: float32[4] = dense<0.1>
  %e: float32[n, 8, 6, 6] = Conv(%x, %we, %be)  # expand
  %es: float32[n, 8, 6, 6] = Sigmoid(%e)  # expand_sigmoid
  %ea: float32[n, 8, 6, 6] = Mul(%e, %es)  # expand_silu
  %d: float32[n, 8, 3, 3] = Conv(%ea, %wd, %bd) {group=8, pads=[1, 1, 1, 1], strides=[2, 2]}  # dw
  %ds: float32[n, 8, 3, 3] = Sigmoid(%d)  # dw_sigmoid
  %da: float32[n, 8, 3, 3] = Mul(%d, %ds)  # dw_silu
  %y: float32[n, 4, 3, 3] = Conv(%da, %wp, %bp)  # project
}
)";

// After fuse_conv_activation and assign_layout, the expansion's SiLU moves into the depthwise
// node where the backend runs the rewritten nodes, and the engine of that graph (CPU, batch 1..3)
// computes what the model does; a backend with no kernel applying an input activation (CUDA's
// float32 engines) gets the graph as it was.
TEST(SinkConvActivation, ExpansionActivationMovesIntoTheDepthwiseWhereAKernelTakesIt) {
  auto all = [](const ir::Node&, const std::vector<const ir::Value*>&,
                const std::vector<const ir::Value*>&) { return true; };
  ir::Graph original = randomized(kInvertedResidual);
  ir::Graph fused = original;
  ASSERT_TRUE(builder::fuse_conv_activation(&fused, all).ok());
  ir::Graph nhwc = layout(fused);
  ASSERT_EQ(nodes_of(nhwc, "FusedConv").size(), 3u) << ir::to_text(nhwc);
  auto no_input_activation = [](const ir::Node& n, const std::vector<const ir::Value*>&,
                                const std::vector<const ir::Value*>&) {
    return !n.attrs.has("input_activation");
  };
  ir::Graph kept = nhwc;
  ASSERT_TRUE(builder::sink_conv_activation(&kept, no_input_activation).ok());
  EXPECT_EQ(ir::to_text(kept), ir::to_text(nhwc));
  ir::Graph sunk = nhwc;
  ASSERT_TRUE(builder::sink_conv_activation(&sunk, all).ok());
  ASSERT_TRUE(ir::verify(sunk).ok()) << ir::verify(sunk).to_string();
  const std::string text = ir::to_text(sunk);
  const std::vector<const ir::Node*> convs = nodes_of(sunk, "FusedConv");
  ASSERT_EQ(convs.size(), 3u) << text;
  for (const ir::Node* conv : convs) EXPECT_EQ(layout_of(*conv), "NHWC") << text;
  EXPECT_EQ(convs[0]->attrs.find("activation")->s, "none") << text;
  ASSERT_NE(convs[1]->attrs.find("input_activation"), nullptr) << text;
  EXPECT_EQ(convs[1]->attrs.find("input_activation")->s, "silu") << text;
  EXPECT_EQ(convs[1]->attrs.find("activation")->s, "silu") << text;
  EXPECT_EQ(convs[2]->attrs.find("input_activation"), nullptr) << text;  // the projection: 1x1
  expect_same_outputs(original, sunk, {2, 4, 6, 6});
}

TEST(FuseSqueezeExcite, OpInfersRunsOnTheCpuAndRefusesMismatchedFilters) {
  const char* text = R"(graph g(%x: float16[n, 3, 3, 8]) -> (%g: float16[n, 1, 1, 8]) {
  opset ai.onnx 17
  opset kiln 1
  %w1: float16[2, 1, 1, 8] = dense<0.5>
  %b1: float16[2] = dense<0.25>
  %w2: float16[8, 1, 1, 2] = dense<-0.5>
  %b2: float16[8] = dense<0.125>
  %g: float16[n, 1, 1, 8] = kiln::SqueezeExcite(%x, %w1, %b1, %w2, %b2) {layout="NHWC", activation1="relu", activation2="sigmoid"}  # se
}
)";
  BuilderConfig config;
  OptimizationProfile p;
  ASSERT_TRUE(p.set_dimensions("x", {1, 3, 3, 8}, {2, 3, 3, 8}, {2, 3, 3, 8}).ok());
  config.add_profile(p);
  Network net;
  net.graph = parse(text);
  auto engine = Builder().build(net, config);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  // x = 1 everywhere: mean 1, hidden relu(8 * 0.5 + 0.25) = 4.25, gate sigmoid(2 * -0.5 * 4.25 +
  // 0.125).
  Tensor x = Tensor::zeros(DType::kFloat16, {2, 3, 3, 8}).value();
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<uint16_t>()[i] = 0x3C00;  // 1.0
  auto out = (*ctx)->run({{"x", x}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const Tensor& gate = out->at("g");
  ASSERT_EQ(gate.shape(), (Shape{2, 1, 1, 8}));
  const double want = 1.0 / (1.0 + std::exp(-(2 * -0.5 * 4.25 + 0.125)));
  for (int64_t i = 0; i < gate.numel(); ++i) EXPECT_NEAR(gate.float_at(i), want, 1e-3) << i;
  std::string bad = text;
  bad.replace(bad.find("%w2: float16[8, 1, 1, 2]"), 24, "%w2: float16[8, 1, 1, 3]");
  Network bad_net;
  bad_net.graph = parse(bad);
  auto refused = Builder().build(bad_net, config);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("W2 reads W1's outputs"), std::string::npos)
      << refused.status().to_string();
}

}  // namespace kiln::testing
