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

#include "backends/cpu/thread_pool.h"
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

// Calls row(out_offset, offsets, n, inner) once per innermost row: out_offset is the output's
// element offset (the output is contiguous), offsets[k] operand k's, n the row length, inner[k]
// operand k's stride along the row (0 when it broadcasts). The rows are split over the thread
// pool in contiguous ranges (parallel_chunks), each walked in row-major order, so `row` must write
// only its own output row and read nothing another row writes (every caller computes each
// element from its operands alone, so the bits do not depend on the split).
template <int N, typename Row>
void for_each_row(const BroadcastPlan<N>& plan, Row&& row) {
  if (plan.numel == 0) return;
  const int rank = int(plan.dims.size());
  if (rank == 0) {
    std::array<int64_t, N> zero{};
    row(int64_t(0), zero, int64_t(1), zero);
    return;
  }
  const int64_t n = plan.dims[rank - 1];
  const std::array<int64_t, N> inner = plan.strides[rank - 1];
  const int64_t rows = plan.numel / n;
  if (rank == 2) {  // one outer axis: each operand's row offset is a multiple of its stride
    const std::array<int64_t, N> outer = plan.strides[0];
    parallel_chunks(rows, std::max<int64_t>(1, kParallelGrain / n),
                    [&](int64_t first, int64_t last) {
                      for (int64_t r = first; r < last; ++r) {
                        std::array<int64_t, N> off;
                        for (int k = 0; k < N; ++k) off[k] = r * outer[k];
                        row(r * n, off, n, inner);
                      }
                    });
    return;
  }
  parallel_chunks(rows, std::max<int64_t>(1, kParallelGrain / n), [&](int64_t first, int64_t last) {
    // The multi-index and operand offsets of row `first`, then a step per row.
    std::vector<int64_t> idx(size_t(rank - 1), 0);
    std::array<int64_t, N> off{};
    int64_t rem = first;
    for (int a = rank - 2; a >= 0; --a) {
      idx[size_t(a)] = rem % plan.dims[size_t(a)];
      rem /= plan.dims[size_t(a)];
      for (int k = 0; k < N; ++k) off[k] += idx[size_t(a)] * plan.strides[size_t(a)][k];
    }
    int64_t out_off = first * n;
    for (int64_t r = first; r < last; ++r, out_off += n) {
      row(out_off, off, n, inner);
      for (int a = rank - 2; a >= 0; --a) {
        const auto& s = plan.strides[size_t(a)];
        if (++idx[size_t(a)] < plan.dims[size_t(a)]) {
          for (int k = 0; k < N; ++k) off[k] += s[k];
          break;
        }
        for (int k = 0; k < N; ++k) off[k] -= s[k] * (plan.dims[size_t(a)] - 1);
        idx[size_t(a)] = 0;
      }
    }
  });
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
