// CPU reference kernels of the resize op family: Resize (nearest/linear/cubic, every coordinate
// transformation mode, any rank and axes), DepthToSpace (DCR/CRD) and SpaceToDepth.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/thread_pool.h"
#include "core/checked.h"

namespace kiln::backends::cpu {
namespace {

struct Half {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

// Storage type T <-> compute type C. Integers (nearest only) go through double, which is exact.
template <typename T>
struct Num {
  using C = std::conditional_t<std::is_integral_v<T>, double, T>;
  static C load(T v) { return C(v); }
  static T store(C v) {
    if constexpr (std::is_integral_v<T>) {
      return T(std::nearbyint(v));
    } else {
      return v;
    }
  }
};
template <>
struct Num<Half> {
  using C = float;
  static float load(Half v) { return half_to_float(v.bits); }
  static Half store(float v) { return Half{float_to_half(v)}; }
};
template <>
struct Num<BF16> {
  using C = float;
  static float load(BF16 v) { return bf16_to_float(v.bits); }
  static BF16 store(float v) { return BF16{float_to_bf16(v)}; }
};

enum class Mode { kNearest, kLinear, kCubic };
enum class Coord {
  kHalfPixel,
  kAsymmetric,
  kPytorchHalfPixel,
  kAlignCorners,
  kTfCropAndResize,
  kHalfPixelSymmetric
};
// kSimple is opset 10's rule: floor when upsampling, ceil when downsampling (as ONNX Runtime does).
enum class Round { kPreferFloor, kPreferCeil, kFloor, kCeil, kSimple };

struct ResizeParams {
  Mode mode = Mode::kNearest;
  Coord coord = Coord::kHalfPixel;
  Round round = Round::kPreferFloor;
  double cubic_a = -0.75;
  bool exclude_outside = false;
  bool antialias = false;  // linear and cubic only: widens the filter when downsampling
  double extrapolation = 0;
};

StatusOr<ResizeParams> parse_params(const ir::Attributes& at, bool opset10) {
  ResizeParams p;
  KILN_ASSIGN_OR_RETURN(std::string mode, at.get_string("mode", "nearest"));
  KILN_ASSIGN_OR_RETURN(std::string ctm,
                        at.get_string("coordinate_transformation_mode", "half_pixel"));
  KILN_ASSIGN_OR_RETURN(std::string nm, at.get_string("nearest_mode", "round_prefer_floor"));
  KILN_ASSIGN_OR_RETURN(float a, at.get_float("cubic_coeff_a", -0.75f));
  KILN_ASSIGN_OR_RETURN(int64_t excl, at.get_int("exclude_outside", 0));
  KILN_ASSIGN_OR_RETURN(float extrap, at.get_float("extrapolation_value", 0.f));
  KILN_ASSIGN_OR_RETURN(int64_t antialias, at.get_int("antialias", 0));
  p.cubic_a = a;
  p.exclude_outside = excl != 0;
  p.extrapolation = extrap;
  if (mode == "nearest") {
    p.mode = Mode::kNearest;
  } else if (mode == "linear") {
    p.mode = Mode::kLinear;
  } else if (mode == "cubic") {
    p.mode = Mode::kCubic;
  } else {
    return invalid_argument("Resize: unknown mode '" + mode + "'");
  }
  if (opset10) {
    p.coord = Coord::kAsymmetric;
    p.round = Round::kSimple;
    return p;
  }
  // Nearest ignores antialias; opset 10 (returned above) has no such attribute.
  p.antialias = antialias != 0 && p.mode != Mode::kNearest;
  static const std::pair<const char*, Coord> kCoords[] = {
      {"half_pixel", Coord::kHalfPixel},
      {"asymmetric", Coord::kAsymmetric},
      {"pytorch_half_pixel", Coord::kPytorchHalfPixel},
      {"align_corners", Coord::kAlignCorners},
      {"tf_crop_and_resize", Coord::kTfCropAndResize},
      {"half_pixel_symmetric", Coord::kHalfPixelSymmetric}};
  bool found = false;
  for (const auto& [name, c] : kCoords) {
    if (ctm == name) {
      p.coord = c;
      found = true;
    }
  }
  if (!found)
    return invalid_argument("Resize: unknown coordinate_transformation_mode '" + ctm + "'");
  static const std::pair<const char*, Round> kRounds[] = {
      {"round_prefer_floor", Round::kPreferFloor},
      {"round_prefer_ceil", Round::kPreferCeil},
      {"floor", Round::kFloor},
      {"ceil", Round::kCeil}};
  found = false;
  for (const auto& [name, r] : kRounds) {
    if (nm == name) {
      p.round = r;
      found = true;
    }
  }
  if (!found) return invalid_argument("Resize: unknown nearest_mode '" + nm + "'");
  return p;
}

double original_coord(const ResizeParams& p, double x, int64_t in, int64_t out, double scale,
                      double roi_start, double roi_end) {
  switch (p.coord) {
    case Coord::kHalfPixel:
      return (x + 0.5) / scale - 0.5;
    case Coord::kAsymmetric:
      return x / scale;
    case Coord::kPytorchHalfPixel:
      return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
    // These two use the unrounded output length in * scale, as the ONNX reference does (with
    // sizes the scale is out / in, so it is the output size).
    case Coord::kAlignCorners: {
      double len = scale * double(in);
      return len == 1 ? 0.0 : x * double(in - 1) / (len - 1);
    }
    case Coord::kTfCropAndResize: {
      double len = scale * double(in);
      return len != 1 ? roi_start * double(in - 1) +
                            x * (roi_end - roi_start) * double(in - 1) / (len - 1)
                      : 0.5 * (roi_start + roi_end) * double(in - 1);
    }
    case Coord::kHalfPixelSymmetric: {
      double adjustment = double(out) / (scale * double(in));
      double offset = double(in) / 2 * (1 - adjustment);
      return offset + (x + 0.5) / scale - 0.5;
    }
  }
  return 0;
}

int64_t nearest_index(Round r, double x, bool downsampling) {
  double f = std::floor(x);
  switch (r) {
    case Round::kPreferFloor:
      return int64_t(x - f == 0.5 ? f : std::round(x));
    case Round::kPreferCeil:
      return int64_t(x - f == 0.5 ? f + 1 : std::round(x));
    case Round::kFloor:
      return int64_t(f);
    case Round::kCeil:
      return int64_t(std::ceil(x));
    case Round::kSimple:
      return int64_t(downsampling ? std::ceil(x) : f);
  }
  return 0;
}

// The taps of one axis: for each output coordinate, `k` (input offset, weight) pairs and whether
// it falls outside the crop (tf_crop_and_resize writes the extrapolation value there).
template <typename C>
struct AxisTaps {
  int k = 1;
  std::vector<int64_t> offset;
  std::vector<C> weight;
  std::vector<uint8_t> outside;
};

// The antialiased filter (ONNX Resize, antialias=1): the linear or cubic kernel stretched by
// 1 / scale when downsampling, so each output averages every input it covers. Tap i of the
// filter reads input base + i, for i in [start, start + taps), where base is the input left of x
// (x - 1 when x is an integer, the reference's tie rule), weighted by the kernel at
// (base + i - x) * min(scale, 1); weights are normalized to sum to 1.
struct AntialiasFilter {
  double support;  // the kernel's half-width at scale 1: 1 for linear, 2 for cubic
  double s;        // min(scale, 1)
  int64_t start, taps;

