// Element access by runtime dtype for CPU reference kernels that compute in double: load_f64 and
// store_f64 over every numeric dtype (float16/bfloat16 through float, integers with saturation).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln::backends::cpu {

inline bool is_numeric_dtype(DType dt) {
  switch (dt) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kInt16:
    case DType::kUInt16:
    case DType::kInt32:
    case DType::kUInt32:
    case DType::kInt64:
    case DType::kUInt64:
    case DType::kBool:
      return true;
    default:
      return false;
  }
}

inline double load_f64(const TensorView& v, int64_t i) {
  const void* p = v.data;
  switch (v.dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(p)[i];
    case DType::kFloat64:
      return static_cast<const double*>(p)[i];
    case DType::kFloat16:
      return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kBFloat16:
      return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kInt8:
      return static_cast<const int8_t*>(p)[i];
    case DType::kUInt8:
      return static_cast<const uint8_t*>(p)[i];
    case DType::kInt16:
      return static_cast<const int16_t*>(p)[i];
    case DType::kUInt16:
      return static_cast<const uint16_t*>(p)[i];
    case DType::kInt32:
      return static_cast<const int32_t*>(p)[i];
    case DType::kUInt32:
      return static_cast<const uint32_t*>(p)[i];
    case DType::kInt64:
      return double(static_cast<const int64_t*>(p)[i]);
    case DType::kUInt64:
      return double(static_cast<const uint64_t*>(p)[i]);
    case DType::kBool:
      return static_cast<const uint8_t*>(p)[i] != 0;
    default:
      return NAN;
  }
}

// Integers saturate (and NaN becomes 0) so that out-of-range values never invoke undefined
// conversions; callers round first where the op says how.
template <typename I>
I saturate(double x) {
  if (std::isnan(x)) return I(0);
  if (x <= double(std::numeric_limits<I>::lowest())) return std::numeric_limits<I>::lowest();
  if (x >= double(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return I(x);
}

inline void store_f64(const TensorView& v, int64_t i, double x) {
  void* p = v.data;
  switch (v.dtype) {
    case DType::kFloat32:
      static_cast<float*>(p)[i] = float(x);
      break;
    case DType::kFloat64:
      static_cast<double*>(p)[i] = x;
      break;
    case DType::kFloat16:
      static_cast<uint16_t*>(p)[i] = float_to_half(float(x));
      break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(p)[i] = float_to_bf16(float(x));
      break;
    case DType::kInt8:
      static_cast<int8_t*>(p)[i] = saturate<int8_t>(x);
      break;
    case DType::kUInt8:
      static_cast<uint8_t*>(p)[i] = saturate<uint8_t>(x);
      break;
    case DType::kInt16:
      static_cast<int16_t*>(p)[i] = saturate<int16_t>(x);
      break;
    case DType::kUInt16:
      static_cast<uint16_t*>(p)[i] = saturate<uint16_t>(x);
      break;
    case DType::kInt32:
      static_cast<int32_t*>(p)[i] = saturate<int32_t>(x);
      break;
    case DType::kUInt32:
      static_cast<uint32_t*>(p)[i] = saturate<uint32_t>(x);
      break;
    case DType::kInt64:
      static_cast<int64_t*>(p)[i] = saturate<int64_t>(x);
      break;
    case DType::kUInt64:
      static_cast<uint64_t*>(p)[i] = saturate<uint64_t>(x);
      break;
    case DType::kBool:
      static_cast<uint8_t*>(p)[i] = x != 0;
      break;
    default:
      break;
  }
}

// The whole tensor as doubles (reference kernels that are not on a hot path).
inline std::vector<double> to_f64(const TensorView& v) {
  std::vector<double> out(size_t(v.numel()));
  for (int64_t i = 0; i < v.numel(); ++i) out[size_t(i)] = load_f64(v, i);
  return out;
}

// Reads an integer index tensor (int32 or int64) into a vector; false for other dtypes.
inline bool read_indices(const TensorView& v, std::vector<int64_t>* out) {
  out->clear();
  if (v.dtype != DType::kInt64 && v.dtype != DType::kInt32) return false;
  for (int64_t i = 0; i < v.numel(); ++i) {
    out->push_back(v.dtype == DType::kInt64 ? v.as<const int64_t>()[i] : v.as<const int32_t>()[i]);
  }
  return true;
}

}  // namespace kiln::backends::cpu
