// The builder's graph passes, each on IR text in and IR text out, and end to end through a built
// engine: fold_batch_norm.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "backends/backend.h"
#include "backends/kernel_registry.h"
#include "builder/build_state.h"
#include "ir/rewrite.h"
#include "ir/text.h"
#include "kiln.h"
#include "model_util.h"
#include "ops/elementwise_program.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

ir::Graph parse(const std::string& text) {
  auto g = ir::parse_text(text, {});
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  return g.ok() ? std::move(g).value() : ir::Graph{};
}

// Runs one pass over `g` as the pipeline would (CPU backend, default config).
std::string run_pass(Status (*pass)(builder::BuildState&), ir::Graph g) {
  BuilderConfig config;
  builder::BuildState s{std::move(g), config, **backends::get_backend(Device::kCPU)};
  Status st = pass(s);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(ir::verify(s.graph).ok()) << ir::verify(s.graph).to_string();
  ir::compact(&s.graph);
  return ir::to_text(s.graph);
}

// Conv (1x1, two channels, with bias) -> BatchNormalization -> Relu.
const char* kConvBn = R"(graph g(%x: float32[n, 2, 2, 2]) -> (%y: float32[n, 2, 2, 2]) {
  opset ai.onnx 17
  %w: float32[2, 2, 1, 1] = dense<[1.0, 2.0, 3.0, 4.0]>
  %b: float32[2] = dense<[0.5, -1.0]>
  %scale: float32[2] = dense<[2.0, 0.5]>
  %shift: float32[2] = dense<[1.0, 0.0]>
  %mean: float32[2] = dense<[0.5, 1.0]>
  %var: float32[2] = dense<[3.0, 0.25]>
  %c: float32[n, 2, 2, 2] = Conv(%x, %w, %b)  # conv
  %bn: float32[n, 2, 2, 2] = BatchNormalization(%c, %scale, %shift, %mean, %var) {epsilon=1.0}  # bn
  %y: float32[n, 2, 2, 2] = Relu(%bn)  # relu
}
)";

TEST(FoldBatchNorm, FoldsIntoTheConvsWeightsAndBias) {
  // s = scale / sqrt(var + 1) = [1, 0.5 / sqrt(1.25)]; W' = W * s per output channel;
  // B' = (b - mean) * s + shift = [1, -2 * s1].
  const double s1 = 0.5 / std::sqrt(1.25);
  char w1[64], w2[64], b1[64];
  std::snprintf(w1, sizeof w1, "%.9g", 3.0 * s1);
  std::snprintf(w2, sizeof w2, "%.9g", 4.0 * s1);
  std::snprintf(b1, sizeof b1, "%.9g", -2.0 * s1);
  std::string text = run_pass(builder::fold_batch_norm, parse(kConvBn));
  EXPECT_EQ(text.find("BatchNormalization"), std::string::npos) << text;
  EXPECT_NE(
      text.find("%bn: float32[n, 2, 2, 2] = Conv(%x, %conv_bn_weight, %conv_bn_bias)  # conv"),
      std::string::npos)
      << text;
  ir::Graph g = parse(text);
  const Tensor& w = *g.values[size_t(g.find_value("conv_bn_weight"))].constant;
  const Tensor& b = *g.values[size_t(g.find_value("conv_bn_bias"))].constant;
  EXPECT_FLOAT_EQ(float(w.float_at(0)), 1.0f);
  EXPECT_FLOAT_EQ(float(w.float_at(1)), 2.0f);
  EXPECT_FLOAT_EQ(float(w.float_at(2)), float(3.0 * s1)) << w1;
  EXPECT_FLOAT_EQ(float(w.float_at(3)), float(4.0 * s1)) << w2;
  EXPECT_FLOAT_EQ(float(b.float_at(0)), 1.0f);
  EXPECT_FLOAT_EQ(float(b.float_at(1)), float(-2.0 * s1)) << b1;
}

TEST(FoldBatchNorm, LeavesWhatItCannotFold) {
  // The Conv's output is also a graph output: folding would change it.
  std::string shared = kConvBn;
  shared.replace(shared.find("-> (%y: float32[n, 2, 2, 2])"), 28,
                 "-> (%y: float32[n, 2, 2, 2], %c: float32[n, 2, 2, 2])");
  EXPECT_NE(run_pass(builder::fold_batch_norm, parse(shared)).find("BatchNormalization"),
            std::string::npos);
  // Statistics computed at run time.
  std::string runtime_var = kConvBn;
  runtime_var.replace(runtime_var.find("(%x: float32[n, 2, 2, 2])"), 25,
                      "(%x: float32[n, 2, 2, 2], %var: float32[2])");
  runtime_var.erase(runtime_var.find("  %var: float32[2] = dense<[3.0, 0.25]>\n"), 41);
  EXPECT_NE(run_pass(builder::fold_batch_norm, parse(runtime_var)).find("BatchNormalization"),
            std::string::npos);
}

TEST(FoldBatchNorm, EngineMatchesTheUnfoldedGraph) {
  // The folded engine against the same Conv and BatchNormalization run by the reference kernels.
  ir::Graph g = parse(kConvBn);
  auto engine = build_cpu(g, {1, 2, 2, 2}, {3, 2, 2, 2});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  // One layer: the Conv with the BatchNormalization folded in, fused with the Relu after it.
  ASSERT_EQ(engine->num_layers(), 1);
  EXPECT_EQ(engine->layers()[0].op_type, "FusedConv");
  Tensor x = random_f32({3, 2, 2, 2}, 11);
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  auto out = (*ctx)->run({{"x", x}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  std::map<int, Tensor> unfolded = run_unfused(g, x);
  ErrorStats e = error_stats(out->at("y"), unfolded.at(g.find_value("y")));
  EXPECT_LE(e.max_abs, 1e-6) << e.max_abs;
}

// ---- assign_precision ----

// Conv -> Relu -> Softmax -> Pow -> output, and the Relu's output also an engine output.
const char* kMixed =
    R"(graph g(%x: float32[1, 2, 2, 2]) -> (%y: float32[1, 2, 2, 2], %r: float32[1, 2, 2, 2]) {
  opset ai.onnx 17
  %w: float32[2, 2, 1, 1] = dense<[1.0, 2.0, 3.0, 4.0]>
  %two: float32[] = dense<2.0>
  %c: float32[1, 2, 2, 2] = Conv(%x, %w)  # conv
  %r: float32[1, 2, 2, 2] = Relu(%c)  # relu
  %s: float32[1, 2, 2, 2] = Softmax(%r)  # softmax
  %y: float32[1, 2, 2, 2] = Pow(%s, %two)  # pow
}
)";

std::string assign(const char* text, std::set<std::string> refuse = {}) {
  ir::Graph g = parse(text);
  auto supports = [&](const ir::Node& n, const std::vector<const ir::Value*>&,
                      const std::vector<const ir::Value*>&) { return !refuse.count(n.op_type); };
  Status st = builder::assign_precision(&g, DType::kFloat16, supports);
  EXPECT_TRUE(st.ok()) << st.to_string();
  ir::compact(&g);
  return ir::to_text(g);
}

TEST(AssignPrecision, AFoldedNodeKeepsItsOutputsInTheTypeOfTheirData) {
  // A MatMul of two constants folded by infer_shapes (its output holds data, the node is still in
  // the graph until eliminate_dead_nodes) feeds a computed Add: the folded output keeps FP32 with
  // its FP32 data and reaches the Add as a converted FP16 constant, never as an FP16 value whose
  // data is FP32 (Swin-V2-T's relative position bias failed the plan verifier so).
  ir::Graph g = parse(R"(graph g(%x: float32[2, 2]) -> (%y: float32[2, 2]) {
  opset ai.onnx 17
  %a: float32[2, 2] = dense<[1.0, 2.0, 3.0, 4.0]>
  %b: float32[2, 2] = dense<[1.0, 0.0, 0.0, 1.0]>
  %m: float32[2, 2] = MatMul(%a, %b)  # table_mlp
  %p: float32[2, 2] = MatMul(%x, %b)  # proj
  %y: float32[2, 2] = Add(%p, %m)  # add
}
)");
  const int m = g.find_value("m");
  g.values[size_t(m)].constant = Tensor::from_vector<float>(DType::kFloat32, {2, 2}, {1, 2, 3, 4});
  auto supports = [](const ir::Node&, const std::vector<const ir::Value*>&,
                     const std::vector<const ir::Value*>&) { return true; };
  Status st = builder::assign_precision(&g, DType::kFloat16, supports);
  ASSERT_TRUE(st.ok()) << st.to_string();
  for (const ir::Value& v : g.values) {
    if (v.constant) {
      EXPECT_EQ(v.constant->dtype(), v.dtype) << v.name << "\n" << ir::to_text(g);
    }
  }
  EXPECT_EQ(g.values[size_t(m)].dtype, DType::kFloat32);
  const int p = g.find_value("p");
  EXPECT_EQ(g.values[size_t(p)].dtype, DType::kFloat16) << ir::to_text(g);
}

TEST(AssignPrecision, AGatherOfAConstantTableRunsReduced) {
  // An embedding: the FP32 table converts at build time and the Gather of token ids runs in FP16
  // (no Cast before or after it); the Add after it follows. A Gather whose data is an activation
  // arriving in FP32 (an engine input) keeps it.
  EXPECT_EQ(
      assign(
          R"(graph g(%ids: int64[2, 3], %x: float32[4, 2]) -> (%y: float32[2, 3, 2], %z: float32[2, 3, 2]) {
  opset ai.onnx 17
  %table: float32[4, 2] = dense<[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]>
  %e: float32[2, 3, 2] = Gather(%table, %ids)  # embed
  %y: float32[2, 3, 2] = Relu(%e)  # act
  %z: float32[2, 3, 2] = Gather(%x, %ids)  # pick
}
)"),
      R"(graph g(%ids: int64[2, 3], %x: float32[4, 2]) -> (%y: float32[2, 3, 2], %z: float32[2, 3, 2]) {
  opset ai.onnx 17
  %table_fp16: float16[4, 2] = dense<[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]>
  %e: float16[2, 3, 2] = Gather(%table_fp16, %ids)  # embed
  %y_fp16: float16[2, 3, 2] = Relu(%e)  # act
  %z: float32[2, 3, 2] = Gather(%x, %ids)  # pick
  %y: float32[2, 3, 2] = Cast(%y_fp16) {to=1}  # y_cast
}
)");
}

TEST(AssignPrecision, ActivationsStayReducedWithCastsOnlyAtBoundaries) {
  // The Conv runs in FP16 (its weight converted at build), the Relu and the Softmax follow; Pow
  // is FP32-class, so it gets its input cast back; the engine output %r keeps its type through
  // a cast at the end.
  EXPECT_EQ(
      assign(kMixed),
      R"(graph g(%x: float32[1, 2, 2, 2]) -> (%y: float32[1, 2, 2, 2], %r: float32[1, 2, 2, 2]) {
  opset ai.onnx 17
  %two: float32[] = dense<[2.0]>
  %w_fp16: float16[2, 2, 1, 1] = dense<[1.0, 2.0, 3.0, 4.0]>
  %x_fp16: float16[1, 2, 2, 2] = Cast(%x) {to=10}  # x_fp16_cast
  %c: float16[1, 2, 2, 2] = Conv(%x_fp16, %w_fp16)  # conv
  %r_fp16: float16[1, 2, 2, 2] = Relu(%c)  # relu
  %s: float16[1, 2, 2, 2] = Softmax(%r_fp16)  # softmax
  %s_fp32: float32[1, 2, 2, 2] = Cast(%s) {to=1}  # s_fp32_cast
  %y: float32[1, 2, 2, 2] = Pow(%s_fp32, %two)  # pow
  %r: float32[1, 2, 2, 2] = Cast(%r_fp16) {to=1}  # r_cast
}
)");
}

TEST(AssignPrecision, AnUnsupportedNodeStaysFloat32) {
  // No FP16 Softmax: it runs in FP32 and the chain after it has no reduced input to follow.
  std::string text = assign(kMixed, {"Softmax"});
  EXPECT_NE(text.find("%s: float32[1, 2, 2, 2] = Softmax(%r_fp32)"), std::string::npos) << text;
  EXPECT_NE(text.find("%y: float32[1, 2, 2, 2] = Pow(%s, %two)"), std::string::npos) << text;
  // Nothing supported: the graph is unchanged.
  EXPECT_EQ(assign(kMixed, {"Conv", "Relu", "Softmax", "Pow"}), ir::to_text(parse(kMixed)));
}

// ---- fuse_conv_activation ----

