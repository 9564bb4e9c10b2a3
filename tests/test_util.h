// Shared test helpers: tolerance checks (the one place tolerances live) and tiny graph builders.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/tensor.h"
#include "ir/graph.h"

namespace kiln::testing {

// |a - e| <= atol + rtol * |e| elementwise, NaN/Inf must match. Also fails when the expected
// tensor is not mostly zero but the actual one is, so a kernel that writes nothing cannot pass.
::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double atol = 1e-4,
                                     double rtol = 1e-3);

// FP32 tolerance of the foundation issue: |a-e| <= 1e-4 + 1e-3*|e|.
inline constexpr double kFp32Atol = 1e-4;
inline constexpr double kFp32Rtol = 1e-3;

Tensor make_f32(Shape shape, std::vector<float> values);
Tensor make_i64(Shape shape, std::vector<int64_t> values);

// Runs one CPU reference kernel for `node` on the given inputs; output shapes must be given.
StatusOr<std::vector<Tensor>> run_cpu_kernel(const ir::Node& node, const std::vector<Tensor>& inputs,
                                             const std::vector<std::pair<DType, Shape>>& outputs);

}  // namespace kiln::testing
