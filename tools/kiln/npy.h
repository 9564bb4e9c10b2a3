// NumPy .npy files (format 1.0/2.0/3.0, little-endian, C order): how kiln run and kiln compare
// read inputs and write outputs, and how they hand tensors to scripts/ort_reference.py. Core code
// alone, so the runtime-only runner (tools/run_engine) compiles it in too.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/tensor.h"
#include "flags.h"

namespace kiln::cli {

// Reads at most `max_bytes` (header included); a path that is not a regular file is refused
// unread. `what` names the file in errors ("input", "reference output").
// The bytes of a .npy file; `path` names it in errors.
Result<Tensor> parse_npy(std::span<const uint8_t> bytes, const std::string& path);
Result<Tensor> read_npy(const std::string& path, uint64_t max_bytes, std::string_view what);
Check write_npy(const std::string& path, const Tensor& tensor);

}  // namespace kiln::cli
