#include "backends/cpu/vector_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "backends/cpu/multiversion.h"

namespace kiln::backends::cpu {
namespace {

// erf(t) ~ t P(t^2) / Q(t^2) for |t| <= 4 (erf(4) = 1 - 1.5e-8): coefficients from a reweighted
// least-squares fit to erf at 6,000 Chebyshev points of [0, 4] (numpy and scipy.special.erf).
constexpr double kP0 = 1.12837917867899, kP1 = 0.18478835869641916, kP2 = 0.054329916848768964,
                 kP3 = 0.0038410709513553246, kP4 = 0.0003822004082780323,
                 kP5 = 4.765513851814795e-06, kP6 = -1.3595065060599956e-08;
constexpr double kQ1 = 0.4970979344890345, kQ2 = 0.11384705624444107, kQ3 = 0.015454760690352454,
                 kQ4 = 0.001309239956308025, kQ5 = 6.386724664934407e-05;

// Past |t| = 4, +-1 exactly, so that 1 + erf(t) is 0 there (as 1 + erf in float is) instead of the
// fit's 1.5e-8. Comparisons, so that NaN passes through.
inline double erf_fit(double t) {
  const double c = t > 4.0 ? 4.0 : (t < -4.0 ? -4.0 : t);
  const double u = c * c;
  const double p = (((((kP6 * u + kP5) * u + kP4) * u + kP3) * u + kP2) * u + kP1) * u + kP0;
  const double q = ((((kQ5 * u + kQ4) * u + kQ3) * u + kQ2) * u + kQ1) * u + 1.0;
  const double r = c * p / q;
  return t > 4.0 ? 1.0 : (t < -4.0 ? -1.0 : r);
}

// The same fit's P(u) and Q(u) in float (Gelu's form), for a float or a vector of floats (one
// definition for gelu_erf_f32's lanes and its tail; references, so no vector crosses a call
// boundary): every coefficient but kP6 is positive, so Horner's rule in float adds no
// cancellation and erf keeps a few float ulp.
template <typename V>
inline __attribute__((always_inline)) void erf_pq_f(const V& u, V& p, V& q) {
  p = (((((float(kP6) * u + float(kP5)) * u + float(kP4)) * u + float(kP3)) * u + float(kP2)) * u +
       float(kP1)) *
          u +
      float(kP0);
  q = ((((float(kQ5) * u + float(kQ4)) * u + float(kQ3)) * u + float(kQ2)) * u + float(kQ1)) * u +
      1.f;
}

// erf(t) through erf_pq_f; past |t| = 4, +-1; NaN passes.
inline float erf_fit_f(float t) {
  const float c = t > 4.f ? 4.f : (t < -4.f ? -4.f : t);
  float p, q;
  erf_pq_f(c * c, p, q);
  const float r = c * p / q;
  return t > 4.f ? 1.f : (t < -4.f ? -1.f : r);
}

// exp(x) for |x| <= 216 (k within a double's exponent range), vectorizable: k = round(x / ln 2)
// through the 1.5 * 2^52 shift (k lands in the mantissa's low bits), r = x - k ln 2 in two parts,
// exp(r) by Taylor's series to r^11 (|r| <= 0.347: the next term is below 7e-15 of the result),
// 2^k put into the exponent field directly.
inline double exp_fit(double x) {
  constexpr double kLog2e = 1.4426950408889634074, kShift = 6755399441055744.0;  // 1.5 * 2^52
  constexpr double kLn2Hi = 0.693147180369123816490, kLn2Lo = 1.90821492927058770002e-10;
  const double tk = x * kLog2e + kShift;
  const double k = tk - kShift;
  const double r = (x - k * kLn2Hi) - k * kLn2Lo;
  double p = 1.0 / 39916800.0;  // 1/11!
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  uint64_t bits;
  std::memcpy(&bits, &tk, sizeof bits);
  bits = (bits + 1023) << 52;  // the low bits hold 2^51 + k: 2^51 shifts out, k + 1023 stays
  double scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

inline void sigmoid_loop(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    // std::min/max keep their first argument when a comparison fails: NaN passes through.
    const double v = std::min(std::max(double(x[i]), -150.0), 150.0);
    y[i] = float(1.0 / (1.0 + exp_fit(-v)));
  }
}

// The sum of term(x[i]) for i < n in double: sixteen partial sums (so the additions do not wait on
// one another), added pairwise, then the tail in order. sum_f32 and both of LayerNorm's passes.
template <typename Term>
inline __attribute__((always_inline)) double sum16(const float* x, int64_t n, Term term) {
  double acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += term(double(x[i + j]));
  }
  for (int w = 8; w > 0; w /= 2) {
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  }
  double s = acc[0];
  for (; i < n; ++i) s += term(double(x[i]));
  return s;
}

// exp(x - m) in float for x <= m (Softmax's x - max): d = x - m is rounded to float, and what the
// rounding lost (TwoSum: exact) is added to r below, so a large |d| costs no accuracy (rounded
// alone, d = -69 is off by up to 4e-6 relative in exp). d = k ln 2 + r with k = round(d / ln 2)
// through the 1.5 * 2^23 shift and r in two parts (kLn2HiF has 15 significant bits, so k * kLn2HiF
// is exact for |k| <= 256), exp(r) by Taylor's series to r^7 (|r| <= 0.347: the next term is 5e-9
// of the result), 2^k put into the exponent field. Below kExpLoF (where 2^k leaves the normal
// floats) 0; NaN passes through. The steps are templates over a float or a vector of floats, so
// softmax_row_f32's lanes and its tail run one definition.
constexpr float kLog2eF = 1.44269504088896341f, kShiftF = 12582912.0f;  // 1.5 * 2^23
constexpr float kLn2HiF = 0.693145751953125f, kLn2LoF = 1.428606820309417e-06f;
constexpr float kExpLoF = -87.33f;
constexpr float kE2 = 1.f / 2, kE3 = 1.f / 6, kE4 = 1.f / 24, kE5 = 1.f / 120, kE6 = 1.f / 720,
                kE7 = 1.f / 5040;

// d = x - m rounded and what the rounding lost (TwoSum).
template <typename V>
inline __attribute__((always_inline)) void diff_and_loss(const V& x, float m, V& d, V& lost) {
  d = x - m;
  const V back = d - x;
  lost = (x - (d - back)) + (-m - back);
}

// For c = max(d, kExpLoF): k (integral, NaN where d is NaN) and p = exp(r), r = c - k ln 2 + lost.
template <typename V>
inline __attribute__((always_inline)) void exp_steps(const V& c, const V& lost, V& k, V& p) {
  k = (c * kLog2eF + kShiftF) - kShiftF;
  const V r = ((c - k * kLn2HiF) - k * kLn2LoF) + lost;
  p = ((((((kE7 * r + kE6) * r + kE5) * r + kE4) * r + kE3) * r + kE2) * r + 1.f) * r + 1.f;
}

inline float exp_minus_f(float x, float m) {
  float d, lost, k, p;
  diff_and_loss(x, m, d, lost);
  exp_steps(d < kExpLoF ? kExpLoF : d, lost, k, p);
  // A NaN d leaves k NaN, whose conversion to int is undefined: 0 there (p is NaN already).
  const int32_t bits = ((std::isnan(k) ? 0 : int32_t(k)) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return d < kExpLoF ? 0.f : p * scale;
}

}  // namespace

KILN_TARGET_CLONES
void gelu_erf_f32(const float* x, float* y, int64_t n) {
  typedef float V16 __attribute__((vector_size(64)));
  // Sixteen lanes of erf_fit_f's steps (no lambda over V16: see hardswish_f32; erf_pq_f takes its
  // vectors by reference).
  const V16 zero = V16{} + 0.f, four = zero + 4.f, one = zero + 1.f;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    V16 v;
    std::memcpy(&v, x + i, sizeof(V16));
    const V16 t = v * 0.70710678118654752f;
    V16 c = t > four ? four : t;
    c = c < -four ? -four : c;
    V16 p, q;
    erf_pq_f(c * c, p, q);
    V16 e = c * p / q;
    e = t > four ? one : e;
    e = t < -four ? -one : e;
    const V16 g = 0.5f * v * (1.f + e);
    std::memcpy(y + i, &g, sizeof(V16));
  }
  for (; i < n; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.f + erf_fit_f(v * 0.70710678118654752f));
  }
}

