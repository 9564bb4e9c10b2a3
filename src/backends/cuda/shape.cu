// The shape op family's copy kernels on CUDA (the CPU reference is cpu/shape.cc): Split (through
// concat_split.cu), Tile, Pad and copy_window (one per-axis source map), SpaceToDepth (a strided
// gather) and Trilu. Copies dispatch on the element size, so every dtype works. Small parameters
// (Pad's pads, Trilu's k) are read where they live: host-readable ones on the host, the rest on the
// device by the kernel, so execute never synchronizes. GatherElements, ScatterElements and OneHot
// are in index.cu, ArgMax/ArgMin in reduce.cu.
#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cuda/concat_split.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/query_checks.h"
#include "core/checked.h"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;
constexpr int kBlock = 256;

// ---- Split ----

class SplitKernel final : public CudaKernel {
 public:
  explicit SplitKernel(int64_t axis) : CudaKernel("cuda.Split"), axis_(axis) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    int r = x.rank();
    int64_t axis = axis_ < 0 ? axis_ + r : axis_;
    if (axis < 0 || axis >= r) return invalid_argument(name_ + ": axis out of range");
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= x.shape[d];
    for (int d = int(axis) + 1; d < r; ++d) inner *= x.shape[d];
    const int64_t es = int64_t(dtype_size(x.dtype));
    const int64_t in_row = x.shape[axis] * inner * es;
    int64_t offset = 0;
    pieces_.clear();
    for (const TensorView& y : out) {
      if (y.rank() != r) return invalid_argument(name_ + ": an output differs in rank");
      const int64_t row = y.shape[axis] * inner * es;
      pieces_.push_back(Piece{y.data, row});
      offset += row;
    }
    if (offset != in_row)
      return invalid_argument(name_ + ": the outputs do not add up to the input along the axis");
    return copy_pieces(x.data, pieces_, outer, /*to_wide=*/false, stream_);
  }

 private:
  int64_t axis_;
  std::vector<Piece> pieces_;  // kept: execute does not allocate once it has grown
};

// ---- Tile and Pad: out[c] = in[src_0(c_0), ...], or the fill where a source is outside ----

enum class PadMode { kConstant, kReflect, kEdge, kWrap };

struct AxisMapArgs {
  int rank;
  int64_t out_dims[kMaxRank];
  int64_t in_dims[kMaxRank];
  int64_t in_strides[kMaxRank];
  int64_t begin[kMaxRank];
  int mode;  // PadMode
};

// Source index of output position j of a padded axis, or -1 for the fill (the CPU's pad_source).
__device__ __forceinline__ int64_t pad_source(int64_t j, int64_t begin, int64_t d, PadMode mode) {
  int64_t s = j - begin;
  if (s >= 0 && s < d) return s;
  if (mode == PadMode::kConstant) return -1;
  if (mode == PadMode::kEdge) return s < 0 ? 0 : d - 1;
  if (mode == PadMode::kWrap) return ((s % d) + d) % d;
  if (d == 1) return 0;  // reflect
  int64_t period = 2 * (d - 1);
  int64_t t = ((s % period) + period) % period;
  return t < d ? t : period - t;
}

template <typename E>
__global__ void axis_map_kernel(const E* in, E* out, const E* fill_ptr, E fill, AxisMapArgs a,
                                int64_t n) {
  KILN_GRID_LOOP(i, n) {
    int64_t r = i, off = 0;
    bool inside = true;
    for (int d = a.rank - 1; d >= 0; --d) {
      int64_t j = r % a.out_dims[d];
      r /= a.out_dims[d];
      int64_t s = pad_source(j, a.begin[d], a.in_dims[d], PadMode(a.mode));
      if (s < 0) inside = false;
      off += s * a.in_strides[d];
    }
    out[i] = inside ? in[off] : (fill_ptr ? *fill_ptr : fill);
  }
}

