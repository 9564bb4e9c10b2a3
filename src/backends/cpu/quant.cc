// CPU reference kernels of the quant op family: QuantizeLinear/DequantizeLinear (per tensor, per
// axis, blocked), DynamicQuantizeLinear, MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv.
// Integer products are exact in double (8-bit operands, sums far below 2^53).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/numeric.h"

namespace kiln::backends::cpu {
namespace {

// Maps each element of X to its scale / zero-point index.
struct ParamMap {
  enum class Kind { kTensor, kAxis, kBlocked } kind = Kind::kTensor;
  int64_t dim = 1, inner = 1, block = 1, blocks = 1;
  int64_t at(int64_t e) const {
    if (kind == Kind::kTensor) return 0;
    int64_t a = (e / inner) % dim;
    if (kind == Kind::kAxis) return a;
    int64_t o = e / (inner * dim);
    return (o * blocks + a / block) * inner + e % inner;
  }
};

Status make_param_map(const char* op, const KernelArgs& a, ParamMap* m) {
  const TensorView& x = a.in[0];
  const TensorView& s = a.in[1];
  KILN_ASSIGN_OR_RETURN(int64_t axis, a.attrs.get_int("axis", 1));
  KILN_ASSIGN_OR_RETURN(int64_t block, a.attrs.get_int("block_size", 0));
  if (a.in.size() > 2 && present(a.in[2]) && a.in[2].numel() != s.numel()) {
    return invalid_argument(std::string(op) + ": zero point and scale sizes differ");
  }
  int rank = x.rank();
  if (s.numel() == 1 && block == 0) {
    m->kind = ParamMap::Kind::kTensor;
    return ok_status();
  }
  if (axis < -rank || axis >= rank) {
    return invalid_argument(std::string(op) + ": axis " + std::to_string(axis) +
                            " is out of range for rank " + std::to_string(rank));
  }
  if (axis < 0) axis += rank;
  m->dim = x.shape[axis];
  m->inner = 1;
  for (int d = int(axis) + 1; d < rank; ++d) m->inner *= x.shape[d];
  if (block == 0) {
    if (s.numel() != m->dim) {
      return invalid_argument(std::string(op) + ": scale has " + std::to_string(s.numel()) +
                              " values for axis dim " + std::to_string(m->dim));
    }
    m->kind = ParamMap::Kind::kAxis;
    return ok_status();
  }
  m->kind = ParamMap::Kind::kBlocked;
  m->block = block;
  m->blocks = (m->dim + block - 1) / block;
  int64_t outer = m->dim ? x.numel() / (m->dim * m->inner) : 0;
  if (s.numel() != outer * m->blocks * m->inner) {
    return invalid_argument(std::string(op) + ": blocked scale has " + std::to_string(s.numel()) +
                            " values, expected " + std::to_string(outer * m->blocks * m->inner));
  }
  return ok_status();
}

double qmin(DType t) {
  switch (t) {
    case DType::kInt8:
      return -128;
    case DType::kInt16:
      return -32768;
    case DType::kInt32:
      return -2147483648.0;
    default:
      return 0;
  }
}
double qmax(DType t) {
  switch (t) {
    case DType::kInt8:
      return 127;
    case DType::kUInt8:
      return 255;
    case DType::kInt16:
      return 32767;
    case DType::kUInt16:
      return 65535;
    case DType::kInt32:
      return 2147483647.0;
    default:
      return 0;
  }
}

bool is_quant(DType t) {
  return t == DType::kInt8 || t == DType::kUInt8 || t == DType::kInt16 || t == DType::kUInt16 ||
         t == DType::kInt32;
}

// round-half-to-even (the default FP rounding mode), then saturate to the type's range.
double quantize_value(double v, double zp, DType t) {
  return std::clamp(std::nearbyint(v) + zp, qmin(t), qmax(t));
}

Status quantize_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const TensorView& y = a.out[0];
  if (!is_quant(y.dtype))
    return unsupported("QuantizeLinear: output dtype " + std::string(dtype_name(y.dtype)));
  if (y.numel() != x.numel()) return invalid_argument("QuantizeLinear: output size differs");
  ParamMap m;
  KILN_RETURN_IF_ERROR(make_param_map("QuantizeLinear", a, &m));
  bool has_zp = a.in.size() > 2 && present(a.in[2]);
  for (int64_t e = 0; e < x.numel(); ++e) {
    int64_t p = m.at(e);
    double q;
    // Divide in the input's precision, as the ONNX reference does, so ties round the same way.
    if (x.dtype == DType::kFloat64) {
      q = load_f64(x, e) / load_f64(a.in[1], p);
    } else {
      float f = float(load_f64(x, e)) / float(load_f64(a.in[1], p));
      if (x.dtype == DType::kFloat16) f = half_to_float(float_to_half(f));
      if (x.dtype == DType::kBFloat16) f = bf16_to_float(float_to_bf16(f));
      q = f;
    }
    store_f64(y, e, quantize_value(q, has_zp ? load_f64(a.in[2], p) : 0.0, y.dtype));
  }
  return ok_status();
}

Status dequantize_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const TensorView& y = a.out[0];
  if (y.numel() != x.numel()) return invalid_argument("DequantizeLinear: output size differs");
  ParamMap m;
  KILN_RETURN_IF_ERROR(make_param_map("DequantizeLinear", a, &m));
  bool has_zp = a.in.size() > 2 && present(a.in[2]);
  for (int64_t e = 0; e < x.numel(); ++e) {
    int64_t p = m.at(e);
    double v = load_f64(x, e) - (has_zp ? load_f64(a.in[2], p) : 0.0);
    if (y.dtype == DType::kFloat64) {
      store_f64(y, e, v * load_f64(a.in[1], p));
    } else {
      store_f64(y, e, double(float(v) * float(load_f64(a.in[1], p))));
    }
  }
  return ok_status();
}

