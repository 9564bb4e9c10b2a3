// Schemas of the resize op family.
#include "ops/schema.h"

namespace kiln::ops {

void register_resize_ops(OpRegistry& r) { (void)r; }

}  // namespace kiln::ops