Status launch_axis_map(const TensorView& x, const TensorView& y, std::span<const int64_t> begin,
                       PadMode mode, const void* fill_ptr, uint64_t fill_bits,
                       const std::string& name, cudaStream_t s) {
  int r = x.rank();
  if (r > kMaxRank) return unsupported(name + ": more than 8 axes");
  AxisMapArgs a{};
  a.rank = r;
  a.mode = int(mode);
  auto st = row_major_strides(x.shape);
  for (int d = 0; d < r; ++d) {
    a.out_dims[d] = y.shape[d], a.in_dims[d] = x.shape[d], a.in_strides[d] = st[d],
    a.begin[d] = begin[d];
  }
  int64_t n = y.numel();
  if (n == 0) return ok_status();
  return by_element_size(dtype_size(x.dtype), name, [&](auto tag) {
    using E = decltype(tag);
    E fill;
    std::memcpy(&fill, &fill_bits, sizeof(E));
    axis_map_kernel<E><<<grid_for(n), kBlock, 0, s>>>(static_cast<const E*>(x.data),
                                                      static_cast<E*>(y.data),
                                                      static_cast<const E*>(fill_ptr), fill, a, n);
  });
}

// n / d for n < 2^31 as a multiply-high, an add and a shift (Granlund and Montgomery's magic
// numbers, as PyTorch's IntDivider).
struct FastDiv {
  uint32_t d, m, s;
};

FastDiv make_fast_div(uint32_t d) {
  FastDiv f{d, 0, 0};
  while ((uint64_t(1) << f.s) < d) ++f.s;
  f.m = uint32_t((uint64_t(1) << 32) * ((uint64_t(1) << f.s) - d) / d + 1);
  return f;
}

__device__ __forceinline__ uint32_t fast_div(uint32_t n, const FastDiv& f) {
  return (__umulhi(n, f.m) + n) >> f.s;
}

// A constant Pad after merging adjacent unpadded axes: the output's rows (its merged last axis)
// over the merged outer axes, every size below 2^30.
struct PadRowsArgs {
  int axes;                    // outer axes
  FastDiv out_dims[kMaxRank];  // the output's outer dims
  uint32_t in_dims[kMaxRank];  // the input's
  int32_t begin[kMaxRank];     // where the input starts on each (negative crops)
  uint32_t in_rows[kMaxRank];  // input rows per step along each
  FastDiv chunks;              // vectors per output row
  int32_t in_w, begin_w;       // the rows' axis
};

// The input row output row `row` reads, and whether it has one (inside; 0 is returned where not).
// The merged outer axes only: an NCHW pad of H and W has two (N*C and H).
__device__ __forceinline__ uint32_t pad_source_row(const PadRowsArgs& a, uint32_t row,
                                                   bool& inside) {
  uint32_t src_row = 0;
  inside = true;
  for (int d = a.axes - 1; d >= 0; --d) {
    const uint32_t q = fast_div(row, a.out_dims[d]);
    const int32_t c = int32_t(row - q * a.out_dims[d].d) - a.begin[d];
    row = q;
    inside = inside && uint32_t(c) < a.in_dims[d];
    src_row += uint32_t(c) * a.in_rows[d];  // wraps where outside; used only inside
  }
  return inside ? src_row : 0u;
}

