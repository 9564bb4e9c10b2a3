// CPU reference kernels of the elementwise op family: arithmetic, comparison and logic with numpy
// broadcasting, unary math, Where, Cast, Clip, Identity. float16/bfloat16 compute in float.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "backends/cpu/broadcast.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/dtype_dispatch.h"
#include "backends/cpu/thread_pool.h"
#include "backends/cpu/vector_math.h"
#include "ops/elementwise_program.h"

namespace kiln::backends::cpu {
namespace {

using ops::OpKind;

Status check_io(const KernelArgs& a, size_t num_in, OpKind op) {
  if (a.in.size() < num_in || a.out.empty()) {
    return invalid_argument(name_of(op) + ": expected " + std::to_string(num_in) +
                            " inputs and 1 output");
  }
  for (size_t i = 0; i < num_in; ++i) {
    if (!present(a.in[i]))
      return invalid_argument(name_of(op) + ": input " + std::to_string(i) + " is missing");
  }
  return ok_status();
}

Status expect_dtype(const TensorView& v, DType want, OpKind op, const char* what) {
  if (v.dtype == want) return ok_status();
  return invalid_argument(name_of(op) + ": " + what + " has dtype " +
                          std::string(dtype_name(v.dtype)) + ", expected " +
                          std::string(dtype_name(want)));
}

template <int N>
Status plan_for(const TensorView& out, const std::array<std::span<const int64_t>, N>& ins,
                OpKind op, BroadcastPlan<N>* plan) {
  Status s = make_broadcast_plan<N>(out.shape, ins, plan);
  if (!s.ok()) s.with_context(name_of(op));
  return s;
}

// ---- binary ops ----

enum class Bin {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kModFloor,
  kModTrunc,
  kMax,
  kMin,
  kEq,
  kLt,
  kLe,
  kGt,
  kGe,
  kAnd,
  kOr,
  kXor
};

template <Bin op, typename C>
inline auto bin_apply(C a, C b) {
  constexpr bool kInt = std::is_integral_v<C>;
  if constexpr (op == Bin::kAdd) {
    if constexpr (kInt)
      return C(Wide<C>(a) + Wide<C>(b));
    else
      return C(a + b);
  } else if constexpr (op == Bin::kSub) {
    if constexpr (kInt)
      return C(Wide<C>(a) - Wide<C>(b));
    else
      return C(a - b);
  } else if constexpr (op == Bin::kMul) {
    if constexpr (kInt)
      return C(Wide<C>(a) * Wide<C>(b));
    else
      return C(a * b);
  } else if constexpr (op == Bin::kDiv) {
    if constexpr (kInt) {
      // Integer division by zero is undefined in ONNX; it must not trap here. 0 is the answer.
      if (b == 0) return C(0);
      if constexpr (std::is_signed_v<C>) {
        if (b == -1) return C(Wide<C>(0) - Wide<C>(a));
      }
      return C(a / b);  // truncates toward zero, as ONNX specifies
    } else {
      return C(a / b);
    }
  } else if constexpr (op == Bin::kModFloor || op == Bin::kModTrunc) {
    C r;
    if constexpr (kInt) {
      if (b == 0) return C(0);
      if constexpr (std::is_signed_v<C>) {
        if (b == -1) return C(0);
      }
      r = C(a % b);
    } else {
      r = std::fmod(a, b);
    }
    if constexpr (op == Bin::kModFloor && std::is_signed_v<C>) {
      if (r != 0 && ((r < 0) != (b < 0))) r = C(r + b);  // result takes the divisor's sign
      // Floats (opset 28, as numpy's mod): a zero remainder takes the divisor's sign too.
      if constexpr (!kInt) {
        if (r == 0) r = std::copysign(C(0), b);
      }
    }
    return r;
  } else if constexpr (op == Bin::kMax) {
    if constexpr (kInt)
      return a > b ? a : b;
    else
      return (a > b || a != a) ? a : b;  // NOLINT(misc-redundant-expression): NaN wins
  } else if constexpr (op == Bin::kMin) {
    if constexpr (kInt)
      return a < b ? a : b;
    else
      return (a < b || a != a) ? a : b;  // NOLINT(misc-redundant-expression): NaN wins
  } else if constexpr (op == Bin::kEq) {
    return a == b;
  } else if constexpr (op == Bin::kLt) {
    return a < b;
  } else if constexpr (op == Bin::kLe) {
    return a <= b;
  } else if constexpr (op == Bin::kGt) {
    return a > b;
  } else if constexpr (op == Bin::kGe) {
    return a >= b;
  } else if constexpr (op == Bin::kAnd) {
    return bool(a) && bool(b);
  } else if constexpr (op == Bin::kOr) {
    return bool(a) || bool(b);
  } else {
    return bool(a) != bool(b);
  }
}

constexpr bool is_predicate(Bin op) { return op >= Bin::kEq; }

// Two same-dtype inputs, broadcast; the output has their dtype, or bool for predicates.
template <OpKind kOp, Bin op, unsigned kSet>
Status binary_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_io(a, 2, kOp));
  const TensorView& x = a.in[0];
  const TensorView& y = a.in[1];
  const TensorView& out = a.out[0];
  KILN_RETURN_IF_ERROR(expect_dtype(y, x.dtype, kOp, "input 1"));
  KILN_RETURN_IF_ERROR(
      expect_dtype(out, is_predicate(op) ? DType::kBool : x.dtype, kOp, "output 0"));
  BroadcastPlan<2> plan;
  KILN_RETURN_IF_ERROR(plan_for<2>(out, {x.shape, y.shape}, kOp, &plan));
  return dispatch<kSet>(x.dtype, kOp, [&]<typename T>(Tag<T>) {
    using N = Num<T>;
    using C = typename N::C;
    if constexpr (is_predicate(op)) {
      rows2(plan, x.as<T>(), y.as<T>(), out.as<uint8_t>(),
            [](T u, T v) { return uint8_t(bin_apply<op, C>(N::load(u), N::load(v))); });
    } else {
      rows2(plan, x.as<T>(), y.as<T>(), out.as<T>(),
            [](T u, T v) { return N::store(bin_apply<op, C>(N::load(u), N::load(v))); });
    }
    return ok_status();
  });
}

