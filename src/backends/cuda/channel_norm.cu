// Channel normalizations: BatchNormalization (inference), InstanceNormalization and
// GroupNormalization (one block per sample and group, statistics in double as the CPU reference),
// LpNormalization (one thread per normalized line), and, for every float dtype, computing in double
// as the CPU reference, MeanVarianceNormalization (one block per kept index) and LRN (one thread
// per element). Batch, Instance and Group normalization also take float16/bfloat16 X and Y (their
// *_half kernels), parameters in X's type or float32.
#include <algorithm>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/group_norm_cluster.h"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;
constexpr int kBlock = 256;

// y = (x - mean) / sqrt(var + eps) * scale + B, the per-channel factors computed in double.
__global__ void batch_norm_kernel(const float* x, const float* scale, const float* bias,
                                  const float* mean, const float* var, float* y, int64_t n,
                                  int64_t channels, int64_t spatial, double eps) {
  KILN_GRID_LOOP(i, n) {
    int64_t c = (i / spatial) % channels;
    double mul = double(scale[c]) / sqrt(double(var[c]) + eps);
    double add = double(bias[c]) - double(mean[c]) * mul;
    y[i] = x[i] * float(mul) + float(add);
  }
}

// Block b normalizes sample b / groups, group b % groups: `cpg` channels of `spatial` elements,
// contiguous. Channel c of the group takes scale/bias [g] when per_group, else [g*cpg + c].
__global__ void grouped_norm_kernel(const float* x, const float* scale, const float* bias, float* y,
                                    int64_t groups, int64_t cpg, int64_t spatial, bool per_group,
                                    double eps) {
  __shared__ double shared[kBlock / 32];
  int64_t b = blockIdx.x, g = b % groups, block = cpg * spatial;
  const float* xp = x + b * block;
  float* yp = y + b * block;
  double s = 0;
  for (int64_t j = threadIdx.x; j < block; j += blockDim.x) s += xp[j];
  double mean = block ? block_sum(s, shared) / double(block) : 0.0;
  double sq = 0;
  for (int64_t j = threadIdx.x; j < block; j += blockDim.x) {
    double d = xp[j] - mean;
    sq += d * d;
  }
  double var = block ? block_sum(sq, shared) / double(block) : 0.0;
  double inv = 1.0 / sqrt(var + eps);
  for (int64_t j = threadIdx.x; j < block; j += blockDim.x) {
    int64_t pi = per_group ? g : g * cpg + j / spatial;
    yp[j] = float((xp[j] - mean) * inv * double(scale[pi]) + double(bias[pi]));
  }
}

// BatchNormalization's parameters of any float type (read by dtype).
struct BatchNormArgs {
  const void* p[4];  // scale, bias, mean, var
  int dtype[4];
  int64_t n, channels, spatial;
  double eps;
};

// BatchNormalization of float16/bfloat16 X: the per-channel factors in double, applied in float as
// the CPU reference does.
template <typename T>
__global__ void batch_norm_half_kernel(const T* x, T* y, BatchNormArgs a) {
  KILN_GRID_LOOP(i, a.n) {
    int64_t c = (i / a.spatial) % a.channels;
    double mul = load_as<double>(a.p[0], a.dtype[0], c) /
                 sqrt(load_as<double>(a.p[3], a.dtype[3], c) + a.eps);
    double add =
        load_as<double>(a.p[1], a.dtype[1], c) - load_as<double>(a.p[2], a.dtype[2], c) * mul;
    y[i] = DNum<T>::store(DNum<T>::load(x[i]) * float(mul) + float(add));
  }
}

// grouped_norm_kernel for float16/bfloat16 X and Y; scale and bias of any float type.
struct HalfGroupedNormArgs {
  const void *scale, *bias;
  int scale_dtype, bias_dtype;
  int64_t groups, cpg, spatial;
  bool per_group;
  double eps;
};