// Constant Pad (NCHW's 1-pixel border: [64,96,56,56] fp16 took 209 us through the per-axis map, 12%
// of the H200's copy bandwidth, for a division per axis and element). Each thread writes kC
// adjacent elements of one output row, found with magic-number divisions once per vector: the
// row's source row (or none: all fill), then its kC sources, as one vector when kVecRead (the row
// shift and the input's rows are whole vectors) or element by element.
template <typename E, int kC, bool kVecRead>
__global__ void pad_rows_kernel(const E* __restrict__ in, E* __restrict__ out, const E* fill_ptr,
                                E fill, PadRowsArgs a, uint32_t total) {
  struct alignas(sizeof(E) * kC) Pack {
    E v[kC];
  };
  const E f = fill_ptr ? *fill_ptr : fill;
  // total < 2^30 and the grid has at most 2^29 threads: i + stride stays below 2^31.
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const uint32_t row = fast_div(i, a.chunks);
    const int32_t j = int32_t(i - row * a.chunks.d) * kC - a.begin_w;  // source of the first
    bool inside;
    const E* src = in + pad_source_row(a, row, inside) * uint32_t(a.in_w);
    Pack p;
    if constexpr (kVecRead) {
      if (inside && uint32_t(j) < uint32_t(a.in_w)) {
        p = *reinterpret_cast<const Pack*>(src + j);
      } else {
#pragma unroll
        for (int k = 0; k < kC; ++k) p.v[k] = f;
      }
    } else {
#pragma unroll
      for (int k = 0; k < kC; ++k) {
        const int32_t s = j + k;
        p.v[k] = inside && uint32_t(s) < uint32_t(a.in_w) ? src[s] : f;
      }
    }
    reinterpret_cast<Pack*>(out)[i] = p;
  }
}

// pad_rows_kernel's form for rows that do not split into 16-byte vectors (the 58-element rows of
// a 56-pixel NCHW image padded by one: float16 went 4 bytes a thread, 52% of the copy rate): a
// thread writes 16 bytes of the flattened output (out_w.d * rows of them, a multiple of kC),
// starting wherever they fall in a row and moving to the next row's source where they cross one.
// The reads are element by element.
template <typename E, int kC>
__global__ void pad_flat_kernel(const E* __restrict__ in, E* __restrict__ out, const E* fill_ptr,
                                E fill, PadRowsArgs a, FastDiv out_w, uint32_t total) {
  struct alignas(sizeof(E) * kC) Pack {
    E v[kC];
  };
  const E f = fill_ptr ? *fill_ptr : fill;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    uint32_t row = fast_div(i * kC, out_w);
    uint32_t col = i * kC - row * out_w.d;
    bool inside;
    const E* src = in + pad_source_row(a, row, inside) * uint32_t(a.in_w);
    Pack p;
#pragma unroll
    for (int k = 0; k < kC; ++k) {
      if (col == out_w.d) {
        col = 0;
        src = in + pad_source_row(a, ++row, inside) * uint32_t(a.in_w);
      }
      const int32_t s = int32_t(col) - a.begin_w;
      p.v[k] = inside && uint32_t(s) < uint32_t(a.in_w) ? src[s] : f;
      ++col;
    }
    reinterpret_cast<Pack*>(out)[i] = p;
  }
}

// The row kernel for a constant Pad where every size and pad is below 2^30 (and the rank at most
// kMaxRank); false where it does not apply (the per-axis map then pads).
bool pad_rows_fits(const TensorView& x, const TensorView& y, std::span<const int64_t> begin) {
  constexpr int64_t kSmall = int64_t(1) << 30;
  if (x.rank() < 1 || x.rank() > kMaxRank || x.numel() >= kSmall || y.numel() >= kSmall) {
    return false;
  }
  for (int64_t b : begin) {
    if (b <= -kSmall || b >= kSmall) return false;
  }
  return true;
}

