// Attention over at most kShortAttentionKeys keys on tensor cores (float16 and bfloat16): the
// windows of Swin (49 or 64 tokens a window, head size 32), short cross-attention and every other
// problem whose keys fit one tile. cuDNN's flash kernels tile 64 or 128 queries by 128 keys and
// stream the keys; on Swin-T's windows they ran 12 attention layers in 1.56 ms of a 3.89 ms
// batch-32 run (ncu, H200), mostly padding and per-tile setup, for about 9 GFLOP of work.
//
// One block of (rows / 16) warps per (batch, head, 64 query rows). The block stages Q, K and V of
// its (batch, head) in shared memory (V transposed, every tile zero-filled past the sequence and
// the head size); each warp takes 16 query rows: S = Q K^T on mma.sync m16n8k16 with float
// accumulators, scale, the additive mask (broadcast like cuDNN's bias) and is_causal (top left)
// in registers, the softmax over the whole row at once (no running max: the keys are one tile),
// P rounded to the input type as flash kernels round it, then O = P V on the same instruction.
// A row whose every key is masked gives 0, as attention.cu's reference kernel does (onnx 1.23's
// errata to Attention 23/24).
//
// Past one tile of keys, tiled_attention_kernel streams them (flash attention 2's schedule on the
// same instructions): the block keeps its 64 query rows and loops over tiles of 64 keys, staged
// with cp.async two tiles deep, V read through ldmatrix.trans instead of a transposed copy; each
// warp keeps a running max and sum per row and rescales its output when the max grows. Under
// is_causal a block reads only the key tiles its rows see, and the blocks of the last query rows
// (the most tiles) start first. It is made for the short sequences of encoders and decoders at
// large batch (BERT's 128, ViT's 197, GPT-2's 256, head size 64), where cuDNN's flash kernels
// spend much of their time in per-tile setup; attention_sdpa.cc times it beside cuDNN's plans and
// runs the faster.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/attention.h"
#include "backends/cuda/attention_launches.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

std::atomic<uint64_t> short_launches{0}, tiled_launches{0};

constexpr int kRows = 64;  // query rows a block takes (4 warps of 16)
constexpr int kPad = 8;    // elements after each shared row: fragment loads free of bank conflicts

// Two floats rounded to T (float16 or bfloat16), packed as one fragment register.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// c += a * b on one m16n8k16 tile of T inputs with float accumulators (sm_80 and later).
#define KILN_MMA_M16N8K16(TYPE)                                       \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE \
               ".f32 {%0,%1,%2,%3}, "                                 \
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"             \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])       \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
template <typename T>
__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __half>) {
    KILN_MMA_M16N8K16("f16");
  } else {
    KILN_MMA_M16N8K16("bf16");
  }
#else
  __trap();
#endif
}
#undef KILN_MMA_M16N8K16

__device__ __forceinline__ uint32_t word(const void* p) { return *static_cast<const uint32_t*>(p); }

// Calls f(r, c, in) for each 16-byte chunk (row r, first column c) of a [kRows][kD] tile, the
// block's threads taking them in turn; `in` says the chunk lies inside `rows` x `cols`.
template <int kD, typename F>
__device__ __forceinline__ void each_chunk(int rows, int cols, F&& f) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks a row of the tile holds
  for (int e = threadIdx.x; e < kRows * kChunks; e += blockDim.x) {
    const int r = e / kChunks, c = (e % kChunks) * 8;
    f(r, c, r < rows && c < cols);
  }
}

