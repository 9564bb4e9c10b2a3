// CUDA Resize: nearest, linear and cubic (cubic_coeff_a, exclude_outside, antialias) in every
// coordinate transformation mode, tf_crop_and_resize with roi and extrapolation_value, any rank
// and axes,
// float32/float64/float16/bfloat16 (and int8/uint8/int32/int64 in nearest mode). Each thread
// computes its output's per-axis taps with the CPU reference's arithmetic (cpu/resize.cc), in
// double; the launch carries every parameter by value, so shapes may change between launches.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;

enum class Mode { kNearest, kLinear, kCubic };
enum class Coord {
  kHalfPixel,
  kAsymmetric,
  kPytorchHalfPixel,
  kAlignCorners,
  kTfCropAndResize,
  kHalfPixelSymmetric
};
// kSimple is opset 10's rule: floor when upsampling, ceil when downsampling.
enum class Round { kPreferFloor, kPreferCeil, kFloor, kCeil, kSimple };

struct ResizeArgs {
  int rank;
  Mode mode;
  Coord coord;
  Round round;
  bool exclude_outside;
  bool antialias;  // linear or cubic with antialias=1: the filter widens by 1 / scale downsampling
  double cubic_a, extrapolation;
  int dtype;
  int64_t in_dims[kMaxRank];
  int64_t out_dims[kMaxRank];
  int64_t in_strides[kMaxRank];
  double scale[kMaxRank];
  double roi_start[kMaxRank], roi_end[kMaxRank];
  bool identity[kMaxRank];  // the axis keeps its size at scale 1: a plain copy along it
};

__device__ double original_coord(const ResizeArgs& a, int d, double x) {
  const int64_t in = a.in_dims[d], out = a.out_dims[d];
  const double s = a.scale[d];
  switch (a.coord) {
    case Coord::kHalfPixel:
      return (x + 0.5) / s - 0.5;
    case Coord::kAsymmetric:
      return x / s;
    case Coord::kPytorchHalfPixel:
      return out > 1 ? (x + 0.5) / s - 0.5 : 0.0;
    // These two use the unrounded output length in * scale, as the reference does.
    case Coord::kAlignCorners: {
      double len = s * double(in);
      return len == 1 ? 0.0 : x * double(in - 1) / (len - 1);
    }
    case Coord::kTfCropAndResize: {
      double len = s * double(in), r0 = a.roi_start[d], r1 = a.roi_end[d];
      return len != 1 ? r0 * double(in - 1) + x * (r1 - r0) * double(in - 1) / (len - 1)
                      : 0.5 * (r0 + r1) * double(in - 1);
    }
    case Coord::kHalfPixelSymmetric: {
      double adjustment = double(out) / (s * double(in));
      return double(in) / 2 * (1 - adjustment) + (x + 0.5) / s - 0.5;
    }
  }
  return 0;
}

