// Shared test helpers: tolerance checks (the one place tolerances live) and tiny graph builders.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/precision.h"
#include "core/tensor.h"
#include "ir/graph.h"

namespace kiln::testing {

// |a - e| <= atol + rtol * |e| elementwise, NaN/Inf must match. Also fails when the expected
// tensor is not mostly zero but the actual one is, so a kernel that writes nothing cannot pass.
// Integer and bool tensors with atol = rtol = 0 compare as int64, exactly.
::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected,
                                     double atol = 1e-4, double rtol = 1e-3);

// FP32 tolerance of the foundation issue: |a-e| <= 1e-4 + 1e-3*|e|.
inline constexpr double kFp32Atol = 1e-4;
inline constexpr double kFp32Rtol = 1e-3;

// Elementwise tolerances of one op's output against the CPU reference (all_close's atol, rtol),
// chosen by what the node computed in (the plan's NodePrecision) and the output's dtype. The
// reduced-precision rows assume the op tests' operands: values in [-1, 1) and reductions of at most
// a few hundred terms, whose rounding error is then a few units of the format's epsilon.
struct Tolerance {
  const char* name;
  double atol, rtol;
};
inline constexpr Tolerance kExactTolerance{"exact (integer, bool)", 0, 0};
inline constexpr Tolerance kFp64OpTolerance{"float64", 1e-12, 1e-10};
inline constexpr Tolerance kFp32OpTolerance{"strict float32", kFp32Atol, kFp32Rtol};
// Float16/bfloat16 tensors computed natively: one or two units in the last place of the format.
inline constexpr Tolerance kFp16DataOpTolerance{"float16 tensors", 1e-3, 2e-3};
inline constexpr Tolerance kBf16DataOpTolerance{"bfloat16 tensors", 1e-2, 1.6e-2};
// Float32 tensors computed in a reduced format (inputs rounded to it, FP32 accumulation): TF32 and
// FP16 keep 10 mantissa bits (epsilon 2^-10), BF16 keeps 7 (epsilon 2^-7).
inline constexpr Tolerance kTf32OpTolerance{"tf32 compute", 2e-2, 1e-2};
inline constexpr Tolerance kFp16OpTolerance{"float16 compute", 2e-2, 1e-2};
inline constexpr Tolerance kBf16OpTolerance{"bfloat16 compute", 1e-1, 5e-2};
Tolerance op_tolerance(DType output, NodePrecision computed = {});

// Reduced-precision runs (TF32, FP16, BF16) against the FP32 reference: error statistics over a
// tensor, checked against per-precision limits. max_abs and mean_abs are relative to the
// reference's max |e| and mean |e| (the shared models' outputs differ in scale); top-1 agreement
// is over rows of the last axis, for classifiers.
struct ErrorStats {
  double max_abs = 0, mean_abs = 0, ref_max_abs = 0, ref_mean_abs = 0, cosine = 1;
};
ErrorStats error_stats(const Tensor& actual, const Tensor& expected);
double top1_agreement(const Tensor& actual, const Tensor& expected);

// The seeded shared models include degenerate references (vit_tiny's logits are all 0 and
// mobilenet_v3_small's are ~1e-9), so the relative limits carry an absolute floor (the FP32
// elementwise atol) and cosine/top-1 are only checked where the reference's max |e| exceeds
// kMeaningfulRefMax.
struct PrecisionTolerance {
  const char* name;
  double max_rel;   // max_abs <= max_rel * ref_max_abs + abs_floor
  double mean_rel;  // mean_abs <= mean_rel * ref_mean_abs + abs_floor
  double abs_floor;
  double min_cosine;
  double min_top1;  // fraction of rows whose argmax agrees
};
inline constexpr double kMeaningfulRefMax = 1e-3;
inline constexpr PrecisionTolerance kTf32Tolerance{"tf32", 1e-2, 5e-3, 1e-4, 0.99995, 0.75};
inline constexpr PrecisionTolerance kFp16Tolerance{"float16", 2e-2, 1e-2, 1e-4, 0.9999, 0.75};
inline constexpr PrecisionTolerance kBf16Tolerance{"bfloat16", 5e-2, 3e-2, 1e-4, 0.999, 0.5};
// The seed's MobileNetV3 finding: strict FP32 reaches about 1e-5 max abs error, and TF32's max
// abs error is at least this many times larger.
inline constexpr double kStrictFp32MobilenetMaxAbs = 2e-5;
inline constexpr double kTf32OverFp32MinRatio = 10.0;

Tensor make_f32(Shape shape, std::vector<float> values);
Tensor make_i64(Shape shape, std::vector<int64_t> values);

// Runs one CPU reference kernel for `node` on the given inputs; output shapes must be given.
StatusOr<std::vector<Tensor>> run_cpu_kernel(const ir::Node& node,
                                             const std::vector<Tensor>& inputs,
                                             const std::vector<std::pair<DType, Shape>>& outputs);

// A backend object that is not a real device: the builder asks it only which device it targets,
// so select_kernels consults that device's implementations in the registry and a CUDA plan is
// built without a GPU.
class DeviceStub final : public backends::Backend {
 public:
  explicit DeviceStub(Device d) : d_(d) {}
  Device device() const override { return d_; }

 private:
  Device d_;
};

}  // namespace kiln::testing
