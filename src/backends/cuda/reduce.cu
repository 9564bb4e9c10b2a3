// The Reduce* ops (Sum, Mean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare) over any axes
// and every numeric dtype, one block per output element (float Sum/Mean/Max/Min over contiguous
// rows: a warp per row; over one strided axis: columns); Hardmax and TopK, per line along an axis.
// Numerics follow the CPU reference (cpu/reduce.cc): floats accumulate in double (float16 and
// bfloat16 rows in float), integers in int64 (wrapping), Max/Min compare in the storage type's
// range and propagate NaN, an empty reduction gives the reduction's identity.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/query_checks.h"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;
constexpr int kBlock = 256;

enum class Red : int { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kLogSum, kLogSumExp, kSumSquare };

struct ReduceArgs {
  int out_rank;  // kept (non-reduced) dims, as a walk over the input
  int64_t out_dims[kMaxRank];
  int64_t out_strides[kMaxRank];
  int red_rank;
  int64_t red_dims[kMaxRank];
  int64_t red_strides[kMaxRank];
  int64_t red_n;
  Red op;
};

struct MulOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a * b;
  }
};
struct MinNanOp {  // NaN wins, as device_util.cuh's NanMaxReduce
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return (a < b || a != a) ? a : b;
  }
};
struct FmaxOp {  // NaN ignored, as std::max(mx, v) in the reference's LogSumExp
  __device__ double operator()(double a, double b) const { return fmax(a, b); }
};

// A double result in the compute type C (integers: truncated, NaN 0, saturating).
template <typename C>
__device__ __forceinline__ C from_double(double v) {
  if constexpr (std::is_floating_point_v<C>) {
    return C(v);
  } else {
    return C(float_to_int64(v));
  }
}

template <typename T>
__global__ void reduce_kernel(const T* x, T* y, ReduceArgs a) {
  using N = DNum<T>;
  using C = typename N::C;
  constexpr bool kFloat = std::is_floating_point_v<C>;
  // Max/Min compare in K, which holds every value of C: C for floats, int64/uint64 for integers.
  using K =
      std::conditional_t<kFloat, C, std::conditional_t<std::is_signed_v<C>, int64_t, uint64_t>>;
  __shared__ K sk[32];
  __shared__ double sd[32];
  __shared__ uint64_t su[32];
  int64_t o = blockIdx.x;
  int64_t base = walk_offset(o, a.out_rank, a.out_dims, a.out_strides);
  auto at = [&](int64_t j) {
    return N::load(x[base + walk_offset(j, a.red_rank, a.red_dims, a.red_strides)]);
  };
  const Red op = a.op;
  if (op == Red::kMax || op == Red::kMin) {
    K ident;
    if constexpr (kFloat) {
      ident = op == Red::kMax ? K(-INFINITY) : K(INFINITY);
    } else {
      ident =
          op == Red::kMax ? K(std::numeric_limits<C>::lowest()) : K(std::numeric_limits<C>::max());
    }
    K best = ident;
    for (int64_t j = threadIdx.x; j < a.red_n; j += blockDim.x) {
      K v = K(at(j));
      best = op == Red::kMax ? NanMaxReduce()(best, v) : MinNanOp()(best, v);
    }
    best = op == Red::kMax ? block_reduce(best, NanMaxReduce(), sk, ident)
                           : block_reduce(best, MinNanOp(), sk, ident);
    if (threadIdx.x == 0) y[o] = N::store(C(best));
  } else if (kFloat || op == Red::kLogSum || op == Red::kLogSumExp) {
    double mx = 0;
    if (op == Red::kLogSumExp) {
      mx = -INFINITY;
      for (int64_t j = threadIdx.x; j < a.red_n; j += blockDim.x) mx = fmax(mx, double(at(j)));
      mx = block_reduce(mx, FmaxOp(), sd, double(-INFINITY));
      if (!isfinite(mx)) mx = 0;
    }
    double acc = op == Red::kProd ? 1.0 : 0.0;
    for (int64_t j = threadIdx.x; j < a.red_n; j += blockDim.x) {
      double v = double(at(j));
      switch (op) {
        case Red::kProd:
          acc *= v;
          break;
        case Red::kL1:
          acc += fabs(v);
          break;
        case Red::kL2:
        case Red::kSumSquare:
          acc += v * v;
          break;
        case Red::kLogSumExp:
          acc += exp(v - mx);
          break;
        default:
          acc += v;
          break;
      }
    }
    acc = op == Red::kProd ? block_reduce(acc, MulOp(), sd, 1.0)
                           : block_reduce(acc, AddReduce(), sd, 0.0);
    if (threadIdx.x == 0) {
      double r = acc;
      if (op == Red::kMean) r = acc / double(a.red_n);
      if (op == Red::kL2) r = sqrt(acc);
      if (op == Red::kLogSum || op == Red::kLogSumExp) r = log(acc) + mx;
      y[o] = N::store(from_double<C>(r));
    }
  } else {
    // Integers: int64 arithmetic, wrapping (kept in uint64 so that overflow is defined).
    uint64_t acc = op == Red::kProd ? 1 : 0;
    for (int64_t j = threadIdx.x; j < a.red_n; j += blockDim.x) {
      int64_t v = int64_t(at(j));
      switch (op) {
        case Red::kProd:
          acc *= uint64_t(v);
          break;
        case Red::kL1:
          acc += v < 0 ? uint64_t(0) - uint64_t(v) : uint64_t(v);
          break;
        case Red::kL2:
        case Red::kSumSquare:
          acc += uint64_t(v) * uint64_t(v);
          break;
        default:
          acc += uint64_t(v);
          break;
      }
    }
    acc = op == Red::kProd ? block_reduce(acc, MulOp(), su, uint64_t(1))
                           : block_reduce(acc, AddReduce(), su, uint64_t(0));
    if (threadIdx.x == 0) {
      int64_t r = int64_t(acc);
      if (op == Red::kMean) r = a.red_n > 0 ? r / a.red_n : 0;
      if (op == Red::kL2) r = float_to_int64(sqrt(double(r)));
      y[o] = N::store(C(r));
    }
  }
}

