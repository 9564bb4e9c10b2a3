// CUDA backend tests: every shared model in strict FP32, TF32, FP16 and BF16 against the ONNX
// Runtime reference (error statistics printed, limits in test_util.h), the MobileNetV3 TF32
// finding, precisions recorded per layer, and device out-of-memory. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backends/backend.h"
#ifdef KILN_HAVE_CUDA
#include "backends/cuda/attention_launches.h"
#include "backends/cuda/jit.h"
#endif
#include "core/dtype.h"
#include "ir/text.h"
#include "model_util.h"
#include "plan/plan.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

#define REQUIRE_CUDA()                                                                          \
  if (models_dir().empty()) GTEST_SKIP() << "../shared/models is absent (set KILN_MODELS_DIR)"; \
  if (Status why = device_available(Device::kCUDA); !why.ok()) {                                \
    GTEST_SKIP() << "CUDA is not available: " << why.message();                                 \
  }

enum class Precision { kFp32, kTf32, kFp16, kBf16 };

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kTf32:
      return "tf32";
    case Precision::kFp16:
      return "fp16";
    case Precision::kBf16:
      return "bf16";
  }
  return "";
}

BuilderConfig config_for(Precision p) {
  BuilderConfig c;  // TF32 on by default
  if (p == Precision::kFp32) c.clear_flag(BuilderFlag::kTF32);
  if (p == Precision::kFp16) c.set_flag(BuilderFlag::kFP16);
  if (p == Precision::kBf16) c.set_flag(BuilderFlag::kBF16);
  return c;
}

bool is_classifier(const std::string& model) {
  return model == "mobilenet_v3_small" || model == "vit_tiny" || model == "vit_tiny_legacy";
}

// Runs every test set of a model on CUDA at one precision; returns per-set stats of output 0.
struct SetResult {
  ErrorStats stats;
  double top1 = 1;
  Tensor got, expected;
};
StatusOr<std::vector<SetResult>> run_model(const std::string& name, Precision precision,
                                           std::vector<LayerInfo>* layers = nullptr) {
  std::string dir = models_dir() + "/" + name;
  KILN_ASSIGN_OR_RETURN(Engine engine, build_model(dir + "/model.onnx", shared_model_profile(name),
                                                   Device::kCUDA, config_for(precision)));
  KILN_ASSIGN_OR_RETURN(auto sets, load_test_sets(dir));
  KILN_ASSIGN_OR_RETURN(auto ctx, engine.create_execution_context());
  int num_inputs = 0;
  while (engine.tensor_mode(engine.io_tensor_name(num_inputs)) == TensorIOMode::kINPUT)
    ++num_inputs;
  std::vector<SetResult> results;
  for (const TestSet& set : sets) {
    std::map<std::string, Tensor> inputs;
    for (int i = 0; i < num_inputs; ++i) inputs[engine.io_tensor_name(i)] = set.inputs[i];
    KILN_ASSIGN_OR_RETURN(auto out, ctx->run(inputs));
    SetResult r;
    r.got = out.at(engine.io_tensor_name(num_inputs));
    r.expected = set.outputs[0];
    r.stats = error_stats(r.got, r.expected);
    if (is_classifier(name)) r.top1 = top1_agreement(r.got, r.expected);
    results.push_back(std::move(r));
  }
  if (layers) *layers = engine.layers();
  return results;
}

void print_stats(const std::string& name, Precision p, size_t set, const SetResult& r) {
  std::printf(
      "[cuda %-5s] %-19s set %zu: max_abs %.3g (ref max %.3g) mean_abs %.3g (ref mean %.3g) cosine "
      "%.7f top1 %.2f\n",
      precision_name(p), name.c_str(), set, r.stats.max_abs, r.stats.ref_max_abs, r.stats.mean_abs,
      r.stats.ref_mean_abs, r.stats.cosine, r.top1);
}

class CudaModel : public ::testing::TestWithParam<std::tuple<std::string, Precision>> {};