// Copies `rows` rows of `cols` elements (a multiple of 8, 16-byte aligned rows `stride` apart)
// into a [kRows][kD + kPad] tile (transposed into [kD][kRows + kPad] when kTranspose), zeros
// elsewhere in the first kRows x kD.
template <typename T, int kD, bool kTranspose>
__device__ void stage(T* tile, const T* src, int64_t stride, int rows, int cols) {
  each_chunk<kD>(rows, cols, [&](int r, int c, bool in) {
    uint4 v = make_uint4(0, 0, 0, 0);
    if (in) v = *reinterpret_cast<const uint4*>(src + r * stride + c);
    if constexpr (kTranspose) {
      const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int k = 0; k < 8; ++k) tile[(c + k) * (kRows + kPad) + r] = h[k];
    } else {
      *reinterpret_cast<uint4*>(tile + r * (kD + kPad) + c) = v;
    }
  });
}

// The A fragments of the warp's 16 query rows (from r0 of a [kRows][kD + kPad] tile), kD / 16
// steps of 16 columns: lane (g, t) holds rows g and g + 8, columns 2t, 2t + 1, + 8 and + 9.
template <typename T, int kD>
__device__ __forceinline__ void load_q(uint32_t qf[kD / 16][4], const T* qs, int r0, int g, int t) {
  constexpr int kLd = kD + kPad;
#pragma unroll
  for (int kc = 0; kc < kD / 16; ++kc) {
    const T* qa = qs + (r0 + g) * kLd + kc * 16 + 2 * t;
    qf[kc][0] = word(qa), qf[kc][1] = word(qa + 8 * kLd), qf[kc][2] = word(qa + 8),
    qf[kc][3] = word(qa + 8 * kLd + 8);
  }
}

// s = Q K^T for the warp's rows over the first `key_tiles` 8-key tiles of a [kRows][kD + kPad]
// K tile (s[n] is key tile n; the others are left at 0).
template <typename T, int kD>
__device__ __forceinline__ void scores(float s[kRows / 8][4], const uint32_t qf[kD / 16][4],
                                       const T* ks, int key_tiles, int g, int t) {
  constexpr int kLd = kD + kPad;
#pragma unroll
  for (int n = 0; n < kRows / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
  for (int kc = 0; kc < kD / 16; ++kc) {
#pragma unroll
    for (int n = 0; n < kRows / 8; ++n) {
      if (n < key_tiles) {
        const T* kb = ks + (n * 8 + g) * kLd + kc * 16 + 2 * t;
        mma<T>(s[n], qf[kc], word(kb), word(kb + 8));
      }
    }
  }
}

// Writes the warp's output rows: query rows `row` and `row` + 8 (this thread's halves), each
// accumulator times its row's 1 / sum, columns below dv.
template <typename T, int kD>
__device__ __forceinline__ void store_rows(const ShortAttnArgs& a, const float acc[kD / 8][4],
                                           const float inv[2], int64_t b, int64_t h, int64_t row,
                                           int t) {
  T* y = static_cast<T*>(a.y) + b * a.st[3][0] + h * a.st[3][1];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t i = row + 8 * half;
    if (i >= a.s) continue;
    T* yr = y + i * a.st[3][2];
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      const int c = n * 8 + 2 * t;
      if (c < a.dv) {
        const uint32_t w = pack2<T>(acc[n][2 * half] * inv[half], acc[n][2 * half + 1] * inv[half]);
        *reinterpret_cast<uint32_t*>(yr + c) = w;
      }
    }
  }
}