  AntialiasFilter(bool cubic, double scale) : support(cubic ? 2.0 : 1.0), s(std::min(scale, 1.0)) {
    start = int64_t(std::floor(-support / s)) + 1;
    taps = 2 - 2 * start;
  }
  double weight(bool cubic, double a, double d) const {
    d = std::fabs(d * s);
    if (!cubic) return std::max(0.0, 1 - d);
    if (d <= 1) return ((a + 2) * d - (a + 3)) * d * d + 1;
    if (d < 2) return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
    return 0;
  }
};

template <typename C>
void build_taps(const ResizeParams& p, int64_t in, int64_t out, int64_t stride, double scale,
                double roi_start, double roi_end, AxisTaps<C>* t) {
  bool identity = in == out && scale == 1.0 && p.coord != Coord::kTfCropAndResize;
  const AntialiasFilter filter(p.mode == Mode::kCubic, scale);
  const bool antialias = p.antialias && !identity;
  int k = identity || p.mode == Mode::kNearest ? 1 : p.mode == Mode::kLinear ? 2 : 4;
  if (antialias) k = int(filter.taps);
  t->k = k;
  t->offset.assign(size_t(out * k), 0);
  t->weight.assign(size_t(out * k), C(0));
  t->outside.assign(size_t(out), 0);
  auto clamp = [in](int64_t i) { return std::clamp<int64_t>(i, 0, in - 1); };
  for (int64_t x = 0; x < out; ++x) {
    int64_t* off = &t->offset[size_t(x * k)];
    C* w = &t->weight[size_t(x * k)];
    if (identity) {
      off[0] = x * stride;
      w[0] = C(1);
      continue;
    }
    double xo = original_coord(p, double(x), in, out, scale, roi_start, roi_end);
    if (p.coord == Coord::kTfCropAndResize && (xo < 0 || xo > double(in - 1))) {
      t->outside[size_t(x)] = 1;
      continue;
    }
    if (antialias) {
      const double f = std::floor(xo);
      const int64_t first = int64_t(f == xo ? f - 1 : f) + filter.start;
      // Normalized over every tap (the edge repeats), or over those inside under exclude_outside.
      double norm = 0;
      std::vector<double> c(static_cast<size_t>(k));
      for (int j = 0; j < k; ++j) {
        const int64_t i = first + j;
        const bool drop = p.exclude_outside && (i < 0 || i >= in);
        c[size_t(j)] =
            drop ? 0.0 : filter.weight(p.mode == Mode::kCubic, p.cubic_a, double(i) - xo);
        norm += c[size_t(j)];
      }
      for (int j = 0; j < k; ++j) {
        off[j] = clamp(first + j) * stride;
        w[j] = C(norm != 0 ? c[size_t(j)] / norm : 0.0);
      }
    } else if (p.mode == Mode::kNearest) {
      off[0] = clamp(nearest_index(p.round, xo, scale < 1)) * stride;
      w[0] = C(1);
    } else if (p.mode == Mode::kLinear) {
      double xc = std::clamp(xo, 0.0, double(in - 1));
      int64_t i0 = int64_t(std::floor(xc));
      int64_t i1 = std::min(i0 + 1, in - 1);
      double frac = xc - double(i0);
      off[0] = i0 * stride;
      off[1] = i1 * stride;
      w[0] = C(1 - frac);
      w[1] = C(frac);
    } else {
      double f = std::floor(xo), r = xo - f, a = p.cubic_a;
      double c[4] = {((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                     ((a + 2) * r - (a + 3)) * r * r + 1,
                     ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
                     ((a * (2 - r) - 5 * a) * (2 - r) + 8 * a) * (2 - r) - 4 * a};
      int64_t i0 = int64_t(f) - 1;
      double sum = 0;
      for (int j = 0; j < 4; ++j) {
        if (p.exclude_outside && (i0 + j < 0 || i0 + j >= in)) c[j] = 0;
        sum += c[j];
      }
      for (int j = 0; j < 4; ++j) {
        off[j] = clamp(i0 + j) * stride;
        w[j] = C(p.exclude_outside && sum != 0 ? c[j] / sum : c[j]);
      }
    }
  }
}

struct Combo {
  int64_t offset;
  double weight;
};

// Whether every axis but the last two maps each output index to its own input index with the
// one nonzero weight 1 (N and C under a spatial resize): each plane then resizes alone.
template <typename C>
bool planes_alone(const std::vector<AxisTaps<C>>& taps, int rank, const TensorView& y,
                  const std::vector<int64_t>& stride) {
  for (int d = 0; d < rank - 2; ++d) {
    const AxisTaps<C>& t = taps[size_t(d)];
    for (int64_t i = 0; i < y.shape[d]; ++i) {
      if (t.outside[size_t(i)]) return false;
      int nonzero = 0;
      for (int j = 0; j < t.k; ++j) {
        const C w = t.weight[size_t(i * t.k + j)];
        if (w == C(0)) continue;
        if (w != C(1) || t.offset[size_t(i * t.k + j)] != i * stride[size_t(d)]) return false;
        ++nonzero;
      }
      if (nonzero != 1) return false;
    }
  }
  return true;
}

// resize_run's float32 planes alone, over the CPU's threads: each input row a plane's output rows
// read is interpolated along W once (resize_run did it again for every output row and tap, with a
// list of taps built per row), then each output row sums its row taps over those. The same float
// operations in the same order as resize_run, so the same bits: UNet's 2x bilinear upsample of
// [2, 16, 100, 100] took 5.9 ms there, most of the model, on the 2-core development machine.
void resize_planes_f32(const std::vector<AxisTaps<float>>& taps, int rank, const TensorView& x,
                       const TensorView& y, float extrap) {
  const int64_t in_h = x.shape[rank - 2], in_w = x.shape[rank - 1];
  const int64_t out_h = y.shape[rank - 2], out_w = y.shape[rank - 1];
  const int64_t planes = y.numel() / (out_h * out_w);
  const AxisTaps<float>& row = taps[size_t(rank - 2)];
  const AxisTaps<float>& col = taps[size_t(rank - 1)];
  const float* in = x.as<const float>();
  float* out = y.as<float>();
  auto plane = [&](int64_t pl) {
    static thread_local std::vector<float> across;  // [in_h][out_w], rows made when first read
    static thread_local std::vector<uint8_t> made;
    if (across.size() < size_t(in_h * out_w)) across.resize(size_t(in_h * out_w));
    made.assign(size_t(in_h), 0);
    const float* xp = in + pl * in_h * in_w;
    float* yp = out + pl * out_h * out_w;
    for (int64_t oy = 0; oy < out_h; ++oy) {
      float* o = yp + oy * out_w;
      if (row.outside[size_t(oy)]) {
        std::fill(o, o + out_w, extrap);
        continue;
      }
      std::fill(o, o + out_w, 0.f);
      for (int j = 0; j < row.k; ++j) {
        const float w = row.weight[size_t(oy * row.k + j)];
        if (w == 0.f) continue;
        const int64_t iy = row.offset[size_t(oy * row.k + j)] / in_w;
        float* h = across.data() + iy * out_w;
        if (!made[size_t(iy)]) {
          made[size_t(iy)] = 1;
          const float* xr = xp + iy * in_w;
          for (int64_t ox = 0; ox < out_w; ++ox) {
            const int64_t* co = &col.offset[size_t(ox * col.k)];
            const float* cw = &col.weight[size_t(ox * col.k)];
            float sum = 0;
            for (int t = 0; t < col.k; ++t) {
              if (cw[t] != 0.f) sum += cw[t] * xr[co[t]];
            }
            h[ox] = sum;
          }
        }
        for (int64_t ox = 0; ox < out_w; ++ox) o[ox] += w * h[ox];
      }
      for (int64_t ox = 0; ox < out_w; ++ox) {
        if (col.outside[size_t(ox)]) o[ox] = extrap;
      }
    }
  };
  if (planes > 1 && y.numel() >= (int64_t(1) << 16)) {
    parallel_for(planes, plane);
  } else {
    for (int64_t pl = 0; pl < planes; ++pl) plane(pl);
  }
}

template <typename T>
void resize_run(const ResizeParams& p, const TensorView& x, const TensorView& y,
                const std::vector<double>& scales, const std::vector<double>& roi) {
  using N = Num<T>;
  using C = typename N::C;
  int rank = x.rank();
  std::vector<int64_t> stride(size_t(rank), 1);
  for (int d = rank - 2; d >= 0; --d) stride[d] = stride[d + 1] * x.shape[d + 1];
  std::vector<AxisTaps<C>> taps(static_cast<size_t>(rank));
  for (int d = 0; d < rank; ++d) {
    build_taps<C>(p, x.shape[d], y.shape[d], stride[d], scales[d], roi[d], roi[rank + d], &taps[d]);
  }
  if constexpr (std::is_same_v<T, float>) {
    if (rank >= 2 && planes_alone(taps, rank, y, stride)) {
      resize_planes_f32(taps, rank, x, y, float(p.extrapolation));
      return;
    }
  }
  const T* in = x.as<const T>();
  T* out = y.as<T>();
  const C extrap = C(p.extrapolation);
  const AxisTaps<C>& col = taps[rank - 1];
  const int64_t out_w = y.shape[rank - 1];
  const int kc = col.k;
  // Rows are every output coordinate but the last axis; a row's taps over the leading axes are
  // expanded once into (offset, weight) combinations, then reused for each output column.
  std::vector<Combo> combos, next;
  std::vector<int64_t> idx(size_t(rank), 0);
  int64_t rows = y.numel() / out_w;
  for (int64_t row = 0; row < rows; ++row) {
    combos.assign(1, Combo{0, 1.0});
    bool outside = false;
    for (int d = 0; d < rank - 1; ++d) {
      const AxisTaps<C>& t = taps[d];
      outside |= t.outside[size_t(idx[d])] != 0;
      next.clear();
      for (const Combo& c : combos) {
        for (int j = 0; j < t.k; ++j) {
          C w = t.weight[size_t(idx[d] * t.k + j)];
          if (w != C(0))
            next.push_back({c.offset + t.offset[size_t(idx[d] * t.k + j)], c.weight * w});
        }
      }
      combos.swap(next);
    }
    T* o = out + row * out_w;
    if (outside) {
      for (int64_t ox = 0; ox < out_w; ++ox) o[ox] = N::store(extrap);
    } else {
      for (int64_t ox = 0; ox < out_w; ++ox) {
        if (col.outside[size_t(ox)]) {
          o[ox] = N::store(extrap);
          continue;
        }
        const int64_t* co = &col.offset[size_t(ox * kc)];
        const C* cw = &col.weight[size_t(ox * kc)];
        C acc = 0;
        for (const Combo& c : combos) {
          const T* base = in + c.offset;
          C s = 0;
          for (int j = 0; j < kc; ++j) {
            if (cw[j] != C(0)) s += cw[j] * N::load(base[co[j]]);
          }
          acc += C(c.weight) * s;
        }
        o[ox] = N::store(acc);
      }
    }
    for (int d = rank - 2; d >= 0; --d) {
      if (++idx[d] < y.shape[d]) break;
      idx[d] = 0;
    }
  }
}

StatusOr<std::vector<double>> read_floats(const TensorView& v, const char* what) {
  std::vector<double> out(size_t(v.numel()));
  for (int64_t i = 0; i < v.numel(); ++i) {
    switch (v.dtype) {
      case DType::kFloat32:
        out[i] = v.as<const float>()[i];
        break;
      case DType::kFloat64:
        out[i] = v.as<const double>()[i];
        break;
      case DType::kFloat16:
        out[i] = half_to_float(v.as<const uint16_t>()[i]);
        break;
      case DType::kBFloat16:
        out[i] = bf16_to_float(v.as<const uint16_t>()[i]);
        break;
      case DType::kInt64:
        out[i] = double(v.as<const int64_t>()[i]);
        break;
      case DType::kInt32:
        out[i] = double(v.as<const int32_t>()[i]);
        break;
      default:
        return invalid_argument(std::string("Resize: ") + what + " has dtype " +
                                std::string(dtype_name(v.dtype)));
    }
  }
  return out;
}

// The output shape the sizes or scales data give (ONNX: sizes, or floor(dim * scale)), for a
// Resize whose output is data-dependent: the view has the shape of its bound, and the result is
// written from its start.
StatusOr<Shape> shape_from_data(const TensorView& x, const TensorView& y,
                                const std::vector<int>& axes, const std::vector<double>* sizes,
                                const std::vector<double>& scales) {
  Shape s(x.shape.begin(), x.shape.end());
  for (size_t k = 0; k < axes.size(); ++k) {
    const int d = axes[k];
    const double v = sizes ? (*sizes)[k] : std::floor(double(x.shape[d]) * scales[d]);
    if (!(v >= 0 && v <= double(ir::Interval::kInf)) || v != std::floor(v)) {
      return invalid_argument("Resize: output dim " + std::to_string(d) + " from the " +
                              (sizes ? "sizes" : "scales") + " is " + std::to_string(v) +
                              ", not a size");
    }
    s[d] = int64_t(v);
  }
  for (size_t d = 0; d < s.size(); ++d) {
    if (s[d] > y.shape[d]) {
      return internal_error("Resize: output dim " + std::to_string(d) + " is " +
                            std::to_string(s[d]) + ", past the " + std::to_string(y.shape[d]) +
                            " the plan bounds it by");
    }
  }
  return s;
}

// `sized`: the output is data-dependent; *shape gets the shape written.
Status resize_kernel(const KernelArgs& a, int opset, bool sized, Shape* shape) {
  bool opset10 = opset > 0 && opset < 11;
  const TensorView& x = a.in[0];
  TensorView y = a.out[0];
  int rank = x.rank();
  if (rank == 0 || y.rank() != rank || y.dtype != x.dtype) {
    return invalid_argument("Resize: output must have the input's rank and dtype");
  }
  KILN_ASSIGN_OR_RETURN(ResizeParams p, parse_params(a.attrs, opset10));
  KILN_ASSIGN_OR_RETURN(std::string policy,
                        a.attrs.get_string("keep_aspect_ratio_policy", "stretch"));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> raw_axes,
                        a.attrs.get_ints("axes", std::vector<int64_t>{}));
  std::vector<int> axes;
  for (int64_t ax : raw_axes) {
    if (ax < -rank || ax >= rank) return invalid_argument("Resize: axes element out of range");
    axes.push_back(int(ax < 0 ? ax + rank : ax));
  }
  if (axes.empty()) {
    for (int d = 0; d < rank; ++d) axes.push_back(d);
  }
  size_t n = axes.size();
  auto given = [&](int i) {
    return int(a.in.size()) > i && present(a.in[i]) && a.in[i].numel() > 0;
  };
  int scales_in = opset10 ? 1 : 2, sizes_in = opset10 ? -1 : 3;
  std::vector<double> scales(size_t(rank), 1.0);
  std::vector<double> roi(size_t(2 * rank), 0.0);
  for (int d = 0; d < rank; ++d) roi[rank + d] = 1.0;
  if (given(scales_in)) {
    KILN_ASSIGN_OR_RETURN(std::vector<double> s, read_floats(a.in[scales_in], "scales"));
    if (s.size() != n) return invalid_argument("Resize: scales length does not match the axes");
    for (size_t k = 0; k < n; ++k) {
      if (!(s[k] > 0) || !std::isfinite(s[k]))
        return invalid_argument("Resize: scales must be > 0");
      scales[axes[k]] = s[k];
    }
    if (sized) {
      KILN_ASSIGN_OR_RETURN(*shape, shape_from_data(x, y, axes, nullptr, scales));
      y.shape = *shape;
    }
  } else if (sizes_in >= 0 && given(sizes_in)) {
    KILN_ASSIGN_OR_RETURN(std::vector<double> s, read_floats(a.in[sizes_in], "sizes"));
    if (s.size() != n) return invalid_argument("Resize: sizes length does not match the axes");
    if (sized) {
      KILN_ASSIGN_OR_RETURN(*shape, shape_from_data(x, y, axes, &s, scales));
      y.shape = *shape;
    }
    double common = policy == "not_larger" ? INFINITY : 0;
    for (size_t k = 0; k < n; ++k) {
      double r = s[k] / double(x.shape[axes[k]]);
      scales[axes[k]] = r;
      common = policy == "not_larger" ? std::min(common, r) : std::max(common, r);
    }
    if (policy != "stretch") {
      for (size_t k = 0; k < n; ++k) scales[axes[k]] = common;
    }
  } else {
    return invalid_argument("Resize: one of scales or sizes must be given");
  }
  if (p.coord == Coord::kTfCropAndResize) {
    if (!given(1)) return invalid_argument("Resize: tf_crop_and_resize needs roi");
    KILN_ASSIGN_OR_RETURN(std::vector<double> r, read_floats(a.in[1], "roi"));
    if (r.size() != 2 * n) return invalid_argument("Resize: roi length must be twice the axes");
    for (size_t k = 0; k < n; ++k) {
      roi[axes[k]] = r[k];
      roi[rank + axes[k]] = r[n + k];
    }
  }
  if (y.numel() == 0) return ok_status();
  if (x.numel() == 0)
    return invalid_argument("Resize: cannot resize an empty input to a non-empty output");
  for (double s : scales) {
    if (!(s > 0) || !std::isfinite(s))
      return invalid_argument("Resize: derived scale is not positive");
  }
  switch (x.dtype) {
    case DType::kFloat32:
      resize_run<float>(p, x, y, scales, roi);
      break;
    case DType::kFloat64:
      resize_run<double>(p, x, y, scales, roi);
      break;
    case DType::kFloat16:
      resize_run<Half>(p, x, y, scales, roi);
      break;
    case DType::kBFloat16:
      resize_run<BF16>(p, x, y, scales, roi);
      break;
    default: {
      if (p.mode != Mode::kNearest) {
        return unsupported("Resize: mode linear/cubic on dtype " +
                           std::string(dtype_name(x.dtype)));
      }
      switch (x.dtype) {
        case DType::kInt64:
          resize_run<int64_t>(p, x, y, scales, roi);
          break;
        case DType::kInt32:
          resize_run<int32_t>(p, x, y, scales, roi);
          break;
        case DType::kInt8:
          resize_run<int8_t>(p, x, y, scales, roi);
          break;
        case DType::kUInt8:
          resize_run<uint8_t>(p, x, y, scales, roi);
          break;
        default:
          return unsupported("Resize: dtype " + std::string(dtype_name(x.dtype)));
      }
    }
  }
  return ok_status();
}

// Runs resize_kernel; where the sizes or scales are computed at run time (the output's dims are
// then data-dependent), reports the shape they gave.
class ResizeKernel final : public Kernel {
 public:
  ResizeKernel(ir::Attributes attrs, int opset, bool sized)
      : attrs_(std::move(attrs)), opset_(opset), sized_(sized) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    valid_ = false;
    KILN_RETURN_IF_ERROR(resize_kernel(KernelArgs{attrs_, in, out}, opset_, sized_, &shape_));
    valid_ = sized_;
    return ok_status();
  }
  std::string name() const override { return "cpu.Resize"; }
  StatusOr<Shape> data_dependent_shape(size_t output) const override {
    if (!valid_ || output != 0) return Kernel::data_dependent_shape(output);
    return shape_;
  }

 private:
  ir::Attributes attrs_;
  int opset_;
  bool sized_;
  Shape shape_;
  bool valid_ = false;
};

StatusOr<std::unique_ptr<Kernel>> make_resize_kernel(const KernelQuery& q) {
  const bool opset10 = q.node.opset > 0 && q.node.opset < 11;
  const bool sized = opset10 ? computed_at_run_time(q, 1)
                             : computed_at_run_time(q, 2) || computed_at_run_time(q, 3);
  return std::unique_ptr<Kernel>(new ResizeKernel(q.node.attrs, q.node.opset, sized));
}

// ---------------------------------------------------------------------------------------------
// DepthToSpace / SpaceToDepth: pure data movement, so any dtype by element size.

template <size_t kBytes>
struct Bytes {
  unsigned char b[kBytes];
};

// out[n, c, h*b + i, w*b + j] = in[n, channel(c, i, j), h, w] for DepthToSpace; SpaceToDepth is
// the inverse permutation (in both modes: SpaceToDepth has CRD from opset 28), done by swapping
// the roles of the two tensors. A row of the wide tensor interleaves b rows of the deep one, so
// each (plane, row, i, j) is one strided run, with no division per element (the first version
// divided and took the remainder of every index: 1.9 ms of UNet's 10 at batch 2 on the 2-core
// development machine); the wide tensor's planes go over the CPU's threads.
template <typename E>
void depth_space_copy(const E* src, E* dst, int64_t batch, int64_t c_out, int64_t h, int64_t w,
                      int64_t b, bool crd, bool to_space) {
  const int64_t c_in = c_out * b * b, ww = w * b;
  auto plane = [&](int64_t t) {
    const int64_t n = t / c_out, c = t % c_out;
    for (int64_t ih = 0; ih < h; ++ih) {
      for (int64_t i = 0; i < b; ++i) {
        const int64_t wide = ((n * c_out + c) * h * b + ih * b + i) * ww;
        for (int64_t j = 0; j < b; ++j) {
          const int64_t ch = crd ? c * b * b + i * b + j : (i * b + j) * c_out + c;
          const int64_t deep = ((n * c_in + ch) * h + ih) * w;
          if (to_space) {
            for (int64_t iw = 0; iw < w; ++iw) dst[wide + iw * b + j] = src[deep + iw];
          } else {
            for (int64_t iw = 0; iw < w; ++iw) dst[deep + iw] = src[wide + iw * b + j];
          }
        }
      }
    }
  };
  const int64_t planes = batch * c_out;
  if (planes > 1 && planes * h * ww >= (int64_t(1) << 16)) {
    parallel_for(planes, plane);
  } else {
    for (int64_t t = 0; t < planes; ++t) plane(t);
  }
}

Status depth_space(const KernelArgs& a, bool to_space) {
  const char* op = to_space ? "DepthToSpace" : "SpaceToDepth";
  const TensorView& x = a.in[0];
  const TensorView& y = a.out[0];
  KILN_ASSIGN_OR_RETURN(int64_t b, a.attrs.get_int("blocksize", std::nullopt));
  KILN_ASSIGN_OR_RETURN(std::string mode, a.attrs.get_string("mode", "DCR"));
  if (x.rank() != 4 || y.rank() != 4 || x.dtype != y.dtype || b <= 0 ||
      (mode != "DCR" && mode != "CRD")) {
    return invalid_argument(std::string(op) +
                            ": needs rank-4 input, blocksize > 0 and mode DCR/CRD");
  }
  // The "deep" tensor is [N, C*b*b, H, W], the "wide" one [N, C, H*b, W*b].
  const TensorView& deep = to_space ? x : y;
  const TensorView& wide = to_space ? y : x;
  int64_t batch = deep.shape[0], h = deep.shape[2], w = deep.shape[3];
  auto bb = checked_mul(b, b);
  if (!bb || deep.shape[1] % *bb != 0) {
    return invalid_argument(std::string(op) + ": channels not divisible by blocksize^2");
  }
  int64_t c = deep.shape[1] / *bb;
  if (wide.shape[0] != batch || wide.shape[1] != c || wide.shape[2] != h * b ||
      wide.shape[3] != w * b) {
    return invalid_argument(std::string(op) + ": output shape does not match the input");
  }
  bool crd = mode == "CRD";
  switch (dtype_size(x.dtype)) {
    case 1:
      depth_space_copy(x.as<const Bytes<1>>(), y.as<Bytes<1>>(), batch, c, h, w, b, crd, to_space);
      break;
    case 2:
      depth_space_copy(x.as<const Bytes<2>>(), y.as<Bytes<2>>(), batch, c, h, w, b, crd, to_space);
      break;
    case 4:
      depth_space_copy(x.as<const Bytes<4>>(), y.as<Bytes<4>>(), batch, c, h, w, b, crd, to_space);
      break;
    case 8:
      depth_space_copy(x.as<const Bytes<8>>(), y.as<Bytes<8>>(), batch, c, h, w, b, crd, to_space);
      break;
    default:
      return unsupported(std::string(op) + ": dtype " + std::string(dtype_name(x.dtype)));
  }
  return ok_status();
}

Status depth_to_space_kernel(const KernelArgs& a) { return depth_space(a, true); }
Status space_to_depth_kernel(const KernelArgs& a) { return depth_space(a, false); }

}  // namespace

void register_resize_kernels(KernelRegistry& r) {
  r.add_factory(ops::OpKind::kResize, &make_resize_kernel);
  r.add(ops::OpKind::kDepthToSpace, &depth_to_space_kernel);
  r.add(ops::OpKind::kSpaceToDepth, &space_to_depth_kernel);
}

}  // namespace kiln::backends::cpu