TEST_P(CudaModel, MatchesOnnxRuntimeWithinPrecisionTolerance) {
  REQUIRE_CUDA();
  const auto [name, precision] = GetParam();
  std::vector<LayerInfo> layers;
  auto results = run_model(name, precision, &layers);
  ASSERT_TRUE(results.ok()) << name << " " << precision_name(precision) << ": "
                            << results.status().to_string();
  // The engine records what each layer computes in; GEMM and conv layers show the precision.
  bool saw_math_layer = false;
  const char* want = precision == Precision::kFp32   ? "float32"
                     : precision == Precision::kTf32 ? "tf32"
                     : precision == Precision::kFp16 ? "float16"
                                                     : "bfloat16";
  for (const LayerInfo& l : layers) {
    if (l.op_type == "MatMul" || l.op_type == "MatMulBias" || l.op_type == "Gemm" ||
        l.op_type == "Conv" || l.op_type == "FusedConv") {
      saw_math_layer = true;
      EXPECT_EQ(l.precision, want) << l.name << " [" << l.kernel << "]";
    }
  }
  EXPECT_TRUE(saw_math_layer);
  for (size_t k = 0; k < results->size(); ++k) {
    const SetResult& r = (*results)[k];
    print_stats(name, precision, k, r);
    ASSERT_EQ(r.got.shape(), r.expected.shape());
    if (precision == Precision::kFp32) {
      EXPECT_TRUE(all_close(r.got, r.expected, kFp32Atol, kFp32Rtol)) << name << " set " << k;
      continue;
    }
    const PrecisionTolerance& tol = precision == Precision::kTf32   ? kTf32Tolerance
                                    : precision == Precision::kFp16 ? kFp16Tolerance
                                                                    : kBf16Tolerance;
    EXPECT_LE(r.stats.max_abs, tol.max_rel * r.stats.ref_max_abs + tol.abs_floor)
        << name << " " << tol.name << " set " << k;
    EXPECT_LE(r.stats.mean_abs, tol.mean_rel * r.stats.ref_mean_abs + tol.abs_floor)
        << name << " " << tol.name << " set " << k;
    if (r.stats.ref_max_abs > kMeaningfulRefMax) {
      EXPECT_GE(r.stats.cosine, tol.min_cosine) << name << " " << tol.name << " set " << k;
      if (is_classifier(name)) {
        EXPECT_GE(r.top1, tol.min_top1) << name << " " << tol.name << " set " << k;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, CudaModel,
                         ::testing::Combine(::testing::Values("testmod_linear", "unet_pixelshuffle",
                                                              "mobilenet_v3_small", "vit_tiny",
                                                              "vit_tiny_legacy", "llama_tiny"),
                                            ::testing::Values(Precision::kFp32, Precision::kTf32,
                                                              Precision::kFp16, Precision::kBf16)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  precision_name(std::get<1>(info.param));
                         });

// The seed's finding: MobileNetV3 under TF32 is visibly less exact than strict FP32, which
// reaches about 1e-5.
TEST(CudaMobilenetFinding, Tf32ErrorIsClearlyLargerThanStrictFp32) {
  REQUIRE_CUDA();
  auto fp32 = run_model("mobilenet_v3_small", Precision::kFp32);
  auto tf32 = run_model("mobilenet_v3_small", Precision::kTf32);
  ASSERT_TRUE(fp32.ok()) << fp32.status().to_string();
  ASSERT_TRUE(tf32.ok()) << tf32.status().to_string();
  // The CPU reference kernels on the same sets, for scale.
  auto cpu = build_model(models_dir() + "/mobilenet_v3_small/model.onnx",
                         shared_model_profile("mobilenet_v3_small"));
  ASSERT_TRUE(cpu.ok());
  auto cpu_ctx = cpu->create_execution_context();
  auto sets = load_test_sets(models_dir() + "/mobilenet_v3_small");
  ASSERT_TRUE(cpu_ctx.ok() && sets.ok());
  for (size_t k = 0; k < sets->size(); ++k) {
    auto out = (*cpu_ctx)->run({{"x", (*sets)[k].inputs[0]}});
    ASSERT_TRUE(out.ok());
    ErrorStats c = error_stats(out->at("linear_1"), (*sets)[k].outputs[0]);
    ErrorStats g = error_stats((*fp32)[k].got, out->at("linear_1"));
    std::printf(
        "[cpu ] mobilenet_v3_small set %zu: cpu-vs-ort max_abs %.3g cosine %.7f; cuda fp32-vs-cpu "
        "max_abs %.3g cosine %.7f\n",
        k, c.max_abs, c.cosine, g.max_abs, g.cosine);
  }
  double max32 = 0, maxtf = 0;
  for (const auto& r : *fp32) max32 = std::max(max32, r.stats.max_abs);
  for (const auto& r : *tf32) maxtf = std::max(maxtf, r.stats.max_abs);
  std::printf("[cuda] mobilenet_v3_small max abs error: strict fp32 %.3g, tf32 %.3g (ratio %.1f)\n",
              max32, maxtf, max32 > 0 ? maxtf / max32 : 0.0);
  EXPECT_LE(max32, kStrictFp32MobilenetMaxAbs);
  EXPECT_GE(maxtf, kTf32OverFp32MinRatio * max32);
}

// The plan records each library's algorithm (ranked at the opt shapes) as the node's tactic. The
// precision pass keeps vit_tiny's activations float16, so every GEMM and the convolution read
// float16 tensors as they are: nothing to convert, no workspace slot (a GEMM converting a float32
// activation would have one). A tactic a library does not know is refused when the engine is
// loaded.
TEST(CudaPlan, RecordsLibraryAlgorithmsAndWorkspaceSlots) {
  REQUIRE_CUDA();
  auto engine = build_model(models_dir() + "/vit_tiny/model.onnx", shared_model_profile("vit_tiny"),
                            Device::kCUDA, config_for(Precision::kFp16));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const plan::Plan& p = engine->plan();
  int gemms = 0, convs = 0, with_workspace = 0, patch_gemms = 0;
  for (size_t n = 0; n < p.nodes.size(); ++n) {
    const plan::NodePlan& np = p.nodes[n];
    const ir::Node& node = p.graph.nodes[n];
    if (np.impl == "cuda.cublaslt.MatMul" || np.impl == "cuda.cublaslt.Gemm" ||
        np.impl == "cuda.cublaslt.MatMulBias") {
      ++gemms;
      patch_gemms +=
          p.graph.values[size_t(node.inputs[1])].name.find("_patch_matrix") != std::string::npos;
      EXPECT_EQ(np.tactic.rfind("algo=", 0), 0u) << node.describe() << ": " << np.tactic;
      EXPECT_NE(np.tactic.find(" tile="), std::string::npos) << np.tactic;
      bool converts = false;
      for (int i = 0; i < 2; ++i) {
        const ir::Value& v = p.graph.values[size_t(node.inputs[i])];
        EXPECT_EQ(v.dtype, DType::kFloat16) << node.describe() << " input " << i;
        converts |= !v.constant.has_value() && v.dtype == DType::kFloat32;
      }
      EXPECT_EQ(np.workspace_slot >= 0, converts) << node.describe();
      with_workspace += np.workspace_slot >= 0;
    } else if (np.impl == "cuda.cudnn.Conv" || np.impl == "cuda.cudnn.FusedConv" ||
               np.impl == "cuda.cudnn_graph.FusedConv") {
      ++convs;
      // The legacy API's algorithm, or the graph API's timed engine configuration.
      if (np.impl == "cuda.cudnn_graph.FusedConv") {
        EXPECT_TRUE(np.tactic.rfind("engine=", 0) == 0 || np.tactic.rfind("fused engine=", 0) == 0)
            << np.tactic;
      } else {
        EXPECT_EQ(np.tactic.rfind("algo=", 0), 0u) << np.tactic;
      }
      // The precision pass keeps the patch embedding's activations float16, which cuDNN reads as
      // they are: nothing to convert. The layout pass made it a channels-last FusedConv, whose
      // workspace is the zero bias of cuDNN's fused call where B is absent, and nothing else.
      EXPECT_EQ(p.graph.values[size_t(node.inputs[0])].dtype, DType::kFloat16) << node.describe();
      const bool no_bias = node.inputs.size() < 3 || node.inputs[2] < 0;
      EXPECT_EQ(np.workspace_slot >= 0, np.impl == "cuda.cudnn.FusedConv" && no_bias)
          << node.describe();
      EXPECT_EQ(np.layout, "NHWC") << node.describe();
      EXPECT_EQ(engine->layers()[n].layout, "NHWC") << node.describe();  // kiln inspect's column
    } else {
      EXPECT_EQ(np.workspace_slot, -1) << node.describe() << " [" << np.impl << "]";
    }
  }
  std::printf(
      "[cuda] vit_tiny fp16: %d GEMMs, %d convolutions, %d nodes with a workspace slot; first "
      "tactic %s\n",
      gemms, convs, with_workspace, gemms ? p.nodes[0].tactic.c_str() : "");
  EXPECT_GT(gemms, 0);
  // patchify_conv made the stride=kernel patch embedding a GEMM (Reshape, Transpose, MatMulBias):
  // no convolution is left.
  EXPECT_EQ(patch_gemms, 1);
  EXPECT_EQ(convs, 0);
  EXPECT_EQ(with_workspace, 0);  // GEMMs only: they read float16 as it is

  // Saved and loaded, the tactics come back and the engine runs batch 1 and 4 alike.
  auto loaded = Engine::deserialize(engine->serialize());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  for (size_t n = 0; n < p.nodes.size(); ++n)
    EXPECT_EQ(loaded->plan().nodes[n].tactic, p.nodes[n].tactic);
  auto ctx = loaded->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  auto sets = load_test_sets(models_dir() + "/vit_tiny");
  ASSERT_TRUE(sets.ok());
  for (const auto& set : *sets) {
    auto out = (*ctx)->run({{"x", set.inputs[0]}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    ErrorStats e = error_stats(out->begin()->second, set.outputs[0]);
    EXPECT_GT(e.cosine, 0.999) << "max_abs " << e.max_abs;
  }

  // An unknown tactic is refused at load, naming it.
  for (size_t n = 0; n < p.nodes.size(); ++n) {
    if (p.nodes[n].impl != "cuda.cudnn.FusedConv" &&
        p.nodes[n].impl != "cuda.cudnn_graph.FusedConv" &&
        p.nodes[n].impl != "cuda.cublaslt.MatMul") {
      continue;
    }
    plan::Plan bad = p;
    bad.nodes[n].tactic = "algo=warp_drive";
    auto e = Engine::from_plan(std::move(bad));
    Status st = e.ok() ? e->create_execution_context().status() : e.status();
    ASSERT_FALSE(st.ok()) << p.nodes[n].impl;
    EXPECT_NE(st.message().find("warp_drive"), std::string::npos) << st.message();
    if (p.nodes[n].impl != "cuda.cudnn_graph.FusedConv") continue;
    // Tampered graph-API tactics: refused by name, never an exception or an overflow.
    for (const char* t :
         {"engine=- knobs=", "engine=1 knobs=3:", "engine=99999999999999999999 knobs=",
          "engine=1 knobs=0:1", "engine=1 knobs=2:1,2:2", "engine=1", "fused ",
          "fused engine=x knobs=", "fused fused engine=1 knobs=", "fusedengine=1 knobs=",
          "engine=1 knobs= | below=0 heuristic", "engine=1 knobs= | below=4",
          "heuristic | below=x heuristic", "heuristic | below=2 engine="}) {
      plan::Plan tampered = p;
      tampered.nodes[n].tactic = t;
      auto te = Engine::from_plan(std::move(tampered));
      Status ts = te.ok() ? te->create_execution_context().status() : te.status();
      ASSERT_FALSE(ts.ok()) << t;
      EXPECT_NE(ts.message().find("cuDNN graph tactic"), std::string::npos) << ts.message();
    }
    // An engine id cuDNN does not have parses, and the kernel falls back to cuDNN's heuristic
    // choice.
    plan::Plan unknown = p;
    unknown.nodes[n].tactic = "engine=987654 knobs=";
    auto ue = Engine::from_plan(std::move(unknown));
    ASSERT_TRUE(ue.ok()) << ue.status().to_string();
    auto uctx = ue->create_execution_context();
    ASSERT_TRUE(uctx.ok()) << uctx.status().to_string();
    EXPECT_TRUE((*uctx)->run({{"x", (*sets)[0].inputs[0]}}).ok());
  }
}

// Every activation kiln::FusedConv takes, with and without bias and residual: the fusion pass makes
// seven FusedConvs of this chain on CUDA, whose cuDNN fused call (ReLU, none) or epilogue kernel
// (the rest) must compute what the CPU reference computes unfused, in strict FP32 (the same sums
// in another order) and in FP16 (cosine). 16 channels, so channels-last rows take the
// vectorized epilogue.
const char* kFusedConvChain = R"(graph g(%x: float32[n, 16, 8, 8]) -> (%y: float32[n, 16, 8, 8]) {
  opset ai.onnx 17
  %w: float32[16, 16, 3, 3] = dense<RANDOM>
  %w1: float32[16, 16, 1, 1] = dense<RANDOM>
  %b: float32[16] = dense<RANDOM>
  %lo: float32[] = dense<-0.5>
  %hi: float32[] = dense<0.75>
  %c1: float32[n, 16, 8, 8] = Conv(%x, %w, %b) {pads=[1, 1, 1, 1]}  # conv_relu_res
  %a1: float32[n, 16, 8, 8] = Add(%c1, %x)  # res1
  %r1: float32[n, 16, 8, 8] = Relu(%a1)  # relu1
  %c2: float32[n, 16, 8, 8] = Conv(%r1, %w1)  # conv_clip
  %r2: float32[n, 16, 8, 8] = Clip(%c2, %lo, %hi)  # clip2
  %c3: float32[n, 16, 8, 8] = Conv(%r2, %w, %b) {pads=[1, 1, 1, 1]}  # conv_hswish
  %r3: float32[n, 16, 8, 8] = HardSwish(%c3)  # hswish3
  %c4: float32[n, 16, 8, 8] = Conv(%r3, %w1, %b)  # conv_hsig
  %r4: float32[n, 16, 8, 8] = HardSigmoid(%c4) {alpha=0.25, beta=0.4}  # hsig4
  %c5: float32[n, 16, 8, 8] = Conv(%r4, %w, %b) {pads=[1, 1, 1, 1]}  # conv_silu
  %s5: float32[n, 16, 8, 8] = Sigmoid(%c5)  # sig5
  %r5: float32[n, 16, 8, 8] = Mul(%c5, %s5)  # silu5
  %c6: float32[n, 16, 8, 8] = Conv(%r5, %w1)  # conv_leaky_res
  %a6: float32[n, 16, 8, 8] = Add(%r4, %c6)  # res6
  %r6: float32[n, 16, 8, 8] = LeakyRelu(%a6) {alpha=0.1}  # leaky6
  %c7: float32[n, 16, 8, 8] = Conv(%r6, %w, %b) {pads=[1, 1, 1, 1]}  # conv_sig_res
  %a7: float32[n, 16, 8, 8] = Add(%c7, %r1)  # res7
  %y: float32[n, 16, 8, 8] = Sigmoid(%a7)  # sig7
}
)";

// kFusedConvChain with its RANDOM constants filled from a seeded generator.
StatusOr<Network> fused_conv_chain() {
  std::string text = kFusedConvChain;
  uint64_t seed = 11;
  for (size_t at; (at = text.find("RANDOM")) != std::string::npos;) {
    size_t open = text.rfind('[', at), close = text.find(']', open);
    Shape shape;
    for (size_t i = open + 1; i < close;) {
      size_t end = text.find_first_of(",]", i);
      shape.push_back(std::stoll(text.substr(i, end - i)));
      i = end + 1;
    }
    Tensor t = random_f32(shape, seed++);
    std::string values = "[";
    for (int64_t i = 0; i < t.numel(); ++i) {
      values += (i ? ", " : "") + std::to_string(t.float_at(i) * 0.3);
    }
    text.replace(at, 6, values + "]");
  }
  KILN_ASSIGN_OR_RETURN(ir::Graph g, ir::parse_text(text, {}));
  Network net;
  net.graph = std::move(g);
  return net;
}

// kFusedConvChain built for `d` in precision `p` at builder optimization level `level`, for
// batches 1..3 (opt 3).
StatusOr<Engine> build_fused_conv_chain(const Network& net, Device d, Precision p, int level) {
  BuilderConfig c = config_for(p);
  KILN_RETURN_IF_ERROR(c.set_builder_optimization_level(level));
  OptimizationProfile prof;
  KILN_RETURN_IF_ERROR(prof.set_dimensions("x", {1, 16, 8, 8}, {3, 16, 8, 8}, {3, 16, 8, 8}));
  c.add_profile(prof);
  return Builder(d).build(net, c);
}

// At optimization level 2: precompiled cuDNN engines only (no runtime fusion, so cuBLASLt keeps
// every 1x1 convolution; CudaFusedConv.RuntimeFusionAtLevelThree covers level 3).
TEST(CudaFusedConv, EveryActivationAndResidualMatchesTheCpu) {
  if (Status why = device_available(Device::kCUDA); !why.ok()) GTEST_SKIP() << why.message();
  auto net = fused_conv_chain();
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  auto build = [&](Device d, Precision p) { return build_fused_conv_chain(*net, d, p, 2); };
  auto cpu = build(Device::kCPU, Precision::kFp32);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  auto cpu_ctx = cpu->create_execution_context();
  ASSERT_TRUE(cpu_ctx.ok());
  for (Precision p : {Precision::kFp32, Precision::kFp16}) {
    auto engine = build(Device::kCUDA, p);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    int fused = 0;
    for (const LayerInfo& l : engine->layers()) {
      if (l.op_type != "FusedConv") continue;
      ++fused;
      EXPECT_NE(l.kernel.find("FusedConv"), std::string::npos) << l.name << ": " << l.kernel;
    }
    EXPECT_EQ(fused, 7) << precision_name(p);
    // In FP16 the layout pass makes them channels last: the three 1x1 convolutions (clip,
    // hardsigmoid, leaky ReLU with a residual) run as cuBLASLt GEMMs, the four 3x3 ones on cuDNN's
    // graph API; in FP32 all stay on the legacy cuDNN API.
    int gemm_convs = 0, graph_convs = 0;
    for (const LayerInfo& l : engine->layers()) {
      gemm_convs += l.kernel == "cuda.cublaslt.FusedConv";
      graph_convs += l.kernel == "cuda.cudnn_graph.FusedConv";
    }
    EXPECT_EQ(gemm_convs, p == Precision::kFp16 ? 3 : 0) << precision_name(p);
    EXPECT_EQ(graph_convs, p == Precision::kFp16 ? 4 : 0) << precision_name(p);
    auto ctx = engine->create_execution_context();
    ASSERT_TRUE(ctx.ok());
    // The layer profiler on CUDA (events around each kernel): every layer reported, none free.
    struct Recorder final : Profiler {
      std::vector<double> ms;
      void report_layer_time(const std::string&, double t) override { ms.push_back(t); }
    } recorder;
    (*ctx)->set_profiler(&recorder);
    ASSERT_TRUE((*ctx)->run({{"x", random_f32({3, 16, 8, 8}, 99)}}).ok());
    (*ctx)->set_profiler(nullptr);
    EXPECT_EQ(recorder.ms.size(), engine->layers().size());
    for (double t : recorder.ms) EXPECT_GT(t, 0.0);
    if (p == Precision::kFp16) {
      // Bias, residual and activation in the cuDNN graph ("fused ...", rounded once) or in a pass
      // after it (rounded twice): the same values within float16's rounding. Hard swish has no
      // cuDNN pointwise mode, so a fused tactic on that node is refused by name.
      // Batch 1 and 3: "below=2" runs its second configuration for batch 1 and its first for 3.
      const Tensor xs[2] = {random_f32({1, 16, 8, 8}, 77), random_f32({3, 16, 8, 8}, 78)};
      std::vector<std::map<std::string, Tensor>> base;
      for (const Tensor& x : xs) {
        auto r = (*ctx)->run({{"x", x}});
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        base.push_back(std::move(*r));
      }
      const plan::Plan& pl = engine->plan();
      int fused_chosen = 0;
      for (size_t n = 0; n < pl.nodes.size(); ++n) {
        if (pl.nodes[n].impl != "cuda.cudnn_graph.FusedConv") continue;
        fused_chosen += pl.nodes[n].tactic.rfind("fused ", 0) == 0;
        auto act = pl.graph.nodes[n].attrs.get_string("activation", "none");
        ASSERT_TRUE(act.ok());
        const bool hswish = *act == "hardswish";
        for (const char* t :
             {"heuristic", "fused heuristic", "heuristic | below=2 fused heuristic"}) {
          plan::Plan forced = pl;
          forced.nodes[n].tactic = t;
          auto fe = Engine::from_plan(std::move(forced));
          Status fs = fe.ok() ? fe->create_execution_context().status() : fe.status();
          if (hswish && std::string(t).find("fused") != std::string::npos) {
            ASSERT_FALSE(fs.ok());
            EXPECT_NE(fs.message().find("fuses an activation"), std::string::npos) << fs.message();
            continue;
          }
          ASSERT_TRUE(fs.ok()) << pl.graph.nodes[n].name << " " << t << ": " << fs.to_string();
          auto fctx = fe->create_execution_context();
          ASSERT_TRUE(fctx.ok());
          for (size_t b = 0; b < 2; ++b) {
            auto got = (*fctx)->run({{"x", xs[b]}});
            ASSERT_TRUE(got.ok()) << got.status().to_string();
            ErrorStats e = error_stats(got->at("y"), base[b].at("y"));
            EXPECT_GE(e.cosine, 0.99999)
                << pl.graph.nodes[n].name << " " << t << " max abs " << e.max_abs;
          }
        }
      }
      std::printf(
          "[cuda] FusedConv chain fp16: %d of 4 graph-API convolutions chose a fused tactic\n",
          fused_chosen);
      // conv_leaky_res, a 1x1 cuBLASLt convolution, is the last reader of its residual Z: Y takes
      // Z's arena slot (C == D, in place). The loader accepts that hand-over for an implementation
      // the registry says writes in place, and refuses it for one that does not.
      int in_place = 0;
      for (size_t n = 0; n < pl.nodes.size(); ++n) {
        const ir::Node& node = pl.graph.nodes[n];
        if (pl.nodes[n].impl != "cuda.cublaslt.FusedConv" || node.inputs.size() < 4 ||
            node.inputs[3] < 0)
          continue;
        const plan::ValuePlan &y = pl.values[size_t(node.outputs[0])],
                              &z = pl.values[size_t(node.inputs[3])];
        if (y.storage != plan::Storage::kActivation || z.storage != plan::Storage::kActivation ||
            y.slot != z.slot) {
          continue;
        }
        ++in_place;
        plan::Plan other = pl;
        other.nodes[n].impl = "cuda.cudnn_graph.FusedConv";
        other.nodes[n].tactic = "heuristic";
        auto oe = Engine::from_plan(std::move(other));
        ASSERT_FALSE(oe.ok()) << node.describe();
        EXPECT_NE(oe.status().message().find("never live at once"), std::string::npos)
            << oe.status().message();
      }
      EXPECT_EQ(in_place, 1);
    }
    for (int64_t batch : {1, 3}) {
      Tensor x = random_f32({batch, 16, 8, 8}, 100 + uint64_t(batch));
      auto want = (*cpu_ctx)->run({{"x", x}});
      auto got = (*ctx)->run({{"x", x}});
      ASSERT_TRUE(want.ok() && got.ok()) << got.status().to_string();
      ErrorStats e = error_stats(got->at("y"), want->at("y"));
      std::printf("[cuda] FusedConv chain %s batch %lld: max abs %.3g, cosine %.7f\n",
                  precision_name(p), (long long)batch, e.max_abs, e.cosine);
      if (p == Precision::kFp32) {
        EXPECT_LE(e.max_abs, 1e-4 + 1e-3 * e.ref_max_abs);
      } else {
        EXPECT_GE(e.cosine, 0.999);
      }
    }
  }
}

// Level 3 (the default): cuBLASLt declines the 1x1 convolutions whose activation its epilogue
// lacks but cuDNN's pointwise nodes compute (Clip, LeakyRelu), so cuDNN's graph API runs six of
// the seven, and its runtime-fusion engines are timed for the fused form ("fused jit engine=...",
// compiled again for each batch the kernel meets). Every tactic the builder chose, at batch 1, 3
// and 2 (a shape the plan has not met), matches the CPU; a jit tactic without "fused", or on
// "heuristic", is refused by name.
TEST(CudaFusedConv, RuntimeFusionAtLevelThree) {
  if (Status why = device_available(Device::kCUDA); !why.ok()) GTEST_SKIP() << why.message();
#ifdef KILN_HAVE_CUDA
  const bool runtime_fusion = backends::cuda::cudnn_runtime_fusion();
#else
  const bool runtime_fusion = false;  // unreachable: no CUDA device without the backend
#endif
  auto net = fused_conv_chain();
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  auto build = [&](Device d, Precision p) { return build_fused_conv_chain(*net, d, p, 3); };
  auto cpu = build(Device::kCPU, Precision::kFp32);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  auto cpu_ctx = cpu->create_execution_context();
  ASSERT_TRUE(cpu_ctx.ok());
  auto engine = build(Device::kCUDA, Precision::kFp16);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const plan::Plan& pl = engine->plan();
  int gemm_convs = 0, graph_convs = 0, jit = 0;
  for (size_t n = 0; n < pl.nodes.size(); ++n) {
    gemm_convs += pl.nodes[n].impl == "cuda.cublaslt.FusedConv";
    if (pl.nodes[n].impl != "cuda.cudnn_graph.FusedConv") continue;
    ++graph_convs;
    jit += pl.nodes[n].tactic.find("fused jit engine=") != std::string::npos;
  }
  EXPECT_EQ(gemm_convs, runtime_fusion ? 1 : 3);  // hard sigmoid's stays on cuBLASLt
  EXPECT_EQ(graph_convs, runtime_fusion ? 6 : 4);
  std::printf(
      "[cuda] FusedConv chain fp16 level 3: %d of %d graph-API convolutions chose a jit "
      "tactic (runtime fusion %s)\n",
      jit, graph_convs, runtime_fusion ? "available" : "unavailable");
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  for (int64_t batch : {1, 3, 2}) {
    Tensor x = random_f32({batch, 16, 8, 8}, 200 + uint64_t(batch));
    auto want = (*cpu_ctx)->run({{"x", x}});
    auto got = (*ctx)->run({{"x", x}});
    ASSERT_TRUE(want.ok() && got.ok()) << got.status().to_string();
    ErrorStats e = error_stats(got->at("y"), want->at("y"));
    std::printf("[cuda] FusedConv chain fp16 level 3 batch %lld: max abs %.3g, cosine %.7f\n",
                (long long)batch, e.max_abs, e.cosine);
    EXPECT_GE(e.cosine, 0.999);
  }
  // With KILN_CUDA_JIT=0 the same engine runs its jit nodes on precompiled engines (fused where
  // one takes the graph, else with the epilogue pass), and a new build records no jit tactic.
  ::setenv("KILN_CUDA_JIT", "0", 1);
  {
    auto off_ctx = engine->create_execution_context();
    ASSERT_TRUE(off_ctx.ok());
    Tensor x = random_f32({2, 16, 8, 8}, 300);
    auto want = (*cpu_ctx)->run({{"x", x}});
    auto got = (*off_ctx)->run({{"x", x}});
    ASSERT_TRUE(want.ok() && got.ok()) << got.status().to_string();
    EXPECT_GE(error_stats(got->at("y"), want->at("y")).cosine, 0.999);
    auto off = build(Device::kCUDA, Precision::kFp16);
    ASSERT_TRUE(off.ok()) << off.status().to_string();
    int off_gemm_convs = 0;
    for (const plan::NodePlan& np : off->plan().nodes) {
      off_gemm_convs += np.impl == "cuda.cublaslt.FusedConv";
      EXPECT_EQ(np.tactic.find("jit"), std::string::npos) << np.tactic;
    }
    EXPECT_EQ(off_gemm_convs, 3);
  }
  ::unsetenv("KILN_CUDA_JIT");
  for (size_t n = 0; n < pl.nodes.size(); ++n) {
    if (pl.nodes[n].impl != "cuda.cudnn_graph.FusedConv") continue;
    for (const char* t :
         {"jit engine=1 knobs=", "fused jit heuristic", "fused jit jit engine=1 knobs="}) {
      plan::Plan tampered = pl;
      tampered.nodes[n].tactic = t;
      auto te = Engine::from_plan(std::move(tampered));
      Status ts = te.ok() ? te->create_execution_context().status() : te.status();
      ASSERT_FALSE(ts.ok()) << t;
      EXPECT_NE(ts.message().find("cuDNN graph tactic"), std::string::npos) << ts.message();
    }
    break;
  }
}

// Elementwise chains the fuse_elementwise pass turns into one kiln::Elementwise each: a bias
// [7] (index i % 7), erf GELU, a per-channel gate [1, 8, 1, 1] (index (i / 35) % 8), HardSigmoid
// and a product; and a broadcast of [n, 1, 7] against [n, 5, 1] (the general walk) into
// LeakyRelu and Tanh.
const char* kEwChain =
    R"(graph g(%x: float32[n, 8, 5, 7], %u: float32[n, 1, 7], %v: float32[n, 5, 1]) -> (%y: float32[n, 8, 5, 7], %z: float32[n, 5, 7]) {
  opset ai.onnx 17
  %b: float32[7] = dense<[0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7]>
  %gch: float32[1, 8, 1, 1] = dense<[1.5, -1.0, 0.5, 2.0, -0.25, 1.0, 0.75, -2.0]>
  %sqrt2: float32[] = dense<1.4142135>
  %one: float32[] = dense<1.0>
  %half: float32[] = dense<0.5>
  %h: float32[n, 8, 5, 7] = Add(%x, %b)  # bias
  %d: float32[n, 8, 5, 7] = Div(%h, %sqrt2)  # gelu_div
  %e: float32[n, 8, 5, 7] = Erf(%d)  # gelu_erf
  %p: float32[n, 8, 5, 7] = Add(%e, %one)  # gelu_add
  %q: float32[n, 8, 5, 7] = Mul(%h, %p)  # gelu_mul
  %g: float32[n, 8, 5, 7] = Mul(%q, %half)  # gelu_half
  %s: float32[n, 8, 5, 7] = Mul(%g, %gch)  # gate
  %t: float32[n, 8, 5, 7] = HardSigmoid(%s) {alpha=0.3, beta=0.4}  # hsig
  %y: float32[n, 8, 5, 7] = Mul(%t, %s)  # prod
  %a: float32[n, 5, 7] = Add(%u, %v)  # outer
  %l: float32[n, 5, 7] = LeakyRelu(%a) {alpha=0.2}  # leaky
  %z: float32[n, 5, 7] = Tanh(%l)  # tanh
}
)";

// The network of an IR text; an empty graph (and a failed expectation) where it does not parse.
Network network_of(const std::string& text) {
  auto g = ir::parse_text(text, {});
  EXPECT_TRUE(g.ok()) << g.status().to_string() << "\n" << text;
  Network net;
  if (g.ok()) net.graph = std::move(*g);
  return net;
}

TEST(CudaElementwise, FusedChainsMatchTheUnfusedCpu) {
  if (Status why = device_available(Device::kCUDA); !why.ok()) GTEST_SKIP() << why.message();
  const Network net = network_of(kEwChain);
  auto build = [&](Device d, Precision p) {
    BuilderConfig c = config_for(p);
    OptimizationProfile prof;
    EXPECT_TRUE(prof.set_dimensions("x", {1, 8, 5, 7}, {64, 8, 5, 7}, {200, 8, 5, 7}).ok());
    EXPECT_TRUE(prof.set_dimensions("u", {1, 1, 7}, {64, 1, 7}, {200, 1, 7}).ok());
    EXPECT_TRUE(prof.set_dimensions("v", {1, 5, 1}, {64, 5, 1}, {200, 5, 1}).ok());
    c.add_profile(prof);
    return Builder(d).build(net, c);
  };
  auto cpu = build(Device::kCPU, Precision::kFp32);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  // The CPU engine fuses the two chains as well (fuse_elementwise serves every device), and its
  // float32 kiln::Elementwise gives the bits of the unfused chain
  // (ElementwiseKernel.Float32ProgramsGiveTheUnfusedChainsBits): the reference stays the unfused
  // arithmetic.
  EXPECT_EQ(cpu->num_layers(), 2);
  auto cpu_ctx = cpu->create_execution_context();
  ASSERT_TRUE(cpu_ctx.ok());
  for (Precision p : {Precision::kFp32, Precision::kFp16}) {
    auto engine = build(Device::kCUDA, p);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    ASSERT_EQ(engine->layers().size(), 2u) << precision_name(p);
    for (const LayerInfo& l : engine->layers()) {
      EXPECT_EQ(l.op_type, "Elementwise") << l.name;
      EXPECT_EQ(l.kernel, "cuda.Elementwise") << l.name;
    }
    auto ctx = engine->create_execution_context();
    ASSERT_TRUE(ctx.ok());
    for (int64_t n : {1, 3, 200}) {
      std::map<std::string, Tensor> in = {{"x", random_f32({n, 8, 5, 7}, 200 + uint64_t(n))},
                                          {"u", random_f32({n, 1, 7}, 300 + uint64_t(n))},
                                          {"v", random_f32({n, 5, 1}, 400 + uint64_t(n))}};
      auto want = (*cpu_ctx)->run(in);
      auto got = (*ctx)->run(in);
      ASSERT_TRUE(want.ok() && got.ok()) << got.status().to_string();
      for (const char* name : {"y", "z"}) {
        ASSERT_EQ(got->at(name).shape(), want->at(name).shape());
        ErrorStats e = error_stats(got->at(name), want->at(name));
        std::printf("[cuda] Elementwise %s %s n=%lld: max abs %.3g, cosine %.7f\n", name,
                    precision_name(p), (long long)n, e.max_abs, e.cosine);
        if (p == Precision::kFp32) {
          EXPECT_LE(e.max_abs, 1e-5 + 1e-5 * e.ref_max_abs) << name;
        } else {
          EXPECT_GE(e.cosine, 0.9999) << name;
        }
      }
    }
  }
}

// The chains the generated kernels take (fused_elementwise.cu, jit.h): SwiGLU of two [n, 64]
// inputs, a bias [64] and a scalar, the graph in float32, float16 and bfloat16. The CUDA engine
// with NVRTC's kernel against one built with KILN_CUDA_JIT=0 (the interpreted kernel: the same
// math per op, so at most a rounding step apart) and against the CPU engine of the same graph.
std::string swiglu_chain(const char* t) {
  std::string b = "[";
  for (int i = 0; i < 64; ++i) b += (i ? ", " : "") + std::to_string(0.05 * (i % 9) - 0.2);
  b += "]";
  std::string text = R"(graph g(%x: T[n, 64], %u: T[n, 64]) -> (%y: T[n, 64]) {
  opset ai.onnx 17
  %b: T[64] = dense<B>
  %c: T[] = dense<1.25>
  %s: T[n, 64] = Sigmoid(%x)  # sig
  %w: T[n, 64] = Mul(%x, %s)  # silu
  %g: T[n, 64] = Mul(%w, %u)  # glu
  %h: T[n, 64] = Add(%g, %b)  # bias
  %y: T[n, 64] = Mul(%h, %c)  # scale
}
)";
  for (size_t at; (at = text.find("T[")) != std::string::npos;) text.replace(at, 1, t);
  text.replace(text.find("B>"), 1, b);
  return text;
}