// kD: the head sizes (Q's and V's) rounded up to a multiple of 16 (16, 32 or 64).
template <typename T, int kD>
__global__ void __launch_bounds__(128) short_attention_kernel(ShortAttnArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kLd = kD + kPad, kLdt = kRows + kPad;
  T* qs = reinterpret_cast<T*>(smem);  // [kRows][kLd]
  T* ks = qs + kRows * kLd;            // [kRows][kLd]
  T* vt = ks + kRows * kLd;            // [kD][kLdt]
  const int64_t bh = blockIdx.x, b = bh / a.hq, h = bh % a.hq, kh = h / (a.hq / a.hk);
  const int64_t q0 = int64_t(blockIdx.y) * kRows;
  const int rows = int(a.s - q0 < kRows ? a.s - q0 : kRows), keys = int(a.l);
  const T* q = static_cast<const T*>(a.q) + b * a.st[0][0] + h * a.st[0][1] + q0 * a.st[0][2];
  const T* k = static_cast<const T*>(a.k) + b * a.st[1][0] + kh * a.st[1][1];
  const T* v = static_cast<const T*>(a.v) + b * a.st[2][0] + kh * a.st[2][1];
  stage<T, kD, false>(qs, q, a.st[0][2], rows, int(a.d));
  stage<T, kD, false>(ks, k, a.st[1][2], keys, int(a.d));
  stage<T, kD, true>(vt, v, a.st[2][2], keys, int(a.dv));
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int r0 = warp * 16;  // the warp's first row in the block
  if (r0 >= rows) return;
  constexpr int kKeyTiles = kRows / 8;
  const int key_tiles = (keys + 7) / 8;
  uint32_t qf[kD / 16][4];
  load_q<T, kD>(qf, qs, r0, g, t);
  float s[kKeyTiles][4];
  scores<T, kD>(s, qf, ks, key_tiles, g, t);

  // Scale, mask and the row softmax. This thread holds rows g and g + 8 of the warp's 16, keys
  // n * 8 + 2t and + 1 of each tile.
  const float neg_inf = -INFINITY;
  const T* mask = static_cast<const T*>(a.mask);
  const int64_t* m = a.m;
  const int64_t mrow = mask ? (((m[0] == 1 ? 0 : b) * m[1] + (m[1] == 1 ? 0 : h)) * m[2]) : 0;
  float mx[2] = {neg_inf, neg_inf};
  bool open[2] = {false, false};  // a key of the row whose bias is not -inf
#pragma unroll
  for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = e >> 1, j = n * 8 + 2 * t + (e & 1);
      const int64_t i = q0 + r0 + g + 8 * half;  // the query's index in the sequence
      float bias = neg_inf;
      if (n < key_tiles && j < keys && i < a.s) {
        bias = mask ? DNum<T>::load(mask[(mrow + (m[2] == 1 ? 0 : i)) * m[3] + j]) : 0.f;
        if (a.causal && j > i) bias = neg_inf;
      }
      open[half] = open[half] || bias != neg_inf;
      const float x = bias == neg_inf ? neg_inf : s[n][e] * a.scale + bias;
      s[n][e] = x;
      mx[half] = fmaxf(mx[half], x);
    }
  }
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    for (int o = 1; o < 4; o <<= 1) {
      mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], o));
      open[half] = __shfl_xor_sync(0xffffffffu, int(open[half]), o) || open[half];
    }
    if (mx[half] == neg_inf) mx[half] = 0.f;
  }
