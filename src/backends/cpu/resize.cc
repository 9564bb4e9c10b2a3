// CPU reference kernels of the resize op family.
#include "backends/cpu/cpu_backend.h"

namespace kiln::backends::cpu {

void register_resize_kernels(KernelRegistry& r) { (void)r; }

}  // namespace kiln::backends::cpu