Tensor random_of(DType t, Shape shape, uint64_t seed) {
  Tensor f = random_f32(shape, seed);
  if (t == DType::kFloat32) return f;
  std::vector<uint16_t> h;
  for (int64_t i = 0; i < f.numel(); ++i) {
    const float v = f.data_as<float>()[i];
    h.push_back(t == DType::kFloat16 ? float_to_half(v) : float_to_bf16(v));
  }
  return Tensor::from_vector(t, std::move(shape), h);
}

TEST(CudaElementwise, GeneratedKernelsMatchTheInterpreted) {
  if (Status why = device_available(Device::kCUDA); !why.ok()) GTEST_SKIP() << why.message();
  const std::pair<DType, const char*> types[] = {
      {DType::kFloat32, "float32"}, {DType::kFloat16, "float16"}, {DType::kBFloat16, "bfloat16"}};
  for (auto [t, tname] : types) {
    const Network net = network_of(swiglu_chain(tname));
    auto build = [&](Device d) {
      BuilderConfig c = config_for(Precision::kFp32);
      OptimizationProfile prof;
      EXPECT_TRUE(prof.set_dimensions("x", {1, 64}, {64, 64}, {4096, 64}).ok());
      EXPECT_TRUE(prof.set_dimensions("u", {1, 64}, {64, 64}, {4096, 64}).ok());
      c.add_profile(prof);
      return Builder(d).build(net, c);
    };
    auto cpu = build(Device::kCPU);
    ASSERT_TRUE(cpu.ok()) << tname << ": " << cpu.status().to_string();
    auto cpu_ctx = cpu->create_execution_context();
#ifdef KILN_HAVE_CUDA
    const backends::cuda::JitCounts before = backends::cuda::jit_counts();
#endif
    auto generated = build(Device::kCUDA);
    ASSERT_TRUE(cpu_ctx.ok() && generated.ok()) << tname << ": " << generated.status().to_string();
    auto ctx = generated->create_execution_context();
#ifdef KILN_HAVE_CUDA
    // The program compiled (or came from the cache): the generated kernel is what runs below.
    const backends::cuda::JitCounts after = backends::cuda::jit_counts();
    EXPECT_EQ(after.failed, before.failed) << tname;
    EXPECT_GT(after.compiled + after.reused, before.compiled + before.reused) << tname;
#endif
    ::setenv("KILN_CUDA_JIT", "0", 1);
    auto interpreted = build(Device::kCUDA);
    decltype(ctx) interpreted_ctx = unsupported("not built");
    if (interpreted.ok()) interpreted_ctx = interpreted->create_execution_context();
    ::unsetenv("KILN_CUDA_JIT");
#ifdef KILN_HAVE_CUDA
    const backends::cuda::JitCounts off = backends::cuda::jit_counts();
    EXPECT_EQ(off.compiled + off.reused + off.failed, after.compiled + after.reused + after.failed)
        << tname;
#endif
    ASSERT_TRUE(ctx.ok() && interpreted_ctx.ok()) << interpreted_ctx.status().to_string();
    ASSERT_EQ(generated->layers().size(), 1u) << tname;
    for (int64_t n : {1, 3, 4096}) {
      std::map<std::string, Tensor> in = {{"x", random_of(t, {n, 64}, 500 + uint64_t(n))},
                                          {"u", random_of(t, {n, 64}, 600 + uint64_t(n))}};
      auto want = (*cpu_ctx)->run(in);
      auto got = (*ctx)->run(in);
      auto old = (*interpreted_ctx)->run(in);
      ASSERT_TRUE(want.ok() && got.ok() && old.ok())
          << got.status().to_string() << old.status().to_string();
      ErrorStats vs_cpu = error_stats(got->at("y"), want->at("y"));
      ErrorStats vs_old = error_stats(got->at("y"), old->at("y"));
      std::printf(
          "[cuda] generated Elementwise %s n=%lld: vs CPU max abs %.3g cosine %.7f; vs interpreted "
          "%.3g\n",
          tname, (long long)n, vs_cpu.max_abs, vs_cpu.cosine, vs_old.max_abs);
      const double ulp = t == DType::kFloat32   ? 1e-6
                         : t == DType::kFloat16 ? 1.0 / 1024
                                                : 1.0 / 128;
      EXPECT_LE(vs_old.max_abs, ulp * (1 + vs_old.ref_max_abs)) << tname;
      EXPECT_LE(vs_cpu.max_abs, 2 * ulp * (1 + vs_cpu.ref_max_abs)) << tname;
      EXPECT_GE(vs_cpu.cosine, 0.99999) << tname;
    }
  }
}

