// kiln::FusedConv depthwise and channels-last (group = channels, one filter per channel, the
// layout MobileNet's and EfficientNet's float16/bfloat16 stacks take) as our own kernel, with the
// bias and activation applied before the one store. cuDNN runs these as an implicit GEMM on tensor
// cores that have nothing to multiply (one input channel per output) and then an epilogue pass of
// its own over Y: on MobileNetV3-Large FP16 at batch 1 on an H100, its 15 depthwise layers took
// 167 us and their 15 epilogue passes 65 us more (ncu kernel times, .gpu_models/prof_mb.sh).
//
// Each thread computes 8 channels (16 bytes) of one output pixel; a tap's 8 filter values are one
// 16-byte load from the filter re-laid out at prepare time as [kh*kw, C]; neighbouring threads
// take neighbouring channels, then neighbouring pixels, so every load of a warp is contiguous and
// the taps neighbours share come from L1. The products accumulate in float; Y is rounded once.
// Measured on MobileNetV3-Large FP16 (H100, 2026-11-27): giving a thread 2 pixels of a row
// (their shared input columns loaded once) took 0.392 ms at batch 1 against 0.348-0.351 for one
// pixel, and 1.335-1.344 against 1.331-1.340 ms at batch 64 (.gpu_models/exp2.sh); 4 pixels took
// 0.496 and 1.583 ms against 0.374 and 1.464 for one pixel (exp.sh, a build with the SE pass).
//
// Larger filters at stride 1 (ConvNeXt's 7x7, 5x5) reuse far more: there a thread computes a strip
// of kStrip output pixels of one row, converting each filter row's kStrip + K - 1 input columns
// once and each tap's 8 filter values once for the strip (depthwise_nhwc_strip_kernel). One pixel
// a thread read each input column 49 times for a 7x7 filter from L1: ConvNeXt-T FP16 at batch 32
// spent 1,114 us of its 2,461 us of kernels (ncu, H200) in its 18 depthwise layers.
// The strip takes 3x3 and 5x5 filters at stride 2 too (MobileNet's and EfficientNet's
// downsampling layers), where one pixel a thread read each input column 9 or 25 times.
//
// Both kept EfficientNetV2-S's 3x3 layers at about 0.9 TB/s (ncu, H200, batch 32: 1,455 us in 30
// layers). The tile kernel (depthwise_nhwc_tile_kernel) stages each block's input in shared
// memory and is the one that takes an input_activation (the SiLU of the 1x1 expansion before it,
// applied once per element instead of a pass of its own). The builder times every tactic that
// fits at the opt and min shapes and weighs the fastest against cuDNN's graph convolution
// (conv_graph.cc; select_kernels). A strip kernel with its rows unrolled measured no faster in
// MobileNetV3-Large (H200, batch 64: 1.247 ms, 1.240 before; .gpu_models/runE1.sh).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/activation.cuh"
#include "backends/cuda/conv_attrs.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;

constexpr int kBlock = 256;
constexpr int kMaxTaps = 7;    // a larger filter is left to cuDNN
constexpr int kTapsMajor = 1;  // device_bytes layout tag: the filter as [kh*kw, C]
constexpr int kBiasFloat = 2;  // device_bytes layout tag: the bias in float

struct DwGeometry {
  int64_t n = 0;
  int h = 0, w = 0, c8 = 0, oh = 0, ow = 0;
  int sh = 1, sw = 1, dh = 1, dw = 1, pt = 0, pl = 0, kh = 1, kw = 1;
  ConvActivation act = ConvActivation::kNone;
  float p0 = 0.f, p1 = 0.f;
  ConvActivation in_act = ConvActivation::kNone;  // input_activation (the tile kernel alone)
  float ip0 = 0.f, ip1 = 0.f;
};

// 16-bit values to and from their bits: a 16-byte vector read as eight floats, eight floats
// rounded into one.
__device__ __forceinline__ float from_bits(__half, uint32_t b) {
  return __half2float(__ushort_as_half((unsigned short)b));
}
__device__ __forceinline__ float from_bits(__nv_bfloat16, uint32_t b) {
  return __uint_as_float(b << 16);
}
__device__ __forceinline__ uint32_t to_bits(__half, float v) {
  return __half_as_ushort(__float2half_rn(v));
}
__device__ __forceinline__ uint32_t to_bits(__nv_bfloat16, float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&v)[8]) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[2 * k] = from_bits(T{}, u[k] & 0xffffu);
    v[2 * k + 1] = from_bits(T{}, u[k] >> 16);
  }
}

// KH, KW: the filter size when known at compile time (3 and 5, MobileNet's), else 0 and g.kh/g.kw.
template <typename T, int KH, int KW>
__global__ void __launch_bounds__(kBlock)
    depthwise_nhwc_kernel(const T* __restrict__ x, const T* __restrict__ w,
                          const float* __restrict__ bias, T* __restrict__ y, DwGeometry g) {
  const int kh = KH > 0 ? KH : g.kh, kw = KW > 0 ? KW : g.kw;
  const int64_t c = int64_t(g.c8) * 8;
  const int64_t total = g.n * g.oh * g.ow * g.c8;
  KILN_GRID_LOOP(i, total) {
    const int cg = int(i % g.c8);
    int64_t r = i / g.c8;
    const int ow = int(r % g.ow);
    r /= g.ow;
    const int oh = int(r % g.oh);
    const int64_t img = r / g.oh;
    float acc[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] = 0.f;
    const T* xc = x + img * g.h * g.w * c + cg * 8;
    const T* wc = w + cg * 8;
#pragma unroll
    for (int a = 0; a < (KH > 0 ? KH : kMaxTaps); ++a) {
      if (KH == 0 && a >= kh) break;
      const int ih = oh * g.sh - g.pt + a * g.dh;
      if (unsigned(ih) >= unsigned(g.h)) continue;
      const T* row = xc + int64_t(ih) * g.w * c;
#pragma unroll
      for (int b = 0; b < (KW > 0 ? KW : kMaxTaps); ++b) {
        if (KW == 0 && b >= kw) break;
        const int iw = ow * g.sw - g.pl + b * g.dw;
        if (unsigned(iw) >= unsigned(g.w)) continue;
        float wv[8], xv[8];
        load8(wc + (a * kw + b) * c, wv);
        load8(row + int64_t(iw) * c, xv);
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[k] = fmaf(xv[k], wv[k], acc[k]);
      }
    }
    uint32_t u[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float v0 = acc[2 * k] + (bias ? bias[cg * 8 + 2 * k] : 0.f);
      const float v1 = acc[2 * k + 1] + (bias ? bias[cg * 8 + 2 * k + 1] : 0.f);
      u[k] = to_bits(T{}, activate(g.act, g.p0, g.p1, v0)) |
             (to_bits(T{}, activate(g.act, g.p0, g.p1, v1)) << 16);
    }
    const uint4 out{u[0], u[1], u[2], u[3]};
    *reinterpret_cast<uint4*>(y + ((img * g.oh + oh) * g.ow + ow) * c + cg * 8) = out;
  }
}

