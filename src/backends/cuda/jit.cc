#include "backends/cuda/jit.h"

#include <cuda_runtime.h>
#include <nvrtc.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_common.h"

namespace kiln::backends::cuda {
namespace {

struct Cache {
  std::mutex mu;
  std::map<std::pair<std::string, int>, cudaKernel_t> kernels;  // (source + entry, sm) -> kernel
  JitCounts counts;
};
Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: kernels may be launched during static teardown
  return *c;
}

std::string nvrtc_error(const std::string& what, nvrtcResult r) {
  return std::string("CUDA JIT: ") + what + ": " + nvrtcGetErrorString(r);
}

StatusOr<std::vector<char>> compile(const std::string& source, const std::string& entry, int sm) {
  nvrtcProgram prog;
  if (nvrtcResult r =
          nvrtcCreateProgram(&prog, source.c_str(), (entry + ".cu").c_str(), 0, nullptr, nullptr);
      r != NVRTC_SUCCESS) {
    return internal_error(nvrtc_error("nvrtcCreateProgram", r));
  }
  const std::string arch = "--gpu-architecture=sm_" + std::to_string(sm);
  // No fast math: the generated kernels compute each op as the precompiled ones do.
  const char* opts[] = {arch.c_str(), "--std=c++17", "-default-device"};
  nvrtcResult r = nvrtcCompileProgram(prog, 3, opts);
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string log(n, '\0');
    if (n) nvrtcGetProgramLog(prog, log.data());
    nvrtcDestroyProgram(&prog);
    return internal_error(nvrtc_error("compiling " + entry, r) + "\n" + log.substr(0, 2000));
  }
  size_t size = 0;
  std::vector<char> cubin;
  r = nvrtcGetCUBINSize(prog, &size);
  if (r == NVRTC_SUCCESS) {
    cubin.resize(size);
    r = nvrtcGetCUBIN(prog, cubin.data());
  }
  nvrtcDestroyProgram(&prog);
  if (r != NVRTC_SUCCESS) return internal_error(nvrtc_error("nvrtcGetCUBIN", r));
  return cubin;
}

}  // namespace

bool jit_enabled() {
  const char* v = std::getenv("KILN_CUDA_JIT");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

bool cudnn_runtime_fusion() {
  static const bool ampere = current_sm() >= 80;
  return ampere && jit_enabled();
}

JitCounts jit_counts() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.counts;
}

StatusOr<CUkern_st*> jit_kernel(const std::string& source, const std::string& entry) {
  if (!jit_enabled()) return unsupported("CUDA JIT: off (KILN_CUDA_JIT=0)");
  const int sm = current_sm();
  if (sm == 0) return unsupported("CUDA JIT: no current device");
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);  // one compile at a time: NVRTC is slow, not hot
  auto key = std::make_pair(entry + '\n' + source, sm);
  if (auto it = c.kernels.find(key); it != c.kernels.end()) {
    ++c.counts.reused;
    return it->second;
  }
  auto cubin = compile(source, entry, sm);
  if (!cubin.ok()) {
    ++c.counts.failed;
    return cubin.status();
  }
  cudaLibrary_t lib = nullptr;
  cudaKernel_t kernel = nullptr;
  if (cudaError_t e =
          cudaLibraryLoadData(&lib, cubin->data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
      e != cudaSuccess) {
    cudaGetLastError();
    ++c.counts.failed;
    return internal_error(std::string("CUDA JIT: loading ") + entry + ": " + cudaGetErrorString(e));
  }
  if (cudaError_t e = cudaLibraryGetKernel(&kernel, lib, entry.c_str()); e != cudaSuccess) {
    cudaGetLastError();
    cudaLibraryUnload(lib);
    ++c.counts.failed;
    return internal_error(std::string("CUDA JIT: no kernel ") + entry + ": " +
                          cudaGetErrorString(e));
  }
  ++c.counts.compiled;
  c.kernels.emplace(std::move(key), kernel);
  return kernel;
}

}  // namespace kiln::backends::cuda
