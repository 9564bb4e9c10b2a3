// CPU reference kernels of the conv op family: Conv (1x1 as a direct GEMM, depthwise as a direct
// loop, few taps a direct loop too (conv_direct.h), everything else im2col + GEMM) and the pools.
// 1-D and 2-D inputs are handled as 3-D ones with leading spatial dims of size 1, so one code path
// serves every spatial rank. float16 and bfloat16 run through float32 copies, each output rounded
// once, as the CUDA kernels compute them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cpu/conv_direct.h"
#include "backends/cpu/conv_geometry.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/depthwise.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/numeric.h"
#include "backends/cpu/thread_pool.h"
#include "backends/cpu/window.h"
#include "core/checked.h"

namespace kiln::backends::cpu {

Status parse_spatial(const char* op, const ir::Attributes& attrs, SpatialAttrs* s) {
  KILN_ASSIGN_OR_RETURN(s->strides, attrs.get_ints("strides", std::vector<int64_t>{}));
  KILN_ASSIGN_OR_RETURN(s->dilations, attrs.get_ints("dilations", std::vector<int64_t>{}));
  KILN_ASSIGN_OR_RETURN(s->pads, attrs.get_ints("pads", std::vector<int64_t>{}));
  KILN_ASSIGN_OR_RETURN(s->kernel, attrs.get_ints("kernel_shape", std::vector<int64_t>{}));
  KILN_ASSIGN_OR_RETURN(int64_t ceil_mode, attrs.get_int("ceil_mode", 0));
  s->ceil_mode = ceil_mode != 0;
  KILN_ASSIGN_OR_RETURN(std::string auto_pad, attrs.get_string("auto_pad", "NOTSET"));
  if (auto_pad == "NOTSET") {
    s->auto_pad = AutoPad::kNotSet;
  } else if (auto_pad == "SAME_UPPER") {
    s->auto_pad = AutoPad::kSameUpper;
  } else if (auto_pad == "SAME_LOWER") {
    s->auto_pad = AutoPad::kSameLower;
  } else if (auto_pad == "VALID") {
    s->auto_pad = AutoPad::kValid;
  } else {
    return invalid_argument(std::string(op) + ": unknown auto_pad '" + auto_pad + "'");
  }
  for (int64_t v : s->strides) {
    if (v < 1) return invalid_argument(std::string(op) + ": strides must be >= 1");
  }
  for (int64_t v : s->dilations) {
    if (v < 1) return invalid_argument(std::string(op) + ": dilations must be >= 1");
  }
  for (int64_t v : s->pads) {
    if (v < 0) return invalid_argument(std::string(op) + ": pads must be >= 0");
  }
  return ok_status();
}

Status resolve_axes(const char* op, const SpatialAttrs& s, int ns, const int64_t* in,
                    const int64_t* k, const int64_t* out, Axis axes[3]) {
  auto bad_len = [&](const char* name) {
    return invalid_argument(std::string(op) + ": attribute " + name + " has the wrong length for " +
                            std::to_string(ns) + " spatial dims");
  };
  if (!s.strides.empty() && int(s.strides.size()) != ns) return bad_len("strides");
  if (!s.dilations.empty() && int(s.dilations.size()) != ns) return bad_len("dilations");
  if (!s.pads.empty() && int(s.pads.size()) != 2 * ns) return bad_len("pads");
  for (int i = 0; i < ns; ++i) {
    Axis& a = axes[3 - ns + i];
    a.in = in[i];
    a.k = k[i];
    a.stride = s.strides.empty() ? 1 : s.strides[i];
    a.dil = s.dilations.empty() ? 1 : s.dilations[i];
    int64_t eff = a.dil * (a.k - 1) + 1;
    int64_t expect;
    if (s.auto_pad == AutoPad::kSameUpper || s.auto_pad == AutoPad::kSameLower) {
      expect = (a.in + a.stride - 1) / a.stride;
      int64_t total = std::max<int64_t>(0, (expect - 1) * a.stride + eff - a.in);
      a.pb = s.auto_pad == AutoPad::kSameUpper ? total / 2 : total - total / 2;
      a.pe = total - a.pb;
    } else {
      if (s.auto_pad == AutoPad::kNotSet && !s.pads.empty()) {
        a.pb = s.pads[i];
        a.pe = s.pads[ns + i];
      }
      int64_t num = a.in + a.pb + a.pe - eff;
      if (num < 0) {
        expect = 0;
      } else if (s.ceil_mode) {
        expect = (num + a.stride - 1) / a.stride + 1;
        if ((expect - 1) * a.stride >= a.in + a.pb) --expect;
      } else {
        expect = num / a.stride + 1;
      }
    }
    if (expect != out[i]) {
      return invalid_argument(std::string(op) + ": output spatial dim " + std::to_string(i) +
                              " is " + std::to_string(out[i]) +
                              " but the input and attributes give " + std::to_string(expect));
    }
    a.out = out[i];
  }
  return ok_status();
}

namespace {

bool is_half_type(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

// `v` as float32 in `buf` (which grows and is reused): the view of that copy.
TensorView widened(const TensorView& v, std::vector<float>& buf) {
  const int64_t n = v.numel();
  if (buf.size() < size_t(n)) buf.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) buf[size_t(i)] = float(load_f64(v, i));
  return TensorView{buf.data(), DType::kFloat32, v.shape};
}

// Runs fn on float32 copies of the float16/bfloat16 inputs and outputs (others pass through as
// they are, such as MaxPool's int64 Indices), then rounds those outputs back.
template <typename Fn>
Status run_as_float(const KernelArgs& args, Fn&& fn) {
  std::vector<std::vector<float>> ins(args.in.size()), outs(args.out.size());
  std::vector<TensorView> in_views(args.in.begin(), args.in.end());
  std::vector<TensorView> out_views(args.out.begin(), args.out.end());
  for (size_t i = 0; i < args.in.size(); ++i) {
    if (present(args.in[i]) && is_half_type(args.in[i].dtype)) {
      in_views[i] = widened(args.in[i], ins[i]);
    }
  }
  for (size_t i = 0; i < args.out.size(); ++i) {
    if (!present(args.out[i]) || !is_half_type(args.out[i].dtype)) continue;
    outs[i].resize(size_t(args.out[i].numel()));
    out_views[i] = TensorView{outs[i].data(), DType::kFloat32, args.out[i].shape};
  }
  KILN_RETURN_IF_ERROR(fn(KernelArgs{args.attrs, in_views, out_views}));
  for (size_t i = 0; i < args.out.size(); ++i) {
    if (out_views[i].data == args.out[i].data) continue;
    for (int64_t e = 0; e < args.out[i].numel(); ++e) store_f64(args.out[i], e, outs[i][size_t(e)]);
  }
  return ok_status();
}

// Rows (c, kd, kh, kw) by columns (od, oh, ow): the input patches one GEMM multiplies by the
// weights, for the output rows (od, oh) flattened in [r0, r1) (columns (r1 - r0) * ow, each row of
// `col` that long). x points at the cg channels of one image and group.
template <typename T>
void im2col(const T* x, int64_t cg, const Axis ax[3], int64_t r0, int64_t r1, T* col) {
  const Axis &ad = ax[0], &ah = ax[1], &aw = ax[2];
  const int64_t cols = (r1 - r0) * aw.out;
  const int64_t plane = ah.in * aw.in;
  T* dst = col;
  for (int64_t c = 0; c < cg; ++c) {
    for (int64_t kd = 0; kd < ad.k; ++kd) {
      for (int64_t kh = 0; kh < ah.k; ++kh) {
        for (int64_t kw = 0; kw < aw.k; ++kw, dst += cols) {
          T* d = dst;
          int64_t off_w = kw * aw.dil - aw.pb;
          int64_t lo, hi;
          valid_range(off_w, aw.stride, aw.out, aw.in, &lo, &hi);
          for (int64_t r = r0; r < r1; ++r, d += aw.out) {
            const int64_t od = r / ah.out, oh = r % ah.out;
            int64_t id = od * ad.stride - ad.pb + kd * ad.dil;
            int64_t ih = oh * ah.stride - ah.pb + kh * ah.dil;
            if (id < 0 || id >= ad.in || ih < 0 || ih >= ah.in) {
              std::fill_n(d, aw.out, T(0));
              continue;
            }
            const T* src = x + (c * ad.in + id) * plane + ih * aw.in + off_w;
            std::fill_n(d, lo, T(0));
            if (aw.stride == 1) {
              std::memcpy(d + lo, src + lo, size_t(hi - lo) * sizeof(T));
            } else {
              for (int64_t ow = lo; ow < hi; ++ow) d[ow] = src[ow * aw.stride];
            }
            std::fill(d + hi, d + aw.out, T(0));
          }
        }
      }
    }
  }
}

// C (m x n, row stride ldc) = A (m x k) B (k x n) + beta C.
void gemm(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float beta, float* c,
          int64_t ldc) {
  sgemm(false, false, m, n, k, 1.f, a, k, b, n, beta, c, ldc);
}
void gemm(int64_t m, int64_t n, int64_t k, const double* a, const double* b, double beta, double* c,
          int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    double* crow = c + i * ldc;
    if (beta == 0) std::fill_n(crow, n, 0.0);
    for (int64_t p = 0; p < k; ++p) {
      double av = a[i * k + p];
      const double* brow = b + p * n;
      for (int64_t j = 0; j < n; ++j) crow[j] += av * brow[j];
    }
  }
}

// The im2col tile a task fills: about this many bytes, so that it stays in the core's L2 while
// the GEMM reads it (a whole image's patches did not: UNet's 24-channel 3x3 layer at 200x200
// built a 35 MB matrix and ran at 7 GFLOP/s).
constexpr int64_t kIm2colTileBytes = 512 * 1024;

// Conv keeps its parsed attributes and the float32 copies of half-precision operands; the im2col
// tiles and depthwise planes are per-thread buffers. All grow to the largest shape seen and are
// reused, so steady state does not allocate.
class ConvKernel final : public Kernel {
 public:
  Status init(const ir::Attributes& attrs) {
    KILN_ASSIGN_OR_RETURN(group_, attrs.get_int("group", 1));
    if (group_ < 1) return invalid_argument("Conv: group must be >= 1");
    return parse_spatial("Conv", attrs, &attrs_);
  }

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    if (in.size() < 2 || out.empty()) return invalid_argument("Conv: expects X, W and Y");
    DType t = in[0].dtype;
    bool has_bias = in.size() > 2 && present(in[2]);
    if (in[1].dtype != t || out[0].dtype != t || (has_bias && in[2].dtype != t)) {
      return invalid_argument("Conv: inputs and output must share one dtype");
    }
    if (t == DType::kFloat32) return run<float>(in[0], in[1], has_bias ? &in[2] : nullptr, out[0]);
    if (t == DType::kFloat64) return run<double>(in[0], in[1], has_bias ? &in[2] : nullptr, out[0]);
    if (is_half_type(t)) {
      // Float32 accumulation, the bias added before Y is rounded once.
      TensorView x = widened(in[0], x_f32_), w = widened(in[1], w_f32_);
      TensorView b = has_bias ? widened(in[2], b_f32_) : TensorView{};
      const int64_t n = out[0].numel();
      if (y_f32_.size() < size_t(n)) y_f32_.resize(size_t(n));
      TensorView y{y_f32_.data(), DType::kFloat32, out[0].shape};
      KILN_RETURN_IF_ERROR(run<float>(x, w, has_bias ? &b : nullptr, y));
      for (int64_t i = 0; i < n; ++i) store_f64(out[0], i, y_f32_[size_t(i)]);
      return ok_status();
    }
    return unsupported(
        "Conv: the CPU kernel supports float32, float64, float16 and bfloat16, not " +
        std::string(dtype_name(t)));
  }

