// Element types. Numbering follows onnx.TensorProto.DataType so files and frontends agree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace kiln {

#define KILN_DTYPES(X)          \
  X(kFloat32, 1, "float32", 4)  \
  X(kUInt8, 2, "uint8", 1)      \
  X(kInt8, 3, "int8", 1)        \
  X(kUInt16, 4, "uint16", 2)    \
  X(kInt16, 5, "int16", 2)      \
  X(kInt32, 6, "int32", 4)      \
  X(kInt64, 7, "int64", 8)      \
  X(kBool, 9, "bool", 1)        \
  X(kFloat16, 10, "float16", 2) \
  X(kFloat64, 11, "float64", 8) \
  X(kUInt32, 12, "uint32", 4)   \
  X(kUInt64, 13, "uint64", 8)   \
  X(kBFloat16, 16, "bfloat16", 2)

enum class DType : uint8_t {
  kUndefined = 0,
#define KILN_DTYPE_ENUM(name, code, str, size) name = code,
  KILN_DTYPES(KILN_DTYPE_ENUM)
#undef KILN_DTYPE_ENUM
};

// 0 for kUndefined and for codes kiln does not know.
size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
// Maps an ONNX TensorProto.DataType code; kUndefined when kiln does not support it.
DType dtype_from_onnx(int32_t code);
bool is_float(DType dtype);
bool is_integer(DType dtype);

// IEEE half and bfloat16 conversions (round to nearest even), used by reference kernels and
// loaders.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
inline float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16(float f);

}  // namespace kiln
