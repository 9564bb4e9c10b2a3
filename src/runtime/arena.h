// The activation arena's alignment: each slot's offset and size round up to it
// (execution_context.cc and context_shapes.cc; Engine::activation_bytes rounds the same way).
#pragma once

#include <cstddef>

namespace kiln {

inline constexpr size_t kAlign = 64;

inline size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace kiln
