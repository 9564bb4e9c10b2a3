// EngineData: the immutable state an Engine shares with its execution contexts.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "plan/plan.h"

namespace kiln {

struct EngineData {
  plan::Plan plan;
  const backends::Backend* backend = nullptr;
  std::vector<int> io_values;                 // plan value index of each IO tensor: inputs, then outputs
  std::vector<int> io_of_value;              // per plan value: its IO index, or -1
  int num_inputs = 0;
  std::map<std::string, int, std::less<>> io_by_name;
  // For each engine input dim: how its value binds a symbol (dim = coeff*symbol + offset).
  struct DimBinding {
    bool fixed = true;
    int64_t value = 0;  // when fixed
    std::string symbol;
    int64_t coeff = 1, offset = 0;
  };
  std::vector<std::vector<DimBinding>> input_bindings;
};

}  // namespace kiln