Status launch_pad_rows(const TensorView& x, const TensorView& y, std::span<const int64_t> begin,
                       const void* fill_ptr, uint64_t fill_bits, const std::string& name,
                       cudaStream_t s) {
  // Merge runs of unpadded axes (one contiguous block in both tensors); the last merged axis holds
  // the rows.
  int64_t in_d[kMaxRank], out_d[kMaxRank], bg[kMaxRank];
  int m = 0;
  bool last_unpadded = false;
  for (int k = 0; k < x.rank(); ++k) {
    const bool unpadded = begin[k] == 0 && x.shape[k] == y.shape[k];
    if (unpadded && last_unpadded) {
      in_d[m - 1] *= x.shape[k], out_d[m - 1] *= y.shape[k];
    } else {
      in_d[m] = x.shape[k], out_d[m] = y.shape[k], bg[m] = begin[k];
      ++m;
    }
    last_unpadded = unpadded;
  }
  const int64_t total_elems = y.numel();
  if (total_elems == 0) return ok_status();
  PadRowsArgs a{};
  a.axes = m - 1;
  a.in_w = int32_t(in_d[m - 1]), a.begin_w = int32_t(bg[m - 1]);
  uint32_t rows = 1;
  for (int d = m - 2; d >= 0; --d) {
    a.out_dims[d] = make_fast_div(uint32_t(out_d[d]));
    a.in_dims[d] = uint32_t(in_d[d]);
    a.begin[d] = int32_t(bg[d]);
    a.in_rows[d] = rows;
    rows *= uint32_t(in_d[d]);  // below 2^30: x.numel() is, unless a dim is 0 (then it stays 0)
  }
  const int64_t out_w = out_d[m - 1];
  const size_t es = dtype_size(x.dtype);
  const uintptr_t xa = reinterpret_cast<uintptr_t>(x.data),
                  ya = reinterpret_cast<uintptr_t>(y.data);
  return by_element_size(
      es, name,
      [&](auto tag) {
        using E = decltype(tag);
        E fill;
        std::memcpy(&fill, &fill_bits, sizeof(E));
        const auto* src = static_cast<const E*>(x.data);
        auto* dst = static_cast<E*>(y.data);
        const auto* f = static_cast<const E*>(fill_ptr);
        // The widest vector (up to 16 bytes) that output rows split into, aligned.
        auto go = [&](auto c) {
          constexpr int kC = decltype(c)::value;
          const int64_t vb = int64_t(sizeof(E)) * kC;
          if (out_w % kC != 0 || ya % vb != 0) return false;
          a.chunks = make_fast_div(uint32_t(out_w / kC));
          const uint32_t total = uint32_t(total_elems / kC);
          if (a.in_w % kC == 0 && a.begin_w % kC == 0 && xa % vb == 0) {
            pad_rows_kernel<E, kC, true>
                <<<grid_for(total), kBlock, 0, s>>>(src, dst, f, fill, a, total);
          } else {
            pad_rows_kernel<E, kC, false>
                <<<grid_for(total), kBlock, 0, s>>>(src, dst, f, fill, a, total);
          }
          return true;
        };
        constexpr int kMax = int(16 / sizeof(E));
        if (go(std::integral_constant<int, kMax>{})) return;
        // Rows that do not split into 16-byte vectors: the flattened output does unless the
        // half-width row vectors can read whole vectors too.
        constexpr int kHalf = kMax / 2 > 0 ? kMax / 2 : 1;
        const bool half_reads = out_w % kHalf == 0 && a.in_w % kHalf == 0 &&
                                a.begin_w % kHalf == 0 && xa % (sizeof(E) * kHalf) == 0;
        if (kMax > 1 && !half_reads && total_elems % kMax == 0 && ya % 16 == 0) {
          const uint32_t total = uint32_t(total_elems / kMax);
          pad_flat_kernel<E, kMax><<<grid_for(total), kBlock, 0, s>>>(
              src, dst, f, fill, a, make_fast_div(uint32_t(out_w)), total);
          return;
        }
        if constexpr (kMax >= 4) {
          if (go(std::integral_constant<int, kMax / 2>{})) return;
        }
        if constexpr (kMax >= 8) {
          if (go(std::integral_constant<int, kMax / 4>{})) return;
        }
        go(std::integral_constant<int, 1>{});
      },
      "pad_rows_kernel");
}

