// The shared FP32 GEMM: GotoBLAS-style blocking (pack a KCxNC panel of B and an MCxKC block of A,
// then an MRxNR register-tiled micro-kernel), compiled once per ISA through GCC function
// multiversioning so one portable binary runs AVX-512, AVX2+FMA or SSE2 code.
#include "backends/cpu/gemm.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backends/cpu/multiversion.h"
#include "backends/cpu/thread_pool.h"

// The micro-kernel's `acc += a * b` must become FMAs; -std=c++20 (not gnu++20) turns contraction
// off by default, so ask for it in this file only.
#pragma GCC optimize("fp-contract=fast")

namespace kiln::backends::cpu {
// Outside the anonymous namespace: clang 14 (the fuzz build) emits no destructor for an internal
// thread_local whose only user is inlined into target_clones, and the link fails.
namespace gemm_detail {

// Packing buffers, per thread so concurrent execution contexts never share them. They grow to at
// most the block sizes and are then reused, so steady state does not allocate.
struct Scratch {
  std::vector<float> a, b;
  static float* aligned(std::vector<float>& v, size_t n) {
    if (v.size() < n + 16) v.resize(n + 16);
    auto p = reinterpret_cast<uintptr_t>(v.data());
    return reinterpret_cast<float*>((p + 63) & ~uintptr_t(63));
  }
};

Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

}  // namespace gemm_detail

namespace {

using gemm_detail::Scratch;
using gemm_detail::scratch;

// Block sizes: a KC-deep sliver of packed B (KC*NR floats, 32 KiB at NR=32) stays in L1, the packed
// A block (MC*KC floats, 96 KiB) in L2. MC is a multiple of every MR below, NC of every NR.
constexpr int64_t kKc = 256;
constexpr int64_t kMc = 96;
constexpr int64_t kNc = 3072;

// Below this many multiply-adds, packing costs more than it saves.
constexpr int64_t kSmallGemm = 8 * 8 * 8;

// GCC vector-extension types: plain C++ arithmetic on them lowers to the target ISA of the
// function they are inlined into, so the micro-kernel needs no intrinsics.
typedef float V4 __attribute__((vector_size(16)));
typedef float V8 __attribute__((vector_size(32)));
typedef float V16 __attribute__((vector_size(64)));

struct GemmArgs {
  bool trans_a, trans_b;
  int64_t m, n, k;
  float alpha;
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
  float* c;
  int64_t ldc;
};

// op(A)[i0 + r][p0 + p] for r < mr, p < kc into slivers of MR rows: [sliver][p][r], zero-padded.
template <int MR>
inline __attribute__((always_inline)) void pack_a(const GemmArgs& g, int64_t i0, int64_t p0,
                                                  int64_t mc, int64_t kc, float* dst) {
  for (int64_t i = 0; i < mc; i += MR) {
    int64_t rows = std::min<int64_t>(MR, mc - i);
    float* d = dst + i * kc;
    if (g.trans_a) {
      for (int64_t p = 0; p < kc; ++p) {
        const float* s = g.a + (p0 + p) * g.lda + i0 + i;
        for (int64_t r = 0; r < rows; ++r) d[p * MR + r] = s[r];
        for (int64_t r = rows; r < MR; ++r) d[p * MR + r] = 0.f;
      }
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        const float* s = g.a + (i0 + i + r) * g.lda + p0;
        for (int64_t p = 0; p < kc; ++p) d[p * MR + r] = s[p];
      }
      for (int64_t r = rows; r < MR; ++r) {
        for (int64_t p = 0; p < kc; ++p) d[p * MR + r] = 0.f;
      }
    }
  }
}

// op(B)[p0 + p][j0 + j] for p < kc, j < nc into slivers of NR columns: [sliver][p][j], zero-padded.
template <int NR>
inline __attribute__((always_inline)) void pack_b(const GemmArgs& g, int64_t p0, int64_t j0,
                                                  int64_t kc, int64_t nc, float* dst) {
  for (int64_t j = 0; j < nc; j += NR) {
    int64_t cols = std::min<int64_t>(NR, nc - j);
    float* d = dst + j * kc;
    if (g.trans_b) {
      for (int64_t c = 0; c < cols; ++c) {
        const float* s = g.b + (j0 + j + c) * g.ldb + p0;
        for (int64_t p = 0; p < kc; ++p) d[p * NR + c] = s[p];
      }
      for (int64_t c = cols; c < NR; ++c) {
        for (int64_t p = 0; p < kc; ++p) d[p * NR + c] = 0.f;
      }
    } else {
      for (int64_t p = 0; p < kc; ++p) {
        const float* s = g.b + (p0 + p) * g.ldb + j0 + j;
        for (int64_t c = 0; c < cols; ++c) d[p * NR + c] = s[c];
        for (int64_t c = cols; c < NR; ++c) d[p * NR + c] = 0.f;
      }
    }
  }
}

// C[0:rows, 0:cols] += alpha * A sliver (MR x kc) * packed B sliver (kc x NR). The A sliver is
// packed ([p][r], kDirect false) or MR rows of A itself, lda apart (kDirect): A's element (r, p)
// is broadcast either way, and a row-major A's block stays in L1/L2 across the slivers of B as
// its packed copy would. The MR*NV accumulators live in registers: the tile sizes per ISA are
// chosen so they fit.
template <int MR, int NV, typename V, bool kDirect = false>
inline __attribute__((always_inline)) void micro_kernel(int64_t kc, const float* __restrict pa,
                                                        const float* __restrict pb, float* c,
                                                        int64_t ldc, float alpha, int64_t rows,
                                                        int64_t cols, int64_t lda = 0) {
  constexpr int W = sizeof(V) / sizeof(float);
  constexpr int NR = NV * W;
  V acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  }
  for (int64_t p = 0; p < kc; ++p) {
    V bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) std::memcpy(&bv[v], pb + p * NR + v * W, sizeof(V));
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      float av = kDirect ? pa[r * lda + p] : pa[p * MR + r];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
  if (rows == MR && cols == NR) {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        V cv;
        std::memcpy(&cv, c + r * ldc + v * W, sizeof(V));
        cv += alpha * acc[r][v];
        std::memcpy(c + r * ldc + v * W, &cv, sizeof(V));
      }
    }
    return;
  }
  alignas(64) float tile[MR * NR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) std::memcpy(tile + r * NR + v * W, &acc[r][v], sizeof(V));
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) c[r * ldc + j] += alpha * tile[r * NR + j];
  }
}

// One packed KC x NC panel of B and the C tiles it feeds, split into tasks of one MC block of A's
// rows by a run of NR-wide column slivers. A task packs its own A block (thread-local scratch)
// and reads the shared panel; tasks write disjoint tiles of C, each with the same kc loop as one
// thread would, so the result does not depend on how many threads ran it.
struct Panel {
  const GemmArgs* g;
  const float* pb;
  int64_t jc, pc, nc, kc;
  int64_t j_chunks, slivers_per_chunk;
};