Status mod_kernel(const KernelArgs& a) {
  KILN_ASSIGN_OR_RETURN(int64_t fmod, a.attrs.get_int("fmod", 0));
  if (fmod != 0) return binary_kernel<OpKind::kMod, Bin::kModTrunc, kNumeric>(a);
  return binary_kernel<OpKind::kMod, Bin::kModFloor, kNumeric>(a);
}

// Max and Min fold their inputs pairwise into the output; a single input is max(x, x) = x.
template <OpKind kOp, Bin op>
Status variadic_kernel(const KernelArgs& a) {
  if (a.in.empty() || a.out.empty())
    return invalid_argument(name_of(kOp) + ": needs inputs and 1 output");
  std::array<TensorView, 2> pair{a.in[0], a.in.size() > 1 ? a.in[1] : a.in[0]};
  KILN_RETURN_IF_ERROR((binary_kernel<kOp, op, kNumeric>(KernelArgs{a.attrs, pair, a.out})));
  for (size_t k = 2; k < a.in.size(); ++k) {
    pair = {a.out[0], a.in[k]};
    KILN_RETURN_IF_ERROR((binary_kernel<kOp, op, kNumeric>(KernelArgs{a.attrs, pair, a.out})));
  }
  return ok_status();
}

// ---- Pow: base and exponent may have different dtypes ----

// float -> integer conversion without undefined behavior: NaN is 0, out-of-range saturates to the
// int64 range, and narrower targets then wrap as integer casts do (matching numpy on common cases).
template <typename D, typename F>
D float_to_int(F f) {
  if (f != f) return D(0);  // NOLINT(misc-redundant-expression): NaN, for every float type
  if constexpr (std::is_same_v<D, uint64_t>) {
    if (f >= F(18446744073709551616.0)) return std::numeric_limits<uint64_t>::max();
    if (f >= F(0)) return uint64_t(f);
  }
  int64_t i;
  if (f >= F(9223372036854775807.0)) {
    i = std::numeric_limits<int64_t>::max();
  } else if (f <= F(-9223372036854775807.0)) {
    i = std::numeric_limits<int64_t>::min();
  } else {
    i = int64_t(f);
  }
  return D(i);
}

template <typename C>
C int_pow(C base, int64_t e) {
  if (e < 0) {
    if (base == 1) return C(1);
    if constexpr (std::is_signed_v<C>) {
      if (base == -1) return (e & 1) ? C(-1) : C(1);
    }
    return C(0);
  }
  Wide<C> r = 1, b = Wide<C>(base);
  while (e > 0) {
    if (e & 1) r = Wide<C>(r * b);
    b = Wide<C>(b * b);
    e >>= 1;
  }
  return C(r);
}

constexpr unsigned kPowTypes = kF32 | kF64 | kF16 | kBF16 | kI32 | kI64;
// The exponent (T1) also takes the narrow and unsigned integers.
constexpr unsigned kPowExponentTypes = kPowTypes | kI8 | kI16 | kU8 | kU16 | kU32 | kU64;

