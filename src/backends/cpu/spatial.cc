// CPU reference kernels of the spatial op family: GridSample, AffineGrid, CenterCropPad, Einsum,
// DFT, STFT, MelWeightMatrix, BitCast and RoiAlign. They compute in double; none is on a hot path
// of the shipped models.
#include "ops/spatial.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/dtype_dispatch.h"
#include "backends/cpu/numeric.h"

namespace kiln::backends::cpu {
namespace {

using ops::OpKind;

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

// ---- DFT, STFT ----

// The twiddle table of an n-point transform: cos and sin of 2*pi*t/n.
struct Twiddles {
  explicit Twiddles(int64_t n) : n(n), cs(size_t(n)), sn(size_t(n)) {
    for (int64_t t = 0; t < n; ++t) {
      double ang = 2 * std::numbers::pi * double(t) / double(n);
      cs[size_t(t)] = std::cos(ang);
      sn[size_t(t)] = std::sin(ang);
    }
  }
  int64_t n;
  std::vector<double> cs, sn;
};

// Bin k of an n-point transform over samples t in [0, terms): sample(t, &re, &im) gives sample t
// (false to skip it). sign is -1 forward, +1 inverse; the sum is in double, unscaled. DFT and
// STFT both transform through this.
template <typename Sample>
void dft_bin(const Twiddles& tw, double sign, int64_t k, int64_t terms, Sample sample,
             double* re_out, double* im_out) {
  double re = 0, im = 0;
  for (int64_t t = 0; t < terms; ++t) {
    double xr, xi;
    if (!sample(t, &xr, &xi)) continue;
    size_t w = size_t((k * t) % tw.n);
    double c = tw.cs[w], s = sign * tw.sn[w];
    re += xr * c - xi * s;
    im += xr * s + xi * c;
  }
  *re_out = re;
  *im_out = im;
}

// DFT's axis is an attribute (default 1) before opset 20 and an input (default -2) from it on,
// so the kernel keeps the node's opset.
class DftKernel final : public Kernel {
 public:
  DftKernel(ir::Attributes attrs, int opset) : attrs_(std::move(attrs)), opset_(opset) {}
  std::string name() const override { return "cpu.DFT"; }
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    if (in.empty() || !present(in[0]) || out.empty()) {
      return invalid_argument("DFT: expected an input and an output");
    }
    const TensorView& x = in[0];
    const TensorView& y = out[0];
    const int rank = x.rank();
    KILN_ASSIGN_OR_RETURN(int64_t inverse, attrs_.get_int("inverse", 0));
    KILN_ASSIGN_OR_RETURN(int64_t onesided, attrs_.get_int("onesided", 0));
    int64_t axis = 1;
    if (opset_ >= 20) {
      axis = -2;
      if (in.size() > 2 && present(in[2])) {
        std::vector<int64_t> v;
        if (!read_indices(in[2], &v) || v.size() != 1) {
          return invalid_argument("DFT: axis must be one int32 or int64");
        }
        axis = v[0];
      }
    } else {
      KILN_ASSIGN_OR_RETURN(axis, attrs_.get_int("axis", 1));
    }
    if (axis < 0) axis += rank;
    if (rank < 2 || axis < 0 || axis > rank - 2) {
      return invalid_argument("DFT: axis " + std::to_string(axis) + " is out of range");
    }
    const int64_t in_len = x.shape[size_t(axis)];
    // Inverse and onesided is the inverse real FFT: the input holds bins 0..n/2 of a conjugate
    // symmetric spectrum and the output is n real samples.
    const bool irfft = inverse && onesided;
    int64_t n = irfft ? 2 * (in_len - 1) : in_len;
    if (in.size() > 1 && present(in[1])) {
      std::vector<int64_t> v;
      if (!read_indices(in[1], &v) || v.size() != 1 || v[0] < 1) {
        return invalid_argument("DFT: dft_length must be one positive integer");
      }
      n = v[0];
    }
    if (n < 1) return invalid_argument("DFT: the signal length must be positive");
    const int64_t out_len = (onesided && !irfft) ? n / 2 + 1 : n;
    const int64_t comps = x.shape.back();
    const int64_t out_comps = irfft ? 1 : 2;
    if ((comps != 1 && comps != 2) || y.rank() != rank || y.shape[size_t(axis)] != out_len ||
        y.shape.back() != out_comps) {
      return invalid_argument("DFT: input or output shape is not [..., n, 1 or 2]");
    }
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= x.shape[size_t(d)];
    for (int d = axis + 1; d < rank - 1; ++d) inner *= x.shape[size_t(d)];
    const double sign = inverse ? 1.0 : -1.0;
    const double scale = inverse ? 1.0 / double(n) : 1.0;
    const Twiddles tw(n);
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        auto sample = [&](int64_t t, double* xr, double* xi) {
          int64_t at = t;
          double conj = 1;
          if (irfft && t >= in_len) {  // the mirrored half: conj(X[n - t])
            at = n - t;
            conj = -1;
            if (at >= in_len) return false;
          }
          int64_t src = ((o * in_len + at) * inner + i) * comps;
          *xr = load_f64(x, src);
          *xi = comps == 2 ? conj * load_f64(x, src + 1) : 0.0;
          return true;
        };
        for (int64_t k = 0; k < out_len; ++k) {
          double re, im;
          dft_bin(tw, sign, k, irfft ? n : std::min(in_len, n), sample, &re, &im);
          int64_t dst = ((o * out_len + k) * inner + i) * out_comps;
          store_f64(y, dst, re * scale);
          if (!irfft) store_f64(y, dst + 1, im * scale);
        }
      }
    }
    return ok_status();
  }

 private:
  ir::Attributes attrs_;
  int opset_;
};

