// Kernels compiled at run time with NVRTC for the GPU in use, where a kernel's work is known only
// when the engine is built (a kiln::Elementwise program): the generated source becomes a cubin for
// the current device's compute capability, is loaded as a context-independent library
// (cudaLibraryLoadData) and launched like any kernel, CUDA graph capture included. Each distinct
// (source, architecture) compiles once per process; the libraries live until the process ends.
// KILN_CUDA_JIT=0 turns the JIT off (every caller then keeps its interpreted or generic path).
#pragma once

#include <string>

#include "core/status.h"

struct CUkern_st;  // cudaKernel_t is CUkern_st* (driver_types.h): this header needs no CUDA headers

namespace kiln::backends::cuda {

// The kernel `entry` (declared extern "C" in `source`) compiled for the current device; the
// NVRTC log in the error where it does not compile.
StatusOr<CUkern_st*> jit_kernel(const std::string& source, const std::string& entry);

// False where KILN_CUDA_JIT=0.
bool jit_enabled();

// Whether cuDNN's runtime-fusion engines, which compile their kernels at run time as these do, may
// be used (conv_graph.cc): jit_enabled() and a GPU of compute capability 8.0 or later.
bool cudnn_runtime_fusion();

// Kernels compiled (cache misses), found in the cache and failed in this process (the tests read
// them).
struct JitCounts {
  int compiled = 0, reused = 0, failed = 0;
};
JitCounts jit_counts();

// The math of ew_math.cuh as NVRTC takes it (its #include lines dropped): one definition of each
// op for the precompiled and the generated kernels.
const char* ew_math_source();

}  // namespace kiln::backends::cuda
