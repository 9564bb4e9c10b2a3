// The epilogue of kiln::MatMulBias after cuBLASLt's MatMul (gemm.cc): y = act(y + bias), bias
// broadcast to Y from the right (a dim of 1 repeats), the sum and the activation computed in float
// (double for float64) and rounded once to Y's type, as the CPU reference rounds each unfused step.
#include <cstdint>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int kMaxBiasRank = 8;

// Y's dims and, per dim, bias's element stride (0 where bias repeats), innermost last.
struct BiasMap {
  int rank = 0;
  int64_t dims[kMaxBiasRank] = {};
  int64_t strides[kMaxBiasRank] = {};
};

template <typename C>
__device__ __forceinline__ C activate(MatMulActivation act, C y) {
  switch (act) {
    case MatMulActivation::kRelu:
      return y > C(0) ? y : C(0);
    case MatMulActivation::kGeluErf:
      return C(0.5) * y * (C(1) + erf(y * C(0.70710678118654752440)));
    case MatMulActivation::kGeluTanh:
      return C(0.5) * y * (C(1) + tanh(C(0.79788456080286535588) * (y + C(0.044715) * y * y * y)));
    case MatMulActivation::kNone:
      break;
  }
  return y;
}

template <typename T>
__global__ void bias_act_kernel(T* y, const T* bias, int64_t n, BiasMap m, MatMulActivation act) {
  using C = typename DNum<T>::C;
  KILN_GRID_LOOP(i, n) {
    C v = DNum<T>::load(y[i]);
    if (bias) {
      int64_t rem = i, off = 0;
      for (int d = m.rank - 1; d >= 0; --d) {
        off += (rem % m.dims[d]) * m.strides[d];
        rem /= m.dims[d];
      }
      v += DNum<T>::load(bias[off]);
    }
    y[i] = DNum<T>::store(activate<C>(act, v));
  }
}

// The common case: no bias, or a bias of Y's last dim (a linear layer's [N]), and Y of fewer than
// 2^31 elements: the bias index is one 32-bit remainder where the general kernel took an int64
// division and remainder per dim (BERT-base's [8192, 3072] GELU epilogue: 0.2 ms of a 0.27 ms
// layer at batch 64).
template <typename T>
__global__ void bias_act_rows_kernel(T* y, const T* bias, int32_t n, int32_t cols,
                                     MatMulActivation act) {
  using C = typename DNum<T>::C;
  for (int32_t i = int32_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int32_t(gridDim.x) * blockDim.x) {
    C v = DNum<T>::load(y[i]);
    if (bias) v += DNum<T>::load(bias[i % cols]);
    y[i] = DNum<T>::store(activate<C>(act, v));
  }
}

// bias_act_rows_kernel on 8 float16/bfloat16 elements a thread (16-byte loads and stores), where
// the row length is a multiple of 8 and Y and the bias are 16-byte aligned: the one-element kernel
// issued a 2-byte load, a remainder and a store per element (ViT-B/16's [12608, 3072] GELU
// epilogue at batch 64: 0.17 ms after a 0.08 ms GEMM).
template <typename T>
__global__ void bias_act_vec_kernel(uint4* y, const uint4* bias, int32_t vecs, int32_t row_vecs,
                                    MatMulActivation act) {
  using N = DNum<T>;
  for (int32_t i = int32_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vecs;
       i += int32_t(gridDim.x) * blockDim.x) {
    uint4 u = y[i];
    uint4 b = bias ? bias[i % row_vecs] : make_uint4(0, 0, 0, 0);
    T* h = reinterpret_cast<T*>(&u);
    const T* bh = reinterpret_cast<const T*>(&b);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float v = float(N::load(h[e]));
      if (bias) v += float(N::load(bh[e]));
      h[e] = N::store(typename N::C(activate<float>(act, v)));
    }
    y[i] = u;
  }
}

template <typename T>
Status launch(void* y, const void* bias, int64_t n, const BiasMap& m, MatMulActivation act,
              cudaStream_t s) {
  bool rows = m.rank >= 1 && n + int64_t(kBlock) * grid_for(n, kBlock) < (int64_t(1) << 31);
  for (int d = 0; d + 1 < m.rank && bias && rows; ++d) rows = m.strides[d] == 0;
  if (rows && bias) rows = m.strides[m.rank - 1] == 1;
  constexpr bool kHalf = sizeof(T) == 2;
  if (kHalf && rows && m.dims[m.rank - 1] % 8 == 0 && aligned16(y) && (!bias || aligned16(bias))) {
    const int64_t vecs = n / 8;
    bias_act_vec_kernel<T><<<grid_for(vecs, kBlock), kBlock, 0, s>>>(
        static_cast<uint4*>(y), static_cast<const uint4*>(bias), int32_t(vecs),
        int32_t(m.dims[m.rank - 1] / 8), act);
    return launch_status("MatMulBias epilogue");
  }
  if (rows) {
    bias_act_rows_kernel<T>
        <<<grid_for(n, kBlock), kBlock, 0, s>>>(static_cast<T*>(y), static_cast<const T*>(bias),
                                                int32_t(n), int32_t(m.dims[m.rank - 1]), act);
  } else {
    bias_act_kernel<T><<<grid_for(n, kBlock), kBlock, 0, s>>>(
        static_cast<T*>(y), static_cast<const T*>(bias), n, m, act);
  }
  return launch_status("MatMulBias epilogue");
}

}  // namespace

Status matmul_bias_epilogue(DType dtype, void* y, std::span<const int64_t> y_shape,
                            const void* bias, std::span<const int64_t> bias_shape,
                            MatMulActivation act, cudaStream_t s) {
  const int64_t n = shape_numel(y_shape);
  if (n == 0 || (!bias && act == MatMulActivation::kNone)) return ok_status();
  if (y_shape.size() > size_t(kMaxBiasRank) || bias_shape.size() > y_shape.size()) {
    return invalid_argument("MatMulBias: Y of rank " + std::to_string(y_shape.size()) +
                            " and bias of rank " + std::to_string(bias_shape.size()) +
                            " (at most " + std::to_string(kMaxBiasRank) + ")");
  }
  BiasMap m;
  m.rank = int(y_shape.size());
  int64_t stride = 1;
  for (int d = m.rank - 1; d >= 0; --d) {
    m.dims[d] = y_shape[size_t(d)];
    const int bd = d - (m.rank - int(bias_shape.size()));
    const int64_t b = bd >= 0 ? bias_shape[size_t(bd)] : 1;
    if (b != 1 && b != m.dims[d]) {
      return invalid_argument("MatMulBias: bias " + shape_to_string(bias_shape) +
                              " does not broadcast to Y " + shape_to_string(y_shape));
    }
    m.strides[d] = b == 1 ? 0 : stride;
    stride *= b;
  }
  switch (dtype) {
    case DType::kFloat32:
      return launch<float>(y, bias, n, m, act, s);
    case DType::kFloat64:
      return launch<double>(y, bias, n, m, act, s);
    case DType::kFloat16:
      return launch<__half>(y, bias, n, m, act, s);
    case DType::kBFloat16:
      return launch<__nv_bfloat16>(y, bias, n, m, act, s);
    default:
      return internal_error("MatMulBias epilogue: dtype " + std::string(dtype_name(dtype)));
  }
}

}  // namespace kiln::backends::cuda
