// CPU reference kernels of the spectral ops of the spatial family: DFT, STFT and
// MelWeightMatrix, through one direct (not fast) transform that sums in double.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/numeric.h"
#include "backends/cpu/spatial_family.h"

namespace kiln::backends::cpu {
namespace {

using ops::OpKind;

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

}  // namespace

void register_spectral_kernels(KernelRegistry& r) {
  r.add_factory(OpKind::kDFT, &make_dft);
  r.add(OpKind::kSTFT, &stft_kernel);
  r.add(OpKind::kMelWeightMatrix, &mel_weight_matrix_kernel);
}

}  // namespace kiln::backends::cpu
