// kiln::BiasSoftmax on CUDA: Softmax(X + B) over the last axis, B (an attention mask, [N, 1, 1, T],
// [1, 1, S, T], [T], ...) read in the softmax's own pass: a row's bias row follows from the row
// index through B's broadcast strides over X's leading dims. The kernels are norm.cu's softmax
// kernels with the bias added as X is loaded: 16-byte vectors, a warp per row, a block per row.
#include <cfloat>
#include <type_traits>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;
constexpr int kBlock = 256;

// Where each row's bias starts: X's leading dims, merged where B's strides allow ([N, 1, 1, T]
// over [N, H, S, T] is [N, H*S] of strides [T, 0]), B's element strides over them (0 where B
// broadcasts) and B's stride along the row (1, or 0 for a B of one column).
struct BiasRows {
  int rank;
  int64_t dims[kMaxRank];
  int64_t strides[kMaxRank];
  int64_t col;

  __device__ int64_t offset(int64_t row) const { return walk_offset(row, rank, dims, strides); }
};

// X + B as the unfused Add gives it: in the compute type, rounded to T (so a float16 sum that
// overflows is inf, as the Add's output was), back in the compute type.
template <typename T>
__device__ __forceinline__ typename DNum<T>::C biased(T x, T b) {
  using N = DNum<T>;
  return N::load(N::store(N::load(x) + N::load(b)));
}

// norm.cu's softmax_vec_kernel with B: kLanes lanes a row, kVecs 16-byte vectors a lane of X and
// of B's row, each exponential computed once and kept in registers. A row whose every element is
// -inf gives NaN (-inf - -inf), as Add then Softmax do on this device.
template <typename T, int kVecs, int kLanes>
__global__ void __launch_bounds__(128)
    bias_softmax_vec_kernel(const T* x, const T* b, T* y, int64_t rows, int n, BiasRows br) {
  using N = DNum<T>;
  constexpr int kE = int(16 / sizeof(T));
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const int lane = threadIdx.x % kLanes;
  const bool live = row < rows;  // rows past the end still take part in the shuffles
  const int nv = live ? n / kE : 0;
  const uint4* xr = reinterpret_cast<const uint4*>(x + (live ? row : 0) * n);
  const uint4* bb = reinterpret_cast<const uint4*>(b + (live ? br.offset(row) : 0));
  uint4* yr = reinterpret_cast<uint4*>(y + (live ? row : 0) * n);
  float v[kVecs][kE];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int c = lane + kLanes * i;
    const uint4 u = c < nv ? xr[c] : make_uint4(0, 0, 0, 0);
    const uint4 w = c < nv ? bb[c] : make_uint4(0, 0, 0, 0);
    const T* h = reinterpret_cast<const T*>(&u);
    const T* g = reinterpret_cast<const T*>(&w);
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      v[i][e] = c < nv ? float(biased(h[e], g[e])) : -INFINITY;
      m = NanMaxReduce()(m, v[i][e]);
    }
  }
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1)
    m = NanMaxReduce()(m, __shfl_xor_sync(0xffffffffu, m, o));
  float s = 0;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const float ex = lane + kLanes * i < nv ? expf(v[i][e] - m) : 0.f;
      s += ex;
      v[i][e] = ex;
    }
  }
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const float inv = 1.0f / s;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int c = lane + kLanes * i;
    if (c >= nv) continue;
    uint4 out;
    T* oh = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int e = 0; e < kE; ++e) oh[e] = N::store(typename N::C(v[i][e] * inv));
    yr[c] = out;
  }
}

// norm.cu's softmax_warp_kernel with B: a warp per contiguous row of n <= 32 * kPer elements.
template <typename T, int kPer>
__global__ void bias_softmax_warp_kernel(const T* x, const T* b, T* y, int64_t rows, int n,
                                         BiasRows br) {
  using N = DNum<T>;
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* xr = x + row * n;
  const T* bb = b + br.offset(row);
  T* yr = y + row * n;
  float v[kPer];
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int j = lane + 32 * k;
    v[k] = j < n ? float(biased(xr[j], bb[j * br.col])) : -INFINITY;
    m = NanMaxReduce()(m, v[k]);
  }
  for (int o = 16; o > 0; o >>= 1) m = NanMaxReduce()(m, __shfl_xor_sync(0xffffffffu, m, o));
  float s = 0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    if (lane + 32 * k < n) s += expf(v[k] - m);
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const float inv = 1.0f / s;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int j = lane + 32 * k;
    if (j < n) yr[j] = N::store(typename N::C(expf(v[k] - m) * inv));
  }
}