  std::string name() const override { return "cpu.Conv"; }

 private:
  template <typename T>
  Status run(const TensorView& xv, const TensorView& wv, const TensorView* bv,
             const TensorView& yv) {
    int r = xv.rank();
    int ns = r - 2;
    if (ns < 1 || ns > 3 || wv.rank() != r || yv.rank() != r) {
      return unsupported("Conv: X " + shape_to_string(xv.shape) + ", W " +
                         shape_to_string(wv.shape) + ", Y " + shape_to_string(yv.shape) +
                         ": only 1-D, 2-D and 3-D convolutions of matching ranks are supported");
    }
    int64_t n = xv.shape[0], c = xv.shape[1], m = wv.shape[0], cg = wv.shape[1];
    if (cg * group_ != c || m % group_ != 0 || yv.shape[0] != n || yv.shape[1] != m) {
      return invalid_argument("Conv: X " + shape_to_string(xv.shape) + " and W " +
                              shape_to_string(wv.shape) + " do not match with group " +
                              std::to_string(group_));
    }
    if (!attrs_.kernel.empty() && !std::equal(attrs_.kernel.begin(), attrs_.kernel.end(),
                                              wv.shape.begin() + 2, wv.shape.end())) {
      return invalid_argument("Conv: kernel_shape does not match W " + shape_to_string(wv.shape));
    }
    if (bv && bv->numel() != m) {
      return invalid_argument("Conv: bias has " + std::to_string(bv->numel()) +
                              " elements, expected " + std::to_string(m));
    }
    Axis ax[3];
    KILN_RETURN_IF_ERROR(resolve_axes("Conv", attrs_, ns, xv.shape.data() + 2, wv.shape.data() + 2,
                                      yv.shape.data() + 2, ax));
    if (yv.numel() == 0) return ok_status();
    int64_t mg = m / group_;
    int64_t in_sp = ax[0].in * ax[1].in * ax[2].in;
    int64_t out_sp = ax[0].out * ax[1].out * ax[2].out;
    int64_t kk = ax[0].k * ax[1].k * ax[2].k;
    int64_t rows = cg * kk;
    const T* x = xv.as<const T>();
    const T* w = wv.as<const T>();
    const T* bias = bv ? bv->as<const T>() : nullptr;
    T* y = yv.as<T>();

    if (cg == 1 && mg == 1 && ax[0].k == 1 && ax[0].in == 1 && ax[0].out == 1 && ax[0].pb == 0) {
      // Channels are independent: split them over the CPU's threads, each with a buffer of its
      // own (the zero-padded plane at stride 1, the phase planes at larger strides undilated, the
      // row phases otherwise).
      const bool unit_stride = ax[1].stride == 1 && ax[2].stride == 1;
      const bool undilated = ax[1].dil == 1 && ax[2].dil == 1;
      auto channel = [&](int64_t i) {
        static thread_local std::vector<T> buf;
        static thread_local std::vector<int64_t> offsets;
        const int64_t ch = i % c;
        const T* xi = x + i * in_sp;
        const T* wi = w + ch * kk;
        const T b = bias ? bias[ch] : T(0);
        T* yi = y + i * out_sp;
        if (unit_stride) {
          depthwise_padded<T>(xi, wi, b, ax[1], ax[2], yi, buf, offsets);
        } else if (undilated) {
          depthwise_phases<T>(xi, wi, b, ax[1], ax[2], yi, buf, offsets);
        } else {
          if (buf.size() < size_t(ax[2].in + ax[2].stride))
            buf.resize(size_t(ax[2].in + ax[2].stride));
          depthwise<T>(xi, wi, b, ax[1], ax[2], yi, buf.data());
        }
      };
      if (n * c * out_sp * kk >= kParallelDepthwise) {
        // Runs of channels, four a thread: a task a channel paid the pool's two shared atomic
        // updates for each of MobileNetV3's 576 7x7 planes, a few microseconds of work each.
        parallel_chunks(n * c, 1, [&](int64_t first, int64_t last) {
          for (int64_t i = first; i < last; ++i) channel(i);
        });
      } else {
        for (int64_t i = 0; i < n * c; ++i) channel(i);
      }
      return ok_status();
    }

    bool pointwise = true;
    for (const Axis& a : ax) {
      pointwise = pointwise && a.k == 1 && a.stride == 1 && a.pb == 0 && a.pe == 0;
    }
    if (pointwise) {
      for (int64_t b = 0; b < n; ++b) {
        for (int64_t g = 0; g < group_; ++g) {
          const T* xg = x + (b * c + g * cg) * in_sp;
          T* yg = y + (b * m + g * mg) * out_sp;
          if (bias) {
            for (int64_t o = 0; o < mg; ++o) std::fill_n(yg + o * out_sp, out_sp, bias[g * mg + o]);
          }
          gemm(mg, out_sp, rows, w + g * mg * rows, xg, bias ? T(1) : T(0), yg, out_sp);
        }
      }
      return ok_status();
    }
    if constexpr (std::is_same_v<T, float>) {
      if (conv_direct_fits(group_, cg, mg, ax[0], ax[1], ax[2])) {
        // Few taps (an RGB stem) or few outputs: directly, a run of output rows a task
        // (conv_direct.h).
        const int64_t chunk = std::max<int64_t>(1, ax[1].out / 8);
        const int64_t chunks = (ax[1].out + chunk - 1) / chunk;
        auto task = [&](int64_t t) {
          static thread_local std::vector<float> buf;
          const int64_t b = t / chunks, r0 = (t % chunks) * chunk;
          conv_direct_f32(x + b * c * in_sp, cg, w, bias, m, ax[1], ax[2], r0,
                          std::min(ax[1].out, r0 + chunk), y + b * m * out_sp, buf);
        };
        if (n * chunks > 1 && m * rows * out_sp * n >= kParallelDepthwise) {
          parallel_for(n * chunks, task);
        } else {
          for (int64_t t = 0; t < n * chunks; ++t) task(t);
        }
        return ok_status();
      }
    }
    // im2col + GEMM a tile of output rows at a time, the tiles of every image and group split over
    // the CPU's threads (each its own tile buffer; every output element is computed by one task,
    // with the GEMM's own order over k, so the bits do not depend on the split).
    const int64_t out_rows = ax[0].out * ax[1].out;  // (od, oh) pairs; each is ow columns
    if (!checked_mul(rows, out_sp)) return invalid_argument("Conv: im2col buffer size overflows");
    const int64_t tile_rows = std::clamp<int64_t>(
        kIm2colTileBytes / int64_t(sizeof(T)) / std::max<int64_t>(rows * ax[2].out, 1), 1,
        out_rows);
    const int64_t tiles = (out_rows + tile_rows - 1) / tile_rows;
    auto task = [&](int64_t t) {
      static thread_local std::vector<T> buf;
      const int64_t bg = t / tiles, r0 = (t % tiles) * tile_rows;
      const int64_t r1 = std::min(out_rows, r0 + tile_rows);
      const int64_t b = bg / group_, g = bg % group_;
      const int64_t cols = (r1 - r0) * ax[2].out;
      if (buf.size() < size_t(rows * cols)) buf.resize(size_t(rows * cols));
      const T* xg = x + (b * c + g * cg) * in_sp;
      T* yt = y + (b * m + g * mg) * out_sp + r0 * ax[2].out;
      if (bias) {
        for (int64_t o = 0; o < mg; ++o) std::fill_n(yt + o * out_sp, cols, bias[g * mg + o]);
      }
      im2col<T>(xg, cg, ax, r0, r1, buf.data());
      gemm(mg, cols, rows, w + g * mg * rows, buf.data(), bias ? T(1) : T(0), yt, out_sp);
    };
    const int64_t count = n * group_ * tiles;
    if (count > 1 && mg * rows * out_sp * n * group_ >= kParallelDepthwise) {
      parallel_for(count, task);
    } else {
      for (int64_t t = 0; t < count; ++t) task(t);
    }
    return ok_status();
  }