// The taps of output coordinate o on axis d: offsets (elements) and weights; returns how many (1,
// 2 or 4), or -1 when tf_crop_and_resize puts it outside the crop.
__device__ int resize_taps(const ResizeArgs& a, int d, int64_t o, int64_t* off, double* w) {
  const int64_t in = a.in_dims[d], stride = a.in_strides[d];
  if (a.identity[d]) {
    off[0] = o * stride, w[0] = 1;
    return 1;
  }
  const double xo = original_coord(a, d, double(o));
  if (a.coord == Coord::kTfCropAndResize && (xo < 0 || xo > double(in - 1))) return -1;
  auto clampi = [in](int64_t i) { return i < 0 ? int64_t(0) : i > in - 1 ? in - 1 : i; };
  if (a.mode == Mode::kNearest) {
    double f = floor(xo);
    int64_t idx = 0;
    switch (a.round) {
      case Round::kPreferFloor:
        idx = int64_t(xo - f == 0.5 ? f : round(xo));
        break;
      case Round::kPreferCeil:
        idx = int64_t(xo - f == 0.5 ? f + 1 : round(xo));
        break;
      case Round::kFloor:
        idx = int64_t(f);
        break;
      case Round::kCeil:
        idx = int64_t(ceil(xo));
        break;
      case Round::kSimple:
        idx = int64_t(a.scale[d] < 1 ? ceil(xo) : f);
        break;
    }
    off[0] = clampi(idx) * stride, w[0] = 1;
    return 1;
  }
  if (a.mode == Mode::kLinear) {
    double xc = xo < 0 ? 0.0 : xo > double(in - 1) ? double(in - 1) : xo;
    int64_t i0 = int64_t(floor(xc)), i1 = i0 + 1 < in ? i0 + 1 : in - 1;
    double frac = xc - double(i0);
    off[0] = i0 * stride, off[1] = i1 * stride;
    w[0] = 1 - frac, w[1] = frac;
    return 2;
  }
  const double f = floor(xo), r = xo - f, ca = a.cubic_a;
  double c[4] = {((ca * (r + 1) - 5 * ca) * (r + 1) + 8 * ca) * (r + 1) - 4 * ca,
                 ((ca + 2) * r - (ca + 3)) * r * r + 1,
                 ((ca + 2) * (1 - r) - (ca + 3)) * (1 - r) * (1 - r) + 1,
                 ((ca * (2 - r) - 5 * ca) * (2 - r) + 8 * ca) * (2 - r) - 4 * ca};
  const int64_t i0 = int64_t(f) - 1;
  double sum = 0;
  for (int j = 0; j < 4; ++j) {
    if (a.exclude_outside && (i0 + j < 0 || i0 + j >= in)) c[j] = 0;
    sum += c[j];
  }
  for (int j = 0; j < 4; ++j) {
    off[j] = clampi(i0 + j) * stride;
    w[j] = a.exclude_outside && sum != 0 ? c[j] / sum : c[j];
  }
  return 4;
}

// The antialiased filter of axis d at output o, as the CPU reference's AntialiasFilter: taps
// first .. first + taps - 1 (clamped to the input when read), weighted by the linear or cubic
// kernel at (index - xo) * min(scale, 1) over norm. false when tf_crop_and_resize puts o outside
// the crop.
struct AxisFilter {
  int64_t first;
  int taps;
  double xo, s, norm;
};

__device__ double antialias_weight(const ResizeArgs& a, double d) {
  d = fabs(d);
  const double ca = a.cubic_a;
  if (a.mode == Mode::kLinear) return d < 1 ? 1 - d : 0.0;
  if (d <= 1) return ((ca + 2) * d - (ca + 3)) * d * d + 1;
  if (d < 2) return ((ca * d - 5 * ca) * d + 8 * ca) * d - 4 * ca;
  return 0;
}

// The weight of input index `idx` on axis d before normalization (0 outside the input under
// exclude_outside).
__device__ double antialias_tap(const ResizeArgs& a, int d, const AxisFilter& f, int64_t idx) {
  if (a.identity[d]) return 1;
  if (a.exclude_outside && (idx < 0 || idx >= a.in_dims[d])) return 0;
  return antialias_weight(a, (double(idx) - f.xo) * f.s);
}

__device__ bool antialias_filter(const ResizeArgs& a, int d, int64_t o, AxisFilter* f) {
  if (a.identity[d]) {
    *f = AxisFilter{o, 1, 0, 1, 1};
    return true;
  }
  const double xo = original_coord(a, d, double(o));
  if (a.coord == Coord::kTfCropAndResize && (xo < 0 || xo > double(a.in_dims[d] - 1))) {
    return false;
  }
  const double s = a.scale[d] < 1 ? a.scale[d] : 1.0;
  const double support = a.mode == Mode::kCubic ? 2.0 : 1.0;
  const int64_t start = int64_t(floor(-support / s)) + 1;
  const double fl = floor(xo);
  const int64_t base = int64_t(fl == xo ? fl - 1 : fl);  // the input left of xo
  f->first = base + start;
  f->taps = int(2 - 2 * start);
  f->xo = xo;
  f->s = s;
  // Normalized over every tap (the edge repeats), or over those inside under exclude_outside.
  double sum = 0;
  for (int j = 0; j < f->taps; ++j) sum += antialias_tap(a, d, *f, f->first + j);
  f->norm = sum != 0 ? sum : 1;
  return true;
}