template <int MR, int NV, typename V>
inline __attribute__((always_inline)) void panel_tiles(const Panel& p, int64_t task) {
  constexpr int NR = NV * int(sizeof(V) / sizeof(float));
  const GemmArgs& g = *p.g;
  const int64_t ic = (task / p.j_chunks) * kMc, mc = std::min(kMc, g.m - ic);
  const int64_t j0 = (task % p.j_chunks) * p.slivers_per_chunk * NR;
  const int64_t j1 = std::min(p.nc, j0 + p.slivers_per_chunk * NR);
  if (j0 >= j1 || mc <= 0) return;
  float* pa = Scratch::aligned(scratch().a, size_t(kMc * p.kc));
  // A row-major A is read in place in slivers of MR whole rows (packing it transposed each
  // element into [p][r] order, one scalar store apiece: 1.7 of ViT-tiny's 14 ms at batch 1 on
  // one thread); only a last sliver of fewer rows is packed, zero-padded. A transposed A is
  // packed: its rows are strided columns.
  const int64_t full = g.trans_a ? 0 : mc / MR * MR;
  if (full < mc) pack_a<MR>(g, ic + full, p.pc, mc - full, p.kc, pa + full * p.kc);
  const float* a_block = g.a + ic * g.lda + p.pc;
  for (int64_t jr = j0; jr < j1; jr += NR) {
    const int64_t cols = std::min<int64_t>(NR, p.nc - jr);
    for (int64_t ir = 0; ir < mc; ir += MR) {
      float* c = g.c + (ic + ir) * g.ldc + p.jc + jr;
      if (ir < full) {
        micro_kernel<MR, NV, V, true>(p.kc, a_block + ir * g.lda, p.pb + jr * p.kc, c, g.ldc,
                                      g.alpha, MR, cols, g.lda);
      } else {
        micro_kernel<MR, NV, V>(p.kc, pa + ir * p.kc, p.pb + jr * p.kc, c, g.ldc, g.alpha,
                                std::min<int64_t>(MR, mc - ir), cols);
      }
    }
  }
}

// Hands the panel's tasks to the pool through a plain callback: clang 14 (the sanitizer builds)
// emits no code for a std::function made in this file of target_clones functions, and the link
// fails.
struct PanelTasks {
  const Panel* panel;
  void (*tiles)(const Panel&, int64_t);
};

void run_panel_task(const void* ctx, int64_t t) {
  const auto* p = static_cast<const PanelTasks*>(ctx);
  p->tiles(*p->panel, t);
}

void run_panel_tasks(const Panel& panel, int64_t tasks, void (*tiles)(const Panel&, int64_t)) {
  const PanelTasks ctx{&panel, tiles};
  parallel_for(tasks, &run_panel_task, &ctx);
}

// Below this many multiply-adds a GEMM runs on the calling thread: waking workers costs more.
constexpr int64_t kParallelGemm = int64_t(1) << 20;

// `tiles` is panel_tiles<MR, NV, V> compiled for the same ISA as the caller, so workers use the
// caller's tile shape (NR) on the panel it packed.
// `packed`: op(B) packed beforehand in this NR's panels (PackedB), or nullptr to pack here.
template <int MR, int NV, typename V>
inline __attribute__((always_inline)) void blocked_gemm(const GemmArgs& g,
                                                        void (*tiles)(const Panel&, int64_t),
                                                        const float* packed) {
  constexpr int NR = NV * int(sizeof(V) / sizeof(float));
  Scratch& s = scratch();
  int64_t kc_max = std::min(g.k, kKc);
  float* pb =
      packed ? nullptr
             : Scratch::aligned(s.b, size_t(((std::min(g.n, kNc) + NR - 1) / NR) * NR * kc_max));
  const int64_t m_blocks = (g.m + kMc - 1) / kMc;
  const bool parallel = g.m * g.n * g.k >= kParallelGemm && thread_limit() > 1;
  for (int64_t jc = 0; jc < g.n; jc += kNc) {
    int64_t nc = std::min(kNc, g.n - jc);
    const int64_t slivers = (nc + NR - 1) / NR;
    // Enough tasks that every thread gets about two, when the panel has the slivers for it.
    const int64_t want = parallel ? 2 * int64_t(thread_limit()) : 1;
    const int64_t j_chunks =
        std::min(slivers, std::max<int64_t>(1, (want + m_blocks - 1) / m_blocks));
    const int64_t per_chunk = (slivers + j_chunks - 1) / j_chunks;
    for (int64_t pc = 0; pc < g.k; pc += kKc) {
      int64_t kc = std::min(kKc, g.k - pc);
      if (packed) {
        pb = const_cast<float*>(packed);  // read only: the panels' tasks never write B
        packed += slivers * NR * kc;
      } else {
        pack_b<NR>(g, pc, jc, kc, nc, pb);
      }
      const Panel panel{&g, pb, jc, pc, nc, kc, j_chunks, per_chunk};
      const int64_t tasks = m_blocks * j_chunks;
      if (!parallel || tasks == 1) {
        for (int64_t t = 0; t < tasks; ++t) panel_tiles<MR, NV, V>(panel, t);
      } else {
        run_panel_tasks(panel, tasks, tiles);
      }
    }
  }
}

// Function multiversioning: the loader picks the best version for the running CPU once (ifunc).
// target_clones would compile one tile shape for all ISAs; separate versions let each keep its
// accumulators in its own register file (32 zmm, 16 ymm, 16 xmm).
// Not under TSan (multiversion.h).
// blocked_nr() is the NR of the version blocked_gemm_dispatch runs, for PackedB.
#if KILN_MULTIVERSION
__attribute__((target("default"))) void tiles_sse(const Panel& p, int64_t t) {
  panel_tiles<6, 2, V4>(p, t);
}
__attribute__((target("avx2,fma"))) void tiles_avx2(const Panel& p, int64_t t) {
  panel_tiles<6, 2, V8>(p, t);
}
__attribute__((target("avx512f"))) void tiles_avx512(const Panel& p, int64_t t) {
  panel_tiles<12, 2, V16>(p, t);
}
__attribute__((target("default"))) void blocked_gemm_dispatch(const GemmArgs& g,
                                                              const float* packed = nullptr) {
  blocked_gemm<6, 2, V4>(g, &tiles_sse, packed);  // 6x8: 12 accumulators
}
__attribute__((target("avx2,fma"))) void blocked_gemm_dispatch(const GemmArgs& g,
                                                               const float* packed = nullptr) {
  blocked_gemm<6, 2, V8>(g, &tiles_avx2, packed);  // 6x16: 12 accumulators
}
__attribute__((target("avx512f"))) void blocked_gemm_dispatch(const GemmArgs& g,
                                                              const float* packed = nullptr) {
  blocked_gemm<12, 2, V16>(g, &tiles_avx512, packed);  // 12x32: 24 accumulators
}
__attribute__((target("default"))) int blocked_nr() { return 8; }
__attribute__((target("avx2,fma"))) int blocked_nr() { return 16; }
__attribute__((target("avx512f"))) int blocked_nr() { return 32; }
#else
void tiles_sse(const Panel& p, int64_t t) { panel_tiles<6, 2, V4>(p, t); }
void blocked_gemm_dispatch(const GemmArgs& g, const float* packed = nullptr) {
  blocked_gemm<6, 2, V4>(g, &tiles_sse, packed);
}
int blocked_nr() { return 8; }
#endif