  int64_t group_ = 1;
  SpatialAttrs attrs_;
  std::vector<float> x_f32_, w_f32_, b_f32_, y_f32_;  // float16/bfloat16 operands widened
};

StatusOr<std::unique_ptr<Kernel>> create_conv(const KernelQuery& q) {
  auto k = std::make_unique<ConvKernel>();
  Status s = k->init(q.node.attrs);
  if (!s.ok()) return s.with_context(q.node.describe());
  return std::unique_ptr<Kernel>(std::move(k));
}

// The shared front of the pools: shapes and attributes resolved into three axes.
Status pool_axes(const char* op, const KernelArgs& args, SpatialAttrs* s, Axis ax[3]) {
  const TensorView& xv = args.in[0];
  const TensorView& yv = args.out[0];
  int ns = xv.rank() - 2;
  if (ns < 1 || ns > 3 || yv.rank() != xv.rank() || yv.shape[0] != xv.shape[0] ||
      yv.shape[1] != xv.shape[1]) {
    return unsupported(std::string(op) + ": X " + shape_to_string(xv.shape) + " -> Y " +
                       shape_to_string(yv.shape) + ": only 1-D, 2-D and 3-D pools are supported");
  }
  KILN_RETURN_IF_ERROR(parse_spatial(op, args.attrs, s));
  if (int(s->kernel.size()) != ns) {
    return invalid_argument(std::string(op) + ": kernel_shape must have " + std::to_string(ns) +
                            " values");
  }
  for (int64_t k : s->kernel) {
    if (k < 1) return invalid_argument(std::string(op) + ": kernel_shape values must be >= 1");
  }
  return resolve_axes(op, *s, ns, xv.shape.data() + 2, s->kernel.data(), yv.shape.data() + 2, ax);
}

