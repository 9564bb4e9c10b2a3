// Data movement kernels: Transpose, Slice and DepthToSpace as one strided gather; Concat as 2-D
// copies; Gather, GatherND, CumSum and CumProd; Resize (nearest and linear, every coordinate mode but
// tf_crop_and_resize) from per-axis tap tables built on the host when shapes change.
#include <algorithm>
#include <cmath>

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

// out (dims) gathers in[base + sum_d c_d * strides[d]]. Size-1 dims are dropped first.
Status strided_gather(const void* in, void* out, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                      int64_t base, size_t elem, cudaStream_t s) {
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
  switch (elem) {
    case 1: strided_gather_kernel<uint8_t><<<grid_for(n), 256, 0, s>>>((const uint8_t*)in, (uint8_t*)out, w, n); break;
    case 2: strided_gather_kernel<uint16_t><<<grid_for(n), 256, 0, s>>>((const uint16_t*)in, (uint16_t*)out, w, n); break;
    case 4: strided_gather_kernel<uint32_t><<<grid_for(n), 256, 0, s>>>((const uint32_t*)in, (uint32_t*)out, w, n); break;
    case 8: strided_gather_kernel<uint64_t><<<grid_for(n), 256, 0, s>>>((const uint64_t*)in, (uint64_t*)out, w, n); break;
    default: return unsupported("elements of " + std::to_string(elem) + " bytes");
  }
  return launch_status("strided_gather_kernel");
}

std::vector<int64_t> contiguous_strides(std::span<const int64_t> shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int d = int(shape.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * shape[d + 1];
  return s;
}

class TransposeKernel final : public CudaKernel {
 public:
  TransposeKernel(std::vector<int64_t> perm) : CudaKernel("cuda.Transpose"), perm_(std::move(perm)) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    int r = in[0].rank();
    std::vector<int64_t> perm = perm_;
    if (perm.empty()) {
      for (int d = r - 1; d >= 0; --d) perm.push_back(d);
    }
    if (int(perm.size()) != r || out[0].rank() != r) return invalid_argument(name_ + ": perm does not match the rank");
    auto is = contiguous_strides(in[0].shape);
    std::vector<int64_t> dims(r), strides(r);
    for (int d = 0; d < r; ++d) {
      if (perm[d] < 0 || perm[d] >= r) return invalid_argument(name_ + ": perm entry out of range");
      dims[d] = in[0].shape[perm[d]];
      strides[d] = is[perm[d]];
      if (dims[d] != out[0].shape[d]) return invalid_argument(name_ + ": output shape does not match the perm");
    }
    return strided_gather(in[0].data, out[0].data, dims, strides, 0, dtype_size(in[0].dtype), stream_);
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
    auto is = contiguous_strides(x.shape);
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
        return invalid_argument("Slice: the output has shape " + shape_to_string(out[0].shape) + " but the slice has " +
                                std::to_string(len[d]) + " elements on axis " + std::to_string(d));
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
      auto s = contiguous_strides(std::vector<int64_t>{n, c, b, b, h, w});
      strides = {s[0], s[1], s[4], s[2], s[5], s[3]};
    } else {  // DCR: [n, b1, b2, c, h, w]
      auto s = contiguous_strides(std::vector<int64_t>{n, b, b, c, h, w});
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
    size_t es = dtype_size(y.dtype);
    size_t out_row = size_t(y.shape[axis] * inner) * es;
    size_t offset = 0;
    for (const TensorView& x : in) {
      if (!present(x)) continue;
      if (x.rank() != r) return invalid_argument(name_ + ": inputs differ in rank");
      size_t row = size_t(x.shape[axis] * inner) * es;
      if (row > 0 && outer > 0) {
        KILN_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(y.data) + offset, out_row, x.data, row, row, size_t(outer),
                                          cudaMemcpyDeviceToDevice, stream_),
                        name_);
      }
      offset += row;
    }
    if (offset != out_row) return invalid_argument(name_ + ": the inputs do not fill the output along the axis");
    return ok_status();
  }

 private:
  int64_t axis_;
};

