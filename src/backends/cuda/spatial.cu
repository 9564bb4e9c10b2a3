// CUDA kernels of the spatial op family: GridSample (1-D to 3-D; nearest, linear, cubic; zeros,
// border, reflection padding; align_corners), AffineGrid (2-D and 3-D) and CenterCropPad.
// They follow the CPU reference (cpu/spatial.cc) step for step and compute in double, as it does.
#include <optional>
#include <string>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;
constexpr int kBlock = 256;
constexpr int kMaxSpatial = 3;

// ---- GridSample ----

enum class Mode { kNearest, kLinear, kCubic };
enum class Padding { kZeros, kBorder, kReflection };

struct GridSampleArgs {
  int r;                         // spatial dims
  int64_t dims[kMaxSpatial];     // X's spatial dims
  int64_t strides[kMaxSpatial];  // X's strides of them
  int64_t channels, x_spatial, out_spatial;
  int mode, padding, align;
  int x_dtype, grid_dtype;
};

// Reflects x into [lo, hi] as the ONNX reference does (a fold, not a modulo).
__device__ double reflect(double x, double lo, double hi) {
  double range = hi - lo;
  if (range <= 0) return lo;
  if (x < lo) {
    double dx = lo - x;
    int64_t n = int64_t(dx / range);
    double r = dx - double(n) * range;
    return n % 2 == 0 ? lo + r : hi - r;
  }
  if (x > hi) {
    double dx = x - hi;
    int64_t n = int64_t(dx / range);
    double r = dx - double(n) * range;
    return n % 2 == 0 ? hi - r : lo + r;
  }
  return x;
}

__device__ void cubic_coeffs(double x, double c[4]) {
  constexpr double a = -0.75;
  x = fabs(x);
  c[0] = ((a * (x + 1) - 5 * a) * (x + 1) + 8 * a) * (x + 1) - 4 * a;
  c[1] = ((a + 2) * x - (a + 3)) * x * x + 1;
  c[2] = ((a + 2) * (1 - x) - (a + 3)) * (1 - x) * (1 - x) + 1;
  c[3] = ((a * (2 - x) - 5 * a) * (2 - x) + 8 * a) * (2 - x) - 4 * a;
}

// One thread per output element (n, channel, point).
__global__ void grid_sample_kernel(const void* x, const void* grid, void* y, GridSampleArgs a,
                                   int64_t n_out) {
  KILN_GRID_LOOP(e, n_out) {
    const int64_t o = e % a.out_spatial, nc = e / a.out_spatial, n = nc / a.channels;
    const Mode mode = Mode(a.mode);
    const Padding pad = Padding(a.padding);
    int64_t idx[kMaxSpatial][4];
    double wt[kMaxSpatial][4];
    int count[kMaxSpatial];
    bool dead = false;
    for (int i = 0; i < a.r; ++i) {
      const int64_t len = a.dims[i];
      const double L = double(len);
      double g = load_as<double>(grid, a.grid_dtype, (n * a.out_spatial + o) * a.r + (a.r - 1 - i));
      double c = a.align ? (g + 1) / 2 * (L - 1) : ((g + 1) * L - 1) / 2;
      if (mode == Mode::kNearest) c = rint(c);
      const double lo = a.align ? 0 : -0.5, hi = a.align ? L - 1 : L - 0.5;
      if (c < lo || c > hi) {
        if (pad == Padding::kBorder) c = fmin(fmax(c, 0.0), L - 1);
        if (pad == Padding::kReflection) c = reflect(c, lo, hi);
      }
      if (!isfinite(c)) {
        dead = true;
        break;
      }
      auto resolve = [&](int64_t k) -> int64_t {
        if (pad == Padding::kZeros) return k >= 0 && k < len ? k : -1;
        if (pad == Padding::kReflection) k = int64_t(reflect(double(k), lo, hi));
        return k < 0 ? 0 : k > len - 1 ? len - 1 : k;
      };
      if (mode == Mode::kNearest) {
        count[i] = 1, idx[i][0] = resolve(int64_t(c)), wt[i][0] = 1.0;
      } else {
        const double f = floor(c), frac = c - f;
        const int64_t i0 = int64_t(f);
        if (mode == Mode::kLinear) {
          count[i] = 2;
          idx[i][0] = resolve(i0), wt[i][0] = 1 - frac;
          idx[i][1] = resolve(i0 + 1), wt[i][1] = frac;
        } else {
          count[i] = 4;
          cubic_coeffs(frac, wt[i]);
          for (int j = 0; j < 4; ++j) idx[i][j] = resolve(i0 - 1 + j);
        }
      }
    }
    double acc = 0;
    if (!dead) {
      const int64_t xbase = nc * a.x_spatial;
      int pos[kMaxSpatial] = {0, 0, 0};
      while (true) {
        int64_t off = 0;
        double w = 1;
        bool valid = true;
        for (int i = 0; i < a.r; ++i) {
          if (idx[i][pos[i]] < 0) valid = false;
          off += idx[i][pos[i]] * a.strides[i];
          w *= wt[i][pos[i]];
        }
        if (valid) acc += w * load_as<double>(x, a.x_dtype, xbase + off);
        int i = a.r - 1;
        while (i >= 0 && ++pos[i] == count[i]) pos[i--] = 0;
        if (i < 0) break;
      }
    }
    store_as<double>(y, a.x_dtype, e, acc);
  }
}