class TileKernel final : public CudaKernel {
 public:
  TileKernel() : CudaKernel("cuda.Tile") {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &y = out[0];
    int r = x.rank();
    if (y.rank() != r) return invalid_argument(name_ + ": the output differs in rank");
    for (int d = 0; d < r; ++d) {
      if (x.shape[d] == 0 ? y.shape[d] != 0 : y.shape[d] % x.shape[d] != 0) {
        return invalid_argument(name_ + ": output " + shape_to_string(y.shape) +
                                " does not tile input " + shape_to_string(x.shape));
      }
    }
    // The repeats are the output's dims over the input's: wrapping from 0 reads them.
    std::vector<int64_t> begin(size_t(r), 0);
    return launch_axis_map(x, y, begin, PadMode::kWrap, nullptr, 0, name_, stream_);
  }
};

class PadKernel final : public CudaKernel {
 public:
  PadKernel(PadMode mode, uint64_t fill_bits)
      : CudaKernel("cuda.Pad"), mode_(mode), fill_bits_(fill_bits) {}
  HostParam pads_in, axes_in;
  std::vector<int64_t> pads_attr;  // opset < 11
  bool from_attr = false;
  // The pads are computed on the device at run time: the output is data-dependent, its view has
  // the shape of its bound, and the kernel writes the shape the pads give from the view's start.
  // Reading the pads is the one synchronization (HostParam::get_ints), which the run makes at such
  // a layer anyway to learn the shape.
  bool sized = false;

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    TensorView y = out[0];
    int r = x.rank();
    valid_ = false;
    std::vector<int64_t> pads = pads_attr, axes;
    if (!from_attr && pads_in.present() && present(in[1])) {
      KILN_ASSIGN_OR_RETURN(pads, pads_in.get_ints(in[1], stream_));
    }
    if (axes_in.present() && in.size() > 3 && present(in[3])) {
      KILN_ASSIGN_OR_RETURN(axes, axes_in.get_ints(in[3], stream_));
      for (int64_t& k : axes) {
        if (k < -r || k >= r) return invalid_argument(name_ + ": axis out of range");
        if (k < 0) k += r;
      }
    } else {
      for (int k = 0; k < r; ++k) axes.push_back(k);
    }
    if (pads.size() != 2 * axes.size() || y.rank() != r)
      return invalid_argument(name_ + ": pads do not match the rank");
    std::vector<int64_t> begin(size_t(r), 0), end(size_t(r), 0);
    for (size_t i = 0; i < axes.size(); ++i) {
      begin[axes[i]] += pads[i];
      end[axes[i]] += pads[i + axes.size()];
    }
    if (sized) {
      shape_.assign(size_t(r), 0);
      for (int k = 0; k < r; ++k) {
        auto grown = checked_add(x.shape[k], begin[k]);
        if (grown) grown = checked_add(*grown, end[k]);
        if (!grown || *grown < 0) {
          return invalid_argument(name_ + ": dim " + std::to_string(k) + " of " +
                                  std::to_string(x.shape[k]) + " padded by " +
                                  std::to_string(begin[k]) + " and " + std::to_string(end[k]) +
                                  " is no size");
        }
        if (*grown > y.shape[k]) {
          return internal_error(name_ + ": dim " + std::to_string(k) + " padded to " +
                                std::to_string(*grown) + ", past the " +
                                std::to_string(y.shape[k]) + " the plan bounds it by");
        }
        shape_[size_t(k)] = *grown;
      }
      y.shape = shape_;
    }
    for (int k = 0; k < r; ++k) {
      if (x.shape[k] + begin[k] + end[k] != y.shape[k]) {
        return invalid_argument(name_ + ": output " + shape_to_string(y.shape) +
                                " does not match the pads");
      }
      if (mode_ != PadMode::kConstant && x.shape[k] == 0 && y.shape[k] > 0) {
        return invalid_argument(name_ + ": cannot pad an empty axis except with a constant");
      }
    }
    const void* fill_ptr =
        in.size() > 2 && present(in[2]) && in[2].numel() > 0 ? in[2].data : nullptr;
    // A constant pad of the innermost axis alone (an NHWC stem's channels): whole rows, without
    // the per-axis map's division per axis and element.
    bool inner_only = mode_ == PadMode::kConstant && r >= 1;
    for (int k = 0; k + 1 < r; ++k) inner_only = inner_only && begin[k] == 0 && end[k] == 0;
    if (inner_only) {
      KILN_RETURN_IF_ERROR(
          pad_last_axis(x, y, begin[size_t(r - 1)], fill_ptr, fill_bits_, stream_));
    } else if (mode_ == PadMode::kConstant && pad_rows_fits(x, y, begin)) {
      KILN_RETURN_IF_ERROR(launch_pad_rows(x, y, begin, fill_ptr, fill_bits_, name_, stream_));
    } else {
      KILN_RETURN_IF_ERROR(
          launch_axis_map(x, y, begin, mode_, fill_ptr, fill_bits_, name_, stream_));
    }
    valid_ = sized;
    return ok_status();
  }

  StatusOr<Shape> data_dependent_shape(size_t output) const override {
    if (!valid_ || output != 0) return Kernel::data_dependent_shape(output);
    return shape_;
  }

 private:
  PadMode mode_;
  uint64_t fill_bits_;  // the `value` attribute (opset < 11) as the data's bytes
  Shape shape_;
  bool valid_ = false;
};

