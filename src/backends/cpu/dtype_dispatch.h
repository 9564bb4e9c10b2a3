// Typed dispatch for CPU kernels: storage types (F16, BF16, Bool8), the type each computes in
// (Num<T>), and dispatch<kSet>(dtype, op, f), which calls f(Tag<T>{}) for the dtype's storage type.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "core/dtype.h"
#include "core/status.h"
#include "ops/schema.h"

namespace kiln::backends::cpu {

// Storage types with their own meaning; plain C++ arithmetic types stand for themselves.
struct F16 {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};
struct Bool8 {
  uint8_t v;
};

// Num<T>: the type T computes in, and conversions to and from it.
template <typename T>
struct Num {
  using C = T;
  static C load(T x) { return x; }
  static T store(C c) { return c; }
};
template <>
struct Num<F16> {
  using C = float;
  static float load(F16 x) { return half_to_float(x.bits); }
  static F16 store(float c) { return F16{float_to_half(c)}; }
};
template <>
struct Num<BF16> {
  using C = float;
  static float load(BF16 x) { return bf16_to_float(x.bits); }
  static BF16 store(float c) { return BF16{float_to_bf16(c)}; }
};
template <>
struct Num<Bool8> {
  using C = bool;
  static bool load(Bool8 x) { return x.v != 0; }
  static Bool8 store(bool c) { return Bool8{uint8_t(c)}; }
};

template <typename T>
struct Tag {
  using type = T;
};

enum : unsigned {
  kF32 = 1u << 0,
  kF64 = 1u << 1,
  kF16 = 1u << 2,
  kBF16 = 1u << 3,
  kI8 = 1u << 4,
  kU8 = 1u << 5,
  kI32 = 1u << 6,
  kI64 = 1u << 7,
  kBool = 1u << 8,
  kI16 = 1u << 9,
  kU16 = 1u << 10,
  kU32 = 1u << 11,
  kU64 = 1u << 12,
};
constexpr unsigned kFloats = kF32 | kF64 | kF16 | kBF16;
constexpr unsigned kSigned = kFloats | kI8 | kI16 | kI32 | kI64;
constexpr unsigned kNumeric = kSigned | kU8 | kU16 | kU32 | kU64;
constexpr unsigned kAll = kNumeric | kBool;

inline std::string name_of(ops::OpKind op) { return std::string(ops::op_name(op)); }

// Calls f(Tag<T>{}) for the storage type T of `dt` when kSet allows it.
template <unsigned kSet, typename F>
Status dispatch(DType dt, ops::OpKind op, F&& f) {
#define KILN_DTYPE_CASE(bit, dtype, T)                     \
  case DType::dtype:                                       \
    if constexpr ((kSet & (bit)) != 0) return f(Tag<T>{}); \
    break;
  switch (dt) {
    KILN_DTYPE_CASE(kF32, kFloat32, float)
    KILN_DTYPE_CASE(kF64, kFloat64, double)
    KILN_DTYPE_CASE(kF16, kFloat16, F16)
    KILN_DTYPE_CASE(kBF16, kBFloat16, BF16)
    KILN_DTYPE_CASE(kI8, kInt8, int8_t)
    KILN_DTYPE_CASE(kU8, kUInt8, uint8_t)
    KILN_DTYPE_CASE(kI16, kInt16, int16_t)
    KILN_DTYPE_CASE(kU16, kUInt16, uint16_t)
    KILN_DTYPE_CASE(kI32, kInt32, int32_t)
    KILN_DTYPE_CASE(kU32, kUInt32, uint32_t)
    KILN_DTYPE_CASE(kI64, kInt64, int64_t)
    KILN_DTYPE_CASE(kU64, kUInt64, uint64_t)
    KILN_DTYPE_CASE(kBool, kBool, Bool8)
    default:
      break;
  }
#undef KILN_DTYPE_CASE
  return unsupported(name_of(op) + ": dtype " + std::string(dtype_name(dt)) +
                     " is not supported by the CPU kernel");
}

// Integer arithmetic wraps (two's complement) instead of overflowing into undefined behavior.
template <typename C>
using Wide = std::conditional_t<(sizeof(C) < 4), uint32_t, std::make_unsigned_t<C>>;

}  // namespace kiln::backends::cpu
