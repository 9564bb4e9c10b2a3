// Depthwise NHWC float16 kernel forms side by side at MobileNetV3-Large's (batch 64) and
// EfficientNetV2-S's (batch 32, 384x384) depthwise layer shapes, on the GPU host, outside kiln: a
// place to try a kernel form before it goes into src/backends/cuda/conv_depthwise.cu. Each form is
// checked against the one-pixel kernel (d = the largest difference) and timed with CUDA events
// (median of 15 repetitions of 20 launches; the input stays in L2 where it fits, as a layer's
// input often does in a model). Forms: `pixel` (one output pixel of 8 channels a thread, float
// sums: kiln's "pixel" tactic), `tTHxTWh|f` (a TH x TW block of output pixels a thread, the block's
// input rows walked once, float sums, the filter in half or pre-converted to float; t1x4h is kiln's
// "strip4" with its rows unrolled), `hTHxTW[_zr][_f9]` (the same with the products summed in half2
// by HFMA2 into partial sums added into float sums per filter row, _f9: per nine products for a
// 3x3 filter, _zr: rows outside the image computed as zeros). The half2 forms break kiln's
// FP32-accumulation contract (docs/precision.md) and are measured here, not shipped. REPS=1 and a
// layer index as the argument run one layer once (for ncu).
//   nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/dw bench/depthwise_micro.cu && /tmp/dw [LAYER]
//   python3 bench/depthwise_micro_torch.py   # cuDNN's depthwise (torch) at the same shapes
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

struct G {
  int n, h, w, c8, oh, ow, s, pt, pl, k;
};

__device__ __forceinline__ float hs(float y) { return y * fminf(fmaxf(y / 6.f + 0.5f, 0.f), 1.f); }