template <typename T>
__device__ __forceinline__ void unpack8(const uint4& raw, float (&v)[8]) {
  const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[2 * k] = from_bits(T{}, u[k] & 0xffffu);
    v[2 * k + 1] = from_bits(T{}, u[k] >> 16);
  }
}

// Stride S (1 or 2), dilation 1, a K x K filter: kStrip output pixels of one row a thread (8
// channels each). Per filter row, the (kStrip - 1) * S + K input columns the strip reads are
// loaded and converted once (zero outside the image: the tap then adds x * w = 0); each tap's
// filter values once. The taps accumulate in the order the one-pixel kernel uses, in float; Y is
// rounded once. At stride 2 a strip loads 2.25 (3x3) or 2.75 (5x5) input columns a filter row and
// output pixel where one pixel a thread loads 3 or 5. In a micro-benchmark on the H200 (batch 64,
// .gpu_models/micro/dw.cu, git-ignored) a strip form with its rows unrolled and its filter in float
// took 44.7 us against 55.6 for one pixel a thread on MobileNetV3-Large's 64x112x112 3x3 layer and
// 26.3 against 36.2 on its 72x56x56 5x5 one; this kernel (one filter row at a time) is timed
// against the others at build time, and in MobileNetV3-Large FP16 at batch 64 the builder took it
// for the 5x5 layer alone (the engine: 1.241 ms, 1.242 before).
constexpr int kStrip = 4;
constexpr int kStripBlock = 128;

template <typename T, int K, int S>
__global__ void __launch_bounds__(kStripBlock)
    depthwise_nhwc_strip_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                const float* __restrict__ bias, T* __restrict__ y, DwGeometry g) {
  constexpr int kCols = (kStrip - 1) * S + K;
  const int64_t c = int64_t(g.c8) * 8;
  const int strips = (g.ow + kStrip - 1) / kStrip;
  const int64_t total = g.n * g.oh * strips * g.c8;
  KILN_GRID_LOOP(i, total) {
    const int cg = int(i % g.c8);
    int64_t r = i / g.c8;
    const int sx = int(r % strips);
    r /= strips;
    const int oh = int(r % g.oh);
    const int64_t img = r / g.oh;
    const int ow0 = sx * kStrip;
    float acc[kStrip][8];
#pragma unroll
    for (int t = 0; t < kStrip; ++t) {
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[t][k] = 0.f;
    }
    const T* xc = x + img * g.h * g.w * c + cg * 8;
    const T* wc = w + cg * 8;
#pragma unroll 1
    for (int a = 0; a < K; ++a) {
      const int ih = oh * S - g.pt + a;
      if (unsigned(ih) >= unsigned(g.h)) continue;
      const T* row = xc + int64_t(ih) * g.w * c;
      float win[kCols][8];
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const int iw = ow0 * S - g.pl + j;
        const uint4 raw = unsigned(iw) < unsigned(g.w)
                              ? __ldg(reinterpret_cast<const uint4*>(row + int64_t(iw) * c))
                              : make_uint4(0, 0, 0, 0);
        unpack8<T>(raw, win[j]);
      }
#pragma unroll
      for (int b = 0; b < K; ++b) {
        float wv[8];
        load8(wc + (a * K + b) * c, wv);
#pragma unroll
        for (int t = 0; t < kStrip; ++t) {
#pragma unroll
          for (int k = 0; k < 8; ++k) acc[t][k] = fmaf(win[t * S + b][k], wv[k], acc[t][k]);
        }
      }
    }
    float bv[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) bv[k] = bias ? bias[cg * 8 + k] : 0.f;
    T* yrow = y + ((img * g.oh + oh) * g.ow) * c + cg * 8;
#pragma unroll
    for (int t = 0; t < kStrip; ++t) {
      if (ow0 + t >= g.ow) break;
      uint32_t u[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        u[k] = to_bits(T{}, activate(g.act, g.p0, g.p1, acc[t][2 * k] + bv[2 * k])) |
               (to_bits(T{}, activate(g.act, g.p0, g.p1, acc[t][2 * k + 1] + bv[2 * k + 1])) << 16);
      }
      *reinterpret_cast<uint4*>(yrow + int64_t(ow0 + t) * c) = uint4{u[0], u[1], u[2], u[3]};
    }
  }
}

