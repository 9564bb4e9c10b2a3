// CPU reference kernels of the math op family: trigonometry and parameterized activations, Shrink,
// PRelu, SwiGLU, variadic Sum/Mean, bitwise and shift ops, inference-mode Dropout.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#include "backends/cpu/broadcast.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/dtype_dispatch.h"

namespace kiln::backends::cpu {
namespace {

using ops::OpKind;

Status check_io(const KernelArgs& a, size_t num_in, OpKind op) {
  if (a.in.size() < num_in || a.out.empty()) {
    return invalid_argument(name_of(op) + ": expected " + std::to_string(num_in) +
                            " inputs and an output");
  }
  for (size_t i = 0; i < num_in; ++i) {
    if (!present(a.in[i])) {
      return invalid_argument(name_of(op) + ": input " + std::to_string(i) + " is missing");
    }
  }
  for (size_t i = 0; i < a.in.size(); ++i) {
    if (present(a.in[i]) && a.in[i].dtype != a.in[0].dtype && op != OpKind::kDropout) {
      return invalid_argument(name_of(op) + ": input " + std::to_string(i) + " has dtype " +
                              std::string(dtype_name(a.in[i].dtype)) + ", input 0 " +
                              std::string(dtype_name(a.in[0].dtype)));
    }
  }
  if (a.out[0].dtype != a.in[0].dtype) {
    return invalid_argument(name_of(op) + ": output dtype differs from input 0's");
  }
  return ok_status();
}

// ---- unary ----

enum class Un {
  kTan,
  kAsin,
  kAcos,
  kAtan,
  kSinh,
  kCosh,
  kAsinh,
  kAcosh,
  kAtanh,
  kSoftsign,
  kSelu,
  kCelu,
  kMish,
  kThresholdedRelu,
  kSwish,
  kShrink
};

struct Params {
  double alpha = 0, gamma = 0, bias = 0, lambd = 0;
};

template <Un op, typename C>
inline C apply(C x, const Params& p) {
  if constexpr (op == Un::kShrink) {
    // Compared and computed in double, as ONNX's reference does (numpy promotes to float): -lambd
    // converted to an unsigned type would be undefined.
    const double xd = double(x);
    if (xd < -p.lambd) return C(xd + p.bias);
    if (xd > p.lambd) return C(xd - p.bias);
    return C(0);
  } else {
    static_assert(std::is_floating_point_v<C>);
    if constexpr (op == Un::kTan) return std::tan(x);
    if constexpr (op == Un::kAsin) return std::asin(x);
    if constexpr (op == Un::kAcos) return std::acos(x);
    if constexpr (op == Un::kAtan) return std::atan(x);
    if constexpr (op == Un::kSinh) return std::sinh(x);
    if constexpr (op == Un::kCosh) return std::cosh(x);
    if constexpr (op == Un::kAsinh) return std::asinh(x);
    if constexpr (op == Un::kAcosh) return std::acosh(x);
    if constexpr (op == Un::kAtanh) return std::atanh(x);
    if constexpr (op == Un::kSoftsign) return x / (C(1) + std::fabs(x));
    if constexpr (op == Un::kSelu) {
      return x > C(0) ? C(p.gamma) * x : C(p.gamma) * (C(p.alpha) * std::exp(x) - C(p.alpha));
    }
    if constexpr (op == Un::kCelu) {
      C a = C(p.alpha);
      return std::fmax(C(0), x) + std::fmin(C(0), a * std::expm1(x / a));
    }
    if constexpr (op == Un::kMish) {
      C sp = x > C(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
      return x * std::tanh(sp);
    }
    if constexpr (op == Un::kThresholdedRelu) return x > C(p.alpha) ? x : C(0);
    if constexpr (op == Un::kSwish) return x / (C(1) + std::exp(-C(p.alpha) * x));
  }
}

template <OpKind kOp, Un op>
Status unary_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_io(a, 1, kOp));
  const TensorView& x = a.in[0];
  const TensorView& out = a.out[0];
  if (x.numel() != out.numel()) return invalid_argument(name_of(kOp) + ": output size differs");
  Params p;
  if constexpr (op == Un::kSelu) {
    KILN_ASSIGN_OR_RETURN(float alpha, a.attrs.get_float("alpha", 1.67326319217681884765625f));
    KILN_ASSIGN_OR_RETURN(float gamma, a.attrs.get_float("gamma", 1.05070102214813232421875f));
    p.alpha = alpha;
    p.gamma = gamma;
  } else if constexpr (op == Un::kCelu || op == Un::kThresholdedRelu || op == Un::kSwish) {
    KILN_ASSIGN_OR_RETURN(float alpha, a.attrs.get_float("alpha", 1.0f));
    if (op == Un::kCelu && alpha == 0) return invalid_argument("Celu: alpha must not be 0");
    p.alpha = alpha;
  } else if constexpr (op == Un::kShrink) {
    KILN_ASSIGN_OR_RETURN(float bias, a.attrs.get_float("bias", 0.0f));
    KILN_ASSIGN_OR_RETURN(float lambd, a.attrs.get_float("lambd", 0.5f));
    p.bias = bias;
    p.lambd = lambd;
  }
  constexpr unsigned kSet = op == Un::kShrink ? kNumeric : kFloats;
  return dispatch<kSet>(x.dtype, kOp, [&]<typename T>(Tag<T>) {
    using N = Num<T>;
    const T* src = x.as<T>();
    T* dst = out.as<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) dst[i] = N::store(apply<op>(N::load(src[i]), p));
    return ok_status();
  });
}

