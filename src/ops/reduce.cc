// Schemas of the reduce op family.
#include "ops/schema.h"

namespace kiln::ops {

void register_reduce_ops(OpRegistry& r) { (void)r; }

}  // namespace kiln::ops
