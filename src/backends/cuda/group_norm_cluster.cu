// GroupNormalization and InstanceNormalization over thread-block clusters (sm_90): the kernel and
// its launcher; group_norm_cluster.h declares what channel_norm.cu calls.
#include <cooperative_groups.h>

#include <algorithm>

#include "backends/cuda/device_util.cuh"
#include "backends/cuda/group_norm_cluster.h"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

constexpr int kBlock = 256;

// GroupNormalization and InstanceNormalization with each (sample, group) row split over a
// thread-block cluster (sm_90): grouped_norm_kernel's one block per row took 226 us (float32) and
// 126 us (float16) for 32 groups of [8, 320, 64, 64] on an H200, 13% of copy bandwidth (256
// blocks for 132 SMs, double arithmetic per element). Here each of the cluster's blocks takes a
// chunk of the row, keeps it in shared memory when `cached` (else reads it again, mostly from
// L2), and the blocks exchange partial sums through distributed shared memory: the mean first,
// then the sum of squared deviations from it (two passes, as the reference), summed in float over
// one vector and in double beyond. Y = (x - mean) * (inv * scale) + bias in float. Sizes fit in
// int: row is at most kMaxClusterRow.
template <typename T, int kVec>
__global__ void __launch_bounds__(kBlock)
    grouped_norm_cluster_kernel(const T* __restrict__ x, T* __restrict__ y, ClusterNormArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  struct alignas(sizeof(T) * kVec) Pack {
    T v[kVec];
  };
  using N = DNum<T>;
  namespace cg = cooperative_groups;
  extern __shared__ __align__(16) unsigned char norm_cache[];
  __shared__ double shared[kBlock / 32];
  __shared__ double partial[2];  // this block's sum, then its sum of squared deviations
  const cg::cluster_group cluster = cg::this_cluster();
  const int k = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  const int64_t r = blockIdx.x / unsigned(k);
  const int begin = min(a.row, rank * a.chunk), end = min(a.row, begin + a.chunk);
  const int stride = int(blockDim.x) * kVec;
  const T* xr = x + r * a.row;
  T* yr = y + r * a.row;
  Pack* cache = reinterpret_cast<Pack*>(norm_cache);
  const auto load = [&](int j) {
    return a.cached ? cache[(j - begin) / kVec] : *reinterpret_cast<const Pack*>(xr + j);
  };
  double s = 0;
#pragma unroll 4
  for (int j = begin + int(threadIdx.x) * kVec; j < end; j += stride) {
    const Pack v = *reinterpret_cast<const Pack*>(xr + j);
    if (a.cached) cache[(j - begin) / kVec] = v;
    float vs = 0;
#pragma unroll
    for (int e = 0; e < kVec; ++e) vs += float(N::load(v.v[e]));
    s += vs;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[0] = s;
  cluster.sync();
  double total = 0;
  for (int b = 0; b < k; ++b) total += *cluster.map_shared_rank(&partial[0], b);
  const double mean = total / double(a.row);
  const float mean_f = float(mean);
  double sq = 0;
  for (int j = begin + int(threadIdx.x) * kVec; j < end; j += stride) {
    const Pack v = load(j);  // this thread's own cached elements: no barrier needed
    float vs = 0;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float d = float(N::load(v.v[e])) - mean_f;
      vs += d * d;
    }
    sq += vs;
  }
  sq = block_sum(sq, shared);
  if (threadIdx.x == 0) partial[1] = sq;
  cluster.sync();
  double total_sq = 0;
  for (int b = 0; b < k; ++b) total_sq += *cluster.map_shared_rank(&partial[1], b);
  // The other blocks read `partial` until they arrive here: no block may exit before.
  auto token = cluster.barrier_arrive();
  const double inv = 1.0 / sqrt(total_sq / double(a.row) + a.eps);
  const int g = int(r % a.groups);
  for (int j = begin + int(threadIdx.x) * kVec; j < end; j += stride) {
    const Pack v = load(j);
    const int pi = a.per_group ? g : g * a.cpg + j / a.spatial;
    const float mul = float(inv * load_as<double>(a.scale, a.scale_dtype, pi));
    const float add = load_as<float>(a.bias, a.bias_dtype, pi);
    Pack o;
#pragma unroll
    for (int e = 0; e < kVec; ++e) o.v[e] = N::store((float(N::load(v.v[e])) - mean_f) * mul + add);
    *reinterpret_cast<Pack*>(yr + j) = o;
  }
  cluster.barrier_wait(std::move(token));
#endif
}

}  // namespace

