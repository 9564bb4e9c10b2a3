// The kernel registry: for each op (ONNX or kiln's own), the ordered list of implementations of
// every backend, preferred first and the reference last. The builder asks each candidate whether it
// supports a node and records the one it picks (id, tactic, precision) in the plan; the runtime
// finds that implementation again by id and instantiates it. It never re-selects.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"
#include "ops/schema.h"

namespace kiln::backends {

// One implementation of one op on one device: a description, not a running kernel.
class KernelImpl {
 public:
  virtual ~KernelImpl() = default;
  // Unique across the registry and stable across builds: the plan stores it ("cuda.cublaslt.Gemm").
  virtual const std::string& id() const = 0;
  virtual Device device() const = 0;
  // Ok, or the reason this implementation cannot run the node (dtype, attribute, rank, device
  // capability). Answered at build time, so that a node it accepts never fails for these reasons
  // at run time.
  virtual Status supports(const KernelQuery& q) const = 0;
  // Ok, or why the builder should give a node this implementation supports to a later one that
  // also supports it (one that runs it faster: cuBLASLt's 1x1 convolution and an activation its
  // epilogue lacks). Where no later one supports the node, the builder takes this one after all.
  virtual Status declines(const KernelQuery& q) const { return ok_status(); }
  // What the node computes in under the build's precision policy (q.policy). The default: the
  // node's own dtypes (integer, bool and copy kernels; float kernels of the output's dtype).
  virtual NodePrecision precision(const KernelQuery& q) const { return {}; }
  // Device scratch one execute() needs, as a formula over the input symbols (the shapes of
  // q.inputs/q.outputs, for the precision in q.precision). The plan gives the node an arena slot of
  // this size; execute() gets it through Kernel::set_workspace and never allocates. 0: none.
  virtual ir::Dim workspace_bytes(const KernelQuery& q) const { return 0; }
  // The input whose bytes output 0 may take over (-1: none): the kernel reads each element of it
  // before writing that element of the output, and both have one size and layout. plan_memory
  // gives the output that input's slot where the node is the input's last reader and reads it
  // through no other input, so a residual sum needs no buffer of its own; the engine loader's
  // lifetime check accepts exactly that hand-over.
  virtual int in_place_input() const { return -1; }
  // The tactics it can be timed over, the default first (one empty tactic when it has none).
  virtual std::vector<std::string> tactics(const KernelQuery& q) const { return {""}; }
  // The tactics it measured on the device, fastest at the opt shapes first, each with its times;
  // empty where it times nothing (no device, optimization level 0, a library that cannot be timed).
  // Where two or more implementations that support a node answer, the builder weighs their times
  // against each other (select_kernels) instead of taking the first; the winner's tactic is its
  // first here, which is also the first of its tactics().
  virtual std::vector<TimedTactic> timed_tactics(const KernelQuery& q) const { return {}; }
  // Once per engine: state derived from the node's constant inputs (weights converted or re-laid
  // out), shared read-only by every context's kernel. nullptr when there is none.
  virtual StatusOr<std::shared_ptr<const PreparedNode>> prepare(const KernelQuery& q,
                                                                const Backend& backend) const {
    return std::shared_ptr<const PreparedNode>();
  }
  // Once per execution context: the kernel object, for the precision and tactic the plan records
  // (q.precision, q.tactic) and the engine's prepared state (also in q.prepared).
  virtual StatusOr<std::unique_ptr<Kernel>> instantiate(
      const KernelQuery& q, std::shared_ptr<const PreparedNode> prepared) const = 0;
};

// Defined in the header so that each backend library can register into it without linking the
// library that owns the registry object (registry.cc).
class KernelRegistry {
 public:
  // Appends an implementation of `op`: earlier ones are preferred. A repeated id is a programming
  // error caught by the registry test (kernel_registry_test.cc), so the first one wins here.
  void add(ops::OpKind op, std::unique_ptr<KernelImpl> impl) {
    size_t i = size_t(op);
    if (by_op_.size() <= i) by_op_.resize(i + 1);
    by_id_.emplace(impl->id(), impl.get());
    by_op_[i].push_back(std::move(impl));
  }
  // The implementations of `op` on `device`, in order of preference.
  std::vector<const KernelImpl*> candidates(ops::OpKind op, Device device) const {
    std::vector<const KernelImpl*> out;
    if (size_t(op) >= by_op_.size()) return out;
    for (const auto& impl : by_op_[size_t(op)]) {
      if (impl->device() == device) out.push_back(impl.get());
    }
    return out;
  }
  // The implementation with this id, or nullptr.
  const KernelImpl* find(std::string_view id) const {
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : it->second;
  }
  // The CPU reference implementation of `op` (the last CPU candidate), or nullptr.
  const KernelImpl* reference(ops::OpKind op) const {
    auto c = candidates(op, Device::kCPU);
    return c.empty() ? nullptr : c.back();
  }
  bool has(ops::OpKind op, Device device) const { return !candidates(op, device).empty(); }
  // Every implementation, by op then preference (docs and the registry test read this).
  const std::vector<std::vector<std::unique_ptr<KernelImpl>>>& all() const { return by_op_; }

 private:
  std::vector<std::vector<std::unique_ptr<KernelImpl>>> by_op_;  // indexed by OpKind
  std::map<std::string, const KernelImpl*, std::less<>> by_id_;
};

// The registry of this build: every backend compiled in registers its implementations here, in
// the order of the list in kernel_registry.cc.
const KernelRegistry& kernel_registry();

// A kernel for a node from the CPU reference implementation: what constant folding and the op
// tests run. kUnsupported naming the node when the reference has none or refuses it.
StatusOr<std::unique_ptr<Kernel>> create_reference_kernel(const KernelQuery& q);

}  // namespace kiln::backends