// ---- binary, broadcast ----

enum class Bin { kAdd, kPRelu, kAnd, kOr, kXor, kShl, kShr };

template <typename C>
constexpr bool is_negative(C x) {
  if constexpr (std::is_signed_v<C>) return x < C(0);
  return false;
}

template <typename C>
constexpr bool shift_in_range(C y) {
  return !is_negative(y) && y < C(sizeof(C) * 8);
}

template <Bin op, typename C>
inline C bin(C x, C y) {
  if constexpr (op == Bin::kAdd) {
    if constexpr (std::is_integral_v<C>) {
      return C(Wide<C>(x) + Wide<C>(y));
    } else {
      return x + y;
    }
  } else if constexpr (op == Bin::kPRelu) {
    return x < C(0) ? C(y * x) : x;
  } else if constexpr (op == Bin::kAnd) {
    return C(x & y);
  } else if constexpr (op == Bin::kOr) {
    return C(x | y);
  } else if constexpr (op == Bin::kXor) {
    return C(x ^ y);
  } else if constexpr (op == Bin::kShl) {
    // Opset 28: a shift count outside [0, bits) gives 0; a signed x shifts as its unsigned bits.
    if (!shift_in_range(y)) return C(0);
    return C(Wide<C>(x) << y);
  } else {
    // Opset 28: a signed x shifts arithmetically (sign-extending); out of range, only the sign
    // extension is left: -1 for a negative x, else 0.
    if (!shift_in_range(y)) return is_negative(x) ? C(-1) : C(0);
    return C(x >> y);
  }
}

// out = x op y; x or y may be the output itself (the variadic fold), which is safe because both
// are walked in the output's order.
template <Bin op, unsigned kSet>
Status binary(OpKind kop, const TensorView& x, const TensorView& y, const TensorView& out) {
  BroadcastPlan<2> plan;
  Status s = make_broadcast_plan<2>(out.shape, {x.shape, y.shape}, &plan);
  if (!s.ok()) return s.with_context(name_of(kop));
  return dispatch<kSet>(x.dtype, kop, [&]<typename T>(Tag<T>) {
    using N = Num<T>;
    using C = typename N::C;
    rows2(plan, x.as<T>(), y.as<T>(), out.as<T>(),
          [](T u, T v) { return N::store(bin<op, C>(N::load(u), N::load(v))); });
    return ok_status();
  });
}

