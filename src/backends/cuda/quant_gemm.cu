// Integer convolution and matmul on CUDA: ConvInteger and QLinearConv (direct, 1-3 spatial dims,
// one thread per output) and MatMulInteger and QLinearMatMul (numpy batch broadcasting, one thread
// per output), with the CPU reference's arithmetic (cpu/quant.cc): exact integer sums of
// zero-point-shifted 8-bit products, requantized in double, rounded half to even and saturated.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;
constexpr int kBlock = 256;

// A product of two zero-point-shifted 8-bit values is at most 255 * 255 in magnitude, so an int32
// sum of this many is exact; longer reductions accumulate in int64 (the reference sums exactly in
// double and saturates to int32 only when storing).
constexpr int64_t kMaxInt32Terms = 2147483647LL / (255 * 255);

// What follows the integer sum of one output element. ConvInteger and MatMulInteger store it as
// int32 (saturated); QLinearConv and QLinearMatMul add the bias, multiply by the requantization
// multiplier, round half to even, add the output zero point and saturate to y's dtype.
struct Epilogue {
  bool requant = false;
  bool conv = false;  // QLinearConv's multiplier (float, per-channel w scale), else QLinearMatMul's
  const void* s1 = nullptr;  // x (a) scale, one value
  const void* s2 = nullptr;  // w (b) scale, one value or one per output channel
  const void* sy = nullptr;  // y scale, one value
  int s1_dtype = 0, s2_dtype = 0, sy_dtype = 0;
  bool s2_per_channel = false;
  const int32_t* bias = nullptr;  // QLinearConv, one per output channel
  const void* y_zp = nullptr;
  int y_zp_dtype = 0;
  int y_dtype = 0;
  double lo = 0, hi = 0;  // y's range
};

__device__ __forceinline__ float round_to_half(float f) { return __half2float(__float2half_rn(f)); }

// The multiplier x_scale * w_scale / y_scale, rounded as the reference rounds it: QLinearConv in
// float32; QLinearMatMul in the first scale's dtype (double for float64, float32 otherwise, with
// the product and the quotient each rounded to float16 when the scales are float16).
__device__ double requant_multiplier(const Epilogue& p, int64_t channel) {
  if (p.conv) {
    float ws = load_as<float>(p.s2, p.s2_dtype, p.s2_per_channel ? channel : 0);
    return double(__fdiv_rn(__fmul_rn(load_as<float>(p.s1, p.s1_dtype, 0), ws),
                            load_as<float>(p.sy, p.sy_dtype, 0)));
  }
  if (DType(p.s1_dtype) == DType::kFloat64) {
    return __ddiv_rn(
        __dmul_rn(load_as<double>(p.s1, p.s1_dtype, 0), load_as<double>(p.s2, p.s2_dtype, 0)),
        load_as<double>(p.sy, p.sy_dtype, 0));
  }
  bool half = DType(p.s1_dtype) == DType::kFloat16;
  float m = __fmul_rn(load_as<float>(p.s1, p.s1_dtype, 0), load_as<float>(p.s2, p.s2_dtype, 0));
  if (half) m = round_to_half(m);
  m = __fdiv_rn(m, load_as<float>(p.sy, p.sy_dtype, 0));
  if (half) m = round_to_half(m);
  return double(m);
}

template <typename Acc>
__device__ void store_result(const Epilogue& p, void* y, int64_t e, Acc acc, int64_t channel) {
  if (!p.requant) {
    int64_t v = int64_t(acc);
    static_cast<int32_t*>(y)[e] = int32_t(v < INT32_MIN   ? INT32_MIN
                                          : v > INT32_MAX ? INT32_MAX
                                                          : v);
    return;
  }
  double v = double(acc);
  if (p.bias) v = __dadd_rn(v, double(p.bias[channel]));
  double zp = p.y_zp ? load_as<double>(p.y_zp, p.y_zp_dtype, 0) : 0.0;
  double r = rint(__dmul_rn(v, requant_multiplier(p, channel))) + zp;
  // NaN (a zero or NaN scale) becomes 0, as the reference's saturating store does.
  r = r != r ? 0.0 : fmin(fmax(r, p.lo), p.hi);
  store_as<double>(y, p.y_dtype, e, r);
}

// ---------------------------------------------------------------------------------------------
// Direct integer convolution, spatial dims right-aligned into three (missing ones are 1).

