// DFT and STFT on CUDA: a direct O(n^2) transform along one axis (DFT: forward, inverse,
// onesided, the inverse real FFT, dft_length's zero padding or truncation; STFT: windowed frames
// of a signal), one thread per output element accumulating in double over a twiddle table in the
// workspace, as the CPU reference (cpu/spatial.cc) computes.
#include <algorithm>
#include <optional>
#include <string>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;
constexpr int kBlock = 256;

// X is [outer, in_len, inner, comps] and Y [outer, out_len, inner, out_comps] around the axis.
struct DftArgs {
  int64_t outer, inner, in_len, out_len, n;
  int64_t terms;  // t runs over [0, terms): min(in_len, n), or n for the inverse real FFT
  int comps, irfft;
  double sign, scale;
};

// tw[t] = (cos, sin)(2*pi*t/n). sincospi reduces the angle exactly, and t < n keeps 2t/n in
// [0, 2), so the table is accurate to the last bit of a double, as std::cos of the CPU is.
__global__ void twiddle_kernel(double2* tw, int64_t n) {
  KILN_GRID_LOOP(t, n) {
    double s, c;
    sincospi(2.0 * double(t) / double(n), &s, &c);
    tw[t] = make_double2(c, s);
  }
}

// Bin k of an n-point transform over samples t in [0, terms): sample(t, xr, xi) gives sample t
// (false to skip it); sign is -1 forward, +1 inverse; the sum is unscaled. DFT and STFT both
// transform through this.
template <typename Sample>
__device__ double2 dft_bin(const double2* tw, int64_t n, int64_t k, int64_t terms, double sign,
                           Sample sample) {
  const int64_t step = k % n;
  double re = 0, im = 0;
  int64_t w = 0;  // (k * t) mod n, advanced by addition so that it never overflows
  for (int64_t t = 0; t < terms; ++t, w = w + step >= n ? w + step - n : w + step) {
    double xr, xi;
    if (!sample(t, xr, xi)) continue;
    const double2 cs = tw[w];
    const double c = cs.x, s = sign * cs.y;
    re += xr * c - xi * s;
    im += xr * s + xi * c;
  }
  return make_double2(re, im);
}

// One thread per output element; i (the dims after the axis) runs fastest, so neighbouring
// threads read neighbouring inputs, or, when inner is 1, the same input (a broadcast).
template <typename T>
__global__ void dft_kernel(const T* x, T* y, const double2* tw, DftArgs a, int64_t total) {
  KILN_GRID_LOOP(e, total) {
    const int64_t i = e % a.inner, k = (e / a.inner) % a.out_len, o = e / (a.inner * a.out_len);
    const T* line = x + (o * a.in_len * a.inner + i) * a.comps;
    const int64_t stride = a.inner * a.comps;
    auto sample = [&](int64_t t, double& xr, double& xi) {
      int64_t at = t;
      double conj = 1;
      if (a.irfft && t >= a.in_len) {  // the mirrored half: conj(X[n - t])
        at = a.n - t;
        conj = -1;
        if (at >= a.in_len) return false;
      }
      const T* p = line + at * stride;
      xr = double(DNum<T>::load(p[0]));
      xi = a.comps == 2 ? conj * double(DNum<T>::load(p[1])) : 0.0;
      return true;
    };
    const double2 v = dft_bin(tw, a.n, k, a.terms, a.sign, sample);
    const double re = v.x, im = v.y;
    if (a.irfft) {
      y[e] = DNum<T>::store(typename DNum<T>::C(re * a.scale));
    } else {
      y[2 * e] = DNum<T>::store(typename DNum<T>::C(re * a.scale));
      y[2 * e + 1] = DNum<T>::store(typename DNum<T>::C(im * a.scale));
    }
  }
}

// The attributes; the axis normalized at build time (an attribute before opset 20, a constant
// input from it on, as the schema requires).
struct DftAttrs {
  bool inverse = false, onesided = false;
  int64_t axis = 1;
  int rank = 0;
};