template <typename T>
void max_pool(const T* x, T* y, int64_t* indices, int64_t planes, const Axis ax[3]) {
  int64_t in_sp = ax[0].in * ax[1].in * ax[2].in;
  for (int64_t p = 0; p < planes; ++p) {
    const T* xp = x + p * in_sp;
    for (int64_t od = 0; od < ax[0].out; ++od) {
      int64_t sd = od * ax[0].stride - ax[0].pb, dlo, dhi;
      valid_range(sd, ax[0].dil, ax[0].k, ax[0].in, &dlo, &dhi);
      for (int64_t oh = 0; oh < ax[1].out; ++oh) {
        int64_t sh = oh * ax[1].stride - ax[1].pb, hlo, hhi;
        valid_range(sh, ax[1].dil, ax[1].k, ax[1].in, &hlo, &hhi);
        for (int64_t ow = 0; ow < ax[2].out; ++ow) {
          int64_t sw = ow * ax[2].stride - ax[2].pb, wlo, whi;
          valid_range(sw, ax[2].dil, ax[2].k, ax[2].in, &wlo, &whi);
          T best = std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                        : std::numeric_limits<T>::lowest();
          int64_t best_i = -1;
          for (int64_t jd = dlo; jd < dhi; ++jd) {
            for (int64_t jh = hlo; jh < hhi; ++jh) {
              int64_t row =
                  ((sd + jd * ax[0].dil) * ax[1].in + sh + jh * ax[1].dil) * ax[2].in + sw;
              for (int64_t jw = wlo; jw < whi; ++jw) {
                int64_t i = row + jw * ax[2].dil;
                if (xp[i] > best || best_i < 0) {
                  best = xp[i];
                  best_i = i;
                }
              }
            }
          }
          *y++ = best;
          if (indices) *indices++ = best_i < 0 ? -1 : p * in_sp + best_i;
        }
      }
    }
  }
}

