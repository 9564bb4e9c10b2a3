// Data movement kernels: Transpose, Slice and DepthToSpace as one strided gather; Concat (its
// kernel is concat_split.cu's); Gather, GatherND, CumSum and CumProd. (Resize lives in resize.cu.)
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backends/cuda/concat_split.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;

struct GatherWalk {
  int rank = 0;
  int64_t dims[kMaxRank];
  int64_t strides[kMaxRank];
  int64_t base = 0;
};

template <typename E>
__global__ void strided_gather_kernel(const E* in, E* out, GatherWalk w, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    int64_t off = w.base, r = i;
    for (int d = w.rank - 1; d >= 0; --d) {
      off += (r % w.dims[d]) * w.strides[d];
      r /= w.dims[d];
    }
    out[i] = in[off];
  }
}

// A batch of 2-D transposes, out[b][j][i] = in[b][i][j] with in's rows of `cols` elements: each
// block moves a 32x32 tile through shared memory, so reads and writes are both coalesced (the
// strided gather reads one element per row of `in` per thread, a stride of `cols` apart: the
// NCHW <-> NHWC transposes around a channels-last stack).
template <typename E>
__global__ void tiled_transpose_kernel(const E* in, E* out, int64_t rows, int64_t cols) {
  __shared__ E tile[32][33];
  const int64_t b = blockIdx.z;
  const int64_t r0 = int64_t(blockIdx.y) * 32, c0 = int64_t(blockIdx.x) * 32;
  const E* src = in + b * rows * cols;
  E* dst = out + b * rows * cols;
  for (int k = threadIdx.y; k < 32; k += blockDim.y) {
    int64_t r = r0 + k, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[k][threadIdx.x] = src[r * cols + c];
  }
  __syncthreads();
  for (int k = threadIdx.y; k < 32; k += blockDim.y) {
    int64_t c = c0 + k, r = r0 + threadIdx.x;
    if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][k];
  }
}

// tiled_transpose_kernel's faster form for batches below 2^31 elements: a tile of kT = 32 * kV
// rows and columns, each thread moving kV adjacent elements as one vector on both sides (16-bit
// elements read by two left a warp's access at 64 bytes), 32-bit index math, and kT / 8 loads in
// flight per thread. The 32x32 tile of single elements ran NCHW -> NHWC of [64,256,56,56] at 37%
// (fp16) and 57% (fp32) of the H200's copy bandwidth. The tile's rows are padded by one element:
// the column reads fall on distinct banks (fp16) or two lanes to a bank (fp32, kV = 2).
template <typename E, int kV>
__global__ void __launch_bounds__(256)
    vec_tile_transpose_kernel(const E* __restrict__ in, E* __restrict__ out, uint32_t rows,
                              uint32_t cols) {
  constexpr int kT = 32 * kV;
  struct alignas(sizeof(E) * kV) Pack {
    E v[kV];
  };
  __shared__ E tile[kT][kT + 1];
  const uint32_t base = blockIdx.z * rows * cols;
  const uint32_t r0 = blockIdx.y * kT, c0 = blockIdx.x * kT;
  const uint32_t tx = threadIdx.x * kV;
  const E* src = in + base;
  E* dst = out + base;
  // rows and cols are multiples of kV: a vector is all inside or all outside.
  if (c0 + tx < cols) {
#pragma unroll
    for (int kk = 0; kk < kT; kk += 8) {
      const int k = kk + int(threadIdx.y);
      if (r0 + k < rows) {
        const Pack p = *reinterpret_cast<const Pack*>(src + (r0 + k) * cols + c0 + tx);
#pragma unroll
        for (int v = 0; v < kV; ++v) tile[k][tx + v] = p.v[v];
      }
    }
  }
  __syncthreads();
  if (r0 + tx < rows) {
#pragma unroll
    for (int kk = 0; kk < kT; kk += 8) {
      const int k = kk + int(threadIdx.y);
      if (c0 + k < cols) {
        Pack p;
#pragma unroll
        for (int v = 0; v < kV; ++v) p.v[v] = tile[tx + v][k];
        *reinterpret_cast<Pack*>(dst + (c0 + k) * rows + r0 + tx) = p;
      }
    }
  }
}