template <typename E>
__global__ void gather_kernel(const E* data, const void* idx, int idx_dtype, E* out, int64_t n, int64_t nidx,
                              int64_t d, int64_t inner) {
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
    if (n != outer * nidx * inner) return invalid_argument("Gather: the output shape does not match the inputs");
    if (n == 0) return ok_status();
    if (d == 0) return invalid_argument("Gather: indexing an empty axis");
    int idt = int(in[1].dtype);
    switch (dtype_size(data.dtype)) {
#define KILN_GATHER(E) gather_kernel<E><<<grid_for(n), 256, 0, stream_>>>((const E*)data.data, in[1].data, idt, (E*)out[0].data, n, nidx, d, inner); break
      case 1: KILN_GATHER(uint8_t);
      case 2: KILN_GATHER(uint16_t);
      case 4: KILN_GATHER(uint32_t);
      case 8: KILN_GATHER(uint64_t);
#undef KILN_GATHER
      default: return unsupported("Gather: dtype " + std::string(dtype_name(data.dtype)));
    }
    return launch_status("gather_kernel");
  }

 private:
  int64_t axis_;
};

struct GatherNDArgs {
  int64_t m;                // index tuple length
  int64_t dims[kMaxRank];   // data dims indexed by a tuple
  int64_t stride[kMaxRank]; // their element strides within a batch
  int64_t slice, per_batch, batch_size;
};

template <typename E>
__global__ void gather_nd_kernel(const E* data, const int64_t* idx, E* out, GatherNDArgs a, int64_t n) {
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
    if (q < 1 || b_ < 0 || b_ >= std::min(r, q)) return invalid_argument("GatherND: bad batch_dims");
    GatherNDArgs a{};
    a.m = indices.shape[q - 1];
    if (a.m < 1 || a.m > r - b_ || a.m > kMaxRank) return invalid_argument("GatherND: bad last indices dim");
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
    if (n != batches * a.per_batch * a.slice) return invalid_argument("GatherND: the output shape does not match");
    if (n == 0) return ok_status();
    const int64_t* idx = indices.as<const int64_t>();
    switch (dtype_size(data.dtype)) {
#define KILN_GND(E) gather_nd_kernel<E><<<grid_for(n), 256, 0, stream_>>>((const E*)data.data, idx, (E*)out[0].data, a, n); break
      case 1: KILN_GND(uint8_t);
      case 2: KILN_GND(uint16_t);
      case 4: KILN_GND(uint32_t);
      case 8: KILN_GND(uint64_t);
#undef KILN_GND
      default: return unsupported("GatherND: dtype " + std::string(dtype_name(data.dtype)));
    }
    return launch_status("gather_nd_kernel");
  }

 private:
  int64_t b_;
};

template <typename C>
__global__ void cumsum_kernel(const void* x, void* y, int dtype, int64_t outer, int64_t n, int64_t inner,
                              bool exclusive, bool reverse, bool prod) {
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
      : CudaKernel(prod ? "cuda.CumProd" : "cuda.CumSum"), exclusive_(exclusive), reverse_(reverse), prod_(prod) {}
  HostParam axis;
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    int r = x.rank();
    KILN_ASSIGN_OR_RETURN(auto av, axis.get_ints(in[1], stream_));
    if (av.size() != 1 || av[0] < -r || av[0] >= r) return invalid_argument("CumSum: the axis must be one value in [-rank, rank)");
    int64_t ax = av[0] < 0 ? av[0] + r : av[0];
    int64_t outer = 1, inner = 1, n = x.shape[ax];
    for (int k = 0; k < ax; ++k) outer *= x.shape[k];
    for (int k = int(ax) + 1; k < r; ++k) inner *= x.shape[k];
    if (x.numel() == 0) return ok_status();
    if (is_float(x.dtype)) {
      cumsum_kernel<double><<<grid_for(outer * inner), 256, 0, stream_>>>(x.data, out[0].data, int(x.dtype), outer, n, inner, exclusive_, reverse_, prod_);
    } else {
      cumsum_kernel<int64_t><<<grid_for(outer * inner), 256, 0, stream_>>>(x.data, out[0].data, int(x.dtype), outer, n, inner, exclusive_, reverse_, prod_);
    }
    return launch_status("cumsum_kernel");
  }

 private:
  bool exclusive_, reverse_, prod_;
};