// Sum, Mean, Max and Min of float types over one axis (after merging) that lies outside a
// contiguous run of kept elements: y[o][i] = reduce_j x[o*outer_stride + j*red_stride + i] (a
// channels-last GlobalAveragePool: [N, H*W, C] over H*W). A block takes 32 consecutive i (reads
// coalesced across them, where one block per output read one element per 32-byte sector) and
// splits j over 8 rows of threads, combined through shared memory; sums in double as the
// reference.
template <typename T>
__global__ void column_reduce_kernel(const T* x, T* y, int64_t inner, int64_t red_n,
                                     int64_t red_stride, int64_t outer_stride, Red op) {
  using N = DNum<T>;
  __shared__ double part[8][33];
  const int64_t i = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const int64_t o = blockIdx.y;
  const bool sum = op == Red::kSum || op == Red::kMean;
  double acc = sum ? 0.0 : op == Red::kMax ? -INFINITY : INFINITY;
  if (i < inner) {
    const T* p = x + o * outer_stride + i;
    for (int64_t j = threadIdx.y; j < red_n; j += 8) {
      double v = double(N::load(p[j * red_stride]));
      acc = sum ? acc + v : op == Red::kMax ? NanMaxReduce()(acc, v) : MinNanOp()(acc, v);
    }
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || i >= inner) return;
  for (int k = 1; k < 8; ++k) {
    double v = part[k][threadIdx.x];
    acc = sum ? acc + v : op == Red::kMax ? NanMaxReduce()(acc, v) : MinNanOp()(acc, v);
  }
  if (op == Red::kMean) acc /= double(red_n);
  y[o * inner + i] = N::store(typename N::C(acc));
}