// One fusion pass over IR text with a backend that supports every fused node (or none), the graph
// verified and compacted after it.
using FusionPass = Status (*)(ir::Graph*, const builder::SupportsFn&);
std::string run_fusion(FusionPass pass, const std::string& text, bool supported) {
  ir::Graph g = parse(text);
  auto supports = [&](const ir::Node&, const std::vector<const ir::Value*>&,
                      const std::vector<const ir::Value*>&) { return supported; };
  Status st = pass(&g, supports);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(ir::verify(g).ok()) << ir::verify(g).to_string();
  ir::compact(&g);
  return ir::to_text(g);
}

// `text` with one more engine output, `extra`, after its last one, `last` (both "%name: type").
std::string with_output(std::string text, const std::string& last, const std::string& extra) {
  const std::string from = last + ") {";
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << last;
  if (at != std::string::npos) text.replace(at, from.size(), last + ", " + extra + ") {");
  return text;
}

std::string fuse(const std::string& text, bool supported = true) {
  return run_fusion(builder::fuse_conv_activation, text, supported);
}

// A residual block's end: Conv -> Add(identity) -> Relu; then Conv -> Clip(0, 6); then
// Conv -> SiLU (x * Sigmoid(x)).
const char* kConvChains =
    R"(graph g(%x: float32[1, 2, 4, 4]) -> (%y: float32[1, 2, 4, 4], %q: float32[1, 2, 4, 4]) {
  opset ai.onnx 17
  %w: float32[2, 2, 1, 1] = dense<[1.0, -2.0, 3.0, -4.0]>
  %b: float32[2] = dense<[0.5, -0.5]>
  %lo: float32[] = dense<0.0>
  %hi: float32[] = dense<6.0>
  %c: float32[1, 2, 4, 4] = Conv(%x, %w, %b)  # conv1
  %a: float32[1, 2, 4, 4] = Add(%c, %x)  # residual
  %r: float32[1, 2, 4, 4] = Relu(%a)  # relu
  %c2: float32[1, 2, 4, 4] = Conv(%r, %w)  # conv2
  %y: float32[1, 2, 4, 4] = Clip(%c2, %lo, %hi)  # relu6
  %c3: float32[1, 2, 4, 4] = Conv(%y, %w, %b)  # conv3
  %s: float32[1, 2, 4, 4] = Sigmoid(%c3)  # sig
  %q: float32[1, 2, 4, 4] = Mul(%c3, %s)  # silu
}
)";