// An integer input known at build time: a constant or a shape formula that is one number.
std::optional<int64_t> known_int(const KernelQuery& q, size_t i) {
  if (i >= q.inputs.size() || !q.inputs[i]) return std::nullopt;
  const ir::Value& v = *q.inputs[i];
  if (v.constant && v.constant->numel() == 1) {
    return read_int64s(v.constant->data(), v.constant->dtype(), 1)[0];
  }
  if (v.sym_value && v.sym_value->size() == 1 && (*v.sym_value)[0].is_const()) {
    return (*v.sym_value)[0].value();
  }
  return std::nullopt;
}

StatusOr<DftAttrs> dft_attrs(const KernelQuery& q) {
  DftAttrs a;
  const ir::Attributes& at = q.node.attrs;
  KILN_ASSIGN_OR_RETURN(int64_t inverse, at.get_int("inverse", 0));
  KILN_ASSIGN_OR_RETURN(int64_t onesided, at.get_int("onesided", 0));
  a.inverse = inverse != 0, a.onesided = onesided != 0;
  if (q.inputs.empty() || !q.inputs[0] || !q.inputs[0]->shape) {
    return invalid_argument(q.node.describe() + ": the input has no shape");
  }
  a.rank = int(q.inputs[0]->shape->size());
  if (q.node.opset >= 20) {
    a.axis = -2;
    if (q.inputs.size() > 2 && q.inputs[2]) {
      std::optional<int64_t> v = known_int(q, 2);
      if (!v) {
        return unsupported(q.node.describe() +
                           ": the CUDA DFT needs the axis (input 2) at build time");
      }
      a.axis = *v;
    }
  } else {
    KILN_ASSIGN_OR_RETURN(a.axis, at.get_int("axis", 1));
  }
  if (a.axis < 0) a.axis += a.rank;
  if (a.rank < 2 || a.axis < 0 || a.axis > a.rank - 2) {
    return invalid_argument(q.node.describe() + ": axis " + std::to_string(a.axis) +
                            " is out of range for rank " + std::to_string(a.rank));
  }
  return a;
}

class DftKernel final : public CudaKernel {
 public:
  explicit DftKernel(DftAttrs a) : CudaKernel("cuda.DFT"), a_(a) {}
  HostParam dft_length;

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &y = out[0];
    const int rank = x.rank();
    const size_t axis = size_t(a_.axis);
    if (rank != a_.rank || y.rank() != rank || y.dtype != x.dtype) {
      return invalid_argument(name_ + ": X " + shape_to_string(x.shape) + " and Y " +
                              shape_to_string(y.shape) + " differ in rank or dtype");
    }
    const bool irfft = a_.inverse && a_.onesided;
    const int64_t in_len = x.shape[axis], out_len = y.shape[axis];
    // n is Y's length along the axis except for the onesided forward transform, whose
    // n/2 + 1 bins leave n's parity to dft_length (or the input's length).
    int64_t n = out_len;
    if (a_.onesided && !a_.inverse) {
      n = in_len;
      if (in.size() > 1 && present(in[1])) {
        KILN_ASSIGN_OR_RETURN(std::vector<int64_t> v, dft_length.get_ints(in[1], stream_));
        if (v.size() != 1 || v[0] < 1) {
          return invalid_argument(name_ + ": dft_length must be one positive integer");
        }
        n = v[0];
      }
      if (n < 1 || out_len != n / 2 + 1) {
        return invalid_argument(name_ + ": Y " + shape_to_string(y.shape) + " does not hold the " +
                                std::to_string(n / 2 + 1) + " bins of a length-" +
                                std::to_string(n) + " transform");
      }
    }
    const int64_t comps = x.shape.back();
    if ((comps != 1 && comps != 2) || y.shape.back() != (irfft ? 1 : 2)) {
      return invalid_argument(name_ + ": X " + shape_to_string(x.shape) + " and Y " +
                              shape_to_string(y.shape) + " are not [..., n, 1 or 2]");
    }
    if (y.numel() == 0) return ok_status();
    if (n < 1) return invalid_argument(name_ + ": the signal length must be positive");
    KILN_RETURN_IF_ERROR(check_workspace(workspace_piece(size_t(n) * sizeof(double2)), name_));
    DftArgs a{};
    a.outer = 1, a.inner = 1;
    for (size_t d = 0; d < axis; ++d) a.outer *= x.shape[d];
    for (int d = int(axis) + 1; d < rank - 1; ++d) a.inner *= x.shape[size_t(d)];
    a.in_len = in_len, a.out_len = out_len, a.n = n;
    a.terms = irfft ? n : std::min(in_len, n);
    a.comps = int(comps), a.irfft = irfft ? 1 : 0;
    a.sign = a_.inverse ? 1.0 : -1.0;
    a.scale = a_.inverse ? 1.0 / double(n) : 1.0;
    double2* tw = static_cast<double2*>(workspace_);
    twiddle_kernel<<<grid_for(n), kBlock, 0, stream_>>>(tw, n);
    KILN_RETURN_IF_ERROR(launch_status("twiddle_kernel"));
    const int64_t total = a.outer * out_len * a.inner;
    bool typed = visit_dtype<kTFloats>(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      dft_kernel<T>
          <<<grid_for(total), kBlock, 0, stream_>>>(x.as<const T>(), y.as<T>(), tw, a, total);
    });
    if (!typed) return unsupported(name_ + ": dtype " + std::string(dtype_name(x.dtype)));
    return launch_status("dft_kernel");
  }

 private:
  DftAttrs a_;
};