void small_gemm(const GemmArgs& g) {
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      float acc = 0.f;
      for (int64_t p = 0; p < g.k; ++p) {
        float x = g.trans_a ? g.a[p * g.lda + i] : g.a[i * g.lda + p];
        float y = g.trans_b ? g.b[j * g.ldb + p] : g.b[p * g.ldb + j];
        acc += x * y;
      }
      g.c[i * g.ldc + j] += g.alpha * acc;
    }
  }
}

// Matrix-vector products (a 1x1 conv on a 1x1 map, a batch-1 classifier head) gain nothing from
// packing, which would copy the whole matrix once per call: they stream it through dot and axpy.
KILN_TARGET_CLONES float dot(const float* __restrict x, const float* __restrict y, int64_t n) {
  V16 acc0 = {}, acc1 = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    V16 x0, x1, y0, y1;
    std::memcpy(&x0, x + i, sizeof(V16));
    std::memcpy(&x1, x + i + 16, sizeof(V16));
    std::memcpy(&y0, y + i, sizeof(V16));
    std::memcpy(&y1, y + i + 16, sizeof(V16));
    acc0 += x0 * y0;
    acc1 += x1 * y1;
  }
  acc0 += acc1;
  float s = 0.f;
  for (int j = 0; j < 16; ++j) s += acc0[j];
  for (; i < n; ++i) s += x[i] * y[i];
  return s;
}

// out[r] = dot(b + r * ldb, x, n) for r < 4: four rows of B^T against one vector, sharing x's
// loads, their eight accumulators independent (dot alone has two FMA chains, so it waits on their
// latency). Each row keeps dot's order of sums: lanes i % 32 < 16 and the rest apart, those two
// added, the lanes summed in order, then the tail. A classifier head at batch 1 (MobileNetV3's
// 1024 -> 1000 Gemm) is this product 250 times.
KILN_TARGET_CLONES void dot4(const float* __restrict b, int64_t ldb, const float* __restrict x,
                             int64_t n, float* __restrict out) {
  V16 acc0[4] = {}, acc1[4] = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    V16 x0, x1;
    std::memcpy(&x0, x + i, sizeof(V16));
    std::memcpy(&x1, x + i + 16, sizeof(V16));
    for (int r = 0; r < 4; ++r) {
      V16 y0, y1;
      std::memcpy(&y0, b + r * ldb + i, sizeof(V16));
      std::memcpy(&y1, b + r * ldb + i + 16, sizeof(V16));
      acc0[r] += y0 * x0;
      acc1[r] += y1 * x1;
    }
  }
  for (int r = 0; r < 4; ++r) {
    acc0[r] += acc1[r];
    float s = 0.f;
    for (int j = 0; j < 16; ++j) s += acc0[r][j];
    for (int64_t t = i; t < n; ++t) s += b[r * ldb + t] * x[t];
    out[r] = s;
  }
}

KILN_TARGET_CLONES void axpy(float* __restrict y, const float* __restrict x, float a, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    V16 xv, yv;
    std::memcpy(&xv, x + i, sizeof(V16));
    std::memcpy(&yv, y + i, sizeof(V16));
    yv += a * xv;
    std::memcpy(y + i, &yv, sizeof(V16));
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

// acc[0:R*16] += w[t] * src[off[t] + 0:R*16] for each tap t in order, R vectors in registers
// (R independent FMA chains, so the taps do not wait on one another's latency).
template <int R>
inline __attribute__((always_inline)) void taps_block(float* __restrict acc,
                                                      const float* __restrict src,
                                                      const int64_t* off, const float* w,
                                                      int64_t taps) {
  V16 a[R];
  for (int r = 0; r < R; ++r) std::memcpy(&a[r], acc + 16 * r, sizeof(V16));
  for (int64_t t = 0; t < taps; ++t) {
    const float* s = src + off[t];
    const float wv = w[t];
    for (int r = 0; r < R; ++r) {
      V16 x;
      std::memcpy(&x, s + 16 * r, sizeof(V16));
      a[r] += wv * x;
    }
  }
  for (int r = 0; r < R; ++r) std::memcpy(acc + 16 * r, &a[r], sizeof(V16));
}

// acc[0:n] += w[t] * src[off[t] + 0:n] for t = 0, 1, ... taps - 1 in that order: every tap of a
// depthwise plane into one output run, held in registers 64 floats at a time while the taps stream
// past it (loaded and stored once instead of once per tap, one call instead of `taps`). Each
// element gets the same products and sums in the same order as one axpy call per tap; whether a
// product and its sum round once (FMA) is the compiler's choice per function (GCC 13 on the GPU
// host rounded 16-float runs differently in the two), so they agree within roundings, not bit
// for bit (CpuVectorMath.TapsAxpyMatchesOneAxpyPerTap). Callers pad n to a multiple of 16 where
// they can, since the tail is scalar.
KILN_TARGET_CLONES void taps_axpy(float* __restrict acc, const float* __restrict src,
                                  const int64_t* off, const float* w, int64_t taps, int64_t n) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) taps_block<4>(acc + i, src + i, off, w, taps);
  switch ((n - i) / 16) {
    case 3:
      taps_block<3>(acc + i, src + i, off, w, taps);
      i += 48;
      break;
    case 2:
      taps_block<2>(acc + i, src + i, off, w, taps);
      i += 32;
      break;
    case 1:
      taps_block<1>(acc + i, src + i, off, w, taps);
      i += 16;
      break;
    default:
      break;
  }
  // The scalar tail through axpy's own tail, so its elements round as axpy's do (whether the
  // compiler contracts them is axpy's business).
  if (i < n) {
    for (int64_t t = 0; t < taps; ++t) axpy(acc + i, src + off[t] + i, w[t], n - i);
  }
}

// depthwise_pixel_f32's R vectors of channels (V: 16 or 8 floats): the accumulators stay in
// registers while the taps stream past them.
template <int R, typename V = V16>
inline __attribute__((always_inline)) void depthwise_block(
    float* __restrict y, const float* __restrict x, const int64_t* off, const float* __restrict w,
    const int64_t* wrow, int64_t taps, const float* bias) {
  constexpr int W = sizeof(V) / sizeof(float);
  V a[R];
  for (int r = 0; r < R; ++r) {
    if (bias) {
      std::memcpy(&a[r], bias + W * r, sizeof(V));
    } else {
      a[r] = V{};
    }
  }
  for (int64_t t = 0; t < taps; ++t) {
    const float* xs = x + off[t];
    const float* ws = w + wrow[t];
    for (int r = 0; r < R; ++r) {
      V xv, wv;
      std::memcpy(&xv, xs + W * r, sizeof(V));
      std::memcpy(&wv, ws + W * r, sizeof(V));
      a[r] += xv * wv;
    }
  }
  for (int r = 0; r < R; ++r) std::memcpy(y + W * r, &a[r], sizeof(V));
}

}  // namespace