// Attention as transformers' TorchScript export writes it (heads split with Reshape [0, 0, 2, 64]
// and Transpose, K transposed once, both operands scaled by 64^-1/4, an additive mask, the NaN
// guard, heads merged), with dynamic batch and sequence.
const char* kExportedAttention =
    R"(graph g(%q: float32[n, s, 128], %k: float32[n, s, 128], %v: float32[n, s, 128], %m: float32[n, 1, 1, s]) -> (%y: float32[n, s, 128]) {
  opset ai.onnx 17
  %split: int64[4] = dense<[0, 0, 2, 64]>
  %merge: int64[3] = dense<[0, 0, 128]>
  %c: float32[] = dense<0.35355339>
  %zero: float32[] = dense<0.0>
  %qr: float32[n, s, 2, 64] = Reshape(%q, %split)  # q_split
  %qt: float32[n, 2, s, 64] = Transpose(%qr) {perm=[0, 2, 1, 3]}  # q_heads
  %kr: float32[n, s, 2, 64] = Reshape(%k, %split)  # k_split
  %kt: float32[n, 2, 64, s] = Transpose(%kr) {perm=[0, 2, 3, 1]}  # k_heads
  %vr: float32[n, s, 2, 64] = Reshape(%v, %split)  # v_split
  %vt: float32[n, 2, s, 64] = Transpose(%vr) {perm=[0, 2, 1, 3]}  # v_heads
  %qs: float32[n, 2, s, 64] = Mul(%qt, %c)  # q_scale
  %ks: float32[n, 2, 64, s] = Mul(%kt, %c)  # k_scale
  %sc: float32[n, 2, s, s] = MatMul(%qs, %ks)  # scores
  %sm: float32[n, 2, s, s] = Add(%sc, %m)  # mask
  %p: float32[n, 2, s, s] = Softmax(%sm) {axis=-1}  # softmax
  %nan: bool[n, 2, s, s] = IsNaN(%p)  # isnan
  %pg: float32[n, 2, s, s] = Where(%nan, %zero, %p)  # guard
  %o: float32[n, 2, s, 64] = MatMul(%pg, %vt)  # context
  %ot: float32[n, s, 2, 64] = Transpose(%o) {perm=[0, 2, 1, 3]}  # merge
  %y: float32[n, s, 128] = Reshape(%ot, %merge)  # merged
}
)";