StatusOr<std::unique_ptr<Kernel>> make_dft(const KernelQuery& q) {
  return std::unique_ptr<Kernel>(new DftKernel(q.node.attrs, q.node.opset));
}

// STFT: frame f of batch b is samples [f * frame_step, f * frame_step + n) of the signal, times
// the window (ones when omitted), transformed forward; onesided keeps bins 0..n/2. The output's
// frame and bin counts come from its shape (the schema's), n from the window, frame_length or the
// signal.
Status stft_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_present(a, 2, "STFT"));
  const TensorView& x = a.in[0];
  const TensorView& y = a.out[0];
  const bool has_window = a.in.size() > 2 && present(a.in[2]);
  const bool has_length = a.in.size() > 3 && present(a.in[3]);
  std::vector<int64_t> step;
  if (!read_indices(a.in[1], &step) || step.size() != 1 || step[0] < 1) {
    return invalid_argument("STFT: frame_step must be one positive integer");
  }
  if (x.rank() != 3 || (x.shape[2] != 1 && x.shape[2] != 2)) {
    return invalid_argument("STFT: the signal " + shape_to_string(x.shape) +
                            " is not [batch, length, 1 or 2]");
  }
  int64_t n = x.shape[1];
  if (has_window) n = a.in[2].numel();
  if (has_length) {
    std::vector<int64_t> v;
    if (!read_indices(a.in[3], &v) || v.size() != 1 || v[0] < 1 || (has_window && v[0] != n)) {
      return invalid_argument(
          "STFT: frame_length must be one positive integer equal to the "
          "window's length");
    }
    n = v[0];
  }
  KILN_ASSIGN_OR_RETURN(int64_t onesided, a.attrs.get_int("onesided", 1));
  const int64_t frames = n >= 1 && x.shape[1] >= n ? (x.shape[1] - n) / step[0] + 1 : 0;
  const int64_t bins = onesided ? n / 2 + 1 : n;
  if (frames < 1 || y.rank() != 4 || y.shape[0] != x.shape[0] || y.shape[1] != frames ||
      y.shape[2] != bins || y.shape[3] != 2) {
    return invalid_argument("STFT: the output " + shape_to_string(y.shape) + " is not [" +
                            std::to_string(x.shape[0]) + ", " + std::to_string(frames) + ", " +
                            std::to_string(bins) + ", 2] for a signal " + shape_to_string(x.shape) +
                            " in frames of " + std::to_string(n));
  }
  const int64_t comps = x.shape[2];
  const Twiddles tw(n);
  for (int64_t b = 0; b < x.shape[0]; ++b) {
    for (int64_t f = 0; f < frames; ++f) {
      const int64_t start = b * x.shape[1] + f * step[0];
      auto sample = [&](int64_t t, double* xr, double* xi) {
        const double w = has_window ? load_f64(a.in[2], t) : 1.0;
        *xr = w * load_f64(x, (start + t) * comps);
        *xi = comps == 2 ? w * load_f64(x, (start + t) * comps + 1) : 0.0;
        return true;
      };
      for (int64_t k = 0; k < bins; ++k) {
        double re, im;
        dft_bin(tw, -1.0, k, n, sample, &re, &im);
        const int64_t dst = ((b * frames + f) * bins + k) * 2;
        store_f64(y, dst, re);
        store_f64(y, dst + 1, im);
      }
    }
  }
  return ok_status();
}