bool clusters_available() {
  if (current_sm() < 90) return false;
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, grouped_norm_cluster_kernel<float, 4>) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return fa.ptxVersion >= 90;
}

// The sizing (the contract is the header's): clusters of up to 8 blocks with chunks of at least
// 64 elements, the most blocks that still run as one wave with their chunks in shared memory
// (every block loads, then every block writes: a second wave would wait on the first's
// reductions), else the most blocks.
template <typename T>
StatusOr<bool> launch_grouped_norm_cluster(const T* x, T* y, ClusterNormArgs a, int64_t rows,
                                           cudaStream_t s) {
  constexpr int kVec = int(16 / sizeof(T));
  const bool vec = aligned16(x) && aligned16(y) && (a.per_group ? a.row : a.spatial) % kVec == 0;
  const int step = vec ? kVec : 1;
  const auto chunk_for = [&](int k) { return ((a.row + k - 1) / k + step - 1) / step * step; };
  int most = 1;
  while (most < kMaxCluster && a.row / (2 * most) >= 64) most *= 2;
  // A cluster's blocks share a GPC, so the clusters that fit at once are fewer than the blocks
  // per SM suggest: ask for them.
  const auto clusters_at_once = [&](int c, size_t bytes) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(std::min<int64_t>(rows * c, INT32_MAX / c * c)));
    cfg.blockDim = dim3(kBlock);
    cfg.dynamicSmemBytes = bytes;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = unsigned(c), attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(
            &clusters,
            vec ? grouped_norm_cluster_kernel<T, kVec> : grouped_norm_cluster_kernel<T, 1>,
            &cfg) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return clusters;
  };
  int k = most;
  for (int c = most; c >= 1; c /= 2) {
    const size_t bytes = size_t(chunk_for(c)) * sizeof(T);
    if (bytes <= kMaxChunkBytes && rows <= clusters_at_once(c, bytes)) {
      k = c;
      break;
    }
  }
  if (rows * k > INT32_MAX) return false;
  a.chunk = chunk_for(k);
  const size_t bytes = size_t(a.chunk) * sizeof(T);
  a.cached = bytes <= kMaxChunkBytes;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(rows * k));
  cfg.blockDim = dim3(kBlock);
  cfg.dynamicSmemBytes = a.cached ? bytes : 0;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(k);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const cudaError_t e =
      vec ? cudaLaunchKernelEx(&cfg, grouped_norm_cluster_kernel<T, kVec>, x, y, a)
          : cudaLaunchKernelEx(&cfg, grouped_norm_cluster_kernel<T, 1>, x, y, a);
  if (e != cudaSuccess) return cuda_status(e, "launching grouped_norm_cluster_kernel");
  return true;
}

template StatusOr<bool> launch_grouped_norm_cluster<float>(const float*, float*, ClusterNormArgs,
                                                           int64_t, cudaStream_t);
template StatusOr<bool> launch_grouped_norm_cluster<__half>(const __half*, __half*, ClusterNormArgs,
                                                            int64_t, cudaStream_t);
template StatusOr<bool> launch_grouped_norm_cluster<__nv_bfloat16>(const __nv_bfloat16*,
                                                                   __nv_bfloat16*, ClusterNormArgs,
                                                                   int64_t, cudaStream_t);

}  // namespace kiln::backends::cuda
