// Value ranges of small tensors computed at run time (Resize's sizes or scales, Pad's pads when
// float math on a shape makes them): per element an interval over the profiles' symbol ranges, by
// interval arithmetic along the value's producers, and the element as a dim where shape math
// knows it exactly. Ops whose output size such a tensor decides bound their data-dependent dims by
// it.
#pragma once

#include <optional>
#include <vector>

#include "ir/graph.h"

namespace kiln::ops {

struct ElementRange {
  std::optional<ir::Dim> exact;  // the element as a formula, where shape math knows it
  double lo = -1.0 / 0.0,
         hi = 1.0 / 0.0;  // every value it takes over the symbol ranges lies within
};

// The elements of value `v` of `g` in row-major order. Walks producers of small tensors of constant
// shape (constants; symbolic values, bounded by `ranges`; Cast, Add/Sub/Mul/Div, Reciprocal, Neg,
// Abs, Min/Max, Floor/Ceil/Round, Clip, Concat, Gather/Slice with constant indices, Unsqueeze/
// Squeeze/Reshape/Flatten/Identity, ReduceMin/ReduceMax over every element); an element it cannot
// follow is unbounded. nullopt when `v` is no small tensor of constant shape. Without ranges
// (nullptr) symbols are only known to be dims (>= 0). Float32 results are widened by their
// rounding, so the bounds hold for what a kernel computes, not only for exact arithmetic.
std::optional<std::vector<ElementRange>> value_range(const ir::Graph& g, int v,
                                                     const ir::SymbolRanges* ranges);

}  // namespace kiln::ops
