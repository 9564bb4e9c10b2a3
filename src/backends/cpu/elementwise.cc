// CPU reference kernels of the elementwise op family.
#include "backends/cpu/cpu_backend.h"

namespace kiln::backends::cpu {

void register_elementwise_kernels(KernelRegistry& r) { (void)r; }

}  // namespace kiln::backends::cpu
