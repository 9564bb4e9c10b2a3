// GroupNormalization's and InstanceNormalization's cluster kernel (group_norm_cluster.cu): each
// (sample, group) row split over a thread-block cluster on sm_90; channel_norm.cu's kernels call
// it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/cuda/cuda_common.h"

namespace kiln::backends::cuda {

constexpr int64_t kMaxClusterRow = int64_t(1) << 27;
constexpr int kMaxCluster = 8;                // the portable cluster size
constexpr size_t kMaxChunkBytes = 48 * 1024;  // dynamic shared memory without opting in

struct ClusterNormArgs {
  const void *scale, *bias;
  int scale_dtype, bias_dtype;
  int groups, cpg, spatial, row, chunk;  // row = cpg * spatial; chunk: a block's part, kVec-aligned
  bool per_group, cached;
  double eps;
};

// Whether this device runs grouped_norm_cluster_kernel: sm_90 or newer, with the kernel's code
// built for it (a build for older architectures only compiles its body out).
bool clusters_available();

// grouped_norm_cluster_kernel over `rows` rows of a.row elements (a.chunk and a.cached left for
// this to fill); false (nothing launched) where the grid would be too large. T: float, __half or
// __nv_bfloat16.
template <typename T>
StatusOr<bool> launch_grouped_norm_cluster(const T* x, T* y, ClusterNormArgs a, int64_t rows,
                                           cudaStream_t s);

}  // namespace kiln::backends::cuda
