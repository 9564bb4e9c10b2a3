// NumPy .npy files (format 1.0/2.0/3.0, little-endian, C order): how kiln run and kiln compare
// read inputs and write outputs, and how they hand tensors to scripts/ort_reference.py.
#pragma once

#include <string>

#include "core/tensor.h"
#include "flags.h"

namespace kiln::cli {

Result<Tensor> read_npy(const std::string& path);
Check write_npy(const std::string& path, const Tensor& tensor);

// An input file by its extension: .npy, or .pb (a serialized onnx.TensorProto).
Result<Tensor> read_tensor_file(const std::string& path);

}  // namespace kiln::cli