#pragma unroll
  for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = __expf(s[n][e] - mx[e >> 1]);
      s[n][e] = p;
      sum[e >> 1] += p;
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    for (int o = 1; o < 4; o <<= 1) sum[half] += __shfl_xor_sync(0xffffffffu, sum[half], o);
  }

  // O = P V: two key tiles of S make one 16-key A fragment.
  float acc[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
  for (int kc = 0; kc < kRows / 16; ++kc) {
    if (kc * 2 < key_tiles) {
      const uint32_t pf[4] = {pack2<T>(s[2 * kc][0], s[2 * kc][1]),
                              pack2<T>(s[2 * kc][2], s[2 * kc][3]),
                              pack2<T>(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                              pack2<T>(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        const T* vb = vt + (n * 8 + g) * kLdt + kc * 16 + 2 * t;
        mma<T>(acc[n], pf, word(vb), word(vb + 8));
      }
    }
  }

  const float inv[2] = {open[0] ? 1.f / sum[0] : 0.f, open[1] ? 1.f / sum[1] : 0.f};
  store_rows<T, kD>(a, acc, inv, b, h, q0 + r0 + g, t);
}

template <typename T, int kD>
Status launch(const ShortAttnArgs& a, cudaStream_t stream) {
  const size_t shared = sizeof(T) * (2 * kRows * (kD + kPad) + kD * (kRows + kPad));
  const int64_t rows = a.s < kRows ? a.s : kRows;
  const dim3 grid(unsigned(a.b * a.hq), unsigned((a.s + kRows - 1) / kRows));
  short_attention_kernel<T, kD><<<grid, unsigned(32 * ((rows + 15) / 16)), shared, stream>>>(a);
  return launch_status("short_attention_kernel");
}

template <typename T>
Status launch_typed(const ShortAttnArgs& a, cudaStream_t stream) {
  const int64_t d = a.d > a.dv ? a.d : a.dv;
  if (d <= 16) return launch<T, 16>(a, stream);
  if (d <= 32) return launch<T, 32>(a, stream);
  return launch<T, 64>(a, stream);
}

// cp.async of 16 bytes from global to shared memory, zero-filled where `in` is false.
__device__ __forceinline__ void copy16(void* dst, const void* src, bool in) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(in ? 16 : 0));
#else
  __trap();
#endif
}
__device__ __forceinline__ void copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most N of this thread's committed groups are in flight.
template <int N>
__device__ __forceinline__ void copy_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// Four 8x8 matrices of 16-bit elements, transposed: lane L gives the address of row L % 8 of
// matrix L / 8; register i receives matrix i's elements [2t][g] and [2t + 1][g].
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#else
  __trap();
#endif
}

// Copies `rows` rows of `cols` elements as stage() does, with cp.async (committed by the caller).
template <typename T, int kD>
__device__ __forceinline__ void stage_async(T* tile, const T* src, int64_t stride, int rows,
                                            int cols) {
  each_chunk<kD>(rows, cols, [&](int r, int c, bool in) {
    copy16(tile + r * (kD + kPad) + c, in ? src + r * stride + c : src, in);
  });
}