// Sum (and Mean), Max and Min of float types over contiguous rows: y[r] = reduce_j x[r*n + j],
// a group of kGroup threads (16, a warp, or the block: launch_rows says when) per row, reading
// 16 bytes a load (the row's unaligned head and tail a element at a time) with kUnroll loads in
// flight. On an H200 reduce_kernel (a block per output, 64-bit index walks, double sums) took
// 239 us for ResNet's global average pool ReduceMean [64,256,56,56] over H, W in float16 (13% of
// copy bandwidth) and 59 us for ViT's ReduceMean [64,197,768] over the last axis (37%). Sums
// accumulate in double for float32 and float64, as the reference; float16 and bfloat16 in float
// (each term exact, rounded once to the output), cheaper where double runs at a fraction of float.
// Max and Min let NaN win, as reduce_kernel.
enum class RowOp { kSum, kMax, kMin };
template <RowOp kOp, typename T, int kGroup>
__global__ void row_reduce_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows,
                                  int64_t n, bool mean) {
  using N = DNum<T>;
  using C = typename N::C;
  using A = std::conditional_t<kOp == RowOp::kSum && sizeof(T) == 2, float,
                               std::conditional_t<kOp == RowOp::kSum, double, C>>;
  // Loads in flight a thread: 8 where groups of 16 take short rows.
  constexpr int kV = int(16 / sizeof(T)), kUnroll = kGroup < 32 ? 8 : 4;
  struct alignas(16) Pack {
    T v[kV];
  };
  __shared__ A part[kGroup > 32 ? kGroup / 32 : 1];
  const A ident = kOp == RowOp::kSum ? A(0) : kOp == RowOp::kMax ? A(-INFINITY) : A(INFINITY);
  auto combine = [](A acc, A v) {
    if constexpr (kOp == RowOp::kSum) {
      return acc + v;
    } else if constexpr (kOp == RowOp::kMax) {
      return NanMaxReduce()(acc, v);
    } else {
      return MinNanOp()(acc, v);
    }
  };
  const int lane = int(threadIdx.x) % kGroup;
  const int64_t per_block = blockDim.x / kGroup;
  // Groups smaller than a warp run while their warp's first row exists (an idle group reads
  // nothing), so that the shuffles find every lane of the warp.
  const int64_t sub = kGroup < 32 ? (threadIdx.x % 32) / kGroup : 0;
  for (int64_t r = blockIdx.x * per_block + threadIdx.x / kGroup; r - sub < rows;
       r += gridDim.x * per_block) {
    const bool active = r < rows;
    const int64_t m = active ? n : 0;
    const T* p = x + (active ? r : 0) * n;
    // Elements before the row's first 16-byte boundary (rows start at any element).
    int64_t head = int64_t((16 - (reinterpret_cast<uintptr_t>(p) & 15)) & 15) / int64_t(sizeof(T));
    head = head < m ? head : m;
    const int64_t vecs = (m - head) / kV;
    const Pack* pv = reinterpret_cast<const Pack*>(p + head);
    A acc = ident;
    for (int64_t j = lane; j < head; j += kGroup) acc = combine(acc, A(N::load(p[j])));
    for (int64_t j = lane; j < vecs; j += kGroup * kUnroll) {
      Pack buf[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (j + u * kGroup < vecs) buf[u] = pv[j + u * kGroup];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (j + u * kGroup < vecs) {
#pragma unroll
          for (int e = 0; e < kV; ++e) acc = combine(acc, A(N::load(buf[u].v[e])));
        }
      }
    }
    for (int64_t j = head + vecs * kV + lane; j < m; j += kGroup) {
      acc = combine(acc, A(N::load(p[j])));
    }
    for (int o = (kGroup < 32 ? kGroup : 32) / 2; o > 0; o >>= 1) {
      acc = combine(acc, __shfl_xor_sync(0xffffffffu, acc, o));
    }
    if constexpr (kGroup > 32) {
      // One row per block: the warps' partials through shared memory.
      if (lane % 32 == 0) part[lane / 32] = acc;
      __syncthreads();
      if (lane == 0) {
        for (int w = 1; w < kGroup / 32; ++w) acc = combine(acc, part[w]);
      }
      __syncthreads();
    }
    if (lane == 0 && active) {
      if (kOp == RowOp::kSum && mean) acc /= A(n);
      y[r] = N::store(C(acc));
    }
  }
}

