// The CPU backend object and its kernel registry.
#include "backends/cpu/cpu_backend.h"

namespace kiln::backends::cpu {
namespace {

class FnKernel final : public Kernel {
 public:
  FnKernel(std::string name, ir::Attributes attrs, KernelFn fn)
      : name_(std::move(name)), attrs_(std::move(attrs)), fn_(fn) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    return fn_(KernelArgs{attrs_, in, out});
  }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  ir::Attributes attrs_;
  KernelFn fn_;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend() {
    register_elementwise_kernels(registry_);
    register_matmul_kernels(registry_);
    register_conv_kernels(registry_);
    register_norm_kernels(registry_);
    register_reduce_kernels(registry_);
    register_resize_kernels(registry_);
    register_shape_kernels(registry_);
    register_index_kernels(registry_);
    register_math_kernels(registry_);
    register_loss_kernels(registry_);
    register_quant_kernels(registry_);
    register_attention_kernels(registry_);
    register_spatial_kernels(registry_);
    register_sequence_model_kernels(registry_);
  }
  Device device() const override { return Device::kCPU; }
  const KernelRegistry& registry() const { return registry_; }
  StatusOr<std::unique_ptr<Kernel>> create_kernel(const KernelQuery& query) const override {
    return registry_.create(query);
  }

 private:
  KernelRegistry registry_;
};

}  // namespace

void KernelRegistry::add(ops::OpKind op, KernelFn fn) {
  size_t i = size_t(op);
  if (entries_.size() <= i) entries_.resize(i + 1);
  entries_[i].fn = fn;
}

void KernelRegistry::add_factory(ops::OpKind op, KernelFactory factory) {
  size_t i = size_t(op);
  if (entries_.size() <= i) entries_.resize(i + 1);
  entries_[i].factory = std::move(factory);
}

StatusOr<std::unique_ptr<Kernel>> KernelRegistry::create(const KernelQuery& query) const {
  ops::OpKind op = ops::find_op(query.node.domain, query.node.op_type);
  size_t i = size_t(op);
  if (op == ops::OpKind::kUnknown || i >= entries_.size() ||
      (!entries_[i].fn && !entries_[i].factory)) {
    return unsupported(query.node.describe() + ": the CPU backend has no kernel for " +
                       query.node.op_type);
  }
  if (entries_[i].factory) return entries_[i].factory(query);
  return std::unique_ptr<Kernel>(
      new FnKernel("cpu." + query.node.op_type, query.node.attrs, entries_[i].fn));
}

bool KernelRegistry::has(ops::OpKind op) const {
  size_t i = size_t(op);
  return i < entries_.size() && (entries_[i].fn || entries_[i].factory);
}

namespace {
const CpuBackend& the_cpu_backend() {
  static const CpuBackend backend;
  return backend;
}
}  // namespace

const Backend& cpu_backend() { return the_cpu_backend(); }

bool cpu_has_kernel(ops::OpKind op) { return the_cpu_backend().registry().has(op); }

}  // namespace kiln::backends::cpu