KILN_TARGET_CLONES void depthwise_pixel_f32(float* y, const float* x, const int64_t* off,
                                            const float* w, const int64_t* wrow, int64_t taps,
                                            const float* bias, int64_t c) {
  int64_t i = 0;
  for (; i + 64 <= c; i += 64) {
    depthwise_block<4>(y + i, x + i, off, w + i, wrow, taps, bias ? bias + i : nullptr);
  }
  switch ((c - i) / 16) {
    case 3:
      depthwise_block<3>(y + i, x + i, off, w + i, wrow, taps, bias ? bias + i : nullptr);
      i += 48;
      break;
    case 2:
      depthwise_block<2>(y + i, x + i, off, w + i, wrow, taps, bias ? bias + i : nullptr);
      i += 32;
      break;
    case 1:
      depthwise_block<1>(y + i, x + i, off, w + i, wrow, taps, bias ? bias + i : nullptr);
      i += 16;
      break;
    default:
      break;
  }
  if (i + 8 <= c) {
    depthwise_block<1, V8>(y + i, x + i, off, w + i, wrow, taps, bias ? bias + i : nullptr);
    i += 8;
  }
  for (; i < c; ++i) {
    float s = bias ? bias[i] : 0.f;
    for (int64_t t = 0; t < taps; ++t) s += x[off[t] + i] * w[wrow[t] + i];
    y[i] = s;
  }
}

