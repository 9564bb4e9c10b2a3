// Feature-level accuracy for the shared classifiers whose logits are degenerate (zero-initialised
// heads map every input to ~0): scripts/make_feature_refs.py exposes the deepest intermediate that
// carries signal as an extra output with an ONNX Runtime FP32 reference, and kiln must match it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "model_util.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

std::string feature_refs_dir() {
  static const std::string dir = [] {
    std::string out = std::string(KILN_BINARY_DIR) + "/feature_refs";
    if (std::filesystem::exists(out + "/vit_tiny/test_data_set_0/output_1.pb")) return out;
    std::string cmd = "python3 " + std::string(KILN_SOURCE_DIR) +
                      "/scripts/make_feature_refs.py '" + models_dir() + "' '" + out + "' > '" +
                      out + ".log' 2>&1";
    std::filesystem::create_directories(out);
    return std::system(cmd.c_str()) == 0 ? out : std::string();
  }();
  return dir;
}

TEST(FeatureReferences, DeepIntermediatesMatchOnnxRuntime) {
  if (models_dir().empty()) GTEST_SKIP() << "../shared/models is absent";
  const std::string dir = feature_refs_dir();
  if (dir.empty())
    GTEST_SKIP()
        << "scripts/make_feature_refs.py failed (onnxruntime missing?); see feature_refs.log";
  for (Device device : {Device::kCPU, Device::kCUDA}) {
    if (Status st = device_available(device); !st.ok()) {
      std::printf("[ SKIPPED  ] %s: %s\n", std::string(device_name(device)).c_str(),
                  st.message().c_str());
      continue;
    }
    for (const std::string name : {"vit_tiny", "vit_tiny_legacy", "mobilenet_v3_small"}) {
      BuilderConfig config;
      config.clear_flag(BuilderFlag::kTF32);  // strict FP32 against the FP32 reference
      auto engine =
          build_model(dir + "/" + name + "/model.onnx", shared_model_profile(name), device, config);
      ASSERT_TRUE(engine.ok()) << name << ": " << engine.status().to_string();
      auto sets = load_test_sets(dir + "/" + name);
      ASSERT_TRUE(sets.ok() && sets->size() == 1) << name;
      const TestSet& set = (*sets)[0];
      auto ctx = engine->create_execution_context();
      ASSERT_TRUE(ctx.ok());
      auto out = (*ctx)->run({{engine->io_tensor_name(0), set.inputs[0]}});
      ASSERT_TRUE(out.ok()) << name << ": " << out.status().to_string();
      ASSERT_EQ(engine->num_io_tensors(), 3) << name << ": input, logits and the feature";
      const Tensor& feature = out->at(engine->io_tensor_name(2));
      const Tensor& expected = set.outputs[1];
      EXPECT_EQ(feature.shape(), expected.shape()) << name;
      // The reference carries signal, so a kernel writing zeros cannot pass.
      double max_abs = 0;
      for (int64_t i = 0; i < expected.numel(); ++i)
        max_abs = std::max(max_abs, std::abs(expected.float_at(i)));
      EXPECT_GT(max_abs, 0.1) << name;
      EXPECT_TRUE(all_close(feature, expected, kFp32Atol, kFp32Rtol))
          << name << " on " << device_name(device) << ", feature " << engine->io_tensor_name(2);
    }
  }
}

}  // namespace
}  // namespace kiln::testing
