// CPU reference kernels of the loss op family, computed in double: NegativeLogLikelihoodLoss and
// SoftmaxCrossEntropyLoss (log-softmax over dim 1, then the same gather, weighting and reduction).
#include <cmath>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/dtype_dispatch.h"

namespace kiln::backends::cpu {
namespace {

using ops::OpKind;

template <typename T>
double load(const TensorView& v, int64_t i) {
  return double(Num<T>::load(v.as<T>()[i]));
}

int64_t target_at(const TensorView& t, int64_t i) {
  return t.dtype == DType::kInt32 ? int64_t(t.as<int32_t>()[i]) : t.as<int64_t>()[i];
}

template <OpKind kOp>
Status loss_kernel(const KernelArgs& a) {
  constexpr bool kSce = kOp == OpKind::kSoftmaxCrossEntropyLoss;
  const std::string name = name_of(kOp);
  if (a.in.size() < 2 || !present(a.in[0]) || !present(a.in[1]) || a.out.empty()) {
    return invalid_argument(name + ": needs input, target and an output");
  }
  const TensorView& x = a.in[0];
  const TensorView& target = a.in[1];
  const bool has_weight = a.in.size() > 2 && present(a.in[2]);
  if (x.rank() < 2 || target.rank() + 1 != x.rank()) {
    return invalid_argument(name + ": input must be (N, C, d...) and target (N, d...)");
  }
  if (target.dtype != DType::kInt32 && target.dtype != DType::kInt64) {
    return invalid_argument(name + ": target must be int32 or int64");
  }
  if (has_weight && a.in[2].dtype != x.dtype) return invalid_argument(name + ": weight dtype");
  KILN_ASSIGN_OR_RETURN(std::string reduction, a.attrs.get_string("reduction", "mean"));
  const bool has_ignore = a.attrs.has("ignore_index");
  KILN_ASSIGN_OR_RETURN(int64_t ignore, a.attrs.get_int("ignore_index", 0));
  const int64_t n = x.shape[0], c = x.shape[1];
  int64_t d = 1;
  for (int k = 2; k < x.rank(); ++k) d *= x.shape[k];
  if (has_weight && a.in[2].numel() != c) return invalid_argument(name + ": weight length != C");
  if (target.numel() != n * d) return invalid_argument(name + ": target shape mismatch");
  return dispatch<kFloats>(x.dtype, kOp, [&]<typename T>(Tag<T>) -> Status {
    // The values gathered from: log-softmax over dim 1 for SoftmaxCrossEntropyLoss.
    std::vector<double> in(size_t(x.numel()));
    for (int64_t i = 0; i < x.numel(); ++i) in[size_t(i)] = load<T>(x, i);
    if constexpr (kSce) {
      for (int64_t b = 0; b < n; ++b) {
        for (int64_t e = 0; e < d; ++e) {
          double mx = -INFINITY;
          for (int64_t k = 0; k < c; ++k) mx = std::fmax(mx, in[size_t((b * c + k) * d + e)]);
          double sum = 0;
          for (int64_t k = 0; k < c; ++k) sum += std::exp(in[size_t((b * c + k) * d + e)] - mx);
          double lse = mx + std::log(sum);
          for (int64_t k = 0; k < c; ++k) in[size_t((b * c + k) * d + e)] -= lse;
        }
      }
      if (a.out.size() > 1 && present(a.out[1])) {
        if (a.out[1].numel() != x.numel() || a.out[1].dtype != x.dtype) {
          return invalid_argument(name + ": log_prob output must match the input");
        }
        T* lp = a.out[1].as<T>();
        for (int64_t i = 0; i < x.numel(); ++i)
          lp[i] = Num<T>::store(decltype(Num<T>::load(lp[0]))(in[size_t(i)]));
      }
    }
    std::vector<double> loss(size_t(n * d)), w(size_t(n * d));
    bool weighted = has_weight || has_ignore;
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t e = 0; e < d; ++e) {
        const size_t i = size_t(b * d + e);
        const int64_t t = target_at(target, int64_t(i));
        if (has_ignore && t == ignore) {
          loss[i] = 0;
          w[i] = 0;
          continue;
        }
        if (t < 0 || t >= c) {
          return invalid_argument(name + ": target value " + std::to_string(t) +
                                  " is outside [0, " + std::to_string(c) + ")");
        }
        w[i] = has_weight ? load<T>(a.in[2], t) : 1.0;
        loss[i] = -in[size_t((b * c + t) * d + e)] * w[i];
      }
    }
    const TensorView& out = a.out[0];
    using C = decltype(Num<T>::load(out.as<T>()[0]));
    if (reduction == "none") {
      if (out.numel() != n * d) return invalid_argument(name + ": output shape mismatch");
      for (size_t i = 0; i < loss.size(); ++i) out.as<T>()[i] = Num<T>::store(C(loss[i]));
      return ok_status();
    }
    if (out.numel() != 1) return invalid_argument(name + ": a reduced loss has one element");
    double sum = 0, wsum = 0;
    for (size_t i = 0; i < loss.size(); ++i) {
      sum += loss[i];
      wsum += w[i];
    }
    double r = sum;
    if (reduction == "mean") r = weighted ? sum / wsum : sum / double(loss.size());
    out.as<T>()[0] = Num<T>::store(C(r));
    return ok_status();
  });
}

}  // namespace

void register_loss_kernels(KernelRegistry& r) {
  r.add(OpKind::kNegativeLogLikelihoodLoss, &loss_kernel<OpKind::kNegativeLogLikelihoodLoss>);
  r.add(OpKind::kSoftmaxCrossEntropyLoss, &loss_kernel<OpKind::kSoftmaxCrossEntropyLoss>);
}

}  // namespace kiln::backends::cpu
