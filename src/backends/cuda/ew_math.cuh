// The scalar math of CUDA's elementwise kernels, one definition for the per-op kernels
// (elementwise.cu) and the fused chains of kiln::Elementwise (fused_elementwise.cu): the op is a
// runtime code (a constant where a kernel is instantiated for one op, so the switch folds),
// computed in C (float for float32, float16 and bfloat16; double; int64).
#pragma once

#include <cmath>
#include <cstdint>

namespace kiln::backends::cuda {

enum class Op : int {
  // binary
  kAdd,
  kSub,
  kMul,
  kDiv,
  kPow,
  kModFloor,
  kModTrunc,
  kEq,
  kLt,
  kLe,
  kGt,
  kGe,
  kAnd,
  kOr,
  kXor,
  // unary
  kNot,
  kNeg,
  kAbs,
  kReciprocal,
  kSqrt,
  kExp,
  kLog,
  kErf,
  kRelu,
  kSigmoid,
  kTanh,
  kHardSigmoid,
  kHardSwish,
  kSin,
  kCos,
  kIsNaN,
  kIsInf,
  kFloor,
  kCeil,
  kLeakyRelu,
  kClip,
  kSoftplus,
  kElu,
  kGelu,
  kGeluTanh,
  kSign,
  kRound,
  kCopy
};

template <typename C>
__device__ __forceinline__ C int_pow(C base, C ec) {
  int64_t e = int64_t(ec);
  if (e < 0) {
    if (base == C(1)) return C(1);
    if (base == C(-1)) return (e & 1) ? C(-1) : C(1);
    return C(0);
  }
  C r = 1;
  while (e > 0) {
    if (e & 1) r = C(r * base);
    base = C(base * base);
    e >>= 1;
  }
  return r;
}

template <typename C>
__device__ __forceinline__ C binary_op(Op op, C a, C b) {
  constexpr bool kFloat = !(C(0.5) == C(0));
  switch (op) {
    case Op::kAdd:
      return a + b;
    case Op::kSub:
      return a - b;
    case Op::kMul:
      return a * b;
    case Op::kDiv:
      if constexpr (kFloat) {
        return a / b;
      } else {
        if (b == 0) return 0;
        if (b == -1) return C(0) - a;
        return a / b;
      }
    case Op::kPow:
      if constexpr (kFloat) {
        return pow(a, b);
      } else {
        return int_pow(a, b);
      }
    case Op::kModFloor:
    case Op::kModTrunc: {
      C r;
      if constexpr (kFloat) {
        r = fmod(a, b);
      } else {
        if (b == 0 || b == -1) return 0;
        r = a % b;
      }
      if (op == Op::kModFloor && r != 0 && ((r < 0) != (b < 0))) r = r + b;
      return r;
    }
    case Op::kEq:
      return C(a == b);
    case Op::kLt:
      return C(a < b);
    case Op::kLe:
      return C(a <= b);
    case Op::kGt:
      return C(a > b);
    case Op::kGe:
      return C(a >= b);
    case Op::kAnd:
      return C(a != C(0) && b != C(0));
    case Op::kOr:
      return C(a != C(0) || b != C(0));
    case Op::kXor:
      return C((a != C(0)) != (b != C(0)));
    default:
      return 0;
  }
}

template <typename C>
__device__ __forceinline__ C unary_op(Op op, C x, float alpha, float beta) {
  constexpr bool kFloat = !(C(0.5) == C(0));
  switch (op) {
    case Op::kNot:
      return C(x == C(0));
    case Op::kNeg:
      return C(0) - x;
    case Op::kAbs:
      return x < C(0) ? C(0) - x : x;
    case Op::kSign:
      return C(x > C(0)) - C(x < C(0));
    case Op::kRelu:
      return x > C(0) ? x : C(0);
    case Op::kCopy:
      return x;
    case Op::kClip: {
      // min(max(x, lo), hi): when lo > hi every element becomes hi, as ONNX specifies.
      C v = x < C(alpha) ? C(alpha) : x;
      return v > C(beta) ? C(beta) : v;
    }
    default:
      break;
  }
  if constexpr (kFloat) {
    switch (op) {
      case Op::kReciprocal:
        return C(1) / x;
      case Op::kSqrt:
        return sqrt(x);
      case Op::kExp:
        return exp(x);
      case Op::kLog:
        return log(x);
      case Op::kErf:
        return erf(x);
      case Op::kSigmoid:
        if (x >= C(0))
          return C(1) / (C(1) + exp(-x));
        else {
          C e = exp(x);
          return e / (C(1) + e);
        }
      case Op::kTanh:
        return tanh(x);
      case Op::kHardSigmoid:
        return fmax(C(0), fmin(C(1), C(alpha) * x + C(beta)));
      case Op::kHardSwish:
        return x * fmax(C(0), fmin(C(1), x / C(6) + C(0.5)));
      case Op::kSin:
        return sin(x);
      case Op::kCos:
        return cos(x);
      case Op::kIsNaN:
        return C(x != x);
      case Op::kIsInf:
        return C(isinf(x) && ((x > 0 && alpha != 0) || (x < 0 && beta != 0)));
      case Op::kFloor:
        return floor(x);
      case Op::kCeil:
        return ceil(x);
      case Op::kRound:
        return rint(x);
      case Op::kLeakyRelu:
        return x < C(0) ? C(alpha) * x : x;
      case Op::kSoftplus:
        return x > C(0) ? x + log1p(exp(-x)) : log1p(exp(x));
      case Op::kElu:
        return x < C(0) ? C(alpha) * expm1(x) : x;
      case Op::kGelu:
        return C(0.5) * x * (C(1) + erf(x * C(0.70710678118654752440)));
      case Op::kGeluTanh:
        return C(0.5) * x *
               (C(1) + tanh(C(0.79788456080286535588) * (x + C(0.044715) * x * x * x)));
      default:
        return x;
    }
  }
  return x;
}

// A unary step whose result is rounded to float16 or bfloat16 (2^-11 and 2^-8 relative): exp,
// sigmoid and tanh-GELU from the hardware's exp approximation and a fast division (a few ulp of
// float, far below what the rounding adds); every other op as unary_op<float>. The precise forms
// cost more instructions than a 16-byte vector of eight elements takes to move: a standalone
// float16 Sigmoid ran at 46% of the copy rate on an H200. tanh-GELU is x * sigmoid(2u), the same
// function as 0.5 x (1 + tanh(u)) without tanh's cancellation near 0.
__device__ __forceinline__ float unary_op_rounded(Op op, float x, float alpha, float beta) {
  switch (op) {
    case Op::kExp:
      return __expf(x);
    case Op::kSigmoid:  // 0 where e^-x overflows to infinity, 1 where it underflows
      return __fdividef(1.f, 1.f + __expf(-x));
    case Op::kGeluTanh: {
      const float u = 0.79788456080286535588f * (x + 0.044715f * x * x * x);
      return x * __fdividef(1.f, 1.f + __expf(-2.f * u));
    }
    default:
      return unary_op<float>(op, x, alpha, beta);
  }
}

}  // namespace kiln::backends::cuda