template <typename T>
__global__ void grouped_norm_half_kernel(const T* x, T* y, HalfGroupedNormArgs a) {
  __shared__ double shared[kBlock / 32];
  int64_t b = blockIdx.x, g = b % a.groups, block = a.cpg * a.spatial;
  const T* xp = x + b * block;
  T* yp = y + b * block;
  double s = 0;
  for (int64_t j = threadIdx.x; j < block; j += blockDim.x) s += DNum<T>::load(xp[j]);
  double mean = block ? block_sum(s, shared) / double(block) : 0.0;
  double sq = 0;
  for (int64_t j = threadIdx.x; j < block; j += blockDim.x) {
    double d = DNum<T>::load(xp[j]) - mean;
    sq += d * d;
  }
  double var = block ? block_sum(sq, shared) / double(block) : 0.0;
  double inv = 1.0 / sqrt(var + a.eps);
  for (int64_t j = threadIdx.x; j < block; j += blockDim.x) {
    int64_t pi = a.per_group ? g : g * a.cpg + j / a.spatial;
    double o = (DNum<T>::load(xp[j]) - mean) * inv * load_as<double>(a.scale, a.scale_dtype, pi) +
               load_as<double>(a.bias, a.bias_dtype, pi);
    yp[j] = DNum<T>::store(float(o));
  }
}

// BatchNormalization of float32/float16/bfloat16 X with at most kMaxTableChannels channels:
// batch_norm_kernel and batch_norm_half_kernel took 431 us (float32) and 477 us (float16) for
// [64, 256, 56, 56] on an H200, 12% of copy bandwidth (a double division and square root and int64
// divisions per element). Here each block first puts every channel's factors in shared memory
// (in double as those kernels compute them, so the results are the same), then a thread takes
// kVec elements of one channel's plane (one 16-byte access of X and Y where the plane is a
// multiple of kVec and the pointers are aligned; kVec = 1 otherwise): one division and one FMA
// per element in float. I: int32_t when n is below 2^30 (the grid stride's overshoot then stays
// below 2^31), int64_t otherwise.
constexpr int64_t kMaxTableChannels = 6144;  // 48 KB of float2 factors