template <typename E, int kV>
void launch_vec_tile_transpose(const void* in, void* out, int64_t rows, int64_t cols, int64_t batch,
                               cudaStream_t s) {
  constexpr int kT = 32 * kV;
  dim3 grid(unsigned((cols + kT - 1) / kT), unsigned((rows + kT - 1) / kT), unsigned(batch));
  vec_tile_transpose_kernel<E, kV><<<grid, dim3(32, 8), 0, s>>>(
      static_cast<const E*>(in), static_cast<E*>(out), uint32_t(rows), uint32_t(cols));
}

// The same transposes with fewer than 8 rows (an RGB image going channels last, [N, 3, H*W] to
// [N, H*W, 3]), where a 32x32 tile would be mostly empty: one thread per output row, reading its
// `rows` elements a column apart (coalesced across the warp) and writing them together.
template <typename E>
__global__ void few_rows_transpose_kernel(const E* in, E* out, int64_t rows, int64_t cols,
                                          int64_t n) {
  KILN_GRID_LOOP(t, n) {
    const int64_t b = t / cols, j = t - b * cols;
    const E* src = in + b * rows * cols + j;
    E* dst = out + t * rows;
    for (int64_t i = 0; i < rows; ++i) dst[i] = src[i * cols];
  }
}

// out (dims) gathers in[base + sum_d c_d * strides[d]]. Size-1 dims are dropped first.
Status strided_gather(const void* in, void* out, const std::vector<int64_t>& dims,
                      const std::vector<int64_t>& strides, int64_t base, size_t elem,
                      cudaStream_t s) {
  GatherWalk w;
  int64_t n = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    n *= dims[d];
    if (dims[d] == 1) continue;
    // Merge with the previous kept axis when contiguous in the input.
    if (w.rank > 0 && w.strides[w.rank - 1] == strides[d] * dims[d]) {
      w.dims[w.rank - 1] *= dims[d];
      w.strides[w.rank - 1] = strides[d];
      continue;
    }
    if (w.rank == kMaxRank) return unsupported("a strided copy over more than 8 axes");
    w.dims[w.rank] = dims[d];
    w.strides[w.rank] = strides[d];
    ++w.rank;
  }
  w.base = base;
  if (n == 0) return ok_status();
  // [batch,] cols x rows out of a contiguous [batch,] rows x cols: the tiled kernel.
  const int t = w.rank;
  if (base == 0 && (t == 2 || t == 3) && w.strides[t - 2] == 1 &&
      w.strides[t - 1] == w.dims[t - 2] && (t == 2 || w.strides[0] == w.dims[1] * w.dims[2]) &&
      (t == 2 || w.dims[0] <= 65535) && w.dims[t - 2] >= 8 && w.dims[t - 1] >= 8 &&
      (elem == 2 || elem == 4)) {
    const int64_t rows = w.dims[t - 1], cols = w.dims[t - 2], batch = t == 3 ? w.dims[0] : 1;
    // 16-bit elements in pairs (or fours) and 32-bit ones in pairs where rows, columns and the
    // pointers allow; the index math is 32-bit, so the whole batch stays below 2^31 elements.
    if (n < (int64_t(1) << 31) && (rows + 31) / 32 <= 65535) {
      const uintptr_t at = reinterpret_cast<uintptr_t>(in) | reinterpret_cast<uintptr_t>(out);
      auto fits = [&](int64_t v) { return rows % v == 0 && cols % v == 0 && at % (v * elem) == 0; };
      if (elem == 2 && fits(4)) {
        launch_vec_tile_transpose<uint16_t, 4>(in, out, rows, cols, batch, s);
      } else if (elem == 2 && fits(2)) {
        launch_vec_tile_transpose<uint16_t, 2>(in, out, rows, cols, batch, s);
      } else if (elem == 2) {
        launch_vec_tile_transpose<uint16_t, 1>(in, out, rows, cols, batch, s);
      } else if (fits(2)) {
        launch_vec_tile_transpose<uint32_t, 2>(in, out, rows, cols, batch, s);
      } else {
        launch_vec_tile_transpose<uint32_t, 1>(in, out, rows, cols, batch, s);
      }
      return launch_status("vec_tile_transpose_kernel");
    }
    dim3 grid(unsigned((cols + 31) / 32), unsigned((rows + 31) / 32), unsigned(batch));
    if ((rows + 31) / 32 <= 65535) {
      if (elem == 2) {
        tiled_transpose_kernel<uint16_t>
            <<<grid, dim3(32, 8), 0, s>>>((const uint16_t*)in, (uint16_t*)out, rows, cols);
      } else {
        tiled_transpose_kernel<uint32_t>
            <<<grid, dim3(32, 8), 0, s>>>((const uint32_t*)in, (uint32_t*)out, rows, cols);
      }
      return launch_status("tiled_transpose_kernel");
    }
  }
  if (base == 0 && (t == 2 || t == 3) && w.strides[t - 2] == 1 &&
      w.strides[t - 1] == w.dims[t - 2] && w.dims[t - 1] < 8 && w.dims[t - 2] >= 32 &&
      (elem == 2 || elem == 4)) {
    const int64_t rows = w.dims[t - 1], cols = w.dims[t - 2], batch = t == 3 ? w.dims[0] : 1;
    if (elem == 2) {
      few_rows_transpose_kernel<uint16_t><<<grid_for(batch * cols), 256, 0, s>>>(
          (const uint16_t*)in, (uint16_t*)out, rows, cols, batch * cols);
    } else {
      few_rows_transpose_kernel<uint32_t><<<grid_for(batch * cols), 256, 0, s>>>(
          (const uint32_t*)in, (uint32_t*)out, rows, cols, batch * cols);
    }
    return launch_status("few_rows_transpose_kernel");
  }
  // Rows contiguous in the input and 16-byte multiples (a head split [N, S, H, D] -> [N, H, S, D]
  // of D = 64 halves): moved as 16-byte vectors, one index computation per 16 bytes instead of
  // per element (BERT-base's head transposes ran at 0.5 TB/s element by element).
  const int64_t vec = 16 / int64_t(elem);
  bool wide = elem <= 8 && t >= 1 && w.strides[t - 1] == 1 && w.dims[t - 1] % vec == 0 &&
              w.base % vec == 0 && aligned16(in) && aligned16(out);
  for (int d = 0; wide && d + 1 < t; ++d) wide = w.strides[d] % vec == 0;
  if (wide) {
    GatherWalk v = w;
    v.dims[t - 1] /= vec;
    for (int d = 0; d + 1 < t; ++d) v.strides[d] /= vec;
    v.base /= vec;
    const int64_t nv = n / vec;
    strided_gather_kernel<uint4><<<grid_for(nv), 256, 0, s>>>((const uint4*)in, (uint4*)out, v, nv);
    return launch_status("strided_gather_kernel (16-byte rows)");
  }
  switch (elem) {
    case 1:
      strided_gather_kernel<uint8_t>
          <<<grid_for(n), 256, 0, s>>>((const uint8_t*)in, (uint8_t*)out, w, n);
      break;
    case 2:
      strided_gather_kernel<uint16_t>
          <<<grid_for(n), 256, 0, s>>>((const uint16_t*)in, (uint16_t*)out, w, n);
      break;
    case 4:
      strided_gather_kernel<uint32_t>
          <<<grid_for(n), 256, 0, s>>>((const uint32_t*)in, (uint32_t*)out, w, n);
      break;
    case 8:
      strided_gather_kernel<uint64_t>
          <<<grid_for(n), 256, 0, s>>>((const uint64_t*)in, (uint64_t*)out, w, n);
      break;
    default:
      return unsupported("elements of " + std::to_string(elem) + " bytes");
  }
  return launch_status("strided_gather_kernel");
}