template <typename T>
void average_pool(const T* x, T* y, int64_t planes, const Axis ax[3], bool include_pad) {
  int64_t in_sp = ax[0].in * ax[1].in * ax[2].in;
  // With count_include_pad the divisor counts window positions inside the padded input, not
  // positions past the end padding that ceil_mode adds.
  auto padded_count = [](const Axis& a, int64_t start) {
    int64_t lo, hi;
    valid_range(start + a.pb, a.dil, a.k, a.in + a.pb + a.pe, &lo, &hi);
    return hi - lo;
  };
  for (int64_t p = 0; p < planes; ++p) {
    const T* xp = x + p * in_sp;
    for (int64_t od = 0; od < ax[0].out; ++od) {
      int64_t sd = od * ax[0].stride - ax[0].pb, dlo, dhi;
      valid_range(sd, ax[0].dil, ax[0].k, ax[0].in, &dlo, &dhi);
      for (int64_t oh = 0; oh < ax[1].out; ++oh) {
        int64_t sh = oh * ax[1].stride - ax[1].pb, hlo, hhi;
        valid_range(sh, ax[1].dil, ax[1].k, ax[1].in, &hlo, &hhi);
        for (int64_t ow = 0; ow < ax[2].out; ++ow) {
          int64_t sw = ow * ax[2].stride - ax[2].pb, wlo, whi;
          valid_range(sw, ax[2].dil, ax[2].k, ax[2].in, &wlo, &whi);
          T sum = 0;
          for (int64_t jd = dlo; jd < dhi; ++jd) {
            for (int64_t jh = hlo; jh < hhi; ++jh) {
              const T* row =
                  xp + ((sd + jd * ax[0].dil) * ax[1].in + sh + jh * ax[1].dil) * ax[2].in + sw;
              for (int64_t jw = wlo; jw < whi; ++jw) sum += row[jw * ax[2].dil];
            }
          }
          int64_t count = include_pad ? padded_count(ax[0], sd) * padded_count(ax[1], sh) *
                                            padded_count(ax[2], sw)
                                      : (dhi - dlo) * (hhi - hlo) * (whi - wlo);
          *y++ = count > 0 ? sum / T(count) : T(0);
        }
      }
    }
  }
}

