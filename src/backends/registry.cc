// The device and kernel registries: the one place that knows which backends this build contains.
#include "backends/backend.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/kernel_registry.h"
#ifdef KILN_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace kiln::backends {

StatusOr<const Backend*> get_backend(Device device) {
  switch (device) {
    case Device::kCPU:
      return &cpu::cpu_backend();
    case Device::kCUDA:
#ifdef KILN_HAVE_CUDA
      return cuda::cuda_backend();
#else
      return unsupported("this build of kiln has no CUDA backend (built without nvcc)");
#endif
  }
  return invalid_argument("unknown device");
}

std::vector<uint32_t> backend_section_tags() { return {}; }

const Backend& reference_backend() { return cpu::cpu_backend(); }

const KernelRegistry& kernel_registry() {
  // Registration order is preference order within a device; the CPU reference comes last for the
  // CPU. A CUDA engine only ever considers CUDA implementations: there is no silent CPU fallback.
  static const KernelRegistry* registry = [] {
    auto* r = new KernelRegistry;  // leaked: kernels may be instantiated during static destruction
    cpu::register_kernels(*r);
#ifdef KILN_HAVE_CUDA
    cuda::register_kernels(*r);
#endif
    return r;
  }();
  return *registry;
}

StatusOr<std::unique_ptr<Kernel>> create_reference_kernel(const KernelQuery& q) {
  ops::OpKind op = ops::find_op(q.node.domain, q.node.op_type);
  const KernelImpl* impl = op == ops::OpKind::kUnknown ? nullptr : kernel_registry().reference(op);
  if (!impl) {
    return unsupported(q.node.describe() + ": the CPU reference has no kernel for " +
                       q.node.op_type);
  }
  KILN_RETURN_IF_ERROR(impl->supports(q));
  return impl->instantiate(q, nullptr);
}

}  // namespace kiln::backends