class TransposeKernel final : public CudaKernel {
 public:
  TransposeKernel(std::vector<int64_t> perm)
      : CudaKernel("cuda.Transpose"), perm_(std::move(perm)) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    int r = in[0].rank();
    std::vector<int64_t> perm = perm_;
    if (perm.empty()) {
      for (int d = r - 1; d >= 0; --d) perm.push_back(d);
    }
    if (int(perm.size()) != r || out[0].rank() != r)
      return invalid_argument(name_ + ": perm does not match the rank");
    auto is = row_major_strides(in[0].shape);
    std::vector<int64_t> dims(r), strides(r);
    for (int d = 0; d < r; ++d) {
      if (perm[d] < 0 || perm[d] >= r) return invalid_argument(name_ + ": perm entry out of range");
      dims[d] = in[0].shape[perm[d]];
      strides[d] = is[perm[d]];
      if (dims[d] != out[0].shape[d])
        return invalid_argument(name_ + ": output shape does not match the perm");
    }
    return strided_gather(in[0].data, out[0].data, dims, strides, 0, dtype_size(in[0].dtype),
                          stream_);
  }

 private:
  std::vector<int64_t> perm_;
};

class SliceKernel final : public CudaKernel {
 public:
  SliceKernel() : CudaKernel("cuda.Slice") {}
  HostParam starts, ends, axes, steps;
  bool from_attrs = false;
  std::vector<int64_t> a_starts, a_ends, a_axes;
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    int r = x.rank();
    std::vector<int64_t> st, en, ax, sp;
    if (from_attrs) {
      st = a_starts, en = a_ends, ax = a_axes;
    } else {
      KILN_ASSIGN_OR_RETURN(st, starts.get_ints(in[1], stream_));
      KILN_ASSIGN_OR_RETURN(en, ends.get_ints(in[2], stream_));
      if (axes.present() && present(in[3])) {
        KILN_ASSIGN_OR_RETURN(ax, axes.get_ints(in[3], stream_));
      }
      if (steps.present() && present(in[4])) {
        KILN_ASSIGN_OR_RETURN(sp, steps.get_ints(in[4], stream_));
      }
    }
    size_t n = st.size();
    if (en.size() != n || (!ax.empty() && ax.size() != n) || (!sp.empty() && sp.size() != n)) {
      return invalid_argument("Slice: starts, ends, axes and steps differ in length");
    }
    auto is = row_major_strides(x.shape);
    std::vector<int64_t> first(r, 0), step(r, 1), len(x.shape.begin(), x.shape.end());
    std::vector<bool> seen(r, false);
    for (size_t i = 0; i < n; ++i) {
      int64_t axis = ax.empty() ? int64_t(i) : ax[i];
      if (axis < -r || axis >= r) return invalid_argument("Slice: axis out of range");
      if (axis < 0) axis += r;
      if (seen[axis]) return invalid_argument("Slice: an axis repeats");
      seen[axis] = true;
      int64_t stp = sp.empty() ? 1 : sp[i];
      if (stp == 0) return invalid_argument("Slice: step is 0");
      int64_t d = x.shape[axis];
      int64_t s = st[i] < 0 ? st[i] + d : st[i];
      int64_t e = en[i] < 0 ? en[i] + d : en[i];
      auto clamp = [](int64_t v, int64_t lo, int64_t hi) { return std::min(std::max(v, lo), hi); };
      int64_t count;
      if (stp > 0) {
        s = clamp(s, 0, d), e = clamp(e, 0, d);
        count = e > s ? (e - s - 1) / stp + 1 : 0;
      } else {
        s = clamp(s, 0, d - 1), e = clamp(e, -1, d - 1);
        count = s > e ? (s - e - 1) / -stp + 1 : 0;
      }
      first[axis] = s, step[axis] = stp, len[axis] = count;
    }
    int64_t base = 0;
    std::vector<int64_t> strides(r);
    for (int d = 0; d < r; ++d) {
      if (len[d] != out[0].shape[d]) {
        return invalid_argument("Slice: the output has shape " + shape_to_string(out[0].shape) +
                                " but the slice has " + std::to_string(len[d]) +
                                " elements on axis " + std::to_string(d));
      }
      base += first[d] * is[d];
      strides[d] = is[d] * step[d];
    }
    return strided_gather(x.data, out[0].data, len, strides, base, dtype_size(x.dtype), stream_);
  }
};