// Shared-memory tiles, any of the three forms above at strides 1 and 2: a block stages an output
// tile's input (the tile's rows and columns with the filter's halo, `cgs` groups of 8 channels)
// in shared memory with cp.async, 16 bytes an element and no register on the way, applies
// input_activation there once per element, then each thread computes strips of tile_p<S>()
// output pixels of 8 channels from it, while the next tile's input lands in a second buffer. A
// thread keeps one channel group, so its filter loads hit L1. The pixel and strip kernels
// instead decode each thread's position with 64-bit divisions and read every input column again
// per output row from L1 or L2; their loads are in flight only while their thread waits.
// Measured on EfficientNetV2-S FP16 at batch 32 (ncu, H200): a first version, one tile a block
// staged through registers one load at a time, took 234 us on a 24x24x960 3x3 layer where the
// strip kernel took 80.
template <int S>
constexpr int tile_p() {
  return S == 1 ? 4 : 2;  // output pixels a thread computes along a row
}
constexpr int kTileLanes = 32;          // strips a block computes per channel group
constexpr int kTileMaxGroups = 8;       // channel groups a block: 256 threads
constexpr int kTileSmem = 48 * 1024;    // bytes of one of a block's two staging buffers, at most
constexpr int kTileMaxBlocksY = 65535;  // gridDim.y holds the channel chunks

// The tile a block computes, chosen at launch from the output's size (tile_shape).
struct TileShape {
  int th = 8, tw = 16, cgs = 8;
  int tiles_w = 1, tiles = 1;  // tiles along W, tiles per image
};

template <typename F>
__device__ __forceinline__ void map8(float (&v)[8], F f) {
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = f(v[k]);
}

// activate() on eight values with one branch on the kind for the eight (activate() branches for
// each value); the forms are activate()'s, so the results are the same bits.
__device__ __forceinline__ void activate8(ConvActivation act, float p0, float p1, float (&v)[8]) {
  switch (act) {
    case ConvActivation::kNone:
      return;
    case ConvActivation::kRelu:
      map8(v, [](float y) { return y > 0.f ? y : 0.f; });
      return;
    case ConvActivation::kSilu:
      map8(v, [](float y) { return y / (1.f + __expf(-y)); });
      return;
    case ConvActivation::kHardSwish:
      map8(v, [](float y) { return y * fminf(fmaxf(y / 6.f + 0.5f, 0.f), 1.f); });
      return;
    default:
      map8(v, [&](float y) { return activate(act, p0, p1, y); });
      return;
  }
}

template <typename T>
__device__ __forceinline__ uint4 pack8(const float (&v)[8]) {
  uint32_t u[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) u[k] = to_bits(T{}, v[2 * k]) | (to_bits(T{}, v[2 * k + 1]) << 16);
  return uint4{u[0], u[1], u[2], u[3]};
}

// 16 bytes global -> shared without a register (cp.async), or 16 zero bytes where !fill.
__device__ __forceinline__ void copy16_async(uint4* dst, const uint4* src, bool fill) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(fill ? 16 : 0));
}
__device__ __forceinline__ void commit_async() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits for every group but the newest.
__device__ __forceinline__ void wait_async_but_newest() {
  asm volatile("cp.async.wait_group 1;\n" ::);
}

// The blocks of a channel chunk take turns over the (image, tile) jobs; each stages the next
// job's input while it computes the current one (two buffers), so loads are in flight while the
// SM computes. A job's input is its tile's rows and columns with the filter's halo.
template <typename T, int K, int S, bool kInAct>
__global__ void __launch_bounds__(kTileLanes* kTileMaxGroups)
    depthwise_nhwc_tile_kernel(const T* __restrict__ x, const T* __restrict__ w,
                               const float* __restrict__ bias, T* __restrict__ y, DwGeometry g,
                               TileShape ts) {
  constexpr int P = tile_p<S>();
  constexpr int kCols = (P - 1) * S + K;
  extern __shared__ uint4 smem[];  // two of [in_rows][in_cols][cgs], 8 values each
  const int cgs = ts.cgs;
  const int in_rows = (ts.th - 1) * S + K, in_cols = (ts.tw - 1) * S + K;
  const int chunks = in_rows * in_cols * cgs, step = int(blockDim.x);
  const int cg0 = int(blockIdx.y) * cgs;
  const int64_t c = int64_t(g.c8) * 8;
  const int64_t jobs = int64_t(ts.tiles) * g.n;
  const uint4* x16 = reinterpret_cast<const uint4*>(x);
  // Where job j's tile starts: its image, output row and column.
  auto origin = [&](int64_t j, int64_t* img, int* oh0, int* ow0) {
    *img = j / ts.tiles;
    const int t = int(j % ts.tiles);
    *oh0 = (t / ts.tiles_w) * ts.th, *ow0 = (t % ts.tiles_w) * ts.tw;
  };
  // Whether chunk e of job j's input lies in the image (else it stays zero: the padding pads
  // the activated X), and its address.
  auto source = [&](int64_t img, int oh0, int ow0, int e, const uint4** src) {
    const int cl = e % cgs, pix = e / cgs;
    const int ih = oh0 * S - g.pt + pix / in_cols, iw = ow0 * S - g.pl + pix % in_cols;
    const bool in = unsigned(ih) < unsigned(g.h) && unsigned(iw) < unsigned(g.w) && cg0 + cl < g.c8;
    *src = in ? x16 + ((img * g.h + ih) * g.w + iw) * g.c8 + cg0 + cl : x16;
    return in;
  };
  auto stage = [&](int64_t j, uint4* buf) {
    int64_t img;
    int oh0, ow0;
    origin(j, &img, &oh0, &ow0);
    for (int e = int(threadIdx.x); e < chunks; e += step) {
      const uint4* src;
      const bool in = source(img, oh0, ow0, e, &src);
      copy16_async(buf + e, src, in);
    }
  };
  const int cl = int(threadIdx.x) % cgs, cg = cg0 + cl;
  const int strips = ts.tw / P, items = ts.th * strips, lanes = step / cgs;
  const T* wc = w + (cg < g.c8 ? cg : 0) * 8;
  float bv[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) bv[k] = bias && cg < g.c8 ? bias[cg * 8 + k] : 0.f;
  int64_t j = blockIdx.x;
  if (j < jobs) stage(j, smem);
  commit_async();
  for (int round = 0; j < jobs; j += gridDim.x, ++round) {
    uint4* tile = smem + (round & 1) * chunks;
    if (j + gridDim.x < jobs) stage(j + gridDim.x, smem + ((round + 1) & 1) * chunks);
    commit_async();  // an empty group where there is no next job: the wait below counts groups
    wait_async_but_newest();
    int64_t img;
    int oh0, ow0;
    origin(j, &img, &oh0, &ow0);
    if constexpr (kInAct) {  // each thread activates the chunks it staged, now landed
      for (int e = int(threadIdx.x); e < chunks; e += step) {
        const uint4* src;
        if (!source(img, oh0, ow0, e, &src)) continue;
        float f[8];
        unpack8<T>(tile[e], f);
        activate8(g.in_act, g.ip0, g.ip1, f);
        tile[e] = pack8<T>(f);
      }
    }
    __syncthreads();  // every thread's chunks landed (and activated)
    for (int it = int(threadIdx.x) / cgs; cg < g.c8 && it < items; it += lanes) {
      const int r = it / strips, sx = it % strips;
      const int oh = oh0 + r, ow = ow0 + sx * P;
      if (oh >= g.oh || ow >= g.ow) continue;
      float acc[P][8];
#pragma unroll
      for (int q = 0; q < P; ++q) {
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[q][k] = 0.f;
      }
#pragma unroll 1
      for (int a = 0; a < K; ++a) {
        const uint4* row = tile + ((r * S + a) * in_cols + sx * P * S) * cgs + cl;
        float win[kCols][8];
#pragma unroll
        for (int jj = 0; jj < kCols; ++jj) unpack8<T>(row[jj * cgs], win[jj]);
#pragma unroll
        for (int b = 0; b < K; ++b) {
          float wv[8];
          load8(wc + (a * K + b) * c, wv);
#pragma unroll
          for (int q = 0; q < P; ++q) {
#pragma unroll
            for (int k = 0; k < 8; ++k) acc[q][k] = fmaf(win[q * S + b][k], wv[k], acc[q][k]);
          }
        }
      }
      T* yrow = y + ((img * g.oh + oh) * g.ow) * c + cg * 8;
#pragma unroll
      for (int q = 0; q < P; ++q) {
        if (ow + q >= g.ow) break;
        float o[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) o[k] = acc[q][k] + bv[k];
        activate8(g.act, g.p0, g.p1, o);
        *reinterpret_cast<uint4*>(yrow + int64_t(ow + q) * c) = pack8<T>(o);
      }
    }
    __syncthreads();  // the next round stages into the buffer this one read
  }
}

