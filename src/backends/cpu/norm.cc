// CPU reference kernels of the norm op family.
#include "backends/cpu/cpu_backend.h"

namespace kiln::backends::cpu {

void register_norm_kernels(KernelRegistry& r) { (void)r; }

}  // namespace kiln::backends::cpu
