// The CUDA backend's entry point, visible to the device registry (no CUDA headers here).
#pragma once

#include "backends/backend.h"
#include "backends/kernel_registry.h"

namespace kiln::backends::cuda {

// The CUDA backend; kUnsupported naming the reason when no CUDA device is usable.
StatusOr<const Backend*> cuda_backend();
// Adds every CUDA implementation to the shared registry (no device needed).
void register_kernels(::kiln::backends::KernelRegistry& registry);

}  // namespace kiln::backends::cuda
