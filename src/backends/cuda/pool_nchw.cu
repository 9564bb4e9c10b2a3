// MaxPool without Indices and AveragePool over 1-D and 2-D NCHW inputs (pool_nchw.h): a thread
// per few adjacent outputs of a row, 32-bit index arithmetic, the 3x3 and 2x2 windows of CNNs
// unrolled with their columns loaded once for the thread's outputs.
#include <cstdint>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/pool_nchw.h"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

constexpr int kBlock = 256;

// n / d and n % d for 0 <= n < 2^31 and 1 <= d < 2^31 by a multiply-high, an add and a shift
// (Granlund and Montgomery's magic numbers, as PyTorch's IntDivider): a 32-bit division by a
// runtime value is a ~20-instruction sequence, and the flat index of a pool output needs two.
struct FastDiv {
  uint32_t d = 1, m = 0, s = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    while ((uint64_t(1) << s) < d) ++s;
    m = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << s) - d)) / d + 1);
  }
  // umulhi(n, m) <= n < 2^31, so the sum does not wrap.
  __host__ __device__ __forceinline__ uint32_t div(uint32_t n) const {
#ifdef __CUDA_ARCH__
    return (__umulhi(n, m) + n) >> s;
#else
    return uint32_t(((uint64_t(n) * m >> 32) + n) >> s);
#endif
  }
};

// The j in [0, count) with 0 <= start + j*step < limit form [*lo, *hi), in 32 bits, without a
// division when step is 1 (no dilation).
__device__ __forceinline__ void window_range(int start, int step, int count, int limit, int* lo,
                                             int* hi) {
  int l, h;
  if (step == 1) {
    l = start >= 0 ? 0 : -start;
    h = limit - start;
  } else {
    l = start >= 0 ? 0 : (-start + step - 1) / step;
    h = start > limit - 1 ? 0 : (limit - 1 - start) / step + 1;
  }
  l = min(l, count);
  h = min(h, count);
  *lo = l;
  *hi = max(h, l);
}

// Adjacent outputs of a row per thread in pool2d_nchw_kernel: 4 of float16/bfloat16 (the window
// columns' loads then span 16 bytes or less a thread, as 2 of float32).
template <typename T>
constexpr int kPool2dOutputs = sizeof(T) == 2 ? 4 : 2;

// The window of a 2-D NCHW pool in 32 bits (1-D pools are 2-D ones with ih = 1), and the flat
// index of a thread: rows = planes * oh of `groups` threads, each of kV adjacent outputs.
struct Pool2dArgs {
  int ih, iw, oh, ow, kh, kw, sh, sw, dh, dw, ph, pw, peh, pew;
  int groups;
  FastDiv by_groups, by_oh;
  uint32_t total;
  bool include_pad;
};

// The divisor of an average: window positions inside the input, or with count_include_pad inside
// the padded input (not past the end padding ceil_mode adds); 64 bits, as padded windows may
// hold more than 2^31 positions.
__device__ __forceinline__ float pool_count(const Pool2dArgs& a, int h0, int w0, int kh, int kw) {
  int hlo, hhi, wlo, whi;
  if (a.include_pad) {
    window_range(h0 + a.ph, a.dh, kh, a.ih + a.ph + a.peh, &hlo, &hhi);
    window_range(w0 + a.pw, a.dw, kw, a.iw + a.pw + a.pew, &wlo, &whi);
  } else {
    window_range(h0, a.dh, kh, a.ih, &hlo, &hhi);
    window_range(w0, a.dw, kw, a.iw, &wlo, &whi);
  }
  return float(int64_t(hhi - hlo) * (whi - wlo));
}