// Threads for a block reducing n elements: a multiple of 32, at most kBlock.
unsigned block_for(int64_t n) {
  int64_t t = (n + 31) / 32 * 32;
  return unsigned(t < 32 ? 32 : t > kBlock ? kBlock : t);
}

class ReduceKernel final : public CudaKernel {
 public:
  ReduceKernel(std::string name, Red op, std::vector<int64_t> axes, bool noop)
      : CudaKernel(std::move(name)), op_(op), axes_(std::move(axes)), noop_(noop) {}
  HostParam axes_in;
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    int rank = x.rank();
    std::vector<int64_t> axes = axes_;
    if (axes_in.present() && in.size() > 1 && present(in[1])) {
      KILN_ASSIGN_OR_RETURN(axes, axes_in.get_ints(in[1], stream_));
    }
    std::vector<bool> reduced(size_t(rank), axes.empty() && !noop_);
    for (int64_t ax : axes) {
      if (ax < -rank || ax >= rank)
        return invalid_argument(name_ + ": axis " + std::to_string(ax) + " out of range");
      reduced[size_t(ax < 0 ? ax + rank : ax)] = true;
    }
    ReduceArgs a{};
    a.op = op_;
    std::vector<int64_t> strides(size_t(rank), 1);
    for (int d = rank - 2; d >= 0; --d) strides[d] = strides[d + 1] * x.shape[d + 1];
    a.red_n = 1;
    int64_t outs = 1;
    for (int d = 0; d < rank; ++d) {
      if (reduced[d]) {
        a.red_n *= x.shape[d];
      } else {
        outs *= x.shape[d];
      }
      if (x.shape[d] == 1) continue;
      // Axes adjacent in memory and of one kind merge (H and W of a GlobalAveragePool).
      int& r = reduced[d] ? a.red_rank : a.out_rank;
      int64_t* dims = reduced[d] ? a.red_dims : a.out_dims;
      int64_t* st = reduced[d] ? a.red_strides : a.out_strides;
      if (r > 0 && st[r - 1] == strides[d] * x.shape[d]) {
        dims[r - 1] *= x.shape[d];
        st[r - 1] = strides[d];
      } else {
        dims[r] = x.shape[d], st[r++] = strides[d];
      }
    }
    if (outs != out[0].numel())
      return invalid_argument(name_ + ": the output shape does not match the axes");
    if (outs == 0) return ok_status();
    if (outs > INT32_MAX) return unsupported(name_ + ": more than 2^31 outputs");
    // Contiguous rows: one reduced run (after merging) inside each kept position.
    const bool row_op =
        op_ == Red::kSum || op_ == Red::kMean || op_ == Red::kMax || op_ == Red::kMin;
    if (row_op && a.red_rank == 1 && a.red_strides[0] == 1 && a.red_n > 0 &&
        (a.out_rank == 0 || (a.out_rank == 1 && a.out_strides[0] == a.red_n)) &&
        (dtype_bit(x.dtype) & kTFloats) != 0) {
      visit_dtype<kTFloats>(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        launch_rows<T>(static_cast<const T*>(x.data), static_cast<T*>(out[0].data), outs, a.red_n);
      });
      return launch_status("row_reduce_kernel");
    }
    const bool column =
        a.red_rank == 1 && a.out_rank >= 1 && a.out_rank <= 2 &&
        a.out_strides[a.out_rank - 1] == 1 && a.red_strides[0] > 1 &&
        (a.out_rank == 1 || a.out_dims[0] <= 65535) &&
        (op_ == Red::kSum || op_ == Red::kMean || op_ == Red::kMax || op_ == Red::kMin) &&
        (dtype_bit(x.dtype) & kTFloats) != 0;
    if (column) {
      const int64_t inner = a.out_dims[a.out_rank - 1];
      const int64_t outer = a.out_rank == 2 ? a.out_dims[0] : 1;
      const int64_t outer_stride = a.out_rank == 2 ? a.out_strides[0] : 0;
      dim3 grid(unsigned((inner + 31) / 32), unsigned(outer));
      visit_dtype<kTFloats>(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        column_reduce_kernel<T><<<grid, dim3(32, 8), 0, stream_>>>(
            static_cast<const T*>(x.data), static_cast<T*>(out[0].data), inner, a.red_dims[0],
            a.red_strides[0], outer_stride, op_);
      });
      return launch_status("column_reduce_kernel");
    }
    unsigned threads = block_for(a.red_n);
    visit_dtype<kTNumeric | kTBool>(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      reduce_kernel<T><<<unsigned(outs), threads, 0, stream_>>>(static_cast<const T*>(x.data),
                                                                static_cast<T*>(out[0].data), a);
    });
    return launch_status("reduce_kernel");
  }

 private:
  // A block per row when rows are too few to give each SM several warps and long enough (4 KiB)
  // to give each of the block's threads a load; 16 threads per row of at most 2 KiB (ViT's 768
  // float16: 11.1 us against 12.6 with a warp in a stand-alone test on an H200, the loads of all
  // rows then in flight at once); a warp per row otherwise.
  template <typename T>
  void launch_rows(const T* x, T* y, int64_t rows, int64_t n) {
    const int64_t bytes = n * int64_t(sizeof(T));
    if (rows < 2048 && bytes >= 4096) {
      launch_row_groups<T, kBlock>(x, y, rows, n);
    } else if (bytes <= 2048) {
      launch_row_groups<T, 16>(x, y, rows, n);
    } else {
      launch_row_groups<T, 32>(x, y, rows, n);
    }
  }
  template <typename T, int kGroup>
  void launch_row_groups(const T* x, T* y, int64_t rows, int64_t n) {
    const unsigned grid = grid_for(rows * kGroup);
    const bool mean = op_ == Red::kMean;
    if (op_ == Red::kMax) {
      row_reduce_kernel<RowOp::kMax, T, kGroup><<<grid, kBlock, 0, stream_>>>(x, y, rows, n, mean);
    } else if (op_ == Red::kMin) {
      row_reduce_kernel<RowOp::kMin, T, kGroup><<<grid, kBlock, 0, stream_>>>(x, y, rows, n, mean);
    } else {
      row_reduce_kernel<RowOp::kSum, T, kGroup><<<grid, kBlock, 0, stream_>>>(x, y, rows, n, mean);
    }
  }

  Red op_;
  std::vector<int64_t> axes_;
  bool noop_;
};

