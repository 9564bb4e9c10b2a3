// The Backend and Kernel interfaces. The builder and runtime see backends only through this
// header: a kernel is created for a node (answering why not when it cannot run it), prepared once,
// and executed on views whose shapes the runtime has already resolved.
#pragma once

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
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  // The kernel for a node, or kUnsupported with the reason ("Conv: 3-D convolution not supported").
  virtual StatusOr<std::unique_ptr<Kernel>> create_kernel(const KernelQuery& query) const = 0;
};

// The backend for a device; kUnsupported when kiln was built without it.
StatusOr<const Backend*> get_backend(Device device);
// The reference backend: CPU, FP32, correct first. Constant folding runs it.
const Backend& reference_backend();

}  // namespace kiln::backends
