// kiln::Relayout on CUDA (schema: ops/kiln_ops.cc): an image input going channels last in one pass,
// X [N, C, spatial...] of float32, float16 or bfloat16 to Y [N, spatial..., C + pad_last] of one of
// those, with pad_last zero channels: the Cast, Transpose and Pad in front of a CNN's stem
// (assign_precision, assign_layout) took 22 + 24 + 39 us of MobileNetV3-L's 1.23 ms at batch 64 on
// an H200 (three passes, the Pad one element a thread: 4 halves a row are no 16-byte store).
// Here each thread reads its pixel's C values (a channel plane apart: coalesced across the warp)
// and writes the padded pixel as one vector. Other permutations, and more than 32 channels out,
// are refused at build time (fuse_relayout then keeps the unfused nodes).
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;

constexpr int kBlock = 256;
constexpr int64_t kMaxChannelsOut = 32;

template <typename TO, typename TI>
__device__ __forceinline__ TO convert(TI v) {
  return DNum<TO>::store(static_cast<typename DNum<TO>::C>(DNum<TI>::load(v)));
}

// One thread per pixel t of [N * S]: Y[t, k] = X[n, k, s] for k < C, 0 for C <= k < kCo. kCo is
// the padded channel count (Y's pixel a vector of kCo elements, aligned: the launcher checks).
template <typename TI, typename TO, int kCo, typename I>
__global__ void __launch_bounds__(kBlock)
    channels_last_kernel(const TI* __restrict__ in, TO* __restrict__ out, I spatial, int c,
                         I pixels) {
  struct alignas(sizeof(TO) * kCo) Pack {
    TO v[kCo];
  };
  for (I t = I(blockIdx.x) * kBlock + threadIdx.x; t < pixels; t += I(gridDim.x) * kBlock) {
    const I n = t / spatial;
    const TI* src = in + (n * c) * spatial + (t - n * spatial);
    Pack p;
#pragma unroll
    for (int k = 0; k < kCo; ++k) p.v[k] = k < c ? convert<TO>(src[I(k) * spatial]) : TO(0.0f);
    reinterpret_cast<Pack*>(out)[t] = p;
  }
}

// Any padded channel count up to kMaxChannelsOut: element by element.
template <typename TI, typename TO, typename I>
__global__ void __launch_bounds__(kBlock)
    channels_last_any_kernel(const TI* __restrict__ in, TO* __restrict__ out, I spatial, int c,
                             int co, I pixels) {
  for (I t = I(blockIdx.x) * kBlock + threadIdx.x; t < pixels; t += I(gridDim.x) * kBlock) {
    const I n = t / spatial;
    const TI* src = in + (n * c) * spatial + (t - n * spatial);
    TO* dst = out + t * co;
    for (int k = 0; k < co; ++k) dst[k] = k < c ? convert<TO>(src[I(k) * spatial]) : TO(0.0f);
  }
}

template <typename TI, typename TO, typename I>
void launch(const TI* in, TO* out, int64_t spatial, int c, int co, int64_t pixels, cudaStream_t s) {
  const unsigned grid = grid_for(pixels, kBlock);
  const uintptr_t at = reinterpret_cast<uintptr_t>(out);
  auto fits = [&](int k) { return co == k && at % (sizeof(TO) * size_t(k)) == 0; };
  if (fits(4)) {
    channels_last_kernel<TI, TO, 4, I><<<grid, kBlock, 0, s>>>(in, out, I(spatial), c, I(pixels));
  } else if (fits(8)) {
    channels_last_kernel<TI, TO, 8, I><<<grid, kBlock, 0, s>>>(in, out, I(spatial), c, I(pixels));
  } else {
    channels_last_any_kernel<TI, TO, I>
        <<<grid, kBlock, 0, s>>>(in, out, I(spatial), c, co, I(pixels));
  }
}

constexpr unsigned kTypes = kTF32 | kTF16 | kTBF16;