TEST(FuseConvActivation, ResidualClipAndSiluChainsBecomeFusedConvs) {
  std::string text = fuse(kConvChains);
  for (const char* part :
       {"%r: float32[1, 2, 4, 4] = kiln::FusedConv(%x, %w, %b, %x) {activation=\"relu\"}  # conv1",
        "%y: float32[1, 2, 4, 4] = kiln::FusedConv(%r, %w, _) {activation=\"clip\", "
        "activation_params=[0.0, 6.0]}  # conv2",
        "%q: float32[1, 2, 4, 4] = kiln::FusedConv(%y, %w, %b) {activation=\"silu\"}  # conv3"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  }
  for (const char* op : {"Add(", "Relu(", "Clip(", "Sigmoid(", "Mul("}) {
    EXPECT_EQ(text.find(op), std::string::npos) << op << "\n" << text;
  }
}

TEST(FuseConvActivation, LeavesSharedOutputsAndUnsupportedBackendsAlone) {
  // %y, the Clip's output, is an engine output and also read by conv3: conv2's activation still
  // fuses (its output is the fused node's), but a Conv whose output is an engine output does not.
  std::string shared = kConvChains;
  const std::string outs = "(%y: float32[1, 2, 4, 4], %q";
  shared.replace(shared.find(outs), outs.size(),
                 "(%y: float32[1, 2, 4, 4], %c3: float32[1, 2, 4, 4], %q");
  std::string text = fuse(shared);
  EXPECT_NE(text.find("Sigmoid(%c3)"), std::string::npos) << text;
  EXPECT_EQ(fuse(kConvChains, /*supported=*/false), ir::to_text(parse(kConvChains)));
}

TEST(FuseConvActivation, EngineMatchesTheUnfusedGraph) {
  ir::Graph g = parse(kConvChains);
  auto engine = build_cpu(g, {1, 2, 4, 4}, {1, 2, 4, 4});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  ASSERT_EQ(engine->num_layers(), 3);  // three kiln::FusedConv
  Tensor x = random_f32({1, 2, 4, 4}, 5);
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  auto out = (*ctx)->run({{"x", x}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  std::map<int, Tensor> v = run_unfused(g, x);
  for (const char* name : {"y", "q"}) {
    ErrorStats e = error_stats(out->at(name), v.at(g.find_value(name)));
    EXPECT_LE(e.max_abs, 1e-5 * std::max(1.0, e.ref_max_abs)) << name;
  }
}

// ---- fuse_elementwise ----

std::string fuse_ew(const std::string& text, bool supported = true) {
  return run_fusion(builder::fuse_elementwise, text, supported);
}

// A linear layer's bias and erf GELU as exporters write them, then a float16 branch: a Cast
// down, a broadcast multiply by a per-row gate, a Cast back up (precision assignment's casts).
// %h (the biased product) is also an engine output, so the chain above it starts after it.
const char* kEwChains =
    R"(graph g(%x: float32[2, 3, 8], %w: float32[8, 8], %gate: float16[2, 1, 1]) -> (%y: float32[2, 3, 8], %h: float32[2, 3, 8], %z: float32[2, 3, 8]) {
  opset ai.onnx 17
  %b: float32[8] = dense<[0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7, -0.8]>
  %sqrt2: float32[] = dense<1.4142135>
  %one: float32[] = dense<1.0>
  %half: float32[] = dense<0.5>
  %m: float32[2, 3, 8] = MatMul(%x, %w)  # fc
  %h: float32[2, 3, 8] = Add(%m, %b)  # bias
  %d: float32[2, 3, 8] = Div(%h, %sqrt2)  # gelu_div
  %e: float32[2, 3, 8] = Erf(%d)  # gelu_erf
  %p: float32[2, 3, 8] = Add(%e, %one)  # gelu_add
  %q: float32[2, 3, 8] = Mul(%h, %p)  # gelu_mul
  %y: float32[2, 3, 8] = Mul(%q, %half)  # gelu_half
  %c: float16[2, 3, 8] = Cast(%x) {to=10}  # down
  %g: float16[2, 3, 8] = Mul(%c, %gate)  # gated
  %s: float16[2, 3, 8] = Sigmoid(%g)  # sig
  %z: float32[2, 3, 8] = Cast(%s) {to=1}  # up
}
)";

TEST(FuseElementwise, GeluAndCastChainsBecomeOneNodeEach) {
  std::string text = fuse_ew(kEwChains);
  for (const char* part :
       {"%y: float32[2, 3, 8] = kiln::Elementwise(%h, %sqrt2, %one, %half) {alpha=[0.0, 0.0, 0.0, "
        "0.0, 0.0], "
        "args=[0, 1, 4, -1, 5, 2, 0, 6, 7, 3], beta=[0.0, 0.0, 0.0, 0.0, 0.0], "
        "ops=[\"Div\", \"Erf\", \"Add\", \"Mul\", \"Mul\"], to=[1, 1, 1, 1, 1]}  # gelu_half",
        "%z: float32[2, 3, 8] = kiln::Elementwise(%x, %gate) {alpha=[0.0, 0.0, 0.0, 0.0], "
        "args=[0, -1, 2, 1, 3, -1, 4, -1], beta=[0.0, 0.0, 0.0, 0.0], "
        "ops=[\"Cast\", \"Mul\", \"Sigmoid\", \"Cast\"], to=[10, 10, 10, 1]}  # up",
        "%h: float32[2, 3, 8] = Add(%m, %b)  # bias"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  }
  EXPECT_EQ(fuse_ew(kEwChains, /*supported=*/false), ir::to_text(parse(kEwChains)));
}

TEST(FuseElementwise, AValueReadOutsideTheChainEndsIt) {
  // %e is read by the chain and by an engine output's node: the chain above %e fuses on its own,
  // and %e stays a value both read.
  std::string shared = kEwChains;
  const std::string outs = "%z: float32[2, 3, 8]) {";
  shared.replace(shared.find(outs), outs.size(), "%z: float32[2, 3, 8], %k: float32[2, 3, 8]) {");
  shared.replace(shared.rfind('}'), 1, "  %k: float32[2, 3, 8] = Neg(%e)  # neg\n}");
  std::string text = fuse_ew(shared);
  EXPECT_NE(text.find("%e: float32[2, 3, 8] = kiln::Elementwise(%h, %sqrt2)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("%k: float32[2, 3, 8] = Neg(%e)"), std::string::npos) << text;
  EXPECT_NE(text.find("%y: float32[2, 3, 8] = kiln::Elementwise(%e, %one, %h, %half)"),
            std::string::npos)
      << text;
}

TEST(FuseElementwise, TheCpuReferenceRoundsAsTheUnfusedChain) {
  // The fused nodes run on the CPU reference (each instruction the ONNX op's kernel, rounded to
  // its dtype) and match the unfused ops' results bit for bit.
  ir::Graph g = parse(kEwChains);
  ir::Graph fused = g;
  auto yes = [](const ir::Node&, const std::vector<const ir::Value*>&,
                const std::vector<const ir::Value*>&) { return true; };
  ASSERT_TRUE(builder::fuse_elementwise(&fused, yes).ok());
  std::map<int, Tensor> v;
  v[g.find_value("x")] = random_f32({2, 3, 8}, 3);
  v[g.find_value("w")] = random_f32({8, 8}, 4);
  auto gate = run_cpu_kernel(g.nodes[size_t(g.values[size_t(g.find_value("c"))].producer)],
                             {random_f32({2, 1, 1}, 5)}, {{DType::kFloat16, {2, 1, 1}}});
  ASSERT_TRUE(gate.ok()) << gate.status().to_string();
  v[g.find_value("gate")] = gate->at(0);
  for (size_t k = 0; k < g.values.size(); ++k) {
    if (g.values[k].constant) v[int(k)] = *g.values[k].constant;
  }
  auto shape_of = [](const ir::Value& val) {
    Shape s;
    for (const ir::Dim& d : *val.shape) s.push_back(d.value());
    return s;
  };
  std::map<int, Tensor> unfused = v, fused_values = v;
  for (auto* run : {&unfused, &fused_values}) {
    const ir::Graph& gr = run == &unfused ? g : fused;
    for (const ir::Node& n : gr.nodes) {
      std::vector<Tensor> in;
      for (int i : n.inputs) in.push_back(run->at(i));
      const ir::Value& out = gr.values[size_t(n.outputs[0])];
      auto r = run_cpu_kernel(n, in, {{out.dtype, shape_of(out)}});
      ASSERT_TRUE(r.ok()) << n.describe() << ": " << r.status().to_string();
      (*run)[n.outputs[0]] = r->at(0);
    }
  }
  for (const char* name : {"y", "z"}) {
    const Tensor& a = fused_values.at(fused.find_value(name));
    const Tensor& e = unfused.at(g.find_value(name));
    ASSERT_EQ(a.shape(), e.shape()) << name;
    for (int64_t i = 0; i < e.numel(); ++i)
      ASSERT_EQ(a.float_at(i), e.float_at(i)) << name << " at " << i;
  }
}

TEST(FuseElementwise, HostileProgramsAreRefusedByName) {
  // The program's parser, as shape inference, the CPU reference and the CUDA kernel run it.
  auto attrs = [](std::vector<std::string> ops, std::vector<int64_t> args,
                  std::vector<int64_t> to) {
    ops::ElementwiseProgram p;
    ir::Attributes a;
    ir::Attribute o;
    o.type = ir::AttrType::kStrings;
    o.strings = std::move(ops);
    a.set("ops", o);
    ir::Attribute r;
    r.type = ir::AttrType::kInts;
    r.ints = std::move(args);
    a.set("args", r);
    r.ints = std::move(to);
    a.set("to", r);
    return a;
  };
  const std::vector<DType> f32x2 = {DType::kFloat32, DType::kFloat32};
  struct Case {
    ir::Attributes a;
    std::vector<DType> in;
    const char* message;
  } cases[] = {
      {attrs({"Add"}, {0, 2}, {1}), f32x2, "second operand register 2 is not one of 0..1"},
      {attrs({"Add"}, {-1, 0}, {1}), f32x2, "operand register -1 is not one of 0..1"},
      {attrs({"Relu"}, {0, 1}, {1}), f32x2, "must be -1 (a unary op)"},
      {attrs({"Softmax"}, {0, -1}, {1}), f32x2, "instruction 0 (Softmax): not an op"},
      {attrs({"GeluTanh", "Relu"}, {0, -1, 3, -1}, {1, 1}), f32x2,
       "instruction 1 (Relu): operand register 3"},
      {attrs({"Add"}, {0, 1}, {10}), f32x2,
       "result dtype float16 differs from its operand's float32"},
      {attrs({"Add"}, {0, 1}, {7}), f32x2,
       "result dtype code 7 is not float32, float16 or bfloat16"},
      {attrs({"Add"}, {0, 1}, {1}),
       {DType::kFloat32, DType::kFloat16},
       "operands of dtypes float32 and float16"},
      {attrs({"Add"}, {0, 1}, {1}), {DType::kFloat32, DType::kInt64}, "input 1 has dtype int64"},
      {attrs({"Add"}, {0, 1, 2}, {1}), f32x2, "do not fit 1 instructions"},
      {attrs({}, {}, {}), f32x2, "has 0 instructions"},
      {attrs({"Relu"}, {0, -1}, {1}), std::vector<DType>(9, DType::kFloat32),
       "has 9 inputs, expected 1 to 8"},
  };
  for (const Case& c : cases) {
    auto p = ops::parse_elementwise_program(c.a, c.in);
    ASSERT_FALSE(p.ok()) << c.message;
    EXPECT_NE(p.status().message().find(c.message), std::string::npos) << p.status().message();
  }
  ir::Attributes unknown = attrs({"Relu"}, {0, -1}, {1});
  unknown.set("axis", ir::Attribute{});
  EXPECT_FALSE(ops::parse_elementwise_program(unknown, f32x2).ok());
  EXPECT_TRUE(
      ops::parse_elementwise_program(attrs({"Mul", "Relu"}, {0, 1, 2, -1}, {1, 1}), f32x2).ok());
}

// ---- fuse_matmul_bias ----

// canonicalize then fuse_matmul_bias, as the pipeline runs them: GELU written out reaches the
// linear layer's pass as one Gelu.
Status canonical_mm(ir::Graph* g, const builder::SupportsFn& supports) {
  KILN_RETURN_IF_ERROR(builder::canonicalize(g, supports));
  return builder::fuse_matmul_bias(g, supports);
}

std::string fuse_mm(const std::string& text, bool supported = true) {
  return run_fusion(canonical_mm, text, supported);
}

// Linear layers as exporters write them: bias then erf GELU with Div by sqrt(2) and the halving
// last (TorchScript, transformers); Mul by 1/sqrt(2) with the halving first and the bias first in
// its Add; the Gelu op; Relu without a bias; a bias alone (fused: an engine output reads it); and a
// bias whose sum a residual Add reads (left for the elementwise pass); an Add of a tensor that is
// no constant (attention's mask) is no bias.
const char* kLinears =
    R"(graph g(%x: float32[2, 3, 4]) -> (%y1: float32[2, 3, 4], %y2: float32[2, 3, 4], %y3: float32[2, 3, 4], %y4: float32[2, 3, 4], %y5: float32[2, 3, 4], %r6: float32[2, 3, 4], %y7: float32[2, 3, 4], %y8: float32[2, 3, 3]) {
  opset ai.onnx 20
  %w: float32[4, 4] = dense<[0.5, -0.25, 0.125, 1.0, -0.5, 0.75, 0.25, -1.0, 1.5, 0.0, -0.75, 0.5, 0.25, 0.5, -0.125, -0.5]>
  %b: float32[4] = dense<[0.1, -0.2, 0.3, -0.4]>
  %sqrt2: float32[] = dense<1.4142135>
  %rsqrt2: float32[] = dense<0.70710677>
  %one: float32[] = dense<1.0>
  %half: float32[] = dense<0.5>
  %m1: float32[2, 3, 4] = MatMul(%x, %w)  # fc1
  %h1: float32[2, 3, 4] = Add(%m1, %b)  # bias1
  %d1: float32[2, 3, 4] = Div(%h1, %sqrt2)  # div1
  %e1: float32[2, 3, 4] = Erf(%d1)  # erf1
  %p1: float32[2, 3, 4] = Add(%e1, %one)  # add1
  %q1: float32[2, 3, 4] = Mul(%h1, %p1)  # mul1
  %y1: float32[2, 3, 4] = Mul(%q1, %half)  # half1
  %m2: float32[2, 3, 4] = MatMul(%y1, %w)  # fc2
  %h2: float32[2, 3, 4] = Add(%b, %m2)  # bias2
  %d2: float32[2, 3, 4] = Mul(%rsqrt2, %h2)  # div2
  %e2: float32[2, 3, 4] = Erf(%d2)  # erf2
  %p2: float32[2, 3, 4] = Add(%one, %e2)  # add2
  %q2: float32[2, 3, 4] = Mul(%h2, %half)  # mul2
  %y2: float32[2, 3, 4] = Mul(%p2, %q2)  # half2
  %m3: float32[2, 3, 4] = MatMul(%y2, %w)  # fc3
  %h3: float32[2, 3, 4] = Add(%m3, %b)  # bias3
  %y3: float32[2, 3, 4] = Gelu(%h3) {approximate="tanh"}  # gelu3
  %m4: float32[2, 3, 4] = MatMul(%y3, %w)  # fc4
  %y4: float32[2, 3, 4] = Relu(%m4)  # relu4
  %m5: float32[2, 3, 4] = MatMul(%y4, %w)  # fc5
  %y5: float32[2, 3, 4] = Add(%m5, %b)  # bias5
  %m6: float32[2, 3, 4] = MatMul(%y5, %w)  # fc6
  %y6: float32[2, 3, 4] = Add(%m6, %b)  # bias6
  %r6: float32[2, 3, 4] = Add(%y6, %x)  # residual6
  %m7: float32[2, 3, 4] = MatMul(%r6, %w)  # scores7
  %a7: float32[2, 3, 4] = Add(%m7, %x)  # mask7
  %y7: float32[2, 3, 4] = Softmax(%a7)  # softmax7
  %xt: float32[2, 4, 3] = Transpose(%x) {perm=[0, 2, 1]}  # xt8
  %m8: float32[2, 3, 3] = MatMul(%y7, %xt)  # scores8
  %mask: float32[2, 3, 3] = MatMul(%x, %xt)  # mask_src8
  %a8: float32[2, 3, 3] = Add(%m8, %mask)  # mask8
  %y8: float32[2, 3, 3] = Softmax(%a8)  # softmax8
}
)";

TEST(FuseMatMulBias, LinearLayersWithActivationsBecomeMatMulBias) {
  std::string text = fuse_mm(kLinears);
  for (const char* part :
       {"%y1: float32[2, 3, 4] = kiln::MatMulBias(%x, %w, %b) {activation=\"gelu_erf\"}  # fc1",
        "%y2: float32[2, 3, 4] = kiln::MatMulBias(%y1, %w, %b) {activation=\"gelu_erf\"}  # fc2",
        "%y3: float32[2, 3, 4] = kiln::MatMulBias(%y2, %w, %b) {activation=\"gelu_tanh\"}  # fc3",
        // No bias: a zero one, so cuBLASLt applies the ReLU in its bias epilogue.
        "%y4: float32[2, 3, 4] = kiln::MatMulBias(%y3, %w, %m4_zero_bias) {activation=\"relu\"}  # "
        "fc4",
        "%y5: float32[2, 3, 4] = kiln::MatMulBias(%y4, %w, %b) {activation=\"none\"}  # fc5",
        // Bias then a residual (a computed tensor of the product's shape), and a residual alone.
        "%r6: float32[2, 3, 4] = kiln::MatMulBias(%y5, %w, %b, %x) {activation=\"none\"}  # fc6",
        "%a7: float32[2, 3, 4] = kiln::MatMulBias(%r6, %w, _, %x) {activation=\"none\"}  # scores7",
        // A product of two computed tensors (attention's scores) keeps its mask Add.
        "%a8: float32[2, 3, 3] = Add(%m8, %mask)  # mask8"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  }
  for (const char* op : {"Erf(", "Div(", "Gelu(", "Relu("}) {
    EXPECT_EQ(text.find(op), std::string::npos) << op << "\n" << text;
  }
  EXPECT_EQ(fuse_mm(kLinears, /*supported=*/false), ir::to_text(parse(kLinears)));
  // A GELU intermediate read outside the pattern keeps that layer unfused.
  const std::string shared =
      with_output(kLinears, "%y8: float32[2, 3, 3]", "%e1: float32[2, 3, 4]");
  EXPECT_NE(fuse_mm(shared).find("Erf(%d1)"), std::string::npos);
}

TEST(FuseMatMulBias, TheFusedReferenceMatchesTheUnfusedLayers) {
  ir::Graph g = parse(kLinears);
  ir::Graph fused = g;
  auto yes = [](const ir::Node&, const std::vector<const ir::Value*>&,
                const std::vector<const ir::Value*>&) { return true; };
  ASSERT_TRUE(canonical_mm(&fused, yes).ok());
  Tensor x = random_f32({2, 3, 4}, 21);
  std::map<int, Tensor> want = run_unfused(g, x), got = run_unfused(fused, x);
  for (const char* name : {"y1", "y2", "y3", "y4", "y5", "r6", "y7", "y8"}) {
    ErrorStats e = error_stats(got.at(fused.find_value(name)), want.at(g.find_value(name)));
    EXPECT_LE(e.max_abs, 1e-6 * std::max(1.0, e.ref_max_abs)) << name;
  }
}

// ---- merge_duplicates ----

// BERT's mask as the exporter repeats it per layer (Where then Cast, twice, the second Where on its
// own copy of a constant), a duplicate whose attribute differs, a random op, and a duplicate that
// is an engine output.
const char* kDuplicates =
    R"(graph g(%x: float32[2, 3], %c: bool[2, 3]) -> (%y: float32[2, 3], %r1: float32[2, 3], %r2: float32[2, 3], %o: float32[2, 3]) {
  opset ai.onnx 17
  %zero: float32[] = dense<0.0>
  %low: float32[] = dense<-100.0>
  %w1: float32[2, 3] = Where(%c, %zero, %low)  # mask1
  %h1: float16[2, 3] = Cast(%w1) {to=10}  # cast1
  %zero2: float32[] = dense<0.0>
  %w2: float32[2, 3] = Where(%c, %zero2, %low)  # mask2
  %h2: float16[2, 3] = Cast(%w2) {to=10}  # cast2
  %h3: float32[2, 3] = Cast(%w2) {to=1}  # cast3
  %b1: float32[2, 3] = Cast(%h1) {to=1}  # back1
  %b2: float32[2, 3] = Cast(%h2) {to=1}  # back2
  %s: float32[2, 3] = Add(%b1, %b2)  # sum
  %t: float32[2, 3] = Add(%s, %h3)  # sum2
  %y: float32[2, 3] = Add(%t, %x)  # out
  %r1: float32[2, 3] = RandomUniformLike(%x)  # rand1
  %r2: float32[2, 3] = RandomUniformLike(%x)  # rand2
  %o: float32[2, 3] = Where(%c, %zero, %low)  # mask3
}
)";

TEST(MergeDuplicates, RepeatedComputationsRunOnce) {
  ir::Graph g = parse(kDuplicates);
  ASSERT_TRUE(builder::merge_duplicates(&g).ok());
  ASSERT_TRUE(ir::verify(g).ok()) << ir::verify(g).to_string();
  ir::compact(&g);
  const std::string text = ir::to_text(g);
  EXPECT_NE(text.find("%s: float32[2, 3] = Add(%b1, %b1)"), std::string::npos) << text;
  for (const char* gone : {"# mask2", "# cast2", "# back2"})
    EXPECT_EQ(text.find(gone), std::string::npos) << gone;
  for (const char* kept : {"Cast(%w1) {to=1}  # cast3", "# rand1", "# rand2", "# mask3"}) {
    EXPECT_NE(text.find(kept), std::string::npos) << kept << "\n" << text;
  }
}

// ---- fuse_attention ----

std::string fuse_attn(const std::string& text, bool supported = true) {
  return run_fusion(builder::fuse_attention, text, supported);
}

// Every value of `g` on the reference kernels, node by node, each output of its IR type.
std::map<std::string, Tensor> run_graph(const ir::Graph& g,
                                        const std::map<std::string, Tensor>& inputs) {
  std::map<int, Tensor> v;
  for (const auto& [name, t] : inputs) v[g.find_value(name)] = t;
  for (size_t k = 0; k < g.values.size(); ++k) {
    if (g.values[k].constant) v[int(k)] = *g.values[k].constant;
  }
  std::map<std::string, Tensor> out;
  for (const ir::Node& n : g.nodes) {
    std::vector<Tensor> in;
    for (int i : n.inputs) in.push_back(i >= 0 ? v.at(i) : Tensor());
    std::vector<std::pair<DType, Shape>> types;
    for (int o : n.outputs) {
      Shape s;
      for (const ir::Dim& d : *g.values[size_t(o)].shape) s.push_back(d.value());
      types.emplace_back(g.values[size_t(o)].dtype, s);
    }
    auto r = run_cpu_kernel(n, in, types);
    EXPECT_TRUE(r.ok()) << n.describe() << ": " << r.status().to_string();
    if (!r.ok()) return out;
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      v[n.outputs[i]] = r->at(i);
      out[g.values[size_t(n.outputs[i])].name] = r->at(i);
    }
  }
  return out;
}

