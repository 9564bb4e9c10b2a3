// CPU reference kernels of the index op family.
#include "backends/cpu/cpu_backend.h"

namespace kiln::backends::cpu {

void register_index_kernels(KernelRegistry& r) { (void)r; }

}  // namespace kiln::backends::cpu
