// CPU reference kernels of the spatial op family: GridSample, AffineGrid, CenterCropPad, Einsum,
// BitCast and RoiAlign (DFT, STFT and MelWeightMatrix are in spectral.cc). They compute in
// double; none is on a hot path of the shipped models.
#include "ops/spatial.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/dtype_dispatch.h"
#include "backends/cpu/numeric.h"
#include "backends/cpu/spatial_family.h"

namespace kiln::backends::cpu {

Status check_present(const KernelArgs& a, size_t num_in, const char* op) {
  if (a.in.size() < num_in || a.out.empty() || !present(a.out[0])) {
    return invalid_argument(std::string(op) + ": expected " + std::to_string(num_in) +
                            " inputs and an output");
  }
  for (size_t i = 0; i < num_in; ++i) {
    if (!present(a.in[i])) {
      return invalid_argument(std::string(op) + ": input " + std::to_string(i) + " is missing");
    }
  }
  return ok_status();
}

namespace {

using ops::OpKind;

std::vector<int64_t> strides_of(std::span<const int64_t> shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int d = int(shape.size()) - 2; d >= 0; --d) {
    s[size_t(d)] = s[size_t(d) + 1] * shape[size_t(d) + 1];
  }
  return s;
}

// ---- GridSample ----

enum class Mode { kNearest, kLinear, kCubic };
enum class Padding { kZeros, kBorder, kReflection };

// Reflects x into [lo, hi] as the ONNX reference does (a fold, not a modulo).
double reflect(double x, double lo, double hi) {
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

void cubic_coeffs(double x, double c[4]) {
  constexpr double a = -0.75;
  x = std::fabs(x);
  c[0] = ((a * (x + 1) - 5 * a) * (x + 1) + 8 * a) * (x + 1) - 4 * a;
  c[1] = ((a + 2) * x - (a + 3)) * x * x + 1;
  c[2] = ((a + 2) * (1 - x) - (a + 3)) * (1 - x) * (1 - x) + 1;
  c[3] = ((a * (2 - x) - 5 * a) * (2 - x) + 8 * a) * (2 - x) - 4 * a;
}

struct Tap {
  int64_t index;  // -1: outside under zeros padding
  double weight;
};

Status grid_sample_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_present(a, 2, "GridSample"));
  const TensorView& x = a.in[0];
  const TensorView& grid = a.in[1];
  const TensorView& y = a.out[0];
  KILN_ASSIGN_OR_RETURN(std::string mode_s, a.attrs.get_string("mode", "linear"));
  KILN_ASSIGN_OR_RETURN(std::string pad_s, a.attrs.get_string("padding_mode", "zeros"));
  KILN_ASSIGN_OR_RETURN(int64_t align, a.attrs.get_int("align_corners", 0));
  Mode mode = mode_s == "nearest"                          ? Mode::kNearest
              : (mode_s == "cubic" || mode_s == "bicubic") ? Mode::kCubic
                                                           : Mode::kLinear;
  Padding pad = pad_s == "border"       ? Padding::kBorder
                : pad_s == "reflection" ? Padding::kReflection
                                        : Padding::kZeros;
  int r = x.rank() - 2;
  if (r < 1 || grid.rank() != x.rank() || y.rank() != x.rank() || grid.shape.back() != r ||
      grid.shape[0] != x.shape[0]) {
    return invalid_argument("GridSample: X, grid and Y shapes do not agree");
  }
  const int64_t n_batch = x.shape[0], channels = x.shape[1];
  std::vector<int64_t> dims(x.shape.begin() + 2, x.shape.end());
  std::vector<int64_t> xstr = strides_of(x.shape);
  int64_t x_spatial = 1, out_spatial = 1;
  for (int64_t d : dims) x_spatial *= d;
  for (int i = 1; i + 1 < grid.rank(); ++i) out_spatial *= grid.shape[size_t(i)];
  std::vector<std::vector<Tap>> taps(static_cast<size_t>(r));
  for (int64_t n = 0; n < n_batch; ++n) {
    for (int64_t o = 0; o < out_spatial; ++o) {
      const int64_t gbase = (n * out_spatial + o) * r;
      for (int i = 0; i < r; ++i) {
        const double L = double(dims[size_t(i)]);
        double g = load_f64(grid, gbase + (r - 1 - i));  // grid's last dim is (x, y, z): reversed
        double c = align ? (g + 1) / 2 * (L - 1) : ((g + 1) * L - 1) / 2;
        if (mode == Mode::kNearest) c = std::nearbyint(c);
        double lo = align ? 0 : -0.5, hi = align ? L - 1 : L - 0.5;
        if (c < lo || c > hi) {
          if (pad == Padding::kBorder) c = std::clamp(c, 0.0, L - 1);
          if (pad == Padding::kReflection) c = reflect(c, lo, hi);
        }
        auto resolve = [&](int64_t idx) -> int64_t {
          int64_t len = dims[size_t(i)];
          if (pad == Padding::kZeros) return idx >= 0 && idx < len ? idx : -1;
          if (pad == Padding::kReflection) idx = int64_t(reflect(double(idx), lo, hi));
          return std::clamp<int64_t>(idx, 0, len - 1);
        };
        auto& t = taps[size_t(i)];
        t.clear();
        if (!std::isfinite(c)) {
          t.push_back({-1, 0});
          continue;
        }
        if (mode == Mode::kNearest) {
          t.push_back({resolve(int64_t(c)), 1.0});
        } else {
          double f = std::floor(c);
          int64_t i0 = int64_t(f);
          double frac = c - f;
          if (mode == Mode::kLinear) {
            t.push_back({resolve(i0), 1 - frac});
            t.push_back({resolve(i0 + 1), frac});
          } else {
            double k[4];
            cubic_coeffs(frac, k);
            for (int j = 0; j < 4; ++j) t.push_back({resolve(i0 - 1 + j), k[j]});
          }
        }
      }
      // The tensor product of the per-dim taps.
      std::vector<size_t> pos(size_t(r), 0);
      std::vector<std::pair<int64_t, double>> points;
      while (true) {
        int64_t off = 0;
        double w = 1;
        bool valid = true;
        for (int i = 0; i < r; ++i) {
          const Tap& tp = taps[size_t(i)][pos[size_t(i)]];
          if (tp.index < 0) valid = false;
          off += tp.index * xstr[size_t(i) + 2];
          w *= tp.weight;
        }
        if (valid) points.push_back({off, w});
        int i = r - 1;
        while (i >= 0 && ++pos[size_t(i)] == taps[size_t(i)].size()) pos[size_t(i--)] = 0;
        if (i < 0) break;
      }
      for (int64_t ch = 0; ch < channels; ++ch) {
        const int64_t xbase = (n * channels + ch) * x_spatial;
        double acc = 0;
        for (const auto& [off, w] : points) acc += w * load_f64(x, xbase + off);
        store_f64(y, (n * channels + ch) * out_spatial + o, acc);
      }
    }
  }
  return ok_status();
}