// A BERT layer's attention as the TorchScript exporter writes it (transformers' SDPA path): heads
// split by Reshape and Transpose (K's two transposes merged into one), both operands scaled by
// the root of the scale, an additive mask, the NaN guard, heads merged back.
const char* kBertAttention =
    R"(graph g(%q: float32[2, 3, 8], %k: float32[2, 3, 8], %v: float32[2, 3, 8], %m: float32[2, 1, 1, 3]) -> (%y: float32[2, 3, 8]) {
  opset ai.onnx 17
  %shape4: int64[4] = dense<[2, 3, 2, 4]>
  %shape3: int64[3] = dense<[2, 3, 8]>
  %c: float32[] = dense<0.70710677>
  %zero: float32[] = dense<0.0>
  %qr: float32[2, 3, 2, 4] = Reshape(%q, %shape4)  # q_split
  %qt: float32[2, 2, 3, 4] = Transpose(%qr) {perm=[0, 2, 1, 3]}  # q_heads
  %kr: float32[2, 3, 2, 4] = Reshape(%k, %shape4)  # k_split
  %kt: float32[2, 2, 4, 3] = Transpose(%kr) {perm=[0, 2, 3, 1]}  # k_heads
  %vr: float32[2, 3, 2, 4] = Reshape(%v, %shape4)  # v_split
  %vt: float32[2, 2, 3, 4] = Transpose(%vr) {perm=[0, 2, 1, 3]}  # v_heads
  %qs: float32[2, 2, 3, 4] = Mul(%qt, %c)  # q_scale
  %ks: float32[2, 2, 4, 3] = Mul(%kt, %c)  # k_scale
  %s: float32[2, 2, 3, 3] = MatMul(%qs, %ks)  # scores
  %sm: float32[2, 2, 3, 3] = Add(%s, %m)  # mask
  %p: float32[2, 2, 3, 3] = Softmax(%sm) {axis=-1}  # softmax
  %nan: bool[2, 2, 3, 3] = IsNaN(%p)  # isnan
  %pg: float32[2, 2, 3, 3] = Where(%nan, %zero, %p)  # guard
  %o: float32[2, 2, 3, 4] = MatMul(%pg, %vt)  # context
  %ot: float32[2, 3, 2, 4] = Transpose(%o) {perm=[0, 2, 1, 3]}  # merge
  %y: float32[2, 3, 8] = Reshape(%ot, %shape3)  # merged
}
)";

// ViT's (torchvision through the TorchScript exporter): 4-D heads made elsewhere, K transposed by
// [0, 1, 3, 2], no mask, no guard, the output permuted sequence-first (so no 3-D form). A second
// attention scales the scores by Div and reads K through a Transpose that is no plain swap, which
// becomes K's transpose; a third has a scale after the mask (which would scale the mask) and stays.
const char* kVitAttention =
    R"(graph g(%q: float32[2, 2, 3, 4], %k: float32[2, 2, 3, 4], %v: float32[2, 2, 3, 4], %k2: float32[2, 3, 2, 4], %m: float32[3, 3]) -> (%y: float32[3, 2, 2, 4], %y2: float32[2, 2, 3, 4], %y3: float32[2, 2, 3, 4]) {
  opset ai.onnx 17
  %c: float32[] = dense<0.70710677>
  %two: float32[] = dense<2.0>
  %kt: float32[2, 2, 4, 3] = Transpose(%k) {perm=[0, 1, 3, 2]}  # k_t
  %qs: float32[2, 2, 3, 4] = Mul(%q, %c)  # q_scale
  %ks: float32[2, 2, 4, 3] = Mul(%kt, %c)  # k_scale
  %s: float32[2, 2, 3, 3] = MatMul(%qs, %ks)  # scores
  %p: float32[2, 2, 3, 3] = Softmax(%s) {axis=-1}  # softmax
  %o: float32[2, 2, 3, 4] = MatMul(%p, %v)  # context
  %y: float32[3, 2, 2, 4] = Transpose(%o) {perm=[2, 0, 1, 3]}  # seq_first
  %kt2: float32[2, 2, 4, 3] = Transpose(%k2) {perm=[0, 2, 3, 1]}  # k2_t
  %s2: float32[2, 2, 3, 3] = MatMul(%q, %kt2)  # scores2
  %d2: float32[2, 2, 3, 3] = Div(%s2, %two)  # scale2
  %a2: float32[2, 2, 3, 3] = Add(%m, %d2)  # mask2
  %p2: float32[2, 2, 3, 3] = Softmax(%a2) {axis=3}  # softmax2
  %y2: float32[2, 2, 3, 4] = MatMul(%p2, %v)  # context2
  %kt3: float32[2, 2, 4, 3] = Transpose(%k) {perm=[0, 1, 3, 2]}  # k3_t
  %s3: float32[2, 2, 3, 3] = MatMul(%q, %kt3)  # scores3
  %a3: float32[2, 2, 3, 3] = Add(%s3, %m)  # mask3
  %d3: float32[2, 2, 3, 3] = Div(%a3, %two)  # scale3
  %p3: float32[2, 2, 3, 3] = Softmax(%d3) {axis=-1}  # softmax3
  %y3: float32[2, 2, 3, 4] = MatMul(%p3, %v)  # context3
}
)";

// The dynamo exporter's ViT: heads folded into the batch, [B*H, S, D], K transposed by [0, 2, 1].
const char* kRank3Attention =
    R"(graph g(%q: float32[4, 3, 8], %k: float32[4, 3, 8], %v: float32[4, 3, 8]) -> (%y: float32[4, 3, 8]) {
  opset ai.onnx 18
  %c: float32[] = dense<0.35355339>
  %kt: float32[4, 8, 3] = Transpose(%k) {perm=[0, 2, 1]}  # k_t
  %s: float32[4, 3, 3] = MatMul(%q, %kt)  # scores
  %sc: float32[4, 3, 3] = Mul(%s, %c)  # scale
  %p: float32[4, 3, 3] = Softmax(%sc) {axis=-1}  # softmax
  %y: float32[4, 3, 8] = MatMul(%p, %v)  # context
}
)";

TEST(FuseAttention, ExportedAttentionBecomesOneAttentionNode) {
  const std::string r3 = fuse_attn(kRank3Attention);
  EXPECT_NE(r3.find("%y: float32[4, 3, 8] = Attention@23(%q, %k, %v) {kv_num_heads=1, "
                    "q_num_heads=1, scale=0.3535533"),
            std::string::npos)
      << r3;

  std::string bert = fuse_attn(kBertAttention);
  EXPECT_NE(bert.find("%y: float32[2, 3, 8] = Attention@23(%q, %k, %v, %m) {kv_num_heads=2, "
                      "q_num_heads=2, scale=0.49999997"),
            std::string::npos)
      << bert;
  for (const char* gone :
       {"Transpose(", "Reshape(", "Softmax(", "IsNaN(", "Where(", "MatMul(", "Mul("}) {
    EXPECT_EQ(bert.find(gone), std::string::npos) << gone << "\n" << bert;
  }
  EXPECT_EQ(fuse_attn(kBertAttention, /*supported=*/false), ir::to_text(parse(kBertAttention)));

  std::string vit = fuse_attn(kVitAttention);
  EXPECT_NE(vit.find("%o: float32[2, 2, 3, 4] = Attention@23(%q, %k, %v) {scale=0.49999997"),
            std::string::npos)
      << vit;
  EXPECT_NE(vit.find("%y2: float32[2, 2, 3, 4] = Attention@23(%q, %kt2, %v, %m) {scale=0.5"),
            std::string::npos)
      << vit;
  EXPECT_NE(vit.find("%kt2: float32[2, 2, 3, 4] = Transpose(%k2) {perm=[0, 2, 1, 3]}"),
            std::string::npos)
      << vit;
  EXPECT_NE(vit.find("%d3: float32[2, 2, 3, 3] = Div(%a3, %two)"), std::string::npos) << vit;
  EXPECT_NE(vit.find("Softmax(%d3)"), std::string::npos) << vit;
  EXPECT_EQ(vit.find("Softmax(%s)"), std::string::npos) << vit;
  // Unsupported: the Transpose the second attention took over is given back as it was.
  EXPECT_EQ(fuse_attn(kVitAttention, /*supported=*/false), ir::to_text(parse(kVitAttention)));
  // Scores read outside the pattern keep that attention unfused.
  const std::string shared =
      with_output(kBertAttention, "%y: float32[2, 3, 8]", "%s: float32[2, 2, 3, 3]");
  EXPECT_NE(fuse_attn(shared).find("Softmax("), std::string::npos);
}

TEST(FuseAttention, TheFusedReferenceMatchesTheUnfusedGraph) {
  for (const char* text : {kBertAttention, kVitAttention, kRank3Attention}) {
    ir::Graph g = parse(text);
    ir::Graph fused = g;
    auto yes = [](const ir::Node&, const std::vector<const ir::Value*>&,
                  const std::vector<const ir::Value*>&) { return true; };
    ASSERT_TRUE(builder::fuse_attention(&fused, yes).ok());
    std::map<std::string, Tensor> in;
    uint64_t seed = 40;
    for (int i : g.inputs) {
      Shape s;
      for (const ir::Dim& d : *g.values[size_t(i)].shape) s.push_back(d.value());
      in[g.values[size_t(i)].name] = random_f32(s, seed++);
    }
    if (text == kBertAttention) {
      // Batch 1 masks its last key and batch 2 every key: the guard's zeros, which Attention
      // gives for a row with nothing to attend.
      std::vector<float> mask = {0.f, 0.f, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
      in["m"] = Tensor::from_vector(DType::kFloat32, {2, 1, 1, 3}, mask);
    }
    std::map<std::string, Tensor> want = run_graph(g, in), got = run_graph(fused, in);
    for (int o : g.outputs) {
      const std::string& name = g.values[size_t(o)].name;
      ASSERT_TRUE(got.count(name) && want.count(name)) << name;
      ErrorStats e = error_stats(got.at(name), want.at(name));
      EXPECT_LE(e.max_abs, 1e-5 * std::max(1.0, e.ref_max_abs)) << name;
    }
  }
}

// ---- canonicalize: GELU ----

// GPT-2's tanh GELU written out (the halving first), on a linear layer's output, and the same with
// the halving last on an input.
const char* kTanhGelu =
    R"(graph g(%x: float32[2, 3, 4], %z: float32[2, 3, 4]) -> (%y: float32[2, 3, 4], %y2: float32[2, 3, 4]) {
  opset ai.onnx 17
  %w: float32[4, 4] = dense<[0.5, -0.25, 0.125, 1.0, -0.5, 0.75, 0.25, -1.0, 1.5, 0.0, -0.75, 0.5, 0.25, 0.5, -0.125, -0.5]>
  %b: float32[4] = dense<[0.1, -0.2, 0.3, -0.4]>
  %half: float32[] = dense<0.5>
  %three: float32[] = dense<3.0>
  %k: float32[] = dense<0.044715>
  %c: float32[] = dense<0.7978846>
  %one: float32[] = dense<1.0>
  %m: float32[2, 3, 4] = MatMul(%x, %w)  # fc
  %h: float32[2, 3, 4] = Add(%b, %m)  # bias
  %a: float32[2, 3, 4] = Mul(%h, %half)  # halve
  %p: float32[2, 3, 4] = Pow(%h, %three)  # cube
  %m1: float32[2, 3, 4] = Mul(%p, %k)  # cube_k
  %s: float32[2, 3, 4] = Add(%h, %m1)  # inner
  %m2: float32[2, 3, 4] = Mul(%s, %c)  # scale
  %t: float32[2, 3, 4] = Tanh(%m2)  # tanh
  %u: float32[2, 3, 4] = Add(%t, %one)  # plus_one
  %y: float32[2, 3, 4] = Mul(%a, %u)  # gelu
  %p2: float32[2, 3, 4] = Pow(%z, %three)  # cube2
  %n1: float32[2, 3, 4] = Mul(%k, %p2)  # cube_k2
  %s2: float32[2, 3, 4] = Add(%n1, %z)  # inner2
  %n2: float32[2, 3, 4] = Mul(%c, %s2)  # scale2
  %t2: float32[2, 3, 4] = Tanh(%n2)  # tanh2
  %u2: float32[2, 3, 4] = Add(%one, %t2)  # plus_one2
  %v2: float32[2, 3, 4] = Mul(%z, %u2)  # product2
  %y2: float32[2, 3, 4] = Mul(%v2, %half)  # gelu2
}
)";

// ---- fuse_norm ----