namespace {

// Q output pixels of one output row (depthwise_band_block's inner step): acc[q] = b + the taps of
// pixel o + q in (kh, kw) order. Each input column of a filter row is loaded once and multiplied
// into every pixel it reaches, and the Q accumulators are independent chains (a fused
// multiply-add's latency is four cycles, two issue a cycle: eight chains keep both busy). A
// filter row's K vectors are loaded per row (wt: the block's filter, [K * K][W]): 25 filter
// vectors and eight accumulators would not fit the 32 registers.
template <int K, int S, int Q, typename V>
inline __attribute__((always_inline)) void depthwise_band_pixels(float* y, int64_t ycol,
                                                                 const float* x, int64_t off0,
                                                                 int64_t xrow, int64_t xcol,
                                                                 const float* wt, int64_t wcol, V b,
                                                                 int kh_lo, int kh_hi) {
  V acc[Q];
#pragma GCC unroll 8
  for (int q = 0; q < Q; ++q) acc[q] = b;
#pragma GCC unroll 8
  for (int kh = 0; kh < K; ++kh) {
    if (kh < kh_lo || kh >= kh_hi) continue;
    const float* row = x + (off0 + kh * xrow);
    V w[K];
#pragma GCC unroll 8
    for (int kw = 0; kw < K; ++kw) std::memcpy(&w[kw], wt + (kh * K + kw) * wcol, sizeof(V));
#pragma GCC unroll 32
    for (int j = 0; j < (Q - 1) * S + K; ++j) {
      V xv;
      std::memcpy(&xv, row + j * xcol, sizeof(V));
#pragma GCC unroll 8
      for (int q = 0; q < Q; ++q) {
        const int kw = j - q * S;
        if (kw >= 0 && kw < K) acc[q] += xv * w[kw];
      }
    }
  }
#pragma GCC unroll 8
  for (int q = 0; q < Q; ++q) std::memcpy(y + q * ycol, &acc[q], sizeof(V));
}

// Output pixels [o, ow_n) by depthwise_band_pixels, eight at a time, then four, two, one; pixel
// o's input column 0 of filter row 0 at x + off0, pixel o + 1's S columns (S * xcol floats) on.
template <int K, int S, typename V>
inline __attribute__((always_inline)) void depthwise_pixels_run(float* y, int64_t ycol,
                                                                const float* x, int64_t off0,
                                                                int64_t xrow, int64_t xcol,
                                                                const float* wt, int64_t wcol, V b,
                                                                int kh_lo, int kh_hi, int64_t n) {
  int64_t o = 0;
  auto at = [&](int64_t p) { return off0 + p * S * xcol; };
  for (; o + 8 <= n; o += 8) {
    depthwise_band_pixels<K, S, 8, V>(y + o * ycol, ycol, x, at(o), xrow, xcol, wt, wcol, b, kh_lo,
                                      kh_hi);
  }
  if (o + 4 <= n) {
    depthwise_band_pixels<K, S, 4, V>(y + o * ycol, ycol, x, at(o), xrow, xcol, wt, wcol, b, kh_lo,
                                      kh_hi);
    o += 4;
  }
  if (o + 2 <= n) {
    depthwise_band_pixels<K, S, 2, V>(y + o * ycol, ycol, x, at(o), xrow, xcol, wt, wcol, b, kh_lo,
                                      kh_hi);
    o += 2;
  }
  if (o < n) {
    depthwise_band_pixels<K, S, 1, V>(y + o * ycol, ycol, x, at(o), xrow, xcol, wt, wcol, b, kh_lo,
                                      kh_hi);
  }
}

// depthwise_row_f32 at other strides, for one K and P pixels at once: the channel block's K * K
// filter vectors (V: 16 or 8 floats) in registers, P accumulators.
template <int K, int P, typename V>
inline __attribute__((always_inline)) void depthwise_row_block(
    float* y, const float* img, const float* taps, const float* bias, int64_t c, int64_t c0,
    int64_t w_in, int64_t stride, int64_t ih0, int64_t kh_lo, int64_t kh_hi, int64_t iw0,
    int64_t ow_lo, int64_t ow_hi) {
  V w[K * K];
  for (int t = 0; t < K * K; ++t) std::memcpy(&w[t], taps + t * c + c0, sizeof(V));
  V b = V{};
  if (bias) std::memcpy(&b, bias + c0, sizeof(V));
  int64_t ow = ow_lo;
  auto pixels = [&](auto count) {
    constexpr int Q = decltype(count)::value;
    V acc[Q];
    for (int q = 0; q < Q; ++q) acc[q] = b;
    for (int kh = 0; kh < K; ++kh) {
      if (kh < kh_lo || kh >= kh_hi) continue;
      const float* row = img + ((ih0 + kh) * w_in + ow * stride + iw0) * c + c0;
      for (int kw = 0; kw < K; ++kw) {
        for (int q = 0; q < Q; ++q) {
          V xv;
          std::memcpy(&xv, row + (q * stride + kw) * c, sizeof(V));
          acc[q] += xv * w[kh * K + kw];
        }
      }
    }
    for (int q = 0; q < Q; ++q) std::memcpy(y + (ow + q) * c + c0, &acc[q], sizeof(V));
  };
  for (; ow + P <= ow_hi; ow += P) pixels(std::integral_constant<int, P>{});
  for (; ow < ow_hi; ++ow) pixels(std::integral_constant<int, 1>{});
}

template <int K, int P>
inline __attribute__((always_inline)) void depthwise_row_k(
    float* y, const float* img, const float* taps, const float* bias, int64_t c, int64_t cv,
    int64_t w_in, int64_t stride, int64_t ih0, int64_t kh_lo, int64_t kh_hi, int64_t iw0,
    int64_t ow_lo, int64_t ow_hi) {
  int64_t c0 = 0;
  for (; c0 + 16 <= cv; c0 += 16) {
    depthwise_row_block<K, P, V16>(y, img, taps, bias, c, c0, w_in, stride, ih0, kh_lo, kh_hi, iw0,
                                   ow_lo, ow_hi);
  }
  if (c0 + 8 <= cv) {
    depthwise_row_block<K, P, V8>(y, img, taps, bias, c, c0, w_in, stride, ih0, kh_lo, kh_hi, iw0,
                                  ow_lo, ow_hi);
  }
}

// depthwise_row_f32 at stride S in 1, 2: depthwise_band_pixels reading the pixels where they lie
// in the image (eight independent sums at a time, where the register-held filter of
// depthwise_row_block below leaves room for two at 5x5). MobileNetV3-small b1 on the 2-core VM
// (bench/ab_layers.sh 7 2, per-layer minima): its 5x5 stride-2 layers 27.0 -> 24.6 and
// 20.5 -> 18.8 us, the 5x5 layers on 7x7 maps 27.9 -> 25.0 and 33.3 -> 29.4; 3x3 ones unchanged.
template <int K, int S>
inline __attribute__((always_inline)) void depthwise_row_direct(
    float* y, const float* img, const float* taps, const float* bias, int64_t c, int64_t cv,
    int64_t w_in, int64_t ih0, int64_t kh_lo, int64_t kh_hi, int64_t iw0, int64_t ow_lo,
    int64_t ow_hi) {
  const int64_t off0 = (ih0 * w_in + ow_lo * S + iw0) * c;
  int64_t c0 = 0;
  for (; c0 + 16 <= cv; c0 += 16) {
    V16 b = V16{};
    if (bias) std::memcpy(&b, bias + c0, sizeof(V16));
    depthwise_pixels_run<K, S, V16>(y + ow_lo * c + c0, c, img + c0, off0, w_in * c, c, taps + c0,
                                    c, b, int(kh_lo), int(kh_hi), ow_hi - ow_lo);
  }
  if (c0 + 8 <= cv) {
    V8 b = V8{};
    if (bias) std::memcpy(&b, bias + c0, sizeof(V8));
    depthwise_pixels_run<K, S, V8>(y + ow_lo * c + c0, c, img + c0, off0, w_in * c, c, taps + c0, c,
                                   b, int(kh_lo), int(kh_hi), ow_hi - ow_lo);
  }
}

KILN_TARGET_CLONES bool depthwise_row(float* y, const float* img, const float* taps,
                                      const float* bias, int64_t k, int64_t c, int64_t cv,
                                      int64_t w_in, int64_t stride, int64_t ih0, int64_t kh_lo,
                                      int64_t kh_hi, int64_t iw0, int64_t ow_lo, int64_t ow_hi) {
  if ((stride == 1 || stride == 2) && (k == 3 || k == 5)) {
    if (k == 3 && stride == 1) {
      depthwise_row_direct<3, 1>(y, img, taps, bias, c, cv, w_in, ih0, kh_lo, kh_hi, iw0, ow_lo,
                                 ow_hi);
    } else if (k == 3) {
      depthwise_row_direct<3, 2>(y, img, taps, bias, c, cv, w_in, ih0, kh_lo, kh_hi, iw0, ow_lo,
                                 ow_hi);
    } else if (stride == 1) {
      depthwise_row_direct<5, 1>(y, img, taps, bias, c, cv, w_in, ih0, kh_lo, kh_hi, iw0, ow_lo,
                                 ow_hi);
    } else {
      depthwise_row_direct<5, 2>(y, img, taps, bias, c, cv, w_in, ih0, kh_lo, kh_hi, iw0, ow_lo,
                                 ow_hi);
    }
    return true;
  }
  if (k == 3) {
    depthwise_row_k<3, 4>(y, img, taps, bias, c, cv, w_in, stride, ih0, kh_lo, kh_hi, iw0, ow_lo,
                          ow_hi);
    return true;
  }
  if (k == 5) {
    depthwise_row_k<5, 2>(y, img, taps, bias, c, cv, w_in, stride, ih0, kh_lo, kh_hi, iw0, ow_lo,
                          ow_hi);
    return true;
  }
  return false;
}

}  // namespace

bool depthwise_row_f32(float* y, const float* img, const float* taps, const float* bias, int64_t k,
                       int64_t c, int64_t cv, int64_t w_in, int64_t stride, int64_t ih0,
                       int64_t kh_lo, int64_t kh_hi, int64_t iw0, int64_t ow_lo, int64_t ow_hi) {
  if (cv <= 0 || ow_lo >= ow_hi) return k == 3 || k == 5;
  return depthwise_row(y, img, taps, bias, k, c, cv, w_in, stride, ih0, kh_lo, kh_hi, iw0, ow_lo,
                       ow_hi);
}

