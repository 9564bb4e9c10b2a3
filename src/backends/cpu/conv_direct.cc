#include "backends/cpu/conv_direct.h"

#include <algorithm>
#include <cstring>

#include "backends/cpu/multiversion.h"

// The accumulation `acc += w * v` becomes FMAs, as in gemm.cc (the im2col + GEMM path these
// convolutions took before).
#pragma GCC optimize("fp-contract=fast")

namespace kiln::backends::cpu {
namespace {

// GCC vector types lower to each clone's instruction set (gemm.cc does the same): 16 floats are
// one zmm register under AVX-512, where the compiler's own vectorizer chose 256-bit shuffles.
typedef float V16 __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;  // output columns a block accumulates
constexpr int kOutBlock = 8;    // output channels a block accumulates (8 independent FMA chains)

// acc[o] over the taps, o < OB output channels from w (rows of `taps` values), columns j0..j0+15
// of every tap's run.
template <int OB>
inline __attribute__((always_inline)) void block(const float* const* runs, int64_t taps,
                                                 const float* w, int64_t j0, V16 (&acc)[OB]) {
  for (int o = 0; o < OB; ++o) acc[o] = V16{};
  for (int64_t t = 0; t < taps; ++t) {
    V16 v;
    std::memcpy(&v, runs[t] + j0, sizeof(V16));
    for (int o = 0; o < OB; ++o) acc[o] += w[o * taps + t] * v;
  }
}

// y[0:n] = acc + b.
inline __attribute__((always_inline)) void store(const V16& acc, float b, float* y, int64_t n) {
  alignas(64) float tmp[kLanes];
  std::memcpy(tmp, &acc, sizeof(V16));
  for (int64_t j = 0; j < n; ++j) y[j] = tmp[j] + b;
}

// One output row of every output channel: `runs` holds each tap's contiguous run of input values
// (padded to a whole number of blocks), y points at the row in the first output plane.
KILN_TARGET_CLONES
void direct_row(const float* const* runs, int64_t taps, const float* w, const float* bias,
                int64_t mg, int64_t ow, float* y, int64_t plane) {
  for (int64_t j0 = 0; j0 < ow; j0 += kLanes) {
    const int64_t n = std::min(kLanes, ow - j0);
    int64_t o = 0;
    for (; o + kOutBlock <= mg; o += kOutBlock) {
      V16 acc[kOutBlock];
      block<kOutBlock>(runs, taps, w + o * taps, j0, acc);
      for (int i = 0; i < kOutBlock; ++i)
        store(acc[i], bias ? bias[o + i] : 0.f, y + (o + i) * plane + j0, n);
    }
    for (; o < mg; ++o) {
      V16 acc[1];
      block<1>(runs, taps, w + o * taps, j0, acc);
      store(acc[0], bias ? bias[o] : 0.f, y + o * plane + j0, n);
    }
  }
}

}  // namespace

void conv_direct_f32(const float* x, int64_t cg, const float* w, const float* bias, int64_t mg,
                     const Axis& ah, const Axis& aw, int64_t oh0, int64_t oh1, float* y,
                     std::vector<float>& scratch) {
  if (oh0 >= oh1) return;
  const int64_t s = aw.stride, taps = cg * ah.k * aw.k;
  // The input rows these output rows read, each split once into s phase runs: run p holds
  // padded columns p, p + s, ... (padded column u = input column u - pb), long enough for the
  // farthest tap and a whole last block of columns. One more run of zeros stands for the rows
  // outside the image.
  const int64_t blocks = (aw.out + kLanes - 1) / kLanes;
  const int64_t run = blocks * kLanes + (aw.k - 1) / s + 1;
  const int64_t ih0 = oh0 * ah.stride - ah.pb, ih1 = (oh1 - 1) * ah.stride - ah.pb + ah.k;
  const int64_t rows = ih1 - ih0;
  const int64_t zeros_at = cg * rows * s * run;
  if (scratch.size() < size_t(zeros_at + run)) scratch.resize(size_t(zeros_at + run));
  float* base = scratch.data();
  std::fill(base + zeros_at, base + zeros_at + run, 0.f);
  for (int64_t c = 0; c < cg; ++c) {
    for (int64_t ih = std::max<int64_t>(ih0, 0); ih < std::min(ih1, ah.in); ++ih) {
      const float* row = x + (c * ah.in + ih) * aw.in;
      for (int64_t p = 0; p < s; ++p) {
        float* ph = base + ((c * rows + ih - ih0) * s + p) * run;
        int64_t lo, hi;
        valid_range(p - aw.pb, s, run, aw.in, &lo, &hi);
        std::fill(ph, ph + lo, 0.f);
        for (int64_t u = lo; u < hi; ++u) ph[u] = row[u * s + p - aw.pb];
        std::fill(ph + hi, ph + run, 0.f);
      }
    }
  }
  const float* runs[kDirectMaxTaps];
  const int64_t plane = ah.out * aw.out;
  for (int64_t oh = oh0; oh < oh1; ++oh) {
    for (int64_t c = 0; c < cg; ++c) {
      for (int64_t a = 0; a < ah.k; ++a) {
        const int64_t ih = oh * ah.stride - ah.pb + a;
        const bool inside = ih >= 0 && ih < ah.in;
        for (int64_t b = 0; b < aw.k; ++b) {
          runs[(c * ah.k + a) * aw.k + b] =
              inside ? base + ((c * rows + ih - ih0) * s + b % s) * run + b / s : base + zeros_at;
        }
      }
    }
    direct_row(runs, taps, w, bias, mg, aw.out, y + oh * aw.out, plane);
  }
}

}  // namespace kiln::backends::cpu