int64_t count_nan(const Tensor& t) {
  int64_t n = 0;
  for (int64_t i = 0; i < t.numel(); ++i) n += std::isnan(t.float_at(i));
  return n;
}

// A padding mask: key j of batch b is masked (-inf) when j >= len(b); batch 0 masks every key.
Tensor padding_mask(int64_t n, int64_t s) {
  std::vector<float> m(size_t(n * s));
  for (int64_t b = 0; b < n; ++b) {
    const int64_t len = b == 0 ? 0 : s - (b * 5) % s;
    for (int64_t j = 0; j < s; ++j) m[size_t(b * s + j)] = j < len ? 0.f : -INFINITY;
  }
  return Tensor::from_vector(DType::kFloat32, {n, 1, 1, s}, m);
}

TEST(CudaAttention, FusedExportedAttentionMatchesTheUnfusedCpu) {
  if (Status why = device_available(Device::kCUDA); !why.ok()) GTEST_SKIP() << why.message();
  const Network net = network_of(kExportedAttention);
  auto build = [&](Device d, Precision p) {
    BuilderConfig c = config_for(p);
    OptimizationProfile prof;
    for (const char* name : {"q", "k", "v"}) {
      EXPECT_TRUE(prof.set_dimensions(name, {1, 1, 128}, {4, 128, 128}, {4, 300, 128}).ok());
    }
    EXPECT_TRUE(prof.set_dimensions("m", {1, 1, 1, 1}, {4, 1, 1, 128}, {4, 1, 1, 300}).ok());
    c.add_profile(prof);
    return Builder(d).build(net, c);
  };
  auto cpu = build(Device::kCPU, Precision::kFp32);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  auto cpu_ctx = cpu->create_execution_context();
  ASSERT_TRUE(cpu_ctx.ok());
  for (Precision p : {Precision::kFp16, Precision::kBf16}) {
    auto engine = build(Device::kCUDA, p);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    int attention = 0;
    for (const LayerInfo& l : engine->layers()) {
      EXPECT_TRUE(l.op_type != "MatMul" && l.op_type != "Softmax" && l.op_type != "Transpose")
          << l.name;
      if (l.op_type == "Attention") {
        ++attention;
        EXPECT_EQ(l.kernel, "cuda.cudnn_sdpa.Attention") << l.name;
      }
    }
    EXPECT_EQ(attention, 1);
    auto ctx = engine->create_execution_context();
    ASSERT_TRUE(ctx.ok());
    for (auto [n, s] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {4, 128}, {2, 300}}) {
      std::map<std::string, Tensor> in = {{"q", random_f32({n, s, 128}, 500 + uint64_t(s))},
                                          {"k", random_f32({n, s, 128}, 600 + uint64_t(s))},
                                          {"v", random_f32({n, s, 128}, 700 + uint64_t(s))},
                                          {"m", padding_mask(n, s)}};
      auto want = (*cpu_ctx)->run(in);
      auto got = (*ctx)->run(in);
      ASSERT_TRUE(want.ok() && got.ok()) << got.status().to_string();
      ASSERT_EQ(got->at("y").shape(), want->at("y").shape());
      ErrorStats e = error_stats(got->at("y"), want->at("y"));
      std::printf("[cuda] Attention %s n=%lld s=%lld: max abs %.3g, cosine %.7f, nan %lld\n",
                  precision_name(p), (long long)n, (long long)s, e.max_abs, e.cosine,
                  (long long)count_nan(got->at("y")));
      EXPECT_EQ(count_nan(got->at("y")), 0);
      EXPECT_LE(e.max_abs, p == Precision::kFp16 ? 1e-2 : 4e-2);
      if (s > 1) EXPECT_GE(e.cosine, 0.999);
    }
  }
}

