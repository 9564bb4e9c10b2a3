// CPU reference kernel of DeformConv (2-D), a member of the conv family kept apart from conv.cc's
// fast paths: each kernel tap is sampled bilinearly at its offset position, then multiplied by W
// as a grouped convolution. Float dtypes; computes in double.
#include <cmath>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/numeric.h"

namespace kiln::backends::cpu {
namespace {

// The value of plane `p` (h x w, row-major) at (y, x), as ONNX's reference computes it through
// GridSample (bilinear, align_corners=1, zeros padding): each of the four corners outside the
// plane reads 0.
double bilinear(const double* p, int64_t h, int64_t w, double y, double x) {
  if (!std::isfinite(y) || !std::isfinite(x) || y <= -1 || x <= -1 || y >= double(h) ||
      x >= double(w)) {
    return 0;  // every corner is outside (and NaN or a huge offset never reaches a cast)
  }
  const double fy = std::floor(y), fx = std::floor(x);
  const int64_t y0 = int64_t(fy), x0 = int64_t(fx);
  const double ly = y - fy, lx = x - fx;
  double v = 0;
  for (int dy = 0; dy < 2; ++dy) {
    const int64_t yy = y0 + dy;
    if (yy < 0 || yy >= h) continue;
    const double wy = dy ? ly : 1 - ly;
    for (int dx = 0; dx < 2; ++dx) {
      const int64_t xx = x0 + dx;
      if (xx < 0 || xx >= w) continue;
      v += wy * (dx ? lx : 1 - lx) * p[yy * w + xx];
    }
  }
  return v;
}

Status get_pair(const ir::Attributes& attrs, const char* name, size_t n, int64_t fallback,
                int64_t min_value, std::vector<int64_t>* out) {
  KILN_ASSIGN_OR_RETURN(*out, attrs.get_ints(name, std::vector<int64_t>(n, fallback)));
  bool ok = out->size() == n;
  for (int64_t v : *out) ok = ok && v >= min_value && v <= (int64_t(1) << 31);
  if (!ok) return invalid_argument(std::string("DeformConv: attribute ") + name + " is malformed");
  return ok_status();
}

Status deform_conv_kernel(const KernelArgs& a) {
  if (a.in.size() < 3 || a.out.empty() || !present(a.in[2])) {
    return invalid_argument("DeformConv: expected X, W, offset and an output");
  }
  const TensorView &x = a.in[0], &w = a.in[1], &offset = a.in[2], &y = a.out[0];
  const bool has_bias = a.in.size() > 3 && present(a.in[3]);
  const bool has_mask = a.in.size() > 4 && present(a.in[4]);
  KILN_ASSIGN_OR_RETURN(int64_t group, a.attrs.get_int("group", 1));
  KILN_ASSIGN_OR_RETURN(int64_t offset_group, a.attrs.get_int("offset_group", 1));
  std::vector<int64_t> strides, dils, pads;
  KILN_RETURN_IF_ERROR(get_pair(a.attrs, "strides", 2, 1, 1, &strides));
  KILN_RETURN_IF_ERROR(get_pair(a.attrs, "dilations", 2, 1, 1, &dils));
  KILN_RETURN_IF_ERROR(get_pair(a.attrs, "pads", 4, 0, 0, &pads));
  if (x.rank() != 4 || w.rank() != 4 || offset.rank() != 4 || y.rank() != 4) {
    return invalid_argument("DeformConv: only 2-D ([N, C, H, W]) is supported");
  }
  const int64_t batch = x.shape[0], c_in = x.shape[1], in_h = x.shape[2], in_w = x.shape[3];
  const int64_t c_out = w.shape[0], kh = w.shape[2], kw = w.shape[3];
  const int64_t out_h = y.shape[2], out_w = y.shape[3];
  const int64_t taps = kh * kw;
  bool ok = group >= 1 && offset_group >= 1 && c_in == w.shape[1] * group && c_out % group == 0 &&
            c_in % offset_group == 0 && y.shape[0] == batch && y.shape[1] == c_out &&
            offset.shape[0] == batch && offset.shape[1] == offset_group * taps * 2 &&
            offset.shape[2] == out_h && offset.shape[3] == out_w &&
            (!has_bias || a.in[3].numel() == c_out);
  if (ok && has_mask) {
    const TensorView& m = a.in[4];
    ok = m.rank() == 4 && m.shape[0] == batch && m.shape[1] == offset_group * taps &&
         m.shape[2] == out_h && m.shape[3] == out_w;
  }
  if (!ok) {
    return invalid_argument("DeformConv: X " + shape_to_string(x.shape) + ", W " +
                            shape_to_string(w.shape) + ", offset " + shape_to_string(offset.shape) +
                            " and Y " + shape_to_string(y.shape) +
                            " do not agree with the group, offset_group and mask");
  }
  const int64_t cpg = c_in / group, opg = c_out / group, c_per_og = c_in / offset_group;
  const int64_t out_sp = out_h * out_w, in_sp = in_h * in_w;
  // Per image: the sampled (and masked) input of every channel and tap, [C, kH*kW, oH*oW], then a
  // grouped product with W.
  std::vector<double> plane(static_cast<size_t>(in_sp)),
      cols(static_cast<size_t>(c_in * taps * out_sp));
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t c = 0; c < c_in; ++c) {
      for (int64_t e = 0; e < in_sp; ++e)
        plane[size_t(e)] = load_f64(x, (n * c_in + c) * in_sp + e);
      const int64_t og = c / c_per_og;
      for (int64_t i = 0; i < kh; ++i) {
        for (int64_t j = 0; j < kw; ++j) {
          const int64_t t = i * kw + j;
          // offset's channels are [offset_group, kH, kW, (dy, dx)]; mask's [offset_group, kH, kW].
          const int64_t off_ch = (n * offset_group * taps + og * taps + t) * 2;
          const int64_t mask_ch = n * offset_group * taps + og * taps + t;
          for (int64_t oy = 0; oy < out_h; ++oy) {
            for (int64_t ox = 0; ox < out_w; ++ox) {
              const int64_t o = oy * out_w + ox;
              const double dy = load_f64(offset, off_ch * out_sp + o);
              const double dx = load_f64(offset, (off_ch + 1) * out_sp + o);
              const double py = double(oy * strides[0] - pads[0] + i * dils[0]) + dy;
              const double px = double(ox * strides[1] - pads[1] + j * dils[1]) + dx;
              double v = bilinear(plane.data(), in_h, in_w, py, px);
              if (has_mask) v *= load_f64(a.in[4], mask_ch * out_sp + o);
              cols[size_t((c * taps + t) * out_sp + o)] = v;
            }
          }
        }
      }
    }
    for (int64_t m = 0; m < c_out; ++m) {
      const int64_t g = m / opg;
      const double b = has_bias ? load_f64(a.in[3], m) : 0.0;
      for (int64_t o = 0; o < out_sp; ++o) {
        double acc = b;
        for (int64_t c = 0; c < cpg; ++c) {
          for (int64_t t = 0; t < taps; ++t) {
            acc += load_f64(w, (m * cpg + c) * taps + t) *
                   cols[size_t(((g * cpg + c) * taps + t) * out_sp + o)];
          }
        }
        store_f64(y, (n * c_out + m) * out_sp + o, acc);
      }
    }
  }
  return ok_status();
}

}  // namespace

void register_deform_conv_kernels(KernelRegistry& r) {
  r.add(ops::OpKind::kDeformConv, &deform_conv_kernel);
}

}  // namespace kiln::backends::cpu