// ---- Resize ----

enum class Coord { kHalfPixel, kAsymmetric, kPytorchHalfPixel, kAlignCorners, kHalfPixelSymmetric };
enum class Round { kPreferFloor, kPreferCeil, kFloor, kCeil, kSimple };

// Everything a Resize launch needs, by value: no tables, so a launch needs no memory of its own
// and shapes may change between launches without synchronizing.
struct ResizeArgs {
  int rank;
  bool linear;
  Coord coord;
  Round round;
  int64_t in_dims[kMaxRank];
  int64_t out_dims[kMaxRank];
  int64_t in_strides[kMaxRank];
  double scale[kMaxRank];
  bool identity[kMaxRank];  // the axis keeps its size at scale 1: a plain copy along it
};

// The source taps of output coordinate o on axis d: offsets (in elements) and weights; returns how
// many (1 or 2). The same arithmetic, in double, as the CPU reference (cpu/resize.cc).
__device__ int resize_taps(const ResizeArgs& a, int d, int64_t o, int64_t* off, float* w) {
  const int64_t inn = a.in_dims[d], outn = a.out_dims[d], stride = a.in_strides[d];
  const double s = a.scale[d];
  if (a.identity[d]) {
    off[0] = o * stride, w[0] = 1.f;
    return 1;
  }
  double xo = 0;
  switch (a.coord) {
    case Coord::kHalfPixel: xo = (o + 0.5) / s - 0.5; break;
    case Coord::kAsymmetric: xo = o / s; break;
    case Coord::kPytorchHalfPixel: xo = outn > 1 ? (o + 0.5) / s - 0.5 : 0.0; break;
    case Coord::kAlignCorners: xo = outn == 1 ? 0.0 : o * double(inn - 1) / double(outn - 1); break;
    case Coord::kHalfPixelSymmetric: {
      double adj = double(outn) / (s * double(inn));
      xo = double(inn) / 2 * (1 - adj) + (o + 0.5) / s - 0.5;
      break;
    }
  }
  auto clampi = [inn](int64_t i) { return i < 0 ? int64_t(0) : i > inn - 1 ? inn - 1 : i; };
  if (!a.linear) {
    double f = floor(xo);
    int64_t idx = 0;
    switch (a.round) {
      case Round::kPreferFloor: idx = int64_t(xo - f == 0.5 ? f : round(xo)); break;
      case Round::kPreferCeil: idx = int64_t(xo - f == 0.5 ? f + 1 : round(xo)); break;
      case Round::kFloor: idx = int64_t(f); break;
      case Round::kCeil: idx = int64_t(ceil(xo)); break;
      case Round::kSimple: idx = int64_t(s < 1 ? ceil(xo) : f); break;
    }
    off[0] = clampi(idx) * stride, w[0] = 1.f;
    return 1;
  }
  double xc = xo < 0 ? 0.0 : xo > double(inn - 1) ? double(inn - 1) : xo;
  int64_t i0 = int64_t(floor(xc)), i1 = i0 + 1 < inn ? i0 + 1 : inn - 1;
  double frac = xc - double(i0);
  off[0] = i0 * stride, off[1] = i1 * stride;
  w[0] = float(1 - frac), w[1] = float(frac);
  return 2;
}