// Attention over views of one packed projection, as nn.MultiheadAttention (sequence first, split
// by Gather) and GPT-2 (batch first, split by Split, an additive mask) export it: pack_attention
// makes each a kiln::PackedAttention that reads the projection in place, on cuDNN in FP16 and
// BF16; each against the float32 CPU engine (its attention_f32 kernel).
const char* kPackedMha = R"(graph g(%p: float32[37, n, 384]) -> (%y: float32[37, n, 2, 64]) {
  opset ai.onnx 17
  %s5: int64[4] = dense<[0, 0, 3, 128]>
  %zero1: int64[1] = dense<[0]>
  %three1: int64[1] = dense<[3]>
  %i0: int64[] = dense<0>
  %i1: int64[] = dense<1>
  %i2: int64[] = dense<2>
  %sbhd: int64[3] = dense<[0, -1, 64]>
  %bhsd: int64[4] = dense<[-1, 2, 37, 64]>
  %c: float32[] = dense<0.35355339>
  %r: float32[37, n, 3, 128] = Reshape(%p, %s5)  # unflatten
  %u: float32[1, 37, n, 3, 128] = Unsqueeze(%r, %zero1)  # unsqueeze
  %t: float32[3, 37, n, 1, 128] = Transpose(%u) {perm=[3, 1, 2, 0, 4]}  # packed_t
  %sq: float32[3, 37, n, 128] = Squeeze(%t, %three1)  # squeeze
  %g0: float32[37, n, 128] = Gather(%sq, %i0) {axis=0}  # q_gather
  %g1: float32[37, n, 128] = Gather(%sq, %i1) {axis=0}  # k_gather
  %g2: float32[37, n, 128] = Gather(%sq, %i2) {axis=0}  # v_gather
  %q1: float32[37, 2*n, 64] = Reshape(%g0, %sbhd)  # q_r1
  %q2: float32[2*n, 37, 64] = Transpose(%q1) {perm=[1, 0, 2]}  # q_t
  %q3: float32[n, 2, 37, 64] = Reshape(%q2, %bhsd)  # q_r2
  %k1: float32[37, 2*n, 64] = Reshape(%g1, %sbhd)  # k_r1
  %k2: float32[2*n, 37, 64] = Transpose(%k1) {perm=[1, 0, 2]}  # k_t
  %k3: float32[n, 2, 37, 64] = Reshape(%k2, %bhsd)  # k_r2
  %v1: float32[37, 2*n, 64] = Reshape(%g2, %sbhd)  # v_r1
  %v2: float32[2*n, 37, 64] = Transpose(%v1) {perm=[1, 0, 2]}  # v_t
  %v3: float32[n, 2, 37, 64] = Reshape(%v2, %bhsd)  # v_r2
  %kt: float32[n, 2, 64, 37] = Transpose(%k3) {perm=[0, 1, 3, 2]}  # k_swap
  %qs: float32[n, 2, 37, 64] = Mul(%q3, %c)  # q_scale
  %ks: float32[n, 2, 64, 37] = Mul(%kt, %c)  # k_scale
  %s: float32[n, 2, 37, 37] = MatMul(%qs, %ks)  # scores
  %pr: float32[n, 2, 37, 37] = Softmax(%s) {axis=-1}  # softmax
  %o: float32[n, 2, 37, 64] = MatMul(%pr, %v3)  # context
  %y: float32[37, n, 2, 64] = Transpose(%o) {perm=[2, 0, 1, 3]}  # seq_first
}
)";

const char* kPackedSplit =
    R"(graph g(%p: float32[n, s, 384], %m: float32[s, s]) -> (%y: float32[n, s, 128]) {
  opset ai.onnx 17
  %sizes: int64[3] = dense<[128, 128, 128]>
  %heads: int64[4] = dense<[0, 0, 2, 64]>
  %merge: int64[3] = dense<[0, 0, 128]>
  %c: float32[] = dense<0.125>
  %q: float32[n, s, 128], %k: float32[n, s, 128], %v: float32[n, s, 128] = Split(%p, %sizes) {axis=2}  # split
  %qr: float32[n, s, 2, 64] = Reshape(%q, %heads)  # q_split
  %qt: float32[n, 2, s, 64] = Transpose(%qr) {perm=[0, 2, 1, 3]}  # q_heads
  %kr: float32[n, s, 2, 64] = Reshape(%k, %heads)  # k_split
  %kt: float32[n, 2, 64, s] = Transpose(%kr) {perm=[0, 2, 3, 1]}  # k_heads
  %vr: float32[n, s, 2, 64] = Reshape(%v, %heads)  # v_split
  %vt: float32[n, 2, s, 64] = Transpose(%vr) {perm=[0, 2, 1, 3]}  # v_heads
  %sc: float32[n, 2, s, s] = MatMul(%qt, %kt)  # scores
  %ss: float32[n, 2, s, s] = Mul(%sc, %c)  # scale
  %sm: float32[n, 2, s, s] = Add(%ss, %m)  # mask
  %pr: float32[n, 2, s, s] = Softmax(%sm) {axis=-1}  # softmax
  %o: float32[n, 2, s, 64] = MatMul(%pr, %vt)  # context
  %ot: float32[n, s, 2, 64] = Transpose(%o) {perm=[0, 2, 1, 3]}  # merge
  %y: float32[n, s, 128] = Reshape(%ot, %merge)  # merged
}
)";

TEST(CudaAttention, PackedProjectionsAreReadInPlaceAndMatchTheCpu) {
  if (Status why = device_available(Device::kCUDA); !why.ok()) GTEST_SKIP() << why.message();
  for (const char* text : {kPackedMha, kPackedSplit}) {
    const bool mha = text == kPackedMha;
    const Network net = network_of(text);
    auto build = [&](Device d, Precision p) {
      BuilderConfig c = config_for(p);
      OptimizationProfile prof;
      if (mha) {
        EXPECT_TRUE(prof.set_dimensions("p", {37, 1, 384}, {37, 4, 384}, {37, 4, 384}).ok());
      } else {
        EXPECT_TRUE(prof.set_dimensions("p", {1, 1, 384}, {4, 128, 384}, {4, 300, 384}).ok());
        EXPECT_TRUE(prof.set_dimensions("m", {1, 1}, {128, 128}, {300, 300}).ok());
      }
      c.add_profile(prof);
      return Builder(d).build(net, c);
    };
    auto cpu = build(Device::kCPU, Precision::kFp32);
    ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
    auto cpu_ctx = cpu->create_execution_context();
    ASSERT_TRUE(cpu_ctx.ok());
    for (Precision p : {Precision::kFp16, Precision::kBf16}) {
      auto engine = build(Device::kCUDA, p);
      ASSERT_TRUE(engine.ok()) << engine.status().to_string();
      int packed = 0;
      for (const LayerInfo& l : engine->layers()) {
        for (const char* gone :
             {"Gather", "Split", "Transpose", "MatMul", "Softmax", "Attention"}) {
          EXPECT_NE(l.op_type, gone) << l.name;
        }
        if (l.op_type == "PackedAttention") {
          ++packed;
          EXPECT_EQ(l.kernel, "cuda.cudnn_sdpa.PackedAttention") << l.name;
        }
      }
      EXPECT_EQ(packed, 1);
      auto ctx = engine->create_execution_context();
      ASSERT_TRUE(ctx.ok());
      for (auto [n, s] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {4, 128}, {2, 300}}) {
        std::map<std::string, Tensor> in;
        if (mha) {
          in["p"] = random_f32({37, n, 384}, 1400 + uint64_t(n));
        } else {
          in["p"] = random_f32({n, s, 384}, 1500 + uint64_t(s));
          in["m"] = random_f32({s, s}, 1600 + uint64_t(s));
        }
        auto want = (*cpu_ctx)->run(in);
        auto got = (*ctx)->run(in);
        ASSERT_TRUE(want.ok() && got.ok()) << got.status().to_string();
        ASSERT_EQ(got->at("y").shape(), want->at("y").shape());
        ErrorStats e = error_stats(got->at("y"), want->at("y"));
        std::printf("[cuda] PackedAttention %s %s n=%lld s=%lld: max abs %.3g, cosine %.7f\n",
                    mha ? "mha" : "split", precision_name(p), (long long)n,
                    (long long)(mha ? 37 : s), e.max_abs, e.cosine);
        EXPECT_LE(e.max_abs, p == Precision::kFp16 ? 1e-2 : 4e-2);
        EXPECT_GE(e.cosine, 0.999);
      }
    }
  }
}

// ONNX Attention itself (opset 23), 4-D with grouped heads: every mask shape that broadcasts,
// causal, and a float32 build (the reference kernel), each against the CPU reference.
TEST(CudaAttention, AttentionOpMasksCausalAndGroupedHeadsMatchTheCpu) {
  if (Status why = device_available(Device::kCUDA); !why.ok()) GTEST_SKIP() << why.message();
  struct Case {
    const char* mask_type;  // "" for none
    int causal;
  };
  for (Case c : {Case{"", 0}, Case{"", 1}, Case{"float32[s, s]", 0}, Case{"float32[n, 1, s, s]", 1},
                 Case{"float32[1, 4, 1, s]", 0}}) {
    std::string text = std::string(
                           "graph g(%q: float32[n, 4, s, 64], %k: float32[n, 2, s, 64], %v: "
                           "float32[n, 2, s, 64]") +
                       (*c.mask_type ? std::string(", %m: ") + c.mask_type : "") +
                       ") -> (%y: float32[n, 4, s, 64]) {\n  opset ai.onnx 23\n  %y: float32[n, 4, "
                       "s, 64] = Attention(%q, %k, %v" +
                       (*c.mask_type ? ", %m" : "") + ") {is_causal=" + std::to_string(c.causal) +
                       "}  # attn\n}\n";
    const Network net = network_of(text);
    auto build = [&](Device d, Precision p) {
      BuilderConfig cfg = config_for(p);
      OptimizationProfile prof;
      EXPECT_TRUE(prof.set_dimensions("q", {1, 4, 1, 64}, {2, 4, 64, 64}, {2, 4, 96, 64}).ok());
      for (const char* name : {"k", "v"}) {
        EXPECT_TRUE(prof.set_dimensions(name, {1, 2, 1, 64}, {2, 2, 64, 64}, {2, 2, 96, 64}).ok());
      }
      const std::string mt = c.mask_type;
      if (mt == "float32[s, s]")
        EXPECT_TRUE(prof.set_dimensions("m", {1, 1}, {64, 64}, {96, 96}).ok());
      if (mt == "float32[n, 1, s, s]") {
        EXPECT_TRUE(prof.set_dimensions("m", {1, 1, 1, 1}, {2, 1, 64, 64}, {2, 1, 96, 96}).ok());
      }
      if (mt == "float32[1, 4, 1, s]")
        EXPECT_TRUE(prof.set_dimensions("m", {1, 4, 1, 1}, {1, 4, 1, 64}, {1, 4, 1, 96}).ok());
      cfg.add_profile(prof);
      return Builder(d).build(net, cfg);
    };
    auto cpu = build(Device::kCPU, Precision::kFp32);
    ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
    auto cpu_ctx = cpu->create_execution_context();
    for (Precision p : {Precision::kFp16, Precision::kFp32}) {
      auto engine = build(Device::kCUDA, p);
      ASSERT_TRUE(engine.ok()) << engine.status().to_string();
      for (const LayerInfo& l : engine->layers()) {
        if (l.op_type == "Attention") {
          EXPECT_EQ(l.kernel,
                    p == Precision::kFp16 ? "cuda.cudnn_sdpa.Attention" : "cuda.Attention")
              << text;
        }
      }
      auto ctx = engine->create_execution_context();
      ASSERT_TRUE(ctx.ok());
      for (auto [n, s] : {std::pair<int64_t, int64_t>{1, 1}, {2, 37}, {2, 96}}) {
        std::map<std::string, Tensor> in = {{"q", random_f32({n, 4, s, 64}, 800 + uint64_t(s))},
                                            {"k", random_f32({n, 2, s, 64}, 900 + uint64_t(s))},
                                            {"v", random_f32({n, 2, s, 64}, 1000 + uint64_t(s))}};
        if (std::string(c.mask_type) == "float32[s, s]") in["m"] = random_f32({s, s}, 1100);
        if (std::string(c.mask_type) == "float32[n, 1, s, s]")
          in["m"] = random_f32({n, 1, s, s}, 1200);
        if (std::string(c.mask_type) == "float32[1, 4, 1, s]")
          in["m"] = random_f32({1, 4, 1, s}, 1300);
        auto want = (*cpu_ctx)->run(in);
        auto got = (*ctx)->run(in);
        ASSERT_TRUE(want.ok() && got.ok()) << got.status().to_string();
        ErrorStats e = error_stats(got->at("y"), want->at("y"));
        std::printf(
            "[cuda] Attention mask=%s causal=%d %s n=%lld s=%lld: max abs %.3g, cosine %.7f\n",
            *c.mask_type ? c.mask_type : "none", c.causal, precision_name(p), (long long)n,
            (long long)s, e.max_abs, e.cosine);
        EXPECT_LE(e.max_abs, p == Precision::kFp16 ? 1e-2 : 1e-4) << text;
      }
    }
  }
}

