// Element type tables and fp16/bf16 conversions.
#include "core/dtype.h"

#include <cmath>

namespace kiln {

size_t dtype_size(DType dtype) {
  switch (dtype) {
#define KILN_DTYPE_SIZE(name, code, str, size) \
  case DType::name:                            \
    return size;
    KILN_DTYPES(KILN_DTYPE_SIZE)
#undef KILN_DTYPE_SIZE
    default:
      return 0;
  }
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
#define KILN_DTYPE_NAME(name, code, str, size) \
  case DType::name:                            \
    return str;
    KILN_DTYPES(KILN_DTYPE_NAME)
#undef KILN_DTYPE_NAME
    default:
      return "undefined";
  }
}

DType dtype_from_onnx(int32_t code) {
  switch (code) {
#define KILN_DTYPE_CODE(name, c, str, size) \
  case c:                                   \
    return DType::name;
    KILN_DTYPES(KILN_DTYPE_CODE)
#undef KILN_DTYPE_CODE
    default:
      return DType::kUndefined;
  }
}

bool is_float(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kFloat64 ||
         d == DType::kBFloat16;
}

bool is_integer(DType d) {
  switch (d) {
    case DType::kUInt8:
    case DType::kInt8:
    case DType::kUInt16:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kUInt32:
    case DType::kUInt64:
      return true;
    default:
      return false;
  }
}

float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: renormalize
      float f = std::ldexp(float(mant), -24);
      std::memcpy(&u, &f, 4);
      u |= sign;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  uint32_t abs = u & 0x7fffffff;
  if (abs >= 0x7f800000u) {  // inf or nan
    return uint16_t(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0));
  }
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to inf
  if (abs < 0x38800000u) {                                 // subnormal or zero in half
    float af;
    std::memcpy(&af, &abs, 4);
    float scaled = af * 16777216.0f;  // 2^24
    uint32_t m = uint32_t(std::nearbyint(scaled));
    return uint16_t(sign | m);
  }
  uint32_t mant = abs & 0x7fffff;
  uint32_t exp = (abs >> 23) - 112;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
  return uint16_t(sign | h);
}

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

}  // namespace kiln
