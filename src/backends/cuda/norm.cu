// Row kernels: Softmax/LogSoftmax, LayerNormalization and RMSNormalization (the Reduce* ops live in
// reduce.cu, the channel normalizations in channel_norm.cu);
// plus the small conversion and bias kernels the GEMM and conv paths use. One block per row; sums
// accumulate in double, as the CPU reference does (Softmax over short contiguous rows of float32,
// float16 and bfloat16: a warp per row, in float). Softmax takes every float dtype: float16 and
// bfloat16 compute in float, float64 in double.
#include <cfloat>
#include <optional>
#include <type_traits>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;
constexpr int kBlock = 256;

// Softmax over rows of length n whose elements are `inner` apart; row r starts at
// (r / inner) * n * inner + r % inner. The max and differences are in C (float, or double for
// float64), the sum of exponentials in double.
template <typename T>
__global__ void softmax_kernel(const T* x, T* y, int64_t n, int64_t inner, bool log_softmax) {
  using N = DNum<T>;
  using C = typename N::C;
  __shared__ double sd[32];
  __shared__ C sc[32];
  int64_t r = blockIdx.x;
  int64_t base = (r / inner) * n * inner + r % inner;
  C m = C(-INFINITY);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    m = NanMaxReduce()(m, N::load(x[base + j * inner]));
  m = block_reduce(m, NanMaxReduce(), sc, C(-INFINITY));
  double s = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    s += exp(double(N::load(x[base + j * inner]) - m));
  s = block_reduce(s, AddReduce(), sd, 0.0);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    C v = N::load(x[base + j * inner]) - m;
    y[base + j * inner] = N::store(C(log_softmax ? double(v) - log(s) : exp(double(v)) / s));
  }
}

// Softmax over contiguous rows of n <= 32 * kPer elements, float16/bfloat16/float32: a warp per
// row, each lane holding its kPer elements in registers, max and sum by shuffles; the sum of
// exponentials in float. One block of 256 threads per row (softmax_kernel) left most lanes idle
// on attention's rows of 128 or 197: 0.22 ms for BERT-base's [64, 12, 128, 128] at FP16.
template <typename T, int kPer>
__global__ void softmax_warp_kernel(const T* x, T* y, int64_t rows, int n, bool log_softmax) {
  using N = DNum<T>;
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* xr = x + row * n;
  T* yr = y + row * n;
  float v[kPer];
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int j = lane + 32 * k;
    v[k] = j < n ? float(N::load(xr[j])) : -INFINITY;
    m = NanMaxReduce()(m, v[k]);
  }
  for (int o = 16; o > 0; o >>= 1) m = NanMaxReduce()(m, __shfl_xor_sync(0xffffffffu, m, o));
  float s = 0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    if (lane + 32 * k < n) s += expf(v[k] - m);
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const float ls = logf(s), inv = 1.0f / s;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int j = lane + 32 * k;
    if (j < n) yr[j] = N::store(typename N::C(log_softmax ? v[k] - m - ls : expf(v[k] - m) * inv));
  }
}

// softmax_warp_kernel's rows through 16-byte accesses: kLanes lanes a row (4-32, so short rows
// share a warp), kVecs vectors a lane held in registers as loaded, each exponential computed once
// and kept. Element-at-a-time loads and a second expf per element ran GPT-2's [32, 12, 256, 256]
// float16 scores at 56 us on an H200 (bench/kernel_roofline.py: 60% of its copy bandwidth).
template <typename T, int kVecs, int kLanes>
__global__ void __launch_bounds__(128)
    softmax_vec_kernel(const T* x, T* y, int64_t rows, int n, bool log_softmax) {
  using N = DNum<T>;
  constexpr int kE = int(16 / sizeof(T));
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const int lane = threadIdx.x % kLanes;
  const bool live = row < rows;  // rows past the end still take part in the shuffles
  const int nv = live ? n / kE : 0;
  const uint4* xr = reinterpret_cast<const uint4*>(x + (live ? row : 0) * n);
  uint4* yr = reinterpret_cast<uint4*>(y + (live ? row : 0) * n);
  float v[kVecs][kE];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int c = lane + kLanes * i;
    const uint4 u = c < nv ? xr[c] : make_uint4(0, 0, 0, 0);
    const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      v[i][e] = c < nv ? float(N::load(h[e])) : -INFINITY;
      m = NanMaxReduce()(m, v[i][e]);
    }
  }
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1)
    m = NanMaxReduce()(m, __shfl_xor_sync(0xffffffffu, m, o));
  float s = 0;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const float d = v[i][e] - m;
      const float ex = lane + kLanes * i < nv ? expf(d) : 0.f;
      s += ex;
      v[i][e] = log_softmax ? d : ex;
    }
  }
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const float ls = logf(s), inv = 1.0f / s;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int c = lane + kLanes * i;
    if (c >= nv) continue;
    uint4 out;
    T* oh = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int e = 0; e < kE; ++e)
      oh[e] = N::store(typename N::C(log_softmax ? v[i][e] - ls : v[i][e] * inv));
    yr[c] = out;
  }
}

