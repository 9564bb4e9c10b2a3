// The GEMM gemm.cc falls back to for a float16, bfloat16 or float64 problem cuBLASLt has no
// algorithm for (an alignment or type combination it lacks): a plain shared-memory tiled kernel,
// one output element per thread, in the column-major cuBLAS terms of gemm.cc's Problem. It
// accumulates in float (double for float64) in k order and rounds the output once.
#include <algorithm>
#include <string>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

constexpr int kTile = 16;

struct FallbackArgs {
  bool trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c;
  int64_t batch;
  double alpha, beta;
};

// D[m x n] (column-major, ld ldc) = alpha * op(A) op(B) + beta * D per batch. op(A)(i, p) is
// A[i + p*lda], or A[p + i*lda] when trans_a; op(B)(p, j) is B[p + j*ldb], or B[j + p*ldb] when
// trans_b. Blocks loop over n-tiles and batches beyond the grid's y and z limits; the loops are
// uniform over a block, so every thread reaches each __syncthreads.
template <typename T>
__global__ void gemm_fallback_kernel(FallbackArgs g, const T* a, const T* b, T* d) {
  using N = DNum<T>;
  using C = typename N::C;
  __shared__ C ta[kTile][kTile + 1];  // ta[p][i] = op(A)(i0 + i, k0 + p)
  __shared__ C tb[kTile][kTile + 1];  // tb[j][p] = op(B)(k0 + p, j0 + j)
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t i = int64_t(blockIdx.x) * kTile + tx;
  const int64_t n_tiles = (g.n + kTile - 1) / kTile;
  const C alpha = C(g.alpha), beta = C(g.beta);
  for (int64_t bt = blockIdx.z; bt < g.batch; bt += gridDim.z) {
    const T* ab = a + bt * g.stride_a;
    const T* bb = b + bt * g.stride_b;
    T* db = d + bt * g.stride_c;
    for (int64_t jt = blockIdx.y; jt < n_tiles; jt += gridDim.y) {
      const int64_t j = jt * kTile + ty;
      C acc = C(0);
      for (int64_t k0 = 0; k0 < g.k; k0 += kTile) {
        const int64_t pa = k0 + ty;  // this thread loads op(A)(i, pa) ...
        ta[ty][tx] = i < g.m && pa < g.k
                         ? N::load(g.trans_a ? ab[i * g.lda + pa] : ab[pa * g.lda + i])
                         : C(0);
        const int64_t pb = k0 + tx;  // ... and op(B)(pb, j)
        tb[ty][tx] = pb < g.k && j < g.n
                         ? N::load(g.trans_b ? bb[pb * g.ldb + j] : bb[j * g.ldb + pb])
                         : C(0);
        __syncthreads();
        for (int p = 0; p < kTile; ++p) acc += ta[p][tx] * tb[ty][p];
        __syncthreads();
      }
      if (i < g.m && j < g.n) {
        T& y = db[j * g.ldc + i];
        y = N::store(g.beta == 0 ? alpha * acc : alpha * acc + beta * N::load(y));
      }
    }
  }
}

}  // namespace

Status gemm_fallback(DType data, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                     double alpha, const void* a, int64_t lda, int64_t stride_a, const void* b,
                     int64_t ldb, int64_t stride_b, double beta, void* d, int64_t ldc,
                     int64_t stride_c, int64_t batch, cudaStream_t s) {
  if (m == 0 || n == 0 || batch == 0) return ok_status();
  const int64_t m_tiles = (m + kTile - 1) / kTile, n_tiles = (n + kTile - 1) / kTile;
  if (m_tiles > INT32_MAX) return unsupported("the fallback GEMM: " + std::to_string(m) + " rows");
  FallbackArgs g{trans_a, trans_b,  m,        n,        k,     lda,   ldb,
                 ldc,     stride_a, stride_b, stride_c, batch, alpha, beta};
  dim3 grid(unsigned(m_tiles), unsigned(std::min<int64_t>(n_tiles, 65535)),
            unsigned(std::min<int64_t>(batch, 65535)));
  bool known = visit_dtype<kTF64 | kTF16 | kTBF16>(data, [&](auto tag) {
    using T = decltype(tag);
    gemm_fallback_kernel<T><<<grid, dim3(kTile, kTile), 0, s>>>(
        g, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(d));
  });
  if (!known) return unsupported("the fallback GEMM: dtype " + std::string(dtype_name(data)));
  return launch_status("gemm_fallback_kernel");
}

}  // namespace kiln::backends::cuda