// MaxPool without Indices and AveragePool over 1-D and 2-D NCHW planes, each thread kV adjacent
// outputs of one row. On an H200 the 64-bit pool_kernel (divisions for the output's coordinates
// and each axis' window bounds) took 383 us for DenseNet's AveragePool 2x2 s2 [64,256,56,56] in
// float16 (11% of copy bandwidth), and the 32-bit max kernel before this one 167 us for
// ResNet-50's stem MaxPool 3x3 s2 [64,64,112,112] (24%): its runtime-bound window loop issued one
// load at a time. Here the index is split by FastDiv and, for a K x K window of stride S without
// dilation (K = 0: any window, by loops), each input row's (kV - 1) * S + K columns are loaded
// once for the kV outputs (two a load where rows start at even elements), all loads of a thread
// issued together: 56 and 53 us for the two float16 cases (~72% of copy; float32 ~100%). The
// window order and rules are the CPU reference's, so results match it exactly: the first element
// wins until a strictly greater one (a leading NaN stays), sums in float in row order, divided
// once.
template <bool kMax, typename T, int K, int S, int kV, int kPairs>
__global__ void pool2d_nchw_kernel(const T* __restrict__ x, T* __restrict__ y, Pool2dArgs a) {
  const int ih = a.ih, iw = a.iw, ow = a.ow;
  const int sh = K > 0 ? S : a.sh, sw = K > 0 ? S : a.sw;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < a.total;
       i += gridDim.x * blockDim.x) {
    const uint32_t row = a.by_groups.div(i);
    const uint32_t plane = a.by_oh.div(row);
    const int ox0 = int(i - row * uint32_t(a.groups)) * kV;
    const int h0 = int(row - plane * uint32_t(a.oh)) * sh - a.ph;
    const T* xp = x + plane * uint32_t(ih * iw);
    T* yp = y + row * uint32_t(ow);
    float acc[kV];
    if constexpr (K > 0) {
      constexpr int kCols = (kV - 1) * S + K;
      const int w0 = ox0 * S - a.pw;
      // Max starts from the window's first element (empty: -inf), so that a tap is a compare and
      // a select, the places outside the input reading -inf.
      int hlo, hhi;
      window_range(h0, 1, K, ih, &hlo, &hhi);
#pragma unroll
      for (int v = 0; v < kV; ++v) {
        acc[v] = 0.f;
        if constexpr (kMax) {
          int wlo, whi;
          window_range(w0 + v * S, 1, K, iw, &wlo, &whi);
          acc[v] = hlo < hhi && wlo < whi ? DNum<T>::load(xp[(h0 + hlo) * iw + w0 + v * S + wlo])
                                          : -INFINITY;
        }
      }
      constexpr float kOutside = kMax ? -INFINITY : 0.f;
#pragma unroll
      for (int jh = 0; jh < K; ++jh) {
        const int h = h0 + jh;
        const bool row_in = unsigned(h) < unsigned(ih);
        float c[kCols];
        if constexpr (kPairs > 0) {
          // Pairs from the even column w0 - kShift (kV is even, so w0 has pw's parity): iw is
          // even, so a pair lies wholly inside or outside the row, and every pair is aligned.
          static_assert(kV % 2 == 0, "w0 = ox0 * S - pw with ox0 even");
          struct alignas(2 * sizeof(T)) Pair {
            T v[2];
          };
          constexpr int kShift = kPairs - 1, kP = (kCols + kShift + 1) / 2;
          const int wb = w0 - kShift;
          float e[2 * kP];
#pragma unroll
          for (int q = 0; q < kP; ++q) {
            if (row_in && unsigned(wb + 2 * q) < unsigned(iw)) {
              const Pair pr = *reinterpret_cast<const Pair*>(xp + h * iw + wb + 2 * q);
              e[2 * q] = DNum<T>::load(pr.v[0]);
              e[2 * q + 1] = DNum<T>::load(pr.v[1]);
            } else {
              e[2 * q] = e[2 * q + 1] = kOutside;
            }
          }
#pragma unroll
          for (int j = 0; j < kCols; ++j) c[j] = e[j + kShift];
        } else {
#pragma unroll
          for (int j = 0; j < kCols; ++j) {
            c[j] = row_in && unsigned(w0 + j) < unsigned(iw) ? DNum<T>::load(xp[h * iw + w0 + j])
                                                             : kOutside;
          }
        }
#pragma unroll
        for (int v = 0; v < kV; ++v) {
#pragma unroll
          for (int jw = 0; jw < K; ++jw) {
            const float e = c[v * S + jw];
            if constexpr (kMax) {
              acc[v] = e > acc[v] ? e : acc[v];
            } else {
              acc[v] += e;
            }
          }
        }
      }
    } else {
      int hlo, hhi;
      window_range(h0, a.dh, a.kh, ih, &hlo, &hhi);
#pragma unroll
      for (int v = 0; v < kV; ++v) {
        const int w0 = (ox0 + v) * sw - a.pw;
        int wlo, whi;
        window_range(w0, a.dw, a.kw, iw, &wlo, &whi);
        if (ox0 + v >= ow) whi = wlo;
        acc[v] = kMax ? -INFINITY : 0.f;
        bool found = false;
        for (int jh = hlo; jh < hhi; ++jh) {
          const int r = (h0 + jh * a.dh) * iw + w0;
          for (int jw = wlo; jw < whi; ++jw) {
            const float e = DNum<T>::load(xp[r + jw * a.dw]);
            if constexpr (kMax) {
              if (e > acc[v] || !found) acc[v] = e, found = true;
            } else {
              acc[v] += e;
            }
          }
        }
      }
    }
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      const int ox = ox0 + v;
      if (ox >= ow) break;
      float r = acc[v];
      if constexpr (!kMax) {
        const float count = pool_count(a, h0, ox * sw - a.pw, K > 0 ? K : a.kh, K > 0 ? K : a.kw);
        r = count > 0 ? r / count : 0.f;
      }
      yp[ox] = DNum<T>::store(r);
    }
  }
}