// ---- SpaceToDepth: a strided gather ----

struct Walk {
  int rank;
  int64_t dims[kMaxRank];
  int64_t strides[kMaxRank];
};

template <typename E>
__global__ void strided_copy_kernel(const E* in, E* out, Walk w, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    int64_t r = i, off = 0;
    for (int d = w.rank - 1; d >= 0; --d) {
      off += (r % w.dims[d]) * w.strides[d];
      r /= w.dims[d];
    }
    out[i] = in[off];
  }
}

class SpaceToDepthKernel final : public CudaKernel {
 public:
  SpaceToDepthKernel(int64_t b, bool crd) : CudaKernel("cuda.SpaceToDepth"), b_(b), crd_(crd) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &y = out[0];
    int64_t b = b_;
    if (x.rank() != 4 || y.rank() != 4 || x.shape[2] % b != 0 || x.shape[3] % b != 0) {
      return invalid_argument(name_ + ": needs a 4-D input whose spatial dims divide by blocksize");
    }
    int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2] / b, w = x.shape[3] / b;
    if (y.shape[0] != n || y.shape[1] != c * b * b || y.shape[2] != h || y.shape[3] != w) {
      return invalid_argument(name_ + ": output " + shape_to_string(y.shape) +
                              " does not match the input");
    }
    // The input as [n, c, h, b1, w, b2], read in output order.
    int64_t row = w * b;
    int64_t sw = b, sb2 = 1, sb1 = row, sh = b * row, sc = h * b * row, sn = c * sc;
    Walk wk{};
    wk.rank = 6;
    int64_t dcr_dims[6] = {n, b, b, c, h, w}, dcr_str[6] = {sn, sb1, sb2, sc, sh, sw};
    int64_t crd_dims[6] = {n, c, b, b, h, w}, crd_str[6] = {sn, sc, sb1, sb2, sh, sw};
    for (int d = 0; d < 6; ++d) {
      wk.dims[d] = crd_ ? crd_dims[d] : dcr_dims[d];
      wk.strides[d] = crd_ ? crd_str[d] : dcr_str[d];
    }
    int64_t total = y.numel();
    if (total == 0) return ok_status();
    return by_element_size(dtype_size(x.dtype), name_, [&](auto tag) {
      using E = decltype(tag);
      strided_copy_kernel<E><<<grid_for(total), kBlock, 0, stream_>>>(
          static_cast<const E*>(x.data), static_cast<E*>(y.data), wk, total);
    });
  }

 private:
  int64_t b_;
  bool crd_;
};

// ---- Trilu ----

