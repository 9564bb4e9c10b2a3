// backend_supports: the rewriting passes' question to the build's backend, whether any of its
// implementations runs a node typed as the pass would make it.
#include "backends/kernel_registry.h"
#include "builder/build_state.h"

namespace kiln::builder {

SupportsFn backend_supports(const BuildState& s) {
  const Device device = s.backend.device();
  return [&s, device](const ir::Node& node, const std::vector<const ir::Value*>& in,
                      const std::vector<const ir::Value*>& out) {
    backends::KernelQuery q{node, in, out, s.config.precision()};
    q.opt_symbols = &s.opt_symbols;
    q.min_symbols = &s.min_symbols;
    for (const backends::KernelImpl* impl :
         backends::kernel_registry().candidates(ops::find_op(node.domain, node.op_type), device)) {
      if (impl->supports(q).ok()) return true;
    }
    return false;
  };
}

}  // namespace kiln::builder