Status pow_kernel(const KernelArgs& a) {
  constexpr OpKind kOp = OpKind::kPow;
  KILN_RETURN_IF_ERROR(check_io(a, 2, kOp));
  const TensorView& x = a.in[0];
  const TensorView& y = a.in[1];
  const TensorView& out = a.out[0];
  KILN_RETURN_IF_ERROR(expect_dtype(out, x.dtype, kOp, "output 0"));
  // x ** 2 on float32 (RMSNorm and variance as exporters write them): x * x, the correctly rounded
  // square, over the thread pool.
  if (x.dtype == DType::kFloat32 && y.dtype == DType::kFloat32 && y.numel() == 1 &&
      *y.as<float>() == 2.0f && out.numel() == x.numel()) {
    const float* src = x.as<float>();
    float* dst = out.as<float>();
    parallel_chunks(x.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) dst[i] = src[i] * src[i];
    });
    return ok_status();
  }
  BroadcastPlan<2> plan;
  KILN_RETURN_IF_ERROR(plan_for<2>(out, {x.shape, y.shape}, kOp, &plan));
  return dispatch<kPowTypes>(x.dtype, kOp, [&]<typename T>(Tag<T>) {
    return dispatch<kPowExponentTypes>(y.dtype, kOp, [&]<typename E>(Tag<E>) {
      using C = typename Num<T>::C;
      using CE = typename Num<E>::C;
      rows2(plan, x.as<T>(), y.as<E>(), out.as<T>(), [](T u, E v) {
        C b = Num<T>::load(u);
        CE e = Num<E>::load(v);
        if constexpr (std::is_floating_point_v<C>) {
          return Num<T>::store(C(std::pow(b, C(e))));
        } else if constexpr (std::is_floating_point_v<CE>) {
          return float_to_int<T>(std::pow(double(b), double(e)));
        } else {
          // A uint64 exponent past int64's range keeps its parity (all that matters for |b| <= 1).
          if constexpr (std::is_unsigned_v<CE> && sizeof(CE) == 8) {
            if (e > CE(INT64_MAX)) return int_pow<C>(b, INT64_MAX - 1 + int64_t(e & 1));
          }
          return int_pow<C>(b, int64_t(e));
        }
      });
      return ok_status();
    });
  });
}

// ---- unary ops ----

enum class Un {
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
  kFloor,
  kCeil,
  kLeakyRelu,
  kSoftplus,
  kElu,
  kGelu,
  kGeluTanh,
  kSign,
  kRound
};

struct UnParams {
  float alpha = 0;
  float beta = 0;
};

template <Un op, typename C>
inline C un_apply(C x, const UnParams& p) {
  if constexpr (op == Un::kNeg) {
    if constexpr (std::is_integral_v<C>)
      return C(Wide<C>(0) - Wide<C>(x));
    else
      return -x;
  } else if constexpr (op == Un::kAbs) {
    if constexpr (std::is_unsigned_v<C>) {
      return x;
    } else if constexpr (std::is_integral_v<C>) {
      return x < 0 ? C(Wide<C>(0) - Wide<C>(x)) : x;
    } else {
      return std::fabs(x);
    }
  } else if constexpr (op == Un::kSign) {
    if constexpr (std::is_unsigned_v<C>) {
      return C(x > 0);
    } else {
      return x > 0 ? C(1) : (x < 0 ? C(-1) : x);  // keeps 0 and NaN
    }
  } else if constexpr (op == Un::kRelu) {
    return x < C(0) ? C(0) : x;  // NaN passes through
  } else if constexpr (op == Un::kReciprocal) {
    return C(1) / x;
  } else if constexpr (op == Un::kSqrt) {
    return std::sqrt(x);
  } else if constexpr (op == Un::kExp) {
    return std::exp(x);
  } else if constexpr (op == Un::kLog) {
    return std::log(x);
  } else if constexpr (op == Un::kErf) {
    return std::erf(x);
  } else if constexpr (op == Un::kSigmoid) {
    // Both branches avoid exp overflow for large |x|.
    if (x >= C(0)) return C(1) / (C(1) + std::exp(-x));
    C e = std::exp(x);
    return e / (C(1) + e);
  } else if constexpr (op == Un::kTanh) {
    return std::tanh(x);
  } else if constexpr (op == Un::kHardSigmoid) {
    return std::fmax(C(0), std::fmin(C(1), C(p.alpha) * x + C(p.beta)));
  } else if constexpr (op == Un::kHardSwish) {
    // x/6 + 1/2 as (x + 3) * (1/6): a multiplication where a division by 6 cost MobileNetV3-small
    // 7% of its time at batch 1 (double division, 2 cores); exactly 0 at -3 and 1 at 3.
    return x * std::fmax(C(0), std::fmin(C(1), (x + C(3)) * (C(1) / C(6))));
  } else if constexpr (op == Un::kSin) {
    return std::sin(x);
  } else if constexpr (op == Un::kCos) {
    return std::cos(x);
  } else if constexpr (op == Un::kFloor) {
    return std::floor(x);
  } else if constexpr (op == Un::kCeil) {
    return std::ceil(x);
  } else if constexpr (op == Un::kRound) {
    return std::nearbyint(x);  // the default rounding mode rounds halves to even, as ONNX wants
  } else if constexpr (op == Un::kLeakyRelu) {
    return x < C(0) ? C(p.alpha) * x : x;
  } else if constexpr (op == Un::kSoftplus) {
    return x > C(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
  } else if constexpr (op == Un::kElu) {
    return x < C(0) ? C(p.alpha) * std::expm1(x) : x;
  } else if constexpr (op == Un::kGelu) {
    return C(0.5) * x * (C(1) + std::erf(x * C(0.70710678118654752440)));
  } else {
    static_assert(op == Un::kGeluTanh);
    constexpr C kSqrt2OverPi = C(0.79788456080286535588);
    return C(0.5) * x * (C(1) + std::tanh(kSqrt2OverPi * (x + C(0.044715) * x * x * x)));
  }
}

Status same_size(const TensorView& in, const TensorView& out, OpKind op) {
  if (in.numel() == out.numel()) return ok_status();
  return invalid_argument(name_of(op) + ": output shape " + shape_to_string(out.shape) +
                          " does not match input shape " + shape_to_string(in.shape));
}

template <OpKind kOp, Un op, unsigned kSet>
Status unary_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_io(a, 1, kOp));
  const TensorView& x = a.in[0];
  const TensorView& out = a.out[0];
  KILN_RETURN_IF_ERROR(expect_dtype(out, x.dtype, kOp, "output 0"));
  KILN_RETURN_IF_ERROR(same_size(x, out, kOp));
  UnParams p;
  if constexpr (op == Un::kLeakyRelu) {
    KILN_ASSIGN_OR_RETURN(p.alpha, a.attrs.get_float("alpha", 0.01f));
  } else if constexpr (op == Un::kElu) {
    KILN_ASSIGN_OR_RETURN(p.alpha, a.attrs.get_float("alpha", 1.0f));
  } else if constexpr (op == Un::kHardSigmoid) {
    KILN_ASSIGN_OR_RETURN(p.alpha, a.attrs.get_float("alpha", 0.2f));
    KILN_ASSIGN_OR_RETURN(p.beta, a.attrs.get_float("beta", 0.5f));
  }
  return dispatch<kSet>(x.dtype, kOp, [&]<typename T>(Tag<T>) {
    using N = Num<T>;
    const T* src = x.as<T>();
    T* dst = out.as<T>();
    parallel_chunks(x.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) dst[i] = N::store(un_apply<op>(N::load(src[i]), p));
    });
    return ok_status();
  });
}