template <typename E>
__global__ void trilu_kernel(const E* in, E* out, const void* k_ptr, int k_dtype, int64_t rows,
                             int64_t cols, bool upper, int64_t n) {
  int64_t k = k_ptr ? load_as<int64_t>(k_ptr, k_dtype, 0) : 0;
  // Clamped first so that i + k cannot overflow (k is data).
  k = k < -rows - 1 ? -rows - 1 : k > cols + 1 ? cols + 1 : k;
  KILN_GRID_LOOP(e, n) {
    int64_t j = e % cols, i = (e / cols) % rows;
    bool keep = upper ? j >= i + k : j <= i + k;
    out[e] = keep ? in[e] : E(0);
  }
}

class TriluKernel final : public CudaKernel {
 public:
  explicit TriluKernel(bool upper) : CudaKernel("cuda.Trilu"), upper_(upper) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    int r = x.rank();
    if (r < 2 || out[0].numel() != x.numel())
      return invalid_argument(name_ + ": the input must have rank >= 2");
    const void* k = in.size() > 1 && present(in[1]) ? in[1].data : nullptr;
    if (k && in[1].numel() != 1) return invalid_argument(name_ + ": k must be a scalar");
    int kd = k ? int(in[1].dtype) : 0;
    int64_t n = x.numel();
    if (n == 0) return ok_status();
    int64_t rows = x.shape[r - 2], cols = x.shape[r - 1];
    return by_element_size(dtype_size(x.dtype), name_, [&](auto tag) {
      using E = decltype(tag);
      trilu_kernel<E><<<grid_for(n), kBlock, 0, stream_>>>(static_cast<const E*>(x.data),
                                                           static_cast<E*>(out[0].data), k, kd,
                                                           rows, cols, upper_, n);
    });
  }

 private:
  bool upper_;
};

// ---- factories ----

StatusOr<std::unique_ptr<Kernel>> make_split(const KernelQuery& q) {
  KILN_RETURN_IF_ERROR(require_element_size(q, q.input_dtype(0)));
  KILN_ASSIGN_OR_RETURN(int64_t axis, q.node.attrs.get_int("axis", 0));
  for (size_t i = 0; i < q.outputs.size(); ++i) {
    if (!q.outputs[i])
      return unsupported(q.node.describe() + ": every output of Split must be present");
  }
  return std::unique_ptr<Kernel>(new SplitKernel(axis));
}

StatusOr<std::unique_ptr<Kernel>> make_tile(const KernelQuery& q) {
  KILN_RETURN_IF_ERROR(require_element_size(q, q.input_dtype(0)));
  KILN_RETURN_IF_ERROR(known_rank(q, 0).status());
  return std::unique_ptr<Kernel>(new TileKernel());
}