struct ConvGeom {
  int64_t batch, c_in, m_out, cg, mg;
  int64_t in[3], k[3], out[3], st[3], dl[3], pb[3];
  int64_t in_sp, k_sp, out_sp, total;
};

// X's (A's) and W's (B's) zero points, nullptr when omitted (0).
struct ZeroPoints {
  const void* x = nullptr;  // conv: one value; matmul: see MatMulGeom::a_zp_n
  const void* w = nullptr;  // conv: one value or one per output channel; matmul: or one per column
  int x_dtype = 0, w_dtype = 0;
  bool w_per_channel = false;
};

template <typename TX, typename TW, typename Acc>
__global__ void conv_integer_kernel(const TX* x, const TW* w, ConvGeom g, ZeroPoints z, Epilogue p,
                                    void* y) {
  KILN_GRID_LOOP(e, g.total) {
    int64_t sp = e % g.out_sp, mo = (e / g.out_sp) % g.m_out, b = e / (g.out_sp * g.m_out);
    int64_t o2 = sp % g.out[2], o1 = (sp / g.out[2]) % g.out[1], o0 = sp / (g.out[2] * g.out[1]);
    int32_t zx = z.x ? load_as<int32_t>(z.x, z.x_dtype, 0) : 0;
    int32_t zw = z.w ? load_as<int32_t>(z.w, z.w_dtype, z.w_per_channel ? mo : 0) : 0;
    int64_t grp = mo / g.mg;
    Acc acc = 0;
    for (int64_t c = 0; c < g.cg; ++c) {
      const TX* xp = x + (b * g.c_in + grp * g.cg + c) * g.in_sp;
      const TW* wp = w + (mo * g.cg + c) * g.k_sp;
      for (int64_t k0 = 0; k0 < g.k[0]; ++k0) {
        int64_t i0 = o0 * g.st[0] + k0 * g.dl[0] - g.pb[0];
        if (i0 < 0 || i0 >= g.in[0]) continue;
        for (int64_t k1 = 0; k1 < g.k[1]; ++k1) {
          int64_t i1 = o1 * g.st[1] + k1 * g.dl[1] - g.pb[1];
          if (i1 < 0 || i1 >= g.in[1]) continue;
          for (int64_t k2 = 0; k2 < g.k[2]; ++k2) {
            int64_t i2 = o2 * g.st[2] + k2 * g.dl[2] - g.pb[2];
            if (i2 < 0 || i2 >= g.in[2]) continue;
            // Padding contributes nothing: the reference pads after subtracting the zero point.
            int32_t xv = int32_t(xp[(i0 * g.in[1] + i1) * g.in[2] + i2]) - zx;
            int32_t wv = int32_t(wp[(k0 * g.k[1] + k1) * g.k[2] + k2]) - zw;
            acc += Acc(xv * wv);
          }
        }
      }
    }
    store_result(p, y, e, acc, mo);
  }
}

// ---------------------------------------------------------------------------------------------
// Integer matmul: Y [batch..., M, N] = A [.., M, K] x B [.., K, N], 1-D operands promoted.

struct MatMulGeom {
  int64_t m, k, n, total;
  int nb;                   // batch dims of Y
  int64_t dims[kMaxRank];   // Y's batch dims
  int64_t a_mat[kMaxRank];  // matrices of A per step of each batch dim (0: broadcast)
  int64_t b_mat[kMaxRank];
  int64_t a_zp_n;        // a_zero_point values: indexed by A's global row modulo this
  bool b_zp_per_column;  // b_zero_point per column of B (else one value)
};