// ---- AffineGrid ----

Status affine_grid_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_present(a, 2, "AffineGrid"));
  const TensorView& theta = a.in[0];
  const TensorView& grid = a.out[0];
  KILN_ASSIGN_OR_RETURN(int64_t align, a.attrs.get_int("align_corners", 0));
  int r = grid.rank() - 2;
  if (r < 1 || theta.rank() != 3 || theta.shape[1] != r || theta.shape[2] != r + 1 ||
      grid.shape.back() != r || grid.shape[0] != theta.shape[0]) {
    return invalid_argument("AffineGrid: theta and the output grid shapes do not agree");
  }
  std::vector<int64_t> dims(grid.shape.begin() + 1, grid.shape.end() - 1);
  int64_t spatial = 1;
  for (int64_t d : dims) spatial *= d;
  std::vector<double> base(size_t(r) + 1, 1.0);
  std::vector<int64_t> idx(size_t(r), 0);
  for (int64_t n = 0; n < grid.shape[0]; ++n) {
    std::fill(idx.begin(), idx.end(), 0);
    for (int64_t s = 0; s < spatial; ++s) {
      for (int j = 0; j < r; ++j) {  // base[m] is the coordinate of spatial dim r-1-m
        double L = double(dims[size_t(j)]);
        double k = double(idx[size_t(j)]);
        double v = align ? (L > 1 ? -1 + k * 2 / (L - 1) : -1) : -1 + (2 * k + 1) / L;
        base[size_t(r - 1 - j)] = v;
      }
      for (int i = 0; i < r; ++i) {
        double acc = 0;
        for (int m = 0; m <= r; ++m) {
          acc += load_f64(theta, (n * r + i) * (r + 1) + m) * base[size_t(m)];
        }
        store_f64(grid, (n * spatial + s) * r + i, acc);
      }
      for (int j = r - 1; j >= 0 && ++idx[size_t(j)] == dims[size_t(j)]; --j) idx[size_t(j)] = 0;
    }
  }
  return ok_status();
}

