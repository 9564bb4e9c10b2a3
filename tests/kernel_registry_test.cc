// The kernel registry and what the plan records: unique implementation ids with the CPU reference
// last, views planned as aliases that run nothing (on every backend), nodes no implementation can
// place listed with every implementation's reason, an engine naming an unknown implementation
// refused, and weights prepared once per process however many engines and contexts use them.
#include "backends/kernel_registry.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "builder/builder.h"
#include "kiln.h"
#include "model_util.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

TEST(KernelRegistry, IdsAreUniqueAndTheCpuReferenceIsLast) {
  const backends::KernelRegistry& r = backends::kernel_registry();
  std::set<std::string> ids;
  size_t total = 0;
  for (size_t op = 0; op < r.all().size(); ++op) {
    for (const auto& impl : r.all()[op]) {
      ++total;
      EXPECT_TRUE(ids.insert(impl->id()).second) << "duplicate implementation id " << impl->id();
      EXPECT_EQ(r.find(impl->id()), impl.get());
    }
    auto cpu = r.candidates(ops::OpKind(op), Device::kCPU);
    if (!cpu.empty()) {
      EXPECT_EQ(r.reference(ops::OpKind(op)), cpu.back());
      EXPECT_EQ(cpu.back()->id(), "cpu." + std::string(ops::op_name(ops::OpKind(op))));
    }
  }
  EXPECT_GT(total, 100u);
  EXPECT_NE(r.find("cpu.MatMul"), nullptr);
  EXPECT_EQ(r.find("cpu.NoSuchOp"), nullptr);
}

// x[n, 6] -> Reshape[-1, 3, 2] -> Relu -> Flatten -> y[n, 6] (+ the Reshape's output as an IO
// tensor `r` when `expose`).
Network view_network(bool expose) {
  Network net;
  ir::Graph& g = net.graph;
  g.opsets[""] = 18;
  auto value = [&](const char* name) { return g.add_value(name); };
  int x = value("x"), shape = value("shape"), r = value("r"), a = value("a"), y = value("y");
  g.values[x].dtype = DType::kFloat32;
  g.values[x].shape = std::vector<ir::Dim>{ir::Dim::symbol("n"), ir::Dim(6)};
  g.values[shape].constant = make_i64({3}, {-1, 3, 2});
  g.values[shape].dtype = DType::kInt64;
  g.values[shape].shape = std::vector<ir::Dim>{ir::Dim(3)};
  auto node = [&](const char* name, const char* op, std::vector<int> in, std::vector<int> out) {
    ir::Node n;
    n.name = name, n.op_type = op, n.opset = 18, n.inputs = std::move(in),
    n.outputs = std::move(out);
    g.nodes.push_back(std::move(n));
  };
  node("reshape", "Reshape", {x, shape}, {r});
  node("relu", "Relu", {r}, {a});
  node("flatten", "Flatten", {a}, {y});
  g.inputs = {x};
  g.outputs = {y};
  if (expose) g.outputs.push_back(r);
  return net;
}

BuilderConfig n_profile() {
  BuilderConfig config;
  OptimizationProfile p;
  EXPECT_TRUE(p.set_dimensions("x", {1, 6}, {2, 6}, {4, 6}).ok());
  config.add_profile(p);
  return config;
}