__device__ __forceinline__ void unpack8(const uint4& raw, float (&v)[8]) {
  const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[2 * k] = __half2float(__ushort_as_half((unsigned short)(u[k] & 0xffffu)));
    v[2 * k + 1] = __half2float(__ushort_as_half((unsigned short)(u[k] >> 16)));
  }
}
__device__ __forceinline__ uint4 pack8(const float (&v)[8]) {
  uint32_t u[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    u[k] = __half_as_ushort(__float2half_rn(v[2 * k])) |
           (uint32_t(__half_as_ushort(__float2half_rn(v[2 * k + 1]))) << 16);
  return uint4{u[0], u[1], u[2], u[3]};
}

// Reference/current: one pixel a thread.
template <int K>
__global__ void __launch_bounds__(256)
    pixel(const __half* __restrict__ x, const __half* __restrict__ w,
          const float* __restrict__ bias, __half* __restrict__ y, G g) {
  const int64_t c = int64_t(g.c8) * 8;
  const int64_t total = int64_t(g.n) * g.oh * g.ow * g.c8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int cg = int(i % g.c8);
    int64_t r = i / g.c8;
    const int ow = int(r % g.ow);
    r /= g.ow;
    const int oh = int(r % g.oh);
    const int64_t img = r / g.oh;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const __half* xc = x + img * g.h * g.w * c + cg * 8;
#pragma unroll
    for (int a = 0; a < K; ++a) {
      const int ih = oh * g.s - g.pt + a;
      if (unsigned(ih) >= unsigned(g.h)) continue;
#pragma unroll
      for (int b = 0; b < K; ++b) {
        const int iw = ow * g.s - g.pl + b;
        if (unsigned(iw) >= unsigned(g.w)) continue;
        float wv[8], xv[8];
        unpack8(__ldg(reinterpret_cast<const uint4*>(w + (a * K + b) * c + cg * 8)), wv);
        unpack8(__ldg(reinterpret_cast<const uint4*>(xc + (int64_t(ih) * g.w + iw) * c)), xv);
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[k] = fmaf(xv[k], wv[k], acc[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] = hs(acc[k] + bias[cg * 8 + k]);
    *reinterpret_cast<uint4*>(y + ((img * g.oh + oh) * g.ow + ow) * c + cg * 8) = pack8(acc);
  }
}

// TH x TW outputs (8 channels) a thread; input rows walked once, each row's columns loaded and
// converted once; the filter in float ([K*K, C]) when FF, else half.
template <int K, int S, int TH, int TW, bool FF>
__global__ void __launch_bounds__(128)
    tile(const __half* __restrict__ x, const void* __restrict__ wv_, const float* __restrict__ bias,
         __half* __restrict__ y, G g) {
  constexpr int IR = (TH - 1) * S + K, IC = (TW - 1) * S + K;
  const int64_t c = int64_t(g.c8) * 8;
  const int tiles_w = (g.ow + TW - 1) / TW, tiles_h = (g.oh + TH - 1) / TH;
  const int64_t total = int64_t(g.n) * tiles_h * tiles_w * g.c8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int cg = int(i % g.c8);
    int64_t r = i / g.c8;
    const int tx = int(r % tiles_w);
    r /= tiles_w;
    const int ty = int(r % tiles_h);
    const int64_t img = r / tiles_h;
    const int oh0 = ty * TH, ow0 = tx * TW;
    float acc[TH][TW][8];
#pragma unroll
    for (int t = 0; t < TH; ++t)
#pragma unroll
      for (int q = 0; q < TW; ++q)
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[t][q][k] = 0.f;
    const __half* xc = x + img * g.h * g.w * c + cg * 8;
    const int ih0 = oh0 * S - g.pt, iw0 = ow0 * S - g.pl;
#pragma unroll
    for (int ir = 0; ir < IR; ++ir) {
      const int ih = ih0 + ir;
      if (unsigned(ih) >= unsigned(g.h)) continue;
      const __half* row = xc + int64_t(ih) * g.w * c;
      float win[IC][8];
#pragma unroll
      for (int j = 0; j < IC; ++j) {
        const int iw = iw0 + j;
        const uint4 raw = unsigned(iw) < unsigned(g.w)
                              ? __ldg(reinterpret_cast<const uint4*>(row + int64_t(iw) * c))
                              : make_uint4(0, 0, 0, 0);
        unpack8(raw, win[j]);
      }
#pragma unroll
      for (int t = 0; t < TH; ++t) {
        const int a = ir - t * S;
        if (a < 0 || a >= K) continue;
#pragma unroll
        for (int b = 0; b < K; ++b) {
          float wv[8];
          if constexpr (FF) {
            const float4* wp = reinterpret_cast<const float4*>(static_cast<const float*>(wv_) +
                                                               (a * K + b) * c + cg * 8);
            const float4 w0 = __ldg(wp), w1 = __ldg(wp + 1);
            wv[0] = w0.x, wv[1] = w0.y, wv[2] = w0.z, wv[3] = w0.w, wv[4] = w1.x, wv[5] = w1.y,
            wv[6] = w1.z, wv[7] = w1.w;
          } else {
            unpack8(__ldg(reinterpret_cast<const uint4*>(static_cast<const __half*>(wv_) +
                                                         (a * K + b) * c + cg * 8)),
                    wv);
          }
#pragma unroll
          for (int q = 0; q < TW; ++q)
#pragma unroll
            for (int k = 0; k < 8; ++k) acc[t][q][k] = fmaf(win[q * S + b][k], wv[k], acc[t][q][k]);
        }
      }
    }
    float bv[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) bv[k] = bias[cg * 8 + k];
#pragma unroll
    for (int t = 0; t < TH; ++t) {
      if (oh0 + t >= g.oh) break;
#pragma unroll
      for (int q = 0; q < TW; ++q) {
        if (ow0 + q >= g.ow) break;
        float o[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) o[k] = hs(acc[t][q][k] + bv[k]);
        *reinterpret_cast<uint4*>(y + ((img * g.oh + oh0 + t) * g.ow + ow0 + q) * c + cg * 8) =
            pack8(o);
      }
    }
  }
}

// Half2 products and sums in fp32 over a row: like tile but the products of a row's taps summed in
// half2 (HFMA2) before being added in fp32: at most K products per half2 partial sum.
template <int K, int S, int TH, int TW, bool ZR = false, bool F9 = false>
__global__ void __launch_bounds__(128)
    tileh(const __half* __restrict__ x, const __half* __restrict__ w,
          const float* __restrict__ bias, __half* __restrict__ y, G g) {
  constexpr int IR = (TH - 1) * S + K, IC = (TW - 1) * S + K;
  const int64_t c = int64_t(g.c8) * 8;
  const int tiles_w = (g.ow + TW - 1) / TW, tiles_h = (g.oh + TH - 1) / TH;
  const int64_t total = int64_t(g.n) * tiles_h * tiles_w * g.c8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int cg = int(i % g.c8);
    int64_t r = i / g.c8;
    const int tx = int(r % tiles_w);
    r /= tiles_w;
    const int ty = int(r % tiles_h);
    const int64_t img = r / tiles_h;
    const int oh0 = ty * TH, ow0 = tx * TW;
    float acc[TH][TW][8];
#pragma unroll
    for (int t = 0; t < TH; ++t)
#pragma unroll
      for (int q = 0; q < TW; ++q)
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[t][q][k] = 0.f;
    __half2 parts[TH][TW][4];
#pragma unroll
    for (int t = 0; t < TH; ++t)
#pragma unroll
      for (int q = 0; q < TW; ++q)
#pragma unroll
        for (int k = 0; k < 4; ++k) parts[t][q][k] = __float2half2_rn(0.f);
    const __half* xc = x + img * g.h * g.w * c + cg * 8;
    const int ih0 = oh0 * S - g.pt, iw0 = ow0 * S - g.pl;
#pragma unroll
    for (int ir = 0; ir < IR; ++ir) {
      const int ih = ih0 + ir;
      const bool row_in = unsigned(ih) < unsigned(g.h);
      if (!ZR && !row_in) continue;
      const __half* row = xc + int64_t(row_in ? ih : 0) * g.w * c;
      uint4 win[IC];
#pragma unroll
      for (int j = 0; j < IC; ++j) {
        const int iw = iw0 + j;
        win[j] = row_in && unsigned(iw) < unsigned(g.w)
                     ? __ldg(reinterpret_cast<const uint4*>(row + int64_t(iw) * c))
                     : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int t = 0; t < TH; ++t) {
        const int a = ir - t * S;
        if (a < 0 || a >= K) continue;
        __half2(&part)[TW][4] = parts[t];
#pragma unroll
        for (int b = 0; b < K; ++b) {
          const uint4 wr = __ldg(reinterpret_cast<const uint4*>(w + (a * K + b) * c + cg * 8));
          const __half2* wh = reinterpret_cast<const __half2*>(&wr);
#pragma unroll
          for (int q = 0; q < TW; ++q) {
            const __half2* xh = reinterpret_cast<const __half2*>(&win[q * S + b]);
#pragma unroll
            for (int k = 0; k < 4; ++k) part[q][k] = __hfma2(xh[k], wh[k], part[q][k]);
          }
        }
        if (!F9 || K > 3) {
#pragma unroll
          for (int q = 0; q < TW; ++q)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const float2 f = __half22float2(part[q][k]);
              acc[t][q][2 * k] += f.x, acc[t][q][2 * k + 1] += f.y;
              part[q][k] = __float2half2_rn(0.f);
            }
        }
      }
    }
    if constexpr (F9 && K == 3) {
#pragma unroll
      for (int t = 0; t < TH; ++t)
#pragma unroll
        for (int q = 0; q < TW; ++q)
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const float2 f = __half22float2(parts[t][q][k]);
            acc[t][q][2 * k] += f.x, acc[t][q][2 * k + 1] += f.y;
          }
    }
    float bv[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) bv[k] = bias[cg * 8 + k];
#pragma unroll
    for (int t = 0; t < TH; ++t) {
      if (oh0 + t >= g.oh) break;
#pragma unroll
      for (int q = 0; q < TW; ++q) {
        if (ow0 + q >= g.ow) break;
        float o[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) o[k] = hs(acc[t][q][k] + bv[k]);
        *reinterpret_cast<uint4*>(y + ((img * g.oh + oh0 + t) * g.ow + ow0 + q) * c + cg * 8) =
            pack8(o);
      }
    }
  }
}

