// Schemas of the conv op family.
#include "ops/schema.h"

namespace kiln::ops {

void register_conv_ops(OpRegistry& r) { (void)r; }

}  // namespace kiln::ops
