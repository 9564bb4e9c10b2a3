// End-to-end tests over ../shared/models: parse, build with the README's profile, save, load, run
// every test set, and match the ONNX Runtime reference; plus the seeds' dynamic-shape cases.
#include <gtest/gtest.h>

#include <filesystem>

#include "model_util.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

#define REQUIRE_MODELS()                                                                   \
  if (models_dir().empty()) {                                                              \
    GTEST_SKIP() << "../shared/models is absent (set KILN_MODELS_DIR to run these tests)"; \
  }

// Skips (printing why) when the device cannot run here: no CUDA in this build, or no GPU.
#define REQUIRE_DEVICE(device)                                                     \
  if (Status why = device_available(device); !why.ok()) {                          \
    GTEST_SKIP() << device_name(device) << " is not available: " << why.message(); \
  }

std::string model_path(const std::string& name) {
  return models_dir() + "/" + name + "/model.onnx";
}

std::string device_param_name(Device d) { return d == Device::kCPU ? "cpu" : "cuda"; }

// Every shared model on every device: the GPU runs the same test case as the CPU. On CUDA the
// engine is built with strict FP32 (TF32 cleared) so the FP32 tolerance applies; reduced
// precisions have their own tests in cuda_test.cc.
class SharedModel : public ::testing::TestWithParam<std::tuple<std::string, Device>> {};