KILN_TARGET_CLONES
void erf_f32(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float(erf_fit(double(x[i])));
}

KILN_TARGET_CLONES
void sigmoid_f32(const float* x, float* y, int64_t n) { sigmoid_loop(x, y, n); }

KILN_TARGET_CLONES
void softmax_row_f32(const float* x, float* y, int64_t n) {
  typedef float V16 __attribute__((vector_size(64)));
  typedef double V8d __attribute__((vector_size(64)));
  typedef int32_t I16 __attribute__((vector_size(64)));
  const float inf = std::numeric_limits<float>::infinity();
  // The max (a NaN is passed over here and makes its own exp NaN below, as std::max does).
  V16 vm = V16{} - inf;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    V16 v;
    std::memcpy(&v, x + i, sizeof(V16));
    vm = v > vm ? v : vm;
  }
  float mx = -inf;
  for (int j = 0; j < 16; ++j) mx = std::max(mx, vm[j]);
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  // e = exp(x - max) as exp_minus_f computes it, summed in double over sixteen lanes.
  const V16 lo = V16{} + kExpLoF, zero = V16{};
  V8d acc0 = V8d{}, acc1 = V8d{};
  i = 0;
  for (; i + 16 <= n; i += 16) {
    V16 v;
    std::memcpy(&v, x + i, sizeof(V16));
    V16 d, lost, k, p;
    diff_and_loss(v, mx, d, lost);
    exp_steps(d < lo ? lo : d, lost, k, p);
    // NOLINTNEXTLINE(misc-redundant-expression): k == k is false in a NaN lane (k is 0 there).
    const I16 bits = (__builtin_convertvector(k == k ? k : zero, I16) + 127) << 23;
    V16 scale;
    std::memcpy(&scale, &bits, sizeof scale);
    V16 e = p * scale;
    e = d < lo ? zero : e;
    std::memcpy(y + i, &e, sizeof(V16));
    acc0 += __builtin_convertvector(__builtin_shufflevector(e, e, 0, 1, 2, 3, 4, 5, 6, 7), V8d);
    acc1 +=
        __builtin_convertvector(__builtin_shufflevector(e, e, 8, 9, 10, 11, 12, 13, 14, 15), V8d);
  }
  const V8d acc = acc0 + acc1;
  double sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) {
    y[i] = exp_minus_f(x[i], mx);
    sum += double(y[i]);
  }
  const float inv = float(1.0 / sum);
  for (int64_t j = 0; j < n; ++j) y[j] *= inv;
}