// ---- Hardmax: 1 at the first maximum of each line (NaN wins, as ArgMax) ----

template <typename T>
__global__ void hardmax_kernel(const T* x, T* y, int64_t n, int64_t inner, int64_t lines) {
  using N = DNum<T>;
  using C = typename N::C;
  KILN_GRID_LOOP(line, lines) {
    int64_t base = (line / inner) * n * inner + line % inner;
    int64_t best_i = 0;
    double best = double(N::load(x[base]));
    for (int64_t k = 1; k < n; ++k) {
      double v = double(N::load(x[base + k * inner]));
      if (best != best) break;
      if (v > best || v != v) {
        best = v;
        best_i = k;
      }
    }
    for (int64_t k = 0; k < n; ++k) y[base + k * inner] = N::store(C(k == best_i ? 1 : 0));
  }
}

class HardmaxKernel final : public CudaKernel {
 public:
  explicit HardmaxKernel(int64_t axis) : CudaKernel("cuda.Hardmax"), axis_(axis) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    int r = x.rank();
    int64_t axis = axis_ < 0 ? axis_ + r : axis_;
    if (r == 0) axis = 0;
    if (axis < 0 || (r > 0 && axis >= r)) return invalid_argument(name_ + ": axis out of range");
    int64_t n = r == 0 ? 1 : x.shape[axis], inner = 1;
    for (int d = int(axis) + 1; d < r; ++d) inner *= x.shape[d];
    if (x.numel() == 0 || n == 0) return ok_status();
    int64_t lines = x.numel() / n;
    visit_dtype<kTFloats>(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      hardmax_kernel<T><<<grid_for(lines), kBlock, 0, stream_>>>(
          static_cast<const T*>(x.data), static_cast<T*>(out[0].data), n, inner, lines);
    });
    return launch_status("hardmax_kernel");
  }

 private:
  int64_t axis_;
};

