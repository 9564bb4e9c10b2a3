// Quickstart: parse an ONNX model with a dynamic batch, build an engine for batch 1..16, print its
// IO, then run it at the batch sizes of the model's test sets and compare with the reference.
// Usage: kiln_quickstart MODEL_DIR  (MODEL_DIR holds model.onnx and test_data_set_K/).
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "kiln.h"

namespace fs = std::filesystem;

static std::string mode_name(kiln::TensorIOMode m) {
  return m == kiln::TensorIOMode::kINPUT    ? "input"
         : m == kiln::TensorIOMode::kOUTPUT ? "output"
                                            : "none";
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
    return 2;
  }
  fs::path dir = argv[1];
  auto network = kiln::onnx::parse_file((dir / "model.onnx").string());
  if (!network.ok()) {
    std::fprintf(stderr, "parse failed: %s\n", network.status().to_string().c_str());
    return 1;
  }
  kiln::BuilderConfig config;
  kiln::OptimizationProfile profile;
  const std::string input = "image";
  if (auto st = profile.set_dimensions(input, {1, 3, 32, 32}, {4, 3, 32, 32}, {16, 3, 32, 32});
      !st.ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }
  config.add_profile(profile);
  auto engine = kiln::Builder(kiln::Device::kCPU).build(*network, config);
  if (!engine.ok()) {
    std::fprintf(stderr, "build failed: %s\n", engine.status().to_string().c_str());
    return 1;
  }
  std::printf("engine: %d IO tensors, %d profile(s), %d layers, activation memory %s bytes\n",
              engine->num_io_tensors(), engine->num_profiles(), engine->num_layers(),
              engine->activation_bytes_formula().to_string().c_str());
  for (int i = 0; i < engine->num_io_tensors(); ++i) {
    std::string name = engine->io_tensor_name(i);
    std::printf("  %-6s %-8s %-10s %s\n", mode_name(engine->tensor_mode(name)).c_str(),
                name.c_str(), std::string(kiln::dtype_name(*engine->tensor_dtype(name))).c_str(),
                kiln::ir::dims_to_string(*engine->tensor_symbolic_shape(name)).c_str());
  }
  auto ctx = engine->create_execution_context();
  if (!ctx.ok()) {
    std::fprintf(stderr, "%s\n", ctx.status().to_string().c_str());
    return 1;
  }
  bool all_ok = true;
  for (int k = 0; fs::exists(dir / ("test_data_set_" + std::to_string(k))); ++k) {
    fs::path set = dir / ("test_data_set_" + std::to_string(k));
    auto x = kiln::onnx::parse_tensor_file((set / "input_0.pb").string());
    auto ref = kiln::onnx::parse_tensor_file((set / "output_0.pb").string());
    if (!x.ok() || !ref.ok()) {
      std::fprintf(stderr, "cannot read %s\n", set.c_str());
      return 1;
    }
    auto out = (*ctx)->run({{input, *x}});
    if (!out.ok()) {
      std::fprintf(stderr, "run failed: %s\n", out.status().to_string().c_str());
      return 1;
    }
    const kiln::Tensor& y = out->begin()->second;
    double max_abs = 0;
    bool ok = y.shape() == ref->shape();
    for (int64_t i = 0; ok && i < y.numel(); ++i) {
      double e = ref->float_at(i), err = std::fabs(y.float_at(i) - e);
      max_abs = std::max(max_abs, err);
      ok = err <= 1e-4 + 1e-3 * std::fabs(e);
    }
    all_ok &= ok;
    std::printf("batch %-3ld input %s -> %s %s; vs ONNX Runtime (FP32): max abs err %.2e  %s\n",
                long(x->shape()[0]), kiln::shape_to_string(x->shape()).c_str(),
                out->begin()->first.c_str(), kiln::shape_to_string(y.shape()).c_str(), max_abs,
                ok ? "PASS" : "FAIL");
  }
  return all_ok ? 0 : 1;
}