// DynamicQuantizeLinear: uint8 with the scale and zero point that map [min(0, x), max(0, x)]
// onto [0, 255], in float32 as the spec writes it.
Status dynamic_quantize_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  if (x.dtype != DType::kFloat32 || a.out[0].dtype != DType::kUInt8 ||
      a.out[1].dtype != DType::kFloat32 || a.out[2].dtype != DType::kUInt8) {
    return invalid_argument("DynamicQuantizeLinear: expects float32 -> uint8, float32, uint8");
  }
  const float* xp = x.as<const float>();
  float mx = 0, mn = 0;
  for (int64_t e = 0; e < x.numel(); ++e) {
    mx = std::max(mx, xp[e]);
    mn = std::min(mn, xp[e]);
  }
  float scale = (mx == mn ? 1.0f : mx - mn) / 255.0f;
  float zp = std::nearbyint(std::clamp(0.0f - mn / scale, 0.0f, 255.0f));
  uint8_t* yp = a.out[0].as<uint8_t>();
  for (int64_t e = 0; e < x.numel(); ++e) {
    yp[e] = uint8_t(std::clamp(std::nearbyint(xp[e] / scale) + zp, 0.0f, 255.0f));
  }
  a.out[1].as<float>()[0] = scale;
  a.out[2].as<uint8_t>()[0] = uint8_t(zp);
  return ok_status();
}

// ---------------------------------------------------------------------------------------------
// Integer matmul and conv in double, with zero points subtracted first.

