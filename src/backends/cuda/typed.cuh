// Typed dispatch for CUDA kernels that instantiate per storage type (as the CPU reference's
// dtype_dispatch.h does): the type each storage type computes in (DNum<T>), dtype sets, and
// visit_dtype<kSet>(dtype, f), which calls f(T{}) for the storage type of the dtype.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace kiln::backends::cuda {

template <typename T>
struct DNum {
  using C = T;
  __device__ static C load(T v) { return v; }
  __device__ static T store(C c) { return c; }
};
template <>
struct DNum<__half> {
  using C = float;
  __device__ static float load(__half v) { return __half2float(v); }
  __device__ static __half store(float c) { return __float2half_rn(c); }
};
template <>
struct DNum<__nv_bfloat16> {
  using C = float;
  __device__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 store(float c) { return __float2bfloat16_rn(c); }
};

// Integer arithmetic wraps (two's complement) instead of overflowing into undefined behaviour.
template <typename C>
using WideOf = std::conditional_t<(sizeof(C) < 4), uint32_t, std::make_unsigned_t<C>>;

enum : unsigned {
  kTF32 = 1u << 0,
  kTF64 = 1u << 1,
  kTF16 = 1u << 2,
  kTBF16 = 1u << 3,
  kTI8 = 1u << 4,
  kTU8 = 1u << 5,
  kTI16 = 1u << 6,
  kTU16 = 1u << 7,
  kTI32 = 1u << 8,
  kTU32 = 1u << 9,
  kTI64 = 1u << 10,
  kTU64 = 1u << 11,
  kTBool = 1u << 12,  // stored as uint8_t
};
inline constexpr unsigned kTFloats = kTF32 | kTF64 | kTF16 | kTBF16;
inline constexpr unsigned kTInts = kTI8 | kTU8 | kTI16 | kTU16 | kTI32 | kTU32 | kTI64 | kTU64;
inline constexpr unsigned kTNumeric = kTFloats | kTInts;

// The set bit of a dtype; 0 for dtypes no typed kernel stores.
inline unsigned dtype_bit(DType dt) {
  switch (dt) {
    case DType::kFloat32:
      return kTF32;
    case DType::kFloat64:
      return kTF64;
    case DType::kFloat16:
      return kTF16;
    case DType::kBFloat16:
      return kTBF16;
    case DType::kInt8:
      return kTI8;
    case DType::kUInt8:
      return kTU8;
    case DType::kInt16:
      return kTI16;
    case DType::kUInt16:
      return kTU16;
    case DType::kInt32:
      return kTI32;
    case DType::kUInt32:
      return kTU32;
    case DType::kInt64:
      return kTI64;
    case DType::kUInt64:
      return kTU64;
    case DType::kBool:
      return kTBool;
    default:
      return 0;
  }
}

// Calls f(T{}) for the storage type of dt when kSet holds it; false when it does not.
template <unsigned kSet, typename F>
bool visit_dtype(DType dt, F&& f) {
#define KILN_TYPED_CASE(bit, T)          \
  if (dtype_bit(dt) == (bit)) {          \
    if constexpr ((kSet & (bit)) != 0) { \
      f(T{});                            \
      return true;                       \
    }                                    \
    return false;                        \
  }
  KILN_TYPED_CASE(kTF32, float)
  KILN_TYPED_CASE(kTF64, double)
  KILN_TYPED_CASE(kTF16, __half)
  KILN_TYPED_CASE(kTBF16, __nv_bfloat16)
  KILN_TYPED_CASE(kTI8, int8_t)
  KILN_TYPED_CASE(kTU8, uint8_t)
  KILN_TYPED_CASE(kTI16, int16_t)
  KILN_TYPED_CASE(kTU16, uint16_t)
  KILN_TYPED_CASE(kTI32, int32_t)
  KILN_TYPED_CASE(kTU32, uint32_t)
  KILN_TYPED_CASE(kTI64, int64_t)
  KILN_TYPED_CASE(kTU64, uint64_t)
  KILN_TYPED_CASE(kTBool, uint8_t)
#undef KILN_TYPED_CASE
  return false;
}

}  // namespace kiln::backends::cuda