#define CK(x)                                                     \
  do {                                                            \
    cudaError_t e = (x);                                          \
    if (e != cudaSuccess) {                                       \
      printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); \
      exit(1);                                                    \
    }                                                             \
  } while (0)

static int sms = 132;
static unsigned grid_for(int64_t total, int block) {
  return unsigned(std::min<int64_t>((total + block - 1) / block, int64_t(sms) * 32));
}

template <typename F>
float time_it(F f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  static const int reps = getenv("REPS") ? atoi(getenv("REPS")) : 15;
  for (int i = 0; i < (reps > 1 ? 20 : 0); ++i) f();
  std::vector<float> ts;
  for (int rep = 0; rep < reps; ++rep) {
    cudaEventRecord(a);
    for (int i = 0; i < (reps > 1 ? 20 : 1); ++i) f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    ts.push_back(ms * 1000.f / 20);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

struct Layer {
  int n, c, h, k, s;
};

template <int K, int S, int TH, int TW, bool FF>
float run_tile(const __half* x, const void* w, const float* b, __half* y, G g) {
  const int64_t total = int64_t(g.n) * ((g.oh + TH - 1) / TH) * ((g.ow + TW - 1) / TW) * g.c8;
  auto f = [&] { tile<K, S, TH, TW, FF><<<grid_for(total, 128), 128>>>(x, w, b, y, g); };
  f();
  CK(cudaDeviceSynchronize());
  return time_it(f);
}
template <int K, int S, int TH, int TW, bool ZR = false, bool F9 = false>
float run_tileh(const __half* x, const __half* w, const float* b, __half* y, G g) {
  const int64_t total = int64_t(g.n) * ((g.oh + TH - 1) / TH) * ((g.ow + TW - 1) / TW) * g.c8;
  auto f = [&] { tileh<K, S, TH, TW, ZR, F9><<<grid_for(total, 128), 128>>>(x, w, b, y, g); };
  f();
  CK(cudaDeviceSynchronize());
  return time_it(f);
}

static float maxdiff(const __half* a, const __half* b, size_t n) {
  std::vector<__half> ha(n), hb(n);
  cudaMemcpy(ha.data(), a, n * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(hb.data(), b, n * 2, cudaMemcpyDeviceToHost);
  float m = 0;
  for (size_t i = 0; i < n; ++i)
    m = std::max(m, std::fabs(__half2float(ha[i]) - __half2float(hb[i])));
  return m;
}

template <int K, int S>
void bench(const Layer& L, const char* only) {
  G g;
  g.n = L.n, g.h = g.w = L.h, g.c8 = L.c / 8, g.k = K, g.s = S, g.pt = g.pl = K / 2;
  g.oh = g.ow = (L.h + 2 * (K / 2) - K) / S + 1;
  const size_t nx = size_t(g.n) * g.h * g.w * L.c, ny = size_t(g.n) * g.oh * g.ow * L.c,
               nw = size_t(K) * K * L.c;
  __half *x, *w, *y, *yr;
  float *wf, *b;
  CK(cudaMalloc(&x, nx * 2));
  CK(cudaMalloc(&y, ny * 2));
  CK(cudaMalloc(&yr, ny * 2));
  CK(cudaMalloc(&w, nw * 2));
  CK(cudaMalloc(&wf, nw * 4));
  CK(cudaMalloc(&b, L.c * 4));
  {
    std::vector<__half> hx(nx), hw(nw);
    std::vector<float> hwf(nw), hb(L.c);
    srand(1);
    for (auto& v : hx) v = __float2half((rand() % 2001 - 1000) / 500.f);
    for (size_t i = 0; i < nw; ++i) {
      hw[i] = __float2half((rand() % 2001 - 1000) / 3000.f);
      hwf[i] = __half2float(hw[i]);
    }
    for (auto& v : hb) v = (rand() % 2001 - 1000) / 2000.f;
    cudaMemcpy(x, hx.data(), nx * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(w, hw.data(), nw * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(wf, hwf.data(), nw * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(b, hb.data(), L.c * 4, cudaMemcpyHostToDevice);
  }
  const double mb = (nx + ny) * 2 / 1e6;
  const int64_t tp = int64_t(g.n) * g.oh * g.ow * g.c8;
  auto fp = [&] { pixel<K><<<grid_for(tp, 256), 256>>>(x, w, b, yr, g); };
  fp();
  CK(cudaDeviceSynchronize());
  const float tpix = time_it(fp);
  printf("n%d c%d h%d k%d s%d  %.1f MB  pixel %.1f us (%.2f TB/s)", L.n, L.c, L.h, K, S, mb, tpix,
         mb / tpix);
  auto rep = [&](const char* name, float t) {
    printf(" | %s %.1f (%.2f) d=%.3g", name, t, mb / t, maxdiff(y, yr, ny));
    cudaMemset(y, 0, ny * 2);
  };
  if (S == 1) {
    rep("t1x4h", run_tile<K, S, 1, 4, false>(x, w, b, y, g));
    rep("h1x4", run_tileh<K, S, 1, 4>(x, w, b, y, g));
    rep("h1x4_zr", run_tileh<K, S, 1, 4, true, false>(x, w, b, y, g));
    rep("h1x4_f9", run_tileh<K, S, 1, 4, false, true>(x, w, b, y, g));
    rep("h1x4_kiln", run_tileh<K, S, 1, 4, true, true>(x, w, b, y, g));
    rep("h2x4_f9", run_tileh<K, S, 2, 4, false, true>(x, w, b, y, g));
    rep("h1x8_f9", run_tileh<K, S, 1, 8, false, true>(x, w, b, y, g));
  } else {
    rep("h2x2", run_tileh<K, S, 2, 2>(x, w, b, y, g));
    rep("h2x2_f9", run_tileh<K, S, 2, 2, false, true>(x, w, b, y, g));
    rep("h2x2_kiln", run_tileh<K, S, 2, 2, true, true>(x, w, b, y, g));
    rep("h1x4_f9", run_tileh<K, S, 1, 4, false, true>(x, w, b, y, g));
    rep("h2x4_f9", run_tileh<K, S, 2, 4, false, true>(x, w, b, y, g));
  }
  printf("\n");
  fflush(stdout);
  cudaFree(x), cudaFree(y), cudaFree(yr), cudaFree(w), cudaFree(wf), cudaFree(b);
}

int main(int argc, char** argv) {
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const char* only = argc > 1 ? argv[1] : "";
  const Layer ls[] = {
      {64, 16, 112, 3, 1},
      {64, 64, 112, 3, 2},
      {64, 72, 56, 3, 1},
      {64, 72, 56, 5, 2},
      {64, 120, 28, 5, 1},
      {64, 240, 28, 3, 2},
      {64, 200, 14, 3, 1},
      {64, 184, 14, 3, 1},
      {64, 480, 14, 3, 1},
      {64, 672, 14, 3, 1},
      {64, 672, 14, 5, 2},
      {64, 960, 7, 5, 1},
      // EfficientNetV2-S b32 at 384 (its perf shape): stages 4..6's depthwise 3x3
      {32, 256, 48, 3, 2},
      {32, 512, 24, 3, 1},
      {32, 768, 24, 3, 1},
      {32, 960, 24, 3, 1},
      {32, 960, 24, 3, 2},
      {32, 1536, 12, 3, 1},
  };
  int idx = -1;
  for (const Layer& L : ls) {
    ++idx;
    if (argc > 1 && atoi(argv[1]) != idx) continue;
    if (L.k == 3 && L.s == 1) bench<3, 1>(L, only);
    if (L.k == 3 && L.s == 2) bench<3, 2>(L, only);
    if (L.k == 5 && L.s == 1) bench<5, 1>(L, only);
    if (L.k == 5 && L.s == 2) bench<5, 2>(L, only);
  }
  return 0;
}