// The antialiased resize: each axis's taps are walked as an odometer (their count depends on the
// scale, so they are recomputed rather than stored), zero weights skipped as the reference does.
template <typename C>
__global__ void resize_antialias_kernel(const void* x, void* y, ResizeArgs a, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    AxisFilter f[kMaxRank];
    int64_t r = i;
    bool outside = false;
    for (int d = a.rank - 1; d >= 0 && !outside; --d) {
      const int64_t o = r % a.out_dims[d];
      r /= a.out_dims[d];
      outside = !antialias_filter(a, d, o, &f[d]);
    }
    if (outside) {
      store_as<C>(y, a.dtype, i, C(a.extrapolation));
      continue;
    }
    int j[kMaxRank] = {};
    C acc = 0;
    while (true) {
      int64_t src = 0;
      C w = 1;
      bool zero = false;
      for (int d = 0; d < a.rank; ++d) {
        const int64_t idx = f[d].first + j[d];
        const double wd = antialias_tap(a, d, f[d], idx) / f[d].norm;
        zero |= wd == 0;
        w *= C(wd);
        const int64_t clamped = idx < 0 ? 0 : idx >= a.in_dims[d] ? a.in_dims[d] - 1 : idx;
        src += clamped * a.in_strides[d];
      }
      if (!zero) acc += w * load_as<C>(x, a.dtype, src);
      int d = a.rank - 1;
      for (; d >= 0; --d) {
        if (++j[d] < f[d].taps) break;
        j[d] = 0;
      }
      if (d < 0) break;
    }
    store_as<C>(y, a.dtype, i, acc);
  }
}

// C: float for float32, float16 and bfloat16 (as the reference), double otherwise.
template <typename C>
__global__ void resize_kernel(const void* x, void* y, ResizeArgs a, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    int64_t off[kMaxRank][4];
    double wt[kMaxRank][4];
    int k[kMaxRank];
    int64_t r = i;
    int combos = 1;
    bool outside = false;
    for (int d = a.rank - 1; d >= 0; --d) {
      int64_t o = r % a.out_dims[d];
      r /= a.out_dims[d];
      k[d] = resize_taps(a, d, o, off[d], wt[d]);
      if (k[d] < 0) {
        outside = true;
        break;
      }
      combos *= k[d];
    }
    if (outside) {
      store_as<C>(y, a.dtype, i, C(a.extrapolation));
      continue;
    }
    C acc = 0;
    for (int c = 0; c < combos; ++c) {
      int rem = c;
      int64_t src = 0;
      C w = 1;
      bool zero = false;
      for (int d = a.rank - 1; d >= 0; --d) {
        int t = rem % k[d];
        rem /= k[d];
        src += off[d][t];
        zero |= wt[d][t] == 0;
        w *= C(wt[d][t]);
      }
      if (!zero) acc += w * load_as<C>(x, a.dtype, src);  // the reference skips zero weights
    }
    store_as<C>(y, a.dtype, i, acc);
  }
}

// The resize of at most two axes (hd < wd; hd = -1 when only wd changes) in nearest or linear
// mode, every other axis a copy: the tensor seen as [A, H, B, W, C], the output as rows (a, oh, b)
// of Wo * C elements. A thread owns kV consecutive elements of a row and one oh: kV channels of
// one w where C is a multiple of kV (one 16-byte access a tap: channels-last images), or kV
// neighbours along W where C = 1 (NCHW). It works out their W taps and its oh's H taps once, then
// walks the planes a (gridDim.z apart) and b, moving its pointers by whole planes: no division
// and no tap arithmetic in the loop. The taps come from resize_taps (the general kernel's double
// arithmetic) and are summed in its order with its float weights, so the results are its bits.
// The general kernel walks every axis with int64 divisions and its per-axis arrays in local
// memory: a x2 upsampling of [8, 128, 128, 128] float16 took 2.2 ms (nearest) and 4.0 ms
// (linear) on an H200, 2% of its copy bandwidth; with the taps worked out per output 1.06 ms, per
// row 0.39 ms.
struct Resize2d {
  int hd, wd;
  int64_t a, hi, ho, b, wi, wo, c;  // A; the input's and output's H and W; B and C
};

// Up to two taps of one output coordinate on one axis: offsets (elements), float weights and
// whether each weight is zero (the reference skips those taps).
template <typename I>
struct Taps2 {
  I off[2];
  float w[2];
  bool zero[2];
  int k;
};