class DepthToSpaceKernel final : public CudaKernel {
 public:
  DepthToSpaceKernel(int64_t bs, bool crd) : CudaKernel("cuda.DepthToSpace"), bs_(bs), crd_(crd) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    if (x.rank() != 4 || bs_ < 1 || x.shape[1] % (bs_ * bs_) != 0) {
      return invalid_argument(name_ + ": needs a 4-D input whose channels divide by blocksize^2");
    }
    int64_t n = x.shape[0], c = x.shape[1] / (bs_ * bs_), h = x.shape[2], w = x.shape[3], b = bs_;
    // The input viewed as 6-D, then read in output order [n, c, h, b1, w, b2].
    std::vector<int64_t> dims = {n, c, h, b, w, b}, strides;
    if (crd_) {  // [n, c, b1, b2, h, w]
      auto s = row_major_strides(std::vector<int64_t>{n, c, b, b, h, w});
      strides = {s[0], s[1], s[4], s[2], s[5], s[3]};
    } else {  // DCR: [n, b1, b2, c, h, w]
      auto s = row_major_strides(std::vector<int64_t>{n, b, b, c, h, w});
      strides = {s[0], s[3], s[4], s[1], s[5], s[2]};
    }
    return strided_gather(x.data, out[0].data, dims, strides, 0, dtype_size(x.dtype), stream_);
  }

 private:
  int64_t bs_;
  bool crd_;
};