// ---- CenterCropPad ----

// Every output dim is centered on its input dim: a crop or pad starts floor(diff / 2) in.
Status center_crop_pad_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_present(a, 1, "CenterCropPad"));
  const TensorView& x = a.in[0];
  const TensorView& y = a.out[0];
  if (x.rank() != y.rank() || x.dtype != y.dtype) {
    return invalid_argument("CenterCropPad: output rank or dtype differs from the input's");
  }
  const size_t es = dtype_size(x.dtype);
  if (y.nbytes() > 0) std::memset(y.data, 0, y.nbytes());
  const int rank = x.rank();
  if (y.numel() == 0) return ok_status();
  std::vector<int64_t> xs = strides_of(x.shape);
  std::vector<int64_t> idx(size_t(rank), 0);
  for (int64_t o = 0, n = y.numel(); o < n; ++o) {
    int64_t off = 0;
    bool valid = true;
    for (int d = 0; d < rank; ++d) {
      int64_t in = x.shape[size_t(d)], out = y.shape[size_t(d)];
      int64_t i = out <= in ? idx[size_t(d)] + (in - out) / 2 : idx[size_t(d)] - (out - in) / 2;
      if (i < 0 || i >= in) valid = false;
      off += i * xs[size_t(d)];
    }
    if (valid) {
      std::memcpy(static_cast<char*>(y.data) + size_t(o) * es,
                  static_cast<const char*>(x.data) + size_t(off) * es, es);
    }
    for (int d = rank - 1; d >= 0 && ++idx[size_t(d)] == y.shape[size_t(d)]; --d) {
      idx[size_t(d)] = 0;
    }
  }
  return ok_status();
}

// ---- Einsum ----

