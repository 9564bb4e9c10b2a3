// Einsum equation parsing shared by the schema (shape inference) and the CPU kernel: labels per
// operand with the ellipsis expanded to numbered labels, and the output's labels.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kiln::ops {

// Letters a-z and A-Z are labels 0..51; the dims an ellipsis covers are labels 52, 53, ...,
// numbered so that the last ellipsis dim of every operand shares one label (they broadcast).
inline constexpr int kEinsumEllipsisLabel = 52;

struct EinsumSpec {
  std::vector<std::vector<int>> inputs;  // labels of each operand's dims, in order
  std::vector<int> output;               // labels of the output's dims
  int ellipsis_rank = 0;                 // how many dims the ellipsis stands for
  int num_labels() const { return kEinsumEllipsisLabel + ellipsis_rank; }
};

// Parses `equation` against the operands' ranks; errors name what was wrong.
StatusOr<EinsumSpec> parse_einsum(std::string_view equation, const std::vector<int>& ranks);

}  // namespace kiln::ops