// ---- MelWeightMatrix ----

// Triangular filters over the spectrogram bins, num_mel_bins + 2 edges spaced evenly in mel
// between the two edge frequencies, as the ONNX reference computes them. `F` is the edge inputs'
// dtype: the reference takes log1p of the inputs in that precision, the rest in double.
template <typename F>
std::vector<int64_t> mel_edges(int64_t num_mel_bins, int64_t dft_length, int64_t sample_rate,
                               F lower, F upper) {
  auto to_mel = [](F hz) { return double(F(2595) * F(std::log1p(hz / F(700)))) / std::log(10.0); };
  const double low = to_mel(lower), high = to_mel(upper);
  const double step = (high - low) / double(num_mel_bins + 2);
  std::vector<int64_t> edges(size_t(num_mel_bins + 2));
  for (int64_t i = 0; i < num_mel_bins + 2; ++i) {
    const double hz = 700 * std::expm1((double(i) * step + low) / 2595 * std::log(10.0));
    edges[size_t(i)] = int64_t(std::floor(double(dft_length + 1) * hz / double(sample_rate)));
  }
  return edges;
}

Status mel_weight_matrix_kernel(const KernelArgs& a) {
  KILN_ASSIGN_OR_RETURN(const int64_t odt, a.attrs.get_int("output_datatype", 1));
  (void)odt;  // the output view has the dtype the schema derived from it
  KILN_RETURN_IF_ERROR(check_present(a, 5, "MelWeightMatrix"));
  int64_t v[3];
  const char* names[] = {"num_mel_bins", "dft_length", "sample_rate"};
  for (int i = 0; i < 3; ++i) {
    std::vector<int64_t> r;
    if (!read_indices(a.in[size_t(i)], &r) || r.size() != 1 || r[0] < 1) {
      return invalid_argument(std::string("MelWeightMatrix: ") + names[i] +
                              " must be one positive integer");
    }
    v[i] = r[0];
  }
  const TensorView& lo = a.in[3];
  const TensorView& hi = a.in[4];
  if (lo.numel() != 1 || hi.numel() != 1 || lo.dtype != hi.dtype || !is_float(lo.dtype)) {
    return invalid_argument(
        "MelWeightMatrix: lower_edge_hertz and upper_edge_hertz must be "
        "float scalars of one dtype");
  }
  const TensorView& y = a.out[0];
  const int64_t bins = v[1] / 2 + 1, mels = v[0];
  if (y.rank() != 2 || y.shape[0] != bins || y.shape[1] != mels) {
    return invalid_argument("MelWeightMatrix: the output " + shape_to_string(y.shape) +
                            " is not [dft_length / 2 + 1, num_mel_bins]");
  }
  const std::vector<int64_t> edges =
      lo.dtype == DType::kFloat64
          ? mel_edges<double>(mels, v[1], v[2], load_f64(lo, 0), load_f64(hi, 0))
          : mel_edges<float>(mels, v[1], v[2], float(load_f64(lo, 0)), float(load_f64(hi, 0)));
  for (int64_t e : edges) {
    if (e < 0 || e >= bins) {
      return invalid_argument("MelWeightMatrix: the edge frequencies map to spectrogram bin " +
                              std::to_string(e) + ", outside [0, " + std::to_string(bins) +
                              "): upper_edge_hertz is past the Nyquist frequency for dft_length " +
                              std::to_string(v[1]));
    }
  }
  std::vector<double> w(size_t(bins * mels), 0.0);
  for (int64_t m = 0; m < mels; ++m) {
    const int64_t left = edges[size_t(m)], center = edges[size_t(m + 1)],
                  right = edges[size_t(m + 2)];
    if (center == left) {
      w[size_t(center * mels + m)] = 1;
    } else {
      for (int64_t j = left; j <= center; ++j) {
        w[size_t(j * mels + m)] = double(j - left) / double(center - left);
      }
    }
    for (int64_t j = center; j < right; ++j) {
      w[size_t(j * mels + m)] = double(right - j) / double(right - center);
    }
  }
  for (int64_t i = 0; i < bins * mels; ++i) store_f64(y, i, w[size_t(i)]);
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
  r.add_factory(OpKind::kDFT, &make_dft);
  r.add(OpKind::kSTFT, &stft_kernel);
  r.add(OpKind::kMelWeightMatrix, &mel_weight_matrix_kernel);
  r.add(OpKind::kBitCast, &bitcast_kernel);
  r.add_factory(OpKind::kRoiAlign, &make_roi_align);
}

}  // namespace kiln::backends::cpu