Status einsum_kernel(const KernelArgs& a) {
  if (a.in.empty() || a.out.empty()) {
    return invalid_argument("Einsum: expected inputs and an output");
  }
  KILN_ASSIGN_OR_RETURN(std::string eq, a.attrs.get_string("equation", std::nullopt));
  std::vector<int> ranks;
  for (size_t i = 0; i < a.in.size(); ++i) {
    if (!present(a.in[i])) {
      return invalid_argument("Einsum: input " + std::to_string(i) + " is missing");
    }
    ranks.push_back(a.in[i].rank());
  }
  KILN_ASSIGN_OR_RETURN(ops::EinsumSpec spec, ops::parse_einsum(eq, ranks));
  const int nl = spec.num_labels();
  std::vector<int64_t> size(size_t(nl), -1);
  for (size_t i = 0; i < a.in.size(); ++i) {
    for (size_t d = 0; d < spec.inputs[i].size(); ++d) {
      int l = spec.inputs[i][d];
      int64_t v = a.in[i].shape[d];
      int64_t& s = size[size_t(l)];
      const bool ellipsis = l >= ops::kEinsumEllipsisLabel;
      if (s < 0 || (ellipsis && s == 1)) {
        s = v;
      } else if (v != s && !(ellipsis && v == 1)) {
        return invalid_argument("Einsum: input " + std::to_string(i) + " dim " + std::to_string(d) +
                                " (" + std::to_string(v) + ") does not match its label's size " +
                                std::to_string(s));
      }
    }
  }
  // Loop order: output labels, then the summed ones.
  std::vector<int> order = spec.output;
  for (int l = 0; l < nl; ++l) {
    if (size[size_t(l)] >= 0 && std::find(order.begin(), order.end(), l) == order.end()) {
      order.push_back(l);
    }
  }
  const TensorView& y = a.out[0];
  if (int(spec.output.size()) != y.rank()) return invalid_argument("Einsum: output rank differs");
  for (size_t k = 0; k < spec.output.size(); ++k) {
    if (size[size_t(spec.output[k])] < 0) size[size_t(spec.output[k])] = 1;
    if (y.shape[k] != size[size_t(spec.output[k])]) {
      return invalid_argument("Einsum: output dim " + std::to_string(k) + " differs");
    }
  }
  // Per operand, the stride each loop label advances it by (0 for a broadcast ellipsis dim).
  const size_t nloop = order.size();
  std::vector<std::vector<int64_t>> step(a.in.size(), std::vector<int64_t>(nloop, 0));
  for (size_t i = 0; i < a.in.size(); ++i) {
    std::vector<int64_t> st = strides_of(a.in[i].shape);
    for (size_t d = 0; d < spec.inputs[i].size(); ++d) {
      if (a.in[i].shape[d] == 1 && size[size_t(spec.inputs[i][d])] != 1) continue;
      size_t k = size_t(std::find(order.begin(), order.end(), spec.inputs[i][d]) - order.begin());
      step[i][k] += st[d];
    }
  }
  std::vector<std::vector<double>> data;
  for (const TensorView& v : a.in) data.push_back(to_f64(v));
  const size_t nout = spec.output.size();
  int64_t out_count = y.numel(), inner = 1;
  for (size_t k = nout; k < nloop; ++k) inner *= size[size_t(order[k])];
  std::vector<int64_t> idx(nloop, 0);
  std::vector<int64_t> off(a.in.size(), 0);
  for (int64_t o = 0; o < out_count; ++o) {
    double acc = 0;
    for (int64_t s = 0; s < inner; ++s) {
      double p = 1;
      for (size_t i = 0; i < a.in.size(); ++i) p *= data[i][size_t(off[i])];
      acc += p;
      // Advance the summed labels.
      for (size_t k = nloop; k-- > nout;) {
        for (size_t i = 0; i < a.in.size(); ++i) off[i] += step[i][k];
        if (++idx[k] < size[size_t(order[k])]) break;
        for (size_t i = 0; i < a.in.size(); ++i) off[i] -= step[i][k] * idx[k];
        idx[k] = 0;
      }
    }
    store_f64(y, o, acc);
    for (size_t k = nout; k-- > 0;) {
      for (size_t i = 0; i < a.in.size(); ++i) off[i] += step[i][k];
      if (++idx[k] < size[size_t(order[k])]) break;
      for (size_t i = 0; i < a.in.size(); ++i) off[i] -= step[i][k] * idx[k];
      idx[k] = 0;
    }
  }
  return ok_status();
}

// ---- BitCast ----

Status bitcast_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_present(a, 1, "BitCast"));
  if (a.in[0].nbytes() != a.out[0].nbytes()) {
    return invalid_argument("BitCast: input and output byte sizes differ");
  }
  if (a.out[0].nbytes() > 0 && a.out[0].data != a.in[0].data) {
    std::memcpy(a.out[0].data, a.in[0].data, a.out[0].nbytes());
  }
  return ok_status();
}

// ---- RoiAlign ----

// Sample points per bin beyond which a region is refused: an adaptive grid (sampling_ratio 0) is
// ceil(roi size / bins) per axis, so a corrupt box would otherwise make the kernel run for hours.
constexpr double kMaxRoiSamples = 1 << 16;

// One sample point: the four corners' flat offsets in an H*W plane and their bilinear weights.
struct RoiSample {
  int64_t pos[4];
  double w[4];
};