class GridSampleKernel final : public CudaKernel {
 public:
  GridSampleKernel(Mode mode, Padding pad, bool align)
      : CudaKernel("cuda.GridSample"), mode_(mode), pad_(pad), align_(align) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &grid = in[1], &y = out[0];
    const int r = x.rank() - 2;
    if (r < 1 || r > kMaxSpatial || grid.rank() != x.rank() || y.rank() != x.rank() ||
        grid.shape.back() != r || grid.shape[0] != x.shape[0]) {
      return invalid_argument(name_ + ": X, grid and Y shapes do not agree");
    }
    GridSampleArgs a{};
    a.r = r;
    a.channels = x.shape[1];
    a.x_spatial = 1;
    for (int i = r - 1; i >= 0; --i) {
      a.dims[i] = x.shape[i + 2];
      a.strides[i] = a.x_spatial;
      a.x_spatial *= x.shape[i + 2];
    }
    a.out_spatial = 1;
    for (int i = 1; i + 1 < grid.rank(); ++i) a.out_spatial *= grid.shape[i];
    a.mode = int(mode_), a.padding = int(pad_), a.align = align_;
    a.x_dtype = int(x.dtype), a.grid_dtype = int(grid.dtype);
    const int64_t n = y.numel();
    if (n != x.shape[0] * a.channels * a.out_spatial)
      return invalid_argument(name_ + ": Y has the wrong size");
    if (n == 0) return ok_status();
    grid_sample_kernel<<<grid_for(n), kBlock, 0, stream_>>>(x.data, grid.data, y.data, a, n);
    return launch_status("grid_sample_kernel");
  }

 private:
  Mode mode_;
  Padding pad_;
  bool align_;
};

Status require_float(const KernelQuery& q, DType t, const char* what) {
  if (!is_float(t) || dtype_size(t) < 2) {
    return unsupported(q.node.describe() + ": " + what + " of dtype " + std::string(dtype_name(t)));
  }
  return ok_status();
}

// A rank known at build time, or nullopt.
std::optional<size_t> rank_of(const ir::Value* v) {
  if (!v || !v->shape) return std::nullopt;
  return v->shape->size();
}