// One block of 4 warps per (batch, head, 64 query rows), over every key tile its rows see.
template <typename T, int kD>
__global__ void __launch_bounds__(128) tiled_attention_kernel(ShortAttnArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kLd = kD + kPad, kTile = kRows * kLd;
  T* qs = reinterpret_cast<T*>(smem);  // [kRows][kLd], then K and V of two stages, as [kRows][kLd]
  const int64_t bh = blockIdx.x, b = bh / a.hq, h = bh % a.hq, kh = h / (a.hq / a.hk);
  const int64_t q0 = int64_t(gridDim.y - 1 - blockIdx.y) * kRows;  // the last rows first
  const int rows = int(a.s - q0 < kRows ? a.s - q0 : kRows);
  const T* q = static_cast<const T*>(a.q) + b * a.st[0][0] + h * a.st[0][1] + q0 * a.st[0][2];
  const T* k = static_cast<const T*>(a.k) + b * a.st[1][0] + kh * a.st[1][1];
  const T* v = static_cast<const T*>(a.v) + b * a.st[2][0] + kh * a.st[2][1];
  int64_t tiles = (a.l + kRows - 1) / kRows;
  if (a.causal) {
    // Key j is seen by query i when j <= i (top left): the block's last row decides.
    const int64_t seen = (q0 + rows - 1) / kRows + 1;
    tiles = seen < tiles ? seen : tiles;
  }
  auto stage_kv = [&](int64_t tile, int buf) {
    T* ks = qs + kTile * (1 + 2 * buf);
    const int64_t j0 = tile * kRows;
    const int n = int(a.l - j0 < kRows ? a.l - j0 : kRows);
    stage_async<T, kD>(ks, k + j0 * a.st[1][2], a.st[1][2], n, int(a.d));
    stage_async<T, kD>(ks + kTile, v + j0 * a.st[2][2], a.st[2][2], n, int(a.dv));
  };
  stage_async<T, kD>(qs, q, a.st[0][2], rows, int(a.d));
  stage_kv(0, 0);
  copy_commit();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int r0 = warp * 16;  // the warp's first row in the block
  const bool active = r0 < rows;
  const float neg_inf = -INFINITY;
  const T* mask = static_cast<const T*>(a.mask);
  const int64_t* m = a.m;
  const int64_t mrow = mask ? (((m[0] == 1 ? 0 : b) * m[1] + (m[1] == 1 ? 0 : h)) * m[2]) : 0;
  uint32_t qf[kD / 16][4];
  float run_max[2] = {neg_inf, neg_inf}, run_sum[2] = {0.f, 0.f};  // this thread's share
  float acc[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;

  for (int64_t kt = 0; kt < tiles; ++kt) {
    const int buf = int(kt & 1);
    if (kt + 1 < tiles) {
      stage_kv(kt + 1, buf ^ 1);  // the buffer the previous iteration read (a barrier ago)
      copy_commit();
      copy_wait<1>();
    } else {
      copy_wait<0>();
    }
    __syncthreads();
    if (active) {
      if (kt == 0) load_q<T, kD>(qf, qs, r0, g, t);
      const T* ks = qs + kTile * (1 + 2 * buf);
      const T* vs = ks + kTile;
      float s[kRows / 8][4];
      scores<T, kD>(s, qf, ks, kRows / 8, g, t);
      // Scale, mask, and the tile's max per row (rows g and g + 8 of the warp's 16).
      float mx[2] = {neg_inf, neg_inf};
#pragma unroll
      for (int n = 0; n < kRows / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int half = e >> 1;
          const int64_t i = q0 + r0 + g + 8 * half, j = kt * kRows + n * 8 + 2 * t + (e & 1);
          float bias = neg_inf;
          if (j < a.l && i < a.s) {
            bias = mask ? DNum<T>::load(mask[(mrow + (m[2] == 1 ? 0 : i)) * m[3] + j]) : 0.f;
            if (a.causal && j > i) bias = neg_inf;
          }
          const float x = bias == neg_inf ? neg_inf : s[n][e] * a.scale + bias;
          s[n][e] = x;
          mx[half] = fmaxf(mx[half], x);
        }
      }
      float base[2], corr[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        for (int o = 1; o < 4; o <<= 1)
          mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], o));
        const float now = fmaxf(run_max[half], mx[half]);
        base[half] = now == neg_inf ? 0.f : now;  // no key open yet: every p below is 0
        corr[half] = __expf(run_max[half] - base[half]);
        run_max[half] = now;
        run_sum[half] *= corr[half];
      }
#pragma unroll
      for (int n = 0; n < kRows / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = __expf(s[n][e] - base[e >> 1]);
          s[n][e] = p;
          run_sum[e >> 1] += p;
        }
      }
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        acc[n][0] *= corr[0], acc[n][1] *= corr[0], acc[n][2] *= corr[1], acc[n][3] *= corr[1];
      }
      // O += P V: two key tiles of S make one 16-key A fragment; V's B fragments for two
      // 8-column tiles come from one ldmatrix.trans (lanes 0-15 the first's 16 rows, 16-31 the
      // second's).
#pragma unroll
      for (int kc = 0; kc < kRows / 16; ++kc) {
        const uint32_t pf[4] = {pack2<T>(s[2 * kc][0], s[2 * kc][1]),
                                pack2<T>(s[2 * kc][2], s[2 * kc][3]),
                                pack2<T>(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                                pack2<T>(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
        for (int n = 0; n < kD / 8; n += 2) {
          uint32_t r[4];
          ldmatrix_x4_trans(r, vs + (kc * 16 + (lane & 15)) * kLd + (n + (lane >> 4)) * 8);
          mma<T>(acc[n], pf, r[0], r[1]);
          mma<T>(acc[n + 1], pf, r[2], r[3]);
        }
      }
    }
    __syncthreads();  // the next iteration stages into the buffer just read
  }
  if (!active) return;

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    for (int o = 1; o < 4; o <<= 1) run_sum[half] += __shfl_xor_sync(0xffffffffu, run_sum[half], o);
  }
  // A row with no open key has a sum of 0 (its max stayed -inf) and gives 0.
  const float inv[2] = {run_sum[0] > 0.f ? 1.f / run_sum[0] : 0.f,
                        run_sum[1] > 0.f ? 1.f / run_sum[1] : 0.f};
  store_rows<T, kD>(a, acc, inv, b, h, q0 + r0 + g, t);
}