template <typename T, int kVec, typename I>
__global__ void batch_norm_table_kernel(const T* __restrict__ x, T* __restrict__ y, BatchNormArgs a,
                                        I n, I channels, I spatial) {
  struct alignas(sizeof(T) * kVec) Pack {
    T v[kVec];
  };
  using N = DNum<T>;
  extern __shared__ float2 bn_factors[];
  for (I c = threadIdx.x; c < channels; c += blockDim.x) {
    const double mul = load_as<double>(a.p[0], a.dtype[0], c) /
                       sqrt(load_as<double>(a.p[3], a.dtype[3], c) + a.eps);
    const double add =
        load_as<double>(a.p[1], a.dtype[1], c) - load_as<double>(a.p[2], a.dtype[2], c) * mul;
    bn_factors[c] = make_float2(float(mul), float(add));
  }
  __syncthreads();
  for (I i = (I(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; i < n;
       i += I(gridDim.x) * blockDim.x * kVec) {
    const float2 f = bn_factors[i / spatial % channels];
    const Pack xs = *reinterpret_cast<const Pack*>(x + i);
    Pack out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) out.v[k] = N::store(float(N::load(xs.v[k])) * f.x + f.y);
    *reinterpret_cast<Pack*>(y + i) = out;
  }
}

// batch_norm_table_kernel for X [n / (channels * spatial), channels, spatial] of storage type T;
// at most 8 blocks of kBlock threads per SM, so that each block's table serves many elements.
template <typename T>
void launch_batch_norm_table(const T* x, T* y, const BatchNormArgs& a, int64_t n, int64_t channels,
                             int64_t spatial, int sms, cudaStream_t s) {
  constexpr int kVec = int(16 / sizeof(T));
  const bool vec = aligned16(x) && aligned16(y) && spatial % kVec == 0;
  const size_t smem = size_t(channels) * sizeof(float2);
  auto launch = [&](auto v) {
    constexpr int kV = decltype(v)::value;
    const unsigned grid = std::min<unsigned>(grid_for(n / kV, kBlock), unsigned(sms) * 8u);
    if (n < (int64_t(1) << 30)) {
      batch_norm_table_kernel<T, kV, int32_t>
          <<<grid, kBlock, smem, s>>>(x, y, a, int32_t(n), int32_t(channels), int32_t(spatial));
    } else {
      batch_norm_table_kernel<T, kV, int64_t>
          <<<grid, kBlock, smem, s>>>(x, y, a, n, channels, spatial);
    }
  };
  if (vec) {
    launch(std::integral_constant<int, kVec>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
}

// Launches kernel<T> for float16 or bfloat16 `dt` (the factories admit no other half type).
template <typename F>
Status launch_half(DType dt, const std::string& who, F&& launch) {
  if (dt == DType::kFloat16) {
    launch(__half{});
  } else if (dt == DType::kBFloat16) {
    launch(__nv_bfloat16{});
  } else {
    return internal_error(who + ": no half kernel for " + std::string(dtype_name(dt)));
  }
  return ok_status();
}

__global__ void lp_norm_kernel(const float* x, float* y, int64_t lines, int64_t n, int64_t inner,
                               bool l1) {
  KILN_GRID_LOOP(line, lines) {
    int64_t base = (line / inner) * n * inner + line % inner;
    double norm = 0;
    for (int64_t k = 0; k < n; ++k) {
      double v = x[base + k * inner];
      norm += l1 ? fabs(v) : v * v;
    }
    if (!l1) norm = sqrt(norm);
    // A zero vector stays zero instead of becoming NaN, as the CPU reference.
    for (int64_t k = 0; k < n; ++k) {
      int64_t e = base + k * inner;
      y[e] = norm == 0 ? 0.f : float(double(x[e]) / norm);
    }
  }
}

// The kept and the reduced dims of MeanVarianceNormalization with X's element strides.
struct MvnGeom {
  int nk, nr;
  int64_t kdims[kMaxRank], kstrides[kMaxRank], rdims[kMaxRank], rstrides[kMaxRank];
  int64_t kept_n, red_n;
};

// Block by block over the kept indices: (x - mean) / (sqrt(E[x^2] - mean^2) + 1e-9), as the
// reference (and the ONNX function body) computes it. Explicitly rounded double operations where
// nvcc would contract into an FMA, so each step rounds as the reference's does (the partial sums
// are added in another order, which moves the result by a few units of double's last place).
__global__ void mvn_kernel(const void* x, void* y, int dtype, MvnGeom g) {
  __shared__ double shared[kBlock / 32];
  for (int64_t s = blockIdx.x; s < g.kept_n; s += gridDim.x) {
    int64_t base = walk_offset(s, g.nk, g.kdims, g.kstrides);
    double sum = 0, sq = 0;
    for (int64_t r = threadIdx.x; r < g.red_n; r += blockDim.x) {
      double v = load_as<double>(x, dtype, base + walk_offset(r, g.nr, g.rdims, g.rstrides));
      sum += v;
      sq = __dadd_rn(sq, __dmul_rn(v, v));
    }
    sum = block_sum(sum, shared);
    sq = block_sum(sq, shared);
    double cnt = double(g.red_n);
    double mean = sum / cnt;
    double var = fmax(__dsub_rn(sq / cnt, __dmul_rn(mean, mean)), 0.0);
    double den = sqrt(var) + 1e-9;
    for (int64_t r = threadIdx.x; r < g.red_n; r += blockDim.x) {
      int64_t e = base + walk_offset(r, g.nr, g.rdims, g.rstrides);
      store_as<double>(y, dtype, e, (load_as<double>(x, dtype, e) - mean) / den);
    }
  }
}

// x / (bias + alpha / size * (sum of squares over the channel window))^beta, X [batch, C, spatial].
__global__ void lrn_kernel(const void* x, void* y, int dtype, int64_t n, int64_t channels,
                           int64_t spatial, int64_t lo, int64_t hi, double bias,
                           double alpha_over_size, double beta) {
  KILN_GRID_LOOP(e, n) {
    int64_t i = e % spatial, c = (e / spatial) % channels, b = e / (spatial * channels);
    int64_t c0 = c - lo < 0 ? 0 : c - lo, c1 = c + hi > channels - 1 ? channels - 1 : c + hi;
    double sq = 0;
    for (int64_t cc = c0; cc <= c1; ++cc) {
      double v = load_as<double>(x, dtype, (b * channels + cc) * spatial + i);
      sq = __dadd_rn(sq, __dmul_rn(v, v));
    }
    double den = pow(__dadd_rn(bias, __dmul_rn(alpha_over_size, sq)), beta);
    store_as<double>(y, dtype, e, load_as<double>(x, dtype, e) / den);
  }
}

class BatchNormKernel final : public CudaKernel {
 public:
  explicit BatchNormKernel(double eps)
      : CudaKernel("cuda.BatchNormalization"), eps_(eps), sms_(current_sms()) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    if (x.rank() < 2) return invalid_argument(name_ + ": X must have rank >= 2");
    if (x.dtype != DType::kFloat32) return execute_half(in, out);
    int64_t channels = x.shape[1], n = x.numel();
    for (int i = 1; i < 5; ++i) {
      if (in[i].numel() != channels) {
        return invalid_argument(name_ + ": input " + std::to_string(i) + " has " +
                                std::to_string(in[i].numel()) + " elements, expected " +
                                std::to_string(channels) + " channels");
      }
    }
    if (n == 0) return ok_status();
    int64_t spatial = n / (x.shape[0] * channels);
    if (channels <= kMaxTableChannels) {
      BatchNormArgs a{};
      for (int i = 1; i < 5; ++i) a.p[i - 1] = in[i].data, a.dtype[i - 1] = int(DType::kFloat32);
      a.eps = eps_;
      launch_batch_norm_table(x.as<const float>(), out[0].as<float>(), a, n, channels, spatial,
                              sms_, stream_);
      return launch_status("batch_norm_table_kernel");
    }
    batch_norm_kernel<<<grid_for(n), kBlock, 0, stream_>>>(
        x.as<const float>(), in[1].as<const float>(), in[2].as<const float>(),
        in[3].as<const float>(), in[4].as<const float>(), out[0].as<float>(), n, channels, spatial,
        eps_);
    return launch_status("batch_norm_kernel");
  }

 private:
  Status execute_half(std::span<const TensorView> in, std::span<const TensorView> out) {
    const TensorView& x = in[0];
    int64_t channels = x.shape[1], n = x.numel();
    BatchNormArgs a{};
    for (int i = 1; i < 5; ++i) {
      if (in[i].numel() != channels) {
        return invalid_argument(name_ + ": input " + std::to_string(i) + " has " +
                                std::to_string(in[i].numel()) + " elements, expected " +
                                std::to_string(channels) + " channels");
      }
      a.p[i - 1] = in[i].data, a.dtype[i - 1] = int(in[i].dtype);
    }
    if (out[0].dtype != x.dtype) return invalid_argument(name_ + ": Y's dtype differs from X's");
    if (n == 0) return ok_status();
    a.n = n, a.channels = channels, a.spatial = n / (x.shape[0] * channels), a.eps = eps_;
    if (channels <= kMaxTableChannels) {
      KILN_RETURN_IF_ERROR(launch_half(x.dtype, name_, [&](auto tag) {
        using T = decltype(tag);
        launch_batch_norm_table(x.as<const T>(), out[0].as<T>(), a, n, channels, a.spatial, sms_,
                                stream_);
      }));
      return launch_status("batch_norm_table_kernel");
    }
    KILN_RETURN_IF_ERROR(launch_half(x.dtype, name_, [&](auto tag) {
      using T = decltype(tag);
      batch_norm_half_kernel<T>
          <<<grid_for(n), kBlock, 0, stream_>>>(x.as<const T>(), out[0].as<T>(), a);
    }));
    return launch_status("batch_norm_half_kernel");
  }

  double eps_;
  int sms_;
};

// InstanceNormalization is GroupNormalization with one channel per group.
class GroupedNormKernel final : public CudaKernel {
 public:
  GroupedNormKernel(std::string name, int64_t groups, double eps)
      : CudaKernel(std::move(name)), groups_(groups), eps_(eps), clusters_(clusters_available()) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    if (x.rank() < 2) return invalid_argument(name_ + ": X must have rank >= 2");
    if (x.dtype != DType::kFloat32) return execute_half(in, out);
    int64_t batch = x.shape[0], channels = x.shape[1];
    int64_t groups = groups_ > 0 ? groups_ : channels;
    if (groups <= 0 || channels % groups != 0) {
      return invalid_argument(name_ + ": " + std::to_string(channels) +
                              " channels do not split into " + std::to_string(groups) + " groups");
    }
    bool per_group = in[1].numel() != channels;
    int64_t param_n = per_group ? groups : channels;
    if (in[1].numel() != param_n || in[2].numel() != param_n) {
      return invalid_argument(name_ + ": scale and bias must have " + std::to_string(channels) +
                              " values");
    }
    int64_t rows = batch * groups;
    if (x.numel() == 0 || rows == 0) return ok_status();
    if (rows > INT32_MAX) return invalid_argument(name_ + ": more than 2^31 groups in the batch");
    int64_t spatial = x.numel() / (batch * channels);
    if (auto a = cluster_args(in, groups, channels / groups, spatial, per_group)) {
      KILN_ASSIGN_OR_RETURN(
          bool launched,
          launch_grouped_norm_cluster(x.as<const float>(), out[0].as<float>(), *a, rows, stream_));
      if (launched) return ok_status();
    }
    grouped_norm_kernel<<<unsigned(rows), kBlock, 0, stream_>>>(
        x.as<const float>(), in[1].as<const float>(), in[2].as<const float>(), out[0].as<float>(),
        groups, channels / groups, spatial, per_group, eps_);
    return launch_status("grouped_norm_kernel");
  }

 private:
  Status execute_half(std::span<const TensorView> in, std::span<const TensorView> out) {
    const TensorView& x = in[0];
    int64_t batch = x.shape[0], channels = x.shape[1];
    int64_t groups = groups_ > 0 ? groups_ : channels;
    if (groups <= 0 || channels % groups != 0) {
      return invalid_argument(name_ + ": " + std::to_string(channels) +
                              " channels do not split into " + std::to_string(groups) + " groups");
    }
    HalfGroupedNormArgs a{};
    a.per_group = in[1].numel() != channels;
    int64_t param_n = a.per_group ? groups : channels;
    if (in[1].numel() != param_n || in[2].numel() != param_n) {
      return invalid_argument(name_ + ": scale and bias must have " + std::to_string(channels) +
                              " values");
    }
    if (out[0].dtype != x.dtype) return invalid_argument(name_ + ": Y's dtype differs from X's");
    int64_t rows = batch * groups;
    if (x.numel() == 0 || rows == 0) return ok_status();
    if (rows > INT32_MAX) return invalid_argument(name_ + ": more than 2^31 groups in the batch");
    a.scale = in[1].data, a.scale_dtype = int(in[1].dtype);
    a.bias = in[2].data, a.bias_dtype = int(in[2].dtype);
    a.groups = groups, a.cpg = channels / groups, a.spatial = x.numel() / (batch * channels);
    a.eps = eps_;
    if (auto ca = cluster_args(in, groups, a.cpg, a.spatial, a.per_group)) {
      StatusOr<bool> launched = false;
      KILN_RETURN_IF_ERROR(launch_half(x.dtype, name_, [&](auto tag) {
        using T = decltype(tag);
        launched = launch_grouped_norm_cluster(x.as<const T>(), out[0].as<T>(), *ca, rows, stream_);
      }));
      if (!launched.ok()) return launched.status();
      if (*launched) return ok_status();
    }
    KILN_RETURN_IF_ERROR(launch_half(x.dtype, name_, [&](auto tag) {
      using T = decltype(tag);
      grouped_norm_half_kernel<T>
          <<<unsigned(rows), kBlock, 0, stream_>>>(x.as<const T>(), out[0].as<T>(), a);
    }));
    return launch_status("grouped_norm_half_kernel");
  }

  // grouped_norm_cluster_kernel's arguments but the chunk, where the sizes fit its int fields.
  std::optional<ClusterNormArgs> cluster_args(std::span<const TensorView> in, int64_t groups,
                                              int64_t cpg, int64_t spatial, bool per_group) const {
    if (!clusters_ || cpg * spatial > kMaxClusterRow || groups * cpg > INT32_MAX) {
      return std::nullopt;
    }
    ClusterNormArgs a{};
    a.scale = in[1].data, a.scale_dtype = int(in[1].dtype);
    a.bias = in[2].data, a.bias_dtype = int(in[2].dtype);
    a.groups = int(groups), a.cpg = int(cpg), a.spatial = int(spatial), a.row = int(cpg * spatial);
    a.per_group = per_group, a.eps = eps_;
    return a;
  }

  int64_t groups_;  // 0: one per channel
  double eps_;
  bool clusters_;  // grouped_norm_cluster_kernel runs here
};

class LpNormKernel final : public CudaKernel {
 public:
  LpNormKernel(int64_t axis, bool l1) : CudaKernel("cuda.LpNormalization"), axis_(axis), l1_(l1) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    int rank = x.rank();
    int64_t axis = axis_ < 0 ? axis_ + rank : axis_;
    if (axis < 0 || axis >= rank) return invalid_argument(name_ + ": axis out of range");
    int64_t n = x.shape[axis], inner = 1;
    for (int d = int(axis) + 1; d < rank; ++d) inner *= x.shape[d];
    if (x.numel() == 0) return ok_status();
    int64_t lines = x.numel() / n;
    lp_norm_kernel<<<grid_for(lines), kBlock, 0, stream_>>>(x.as<const float>(), out[0].as<float>(),
                                                            lines, n, inner, l1_);
    return launch_status("lp_norm_kernel");
  }

 private:
  int64_t axis_;
  bool l1_;
};