StatusOr<std::unique_ptr<Kernel>> make_grid_sample(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(std::string mode_s, q.node.attrs.get_string("mode", "linear"));
  KILN_ASSIGN_OR_RETURN(std::string pad_s, q.node.attrs.get_string("padding_mode", "zeros"));
  KILN_ASSIGN_OR_RETURN(int64_t align, q.node.attrs.get_int("align_corners", 0));
  Mode mode;
  if (mode_s == "nearest") {
    mode = Mode::kNearest;
  } else if (mode_s == "linear" || mode_s == "bilinear") {
    mode = Mode::kLinear;
  } else if (mode_s == "cubic" || mode_s == "bicubic") {
    mode = Mode::kCubic;
  } else {
    return unsupported(q.node.describe() + ": mode '" + mode_s + "'");
  }
  Padding pad;
  if (pad_s == "zeros") {
    pad = Padding::kZeros;
  } else if (pad_s == "border") {
    pad = Padding::kBorder;
  } else if (pad_s == "reflection") {
    pad = Padding::kReflection;
  } else {
    return unsupported(q.node.describe() + ": padding_mode '" + pad_s + "'");
  }
  KILN_RETURN_IF_ERROR(require_float(q, q.input_dtype(0), "X"));
  KILN_RETURN_IF_ERROR(require_float(q, q.input_dtype(1), "grid"));
  if (q.output_dtype(0) != q.input_dtype(0))
    return unsupported(q.node.describe() + ": Y's dtype differs from X's");
  auto r = rank_of(q.inputs[0]);
  if (!r || *r < 3 || *r > 2 + kMaxSpatial) {
    return unsupported(q.node.describe() +
                       ": the CUDA GridSample takes 1 to 3 spatial dims of known rank");
  }
  return std::unique_ptr<Kernel>(new GridSampleKernel(mode, pad, align != 0));
}

// ---- AffineGrid ----

struct AffineGridArgs {
  int r;
  int64_t dims[kMaxSpatial];
  int64_t spatial;
  int align, theta_dtype, grid_dtype;
};

// One thread per output element (n, point, coordinate i).
__global__ void affine_grid_kernel(const void* theta, void* grid, AffineGridArgs a, int64_t n_out) {
  KILN_GRID_LOOP(e, n_out) {
    const int i = int(e % a.r);
    const int64_t s = (e / a.r) % a.spatial, n = e / (a.r * a.spatial);
    double base[kMaxSpatial + 1];
    base[a.r] = 1.0;
    int64_t rest = s;
    for (int j = a.r - 1; j >= 0; --j) {  // base[m] is the coordinate of spatial dim r-1-m
      const double L = double(a.dims[j]), k = double(rest % a.dims[j]);
      rest /= a.dims[j];
      base[a.r - 1 - j] = a.align ? (L > 1 ? -1 + k * 2 / (L - 1) : -1) : -1 + (2 * k + 1) / L;
    }
    double acc = 0;
    for (int m = 0; m <= a.r; ++m)
      acc += load_as<double>(theta, a.theta_dtype, (n * a.r + i) * (a.r + 1) + m) * base[m];
    store_as<double>(grid, a.grid_dtype, e, acc);
  }
}

class AffineGridKernel final : public CudaKernel {
 public:
  explicit AffineGridKernel(bool align) : CudaKernel("cuda.AffineGrid"), align_(align) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &theta = in[0], &grid = out[0];
    const int r = grid.rank() - 2;
    if (r < 1 || r > kMaxSpatial || theta.rank() != 3 || theta.shape[1] != r ||
        theta.shape[2] != r + 1 || grid.shape.back() != r || grid.shape[0] != theta.shape[0]) {
      return invalid_argument(name_ + ": theta and the output grid shapes do not agree");
    }
    AffineGridArgs a{};
    a.r = r;
    a.spatial = 1;
    for (int j = 0; j < r; ++j) a.dims[j] = grid.shape[j + 1], a.spatial *= grid.shape[j + 1];
    a.align = align_, a.theta_dtype = int(theta.dtype), a.grid_dtype = int(grid.dtype);
    const int64_t n = grid.numel();
    if (n == 0) return ok_status();
    affine_grid_kernel<<<grid_for(n), kBlock, 0, stream_>>>(theta.data, grid.data, a, n);
    return launch_status("affine_grid_kernel");
  }

 private:
  bool align_;
};

