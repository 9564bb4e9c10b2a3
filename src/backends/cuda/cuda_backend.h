// The CUDA backend's entry point, visible to the device registry (no CUDA headers here).
#pragma once

#include "backends/backend.h"

namespace kiln::backends::cuda {

// The CUDA backend; kUnsupported naming the reason when no CUDA device is usable.
StatusOr<const Backend*> cuda_backend();

}  // namespace kiln::backends::cuda