class MvnKernel final : public CudaKernel {
 public:
  explicit MvnKernel(std::vector<int64_t> axes)
      : CudaKernel("cuda.MeanVarianceNormalization"), axes_(std::move(axes)) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    int rank = x.rank();
    if (rank > kMaxRank)
      return invalid_argument(name_ + ": rank " + std::to_string(rank) + " is above " +
                              std::to_string(kMaxRank));
    if (out[0].dtype != x.dtype || out[0].numel() != x.numel())
      return invalid_argument(name_ + ": output does not match the input");
    bool reduced[kMaxRank] = {};
    for (int64_t ax : axes_) {
      if (ax < -rank || ax >= rank)
        return invalid_argument(name_ + ": axis " + std::to_string(ax) + " is out of range");
      reduced[ax < 0 ? ax + rank : ax] = true;
    }
    int64_t strides[kMaxRank], step = 1;
    for (int d = rank - 1; d >= 0; --d) {
      strides[d] = step;
      step *= x.shape[d];
    }
    MvnGeom g{};
    g.kept_n = g.red_n = 1;
    for (int d = 0; d < rank; ++d) {
      if (reduced[d]) {
        g.rdims[g.nr] = x.shape[d], g.rstrides[g.nr++] = strides[d];
        g.red_n *= x.shape[d];
      } else {
        g.kdims[g.nk] = x.shape[d], g.kstrides[g.nk++] = strides[d];
        g.kept_n *= x.shape[d];
      }
    }
    if (x.numel() == 0) return ok_status();
    unsigned blocks = unsigned(std::min<int64_t>(g.kept_n, 65535LL * 32));
    mvn_kernel<<<blocks, kBlock, 0, stream_>>>(x.data, out[0].data, int(x.dtype), g);
    return launch_status("mvn_kernel");
  }

 private:
  std::vector<int64_t> axes_;
};