template <OpKind kOp, Bin op, unsigned kSet>
Status binary_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_io(a, 2, kOp));
  return binary<op, kSet>(kOp, a.in[0], a.in[1], a.out[0]);
}

constexpr unsigned kInts = kI8 | kI16 | kI32 | kI64 | kU8 | kU16 | kU32 | kU64;

Status bitshift_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_io(a, 2, OpKind::kBitShift));
  KILN_ASSIGN_OR_RETURN(std::string dir, a.attrs.get_string("direction", std::nullopt));
  const TensorView &x = a.in[0], &y = a.in[1], &out = a.out[0];
  if (dir == "LEFT") return binary<Bin::kShl, kInts>(OpKind::kBitShift, x, y, out);
  if (dir == "RIGHT") return binary<Bin::kShr, kInts>(OpKind::kBitShift, x, y, out);
  return invalid_argument("BitShift: direction must be 'LEFT' or 'RIGHT', got '" + dir + "'");
}

// SwiGLU: y = a * sigmoid(alpha * a) * b, computed as Swish is (float for the half types).
Status swiglu_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_io(a, 2, OpKind::kSwiGLU));
  const TensorView& x = a.in[0];
  const TensorView& g = a.in[1];
  const TensorView& out = a.out[0];
  if (!std::ranges::equal(x.shape, g.shape) || x.numel() != out.numel()) {
    return invalid_argument("SwiGLU: A " + shape_to_string(x.shape) + ", B " +
                            shape_to_string(g.shape) + " and the output must have one shape");
  }
  Params p;
  KILN_ASSIGN_OR_RETURN(float alpha, a.attrs.get_float("alpha", 1.0f));
  p.alpha = alpha;
  return dispatch<kFloats>(x.dtype, OpKind::kSwiGLU, [&]<typename T>(Tag<T>) {
    using N = Num<T>;
    const T* src = x.as<T>();
    const T* lin = g.as<T>();
    T* dst = out.as<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
      dst[i] = N::store(apply<Un::kSwish>(N::load(src[i]), p) * N::load(lin[i]));
    }
    return ok_status();
  });
}

Status bitwise_not_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_io(a, 1, OpKind::kBitwiseNot));
  const TensorView& x = a.in[0];
  const TensorView& out = a.out[0];
  if (x.numel() != out.numel()) return invalid_argument("BitwiseNot: output size differs");
  return dispatch<kInts>(x.dtype, OpKind::kBitwiseNot, [&]<typename T>(Tag<T>) {
    const T* src = x.as<T>();
    T* dst = out.as<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) dst[i] = T(~src[i]);
    return ok_status();
  });
}

// Sum and Mean fold their inputs pairwise into the output; one input is copied.
template <OpKind kOp>
Status variadic_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_io(a, a.in.size(), kOp));
  const TensorView& out = a.out[0];
  if (a.in.size() == 1) {
    if (a.in[0].numel() != out.numel()) return invalid_argument(name_of(kOp) + ": size differs");
    if (out.nbytes() > 0 && out.data != a.in[0].data)
      std::memcpy(out.data, a.in[0].data, out.nbytes());
  } else {
    KILN_RETURN_IF_ERROR((binary<Bin::kAdd, kNumeric>(kOp, a.in[0], a.in[1], out)));
    for (size_t k = 2; k < a.in.size(); ++k) {
      KILN_RETURN_IF_ERROR((binary<Bin::kAdd, kNumeric>(kOp, out, a.in[k], out)));
    }
  }
  if constexpr (kOp == OpKind::kMean) {
    const double n = double(a.in.size());
    return dispatch<kFloats>(out.dtype, kOp, [&]<typename T>(Tag<T>) {
      using N = Num<T>;
      using C = typename N::C;
      T* p = out.as<T>();
      for (int64_t i = 0, e = out.numel(); i < e; ++i) p[i] = N::store(C(N::load(p[i]) / C(n)));
      return ok_status();
    });
  }
  return ok_status();
}