// Sigmoid, Erf and Gelu of float32 through the vectorized forms (vector_math.h) over the thread
// pool; the other types as the other unary ops.
template <OpKind kOp, Un op, void (*kVector)(const float*, float*, int64_t)>
Status vector_unary_kernel(const KernelArgs& a) {
  if (a.in.size() == 1 && a.out.size() == 1 && a.in[0].dtype == DType::kFloat32 &&
      a.out[0].dtype == DType::kFloat32 && a.in[0].numel() == a.out[0].numel()) {
    const float* x = a.in[0].as<float>();
    float* y = a.out[0].as<float>();
    parallel_chunks(a.in[0].numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
      kVector(x + begin, y + begin, end - begin);
    });
    return ok_status();
  }
  return unary_kernel<kOp, op, kFloats>(a);
}

Status gelu_kernel(const KernelArgs& a) {
  KILN_ASSIGN_OR_RETURN(std::string approx, a.attrs.get_string("approximate", "none"));
  if (approx == "tanh") return unary_kernel<OpKind::kGelu, Un::kGeluTanh, kFloats>(a);
  if (approx != "none") return invalid_argument("Gelu: approximate must be 'none' or 'tanh'");
  // float32 through the vectorized form (vector_math.h), ~10x the scalar erf's speed.
  return vector_unary_kernel<OpKind::kGelu, Un::kGelu, &gelu_erf_f32>(a);
}

// IsNaN and IsInf: float in, bool out.
template <OpKind kOp>
Status isnan_isinf_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_io(a, 1, kOp));
  const TensorView& x = a.in[0];
  const TensorView& out = a.out[0];
  KILN_RETURN_IF_ERROR(expect_dtype(out, DType::kBool, kOp, "output 0"));
  KILN_RETURN_IF_ERROR(same_size(x, out, kOp));
  bool pos = true, neg = true;
  if constexpr (kOp == OpKind::kIsInf) {
    KILN_ASSIGN_OR_RETURN(int64_t dp, a.attrs.get_int("detect_positive", 1));
    KILN_ASSIGN_OR_RETURN(int64_t dn, a.attrs.get_int("detect_negative", 1));
    pos = dp != 0;
    neg = dn != 0;
  }
  return dispatch<kFloats>(x.dtype, kOp, [&]<typename T>(Tag<T>) {
    const T* src = x.as<T>();
    uint8_t* dst = out.as<uint8_t>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) {
      auto v = Num<T>::load(src[i]);
      if constexpr (kOp == OpKind::kIsNaN) {
        dst[i] = std::isnan(v);
      } else {
        dst[i] = std::isinf(v) && ((v > 0 && pos) || (v < 0 && neg));
      }
    }
    return ok_status();
  });
}

