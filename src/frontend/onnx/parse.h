// The ONNX frontend: loads a ModelProto (and its external data) into an ir::Graph, and reads
// serialized TensorProto files such as the ONNX test_data_set_* inputs and outputs.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"
#include "core/tensor.h"
#include "ir/graph.h"

namespace kiln {

// A parsed model: the IR graph plus facts about the file.
struct Network {
  ir::Graph graph;
  uint64_t model_hash = 0;  // FNV-1a 64 over the model file's bytes
  std::string path;         // empty when parsed from memory
  int64_t ir_version = 0;
  std::string producer;
};

namespace onnx {

// External data is resolved relative to the model's folder and may not leave it.
StatusOr<Network> parse_file(const std::string& path);
// model_dir "" refuses external data (a model in memory has no folder to confine it to).
StatusOr<Network> parse_bytes(std::span<const uint8_t> bytes, const std::string& model_dir);
// A serialized TensorProto (.pb), as in ONNX test_data_set_*.
StatusOr<Tensor> parse_tensor_file(const std::string& path);
StatusOr<Tensor> tensor_from_bytes(std::span<const uint8_t> bytes);

// A value of an ONNX test data file, read as the kind the model declares for it (the file does not
// say): a TensorProto, a SequenceProto of tensors, or an OptionalProto of a tensor or sequence.
struct DataValue {
  ir::ValueKind kind = ir::ValueKind::kTensor;
  bool present = true;          // false: an empty optional
  std::vector<Tensor> tensors;  // the tensor, or the sequence's elements
};
StatusOr<DataValue> parse_value_file(const std::string& path, ir::ValueKind kind);

}  // namespace onnx
}  // namespace kiln