StatusOr<std::unique_ptr<Kernel>> make_affine_grid(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(int64_t align, q.node.attrs.get_int("align_corners", 0));
  KILN_RETURN_IF_ERROR(require_float(q, q.input_dtype(0), "theta"));
  KILN_RETURN_IF_ERROR(require_float(q, q.output_dtype(0), "grid"));
  auto r = rank_of(q.outputs.empty() ? nullptr : q.outputs[0]);
  if (!r || *r < 3 || *r > 2 + kMaxSpatial) {
    return unsupported(q.node.describe() +
                       ": the CUDA AffineGrid makes 1 to 3-D grids of known rank");
  }
  return std::unique_ptr<Kernel>(new AffineGridKernel(align != 0));
}

// ---- CenterCropPad ----

struct CropPadArgs {
  int rank;
  int64_t out_dims[kMaxRank];
  int64_t in_dims[kMaxRank];
  int64_t in_strides[kMaxRank];
};

// Every output dim is centered on its input dim: a crop or pad starts floor(diff / 2) in; what
// falls outside the input is 0.
template <typename E>
__global__ void center_crop_pad_kernel(const E* x, E* y, CropPadArgs a, int64_t n) {
  KILN_GRID_LOOP(o, n) {
    int64_t r = o, off = 0;
    bool valid = true;
    for (int d = a.rank - 1; d >= 0; --d) {
      const int64_t j = r % a.out_dims[d], in = a.in_dims[d], out = a.out_dims[d];
      r /= a.out_dims[d];
      const int64_t i = out <= in ? j + (in - out) / 2 : j - (out - in) / 2;
      if (i < 0 || i >= in) valid = false;
      off += i * a.in_strides[d];
    }
    y[o] = valid ? x[off] : E(0);
  }
}

class CenterCropPadKernel final : public CudaKernel {
 public:
  CenterCropPadKernel() : CudaKernel("cuda.CenterCropPad") {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &y = out[0];
    const int rank = x.rank();
    if (rank != y.rank()) return invalid_argument(name_ + ": output rank differs from the input's");
    if (rank > kMaxRank) return unsupported(name_ + ": more than 8 dims");
    CropPadArgs a{};
    a.rank = rank;
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      a.out_dims[d] = y.shape[d], a.in_dims[d] = x.shape[d], a.in_strides[d] = stride;
      stride *= x.shape[d];
    }
    const int64_t n = y.numel();
    if (n == 0) return ok_status();
    auto launch = [&](auto tag) {
      using E = decltype(tag);
      center_crop_pad_kernel<E><<<grid_for(n), kBlock, 0, stream_>>>(static_cast<const E*>(x.data),
                                                                     static_cast<E*>(y.data), a, n);
    };
    return by_element_size(dtype_size(x.dtype), name_, launch, "center_crop_pad_kernel");
  }
};

StatusOr<std::unique_ptr<Kernel>> make_center_crop_pad(const KernelQuery& q) {
  size_t es = dtype_size(q.input_dtype(0));
  if (es != 1 && es != 2 && es != 4 && es != 8) {
    return unsupported(q.node.describe() + ": dtype " + std::string(dtype_name(q.input_dtype(0))));
  }
  auto r = rank_of(q.inputs[0]);
  if (!r || *r > size_t(kMaxRank))
    return unsupported(q.node.describe() + ": rank unknown or above 8");
  return std::unique_ptr<Kernel>(new CenterCropPadKernel());
}

}  // namespace

void register_spatial(Registry& r) {
  r.add(OpKind::kGridSample, &make_grid_sample);
  r.add(OpKind::kAffineGrid, &make_affine_grid);
  r.add(OpKind::kCenterCropPad, &make_center_crop_pad);
}

}  // namespace kiln::backends::cuda