// The tactics. "pixel": one pixel a thread, any geometry. "strip4" and "tile": dilation 1, a
// square 3x3 or 5x5 filter at stride 1 or 2, or 7x7 at stride 1; the tile is the only one that
// applies an input_activation. The builder times those that
// fit at the opt shapes (depthwise_tactics).
enum class DwTactic { kPixel, kStrip, kTile };
constexpr const char* kPixelTactic = "pixel";
constexpr const char* kStripTactic = "strip4";
constexpr const char* kTileTactic = "tile";

const char* tactic_name(DwTactic t) {
  return t == DwTactic::kStrip ? kStripTactic : t == DwTactic::kTile ? kTileTactic : kPixelTactic;
}

// Whether a tactic fits these strides, dilations and filter sizes (one rule for the node's
// attributes at build time and a geometry at run time).
bool tactic_fits(DwTactic t, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t kh,
                 int64_t kw) {
  const bool square = kh == kw && (kh == 3 || kh == 5 || kh == 7) && dh == 1 && dw == 1;
  switch (t) {
    case DwTactic::kPixel:
      return true;
    case DwTactic::kStrip:
    case DwTactic::kTile:
      return square && sh == sw && (sh == 1 || (sh == 2 && kh <= 5));
  }
  return false;
}

// The tile for this output: of the tiles of 32 strips (th rows by 32 / th strips of P pixels),
// the one whose tiles cover the output with the fewest staged plus computed pixels, within the
// shared memory a block may use; then as many channel groups a block (up to 8) as leave about
// two blocks per SM.
TileShape tile_shape(const DwGeometry& g, int sms) {
  const int s = g.sh, k = g.kh, p = s == 1 ? 4 : 2;
  TileShape best;
  int64_t best_cost = -1;
  for (int th = 1; th <= kTileLanes; th *= 2) {
    const int tw = (kTileLanes / th) * p;
    const int in_rows = (th - 1) * s + k, in_cols = (tw - 1) * s + k;
    if (in_rows * in_cols * kTileMaxGroups * 16 > kTileSmem) continue;
    const int tiles_h = (g.oh + th - 1) / th, tiles_w = (g.ow + tw - 1) / tw;
    const int64_t cost = int64_t(tiles_h) * tiles_w * (int64_t(in_rows) * in_cols + th * tw);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best.th = th, best.tw = tw, best.tiles_w = tiles_w, best.tiles = tiles_h * tiles_w;
    }
  }
  int cgs = 1;
  while (cgs < kTileMaxGroups && cgs < g.c8) cgs *= 2;
  auto blocks = [&](int groups) {
    return int64_t(best.tiles) * g.n * ((g.c8 + groups - 1) / groups);
  };
  while (cgs > 1 && blocks(cgs) < 2 * int64_t(sms)) cgs /= 2;
  best.cgs = cgs;
  return best;
}

// Blocks a channel chunk: enough for two resident on each SM (their registers and two buffers
// allow two), no more than there are jobs.
constexpr int kTileBlocksPerSm = 2;