// LayerNorm written out (an exporter before opset 17), llama's RMSNorm (Pow, Reciprocal of Sqrt,
// weight [1, 1, C] first), an RMSNorm by Div of Mul(x, x) without weight, and one over axis 1.
const char* kNorms =
    R"(graph g(%x: float32[2, 3, 4]) -> (%ln: float32[2, 3, 4], %rms: float32[2, 3, 4], %rms2: float32[2, 3, 4], %keep: float32[2, 3, 4]) {
  opset ai.onnx 17
  %two: float32[] = dense<2.0>
  %eps: float32[] = dense<1e-05>
  %g: float32[4] = dense<[0.9, 1.1, -0.7, 1.3]>
  %b: float32[4] = dense<[0.1, -0.2, 0.3, 0.05]>
  %g3: float32[1, 1, 4] = dense<[1.2, 0.8, 1.0, -0.5]>
  %m: float32[2, 3, 1] = ReduceMean(%x) {axes=[-1]}  # ln_mean
  %d: float32[2, 3, 4] = Sub(%x, %m)  # ln_sub
  %p: float32[2, 3, 4] = Pow(%d, %two)  # ln_pow
  %v: float32[2, 3, 1] = ReduceMean(%p) {axes=[2]}  # ln_var
  %ve: float32[2, 3, 1] = Add(%v, %eps)  # ln_eps
  %s: float32[2, 3, 1] = Sqrt(%ve)  # ln_sqrt
  %n: float32[2, 3, 4] = Div(%d, %s)  # ln_div
  %gm: float32[2, 3, 4] = Mul(%n, %g)  # ln_gamma
  %ln: float32[2, 3, 4] = Add(%b, %gm)  # ln_beta
  %p2: float32[2, 3, 4] = Pow(%x, %two)  # rms_pow
  %v2: float32[2, 3, 1] = ReduceMean(%p2) {axes=[-1]}  # rms_var
  %e2: float32[2, 3, 1] = Add(%v2, %eps)  # rms_eps
  %s2: float32[2, 3, 1] = Sqrt(%e2)  # rms_sqrt
  %r2: float32[2, 3, 1] = Reciprocal(%s2)  # rms_rsqrt
  %n2: float32[2, 3, 4] = Mul(%x, %r2)  # rms_norm
  %rms: float32[2, 3, 4] = Mul(%g3, %n2)  # rms_weight
  %p3: float32[2, 3, 4] = Mul(%x, %x)  # rms2_square
  %v3: float32[2, 3, 1] = ReduceMean(%p3) {axes=[-1]}  # rms2_var
  %e3: float32[2, 3, 1] = Add(%eps, %v3)  # rms2_eps
  %s3: float32[2, 3, 1] = Sqrt(%e3)  # rms2_sqrt
  %rms2: float32[2, 3, 4] = Div(%x, %s3)  # rms2_div
  %p4: float32[2, 3, 4] = Pow(%x, %two)  # wrong_pow
  %v4: float32[2, 1, 4] = ReduceMean(%p4) {axes=[1]}  # wrong_var
  %e4: float32[2, 1, 4] = Add(%v4, %eps)  # wrong_eps
  %s4: float32[2, 1, 4] = Sqrt(%e4)  # wrong_sqrt
  %keep: float32[2, 3, 4] = Div(%x, %s4)  # wrong_div
}
)";

TEST(FuseNorm, LayerNormAndRmsNormWrittenOutBecomeOneOpEach) {
  ir::Graph g = parse(kNorms);
  ir::Graph f = g;
  auto yes = [](const ir::Node&, const std::vector<const ir::Value*>&,
                const std::vector<const ir::Value*>&) { return true; };
  ASSERT_TRUE(builder::fuse_norm(&f, yes).ok());
  ASSERT_TRUE(ir::verify(f).ok()) << ir::verify(f).to_string();
  ir::compact(&f);
  const std::string text = ir::to_text(f);
  for (const char* part : {"%ln: float32[2, 3, 4] = LayerNormalization(%x, %ln_var_ln_scale, "
                           "%ln_var_ln_bias) {axis=-1, epsilon=1e-05}  # ln_var",
                           "%rms: float32[2, 3, 4] = RMSNormalization@23(%x, %rms_var_rms_scale) "
                           "{axis=-1, epsilon=1e-05}  # rms_var",
                           "%rms2: float32[2, 3, 4] = RMSNormalization@23(%x, %rms2_var_rms_scale) "
                           "{axis=-1, epsilon=1e-05}  # rms2_var",
                           "%keep: float32[2, 3, 4] = Div(%x, %s4)  # wrong_div"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  }
  for (const char* gone : {"Sub(", "Reciprocal(", "Mul("})
    EXPECT_EQ(text.find(gone), std::string::npos) << gone << "\n" << text;
  // Each op records the model's nodes it replaced.
  std::map<std::string, std::map<std::string, int64_t>> replaced;
  for (const ir::Node& n : f.nodes) replaced[n.name] = n.replaced;
  EXPECT_EQ(replaced["ln_var"], (std::map<std::string, int64_t>{{"Add", 2},
                                                                {"Div", 1},
                                                                {"Mul", 1},
                                                                {"Pow", 1},
                                                                {"ReduceMean", 2},
                                                                {"Sqrt", 1},
                                                                {"Sub", 1}}));
  EXPECT_EQ(
      replaced["rms_var"],
      (std::map<std::string, int64_t>{
          {"Add", 1}, {"Mul", 2}, {"Pow", 1}, {"ReduceMean", 1}, {"Reciprocal", 1}, {"Sqrt", 1}}));
  std::map<std::string, Tensor> in = {{"x", random_f32({2, 3, 4}, 77)}};
  std::map<std::string, Tensor> want = run_graph(g, in), got = run_graph(f, in);
  for (const char* name : {"ln", "rms", "rms2", "keep"}) {
    ASSERT_TRUE(got.count(name) && want.count(name)) << name;
    ErrorStats e = error_stats(got.at(name), want.at(name));
    EXPECT_GT(e.ref_max_abs, 0.0) << name;
    EXPECT_LE(e.max_abs, 1e-5 * std::max(1.0, e.ref_max_abs)) << name;
  }
  // An intermediate read elsewhere (the centred x as a graph output) keeps that LayerNorm; an
  // unsupported op keeps them all.
  std::string shared = kNorms;
  shared.replace(shared.find("(%ln: float32[2, 3, 4],"), 23,
                 "(%ln: float32[2, 3, 4], %d: float32[2, 3, 4],");
  ir::Graph sg = parse(shared);
  ASSERT_TRUE(builder::fuse_norm(&sg, yes).ok());
  const std::string st = ir::to_text(sg);
  EXPECT_EQ(st.find("LayerNormalization("), std::string::npos) << st;
  EXPECT_NE(st.find("RMSNormalization@23("), std::string::npos) << st;
  ir::Graph u = parse(kNorms);
  auto no = [](const ir::Node&, const std::vector<const ir::Value*>&,
               const std::vector<const ir::Value*>&) { return false; };
  ASSERT_TRUE(builder::fuse_norm(&u, no).ok());
  EXPECT_EQ(ir::to_text(u), ir::to_text(parse(kNorms)));
}

TEST(Canonicalize, TanhGeluWrittenOutBecomesOneGelu) {
  ir::Graph g = parse(kTanhGelu);
  ir::Graph f = g;
  auto yes = [](const ir::Node&, const std::vector<const ir::Value*>&,
                const std::vector<const ir::Value*>&) { return true; };
  ASSERT_TRUE(builder::canonicalize(&f, yes).ok());
  ASSERT_TRUE(ir::verify(f).ok()) << ir::verify(f).to_string();
  ir::compact(&f);
  std::string text = ir::to_text(f);
  EXPECT_NE(text.find("%y: float32[2, 3, 4] = Gelu@20(%h) {approximate=\"tanh\"}  # gelu"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("%y2: float32[2, 3, 4] = Gelu@20(%z) {approximate=\"tanh\"}  # gelu2"),
            std::string::npos)
      << text;
  for (const char* gone : {"Tanh(", "Pow("})
    EXPECT_EQ(text.find(gone), std::string::npos) << gone << "\n" << text;
  std::map<std::string, Tensor> in = {{"x", random_f32({2, 3, 4}, 97)},
                                      {"z", random_f32({2, 3, 4}, 98)}};
  std::map<std::string, Tensor> want = run_graph(g, in), got = run_graph(f, in);
  for (const char* name : {"y", "y2"}) {
    ASSERT_TRUE(got.count(name) && want.count(name)) << name;
    ErrorStats e = error_stats(got.at(name), want.at(name));
    EXPECT_GT(e.ref_max_abs, 0.0) << name;
    EXPECT_LE(e.max_abs, 1e-5 * std::max(1.0, e.ref_max_abs)) << name;
  }
  // Then the linear layer takes it into its epilogue.
  ASSERT_TRUE(builder::fuse_matmul_bias(&f, yes).ok());
  text = ir::to_text(f);
  EXPECT_NE(
      text.find("%y: float32[2, 3, 4] = kiln::MatMulBias(%x, %w, %b) {activation=\"gelu_tanh\"}"),
      std::string::npos)
      << text;
  // A wrong constant (not 0.044715) keeps the ops.
  std::string off = kTanhGelu;
  off.replace(off.find("dense<0.044715>"), 15, "dense<0.045000>");
  ir::Graph o = parse(off);
  ASSERT_TRUE(builder::canonicalize(&o, yes).ok());
  EXPECT_NE(ir::to_text(o).find("Tanh("), std::string::npos);
}

// ---- unflatten_gemm ----

// GPT-2's MLP as transformers' Conv1D exports it: addmm on x.view(-1, K) and .view back, a tanh
// GELU between (here the Gelu op), the second projection (W stored [N, K], transB) and the
// residual Add.
const char* kConv1DMlp = R"(graph g(%x: float32[2, 3, 4]) -> (%y: float32[2, 3, 4]) {
  opset ai.onnx 20
  %w1: float32[4, 6] = dense<[0.446, 0.499, 0.471, 0.366, 0.201, 0.003, -0.195, -0.361, -0.469, -0.499, -0.449, -0.324, -0.147, 0.054, 0.246, 0.398, 0.485, 0.493, 0.420, 0.279, 0.092, -0.110, -0.294, -0.430]>
  %b1: float32[6] = dense<[0.473, 0.256, -0.082, -0.381, -0.500, -0.382]>
  %w2: float32[4, 6] = dense<[0.214, -0.264, -0.500, -0.277, 0.201, 0.494, 0.334, -0.133, -0.477, -0.384, 0.062, 0.451, 0.426, 0.010, -0.415, -0.459, -0.082, 0.370, 0.483, 0.153, -0.318, -0.497, -0.220, 0.259]>
  %b2: float32[4] = dense<[0.148, 0.200, 0.249, 0.296]>
  %flat4: int64[2] = dense<[-1, 4]>
  %flat6: int64[2] = dense<[-1, 6]>
  %back6: int64[3] = dense<[2, 3, 6]>
  %back4: int64[3] = dense<[2, 3, 4]>
  %x2: float32[6, 4] = Reshape(%x, %flat4)  # fc_view
  %g1: float32[6, 6] = Gemm(%x2, %w1, %b1)  # fc
  %h: float32[2, 3, 6] = Reshape(%g1, %back6)  # fc_back
  %a: float32[2, 3, 6] = Gelu(%h) {approximate="tanh"}  # act
  %a2: float32[6, 6] = Reshape(%a, %flat6)  # proj_view
  %g2: float32[6, 4] = Gemm(%a2, %w2, %b2) {transB=1}  # proj
  %p: float32[2, 3, 4] = Reshape(%g2, %back4)  # proj_back
  %y: float32[2, 3, 4] = Add(%x, %p)  # residual
}
)";