template <bool kMax, typename T, int K, int S>
void launch_2d_window(const T* x, T* y, const Pool2dArgs& f, int pairs, unsigned grid,
                      cudaStream_t stream) {
  constexpr int kV = kPool2dOutputs<T>;
  if (pairs == 1) {
    pool2d_nchw_kernel<kMax, T, K, S, kV, 1><<<grid, kBlock, 0, stream>>>(x, y, f);
  } else if (pairs == 2) {
    pool2d_nchw_kernel<kMax, T, K, S, kV, 2><<<grid, kBlock, 0, stream>>>(x, y, f);
  } else {
    pool2d_nchw_kernel<kMax, T, K, S, kV, 0><<<grid, kBlock, 0, stream>>>(x, y, f);
  }
}

template <bool kMax, typename T>
void launch_2d_op(const T* x, T* y, const Pool2dArgs& f, cudaStream_t stream) {
  constexpr int kV = kPool2dOutputs<T>;
  const unsigned grid = grid_for(f.total);
  const bool square = f.kh == f.kw && f.sh == f.sw && f.dh == 1 && f.dw == 1;
  // Two adjacent elements a load where every row starts at an even element, 2 * sizeof(T)-
  // aligned: 1 from w0, 2 from w0 - 1 (odd pads).
  const int pairs =
      f.iw % 2 == 0 && reinterpret_cast<uintptr_t>(x) % (2 * sizeof(T)) == 0 ? 1 + f.pw % 2 : 0;
  if (square && f.kh == 3 && f.sh == 2) {
    launch_2d_window<kMax, T, 3, 2>(x, y, f, pairs, grid, stream);
  } else if (square && f.kh == 3 && f.sh == 1) {
    launch_2d_window<kMax, T, 3, 1>(x, y, f, pairs, grid, stream);
  } else if (square && f.kh == 2 && f.sh == 2) {
    launch_2d_window<kMax, T, 2, 2>(x, y, f, pairs, grid, stream);
  } else {
    pool2d_nchw_kernel<kMax, T, 0, 0, kV, 0><<<grid, kBlock, 0, stream>>>(x, y, f);
  }
}

// pool2d_nchw_kernel with the window unrolled for the pools of CNNs: 3x3 of stride 2 (ResNet's
// stem) and 1, 2x2 of stride 2.
template <typename T>
void launch_2d(bool is_max, const T* x, T* y, Pool2dArgs f, int64_t rows, cudaStream_t stream) {
  // rows * groups <= Y's size < 2^31.
  constexpr int kV = kPool2dOutputs<T>;
  f.groups = (f.ow + kV - 1) / kV;
  f.by_groups = FastDiv(uint32_t(f.groups));
  f.by_oh = FastDiv(uint32_t(f.oh));
  f.total = uint32_t(rows * f.groups);
  if (is_max) {
    launch_2d_op<true, T>(x, y, f, stream);
  } else {
    launch_2d_op<false, T>(x, y, f, stream);
  }
}

}  // namespace

bool pool2d_nchw(bool is_max, DType dt, const void* x, void* y, const Pool2dWindow& w,
                 cudaStream_t stream) {
  // Sums of window terms each below 2^28 stay below 2^31; flat indices below 2^31.
  bool small = w.planes * w.ih * w.iw < INT32_MAX && w.planes * w.oh * w.ow < INT32_MAX;
  for (int64_t v :
       {w.ih, w.iw, w.oh, w.ow, w.kh * w.dh, w.kw * w.dw, w.sh, w.sw, w.ph, w.pw, w.peh, w.pew}) {
    small = small && v >= 0 && v < (int64_t(1) << 28);
  }
  if (!small || w.planes * w.oh * w.ow == 0) return false;
  const Pool2dArgs f{.ih = int(w.ih),
                     .iw = int(w.iw),
                     .oh = int(w.oh),
                     .ow = int(w.ow),
                     .kh = int(w.kh),
                     .kw = int(w.kw),
                     .sh = int(w.sh),
                     .sw = int(w.sw),
                     .dh = int(w.dh),
                     .dw = int(w.dw),
                     .ph = int(w.ph),
                     .pw = int(w.pw),
                     .peh = int(w.peh),
                     .pew = int(w.pew),
                     .include_pad = w.include_pad};
  return visit_dtype<kTF32 | kTF16 | kTBF16>(dt, [&](auto tag) {
    using T = decltype(tag);
    launch_2d<T>(is_max, static_cast<const T*>(x), static_cast<T*>(y), f, w.planes * w.oh, stream);
  });
}

}  // namespace kiln::backends::cuda