__global__ void resize_kernel(const float* x, float* y, ResizeArgs a, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    int64_t off[kMaxRank][2];
    float wt[kMaxRank][2];
    int k[kMaxRank];
    int64_t r = i;
    int combos = 1;
    for (int d = a.rank - 1; d >= 0; --d) {
      int64_t o = r % a.out_dims[d];
      r /= a.out_dims[d];
      k[d] = resize_taps(a, d, o, off[d], wt[d]);
      combos *= k[d];
    }
    float acc = 0;
    for (int c = 0; c < combos; ++c) {
      int rem = c;
      int64_t src = 0;
      float w = 1;
      for (int d = a.rank - 1; d >= 0; --d) {
        int t = rem % k[d];
        rem /= k[d];
        src += off[d][t];
        w *= wt[d][t];
      }
      acc += w * x[src];
    }
    y[i] = acc;
  }
}

class ResizeKernel final : public CudaKernel {
 public:
  ResizeKernel() : CudaKernel("cuda.Resize") {}
  bool linear = false;
  Coord coord = Coord::kHalfPixel;
  Round round = Round::kPreferFloor;
  std::vector<int> axes;
  int scales_in = 2, sizes_in = 3;
  HostParam scales, sizes;
  std::string policy = "stretch";

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    const TensorView& y = out[0];
    int rank = x.rank();
    if (x.dtype != DType::kFloat32) return unsupported("Resize: the CUDA backend resizes float32 only");
    if (rank < 1 || rank > kMaxRank || y.rank() != rank) return invalid_argument("Resize: bad rank");
    Shape key(x.shape.begin(), x.shape.end());
    key.insert(key.end(), y.shape.begin(), y.shape.end());
    if (key != key_) KILN_RETURN_IF_ERROR(set_args(in, x, y));
    int64_t n = y.numel();
    if (n == 0) return ok_status();
    resize_kernel<<<grid_for(n), 256, 0, stream_>>>(x.as<const float>(), y.as<float>(), args_, n);
    return launch_status("resize_kernel");
  }

 private:
  Status set_args(std::span<const TensorView> in, const TensorView& x, const TensorView& y) {
    int rank = x.rank();
    std::vector<int> ax = axes;
    if (ax.empty()) {
      for (int d = 0; d < rank; ++d) ax.push_back(d);
    }
    std::vector<double> sc(rank, 1.0);
    auto given = [&](int i) { return int(in.size()) > i && present(in[i]) && in[i].numel() > 0; };
    if (given(scales_in)) {
      KILN_ASSIGN_OR_RETURN(auto s, scales.get(in[scales_in], stream_));
      if (s.size() != ax.size()) return invalid_argument("Resize: scales length does not match the axes");
      for (size_t k = 0; k < ax.size(); ++k) {
        if (!(s[k] > 0) || !std::isfinite(s[k])) return invalid_argument("Resize: scales must be > 0");
        sc[ax[k]] = s[k];
      }
    } else if (sizes_in >= 0 && given(sizes_in)) {
      KILN_ASSIGN_OR_RETURN(auto s, sizes.get(in[sizes_in], stream_));
      if (s.size() != ax.size()) return invalid_argument("Resize: sizes length does not match the axes");
      double common = policy == "not_larger" ? INFINITY : 0;
      for (size_t k = 0; k < ax.size(); ++k) {
        double r = s[k] / double(x.shape[ax[k]]);
        sc[ax[k]] = r;
        common = policy == "not_larger" ? std::min(common, r) : std::max(common, r);
      }
      if (policy != "stretch") {
        for (int a : ax) sc[a] = common;
      }
    } else {
      return invalid_argument("Resize: one of scales or sizes must be given");
    }
    auto strides = contiguous_strides(x.shape);
    ResizeArgs a{};
    a.rank = rank, a.linear = linear, a.coord = coord, a.round = round;
    for (int d = 0; d < rank; ++d) {
      a.in_dims[d] = x.shape[d], a.out_dims[d] = y.shape[d], a.in_strides[d] = strides[d];
      a.scale[d] = sc[d];
      a.identity[d] = x.shape[d] == y.shape[d] && sc[d] == 1.0;
    }
    args_ = a;
    key_.assign(x.shape.begin(), x.shape.end());
    key_.insert(key_.end(), y.shape.begin(), y.shape.end());
    return ok_status();
  }

  Shape key_;
  ResizeArgs args_{};
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
  if (mode != "DCR" && mode != "CRD") return invalid_argument(q.node.describe() + ": mode must be DCR or CRD");
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