class LrnKernel final : public CudaKernel {
 public:
  LrnKernel(int64_t size, double alpha, double beta, double bias)
      : CudaKernel("cuda.LRN"), size_(size), alpha_(alpha), beta_(beta), bias_(bias) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    if (x.rank() < 2) return invalid_argument(name_ + ": X must have rank >= 2");
    if (out[0].dtype != x.dtype || out[0].numel() != x.numel())
      return invalid_argument(name_ + ": output does not match the input");
    int64_t n = x.numel();
    if (n == 0) return ok_status();
    int64_t channels = x.shape[1], spatial = n / (x.shape[0] * channels);
    int64_t lo = (size_ - 1) / 2, hi = size_ - 1 - lo;
    lrn_kernel<<<grid_for(n), kBlock, 0, stream_>>>(x.data, out[0].data, int(x.dtype), n, channels,
                                                    spatial, lo, hi, bias_, alpha_ / double(size_),
                                                    beta_);
    return launch_status("lrn_kernel");
  }

 private:
  int64_t size_;
  double alpha_, beta_, bias_;
};

// float32, float16, bfloat16 or float64 X and Y of the same dtype (MeanVarianceNormalization, LRN).
Status require_float_data(const KernelQuery& q) {
  DType x = q.input_dtype(0), y = q.output_dtype(0);
  bool ok =
      x == DType::kFloat32 || x == DType::kFloat16 || x == DType::kBFloat16 || x == DType::kFloat64;
  if (!ok || y != x) {
    return unsupported(q.node.describe() +
                       ": the CUDA kernel takes float32, float16, bfloat16 or float64 X and Y " +
                       "of one dtype, not " + std::string(dtype_name(x)) + " and " +
                       std::string(dtype_name(y)));
  }
  return ok_status();
}

