// CUDA MaxUnpool, as the reference (cpu/conv_transpose.cc): X scattered by flat index into the
// zero tensor of the size the pool attributes imply, placed at the origin of Y (output_shape may
// be larger). An index outside that tensor, which the reference refuses, is skipped here.
#include <string>
#include <vector>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;

struct UnpoolArgs {
  int rank;
  int64_t inferred[kMaxRank];  // the unpooled dims (N, C, spatial...)
  int64_t y_strides[kMaxRank];
  int64_t total;  // numel of the unpooled tensor
};

template <typename E>
__global__ void max_unpool_kernel(const E* x, const int64_t* idx, E* y, UnpoolArgs a, int64_t n) {
  KILN_GRID_LOOP(e, n) {
    int64_t f = idx[e];
    if (f < 0 || f >= a.total) continue;
    int64_t off = 0;
    for (int d = a.rank - 1; d >= 0; --d) {
      off += (f % a.inferred[d]) * a.y_strides[d];
      f /= a.inferred[d];
    }
    y[off] = x[e];
  }
}

class MaxUnpoolKernel final : public CudaKernel {
 public:
  MaxUnpoolKernel(std::vector<int64_t> kernel, std::vector<int64_t> strides,
                  std::vector<int64_t> pads)
      : CudaKernel("cuda.MaxUnpool"),
        kernel_(std::move(kernel)),
        strides_(std::move(strides)),
        pads_(std::move(pads)) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &idx = in[1], &y = out[0];
    const int rank = x.rank(), ns = rank - 2;
    if (ns < 1 || rank > kMaxRank || y.rank() != rank || idx.numel() != x.numel() ||
        int(kernel_.size()) != ns) {
      return invalid_argument(name_ + ": X " + shape_to_string(x.shape) + ", I " +
                              shape_to_string(idx.shape) + " and Y " + shape_to_string(y.shape) +
                              " are inconsistent");
    }
    UnpoolArgs a{};
    a.rank = rank;
    a.inferred[0] = x.shape[0], a.inferred[1] = x.shape[1];
    for (int i = 0; i < ns; ++i) {
      int64_t s = strides_.empty() ? 1 : strides_[i];
      int64_t pb = pads_.empty() ? 0 : pads_[i], pe = pads_.empty() ? 0 : pads_[ns + i];
      int64_t d = (x.shape[2 + i] - 1) * s - pb - pe + kernel_[i];
      if (d > y.shape[2 + i] || d < 0)
        return invalid_argument(name_ + ": output_shape is smaller than the unpooled size");
      a.inferred[2 + i] = d;
    }
    if (a.inferred[0] != y.shape[0] || a.inferred[1] != y.shape[1]) {
      return invalid_argument(name_ + ": output_shape must keep N and C");
    }
    a.total = 1;
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      a.y_strides[d] = stride;
      stride *= y.shape[d];
      a.total *= a.inferred[d];
    }
    if (y.nbytes() > 0) KILN_CUDA_CHECK(cudaMemsetAsync(y.data, 0, y.nbytes(), stream_), name_);
    const int64_t n = x.numel();
    if (n == 0) return ok_status();
    auto launch = [&](auto tag) {
      using E = decltype(tag);
      max_unpool_kernel<E><<<grid_for(n), 256, 0, stream_>>>(
          static_cast<const E*>(x.data), idx.as<const int64_t>(), static_cast<E*>(y.data), a, n);
    };
    switch (dtype_size(x.dtype)) {
      case 2:
        launch(uint16_t{});
        break;
      case 4:
        launch(uint32_t{});
        break;
      case 8:
        launch(uint64_t{});
        break;
      default:
        return unsupported(name_ + ": elements of " + std::to_string(dtype_size(x.dtype)) +
                           " bytes");
    }
    return launch_status("max_unpool_kernel");
  }

 private:
  std::vector<int64_t> kernel_, strides_, pads_;
};

StatusOr<std::unique_ptr<Kernel>> make_max_unpool(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(auto kernel, q.node.attrs.get_ints("kernel_shape", std::nullopt));
  KILN_ASSIGN_OR_RETURN(auto strides, q.node.attrs.get_ints("strides", std::vector<int64_t>{}));
  KILN_ASSIGN_OR_RETURN(auto pads, q.node.attrs.get_ints("pads", std::vector<int64_t>{}));
  const size_t ns = kernel.size();
  if (ns < 1 || ns + 2 > size_t(kMaxRank) || (!strides.empty() && strides.size() != ns) ||
      (!pads.empty() && pads.size() != 2 * ns)) {
    return unsupported(q.node.describe() + ": kernel_shape, strides and pads do not agree");
  }
  DType t = q.input_dtype(0);
  if (!is_float(t) || dtype_size(t) < 2 || q.output_dtype(0) != t) {
    return unsupported(q.node.describe() + ": the CUDA MaxUnpool takes float X and Y of one dtype");
  }
  if (q.input_dtype(1) != DType::kInt64)
    return unsupported(q.node.describe() + ": I must be int64");
  return std::unique_ptr<Kernel>(new MaxUnpoolKernel(kernel, strides, pads));
}

}  // namespace

void register_unpool(Registry& r) { r.add(OpKind::kMaxUnpool, &make_max_unpool); }

}  // namespace kiln::backends::cuda
