// The CPU backend: reference kernels registered per op family, reached through backend.h.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "ops/schema.h"

namespace kiln::backends::cpu {

// What a CPU kernel function receives on every call.
struct KernelArgs {
  const ir::Attributes& attrs;
  std::span<const TensorView> in;
  std::span<const TensorView> out;
};

using KernelFn = Status (*)(const KernelArgs& args);

// A kernel factory for kernels that prepare state once (packed weights, parsed attributes).
using KernelFactory = std::function<StatusOr<std::unique_ptr<Kernel>>(const KernelQuery&)>;

class KernelRegistry {
 public:
  // A stateless kernel: attributes are read on each call.
  void add(ops::OpKind op, KernelFn fn);
  void add_factory(ops::OpKind op, KernelFactory factory);
  StatusOr<std::unique_ptr<Kernel>> create(const KernelQuery& query) const;
  bool has(ops::OpKind op) const;

 private:
  struct Entry {
    KernelFn fn = nullptr;
    KernelFactory factory;
  };
  std::vector<Entry> entries_;  // indexed by OpKind
};

const Backend& cpu_backend();
// Whether the CPU backend registers a kernel for the op (docs/ops.md reads this).
bool cpu_has_kernel(ops::OpKind op);

void register_elementwise_kernels(KernelRegistry& r);
void register_matmul_kernels(KernelRegistry& r);
void register_conv_kernels(KernelRegistry& r);
void register_norm_kernels(KernelRegistry& r);
void register_reduce_kernels(KernelRegistry& r);
void register_resize_kernels(KernelRegistry& r);
void register_shape_kernels(KernelRegistry& r);
void register_index_kernels(KernelRegistry& r);
void register_math_kernels(KernelRegistry& r);
void register_loss_kernels(KernelRegistry& r);
// Part of the conv family (called from register_conv_kernels).
void register_conv_transpose_kernels(KernelRegistry& r);
void register_quant_kernels(KernelRegistry& r);
void register_attention_kernels(KernelRegistry& r);
void register_spatial_kernels(KernelRegistry& r);
void register_sequence_model_kernels(KernelRegistry& r);

}  // namespace kiln::backends::cpu
