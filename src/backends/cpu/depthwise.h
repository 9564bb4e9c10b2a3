// Depthwise convolution of one channel's plane on the CPU (conv.cc's Conv with one input and one
// output channel per group): row by row, through a zero-padded plane at stride 1, and through its
// phase planes at larger strides.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backends/cpu/gemm.h"
#include "backends/cpu/vector_math.h"
#include "backends/cpu/window.h"

namespace kiln::backends::cpu {

inline void axpy(float* y, const float* x, float w, int64_t n) { saxpy(y, x, w, n); }
inline void axpy(double* y, const double* x, double w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += w * x[i];
}

// acc[0:n] += w[t] * src[off[t] + 0:n] for every tap t in order (one axpy per tap, in float32
// through saxpy_taps, which keeps the run in registers across the taps).
inline void axpy_taps(float* acc, const float* src, const int64_t* off, const float* w,
                      int64_t taps, int64_t n) {
  saxpy_taps(acc, src, off, w, taps, n);
}
inline void axpy_taps(double* acc, const double* src, const int64_t* off, const double* w,
                      int64_t taps, int64_t n) {
  for (int64_t t = 0; t < taps; ++t) axpy(acc, src + off[t], w[t], n);
}

// Depthwise (one input and one output channel per group), at most 2 spatial dims: each tap of the
// kernel adds a scaled, shifted input row to an output row that stays in L1. For stride s > 1 the
// input row is first split into s phases (phase r holds x[j*s + r]) in `phases` (>= in + s
// elements), so every tap is a contiguous, vectorized axpy.
template <typename T>
void depthwise(const T* x, const T* w, T bias, const Axis& ah, const Axis& aw, T* y, T* phases) {
  int64_t s = aw.stride;
  int64_t plen = (aw.in + s - 1) / s;
  for (int64_t oh = 0; oh < ah.out; ++oh) {
    T* yrow = y + oh * aw.out;
    std::fill_n(yrow, aw.out, bias);
    for (int64_t kh = 0; kh < ah.k; ++kh) {
      int64_t ih = oh * ah.stride - ah.pb + kh * ah.dil;
      if (ih < 0 || ih >= ah.in) continue;
      const T* xrow = x + ih * aw.in;
      if (s > 1) {
        for (int64_t r = 0; r < s; ++r) {
          for (int64_t j = 0; j < plen; ++j) {
            int64_t i = j * s + r;
            phases[r * plen + j] = i < aw.in ? xrow[i] : T(0);
          }
        }
      }
      for (int64_t kw = 0; kw < aw.k; ++kw) {
        T wv = w[kh * aw.k + kw];
        int64_t off = kw * aw.dil - aw.pb;
        int64_t lo, hi;
        valid_range(off, s, aw.out, aw.in, &lo, &hi);
        if (hi <= lo) continue;
        if (s == 1) {
          axpy(yrow + lo, xrow + off + lo, wv, hi - lo);
        } else {
          // x[ow*s + off] = phase r at (ow + q), with off = q*s + r and 0 <= r < s.
          int64_t q = off >= 0 ? off / s : -((-off + s - 1) / s);
          int64_t r = off - q * s;
          axpy(yrow + lo, phases + r * plen + lo + q, wv, hi - lo);
        }
      }
    }
  }
}

// Below this many multiply-adds a depthwise convolution runs on the calling thread.
inline constexpr int64_t kParallelDepthwise = int64_t(1) << 16;

// Depthwise at stride 1 through a zero-padded copy of the channel's plane. Output row oh, column
// ow reads padded row oh + kh*dil_h, column ow + kw*dil_w, so over the padded width pw the whole
// output plane is one contiguous run per tap: out_h*pw multiply-adds, of which the ow < out_w
// columns of each row are kept. On MobileNet's small planes (5x5 taps over 14x14) this beats
// depthwise() above, whose per-tap bounds work and short rows cost more than the arithmetic. Taps
// accumulate in the same order as there, all of them in one axpy_taps call over the run rounded up
// to whole vectors (one axpy call per tap, each loading and storing the run, and a scalar tail of
// up to 15 dependent chains took MobileNetV3-small's 576-channel 5x5 layer on 7x7 0.14 ms; 0.10
// now, two threads).
template <typename T>
void depthwise_padded(const T* x, const T* w, T bias, const Axis& ah, const Axis& aw, T* y,
                      std::vector<T>& buf, std::vector<int64_t>& offsets) {
  const int64_t ph = (ah.out - 1) + (ah.k - 1) * ah.dil + 1;
  const int64_t pw = (aw.out - 1) + (aw.k - 1) * aw.dil + 1;
  // The last row's run reads past its end, and the run is rounded up to whole 16-float vectors
  // (the lanes past it are computed and dropped).
  const int64_t run = ah.out * pw, run16 = (run + 15) / 16 * 16;
  const int64_t plane = ph * pw + (aw.k - 1) * aw.dil + (run16 - run);
  if (buf.size() < size_t(plane + run16)) buf.resize(size_t(plane + run16));
  T* pad = buf.data();
  T* acc = pad + plane;
  std::fill_n(pad, plane, T(0));
  const int64_t lo = std::max<int64_t>(0, aw.pb), hi = std::min<int64_t>(pw, aw.pb + aw.in);
  for (int64_t r = 0; r < ph && hi > lo; ++r) {
    const int64_t ih = r - ah.pb;
    if (ih < 0 || ih >= ah.in) continue;
    std::copy(x + ih * aw.in + (lo - aw.pb), x + ih * aw.in + (hi - aw.pb), pad + r * pw + lo);
  }
  std::fill_n(acc, run16, bias);
  offsets.resize(size_t(ah.k * aw.k));
  for (int64_t kh = 0; kh < ah.k; ++kh) {
    for (int64_t kw = 0; kw < aw.k; ++kw)
      offsets[size_t(kh * aw.k + kw)] = kh * ah.dil * pw + kw * aw.dil;
  }
  axpy_taps(acc, pad, offsets.data(), w, ah.k * aw.k, run16);
  for (int64_t oh = 0; oh < ah.out; ++oh) std::copy_n(acc + oh * pw, aw.out, y + oh * aw.out);
}

// Depthwise at stride s > 1 (dilation 1) the same way: the zero-padded plane is split into its
// sh x sw phase planes (phase (a, b) holds padded rows a, a + sh, ... and columns b, b + sw, ...,
// each qh x qw), and output (oh, ow) reads phase (kh % sh, kw % sw) at (oh + kh / sh,
// ow + kw / sw), so each tap is again one axpy over the whole output plane (out_h * qw values).
// depthwise() above did one short axpy per output row and tap: MobileNetV3-small's 5x5 stride-2
// layer on a 14x14 plane made 50,000 calls of 7 values for 288 channels (0.64 ms at batch 1).
// Taps accumulate in the same order, and the zero taps outside the image add x * 0.
template <typename T>
void depthwise_phases(const T* x, const T* w, T bias, const Axis& ah, const Axis& aw, T* y,
                      std::vector<T>& buf, std::vector<int64_t>& offsets) {
  const int64_t sh = ah.stride, sw = aw.stride;
  const int64_t ph = (ah.out - 1) * sh + ah.k, pw = (aw.out - 1) * sw + aw.k;  // padded extent
  const int64_t qh = (ph + sh - 1) / sh, qw = (pw + sw - 1) / sw;              // a phase plane
  const int64_t plane = qh * qw + qw;  // a run starting at a tap's offset reads past the end
  // The run rounded up to whole 16-float vectors, as in depthwise_padded.
  const int64_t run = ah.out * qw, run16 = (run + 15) / 16 * 16;
  const int64_t planes = sh * sw * plane + (run16 - run);
  const size_t need = size_t(planes + run16);
  if (buf.size() < need) buf.resize(need);
  T* phases = buf.data();
  T* acc = phases + planes;
  std::fill_n(phases, planes, T(0));
  for (int64_t r = 0; r < ph; ++r) {
    const int64_t ih = r - ah.pb;
    if (ih < 0 || ih >= ah.in) continue;
    const T* xrow = x + ih * aw.in;
    T* prow = phases + (r % sh) * sw * plane + (r / sh) * qw;
    // Padded column c = j * sw + b goes to phase b at j; the image covers c in [pb, pb + in).
    for (int64_t b = 0; b < sw; ++b) {
      int64_t lo, hi;
      valid_range(b - aw.pb, sw, qw, aw.in, &lo, &hi);
      T* dst = prow + b * plane;
      if constexpr (std::is_same_v<T, float>) {
        if (hi > lo) strided_copy_f32(dst + lo, xrow + lo * sw + b - aw.pb, sw, hi - lo);
      } else {
        for (int64_t j = lo; j < hi; ++j) dst[j] = xrow[j * sw + b - aw.pb];
      }
    }
  }
  std::fill_n(acc, run16, bias);
  offsets.resize(size_t(ah.k * aw.k));
  for (int64_t kh = 0; kh < ah.k; ++kh) {
    for (int64_t kw = 0; kw < aw.k; ++kw) {
      offsets[size_t(kh * aw.k + kw)] =
          ((kh % sh) * sw + kw % sw) * plane + (kh / sh) * qw + kw / sw;
    }
  }
  axpy_taps(acc, phases, offsets.data(), w, ah.k * aw.k, run16);
  for (int64_t oh = 0; oh < ah.out; ++oh) std::copy_n(acc + oh * qw, aw.out, y + oh * aw.out);
}

}  // namespace kiln::backends::cpu