// softmax_vec_kernel where it applies (n a whole number of 16-byte vectors, at most 4 a lane: the
// fewest lanes of 4, 8, 16 or 32 that hold the row; aligned rows); false (nothing launched)
// otherwise.
template <typename T>
bool launch_softmax_vec(const void* x, void* y, int64_t rows, int64_t n, bool log, cudaStream_t s) {
  constexpr int64_t kE = 16 / sizeof(T);
  if (n % kE != 0 || n > 32 * 4 * kE || n < 1 || !aligned16(x) || !aligned16(y)) return false;
  const int64_t nv = n / kE;
  auto go = [&](auto vecs, auto lanes) {
    constexpr int kL = decltype(lanes)::value;
    const int64_t grid = (rows + 128 / kL - 1) / (128 / kL);
    if (grid > 0x7fffffff) return false;
    softmax_vec_kernel<T, decltype(vecs)::value, kL><<<unsigned(grid), 128, 0, s>>>(
        static_cast<const T*>(x), static_cast<T*>(y), rows, int(n), log);
    return true;
  };
  using I4 = std::integral_constant<int, 4>;
  if (nv <= 4 * 4) return go(I4{}, std::integral_constant<int, 4>{});
  if (nv <= 8 * 4) return go(I4{}, std::integral_constant<int, 8>{});
  if (nv <= 16 * 4) return go(I4{}, std::integral_constant<int, 16>{});
  return go(I4{}, std::integral_constant<int, 32>{});
}

// softmax_warp_kernel where it applies (contiguous rows of at most 1024, a float type other than
// float64); false (nothing launched) otherwise.
template <typename T>
bool launch_softmax_warp(const void* x, void* y, int64_t rows, int64_t n, int64_t inner, bool log,
                         cudaStream_t s) {
  if constexpr (std::is_same_v<T, double>) {
    return false;
  } else {
    if (inner != 1 || n > 1024 || n < 1) return false;
    if (launch_softmax_vec<T>(x, y, rows, n, log, s)) return true;
    const unsigned grid = unsigned((rows + 7) / 8);  // 8 warps (rows) per block of 256
    if (grid > 0x7fffffffu / 256) return false;
    auto go = [&](auto per) {
      constexpr int kPer = decltype(per)::value;
      softmax_warp_kernel<T, kPer>
          <<<grid, 256, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), rows, int(n), log);
    };
    if (n <= 128)
      go(std::integral_constant<int, 4>{});
    else if (n <= 256)
      go(std::integral_constant<int, 8>{});
    else if (n <= 512)
      go(std::integral_constant<int, 16>{});
    else
      go(std::integral_constant<int, 32>{});
    return true;
  }
}

__global__ void layer_norm_kernel(const float* x, const float* scale, const float* bias, float* y,
                                  float* mean_out, float* inv_out, int64_t n, int64_t scale_n,
                                  int64_t bias_n, float eps) {
  __shared__ double sd[32];
  int64_t r = blockIdx.x;
  const float* row = x + r * n;
  double s = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += row[j];
  double mean = block_reduce(s, AddReduce(), sd, 0.0) / double(n);
  double v = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    double d = row[j] - mean;
    v += d * d;
  }
  double var = block_reduce(v, AddReduce(), sd, 0.0) / double(n);
  double inv = 1.0 / sqrt(var + double(eps));
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    double o = (row[j] - mean) * inv;
    if (scale) o *= scale[scale_n == 1 ? 0 : j];
    if (bias) o += bias[bias_n == 1 ? 0 : j];
    y[r * n + j] = float(o);
  }
  if (threadIdx.x == 0) {
    if (mean_out) mean_out[r] = float(mean);
    if (inv_out) inv_out[r] = float(inv);
  }
}

// LayerNormalization of float16/bfloat16 rows: statistics in double as above; Scale and B in X's
// type or float32, Mean and InvStdDev in any float type (read and written by dtype).
struct HalfLayerNormArgs {
  const void *scale, *bias;
  void *mean, *inv;
  int scale_dtype, bias_dtype, mean_dtype, inv_dtype;
  int64_t n, scale_n, bias_n;
  float eps;
};

