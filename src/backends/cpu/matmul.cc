// CPU reference kernels of the matmul op family.
#include "backends/cpu/cpu_backend.h"

namespace kiln::backends::cpu {

void register_matmul_kernels(KernelRegistry& r) { (void)r; }

}  // namespace kiln::backends::cpu