class ConcatKernel final : public CudaKernel {
 public:
  explicit ConcatKernel(int64_t axis) : CudaKernel("cuda.Concat"), axis_(axis) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& y = out[0];
    int r = y.rank();
    int64_t axis = axis_ < 0 ? axis_ + r : axis_;
    if (axis < 0 || axis >= r) return invalid_argument(name_ + ": axis out of range");
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= y.shape[d];
    for (int d = int(axis) + 1; d < r; ++d) inner *= y.shape[d];
    const int64_t es = int64_t(dtype_size(y.dtype));
    const int64_t out_row = y.shape[axis] * inner * es;
    int64_t offset = 0;
    pieces_.clear();
    for (const TensorView& x : in) {
      if (!present(x)) continue;
      if (x.rank() != r) return invalid_argument(name_ + ": inputs differ in rank");
      const int64_t row = x.shape[axis] * inner * es;
      pieces_.push_back(Piece{x.data, row});
      offset += row;
    }
    if (offset != out_row)
      return invalid_argument(name_ + ": the inputs do not fill the output along the axis");
    return copy_pieces(y.data, pieces_, outer, /*to_wide=*/true, stream_);
  }

 private:
  int64_t axis_;
  std::vector<Piece> pieces_;  // kept: execute does not allocate once it has grown
};

template <typename E>
__global__ void gather_kernel(const E* data, const void* idx, int idx_dtype, E* out, int64_t n,
                              int64_t nidx, int64_t d, int64_t inner) {
  KILN_GRID_LOOP(i, n) {
    int64_t in_i = i % inner, r = i / inner;
    int64_t j = r % nidx, o = r / nidx;
    int64_t k = load_as<int64_t>(idx, idx_dtype, j);
    if (k < 0) k += d;
    // Out-of-range indices cannot raise an error from the device; they read element 0.
    if (k < 0 || k >= d) k = 0;
    out[i] = data[(o * d + k) * inner + in_i];
  }
}