TEST_P(SharedModel, BuildsSavesLoadsAndMatchesOnnxRuntime) {
  REQUIRE_MODELS();
  const std::string name = std::get<0>(GetParam());
  const Device device = std::get<1>(GetParam());
  REQUIRE_DEVICE(device);
  BuilderConfig config;
  if (device != Device::kCPU) config.clear_flag(BuilderFlag::kTF32);
  auto built = build_model(model_path(name), shared_model_profile(name), device, config);
  ASSERT_TRUE(built.ok()) << built.status().to_string();
  auto file = std::filesystem::temp_directory_path() / (name + ".kiln");
  ASSERT_TRUE(built->save(file.string()).ok());
  auto engine = Engine::load(file.string());
  std::filesystem::remove(file);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto sets = load_test_sets(models_dir() + "/" + name);
  ASSERT_TRUE(sets.ok()) << sets.status().to_string();
  ASSERT_FALSE(sets->empty());
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  int num_inputs = 0;
  while (engine->tensor_mode(engine->io_tensor_name(num_inputs)) == TensorIOMode::kINPUT)
    ++num_inputs;
  for (size_t k = 0; k < sets->size(); ++k) {
    const TestSet& set = (*sets)[k];
    std::map<std::string, Tensor> inputs;
    for (int i = 0; i < num_inputs; ++i) inputs[engine->io_tensor_name(i)] = set.inputs[i];
    auto out = (*ctx)->run(inputs);
    ASSERT_TRUE(out.ok()) << name << " set " << k << ": " << out.status().to_string();
    ASSERT_EQ(int(set.outputs.size()), engine->num_io_tensors() - num_inputs);
    for (size_t o = 0; o < set.outputs.size(); ++o) {
      const std::string out_name = engine->io_tensor_name(num_inputs + int(o));
      const Tensor& got = out->at(out_name);
      EXPECT_EQ(got.shape(), set.outputs[o].shape())
          << name << " set " << k << " output " << out_name;
      EXPECT_TRUE(all_close(got, set.outputs[o], kFp32Atol, kFp32Rtol))
          << name << " set " << k << " output " << out_name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, SharedModel,
                         ::testing::Combine(::testing::Values("testmod_linear", "unet_pixelshuffle",
                                                              "mobilenet_v3_small", "vit_tiny",
                                                              "vit_tiny_legacy", "llama_tiny"),
                                            ::testing::Values(Device::kCPU, Device::kCUDA)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  device_param_name(std::get<1>(info.param));
                         });

// Seed 000: one context at batch 4, 1, 32, 4; outputs are exactly (batch, 1000), each row equals
// the row computed alone, and activation memory follows the batch instead of the profile max.
// Runs on the CPU, and on CUDA (strict FP32) without and with CUDA graphs.
struct VitRun {
  Device device;
  bool cuda_graph;
};
class SeedVitDynamicBatch : public ::testing::TestWithParam<VitRun> {};

TEST_P(SeedVitDynamicBatch, ExactOutputShapesAndRowsMatchAloneRuns) {
  REQUIRE_MODELS();
  const VitRun param = GetParam();
  REQUIRE_DEVICE(param.device);
  BuilderConfig config;
  if (param.device != Device::kCPU) config.clear_flag(BuilderFlag::kTF32);
  // The shared ViT's zero-initialised head gives all-zero logits, so the rows are also compared on
  // the feature the head reads (the last Gemm's input), exposed as a second output.
  auto net = onnx::parse_file(model_path("vit_tiny"));
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  int feature_value = -1;
  for (const auto& node : net->graph.nodes) {
    if (node.op_type == "Gemm") feature_value = node.inputs[0];
  }
  ASSERT_GE(feature_value, 0);
  net->graph.outputs.push_back(feature_value);
  const std::string feature = net->graph.values[feature_value].name;
  OptimizationProfile profile;
  const ModelProfile mp = shared_model_profile("vit_tiny")[0];
  ASSERT_TRUE(profile.set_dimensions(mp.input, mp.min, mp.opt, mp.max).ok());
  config.add_profile(profile);
  auto engine = Builder(param.device).build(*net, config);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ(ir::dims_to_string(*engine->tensor_symbolic_shape("linear_16")), "[batch, 1000]");
  EXPECT_EQ(ir::dims_to_string(*engine->tensor_symbolic_shape(feature)), "[batch, 192]");
  EXPECT_EQ(*engine->tensor_shape("linear_16"), (Shape{-1, 1000}));
  Tensor all = random_f32({32, 3, 224, 224}, 7);
  const int64_t image = 3 * 224 * 224;
  auto batch_of = [&](int64_t n) {
    return Tensor::wrap(DType::kFloat32, {n, 3, 224, 224}, all.data(), nullptr);
  };
  auto alone_ctx = engine->create_execution_context();
  ASSERT_TRUE(alone_ctx.ok());
  std::vector<Tensor> alone, alone_feature;
  for (int64_t r = 0; r < 32; ++r) {
    Tensor row =
        Tensor::wrap(DType::kFloat32, {1, 3, 224, 224}, all.data_as<float>() + r * image, nullptr);
    auto out = (*alone_ctx)->run({{"x", row}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    alone.push_back(out->at("linear_16"));
    alone_feature.push_back(out->at(feature));
  }
  double feature_max = 0;
  for (int64_t i = 0; i < alone_feature[0].numel(); ++i) {
    feature_max = std::max(feature_max, std::abs(alone_feature[0].float_at(i)));
  }
  ASSERT_GT(feature_max, 0.1)
      << "the feature rows must carry signal for the row check to mean anything";
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  (*ctx)->set_use_cuda_graph(param.cuda_graph);
  size_t arena_at_4 = 0;
  for (int64_t batch : {4, 1, 32, 4}) {
    ASSERT_TRUE((*ctx)->set_input_shape("x", {batch, 3, 224, 224}).ok());
    EXPECT_EQ(*(*ctx)->tensor_shape("linear_16"), (Shape{batch, 1000}));
    auto out = (*ctx)->run({{"x", batch_of(batch)}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    const Tensor& y = out->at("linear_16");
    ASSERT_EQ(y.shape(), (Shape{batch, 1000})) << "never sized for the profile max";
    const Tensor& f = out->at(feature);
    ASSERT_EQ(f.shape(), (Shape{batch, 192}));
    for (int64_t r = 0; r < batch; ++r) {
      Tensor row = Tensor::wrap(DType::kFloat32, {1, 1000}, y.data_as<float>() + r * 1000, nullptr);
      EXPECT_TRUE(all_close(row, alone[r], 1e-5, 1e-4)) << "batch " << batch << " row " << r;
      Tensor frow = Tensor::wrap(DType::kFloat32, {1, 192}, f.data_as<float>() + r * 192, nullptr);
      EXPECT_TRUE(all_close(frow, alone_feature[r], 1e-4, 1e-3))
          << "batch " << batch << " feature row " << r;
    }
    if (batch == 4 && arena_at_4 == 0) arena_at_4 = (*ctx)->arena_bytes();
  }
  auto fresh = engine->create_execution_context();
  ASSERT_TRUE((*fresh)->run({{"x", batch_of(32)}}).ok());
  EXPECT_LT(arena_at_4 * 4, (*fresh)->arena_bytes())
      << "activation memory at batch 4 should be far below batch 32";
  // The formula agrees with what the arena holds at batch 32 (give or take slot alignment).
  auto formula = engine->activation_bytes_formula().eval({{"batch", 32}});
  ASSERT_TRUE(formula.has_value());
  EXPECT_LE(size_t(*formula), (*fresh)->arena_bytes());
  if (param.cuda_graph) {
    // Replays of the captured graph give the same rows as the first (direct) run of that shape.
    auto again = (*ctx)->run({{"x", batch_of(4)}});
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    for (int64_t r = 0; r < 4; ++r) {
      Tensor row = Tensor::wrap(DType::kFloat32, {1, 1000},
                                again->at("linear_16").data_as<float>() + r * 1000, nullptr);
      EXPECT_TRUE(all_close(row, alone[r], 1e-5, 1e-4)) << "graph replay row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, SeedVitDynamicBatch,
                         ::testing::Values(VitRun{Device::kCPU, false},
                                           VitRun{Device::kCUDA, false},
                                           VitRun{Device::kCUDA, true}),
                         [](const auto& info) {
                           return device_param_name(info.param.device) +
                                  (info.param.cuda_graph ? "_graph" : "");
                         });

// Seed 003: a dependent symbolic dim reported as a formula and resolved from the input shape.
TEST(SeedDependentDims, TestmodLinearReportsSeqLenPlusOne) {
  REQUIRE_MODELS();
  auto engine = build_model(model_path("testmod_linear"), shared_model_profile("testmod_linear"));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ(ir::dims_to_string(*engine->tensor_symbolic_shape("cat")),
            "[batch_size, seq_len + 1, 8]");
  EXPECT_EQ(*engine->tensor_shape("cat"), (Shape{-1, -1, 8}));
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE((*ctx)->set_input_shape("x", {10, 10, 16}).ok());
  EXPECT_EQ(*(*ctx)->tensor_shape("cat"), (Shape{10, 11, 8}));
  ASSERT_TRUE((*ctx)->set_input_shape("x", {3, 1, 16}).ok());
  EXPECT_EQ(*(*ctx)->tensor_shape("cat"), (Shape{3, 2, 8}));
}

// Seed 001: dynamic H and W through PixelShuffle and interpolate.
TEST(SeedUnetDynamicHW, RunsTwoSpatialSizes) {
  REQUIRE_MODELS();
  auto engine =
      build_model(model_path("unet_pixelshuffle"), shared_model_profile("unet_pixelshuffle"));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ(ir::dims_to_string(*engine->tensor_symbolic_shape("pixel_shuffle_1")),
            "[n, 3, 8*h, 8*w]");
  auto ctx = engine->create_execution_context();
  for (Shape s : {Shape{2, 3, 200, 200}, Shape{1, 3, 300, 400}}) {
    auto out = (*ctx)->run({{"x", random_f32(s, 3)}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(out->at("pixel_shuffle_1").shape(), (Shape{s[0], 3, 2 * s[2], 2 * s[3]}));
  }
  auto bad = (*ctx)->set_input_shape("x", {1, 3, 202, 200});
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("4*h"), std::string::npos) << bad.message();
}

TEST(RuntimeErrors, ClearMessagesNeverCrashes) {
  REQUIRE_MODELS();
  auto engine = build_model(model_path("testmod_linear"), shared_model_profile("testmod_linear"));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = (*engine).create_execution_context();
  ASSERT_TRUE(ctx.ok());
  auto& c = **ctx;

  Status outside = c.set_input_shape("x", {11, 4, 16});
  EXPECT_EQ(outside.code(), StatusCode::kInvalidArgument);
  for (const char* part : {"'x'", "dim 0", "batch_size", "11", "[1, 10]"}) {
    EXPECT_NE(outside.message().find(part), std::string::npos)
        << part << " missing in: " << outside.message();
  }
  Status rank = c.set_input_shape("x", {4, 16});
  EXPECT_NE(rank.message().find("rank 3"), std::string::npos) << rank.message();
  Status fixed = c.set_input_shape("x", {4, 4, 15});
  EXPECT_NE(fixed.message().find("fixed at 16"), std::string::npos) << fixed.message();
  Status unknown = c.set_input_shape("y", {4, 4, 16});
  EXPECT_EQ(unknown.code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.message().find("'y'"), std::string::npos);
  EXPECT_EQ(engine->tensor_mode("y"), TensorIOMode::kNONE);
  EXPECT_FALSE(engine->tensor_dtype("y").ok());

  auto wrong_dtype = c.run({{"x", make_i64({1, 1, 16}, std::vector<int64_t>(16, 1))}});
  ASSERT_FALSE(wrong_dtype.ok());
  EXPECT_NE(wrong_dtype.status().message().find("int64"), std::string::npos)
      << wrong_dtype.status().message();
  auto missing = c.run({});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("missing input(s): x"), std::string::npos)
      << missing.status().message();
  auto no_address = (*engine->create_execution_context())->execute();
  EXPECT_FALSE(no_address.ok());
  EXPECT_NE(no_address.message().find("not set: x"), std::string::npos) << no_address.message();
}

TEST(EngineFileErrors, TruncatedAndFlippedFilesAreRefused) {
  REQUIRE_MODELS();
  auto engine = build_model(model_path("testmod_linear"), shared_model_profile("testmod_linear"));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  std::vector<uint8_t> bytes = engine->serialize();
  ASSERT_TRUE(Engine::deserialize(bytes).ok());
  auto truncated = Engine::deserialize(std::span<const uint8_t>(bytes.data(), bytes.size() / 2));
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("truncated"), std::string::npos)
      << truncated.status().message();
  for (size_t pos : {size_t(3), size_t(20), bytes.size() / 3, bytes.size() - 5}) {
    std::vector<uint8_t> flipped = bytes;
    flipped[pos] ^= 0x10;
    auto r = Engine::deserialize(flipped);
    EXPECT_FALSE(r.ok()) << "flipped byte " << pos << " was accepted";
  }
  auto missing = Engine::load("/nonexistent/model.kiln");
  EXPECT_FALSE(missing.ok());
}

}  // namespace
}  // namespace kiln::testing