template <typename I>
__device__ __forceinline__ Taps2<I> taps2(const ResizeArgs& a, int d, int64_t o) {
  int64_t off[4] = {};
  double w[4] = {};
  Taps2<I> t{};
  t.k = resize_taps(a, d, o, off, w);
#pragma unroll
  for (int j = 0; j < 2; ++j) t.off[j] = I(off[j]), t.w[j] = float(w[j]), t.zero[j] = w[j] == 0;
  return t;
}

template <typename T, typename I, int kV, bool kAlongW>
__global__ void __launch_bounds__(256, 3)
    resize_2d_kernel(const T* __restrict__ x, T* __restrict__ y, ResizeArgs a, Resize2d g, I cols) {
  using N = DNum<T>;
  struct alignas(sizeof(T) * kV) Pack {
    T v[kV];
  };
  constexpr int kW = kAlongW ? kV : 1;  // separate W taps a thread
  const I col = I(blockIdx.x) * blockDim.x + threadIdx.x;
  const I oh = I(blockIdx.y) * blockDim.y + threadIdx.y;
  if (col >= cols || oh >= I(g.ho)) return;
  const I e = col * kV;
  const I c = e % I(g.c);
  const I ow = e / I(g.c);
  Taps2<I> tw[kW];
#pragma unroll
  for (int j = 0; j < kW; ++j) tw[j] = taps2<I>(a, g.wd, int64_t(ow) + j);
  Taps2<I> th{};
  if (g.hd >= 0) {
    th = taps2<I>(a, g.hd, oh);
  } else {
    th.k = 1, th.w[0] = 1;
  }
  // Plane a's rows start at a * Hi * B (input) and a * Ho * B (output); b adds a row.
  const I in_row = I(g.wi) * I(g.c), out_row = I(g.wo) * I(g.c);
  const I in_plane = I(g.hi) * I(g.b) * in_row, out_plane = I(g.ho) * I(g.b) * out_row;
  const T* src = x + (I(blockIdx.z) * in_plane + c);
  T* dst = y + (I(blockIdx.z) * out_plane + oh * I(g.b) * out_row + e);
  for (I an = blockIdx.z; an < I(g.a); an += gridDim.z) {
    for (I bi = 0; bi < I(g.b); ++bi) {
      const T* s = src + bi * in_row;
      Pack out;
#pragma unroll
      for (int j = 0; j < kW; ++j) {
        float acc[kAlongW ? 1 : kV] = {};
        // At most two taps an axis (nearest 1, linear 2), unrolled so the taps stay in registers.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int w = 0; w < 2; ++w) {
            if (h >= th.k || w >= tw[j].k || th.zero[h] || tw[j].zero[w]) continue;
            const float wt = tw[j].w[w] * th.w[h];
            const T* p = s + th.off[h] + tw[j].off[w];
            if constexpr (kAlongW) {
              acc[0] += wt * float(N::load(*p));
            } else {
              const Pack v = *reinterpret_cast<const Pack*>(p);
#pragma unroll
              for (int k = 0; k < kV; ++k) acc[k] += wt * float(N::load(v.v[k]));
            }
          }
        }
        if constexpr (kAlongW) {
          out.v[j] = N::store(typename N::C(acc[0]));
        } else {
#pragma unroll
          for (int k = 0; k < kV; ++k) out.v[k] = N::store(typename N::C(acc[k]));
        }
      }
      *reinterpret_cast<Pack*>(dst + bi * out_row) = out;
    }
    src += I(gridDim.z) * in_plane;
    dst += I(gridDim.z) * out_plane;
  }
}

