// Internal to the ONNX frontend: TensorProto decoding, external data and file reading.
// Keeps protobuf types out of parse.h; only frontend/onnx/*.cc include this header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "onnx/onnx.pb.h"

namespace kiln::onnx {

// Protobuf cannot parse messages of 2 GiB or more; larger weights must live in external data.
inline constexpr uint64_t kMaxProtoBytes = (uint64_t(1) << 31) - 1;

// "float8e4m3fn", "string", ...: names ONNX element types in errors, including ones kiln lacks.
std::string onnx_type_name(int32_t code);

// "tensor 'w'" (or "tensor (unnamed)"), the prefix of every error about a tensor.
std::string tensor_label(const ::onnx::TensorProto& tp);

// Decodes raw_data, the typed fields or external data (model_dir "" refuses external data).
StatusOr<Tensor> decode_tensor(const ::onnx::TensorProto& tp, const std::string& model_dir);

// Reads external data of `tp` (already validated as EXTERNAL) into a new tensor of `dtype` and
// `shape`, `nbytes` in all. The tensor is allocated only once the location, offset and length
// have been checked against the file, so a few bytes of model cannot demand a huge allocation.
StatusOr<Tensor> read_external_data(const ::onnx::TensorProto& tp, const std::string& model_dir,
                                    DType dtype, const Shape& shape, int64_t nbytes);

// Reads a whole file, refusing one larger than max_bytes; `what` names it in errors ("model").
StatusOr<std::vector<uint8_t>> read_file_bytes(const std::string& path, uint64_t max_bytes,
                                               const std::string& what);

}  // namespace kiln::onnx