// LpPool: (sum over the window of |x|^p)^(1/p); padding contributes zeros.
template <typename T>
void lp_pool(const T* x, T* y, int64_t planes, const Axis ax[3], double p) {
  int64_t in_sp = ax[0].in * ax[1].in * ax[2].in;
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T* xp = x + pl * in_sp;
    for (int64_t od = 0; od < ax[0].out; ++od) {
      int64_t sd = od * ax[0].stride - ax[0].pb, dlo, dhi;
      valid_range(sd, ax[0].dil, ax[0].k, ax[0].in, &dlo, &dhi);
      for (int64_t oh = 0; oh < ax[1].out; ++oh) {
        int64_t sh = oh * ax[1].stride - ax[1].pb, hlo, hhi;
        valid_range(sh, ax[1].dil, ax[1].k, ax[1].in, &hlo, &hhi);
        for (int64_t ow = 0; ow < ax[2].out; ++ow) {
          int64_t sw = ow * ax[2].stride - ax[2].pb, wlo, whi;
          valid_range(sw, ax[2].dil, ax[2].k, ax[2].in, &wlo, &whi);
          double sum = 0;
          for (int64_t jd = dlo; jd < dhi; ++jd) {
            for (int64_t jh = hlo; jh < hhi; ++jh) {
              const T* row =
                  xp + ((sd + jd * ax[0].dil) * ax[1].in + sh + jh * ax[1].dil) * ax[2].in + sw;
              for (int64_t jw = wlo; jw < whi; ++jw)
                sum += std::pow(std::fabs(double(row[jw * ax[2].dil])), p);
            }
          }
          *y++ = T(std::pow(sum, 1.0 / p));
        }
      }
    }
  }
}