template <typename T>
__global__ void layer_norm_half_kernel(const T* x, T* y, HalfLayerNormArgs a) {
  __shared__ double sd[32];
  const int64_t r = blockIdx.x, n = a.n;
  const T* row = x + r * n;
  double s = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += DNum<T>::load(row[j]);
  double mean = block_reduce(s, AddReduce(), sd, 0.0) / double(n);
  double v = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    double d = DNum<T>::load(row[j]) - mean;
    v += d * d;
  }
  double var = block_reduce(v, AddReduce(), sd, 0.0) / double(n);
  double inv = 1.0 / sqrt(var + double(a.eps));
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    double o = (DNum<T>::load(row[j]) - mean) * inv;
    if (a.scale) o *= load_as<double>(a.scale, a.scale_dtype, a.scale_n == 1 ? 0 : j);
    if (a.bias) o += load_as<double>(a.bias, a.bias_dtype, a.bias_n == 1 ? 0 : j);
    y[r * n + j] = DNum<T>::store(float(o));
  }
  if (threadIdx.x == 0) {
    if (a.mean) store_as<double>(a.mean, a.mean_dtype, r, mean);
    if (a.inv) store_as<double>(a.inv, a.inv_dtype, r, inv);
  }
}

// LayerNormalization of float16/bfloat16/float32 rows of n <= kE * kLanes * kVecs elements (kE =
// 8 or 4 a 16-byte vector; at most 2048 or 1024), n a multiple of kE, with Scale and B of X's
// type and the row's size (or absent) and no Mean/InvStdDev outputs: kLanes lanes of a warp a row
// (32, or 4-16 for short rows), held in registers from 16-byte loads; mean and variance in float
// over the held values (two passes, no cancellation), one rounding of each result. The
// block-per-row kernels above read the row three times in double: 47-70 us a layer for
// BERT-base's and ViT-B/16's [8192..12608, 768] float16 rows at batch 64 on an H100; in float32,
// 60 us for ViT-B/16's rows and 221 us for ConvNeXt-T's [100352, 96] on an H200 (bench/
// kernel_roofline.py: 50% and 13% of its copy bandwidth).
//
// kRms: RMSNormalization's rows the same way (no mean subtracted, no B): the block-per-row
// rms_norm_kernel below reads in double through load_as and took 80 us a layer on a Llama-style
// decoder's [8192, 1024] rows on an H200.
template <typename T, int kVecs, int kLanes, bool kRms = false>
__global__ void __launch_bounds__(128, kVecs <= 3 ? 16 : 1)
    layer_norm_warp_kernel(const T* x, const T* scale, const T* bias, T* y, int64_t rows, int n,
                           float eps) {
  using N = DNum<T>;
  constexpr int kE = int(16 / sizeof(T));  // elements a 16-byte vector
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const int lane = threadIdx.x % kLanes;
  // Rows past the end still take part in the shuffles (a group of lanes shares its warp with other
  // rows), with nothing loaded and nothing stored.
  const bool live = row < rows;
  const int nv = live ? n / kE : 0;
  const uint4* xr = reinterpret_cast<const uint4*>(x + (live ? row : 0) * n);
  uint4* yr = reinterpret_cast<uint4*>(y + (live ? row : 0) * n);
  // The row stays in registers as loaded (8 halves a vector) and is converted to float in each of
  // the three passes: a float copy took 53 registers a thread for 768-wide rows, so only 36 of an
  // SM's 64 warps were resident and GPT-2's [8192, 768] rows took two waves (9.7 us a layer on an
  // H200); held as loaded, the rows of a layer are resident at once.
  uint4 u[kVecs];
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int c = lane + kLanes * i;
    u[i] = c < nv ? xr[c] : make_uint4(0, 0, 0, 0);
  }
  auto at = [&](int i, int e) { return float(N::load(reinterpret_cast<const T*>(&u[i])[e])); };
  float mean = 0;
  if (!kRms) {
    float s = 0;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
#pragma unroll
      for (int e = 0; e < kE; ++e) s += at(i, e);
    }
#pragma unroll
    for (int o = kLanes / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    mean = s / float(n);
  }
  float q = 0;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    if (lane + kLanes * i < nv) {
#pragma unroll
      for (int e = 0; e < kE; ++e) q += (at(i, e) - mean) * (at(i, e) - mean);
    }
  }
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
  const float inv = 1.f / sqrtf(q / float(n) + eps);
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int c = lane + kLanes * i;
    if (c >= nv) continue;
    uint4 su = scale ? reinterpret_cast<const uint4*>(scale)[c] : make_uint4(0, 0, 0, 0);
    uint4 bu = bias ? reinterpret_cast<const uint4*>(bias)[c] : make_uint4(0, 0, 0, 0);
    const T *sh = reinterpret_cast<const T*>(&su), *bh = reinterpret_cast<const T*>(&bu);
    uint4 out;
    T* oh = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      float o = (at(i, e) - mean) * inv;
      if (scale) o *= float(N::load(sh[e]));
      if (bias) o += float(N::load(bh[e]));
      oh[e] = N::store(typename N::C(o));
    }
    yr[c] = out;
  }
}

