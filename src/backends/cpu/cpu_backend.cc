// The CPU backend object and its reference implementations in the shared kernel registry.
#include "backends/cpu/cpu_backend.h"

namespace kiln::backends::cpu {
namespace {

class FnKernel final : public Kernel {
 public:
  FnKernel(std::string name, ir::Attributes attrs, KernelFn fn,
           std::shared_ptr<const PreparedNode> prepared)
      : name_(std::move(name)), attrs_(std::move(attrs)), fn_(fn), prepared_(std::move(prepared)) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    return fn_(KernelArgs{attrs_, in, out, prepared_.get()});
  }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  ir::Attributes attrs_;
  KernelFn fn_;
  std::shared_ptr<const PreparedNode> prepared_;
};

// A CPU reference implementation: a kernel function (stateless, supports every node the op's
// schema accepted) or a factory (which refuses what it cannot run, with the reason).
class CpuImpl final : public KernelImpl {
 public:
  CpuImpl(ops::OpKind op, KernelRegistry::Entry entry)
      : id_("cpu." + std::string(ops::op_name(op))), entry_(std::move(entry)) {}
  const std::string& id() const override { return id_; }
  Device device() const override { return Device::kCPU; }
  Status supports(const KernelQuery& q) const override {
    if (!entry_.factory) return ok_status();
    // Factories validate attributes and dtypes while they construct; constructing is cheap.
    auto kernel = entry_.factory(q);
    return kernel.ok() ? ok_status() : kernel.status();
  }
  NodePrecision precision(const KernelQuery& q) const override {
    // The reference computes in the node's own dtypes: float32 stays float32 (TF32, FP16 and BF16
    // have no effect on the CPU), and integer kernels are exact.
    return {};
  }
  StatusOr<std::shared_ptr<const PreparedNode>> prepare(const KernelQuery& q,
                                                        const Backend&) const override {
    if (!entry_.prepare) return std::shared_ptr<const PreparedNode>();
    return entry_.prepare(q);
  }
  StatusOr<std::unique_ptr<Kernel>> instantiate(
      const KernelQuery& q, std::shared_ptr<const PreparedNode> prepared) const override {
    if (entry_.factory) return entry_.factory(q);
    return std::unique_ptr<Kernel>(new FnKernel(id_, q.node.attrs, entry_.fn, std::move(prepared)));
  }

 private:
  std::string id_;
  KernelRegistry::Entry entry_;
};

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::kCPU; }
};

KernelRegistry family_kernels() {
  KernelRegistry r;
  register_elementwise_kernels(r);
  register_matmul_kernels(r);
  register_conv_kernels(r);
  register_norm_kernels(r);
  register_reduce_kernels(r);
  register_resize_kernels(r);
  register_shape_kernels(r);
  register_index_kernels(r);
  register_math_kernels(r);
  register_loss_kernels(r);
  register_quant_kernels(r);
  register_attention_kernels(r);
  register_spatial_kernels(r);
  register_sequence_model_kernels(r);
  register_recurrent_kernels(r);
  register_data_dependent_kernels(r);
  register_kiln_kernels(r);
  return r;
}

}  // namespace

void KernelRegistry::add(ops::OpKind op, KernelFn fn, PrepareFn prepare) {
  size_t i = size_t(op);
  if (entries_.size() <= i) entries_.resize(i + 1);
  entries_[i].fn = fn;
  entries_[i].prepare = prepare;
}

void KernelRegistry::add_factory(ops::OpKind op, KernelFactory factory, PrepareFn prepare) {
  size_t i = size_t(op);
  if (entries_.size() <= i) entries_.resize(i + 1);
  entries_[i].factory = std::move(factory);
  entries_[i].prepare = prepare;
}

void register_kernels(::kiln::backends::KernelRegistry& registry) {
  KernelRegistry families = family_kernels();
  const auto& entries = families.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!entries[i].fn && !entries[i].factory) continue;
    registry.add(ops::OpKind(i), std::make_unique<CpuImpl>(ops::OpKind(i), entries[i]));
  }
}

const Backend& cpu_backend() {
  static const CpuBackend backend;
  return backend;
}

bool cpu_has_kernel(ops::OpKind op) { return kernel_registry().has(op, Device::kCPU); }

}  // namespace kiln::backends::cpu
