// The CPU backend's shared FP32 GEMM: a cache-blocked, register-tiled SGEMM that MatMul, Gemm and
// Conv (im2col, 1x1) run on. Row-major, arbitrary leading dims, optional transposes.
#pragma once

#include <cstdint>

namespace kiln::backends::cpu {

// C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C[m,n], all row-major. op(A) is A ([m,k],
// leading dim lda) or, when trans_a, the transpose of A stored as [k,m]; likewise for B. beta == 0
// overwrites C without reading it (NaNs in C do not leak). Accumulates in float. Internal packing
// buffers are per thread, bounded by the block sizes and allocated once per thread.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// y[0:n] += a * x[0:n], vectorized for the running CPU (the depthwise conv's inner loop).
void saxpy(float* y, const float* x, float a, int64_t n);

// acc[0:n] += w[t] * src[offsets[t] + 0:n] for each t < taps in order: the sums of one saxpy per
// tap in the same order (not always the same bits: the compiler decides per function whether a
// product and its sum round once), with the run kept in registers across the taps (a depthwise
// plane's every tap).
void saxpy_taps(float* acc, const float* src, const int64_t* offsets, const float* w, int64_t taps,
                int64_t n);

}  // namespace kiln::backends::cpu
