// Build-time checks the CUDA kernel factories of several op families share (shape.cu, index.cu,
// reduce.cu): element sizes the copy kernels move, inputs readable on the host, a known rank.
#pragma once

#include <string>

#include "backends/cuda/cuda_common.h"

namespace kiln::backends::cuda {

// Element sizes the copy kernels move: refused at build time otherwise.
inline Status require_element_size(const KernelQuery& q, DType t) {
  size_t es = dtype_size(t);
  if (es != 1 && es != 2 && es != 4 && es != 8) {
    return unsupported(q.node.describe() + ": dtype " + std::string(dtype_name(t)) +
                       " is not supported");
  }
  return ok_status();
}

// Whether input i can be read on the host without a device copy, so that HostParam::get never
// synchronizes: a constant, or a value known as formulas (shape arithmetic), whose producer never
// runs (eliminate_dead_nodes) and which the runtime evaluates into page-locked host memory.
inline bool host_readable(const KernelQuery& q, size_t i) {
  if (i >= q.inputs.size() || !q.inputs[i]) return true;  // omitted
  const ir::Value& v = *q.inputs[i];
  return v.constant.has_value() || v.sym_value.has_value();
}

// The rank of input i, known at build time and at most kMaxRank.
inline StatusOr<int> known_rank(const KernelQuery& q, size_t i) {
  if (i >= q.inputs.size() || !q.inputs[i] || !q.inputs[i]->shape) {
    return unsupported(q.node.describe() + ": input " + std::to_string(i) + " has no known rank");
  }
  int r = int(q.inputs[i]->shape->size());
  if (r > kMaxRank) {
    return unsupported(q.node.describe() + ": rank " + std::to_string(r) +
                       " exceeds the CUDA kernels' " + std::to_string(kMaxRank));
  }
  return r;
}

}  // namespace kiln::backends::cuda