template <typename TA, typename TB, typename Acc>
__global__ void matmul_integer_kernel(const TA* a, const TB* b, MatMulGeom g, ZeroPoints z,
                                      Epilogue p, void* y) {
  KILN_GRID_LOOP(e, g.total) {
    int64_t j = e % g.n, i = (e / g.n) % g.m, t = e / (g.n * g.m);
    int64_t am = 0, bm = 0;
    for (int d = g.nb - 1; d >= 0; --d) {
      int64_t c = t % g.dims[d];
      t /= g.dims[d];
      am += c * g.a_mat[d];
      bm += c * g.b_mat[d];
    }
    // The reference indexes a per-row zero point by A's row counted over every batch.
    int32_t za = z.x ? load_as<int32_t>(z.x, z.x_dtype, (am * g.m + i) % g.a_zp_n) : 0;
    int32_t zb = z.w ? load_as<int32_t>(z.w, z.w_dtype, g.b_zp_per_column ? j : 0) : 0;
    const TA* ap = a + (am * g.m + i) * g.k;
    const TB* bp = b + bm * g.k * g.n + j;
    Acc acc = 0;
    for (int64_t q = 0; q < g.k; ++q)
      acc += Acc((int32_t(ap[q]) - za) * (int32_t(bp[q * g.n]) - zb));
    store_result(p, y, e, acc, 0);
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

// Calls f(T{}) for an 8-bit dtype; false for any other.
template <typename F>
bool visit_8bit(DType dt, F&& f) {
  if (dt == DType::kInt8) {
    f(int8_t{});
  } else if (dt == DType::kUInt8) {
    f(uint8_t{});
  } else {
    return false;
  }
  return true;
}

bool is_8bit(DType t) { return t == DType::kInt8 || t == DType::kUInt8; }

// The element count of v when its shape is known at build time.
std::optional<int64_t> static_numel(const ir::Value* v) {
  if (!v || !v->shape) return std::nullopt;
  int64_t n = 1;
  for (const ir::Dim& d : *v->shape) {
    if (!d.is_const()) return std::nullopt;
    n *= d.value();
  }
  return n;
}

// Input i of an execute, or nullptr when omitted.
const TensorView* opt_input(std::span<const TensorView> in, size_t i) {
  return i < in.size() && present(in[i]) ? &in[i] : nullptr;
}

const ir::Value* opt_value(const KernelQuery& q, size_t i) {
  return i < q.inputs.size() ? q.inputs[i] : nullptr;
}

// "input 5 ('w_zero_point')" for messages.
std::string input_label(const KernelQuery& q, int i) {
  const ir::Value* v = opt_value(q, size_t(i));
  return "input " + std::to_string(i) + (v ? " ('" + v->name + "')" : std::string());
}

// Where a node's operands sit: ConvInteger/MatMulInteger (x, w, x_zp, w_zp) or QLinearConv/
// QLinearMatMul (x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp[, B]).
struct Operands {
  bool qlinear;
  int x, w, x_zp, w_zp, x_scale = -1, w_scale = -1, y_scale = -1, y_zp = -1, bias = -1;
};
Operands operands_of(bool qlinear, bool conv) {
  if (!qlinear) return {false, 0, 1, 2, 3};
  return {true, 0, 3, 2, 5, 1, 4, 6, 7, conv ? 8 : -1};
}

// The requantizing epilogue's parameters from the node's inputs (checked by the factory and again
// here, since shapes may be symbolic at build time).
Status make_epilogue(const std::string& name, const Operands& o, bool conv,
                     std::span<const TensorView> in, const TensorView& y, int64_t m_out,
                     Epilogue* p) {
  p->conv = conv;
  if (!o.qlinear) return ok_status();
  p->requant = true;
  const TensorView &s1 = in[o.x_scale], &s2 = in[o.w_scale], &sy = in[o.y_scale];
  if (s1.numel() != 1 || sy.numel() != 1)
    return invalid_argument(name + ": x and y scales must be one value each");
  if (s2.numel() != 1 && !(conv && s2.numel() == m_out)) {
    return invalid_argument(
        name + ": the w scale has " + std::to_string(s2.numel()) + " values, expected 1" +
        (conv ? " or one per output channel (" + std::to_string(m_out) + ")" : std::string()));
  }
  p->s1 = s1.data, p->s2 = s2.data, p->sy = sy.data;
  p->s1_dtype = int(s1.dtype), p->s2_dtype = int(s2.dtype), p->sy_dtype = int(sy.dtype);
  p->s2_per_channel = s2.numel() != 1;
  if (const TensorView* b = o.bias >= 0 ? opt_input(in, size_t(o.bias)) : nullptr) {
    if (b->numel() != m_out)
      return invalid_argument(name + ": B must have one value per output channel");
    p->bias = b->as<const int32_t>();
  }
  if (const TensorView* z = opt_input(in, size_t(o.y_zp))) {
    if (z->numel() != 1) return invalid_argument(name + ": y_zero_point must be one value");
    p->y_zp = z->data, p->y_zp_dtype = int(z->dtype);
  }
  p->y_dtype = int(y.dtype);
  p->lo = y.dtype == DType::kInt8 ? -128.0 : 0.0;
  p->hi = y.dtype == DType::kInt8 ? 127.0 : 255.0;
  return ok_status();
}

// Whether a value known to hold `n` elements may be a per-channel parameter along `dim` (its size
// unknown at build time counts as yes; execute checks again).
bool fits_channels(int64_t n, const ir::Dim& dim) {
  return n == 1 || !dim.is_const() || dim.value() == n;
}

// Build-time checks shared by the four ops: operand dtypes, and zero point and scale counts where
// the shapes are known.
Status check_operands(const KernelQuery& q, const Operands& o, bool conv) {
  const std::string who = q.node.describe();
  for (int i : {o.x, o.w, o.x_zp, o.w_zp, o.y_zp}) {
    if (i < 0) continue;
    DType t = q.input_dtype(size_t(i));
    if (t != DType::kUndefined && !is_8bit(t)) {
      return unsupported(who + ": the CUDA kernel takes int8 or uint8 operands and zero points; " +
                         input_label(q, i) + " is " + std::string(dtype_name(t)));
    }
  }
  const ir::Value* x = opt_value(q, size_t(o.x));
  const ir::Value* w = opt_value(q, size_t(o.w));
  if (!x || !w) return invalid_argument(who + ": the data inputs are missing");
  DType y = q.output_dtype(0);
  if (o.qlinear ? !is_8bit(y) : y != DType::kInt32) {
    return unsupported(who + ": output dtype " + std::string(dtype_name(y)) +
                       " (the CUDA kernel writes " + (o.qlinear ? "int8 or uint8)" : "int32)"));
  }
  // The x zero point is one value for a convolution (a matmul's a zero point may be one per row);
  // w's zero point (and QLinearConv's scale) one value or one per output channel (W dim 0), B's one
  // value or one per column.
  if (conv) {
    if (auto n = static_numel(opt_value(q, size_t(o.x_zp))); n && *n != 1) {
      return unsupported(who + ": x_zero_point has " + std::to_string(*n) +
                         " values; the CUDA kernel takes one");
    }
  }
  if (w->shape && !w->shape->empty()) {
    ir::Dim channels = conv ? (*w->shape)[0] : w->shape->size() > 1 ? w->shape->back() : ir::Dim(1);
    for (int i : {o.w_zp, conv ? o.w_scale : -1}) {
      if (i < 0) continue;
      if (auto n = static_numel(opt_value(q, size_t(i))); n && !fits_channels(*n, channels)) {
        return unsupported(who + ": " + input_label(q, i) + " has " + std::to_string(*n) +
                           " values; the CUDA kernel takes one or one per " +
                           (conv ? "output channel" : "column of B"));
      }
    }
  }
  if (!o.qlinear) return ok_status();
  for (int i : {o.x_scale, o.w_scale, o.y_scale}) {
    DType t = q.input_dtype(size_t(i));
    if (t != DType::kFloat32 && t != DType::kFloat16 && t != DType::kFloat64 &&
        t != DType::kBFloat16) {
      return unsupported(who + ": scale " + input_label(q, i) + " is " +
                         std::string(dtype_name(t)) +
                         "; the CUDA kernel takes float32, float16, bfloat16 or float64 scales");
    }
  }
  for (int i : {o.x_scale, o.y_scale, o.y_zp}) {
    if (auto n = static_numel(opt_value(q, size_t(i))); n && *n != 1) {
      return unsupported(
          who + ": " + input_label(q, i) + " has " + std::to_string(*n) +
          " values; the CUDA kernel takes a per-tensor x scale, y scale and y zero point");
    }
  }
  if (!conv) {
    // As the reference (which refuses per-row or per-column scales), QLinearMatMul is per tensor.
    for (int i : {o.w_scale, o.x_zp, o.w_zp}) {
      if (auto n = static_numel(opt_value(q, size_t(i))); n && *n != 1) {
        return unsupported(
            who + ": " + input_label(q, i) + " has " + std::to_string(*n) +
            " values; the CUDA QLinearMatMul takes per-tensor scales and zero points");
      }
    }
  }
  if (conv && o.bias >= 0 && q.input_dtype(size_t(o.bias)) != DType::kUndefined &&
      q.input_dtype(size_t(o.bias)) != DType::kInt32) {
    return unsupported(who + ": B must be int32");
  }
  return ok_status();
}

enum class AutoPad { kNotSet, kValid, kSameUpper, kSameLower };

struct ConvAttrs {
  int ns = 0;  // spatial dims
  int64_t group = 1;
  std::vector<int64_t> strides, dils, pads;
  AutoPad auto_pad = AutoPad::kNotSet;
};

class ConvIntegerKernel final : public CudaKernel {
 public:
  ConvIntegerKernel(std::string name, Operands o, ConvAttrs a)
      : CudaKernel(std::move(name)), o_(o), a_(std::move(a)) {}

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[size_t(o_.x)], &w = in[size_t(o_.w)], &y = out[0];
    int ns = a_.ns;
    if (x.rank() != ns + 2 || w.rank() != ns + 2 || y.rank() != ns + 2) {
      return invalid_argument(name_ + ": X, W and Y must have rank " + std::to_string(ns + 2));
    }
    ConvGeom g{};
    g.batch = x.shape[0], g.c_in = x.shape[1], g.m_out = w.shape[0];
    if (g.c_in != w.shape[1] * a_.group || g.m_out % a_.group != 0 || y.shape[1] != g.m_out ||
        y.shape[0] != g.batch) {
      return invalid_argument(name_ + ": the batch or channels of X, W and Y do not agree (group " +
                              std::to_string(a_.group) + ")");
    }
    for (int j = 0; j < 3; ++j) g.in[j] = g.k[j] = g.out[j] = g.st[j] = g.dl[j] = 1, g.pb[j] = 0;
    for (int i = 0; i < ns; ++i) {
      int j = 3 - ns + i;
      g.in[j] = x.shape[2 + i], g.k[j] = w.shape[2 + i], g.out[j] = y.shape[2 + i];
      g.st[j] = a_.strides[i], g.dl[j] = a_.dils[i];
      if (a_.auto_pad == AutoPad::kSameUpper || a_.auto_pad == AutoPad::kSameLower) {
        int64_t total =
            std::max<int64_t>(0, (g.out[j] - 1) * g.st[j] + (g.k[j] - 1) * g.dl[j] + 1 - g.in[j]);
        g.pb[j] = a_.auto_pad == AutoPad::kSameUpper ? total / 2 : total - total / 2;
      } else if (a_.auto_pad == AutoPad::kNotSet) {
        g.pb[j] = a_.pads[i];
      }
    }
    g.cg = g.c_in / a_.group, g.mg = g.m_out / a_.group;
    g.in_sp = g.in[0] * g.in[1] * g.in[2], g.k_sp = g.k[0] * g.k[1] * g.k[2];
    g.out_sp = g.out[0] * g.out[1] * g.out[2];
    g.total = y.numel();
    ZeroPoints z;
    if (const TensorView* zx = opt_input(in, size_t(o_.x_zp))) {
      if (zx->numel() != 1) return invalid_argument(name_ + ": x_zero_point must be one value");
      z.x = zx->data, z.x_dtype = int(zx->dtype);
    }
    if (const TensorView* zw = opt_input(in, size_t(o_.w_zp))) {
      if (zw->numel() != 1 && zw->numel() != g.m_out) {
        return invalid_argument(name_ + ": w_zero_point must have 1 or " + std::to_string(g.m_out) +
                                " values");
      }
      z.w = zw->data, z.w_dtype = int(zw->dtype), z.w_per_channel = zw->numel() != 1;
    }
    Epilogue p;
    KILN_RETURN_IF_ERROR(make_epilogue(name_, o_, /*conv=*/true, in, y, g.m_out, &p));
    if (g.total == 0) return ok_status();
    if (!is_8bit(x.dtype) || !is_8bit(w.dtype))
      return invalid_argument(name_ + ": X and W must be int8 or uint8");
    bool wide = g.cg * g.k_sp > kMaxInt32Terms;
    visit_8bit(x.dtype, [&](auto tx) {
      visit_8bit(w.dtype, [&](auto tw) {
        using TX = decltype(tx);
        using TW = decltype(tw);
        if (wide) {
          conv_integer_kernel<TX, TW, int64_t><<<grid_for(g.total), kBlock, 0, stream_>>>(
              x.as<const TX>(), w.as<const TW>(), g, z, p, y.data);
        } else {
          conv_integer_kernel<TX, TW, int32_t><<<grid_for(g.total), kBlock, 0, stream_>>>(
              x.as<const TX>(), w.as<const TW>(), g, z, p, y.data);
        }
      });
    });
    return launch_status("conv_integer_kernel");
  }

 private:
  Operands o_;
  ConvAttrs a_;
};

class MatMulIntegerKernel final : public CudaKernel {
 public:
  MatMulIntegerKernel(std::string name, Operands o) : CudaKernel(std::move(name)), o_(o) {}

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &a = in[size_t(o_.x)], &b = in[size_t(o_.w)], &y = out[0];
    int ra = a.rank(), rb = b.rank(), ry = y.rank();
    if (ra == 0 || rb == 0) return invalid_argument(name_ + ": inputs must have rank >= 1");
    MatMulGeom g{};
    g.m = ra > 1 ? a.shape[ra - 2] : 1, g.k = a.shape[ra - 1];
    int64_t kb = rb > 1 ? b.shape[rb - 2] : b.shape[0];
    g.n = rb > 1 ? b.shape[rb - 1] : 1;
    g.nb = ry - (ra > 1) - (rb > 1);
    int nba = std::max(ra - 2, 0), nbb = std::max(rb - 2, 0);
    if (g.k != kb || g.nb < std::max(nba, nbb))
      return invalid_argument(name_ + ": inner dims differ");
    if (g.nb > kMaxRank)
      return invalid_argument(name_ + ": more than " + std::to_string(kMaxRank) + " batch dims");
    if ((ra > 1 && y.shape[g.nb] != g.m) || (rb > 1 && y.shape[ry - 1] != g.n)) {
      return invalid_argument(name_ + ": Y's matrix dims differ from A's rows and B's columns");
    }
    // Matrices per step of each of A's and B's batch dims, right-aligned to Y's.
    int64_t sa = 1, sb = 1;
    for (int d = g.nb - 1; d >= 0; --d) {
      int da = d - (g.nb - nba), db = d - (g.nb - nbb);
      if ((da >= 0 && a.shape[da] != 1 && a.shape[da] != y.shape[d]) ||
          (db >= 0 && b.shape[db] != 1 && b.shape[db] != y.shape[d])) {
        return invalid_argument(name_ + ": batch dim " + std::to_string(d) +
                                " of A or B does not broadcast to Y's");
      }
      g.dims[d] = y.shape[d];
      g.a_mat[d] = da >= 0 && a.shape[da] != 1 ? sa : 0;
      g.b_mat[d] = db >= 0 && b.shape[db] != 1 ? sb : 0;
      if (da >= 0) sa *= a.shape[da];
      if (db >= 0) sb *= b.shape[db];
    }
    g.total = y.numel();
    ZeroPoints z;
    g.a_zp_n = 1;
    if (const TensorView* za = opt_input(in, size_t(o_.x_zp))) {
      if (za->numel() < 1 || (o_.qlinear && za->numel() != 1)) {
        return invalid_argument(name_ + ": the a zero point has " + std::to_string(za->numel()) +
                                " values" + (o_.qlinear ? ", expected one" : ""));
      }
      z.x = za->data, z.x_dtype = int(za->dtype), g.a_zp_n = za->numel();
    }
    if (const TensorView* zb = opt_input(in, size_t(o_.w_zp))) {
      if (zb->numel() != 1 && (o_.qlinear || zb->numel() != g.n)) {
        return invalid_argument(name_ + ": the b zero point must have 1" +
                                (o_.qlinear ? std::string() : " or " + std::to_string(g.n)) +
                                " values");
      }
      z.w = zb->data, z.w_dtype = int(zb->dtype), g.b_zp_per_column = zb->numel() != 1;
    }
    Epilogue p;
    KILN_RETURN_IF_ERROR(make_epilogue(name_, o_, /*conv=*/false, in, y, 1, &p));
    if (g.total == 0) return ok_status();
    if (!is_8bit(a.dtype) || !is_8bit(b.dtype))
      return invalid_argument(name_ + ": A and B must be int8 or uint8");
    bool wide = g.k > kMaxInt32Terms;
    visit_8bit(a.dtype, [&](auto ta) {
      visit_8bit(b.dtype, [&](auto tb) {
        using TA = decltype(ta);
        using TB = decltype(tb);
        if (wide) {
          matmul_integer_kernel<TA, TB, int64_t><<<grid_for(g.total), kBlock, 0, stream_>>>(
              a.as<const TA>(), b.as<const TB>(), g, z, p, y.data);
        } else {
          matmul_integer_kernel<TA, TB, int32_t><<<grid_for(g.total), kBlock, 0, stream_>>>(
              a.as<const TA>(), b.as<const TB>(), g, z, p, y.data);
        }
      });
    });
    return launch_status("matmul_integer_kernel");
  }

 private:
  Operands o_;
};