// norm.cu's softmax_kernel with B, for any row length and float64: a block per row, the max and
// differences in the compute type, the sum of exponentials in double.
template <typename T>
__global__ void bias_softmax_block_kernel(const T* x, const T* b, T* y, int64_t n, BiasRows br) {
  using N = DNum<T>;
  using C = typename N::C;
  __shared__ double sd[32];
  __shared__ C sc[32];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * n;
  const T* bb = b + br.offset(r);
  C m = C(-INFINITY);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    m = NanMaxReduce()(m, biased(xr[j], bb[j * br.col]));
  m = block_reduce(m, NanMaxReduce(), sc, C(-INFINITY));
  double s = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    s += exp(double(biased(xr[j], bb[j * br.col]) - m));
  s = block_reduce(s, AddReduce(), sd, 0.0);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const C v = biased(xr[j], bb[j * br.col]) - m;
    y[r * n + j] = N::store(C(exp(double(v)) / s));
  }
}

// bias_softmax_vec_kernel where it applies: n a whole number of 16-byte vectors, at most 4 a lane
// (the fewest lanes of 4, 8, 16 or 32 that hold the row), B of whole rows, X, Y and B aligned
// (B's row offsets are multiples of n, so its rows are too); false (nothing launched) otherwise.
template <typename T>
bool launch_vec(const T* x, const T* b, T* y, int64_t rows, int64_t n, const BiasRows& br,
                cudaStream_t s) {
  constexpr int64_t kE = 16 / sizeof(T);
  if (n % kE != 0 || n > 32 * 4 * kE || n < 1 || br.col != 1 || !aligned16(x) || !aligned16(y) ||
      !aligned16(b)) {
    return false;
  }
  const int64_t nv = n / kE;
  auto go = [&](auto lanes) {
    constexpr int kL = decltype(lanes)::value;
    const int64_t grid = (rows + 128 / kL - 1) / (128 / kL);
    if (grid > 0x7fffffff) return false;
    bias_softmax_vec_kernel<T, 4, kL><<<unsigned(grid), 128, 0, s>>>(x, b, y, rows, int(n), br);
    return true;
  };
  if (nv <= 4 * 4) return go(std::integral_constant<int, 4>{});
  if (nv <= 8 * 4) return go(std::integral_constant<int, 8>{});
  if (nv <= 16 * 4) return go(std::integral_constant<int, 16>{});
  return go(std::integral_constant<int, 32>{});
}

// The vector kernel, else a warp per row up to 1024 elements, else a block per row.
template <typename T>
void launch(const T* x, const T* b, T* y, int64_t rows, int64_t n, const BiasRows& br,
            cudaStream_t s) {
  if constexpr (!std::is_same_v<T, double>) {
    if (launch_vec<T>(x, b, y, rows, n, br, s)) return;
    if (n <= 1024 && (rows + 7) / 8 <= 0x7fffffff / 256) {
      const unsigned grid = unsigned((rows + 7) / 8);  // 8 warps (rows) per block of 256
      auto go = [&](auto per) {
        constexpr int kPer = decltype(per)::value;
        bias_softmax_warp_kernel<T, kPer><<<grid, 256, 0, s>>>(x, b, y, rows, int(n), br);
      };
      if (n <= 128)
        go(std::integral_constant<int, 4>{});
      else if (n <= 256)
        go(std::integral_constant<int, 8>{});
      else if (n <= 512)
        go(std::integral_constant<int, 16>{});
      else
        go(std::integral_constant<int, 32>{});
      return;
    }
  }
  bias_softmax_block_kernel<T><<<unsigned(rows), kBlock, 0, s>>>(x, b, y, n, br);
}

