// The CPU backend: reference kernels registered per op family. Each family file adds its kernels to
// a cpu::KernelRegistry (a kernel function or a factory per op); register_kernels() turns every
// entry into an implementation "cpu.<Op>" of the shared registry (backends/kernel_registry.h).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/kernel_registry.h"
#include "ops/elementwise_program.h"
#include "ops/schema.h"

namespace kiln::backends::cpu {

// What a CPU kernel function receives on every call.
struct KernelArgs {
  const ir::Attributes& attrs;
  std::span<const TensorView> in;
  std::span<const TensorView> out;
  // What the kernel's PrepareFn made of the node's constants for this engine, or nullptr (no
  // PrepareFn, nothing to prepare, or a kernel run outside an engine: constant folding, the op
  // tests). A kernel computes the same with and without it.
  const PreparedNode* prepared = nullptr;
};

using KernelFn = Status (*)(const KernelArgs& args);
// Once per engine, for a KernelFn: state made from the node's constant inputs (packed weights),
// shared read-only by every context; a null pointer where there is nothing to prepare.
using PrepareFn = StatusOr<std::shared_ptr<const PreparedNode>> (*)(const KernelQuery& q);

// A kernel factory for kernels that prepare state once (packed weights, parsed attributes). It
// also answers whether the node is supported: a factory that refuses a node returns the reason.
using KernelFactory = std::function<StatusOr<std::unique_ptr<Kernel>>(const KernelQuery&)>;

// What the family files fill; register_kernels() hands it to the shared registry.
class KernelRegistry {
 public:
  // A stateless kernel: attributes are read on each call.
  void add(ops::OpKind op, KernelFn fn, PrepareFn prepare = nullptr);
  // A factory's kernels read what `prepare` made through KernelQuery::prepared.
  void add_factory(ops::OpKind op, KernelFactory factory, PrepareFn prepare = nullptr);

  struct Entry {
    KernelFn fn = nullptr;
    PrepareFn prepare = nullptr;
    KernelFactory factory;
  };
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  std::vector<Entry> entries_;  // indexed by OpKind
};

const Backend& cpu_backend();
// Adds the CPU reference implementation of every op to the shared registry.
void register_kernels(::kiln::backends::KernelRegistry& registry);
// Whether the CPU backend registers a kernel for the op (docs/ops.md reads this).
bool cpu_has_kernel(ops::OpKind op);

void register_elementwise_kernels(KernelRegistry& r);

// kiln::Elementwise's program where every input, instruction result and the output is float32:
// evaluated 256 elements at a time into registers that stay in cache, instead of a tensor and a
// pass over memory per instruction, each instruction with its reference kernel's arithmetic (so
// the bits are the unfused chain's). False, with nothing written, for any other program (another
// dtype, inputs that do not broadcast to the output); the caller then runs the reference.
StatusOr<bool> run_float32_program(const ops::ElementwiseProgram& p, std::span<const TensorView> in,
                                   const TensorView& out);
void register_matmul_kernels(KernelRegistry& r);
void register_conv_kernels(KernelRegistry& r);
void register_norm_kernels(KernelRegistry& r);
void register_reduce_kernels(KernelRegistry& r);
void register_resize_kernels(KernelRegistry& r);
void register_shape_kernels(KernelRegistry& r);
void register_index_kernels(KernelRegistry& r);
void register_math_kernels(KernelRegistry& r);
void register_loss_kernels(KernelRegistry& r);
// Parts of the conv family (called from register_conv_kernels).
void register_conv_transpose_kernels(KernelRegistry& r);
void register_deform_conv_kernels(KernelRegistry& r);
void register_quant_kernels(KernelRegistry& r);
void register_attention_kernels(KernelRegistry& r);
void register_spatial_kernels(KernelRegistry& r);
void register_sequence_model_kernels(KernelRegistry& r);
void register_recurrent_kernels(KernelRegistry& r);  // RNN, GRU, LSTM (recurrent.cc)
void register_data_dependent_kernels(
    KernelRegistry& r);  // NonZero, Unique, ... (data_dependent.cc)
// A kernel whose output sizes its data may decide: `fn` fills each output's exact shape, which the
// kernel reports (Kernel::data_dependent_shape). Defined in data_dependent.cc.
using SizedFn = Status (*)(const KernelArgs& args, std::vector<Shape>* shapes);
void add_sized_kernel(KernelRegistry& r, ops::OpKind op, SizedFn fn);
// The kernel add_sized_kernel makes, for factories that size only some nodes of an op by their data
// (Pad where its pads are computed at run time).
std::unique_ptr<Kernel> make_sized_kernel(ops::OpKind op, const ir::Attributes& attrs, SizedFn fn);
// Whether input i of the node is data the run computes: neither a constant nor a shape formula.
inline bool computed_at_run_time(const KernelQuery& q, size_t i) {
  return i < q.inputs.size() && q.inputs[i] && !q.inputs[i]->constant && !q.inputs[i]->sym_value;
}
void register_kiln_kernels(KernelRegistry& r);  // domain "kiln" (kiln_ops.cc)

}  // namespace kiln::backends::cpu