TEST(UnflattenGemm, Conv1DLinearsBecomeMatMulBiasWithEpilogues) {
  ir::Graph g = parse(kConv1DMlp);
  ir::Graph f = g;
  auto yes = [](const ir::Node&, const std::vector<const ir::Value*>&,
                const std::vector<const ir::Value*>&) { return true; };
  ASSERT_TRUE(builder::unflatten_gemm(&f, yes).ok());
  ASSERT_TRUE(ir::verify(f).ok()) << ir::verify(f).to_string();
  std::map<std::string, Tensor> in = {{"x", random_f32({2, 3, 4}, 99)}};
  std::map<std::string, Tensor> want = run_graph(g, in), mid = run_graph(f, in);
  ASSERT_TRUE(builder::fuse_matmul_bias(&f, yes).ok());
  ASSERT_TRUE(ir::verify(f).ok()) << ir::verify(f).to_string();
  ir::compact(&f);
  const std::string text = ir::to_text(f);
  for (const char* part :
       {"%a: float32[2, 3, 6] = kiln::MatMulBias(%x, %w1, %b1) {activation=\"gelu_tanh\"}",
        "%y: float32[2, 3, 4] = kiln::MatMulBias(%a, %w2_kn, %b2, %x) {activation=\"none\"}"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  }
  for (const char* gone : {"Gemm(", "Reshape(", "Gelu(", "Add("})
    EXPECT_EQ(text.find(gone), std::string::npos) << gone << "\n" << text;
  // Each model node counted once, through unflatten_gemm's bias Add (which replaced the Gemm and
  // the Reshape after it) and fuse_matmul_bias's copy of it; the MatMul unflatten_gemm put in
  // before the Add counts as a MatMul of its own.
  ASSERT_EQ(f.nodes.size(), 2u) << text;
  EXPECT_EQ(f.nodes[0].replaced, (std::map<std::string, int64_t>{
                                     {"Gelu", 1}, {"Gemm", 1}, {"MatMul", 1}, {"Reshape", 1}}));
  EXPECT_EQ(f.nodes[1].replaced, (std::map<std::string, int64_t>{
                                     {"Add", 1}, {"Gemm", 1}, {"MatMul", 1}, {"Reshape", 1}}));
  std::map<std::string, Tensor> got = run_graph(f, in);
  for (const auto* m : {&mid, &got}) {
    ASSERT_TRUE(m->count("y") && want.count("y"));
    ErrorStats e = error_stats(m->at("y"), want.at("y"));
    EXPECT_GT(e.ref_max_abs, 0.0);
    EXPECT_LE(e.max_abs, 1e-5 * std::max(1.0, e.ref_max_abs));
  }
}

// ---- patchify_conv ----

// A ViT patch embedding: Conv 4x4 stride 4 over [2, 3, 8, 8], flattened to [2, 4 tokens, 4].
const char* kPatchEmbed = R"(graph g(%x: float32[2, 3, 8, 8]) -> (%y: float32[2, 4, 4]) {
  opset ai.onnx 17
  %w: float32[4, 3, 4, 4] = dense<[0.496, 0.363, 0.091, -0.215, -0.440, -0.496, -0.362, -0.090, 0.217, 0.440, 0.495, 0.361, 0.088, -0.218, -0.441, -0.495, -0.360, -0.086, 0.220, 0.442, 0.495, 0.358, 0.085, -0.222, -0.443, -0.495, -0.357, -0.083, 0.223, 0.444, 0.494, 0.356, 0.081, -0.225, -0.444, -0.494, -0.355, -0.080, 0.226, 0.445, 0.494, 0.354, 0.078, -0.228, -0.446, -0.494, -0.352, -0.076, 0.229, 0.447, 0.493, 0.351, 0.074, -0.231, -0.448, -0.493, -0.350, -0.073, 0.232, 0.448, 0.493, 0.349, 0.071, -0.234, -0.449, -0.492, -0.347, -0.069, 0.235, 0.450, 0.492, 0.346, 0.068, -0.237, -0.451, -0.492, -0.345, -0.066, 0.238, 0.451, 0.492, 0.344, 0.064, -0.240, -0.452, -0.491, -0.343, -0.063, 0.241, 0.453, 0.491, 0.341, 0.061, -0.243, -0.453, -0.491, -0.340, -0.059, 0.244, 0.454, 0.490, 0.339, 0.058, -0.246, -0.455, -0.490, -0.338, -0.056, 0.247, 0.456, 0.490, 0.336, 0.054, -0.249, -0.456, -0.489, -0.335, -0.053, 0.250, 0.457, 0.489, 0.334, 0.051, -0.252, -0.458, -0.489, -0.332, -0.049, 0.253, 0.458, 0.488, 0.331, 0.047, -0.254, -0.459, -0.488, -0.330, -0.046, 0.256, 0.460, 0.487, 0.329, 0.044, -0.257, -0.460, -0.487, -0.327, -0.042, 0.259, 0.461, 0.487, 0.326, 0.041, -0.260, -0.462, -0.486, -0.325, -0.039, 0.262, 0.462, 0.486, 0.323, 0.037, -0.263, -0.463, -0.485, -0.322, -0.036, 0.265, 0.464, 0.485, 0.321, 0.034, -0.266, -0.464, -0.485, -0.320, -0.032, 0.268, 0.465, 0.484, 0.318, 0.030, -0.269, -0.465, -0.484, -0.317, -0.029, 0.270, 0.466, 0.483, 0.316]>
  %b: float32[4] = dense<[0.373, -0.005, -0.379, -0.495]>
  %flat: int64[3] = dense<[2, 4, 4]>
  %c: float32[2, 4, 2, 2] = Conv(%x, %w, %b) {kernel_shape=[4, 4], strides=[4, 4], pads=[0, 0, 0, 0]}  # conv_proj
  %r: float32[2, 4, 4] = Reshape(%c, %flat)  # flatten
  %y: float32[2, 4, 4] = Transpose(%r) {perm=[0, 2, 1]}  # tokens
}
)";

TEST(PatchifyConv, PatchEmbeddingBecomesOneGemm) {
  ir::Graph g = parse(kPatchEmbed);
  ir::Graph p = g;
  auto yes = [](const ir::Node&, const std::vector<const ir::Value*>&,
                const std::vector<const ir::Value*>&) { return true; };
  ASSERT_TRUE(builder::patchify_conv(&p, yes).ok());
  ASSERT_TRUE(ir::verify(p).ok()) << ir::verify(p).to_string();
  ir::compact(&p);
  const std::string text = ir::to_text(p);
  for (const char* part :
       {"%x_patches6: float32[2, 3, 2, 4, 2, 4] = Reshape(%x, %x_patches6_shape)",
        "Transpose(%x_patches6) {perm=[0, 2, 4, 1, 3, 5]}",
        "%x_patches: float32[2, 4, 48] = Reshape(%x_patches6t, %x_patches_shape)",
        "%y: float32[2, 4, 4] = kiln::MatMulBias(%x_patches, %w_patch_matrix, %b) "
        "{activation=\"none\"}  # conv_proj"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  }
  EXPECT_EQ(text.find("Conv("), std::string::npos) << text;
  std::map<std::string, Tensor> in = {{"x", random_f32({2, 3, 8, 8}, 95)}};
  std::map<std::string, Tensor> want = run_graph(g, in), got = run_graph(p, in);
  ASSERT_TRUE(got.count("y") && want.count("y"));
  ErrorStats e = error_stats(got.at("y"), want.at("y"));
  EXPECT_GT(e.ref_max_abs, 0.0);
  EXPECT_LE(e.max_abs, 1e-5 * std::max(1.0, e.ref_max_abs));
  // A Conv with a stride unlike its kernel stays.
  std::string strided = kPatchEmbed;
  strided.replace(strided.find("strides=[4, 4]"), 14, "strides=[2, 2]");
  ir::Graph s = parse(strided);
  ASSERT_TRUE(builder::patchify_conv(&s, yes).ok());
  EXPECT_NE(ir::to_text(s).find("Conv("), std::string::npos);
}

// ---- pack_attention ----

// fuse_attention, then pack_attention, each told the backend takes what it makes.
// fuse_attention then pack_attention on `text` (linear_layers: fuse_matmul_bias first, as the
// build runs them), everything supported; verified and compacted.
ir::Graph fuse_and_pack(const std::string& text, bool linear_layers = false) {
  ir::Graph g = parse(text);
  auto yes = [](const ir::Node&, const std::vector<const ir::Value*>&,
                const std::vector<const ir::Value*>&) { return true; };
  if (linear_layers) EXPECT_TRUE(builder::fuse_matmul_bias(&g, yes).ok());
  EXPECT_TRUE(builder::fuse_attention(&g, yes).ok());
  Status st = builder::pack_attention(&g, yes);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(ir::verify(g).ok()) << ir::verify(g).to_string();
  ir::compact(&g);
  return g;
}

// nn.MultiheadAttention as torchvision's ViT exports it (sequence first, S=3, B=2, E=8, 2 heads):
// the packed projection %p split by Reshape, Unsqueeze, Transpose, Squeeze and three Gathers,
// heads by Reshape [S, B*H, D], Transpose and Reshape, the output permuted back to [S, B, H, D].
const char* kMhaAttention = R"(graph g(%p: float32[3, 2, 24]) -> (%y: float32[6, 8]) {
  opset ai.onnx 17
  %s5: int64[4] = dense<[3, 2, 3, 8]>
  %zero1: int64[1] = dense<[0]>
  %three1: int64[1] = dense<[3]>
  %i0: int64[] = dense<0>
  %i1: int64[] = dense<1>
  %i2: int64[] = dense<2>
  %sbhd: int64[3] = dense<[3, 4, 4]>
  %bhsd: int64[4] = dense<[2, 2, 3, 4]>
  %flat: int64[2] = dense<[6, 8]>
  %c: float32[] = dense<0.70710677>
  %r: float32[3, 2, 3, 8] = Reshape(%p, %s5)  # unflatten
  %u: float32[1, 3, 2, 3, 8] = Unsqueeze(%r, %zero1)  # unsqueeze
  %t: float32[3, 3, 2, 1, 8] = Transpose(%u) {perm=[3, 1, 2, 0, 4]}  # packed_t
  %sq: float32[3, 3, 2, 8] = Squeeze(%t, %three1)  # squeeze
  %g0: float32[3, 2, 8] = Gather(%sq, %i0) {axis=0}  # q_gather
  %g1: float32[3, 2, 8] = Gather(%sq, %i1) {axis=0}  # k_gather
  %g2: float32[3, 2, 8] = Gather(%sq, %i2) {axis=0}  # v_gather
  %q1: float32[3, 4, 4] = Reshape(%g0, %sbhd)  # q_r1
  %q2: float32[4, 3, 4] = Transpose(%q1) {perm=[1, 0, 2]}  # q_t
  %q3: float32[2, 2, 3, 4] = Reshape(%q2, %bhsd)  # q_r2
  %k1: float32[3, 4, 4] = Reshape(%g1, %sbhd)  # k_r1
  %k2: float32[4, 3, 4] = Transpose(%k1) {perm=[1, 0, 2]}  # k_t
  %k3: float32[2, 2, 3, 4] = Reshape(%k2, %bhsd)  # k_r2
  %v1: float32[3, 4, 4] = Reshape(%g2, %sbhd)  # v_r1
  %v2: float32[4, 3, 4] = Transpose(%v1) {perm=[1, 0, 2]}  # v_t
  %v3: float32[2, 2, 3, 4] = Reshape(%v2, %bhsd)  # v_r2
  %kt: float32[2, 2, 4, 3] = Transpose(%k3) {perm=[0, 1, 3, 2]}  # k_swap
  %qs: float32[2, 2, 3, 4] = Mul(%q3, %c)  # q_scale
  %ks: float32[2, 2, 4, 3] = Mul(%kt, %c)  # k_scale
  %s: float32[2, 2, 3, 3] = MatMul(%qs, %ks)  # scores
  %pr: float32[2, 2, 3, 3] = Softmax(%s) {axis=-1}  # softmax
  %o: float32[2, 2, 3, 4] = MatMul(%pr, %v3)  # context
  %ot: float32[3, 2, 2, 4] = Transpose(%o) {perm=[2, 0, 1, 3]}  # seq_first
  %y: float32[6, 8] = Reshape(%ot, %flat)  # flatten
}
)";

// GPT-2's: a [B, S, 3E] projection split in three on its last axis, heads split and merged
// around a causal mask's attention (here an additive mask input), batch symbolic.
const char* kSplitAttention =
    R"(graph g(%p: float32[b, 3, 24], %m: float32[3, 3]) -> (%y: float32[b, 3, 8]) {
  opset ai.onnx 17
  %sizes: int64[3] = dense<[8, 8, 8]>
  %heads: int64[4] = dense<[0, 0, 2, 4]>
  %merge: int64[3] = dense<[0, 0, 8]>
  %c: float32[] = dense<0.5>
  %q: float32[b, 3, 8], %k: float32[b, 3, 8], %v: float32[b, 3, 8] = Split(%p, %sizes) {axis=2}  # split
  %qr: float32[b, 3, 2, 4] = Reshape(%q, %heads)  # q_split
  %qt: float32[b, 2, 3, 4] = Transpose(%qr) {perm=[0, 2, 1, 3]}  # q_heads
  %kr: float32[b, 3, 2, 4] = Reshape(%k, %heads)  # k_split
  %kt: float32[b, 2, 4, 3] = Transpose(%kr) {perm=[0, 2, 3, 1]}  # k_heads
  %vr: float32[b, 3, 2, 4] = Reshape(%v, %heads)  # v_split
  %vt: float32[b, 2, 3, 4] = Transpose(%vr) {perm=[0, 2, 1, 3]}  # v_heads
  %s: float32[b, 2, 3, 3] = MatMul(%qt, %kt)  # scores
  %sc: float32[b, 2, 3, 3] = Mul(%s, %c)  # scale
  %sm: float32[b, 2, 3, 3] = Add(%sc, %m)  # mask
  %pr: float32[b, 2, 3, 3] = Softmax(%sm) {axis=-1}  # softmax
  %o: float32[b, 2, 3, 4] = MatMul(%pr, %vt)  # context
  %ot: float32[b, 3, 2, 4] = Transpose(%o) {perm=[0, 2, 1, 3]}  # merge
  %y: float32[b, 3, 8] = Reshape(%ot, %merge)  # merged
}
)";

