// The values ONNX allows for an op's enumerated integer attributes (flags that are 0 or 1,
// directions, layouts): one table that the builder's check_supported applies to every node of a
// model (subgraphs included) and the plan verifier to every node of an engine file, so a value
// the spec forbids (Scan's scan_input_directions=[2], ConcatFromSequence's new_axis=7) is an
// error naming the node, the attribute and the allowed values, never a silent reading of it.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::ops {

// One message per attribute of `node` (not of its subgraphs) outside its domain; empty if none.
std::vector<std::string> attribute_domain_problems(const ir::Node& node);

}  // namespace kiln::ops