// B's strides over X's dims (aligned from the right, 0 where B broadcasts), the leading dims
// merged where one stride follows from the next (Sp == Dd * Sd, broadcast runs included).
StatusOr<BiasRows> bias_rows(const TensorView& x, const TensorView& b, const std::string& name) {
  const int rank = x.rank(), brank = b.rank();
  if (brank > rank) return invalid_argument(name + ": B has more dims than X");
  std::vector<int64_t> stride(size_t(rank), 0);
  int64_t s = 1;
  for (int d = brank - 1; d >= 0; --d) {
    const int64_t bd = b.shape[d], xd = x.shape[rank - brank + d];
    if (bd != 1 && bd != xd) {
      return invalid_argument(name + ": B of shape " + shape_to_string(b.shape) +
                              " does not broadcast to X of shape " + shape_to_string(x.shape));
    }
    stride[size_t(rank - brank + d)] = bd == 1 ? 0 : s;
    s *= bd;
  }
  BiasRows r{};
  r.col = stride[size_t(rank - 1)];
  for (int d = 0; d + 1 < rank; ++d) {
    if (x.shape[d] == 1) continue;
    if (r.rank > 0 && r.strides[r.rank - 1] == x.shape[d] * stride[size_t(d)]) {
      r.dims[r.rank - 1] *= x.shape[d];
      r.strides[r.rank - 1] = stride[size_t(d)];
      continue;
    }
    if (r.rank == kMaxRank) return unsupported(name + ": more than 8 unmergeable leading dims");
    r.dims[r.rank] = x.shape[d];
    r.strides[r.rank] = stride[size_t(d)];
    ++r.rank;
  }
  return r;
}

class BiasSoftmaxKernel final : public CudaKernel {
 public:
  BiasSoftmaxKernel() : CudaKernel("cuda.BiasSoftmax") {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &b = in[1], &y = out[0];
    if (x.rank() == 0) return invalid_argument(name_ + ": X of rank 0");
    if (b.dtype != x.dtype || y.dtype != x.dtype) {
      return invalid_argument(name_ + ": X, B and Y of different dtypes");
    }
    const int64_t n = x.shape[x.rank() - 1];
    const int64_t rows = n == 0 ? 0 : x.numel() / n;
    if (rows == 0) return ok_status();
    if (rows > INT32_MAX) return unsupported(name_ + ": too many rows");
    KILN_ASSIGN_OR_RETURN(BiasRows br, bias_rows(x, b, name_));
    const bool known = visit_dtype<kTFloats>(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      launch<T>(x.as<const T>(), b.as<const T>(), y.as<T>(), rows, n, br, stream_);
    });
    if (!known) return unsupported(name_ + ": dtype " + std::string(dtype_name(x.dtype)));
    return launch_status("bias_softmax_kernel");
  }
};

StatusOr<std::unique_ptr<Kernel>> make_bias_softmax(const KernelQuery& q) {
  const DType t = q.input_dtype(0);
  if (!is_float(t) || dtype_size(t) < 2 || q.input_dtype(1) != t || q.output_dtype(0) != t) {
    return unsupported(q.node.describe() +
                       ": the CUDA BiasSoftmax takes X, B and Y of one of float32, float64, "
                       "float16 or bfloat16, not " +
                       std::string(dtype_name(t)) + ", " +
                       std::string(dtype_name(q.input_dtype(1))) + " to " +
                       std::string(dtype_name(q.output_dtype(0))));
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, q.node.attrs.get_int("axis", -1));
  const auto* x = q.inputs.empty() ? nullptr : q.inputs[0];
  if (axis != -1 && !(x && x->shape && axis == int64_t(x->shape->size()) - 1)) {
    return unsupported(q.node.describe() + ": the CUDA BiasSoftmax runs over the last axis only");
  }
  return std::unique_ptr<Kernel>(new BiasSoftmaxKernel());
}

}  // namespace

void register_bias_softmax(Registry& r) { r.add(OpKind::kBiasSoftmax, &make_bias_softmax); }

}  // namespace kiln::backends::cuda