namespace {

// depthwise_band_f32 on channels [c0, c0 + V's width): bands of output rows whose input rows
// (zero-padded along W) fill `scratch`.
template <int K, int S, typename V>
inline __attribute__((always_inline)) void depthwise_band_block(
    float* y, const float* img, const float* taps, const float* bias, int64_t c, int64_t c0,
    int64_t h, int64_t w_in, int64_t oh0, int64_t oh1, int64_t ow_n, int64_t pt, int64_t pl,
    float* scratch, int64_t band) {
  constexpr int W = sizeof(V) / sizeof(float);
  alignas(64) float wt[K * K * W];  // the block's filter, [K * K][W]: one base, constant offsets
  for (int t = 0; t < K * K; ++t) std::memcpy(wt + t * W, taps + t * c + c0, sizeof(V));
  V b = V{};
  if (bias) std::memcpy(&b, bias + c0, sizeof(V));
  const int64_t wp = (ow_n - 1) * S + K;  // the padded input columns an output row reads
  for (int64_t oa = oh0; oa < oh1; oa += band) {
    const int64_t ob = std::min(oh1, oa + band), first = oa * S - pt;
    const int64_t n_in = (ob - 1 - oa) * S + K;  // input rows first .. first + n_in - 1
    for (int64_t i = 0; i < n_in; ++i) {
      const int64_t ih = first + i;
      if (ih < 0 || ih >= h) continue;  // never read: those filter rows are skipped
      const float* src = img + ih * w_in * c + c0;
      float* dst = scratch + i * wp * W;
      for (int64_t j = 0; j < wp; ++j) {
        const int64_t iw = j - pl;
        V v = V{};
        if (iw >= 0 && iw < w_in) std::memcpy(&v, src + iw * c, sizeof(V));
        std::memcpy(dst + j * W, &v, sizeof(V));
      }
    }
    for (int64_t oh = oa; oh < ob; ++oh) {
      const int64_t ih0 = oh * S - pt;
      int kh_lo = 0, kh_hi = K;  // the filter rows inside the image
      while (kh_lo < K && ih0 + kh_lo < 0) ++kh_lo;
      while (kh_hi > kh_lo && ih0 + kh_hi - 1 >= h) --kh_hi;
      depthwise_pixels_run<K, S, V>(y + (oh - oh0) * ow_n * c + c0, c, scratch,
                                    (oh - oa) * S * wp * W, wp * W, W, wt, W, b, kh_lo, kh_hi,
                                    ow_n);
    }
  }
}

template <int K, int S>
inline __attribute__((always_inline)) void depthwise_band_k(float* y, const float* img,
                                                            const float* taps, const float* bias,
                                                            int64_t c, int64_t cv, int64_t h,
                                                            int64_t w_in, int64_t oh0, int64_t oh1,
                                                            int64_t ow_n, int64_t pt, int64_t pl,
                                                            float* scratch, int64_t band) {
  int64_t c0 = 0;
  for (; c0 + 16 <= cv; c0 += 16) {
    depthwise_band_block<K, S, V16>(y, img, taps, bias, c, c0, h, w_in, oh0, oh1, ow_n, pt, pl,
                                    scratch, band);
  }
  if (c0 + 8 <= cv) {
    depthwise_band_block<K, S, V8>(y, img, taps, bias, c, c0, h, w_in, oh0, oh1, ow_n, pt, pl,
                                   scratch, band);
  }
}

KILN_TARGET_CLONES bool depthwise_band(float* y, const float* img, const float* taps,
                                       const float* bias, int64_t k, int64_t s, int64_t c,
                                       int64_t cv, int64_t h, int64_t w_in, int64_t oh0,
                                       int64_t oh1, int64_t ow_n, int64_t pt, int64_t pl,
                                       float* scratch, int64_t band) {
  if (k == 3 && s == 1) {
    depthwise_band_k<3, 1>(y, img, taps, bias, c, cv, h, w_in, oh0, oh1, ow_n, pt, pl, scratch,
                           band);
  } else if (k == 3 && s == 2) {
    depthwise_band_k<3, 2>(y, img, taps, bias, c, cv, h, w_in, oh0, oh1, ow_n, pt, pl, scratch,
                           band);
  } else if (k == 5 && s == 1) {
    depthwise_band_k<5, 1>(y, img, taps, bias, c, cv, h, w_in, oh0, oh1, ow_n, pt, pl, scratch,
                           band);
  } else if (k == 5 && s == 2) {
    depthwise_band_k<5, 2>(y, img, taps, bias, c, cv, h, w_in, oh0, oh1, ow_n, pt, pl, scratch,
                           band);
  } else {
    return false;
  }
  return true;
}

constexpr int64_t kDepthwiseScratchFloats = 8192;  // 32 KB

// The output rows a band of depthwise_band_f32 computes per copy of its input rows: as many as
// keep the copied rows within kDepthwiseScratchFloats (at least one, at most 16).
int64_t depthwise_band_rows(int64_t k, int64_t s, int64_t ow) {
  const int64_t row_floats = ((ow - 1) * s + k) * 16;
  const int64_t fit = kDepthwiseScratchFloats / std::max<int64_t>(1, row_floats);
  return std::clamp<int64_t>((fit - k) / std::max<int64_t>(1, s) + 1, 1, 16);
}

}  // namespace

int64_t depthwise_band_scratch_floats(int64_t k, int64_t s, int64_t ow) {
  const int64_t copied = ((depthwise_band_rows(k, s, ow) - 1) * s + k) * ((ow - 1) * s + k) * 16;
  return std::max(kDepthwiseScratchFloats, copied);
}

bool depthwise_band_f32(float* y, const float* img, const float* taps, const float* bias, int64_t k,
                        int64_t s, int64_t c, int64_t cv, int64_t h, int64_t w_in, int64_t oh0,
                        int64_t oh1, int64_t ow, int64_t pt, int64_t pl, float* scratch) {
  if (!((k == 3 || k == 5) && (s == 1 || s == 2))) return false;
  if (cv <= 0 || oh0 >= oh1 || ow <= 0) return true;
  return depthwise_band(y, img, taps, bias, k, s, c, cv, h, w_in, oh0, oh1, ow, pt, pl, scratch,
                        depthwise_band_rows(k, s, ow));
}

namespace {

// sgemm_small_n's block: P rows of A against R vectors of B, P * R accumulators in registers.
// A's column p is a + off[p] where `off` is given (an implicit im2col), else a + p.
template <int R, int P>
inline __attribute__((always_inline)) void small_n_block(int64_t n, int64_t k, const float* a,
                                                         int64_t lda, const int64_t* off,
                                                         const float* b, float* c, int64_t ldc) {
  V16 acc[P][R];
  for (int i = 0; i < P; ++i) {
    for (int r = 0; r < R; ++r) acc[i][r] = V16{};
  }
  const int64_t ldb = R * 16;
  for (int64_t p = 0; p < k; ++p) {
    V16 bv[R];
    for (int r = 0; r < R; ++r) std::memcpy(&bv[r], b + p * ldb + 16 * r, sizeof(V16));
    for (int i = 0; i < P; ++i) {
      const float av = a[i * lda + (off ? off[p] : p)];
      for (int r = 0; r < R; ++r) acc[i][r] += av * bv[r];
    }
  }
  for (int i = 0; i < P; ++i) {
    float* ci = c + i * ldc;
    for (int r = 0; r < R; ++r) {
      const int64_t cols = std::min<int64_t>(16, n - 16 * r);
      if (cols == 16) {
        std::memcpy(ci + 16 * r, &acc[i][r], sizeof(V16));
      } else {
        float tmp[16];
        std::memcpy(tmp, &acc[i][r], sizeof(V16));
        std::memcpy(ci + 16 * r, tmp, size_t(cols) * sizeof(float));
      }
    }
  }
}

template <int R, int P>
inline __attribute__((always_inline)) void small_n_rows(int64_t m, int64_t n, int64_t k,
                                                        const float* a, int64_t lda,
                                                        const int64_t* off, const float* b,
                                                        float* c, int64_t ldc) {
  int64_t i = 0;
  for (; i + P <= m; i += P) small_n_block<R, P>(n, k, a + i * lda, lda, off, b, c + i * ldc, ldc);
  for (; i < m; ++i) small_n_block<R, 1>(n, k, a + i * lda, lda, off, b, c + i * ldc, ldc);
}

// The kernel twice, with and without the offsets, so the plain form's loads stay p-indexed.
template <bool kOff>
inline __attribute__((always_inline)) void small_n_any(int64_t m, int64_t n, int64_t k,
                                                       const float* a, int64_t lda,
                                                       const int64_t* off_in, const float* b,
                                                       float* c, int64_t ldc) {
  const int64_t* off = kOff ? off_in : nullptr;
  switch (small_n_stride(n) / 16) {
    case 1:
      return small_n_rows<1, 8>(m, n, k, a, lda, off, b, c, ldc);
    case 2:
      return small_n_rows<2, 6>(m, n, k, a, lda, off, b, c, ldc);
    case 3:
      return small_n_rows<3, 4>(m, n, k, a, lda, off, b, c, ldc);
    case 4:
      return small_n_rows<4, 4>(m, n, k, a, lda, off, b, c, ldc);
    case 5:
      return small_n_rows<5, 4>(m, n, k, a, lda, off, b, c, ldc);
    default:
      return small_n_rows<6, 4>(m, n, k, a, lda, off, b, c, ldc);
  }
}

KILN_TARGET_CLONES void small_n_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                     const float* b, float* c, int64_t ldc) {
  small_n_any<false>(m, n, k, a, lda, nullptr, b, c, ldc);
}

