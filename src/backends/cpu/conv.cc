// CPU reference kernels of the conv op family.
#include "backends/cpu/cpu_backend.h"

namespace kiln::backends::cpu {

void register_conv_kernels(KernelRegistry& r) { (void)r; }

}  // namespace kiln::backends::cpu
