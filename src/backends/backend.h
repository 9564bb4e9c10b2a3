// The Backend and Kernel interfaces. The builder and runtime see backends only through this header
// and kernel_registry.h: an implementation answers whether it supports a node, prepares constant
// state once per engine, and instantiates a kernel per context that runs on views whose shapes the
// runtime has already resolved.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/precision.h"
#include "core/status.h"
#include "core/tensor.h"
#include "ir/graph.h"

namespace kiln::backends {

// What an implementation is asked about: a node with its resolved input and output values
// (dtype, symbolic shape, constant data where known), the build's precision policy, and, when a
// kernel is instantiated, the precision and tactic the plan recorded for it.
struct KernelQuery {
  const ir::Node& node;
  std::vector<const ir::Value*> inputs;   // nullptr for an omitted optional input
  std::vector<const ir::Value*> outputs;  // nullptr for an omitted optional output
  PrecisionPolicy policy;                 // what the build allows
  NodePrecision precision;                // assigned: set for instantiate()
  std::string tactic;                     // chosen: set for instantiate()
  // What the implementation prepared for this engine: set for instantiate(); it outlives the
  // kernel (the engine owns it and every context keeps the engine alive).
  const class PreparedNode* prepared = nullptr;
  // The symbol values at the first profile's opt shapes: what tactics are ranked at. nullptr
  // outside a build (a static graph needs none: its shapes evaluate without symbols).
  const ir::SymbolValues* opt_symbols = nullptr;
  // The same at the first profile's min shapes (where an implementation may time a second choice
  // for small problems).
  const ir::SymbolValues* min_symbols = nullptr;
  // The builder optimization level, 0..5 (BuilderConfig): how hard tactics() may search. At 0 an
  // implementation ranks its tactics by heuristics alone; from 1 on it may time them on the device.
  int optimization_level = 3;

  // The dtype of input/output i; kUndefined when it is omitted.
  DType input_dtype(size_t i) const {
    return i < inputs.size() && inputs[i] ? inputs[i]->dtype : DType::kUndefined;
  }
  DType output_dtype(size_t i) const {
    return i < outputs.size() && outputs[i] ? outputs[i]->dtype : DType::kUndefined;
  }
  bool input_is_constant(size_t i) const {
    return i < inputs.size() && inputs[i] && inputs[i]->constant.has_value();
  }
  // The shape of `v` at the opt point (opt_symbols), or nullopt when it does not evaluate.
  std::optional<Shape> opt_shape(const ir::Value* v) const { return shape_at(v, opt_symbols); }
  // ... at the min point (min_symbols).
  std::optional<Shape> min_shape(const ir::Value* v) const { return shape_at(v, min_symbols); }
  static std::optional<Shape> shape_at(const ir::Value* v, const ir::SymbolValues* symbols) {
    if (!v || !v->shape) return std::nullopt;
    static const ir::SymbolValues kNone;
    Shape s;
    for (const ir::Dim& d : *v->shape) {
      auto x = d.eval(symbols ? *symbols : kNone);
      if (!x || *x < 0) return std::nullopt;
      s.push_back(*x);
    }
    return s;
  }
};

// A tactic with the time the implementation measured for it: milliseconds a run at the profile's
// opt shapes and at its min shapes (negative where not measured).
struct TimedTactic {
  std::string tactic;
  double opt_ms = -1, min_ms = -1;
};

// State an implementation derives once per engine from a node's constants (converted weights,
// re-laid-out filters), shared read-only by the kernels of every execution context.
class PreparedNode {
 public:
  virtual ~PreparedNode() = default;
};

// An omitted optional input arrives as a view with dtype kUndefined.
inline bool present(const TensorView& v) { return v.dtype != DType::kUndefined; }

class Kernel {
 public:
  virtual ~Kernel() = default;
  // Runs the node. Output views are allocated with exactly the shapes the runtime resolved.
  // Must not allocate in steady state beyond what prepare() sized.
  virtual Status execute(std::span<const TensorView> inputs,
                         std::span<const TensorView> outputs) = 0;
  virtual std::string name() const = 0;
  // The stream (cudaStream_t on CUDA) later execute() calls enqueue on; ignored on the CPU.
  virtual void set_stream(void* stream) {}
  // Ops whose output sizes their data decides (NonZero, Unique, Compress, NonMaxSuppression): such
  // an output's view has the shape of its upper bound, and the kernel writes the exact shape's
  // elements contiguously from the view's start. After execute() (on a device, once its stream has
  // been synchronized) this is the exact shape of output i.
  virtual StatusOr<Shape> data_dependent_shape(size_t output) const {
    return internal_error(name() + " does not report data-dependent output sizes");
  }
  // Scratch for the next execute(): the node's arena slot of KernelImpl::workspace_bytes for the
  // current shapes (nullptr, 0 when it declared none). The runtime sets it before every execute.
  void set_workspace(void* p, size_t bytes) {
    workspace_ = p;
    workspace_size_ = bytes;
  }

