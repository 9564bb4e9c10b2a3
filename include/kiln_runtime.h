// kiln's runtime API alone: load an engine file and run it (CMake target kiln_runtime_api). It
// links no builder or frontend code, so a deployment ships the runner without them.
#pragma once

#include "core/status.h"     // Status, StatusOr
#include "core/tensor.h"     // Tensor
#include "runtime/engine.h"  // Engine, ExecutionContext, OutputAllocator, Profiler