// Not: bool in, bool out.
Status not_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_io(a, 1, OpKind::kNot));
  KILN_RETURN_IF_ERROR(expect_dtype(a.in[0], DType::kBool, OpKind::kNot, "input 0"));
  KILN_RETURN_IF_ERROR(expect_dtype(a.out[0], DType::kBool, OpKind::kNot, "output 0"));
  KILN_RETURN_IF_ERROR(same_size(a.in[0], a.out[0], OpKind::kNot));
  const uint8_t* src = a.in[0].as<uint8_t>();
  uint8_t* dst = a.out[0].as<uint8_t>();
  for (int64_t i = 0, n = a.in[0].numel(); i < n; ++i) dst[i] = src[i] == 0;
  return ok_status();
}

// ---- Clip: bounds from optional scalar inputs (opset >= 11) or from attributes (before) ----

Status clip_kernel(const KernelArgs& a) {
  constexpr OpKind kOp = OpKind::kClip;
  KILN_RETURN_IF_ERROR(check_io(a, 1, kOp));
  const TensorView& x = a.in[0];
  const TensorView& out = a.out[0];
  KILN_RETURN_IF_ERROR(expect_dtype(out, x.dtype, kOp, "output 0"));
  KILN_RETURN_IF_ERROR(same_size(x, out, kOp));
  for (size_t i = 1; i < a.in.size() && i < 3; ++i) {
    if (!present(a.in[i])) continue;
    KILN_RETURN_IF_ERROR(
        expect_dtype(a.in[i], x.dtype, kOp, i == 1 ? "input 1 (min)" : "input 2 (max)"));
    if (a.in[i].numel() != 1) return invalid_argument("Clip: min and max must have one element");
  }
  return dispatch<kNumeric>(x.dtype, kOp, [&]<typename T>(Tag<T>) -> Status {
    using N = Num<T>;
    using C = typename N::C;
    using L = std::numeric_limits<C>;
    C lo = L::has_infinity ? -L::infinity() : L::lowest();
    C hi = L::has_infinity ? L::infinity() : L::max();
    const char* names[2] = {"min", "max"};
    C* bounds[2] = {&lo, &hi};
    for (int k = 0; k < 2; ++k) {
      size_t i = size_t(k) + 1;
      if (i < a.in.size() && present(a.in[i])) {
        *bounds[k] = N::load(a.in[i].as<T>()[0]);
      } else if (a.attrs.has(names[k])) {
        KILN_ASSIGN_OR_RETURN(float f, a.attrs.get_float(names[k], std::nullopt));
        if constexpr (std::is_floating_point_v<C>) {
          *bounds[k] = C(f);
        } else {
          *bounds[k] = float_to_int<C>(f);
        }
      }
    }
    const T* src = x.as<T>();
    T* dst = out.as<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
      // min(max(x, lo), hi): when lo > hi every element becomes hi, as ONNX specifies.
      C v = N::load(src[i]);
      v = v < lo ? lo : v;  // NaN passes through
      dst[i] = N::store(v > hi ? hi : v);
    }
    return ok_status();
  });
}

// ---- Where: selects bytes, so it dispatches on element size only ----

template <typename T>
void where_rows(const BroadcastPlan<3>& plan, const uint8_t* pc, const T* px, const T* py, T* po) {
  for_each_row(plan, [&](int64_t o, const std::array<int64_t, 3>& off, int64_t n,
                         const std::array<int64_t, 3>& s) {
    const uint8_t* c = pc + off[0];
    const T* x = px + off[1];
    const T* y = py + off[2];
    T* z = po + o;
    if (s[0] == 1 && s[1] == 1 && s[2] == 1) {
      for (int64_t i = 0; i < n; ++i) z[i] = c[i] ? x[i] : y[i];
    } else {
      for (int64_t i = 0; i < n; ++i) z[i] = c[i * s[0]] ? x[i * s[1]] : y[i * s[2]];
    }
  });
}

Status where_kernel(const KernelArgs& a) {
  constexpr OpKind kOp = OpKind::kWhere;
  KILN_RETURN_IF_ERROR(check_io(a, 3, kOp));
  const TensorView& c = a.in[0];
  const TensorView& x = a.in[1];
  const TensorView& y = a.in[2];
  const TensorView& out = a.out[0];
  KILN_RETURN_IF_ERROR(expect_dtype(c, DType::kBool, kOp, "input 0 (condition)"));
  KILN_RETURN_IF_ERROR(expect_dtype(y, x.dtype, kOp, "input 2"));
  KILN_RETURN_IF_ERROR(expect_dtype(out, x.dtype, kOp, "output 0"));
  BroadcastPlan<3> plan;
  KILN_RETURN_IF_ERROR(plan_for<3>(out, {c.shape, x.shape, y.shape}, kOp, &plan));
  const uint8_t* pc = c.as<uint8_t>();
  switch (dtype_size(x.dtype)) {
    case 1:
      where_rows(plan, pc, x.as<uint8_t>(), y.as<uint8_t>(), out.as<uint8_t>());
      break;
    case 2:
      where_rows(plan, pc, x.as<uint16_t>(), y.as<uint16_t>(), out.as<uint16_t>());
      break;
    case 4:
      where_rows(plan, pc, x.as<uint32_t>(), y.as<uint32_t>(), out.as<uint32_t>());
      break;
    case 8:
      where_rows(plan, pc, x.as<uint64_t>(), y.as<uint64_t>(), out.as<uint64_t>());
      break;
    default:
      return unsupported("Where: dtype " + std::string(dtype_name(x.dtype)) + " is not supported");
  }
  return ok_status();
}