StatusOr<std::unique_ptr<Kernel>> make_resize(const KernelQuery& q) {
  const ir::Attributes& at = q.node.attrs;
  auto k = std::make_unique<ResizeKernel>();
  KILN_ASSIGN_OR_RETURN(std::string mode, at.get_string("mode", "nearest"));
  KILN_ASSIGN_OR_RETURN(std::string ctm, at.get_string("coordinate_transformation_mode", "half_pixel"));
  KILN_ASSIGN_OR_RETURN(std::string nm, at.get_string("nearest_mode", "round_prefer_floor"));
  KILN_ASSIGN_OR_RETURN(int64_t antialias, at.get_int("antialias", 0));
  KILN_ASSIGN_OR_RETURN(k->policy, at.get_string("keep_aspect_ratio_policy", "stretch"));
  KILN_ASSIGN_OR_RETURN(auto raw_axes, at.get_ints("axes", std::vector<int64_t>{}));
  if (mode != "nearest" && mode != "linear") {
    return unsupported(q.node.describe() + ": the CUDA backend resizes in nearest and linear modes, not " + mode);
  }
  if (antialias) return unsupported(q.node.describe() + ": antialias is not supported on CUDA");
  k->linear = mode == "linear";
  if (ctm == "half_pixel") k->coord = Coord::kHalfPixel;
  else if (ctm == "asymmetric") k->coord = Coord::kAsymmetric;
  else if (ctm == "pytorch_half_pixel") k->coord = Coord::kPytorchHalfPixel;
  else if (ctm == "align_corners") k->coord = Coord::kAlignCorners;
  else if (ctm == "half_pixel_symmetric") k->coord = Coord::kHalfPixelSymmetric;
  else return unsupported(q.node.describe() + ": coordinate_transformation_mode '" + ctm + "' is not supported on CUDA");
  if (nm == "round_prefer_floor") k->round = Round::kPreferFloor;
  else if (nm == "round_prefer_ceil") k->round = Round::kPreferCeil;
  else if (nm == "floor") k->round = Round::kFloor;
  else if (nm == "ceil") k->round = Round::kCeil;
  else return invalid_argument(q.node.describe() + ": unknown nearest_mode '" + nm + "'");
  int rank = q.inputs.empty() || !q.inputs[0] || !q.inputs[0]->shape ? 0 : int(q.inputs[0]->shape->size());
  for (int64_t a : raw_axes) {
    if (a < -rank || a >= rank) return invalid_argument(q.node.describe() + ": axes element out of range");
    k->axes.push_back(int(a < 0 ? a + rank : a));
  }
  bool opset10 = q.node.opset > 0 && q.node.opset < 11;
  if (opset10) {
    k->scales_in = 1, k->sizes_in = -1;
    if (k->round == Round::kPreferFloor && !at.has("nearest_mode")) k->round = Round::kSimple;
    k->coord = Coord::kAsymmetric;
  }
  k->scales.init(q, k->scales_in);
  if (k->sizes_in >= 0) k->sizes.init(q, k->sizes_in);
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
  r.add(OpKind::kResize, &make_resize, {.float32_only = true});
}

}  // namespace kiln::backends::cuda