// numpy matmul over doubles: a [.., M, K], b [.., K, N] (1-D operands promoted) into y.
Status matmul_f64(const std::vector<double>& a, std::span<const int64_t> as,
                  const std::vector<double>& b, std::span<const int64_t> bs,
                  std::span<const int64_t> ys, std::vector<double>* y) {
  int ra = int(as.size()), rb = int(bs.size()), ry = int(ys.size());
  if (ra == 0 || rb == 0) return invalid_argument("matmul: inputs must have rank >= 1");
  int64_t m = ra > 1 ? as[ra - 2] : 1, k = as[ra - 1];
  int64_t kb = rb > 1 ? bs[rb - 2] : bs[0], n = rb > 1 ? bs[rb - 1] : 1;
  int nb = ry - (ra > 1) - (rb > 1);
  if (k != kb || nb < 0) return invalid_argument("matmul: inner dims differ");
  int nba = std::max(ra - 2, 0), nbb = std::max(rb - 2, 0);
  int64_t batches = 1;
  for (int d = 0; d < nb; ++d) batches *= ys[d];
  y->assign(size_t(batches * m * n), 0.0);
  std::vector<int64_t> idx(size_t(nb), 0);
  for (int64_t t = 0; t < batches; ++t) {
    int64_t ao = 0, bo = 0;
    for (int d = 0; d < nb; ++d) {
      int da = d - (nb - nba), db = d - (nb - nbb);
      if (da >= 0) ao = ao * as[da] + (as[da] == 1 ? 0 : idx[d]);
      if (db >= 0) bo = bo * bs[db] + (bs[db] == 1 ? 0 : idx[d]);
    }
    const double* ap = a.data() + ao * m * k;
    const double* bp = b.data() + bo * k * n;
    double* yp = y->data() + t * m * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t p = 0; p < k; ++p) {
        double av = ap[i * k + p];
        for (int64_t j = 0; j < n; ++j) yp[i * n + j] += av * bp[p * n + j];
      }
    }
    for (int d = nb - 1; d >= 0; --d) {
      if (++idx[d] < ys[d]) break;
      idx[d] = 0;
    }
  }
  return ok_status();
}

// v - zero point, where the zero point is per tensor or indexed by `along(e)` (a row of A or a
// column of B, an output channel of W).
template <typename Along>
std::vector<double> minus_zero_point(const TensorView& v, const KernelArgs& a, int zi,
                                     Along along) {
  std::vector<double> out = to_f64(v);
  if (zi >= int(a.in.size()) || !present(a.in[zi])) return out;
  const TensorView& z = a.in[zi];
  for (int64_t e = 0; e < v.numel(); ++e) {
    out[size_t(e)] -= load_f64(z, z.numel() == 1 ? 0 : along(e));
  }
  return out;
}

Status matmul_integer_kernel(const KernelArgs& a) {
  const TensorView& av = a.in[0];
  const TensorView& bv = a.in[1];
  if (a.out[0].dtype != DType::kInt32) return invalid_argument("MatMulInteger: output is int32");
  int64_t k = av.shape.back();
  int64_t n = bv.rank() > 1 ? bv.shape.back() : 1;
  // a_zero_point may be per row of A (M values), b_zero_point per column of B (N values).
  std::vector<double> A = minus_zero_point(
      av, a, 2, [&](int64_t e) { return (e / k) % std::max<int64_t>(a.in[2].numel(), 1); });
  std::vector<double> B = minus_zero_point(bv, a, 3, [&](int64_t e) { return e % n; });
  std::vector<double> y;
  KILN_RETURN_IF_ERROR(matmul_f64(A, av.shape, B, bv.shape, a.out[0].shape, &y));
  for (int64_t e = 0; e < a.out[0].numel(); ++e) store_f64(a.out[0], e, y[size_t(e)]);
  return ok_status();
}

// The requantization multiplier a_scale * b_scale / y_scale, rounded in the scales' dtype as the
// ONNX reference (numpy) rounds it.
double requant_multiplier(const TensorView& s1, const TensorView& s2, const TensorView& sy) {
  if (s1.dtype == DType::kFloat64) return load_f64(s1, 0) * load_f64(s2, 0) / load_f64(sy, 0);
  float m = float(load_f64(s1, 0)) * float(load_f64(s2, 0));
  if (s1.dtype == DType::kFloat16) m = half_to_float(float_to_half(m));
  m = m / float(load_f64(sy, 0));
  if (s1.dtype == DType::kFloat16) m = half_to_float(float_to_half(m));
  return m;
}