// ---- Cast ----

template <typename D, typename S>
inline D convert(S s) {
  auto c = Num<S>::load(s);
  using CS = decltype(c);
  using CD = typename Num<D>::C;
  if constexpr (std::is_same_v<D, Bool8>) {
    return Bool8{uint8_t(c != CS(0))};  // NaN is nonzero, so true
  } else if constexpr (std::is_floating_point_v<CD>) {
    return Num<D>::store(CD(c));
  } else if constexpr (std::is_floating_point_v<CS>) {
    return float_to_int<D>(c);
  } else {
    return D(c);  // integer and bool sources: two's complement wrap
  }
}

Status cast_kernel(const KernelArgs& a) {
  constexpr OpKind kOp = OpKind::kCast;
  KILN_RETURN_IF_ERROR(check_io(a, 1, kOp));
  const TensorView& x = a.in[0];
  const TensorView& out = a.out[0];
  KILN_RETURN_IF_ERROR(same_size(x, out, kOp));
  if (x.dtype == out.dtype) {
    if (x.data != out.data && x.nbytes() > 0) std::memcpy(out.data, x.data, x.nbytes());
    return ok_status();
  }
  return dispatch<kAll>(x.dtype, kOp, [&]<typename S>(Tag<S>) {
    return dispatch<kAll>(out.dtype, kOp, [&]<typename D>(Tag<D>) {
      const S* src = x.as<S>();
      D* dst = out.as<D>();
      for (int64_t i = 0, n = x.numel(); i < n; ++i) dst[i] = convert<D>(src[i]);
      return ok_status();
    });
  });
}

Status identity_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_io(a, 1, OpKind::kIdentity));
  const TensorView& x = a.in[0];
  const TensorView& out = a.out[0];
  KILN_RETURN_IF_ERROR(expect_dtype(out, x.dtype, OpKind::kIdentity, "output 0"));
  KILN_RETURN_IF_ERROR(same_size(x, out, OpKind::kIdentity));
  if (x.data != out.data && x.nbytes() > 0) std::memcpy(out.data, x.data, x.nbytes());
  return ok_status();
}

// One instruction of a float32 program over m elements: the reference kernels' arithmetic
// (un_apply/bin_apply in float, the vector_math forms for Sigmoid, Erf and Gelu), so each result
// has the bits the unfused op gives it.
void run_instruction_f32(const ops::EwInstruction& ins, const float* a, const float* b, float* y,
                         int64_t m) {
  using ops::EwOp;
  const UnParams p{ins.alpha, ins.beta};
  auto unary = [&]<Un op>() {
    for (int64_t i = 0; i < m; ++i) y[i] = un_apply<op, float>(a[i], p);
  };
  switch (ins.op) {
    case EwOp::kAdd:
      for (int64_t i = 0; i < m; ++i) y[i] = a[i] + b[i];
      return;
    case EwOp::kSub:
      for (int64_t i = 0; i < m; ++i) y[i] = a[i] - b[i];
      return;
    case EwOp::kMul:
      for (int64_t i = 0; i < m; ++i) y[i] = a[i] * b[i];
      return;
    case EwOp::kDiv:
      for (int64_t i = 0; i < m; ++i) y[i] = a[i] / b[i];
      return;
    case EwOp::kPow:  // pow_kernel: x ** 2 as x * x, else std::pow in float
      for (int64_t i = 0; i < m; ++i) y[i] = b[i] == 2.0f ? a[i] * a[i] : std::pow(a[i], b[i]);
      return;
    case EwOp::kSigmoid:
      sigmoid_f32(a, y, m);
      return;
    case EwOp::kErf:
      erf_f32(a, y, m);
      return;
    case EwOp::kGelu:
      gelu_erf_f32(a, y, m);
      return;
    case EwOp::kIdentity:
    case EwOp::kCast:  // float32 to float32 (run_float32_program checks)
      if (y != a) std::memcpy(y, a, size_t(m) * sizeof(float));
      return;
    case EwOp::kRelu:
      return unary.template operator()<Un::kRelu>();
    case EwOp::kTanh:
      return unary.template operator()<Un::kTanh>();
    case EwOp::kExp:
      return unary.template operator()<Un::kExp>();
    case EwOp::kLog:
      return unary.template operator()<Un::kLog>();
    case EwOp::kSqrt:
      return unary.template operator()<Un::kSqrt>();
    case EwOp::kReciprocal:
      return unary.template operator()<Un::kReciprocal>();
    case EwOp::kNeg:
      return unary.template operator()<Un::kNeg>();
    case EwOp::kAbs:
      return unary.template operator()<Un::kAbs>();
    case EwOp::kHardSigmoid:
      return unary.template operator()<Un::kHardSigmoid>();
    case EwOp::kHardSwish:
      return unary.template operator()<Un::kHardSwish>();
    case EwOp::kLeakyRelu:
      return unary.template operator()<Un::kLeakyRelu>();
    case EwOp::kGeluTanh:
      return unary.template operator()<Un::kGeluTanh>();
    case EwOp::kSin:
      return unary.template operator()<Un::kSin>();
    case EwOp::kCos:
      return unary.template operator()<Un::kCos>();
    case EwOp::kFloor:
      return unary.template operator()<Un::kFloor>();
    case EwOp::kCeil:
      return unary.template operator()<Un::kCeil>();
    case EwOp::kSoftplus:
      return unary.template operator()<Un::kSoftplus>();
  }
}

}  // namespace

