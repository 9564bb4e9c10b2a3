// Shared test helpers.
#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/backend.h"
#include "backends/kernel_registry.h"

namespace kiln::testing {

::testing::AssertionResult all_close(const Tensor& a, const Tensor& e, double atol, double rtol) {
  if (a.dtype() != e.dtype()) {
    return ::testing::AssertionFailure()
           << "dtype " << dtype_name(a.dtype()) << " != expected " << dtype_name(e.dtype());
  }
  if (a.shape() != e.shape()) {
    return ::testing::AssertionFailure() << "shape " << shape_to_string(a.shape())
                                         << " != expected " << shape_to_string(e.shape());
  }
  int64_t n = a.numel();
  if (!is_float(a.dtype()) && atol == 0 && rtol == 0) {
    // float_at would round int64 values past 2^53.
    for (int64_t i = 0; i < n; ++i) {
      if (a.int_at(i) != e.int_at(i)) {
        return ::testing::AssertionFailure()
               << "element " << i << ": got " << a.int_at(i) << ", expected " << e.int_at(i)
               << " (exact " << dtype_name(a.dtype()) << ")";
      }
    }
  }
  int64_t bad = 0, nonzero_e = 0, nonzero_a = 0;
  double worst = 0;
  int64_t worst_i = -1;
  for (int64_t i = 0; i < n; ++i) {
    double x = a.float_at(i), y = e.float_at(i);
    if (y != 0) ++nonzero_e;
    if (x != 0) ++nonzero_a;
    bool ok;
    if (std::isnan(y) || std::isnan(x)) {
      ok = std::isnan(x) && std::isnan(y);
    } else if (std::isinf(y) || std::isinf(x)) {
      ok = x == y;
    } else {
      double err = std::fabs(x - y);
      ok = err <= atol + rtol * std::fabs(y);
      if (err - rtol * std::fabs(y) > worst) {
        worst = err - rtol * std::fabs(y);
        worst_i = i;
      }
    }
    if (!ok) {
      if (bad == 0) worst_i = i;
      ++bad;
    }
  }
  if (nonzero_e > n / 2 && nonzero_a < nonzero_e / 4) {
    return ::testing::AssertionFailure()
           << "output is mostly zero (" << nonzero_a << " nonzero of " << n
           << ") where the reference is not (" << nonzero_e << ")";
  }
  if (bad) {
    return ::testing::AssertionFailure()
           << bad << " of " << n << " elements differ; element " << worst_i << ": got "
           << a.float_at(worst_i) << ", expected " << e.float_at(worst_i) << " (atol " << atol
           << ", rtol " << rtol << ")";
  }
  return ::testing::AssertionSuccess();
}

Tolerance op_tolerance(DType output, NodePrecision computed) {
  if (computed.tf32) return kTf32OpTolerance;
  if (output == DType::kFloat32 || output == DType::kUndefined) {
    switch (computed.compute) {
      case DType::kFloat16:
        return kFp16OpTolerance;
      case DType::kBFloat16:
        return kBf16OpTolerance;
      default:
        return kFp32OpTolerance;
    }
  }
  switch (output) {
    case DType::kFloat64:
      return kFp64OpTolerance;
    case DType::kFloat16:
      return kFp16DataOpTolerance;
    case DType::kBFloat16:
      return kBf16DataOpTolerance;
    default:
      return is_float(output) ? kBf16DataOpTolerance : kExactTolerance;
  }
}

ErrorStats error_stats(const Tensor& a, const Tensor& e) {
  ErrorStats s;
  int64_t n = std::min(a.numel(), e.numel());
  double dot = 0, na = 0, ne = 0;
  for (int64_t i = 0; i < n; ++i) {
    double x = a.float_at(i), y = e.float_at(i), d = std::fabs(x - y);
    s.max_abs = std::max(s.max_abs, d);
    s.mean_abs += d;
    s.ref_max_abs = std::max(s.ref_max_abs, std::fabs(y));
    s.ref_mean_abs += std::fabs(y);
    dot += x * y, na += x * x, ne += y * y;
  }
  if (n > 0) s.mean_abs /= double(n), s.ref_mean_abs /= double(n);
  s.cosine = na > 0 && ne > 0 ? dot / std::sqrt(na * ne) : (na == ne ? 1.0 : 0.0);
  return s;
}

double top1_agreement(const Tensor& a, const Tensor& e) {
  if (a.rank() == 0 || a.shape() != e.shape()) return 0;
  int64_t cols = a.shape().back();
  int64_t rows = cols ? a.numel() / cols : 0, agree = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t ba = 0, be = 0;
    for (int64_t c = 1; c < cols; ++c) {
      if (a.float_at(r * cols + c) > a.float_at(r * cols + ba)) ba = c;
      if (e.float_at(r * cols + c) > e.float_at(r * cols + be)) be = c;
    }
    agree += ba == be;
  }
  return rows ? double(agree) / double(rows) : 1.0;
}

Tensor make_f32(Shape shape, std::vector<float> values) {
  return Tensor::from_vector(DType::kFloat32, std::move(shape), values);
}

Tensor make_i64(Shape shape, std::vector<int64_t> values) {
  return Tensor::from_vector(DType::kInt64, std::move(shape), values);
}

StatusOr<std::vector<Tensor>> run_cpu_kernel(const ir::Node& node,
                                             const std::vector<Tensor>& inputs,
                                             const std::vector<std::pair<DType, Shape>>& outputs) {
  ir::Graph g;
  std::vector<const ir::Value*> in_vals, out_vals;
  for (size_t i = 0; i < inputs.size() + outputs.size(); ++i) g.add_value("v" + std::to_string(i));
  for (size_t i = 0; i < inputs.size(); ++i) {
    ir::Value& v = g.values[i];
    v.dtype = inputs[i].dtype();
    std::vector<ir::Dim> s(inputs[i].shape().begin(), inputs[i].shape().end());
    v.shape = s;
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    ir::Value& v = g.values[inputs.size() + i];
    v.dtype = outputs[i].first;
    v.shape = std::vector<ir::Dim>(outputs[i].second.begin(), outputs[i].second.end());
  }
  for (size_t i = 0; i < inputs.size(); ++i)
    in_vals.push_back(inputs[i].empty() ? nullptr : &g.values[i]);
  for (size_t i = 0; i < outputs.size(); ++i) out_vals.push_back(&g.values[inputs.size() + i]);
  backends::KernelQuery q{node, in_vals, out_vals};
  KILN_ASSIGN_OR_RETURN(auto kernel, backends::create_reference_kernel(q));
  std::vector<TensorView> iv, ov;
  for (const auto& t : inputs) iv.push_back(t.view());
  std::vector<Tensor> out;
  for (const auto& [dt, shape] : outputs) {
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(dt, shape));
    out.push_back(t);
  }
  for (const auto& t : out) ov.push_back(t.view());
  KILN_RETURN_IF_ERROR(kernel->execute(iv, ov));
  return out;
}

}  // namespace kiln::testing