 protected:
  // kInternal naming `who` when the workspace the runtime gave is smaller than `bytes` (a plan
  // whose workspace slot does not match the implementation's formula).
  Status check_workspace(size_t bytes, const std::string& who) const {
    if (bytes <= workspace_size_) return ok_status();
    return internal_error(who + " needs " + std::to_string(bytes) +
                          " bytes of workspace but the plan gives " +
                          std::to_string(workspace_size_));
  }
  void* workspace_ = nullptr;
  size_t workspace_size_ = 0;
};

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice, kHostToHost };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;

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
  // Zeroes `bytes` of this backend's memory at `dst`, enqueued on `stream`.
  virtual Status fill_zero(void* dst, size_t bytes, void* stream) const {
    if (bytes) std::memset(dst, 0, bytes);
    return ok_status();
  }
  virtual Status synchronize(void* stream) const { return ok_status(); }
  // True when kernels read and write host memory (allocate() returns host pointers).
  virtual bool host_accessible() const { return true; }
  // Whether a pointer is device memory of this backend (run() then binds it without copying).
  virtual bool is_device_pointer(const void* p) const { return false; }
  // Whether a host pointer is in page-locked memory of this backend (allocate_host, or pinned by
  // another library): run() copies such an input to the device from where it is, not through its
  // staging buffer.
  virtual bool is_page_locked(const void* p) const { return false; }
  // The device this backend runs on (CUDA's current device), as DLPack numbers it; 0 on the CPU.
  virtual int device_ordinal() const { return 0; }
  virtual StatusOr<void*> create_stream() const { return static_cast<void*>(nullptr); }
  virtual void destroy_stream(void* stream) const {}
  // Graph capture (CUDA graphs): work enqueued on `stream` between begin and end is recorded into
  // an executable graph instead of running. kUnsupported where the backend has none.
  virtual Status begin_capture(void* stream) const { return unsupported("graph capture"); }
  virtual StatusOr<void*> end_capture(void* stream) const { return unsupported("graph capture"); }
  virtual Status launch_graph(void* graph, void* stream) const {
    return unsupported("graph capture");
  }
  virtual void destroy_graph(void* graph) const {}
  // Orders two streams: work queued on `waiter` from now on starts after the work queued on
  // `producer` so far (an event recorded on one, waited for by the other; nothing blocks the host).
  // nullptr is CUDA's legacy default stream (stream 0). The CPU runs everything as it is enqueued.
  virtual Status order_after(void* waiter, void* producer) const { return ok_status(); }
  // Per-layer timing (ExecutionContext::set_profiler): a marker recorded on `stream` passes once
  // the work enqueued before it has run; marker_elapsed_ms is the time between two markers that
  // have both passed (the caller synchronizes first). The CPU's markers are clock readings, its
  // kernels running as they are enqueued.
  virtual StatusOr<void*> create_marker() const {
    return static_cast<void*>(new std::chrono::steady_clock::time_point());
  }
  virtual Status record_marker(void* marker, void* stream) const {
    *static_cast<std::chrono::steady_clock::time_point*>(marker) = std::chrono::steady_clock::now();
    return ok_status();
  }
  virtual StatusOr<double> marker_elapsed_ms(void* from, void* to) const {
    using T = std::chrono::steady_clock::time_point;
    return std::chrono::duration<double, std::milli>(*static_cast<T*>(to) - *static_cast<T*>(from))
        .count();
  }
  virtual void destroy_marker(void* marker) const {
    delete static_cast<std::chrono::steady_clock::time_point*>(marker);
  }
  // How many constant tensors this backend has converted or re-laid out for kernels' prepared
  // state in this process (tests use it to show that weights are prepared once, not per context).
  virtual uint64_t weights_prepared() const { return 0; }
  // What tactic choices depend on besides the node: the timing cache keys every entry with it, so
  // choices timed on one device (or with other library versions) are never reused on another. The
  // CPU's tactics are not timed, so one identity serves every CPU.
  virtual std::string device_identity() const { return "cpu"; }

 protected:
  static StatusOr<void*> host_allocate(size_t bytes) {
    size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    if (rounded < bytes)
      return out_of_memory("cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    void* p = std::aligned_alloc(64, rounded);
    if (!p)
      return out_of_memory("cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    return p;
  }
};

// The engine-file section tags the backends of this build own (plan::BackendSection): a loader
// refuses a file with a required section outside these and the core ones. None yet; a backend
// that stores data of its own (a timing cache, prepared kernels) adds its tags here.
std::vector<uint32_t> backend_section_tags();

// The backend for a device; kUnsupported when kiln was built without it.
StatusOr<const Backend*> get_backend(Device device);
// The reference backend: CPU, FP32, correct first. Constant folding runs it.
const Backend& reference_backend();

}  // namespace kiln::backends
