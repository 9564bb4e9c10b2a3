// Schemas of the shape op family.
#include "ops/schema.h"

namespace kiln::ops {

void register_shape_ops(OpRegistry& r) { (void)r; }

}  // namespace kiln::ops