// ---- TopK: one block per line; each element's place is the number of elements before it ----

// The order TopK sorts in, total so that places are distinct: NaN above everything (and equal
// to NaN), ties by index.
__device__ __forceinline__ bool goes_before(double a, int64_t ia, double b, int64_t ib,
                                            bool largest) {
  bool an = a != a, bn = b != b;
  if (an || bn) {
    if (an && bn) return ia < ib;
    return largest ? an : bn;
  }
  if (a == b) return ia < ib;
  return largest ? a > b : a < b;
}

template <typename E>
__global__ void topk_kernel(const void* x, int dtype, E* values, int64_t* indices, int64_t n,
                            int64_t inner, int64_t k, bool largest) {
  __shared__ double tile[kBlock];
  int64_t line = blockIdx.x;
  int64_t o = line / inner, in = line % inner;
  int64_t base = o * n * inner + in, obase = o * k * inner + in;
  const E* xs = static_cast<const E*>(x);
  for (int64_t j0 = 0; j0 < n; j0 += blockDim.x) {
    int64_t j = j0 + threadIdx.x;
    double vj = j < n ? load_as<double>(x, dtype, base + j * inner) : 0.0;
    int64_t place = 0;
    for (int64_t i0 = 0; i0 < n; i0 += blockDim.x) {
      __syncthreads();
      int64_t i = i0 + threadIdx.x;
      tile[threadIdx.x] = i < n ? load_as<double>(x, dtype, base + i * inner) : 0.0;
      __syncthreads();
      int64_t m = n - i0 < int64_t(blockDim.x) ? n - i0 : int64_t(blockDim.x);
      if (j < n) {
        for (int64_t t = 0; t < m; ++t) place += goes_before(tile[t], i0 + t, vj, j, largest);
      }
    }
    if (j < n && place < k) {
      values[obase + place * inner] = xs[base + j * inner];
      indices[obase + place * inner] = j;
    }
  }
}

class TopKKernel final : public CudaKernel {
 public:
  TopKKernel(int64_t axis, bool largest)
      : CudaKernel("cuda.TopK"), axis_(axis), largest_(largest) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &values = out[0], &indices = out[1];
    int r = x.rank();
    int64_t axis = axis_ < 0 ? axis_ + r : axis_;
    if (axis < 0 || axis >= r || values.rank() != r)
      return invalid_argument(name_ + ": axis out of range");
    // K is fixed at build time: it is the outputs' extent along the axis.
    int64_t n = x.shape[axis], k = values.shape[axis], outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= x.shape[d];
    for (int d = int(axis) + 1; d < r; ++d) inner *= x.shape[d];
    if (k > n || indices.numel() != values.numel() || values.numel() != outer * k * inner) {
      return invalid_argument(name_ + ": outputs do not hold K elements along the axis");
    }
    int64_t lines = outer * inner;
    if (lines == 0 || k == 0) return ok_status();
    if (lines > INT32_MAX) return unsupported(name_ + ": more than 2^31 lines");
    unsigned threads = block_for(n);
    switch (dtype_size(x.dtype)) {
      case 1:
        launch<uint8_t>(x, values, indices, n, inner, k, lines, threads);
        break;
      case 2:
        launch<uint16_t>(x, values, indices, n, inner, k, lines, threads);
        break;
      case 4:
        launch<uint32_t>(x, values, indices, n, inner, k, lines, threads);
        break;
      case 8:
        launch<uint64_t>(x, values, indices, n, inner, k, lines, threads);
        break;
      default:
        return unsupported(name_ + ": dtype " + std::string(dtype_name(x.dtype)));
    }
    return launch_status("topk_kernel");
  }

 private:
  template <typename E>
  void launch(const TensorView& x, const TensorView& values, const TensorView& indices, int64_t n,
              int64_t inner, int64_t k, int64_t lines, unsigned threads) {
    topk_kernel<E><<<unsigned(lines), threads, 0, stream_>>>(
        x.data, int(x.dtype), static_cast<E*>(values.data), indices.as<int64_t>(), n, inner, k,
        largest_);
  }
  int64_t axis_;
  bool largest_;
};