// The whole self-attention block of torchvision's encoder layer: the sequence-first transpose,
// the packed projection, the views, attention, the output transpose, Gemm and the residual.
const char* kMhaBlock = R"(graph g(%x: float32[2, 3, 8]) -> (%out: float32[2, 3, 8]) {
  opset ai.onnx 17
  %w: float32[8, 24] = dense<[0.482, 0.489, 0.385, 0.194, -0.041, -0.267, -0.432, -0.499, -0.453, -0.304, -0.086, 0.151, 0.355, 0.478, 0.492, 0.395, 0.208, -0.026, -0.254, -0.425, -0.499, -0.459, -0.316, -0.101, 0.137, 0.344, 0.473, 0.494, 0.404, 0.222, -0.011, -0.241, -0.416, -0.497, -0.465, -0.328, -0.116, 0.122, 0.333, 0.468, 0.496, 0.412, 0.235, 0.004, -0.228, -0.408, -0.495, -0.471, -0.339, -0.130, 0.108, 0.321, 0.462, 0.498, 0.421, 0.248, 0.019, -0.214, -0.399, -0.493, -0.475, -0.350, -0.145, 0.093, 0.310, 0.456, 0.499, 0.429, 0.261, 0.034, -0.200, -0.390, -0.490, -0.480, -0.360, -0.159, 0.078, 0.298, 0.450, 0.500, 0.436, 0.274, 0.049, -0.187, -0.380, -0.487, -0.484, -0.371, -0.173, 0.063, 0.285, 0.443, 0.500, 0.444, 0.286, 0.064, -0.172, -0.370, -0.484, -0.487, -0.381, -0.188, 0.048, 0.273, 0.436, 0.500, 0.450, 0.299, 0.079, -0.158, -0.360, -0.480, -0.491, -0.390, -0.201, 0.033, 0.260, 0.428, 0.499, 0.457, 0.311, 0.094, -0.144, -0.349, -0.475, -0.493, -0.400, -0.215, 0.018, 0.247, 0.420, 0.498, 0.463, 0.322, 0.109, -0.129, -0.338, -0.470, -0.496, -0.408, -0.229, 0.003, 0.234, 0.412, 0.496, 0.468, 0.334, 0.124, -0.115, -0.327, -0.465, -0.497, -0.417, -0.242, -0.012, 0.221, 0.403, 0.494, 0.473, 0.345, 0.138, -0.100, -0.315, -0.459, -0.499, -0.425, -0.255, -0.027, 0.207, 0.394, 0.492, 0.478, 0.356, 0.153, -0.085, -0.303, -0.453, -0.500, -0.433, -0.268, -0.042, 0.193, 0.385, 0.489, 0.482, 0.366, 0.167, -0.070, -0.291, -0.446, -0.500, -0.440]>
  %b: float32[24] = dense<[0.432, 0.131, -0.245, -0.480, -0.440, -0.147, 0.230, 0.475, 0.448, 0.163, -0.215, -0.470, -0.455, -0.179, 0.200, 0.464, 0.462, 0.194, -0.185, -0.457, -0.468, -0.210, 0.169, 0.450]>
  %wo: float32[8, 8] = dense<[0.322, 0.409, 0.469, 0.498, 0.493, 0.456, 0.388, 0.294, 0.181, 0.055, -0.074, -0.198, -0.309, -0.399, -0.463, -0.496, -0.496, -0.462, -0.398, -0.307, -0.196, -0.072, 0.057, 0.183, 0.296, 0.389, 0.457, 0.494, 0.498, 0.468, 0.408, 0.320, 0.212, 0.088, -0.041, -0.167, -0.282, -0.378, -0.449, -0.491, -0.499, -0.474, -0.418, -0.333, -0.227, -0.105, 0.024, 0.151, 0.268, 0.367, 0.442, 0.487, 0.500, 0.479, 0.427, 0.346, 0.241, 0.121, -0.007, -0.135, -0.254, -0.356, -0.434, -0.483]>
  %bo: float32[8] = dense<[-0.079, -0.491, -0.258, 0.314, 0.473, 0.010, -0.466, -0.329]>
  %s5: int64[4] = dense<[3, 2, 3, 8]>
  %zero1: int64[1] = dense<[0]>
  %three1: int64[1] = dense<[3]>
  %i0: int64[] = dense<0>
  %i1: int64[] = dense<1>
  %i2: int64[] = dense<2>
  %sbhd: int64[3] = dense<[3, 4, 4]>
  %bhsd: int64[4] = dense<[2, 2, 3, 4]>
  %flat: int64[2] = dense<[6, 8]>
  %sbe: int64[3] = dense<[3, 2, 8]>
  %c: float32[] = dense<0.70710677>
  %xt: float32[3, 2, 8] = Transpose(%x) {perm=[1, 0, 2]}  # seq_first_in
  %pm: float32[3, 2, 24] = MatMul(%xt, %w)  # in_proj
  %p: float32[3, 2, 24] = Add(%b, %pm)  # in_proj_bias
  %r: float32[3, 2, 3, 8] = Reshape(%p, %s5)  # unflatten
  %u: float32[1, 3, 2, 3, 8] = Unsqueeze(%r, %zero1)  # unsqueeze
  %t: float32[3, 3, 2, 1, 8] = Transpose(%u) {perm=[3, 1, 2, 0, 4]}  # packed_t
  %sq: float32[3, 3, 2, 8] = Squeeze(%t, %three1)  # squeeze
  %g0: float32[3, 2, 8] = Gather(%sq, %i0) {axis=0}  # q_gather
  %g1: float32[3, 2, 8] = Gather(%sq, %i1) {axis=0}  # k_gather
  %g2: float32[3, 2, 8] = Gather(%sq, %i2) {axis=0}  # v_gather
  %q1: float32[3, 4, 4] = Reshape(%g0, %sbhd)  # q_r1
  %q2: float32[4, 3, 4] = Transpose(%q1) {perm=[1, 0, 2]}  # q_t
  %q3: float32[2, 2, 3, 4] = Reshape(%q2, %bhsd)  # q_r2
  %k1: float32[3, 4, 4] = Reshape(%g1, %sbhd)  # k_r1
  %k2: float32[4, 3, 4] = Transpose(%k1) {perm=[1, 0, 2]}  # k_t
  %k3: float32[2, 2, 3, 4] = Reshape(%k2, %bhsd)  # k_r2
  %v1: float32[3, 4, 4] = Reshape(%g2, %sbhd)  # v_r1
  %v2: float32[4, 3, 4] = Transpose(%v1) {perm=[1, 0, 2]}  # v_t
  %v3: float32[2, 2, 3, 4] = Reshape(%v2, %bhsd)  # v_r2
  %kt: float32[2, 2, 4, 3] = Transpose(%k3) {perm=[0, 1, 3, 2]}  # k_swap
  %qs: float32[2, 2, 3, 4] = Mul(%q3, %c)  # q_scale
  %ks: float32[2, 2, 4, 3] = Mul(%kt, %c)  # k_scale
  %s: float32[2, 2, 3, 3] = MatMul(%qs, %ks)  # scores
  %pr: float32[2, 2, 3, 3] = Softmax(%s) {axis=-1}  # softmax
  %o: float32[2, 2, 3, 4] = MatMul(%pr, %v3)  # context
  %ot: float32[3, 2, 2, 4] = Transpose(%o) {perm=[2, 0, 1, 3]}  # seq_first
  %of: float32[6, 8] = Reshape(%ot, %flat)  # flatten
  %gm: float32[6, 8] = Gemm(%of, %wo, %bo) {transB=1}  # out_proj
  %gr: float32[3, 2, 8] = Reshape(%gm, %sbe)  # unflatten_out
  %z: float32[2, 3, 8] = Transpose(%gr) {perm=[1, 0, 2]}  # batch_first_out
  %out: float32[2, 3, 8] = Add(%z, %x)  # residual
}
)";

TEST(PackAttention, SequenceFirstBlocksRunBatchFirst) {
  ir::Graph g = parse(kMhaBlock);
  ir::Graph packed = fuse_and_pack(kMhaBlock, /*linear_layers=*/true);
  const std::string text = ir::to_text(packed);
  for (const char* part :
       {"%p: float32[2, 3, 24] = kiln::MatMulBias(%x, %w, %b) {activation=\"none\"}  # in_proj",
        "float32[2, 3, 8] = kiln::PackedAttention(%p, %p, %p) {head_size=4, k_offset=8, "
        "kv_num_heads=2, "
        "output_rank=3, q_num_heads=2, q_offset=0, scale=0.49999997, seq_first=0",
        "%out: float32[2, 3, 8] = kiln::MatMulBias("}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  }
  for (const char* gone : {"Transpose(", "Gemm(", "Reshape(", "Add("}) {
    EXPECT_EQ(text.find(gone), std::string::npos) << gone << "\n" << text;
  }
  // Each fused node records the model's nodes it stands for (kiln inspect's "fused layers"),
  // counted through the fusions before it: the attention replaced fuse_attention's Attention.
  std::map<std::string, std::map<std::string, int64_t>> replaced;
  for (const ir::Node& n : packed.nodes) replaced[n.name] = n.replaced;
  EXPECT_EQ(replaced["scores"], (std::map<std::string, int64_t>{
                                    {"MatMul", 2}, {"Mul", 2}, {"Softmax", 1}, {"Transpose", 2}}));
  EXPECT_EQ(replaced["in_proj"], (std::map<std::string, int64_t>{{"Add", 1}, {"MatMul", 1}}));
  // The output projection: the Gemm between its Reshapes, which it leaves unread, and the
  // Transpose and residual Add it replaces.
  EXPECT_EQ(replaced["out_proj"], (std::map<std::string, int64_t>{
                                      {"Add", 1}, {"Gemm", 1}, {"Reshape", 2}, {"Transpose", 1}}));
  std::map<std::string, Tensor> in = {{"x", random_f32({2, 3, 8}, 90)}};
  std::map<std::string, Tensor> want = run_graph(g, in), got = run_graph(packed, in);
  ASSERT_TRUE(got.count("out") && want.count("out"));
  ErrorStats e = error_stats(got.at("out"), want.at("out"));
  EXPECT_GT(e.ref_max_abs, 0.0);
  EXPECT_LE(e.max_abs, 1e-5 * std::max(1.0, e.ref_max_abs));
}

// kBertAttention with its Q, K and V computed in the graph: three linear layers of one input x.
std::string bert_projections() {
  std::string body = kBertAttention;
  body = body.substr(body.find("  %shape4"));  // the attention itself, after the opset line
  auto dense = [](int n, int seed) {
    std::string d = "dense<[";
    for (int i = 0; i < n; ++i)
      d += (i ? ", " : "") + std::to_string(0.5 * std::sin(0.37 * (i + 1) * seed + seed));
    return d + "]>";
  };
  std::string text =
      "graph g(%x: float32[2, 3, 8], %m: float32[2, 1, 1, 3]) -> (%y: float32[2, 3, 8]) {\n"
      "  opset ai.onnx 17\n";
  int seed = 1;
  for (const char* p : {"q", "k", "v"}) {
    const std::string s = p;
    text += "  %w" + s + ": float32[8, 8] = " + dense(64, seed++) + "\n";
    text += "  %b" + s + ": float32[8] = " + dense(8, seed++) + "\n";
    text += "  %" + s + "m: float32[2, 3, 8] = MatMul(%x, %w" + s + ")  # " + s + "_proj\n";
    text += "  %" + s + ": float32[2, 3, 8] = Add(%" + s + "m, %b" + s + ")  # " + s + "_bias\n";
  }
  return text + body;
}