// Follows onnx's reference (op_roi_align.py) step for step: a point more than one pixel outside
// the map reads 0 with weight 0; otherwise it is clamped into the map. avg averages the bilinear
// values of the bin's points; max takes, over the points, the largest of the four weighted corner
// terms (w_i * x_i), which is ONNX's definition (ORT's max differs).
class RoiAlignKernel final : public Kernel {
 public:
  RoiAlignKernel(bool half_pixel, bool max_mode, int64_t ratio, double scale)
      : half_pixel_(half_pixel), max_mode_(max_mode), ratio_(ratio), scale_(scale) {}
  std::string name() const override { return "cpu.RoiAlign"; }

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    if (in.size() < 3 || out.empty())
      return invalid_argument("RoiAlign: expected 3 inputs and an output");
    const TensorView &x = in[0], &rois = in[1], &idx = in[2], &y = out[0];
    if (x.rank() != 4 || rois.rank() != 2 || rois.shape[1] != 4 || idx.rank() != 1 ||
        idx.shape[0] != rois.shape[0] || y.rank() != 4 || y.shape[0] != rois.shape[0] ||
        y.shape[1] != x.shape[1]) {
      return invalid_argument("RoiAlign: X, rois, batch_indices and Y shapes do not agree");
    }
    std::vector<int64_t> batch;
    if (!read_indices(idx, &batch))
      return invalid_argument("RoiAlign: batch_indices must be int64");
    return dispatch<kFloats>(x.dtype, OpKind::kRoiAlign,
                             [&]<typename T>(Tag<T>) { return run<T>(x, rois, batch, y); });
  }

 private:
  template <typename T>
  Status run(const TensorView& x, const TensorView& rois, const std::vector<int64_t>& batch,
             const TensorView& y) {
    const int64_t n_batch = x.shape[0], channels = x.shape[1], height = x.shape[2],
                  width = x.shape[3];
    const int64_t out_h = y.shape[2], out_w = y.shape[3], plane = height * width;
    const T* xd = x.as<const T>();
    const double offset = half_pixel_ ? 0.5 : 0.0;
    std::vector<RoiSample> samples;
    for (int64_t r = 0; r < rois.shape[0]; ++r) {
      const int64_t b = batch[size_t(r)];
      if (b < 0 || b >= n_batch) {
        return invalid_argument("RoiAlign: batch_indices[" + std::to_string(r) + "] is " +
                                std::to_string(b) + ", outside [0, " + std::to_string(n_batch) +
                                ") (X's batch)");
      }
      double box[4];
      for (int k = 0; k < 4; ++k) {
        box[k] = load_f64(rois, r * 4 + k) * scale_ - offset;
        if (!std::isfinite(box[k])) {
          return invalid_argument("RoiAlign: roi " + std::to_string(r) + " is not finite");
        }
      }
      double roi_w = box[2] - box[0], roi_h = box[3] - box[1];
      if (!half_pixel_) {  // output_half_pixel makes a malformed box at least 1x1
        roi_w = std::max(roi_w, 1.0);
        roi_h = std::max(roi_h, 1.0);
      }
      const double bin_h = roi_h / double(out_h), bin_w = roi_w / double(out_w);
      double grid_hd = ratio_ > 0 ? double(ratio_) : std::ceil(bin_h);
      double grid_wd = ratio_ > 0 ? double(ratio_) : std::ceil(bin_w);
      // An inverted half_pixel box has no points: its bins are 0.
      grid_hd = std::max(grid_hd, 0.0);
      grid_wd = std::max(grid_wd, 0.0);
      if (grid_hd > kMaxRoiSamples || grid_wd > kMaxRoiSamples ||
          grid_hd * grid_wd > kMaxRoiSamples) {
        return invalid_argument("RoiAlign: roi " + std::to_string(r) + " needs " +
                                std::to_string(grid_hd) + " x " + std::to_string(grid_wd) +
                                " sample points per bin; kiln allows at most 65536");
      }
      const int64_t grid_h = int64_t(grid_hd), grid_w = int64_t(grid_wd);
      const double count = double(std::max<int64_t>(grid_h * grid_w, 1));
      samples.resize(size_t(grid_h * grid_w));
      for (int64_t ph = 0; ph < out_h; ++ph) {
        for (int64_t pw = 0; pw < out_w; ++pw) {
          for (int64_t iy = 0; iy < grid_h; ++iy) {
            const double yy =
                box[1] + double(ph) * bin_h + (double(iy) + 0.5) * bin_h / double(grid_h);
            for (int64_t ix = 0; ix < grid_w; ++ix) {
              const double xx =
                  box[0] + double(pw) * bin_w + (double(ix) + 0.5) * bin_w / double(grid_w);
              samples[size_t(iy * grid_w + ix)] = sample_at(yy, xx, height, width);
            }
          }
          for (int64_t c = 0; c < channels; ++c) {
            const T* src = xd + (b * channels + c) * plane;
            double acc = 0;
            bool first = true;
            for (const RoiSample& s : samples) {
              if (max_mode_) {
                double v = s.w[0] * double(Num<T>::load(src[s.pos[0]]));
                for (int k = 1; k < 4; ++k) {
                  v = std::max(v, s.w[k] * double(Num<T>::load(src[s.pos[k]])));
                }
                acc = first ? v : std::max(acc, v);
                first = false;
              } else {
                for (int k = 0; k < 4; ++k) acc += s.w[k] * double(Num<T>::load(src[s.pos[k]]));
              }
            }
            if (!max_mode_) acc /= count;
            store_f64(y, ((r * channels + c) * out_h + ph) * out_w + pw, acc);
          }
        }
      }
    }
    return ok_status();
  }

  static RoiSample sample_at(double y, double x, int64_t height, int64_t width) {
    RoiSample s{{0, 0, 0, 0}, {0, 0, 0, 0}};
    if (height == 0 || width == 0 || y < -1.0 || y > double(height) || x < -1.0 ||
        x > double(width)) {
      return s;
    }
    y = std::max(y, 0.0);
    x = std::max(x, 0.0);
    int64_t y_lo = int64_t(y), x_lo = int64_t(x), y_hi, x_hi;
    if (y_lo >= height - 1) {
      y_hi = y_lo = height - 1;
      y = double(y_lo);
    } else {
      y_hi = y_lo + 1;
    }
    if (x_lo >= width - 1) {
      x_hi = x_lo = width - 1;
      x = double(x_lo);
    } else {
      x_hi = x_lo + 1;
    }
    const double ly = y - double(y_lo), lx = x - double(x_lo), hy = 1 - ly, hx = 1 - lx;
    s.pos[0] = y_lo * width + x_lo;
    s.pos[1] = y_lo * width + x_hi;
    s.pos[2] = y_hi * width + x_lo;
    s.pos[3] = y_hi * width + x_hi;
    s.w[0] = hy * hx;
    s.w[1] = hy * lx;
    s.w[2] = ly * hx;
    s.w[3] = ly * lx;
    return s;
  }

  bool half_pixel_, max_mode_;
  int64_t ratio_;
  double scale_;
};