Status qlinear_matmul_kernel(const KernelArgs& a) {
  const TensorView& av = a.in[0];
  const TensorView& bv = a.in[3];
  const TensorView& yv = a.out[0];
  for (int i : {1, 4, 6}) {
    if (a.in[i].numel() != 1) {
      return unsupported("QLinearMatMul: only per-tensor scales are supported");
    }
  }
  std::vector<double> A = minus_zero_point(av, a, 2, [](int64_t) { return int64_t(0); });
  std::vector<double> B = minus_zero_point(bv, a, 5, [](int64_t) { return int64_t(0); });
  std::vector<double> y;
  KILN_RETURN_IF_ERROR(matmul_f64(A, av.shape, B, bv.shape, yv.shape, &y));
  double mul = requant_multiplier(a.in[1], a.in[4], a.in[6]);
  double zp = present(a.in[7]) ? load_f64(a.in[7], 0) : 0.0;
  for (int64_t e = 0; e < yv.numel(); ++e) {
    store_f64(yv, e, quantize_value(y[size_t(e)] * mul, zp, yv.dtype));
  }
  return ok_status();
}

// Direct convolution over doubles (groups, strides, pads, dilations, auto_pad), y sized by Y.
Status conv_f64(const char* op, const ir::Attributes& attrs, const std::vector<double>& x,
                std::span<const int64_t> xs, const std::vector<double>& w,
                std::span<const int64_t> ws, std::span<const int64_t> ys, std::vector<double>* y) {
  int ns = int(xs.size()) - 2;
  if (ns < 1 || ns > 3 || ws.size() != xs.size() || ys.size() != xs.size()) {
    return unsupported(std::string(op) + ": only 1-D, 2-D and 3-D inputs are supported");
  }
  KILN_ASSIGN_OR_RETURN(int64_t group, attrs.get_int("group", 1));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> strides,
                        attrs.get_ints("strides", std::vector<int64_t>(ns, 1)));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dils,
                        attrs.get_ints("dilations", std::vector<int64_t>(ns, 1)));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> pads,
                        attrs.get_ints("pads", std::vector<int64_t>(2 * ns, 0)));
  KILN_ASSIGN_OR_RETURN(std::string auto_pad, attrs.get_string("auto_pad", "NOTSET"));
  if (int(strides.size()) != ns || int(dils.size()) != ns || int(pads.size()) != 2 * ns) {
    return invalid_argument(std::string(op) + ": strides, dilations or pads have the wrong length");
  }
  int64_t batch = xs[0], c_in = xs[1], m_out = ws[0];
  if (group < 1 || c_in != ws[1] * group || m_out % group != 0 || ys[1] != m_out) {
    return invalid_argument(std::string(op) + ": channels do not agree with group");
  }
  int64_t in[3] = {1, 1, 1}, k[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int64_t st[3] = {1, 1, 1}, dl[3] = {1, 1, 1}, pb[3] = {0, 0, 0};
  for (int i = 0; i < ns; ++i) {
    int j = 3 - ns + i;
    in[j] = xs[2 + i];
    k[j] = ws[2 + i];
    out[j] = ys[2 + i];
    st[j] = strides[i];
    dl[j] = dils[i];
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      int64_t total = std::max<int64_t>(0, (out[j] - 1) * st[j] + (k[j] - 1) * dl[j] + 1 - in[j]);
      pb[j] = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
    } else if (auto_pad == "NOTSET") {
      pb[j] = pads[i];
    }
  }
  int64_t cg = c_in / group, mg = m_out / group;
  int64_t in_sp = in[0] * in[1] * in[2], k_sp = k[0] * k[1] * k[2],
          out_sp = out[0] * out[1] * out[2];
  y->assign(size_t(batch * m_out * out_sp), 0.0);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t mo = 0; mo < m_out; ++mo) {
      int64_t g = mo / mg;
      double* yp = y->data() + (b * m_out + mo) * out_sp;
      for (int64_t c = 0; c < cg; ++c) {
        const double* xp = x.data() + (b * c_in + g * cg + c) * in_sp;
        const double* wp = w.data() + (mo * cg + c) * k_sp;
        for (int64_t o0 = 0; o0 < out[0]; ++o0) {
          for (int64_t o1 = 0; o1 < out[1]; ++o1) {
            for (int64_t o2 = 0; o2 < out[2]; ++o2) {
              double acc = 0;
              for (int64_t k0 = 0; k0 < k[0]; ++k0) {
                int64_t i0 = o0 * st[0] + k0 * dl[0] - pb[0];
                if (i0 < 0 || i0 >= in[0]) continue;
                for (int64_t k1 = 0; k1 < k[1]; ++k1) {
                  int64_t i1 = o1 * st[1] + k1 * dl[1] - pb[1];
                  if (i1 < 0 || i1 >= in[1]) continue;
                  for (int64_t k2 = 0; k2 < k[2]; ++k2) {
                    int64_t i2 = o2 * st[2] + k2 * dl[2] - pb[2];
                    if (i2 < 0 || i2 >= in[2]) continue;
                    acc += xp[(i0 * in[1] + i1) * in[2] + i2] * wp[(k0 * k[1] + k1) * k[2] + k2];
                  }
                }
              }
              yp[(o0 * out[1] + o1) * out[2] + o2] += acc;
            }
          }
        }
      }
    }
  }
  return ok_status();
}