// The rank of input 0, known at build time, is at least `min`.
Status require_rank(const KernelQuery& q, size_t min) {
  if (q.inputs.empty() || !q.inputs[0] || !q.inputs[0]->shape || q.inputs[0]->shape->size() < min) {
    return unsupported(q.node.describe() + ": X must have a known rank >= " + std::to_string(min));
  }
  return ok_status();
}

StatusOr<std::unique_ptr<Kernel>> make_batch_norm(const KernelQuery& q) {
  KILN_RETURN_IF_ERROR(require_float_data(q));
  KILN_RETURN_IF_ERROR(require_rank(q, 2));
  KILN_ASSIGN_OR_RETURN(float eps, q.node.attrs.get_float("epsilon", 1e-5f));
  KILN_ASSIGN_OR_RETURN(int64_t training, q.node.attrs.get_int("training_mode", 0));
  KILN_ASSIGN_OR_RETURN(int64_t spatial, q.node.attrs.get_int("spatial", 1));
  if (training != 0) {
    return unsupported(
        q.node.describe() +
        ": training_mode=1 (batch statistics, running mean and variance "
        "outputs) is not supported; the CUDA kernel normalizes with the given mean and variance");
  }
  if (spatial == 0)
    return unsupported(q.node.describe() + ": spatial=0 (per-element statistics) is not supported");
  for (size_t i = 1; i < q.outputs.size(); ++i) {
    if (q.outputs[i]) {
      return unsupported(q.node.describe() + ": output " + std::to_string(i) +
                         " (a training statistic) is not computed by the CUDA inference kernel");
    }
  }
  if (q.inputs.size() < 5) return invalid_argument(q.node.describe() + ": needs 5 inputs");
  for (size_t i = 1; i < 5; ++i) {
    if (!q.inputs[i])
      return invalid_argument(q.node.describe() + ": input " + std::to_string(i) + " is missing");
  }
  return std::unique_ptr<Kernel>(new BatchNormKernel(double(eps)));
}

