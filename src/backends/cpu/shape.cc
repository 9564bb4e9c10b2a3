// CPU reference kernels of the shape op family.
#include "backends/cpu/cpu_backend.h"

namespace kiln::backends::cpu {

void register_shape_kernels(KernelRegistry& r) { (void)r; }

}  // namespace kiln::backends::cpu
