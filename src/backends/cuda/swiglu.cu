// SwiGLU on CUDA (swish(A) * B with
// alpha), computed in double and stored in the data's float dtype, as the reference rounds once.
#include <string>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;

__global__ void swiglu_kernel(const void* a, const void* b, void* y, int dtype, double alpha,
                              int64_t n) {
  KILN_GRID_LOOP(i, n) {
    double x = load_as<double>(a, dtype, i);
    store_as<double>(y, dtype, i, x / (1.0 + exp(-alpha * x)) * load_as<double>(b, dtype, i));
  }
}

class SwiGluKernel final : public CudaKernel {
 public:
  explicit SwiGluKernel(double alpha) : CudaKernel("cuda.SwiGLU"), alpha_(alpha) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const int64_t n = out[0].numel();
    if (in[0].numel() != n || in[1].numel() != n)
      return invalid_argument(name_ + ": A, B and the output differ in size");
    if (n == 0) return ok_status();
    swiglu_kernel<<<grid_for(n), 256, 0, stream_>>>(in[0].data, in[1].data, out[0].data,
                                                    int(in[0].dtype), alpha_, n);
    return launch_status("swiglu_kernel");
  }

 private:
  double alpha_;
};

StatusOr<std::unique_ptr<Kernel>> make_swiglu(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(float alpha, q.node.attrs.get_float("alpha", 1.0f));
  DType t = q.input_dtype(0);
  if (!is_float(t) || dtype_size(t) < 2 || q.input_dtype(1) != t || q.output_dtype(0) != t) {
    return unsupported(q.node.describe() +
                       ": the CUDA SwiGLU takes A, B and the output of one float dtype");
  }
  return std::unique_ptr<Kernel>(new SwiGluKernel(double(alpha)));
}

}  // namespace

void register_swiglu(Registry& r) { r.add(OpKind::kSwiGLU, &make_swiglu); }

}  // namespace kiln::backends::cuda