Status conv_integer_kernel(const KernelArgs& a) {
  const TensorView& xv = a.in[0];
  const TensorView& wv = a.in[1];
  if (a.out[0].dtype != DType::kInt32) return invalid_argument("ConvInteger: output is int32");
  int64_t w_per_out = wv.shape[0] ? wv.numel() / wv.shape[0] : 1;
  std::vector<double> X = minus_zero_point(xv, a, 2, [](int64_t) { return int64_t(0); });
  std::vector<double> W = minus_zero_point(wv, a, 3, [&](int64_t e) { return e / w_per_out; });
  std::vector<double> y;
  KILN_RETURN_IF_ERROR(
      conv_f64("ConvInteger", a.attrs, X, xv.shape, W, wv.shape, a.out[0].shape, &y));
  for (int64_t e = 0; e < a.out[0].numel(); ++e) store_f64(a.out[0], e, y[size_t(e)]);
  return ok_status();
}

Status qlinear_conv_kernel(const KernelArgs& a) {
  const TensorView& xv = a.in[0];
  const TensorView& wv = a.in[3];
  const TensorView& yv = a.out[0];
  if (a.in[1].numel() != 1 || a.in[6].numel() != 1) {
    return unsupported("QLinearConv: x_scale and y_scale must be per tensor");
  }
  int64_t m_out = wv.shape[0];
  int64_t w_per_out = m_out ? wv.numel() / m_out : 1;
  std::vector<double> X = minus_zero_point(xv, a, 2, [](int64_t) { return int64_t(0); });
  std::vector<double> W = minus_zero_point(wv, a, 5, [&](int64_t e) { return e / w_per_out; });
  std::vector<double> y;
  KILN_RETURN_IF_ERROR(conv_f64("QLinearConv", a.attrs, X, xv.shape, W, wv.shape, yv.shape, &y));
  bool has_bias = a.in.size() > 8 && present(a.in[8]);
  double zp = present(a.in[7]) ? load_f64(a.in[7], 0) : 0.0;
  int64_t planes = yv.shape[0] * m_out;
  int64_t out_sp = planes != 0 ? yv.numel() / planes : 1;
  const TensorView& ws = a.in[4];
  for (int64_t e = 0; e < yv.numel(); ++e) {
    int64_t mo = (e / out_sp) % m_out;
    double acc = y[size_t(e)] + (has_bias ? load_f64(a.in[8], mo) : 0.0);
    double mul =
        double(float(load_f64(a.in[1], 0)) * float(load_f64(ws, ws.numel() == 1 ? 0 : mo)) /
               float(load_f64(a.in[6], 0)));
    store_f64(yv, e, quantize_value(acc * mul, zp, yv.dtype));
  }
  return ok_status();
}

}  // namespace

void register_quant_kernels(KernelRegistry& r) {
  r.add(ops::OpKind::kQuantizeLinear, &quantize_kernel);
  r.add(ops::OpKind::kDequantizeLinear, &dequantize_kernel);
  r.add(ops::OpKind::kDynamicQuantizeLinear, &dynamic_quantize_kernel);
  r.add(ops::OpKind::kMatMulInteger, &matmul_integer_kernel);
  r.add(ops::OpKind::kQLinearMatMul, &qlinear_matmul_kernel);
  r.add(ops::OpKind::kConvInteger, &conv_integer_kernel);
  r.add(ops::OpKind::kQLinearConv, &qlinear_conv_kernel);
}

}  // namespace kiln::backends::cpu
