// Ops that move elements of one size without computing on them: Where (a broadcast select),
// Expand and broadcast_copy (the broadcast copy other kernels use too), and the copy-only ops
// (Reshape, Squeeze, Unsqueeze, Flatten, Identity, same-size BitCast).
#include <string>

#include "backends/cuda/broadcast_walk.cuh"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;

// Where and broadcast copies move elements of one size, whatever they hold.
template <typename E>
__global__ void where_kernel(EwArgs a) {
  KILN_GRID_LOOP(i, a.n) {
    int64_t off[3];
    a.walk.offsets(i, off);
    bool c = static_cast<const uint8_t*>(a.in[0])[off[0]] != 0;
    static_cast<E*>(a.out)[i] =
        c ? static_cast<const E*>(a.in[1])[off[1]] : static_cast<const E*>(a.in[2])[off[2]];
  }
}

template <typename E>
__global__ void copy_kernel(EwArgs a) {
  KILN_GRID_LOOP(i, a.n) {
    int64_t off[3];
    a.walk.offsets(i, off);
    static_cast<E*>(a.out)[i] = static_cast<const E*>(a.in[0])[off[0]];
  }
}

template <typename E>
Status launch_copy_sized(const EwArgs& a, cudaStream_t s) {
  copy_kernel<E><<<grid_for(a.n), 256, 0, s>>>(a);
  return launch_status("broadcast copy");
}

Status launch_copy(const EwArgs& a, size_t elem, cudaStream_t s) {
  switch (elem) {
    case 1:
      return launch_copy_sized<uint8_t>(a, s);
    case 2:
      return launch_copy_sized<uint16_t>(a, s);
    case 4:
      return launch_copy_sized<uint32_t>(a, s);
    case 8:
      return launch_copy_sized<uint64_t>(a, s);
  }
  return unsupported("broadcast copy of " + std::to_string(elem) + "-byte elements");
}

class WhereKernel final : public CudaKernel {
 public:
  using CudaKernel::CudaKernel;
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    if (in.size() < 3 || out.empty())
      return invalid_argument(name_ + ": expects 3 inputs and 1 output");
    EwArgs a{};
    KILN_RETURN_IF_ERROR(
        plan_walk<3>(out[0].shape, {in[0].shape, in[1].shape, in[2].shape}, &a.walk));
    a.n = out[0].numel();
    if (a.n == 0) return ok_status();
    for (int k = 0; k < 3; ++k) a.in[k] = in[k].data;
    a.out = out[0].data;
    switch (dtype_size(out[0].dtype)) {
      case 1:
        where_kernel<uint8_t><<<grid_for(a.n), 256, 0, stream_>>>(a);
        break;
      case 2:
        where_kernel<uint16_t><<<grid_for(a.n), 256, 0, stream_>>>(a);
        break;
      case 4:
        where_kernel<uint32_t><<<grid_for(a.n), 256, 0, stream_>>>(a);
        break;
      case 8:
        where_kernel<uint64_t><<<grid_for(a.n), 256, 0, stream_>>>(a);
        break;
      default:
        return unsupported(name_ + ": dtype " + std::string(dtype_name(out[0].dtype)));
    }
    return launch_status("where_kernel");
  }
};

// Expand: the shape input is already reflected in the output shape the runtime resolved.
class ExpandKernel final : public CudaKernel {
 public:
  using CudaKernel::CudaKernel;
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    if (in.empty() || out.empty())
      return invalid_argument(name_ + ": expects an input and an output");
    return broadcast_copy(in[0].data, in[0].shape, out[0].data, out[0].shape,
                          dtype_size(out[0].dtype), stream_);
  }
};

// Reshape, Squeeze, Unsqueeze, Flatten, Identity: the bytes are unchanged.
class CopyKernel final : public CudaKernel {
 public:
  using CudaKernel::CudaKernel;
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    if (in.empty() || out.empty())
      return invalid_argument(name_ + ": expects an input and an output");
    if (in[0].nbytes() != out[0].nbytes()) {
      return invalid_argument(name_ + ": input holds " + std::to_string(in[0].nbytes()) +
                              " bytes, output " + std::to_string(out[0].nbytes()));
    }
    if (in[0].data == out[0].data || out[0].nbytes() == 0) return ok_status();
    KILN_CUDA_CHECK(cudaMemcpyAsync(out[0].data, in[0].data, out[0].nbytes(),
                                    cudaMemcpyDeviceToDevice, stream_),
                    name_);
    return ok_status();
  }
};

StatusOr<std::unique_ptr<Kernel>> make_where(const KernelQuery& q) {
  return std::unique_ptr<Kernel>(new WhereKernel("cuda.Where"));
}
StatusOr<std::unique_ptr<Kernel>> make_expand(const KernelQuery& q) {
  return std::unique_ptr<Kernel>(new ExpandKernel("cuda.Expand"));
}
StatusOr<std::unique_ptr<Kernel>> make_copy(const KernelQuery& q) {
  return std::unique_ptr<Kernel>(new CopyKernel("cuda." + q.node.op_type + "(copy)"));
}

}  // namespace

Status broadcast_copy(const void* in, std::span<const int64_t> in_shape, void* out,
                      std::span<const int64_t> out_shape, size_t elem_size, cudaStream_t s) {
  EwArgs a{};
  KILN_RETURN_IF_ERROR(plan_walk<1>(out_shape, {in_shape}, &a.walk));
  a.n = shape_numel(out_shape);
  if (a.n == 0) return ok_status();
  a.in[0] = in;
  a.out = out;
  return launch_copy(a, elem_size, s);
}

void register_broadcast_copy(Registry& r) {
  r.add(OpKind::kWhere, &make_where);
  r.add(OpKind::kExpand, &make_expand);
  for (OpKind k : {OpKind::kReshape, OpKind::kSqueeze, OpKind::kUnsqueeze, OpKind::kFlatten,
                   OpKind::kIdentity, OpKind::kBitCast}) {
    r.add(k, &make_copy);
  }
}

}  // namespace kiln::backends::cuda