KILN_TARGET_CLONES void small_n_gemm_off(int64_t m, int64_t n, int64_t k, const float* a,
                                         int64_t lda, const int64_t* off, const float* b, float* c,
                                         int64_t ldc) {
  small_n_any<true>(m, n, k, a, lda, off, b, c, ldc);
}

}  // namespace

KILN_TARGET_CLONES void add_rows_f32(float* y, const float* b, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * n;
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
      V16 yv, bv;
      std::memcpy(&yv, yr + j, sizeof(V16));
      std::memcpy(&bv, b + j, sizeof(V16));
      yv += bv;
      std::memcpy(yr + j, &yv, sizeof(V16));
    }
    for (; j < n; ++j) yr[j] += b[j];
  }
}

namespace {

// A strided dot product, for the rare transposed layouts of a vector operand.
float dot_strided(const float* x, int64_t sx, const float* y, int64_t sy, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += x[i * sx] * y[i * sy];
  return s;
}

// n == 1: C[:, 0] += alpha * op(A) * op(B)[:, 0].
void gemv_n1(const GemmArgs& g) {
  int64_t sb = g.trans_b ? 1 : g.ldb;
  for (int64_t i = 0; i < g.m; ++i) {
    float v = !g.trans_a && sb == 1 ? dot(g.a + i * g.lda, g.b, g.k)
              : g.trans_a           ? dot_strided(g.a + i, g.lda, g.b, sb, g.k)
                                    : dot_strided(g.a + i * g.lda, 1, g.b, sb, g.k);
    g.c[i * g.ldc] += g.alpha * v;
  }
}

// m == 1: C[0, :] += alpha * op(A)[0, :] * op(B).
void gemv_m1(const GemmArgs& g) {
  int64_t sa = g.trans_a ? g.lda : 1;
  if (!g.trans_b) {
    for (int64_t p = 0; p < g.k; ++p) axpy(g.c, g.b + p * g.ldb, g.alpha * g.a[p * sa], g.n);
    return;
  }
  for (int64_t j = 0; j < g.n; ++j) {
    float v =
        sa == 1 ? dot(g.b + j * g.ldb, g.a, g.k) : dot_strided(g.b + j * g.ldb, 1, g.a, sa, g.k);
    g.c[j] += g.alpha * v;
  }
}

// A few rows of A (m <= kSmallM, A not transposed): a batch of a few vectors through a classifier
// head or projection (MobileNetV3's two Gemms at batch 4). Packing would copy all of B for a
// handful of rows, and a transposed B packed column by column reads it with a stride of K, so
// instead each row (B^T: [N, K]) or row segment (B: [K, N]) of B is read once and used against
// every row of A from L1 (B^T: dot4 per row; B: every row's products in registers, few_rows_nt).
// The columns of C are split over threads; each element keeps the order of its sums whatever the
// split and however many rows there are.
constexpr int64_t kSmallM = 8;

// C[0:P, 0:16R] += alpha * A[0:P, 0:k] * B[0:k, 0:16R] (B not transposed, rows ldb apart): P * R
// accumulators in registers, each summed from zero in order of p, B's row segment loaded once per
// p for every row of A.
template <int P, int R>
inline __attribute__((always_inline)) void few_rows_block(int64_t k, const float* a, int64_t lda,
                                                          const float* b, int64_t ldb, float* c,
                                                          int64_t ldc, float alpha) {
  V16 acc[P][R];
  for (int i = 0; i < P; ++i) {
    for (int r = 0; r < R; ++r) acc[i][r] = V16{};
  }
  for (int64_t p = 0; p < k; ++p) {
    V16 bv[R];
    for (int r = 0; r < R; ++r) std::memcpy(&bv[r], b + p * ldb + 16 * r, sizeof(V16));
    for (int i = 0; i < P; ++i) {
      const float av = a[i * lda + p];
      for (int r = 0; r < R; ++r) acc[i][r] += av * bv[r];
    }
  }
  for (int i = 0; i < P; ++i) {
    for (int r = 0; r < R; ++r) {
      V16 cv;
      std::memcpy(&cv, c + i * ldc + 16 * r, sizeof(V16));
      cv += alpha * acc[i][r];
      std::memcpy(c + i * ldc + 16 * r, &cv, sizeof(V16));
    }
  }
}

template <int P>
inline __attribute__((always_inline)) void few_rows_cols(int64_t k, const float* a, int64_t lda,
                                                         const float* b, int64_t ldb, float* c,
                                                         int64_t ldc, float alpha, int64_t cols) {
  int64_t j = 0;
  for (; j + 32 <= cols; j += 32) few_rows_block<P, 2>(k, a, lda, b + j, ldb, c + j, ldc, alpha);
  for (; j + 16 <= cols; j += 16) few_rows_block<P, 1>(k, a, lda, b + j, ldb, c + j, ldc, alpha);
  for (; j < cols; ++j) {  // fewer than 16 columns left: each in order of p
    for (int i = 0; i < P; ++i) {
      float s = 0.f;
      for (int64_t p = 0; p < k; ++p) s += a[i * lda + p] * b[p * ldb + j];
      c[i * ldc + j] += alpha * s;
    }
  }
}

// few_rows_task's product for B not transposed over columns [0, cols) of b and c: the rows of A
// (m <= kSmallM) all in registers against each 32 (then 16) columns of B.
KILN_TARGET_CLONES void few_rows_nt(int64_t m, int64_t k, const float* a, int64_t lda,
                                    const float* b, int64_t ldb, float* c, int64_t ldc, float alpha,
                                    int64_t cols) {
  switch (m) {
    case 1:
      return few_rows_cols<1>(k, a, lda, b, ldb, c, ldc, alpha, cols);
    case 2:
      return few_rows_cols<2>(k, a, lda, b, ldb, c, ldc, alpha, cols);
    case 3:
      return few_rows_cols<3>(k, a, lda, b, ldb, c, ldc, alpha, cols);
    case 4:
      return few_rows_cols<4>(k, a, lda, b, ldb, c, ldc, alpha, cols);
    case 5:
      return few_rows_cols<5>(k, a, lda, b, ldb, c, ldc, alpha, cols);
    case 6:
      return few_rows_cols<6>(k, a, lda, b, ldb, c, ldc, alpha, cols);
    case 7:
      return few_rows_cols<7>(k, a, lda, b, ldb, c, ldc, alpha, cols);
    default:
      return few_rows_cols<8>(k, a, lda, b, ldb, c, ldc, alpha, cols);
  }
}

struct FewRows {
  const GemmArgs* g;
  int64_t chunk;  // columns of C a task takes
};

void few_rows_task(const void* ctx, int64_t t) {
  const auto* f = static_cast<const FewRows*>(ctx);
  const GemmArgs& g = *f->g;
  const int64_t j0 = t * f->chunk, j1 = std::min(g.n, j0 + f->chunk);
  if (j0 >= j1) return;
  if (g.trans_b) {
    // Columns in fours (chunks start at multiples of 4, so which columns take dot4 and which dot
    // depends on the column alone, not on the split over threads).
    const int64_t quads = g.n / 4 * 4;
    int64_t j = j0;
    for (; j + 4 <= std::min(j1, quads); j += 4) {
      for (int64_t i = 0; i < g.m; ++i) {
        float v[4];
        dot4(g.b + j * g.ldb, g.ldb, g.a + i * g.lda, g.k, v);
        for (int r = 0; r < 4; ++r) g.c[i * g.ldc + j + r] += g.alpha * v[r];
      }
    }
    for (; j < j1; ++j) {
      for (int64_t i = 0; i < g.m; ++i)
        g.c[i * g.ldc + j] += g.alpha * dot(g.b + j * g.ldb, g.a + i * g.lda, g.k);
    }
    return;
  }
  few_rows_nt(g.m, g.k, g.a, g.lda, g.b + j0, g.ldb, g.c + j0, g.ldc, g.alpha, j1 - j0);
}

void few_rows(const GemmArgs& g) {
  // Each product here streams a row of B once (4 MB for MobileNetV3's head), so a quarter of the
  // blocked GEMM's threshold already pays for the pool's hand-off.
  const int64_t threads = g.m * g.n * g.k >= kParallelGemm / 4 ? thread_limit() : 1;
  // Four chunks a thread; column runs of whole 16-float vectors for the axpy form.
  int64_t chunk = (g.n + 4 * threads - 1) / (4 * threads);
  chunk = g.trans_b ? (chunk + 3) / 4 * 4 : (chunk + 15) / 16 * 16;
  const FewRows ctx{&g, chunk};
  const int64_t tasks = (g.n + chunk - 1) / chunk;
  if (threads > 1 && tasks > 1) {
    parallel_for(tasks, &few_rows_task, &ctx);
  } else {
    for (int64_t t = 0; t < tasks; ++t) few_rows_task(&ctx, t);
  }
}

}  // namespace

