// NonZero, Compress, Unique, NonMaxSuppression and TopK with K from data on CUDA
// ("cuda.host.<Op>"; cuda.TopK takes every TopK whose K is known at build time): ops whose output
// sizes their data decides. The run must learn those sizes on the host before it can size what
// follows, so it waits for the stream at these layers anyway (kiln inspect marks them). These
// kernels use that wait: they copy their inputs to page-locked host memory, run the CPU reference
// kernel there, and copy the exact outputs back to the device. Their inputs are small in the
// models that use them (boxes and scores after a detector's heads, masks, index lists); a device
// kernel per op is the later step where one shows up in a profile.
#include <algorithm>

#include "backends/cuda/cuda_common.h"
#include "backends/kernel_registry.h"

namespace kiln::backends::cuda {
namespace {

class HostRunKernel final : public CudaKernel {
 public:
  HostRunKernel(std::string name, std::unique_ptr<Kernel> cpu) : CudaKernel(std::move(name)), cpu_(std::move(cpu)) {}
  ~HostRunKernel() override {
    if (host_) cudaFreeHost(host_);
  }

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    valid_ = false;
    size_t total = 0;
    std::vector<size_t> off;
    for (const auto* views : {&in, &out}) {
      for (const TensorView& v : *views) {
        off.push_back(total);
        total += present(v) ? (v.nbytes() + 63) / 64 * 64 : 0;
      }
    }
    if (total > capacity_) {
      if (host_) KILN_CUDA_CHECK(cudaFreeHost(host_), name_ + ": freeing its host buffer");
      host_ = nullptr;
      capacity_ = 0;
      KILN_CUDA_CHECK(cudaHostAlloc(&host_, total, cudaHostAllocDefault), name_ + ": " + std::to_string(total) + " bytes of page-locked memory");
      capacity_ = total;
    }
    char* base = static_cast<char*>(host_);
    std::vector<TensorView> hin(in.begin(), in.end()), hout(out.begin(), out.end());
    for (size_t i = 0; i < in.size(); ++i) {
      if (!present(in[i])) continue;
      hin[i].data = base + off[i];
      if (in[i].nbytes()) {
        KILN_CUDA_CHECK(cudaMemcpyAsync(hin[i].data, in[i].data, in[i].nbytes(), cudaMemcpyDefault, stream_),
                        name_ + ": copying input " + std::to_string(i) + " to the host");
      }
    }
    for (size_t o = 0; o < out.size(); ++o) {
      if (present(out[o])) hout[o].data = base + off[in.size() + o];
    }
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_), name_ + ": waiting for its inputs");
    KILN_RETURN_IF_ERROR(cpu_->execute(hin, hout));
    shapes_.assign(out.size(), Shape{});
    for (size_t o = 0; o < out.size(); ++o) {
      if (!present(out[o])) continue;
      KILN_ASSIGN_OR_RETURN(shapes_[o], cpu_->data_dependent_shape(o));
      const size_t bytes = size_t(shape_numel(shapes_[o])) * dtype_size(out[o].dtype);
      if (bytes > out[o].nbytes()) return internal_error(name_ + ": output " + std::to_string(o) + " exceeds its view");
      if (bytes) {
        KILN_CUDA_CHECK(cudaMemcpyAsync(out[o].data, hout[o].data, bytes, cudaMemcpyDefault, stream_),
                        name_ + ": copying output " + std::to_string(o) + " to the device");
      }
    }
    // The host buffer is reused by the next run: the copies out of it finish first.
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_), name_ + ": copying its outputs");
    valid_ = true;
    return ok_status();
  }

  StatusOr<Shape> data_dependent_shape(size_t output) const override {
    if (!valid_ || output >= shapes_.size()) return internal_error(name_ + " has not run");
    return shapes_[output];
  }

 private:
  std::unique_ptr<Kernel> cpu_;
  void* host_ = nullptr;
  size_t capacity_ = 0;
  std::vector<Shape> shapes_;
  bool valid_ = false;
};

StatusOr<std::unique_ptr<Kernel>> make_host_run(const KernelQuery& q) {
  const std::string op(ops::op_name(ops::find_op(q.node.domain, q.node.op_type)));
  const KernelImpl* cpu = kernel_registry().find("cpu." + op);
  if (!cpu) return unsupported("cuda.host." + op + ": no CPU kernel to run");
  for (const ir::Value* v : q.inputs) {
    if (v && dtype_size(v->dtype) == 0) return unsupported("cuda.host." + op + ": input '" + v->name + "' has no storage");
  }
  KILN_RETURN_IF_ERROR(cpu->supports(q));
  KILN_ASSIGN_OR_RETURN(auto kernel, cpu->instantiate(q, nullptr));
  return std::unique_ptr<Kernel>(new HostRunKernel("cuda.host." + op, std::move(kernel)));
}

}  // namespace

void register_data_dependent(Registry& r) {
  for (ops::OpKind op : {ops::OpKind::kNonZero, ops::OpKind::kCompress, ops::OpKind::kUnique,
                         ops::OpKind::kNonMaxSuppression, ops::OpKind::kTopK}) {
    r.add(op, &make_host_run, ImplInfo{"host"});
  }
}

}  // namespace kiln::backends::cuda