// resize_2d_kernel where it applies (float32/float16/bfloat16, nearest or linear without
// antialias, no crop, at most two axes resized); false (nothing launched) otherwise.
bool launch_resize_2d(const TensorView& x, const TensorView& y, const ResizeArgs& a,
                      cudaStream_t s) {
  const DType t = x.dtype;
  if ((t != DType::kFloat32 && t != DType::kFloat16 && t != DType::kBFloat16) || y.dtype != t)
    return false;
  if (a.antialias || a.mode == Mode::kCubic || a.coord == Coord::kTfCropAndResize) return false;
  int resized[2], k = 0;
  for (int d = 0; d < a.rank; ++d) {
    if (a.identity[d]) continue;
    if (k == 2) return false;
    resized[k++] = d;
  }
  if (k == 0) return false;
  Resize2d g{};
  g.hd = k == 2 ? resized[0] : -1;
  g.wd = resized[k - 1];
  auto prod = [&](int from, int to) {  // the identity dims in [from, to)
    int64_t p = 1;
    for (int d = from; d < to; ++d) p *= a.in_dims[d];
    return p;
  };
  g.hi = g.hd >= 0 ? a.in_dims[g.hd] : 1, g.ho = g.hd >= 0 ? a.out_dims[g.hd] : 1;
  // With W alone resized every dim before it is a plane (A), so they spread over the grid.
  g.a = prod(0, g.hd >= 0 ? g.hd : g.wd);
  g.b = g.hd >= 0 ? prod(g.hd + 1, g.wd) : 1;
  g.wi = a.in_dims[g.wd], g.wo = a.out_dims[g.wd];
  g.c = prod(g.wd + 1, a.rank);
  const int64_t n = y.numel();
  if (n == 0 || x.numel() == 0) return false;
  // The grid: columns along x (at most 2^31 - 1 blocks), oh along y (at most 65535 blocks).
  if (g.wo * g.c / 256 >= (int64_t(1) << 31) || g.ho > 65535) return false;
  // int32 indices below 2^30 elements: the last plane step then overshoots without passing 2^31.
  const bool small = n < (int64_t(1) << 30) && x.numel() < (int64_t(1) << 30);
  auto go = [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = int(16 / sizeof(T));
    const auto* xp = static_cast<const T*>(x.data);
    auto* yp = static_cast<T*>(y.data);
    auto launch = [&](auto vec, auto along_w) {
      constexpr int kV = decltype(vec)::value;
      constexpr bool kAlong = decltype(along_w)::value;
      const int64_t cols = g.wo * g.c / kV;
      // A warp's lanes share an oh: blocks of 256 threads, bx of them along the row; the planes
      // split over gridDim.z until the grid has about 8 blocks an SM.
      const int bx = int(std::min<int64_t>(256, (cols + 31) / 32 * 32));
      const int by = 256 / bx;
      const int64_t gx = (cols + bx - 1) / bx, gy = (g.ho + by - 1) / by;
      const int64_t want = std::max<int64_t>(1, int64_t(current_sms()) * 8 / (gx * gy));
      const int64_t gz = std::clamp<int64_t>(want, 1, std::min<int64_t>(g.a, 65535));
      const dim3 grid{unsigned(gx), unsigned(gy), unsigned(gz)}, block{unsigned(bx), unsigned(by)};
      if (small) {
        resize_2d_kernel<T, int32_t, kV, kAlong>
            <<<grid, block, 0, s>>>(xp, yp, a, g, int32_t(cols));
      } else {
        resize_2d_kernel<T, int64_t, kV, kAlong><<<grid, block, 0, s>>>(xp, yp, a, g, cols);
      }
    };
    const bool aligned = aligned16(x.data) && aligned16(y.data);
    if (aligned && g.c % kVec == 0) {
      launch(std::integral_constant<int, kVec>{}, std::false_type{});
    } else if (g.c == 1 && g.wo % 4 == 0 && aligned) {
      launch(std::integral_constant<int, 4>{}, std::true_type{});
    } else {
      launch(std::integral_constant<int, 1>{}, std::false_type{});
    }
  };
  return visit_dtype<kTF32 | kTF16 | kTBF16>(t, go);
}

class ResizeKernel final : public CudaKernel {
 public:
  ResizeKernel() : CudaKernel("cuda.Resize") {}
  ResizeArgs base{};  // attributes; shapes, scales and roi are filled per launch
  std::vector<int> axes;
  int scales_in = 2, sizes_in = 3;
  HostParam scales, sizes, roi;
  std::string policy = "stretch";