Status check_float(const char* op, const KernelArgs& args) {
  DType t = args.in[0].dtype;
  if (t != DType::kFloat32 && t != DType::kFloat64 && !is_half_type(t)) {
    return unsupported(std::string(op) +
                       ": the CPU kernel supports float32, float64, float16 and bfloat16, not " +
                       std::string(dtype_name(t)));
  }
  if (args.out[0].dtype != t) return invalid_argument(std::string(op) + ": output dtype mismatch");
  return ok_status();
}

Status max_pool_kernel(const KernelArgs& args) {
  const DType t = args.in[0].dtype;
  const bool is_8bit = t == DType::kInt8 || t == DType::kUInt8;
  if (!is_8bit) KILN_RETURN_IF_ERROR(check_float("MaxPool", args));
  if (is_8bit && args.out[0].dtype != t) return invalid_argument("MaxPool: output dtype mismatch");
  if (is_half_type(t)) return run_as_float(args, &max_pool_kernel);
  SpatialAttrs s;
  Axis ax[3];
  KILN_RETURN_IF_ERROR(pool_axes("MaxPool", args, &s, ax));
  int64_t* indices = nullptr;
  int64_t storage_order = 0;
  if (args.out.size() > 1 && present(args.out[1])) {
    KILN_ASSIGN_OR_RETURN(storage_order, args.attrs.get_int("storage_order", 0));
    if (args.out[1].dtype != DType::kInt64 || args.out[1].numel() != args.out[0].numel()) {
      return invalid_argument("MaxPool: Indices must be int64 of Y's shape");
    }
    indices = args.out[1].as<int64_t>();
  }
  int64_t planes = args.in[0].shape[0] * args.in[0].shape[1];
  const void* x = args.in[0].data;
  void* y = args.out[0].data;
  switch (t) {
    case DType::kFloat64:
      max_pool(static_cast<const double*>(x), static_cast<double*>(y), indices, planes, ax);
      break;
    case DType::kInt8:
      max_pool(static_cast<const int8_t*>(x), static_cast<int8_t*>(y), indices, planes, ax);
      break;
    case DType::kUInt8:
      max_pool(static_cast<const uint8_t*>(x), static_cast<uint8_t*>(y), indices, planes, ax);
      break;
    default:
      max_pool(static_cast<const float*>(x), static_cast<float*>(y), indices, planes, ax);
      break;
  }
  if (indices && storage_order != 0) {
    // Column-major Indices (storage_order=1): the spatial position with the first spatial axis
    // varying fastest, as ONNX's reference numbers it (h + w*H in 2-D); the plane offset stays.
    const int64_t n0 = ax[0].in, n1 = ax[1].in, n2 = ax[2].in, in_sp = n0 * n1 * n2;
    for (int64_t e = 0; e < args.out[1].numel(); ++e) {
      const int64_t v = indices[e];
      if (v < 0) continue;
      const int64_t i = v % in_sp, c2 = i % n2, c1 = (i / n2) % n1, c0 = i / (n1 * n2);
      indices[e] = v - i + c0 + c1 * n0 + c2 * n0 * n1;
    }
  }
  return ok_status();
}

