// Helpers for tests over ../shared/models: where the models are, their profiles, their test sets.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kiln.h"

namespace kiln::testing {

// KILN_MODELS_DIR if set, else ../shared/models beside the repository; "" when absent.
std::string models_dir();

struct ModelProfile {
  std::string input;
  Shape min, opt, max;
};

// The profile the shared models' README gives for each model.
std::vector<ModelProfile> shared_model_profile(const std::string& model);

struct TestSet {
  std::vector<Tensor> inputs, outputs;
};
StatusOr<std::vector<TestSet>> load_test_sets(const std::string& model_dir);

StatusOr<Engine> build_model(const std::string& model_path,
                             const std::vector<ModelProfile>& profile,
                             Device device = Device::kCPU);
// The same with a given configuration (precision flags); the profile is added to it.
StatusOr<Engine> build_model(const std::string& model_path,
                             const std::vector<ModelProfile>& profile, Device device,
                             BuilderConfig config);

// ok when tests can run on `device`; otherwise why not (no CUDA build, no GPU).
Status device_available(Device device);

// A CPU engine of `g` for its input "x" over shapes min..max (opt = max).
StatusOr<Engine> build_cpu(const ir::Graph& g, const Shape& min, const Shape& max);

// Every value of `g` computed node by node on the CPU reference kernels, from input "x" and the
// constants (each node's one output of its static IR shape, else of x's shape).
std::map<int, Tensor> run_unfused(const ir::Graph& g, const Tensor& x);

// Deterministic pseudo-random floats in [-1, 1).
Tensor random_f32(Shape shape, uint64_t seed);

}  // namespace kiln::testing