// layer_norm_warp_kernel where it applies; false (nothing launched) otherwise. A row takes the
// fewest lanes (4, 8, 16 or 32) that leave each at most 4 vectors, so short rows share a warp:
// ConvNeXt-T's 96-channel rows (12 vectors) had 20 of 32 lanes idle when a row took a warp
// (190 us for 9 layers at batch 32 on an H200, 1.8 TB/s).
template <typename T, bool kRms = false>
bool layer_norm_warp(const TensorView& x, const TensorView* scale, const TensorView* bias, T* y,
                     int64_t rows, int64_t n, float eps, cudaStream_t s) {
  constexpr int64_t kE = 16 / sizeof(T);
  if (n % kE != 0 || n > 256 * kE || rows > int64_t(0x7fffffff) * 4 || !aligned16(x.data) ||
      !aligned16(y))
    return false;
  for (const TensorView* p : {scale, bias}) {
    if (p && (p->dtype != x.dtype || p->numel() != n || !aligned16(p->data))) return false;
  }
  const T* sp = scale ? static_cast<const T*>(scale->data) : nullptr;
  const T* bp = bias ? static_cast<const T*>(bias->data) : nullptr;
  const int64_t nv = n / kE;  // 16-byte vectors a row
  auto go = [&](auto vecs, auto lanes) {
    constexpr int kL = decltype(lanes)::value;
    const unsigned grid = unsigned((rows + 128 / kL - 1) / (128 / kL));  // blocks of 128
    layer_norm_warp_kernel<T, decltype(vecs)::value, kL, kRms>
        <<<grid, 128, 0, s>>>(static_cast<const T*>(x.data), sp, bp, y, rows, int(n), eps);
  };
  using I1 = std::integral_constant<int, 1>;
  using I2 = std::integral_constant<int, 2>;
  using I4 = std::integral_constant<int, 4>;
  using I8 = std::integral_constant<int, 8>;
  if (nv <= 4 * 4) {
    go(I4{}, std::integral_constant<int, 4>{});
  } else if (nv <= 8 * 4) {
    go(I4{}, std::integral_constant<int, 8>{});
  } else if (nv <= 16 * 4) {
    go(I4{}, std::integral_constant<int, 16>{});
  } else {
    const int64_t per_lane = (nv + 31) / 32;
    auto l32 = std::integral_constant<int, 32>{};
    if (per_lane <= 1)
      go(I1{}, l32);
    else if (per_lane <= 2)
      go(I2{}, l32);
    else if (per_lane <= 3)
      go(std::integral_constant<int, 3>{}, l32);
    else if (per_lane <= 4)
      go(I4{}, l32);
    else
      go(I8{}, l32);
  }
  return true;
}

// RMSNormalization: the normalized slice as up to kMaxRank dims, Scale broadcast onto them by
// per-dim strides (0 where it broadcasts); any float dtype through load_as/store_as.
struct RmsArgs {
  int rank;
  int64_t dims[kMaxRank];
  int64_t scale_strides[kMaxRank];
  int64_t n;
  int dtype, scale_dtype;
  double eps;
};

__global__ void rms_norm_kernel(const void* x, const void* scale, void* y, RmsArgs a) {
  __shared__ double sd[32];
  const int64_t base = int64_t(blockIdx.x) * a.n;
  double s = 0;
  for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x) {
    double v = load_as<double>(x, a.dtype, base + j);
    s += v * v;
  }
  s = block_reduce(s, AddReduce(), sd, 0.0);
  const double inv = 1.0 / sqrt(s / double(a.n > 0 ? a.n : 1) + a.eps);
  for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x) {
    int64_t si = 0, r = j;
    for (int d = a.rank - 1; d >= 0; --d) {
      si += (r % a.dims[d]) * a.scale_strides[d];
      r /= a.dims[d];
    }
    double o =
        load_as<double>(x, a.dtype, base + j) * inv * load_as<double>(scale, a.scale_dtype, si);
    store_as<double>(y, a.dtype, base + j, o);
  }
}