// ---- factories ----

Status require_dtype(const KernelQuery& q, unsigned set, DType t) {
  if ((dtype_bit(t) & set) == 0) {
    return unsupported(q.node.describe() + ": dtype " + std::string(dtype_name(t)) +
                       " is not supported on CUDA");
  }
  return ok_status();
}

StatusOr<std::unique_ptr<Kernel>> make_reduce(const KernelQuery& q) {
  Red op;
  switch (ops::find_op(q.node.domain, q.node.op_type)) {
    case OpKind::kReduceSum:
      op = Red::kSum;
      break;
    case OpKind::kReduceMean:
      op = Red::kMean;
      break;
    case OpKind::kReduceMax:
      op = Red::kMax;
      break;
    case OpKind::kReduceMin:
      op = Red::kMin;
      break;
    case OpKind::kReduceProd:
      op = Red::kProd;
      break;
    case OpKind::kReduceL1:
      op = Red::kL1;
      break;
    case OpKind::kReduceL2:
      op = Red::kL2;
      break;
    case OpKind::kReduceLogSum:
      op = Red::kLogSum;
      break;
    case OpKind::kReduceLogSumExp:
      op = Red::kLogSumExp;
      break;
    case OpKind::kReduceSumSquare:
      op = Red::kSumSquare;
      break;
    default:
      return unsupported(q.node.describe() + ": not a reduction");
  }
  KILN_RETURN_IF_ERROR(require_dtype(q, kTNumeric | kTBool, q.input_dtype(0)));
  if (q.output_dtype(0) != q.input_dtype(0)) {
    return invalid_argument(q.node.describe() + ": the output dtype differs from the input's");
  }
  if (q.inputs.empty() || !q.inputs[0] || !q.inputs[0]->shape ||
      q.inputs[0]->shape->size() > size_t(kMaxRank)) {
    return unsupported(q.node.describe() + ": the CUDA reductions need a known rank of at most " +
                       std::to_string(kMaxRank));
  }
  KILN_ASSIGN_OR_RETURN(auto axes, q.node.attrs.get_ints("axes", std::vector<int64_t>{}));
  KILN_ASSIGN_OR_RETURN(int64_t noop, q.node.attrs.get_int("noop_with_empty_axes", 0));
  auto kernel = std::make_unique<ReduceKernel>("cuda." + q.node.op_type, op, axes, noop != 0);
  if (!q.node.attrs.has("axes")) {
    if (!host_readable(q, 1)) {
      return unsupported(
          q.node.describe() +
          ": axes computed on the device; the CUDA reductions read them on the host");
    }
    kernel->axes_in.init(q, 1);
  }
  return std::unique_ptr<Kernel>(std::move(kernel));
}

StatusOr<std::unique_ptr<Kernel>> make_hardmax(const KernelQuery& q) {
  KILN_RETURN_IF_ERROR(require_dtype(q, kTFloats, q.input_dtype(0)));
  KILN_ASSIGN_OR_RETURN(int64_t axis, q.node.attrs.get_int("axis", -1));
  return std::unique_ptr<Kernel>(new HardmaxKernel(axis));
}

StatusOr<std::unique_ptr<Kernel>> make_topk(const KernelQuery& q) {
  KILN_RETURN_IF_ERROR(require_dtype(q, kTNumeric, q.input_dtype(0)));
  if (q.output_dtype(1) != DType::kInt64)
    return invalid_argument(q.node.describe() + ": indices must be int64");
  if (q.outputs.size() < 2 || !q.outputs[0] || !q.outputs[1]) {
    return unsupported(q.node.describe() +
                       ": the CUDA TopK writes both outputs; both must be present");
  }
  // K from data sizes the outputs only when the run reads it: cuda.host.TopK runs that case.
  const ir::Value* k = q.inputs.size() > 1 ? q.inputs[1] : nullptr;
  if (k && !k->constant && !k->sym_value) {
    return unsupported(q.node.describe() + ": K ('" + k->name +
                       "') comes from data; cuda.host.TopK runs it");
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, q.node.attrs.get_int("axis", -1));
  KILN_ASSIGN_OR_RETURN(int64_t largest, q.node.attrs.get_int("largest", 1));
  return std::unique_ptr<Kernel>(new TopKKernel(axis, largest != 0));
}