StatusOr<std::unique_ptr<Kernel>> make_dft(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(DftAttrs a, dft_attrs(q));
  DType t = q.input_dtype(0);
  if (!(dtype_bit(t) & kTFloats) || q.output_dtype(0) != t) {
    return unsupported(q.node.describe() + ": the CUDA DFT takes float32, float64, float16 or " +
                       "bfloat16 with an output of the same dtype, not " +
                       std::string(dtype_name(t)));
  }
  auto k = std::make_unique<DftKernel>(a);
  k->dft_length.init(q, 1);
  return std::unique_ptr<Kernel>(std::move(k));
}

// The twiddle table: n (cos, sin) pairs in double. n is Y's length along the axis, or below
// twice that for the onesided forward transform.
ir::Dim dft_workspace(const KernelQuery& q) {
  auto a = dft_attrs(q);
  const ir::Value* y = q.outputs.empty() ? nullptr : q.outputs[0];
  if (!a.ok() || !y || !y->shape || int(y->shape->size()) != a->rank) return 0;
  ir::Dim n = (*y->shape)[size_t(a->axis)];
  if (a->onesided && !a->inverse) n = n * 2;
  const int64_t align = int64_t(kWorkspaceAlign);
  return ir::Dim::ceil_div(n * int64_t(sizeof(double2)), align) * align;
}

// ---- STFT ----

// Signal [batch, len, comps], Y [batch, frames, bins, 2]; frame f starts at sample f * step.
struct StftArgs {
  int64_t frames, bins, len, step, n;
  int comps;
};

// One thread per (batch, frame, bin), the bin fastest: neighbouring threads read the same frame.
template <typename T>
__global__ void stft_kernel(const T* x, const T* window, T* y, const double2* tw, StftArgs a,
                            int64_t total) {
  KILN_GRID_LOOP(e, total) {
    const int64_t k = e % a.bins, f = (e / a.bins) % a.frames, b = e / (a.bins * a.frames);
    const T* frame = x + (b * a.len + f * a.step) * a.comps;
    auto sample = [&](int64_t t, double& xr, double& xi) {
      const double w = window ? double(DNum<T>::load(window[t])) : 1.0;
      xr = w * double(DNum<T>::load(frame[t * a.comps]));
      xi = a.comps == 2 ? w * double(DNum<T>::load(frame[t * a.comps + 1])) : 0.0;
      return true;
    };
    const double2 v = dft_bin(tw, a.n, k, a.n, -1.0, sample);
    y[2 * e] = DNum<T>::store(typename DNum<T>::C(v.x));
    y[2 * e + 1] = DNum<T>::store(typename DNum<T>::C(v.y));
  }
}