class SoftmaxKernel final : public CudaKernel {
 public:
  SoftmaxKernel(std::string name, int64_t axis, bool single_axis, bool log)
      : CudaKernel(std::move(name)), axis_(axis), single_(single_axis), log_(log) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    int rank = x.rank();
    int64_t axis = axis_ < 0 ? axis_ + rank : axis_;
    if (rank == 0 || axis < 0 || axis >= rank)
      return invalid_argument(name_ + ": axis " + std::to_string(axis_) + " out of range");
    int64_t outer = 1, n = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= x.shape[d];
    if (single_) {
      n = x.shape[axis];
      for (int d = int(axis) + 1; d < rank; ++d) inner *= x.shape[d];
    } else {
      for (int d = int(axis); d < rank; ++d) n *= x.shape[d];
    }
    int64_t rows = outer * inner;
    if (rows == 0 || n == 0) return ok_status();
    if (rows > INT32_MAX) return unsupported(name_ + ": too many rows");
    bool known = visit_dtype<kTFloats>(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (launch_softmax_warp<T>(x.data, out[0].data, rows, n, inner, log_, stream_)) return;
      softmax_kernel<T><<<unsigned(rows), kBlock, 0, stream_>>>(
          static_cast<const T*>(x.data), static_cast<T*>(out[0].data), n, inner, log_);
    });
    if (!known) return unsupported(name_ + ": dtype " + std::string(dtype_name(x.dtype)));
    return launch_status("softmax_kernel");
  }

 private:
  int64_t axis_;
  bool single_, log_;
};

class LayerNormKernel final : public CudaKernel {
 public:
  LayerNormKernel(int64_t axis, float eps)
      : CudaKernel("cuda.LayerNormalization"), axis_(axis), eps_(eps) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    int rank = x.rank();
    if (x.dtype == DType::kFloat16 || x.dtype == DType::kBFloat16) return execute_half(in, out);
    if (x.dtype != DType::kFloat32) {
      return unsupported(name_ + ": float32, float16 and bfloat16 only on CUDA");
    }
    int64_t axis = axis_ < 0 ? axis_ + rank : axis_;
    if (rank == 0 || axis < 0 || axis >= rank)
      return invalid_argument("LayerNormalization: axis out of range");
    int64_t outer = 1, n = 1;
    for (int d = 0; d < axis; ++d) outer *= x.shape[d];
    for (int d = int(axis); d < rank; ++d) n *= x.shape[d];
    const float* scale = in.size() > 1 && present(in[1]) ? in[1].as<const float>() : nullptr;
    const float* bias = in.size() > 2 && present(in[2]) ? in[2].as<const float>() : nullptr;
    int64_t sn = scale ? in[1].numel() : 1, bn = bias ? in[2].numel() : 1;
    if ((scale && sn != n && sn != 1) || (bias && bn != n && bn != 1)) {
      return unsupported(
          "LayerNormalization: the CUDA backend needs Scale and B of the normalized size or 1");
    }
    float* mean = out.size() > 1 && present(out[1]) ? out[1].as<float>() : nullptr;
    float* inv = out.size() > 2 && present(out[2]) ? out[2].as<float>() : nullptr;
    if (outer == 0 || n == 0) return ok_status();
    if (!mean && !inv && out[0].dtype == DType::kFloat32 && outer <= INT32_MAX) {
      const TensorView* sv = scale ? &in[1] : nullptr;
      const TensorView* bv = bias ? &in[2] : nullptr;
      if (layer_norm_warp(x, sv, bv, out[0].as<float>(), outer, n, eps_, stream_))
        return launch_status("layer_norm_warp_kernel");
    }
    layer_norm_kernel<<<unsigned(outer), kBlock, 0, stream_>>>(
        x.as<const float>(), scale, bias, out[0].as<float>(), mean, inv, n, sn, bn, eps_);
    return launch_status("layer_norm_kernel");
  }

 private:
  // Float16/bfloat16 X and Y (make_layer_norm checked the other dtypes).
  Status execute_half(std::span<const TensorView> in, std::span<const TensorView> out) {
    const TensorView &x = in[0], &y = out[0];
    int rank = x.rank();
    int64_t axis = axis_ < 0 ? axis_ + rank : axis_;
    if (rank == 0 || axis < 0 || axis >= rank) {
      return invalid_argument("LayerNormalization: axis out of range");
    }
    if (y.dtype != x.dtype) return invalid_argument(name_ + ": Y's dtype differs from X's");
    int64_t outer = 1, n = 1;
    for (int d = 0; d < axis; ++d) outer *= x.shape[d];
    for (int d = int(axis); d < rank; ++d) n *= x.shape[d];
    HalfLayerNormArgs a{};
    bool has_scale = in.size() > 1 && present(in[1]), has_bias = in.size() > 2 && present(in[2]);
    a.scale = has_scale ? in[1].data : nullptr, a.scale_dtype = has_scale ? int(in[1].dtype) : 0;
    a.bias = has_bias ? in[2].data : nullptr, a.bias_dtype = has_bias ? int(in[2].dtype) : 0;
    a.scale_n = has_scale ? in[1].numel() : 1, a.bias_n = has_bias ? in[2].numel() : 1;
    if ((has_scale && a.scale_n != n && a.scale_n != 1) ||
        (has_bias && a.bias_n != n && a.bias_n != 1)) {
      return unsupported(
          "LayerNormalization: the CUDA backend needs Scale and B of the normalized size or 1");
    }
    if (out.size() > 1 && present(out[1])) a.mean = out[1].data, a.mean_dtype = int(out[1].dtype);
    if (out.size() > 2 && present(out[2])) a.inv = out[2].data, a.inv_dtype = int(out[2].dtype);
    a.n = n, a.eps = eps_;
    if (outer == 0 || n == 0) return ok_status();
    if (outer > INT32_MAX) return unsupported(name_ + ": too many rows");
    const TensorView* scale = has_scale ? &in[1] : nullptr;
    const TensorView* bias = has_bias ? &in[2] : nullptr;
    if (!a.mean && !a.inv) {
      const bool warp =
          x.dtype == DType::kFloat16
              ? layer_norm_warp(x, scale, bias, y.as<__half>(), outer, n, eps_, stream_)
              : layer_norm_warp(x, scale, bias, y.as<__nv_bfloat16>(), outer, n, eps_, stream_);
      if (warp) return launch_status("layer_norm_warp_kernel");
    }
    if (x.dtype == DType::kFloat16) {
      layer_norm_half_kernel<__half>
          <<<unsigned(outer), kBlock, 0, stream_>>>(x.as<const __half>(), y.as<__half>(), a);
    } else {
      layer_norm_half_kernel<__nv_bfloat16><<<unsigned(outer), kBlock, 0, stream_>>>(
          x.as<const __nv_bfloat16>(), y.as<__nv_bfloat16>(), a);
    }
    return launch_status("layer_norm_half_kernel");
  }

  int64_t axis_;
  float eps_;
};

