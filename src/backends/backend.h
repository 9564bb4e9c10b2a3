// The Backend and Kernel interfaces. The builder and runtime see backends only through this
// header: a kernel is created for a node (answering why not when it cannot run it), prepared once,
// and executed on views whose shapes the runtime has already resolved.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/status.h"
#include "core/tensor.h"
#include "ir/graph.h"

namespace kiln::backends {

// What a backend is asked to implement: a node with its resolved input and output values
// (dtype, symbolic shape, constant data where known).
struct KernelQuery {
  const ir::Node& node;
  std::vector<const ir::Value*> inputs;   // nullptr for an omitted optional input
  std::vector<const ir::Value*> outputs;  // nullptr for an omitted optional output
  uint32_t builder_flags = 0;             // BuilderConfig::flags(): TF32/FP16/BF16 policy
};

// An omitted optional input arrives as a view with dtype kUndefined.
inline bool present(const TensorView& v) { return v.dtype != DType::kUndefined; }

class Kernel {
 public:
  virtual ~Kernel() = default;
  // Runs the node. Output views are allocated with exactly the shapes the runtime resolved.
  // Must not allocate in steady state beyond what prepare() sized.
  virtual Status execute(std::span<const TensorView> inputs, std::span<const TensorView> outputs) = 0;
  virtual std::string name() const = 0;
  // What the kernel computes in ("float32", "tf32", "float16"); empty: its output dtype.
  virtual std::string precision() const { return ""; }
  // The stream (cudaStream_t on CUDA) later execute() calls enqueue on; ignored on the CPU.
  virtual void set_stream(void* stream) {}
};

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice, kHostToHost };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  // The kernel for a node, or kUnsupported with the reason ("Conv: 3-D convolution not supported").
  virtual StatusOr<std::unique_ptr<Kernel>> create_kernel(const KernelQuery& query) const = 0;

  // Memory and streams. The CPU backend works on host memory and runs synchronously (streams are
  // nullptr); a device backend allocates device memory and enqueues asynchronously on streams.
  // Out of memory is kOutOfMemory naming the byte count.
  virtual StatusOr<void*> allocate(size_t bytes) const { return host_allocate(bytes); }
  virtual void deallocate(void* p) const { std::free(p); }
  // Page-locked host memory for staging copies (plain host memory on the CPU).
  virtual StatusOr<void*> allocate_host(size_t bytes) const { return host_allocate(bytes); }
  virtual void deallocate_host(void* p) const { std::free(p); }
  virtual Status copy(void* dst, const void* src, size_t bytes, CopyKind kind, void* stream) const {
    if (bytes) std::memmove(dst, src, bytes);
    return ok_status();
  }
  virtual Status synchronize(void* stream) const { return ok_status(); }
  // True when kernels read and write host memory (allocate() returns host pointers).
  virtual bool host_accessible() const { return true; }
  // Whether a pointer is device memory of this backend (run() then binds it without copying).
  virtual bool is_device_pointer(const void* p) const { return false; }
  virtual StatusOr<void*> create_stream() const { return static_cast<void*>(nullptr); }
  virtual void destroy_stream(void* stream) const {}
  // Graph capture (CUDA graphs): work enqueued on `stream` between begin and end is recorded into
  // an executable graph instead of running. kUnsupported where the backend has none.
  virtual Status begin_capture(void* stream) const { return unsupported("graph capture"); }
  virtual StatusOr<void*> end_capture(void* stream) const { return unsupported("graph capture"); }
  virtual Status launch_graph(void* graph, void* stream) const { return unsupported("graph capture"); }
  virtual void destroy_graph(void* graph) const {}

 protected:
  static StatusOr<void*> host_allocate(size_t bytes) {
    size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    if (rounded < bytes) return out_of_memory("cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    void* p = std::aligned_alloc(64, rounded);
    if (!p) return out_of_memory("cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    return p;
  }
};

// The backend for a device; kUnsupported when kiln was built without it.
StatusOr<const Backend*> get_backend(Device device);
// The reference backend: CPU, FP32, correct first. Constant folding runs it.
const Backend& reference_backend();

}  // namespace kiln::backends
