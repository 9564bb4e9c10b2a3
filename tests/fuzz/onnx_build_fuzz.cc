// libFuzzer target: bytes as an ONNX model. A model that parses is built for the CPU with a small
// profile (every dynamic dim 1..2, sequences of two elements), saved and loaded again, and run
// once at its min shapes.
// Every outcome but a crash, a leak or a sanitizer report is fine: errors are the expected answer.
#include <cstdint>
#include <map>
#include <span>
#include <string>

#include "builder/builder.h"  // builder::tensor_inputs
#include "kiln.h"

namespace {

// Inputs larger than this are not built: the fuzzer looks for crashes, and a legitimately huge
// static input would only make it report running out of memory.
constexpr int64_t kMaxInputElements = int64_t(1) << 16;
// Nor are engines run whose outputs at the run's shapes take more than this: a model may ask for a
// legitimately huge output from a small input (a Pad of 2^56), which the runtime refuses or
// allocates as asked; either way the fuzzer would only be measuring the allocator.
constexpr int64_t kMaxOutputBytes = int64_t(256) << 20;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  auto net = onnx::parse_bytes(std::span<const uint8_t>(data, size), "");
  if (!net.ok()) return 0;
  OptimizationProfile profile;
  BuilderConfig config;
  std::map<std::string, Tensor> inputs;
  // Sequence inputs are built with two elements, "s[0]" and "s[1]"; optionals are present.
  for (int v : net->graph.inputs) {
    const ir::Value& value = net->graph.values[size_t(v)];
    if (value.kind == ir::ValueKind::kSequence || value.kind == ir::ValueKind::kOptionalSequence) {
      if (!config.set_sequence_length(value.name, 2).ok()) return 0;
    }
  }
  const std::vector<ir::Value> tensors = builder::tensor_inputs(net->graph, config);
  for (const ir::Value& value : tensors) {
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
  config.add_profile(profile);
  auto engine = Builder(Device::kCPU).build(*net, config);
  if (!engine.ok()) return 0;
  // The loader must accept whatever the builder writes.
  const std::vector<uint8_t> bytes = engine->serialize();
  auto loaded = Engine::deserialize(bytes);
  if (!loaded.ok()) __builtin_trap();
  auto context = loaded->create_execution_context();
  if (!context.ok()) return 0;
  // The same budget for the activation arena (an intermediate can be huge where the output is not).
  auto arena = loaded->activation_bytes(0, OptProfileSelector::kMAX);
  if (!arena.ok() || *arena > kMaxOutputBytes) return 0;
  for (const auto& [name, t] : inputs) {
    if (!(*context)->set_input_shape(name, t.shape()).ok()) return 0;
  }
  int64_t output_bytes = 0;
  for (int i = 0; i < loaded->num_io_tensors(); ++i) {
    const std::string name = loaded->io_tensor_name(i);
    if (loaded->tensor_mode(name) != TensorIOMode::kOUTPUT) continue;
    auto shape = (*context)->tensor_shape(name);
    auto dtype = loaded->tensor_dtype(name);
    if (!shape.ok() || !dtype.ok()) return 0;
    int64_t bytes = int64_t(dtype_size(*dtype));
    for (int64_t d : *shape) {
      if (d < 0 || (d > 0 && bytes > kMaxOutputBytes / d)) return 0;
      bytes *= d;
    }
    output_bytes += bytes;
    if (output_bytes > kMaxOutputBytes) return 0;
  }
  (*context)->set_max_loop_iterations(
      1000);  // a run-time loop whose condition never turns false ends soon
  (void)(*context)->run(inputs);
  return 0;
}