class RmsNormKernel final : public CudaKernel {
 public:
  RmsNormKernel(int64_t axis, float eps)
      : CudaKernel("cuda.RMSNormalization"), axis_(axis), eps_(eps) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &scale = in[1];
    int rank = x.rank();
    int64_t axis = axis_ < 0 ? axis_ + rank : axis_;
    if (rank == 0 || axis < 0 || axis >= rank)
      return invalid_argument(name_ + ": axis out of range");
    int64_t outer = 1, n = 1;
    for (int d = 0; d < axis; ++d) outer *= x.shape[d];
    for (int d = int(axis); d < rank; ++d) n *= x.shape[d];
    RmsArgs a{};
    a.n = n, a.dtype = int(x.dtype), a.scale_dtype = int(scale.dtype), a.eps = double(eps_);
    const int nr = rank - int(axis), pr = scale.rank();
    if (scale.numel() == n || scale.numel() == 1) {
      a.rank = 1, a.dims[0] = n > 0 ? n : 1, a.scale_strides[0] = scale.numel() == 1 ? 0 : 1;
    } else {
      if (pr > nr)
        return invalid_argument(name_ + ": Scale has more dims than the normalized slice");
      if (nr > kMaxRank) return unsupported(name_ + ": more than 8 normalized dims");
      a.rank = nr;
      int64_t stride = 1;
      for (int d = nr - 1; d >= 0; --d) {
        a.dims[d] = x.shape[axis + d];
        int pd = d - (nr - pr);
        int64_t sdim = pd >= 0 ? scale.shape[pd] : 1;
        if (sdim != 1 && sdim != a.dims[d]) {
          return invalid_argument(name_ + ": Scale of shape " + shape_to_string(scale.shape) +
                                  " does not broadcast onto the normalized dims");
        }
        a.scale_strides[d] = sdim == 1 ? 0 : stride;
        stride *= sdim;
      }
    }
    if (outer == 0 || n == 0) return ok_status();
    if (outer > INT32_MAX) return unsupported(name_ + ": too many rows");
    if (scale.numel() == n && scale.dtype == x.dtype) {
      const bool warp =
          x.dtype == DType::kFloat16
              ? layer_norm_warp<__half, true>(x, &scale, nullptr, out[0].as<__half>(), outer, n,
                                              eps_, stream_)
          : x.dtype == DType::kBFloat16
              ? layer_norm_warp<__nv_bfloat16, true>(x, &scale, nullptr, out[0].as<__nv_bfloat16>(),
                                                     outer, n, eps_, stream_)
          : x.dtype == DType::kFloat32
              ? layer_norm_warp<float, true>(x, &scale, nullptr, out[0].as<float>(), outer, n, eps_,
                                             stream_)
              : false;
      if (warp) return launch_status("rms_norm_warp_kernel");
    }
    rms_norm_kernel<<<unsigned(outer), kBlock, 0, stream_>>>(x.data, scale.data, out[0].data, a);
    return launch_status("rms_norm_kernel");
  }

 private:
  int64_t axis_;
  float eps_;
};

