// Pad's fast path (shape.cu's PadKernel calls it): a constant-mode Pad of only the innermost axis,
// such as the 3 -> 8 channel pad of an NHWC RGB stem (assign_layout), as rows copied with the
// fill around them. The general per-axis map costs a division per axis and element; this costs
// one per 16 bytes written.
#include <cstdint>
#include <cstring>
#include <string>

#include "backends/cuda/cuda_common.h"

namespace kiln::backends::cuda {
namespace {

constexpr int kBlock = 256;

// Each thread writes kC adjacent elements of one output row (16 bytes where the row length is a
// multiple of that and Y is 16-byte aligned; one element otherwise) and reads their sources,
// element by element, from the input row (a source outside [0, in_w) takes the fill, which also
// crops for a negative begin). I is a signed index type: int32_t when every index and the grid
// stride's overshoot stay below 2^31, int64_t otherwise.
template <typename E, int kC, typename I>
__global__ void pad_last_axis_kernel(const E* __restrict__ in, E* __restrict__ out,
                                     const E* fill_ptr, E fill, I in_w, I out_w, I begin, I total) {
  struct alignas(sizeof(E) * kC) Pack {
    E v[kC];
  };
  const E f = fill_ptr ? *fill_ptr : fill;
  const I chunks = out_w / kC;
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I row = i / chunks;
    const I j = (i - row * chunks) * kC;
    const E* src = in + row * in_w;
    Pack p;
#pragma unroll
    for (int k = 0; k < kC; ++k) {
      const I s = j + k - begin;
      p.v[k] = s >= 0 && s < in_w ? src[s] : f;
    }
    *reinterpret_cast<Pack*>(out + row * out_w + j) = p;
  }
}

template <typename E, int kC>
void launch(const TensorView& x, const TensorView& y, int64_t begin, const void* fill_ptr, E fill,
            bool small, cudaStream_t s) {
  const int64_t in_w = x.shape.back(), out_w = y.shape.back(), total = y.numel() / kC;
  const auto* src = static_cast<const E*>(x.data);
  auto* dst = static_cast<E*>(y.data);
  const auto* f = static_cast<const E*>(fill_ptr);
  if (small) {
    pad_last_axis_kernel<E, kC, int32_t><<<grid_for(total), kBlock, 0, s>>>(
        src, dst, f, fill, int32_t(in_w), int32_t(out_w), int32_t(begin), int32_t(total));
  } else {
    pad_last_axis_kernel<E, kC, int64_t>
        <<<grid_for(total), kBlock, 0, s>>>(src, dst, f, fill, in_w, out_w, begin, total);
  }
}

}  // namespace

Status pad_last_axis(const TensorView& x, const TensorView& y, int64_t begin, const void* fill_ptr,
                     uint64_t fill_bits, cudaStream_t s) {
  if (x.rank() < 1 || y.rank() != x.rank() || y.numel() == 0) {
    return y.numel() == 0 ? ok_status() : invalid_argument("pad_last_axis: X and Y differ in rank");
  }
  // grid_for caps the grid at 65535 * 32 blocks of 256 threads (2^29 threads): i + stride stays
  // below 2^31 when every index is below 2^30.
  constexpr int64_t kSmall = int64_t(1) << 30;
  const int64_t in_w = x.shape.back(), out_w = y.shape.back();
  const bool small = x.numel() < kSmall && y.numel() < kSmall && in_w < kSmall && begin > -kSmall &&
                     begin < kSmall;
  const size_t es = dtype_size(x.dtype);
  const bool aligned = aligned16(y.data);
  return by_element_size(
      es, "pad_last_axis",
      [&](auto tag) {
        using E = decltype(tag);
        constexpr int kC = int(16 / sizeof(E));
        E fill;
        std::memcpy(&fill, &fill_bits, sizeof(E));
        if (aligned && out_w % kC == 0) {
          launch<E, kC>(x, y, begin, fill_ptr, fill, small, s);
        } else {
          launch<E, 1>(x, y, begin, fill_ptr, fill, small, s);
        }
      },
      "pad_last_axis_kernel");
}

}  // namespace kiln::backends::cuda