template <typename T, int K, int S, bool kInAct>
void launch_tile_kernel(const T* x, const T* w, const float* b, T* y, const DwGeometry& g,
                        const TileShape& ts, dim3 grid, unsigned threads, size_t smem,
                        cudaStream_t s) {
  // Two buffers may pass the 48 KB a launch gets by default; the attribute is the current
  // device's, so it is set for each launch that needs it (a failure shows as the launch's).
  if (smem > 48 * 1024) {
    (void)cudaFuncSetAttribute(depthwise_nhwc_tile_kernel<T, K, S, kInAct>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  }
  depthwise_nhwc_tile_kernel<T, K, S, kInAct><<<grid, threads, smem, s>>>(x, w, b, y, g, ts);
}

template <typename T, int K, int S>
void launch_tile(const T* x, const T* w, const float* b, T* y, const DwGeometry& g, int sms,
                 cudaStream_t s) {
  const TileShape ts = tile_shape(g, sms);
  const int64_t chunks_y = (g.c8 + ts.cgs - 1) / ts.cgs, jobs = int64_t(ts.tiles) * g.n;
  const int64_t per_chunk = (int64_t(kTileBlocksPerSm) * sms + chunks_y - 1) / chunks_y;
  const dim3 grid(unsigned(std::clamp<int64_t>(per_chunk, 1, jobs)), unsigned(chunks_y));
  const size_t smem =
      2 * size_t((ts.th - 1) * S + K) * size_t((ts.tw - 1) * S + K) * size_t(ts.cgs) * 16;
  const unsigned threads = unsigned(kTileLanes * ts.cgs);
  if (g.in_act != ConvActivation::kNone) {
    launch_tile_kernel<T, K, S, true>(x, w, b, y, g, ts, grid, threads, smem, s);
  } else {
    launch_tile_kernel<T, K, S, false>(x, w, b, y, g, ts, grid, threads, smem, s);
  }
}

// Ok when the tile kernel's grid holds this geometry (its channel chunks along y).
Status tile_grid_fits(const std::string& who, const DwGeometry& g, int sms) {
  const TileShape ts = tile_shape(g, sms);
  if ((g.c8 + ts.cgs - 1) / ts.cgs > kTileMaxBlocksY) {
    return unsupported(who + ": " + std::to_string(int64_t(g.c8) * 8) +
                       " channels are past the tile kernel's grid");
  }
  return ok_status();
}

template <typename T>
void launch(const void* x, const void* w, const float* b, void* y, const DwGeometry& g,
            DwTactic tactic, int sms, cudaStream_t s) {
  const T* tx = static_cast<const T*>(x);
  const T* tw = static_cast<const T*>(w);
  T* ty = static_cast<T*>(y);
  if (tactic == DwTactic::kTile) {
    if (g.sh == 2) {
      if (g.kh == 5) {
        launch_tile<T, 5, 2>(tx, tw, b, ty, g, sms, s);
      } else {
        launch_tile<T, 3, 2>(tx, tw, b, ty, g, sms, s);
      }
    } else if (g.kh == 7) {
      launch_tile<T, 7, 1>(tx, tw, b, ty, g, sms, s);
    } else if (g.kh == 5) {
      launch_tile<T, 5, 1>(tx, tw, b, ty, g, sms, s);
    } else {
      launch_tile<T, 3, 1>(tx, tw, b, ty, g, sms, s);
    }
    return;
  }
  if (tactic == DwTactic::kStrip) {
    const int strips = (g.ow + kStrip - 1) / kStrip;
    const unsigned sgrid = grid_for(g.n * g.oh * strips * g.c8, kStripBlock);
    if (g.sh == 2) {
      if (g.kh == 5) {
        depthwise_nhwc_strip_kernel<T, 5, 2><<<sgrid, kStripBlock, 0, s>>>(tx, tw, b, ty, g);
      } else {
        depthwise_nhwc_strip_kernel<T, 3, 2><<<sgrid, kStripBlock, 0, s>>>(tx, tw, b, ty, g);
      }
    } else if (g.kh == 7) {
      depthwise_nhwc_strip_kernel<T, 7, 1><<<sgrid, kStripBlock, 0, s>>>(tx, tw, b, ty, g);
    } else if (g.kh == 5) {
      depthwise_nhwc_strip_kernel<T, 5, 1><<<sgrid, kStripBlock, 0, s>>>(tx, tw, b, ty, g);
    } else {
      depthwise_nhwc_strip_kernel<T, 3, 1><<<sgrid, kStripBlock, 0, s>>>(tx, tw, b, ty, g);
    }
    return;
  }
  const unsigned grid = grid_for(g.n * g.oh * g.ow * g.c8, kBlock);
  if (g.kh == 3 && g.kw == 3) {
    depthwise_nhwc_kernel<T, 3, 3><<<grid, kBlock, 0, s>>>(tx, tw, b, ty, g);
  } else if (g.kh == 5 && g.kw == 5) {
    depthwise_nhwc_kernel<T, 5, 5><<<grid, kBlock, 0, s>>>(tx, tw, b, ty, g);
  } else {
    depthwise_nhwc_kernel<T, 0, 0><<<grid, kBlock, 0, s>>>(tx, tw, b, ty, g);
  }
}

// The filter as [kh*kw, C] and the bias in float, uploaded once per engine.
class DepthwisePrepared final : public PreparedNode {
 public:
  std::shared_ptr<const DeviceWeight> filter, bias;
};

// The padding before and after axis i (0: H, 1: W) for an input of `in` elements along it and a
// filter of k taps: the node's pads, or what SAME computes (UPPER puts the odd one after).
std::pair<int64_t, int64_t> pads_of(const ConvAttrs& a, size_t i, int64_t in, int64_t k) {
  const int64_t s = i < a.strides.size() ? a.strides[i] : 1;
  const int64_t d = i < a.dilations.size() ? a.dilations[i] : 1;
  if (a.auto_pad == "SAME_UPPER" || a.auto_pad == "SAME_LOWER") {
    const int64_t total = std::max<int64_t>(((in + s - 1) / s - 1) * s + (k - 1) * d + 1 - in, 0);
    const int64_t begin = a.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
    return {begin, total - begin};
  }
  if (a.auto_pad == "VALID" || a.pads.size() != 4) return {0, 0};
  return {a.pads[i], a.pads[2 + i]};
}

// The kernel's geometry for X, W ([C, kh, kw, 1]) and Y of these shapes; an error names what does
// not fit a channels-last depthwise convolution of a multiple of 8 channels.
StatusOr<DwGeometry> dw_geometry(const std::string& who, const ConvAttrs& attrs,
                                 std::span<const int64_t> x, std::span<const int64_t> w,
                                 std::span<const int64_t> y) {
  const int64_t c = x[3];
  if (w[0] != c || w[3] != 1 || y[3] != c || y[0] != x[0] || c % 8 != 0) {
    return invalid_argument(who + ": X " + shape_to_string(x) + ", W " + shape_to_string(w) +
                            " and Y " + shape_to_string(y) +
                            " are not a depthwise convolution of a multiple of 8 channels");
  }
  for (int64_t v : {x[1], x[2], y[1], y[2], w[1], w[2]}) {
    if (v > INT32_MAX)
      return unsupported(who + ": a spatial size of " + std::to_string(v) + " is past 32 bits");
  }
  DwGeometry g;
  g.n = x[0];
  g.h = int(x[1]), g.w = int(x[2]), g.c8 = int(c / 8);
  g.oh = int(y[1]), g.ow = int(y[2]);
  g.kh = int(w[1]), g.kw = int(w[2]);
  g.sh = int(attrs.strides.size() == 2 ? attrs.strides[0] : 1);
  g.sw = int(attrs.strides.size() == 2 ? attrs.strides[1] : 1);
  g.dh = int(attrs.dilations.size() == 2 ? attrs.dilations[0] : 1);
  g.dw = int(attrs.dilations.size() == 2 ? attrs.dilations[1] : 1);
  const auto [pt, pb] = pads_of(attrs, 0, g.h, g.kh);
  const auto [pl, pr] = pads_of(attrs, 1, g.w, g.kw);
  g.pt = int(pt), g.pl = int(pl);
  g.act = attrs.act, g.p0 = attrs.p0, g.p1 = attrs.p1;
  g.in_act = attrs.in_act, g.ip0 = attrs.ip0, g.ip1 = attrs.ip1;
  // The output size the attributes imply must be Y's (shape inference computed it; a mismatch
  // would read or write out of bounds).
  const int64_t eh = (int64_t(g.h) + pt + pb - (int64_t(g.kh) - 1) * g.dh - 1) / g.sh + 1;
  const int64_t ew = (int64_t(g.w) + pl + pr - (int64_t(g.kw) - 1) * g.dw - 1) / g.sw + 1;
  if (eh != g.oh || ew != g.ow) {
    return invalid_argument(who + ": Y " + shape_to_string(y) + " is not the output of X " +
                            shape_to_string(x) + " under the node's strides, pads and dilations");
  }
  return g;
}

class DepthwiseKernel final : public CudaKernel {
 public:
  DepthwiseKernel(DType t, ConvAttrs attrs, const DepthwisePrepared* prepared, DwTactic tactic)
      : CudaKernel("cuda.FusedConv"),
        t_(t),
        attrs_(std::move(attrs)),
        prepared_(prepared),
        tactic_(tactic),
        sms_(tactic == DwTactic::kTile ? current_sms() : 1) {}

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    const TensorView& w = in[1];
    const TensorView& y = out[0];
    if (x.rank() != 4 || w.rank() != 4 || y.rank() != 4)
      return invalid_argument(name_ + ": X, W and Y must be rank 4");
    KILN_ASSIGN_OR_RETURN(DwGeometry g, dw_geometry(name_, attrs_, x.shape, w.shape, y.shape));
    KILN_RETURN_IF_ERROR(check_fused_operands(name_, in, y, t_, x.shape[3]));
    if (in.size() > 3 && present(in[3])) return invalid_argument(name_ + ": takes no residual Z");
    // The tactic fits the node's attributes and filter (make_depthwise), so it fits g.
    if (y.numel() == 0) return ok_status();
    if (tactic_ == DwTactic::kTile) KILN_RETURN_IF_ERROR(tile_grid_fits(name_, g, sms_));
    if (!prepared_ || !prepared_->filter)
      return internal_error(name_ + ": the prepared filter is missing");
    if (!aligned16(x.data) || !aligned16(y.data)) {
      return invalid_argument(name_ + ": X and Y must start at 16-byte aligned addresses");
    }
    const void* filter = prepared_->filter->data;
    const float* bias =
        prepared_->bias ? static_cast<const float*>(prepared_->bias->data) : nullptr;
    if (t_ == DType::kFloat16) {
      launch<__half>(x.data, filter, bias, y.data, g, tactic_, sms_, stream_);
    } else {
      launch<__nv_bfloat16>(x.data, filter, bias, y.data, g, tactic_, sms_, stream_);
    }
    return launch_status(tactic_ == DwTactic::kTile    ? "depthwise_nhwc_tile_kernel"
                         : tactic_ == DwTactic::kStrip ? "depthwise_nhwc_strip_kernel"
                                                       : "depthwise_nhwc_kernel");
  }

 private:
  DType t_;
  ConvAttrs attrs_;
  const DepthwisePrepared* prepared_;
  DwTactic tactic_;
  int sms_;  // the device's SMs, for the tile kernel's blocks
};