Status average_pool_kernel(const KernelArgs& args) {
  KILN_RETURN_IF_ERROR(check_float("AveragePool", args));
  if (is_half_type(args.in[0].dtype)) return run_as_float(args, &average_pool_kernel);
  SpatialAttrs s;
  Axis ax[3];
  KILN_RETURN_IF_ERROR(pool_axes("AveragePool", args, &s, ax));
  KILN_ASSIGN_OR_RETURN(int64_t include_pad, args.attrs.get_int("count_include_pad", 0));
  int64_t planes = args.in[0].shape[0] * args.in[0].shape[1];
  if (args.in[0].dtype == DType::kFloat64) {
    average_pool(args.in[0].as<const double>(), args.out[0].as<double>(), planes, ax,
                 include_pad != 0);
  } else {
    average_pool(args.in[0].as<const float>(), args.out[0].as<float>(), planes, ax,
                 include_pad != 0);
  }
  return ok_status();
}

Status lp_pool_kernel(const KernelArgs& args) {
  KILN_RETURN_IF_ERROR(check_float("LpPool", args));
  if (is_half_type(args.in[0].dtype)) return run_as_float(args, &lp_pool_kernel);
  SpatialAttrs s;
  Axis ax[3];
  KILN_RETURN_IF_ERROR(pool_axes("LpPool", args, &s, ax));
  KILN_ASSIGN_OR_RETURN(int64_t p, args.attrs.get_int("p", 2));
  if (p < 1) return invalid_argument("LpPool: p must be >= 1");
  int64_t planes = args.in[0].shape[0] * args.in[0].shape[1];
  if (args.in[0].dtype == DType::kFloat64) {
    lp_pool(args.in[0].as<const double>(), args.out[0].as<double>(), planes, ax, double(p));
  } else {
    lp_pool(args.in[0].as<const float>(), args.out[0].as<float>(), planes, ax, double(p));
  }
  return ok_status();
}

template <typename T>
void global_pool(const T* x, T* y, int64_t planes, int64_t size, bool is_max) {
  for (int64_t p = 0; p < planes; ++p) {
    const T* xp = x + p * size;
    if (is_max) {
      T best = -std::numeric_limits<T>::infinity();
      for (int64_t i = 0; i < size; ++i) best = xp[i] > best ? xp[i] : best;
      y[p] = best;
    } else {
      // Four partial sums let the loop pipeline; a float accumulator is accurate enough for the
      // spatial sizes of real models (the reference tolerance is 1e-3 relative).
      T s[4] = {0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 4 <= size; i += 4) {
        for (int j = 0; j < 4; ++j) s[j] += xp[i + j];
      }
      for (; i < size; ++i) s[0] += xp[i];
      y[p] = size > 0 ? (s[0] + s[1] + s[2] + s[3]) / T(size) : T(0);
    }
  }
}

Status global_pool_kernel(const KernelArgs& args, const char* op, bool is_max) {
  KILN_RETURN_IF_ERROR(check_float(op, args));
  if (is_half_type(args.in[0].dtype)) {
    return run_as_float(
        args, [&](const KernelArgs& wide) { return global_pool_kernel(wide, op, is_max); });
  }
  const TensorView& xv = args.in[0];
  if (xv.rank() < 3 || args.out[0].numel() != xv.shape[0] * xv.shape[1]) {
    return invalid_argument(std::string(op) + ": X " + shape_to_string(xv.shape) + " -> Y " +
                            shape_to_string(args.out[0].shape) + " is inconsistent");
  }
  int64_t planes = xv.shape[0] * xv.shape[1];
  int64_t size = planes == 0 ? 0 : xv.numel() / planes;
  if (xv.dtype == DType::kFloat64) {
    global_pool(xv.as<const double>(), args.out[0].as<double>(), planes, size, is_max);
  } else {
    global_pool(xv.as<const float>(), args.out[0].as<float>(), planes, size, is_max);
  }
  return ok_status();
}

Status global_average_pool_kernel(const KernelArgs& args) {
  return global_pool_kernel(args, "GlobalAveragePool", false);
}
Status global_max_pool_kernel(const KernelArgs& args) {
  return global_pool_kernel(args, "GlobalMaxPool", true);
}

}  // namespace

void register_conv_kernels(KernelRegistry& r) {
  r.add_factory(ops::OpKind::kConv, &create_conv);
  r.add(ops::OpKind::kMaxPool, &max_pool_kernel);
  r.add(ops::OpKind::kAveragePool, &average_pool_kernel);
  r.add(ops::OpKind::kGlobalAveragePool, &global_average_pool_kernel);
  r.add(ops::OpKind::kGlobalMaxPool, &global_max_pool_kernel);
  r.add(ops::OpKind::kLpPool, &lp_pool_kernel);
  register_conv_transpose_kernels(r);
  register_deform_conv_kernels(r);
}

}  // namespace kiln::backends::cpu
