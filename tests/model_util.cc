// Helpers for tests over ../shared/models.
#include "model_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "backends/backend.h"
#include "test_util.h"

namespace kiln::testing {

std::string models_dir() {
  const char* env = std::getenv("KILN_MODELS_DIR");
  std::string dir = env ? env : KILN_DEFAULT_MODELS_DIR;
  return std::filesystem::exists(std::filesystem::path(dir) / "manifest.json") ? dir : "";
}

std::vector<ModelProfile> shared_model_profile(const std::string& model) {
  if (model == "mobilenet_v3_small" || model == "vit_tiny") {
    return {{"x", {1, 3, 224, 224}, {4, 3, 224, 224}, {32, 3, 224, 224}}};
  }
  if (model == "vit_tiny_legacy")
    return {{"input", {1, 3, 224, 224}, {4, 3, 224, 224}, {32, 3, 224, 224}}};
  if (model == "unet_pixelshuffle")
    return {{"x", {1, 3, 200, 200}, {1, 3, 300, 300}, {32, 3, 400, 400}}};
  if (model == "testmod_linear") return {{"x", {1, 1, 16}, {4, 4, 16}, {10, 10, 16}}};
  if (model == "llama_tiny") return {{"ids", {1, 2}, {2, 32}, {8, 128}}};
  return {};
}

StatusOr<std::vector<TestSet>> load_test_sets(const std::string& model_dir) {
  std::vector<TestSet> sets;
  for (int k = 0;; ++k) {
    auto dir = std::filesystem::path(model_dir) / ("test_data_set_" + std::to_string(k));
    if (!std::filesystem::exists(dir)) break;
    TestSet set;
    for (int i = 0; std::filesystem::exists(dir / ("input_" + std::to_string(i) + ".pb")); ++i) {
      KILN_ASSIGN_OR_RETURN(Tensor t, onnx::parse_tensor_file(
                                          (dir / ("input_" + std::to_string(i) + ".pb")).string()));
      set.inputs.push_back(std::move(t));
    }
    for (int i = 0; std::filesystem::exists(dir / ("output_" + std::to_string(i) + ".pb")); ++i) {
      KILN_ASSIGN_OR_RETURN(
          Tensor t,
          onnx::parse_tensor_file((dir / ("output_" + std::to_string(i) + ".pb")).string()));
      set.outputs.push_back(std::move(t));
    }
    sets.push_back(std::move(set));
  }
  return sets;
}

StatusOr<Engine> build_model(const std::string& model_path,
                             const std::vector<ModelProfile>& profile, Device device) {
  return build_model(model_path, profile, device, BuilderConfig());
}

Status device_available(Device device) {
  auto backend = backends::get_backend(device);
  return backend.ok() ? ok_status() : backend.status();
}

StatusOr<Engine> build_model(const std::string& model_path,
                             const std::vector<ModelProfile>& profile, Device device,
                             BuilderConfig config) {
  KILN_ASSIGN_OR_RETURN(Network net, onnx::parse_file(model_path));
  OptimizationProfile p;
  for (const auto& m : profile)
    KILN_RETURN_IF_ERROR(p.set_dimensions(m.input, m.min, m.opt, m.max));
  config.add_profile(p);
  return Builder(device).build(net, config);
}

StatusOr<Engine> build_cpu(const ir::Graph& g, const Shape& min, const Shape& max) {
  Network net;
  net.graph = g;
  BuilderConfig config;
  OptimizationProfile p;
  KILN_RETURN_IF_ERROR(p.set_dimensions("x", min, max, max));
  config.add_profile(p);
  return Builder().build(net, config);
}

// Every value of `g` computed node by node on the reference kernels (each output of x's shape).
std::map<int, Tensor> run_unfused(const ir::Graph& g, const Tensor& x) {
  std::map<int, Tensor> v;
  v[g.find_value("x")] = x;
  for (size_t k = 0; k < g.values.size(); ++k) {
    if (g.values[k].constant) v[int(k)] = *g.values[k].constant;
  }
  for (const ir::Node& n : g.nodes) {
    std::vector<Tensor> in;
    for (int i : n.inputs) in.push_back(i >= 0 ? v.at(i) : Tensor());
    // The output's IR shape where it is static (else x's, for the symbolic graphs).
    Shape shape = x.shape();
    const auto& ir_shape = g.values[size_t(n.outputs[0])].shape;
    if (ir_shape && std::all_of(ir_shape->begin(), ir_shape->end(),
                                [](const ir::Dim& d) { return d.is_const(); })) {
      shape.clear();
      for (const ir::Dim& d : *ir_shape) shape.push_back(d.value());
    }
    auto r = run_cpu_kernel(n, in, {{DType::kFloat32, shape}});
    EXPECT_TRUE(r.ok()) << n.describe() << ": " << r.status().to_string();
    if (!r.ok()) return v;
    v[n.outputs[0]] = r->at(0);
  }
  return v;
}

Tensor random_f32(Shape shape, uint64_t seed) {
  Tensor t = Tensor::zeros(DType::kFloat32, std::move(shape)).value();
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = float((s >> 40) & 0xffffff) / float(1 << 23) - 1.0f;
  }
  return t;
}

}  // namespace kiln::testing