// Whether a tactic fits the node's attributes and filter (tactic_fits before shapes are known).
bool node_fits(DwTactic t, const KernelQuery& q, const ConvAttrs& c) {
  auto at = [](const std::vector<int64_t>& v, size_t i) { return i < v.size() ? v[i] : 1; };
  const Shape& ws = q.inputs[1]->constant->shape();
  return tactic_fits(t, at(c.strides, 0), at(c.strides, 1), at(c.dilations, 0), at(c.dilations, 1),
                     ws[1], ws[2]);
}

// Ok when this kernel runs the node; else why not (the builder then asks cuDNN).
Status check_depthwise(const KernelQuery& q, const ConvAttrs& c) {
  const std::string who = q.node.describe() + ": cuda.FusedConv";
  if (q.node.op_type != "FusedConv" || !c.nhwc)
    return unsupported(who + " runs channels-last FusedConv only");
  const DType t = q.input_dtype(0);
  if (!is_half(t))
    return unsupported(who + " takes float16 or bfloat16 tensors, not " +
                       std::string(dtype_name(t)));
  if (q.output_dtype(0) != t) return unsupported(who + " takes one dtype; Y differs from X");
  const ir::Value* x = q.inputs.empty() ? nullptr : q.inputs[0];
  const ir::Value* w = q.inputs.size() > 1 ? q.inputs[1] : nullptr;
  const ir::Value* b = q.inputs.size() > 2 ? q.inputs[2] : nullptr;
  if (q.inputs.size() > 3 && q.inputs[3]) return unsupported(who + " takes no residual input");
  if (!x || !x->shape || x->shape->size() != 4 || !w || !w->shape || w->shape->size() != 4) {
    return unsupported(who + " runs 2-D convolutions (rank-4 X and W)");
  }
  if (!w->constant || w->dtype != t || (b && (!b->constant || b->dtype != t))) {
    return unsupported(who + " takes a constant filter and bias of X's dtype");
  }
  const auto& xs = *x->shape;
  const Shape& ws = w->constant->shape();
  if (!xs[3].is_const() || xs[3].value() != c.group || ws[0] != c.group || ws[3] != 1) {
    return unsupported(who + " runs depthwise convolutions (group = channels, one filter each)");
  }
  if (c.group % 8 != 0) return unsupported(who + " runs channel counts that are multiples of 8");
  if (ws[1] > kMaxTaps || ws[2] > kMaxTaps) {
    return unsupported(who + " runs filters up to " + std::to_string(kMaxTaps) + "x" +
                       std::to_string(kMaxTaps));
  }
  if (b && b->constant->numel() != c.group) return unsupported(who + ": B has the wrong size");
  if (c.auto_pad != "NOTSET" && c.auto_pad != "VALID" && c.auto_pad != "SAME_UPPER" &&
      c.auto_pad != "SAME_LOWER") {
    return invalid_argument(q.node.describe() + ": unknown auto_pad '" + c.auto_pad + "'");
  }
  if ((!c.strides.empty() && c.strides.size() != 2) ||
      (!c.dilations.empty() && c.dilations.size() != 2) ||
      (!c.pads.empty() && c.pads.size() != 4)) {
    return unsupported(who + ": strides, dilations or pads of the wrong length");
  }
  for (size_t i = 0; i < c.strides.size(); ++i) {
    if (c.strides[i] < 1 || c.strides[i] > 64)
      return unsupported(who + ": stride " + std::to_string(c.strides[i]));
  }
  for (size_t i = 0; i < c.dilations.size(); ++i) {
    if (c.dilations[i] < 1 || c.dilations[i] > 64) {
      return unsupported(who + ": dilation " + std::to_string(c.dilations[i]));
    }
  }
  for (int64_t p : c.pads) {
    if (p < 0 || p > 64) return unsupported(who + ": pad " + std::to_string(p));
  }
  if (c.in_act != ConvActivation::kNone && !node_fits(DwTactic::kTile, q, c)) {
    return unsupported(who +
                       " applies an input_activation only with a 3x3 or 5x5 filter at "
                       "stride 1 or 2, or 7x7 at stride 1, dilation 1");
  }
  return ok_status();
}