  // The sizes or scales are computed on the device at run time: the output is data-dependent, its
  // view has the shape of its bound, and the kernel writes the shape they give from the view's
  // start. Reading them is the one synchronization (HostParam::get), which the run makes at such a
  // layer anyway to learn the shape.
  bool sized = false;

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    TensorView y = out[0];
    int rank = x.rank();
    if (rank < 1 || rank > kMaxRank || y.rank() != rank)
      return invalid_argument(name_ + ": bad rank");
    valid_ = false;
    if (sized) {
      KILN_ASSIGN_OR_RETURN(shape_, shape_from_data(in, x, y));
      y.shape = shape_;
    }
    Shape key(x.shape.begin(), x.shape.end());
    key.insert(key.end(), y.shape.begin(), y.shape.end());
    // roi values may change without the shapes changing: read them every launch (a constant or a
    // host formula costs nothing).
    if (key != key_ || base.coord == Coord::kTfCropAndResize)
      KILN_RETURN_IF_ERROR(set_args(in, x, y));
    int64_t n = y.numel();
    if (n == 0) return ok_status();
    if (x.numel() == 0)
      return invalid_argument(name_ + ": cannot resize an empty input to a non-empty output");
    const bool wide = x.dtype == DType::kFloat64 || !is_float(x.dtype);
    if (launch_resize_2d(x, y, args_, stream_)) {
      KILN_RETURN_IF_ERROR(launch_status("resize_2d_kernel"));
      valid_ = sized;
      return ok_status();
    }
    if (args_.antialias) {
      if (wide) {
        resize_antialias_kernel<double><<<grid_for(n), 256, 0, stream_>>>(x.data, y.data, args_, n);
      } else {
        resize_antialias_kernel<float><<<grid_for(n), 256, 0, stream_>>>(x.data, y.data, args_, n);
      }
    } else if (wide) {
      resize_kernel<double><<<grid_for(n), 256, 0, stream_>>>(x.data, y.data, args_, n);
    } else {
      resize_kernel<float><<<grid_for(n), 256, 0, stream_>>>(x.data, y.data, args_, n);
    }
    KILN_RETURN_IF_ERROR(
        launch_status(args_.antialias ? "resize_antialias_kernel" : "resize_kernel"));
    valid_ = sized;
    return ok_status();
  }

  StatusOr<Shape> data_dependent_shape(size_t output) const override {
    if (!valid_ || output != 0) return Kernel::data_dependent_shape(output);
    return shape_;
  }

 private:
  // The output shape the sizes (or floor(dim * scale)) give, within the view's bound (as the CPU
  // reference's shape_from_data).
  StatusOr<Shape> shape_from_data(std::span<const TensorView> in, const TensorView& x,
                                  const TensorView& y) {
    const int rank = x.rank();
    std::vector<int> ax = axes;
    if (ax.empty()) {
      for (int d = 0; d < rank; ++d) ax.push_back(d);
    }
    auto given = [&](int i) {
      return i >= 0 && int(in.size()) > i && present(in[i]) && in[i].numel() > 0;
    };
    const bool by_sizes = !given(scales_in) && given(sizes_in);
    if (!by_sizes && !given(scales_in))
      return invalid_argument(name_ + ": one of scales or sizes must be given");
    KILN_ASSIGN_OR_RETURN(
        auto v, by_sizes ? sizes.get(in[sizes_in], stream_) : scales.get(in[scales_in], stream_));
    if (v.size() != ax.size())
      return invalid_argument(name_ + ": sizes or scales do not match the axes");
    Shape s(x.shape.begin(), x.shape.end());
    for (size_t k = 0; k < ax.size(); ++k) {
      const int d = ax[k];
      const double o = by_sizes ? v[k] : std::floor(double(x.shape[d]) * v[k]);
      if (!(o >= 0 && o <= double(ir::Interval::kInf)) || o != std::floor(o)) {
        return invalid_argument(name_ + ": output dim " + std::to_string(d) + " from the data is " +
                                std::to_string(o) + ", not a size");
      }
      s[d] = int64_t(o);
      if (s[d] > y.shape[d]) {
        return internal_error(name_ + ": output dim " + std::to_string(d) + " is " +
                              std::to_string(s[d]) + ", past the " + std::to_string(y.shape[d]) +
                              " the plan bounds it by");
      }
    }
    return s;
  }

  Status set_args(std::span<const TensorView> in, const TensorView& x, const TensorView& y) {
    int rank = x.rank();
    std::vector<int> ax = axes;
    if (ax.empty()) {
      for (int d = 0; d < rank; ++d) ax.push_back(d);
    }
    std::vector<double> sc(rank, 1.0);
    auto given = [&](int i) {
      return i >= 0 && int(in.size()) > i && present(in[i]) && in[i].numel() > 0;
    };
    if (given(scales_in)) {
      KILN_ASSIGN_OR_RETURN(auto s, scales.get(in[scales_in], stream_));
      if (s.size() != ax.size())
        return invalid_argument(name_ + ": scales length does not match the axes");
      for (size_t k = 0; k < ax.size(); ++k) {
        if (!(s[k] > 0) || !std::isfinite(s[k]))
          return invalid_argument(name_ + ": scales must be > 0");
        sc[ax[k]] = s[k];
      }
    } else if (given(sizes_in)) {
      KILN_ASSIGN_OR_RETURN(auto s, sizes.get(in[sizes_in], stream_));
      if (s.size() != ax.size())
        return invalid_argument(name_ + ": sizes length does not match the axes");
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
      return invalid_argument(name_ + ": one of scales or sizes must be given");
    }
    ResizeArgs a = base;
    a.rank = rank;
    a.dtype = int(x.dtype);
    for (int d = 0; d < rank; ++d) a.roi_start[d] = 0, a.roi_end[d] = 1;
    if (a.coord == Coord::kTfCropAndResize) {
      if (!given(1)) return invalid_argument(name_ + ": tf_crop_and_resize needs roi");
      KILN_ASSIGN_OR_RETURN(auto r, roi.get(in[1], stream_));
      if (r.size() != 2 * ax.size())
        return invalid_argument(name_ + ": roi length must be twice the axes");
      for (size_t k = 0; k < ax.size(); ++k)
        a.roi_start[ax[k]] = r[k], a.roi_end[ax[k]] = r[ax.size() + k];
    }
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      if (!(sc[d] > 0) || !std::isfinite(sc[d]))
        return invalid_argument(name_ + ": derived scale is not positive");
      a.in_dims[d] = x.shape[d], a.out_dims[d] = y.shape[d], a.in_strides[d] = stride;
      stride *= x.shape[d];
      a.scale[d] = sc[d];
      a.identity[d] =
          x.shape[d] == y.shape[d] && sc[d] == 1.0 && a.coord != Coord::kTfCropAndResize;
    }
    args_ = a;
    key_.assign(x.shape.begin(), x.shape.end());
    key_.insert(key_.end(), y.shape.begin(), y.shape.end());
    return ok_status();
  }

  Shape key_;
  ResizeArgs args_{};
  Shape shape_;
  bool valid_ = false;
};

