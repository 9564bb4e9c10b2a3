// Schemas of the index op family.
#include "ops/schema.h"

namespace kiln::ops {

void register_index_ops(OpRegistry& r) { (void)r; }

}  // namespace kiln::ops