// The tactics that run this node: the tile alone where it has an input_activation, else each
// that fits, in the untimed order (one pixel first for 3x3 filters, the strip first for 5x5
// and 7x7, as measured before the tile kernel; the tile last until its measurements say more).
std::vector<DwTactic> fitting_tactics(const KernelQuery& q, const ConvAttrs& c) {
  if (c.in_act != ConvActivation::kNone) return {DwTactic::kTile};
  std::vector<DwTactic> out = {DwTactic::kPixel};
  if (node_fits(DwTactic::kStrip, q, c)) {
    const bool three = q.inputs[1]->constant->shape()[1] == 3;
    out.insert(three ? out.end() : out.begin(), DwTactic::kStrip);
  }
  if (node_fits(DwTactic::kTile, q, c)) out.push_back(DwTactic::kTile);
  return out;
}

StatusOr<std::unique_ptr<Kernel>> make_depthwise(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(ConvAttrs c, conv_attrs(q));
  KILN_RETURN_IF_ERROR(check_depthwise(q, c));
  const std::vector<DwTactic> fit = fitting_tactics(q, c);
  DwTactic tactic = fit.front();
  if (!q.tactic.empty()) {
    auto it = std::find_if(fit.begin(), fit.end(),
                           [&](DwTactic t) { return q.tactic == tactic_name(t); });
    if (it == fit.end()) {
      std::string names;
      for (DwTactic t : fit) names += std::string(names.empty() ? "" : ", ") + tactic_name(t);
      return invalid_argument(q.node.describe() + ": depthwise tactic '" + q.tactic +
                              "' does not run this node (its tactics: " + names + ")");
    }
    tactic = *it;
  }
  // Null when supports() asks (nothing is prepared then); execute() refuses to run without it.
  const auto* prepared = dynamic_cast<const DepthwisePrepared*>(q.prepared);
  return std::unique_ptr<Kernel>(
      new DepthwiseKernel(q.input_dtype(0), std::move(c), prepared, tactic));
}