StatusOr<bool> run_float32_program(const ops::ElementwiseProgram& p, std::span<const TensorView> in,
                                   const TensorView& out) {
  constexpr int kIn = ops::kMaxElementwiseInputs;
  const int ni = p.num_inputs;
  if (ni < 1 || ni > kIn || int(in.size()) != ni || p.code.empty() ||
      p.code.size() > size_t(ops::kMaxElementwiseInstructions) || out.dtype != DType::kFloat32) {
    return false;
  }
  for (const TensorView& v : in) {
    if (v.dtype != DType::kFloat32) return false;
  }
  // Each instruction's broadcast shape, as the reference computes it: the program computes at the
  // output's shape only where the last one is the output's (else the reference reports it).
  std::vector<Shape> shapes;
  for (const TensorView& v : in) shapes.emplace_back(v.shape.begin(), v.shape.end());
  for (const ops::EwInstruction& ins : p.code) {
    if (ins.to != DType::kFloat32) return false;
    Shape s;
    for (int r : {ins.a, ins.b}) {
      if (r < 0) continue;
      const Shape& v = shapes[size_t(r)];
      if (v.size() > s.size()) s.insert(s.begin(), v.size() - s.size(), 1);
      for (size_t d = 0; d < v.size(); ++d) {
        int64_t& o = s[s.size() - v.size() + d];
        if (o == 1) o = v[d];
      }
    }
    shapes.push_back(std::move(s));
  }
  if (!std::equal(shapes.back().begin(), shapes.back().end(), out.shape.begin(), out.shape.end()))
    return false;
  std::array<std::span<const int64_t>, kIn> ins_shapes{};
  for (int k = 0; k < ni; ++k) ins_shapes[size_t(k)] = in[size_t(k)].shape;
  BroadcastPlan<kIn> plan;
  if (!make_broadcast_plan<kIn>(out.shape, ins_shapes, &plan).ok()) return false;
  const float* base[kIn] = {};
  for (int k = 0; k < ni; ++k) base[k] = in[size_t(k)].as<float>();
  float* dst = out.as<float>();
  // Elements [first, first + n) of one output row: operand k at base[k] + off[k], stepping s[k].
  auto run = [&](int64_t o, const std::array<int64_t, kIn>& off, int64_t n,
                 const std::array<int64_t, kIn>& s) {
    constexpr int64_t kChunk = 256;  // registers of a chunk stay in L1: 32 x 1 KB
    alignas(64) float regs[kIn + ops::kMaxElementwiseInstructions][kChunk];
    const float* src[kIn + ops::kMaxElementwiseInstructions] = {};
    const size_t last = p.code.size() - 1;
    for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
      const int64_t m = std::min(kChunk, n - i0);
      for (int k = 0; k < ni; ++k) {
        const float* x = base[k] + off[size_t(k)] + i0 * s[size_t(k)];
        if (s[size_t(k)] == 1) {
          src[k] = x;
        } else {
          for (int64_t i = 0; i < m; ++i) regs[k][i] = x[i * s[size_t(k)]];
          src[k] = regs[k];
        }
      }
      for (size_t j = 0; j < p.code.size(); ++j) {
        const ops::EwInstruction& ins = p.code[j];
        float* y = j == last ? dst + o + i0 : regs[kIn + j];
        run_instruction_f32(ins, src[ins.a], ins.b >= 0 ? src[ins.b] : nullptr, y, m);
        src[ni + int(j)] = y;
      }
    }
  };
  if (plan.dims.size() == 1) {
    // One row (every operand the output's size or one element): split it over the threads.
    const std::array<int64_t, kIn> s = plan.strides[0];
    parallel_chunks(plan.numel, kParallelGrain / 4, [&](int64_t first, int64_t end) {
      std::array<int64_t, kIn> off{};
      for (int k = 0; k < kIn; ++k) off[size_t(k)] = first * s[size_t(k)];
      run(first, off, end - first, s);
    });
  } else {
    for_each_row(plan, run);
  }
  return true;
}