KILN_TARGET_CLONES
void relu_f32(float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = y[i];
    y[i] = float(v > 0 ? v : 0.0);
  }
}

KILN_TARGET_CLONES
void clip_f32(float* y, int64_t n, double lo, double hi) {
  for (int64_t i = 0; i < n; ++i) y[i] = float(std::min(std::max(double(y[i]), lo), hi));
}

KILN_TARGET_CLONES
double sum_f32(const float* x, int64_t n) {
  return sum16(x, n, [](double v) { return v; });
}

KILN_TARGET_CLONES
void layer_norm_row_f32(const float* x, float* y, int64_t n, const float* scale, const float* bias,
                        double eps, double* mean_out, double* inv_out) {
  const double mean = sum16(x, n, [](double v) { return v; }) / double(n);
  const double var = sum16(x, n, [mean](double v) { return (v - mean) * (v - mean); });
  const double inv = 1.0 / std::sqrt(var / double(n) + eps);
  if (bias) {
    for (int64_t j = 0; j < n; ++j)
      y[j] = float((double(x[j]) - mean) * inv * double(scale[j]) + double(bias[j]));
  } else {
    for (int64_t j = 0; j < n; ++j) y[j] = float((double(x[j]) - mean) * inv * double(scale[j]));
  }
  *mean_out = mean;
  *inv_out = inv;
}

void rms_norm_row_f32(const float* x, float* y, int64_t n, const float* scale, double eps) {
  const double ms = sum16(x, n, [](double v) { return v * v; }) / double(std::max<int64_t>(n, 1));
  const double inv = 1.0 / std::sqrt(ms + eps);
  for (int64_t j = 0; j < n; ++j) y[j] = float(double(x[j]) * inv * double(scale[j]));
}

// In float, as ONNX Runtime computes it (one rounding of x + 3, of the product by 1/6 and of the
// final product: within 2 ulp of the exact value, exactly 0 at -3 and x at 3 and above). The
// double form took 8% of MobileNetV3-small at batch 1 (one thread), 16 lanes against 8 plus the
// conversions.
KILN_TARGET_CLONES
void hardswish_f32(float* y, int64_t n) {
  typedef float V16 __attribute__((vector_size(64)));
  // No lambda over V16: clang 14 compiles it without the clone's target (a vector argument's ABI).
  const V16 zero = V16{} + 0.0f, one = zero + 1.0f, three = zero + 3.0f, sixth = zero + 1.0f / 6;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    V16 v;
    std::memcpy(&v, y + i, sizeof(V16));
    V16 g = (v + three) * sixth;
    g = g < zero ? zero : g;
    g = g > one ? one : g;
    v *= g;
    std::memcpy(y + i, &v, sizeof(V16));
  }
  for (; i < n; ++i) {
    const float v = y[i];
    y[i] = v * std::min(1.0f, std::max(0.0f, (v + 3.0f) * (1.0f / 6)));
  }
}