class StftKernel final : public CudaKernel {
 public:
  explicit StftKernel(bool onesided) : CudaKernel("cuda.STFT"), onesided_(onesided) {}
  HostParam frame_step, frame_length;

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &y = out[0];
    const bool has_window = in.size() > 2 && present(in[2]);
    if (x.rank() != 3 || (x.shape[2] != 1 && x.shape[2] != 2) || y.rank() != 4 ||
        y.dtype != x.dtype || (has_window && in[2].dtype != x.dtype)) {
      return invalid_argument(name_ + ": signal " + shape_to_string(x.shape) + " and Y " +
                              shape_to_string(y.shape) +
                              " are not [batch, length, 1 or 2] and [batch, frames, bins, 2] "
                              "of one dtype");
    }
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> step, frame_step.get_ints(in[1], stream_));
    if (step.size() != 1 || step[0] < 1) {
      return invalid_argument(name_ + ": frame_step must be one positive integer");
    }
    int64_t n = has_window ? in[2].numel() : x.shape[1];
    if (in.size() > 3 && present(in[3])) {
      KILN_ASSIGN_OR_RETURN(std::vector<int64_t> v, frame_length.get_ints(in[3], stream_));
      if (v.size() != 1 || v[0] < 1 || (has_window && v[0] != n)) {
        return invalid_argument(name_ + ": frame_length must be one positive integer equal to " +
                                "the window's length");
      }
      n = v[0];
    }
    const int64_t frames = n >= 1 && x.shape[1] >= n ? (x.shape[1] - n) / step[0] + 1 : 0;
    const int64_t bins = onesided_ ? n / 2 + 1 : n;
    if (frames < 1 || y.shape[0] != x.shape[0] || y.shape[1] != frames || y.shape[2] != bins ||
        y.shape[3] != 2) {
      return invalid_argument(name_ + ": Y " + shape_to_string(y.shape) + " is not [" +
                              std::to_string(x.shape[0]) + ", " + std::to_string(frames) + ", " +
                              std::to_string(bins) + ", 2] for a signal " +
                              shape_to_string(x.shape) + " in frames of " + std::to_string(n));
    }
    if (y.numel() == 0) return ok_status();
    KILN_RETURN_IF_ERROR(check_workspace(workspace_piece(size_t(n) * sizeof(double2)), name_));
    const StftArgs a{frames, bins, x.shape[1], step[0], n, int(x.shape[2])};
    double2* tw = static_cast<double2*>(workspace_);
    twiddle_kernel<<<grid_for(n), kBlock, 0, stream_>>>(tw, n);
    KILN_RETURN_IF_ERROR(launch_status("twiddle_kernel"));
    const int64_t total = x.shape[0] * frames * bins;
    bool typed = visit_dtype<kTFloats>(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      stft_kernel<T><<<grid_for(total), kBlock, 0, stream_>>>(
          x.as<const T>(), has_window ? in[2].as<const T>() : nullptr, y.as<T>(), tw, a, total);
    });
    if (!typed) return unsupported(name_ + ": dtype " + std::string(dtype_name(x.dtype)));
    return launch_status("stft_kernel");
  }

 private:
  bool onesided_;
};

StatusOr<std::unique_ptr<Kernel>> make_stft(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(int64_t onesided, q.node.attrs.get_int("onesided", 1));
  DType t = q.input_dtype(0);
  if (!(dtype_bit(t) & kTFloats) || q.output_dtype(0) != t) {
    return unsupported(q.node.describe() + ": the CUDA STFT takes float32, float64, float16 or " +
                       "bfloat16 with an output of the same dtype, not " +
                       std::string(dtype_name(t)));
  }
  auto k = std::make_unique<StftKernel>(onesided != 0);
  k->frame_step.init(q, 1);
  k->frame_length.init(q, 3);
  return std::unique_ptr<Kernel>(std::move(k));
}

// The twiddle table: n (cos, sin) pairs in double, n the frame length: Y's bins, or below twice
// that when onesided.
ir::Dim stft_workspace(const KernelQuery& q) {
  auto onesided = q.node.attrs.get_int("onesided", 1);
  const ir::Value* y = q.outputs.empty() ? nullptr : q.outputs[0];
  if (!onesided.ok() || !y || !y->shape || y->shape->size() != 4) return 0;
  ir::Dim n = (*y->shape)[2];
  if (*onesided) n = n * 2;
  const int64_t align = int64_t(kWorkspaceAlign);
  return ir::Dim::ceil_div(n * int64_t(sizeof(double2)), align) * align;
}

}  // namespace

void register_dft(Registry& r) {
  r.add(OpKind::kDFT, &make_dft, {.workspace = &dft_workspace});
  r.add(OpKind::kSTFT, &make_stft, {.workspace = &stft_workspace});
}

}  // namespace kiln::backends::cuda