void register_elementwise_kernels(KernelRegistry& r) {
  r.add(OpKind::kAdd, &binary_kernel<OpKind::kAdd, Bin::kAdd, kNumeric>);
  r.add(OpKind::kSub, &binary_kernel<OpKind::kSub, Bin::kSub, kNumeric>);
  r.add(OpKind::kMul, &binary_kernel<OpKind::kMul, Bin::kMul, kNumeric>);
  r.add(OpKind::kDiv, &binary_kernel<OpKind::kDiv, Bin::kDiv, kNumeric>);
  r.add(OpKind::kMod, &mod_kernel);
  r.add(OpKind::kPow, &pow_kernel);
  r.add(OpKind::kMax, &variadic_kernel<OpKind::kMax, Bin::kMax>);
  r.add(OpKind::kMin, &variadic_kernel<OpKind::kMin, Bin::kMin>);
  r.add(OpKind::kEqual, &binary_kernel<OpKind::kEqual, Bin::kEq, kNumeric | kBool>);
  r.add(OpKind::kLess, &binary_kernel<OpKind::kLess, Bin::kLt, kNumeric>);
  r.add(OpKind::kLessOrEqual, &binary_kernel<OpKind::kLessOrEqual, Bin::kLe, kNumeric>);
  r.add(OpKind::kGreater, &binary_kernel<OpKind::kGreater, Bin::kGt, kNumeric>);
  r.add(OpKind::kGreaterOrEqual, &binary_kernel<OpKind::kGreaterOrEqual, Bin::kGe, kNumeric>);
  r.add(OpKind::kAnd, &binary_kernel<OpKind::kAnd, Bin::kAnd, kBool>);
  r.add(OpKind::kOr, &binary_kernel<OpKind::kOr, Bin::kOr, kBool>);
  r.add(OpKind::kXor, &binary_kernel<OpKind::kXor, Bin::kXor, kBool>);
  r.add(OpKind::kNot, &not_kernel);
  r.add(OpKind::kNeg, &unary_kernel<OpKind::kNeg, Un::kNeg, kSigned>);
  r.add(OpKind::kAbs, &unary_kernel<OpKind::kAbs, Un::kAbs, kNumeric>);
  r.add(OpKind::kSign, &unary_kernel<OpKind::kSign, Un::kSign, kNumeric>);
  r.add(OpKind::kRelu, &unary_kernel<OpKind::kRelu, Un::kRelu, kSigned>);
  r.add(OpKind::kReciprocal, &unary_kernel<OpKind::kReciprocal, Un::kReciprocal, kFloats>);
  r.add(OpKind::kSqrt, &unary_kernel<OpKind::kSqrt, Un::kSqrt, kFloats>);
  r.add(OpKind::kExp, &unary_kernel<OpKind::kExp, Un::kExp, kFloats>);
  r.add(OpKind::kLog, &unary_kernel<OpKind::kLog, Un::kLog, kFloats>);
  r.add(OpKind::kErf, &vector_unary_kernel<OpKind::kErf, Un::kErf, &erf_f32>);
  r.add(OpKind::kSigmoid, &vector_unary_kernel<OpKind::kSigmoid, Un::kSigmoid, &sigmoid_f32>);
  r.add(OpKind::kTanh, &unary_kernel<OpKind::kTanh, Un::kTanh, kFloats>);
  r.add(OpKind::kHardSigmoid, &unary_kernel<OpKind::kHardSigmoid, Un::kHardSigmoid, kFloats>);
  r.add(OpKind::kHardSwish, &unary_kernel<OpKind::kHardSwish, Un::kHardSwish, kFloats>);
  r.add(OpKind::kSin, &unary_kernel<OpKind::kSin, Un::kSin, kFloats>);
  r.add(OpKind::kCos, &unary_kernel<OpKind::kCos, Un::kCos, kFloats>);
  r.add(OpKind::kFloor, &unary_kernel<OpKind::kFloor, Un::kFloor, kFloats>);
  r.add(OpKind::kCeil, &unary_kernel<OpKind::kCeil, Un::kCeil, kFloats>);
  r.add(OpKind::kRound, &unary_kernel<OpKind::kRound, Un::kRound, kFloats>);
  r.add(OpKind::kLeakyRelu, &unary_kernel<OpKind::kLeakyRelu, Un::kLeakyRelu, kFloats>);
  r.add(OpKind::kSoftplus, &unary_kernel<OpKind::kSoftplus, Un::kSoftplus, kFloats>);
  r.add(OpKind::kElu, &unary_kernel<OpKind::kElu, Un::kElu, kFloats>);
  r.add(OpKind::kGelu, &gelu_kernel);
  r.add(OpKind::kIsNaN, &isnan_isinf_kernel<OpKind::kIsNaN>);
  r.add(OpKind::kIsInf, &isnan_isinf_kernel<OpKind::kIsInf>);
  r.add(OpKind::kClip, &clip_kernel);
  r.add(OpKind::kWhere, &where_kernel);
  r.add(OpKind::kCast, &cast_kernel);
  r.add(OpKind::kCastLike, &cast_kernel);
  r.add(OpKind::kIdentity, &identity_kernel);
}

}  // namespace kiln::backends::cpu
