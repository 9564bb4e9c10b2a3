// Schemas of the matmul op family.
#include "ops/schema.h"

namespace kiln::ops {

void register_matmul_ops(OpRegistry& r) { (void)r; }

}  // namespace kiln::ops