KILN_TARGET_CLONES
void column_sums_f32(const float* x, int64_t rows, int64_t stride, int64_t cols, double* out) {
  typedef float V8f __attribute__((vector_size(32)));
  typedef double V8d __attribute__((vector_size(64)));
  int64_t c = 0;
  for (; c + 32 <= cols; c += 32) {
    V8d a0 = V8d{}, a1 = V8d{}, a2 = V8d{}, a3 = V8d{};
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * stride + c;
      V8f f0, f1, f2, f3;
      std::memcpy(&f0, xr, sizeof(V8f));
      std::memcpy(&f1, xr + 8, sizeof(V8f));
      std::memcpy(&f2, xr + 16, sizeof(V8f));
      std::memcpy(&f3, xr + 24, sizeof(V8f));
      a0 += __builtin_convertvector(f0, V8d);
      a1 += __builtin_convertvector(f1, V8d);
      a2 += __builtin_convertvector(f2, V8d);
      a3 += __builtin_convertvector(f3, V8d);
    }
    std::memcpy(out + c, &a0, sizeof(V8d));
    std::memcpy(out + c + 8, &a1, sizeof(V8d));
    std::memcpy(out + c + 16, &a2, sizeof(V8d));
    std::memcpy(out + c + 24, &a3, sizeof(V8d));
  }
  if (c + 16 <= cols) {  // two chains: a squeeze-excitation's 16 channels
    V8d a0 = V8d{}, a1 = V8d{};
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * stride + c;
      V8f f0, f1;
      std::memcpy(&f0, xr, sizeof(V8f));
      std::memcpy(&f1, xr + 8, sizeof(V8f));
      a0 += __builtin_convertvector(f0, V8d);
      a1 += __builtin_convertvector(f1, V8d);
    }
    std::memcpy(out + c, &a0, sizeof(V8d));
    std::memcpy(out + c + 8, &a1, sizeof(V8d));
    c += 16;
  }
  for (; c + 8 <= cols; c += 8) {
    V8d a = V8d{};
    for (int64_t r = 0; r < rows; ++r) {
      V8f f;
      std::memcpy(&f, x + r * stride + c, sizeof(V8f));
      a += __builtin_convertvector(f, V8d);
    }
    std::memcpy(out + c, &a, sizeof(V8d));
  }
  for (; c < cols; ++c) {
    double a = 0;
    for (int64_t r = 0; r < rows; ++r) a += double(x[r * stride + c]);
    out[c] = a;
  }
}

KILN_TARGET_CLONES
void strided_copy_f32(float* dst, const float* src, int64_t stride, int64_t n) {
  int64_t j = 0;
  if (stride == 2) {
    typedef float V16 __attribute__((vector_size(64)));
    for (; j + 16 <= n; j += 16) {
      V16 a, b;
      std::memcpy(&a, src + 2 * j, sizeof(V16));
      // The last block's second half may lie past src[2 (n - 1)]: read only what exists.
      if (j + 16 < n) {
        std::memcpy(&b, src + 2 * j + 16, sizeof(V16));
      } else {
        b = V16{};
        std::memcpy(&b, src + 2 * j + 16, sizeof(float) * 15);
      }
      // The even lanes of a:b (__builtin_shufflevector: GCC 12 and clang alike).
      const V16 d =
          __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
      std::memcpy(dst + j, &d, sizeof(V16));
    }
  }
  for (; j < n; ++j) dst[j] = src[j * stride];
}

KILN_TARGET_CLONES
void hardsigmoid_f32(float* y, int64_t n, double a, double b) {
  for (int64_t i = 0; i < n; ++i) y[i] = float(std::max(0.0, std::min(1.0, a * double(y[i]) + b)));
}

KILN_TARGET_CLONES
void leaky_relu_f32(float* y, int64_t n, double a) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = y[i];
    y[i] = float(v >= 0 ? v : a * v);
  }
}

}  // namespace kiln::backends::cpu
