// Ops CUDA runs through the CPU reference ("cuda.host.<Op>"): the kernel copies its inputs to
// page-locked host memory, waits, runs the CPU kernel there, and copies the outputs back.
//
// - Ops whose output sizes their data decides (NonZero, Compress, Unique, NonMaxSuppression, TopK
//   with K from data; cuda.TopK takes every TopK whose K is known at build time): the run must
//   learn those sizes on the host before it can size what follows, so it waits for the stream at
//   these layers anyway (kiln inspect marks them). Their inputs are small in the models that use
//   them (boxes and scores after a detector's heads, masks, index lists). kiln::SelectBranch (an
//   If on data) too: it reads its condition on the host, and its branches' results may differ in
//   size.
// - Ops with no device kernel yet (register_host_run's other callers): correct on CUDA, at the
//   cost of two copies and a wait. kiln inspect names the kernel, so a profile shows where one is;
//   a device kernel is the step that replaces it.
#include <algorithm>

#include "backends/cuda/cuda_common.h"
#include "backends/kernel_registry.h"

namespace kiln::backends::cuda {
namespace {

class HostRunKernel final : public CudaKernel {
 public:
  HostRunKernel(std::string name, std::unique_ptr<Kernel> cpu, bool sized)
      : CudaKernel(std::move(name)), cpu_(std::move(cpu)), sized_(sized) {}
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
      KILN_CUDA_CHECK(cudaHostAlloc(&host_, total, cudaHostAllocDefault),
                      name_ + ": " + std::to_string(total) + " bytes of page-locked memory");
      capacity_ = total;
    }
    char* base = static_cast<char*>(host_);
    std::vector<TensorView> hin(in.begin(), in.end()), hout(out.begin(), out.end());
    for (size_t i = 0; i < in.size(); ++i) {
      if (!present(in[i])) continue;
      hin[i].data = base + off[i];
      if (in[i].nbytes()) {
        KILN_CUDA_CHECK(
            cudaMemcpyAsync(hin[i].data, in[i].data, in[i].nbytes(), cudaMemcpyDefault, stream_),
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
      size_t bytes = out[o].nbytes();
      if (sized_) {
        KILN_ASSIGN_OR_RETURN(shapes_[o], cpu_->data_dependent_shape(o));
        bytes = size_t(shape_numel(shapes_[o])) * dtype_size(out[o].dtype);
      }
      if (bytes > out[o].nbytes())
        return internal_error(name_ + ": output " + std::to_string(o) + " exceeds its view");
      if (bytes) {
        KILN_CUDA_CHECK(
            cudaMemcpyAsync(out[o].data, hout[o].data, bytes, cudaMemcpyDefault, stream_),
            name_ + ": copying output " + std::to_string(o) + " to the device");
      }
    }
    // The host buffer is reused by the next run: the copies out of it finish first.
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_), name_ + ": copying its outputs");
    valid_ = true;
    return ok_status();
  }

  StatusOr<Shape> data_dependent_shape(size_t output) const override {
    if (!sized_) return Kernel::data_dependent_shape(output);
    if (!valid_ || output >= shapes_.size()) return internal_error(name_ + " has not run");
    return shapes_[output];
  }

 private:
  std::unique_ptr<Kernel> cpu_;
  bool sized_;  // the CPU kernel reports its outputs' exact shapes (data_dependent_shape)
  void* host_ = nullptr;
  size_t capacity_ = 0;
  std::vector<Shape> shapes_;
  bool valid_ = false;
};

StatusOr<std::unique_ptr<Kernel>> make_host_run(const KernelQuery& q, bool sized) {
  const std::string op(ops::op_name(ops::find_op(q.node.domain, q.node.op_type)));
  const KernelImpl* cpu = kernel_registry().find("cpu." + op);
  if (!cpu) return unsupported("cuda.host." + op + ": no CPU kernel to run");
  for (const ir::Value* v : q.inputs) {
    if (v && dtype_size(v->dtype) == 0)
      return unsupported("cuda.host." + op + ": input '" + v->name + "' has no storage");
  }
  KILN_RETURN_IF_ERROR(cpu->supports(q));
  KILN_ASSIGN_OR_RETURN(auto kernel, cpu->instantiate(q, nullptr));
  return std::unique_ptr<Kernel>(new HostRunKernel("cuda.host." + op, std::move(kernel), sized));
}

StatusOr<std::unique_ptr<Kernel>> make_sized_host_run(const KernelQuery& q) {
  return make_host_run(q, true);
}
StatusOr<std::unique_ptr<Kernel>> make_plain_host_run(const KernelQuery& q) {
  return make_host_run(q, false);
}

}  // namespace

void register_host_run(Registry& r, ops::OpKind op) {
  r.add(op, &make_plain_host_run, ImplInfo{"host"});
}

void register_data_dependent(Registry& r) {
  for (ops::OpKind op :
       {ops::OpKind::kNonZero, ops::OpKind::kCompress, ops::OpKind::kUnique,
        ops::OpKind::kNonMaxSuppression, ops::OpKind::kTopK, ops::OpKind::kSelectBranch}) {
    r.add(op, &make_sized_host_run, ImplInfo{"host"});
  }
}

}  // namespace kiln::backends::cuda