// Inference-mode Dropout (the schema refuses random training mode): Y = X, mask all true.
Status dropout_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_io(a, 1, OpKind::kDropout));
  const TensorView& x = a.in[0];
  const TensorView& y = a.out[0];
  if (x.numel() != y.numel()) return invalid_argument("Dropout: output size differs");
  if (y.nbytes() > 0 && y.data != x.data) std::memcpy(y.data, x.data, y.nbytes());
  if (a.out.size() > 1 && present(a.out[1])) {
    if (a.out[1].dtype != DType::kBool || a.out[1].numel() != x.numel()) {
      return invalid_argument("Dropout: the mask must be bool with X's shape");
    }
    if (a.out[1].nbytes() > 0) std::memset(a.out[1].data, 1, a.out[1].nbytes());
  }
  return ok_status();
}

}  // namespace

void register_math_kernels(KernelRegistry& r) {
  r.add(OpKind::kTan, &unary_kernel<OpKind::kTan, Un::kTan>);
  r.add(OpKind::kAsin, &unary_kernel<OpKind::kAsin, Un::kAsin>);
  r.add(OpKind::kAcos, &unary_kernel<OpKind::kAcos, Un::kAcos>);
  r.add(OpKind::kAtan, &unary_kernel<OpKind::kAtan, Un::kAtan>);
  r.add(OpKind::kSinh, &unary_kernel<OpKind::kSinh, Un::kSinh>);
  r.add(OpKind::kCosh, &unary_kernel<OpKind::kCosh, Un::kCosh>);
  r.add(OpKind::kAsinh, &unary_kernel<OpKind::kAsinh, Un::kAsinh>);
  r.add(OpKind::kAcosh, &unary_kernel<OpKind::kAcosh, Un::kAcosh>);
  r.add(OpKind::kAtanh, &unary_kernel<OpKind::kAtanh, Un::kAtanh>);
  r.add(OpKind::kSoftsign, &unary_kernel<OpKind::kSoftsign, Un::kSoftsign>);
  r.add(OpKind::kSelu, &unary_kernel<OpKind::kSelu, Un::kSelu>);
  r.add(OpKind::kCelu, &unary_kernel<OpKind::kCelu, Un::kCelu>);
  r.add(OpKind::kMish, &unary_kernel<OpKind::kMish, Un::kMish>);
  r.add(OpKind::kThresholdedRelu, &unary_kernel<OpKind::kThresholdedRelu, Un::kThresholdedRelu>);
  r.add(OpKind::kSwish, &unary_kernel<OpKind::kSwish, Un::kSwish>);
  r.add(OpKind::kShrink, &unary_kernel<OpKind::kShrink, Un::kShrink>);
  r.add(OpKind::kPRelu, &binary_kernel<OpKind::kPRelu, Bin::kPRelu, kNumeric>);
  r.add(OpKind::kBitwiseAnd, &binary_kernel<OpKind::kBitwiseAnd, Bin::kAnd, kInts>);
  r.add(OpKind::kBitwiseOr, &binary_kernel<OpKind::kBitwiseOr, Bin::kOr, kInts>);
  r.add(OpKind::kBitwiseXor, &binary_kernel<OpKind::kBitwiseXor, Bin::kXor, kInts>);
  r.add(OpKind::kBitwiseNot, &bitwise_not_kernel);
  r.add(OpKind::kBitShift, &bitshift_kernel);
  r.add(OpKind::kSwiGLU, &swiglu_kernel);
  r.add(OpKind::kSum, &variadic_kernel<OpKind::kSum>);
  r.add(OpKind::kMean, &variadic_kernel<OpKind::kMean>);
  r.add(OpKind::kDropout, &dropout_kernel);
}

}  // namespace kiln::backends::cpu
