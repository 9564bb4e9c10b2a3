// The broadcast walk shared by the elementwise kernels of elementwise.cu (unary and binary ops) and
// broadcast_copy.cu (Where, Expand): the kernels' arguments and plan_walk, which fills their walk.
#pragma once

#include <array>
#include <span>
#include <string>

#include "backends/cpu/broadcast.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/ew_math.cuh"

namespace kiln::backends::cuda {

struct EwArgs {
  Strided<3> walk;
  const void* in[3];
  int in_dtype[3];
  void* out;
  int out_dtype;
  int64_t n;
  Op op;
  float alpha, beta;
};

template <int N>
Status plan_walk(std::span<const int64_t> out, const std::array<std::span<const int64_t>, N>& ins,
                 Strided<3>* walk) {
  cpu::BroadcastPlan<N> plan;
  KILN_RETURN_IF_ERROR(cpu::make_broadcast_plan<N>(out, ins, &plan));
  if (plan.dims.size() > size_t(kMaxRank)) {
    return unsupported("broadcast over " + std::to_string(plan.dims.size()) +
                       " non-mergeable axes (at most " + std::to_string(kMaxRank) + ")");
  }
  walk->rank = int(plan.dims.size());
  for (size_t d = 0; d < plan.dims.size(); ++d) {
    walk->dims[d] = plan.dims[d];
    for (int k = 0; k < 3; ++k) walk->strides[d][k] = k < N ? plan.strides[d][k] : 0;
  }
  return ok_status();
}

}  // namespace kiln::backends::cuda