// gather_kernel where each gathered row (inner elements) is a whole number of 16-byte vectors and
// the tensors are 16-byte aligned: a vector a thread, one index load per vector instead of per
// element. ViT-B/16's split of its packed Q, K and V (three Gathers of a 19 MB third at batch 64)
// took 64 us each element by element.
__global__ void gather_rows_kernel(const uint4* data, const void* idx, int idx_dtype, uint4* out,
                                   int64_t vecs, int64_t nidx, int64_t d, int64_t row_vecs) {
  KILN_GRID_LOOP(vi, vecs) {
    const int64_t row = vi / row_vecs, in_v = vi - row * row_vecs;
    const int64_t o = row / nidx, j = row - o * nidx;
    int64_t k = load_as<int64_t>(idx, idx_dtype, j);
    if (k < 0) k += d;
    if (k < 0 || k >= d) k = 0;  // as gather_kernel
    out[vi] = data[(o * d + k) * row_vecs + in_v];
  }
}

class GatherKernel final : public CudaKernel {
 public:
  explicit GatherKernel(int64_t axis) : CudaKernel("cuda.Gather"), axis_(axis) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& data = in[0];
    int r = data.rank();
    int64_t axis = axis_ < 0 ? axis_ + r : axis_;
    if (r < 1 || axis < 0 || axis >= r) return invalid_argument("Gather: axis out of range");
    int64_t outer = 1, inner = 1, d = data.shape[axis], nidx = in[1].numel();
    for (int k = 0; k < axis; ++k) outer *= data.shape[k];
    for (int k = int(axis) + 1; k < r; ++k) inner *= data.shape[k];
    int64_t n = out[0].numel();
    if (n != outer * nidx * inner)
      return invalid_argument("Gather: the output shape does not match the inputs");
    if (n == 0) return ok_status();
    if (d == 0) return invalid_argument("Gather: indexing an empty axis");
    int idt = int(in[1].dtype);
    const size_t row_bytes = size_t(inner) * dtype_size(data.dtype);
    if (row_bytes % 16 == 0 && aligned16(data.data) && aligned16(out[0].data)) {
      const int64_t row_vecs = int64_t(row_bytes / 16), vecs = outer * nidx * row_vecs;
      gather_rows_kernel<<<grid_for(vecs), 256, 0, stream_>>>(
          static_cast<const uint4*>(data.data), in[1].data, idt, static_cast<uint4*>(out[0].data),
          vecs, nidx, d, row_vecs);
      return launch_status("gather_rows_kernel");
    }
    switch (dtype_size(data.dtype)) {
#define KILN_GATHER(E)                                                                     \
  gather_kernel<E><<<grid_for(n), 256, 0, stream_>>>((const E*)data.data, in[1].data, idt, \
                                                     (E*)out[0].data, n, nidx, d, inner);  \
  break
      case 1:
        KILN_GATHER(uint8_t);
      case 2:
        KILN_GATHER(uint16_t);
      case 4:
        KILN_GATHER(uint32_t);
      case 8:
        KILN_GATHER(uint64_t);
#undef KILN_GATHER
      default:
        return unsupported("Gather: dtype " + std::string(dtype_name(data.dtype)));
    }
    return launch_status("gather_kernel");
  }

 private:
  int64_t axis_;
};

struct GatherNDArgs {
  int64_t m;                 // index tuple length
  int64_t dims[kMaxRank];    // data dims indexed by a tuple
  int64_t stride[kMaxRank];  // their element strides within a batch
  int64_t slice, per_batch, batch_size;
};

template <typename E>
__global__ void gather_nd_kernel(const E* data, const int64_t* idx, E* out, GatherNDArgs a,
                                 int64_t n) {
  KILN_GRID_LOOP(i, n) {
    int64_t s = i % a.slice, t = i / a.slice;  // t: global tuple number
    int64_t b = t / a.per_batch;
    int64_t off = b * a.batch_size + s;
    for (int k = 0; k < a.m; ++k) {
      int64_t v = idx[t * a.m + k];
      if (v < 0) v += a.dims[k];
      if (v < 0 || v >= a.dims[k]) v = 0;
      off += v * a.stride[k];
    }
    out[i] = data[off];
  }
}

