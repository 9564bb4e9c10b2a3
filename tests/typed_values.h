// Test tensors of any numeric dtype from doubles (converted as a C++ cast would, integers wrapping,
// half types by rounding to nearest), for kernel cases that sweep dtypes.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/tensor.h"

namespace kiln::testing {

inline Tensor make_typed(DType dt, Shape shape, const std::vector<double>& v) {
  auto as = [&]<typename T>(T) {
    std::vector<T> out;
    for (double d : v) {
      // Integers go through a 64-bit integer and wrap (defined since C++20): a double outside
      // T's range converts with undefined behaviour, which the UBSan build reports.
      if constexpr (std::is_integral_v<T>) {
        out.push_back(d < 0 ? T(int64_t(d)) : T(uint64_t(d)));
      } else {
        out.push_back(T(d));
      }
    }
    return Tensor::from_vector(dt, std::move(shape), out);
  };
  switch (dt) {
    case DType::kFloat32:
      return as(float{});
    case DType::kFloat64:
      return as(double{});
    case DType::kInt8:
      return as(int8_t{});
    case DType::kUInt8:
      return as(uint8_t{});
    case DType::kBool:
      return as(uint8_t{});
    case DType::kInt16:
      return as(int16_t{});
    case DType::kUInt16:
      return as(uint16_t{});
    case DType::kInt32:
      return as(int32_t{});
    case DType::kUInt32:
      return as(uint32_t{});
    case DType::kInt64:
      return as(int64_t{});
    case DType::kUInt64:
      return as(uint64_t{});
    case DType::kFloat16:
    case DType::kBFloat16: {
      std::vector<uint16_t> out;
      for (double d : v)
        out.push_back(dt == DType::kFloat16 ? float_to_half(float(d)) : float_to_bf16(float(d)));
      return Tensor::from_vector(dt, std::move(shape), out);
    }
    default:
      return Tensor();
  }
}

// A float tensor's values in dtype dt (float16/bfloat16 rounded to nearest): float32 test data
// as float16 or bfloat16 operands, and those back as float32.
inline Tensor as_dtype(const Tensor& t, DType dt) {
  std::vector<double> v(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = t.float_at(i);
  return make_typed(dt, t.shape(), v);
}

// Whether dt is an integer type that holds negative values.
inline bool signed_int(DType dt) {
  return dt == DType::kInt8 || dt == DType::kInt16 || dt == DType::kInt32 || dt == DType::kInt64;
}

}  // namespace kiln::testing