// ---- ArgMax / ArgMin ----

// The CPU reference's arg_best: a NaN wins and stops the scan; ties keep the first index unless
// select_last_index.
template <bool kMax>
__global__ void arg_kernel(const void* x, int dtype, int64_t* out, int64_t n, int64_t inner,
                           bool last, int64_t lines) {
  KILN_GRID_LOOP(line, lines) {
    int64_t base = (line / inner) * n * inner + line % inner;
    int64_t best_i = 0;
    double best = load_as<double>(x, dtype, base);
    for (int64_t k = 1; k < n; ++k) {
      double v = load_as<double>(x, dtype, base + k * inner);
      if (best != best) break;
      bool better = kMax ? (v > best) : (v < best);
      if (better || v != v || (last && v == best)) {
        best = v;
        best_i = k;
      }
    }
    out[line] = best_i;
  }
}

class ArgKernel final : public CudaKernel {
 public:
  ArgKernel(std::string name, bool is_max, int64_t axis, bool last)
      : CudaKernel(std::move(name)), max_(is_max), axis_(axis), last_(last) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    int r = x.rank();
    int64_t axis = axis_ < 0 ? axis_ + r : axis_;
    if (axis < 0 || axis >= r) return invalid_argument(name_ + ": axis out of range");
    int64_t n = x.shape[axis], inner = 1, outer = 1;
    for (int d = 0; d < axis; ++d) outer *= x.shape[d];
    for (int d = int(axis) + 1; d < r; ++d) inner *= x.shape[d];
    int64_t lines = outer * inner;
    if (out[0].numel() != lines)
      return invalid_argument(name_ + ": the output does not match the reduced input");
    if (lines == 0) return ok_status();
    if (n == 0) return invalid_argument(name_ + ": the reduced axis is empty");
    if (max_) {
      arg_kernel<true><<<grid_for(lines), kBlock, 0, stream_>>>(
          x.data, int(x.dtype), out[0].as<int64_t>(), n, inner, last_, lines);
    } else {
      arg_kernel<false><<<grid_for(lines), kBlock, 0, stream_>>>(
          x.data, int(x.dtype), out[0].as<int64_t>(), n, inner, last_, lines);
    }
    return launch_status("arg_kernel");
  }

 private:
  bool max_;
  int64_t axis_;
  bool last_;
};

StatusOr<std::unique_ptr<Kernel>> make_arg(const KernelQuery& q) {
  DType t = q.input_dtype(0);
  if (!is_integer(t) && !is_float(t) && t != DType::kBool) {
    return unsupported(q.node.describe() + ": dtype " + std::string(dtype_name(t)) +
                       " is not supported");
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, q.node.attrs.get_int("axis", 0));
  KILN_ASSIGN_OR_RETURN(int64_t last, q.node.attrs.get_int("select_last_index", 0));
  bool is_max = ops::find_op(q.node.domain, q.node.op_type) == OpKind::kArgMax;
  return std::unique_ptr<Kernel>(new ArgKernel("cuda." + q.node.op_type, is_max, axis, last != 0));
}

}  // namespace

void register_reduce(Registry& r) {
  for (OpKind k : {OpKind::kReduceSum, OpKind::kReduceMean, OpKind::kReduceMax, OpKind::kReduceMin,
                   OpKind::kReduceProd, OpKind::kReduceL1, OpKind::kReduceL2, OpKind::kReduceLogSum,
                   OpKind::kReduceLogSumExp, OpKind::kReduceSumSquare}) {
    r.add(k, &make_reduce);
  }
  r.add(OpKind::kHardmax, &make_hardmax);
  r.add(OpKind::kTopK, &make_topk);
  r.add(OpKind::kArgMax, &make_arg);
  r.add(OpKind::kArgMin, &make_arg);
}

}  // namespace kiln::backends::cuda