class GatherNDKernel final : public CudaKernel {
 public:
  explicit GatherNDKernel(int64_t b) : CudaKernel("cuda.GatherND"), b_(b) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& data = in[0];
    const TensorView& indices = in[1];
    int r = data.rank(), q = indices.rank();
    if (indices.dtype != DType::kInt64) return unsupported("GatherND: indices must be int64");
    if (q < 1 || b_ < 0 || b_ >= std::min(r, q))
      return invalid_argument("GatherND: bad batch_dims");
    GatherNDArgs a{};
    a.m = indices.shape[q - 1];
    if (a.m < 1 || a.m > r - b_ || a.m > kMaxRank)
      return invalid_argument("GatherND: bad last indices dim");
    int64_t batches = 1;
    a.slice = 1, a.per_batch = 1;
    for (int k = 0; k < b_; ++k) batches *= data.shape[k];
    for (int k = int(b_ + a.m); k < r; ++k) a.slice *= data.shape[k];
    for (int k = int(b_); k < q - 1; ++k) a.per_batch *= indices.shape[k];
    int64_t bs = a.slice;
    for (int64_t k = a.m - 1; k >= 0; --k) {
      a.stride[k] = bs;
      a.dims[k] = data.shape[b_ + k];
      bs *= data.shape[b_ + k];
    }
    a.batch_size = bs;
    int64_t n = out[0].numel();
    if (n != batches * a.per_batch * a.slice)
      return invalid_argument("GatherND: the output shape does not match");
    if (n == 0) return ok_status();
    const int64_t* idx = indices.as<const int64_t>();
    switch (dtype_size(data.dtype)) {
#define KILN_GND(E)                                                                        \
  gather_nd_kernel<E>                                                                      \
      <<<grid_for(n), 256, 0, stream_>>>((const E*)data.data, idx, (E*)out[0].data, a, n); \
  break
      case 1:
        KILN_GND(uint8_t);
      case 2:
        KILN_GND(uint16_t);
      case 4:
        KILN_GND(uint32_t);
      case 8:
        KILN_GND(uint64_t);
#undef KILN_GND
      default:
        return unsupported("GatherND: dtype " + std::string(dtype_name(data.dtype)));
    }
    return launch_status("gather_nd_kernel");
  }

 private:
  int64_t b_;
};

template <typename C>
__global__ void cumsum_kernel(const void* x, void* y, int dtype, int64_t outer, int64_t n,
                              int64_t inner, bool exclusive, bool reverse, bool prod) {
  KILN_GRID_LOOP(line, outer * inner) {
    int64_t o = line / inner, in = line % inner;
    C acc = prod ? 1 : 0;
    for (int64_t j = 0; j < n; ++j) {
      int64_t jj = reverse ? n - 1 - j : j;
      int64_t p = (o * n + jj) * inner + in;
      C v = load_as<C>(x, dtype, p);
      if (exclusive) {
        store_as<C>(y, dtype, p, acc);
        acc = prod ? C(acc * v) : C(acc + v);
      } else {
        acc = prod ? C(acc * v) : C(acc + v);
        store_as<C>(y, dtype, p, acc);
      }
    }
  }
}

class CumSumKernel final : public CudaKernel {
 public:
  CumSumKernel(bool exclusive, bool reverse, bool prod)
      : CudaKernel(prod ? "cuda.CumProd" : "cuda.CumSum"),
        exclusive_(exclusive),
        reverse_(reverse),
        prod_(prod) {}
  HostParam axis;
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    int r = x.rank();
    KILN_ASSIGN_OR_RETURN(auto av, axis.get_ints(in[1], stream_));
    if (av.size() != 1 || av[0] < -r || av[0] >= r)
      return invalid_argument("CumSum: the axis must be one value in [-rank, rank)");
    int64_t ax = av[0] < 0 ? av[0] + r : av[0];
    int64_t outer = 1, inner = 1, n = x.shape[ax];
    for (int k = 0; k < ax; ++k) outer *= x.shape[k];
    for (int k = int(ax) + 1; k < r; ++k) inner *= x.shape[k];
    if (x.numel() == 0) return ok_status();
    if (is_float(x.dtype)) {
      cumsum_kernel<double><<<grid_for(outer * inner), 256, 0, stream_>>>(
          x.data, out[0].data, int(x.dtype), outer, n, inner, exclusive_, reverse_, prod_);
    } else {
      cumsum_kernel<int64_t><<<grid_for(outer * inner), 256, 0, stream_>>>(
          x.data, out[0].data, int(x.dtype), outer, n, inner, exclusive_, reverse_, prod_);
    }
    return launch_status("cumsum_kernel");
  }

 private:
  bool exclusive_, reverse_, prod_;
};