TEST(Views, ReshapeAndFlattenAreAliasesThatRunNothing) {
  auto engine = Builder().build(view_network(false), n_profile());
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto layers = engine->layers();
  ASSERT_EQ(layers.size(), 3u);
  EXPECT_EQ(layers[0].kernel, "alias");
  EXPECT_EQ(layers[0].alias_of, "x");
  EXPECT_EQ(layers[1].kernel, "cpu.Relu");
  // Flatten's output is the engine output: the caller's buffer must receive it, so it copies.
  EXPECT_EQ(layers[2].kernel, "cpu.Flatten");
  const plan::Plan& p = engine->plan();
  int r = -1;
  for (size_t v = 0; v < p.graph.values.size(); ++v) {
    if (p.graph.values[v].name == "r") r = int(v);
  }
  ASSERT_GE(r, 0);
  EXPECT_EQ(p.values[r].storage, plan::Storage::kAlias);
  EXPECT_EQ(p.graph.values[p.values[r].alias_of].name, "x");

  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  Tensor x = make_f32({2, 6}, {-1, 2, -3, 4, -5, 6, 7, -8, 9, -10, 11, -12});
  auto out = (*ctx)->run({{"x", x}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const Tensor& y = out->at("y");
  ASSERT_EQ(y.shape(), (Shape{2, 6}));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(y.float_at(i), std::max(0.0, x.float_at(i))) << i;
}

// A profiler set on a context hears every layer that runs, once per run, in execution order, and
// never an alias (a view runs nothing); unset, it hears nothing more.
TEST(Profiler, ReportsEveryLayerThatRunsOncePerRunInOrder) {
  auto engine = Builder().build(view_network(false), n_profile());
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  struct Recorder final : Profiler {
    std::vector<std::pair<std::string, double>> reports;
    void report_layer_time(const std::string& layer, double ms) override {
      reports.emplace_back(layer, ms);
    }
  } recorder;
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  (*ctx)->set_profiler(&recorder);
  Tensor x = make_f32({2, 6}, {-1, 2, -3, 4, -5, 6, 7, -8, 9, -10, 11, -12});
  for (int run = 0; run < 3; ++run) {
    auto out = (*ctx)->run({{"x", x}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(out->at("y").float_at(1), 2.0);  // profiling changes no result
  }
  std::vector<std::string> running;
  for (const LayerInfo& l : engine->layers()) {
    if (l.kernel != "alias") running.push_back(l.name);
  }
  ASSERT_EQ(running.size(), 2u);  // Relu and the copying Flatten; the Reshape is an alias
  ASSERT_EQ(recorder.reports.size(), 3 * running.size());
  for (size_t k = 0; k < recorder.reports.size(); ++k) {
    EXPECT_EQ(recorder.reports[k].first, running[k % running.size()]) << k;
    EXPECT_GE(recorder.reports[k].second, 0.0) << k;
  }
  (*ctx)->set_profiler(nullptr);
  ASSERT_TRUE((*ctx)->run({{"x", x}}).ok());
  EXPECT_EQ(recorder.reports.size(), 3 * running.size());
}

TEST(Views, AViewWhoseOutputIsAnEngineOutputCopies) {
  auto engine = Builder().build(view_network(true), n_profile());
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ(engine->layers()[0].kernel, "cpu.Reshape");
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  auto out = (*ctx)->run({{"x", make_f32({1, 6}, {1, 2, 3, 4, 5, 6})}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->at("r").shape(), (Shape{1, 3, 2}));
  EXPECT_EQ(out->at("r").float_at(5), 6.0);
}

TEST(Views, VitTinyReshapesAreAliasesOnEveryBackend) {
  if (models_dir().empty()) GTEST_SKIP() << "../shared/models is absent (set KILN_MODELS_DIR)";
  for (Device device : {Device::kCPU, Device::kCUDA}) {
    if (Status why = device_available(device); !why.ok()) {
      std::printf("[ skipped  ] %s: %s\n", std::string(device_name(device)).c_str(),
                  why.message().c_str());
      continue;
    }
    auto engine = build_model(models_dir() + "/vit_tiny/model.onnx",
                              shared_model_profile("vit_tiny"), device);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    int reshapes = 0, aliased = 0;
    for (const auto& l : engine->layers()) {
      if (l.op_type != "Reshape") continue;
      ++reshapes;
      aliased += l.kernel == "alias";
    }
    // 45 in the model, of which canonicalize takes 8: the dynamo exporter's swap of K's last two
    // axes through a [-1, S, D] flatten is one Transpose (its two Reshapes go, 4 blocks).
    // patchify_conv (on both devices) writes the stride=kernel patch embedding as Reshape,
    // Transpose and a GEMM: one Reshape more, 38. On the CPU (float32) fuse_attention and
    // pack_attention also run: each block's attention reads its packed projection in place, and
    // the 36 Reshapes of the heads' views go with it; the patch embedding's Reshape and one other
    // stay. A float32 CUDA build keeps the batched GEMMs, so its views stay.
    EXPECT_EQ(reshapes, device == Device::kCPU ? 2 : 38) << device_name(device);
    EXPECT_EQ(aliased, reshapes) << device_name(device) << ": every Reshape should be an alias";
  }
}

TEST(Plan, AnEngineNamingAnUnknownImplementationIsRefused) {
  auto engine = Builder().build(view_network(false), n_profile());
  ASSERT_TRUE(engine.ok());
  plan::Plan p = engine->plan();
  p.nodes[1].impl = "cpu.Relu.from_the_future";
  auto loaded = Engine::from_plan(std::move(p));
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("cpu.Relu.from_the_future"), std::string::npos)
      << loaded.status().message();
  EXPECT_NE(loaded.status().message().find("rebuild"), std::string::npos)
      << loaded.status().message();
}

TEST(Plan, AKernelOfAnotherOpIsRefused) {
  auto engine = Builder().build(view_network(false), n_profile());
  ASSERT_TRUE(engine.ok());
  plan::Plan p = engine->plan();
  p.nodes[1].impl = "cpu.Conv";  // the Relu node
  auto loaded = Engine::from_plan(std::move(p));
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("does not implement Relu"), std::string::npos)
      << loaded.status().message();
}

TEST(Plan, EditedAliasesAreRefused) {
  auto engine = Builder().build(view_network(false), n_profile());
  ASSERT_TRUE(engine.ok());
  auto index_of = [&](const plan::Plan& p, const char* name) {
    for (size_t v = 0; v < p.graph.values.size(); ++v) {
      if (p.graph.values[v].name == name) return int(v);
    }
    return -1;
  };
  // The view's output made to alias another value than its input's bytes.
  plan::Plan p = engine->plan();
  p.values[index_of(p, "r")].alias_of = index_of(p, "a");
  auto loaded = Engine::from_plan(std::move(p));
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("not its input's bytes"), std::string::npos)
      << loaded.status().message();
  // A kernel's output stored as an alias: the kernel would write into another value's bytes.
  p = engine->plan();
  int a = index_of(p, "a");
  p.values[a].storage = plan::Storage::kAlias;
  p.values[a].alias_of = index_of(p, "x");
  loaded = Engine::from_plan(std::move(p));
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("no view produces it"), std::string::npos)
      << loaded.status().message();
}

TEST(Placement, EveryUnplaceableNodeIsListedWithEveryImplementationsReason) {
  const backends::KernelRegistry& r = backends::kernel_registry();
  if (!r.has(ops::OpKind::kMatMul, Device::kCUDA)) {
    GTEST_SKIP() << "this build has no CUDA implementations (built without nvcc)";
  }
  // Two nodes the CUDA implementations refuse: an int32 MatMul (cuBLASLt runs float tensors only)
  // and a float64 MaxPool (the CUDA pools take float32, float16 and bfloat16).
  ir::Graph g;
  g.opsets[""] = 23;
  int a = g.add_value("a"), b = g.add_value("b"), c = g.add_value("c");
  int x = g.add_value("x"), y = g.add_value("y");
  for (int v : {a, b}) {
    g.values[v].dtype = DType::kInt32;
    g.values[v].shape = std::vector<ir::Dim>{ir::Dim(4), ir::Dim(4)};
  }
  g.values[x].dtype = DType::kFloat64;
  g.values[x].shape = std::vector<ir::Dim>{ir::Dim(1), ir::Dim(1), ir::Dim(4), ir::Dim(4)};
  ir::Node mm;
  mm.name = "mm32", mm.op_type = "MatMul", mm.opset = 19, mm.inputs = {a, b}, mm.outputs = {c};
  ir::Node pool;
  pool.name = "pool64", pool.op_type = "MaxPool", pool.opset = 22, pool.inputs = {x},
  pool.outputs = {y};
  ir::Attribute k;
  k.type = ir::AttrType::kInts;
  k.ints = {2, 2};
  pool.attrs.set("kernel_shape", k);
  g.nodes = {mm, pool};
  g.inputs = {a, b, x};
  g.outputs = {c, y};
  testing::DeviceStub cuda(Device::kCUDA);
  auto plan = builder::build_plan(g, 0, BuilderConfig(), cuda);
  ASSERT_FALSE(plan.ok());
  const std::string& m = plan.status().message();
  for (const char* part : {"2 node(s)", "mm32", "cuda.cublaslt.MatMul", "int32", "pool64",
                           "cuda.MaxPool", "float64"}) {
    EXPECT_NE(m.find(part), std::string::npos) << "'" << part << "' missing in: " << m;
  }
}

// The cuDNN convolution's tactic grammar: "algo=A [epilogue=separate] [small=B below=N]" (B for
// batches under N, timed at the profile's min shapes). Anything else is refused naming the tactic,
// so an edited plan cannot run an algorithm nobody chose. Asked through supports(), which builds
// the kernel object without a GPU.
TEST(KernelRegistry, CudaConvolutionTacticsParseOrAreRefused) {
  const backends::KernelRegistry& registry = backends::kernel_registry();
  if (!registry.has(ops::OpKind::kConv, Device::kCUDA)) {
    GTEST_SKIP() << "this build has no CUDA implementations (built without nvcc)";
  }
  auto value = [](const char* name, std::vector<ir::Dim> shape) {
    ir::Value v;
    v.name = name;
    v.dtype = DType::kFloat32;
    v.shape = std::move(shape);
    return v;
  };
  ir::Value x = value("x", {1, 4, 8, 8}), w = value("w", {4, 4, 3, 3}),
            y = value("y", {1, 4, 6, 6});
  ir::Node conv;
  conv.name = "conv";
  conv.op_type = "Conv";
  conv.opset = 17;
  const backends::KernelImpl* impl = registry.candidates(ops::OpKind::kConv, Device::kCUDA).front();
  auto check = [&](const std::string& tactic) {
    backends::KernelQuery q{conv, {&x, &w}, {&y}, PrecisionPolicy{}};
    q.tactic = tactic;
    return impl->supports(q);
  };
  for (const char* ok :
       {"", "algo=implicit_precomp_gemm", "algo=gemm small=implicit_gemm below=8",
        "algo=gemm epilogue=separate", "algo=gemm epilogue=separate small=fft below=4"}) {
    EXPECT_TRUE(check(ok).ok()) << ok << ": " << check(ok).to_string();
  }
  for (const char* bad :
       {"algo=warp_drive", "algo=gemm small=fft", "algo=gemm below=8", "small=fft below=2",
        "algo=gemm small=fft below=x", "algo=gemm algo=fft", "algo=gemm  small=fft below=8",
        "algo=gemm epilogue=fused", "epilogue=separate algo=gemm",
        "algo=gemm small=fft below=4 epilogue=separate"}) {
    Status st = check(bad);
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find(bad), std::string::npos) << st.message();
  }
}

