// CPU reference kernels of the reduce op family.
#include "backends/cpu/cpu_backend.h"

namespace kiln::backends::cpu {

void register_reduce_kernels(KernelRegistry& r) { (void)r; }

}  // namespace kiln::backends::cpu
