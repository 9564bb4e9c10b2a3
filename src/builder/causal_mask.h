// What a boolean attention mask computed in the graph holds, as far as its dataflow shows: the
// causal masks that exporters build at run time from index comparisons (transformers' mask
// functions: LessOrEqual of a Range of key positions against one of query positions, Trilu of
// ones), combined with And of masks that are all true (the padding mask of an all-ones
// attention_mask, Cast, Expanded and Gathered), whatever the exporter's spelling of each step.
#pragma once

#include "ir/graph.h"

namespace kiln::builder {

enum class MaskKind {
  kUnknown,
  kAllTrue,  // every element nonzero
  kCausal,   // over the last two axes [.., S, S]: nonzero where j <= i (key at or before the query)
  kStrictlyUpper,  // the complement: nonzero where j > i (the keys a causal mask hides)
};

// What `v` holds; kUnknown where the analysis cannot tell. Linear in the nodes it visits (bounded
// depth).
MaskKind mask_kind(const ir::Graph& g, int v);

}  // namespace kiln::builder
