// CPU reference kernels of ConvTranspose (groups, dilations, output_padding, output_shape,
// auto_pad), MaxUnpool and Col2Im (the scatter-add ops), members of the conv family kept apart from
// conv.cc's fast paths. ConvTranspose takes any float dtype and accumulates in double.
#include <algorithm>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/numeric.h"

namespace kiln::backends::cpu {
namespace {

bool is_float_dtype(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 ||
         t == DType::kBFloat16;
}

// Reads an int list attribute that must be empty or have n values.
Status get_list(const ir::Attributes& attrs, const char* name, size_t n, int64_t fallback,
                std::vector<int64_t>* out) {
  KILN_ASSIGN_OR_RETURN(*out, attrs.get_ints(name, std::vector<int64_t>{}));
  if (out->empty()) out->assign(n, fallback);
  if (out->size() != n) {
    return invalid_argument(std::string("attribute ") + name + " has " +
                            std::to_string(out->size()) + " values, expected " + std::to_string(n));
  }
  return ok_status();
}

// Scatters every input element through the kernel: y[n, g*Mg + m, i*stride + k*dil - pad_begin]
// += x[n, g*Cg + c, i] * w[g*Cg + c, m, k], dropping positions outside Y.
Status conv_transpose_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const TensorView& w = a.in[1];
  const TensorView& y = a.out[0];
  int ns = x.rank() - 2;
  if (ns < 1 || ns > 3 || w.rank() != x.rank() || y.rank() != x.rank()) {
    return unsupported("ConvTranspose: X " + shape_to_string(x.shape) + ", W " +
                       shape_to_string(w.shape) + ": only 1-D, 2-D and 3-D are supported");
  }
  if (!is_float_dtype(x.dtype) || w.dtype != x.dtype || y.dtype != x.dtype) {
    return unsupported("ConvTranspose: dtype " + std::string(dtype_name(x.dtype)));
  }
  KILN_ASSIGN_OR_RETURN(int64_t group, a.attrs.get_int("group", 1));
  std::vector<int64_t> strides, dils, pads, out_pad;
  KILN_RETURN_IF_ERROR(get_list(a.attrs, "strides", size_t(ns), 1, &strides));
  KILN_RETURN_IF_ERROR(get_list(a.attrs, "dilations", size_t(ns), 1, &dils));
  KILN_RETURN_IF_ERROR(get_list(a.attrs, "pads", size_t(2 * ns), 0, &pads));
  KILN_RETURN_IF_ERROR(get_list(a.attrs, "output_padding", size_t(ns), 0, &out_pad));
  KILN_ASSIGN_OR_RETURN(std::string auto_pad, a.attrs.get_string("auto_pad", "NOTSET"));
  int64_t batch = x.shape[0], c_in = x.shape[1], m_out = y.shape[1];
  if (group < 1 || c_in % group != 0 || w.shape[0] != c_in || w.shape[1] * group != m_out ||
      y.shape[0] != batch) {
    return invalid_argument("ConvTranspose: X " + shape_to_string(x.shape) + ", W " +
                            shape_to_string(w.shape) + " and Y " + shape_to_string(y.shape) +
                            " do not agree with group " + std::to_string(group));
  }
  // Three axes, leading ones of size 1 for 1-D and 2-D.
  int64_t in[3] = {1, 1, 1}, k[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int64_t st[3] = {1, 1, 1}, dl[3] = {1, 1, 1}, pb[3] = {0, 0, 0};
  for (int i = 0; i < ns; ++i) {
    int j = 3 - ns + i;
    in[j] = x.shape[2 + i];
    k[j] = w.shape[2 + i];
    out[j] = y.shape[2 + i];
    st[j] = strides[i];
    dl[j] = dils[i];
    if (st[j] < 1 || dl[j] < 1)
      return invalid_argument("ConvTranspose: strides and dilations >= 1");
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      // As the ONNX reference: the padding that makes the full result exactly Y's size.
      int64_t total = st[j] * (in[j] - 1) + out_pad[i] + (k[j] - 1) * dl[j] + 1 - out[j];
      pb[j] = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
    } else if (auto_pad == "NOTSET") {
      pb[j] = pads[i];
    }
  }
  int64_t cg = c_in / group, mg = m_out / group;
  int64_t in_sp = in[0] * in[1] * in[2], k_sp = k[0] * k[1] * k[2],
          out_sp = out[0] * out[1] * out[2];
  std::vector<double> acc(size_t(y.numel()), 0.0);
  bool has_bias = a.in.size() > 2 && present(a.in[2]);
  if (has_bias && a.in[2].numel() != m_out) {
    return invalid_argument("ConvTranspose: B must have " + std::to_string(m_out) + " values");
  }
  std::vector<double> xs = to_f64(x), ws = to_f64(w);
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t g = 0; g < group; ++g) {
      for (int64_t c = 0; c < cg; ++c) {
        const double* xp = xs.data() + (n * c_in + g * cg + c) * in_sp;
        for (int64_t m = 0; m < mg; ++m) {
          const double* wp = ws.data() + ((g * cg + c) * mg + m) * k_sp;
          double* yp = acc.data() + (n * m_out + g * mg + m) * out_sp;
          for (int64_t i0 = 0; i0 < in[0]; ++i0) {
            for (int64_t i1 = 0; i1 < in[1]; ++i1) {
              for (int64_t i2 = 0; i2 < in[2]; ++i2) {
                double xv = xp[(i0 * in[1] + i1) * in[2] + i2];
                if (xv == 0) continue;
                for (int64_t k0 = 0; k0 < k[0]; ++k0) {
                  int64_t o0 = i0 * st[0] + k0 * dl[0] - pb[0];
                  if (o0 < 0 || o0 >= out[0]) continue;
                  for (int64_t k1 = 0; k1 < k[1]; ++k1) {
                    int64_t o1 = i1 * st[1] + k1 * dl[1] - pb[1];
                    if (o1 < 0 || o1 >= out[1]) continue;
                    for (int64_t k2 = 0; k2 < k[2]; ++k2) {
                      int64_t o2 = i2 * st[2] + k2 * dl[2] - pb[2];
                      if (o2 < 0 || o2 >= out[2]) continue;
                      yp[(o0 * out[1] + o1) * out[2] + o2] += xv * wp[(k0 * k[1] + k1) * k[2] + k2];
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t m = 0; m < m_out; ++m) {
      double b = has_bias ? load_f64(a.in[2], m) : 0.0;
      for (int64_t i = 0; i < out_sp; ++i) {
        int64_t e = (n * m_out + m) * out_sp + i;
        store_f64(y, e, acc[size_t(e)] + b);
      }
    }
  }
  return ok_status();
}

// MaxUnpool, as the ONNX reference: X scattered by flat index into a zero tensor of the size the
// pool attributes imply, which is then placed at the origin of Y (output_shape may be larger).
Status max_unpool_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const TensorView& idx = a.in[1];
  const TensorView& y = a.out[0];
  int ns = x.rank() - 2;
  if (ns < 1 || y.rank() != x.rank() || idx.numel() != x.numel() || y.dtype != x.dtype ||
      idx.dtype != DType::kInt64) {
    return invalid_argument("MaxUnpool: X " + shape_to_string(x.shape) + ", I " +
                            shape_to_string(idx.shape) + " and Y " + shape_to_string(y.shape) +
                            " are inconsistent");
  }
  std::vector<int64_t> kernel, strides, pads;
  KILN_ASSIGN_OR_RETURN(kernel, a.attrs.get_ints("kernel_shape", std::nullopt));
  KILN_RETURN_IF_ERROR(get_list(a.attrs, "strides", size_t(ns), 1, &strides));
  KILN_RETURN_IF_ERROR(get_list(a.attrs, "pads", size_t(2 * ns), 0, &pads));
  if (int(kernel.size()) != ns) return invalid_argument("MaxUnpool: kernel_shape length");
  std::vector<int64_t> inferred = {x.shape[0], x.shape[1]};
  for (int i = 0; i < ns; ++i) {
    int64_t d = (x.shape[2 + i] - 1) * strides[i] - pads[i] - pads[ns + i] + kernel[i];
    if (d > y.shape[2 + i] || d < 0) {
      return invalid_argument("MaxUnpool: output_shape is smaller than the unpooled size");
    }
    inferred.push_back(d);
  }
  if (inferred[0] != y.shape[0] || inferred[1] != y.shape[1]) {
    return invalid_argument("MaxUnpool: output_shape must keep N and C");
  }
  int64_t total = shape_numel(inferred);
  std::vector<double> tmp(size_t(total), 0.0);
  const int64_t* ip = idx.as<const int64_t>();
  for (int64_t e = 0; e < x.numel(); ++e) {
    if (ip[e] < 0 || ip[e] >= total) {
      return invalid_argument("MaxUnpool: index " + std::to_string(ip[e]) +
                              " is out of range [0, " + std::to_string(total) + ")");
    }
    tmp[size_t(ip[e])] = load_f64(x, e);
  }
  for (int64_t e = 0; e < y.numel(); ++e) store_f64(y, e, 0.0);
  // Walk the inferred tensor and place each element at the same coordinates in Y.
  int rank = x.rank();
  std::vector<int64_t> coord(size_t(rank), 0);
  for (int64_t e = 0; e < total; ++e) {
    int64_t off = 0;
    for (int d = 0; d < rank; ++d) off = off * y.shape[d] + coord[d];
    store_f64(y, off, tmp[size_t(e)]);
    for (int d = rank - 1; d >= 0; --d) {
      if (++coord[d] < inferred[d]) break;
      coord[d] = 0;
    }
  }
  return ok_status();
}

// Col2Im, as the ONNX reference: block element k of column l of channel c lands at image position
// l_i*stride_i - pad_begin_i + k_i*dilation_i (per axis, l and k unravelled row-major), summed,
// positions outside the image dropped. Any numeric dtype; sums in double.
Status col2im_kernel(const KernelArgs& a) {
  if (a.in.size() < 3 || a.out.empty()) return invalid_argument("Col2Im: expected 3 inputs");
  const TensorView& x = a.in[0];
  const TensorView& y = a.out[0];
  std::vector<int64_t> image, block;
  if (!read_indices(a.in[1], &image) || !read_indices(a.in[2], &block) || image.empty() ||
      block.size() != image.size()) {
    return invalid_argument("Col2Im: image_shape and block_shape must be int64 of one length");
  }
  const size_t ns = image.size();
  std::vector<int64_t> strides, dils, pads;
  KILN_RETURN_IF_ERROR(get_list(a.attrs, "strides", ns, 1, &strides));
  KILN_RETURN_IF_ERROR(get_list(a.attrs, "dilations", ns, 1, &dils));
  KILN_RETURN_IF_ERROR(get_list(a.attrs, "pads", 2 * ns, 0, &pads));
  // Every number below comes from the model or its inputs: checked before any index is formed.
  int64_t block_size = 1, blocks = 1;
  std::vector<int64_t> counts(ns);
  bool ok =
      x.rank() == 3 && y.rank() == int(ns) + 2 && y.dtype == x.dtype && y.shape[0] == x.shape[0];
  for (size_t i = 0; ok && i < ns; ++i) {
    ok = block[i] >= 1 && strides[i] >= 1 && dils[i] >= 1 && pads[i] >= 0 && pads[ns + i] >= 0 &&
         image[i] == y.shape[2 + i] && block[i] <= x.shape[1] && dils[i] <= (int64_t(1) << 31) &&
         block[i] <= (int64_t(1) << 31) && pads[i] < (int64_t(1) << 40) &&
         pads[ns + i] < (int64_t(1) << 40);
    if (!ok) break;
    block_size *= block[i];
    const int64_t span = image[i] + pads[i] + pads[ns + i] - dils[i] * (block[i] - 1) - 1;
    counts[i] = span / strides[i] + 1;
    ok = block_size <= x.shape[1] && span >= 0 && counts[i] <= x.shape[2];
    if (ok) blocks *= counts[i];
    ok = ok && blocks <= x.shape[2];
  }
  if (!ok || blocks != x.shape[2] || x.shape[1] != y.shape[1] * block_size) {
    return invalid_argument("Col2Im: input " + shape_to_string(x.shape) + ", output " +
                            shape_to_string(y.shape) +
                            ", image_shape, block_shape and the attributes do not agree");
  }
  const int64_t batch = x.shape[0], channels = y.shape[1], cols = x.shape[2];
  const int64_t image_size = shape_numel(image);
  std::vector<double> acc(static_cast<size_t>(image_size));
  std::vector<int64_t> kidx(ns), lidx(ns);
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t c = 0; c < channels; ++c) {
      std::fill(acc.begin(), acc.end(), 0.0);
      std::fill(kidx.begin(), kidx.end(), 0);
      for (int64_t k = 0; k < block_size; ++k) {
        const int64_t row = (n * channels + c) * block_size + k;
        std::fill(lidx.begin(), lidx.end(), 0);
        for (int64_t l = 0; l < cols; ++l) {
          int64_t off = 0;
          bool inside = true;
          for (size_t i = 0; i < ns && inside; ++i) {
            const int64_t p = lidx[i] * strides[i] - pads[i] + kidx[i] * dils[i];
            inside = p >= 0 && p < image[i];
            off = off * image[i] + p;
          }
          if (inside) acc[size_t(off)] += load_f64(x, row * cols + l);
          for (size_t i = ns; i-- > 0;) {
            if (++lidx[i] < counts[i]) break;
            lidx[i] = 0;
          }
        }
        for (size_t i = ns; i-- > 0;) {
          if (++kidx[i] < block[i]) break;
          kidx[i] = 0;
        }
      }
      for (int64_t e = 0; e < image_size; ++e) {
        store_f64(y, (n * channels + c) * image_size + e, acc[size_t(e)]);
      }
    }
  }
  return ok_status();
}

}  // namespace

void register_conv_transpose_kernels(KernelRegistry& r) {
  r.add(ops::OpKind::kConvTranspose, &conv_transpose_kernel);
  r.add(ops::OpKind::kMaxUnpool, &max_unpool_kernel);
  r.add(ops::OpKind::kCol2Im, &col2im_kernel);
}

}  // namespace kiln::backends::cpu