StatusOr<std::unique_ptr<Kernel>> make_conv_integer(const KernelQuery& q) {
  bool qlinear = ops::find_op(q.node.domain, q.node.op_type) == OpKind::kQLinearConv;
  Operands o = operands_of(qlinear, /*conv=*/true);
  KILN_RETURN_IF_ERROR(check_operands(q, o, /*conv=*/true));
  const std::string who = q.node.describe();
  const ir::Value* x = q.inputs[size_t(o.x)];
  if (!x->shape || x->shape->size() < 3 || x->shape->size() > 5) {
    return unsupported(who +
                       ": the CUDA kernel takes X of known rank 3 to 5 (1-D to 3-D convolutions)");
  }
  ConvAttrs a;
  a.ns = int(x->shape->size()) - 2;
  KILN_ASSIGN_OR_RETURN(a.group, q.node.attrs.get_int("group", 1));
  KILN_ASSIGN_OR_RETURN(a.strides,
                        q.node.attrs.get_ints("strides", std::vector<int64_t>(size_t(a.ns), 1)));
  KILN_ASSIGN_OR_RETURN(a.dils,
                        q.node.attrs.get_ints("dilations", std::vector<int64_t>(size_t(a.ns), 1)));
  KILN_ASSIGN_OR_RETURN(a.pads,
                        q.node.attrs.get_ints("pads", std::vector<int64_t>(size_t(2 * a.ns), 0)));
  KILN_ASSIGN_OR_RETURN(std::string auto_pad, q.node.attrs.get_string("auto_pad", "NOTSET"));
  if (int(a.strides.size()) != a.ns || int(a.dils.size()) != a.ns ||
      int(a.pads.size()) != 2 * a.ns) {
    return invalid_argument(who + ": strides, dilations or pads have the wrong length");
  }
  if (a.group < 1) return invalid_argument(who + ": group must be >= 1");
  for (int i = 0; i < a.ns; ++i) {
    if (a.strides[i] < 1 || a.dils[i] < 1)
      return invalid_argument(who + ": strides and dilations must be >= 1");
  }
  if (auto_pad == "NOTSET") {
    a.auto_pad = AutoPad::kNotSet;
  } else if (auto_pad == "VALID") {
    a.auto_pad = AutoPad::kValid;
  } else if (auto_pad == "SAME_UPPER") {
    a.auto_pad = AutoPad::kSameUpper;
  } else if (auto_pad == "SAME_LOWER") {
    a.auto_pad = AutoPad::kSameLower;
  } else {
    return unsupported(who + ": auto_pad '" + auto_pad + "'");
  }
  return std::unique_ptr<Kernel>(new ConvIntegerKernel("cuda." + q.node.op_type, o, std::move(a)));
}

StatusOr<std::unique_ptr<Kernel>> make_matmul_integer(const KernelQuery& q) {
  bool qlinear = ops::find_op(q.node.domain, q.node.op_type) == OpKind::kQLinearMatMul;
  Operands o = operands_of(qlinear, /*conv=*/false);
  KILN_RETURN_IF_ERROR(check_operands(q, o, /*conv=*/false));
  const std::string who = q.node.describe();
  const ir::Value* y = q.outputs.empty() ? nullptr : q.outputs[0];
  if (!y || !y->shape || y->shape->size() > size_t(kMaxRank) + 2) {
    return unsupported(who + ": the CUDA kernel takes Y of known rank up to " +
                       std::to_string(kMaxRank + 2));
  }
  return std::unique_ptr<Kernel>(new MatMulIntegerKernel("cuda." + q.node.op_type, o));
}

}  // namespace

void register_quant_gemm(Registry& r) {
  r.add(OpKind::kConvInteger, &make_conv_integer);
  r.add(OpKind::kQLinearConv, &make_conv_integer);
  r.add(OpKind::kMatMulInteger, &make_matmul_integer);
  r.add(OpKind::kQLinearMatMul, &make_matmul_integer);
}

}  // namespace kiln::backends::cuda