template <typename T, int kD>
Status launch_tiled(const ShortAttnArgs& a, cudaStream_t stream) {
  const size_t shared = sizeof(T) * 5 * kRows * (kD + kPad);  // Q, then K and V twice
  const dim3 grid(unsigned(a.b * a.hq), unsigned((a.s + kRows - 1) / kRows));
  tiled_attention_kernel<T, kD><<<grid, 128, shared, stream>>>(a);
  return launch_status("tiled_attention_kernel");
}

template <typename T>
Status launch_tiled_typed(const ShortAttnArgs& a, cudaStream_t stream) {
  const int64_t d = a.d > a.dv ? a.d : a.dv;
  if (d <= 16) return launch_tiled<T, 16>(a, stream);
  if (d <= 32) return launch_tiled<T, 32>(a, stream);
  return launch_tiled<T, 64>(a, stream);
}

// What both kernels need beyond the key count: float16 or bfloat16, head sizes multiples of 8 up
// to kShortAttentionHead, a grid that fits, 16-byte loads of Q, K and V rows, 4-byte stores of Y's.
bool tensor_core_attention_takes(const ShortAttnArgs& a, DType t, size_t element) {
  if (t != DType::kFloat16 && t != DType::kBFloat16) return false;
  if (a.l < 1 || a.s < 1 || a.b < 1 || a.hq < 1 || a.hk < 1 || a.hq % a.hk != 0) return false;
  if (a.d < 8 || a.d > kShortAttentionHead || a.d % 8 || a.dv < 8 || a.dv > kShortAttentionHead ||
      a.dv % 8) {
    return false;
  }
  if (a.b * a.hq > 2147483647LL || (a.s + kRows - 1) / kRows > 65535) return false;  // the grid
  const void* in[3] = {a.q, a.k, a.v};
  for (int i = 0; i < 3; ++i) {
    if (reinterpret_cast<uintptr_t>(in[i]) % 16) return false;
    for (int x = 0; x < 3; ++x) {
      if ((a.st[i][x] * int64_t(element)) % 16) return false;
    }
  }
  if (reinterpret_cast<uintptr_t>(a.y) % 4) return false;
  for (int x = 0; x < 3; ++x) {
    if ((a.st[3][x] * int64_t(element)) % 4) return false;
  }
  return true;
}

}  // namespace

bool short_attention_takes(const ShortAttnArgs& a, DType t, size_t element) {
  return a.l <= kShortAttentionKeys && tensor_core_attention_takes(a, t, element);
}

bool tiled_attention_takes(const ShortAttnArgs& a, DType t, size_t element) {
  return tensor_core_attention_takes(a, t, element);
}

Status short_attention(DType t, const ShortAttnArgs& a, cudaStream_t stream) {
  short_launches.fetch_add(1, std::memory_order_relaxed);
  if (t == DType::kFloat16) return launch_typed<__half>(a, stream);
  return launch_typed<__nv_bfloat16>(a, stream);
}

Status tiled_attention(DType t, const ShortAttnArgs& a, cudaStream_t stream) {
  tiled_launches.fetch_add(1, std::memory_order_relaxed);
  if (t == DType::kFloat16) return launch_tiled_typed<__half>(a, stream);
  return launch_tiled_typed<__nv_bfloat16>(a, stream);
}

AttentionLaunches attention_launches() {
  return {short_launches.load(std::memory_order_relaxed),
          tiled_launches.load(std::memory_order_relaxed)};
}

}  // namespace kiln::backends::cuda