// Whether input i is data the run computes on the device: neither a constant nor a shape formula.
bool computed_at_run_time(const KernelQuery& q, size_t i) {
  return i < q.inputs.size() && q.inputs[i] && !q.inputs[i]->constant && !q.inputs[i]->sym_value;
}

StatusOr<std::unique_ptr<Kernel>> make_resize(const KernelQuery& q) {
  const ir::Attributes& at = q.node.attrs;
  auto k = std::make_unique<ResizeKernel>();
  KILN_ASSIGN_OR_RETURN(std::string mode, at.get_string("mode", "nearest"));
  KILN_ASSIGN_OR_RETURN(std::string ctm,
                        at.get_string("coordinate_transformation_mode", "half_pixel"));
  KILN_ASSIGN_OR_RETURN(std::string nm, at.get_string("nearest_mode", "round_prefer_floor"));
  KILN_ASSIGN_OR_RETURN(int64_t antialias, at.get_int("antialias", 0));
  KILN_ASSIGN_OR_RETURN(float cubic_a, at.get_float("cubic_coeff_a", -0.75f));
  KILN_ASSIGN_OR_RETURN(int64_t exclude, at.get_int("exclude_outside", 0));
  KILN_ASSIGN_OR_RETURN(float extrapolation, at.get_float("extrapolation_value", 0.f));
  KILN_ASSIGN_OR_RETURN(k->policy, at.get_string("keep_aspect_ratio_policy", "stretch"));
  KILN_ASSIGN_OR_RETURN(auto raw_axes, at.get_ints("axes", std::vector<int64_t>{}));
  ResizeArgs& b = k->base;
  b.cubic_a = cubic_a, b.exclude_outside = exclude != 0, b.extrapolation = extrapolation;
  if (mode == "nearest") {
    b.mode = Mode::kNearest;
  } else if (mode == "linear") {
    b.mode = Mode::kLinear;
  } else if (mode == "cubic") {
    b.mode = Mode::kCubic;
  } else {
    return unsupported(q.node.describe() + ": unknown mode '" + mode + "'");
  }
  static const std::pair<const char*, Coord> kCoords[] = {
      {"half_pixel", Coord::kHalfPixel},
      {"asymmetric", Coord::kAsymmetric},
      {"pytorch_half_pixel", Coord::kPytorchHalfPixel},
      {"align_corners", Coord::kAlignCorners},
      {"tf_crop_and_resize", Coord::kTfCropAndResize},
      {"half_pixel_symmetric", Coord::kHalfPixelSymmetric}};
  auto coord = std::find_if(std::begin(kCoords), std::end(kCoords),
                            [&](const auto& c) { return ctm == c.first; });
  if (coord == std::end(kCoords)) {
    return unsupported(q.node.describe() + ": coordinate_transformation_mode '" + ctm + "'");
  }
  b.coord = coord->second;
  static const std::pair<const char*, Round> kRounds[] = {
      {"round_prefer_floor", Round::kPreferFloor},
      {"round_prefer_ceil", Round::kPreferCeil},
      {"floor", Round::kFloor},
      {"ceil", Round::kCeil}};
  auto round = std::find_if(std::begin(kRounds), std::end(kRounds),
                            [&](const auto& r) { return nm == r.first; });
  if (round == std::end(kRounds))
    return unsupported(q.node.describe() + ": nearest_mode '" + nm + "'");
  b.round = round->second;
  DType t = q.input_dtype(0);
  bool float_data =
      t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 || t == DType::kBFloat16;
  bool int_data =
      t == DType::kInt8 || t == DType::kUInt8 || t == DType::kInt32 || t == DType::kInt64;
  if (!float_data && !(int_data && b.mode == Mode::kNearest)) {
    return unsupported(q.node.describe() +
                       ": the CUDA Resize takes float data, or int8/uint8/int32/int64 in "
                       "nearest mode; this is " +
                       mode + " on " + std::string(dtype_name(t)));
  }
  if (q.output_dtype(0) != t)
    return unsupported(q.node.describe() + ": Y's dtype differs from X's");
  int rank =
      q.inputs.empty() || !q.inputs[0] || !q.inputs[0]->shape ? 0 : int(q.inputs[0]->shape->size());
  if (rank < 1 || rank > kMaxRank)
    return unsupported(q.node.describe() + ": rank unknown or above 8");
  for (int64_t a : raw_axes) {
    if (a < -rank || a >= rank)
      return unsupported(q.node.describe() + ": axes element out of range");
    k->axes.push_back(int(a < 0 ? a + rank : a));
  }
  bool opset10 = q.node.opset > 0 && q.node.opset < 11;
  if (opset10) {
    k->scales_in = 1, k->sizes_in = -1;
    b.round = Round::kSimple;
    b.coord = Coord::kAsymmetric;
  }
  // Antialias changes linear and cubic only (nearest ignores it, as the reference's schema
  // allows); opset 10 has no such attribute.
  b.antialias = antialias != 0 && b.mode != Mode::kNearest && !opset10;
  k->sized = computed_at_run_time(q, size_t(k->scales_in)) ||
             (k->sizes_in >= 0 && computed_at_run_time(q, size_t(k->sizes_in)));
  k->scales.init(q, k->scales_in);
  if (k->sizes_in >= 0) k->sizes.init(q, k->sizes_in);
  if (b.coord == Coord::kTfCropAndResize) k->roi.init(q, 1);
  return std::unique_ptr<Kernel>(std::move(k));
}

}  // namespace

void register_resize(Registry& r) { r.add(OpKind::kResize, &make_resize); }

}  // namespace kiln::backends::cuda