StatusOr<std::unique_ptr<Kernel>> make_roi_align(const KernelQuery& q) {
  const ir::Attributes& at = q.node.attrs;
  KILN_ASSIGN_OR_RETURN(std::string ctm,
                        at.get_string("coordinate_transformation_mode",
                                      q.node.opset >= 16 ? "half_pixel" : "output_half_pixel"));
  KILN_ASSIGN_OR_RETURN(std::string mode, at.get_string("mode", "avg"));
  KILN_ASSIGN_OR_RETURN(int64_t ratio, at.get_int("sampling_ratio", 0));
  KILN_ASSIGN_OR_RETURN(float scale, at.get_float("spatial_scale", 1.0f));
  if ((ctm != "half_pixel" && ctm != "output_half_pixel") || (mode != "avg" && mode != "max") ||
      ratio < 0 || !std::isfinite(scale)) {
    return unsupported(q.node.describe() + ": RoiAlign attributes out of range");
  }
  return std::unique_ptr<Kernel>(
      new RoiAlignKernel(ctm == "half_pixel", mode == "max", ratio, double(scale)));
}

}  // namespace

void register_spatial_kernels(KernelRegistry& r) {
  r.add(OpKind::kGridSample, &grid_sample_kernel);
  r.add(OpKind::kAffineGrid, &affine_grid_kernel);
  r.add(OpKind::kCenterCropPad, &center_crop_pad_kernel);
  r.add(OpKind::kEinsum, &einsum_kernel);
  r.add(OpKind::kBitCast, &bitcast_kernel);
  r.add_factory(OpKind::kRoiAlign, &make_roi_align);
  register_spectral_kernels(r);
}

}  // namespace kiln::backends::cpu