StatusOr<std::unique_ptr<Kernel>> make_grouped_norm(const KernelQuery& q) {
  KILN_RETURN_IF_ERROR(require_float_data(q));
  KILN_RETURN_IF_ERROR(require_rank(q, 2));
  KILN_ASSIGN_OR_RETURN(float eps, q.node.attrs.get_float("epsilon", 1e-5f));
  int64_t groups = 0;
  if (ops::find_op(q.node.domain, q.node.op_type) == OpKind::kGroupNormalization) {
    KILN_ASSIGN_OR_RETURN(groups, q.node.attrs.get_int("num_groups", std::nullopt));
    if (groups <= 0) return invalid_argument(q.node.describe() + ": num_groups must be >= 1");
  }
  if (q.inputs.size() < 3 || !q.inputs[1] || !q.inputs[2]) {
    return invalid_argument(q.node.describe() + ": needs scale and bias");
  }
  return std::unique_ptr<Kernel>(
      new GroupedNormKernel("cuda." + q.node.op_type, groups, double(eps)));
}

StatusOr<std::unique_ptr<Kernel>> make_lp_norm(const KernelQuery& q) {
  KILN_RETURN_IF_ERROR(require_rank(q, 1));
  KILN_ASSIGN_OR_RETURN(int64_t axis, q.node.attrs.get_int("axis", -1));
  KILN_ASSIGN_OR_RETURN(int64_t p, q.node.attrs.get_int("p", 2));
  int64_t rank = int64_t(q.inputs[0]->shape->size());
  if (axis < -rank || axis >= rank)
    return invalid_argument(q.node.describe() + ": axis out of range");
  if (p != 1 && p != 2) return invalid_argument(q.node.describe() + ": p must be 1 or 2");
  return std::unique_ptr<Kernel>(new LpNormKernel(axis, p == 1));
}

