// libFuzzer target: bytes as an ONNX model. A model that parses is built for the CPU with a small
// profile (every dynamic dim 1..2), saved and loaded again, and run once at its min shapes.
// Every outcome but a crash, a leak or a sanitizer report is fine: errors are the expected answer.
#include <cstdint>
#include <map>
#include <span>
#include <string>

#include "kiln.h"

namespace {

// Inputs larger than this are not built: the fuzzer looks for crashes, and a legitimately huge
// static input would only make it report running out of memory.
constexpr int64_t kMaxInputElements = int64_t(1) << 16;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  auto net = onnx::parse_bytes(std::span<const uint8_t>(data, size), "");
  if (!net.ok()) return 0;
  OptimizationProfile profile;
  std::map<std::string, Tensor> inputs;
  for (int v : net->graph.inputs) {
    const ir::Value& value = net->graph.values[size_t(v)];
    if (!value.shape || value.constant) continue;
    std::vector<int64_t> min, max;
    int64_t elements = 1;
    for (const ir::Dim& d : *value.shape) {
      min.push_back(d.is_const() ? d.value() : 1);
      max.push_back(d.is_const() ? d.value() : 2);
      if (min.back() < 0 || max.back() > kMaxInputElements) return 0;
      elements *= max.back();
      if (elements > kMaxInputElements) return 0;
    }
    if (!profile.set_dimensions(value.name, min, min, max).ok()) return 0;
    auto t = Tensor::zeros(value.dtype, min);
    if (t.ok()) inputs.emplace(value.name, std::move(t).value());
  }
  BuilderConfig config;
  config.add_profile(profile);
  auto engine = Builder(Device::kCPU).build(*net, config);
  if (!engine.ok()) return 0;
  // The loader must accept whatever the builder writes.
  const std::vector<uint8_t> bytes = engine->serialize();
  auto loaded = Engine::deserialize(bytes);
  if (!loaded.ok()) __builtin_trap();
  auto context = loaded->create_execution_context();
  if (!context.ok()) return 0;
  (void)(*context)->run(inputs);
  return 0;
}
