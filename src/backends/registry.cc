// The device registry: the one place that knows which backends this build contains.
#include "backends/backend.h"
#include "backends/cpu/cpu_backend.h"

namespace kiln::backends {

StatusOr<const Backend*> get_backend(Device device) {
  switch (device) {
    case Device::kCPU: return &cpu::cpu_backend();
    case Device::kCUDA:
      return unsupported("this build of kiln has no CUDA backend (built without nvcc)");
  }
  return invalid_argument("unknown device");
}

const Backend& reference_backend() { return cpu::cpu_backend(); }

}  // namespace kiln::backends
