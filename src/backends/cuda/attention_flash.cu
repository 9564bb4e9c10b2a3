// Attention over any number of keys on tensor cores (float16 and bfloat16), in the manner of
// FlashAttention-2: one block of 4 warps per (batch, head, 64 query rows) walks the keys 64 at a
// time, each chunk of K and V copied into shared memory with cp.async while the warps work on the
// one before; each warp holds S = Q K^T for its 16 rows and one chunk in registers (mma.sync
// m16n8k16, float accumulators), keeps the row's running max and sum, rescales its O accumulator
// when the max grows and adds P V (P rounded to the input type, V's fragments by ldmatrix.trans).
// Scale, the additive mask (broadcast like cuDNN's bias) and is_causal (top left) are applied in
// registers; a causal block stops at its last row's key, and the blocks with the most keys start
// first. A row whose every key is masked gives 0, as attention.cu's reference kernel does.
//
// It exists for the short causal sequences of decoders: cuDNN's sm_90 flash kernel took 28 us a
// layer for GPT-2 at batch 32 (256 tokens, 12 heads of 64; ncu, H200), a 64 x 256 tile over the
// whole masked square. attention_sdpa.cc picks between the two (attention.h says when).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/attention.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

constexpr int kRows = 64;  // query rows a block takes (4 warps of 16)
constexpr int kKeys = 64;  // keys a chunk
constexpr int kPad = 8;    // elements after each shared row: fragment loads free of bank conflicts

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
#define KILN_MMA_M16N8K16(TYPE)                                                                  \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 {%0,%1,%2,%3}, "     \
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                                       \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                 \
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

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes from global to shared memory, or zeros where `valid` is false (nothing is read then).
__device__ __forceinline__ void copy16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)),
               "l"(src), "r"(valid ? 16 : 0));
#endif
}
__device__ __forceinline__ void copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int kPending>
__device__ __forceinline__ void copy_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

// Four 8x8 tiles of 16-bit elements, transposed, from the rows whose addresses lanes 0-31 give.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
#endif
}

// Rows [first, first + kRows) of a (seq, head) matrix into a [kRows][kD + kPad] tile: rows past
// `rows` and columns past `cols` (a multiple of 8) are zeros. `src` is row 0; rows are `stride`
// elements apart. Asynchronous: the caller commits and waits.
template <typename T, int kD>
__device__ __forceinline__ void stage(T* tile, const T* src, int64_t stride, int64_t first,
                                      int64_t rows, int cols) {
  constexpr int kChunks = kD / 8;  // 16-byte pieces a row of the tile holds
#pragma unroll
  for (int e = threadIdx.x; e < kRows * kChunks; e += 4 * 32) {
    const int r = e / kChunks, c = (e % kChunks) * 8;
    const bool valid = first + r < rows && c < cols;
    copy16(tile + r * (kD + kPad) + c, valid ? src + (first + r) * stride + c : src, valid);
  }
}

