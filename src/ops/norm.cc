// Schemas of the norm op family.
#include "ops/schema.h"

namespace kiln::ops {

void register_norm_ops(OpRegistry& r) { (void)r; }

}  // namespace kiln::ops