void saxpy(float* y, const float* x, float a, int64_t n) { axpy(y, x, a, n); }

void saxpy_taps(float* acc, const float* src, const int64_t* offsets, const float* w, int64_t taps,
                int64_t n) {
  taps_axpy(acc, src, offsets, w, taps, n);
}

void sgemm_small_n(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                   float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  small_n_gemm(m, n, k, a, lda, b, c, ldc);
}

void sgemm_small_n_gather(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                          const int64_t* off, const float* b, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  small_n_gemm_off(m, n, k, a, lda, off, b, c, ldc);
}

namespace {

void sgemm_with(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc, const float* packed) {
  if (m <= 0 || n <= 0) return;
  if (beta == 0.f) {
    for (int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.f);
  } else if (beta != 1.f) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] *= beta;
    }
  }
  if (k <= 0) return;
  GemmArgs g{trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc};
  if (double(m) * double(n) * double(k) <= double(kSmallGemm)) {
    small_gemm(g);
  } else if (n == 1) {
    gemv_n1(g);
  } else if (m <= kSmallM && !trans_a) {
    few_rows(g);
  } else if (m == 1) {
    gemv_m1(g);
  } else {
    blocked_gemm_dispatch(g, packed);
  }
}

float* align64(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
}

// op(B)'s panels in blocked_gemm's order (column panels of kNc, in each the k chunks of kKc, each
// chunk's slivers of NR columns, zero-padded), packed by pack_b<NR>.
template <int NR>
std::vector<float> pack_all(const GemmArgs& g) {
  int64_t total = 0;
  for (int64_t jc = 0; jc < g.n; jc += kNc) {
    total += (std::min(kNc, g.n - jc) + NR - 1) / NR * NR * g.k;
  }
  std::vector<float> out(size_t(total) + 16);
  float* dst = align64(out.data());  // as the scratch panels are
  for (int64_t jc = 0; jc < g.n; jc += kNc) {
    const int64_t nc = std::min(kNc, g.n - jc), slivers = (nc + NR - 1) / NR;
    for (int64_t pc = 0; pc < g.k; pc += kKc) {
      const int64_t kc = std::min(kKc, g.k - pc);
      pack_b<NR>(g, pc, jc, kc, nc, dst);
      dst += slivers * NR * kc;
    }
  }
  return out;
}

}  // namespace

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  sgemm_with(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, nullptr);
}

PackedB::PackedB(bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb)
    : trans_b_(trans_b), k_(k), n_(n), nr_(blocked_nr()) {
  if (k <= 0 || n <= 0) return;
  const GemmArgs g{false, trans_b, 0, n, k, 1.f, nullptr, 0, b, ldb, nullptr, 0};
  data_ = nr_ == 32 ? pack_all<32>(g) : nr_ == 16 ? pack_all<16>(g) : pack_all<8>(g);
}

void sgemm_packed(int64_t m, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                  const PackedB& packed, float beta, float* c, int64_t ldc) {
  // Packed for another tile width (a build without multiversioning loading a plan of one with it
  // cannot happen in one process, but the check costs nothing): pack as usual.
  const float* panels = packed.nr_ == blocked_nr() && !packed.data_.empty()
                            ? align64(const_cast<float*>(packed.data_.data()))
                            : nullptr;
  sgemm_with(false, packed.trans_b_, m, packed.n_, packed.k_, alpha, a, lda, b, ldb, beta, c, ldc,
             panels);
}

}  // namespace kiln::backends::cpu
