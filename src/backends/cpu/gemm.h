// The CPU backend's shared FP32 GEMM: a cache-blocked, register-tiled SGEMM that MatMul, Gemm and
// Conv (im2col, 1x1) run on. Row-major, arbitrary leading dims, optional transposes.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::backends::cpu {

// C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C[m,n], all row-major. op(A) is A ([m,k],
// leading dim lda) or, when trans_a, the transpose of A stored as [k,m]; likewise for B. beta == 0
// overwrites C without reading it (NaNs in C do not leak). Accumulates in float. Internal packing
// buffers are per thread, bounded by the block sizes and allocated once per thread.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// op(B) of a GEMM whose B is constant (a layer's weights), packed once into the blocked GEMM's
// panels for the running CPU's tile width, so that sgemm_packed does not pack it on every call
// (1.3 of ViT-tiny's 12 ms at batch 1 on one thread). Holds a copy of B's size (padded to whole
// tiles). Move-only: the panels sit at a 64-byte boundary inside the buffer.
class PackedB {
 public:
  PackedB(bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb);
  PackedB(PackedB&&) = default;
  PackedB& operator=(PackedB&&) = default;
  PackedB(const PackedB&) = delete;
  PackedB& operator=(const PackedB&) = delete;
  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  bool trans_b() const { return trans_b_; }

 private:
  friend void sgemm_packed(int64_t m, float alpha, const float* a, int64_t lda, const float* b,
                           int64_t ldb, const PackedB& packed, float beta, float* c, int64_t ldc);
  bool trans_b_;
  int64_t k_, n_;
  int nr_;
  std::vector<float> data_;
};

// sgemm(false, packed.trans_b(), m, packed.n(), packed.k(), alpha, a, lda, b, ldb, beta, c, ldc)
// with B's panels from `packed` (b, ldb: the same B, for the paths that do not pack: few rows,
// matrix-vector products). The same products in the same order as sgemm, so the same bits.
void sgemm_packed(int64_t m, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                  const PackedB& packed, float beta, float* c, int64_t ldc);

// y[0:n] += a * x[0:n], vectorized for the running CPU (the depthwise conv's inner loop).
void saxpy(float* y, const float* x, float a, int64_t n);

// acc[0:n] += w[t] * src[offsets[t] + 0:n] for each t < taps in order: the sums of one saxpy per
// tap in the same order (not always the same bits: the compiler decides per function whether a
// product and its sum round once), with the run kept in registers across the taps (a depthwise
// plane's every tap).
void saxpy_taps(float* acc, const float* src, const int64_t* offsets, const float* w, int64_t taps,
                int64_t n);

// One output pixel of a channels-last depthwise convolution: y[j] = bias[j] (0 where bias is null)
// + the sum over t < taps, in that order, of x[off[t] + j] * w[wrow[t] + j], for j < c (the
// pixel's channels; each tap's input pixel and filter row are c floats apart from their
// neighbours). Vectorized over channels, 64 at a time in registers across the taps.
void depthwise_pixel_f32(float* y, const float* x, const int64_t* off, const float* w,
                         const int64_t* wrow, int64_t taps, const float* bias, int64_t c);

// C[i, 0:n] = sum over p < k of A[i, p] * B[p, 0:n] for i < m (C overwritten; row-major, A's
// rows lda apart, C's ldc), for few columns (n <= kSmallN): B is [k][round_up(n, 16)], zero-padded
// (small_n_stride). A channels-last conv with few output channels (an RGB stem's 16), where the
// blocked GEMM's 32-column tiles would be half empty: rows in blocks held in registers against B's
// row, each element's sum in order of p.
void sgemm_small_n(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                   float* c, int64_t ldc);
// sgemm_small_n with A's element (i, p) at a[i * lda + off[p]]: a conv's patches read where they
// lie in the image (the row of output pixel i at a + i * lda, tap p at off[p] from it) instead of
// copied out first. The same sums in the same order as sgemm_small_n on the copied rows.
void sgemm_small_n_gather(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                          const int64_t* off, const float* b, float* c, int64_t ldc);
inline int64_t small_n_stride(int64_t n) { return (n + 15) / 16 * 16; }
inline constexpr int64_t kSmallN = 96;

// Output pixels [ow_lo, ow_hi) of one output row of a channels-last depthwise K x K conv (K 3 or
// 5, dilation 1) whose taps along W all lie inside the input, channels [0, cv) (cv a multiple of
// 8 up to c): y is the row's first pixel, img the image ([H, W, c]), taps [K * K][c], rows
// kh in [kh_lo, kh_hi) valid at input row ih0 + kh, input column ow * stride + iw0 + kw. At
// strides 1 and 2, eight pixels of 16 (or 8) channels at a time, each input column loaded once a
// filter row; at others each 16 (or 8) channels' K * K filter vectors stay in registers across
// the pixels, several at once. Each output is bias + the taps in (kh, kw) order, as
// depthwise_pixel_f32 sums them. False (nothing written) for another K.
bool depthwise_row_f32(float* y, const float* img, const float* taps, const float* bias, int64_t k,
                       int64_t c, int64_t cv, int64_t w_in, int64_t stride, int64_t ih0,
                       int64_t kh_lo, int64_t kh_hi, int64_t iw0, int64_t ow_lo, int64_t ow_hi);

// Output rows [oh0, oh1) of one image of a channels-last depthwise K x K conv (K 3 or 5) at
// stride s (1 or 2), dilation 1, for channels [0, cv) (cv a multiple of 8 up to c): img is the
// image ([h, w_in, c]), taps [K * K][c], pads pt (top) and pl (left), y the band's first output
// row ([oh1 - oh0][ow][c]). For each 16 (or 8) channels, bands of output rows have their input
// rows copied into `scratch` (depthwise_band_scratch_floats(k, s, ow) floats) with the padding
// along W as zeros, so every pixel of a row, border or not, takes the same unrolled path: eight
// pixels at once, each input column loaded once a filter row. Each output is bias + the taps in
// (kh, kw) order (the rows inside the image; a tap in the left or right padding adds 0 * w).
// False (nothing written) for another K or s.
bool depthwise_band_f32(float* y, const float* img, const float* taps, const float* bias, int64_t k,
                        int64_t s, int64_t c, int64_t cv, int64_t h, int64_t w_in, int64_t oh0,
                        int64_t oh1, int64_t ow, int64_t pt, int64_t pl, float* scratch);
// The floats depthwise_band_f32 needs in `scratch` for this filter size, stride and output width:
// 32 KB, or the input rows of one output row where those alone are more.
int64_t depthwise_band_scratch_floats(int64_t k, int64_t s, int64_t ow);

// y[r * n + j] += b[j] for r < rows, j < n (a bias over rows of channels).
void add_rows_f32(float* y, const float* b, int64_t rows, int64_t n);

}  // namespace kiln::backends::cpu