// kD: the head sizes (Q's and V's) rounded up to a multiple of 16 (32, 64 or 128).
template <typename T, int kD>
__global__ void __launch_bounds__(128) flash_attention_kernel(ShortAttnArgs a, int64_t q_tiles) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kLd = kD + kPad;
  T* qs = reinterpret_cast<T*>(smem);  // [kRows][kLd]
  T* ks = qs + kRows * kLd;            // [2][kKeys][kLd]
  T* vs = ks + 2 * kKeys * kLd;        // [2][kKeys][kLd]
  const int64_t bhs = a.b * a.hq;
  // The heaviest query tiles (a causal block's last rows see the most keys) go first.
  const int64_t qt = q_tiles - 1 - int64_t(blockIdx.x) / bhs, bh = int64_t(blockIdx.x) % bhs;
  const int64_t b = bh / a.hq, h = bh % a.hq, kh = h / (a.hq / a.hk);
  const int64_t q0 = qt * kRows;
  const T* q = static_cast<const T*>(a.q) + b * a.st[0][0] + h * a.st[0][1];
  const T* k = static_cast<const T*>(a.k) + b * a.st[1][0] + kh * a.st[1][1];
  const T* v = static_cast<const T*>(a.v) + b * a.st[2][0] + kh * a.st[2][1];
  // Keys this block needs: causal rows i see keys j <= i.
  const int64_t last = a.causal ? (q0 + kRows < a.l ? q0 + kRows : a.l) : a.l;
  const int chunks = int((last + kKeys - 1) / kKeys);

  stage<T, kD>(qs, q, a.st[0][2], q0, a.s, int(a.d));
  stage<T, kD>(ks, k, a.st[1][2], 0, a.l, int(a.d));
  stage<T, kD>(vs, v, a.st[2][2], 0, a.l, int(a.dv));
  copy_commit();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int r0 = warp * 16;  // the warp's first row in the block
  const float neg_inf = -INFINITY;
  const T* mask = static_cast<const T*>(a.mask);
  const int64_t* m = a.m;
  const int64_t mrow = mask ? (((m[0] == 1 ? 0 : b) * m[1] + (m[1] == 1 ? 0 : h)) * m[2]) : 0;
  const int64_t row_i[2] = {q0 + r0 + g, q0 + r0 + g + 8};  // this thread's two query rows

  uint32_t qf[kD / 16][4];
  float acc[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float mx[2] = {neg_inf, neg_inf}, sum[2] = {0.f, 0.f};

  for (int c = 0; c < chunks; ++c) {
    const int buf = c & 1;
    if (c + 1 < chunks) {
      const int nb = buf ^ 1;
      stage<T, kD>(ks + nb * kKeys * kLd, k, a.st[1][2], int64_t(c + 1) * kKeys, a.l, int(a.d));
      stage<T, kD>(vs + nb * kKeys * kLd, v, a.st[2][2], int64_t(c + 1) * kKeys, a.l, int(a.dv));
      copy_commit();
      copy_wait<1>();
    } else {
      copy_wait<0>();
    }
    __syncthreads();
    if (c == 0) {
#pragma unroll
      for (int kc = 0; kc < kD / 16; ++kc) {
        const T* qa = qs + (r0 + g) * kLd + kc * 16 + 2 * t;
        qf[kc][0] = word(qa), qf[kc][1] = word(qa + 8 * kLd), qf[kc][2] = word(qa + 8),
        qf[kc][3] = word(qa + 8 * kLd + 8);
      }
    }
    const T* kb0 = ks + buf * kKeys * kLd;
    const T* vb0 = vs + buf * kKeys * kLd;
    const int64_t j0 = int64_t(c) * kKeys;

    // S = Q K^T over this chunk's 8 key tiles of 8.
    float s[kKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kc = 0; kc < kD / 16; ++kc) {
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
        const T* kb = kb0 + (n * 8 + g) * kLd + kc * 16 + 2 * t;
        mma<T>(s[n], qf[kc], word(kb), word(kb + 8));
      }
    }

    // Scale, mask, and the running max and sum of rows g and g + 8 (keys n * 8 + 2t and + 1).
    const bool edge = j0 + kKeys > a.l || (a.causal && j0 + kKeys - 1 > q0 + r0) || mask;
    float cmx[2] = {neg_inf, neg_inf};
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e >> 1;
        float x = s[n][e] * a.scale;
        if (edge) {
          const int64_t i = row_i[half], j = j0 + n * 8 + 2 * t + (e & 1);
          float bias = neg_inf;
          if (j < a.l && !(a.causal && j > i) && i < a.s) {
            bias = mask ? DNum<T>::load(mask[(mrow + (m[2] == 1 ? 0 : i)) * m[3] + j]) : 0.f;
          }
          x = bias == neg_inf ? neg_inf : x + bias;
        }
        s[n][e] = x;
        cmx[half] = fmaxf(cmx[half], x);
      }
    }
    float corr[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      for (int o = 1; o < 4; o <<= 1)
        cmx[half] = fmaxf(cmx[half], __shfl_xor_sync(0xffffffffu, cmx[half], o));
      const float nmx = fmaxf(mx[half], cmx[half]);
      // Rows with no open key yet keep max -inf; their exponent base is 0 so that p is 0.
      corr[half] = mx[half] == neg_inf ? 0.f : __expf(mx[half] - nmx);
      mx[half] = nmx;
      sum[half] *= corr[half];
    }
    const float base[2] = {mx[0] == neg_inf ? 0.f : mx[0], mx[1] == neg_inf ? 0.f : mx[1]};
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = __expf(s[n][e] - base[e >> 1]);
        s[n][e] = p;
        sum[e >> 1] += p;
      }
    }
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      acc[n][0] *= corr[0], acc[n][1] *= corr[0], acc[n][2] *= corr[1], acc[n][3] *= corr[1];
    }

    // O += P V: two key tiles of S make one 16-key A fragment; ldmatrix.trans gives V's B
    // fragments for two head-size tiles at once (lanes 0-7 and 16-23 address keys kk*16 + r,
    // lanes 8-15 and 24-31 keys kk*16 + 8 + r; lanes 16-31 the next 8 columns).
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint32_t pf[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]),
                              pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                              pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const int mi = lane >> 3, r = lane & 7;