StatusOr<std::unique_ptr<Kernel>> make_softmax(const KernelQuery& q) {
  const DType t = q.input_dtype(0);
  if (!is_float(t) || dtype_size(t) < 2 || q.output_dtype(0) != t) {
    return unsupported(
        q.node.describe() + ": the CUDA " + q.node.op_type +
        " takes float32, float64, float16 or bfloat16 with the output of the input's dtype, not " +
        std::string(dtype_name(t)) + " to " + std::string(dtype_name(q.output_dtype(0))));
  }
  bool single = q.node.opset <= 0 || q.node.opset >= 13;
  KILN_ASSIGN_OR_RETURN(int64_t axis, q.node.attrs.get_int("axis", single ? -1 : 1));
  bool log = q.node.op_type == "LogSoftmax";
  return std::unique_ptr<Kernel>(new SoftmaxKernel("cuda." + q.node.op_type, axis, single, log));
}

// The elements of `v` as a formula over the input symbols; nullopt when its shape is unknown.
std::optional<ir::Dim> numel_of(const ir::Value* v, size_t from = 0) {
  if (!v || !v->shape) return std::nullopt;
  ir::Dim n(int64_t(1));
  for (size_t d = from; d < v->shape->size(); ++d) n = n * (*v->shape)[d];
  return n;
}

StatusOr<std::unique_ptr<Kernel>> make_layer_norm(const KernelQuery& q) {
  KILN_RETURN_IF_ERROR(require_float_data(q));
  KILN_ASSIGN_OR_RETURN(int64_t axis, q.node.attrs.get_int("axis", -1));
  KILN_ASSIGN_OR_RETURN(float eps, q.node.attrs.get_float("epsilon", 1e-5f));
  // The kernel broadcasts Scale and B only as the whole normalized slice or one element: refuse
  // any other shape here, at build time, rather than when it runs.
  if (!q.inputs.empty() && q.inputs[0] && q.inputs[0]->shape) {
    int64_t rank = int64_t(q.inputs[0]->shape->size());
    int64_t a = axis < 0 ? axis + rank : axis;
    if (a >= 0 && a < rank) {
      std::optional<ir::Dim> n = numel_of(q.inputs[0], size_t(a));
      for (size_t i : {size_t(1), size_t(2)}) {
        if (i >= q.inputs.size() || !q.inputs[i]) continue;
        std::optional<ir::Dim> m = numel_of(q.inputs[i]);
        bool one = m && m->is_const() && m->value() == 1;
        if (!one && !(n && m && *m == *n)) {
          return unsupported(q.node.describe() + ": the CUDA LayerNormalization needs " +
                             (i == 1 ? "Scale" : "B") + " of the normalized slice's size (" +
                             (n ? n->to_string() : "unknown") +
                             " elements) or one element; it has " +
                             (m ? m->to_string() : "an unknown number of") + " elements");
        }
      }
    }
  }
  return std::unique_ptr<Kernel>(new LayerNormKernel(axis, eps));
}

// Conversions between float and float16/bfloat16: 8 elements a thread on 16-byte accesses where n
// is a multiple of 8 and both buffers are 16-byte aligned (every engine output of an FP16 build
// passes here; one element a thread ran at about 2 TB/s on an H200), one a thread otherwise.
template <typename T>
struct alignas(8 * sizeof(T)) Pack8 {
  T v[8];
};
struct ToHalf {
  __device__ __half operator()(float x) const { return __float2half_rn(x); }
};
struct ToBf16 {
  __device__ __nv_bfloat16 operator()(float x) const { return __float2bfloat16_rn(x); }
};
struct FromHalf {
  __device__ float operator()(__half x) const { return __half2float(x); }
};
struct FromBf16 {
  __device__ float operator()(__nv_bfloat16 x) const { return __bfloat162float(x); }
};
template <typename From, typename To, typename Cvt>
__global__ void convert_kernel(const From* in, To* out, int64_t n) {
  KILN_GRID_LOOP(i, n) out[i] = Cvt()(in[i]);
}
template <typename From, typename To, typename Cvt>
__global__ void convert8_kernel(const Pack8<From>* in, Pack8<To>* out, int64_t n8) {
  KILN_GRID_LOOP(i, n8) {
    const Pack8<From> a = in[i];
    Pack8<To> b;
#pragma unroll
    for (int k = 0; k < 8; ++k) b.v[k] = Cvt()(a.v[k]);
    out[i] = b;
  }
}
template <typename From, typename To, typename Cvt>
Status convert(const void* in, void* out, int64_t n, cudaStream_t s, const char* name) {
  if (n == 0) return ok_status();
  if (n % 8 == 0 && aligned16(in) && aligned16(out)) {
    convert8_kernel<From, To, Cvt><<<grid_for(n / 8), kBlock, 0, s>>>(
        static_cast<const Pack8<From>*>(in), static_cast<Pack8<To>*>(out), n / 8);
  } else {
    convert_kernel<From, To, Cvt>
        <<<grid_for(n), kBlock, 0, s>>>(static_cast<const From*>(in), static_cast<To*>(out), n);
  }
  return launch_status(name);
}
__global__ void channel_bias_kernel(float* out, const float* bias, int64_t n, int64_t channels,
                                    int64_t inner, int act) {
  KILN_GRID_LOOP(i, n) {
    float v = out[i] + (bias ? bias[(i / inner) % channels] : 0.f);
    if (act == 1) v = v > 0.f ? v : 0.f;
    out[i] = v;
  }
}
template <typename T>
__global__ void channel_bias_half_kernel(T* out, const T* bias, int64_t n, int64_t channels,
                                         int64_t inner) {
  KILN_GRID_LOOP(i, n) {
    out[i] = DNum<T>::store(DNum<T>::load(out[i]) + DNum<T>::load(bias[(i / inner) % channels]));
  }
}