// An Attention case of the tensor-core kernels' tests: heads, head sizes, the mask, is_causal, and
// the (s, l) pairs run.
struct TensorCoreAttentionCase {
  int64_t hq, hk, d, dv;
  const char* mask;  // "" none, "h": [1, hq, s, l], "q": [s, l]
  int causal;
  std::vector<std::pair<int64_t, int64_t>> sl;
};

// Which of attention_short.cu's kernels a test expects to run each case, and their launches so far
// in this process (backends/cuda/attention_launches.h; 0 in a build without CUDA, whose tests
// skip before asking).
enum class TensorCoreKernel { kAny, kShortKeys, kTiled };
uint64_t tensor_core_launches(TensorCoreKernel k) {
#ifdef KILN_HAVE_CUDA
  const backends::cuda::AttentionLaunches l = backends::cuda::attention_launches();
  return k == TensorCoreKernel::kShortKeys ? l.short_keys
         : k == TensorCoreKernel::kTiled   ? l.tiled
                                           : 0;
#else
  (void)k;
  return 0;
#endif
}

// Builds each case for a profile up to [2, heads, max_s, .] queries and max_l keys and runs its
// (s, l) pairs in FP16 and BF16 against the CPU reference (FP32). With `kernel`, each run must
// launch that kernel of attention_short.cu (the count attention_launches keeps grows).
void check_tensor_core_attention(const std::vector<TensorCoreAttentionCase>& cases, int64_t max_s,
                                 int64_t max_l, const char* label,
                                 TensorCoreKernel kernel = TensorCoreKernel::kAny) {
  for (const TensorCoreAttentionCase& c : cases) {
    const std::string dt = "float32";
    const std::string mt = std::string(c.mask) == "h"
                               ? dt + "[1, " + std::to_string(c.hq) + ", s, l]"
                           : std::string(c.mask) == "q" ? dt + "[s, l]"
                                                        : "";
    auto dims = [](int64_t a, const char* s2, int64_t b) {
      return "[n, " + std::to_string(a) + ", " + s2 + ", " + std::to_string(b) + "]";
    };
    std::string text =
        "graph g(%q: " + dt + dims(c.hq, "s", c.d) + ", %k: " + dt + dims(c.hk, "l", c.d) +
        ", %v: " + dt + dims(c.hk, "l", c.dv) + (mt.empty() ? "" : ", %m: " + mt) +
        ") -> (%y: " + dt + dims(c.hq, "s", c.dv) + ") {\n  opset ai.onnx 23\n  %y: " + dt +
        dims(c.hq, "s", c.dv) + " = Attention(%q, %k, %v" + (mt.empty() ? "" : ", %m") +
        ") {is_causal=" + std::to_string(c.causal) + "}  # attn\n}\n";
    const Network net = network_of(text);
    auto build = [&](Device d, Precision p) {
      BuilderConfig cfg = config_for(p);
      OptimizationProfile prof;
      EXPECT_TRUE(
          prof.set_dimensions("q", {1, c.hq, 1, c.d}, {2, c.hq, 49, c.d}, {2, c.hq, max_s, c.d})
              .ok());
      EXPECT_TRUE(
          prof.set_dimensions("k", {1, c.hk, 1, c.d}, {2, c.hk, 49, c.d}, {2, c.hk, max_l, c.d})
              .ok());
      EXPECT_TRUE(
          prof.set_dimensions("v", {1, c.hk, 1, c.dv}, {2, c.hk, 49, c.dv}, {2, c.hk, max_l, c.dv})
              .ok());
      if (std::string(c.mask) == "h") {
        EXPECT_TRUE(
            prof.set_dimensions("m", {1, c.hq, 1, 1}, {1, c.hq, 49, 49}, {1, c.hq, max_s, max_l})
                .ok());
      }
      if (std::string(c.mask) == "q")
        EXPECT_TRUE(prof.set_dimensions("m", {1, 1}, {49, 49}, {max_s, max_l}).ok());
      cfg.add_profile(prof);
      return Builder(d).build(net, cfg);
    };
    auto cpu = build(Device::kCPU, Precision::kFp32);
    ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
    auto cpu_ctx = cpu->create_execution_context();
    ASSERT_TRUE(cpu_ctx.ok());
    for (Precision p : {Precision::kFp16, Precision::kBf16}) {
      auto engine = build(Device::kCUDA, p);
      ASSERT_TRUE(engine.ok()) << engine.status().to_string();
      auto ctx = engine->create_execution_context();
      ASSERT_TRUE(ctx.ok());
      for (auto [s, l] : c.sl) {
        const int64_t n = 2;
        std::map<std::string, Tensor> in = {
            {"q", random_f32({n, c.hq, s, c.d}, 2000 + uint64_t(s))},
            {"k", random_f32({n, c.hk, l, c.d}, 2100 + uint64_t(l))},
            {"v", random_f32({n, c.hk, l, c.dv}, 2200 + uint64_t(l))}};
        if (std::string(c.mask) == "h") in["m"] = random_f32({1, c.hq, s, l}, 2300);
        if (std::string(c.mask) == "q") in["m"] = random_f32({s, l}, 2400);
        auto want = (*cpu_ctx)->run(in);
        const uint64_t before = tensor_core_launches(kernel);
        auto got = (*ctx)->run(in);
        ASSERT_TRUE(want.ok() && got.ok()) << got.status().to_string();
        if (kernel != TensorCoreKernel::kAny) {
          EXPECT_GT(tensor_core_launches(kernel), before)
              << label << ": the kernel did not run s=" << s << " l=" << l << "\n"
              << text;
        }
        ASSERT_EQ(got->at("y").shape(), want->at("y").shape());
        ErrorStats e = error_stats(got->at("y"), want->at("y"));
        std::printf(
            "[cuda] %s Attention hq=%lld hk=%lld d=%lld dv=%lld mask=%s causal=%d %s s=%lld "
            "l=%lld: "
            "max abs %.3g, cosine %.7f, nan %lld\n",
            label, (long long)c.hq, (long long)c.hk, (long long)c.d, (long long)c.dv,
            *c.mask ? c.mask : "none", c.causal, precision_name(p), (long long)s, (long long)l,
            e.max_abs, e.cosine, (long long)count_nan(got->at("y")));
        EXPECT_EQ(count_nan(got->at("y")), 0);
        EXPECT_LE(e.max_abs, p == Precision::kFp16 ? 1e-2 : 4e-2)
            << text << " s=" << s << " l=" << l;
        EXPECT_GE(e.cosine, 0.999) << text << " s=" << s << " l=" << l;
      }
    }
  }
}

// Keys that fit one tile run attention_short.cu's tensor-core kernel (Swin's windows: 49 tokens,
// head size 32, a [1, heads, 49, 49] bias): head sizes 8 to 64 and Q's differing from V's, grouped
// heads, a mask per head or per query, is_causal, more queries than one block takes (s 100 over 49
// keys), and 64 keys against 65 (the next kernel), in FP16 and BF16 against the CPU reference.
TEST(CudaAttention, ShortKeysOnTensorCoresMatchTheCpu) {
  if (Status why = device_available(Device::kCUDA); !why.ok()) GTEST_SKIP() << why.message();
  check_tensor_core_attention(
      {{3, 3, 32, 32, "h", 0, {{49, 49}, {1, 1}, {7, 7}, {64, 64}, {65, 65}}},
       {4, 2, 8, 16, "", 1, {{49, 49}, {100, 49}, {16, 16}}},
       {2, 1, 64, 40, "q", 0, {{49, 49}, {100, 33}, {3, 64}}},
       {2, 2, 24, 64, "h", 1, {{49, 49}, {64, 64}}}},
      100, 65, "short");
}

// attention_short.cu's tiled kernel (forced with KILN_CUDA_ATTENTION=tiled; unforced it runs where
// it times faster than cuDNN): a decoder's 256 causal keys, ViT's 197 with a mask per head,
// causal rows past the keys, more keys than queries and one query over 129, grouped heads,
// head sizes 16 to 64 and Q's differing from V's, a mask per query, sizes one past a tile, in FP16
// and BF16 against the CPU reference.
TEST(CudaAttention, LongKeysOnTheTiledKernelMatchTheCpu) {
  if (Status why = device_available(Device::kCUDA); !why.ok()) GTEST_SKIP() << why.message();
  ::setenv("KILN_CUDA_ATTENTION", "tiled", 1);
  check_tensor_core_attention(
      {{4, 4, 64, 64, "", 1, {{256, 256}, {1, 129}, {300, 100}, {65, 65}, {100, 300}}},
       {3, 3, 64, 64, "h", 0, {{197, 197}, {100, 300}, {129, 129}, {64, 65}}},
       {4, 2, 32, 32, "", 0, {{256, 256}, {17, 300}}},
       {2, 1, 40, 24, "q", 1, {{130, 130}, {256, 77}}},
       {2, 2, 16, 48, "h", 1, {{200, 200}, {3, 70}}}},
      300, 300, "tiled", TensorCoreKernel::kTiled);
  ::unsetenv("KILN_CUDA_ATTENTION");
}