StatusOr<std::unique_ptr<Kernel>> make_pad(const KernelQuery& q) {
  const ir::Attributes& at = q.node.attrs;
  DType t = q.input_dtype(0);
  KILN_RETURN_IF_ERROR(require_element_size(q, t));
  KILN_RETURN_IF_ERROR(known_rank(q, 0).status());
  KILN_ASSIGN_OR_RETURN(std::string mode_s, at.get_string("mode", "constant"));
  PadMode mode;
  if (mode_s == "constant")
    mode = PadMode::kConstant;
  else if (mode_s == "reflect")
    mode = PadMode::kReflect;
  else if (mode_s == "edge")
    mode = PadMode::kEdge;
  else if (mode_s == "wrap")
    mode = PadMode::kWrap;
  else
    return unsupported(q.node.describe() + ": mode '" + mode_s + "' is not supported");
  uint64_t fill = 0;
  if (at.has("value")) {
    KILN_ASSIGN_OR_RETURN(float v, at.get_float("value", 0.0f));
    switch (t) {
      case DType::kFloat32:
        std::memcpy(&fill, &v, 4);
        break;
      case DType::kFloat64: {
        double d = v;
        std::memcpy(&fill, &d, 8);
        break;
      }
      case DType::kFloat16: {
        uint16_t h = float_to_half(v);
        std::memcpy(&fill, &h, 2);
        break;
      }
      case DType::kBFloat16: {
        uint16_t h = float_to_bf16(v);
        std::memcpy(&fill, &h, 2);
        break;
      }
      default: {
        // Integers: the value truncated, stored in the element's low bytes (little-endian).
        int64_t iv = int64_t(v);
        std::memcpy(&fill, &iv, 8);
        if (t == DType::kBool) fill = v != 0.f;
        break;
      }
    }
  }
  auto k = std::make_unique<PadKernel>(mode, fill);
  for (const char* name : {"pads", "paddings"}) {
    if (at.has(name)) {
      KILN_ASSIGN_OR_RETURN(k->pads_attr, at.get_ints(name, std::nullopt));
      k->from_attr = true;
      break;
    }
  }
  if (!k->from_attr) {
    if (!host_readable(q, 3)) {
      return unsupported(
          q.node.describe() +
          ": input 3 (axes) is computed on the device; the CUDA Pad reads it on the host, so it "
          "must be a constant or a shape formula");
    }
    // Pads computed on the device size a data-dependent output (the schema bounds it).
    k->sized = !host_readable(q, 1);
    k->pads_in.init(q, 1);
    k->axes_in.init(q, 3);
  }
  if (q.inputs.size() > 2 && q.inputs[2] && q.inputs[2]->dtype != t) {
    return invalid_argument(q.node.describe() + ": constant_value's dtype differs from the data's");
  }
  return std::unique_ptr<Kernel>(std::move(k));
}

StatusOr<std::unique_ptr<Kernel>> make_space_to_depth(const KernelQuery& q) {
  KILN_RETURN_IF_ERROR(require_element_size(q, q.input_dtype(0)));
  KILN_ASSIGN_OR_RETURN(int64_t b, q.node.attrs.get_int("blocksize", std::nullopt));
  KILN_ASSIGN_OR_RETURN(std::string mode, q.node.attrs.get_string("mode", "DCR"));
  if (b < 1) return invalid_argument(q.node.describe() + ": blocksize must be >= 1");
  if (mode != "DCR" && mode != "CRD")
    return invalid_argument(q.node.describe() + ": mode must be DCR or CRD");
  return std::unique_ptr<Kernel>(new SpaceToDepthKernel(b, mode == "CRD"));
}

StatusOr<std::unique_ptr<Kernel>> make_trilu(const KernelQuery& q) {
  KILN_RETURN_IF_ERROR(require_element_size(q, q.input_dtype(0)));
  KILN_ASSIGN_OR_RETURN(int64_t upper, q.node.attrs.get_int("upper", 1));
  DType kt = q.input_dtype(1);
  if (kt != DType::kUndefined && !is_integer(kt))
    return invalid_argument(q.node.describe() + ": k must be an integer");
  return std::unique_ptr<Kernel>(new TriluKernel(upper != 0));
}

}  // namespace

Status copy_window(const TensorView& in, const TensorView& out, std::span<const int64_t> begin,
                   cudaStream_t s) {
  if (in.rank() != out.rank() || int(begin.size()) != in.rank()) {
    return internal_error("copy_window: " + shape_to_string(in.shape) + " and " +
                          shape_to_string(out.shape) + " differ in rank");
  }
  // The axis map's begin is where the input starts in the output.
  std::vector<int64_t> at(begin.size());
  for (size_t d = 0; d < begin.size(); ++d) at[d] = -begin[d];
  return launch_axis_map(in, out, at, PadMode::kConstant, nullptr, 0, "copy_window", s);
}

void register_shape(Registry& r) {
  r.add(OpKind::kSplit, &make_split);
  r.add(OpKind::kTile, &make_tile);
  r.add(OpKind::kPad, &make_pad);
  r.add(OpKind::kSpaceToDepth, &make_space_to_depth);
  r.add(OpKind::kTrilu, &make_trilu);
}

}  // namespace kiln::backends::cuda