TEST(PreparedWeights, Fp16WeightsAreConvertedAtBuildAndNeverPreparedAgain) {
  if (models_dir().empty()) GTEST_SKIP() << "../shared/models is absent (set KILN_MODELS_DIR)";
  if (Status why = device_available(Device::kCUDA); !why.ok()) {
    GTEST_SKIP() << "CUDA is not available: " << why.message();
  }
  BuilderConfig fp16;
  fp16.set_flag(BuilderFlag::kFP16);
  auto built = build_model(models_dir() + "/vit_tiny/model.onnx", shared_model_profile("vit_tiny"),
                           Device::kCUDA, fp16);
  ASSERT_TRUE(built.ok()) << built.status().to_string();
  std::string path = (std::filesystem::temp_directory_path() / "kiln_prepared_once.kiln").string();
  ASSERT_TRUE(built->save(path).ok());
  // The precision pass converted the GEMMs' weights (the patch embedding's among them, a GEMM
  // since patchify_conv) to float16 at build time: the engine stores them so, and no float32 weight
  // feeds a node computing in FP16.
  std::set<std::string> weights, float32_weights;
  const plan::Plan& p = built->plan();
  for (size_t n = 0; n < p.graph.nodes.size(); ++n) {
    const std::string& op = p.graph.nodes[n].op_type;
    if (op != "MatMul" && op != "Gemm" && op != "MatMulBias" && op != "Conv" && op != "FusedConv")
      continue;
    for (int v : p.graph.nodes[n].inputs) {
      if (v < 0 || !p.graph.values[v].constant) continue;
      (p.graph.values[v].dtype == DType::kFloat16 ? weights : float32_weights)
          .insert(p.graph.values[v].name);
    }
  }
  ASSERT_GT(weights.size(), 10u);
  EXPECT_TRUE(float32_weights.empty()) << *float32_weights.begin();
  built = Status(unsupported("released"));  // drop the built engine and the weights it prepared
  const backends::Backend* cuda = *backends::get_backend(Device::kCUDA);
  uint64_t before = cuda->weights_prepared();
  std::vector<Engine> engines;
  std::vector<std::unique_ptr<ExecutionContext>> contexts;
  Tensor x = random_f32({2, 3, 224, 224}, 7);
  uint64_t after_first = 0;
  for (int load = 0; load < 2; ++load) {
    auto engine = Engine::load(path);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    engines.push_back(std::move(engine).value());
    for (int c = 0; c < 2; ++c) {
      auto ctx = engines.back().create_execution_context();
      ASSERT_TRUE(ctx.ok());
      auto out = (*ctx)->run({{"x", x}});
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      contexts.push_back(std::move(ctx).value());
    }
    if (load == 0) after_first = cuda->weights_prepared() - before;
  }
  uint64_t prepared = cuda->weights_prepared() - before;
  std::printf(
      "[ info     ] %zu FP16 weights stored converted; %llu prepared by two loads with 2 "
      "contexts each\n",
      weights.size(), static_cast<unsigned long long>(prepared));
  // Nothing is converted at load or per context: the engine file holds the FP16 weights.
  EXPECT_EQ(after_first, 0u);
  EXPECT_EQ(prepared, 0u);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kiln::testing