#pragma unroll
      for (int n = 0; n < kD / 8; n += 2) {
        uint32_t bf[4];
        ldmatrix_x4_trans(bf, vb0 + (kk * 16 + (mi & 1) * 8 + r) * kLd + (n + (mi >> 1)) * 8);
        mma<T>(acc[n], pf, bf[0], bf[1]);
        mma<T>(acc[n + 1], pf, bf[2], bf[3]);
      }
    }
    __syncthreads();  // every warp is done with this buffer before the next chunk refills it
  }

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    for (int o = 1; o < 4; o <<= 1) sum[half] += __shfl_xor_sync(0xffffffffu, sum[half], o);
  }
  const float inv[2] = {sum[0] > 0.f ? 1.f / sum[0] : 0.f, sum[1] > 0.f ? 1.f / sum[1] : 0.f};
  T* y = static_cast<T*>(a.y) + b * a.st[3][0] + h * a.st[3][1];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t i = row_i[half];
    if (i >= a.s) continue;
    T* yr = y + i * a.st[3][2];
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      const int col = n * 8 + 2 * t;
      if (col < a.dv) {
        *reinterpret_cast<uint32_t*>(yr + col) =
            pack2<T>(acc[n][2 * half] * inv[half], acc[n][2 * half + 1] * inv[half]);
      }
    }
  }
}

template <typename T, int kD>
Status launch(const ShortAttnArgs& a, cudaStream_t stream) {
  constexpr size_t kShared = sizeof(T) * size_t(kRows + 4 * kKeys) * (kD + kPad);
  static const cudaError_t attr = cudaFuncSetAttribute(
      flash_attention_kernel<T, kD>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kShared));
  if (attr != cudaSuccess) return launch_status("flash_attention_kernel (shared memory)");
  const int64_t q_tiles = (a.s + kRows - 1) / kRows;
  const dim3 grid(unsigned(q_tiles * a.b * a.hq));
  flash_attention_kernel<T, kD><<<grid, 128, kShared, stream>>>(a, q_tiles);
  return launch_status("flash_attention_kernel");
}

template <typename T>
Status launch_typed(const ShortAttnArgs& a, cudaStream_t stream) {
  const int64_t d = a.d > a.dv ? a.d : a.dv;
  if (d <= 32) return launch<T, 32>(a, stream);
  if (d <= 64) return launch<T, 64>(a, stream);
  return launch<T, 128>(a, stream);
}

}  // namespace

bool flash_attention_takes(const ShortAttnArgs& a, DType t, size_t element) {
  if (t != DType::kFloat16 && t != DType::kBFloat16) return false;
  if (a.l < 1 || a.s < 1 || a.b < 1 || a.hq < 1 || a.hk < 1 || a.hq % a.hk != 0) return false;
  if (a.d < 8 || a.d > kFlashAttentionHead || a.d % 8 || a.dv < 8 ||
      a.dv > kFlashAttentionHead || a.dv % 8) {
    return false;
  }
  if ((a.s + kRows - 1) / kRows * a.b * a.hq > 2147483647LL) return false;  // the grid
  // 16-byte copies of Q, K and V rows; 4-byte stores of Y's.
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

Status flash_attention(DType t, const ShortAttnArgs& a, cudaStream_t stream) {
  if (t == DType::kFloat16) return launch_typed<__half>(a, stream);
  return launch_typed<__nv_bfloat16>(a, stream);
}

}  // namespace kiln::backends::cuda