TEST(PackAttention, ProjectionsOfOneInputBecomeOneGemm) {
  ir::Graph g = parse(bert_projections());
  ir::Graph packed = fuse_and_pack(bert_projections(), /*linear_layers=*/true);
  auto yes = [](const ir::Node&, const std::vector<const ir::Value*>&,
                const std::vector<const ir::Value*>&) { return true; };
  const std::string text = ir::to_text(packed);
  for (const char* part :
       {"%q_qkv: float32[2, 3, 24] = kiln::MatMulBias(%x, %wq_qkv, %wq_qkv_bias) "
        "{activation=\"none\"}",
        "%y: float32[2, 3, 8] = kiln::PackedAttention(%q_qkv, %q_qkv, %q_qkv, %m) {head_size=4, "
        "k_offset=8, kv_num_heads=2, q_num_heads=2, q_offset=0, scale=0.49999997, seq_first=0, "
        "v_head_size=4, v_offset=16}"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  }
  EXPECT_EQ(packed.nodes.size(), 2u) << text;
  EXPECT_EQ(packed.nodes[0].replaced, (std::map<std::string, int64_t>{{"Add", 3}, {"MatMul", 3}}));
  std::map<std::string, Tensor> in = {{"x", random_f32({2, 3, 8}, 91)},
                                      {"m", random_f32({2, 1, 1, 3}, 92)}};
  std::map<std::string, Tensor> want = run_graph(g, in), got = run_graph(packed, in);
  ASSERT_TRUE(got.count("y") && want.count("y"));
  ErrorStats e = error_stats(got.at("y"), want.at("y"));
  EXPECT_GT(e.ref_max_abs, 0.0);
  EXPECT_LE(e.max_abs, 1e-5 * std::max(1.0, e.ref_max_abs));

  // A projection read by something else as well stays, and so do the other two.
  std::string shared = bert_projections();
  shared.replace(shared.find("-> (%y: float32[2, 3, 8])"), 25,
                 "-> (%y: float32[2, 3, 8], %k: float32[2, 3, 8])");
  ir::Graph s = parse(shared);
  ASSERT_TRUE(builder::fuse_matmul_bias(&s, yes).ok());
  ASSERT_TRUE(builder::fuse_attention(&s, yes).ok());
  ASSERT_TRUE(builder::pack_attention(&s, yes).ok());
  const std::string st = ir::to_text(s);
  EXPECT_EQ(st.find("PackedAttention"), std::string::npos) << st;
  EXPECT_EQ(st.find("_qkv"), std::string::npos) << st;
  // Unsupported: the graph as it was.
  ir::Graph u = parse(bert_projections());
  ASSERT_TRUE(builder::fuse_matmul_bias(&u, yes).ok());
  ASSERT_TRUE(builder::fuse_attention(&u, yes).ok());
  const std::string before = ir::to_text(u);
  auto no_packed = [](const ir::Node& n, const std::vector<const ir::Value*>&,
                      const std::vector<const ir::Value*>&) {
    return n.op_type != "PackedAttention";
  };
  ASSERT_TRUE(builder::pack_attention(&u, no_packed).ok());
  EXPECT_EQ(ir::to_text(u), before);
}

TEST(PackAttention, ViewsOfAPackedProjectionAreReadInPlace) {
  const std::string mha = ir::to_text(fuse_and_pack(kMhaAttention));
  EXPECT_NE(
      mha.find(
          "%ot: float32[3, 2, 2, 4] = kiln::PackedAttention(%p, %p, %p) {head_size=4, k_offset=8, "
          "kv_num_heads=2, output_rank=4, q_num_heads=2, q_offset=0, scale=0.49999997, "
          "seq_first=1, "
          "v_head_size=4, v_offset=16}"),
      std::string::npos)
      << mha;
  for (const char* gone : {"Gather(", "Transpose(", "Squeeze(", "Unsqueeze(", "Attention@"}) {
    EXPECT_EQ(mha.find(gone), std::string::npos) << gone << "\n" << mha;
  }
  const std::string split = ir::to_text(fuse_and_pack(kSplitAttention));
  EXPECT_NE(
      split.find(
          "%y: float32[b, 3, 8] = kiln::PackedAttention(%p, %p, %p, %m) {head_size=4, k_offset=8, "
          "kv_num_heads=2, q_num_heads=2, q_offset=0, scale=0.5, seq_first=0, v_head_size=4, "
          "v_offset=16}"),
      std::string::npos)
      << split;
  EXPECT_EQ(split.find("Split("), std::string::npos) << split;
  // The same with a symbolic batch: [S, B*H, D] merges a symbol with a head count, and the
  // Reshape back to [B, H, S, D] splits it again.
  std::string sym = kMhaAttention;
  auto subst = [&](const std::string& from, const std::string& to) {
    for (size_t at; (at = sym.find(from)) != std::string::npos;) sym.replace(at, from.size(), to);
  };
  subst("%p: float32[3, 2, 24]) -> (%y: float32[6, 8])",
        "%p: float32[3, b, 24]) -> (%y: float32[3*b, 8])");
  subst("dense<[3, 2, 3, 8]>", "dense<[0, 0, 3, 8]>");
  subst("dense<[3, 4, 4]>", "dense<[0, -1, 4]>");
  subst("dense<[2, 2, 3, 4]>", "dense<[-1, 2, 3, 4]>");
  subst("dense<[6, 8]>", "dense<[-1, 8]>");
  subst("[3, 2, 3, 8]", "[3, b, 3, 8]");
  subst("[1, 3, 2, 3, 8]", "[1, 3, b, 3, 8]");
  subst("[3, 3, 2, 1, 8]", "[3, 3, b, 1, 8]");
  subst("[3, 3, 2, 8]", "[3, 3, b, 8]");
  subst("[3, 2, 8]", "[3, b, 8]");
  subst("[3, 4, 4]", "[3, 2*b, 4]");
  subst("[4, 3, 4]", "[2*b, 3, 4]");
  subst("[2, 2, 3, 4]", "[b, 2, 3, 4]");
  subst("[2, 2, 4, 3]", "[b, 2, 4, 3]");
  subst("[2, 2, 3, 3]", "[b, 2, 3, 3]");
  subst("[3, 2, 2, 4]", "[3, b, 2, 4]");
  subst("[6, 8]", "[3*b, 8]");
  const std::string symbolic = ir::to_text(fuse_and_pack(sym));
  EXPECT_NE(symbolic.find("%ot: float32[3, b, 2, 4] = kiln::PackedAttention(%p, %p, %p)"),
            std::string::npos)
      << symbolic;
  // BERT's separate projections are Attention's 3-D form already: nothing to pack.
  const std::string bert = ir::to_text(fuse_and_pack(kBertAttention));
  EXPECT_EQ(bert.find("PackedAttention"), std::string::npos) << bert;
  EXPECT_NE(bert.find("Attention@23(%q, %k, %v, %m)"), std::string::npos) << bert;
  // A projection split where the heads are not contiguous (a Transpose inside the head) stays.
  std::string strided = kMhaAttention;
  const std::string from =
      "%q2: float32[4, 3, 4] = Transpose(%q1) {perm=[1, 0, 2]}  # q_t\n"
      "  %q3: float32[2, 2, 3, 4] = Reshape(%q2, %bhsd)  # q_r2";
  const std::string to =
      "%q2: float32[4, 4, 3] = Transpose(%q1) {perm=[1, 2, 0]}  # q_t\n"
      "  %q3: float32[2, 2, 3, 4] = Reshape(%q2, %bhsd)  # q_r2";
  ASSERT_NE(strided.find(from), std::string::npos);
  strided.replace(strided.find(from), from.size(), to);
  const std::string kept = ir::to_text(fuse_and_pack(strided));
  EXPECT_EQ(kept.find("PackedAttention"), std::string::npos) << kept;
}

TEST(PackAttention, ThePackedReferenceMatchesTheUnfusedGraph) {
  // kSplitAttention at batch 2 (the reference runs static shapes).
  std::string split = kSplitAttention;
  for (size_t at; (at = split.find("[b, ")) != std::string::npos;) split.replace(at, 4, "[2, ");
  for (const std::string& text : {std::string(kMhaAttention), split}) {
    ir::Graph g = parse(text);
    ir::Graph packed = fuse_and_pack(text);
    ASSERT_NE(ir::to_text(packed).find("PackedAttention"), std::string::npos)
        << ir::to_text(packed);
    std::map<std::string, Tensor> in;
    uint64_t seed = 70;
    for (int i : g.inputs) {
      Shape s;
      for (const ir::Dim& d : *g.values[size_t(i)].shape) s.push_back(d.value());
      in[g.values[size_t(i)].name] = random_f32(s, seed++);
    }
    std::map<std::string, Tensor> want = run_graph(g, in), got = run_graph(packed, in);
    for (int o : g.outputs) {
      const std::string& name = g.values[size_t(o)].name;
      ASSERT_TRUE(got.count(name) && want.count(name)) << name;
      ErrorStats e = error_stats(got.at(name), want.at(name));
      EXPECT_GT(e.ref_max_abs, 0.0) << name;
      EXPECT_LE(e.max_abs, 1e-5 * std::max(1.0, e.ref_max_abs)) << name;
    }
  }
}

// A small CNN: Conv+BatchNormalization+Relu, MaxPool, a depthwise Conv with HardSwish and ReLU6,
// AveragePool, Concat, a 1x1 Conv with InstanceNormalization and SiLU, a residual Add,
// GlobalAveragePool and Flatten.
const char* kCnn = R"(graph g(%x: float32[1, 3, 8, 8]) -> (%y: float32[1, 8]) {
  opset ai.onnx 17
  %w1: float32[8, 3, 3, 3] = dense<0.05>
  %b1: float32[8] = dense<0.1>
  %one: float32[8] = dense<1.0>
  %zeros: float32[8] = dense<0.0>
  %w2: float32[8, 1, 3, 3] = dense<0.1>
  %w3: float32[8, 16, 1, 1] = dense<0.02>
  %lo: float32[] = dense<0.0>
  %hi: float32[] = dense<6.0>
  %c1: float32[1, 8, 8, 8] = Conv(%x, %w1, %b1) {pads=[1, 1, 1, 1]}  # conv1
  %n1: float32[1, 8, 8, 8] = BatchNormalization(%c1, %one, %zeros, %zeros, %one)  # bn1
  %r1: float32[1, 8, 8, 8] = Relu(%n1)  # relu1
  %p1: float32[1, 8, 4, 4] = MaxPool(%r1) {kernel_shape=[2, 2], strides=[2, 2]}  # pool1
  %c2: float32[1, 8, 4, 4] = Conv(%p1, %w2) {group=8, pads=[1, 1, 1, 1]}  # dw2
  %h2: float32[1, 8, 4, 4] = HardSwish(%c2)  # hswish2
  %q2: float32[1, 8, 4, 4] = Clip(%h2, %lo, %hi)  # relu6
  %a2: float32[1, 8, 4, 4] = AveragePool(%q2) {kernel_shape=[3, 3], pads=[1, 1, 1, 1]}  # pool2
  %cat: float32[1, 16, 4, 4] = Concat(%p1, %a2) {axis=1}  # cat
  %c3: float32[1, 8, 4, 4] = Conv(%cat, %w3)  # pw3
  %n3: float32[1, 8, 4, 4] = InstanceNormalization(%c3, %one, %zeros)  # in3
  %s3: float32[1, 8, 4, 4] = Sigmoid(%n3)  # sig3
  %m3: float32[1, 8, 4, 4] = Mul(%n3, %s3)  # silu3
  %res: float32[1, 8, 4, 4] = Add(%m3, %p1)  # res
  %gap: float32[1, 8, 1, 1] = GlobalAveragePool(%res)  # gap
  %y: float32[1, 8] = Flatten(%gap)  # flat
}
)";

TEST(AssignPrecision, TheCudaKernelsKeepACnnReduced) {
  // The CUDA implementations answer supports() without a GPU (their factories allocate nothing).
  const backends::KernelRegistry& registry = backends::kernel_registry();
  if (!registry.has(ops::OpKind::kConv, Device::kCUDA)) {
    GTEST_SKIP() << "this build has no CUDA implementations (built without nvcc)";
  }
  for (DType reduced : {DType::kFloat16, DType::kBFloat16}) {
    PrecisionPolicy policy;
    (reduced == DType::kFloat16 ? policy.fp16 : policy.bf16) = true;
    std::vector<std::string> refused;
    auto supports = [&](const ir::Node& n, const std::vector<const ir::Value*>& in,
                        const std::vector<const ir::Value*>& out) {
      backends::KernelQuery q{n, in, out, policy};
      std::string why;
      for (const backends::KernelImpl* impl :
           registry.candidates(ops::find_op(n.domain, n.op_type), Device::kCUDA)) {
        Status st = impl->supports(q);
        if (st.ok()) return true;
        why += " " + st.message();
      }
      refused.push_back(n.name + ":" + why);
      return false;
    };
    ir::Graph g = parse(kCnn);
    Status st = builder::assign_precision(&g, reduced, supports);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ir::compact(&g);
    std::string text = ir::to_text(g);
    EXPECT_TRUE(refused.empty()) << ::testing::PrintToString(refused);
    // Casts only at the engine's input and output; every other node computes in the reduced type.
    int casts = 0;
    for (const ir::Node& n : g.nodes) {
      if (n.op_type == "Cast") {
        ++casts;
        continue;
      }
      for (int v : n.outputs) {
        EXPECT_EQ(g.values[size_t(v)].dtype, reduced) << n.name << "\n" << text;
      }
    }
    EXPECT_EQ(casts, 2) << text;
  }
}

}  // namespace
}  // namespace kiln::testing
