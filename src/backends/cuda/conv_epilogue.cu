// The epilogue of kiln::FusedConv where cuDNN's fused convolution cannot apply it: one pass over Y
// computing activation(Y + bias[c] + Z) in float and rounding once to Y's type. The channel of
// element i is (i / inner) % channels: inner = H*W for NCHW, 1 for NHWC (channels innermost).
// float16/bfloat16 NHWC rows of a channel count divisible by 8 move 16 bytes per thread.
#include <cstdint>

#include "backends/cuda/activation.cuh"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

constexpr int kBlock = 256;

template <typename T>
__global__ void epilogue_kernel(T* y, const T* bias, const T* z, int64_t n, int64_t channels,
                                int64_t inner, ConvActivation act, float p0, float p1) {
  KILN_GRID_LOOP(i, n) {
    float v = float(DNum<T>::load(y[i]));
    if (bias) v += float(DNum<T>::load(bias[(i / inner) % channels]));
    if (z) v += float(DNum<T>::load(z[i]));
    y[i] = DNum<T>::store(typename DNum<T>::C(activate(act, p0, p1, v)));
  }
}

// Eight 16-bit elements per thread (one uint4), channels innermost and a multiple of 8, so the
// eight share one aligned run of bias.
template <typename T>
__global__ void epilogue_vec8_kernel(T* y, const T* bias, const T* z, int64_t n8, int64_t channels,
                                     ConvActivation act, float p0, float p1) {
  KILN_GRID_LOOP(i, n8) {
    uint4 raw = reinterpret_cast<const uint4*>(y)[i];
    uint4 zraw = z ? reinterpret_cast<const uint4*>(z)[i] : uint4{};
    uint4 braw = bias ? reinterpret_cast<const uint4*>(bias)[(i * 8 % channels) / 8] : uint4{};
    const T* v = reinterpret_cast<const T*>(&raw);
    const T* zv = reinterpret_cast<const T*>(&zraw);
    const T* bv = reinterpret_cast<const T*>(&braw);
    uint4 out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float s = DNum<T>::load(v[k]);
      if (bias) s += DNum<T>::load(bv[k]);
      if (z) s += DNum<T>::load(zv[k]);
      o[k] = DNum<T>::store(activate(act, p0, p1, s));
    }
    reinterpret_cast<uint4*>(y)[i] = out;
  }
}

template <typename T>
Status launch(void* y, const void* bias, const void* z, int64_t n, int64_t channels, int64_t inner,
              ConvActivation act, float p0, float p1, cudaStream_t s) {
  T* ty = static_cast<T*>(y);
  const T* tb = static_cast<const T*>(bias);
  const T* tz = static_cast<const T*>(z);
  if constexpr (sizeof(T) == 2) {
    if (inner == 1 && channels % 8 == 0 && aligned16(y) && (!z || aligned16(z)) &&
        (!bias || aligned16(bias))) {
      epilogue_vec8_kernel<T>
          <<<grid_for(n / 8, kBlock), kBlock, 0, s>>>(ty, tb, tz, n / 8, channels, act, p0, p1);
      return launch_status("conv epilogue (8 per thread)");
    }
  }
  epilogue_kernel<T>
      <<<grid_for(n, kBlock), kBlock, 0, s>>>(ty, tb, tz, n, channels, inner, act, p0, p1);
  return launch_status("conv epilogue");
}

}  // namespace

Status conv_epilogue(DType dtype, void* y, const void* bias, const void* z, int64_t n,
                     int64_t channels, int64_t inner, ConvActivation act, float p0, float p1,
                     cudaStream_t s) {
  if (n == 0) return ok_status();
  switch (dtype) {
    case DType::kFloat32:
      return launch<float>(y, bias, z, n, channels, inner, act, p0, p1, s);
    case DType::kFloat16:
      return launch<__half>(y, bias, z, n, channels, inner, act, p0, p1, s);
    case DType::kBFloat16:
      return launch<__nv_bfloat16>(y, bias, z, n, channels, inner, act, p0, p1, s);
    default:
      return internal_error("conv_epilogue: dtype " + std::string(dtype_name(dtype)));
  }
}

}  // namespace kiln::backends::cuda
