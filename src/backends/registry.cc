// The device registry: the one place that knows which backends this build contains.
#include "backends/backend.h"
#include "backends/cpu/cpu_backend.h"
#ifdef KILN_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace kiln::backends {

StatusOr<const Backend*> get_backend(Device device) {
  switch (device) {
    case Device::kCPU: return &cpu::cpu_backend();
    case Device::kCUDA:
#ifdef KILN_HAVE_CUDA
      return cuda::cuda_backend();
#else
      return unsupported("this build of kiln has no CUDA backend (built without nvcc)");
#endif
  }
  return invalid_argument("unknown device");
}

const Backend& reference_backend() { return cpu::cpu_backend(); }

}  // namespace kiln::backends
