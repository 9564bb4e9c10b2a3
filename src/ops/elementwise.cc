// Schemas of the elementwise op family.
#include "ops/schema.h"

namespace kiln::ops {

void register_elementwise_ops(OpRegistry& r) { (void)r; }

}  // namespace kiln::ops
