// Broadcast iteration for CPU kernels: numpy-style strided walks over N operands. Adjacent axes are
// merged so that the common cases (same shape, a scalar operand, [b,197,192] + [192],
// [b,4,s,s] + [1,1,s,s]) run as a few long rows with per-operand strides of 0 or 1.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace kiln::backends::cpu {

template <int N>
struct BroadcastPlan {
  std::vector<int64_t> dims;  // merged output dims, outermost first; size-1 dims dropped
  std::vector<std::array<int64_t, N>> strides;  // per merged axis, each operand's element stride
  int64_t numel = 0;                            // of the output
};

// Plans the walk of an output of shape `out` over operands of shapes `ins`, each of which must
// broadcast to `out` (rank <= out's, every dim 1 or equal). The caller names the op in errors.
template <int N>
Status make_broadcast_plan(std::span<const int64_t> out,
                           const std::array<std::span<const int64_t>, N>& ins,
                           BroadcastPlan<N>* plan) {
  const size_t rank = out.size();
  plan->dims.clear();
  plan->strides.clear();
  plan->numel = 1;
  for (int64_t d : out) plan->numel *= d;
  std::vector<std::array<int64_t, N>> full(rank);
  for (int k = 0; k < N; ++k) {
    std::span<const int64_t> s = ins[k];
    if (s.size() > rank) {
      return invalid_argument("operand " + std::to_string(k) + " shape " + shape_to_string(s) +
                              " has a higher rank than the output shape " + shape_to_string(out));
    }
    int64_t stride = 1;
    for (size_t d = rank; d-- > 0;) {
      size_t sd = d + s.size();
      if (sd < rank) {
        full[d][k] = 0;
        continue;
      }
      int64_t dim = s[sd - rank];
      if (dim != out[d] && dim != 1) {
        return invalid_argument("operand " + std::to_string(k) + " shape " + shape_to_string(s) +
                                " does not broadcast to the output shape " + shape_to_string(out));
      }
      full[d][k] = dim == 1 ? 0 : stride;
      stride *= dim;
    }
  }
  if (plan->numel == 0) return ok_status();
  // Merge from the innermost axis outwards: axis d folds into the merged axis inside it when, for
  // every operand, stepping d equals stepping across the whole inner axis (both 0 or contiguous).
  for (size_t d = rank; d-- > 0;) {
    if (out[d] == 1) continue;
    if (!plan->dims.empty()) {
      bool merge = true;
      for (int k = 0; k < N; ++k) {
        if (full[d][k] != plan->strides.back()[k] * plan->dims.back()) merge = false;
      }
      if (merge) {
        plan->dims.back() *= out[d];
        continue;
      }
    }
    plan->dims.push_back(out[d]);
    plan->strides.push_back(full[d]);
  }
  std::reverse(plan->dims.begin(), plan->dims.end());
  std::reverse(plan->strides.begin(), plan->strides.end());
  return ok_status();
}

// Calls row(out_offset, offsets, n, inner) once per innermost row, in row-major output order:
// out_offset is the output's element offset (the output is contiguous), offsets[k] operand k's,
// n the row length, inner[k] operand k's stride along the row (0 when it broadcasts).
template <int N, typename Row>
void for_each_row(const BroadcastPlan<N>& plan, Row&& row) {
  if (plan.numel == 0) return;
  std::array<int64_t, N> off{};
  const int rank = int(plan.dims.size());
  if (rank == 0) {
    std::array<int64_t, N> zero{};
    row(int64_t(0), off, int64_t(1), zero);
    return;
  }
  const int64_t n = plan.dims[rank - 1];
  const std::array<int64_t, N> inner = plan.strides[rank - 1];
  const int64_t rows = plan.numel / n;
  std::vector<int64_t> idx(size_t(rank - 1), 0);
  int64_t out_off = 0;
  for (int64_t r = 0; r < rows; ++r, out_off += n) {
    row(out_off, off, n, inner);
    for (int a = rank - 2; a >= 0; --a) {
      const auto& s = plan.strides[a];
      if (++idx[a] < plan.dims[a]) {
        for (int k = 0; k < N; ++k) off[k] += s[k];
        break;
      }
      for (int k = 0; k < N; ++k) off[k] -= s[k] * (plan.dims[a] - 1);
      idx[a] = 0;
    }
  }
}

// out[i] = f(a[.], b[.]) over a broadcast plan, with flat loops for the stride patterns that occur.
template <typename Ta, typename Tb, typename O, typename F>
void rows2(const BroadcastPlan<2>& plan, const Ta* pa, const Tb* pb, O* po, F f) {
  for_each_row(plan, [&](int64_t o, const std::array<int64_t, 2>& off, int64_t n,
                         const std::array<int64_t, 2>& s) {
    const Ta* x = pa + off[0];
    const Tb* y = pb + off[1];
    O* z = po + o;
    if (s[0] == 1 && s[1] == 1) {
      for (int64_t i = 0; i < n; ++i) z[i] = f(x[i], y[i]);
    } else if (s[0] == 1 && s[1] == 0) {
      const Tb yv = *y;
      for (int64_t i = 0; i < n; ++i) z[i] = f(x[i], yv);
    } else if (s[0] == 0 && s[1] == 1) {
      const Ta xv = *x;
      for (int64_t i = 0; i < n; ++i) z[i] = f(xv, y[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) z[i] = f(x[i * s[0]], y[i * s[1]]);
    }
  });
}

}  // namespace kiln::backends::cpu