// The tactics that fit (fitting_tactics), each timed (one run, then the mean of five) on
// zero-filled operands at the opt shapes and, where they differ, at the min shapes, from
// optimization level 1; fastest at the opt shapes first. Empty where nothing was timed.
std::vector<TimedTactic> depthwise_timed_tactics(const KernelQuery& q) {
  auto c = conv_attrs(q);
  if (!c.ok() || !check_depthwise(q, *c).ok() || q.optimization_level < 1) return {};
  const std::vector<DwTactic> fit = fitting_tactics(q, *c);
  auto geometry_at = [&](bool opt) -> std::optional<DwGeometry> {
    auto x = opt ? q.opt_shape(q.inputs[0]) : q.min_shape(q.inputs[0]);
    auto y = q.outputs.empty() ? std::nullopt
             : opt             ? q.opt_shape(q.outputs[0])
                               : q.min_shape(q.outputs[0]);
    if (!x || !y || x->size() != 4 || y->size() != 4 || shape_numel(*y) == 0) return std::nullopt;
    auto g = dw_geometry(q.node.describe(), *c, *x, q.inputs[1]->constant->shape(), *y);
    return g.ok() ? std::optional<DwGeometry>(*g) : std::nullopt;
  };
  const std::optional<DwGeometry> opt = geometry_at(true), min = geometry_at(false);
  static cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    return cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess ? s : nullptr;
  }();
  const int sms = current_sms();
  if (!opt || !stream || !tile_grid_fits("", *opt, sms).ok()) return {};
  // The opt shapes exist where `opt` does (geometry_at checked them).
  const Shape x = *q.opt_shape(q.inputs[0]), y = *q.opt_shape(q.outputs[0]);
  TimingBuffers buffers;
  const int64_t ch = int64_t(opt->c8) * 8;
  void* px = buffers.alloc(size_t(shape_numel(x)) * 2);
  void* pw = buffers.alloc(size_t(ch * opt->kh * opt->kw) * 2);
  void* py = buffers.alloc(size_t(shape_numel(y)) * 2);
  void* pb = buffers.alloc(size_t(ch) * 4);
  if (!px || !pw || !py || !pb) return {};
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    cudaGetLastError();
    if (start) cudaEventDestroy(start);
    return {};
  }
  const bool half = q.input_dtype(0) == DType::kFloat16;
  const float* bias = q.inputs.size() > 2 && q.inputs[2] ? static_cast<const float*>(pb) : nullptr;
  // Milliseconds a run (the mean of five after one), or -1 where it failed.
  auto time = [&](DwTactic tactic, const DwGeometry& g) -> double {
    auto run = [&] {
      if (half) {
        launch<__half>(px, pw, bias, py, g, tactic, sms, stream);
      } else {
        launch<__nv_bfloat16>(px, pw, bias, py, g, tactic, sms, stream);
      }
    };
    run();
    cudaEventRecord(start, stream);
    for (int i = 0; i < 5; ++i) run();
    cudaEventRecord(stop, stream);
    float ms = 0;
    const bool timed = cudaEventSynchronize(stop) == cudaSuccess &&
                       cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
    cudaGetLastError();
    return timed ? double(ms) / 5 : -1.0;
  };
  const bool at_min = min && min->n < opt->n && tile_grid_fits("", *min, sms).ok();
  std::vector<TimedTactic> timed;
  bool failed = false;
  for (DwTactic t : fit) {
    TimedTactic tt{tactic_name(t), time(t, *opt), at_min ? time(t, *min) : -1.0};
    failed = failed || tt.opt_ms < 0 || (at_min && tt.min_ms < 0);
    timed.push_back(std::move(tt));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (failed) return {};
  std::stable_sort(timed.begin(), timed.end(),
                   [](const auto& l, const auto& r) { return l.opt_ms < r.opt_ms; });
  return timed;
}

// depthwise_timed_tactics' order; untimed, fitting_tactics' order.
std::vector<std::string> depthwise_tactics(const KernelQuery& q) {
  std::vector<std::string> order;
  for (const TimedTactic& t : depthwise_timed_tactics(q)) order.push_back(t.tactic);
  if (!order.empty()) return order;
  auto c = conv_attrs(q);
  if (!c.ok() || !check_depthwise(q, *c).ok()) return {kPixelTactic};
  for (DwTactic t : fitting_tactics(q, *c)) order.push_back(tactic_name(t));
  return order;
}

StatusOr<std::shared_ptr<const PreparedNode>> prepare_depthwise(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(ConvAttrs c, conv_attrs(q));
  KILN_RETURN_IF_ERROR(check_depthwise(q, c));
  const Tensor& w = *q.inputs[1]->constant;  // [C, kh, kw, 1] of 16-bit elements
  const int64_t ch = w.shape()[0], taps = w.shape()[1] * w.shape()[2];
  std::vector<uint16_t> taps_major(size_t(ch * taps));
  const auto* src = static_cast<const uint16_t*>(w.data());
  for (int64_t k = 0; k < ch; ++k) {
    for (int64_t t = 0; t < taps; ++t) taps_major[size_t(t * ch + k)] = src[k * taps + t];
  }
  auto prepared = std::make_shared<DepthwisePrepared>();
  KILN_ASSIGN_OR_RETURN(
      prepared->filter,
      device_bytes({reinterpret_cast<const uint8_t*>(taps_major.data()), taps_major.size() * 2},
                   kTapsMajor));
  const ir::Value* b = q.inputs.size() > 2 ? q.inputs[2] : nullptr;
  if (b) {
    std::vector<float> bias(static_cast<size_t>(ch));
    for (int64_t k = 0; k < ch; ++k) bias[size_t(k)] = float(b->constant->float_at(k));
    KILN_ASSIGN_OR_RETURN(
        prepared->bias,
        device_bytes({reinterpret_cast<const uint8_t*>(bias.data()), bias.size() * 4}, kBiasFloat));
  }
  return std::shared_ptr<const PreparedNode>(std::move(prepared));
}

}  // namespace

// Registered before cuDNN's convolutions: where cuDNN's graph API runs the node too, the builder
// weighs both implementations' timed tactics (select_kernels); else it takes this one.
void register_conv_depthwise(Registry& r) {
  r.add(OpKind::kFusedConv, &make_depthwise,
        {.prepare = &prepare_depthwise,
         .tactics = &depthwise_tactics,
         .timed_tactics = &depthwise_timed_tactics});
}

}  // namespace kiln::backends::cuda