class RelayoutKernel final : public CudaKernel {
 public:
  RelayoutKernel() : CudaKernel("cuda.Relayout") {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &y = out[0];
    const int r = x.rank();
    if (r < 3 || y.rank() != r) return invalid_argument(name_ + ": X and Y of rank 3 or more");
    const int64_t c = x.shape[1], co = y.shape[size_t(r - 1)];
    int64_t spatial = 1;
    for (int d = 2; d < r; ++d) {
      spatial *= x.shape[size_t(d)];
      if (y.shape[size_t(d - 1)] != x.shape[size_t(d)]) {
        return invalid_argument(name_ + ": Y's dims are not X's channels last");
      }
    }
    if (y.shape[0] != x.shape[0] || co < c || co > kMaxChannelsOut) {
      return invalid_argument(name_ + ": Y has " + std::to_string(co) + " channels for X's " +
                              std::to_string(c) + " (at most " + std::to_string(kMaxChannelsOut) +
                              ")");
    }
    const int64_t pixels = x.shape[0] * spatial;
    if (pixels == 0) return ok_status();
    // 32-bit index math where every index and the grid's overshoot stay below 2^31.
    const bool small = y.numel() < (int64_t(1) << 30) && x.numel() < (int64_t(1) << 30);
    bool known = false;
    visit_dtype<kTypes>(x.dtype, [&](auto ti) {
      using TI = decltype(ti);
      known = visit_dtype<kTypes>(y.dtype, [&](auto to) {
        using TO = decltype(to);
        if (small) {
          launch<TI, TO, int32_t>(x.as<const TI>(), y.as<TO>(), spatial, int(c), int(co), pixels,
                                  stream_);
        } else {
          launch<TI, TO, int64_t>(x.as<const TI>(), y.as<TO>(), spatial, int(c), int(co), pixels,
                                  stream_);
        }
      });
    });
    if (!known) {
      return unsupported(name_ + ": " + std::string(dtype_name(x.dtype)) + " to " +
                         std::string(dtype_name(y.dtype)));
    }
    return launch_status("channels_last_kernel");
  }
};

StatusOr<std::unique_ptr<Kernel>> make_relayout(const KernelQuery& q) {
  const DType ti = q.input_dtype(0), to = q.output_dtype(0);
  if (!(dtype_bit(ti) & kTypes) || !(dtype_bit(to) & kTypes)) {
    return unsupported(q.node.describe() +
                       ": the CUDA Relayout converts between float32, float16 and bfloat16, not " +
                       std::string(dtype_name(ti)) + " to " + std::string(dtype_name(to)));
  }
  const ir::Value* x = q.inputs.empty() ? nullptr : q.inputs[0];
  const ir::Value* y = q.outputs.empty() ? nullptr : q.outputs[0];
  if (!x || !x->shape || !y || !y->shape || x->shape->size() < 3) {
    return unsupported(q.node.describe() + ": the CUDA Relayout takes X of rank 3 or more");
  }
  const int r = int(x->shape->size());
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> perm, q.node.attrs.get_ints("perm", std::nullopt));
  bool channels_last = int(perm.size()) == r && perm[0] == 0 && perm[size_t(r - 1)] == 1;
  for (int d = 1; channels_last && d + 1 < r; ++d) channels_last = perm[size_t(d)] == d + 1;
  if (!channels_last) {
    return unsupported(q.node.describe() +
                       ": the CUDA Relayout moves axis 1 last (NCHW to NHWC), not perm " +
                       shape_to_string(perm));
  }
  const ir::Dim& co = (*y->shape)[size_t(r - 1)];
  if (!co.is_const() || co.value() > kMaxChannelsOut) {
    return unsupported(q.node.describe() + ": the CUDA Relayout writes at most " +
                       std::to_string(kMaxChannelsOut) + " channels, not " + co.to_string());
  }
  return std::unique_ptr<Kernel>(new RelayoutKernel());
}

}  // namespace

void register_relayout(Registry& r) { r.add(OpKind::kRelayout, &make_relayout); }

}  // namespace kiln::backends::cuda