StatusOr<std::unique_ptr<Kernel>> make_mvn(const KernelQuery& q) {
  KILN_RETURN_IF_ERROR(require_float_data(q));
  KILN_RETURN_IF_ERROR(require_rank(q, 1));
  int64_t rank = int64_t(q.inputs[0]->shape->size());
  if (rank > kMaxRank) {
    return unsupported(q.node.describe() + ": the CUDA kernel takes X of rank up to " +
                       std::to_string(kMaxRank));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> axes,
                        q.node.attrs.get_ints("axes", std::vector<int64_t>{0, 2, 3}));
  for (int64_t ax : axes) {
    if (ax < -rank || ax >= rank)
      return invalid_argument(q.node.describe() + ": axis " + std::to_string(ax) +
                              " is out of range");
  }
  return std::unique_ptr<Kernel>(new MvnKernel(std::move(axes)));
}

StatusOr<std::unique_ptr<Kernel>> make_lrn(const KernelQuery& q) {
  KILN_RETURN_IF_ERROR(require_float_data(q));
  KILN_RETURN_IF_ERROR(require_rank(q, 2));
  KILN_ASSIGN_OR_RETURN(int64_t size, q.node.attrs.get_int("size", std::nullopt));
  KILN_ASSIGN_OR_RETURN(float alpha, q.node.attrs.get_float("alpha", 1e-4f));
  KILN_ASSIGN_OR_RETURN(float beta, q.node.attrs.get_float("beta", 0.75f));
  KILN_ASSIGN_OR_RETURN(float bias, q.node.attrs.get_float("bias", 1.f));
  if (size <= 0) return invalid_argument(q.node.describe() + ": size must be > 0");
  return std::unique_ptr<Kernel>(new LrnKernel(size, double(alpha), double(beta), double(bias)));
}

}  // namespace

void register_channel_norm(Registry& r) {
  r.add(OpKind::kBatchNormalization, &make_batch_norm);
  r.add(OpKind::kInstanceNormalization, &make_grouped_norm);
  r.add(OpKind::kGroupNormalization, &make_grouped_norm);
  r.add(OpKind::kLpNormalization, &make_lp_norm, {.float32_only = true});
  r.add(OpKind::kMeanVarianceNormalization, &make_mvn);
  r.add(OpKind::kLRN, &make_lrn);
}

}  // namespace kiln::backends::cuda