StatusOr<std::unique_ptr<Kernel>> make_transpose(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(auto perm, q.node.attrs.get_ints("perm", std::vector<int64_t>{}));
  return std::unique_ptr<Kernel>(new TransposeKernel(perm));
}

StatusOr<std::unique_ptr<Kernel>> make_slice(const KernelQuery& q) {
  auto k = std::make_unique<SliceKernel>();
  if (q.node.attrs.has("starts")) {
    k->from_attrs = true;
    KILN_ASSIGN_OR_RETURN(k->a_starts, q.node.attrs.get_ints("starts", std::nullopt));
    KILN_ASSIGN_OR_RETURN(k->a_ends, q.node.attrs.get_ints("ends", std::nullopt));
    KILN_ASSIGN_OR_RETURN(k->a_axes, q.node.attrs.get_ints("axes", std::vector<int64_t>{}));
  } else {
    if (q.inputs.size() < 3) return invalid_argument(q.node.describe() + ": needs starts and ends");
    k->starts.init(q, 1);
    k->ends.init(q, 2);
    k->axes.init(q, 3);
    k->steps.init(q, 4);
  }
  return std::unique_ptr<Kernel>(std::move(k));
}

StatusOr<std::unique_ptr<Kernel>> make_depth_to_space(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(int64_t bs, q.node.attrs.get_int("blocksize", std::nullopt));
  KILN_ASSIGN_OR_RETURN(std::string mode, q.node.attrs.get_string("mode", "DCR"));
  if (mode != "DCR" && mode != "CRD")
    return invalid_argument(q.node.describe() + ": mode must be DCR or CRD");
  return std::unique_ptr<Kernel>(new DepthToSpaceKernel(bs, mode == "CRD"));
}

StatusOr<std::unique_ptr<Kernel>> make_concat(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, q.node.attrs.get_int("axis", std::nullopt));
  return std::unique_ptr<Kernel>(new ConcatKernel(axis));
}

StatusOr<std::unique_ptr<Kernel>> make_gather(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, q.node.attrs.get_int("axis", 0));
  return std::unique_ptr<Kernel>(new GatherKernel(axis));
}

StatusOr<std::unique_ptr<Kernel>> make_gather_nd(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(int64_t b, q.node.attrs.get_int("batch_dims", 0));
  return std::unique_ptr<Kernel>(new GatherNDKernel(b));
}

StatusOr<std::unique_ptr<Kernel>> make_cumsum(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(int64_t ex, q.node.attrs.get_int("exclusive", 0));
  KILN_ASSIGN_OR_RETURN(int64_t rev, q.node.attrs.get_int("reverse", 0));
  bool prod = ops::find_op(q.node.domain, q.node.op_type) == OpKind::kCumProd;
  auto k = std::make_unique<CumSumKernel>(ex != 0, rev != 0, prod);
  k->axis.init(q, 1);
  return std::unique_ptr<Kernel>(std::move(k));
}

}  // namespace

void register_data(Registry& r) {
  r.add(OpKind::kTranspose, &make_transpose);
  r.add(OpKind::kSlice, &make_slice);
  r.add(OpKind::kDepthToSpace, &make_depth_to_space);
  r.add(OpKind::kConcat, &make_concat);
  r.add(OpKind::kGather, &make_gather);
  r.add(OpKind::kGatherND, &make_gather_nd);
  r.add(OpKind::kCumSum, &make_cumsum);
  r.add(OpKind::kCumProd, &make_cumsum);
}

}  // namespace kiln::backends::cuda