// Longer keys run cuDNN's flash attention: a decoder's sequence (256, causal), ViT's 197, more
// keys than queries and more queries than keys (causal rows past the keys see every key), one
// query, key counts one past a tile, head sizes 128, 64 and 40 over 24, grouped heads and both
// masks, in FP16 and BF16 against the CPU reference.
TEST(CudaAttention, LongKeysOnTensorCoresMatchTheCpu) {
  if (Status why = device_available(Device::kCUDA); !why.ok()) GTEST_SKIP() << why.message();
  check_tensor_core_attention({{4, 4, 64, 64, "", 1, {{256, 256}, {1, 129}, {300, 100}, {65, 65}}},
                               {3, 3, 64, 64, "h", 0, {{197, 197}, {100, 300}, {129, 129}}},
                               {4, 2, 128, 128, "", 0, {{256, 256}, {17, 300}}},
                               {2, 1, 40, 24, "q", 1, {{130, 130}, {256, 77}}}},
                              300, 300, "long");
}

// enqueue_on_default_stream (TensorRT's enqueueV3(0); torch's default stream is stream 0): the run
// starts after the work queued on stream 0 before it and the work queued there after it waits for
// the run, though it executes on the context's own (non-blocking) stream. On stream 0, ~1 GB of
// copies delay the copy that writes the input; a run that did not wait for it would read the stale
// input (zeros), and a read-back that did not wait for the run would find the output unwritten.
// Three times per mode, with new input values: with CUDA graphs the first run captures (on the
// context's stream, fenced) and the later ones replay the graph on stream 0 itself, unfenced.
TEST(CudaStreams, DefaultStreamRunIsOrderedBothWays) {
  if (Status why = device_available(Device::kCUDA); !why.ok()) GTEST_SKIP() << why.message();
  const Network net = network_of(R"(graph g(%x: float32[n]) -> (%y: float32[n]) {
  opset ai.onnx 17
  %two: float32[] = dense<2.0>
  %one: float32[] = dense<1.0>
  %t: float32[n] = Mul(%x, %two)
  %y: float32[n] = Add(%t, %one)
}
)");
  const int64_t n = int64_t(1) << 22;
  BuilderConfig config;
  OptimizationProfile prof;
  ASSERT_TRUE(prof.set_dimensions("x", {1}, {n}, {n}).ok());
  config.add_profile(prof);
  auto engine = Builder(Device::kCUDA).build(net, config);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const backends::Backend* b = *backends::get_backend(Device::kCUDA);
  const size_t bytes = size_t(n) * sizeof(float), scratch_bytes = size_t(256) << 20;
  std::vector<void*> mem;
  for (size_t sz : {bytes, bytes, bytes, bytes, scratch_bytes, scratch_bytes}) {
    auto p = b->allocate(sz);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    mem.push_back(*p);
  }
  void *src = mem[0], *in = mem[1], *out = mem[2], *back = mem[3], *s0 = mem[4], *s1 = mem[5];
  for (bool graphs : {false, true}) {
    auto ctx = engine->create_execution_context();
    ASSERT_TRUE(ctx.ok());
    (*ctx)->set_use_cuda_graph(graphs);
    ASSERT_TRUE((*ctx)->set_input_shape("x", {n}).ok());
    ASSERT_TRUE((*ctx)->set_tensor_address("x", in).ok());
    ASSERT_TRUE((*ctx)->set_tensor_address("y", out).ok());
    for (int round = 0; round < 3; ++round) {
      std::vector<float> x(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) x[size_t(i)] = float(i % 1000) * 0.5f + float(round + 1);
      ASSERT_TRUE(b->copy(src, x.data(), bytes, backends::CopyKind::kHostToDevice, nullptr).ok());
      ASSERT_TRUE(b->fill_zero(in, bytes, nullptr).ok());
      ASSERT_TRUE(b->fill_zero(out, bytes, nullptr).ok());
      ASSERT_TRUE(b->synchronize(nullptr).ok());
      for (int k = 0; k < 4; ++k) {  // stream 0 busy before the input is written
        ASSERT_TRUE(
            b->copy(s1, s0, scratch_bytes, backends::CopyKind::kDeviceToDevice, nullptr).ok());
        ASSERT_TRUE(
            b->copy(s0, s1, scratch_bytes, backends::CopyKind::kDeviceToDevice, nullptr).ok());
      }
      ASSERT_TRUE(b->copy(in, src, bytes, backends::CopyKind::kDeviceToDevice, nullptr).ok());
      Status run = (*ctx)->enqueue_on_default_stream();
      ASSERT_TRUE(run.ok()) << run.to_string();
      ASSERT_TRUE(b->copy(back, out, bytes, backends::CopyKind::kDeviceToDevice, nullptr).ok());
      ASSERT_TRUE(b->synchronize(nullptr).ok());  // stream 0 only: the read-back's own wait
      std::vector<float> y(static_cast<size_t>(n));
      ASSERT_TRUE(b->copy(y.data(), back, bytes, backends::CopyKind::kDeviceToHost, nullptr).ok());
      ASSERT_TRUE(b->synchronize(nullptr).ok());
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) wrong += y[size_t(i)] != x[size_t(i)] * 2.0f + 1.0f;
      EXPECT_EQ(wrong, 0) << "graphs " << graphs << ", round " << round << ": y[0] = " << y[0]
                          << ", want " << x[0] * 2.0f + 1.0f;
    }
    if (graphs) EXPECT_EQ((*ctx)->cuda_graph_stats().replays, 2);
  }
  for (void* p : mem) b->deallocate(p);
}

TEST(CudaErrors, DeviceOutOfMemoryNamesTheAmount) {
  REQUIRE_CUDA();
  const backends::Backend* b = *backends::get_backend(Device::kCUDA);
  const size_t huge = size_t(1) << 50;  // 1 PiB
  auto p = b->allocate(huge);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kOutOfMemory) << p.status().to_string();
  EXPECT_NE(p.status().message().find(std::to_string(huge)), std::string::npos)
      << p.status().message();
  // The device still works afterwards.
  auto small = b->allocate(1024);
  ASSERT_TRUE(small.ok()) << small.status().to_string();
  b->deallocate(*small);
}

// x: float32[n, 1] -> y[n] = ReduceSum(x * x^T, axis 1). The [n, n] product lives only in the
// activation arena, so n = 200000 asks for 160 GB of device memory from an 800 KB input.
Network outer_product_network() {
  Network net;
  ir::Graph& g = net.graph;
  g.opsets[""] = 17;
  auto value = [&g](const std::string& name) { return g.add_value(name); };
  int x = value("x"), xt = value("xt"), prod = value("prod"), axes = value("axes"), y = value("y");
  g.values[x].dtype = DType::kFloat32;
  g.values[x].shape = std::vector<ir::Dim>{ir::Dim::symbol("n"), ir::Dim(1)};
  g.values[axes].constant = make_i64({1}, {1});
  g.values[axes].dtype = DType::kInt64;
  g.values[axes].shape = std::vector<ir::Dim>{ir::Dim(1)};
  auto node = [&g](std::string name, std::string op, std::vector<int> in, int out) {
    ir::Node n;
    n.name = std::move(name);
    n.op_type = std::move(op);
    n.opset = 17;
    n.inputs = std::move(in);
    n.outputs = {out};
    g.nodes.push_back(std::move(n));
  };
  node("transpose", "Transpose", {x}, xt);
  node("outer", "MatMul", {x, xt}, prod);
  node("row_sums", "ReduceSum", {prod, axes}, y);
  ir::Attribute keep;
  keep.type = ir::AttrType::kInt;
  keep.i = 0;
  g.nodes.back().attrs.set("keepdims", keep);
  g.inputs = {x};
  g.outputs = {y};
  return net;
}

TEST(CudaErrors, RunNeedingMoreMemoryThanTheCardHasIsOutOfMemory) {
  REQUIRE_CUDA();
  BuilderConfig config;
  OptimizationProfile p;
  ASSERT_TRUE(p.set_dimensions("x", {1, 1}, {4, 1}, {1 << 20, 1}).ok());
  config.add_profile(p);
  auto engine = Builder(Device::kCUDA).build(outer_product_network(), config);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  const int64_t n = 200000;  // the [n, n] float product: 160 GB, more than any card kiln runs on
  auto huge = (*ctx)->run({{"x", random_f32({n, 1}, 3)}});
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kOutOfMemory) << huge.status().to_string();
  EXPECT_NE(huge.status().message().find("activation memory"), std::string::npos)
      << huge.status().message();
  // The same context still runs a shape that fits, and computes x_i * sum(x).
  auto small = (*ctx)->run({{"x", make_f32({3, 1}, {1, 2, -4})}});
  ASSERT_TRUE(small.ok()) << small.status().to_string();
  ASSERT_EQ(small->at("y").shape(), (Shape{3}));
  const float* y = small->at("y").data_as<float>();
  EXPECT_FLOAT_EQ(y[0], -1.0f);
  EXPECT_FLOAT_EQ(y[1], -2.0f);
  EXPECT_FLOAT_EQ(y[2], 4.0f);
}

TEST(CudaErrors, BadInputsGetTheCpuErrors) {
  REQUIRE_CUDA();
  auto cpu = build_model(models_dir() + "/testmod_linear/model.onnx",
                         shared_model_profile("testmod_linear"));
  auto gpu = build_model(models_dir() + "/testmod_linear/model.onnx",
                         shared_model_profile("testmod_linear"), Device::kCUDA);
  ASSERT_TRUE(cpu.ok() && gpu.ok());
  auto c = cpu->create_execution_context();
  auto g = gpu->create_execution_context();
  ASSERT_TRUE(c.ok() && g.ok());
  for (const Shape& s : {Shape{11, 4, 16}, Shape{4, 16}, Shape{4, 4, 15}}) {
    Status a = (*c)->set_input_shape("x", s), b = (*g)->set_input_shape("x", s);
    EXPECT_FALSE(b.ok());
    EXPECT_EQ(a.message(), b.message());
  }
  auto wrong = (*g)->run({{"x", make_i64({1, 1, 16}, std::vector<int64_t>(16, 1))}});
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("int64"), std::string::npos);
}

}  // namespace
}  // namespace kiln::testing