StatusOr<std::unique_ptr<Kernel>> make_rms_norm(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, q.node.attrs.get_int("axis", -1));
  KILN_ASSIGN_OR_RETURN(float eps, q.node.attrs.get_float("epsilon", 1e-5f));
  // stash_type only says what the reference computes in; the kernel accumulates in double.
  for (DType t : {q.input_dtype(0), q.input_dtype(1), q.output_dtype(0)}) {
    if (!is_float(t) || dtype_size(t) < 2) {
      return unsupported(q.node.describe() +
                         ": the CUDA RMSNormalization takes float32, float64, float16 or "
                         "bfloat16, not " +
                         std::string(dtype_name(t)));
    }
  }
  if (!q.inputs.empty() && q.inputs[0] && q.inputs[0]->shape) {
    int64_t rank = int64_t(q.inputs[0]->shape->size());
    int64_t a = axis < 0 ? axis + rank : axis;
    if (rank - a > kMaxRank)
      return unsupported(q.node.describe() + ": more than 8 normalized dims");
  }
  return std::unique_ptr<Kernel>(new RmsNormKernel(axis, eps));
}

}  // namespace

Status convert_f32_to_f16(const float* in, void* out, int64_t n, cudaStream_t s) {
  return convert<float, __half, ToHalf>(in, out, n, s, "f32_to_f16");
}
Status convert_f32_to_bf16(const float* in, void* out, int64_t n, cudaStream_t s) {
  return convert<float, __nv_bfloat16, ToBf16>(in, out, n, s, "f32_to_bf16");
}
Status convert_f16_to_f32(const void* in, float* out, int64_t n, cudaStream_t s) {
  return convert<__half, float, FromHalf>(in, out, n, s, "f16_to_f32");
}
Status convert_bf16_to_f32(const void* in, float* out, int64_t n, cudaStream_t s) {
  return convert<__nv_bfloat16, float, FromBf16>(in, out, n, s, "bf16_to_f32");
}
Status add_channel_bias_half(void* out, const void* bias, DType dtype, int64_t n, int64_t channels,
                             int64_t inner, cudaStream_t s) {
  if (n == 0) return ok_status();
  if (dtype == DType::kFloat16) {
    channel_bias_half_kernel<__half><<<grid_for(n), kBlock, 0, s>>>(
        static_cast<__half*>(out), static_cast<const __half*>(bias), n, channels, inner);
  } else if (dtype == DType::kBFloat16) {
    channel_bias_half_kernel<__nv_bfloat16><<<grid_for(n), kBlock, 0, s>>>(
        static_cast<__nv_bfloat16*>(out), static_cast<const __nv_bfloat16*>(bias), n, channels,
        inner);
  } else {
    return internal_error("add_channel_bias_half: dtype " + std::string(dtype_name(dtype)));
  }
  return launch_status("channel_bias_half_kernel");
}
Status add_channel_bias(float* out, const float* bias, int64_t n, int64_t channels, int64_t inner,
                        int act, cudaStream_t s) {
  if (n == 0) return ok_status();
  channel_bias_kernel<<<grid_for(n), kBlock, 0, s>>>(out, bias, n, channels, inner, act);
  return launch_status("channel_bias_kernel");
}

void register_norm(Registry& r) {
  r.add(OpKind::kSoftmax, &make_softmax);
  r.add(OpKind::kLogSoftmax, &make_softmax);
  r.add(OpKind::kLayerNormalization, &make_layer_norm);
  r.add(OpKind::kRMSNormalization, &make_rms_norm);
}

}  // namespace kiln::backends::cuda
