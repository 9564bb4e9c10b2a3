// Device-side helpers shared by the CUDA kernel files: typed loads and stores by runtime dtype
// (so one kernel instantiation serves every storage type), and index decomposition.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace kiln::backends::cuda {

constexpr int kMaxRank = 8;

template <typename C>
__device__ __forceinline__ C load_as(const void* p, int dtype, int64_t i) {
  switch (DType(dtype)) {
    case DType::kFloat32:
      return C(static_cast<const float*>(p)[i]);
    case DType::kFloat64:
      return C(static_cast<const double*>(p)[i]);
    case DType::kFloat16:
      return C(__half2float(static_cast<const __half*>(p)[i]));
    case DType::kBFloat16:
      return C(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
    case DType::kInt64:
      return C(static_cast<const int64_t*>(p)[i]);
    case DType::kInt32:
      return C(static_cast<const int32_t*>(p)[i]);
    case DType::kInt16:
      return C(static_cast<const int16_t*>(p)[i]);
    case DType::kInt8:
      return C(static_cast<const int8_t*>(p)[i]);
    case DType::kUInt8:
    case DType::kBool:
      return C(static_cast<const uint8_t*>(p)[i]);
    case DType::kUInt16:
      return C(static_cast<const uint16_t*>(p)[i]);
    case DType::kUInt32:
      return C(static_cast<const uint32_t*>(p)[i]);
    case DType::kUInt64:
      return C(static_cast<const uint64_t*>(p)[i]);
    default:
      return C(0);
  }
}

// Float to integer without undefined behaviour: NaN is 0, out-of-range saturates to int64.
template <typename F>
__device__ __forceinline__ int64_t float_to_int64(F f) {
  if (f != f) return 0;
  if (f >= F(9223372036854775807.0)) return INT64_MAX;
  if (f <= F(-9223372036854775807.0)) return INT64_MIN;
  return int64_t(f);
}

template <typename C>
__device__ __forceinline__ void store_as(void* p, int dtype, int64_t i, C v) {
  constexpr bool kFloatC = !(C(0.5) == C(0));
  int64_t iv;
  if constexpr (kFloatC) {
    iv = float_to_int64(v);
  } else {
    iv = int64_t(v);
  }
  switch (DType(dtype)) {
    case DType::kFloat32:
      static_cast<float*>(p)[i] = float(v);
      break;
    case DType::kFloat64:
      static_cast<double*>(p)[i] = double(v);
      break;
    case DType::kFloat16:
      static_cast<__half*>(p)[i] = __float2half_rn(float(v));
      break;
    case DType::kBFloat16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(float(v));
      break;
    case DType::kInt64:
      static_cast<int64_t*>(p)[i] = iv;
      break;
    case DType::kInt32:
      static_cast<int32_t*>(p)[i] = int32_t(iv);
      break;
    case DType::kInt16:
      static_cast<int16_t*>(p)[i] = int16_t(iv);
      break;
    case DType::kInt8:
      static_cast<int8_t*>(p)[i] = int8_t(iv);
      break;
    case DType::kUInt8:
      static_cast<uint8_t*>(p)[i] = uint8_t(iv);
      break;
    case DType::kBool:
      static_cast<uint8_t*>(p)[i] = uint8_t(v != C(0));
      break;
    case DType::kUInt16:
      static_cast<uint16_t*>(p)[i] = uint16_t(iv);
      break;
    case DType::kUInt32:
      static_cast<uint32_t*>(p)[i] = uint32_t(iv);
      break;
    case DType::kUInt64:
      static_cast<uint64_t*>(p)[i] = uint64_t(iv);
      break;
    default:
      break;
  }
}

// Strided walk of up to N operands over an output of `rank` merged dims.
template <int N>
struct Strided {
  int rank = 0;
  int64_t dims[kMaxRank];
  int64_t strides[kMaxRank][N];

  __device__ __forceinline__ void offsets(int64_t i, int64_t* off) const {
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = rank - 1; d >= 0; --d) {
      int64_t c = i % dims[d];
      i /= dims[d];
      for (int k = 0; k < N; ++k) off[k] += c * strides[d][k];
    }
  }
};

// block_reduce's and the warp shuffles' operators: a sum, and a max that keeps a NaN (as the CPU
// references' std::max chains over a row do not drop one).
struct AddReduce {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct NanMaxReduce {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return (a > b || a != a) ? a : b;
  }
};

// Reduces v over the block (blockDim.x a multiple of 32, at most 1024; `shared` holds 32 Ts);
// `identity` fills the lanes of warp 0 beyond the warp count. Every thread gets the result.
template <typename T, typename F>
__device__ T block_reduce(T v, F op, T* shared, T identity) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  int nw = (blockDim.x + 31) >> 5;
  v = threadIdx.x < nw ? shared[threadIdx.x] : identity;
  if (warp == 0) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  return shared[0];
}

// The offset of the i-th element (row-major over `dims`) in a tensor of element `strides`.
__device__ __forceinline__ int64_t walk_offset(int64_t i, int rank, const int64_t* dims,
                                               const int64_t* strides) {
  int64_t off = 0;
  for (int d = rank - 1; d >= 0; --d) {
    off += (i % dims[d]) * strides[d];
    i /= dims[d];
  }
  return off;
}

// The sum of v over the block (blockDim.x a multiple of 32); every thread gets it. `shared` holds
// a double per warp and may be reused by the next call.
__device__ inline double block_sum(double v, double* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // shared may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  double s = 0;
  for (int w = 0; w < int(blockDim.x >> 5); ++w) s += shared[w];
  return s;
}

#define KILN_GRID_LOOP(i, n)                                                \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

}  // namespace kiln::backends::cuda
