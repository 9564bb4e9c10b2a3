// CPU reference kernels of the norm op family: Layer/RMS/Batch(inference)/Instance/Group/Lp/
// MeanVariance normalization, LRN, Softmax, LogSoftmax and kiln::BiasSoftmax. Float types only;
// float16/bfloat16 compute in float, float64 in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/thread_pool.h"
#include "backends/cpu/vector_math.h"

namespace kiln::backends::cpu {
namespace {

struct Half {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

// Storage type T <-> compute type C.
template <typename T>
struct Num {
  using C = T;
  static C load(T v) { return v; }
  static T store(C v) { return v; }
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

template <typename Fn>
Status visit_float(DType dt, std::string_view op, Fn&& fn) {
  switch (dt) {
    case DType::kFloat32:
      return fn(float{});
    case DType::kFloat64:
      return fn(double{});
    case DType::kFloat16:
      return fn(Half{});
    case DType::kBFloat16:
      return fn(BF16{});
    default:
      return unsupported(std::string(op) + ": dtype " + std::string(dtype_name(dt)) +
                         " is not supported by the CPU kernel");
  }
}

// Scalar access by dtype, for per-channel parameters and per-row statistics.
double load_at(const TensorView& v, int64_t i) {
  switch (v.dtype) {
    case DType::kFloat32:
      return v.as<float>()[i];
    case DType::kFloat64:
      return v.as<double>()[i];
    case DType::kFloat16:
      return half_to_float(v.as<uint16_t>()[i]);
    case DType::kBFloat16:
      return bf16_to_float(v.as<uint16_t>()[i]);
    default:
      return NAN;
  }
}

void store_at(const TensorView& v, int64_t i, double x) {
  switch (v.dtype) {
    case DType::kFloat32:
      v.as<float>()[i] = float(x);
      break;
    case DType::kFloat64:
      v.as<double>()[i] = x;
      break;
    case DType::kFloat16:
      v.as<uint16_t>()[i] = float_to_half(float(x));
      break;
    case DType::kBFloat16:
      v.as<uint16_t>()[i] = float_to_bf16(float(x));
      break;
    default:
      break;
  }
}

bool is_kernel_float(DType dt) {
  return dt == DType::kFloat32 || dt == DType::kFloat64 || dt == DType::kFloat16 ||
         dt == DType::kBFloat16;
}

int64_t prod(std::span<const int64_t> s, int from, int to) {
  int64_t p = 1;
  for (int d = from; d < to; ++d) p *= s[d];
  return p;
}

// A kernel whose meaning depends on the node's opset (Softmax's axis semantics changed in 13).
class OpsetKernel final : public Kernel {
 public:
  using Fn = Status (*)(const KernelArgs& args, int opset);
  OpsetKernel(std::string name, ir::Attributes attrs, int opset, Fn fn)
      : name_(std::move(name)), attrs_(std::move(attrs)), opset_(opset), fn_(fn) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    return fn_(KernelArgs{attrs_, in, out}, opset_);
  }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  ir::Attributes attrs_;
  int opset_;
  Fn fn_;
};

// ---------------------------------------------------------------------------------------------
// Softmax / LogSoftmax over (outer, n, inner): n is reduced, inner is the stride between items.

// One outer block of Softmax / LogSoftmax: its `inner` items of n values each.
template <typename T>
void softmax_outer(const T* x, T* y, int64_t o, int64_t n, int64_t inner, bool log) {
  using N = Num<T>;
  using C = typename N::C;
  for (int64_t i = 0; i < inner; ++i) {
    const T* xp = x + o * n * inner + i;
    T* yp = y + o * n * inner + i;
    C mx = -std::numeric_limits<C>::infinity();
    for (int64_t k = 0; k < n; ++k) mx = std::max(mx, N::load(xp[k * inner]));
    double sum = 0;
    for (int64_t k = 0; k < n; ++k) {
      C e = std::exp(N::load(xp[k * inner]) - mx);
      sum += e;
      if constexpr (std::is_same_v<T, C>) {
        if (!log) yp[k * inner] = e;  // exact in T, so it is reused below
      }
    }
    if (log) {
      C shift = mx + C(std::log(sum));
      for (int64_t k = 0; k < n; ++k) yp[k * inner] = N::store(N::load(xp[k * inner]) - shift);
    } else {
      C inv = C(1.0 / sum);
      for (int64_t k = 0; k < n; ++k) {
        if constexpr (std::is_same_v<T, C>) {
          yp[k * inner] *= inv;
        } else {
          yp[k * inner] = N::store(std::exp(N::load(xp[k * inner]) - mx) * inv);
        }
      }
    }
  }
}

// The outer blocks, each alone, so they go to threads with the same bits as one thread.
template <typename T>
void softmax_block(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool log) {
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n * inner, 1));
  parallel_chunks(outer, grain, [&](int64_t first, int64_t last) {
    for (int64_t o = first; o < last; ++o) {
      if constexpr (std::is_same_v<T, float>) {
        // Contiguous float32 rows (the last axis, as attention's scores): the vectorized row.
        if (inner == 1 && !log) {
          softmax_row_f32(x + o * n, y + o * n, n);
          continue;
        }
      }
      softmax_outer(x, y, o, n, inner, log);
    }
  });
}

Status softmax_impl(const KernelArgs& a, int opset, bool log) {
  const char* op = log ? "LogSoftmax" : "Softmax";
  const TensorView& x = a.in[0];
  const TensorView& y = a.out[0];
  int rank = x.rank();
  bool single_axis = opset <= 0 || opset >= 13;
  KILN_ASSIGN_OR_RETURN(int64_t axis, a.attrs.get_int("axis", single_axis ? -1 : 1));
  if (axis < -rank || axis > rank || (single_axis && axis == rank) || (axis == rank && rank == 0)) {
    return invalid_argument(std::string(op) + ": axis " + std::to_string(axis) +
                            " is out of range for rank " + std::to_string(rank));
  }
  if (axis < 0) axis += rank;
  if (y.dtype != x.dtype || y.numel() != x.numel()) {
    return invalid_argument(std::string(op) + ": output does not match the input");
  }
  int64_t outer = prod(x.shape, 0, int(axis));
  int64_t n, inner;
  if (single_axis) {
    n = x.shape[axis];
    inner = prod(x.shape, int(axis) + 1, rank);
  } else {
    n = prod(x.shape, int(axis), rank);
    inner = 1;
  }
  if (x.numel() == 0) return ok_status();
  return visit_float(x.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    softmax_block<T>(x.as<const T>(), y.as<T>(), outer, n, inner, log);
    return ok_status();
  });
}

Status softmax_kernel(const KernelArgs& a, int opset) { return softmax_impl(a, opset, false); }
Status log_softmax_kernel(const KernelArgs& a, int opset) { return softmax_impl(a, opset, true); }

// kiln::BiasSoftmax(X, B): Softmax(X + B) over the last axis. Each row's sum goes into its output
// row with the Add kernel's arithmetic (in float for float16/bfloat16, rounded to X's type), then
// the Softmax kernel's own row routine runs on it in place: the unfused Add and Softmax's bits.
Status bias_softmax_kernel(const KernelArgs& a) {
  const TensorView &x = a.in[0], &b = a.in[1], &y = a.out[0];
  const int rank = x.rank();
  KILN_ASSIGN_OR_RETURN(int64_t axis, a.attrs.get_int("axis", -1));
  if (rank == 0 || (axis != -1 && axis != rank - 1)) {
    return invalid_argument("BiasSoftmax: axis " + std::to_string(axis) +
                            " is not the last axis of rank " + std::to_string(rank));
  }
  if (y.dtype != x.dtype || b.dtype != x.dtype || y.numel() != x.numel()) {
    return invalid_argument("BiasSoftmax: B and Y must match X's dtype, Y its size");
  }
  const int br = b.rank();
  if (br > rank) return invalid_argument("BiasSoftmax: B has more dims than X");
  // B's element strides over X's dims (0 where B broadcasts), aligned from the right.
  std::vector<int64_t> stride(size_t(rank), 0);
  int64_t s = 1;
  for (int d = br - 1; d >= 0; --d) {
    const int64_t bd = b.shape[d], xd = x.shape[rank - br + d];
    if (bd != 1 && bd != xd) {
      return invalid_argument("BiasSoftmax: B of shape " + shape_to_string(b.shape) +
                              " does not broadcast to X of shape " + shape_to_string(x.shape));
    }
    stride[size_t(rank - br + d)] = bd == 1 ? 0 : s;
    s *= bd;
  }
  if (x.numel() == 0) return ok_status();
  const int64_t n = x.shape[rank - 1], rows = x.numel() / n, col = stride[size_t(rank - 1)];
  return visit_float(x.dtype, "BiasSoftmax", [&](auto tag) {
    using T = decltype(tag);
    using N = Num<T>;
    const T* xp = x.as<const T>();
    const T* bp = b.as<const T>();
    T* yp = y.as<T>();
    const int64_t grain = std::max<int64_t>(1, kParallelGrain / n);
    parallel_chunks(rows, grain, [&](int64_t first, int64_t last) {
      for (int64_t r = first; r < last; ++r) {
        int64_t off = 0;
        for (int64_t d = rank - 2, q = r; d >= 0; --d) {
          off += (q % x.shape[d]) * stride[size_t(d)];
          q /= x.shape[d];
        }
        const T* xr = xp + r * n;
        const T* brow = bp + off;
        T* yr = yp + r * n;
        for (int64_t j = 0; j < n; ++j) yr[j] = N::store(N::load(xr[j]) + N::load(brow[j * col]));
        if constexpr (std::is_same_v<T, float>) {
          softmax_row_f32(yr, yr, n);  // x and y may be one array
        } else {
          softmax_outer(yr, yr, 0, n, 1, false);
        }
      }
    });
    return ok_status();
  });
}

// ---------------------------------------------------------------------------------------------
// LayerNormalization: rows of X[axis:] normalized with two passes (mean, then variance) in double.

// Index of each normalized element into a parameter that broadcasts onto X[axis:]. Empty when the
// parameter is full-size (identity) or a scalar.
Status param_index(const TensorView& p, std::span<const int64_t> norm_shape, int64_t n,
                   std::vector<int64_t>* index) {
  index->clear();
  if (p.numel() == n || p.numel() == 1) return ok_status();
  int pr = p.rank(), nr = int(norm_shape.size());
  if (pr > nr) return invalid_argument("LayerNormalization: Scale/B rank exceeds normalized rank");
  for (int d = 0; d < pr; ++d) {
    int64_t pd = p.shape[d], xd = norm_shape[nr - pr + d];
    if (pd != 1 && pd != xd) {
      return invalid_argument("LayerNormalization: Scale/B shape " + shape_to_string(p.shape) +
                              " does not broadcast onto " + shape_to_string(norm_shape));
    }
  }
  index->resize(size_t(n));
  std::vector<int64_t> idx(nr, 0);
  for (int64_t j = 0; j < n; ++j) {
    int64_t off = 0;
    for (int d = 0; d < pr; ++d) {
      int64_t pd = p.shape[d];
      off = off * pd + (pd == 1 ? 0 : idx[nr - pr + d]);
    }
    (*index)[j] = off;
    for (int d = nr - 1; d >= 0; --d) {
      if (++idx[d] < norm_shape[d]) break;
      idx[d] = 0;
    }
  }
  return ok_status();
}

template <typename T>
void layer_norm_rows(const KernelArgs& a, int64_t outer, int64_t n, double eps,
                     const std::vector<int64_t>& scale_idx, const std::vector<int64_t>& bias_idx) {
  using N = Num<T>;
  using C = typename N::C;
  const T* x = a.in[0].as<const T>();
  const T* scale = a.in[1].as<const T>();
  bool has_bias = a.in.size() > 2 && present(a.in[2]);
  const T* bias = has_bias ? a.in[2].as<const T>() : nullptr;
  int64_t s_numel = a.in[1].numel(), b_numel = has_bias ? a.in[2].numel() : 0;
  T* y = a.out[0].as<T>();
  const TensorView* mean_out = a.out.size() > 1 && present(a.out[1]) ? &a.out[1] : nullptr;
  const TensorView* inv_out = a.out.size() > 2 && present(a.out[2]) ? &a.out[2] : nullptr;
  auto at = [n](const std::vector<int64_t>& idx, int64_t numel, int64_t j) {
    return !idx.empty() ? idx[j] : (numel == n ? j : 0);
  };
  // float32 with Scale and B of the row's size: layer_norm_row_f32's vector loops, the same
  // formula over partial sums.
  const bool rows_f32 = std::is_same_v<T, float> && scale_idx.empty() && s_numel == n &&
                        (!bias || (bias_idx.empty() && b_numel == n));
  auto row = [&](int64_t o) {
    const T* xr = x + o * n;
    T* yr = y + o * n;
    if constexpr (std::is_same_v<T, float>) {
      if (rows_f32) {
        double mean = 0, inv = 0;
        layer_norm_row_f32(xr, yr, n, scale, bias, eps, &mean, &inv);
        if (mean_out) store_at(*mean_out, o, mean);
        if (inv_out) store_at(*inv_out, o, inv);
        return;
      }
    }
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += double(N::load(xr[j]));
    double mean = sum / double(n);
    double sq = 0;
    for (int64_t j = 0; j < n; ++j) {
      double d = double(N::load(xr[j])) - mean;
      sq += d * d;
    }
    double inv = 1.0 / std::sqrt(sq / double(n) + eps);
    for (int64_t j = 0; j < n; ++j) {
      double v =
          (double(N::load(xr[j])) - mean) * inv * double(N::load(scale[at(scale_idx, s_numel, j)]));
      if (bias) v += double(N::load(bias[at(bias_idx, b_numel, j)]));
      yr[j] = N::store(C(v));
    }
    if (mean_out) store_at(*mean_out, o, mean);
    if (inv_out) store_at(*inv_out, o, inv);
  };
  // Rows alone, so they go to threads with the same bits as one thread.
  parallel_chunks(outer, std::max<int64_t>(1, kParallelGrain / n),
                  [&](int64_t first, int64_t last) {
                    for (int64_t o = first; o < last; ++o) row(o);
                  });
}

Status layer_norm_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  int rank = x.rank();
  KILN_ASSIGN_OR_RETURN(int64_t axis, a.attrs.get_int("axis", -1));
  KILN_ASSIGN_OR_RETURN(float eps, a.attrs.get_float("epsilon", 1e-5f));
  if (rank == 0 || axis < -rank || axis >= rank) {
    return invalid_argument("LayerNormalization: axis " + std::to_string(axis) +
                            " is out of range for rank " + std::to_string(rank));
  }
  if (axis < 0) axis += rank;
  if (a.in.size() < 2 || !present(a.in[1])) {
    return invalid_argument("LayerNormalization: Scale is required");
  }
  bool has_bias = a.in.size() > 2 && present(a.in[2]);
  if (a.in[1].dtype != x.dtype || (has_bias && a.in[2].dtype != x.dtype) ||
      a.out[0].dtype != x.dtype) {
    return invalid_argument("LayerNormalization: Scale, B and Y must have X's dtype");
  }
  for (size_t k = 1; k < a.out.size(); ++k) {
    if (present(a.out[k]) && !is_kernel_float(a.out[k].dtype)) {
      return unsupported("LayerNormalization: statistics dtype " +
                         std::string(dtype_name(a.out[k].dtype)));
    }
  }
  int64_t outer = prod(x.shape, 0, int(axis));
  int64_t n = prod(x.shape, int(axis), rank);
  std::span<const int64_t> norm_shape = x.shape.subspan(size_t(axis));
  std::vector<int64_t> scale_idx, bias_idx;
  KILN_RETURN_IF_ERROR(param_index(a.in[1], norm_shape, n, &scale_idx));
  if (has_bias) KILN_RETURN_IF_ERROR(param_index(a.in[2], norm_shape, n, &bias_idx));
  if (n == 0) {
    // Statistics of an empty row are undefined; write NaN rather than leave memory unset.
    for (size_t k = 1; k < a.out.size() && k < 3; ++k) {
      if (!present(a.out[k])) continue;
      for (int64_t o = 0; o < a.out[k].numel(); ++o) store_at(a.out[k], o, NAN);
    }
    return ok_status();
  }
  return visit_float(x.dtype, "LayerNormalization", [&](auto tag) {
    layer_norm_rows<decltype(tag)>(a, outer, n, double(eps), scale_idx, bias_idx);
    return ok_status();
  });
}

// ---------------------------------------------------------------------------------------------
// BatchNormalization: y = (x - mean) / sqrt(var + eps) * scale + B per channel, with the given
// mean and variance (inference) or the batch's (training_mode).

Status batch_norm_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  if (x.rank() < 2) return invalid_argument("BatchNormalization: X must have rank >= 2");
  if (a.in.size() < 5) return invalid_argument("BatchNormalization: needs 5 inputs");
  KILN_ASSIGN_OR_RETURN(float eps, a.attrs.get_float("epsilon", 1e-5f));
  KILN_ASSIGN_OR_RETURN(int64_t training, a.attrs.get_int("training_mode", 0));
  int64_t batch = x.shape[0], channels = x.shape[1];
  int64_t spatial = prod(x.shape, 2, x.rank());
  for (int i = 1; i < 5; ++i) {
    if (!present(a.in[i]) || a.in[i].numel() != channels || !is_kernel_float(a.in[i].dtype)) {
      return invalid_argument("BatchNormalization: input " + std::to_string(i) +
                              " must be a float vector of " + std::to_string(channels) +
                              " channels");
    }
  }
  if (a.out[0].dtype != x.dtype)
    return invalid_argument("BatchNormalization: Y dtype differs from X");
  for (size_t o = 1; o < a.out.size(); ++o) {
    if (present(a.out[o]) && (training == 0 || o > 2 || a.out[o].numel() != channels ||
                              !is_kernel_float(a.out[o].dtype))) {
      return invalid_argument("BatchNormalization: output " + std::to_string(o) +
                              " must be training mode's running mean or variance");
    }
  }
  if (training != 0) {
    // Training mode (opset 14 on): the batch's mean and population variance per channel normalize
    // X, and running = input * momentum + batch * (1 - momentum).
    KILN_ASSIGN_OR_RETURN(float momentum, a.attrs.get_float("momentum", 0.9f));
    const double count = double(batch * spatial);
    for (int64_t c = 0; c < channels; ++c) {
      double sum = 0, sq = 0;
      for (int64_t n = 0; n < batch; ++n) {
        for (int64_t i = 0; i < spatial; ++i) sum += load_at(x, (n * channels + c) * spatial + i);
      }
      const double mean = sum / count;
      for (int64_t n = 0; n < batch; ++n) {
        for (int64_t i = 0; i < spatial; ++i) {
          const double d = load_at(x, (n * channels + c) * spatial + i) - mean;
          sq += d * d;
        }
      }
      const double var = sq / count;
      const double mul = load_at(a.in[1], c) / std::sqrt(var + double(eps));
      const double add = load_at(a.in[2], c);
      for (int64_t n = 0; n < batch; ++n) {
        for (int64_t i = 0; i < spatial; ++i) {
          const int64_t e = (n * channels + c) * spatial + i;
          store_at(a.out[0], e, (load_at(x, e) - mean) * mul + add);
        }
      }
      const double m = double(momentum);
      if (a.out.size() > 1 && present(a.out[1])) {
        store_at(a.out[1], c, load_at(a.in[3], c) * m + mean * (1 - m));
      }
      if (a.out.size() > 2 && present(a.out[2])) {
        store_at(a.out[2], c, load_at(a.in[4], c) * m + var * (1 - m));
      }
    }
    return ok_status();
  }
  return visit_float(x.dtype, "BatchNormalization", [&](auto tag) {
    using T = decltype(tag);
    using N = Num<T>;
    using C = typename N::C;
    const T* xp = x.as<const T>();
    T* yp = a.out[0].as<T>();
    for (int64_t c = 0; c < channels; ++c) {
      double mul = load_at(a.in[1], c) / std::sqrt(load_at(a.in[4], c) + double(eps));
      double add = load_at(a.in[2], c) - load_at(a.in[3], c) * mul;
      C m = C(mul), b = C(add);
      for (int64_t n = 0; n < batch; ++n) {
        int64_t off = (n * channels + c) * spatial;
        for (int64_t i = 0; i < spatial; ++i) yp[off + i] = N::store(N::load(xp[off + i]) * m + b);
      }
    }
    return ok_status();
  });
}

// ---------------------------------------------------------------------------------------------
// RMSNormalization, Instance/Group/Lp/MeanVariance normalization and LRN: computed in double
// (float32 RMSNormalization rows by rms_norm_row_f32's vector loop, the same formula).

Status same_float_output(const char* op, const KernelArgs& a) {
  const TensorView& x = a.in[0];
  if (!is_kernel_float(x.dtype)) {
    return unsupported(std::string(op) + ": dtype " + std::string(dtype_name(x.dtype)) +
                       " is not supported by the CPU kernel");
  }
  if (a.out[0].dtype != x.dtype || a.out[0].numel() != x.numel()) {
    return invalid_argument(std::string(op) + ": output does not match the input");
  }
  return ok_status();
}

Status rms_norm_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(same_float_output("RMSNormalization", a));
  const TensorView& x = a.in[0];
  const TensorView& scale = a.in[1];
  int rank = x.rank();
  KILN_ASSIGN_OR_RETURN(int64_t axis, a.attrs.get_int("axis", -1));
  KILN_ASSIGN_OR_RETURN(float eps, a.attrs.get_float("epsilon", 1e-5f));
  if (rank == 0 || axis < -rank || axis >= rank) {
    return invalid_argument("RMSNormalization: axis " + std::to_string(axis) +
                            " is out of range for rank " + std::to_string(rank));
  }
  if (axis < 0) axis += rank;
  if (!is_kernel_float(scale.dtype)) return invalid_argument("RMSNormalization: scale dtype");
  int64_t outer = prod(x.shape, 0, int(axis));
  int64_t n = prod(x.shape, int(axis), rank);
  std::vector<int64_t> scale_idx;
  KILN_RETURN_IF_ERROR(param_index(scale, x.shape.subspan(size_t(axis)), n, &scale_idx));
  int64_t s_numel = scale.numel();
  if (x.dtype == DType::kFloat32 && scale.dtype == DType::kFloat32 && scale_idx.empty() &&
      s_numel == n) {
    // rms_norm_row_f32's vector loop, the same formula over partial sums; rows over the threads.
    const float* xs = x.as<const float>();
    const float* gs = scale.as<const float>();
    float* ys = a.out[0].as<float>();
    parallel_chunks(outer, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1)),
                    [&](int64_t first, int64_t last) {
                      for (int64_t o = first; o < last; ++o)
                        rms_norm_row_f32(xs + o * n, ys + o * n, n, gs, double(eps));
                    });
    return ok_status();
  }
  for (int64_t o = 0; o < outer; ++o) {
    double sq = 0;
    for (int64_t j = 0; j < n; ++j) {
      double v = load_at(x, o * n + j);
      sq += v * v;
    }
    double inv = 1.0 / std::sqrt(sq / double(std::max<int64_t>(n, 1)) + double(eps));
    for (int64_t j = 0; j < n; ++j) {
      int64_t si = !scale_idx.empty() ? scale_idx[j] : (s_numel == n ? j : 0);
      store_at(a.out[0], o * n + j, load_at(x, o * n + j) * inv * load_at(scale, si));
    }
  }
  return ok_status();
}

// Normalizes `groups` contiguous blocks per sample: x of shape [N, C, spatial...] as
// [N * groups, (C / groups) * spatial]; channel c's scale/bias index is c, or its group when the
// parameters are per group (GroupNormalization before opset 21).
Status grouped_norm(const char* op, const KernelArgs& a, int64_t groups, double eps) {
  KILN_RETURN_IF_ERROR(same_float_output(op, a));
  const TensorView& x = a.in[0];
  if (x.rank() < 2) return invalid_argument(std::string(op) + ": X must have rank >= 2");
  int64_t batch = x.shape[0], channels = x.shape[1];
  int64_t spatial = prod(x.shape, 2, x.rank());
  if (groups <= 0 || channels % groups != 0) {
    return invalid_argument(std::string(op) + ": " + std::to_string(channels) +
                            " channels do not split into " + std::to_string(groups) + " groups");
  }
  const TensorView& scale = a.in[1];
  const TensorView& bias = a.in[2];
  bool per_group = scale.numel() != channels;
  int64_t param_n = per_group ? groups : channels;
  if (scale.numel() != param_n || bias.numel() != param_n || !is_kernel_float(scale.dtype) ||
      !is_kernel_float(bias.dtype)) {
    return invalid_argument(std::string(op) + ": scale and bias must be float vectors of " +
                            std::to_string(channels) + " channels");
  }
  int64_t cpg = channels / groups;
  int64_t block = cpg * spatial;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t g = 0; g < groups; ++g) {
      int64_t base = (b * groups + g) * block;
      double sum = 0;
      for (int64_t j = 0; j < block; ++j) sum += load_at(x, base + j);
      double mean = block ? sum / double(block) : 0;
      double sq = 0;
      for (int64_t j = 0; j < block; ++j) {
        double d = load_at(x, base + j) - mean;
        sq += d * d;
      }
      double inv = 1.0 / std::sqrt((block ? sq / double(block) : 0) + eps);
      for (int64_t c = 0; c < cpg; ++c) {
        int64_t pi = per_group ? g : g * cpg + c;
        double sc = load_at(scale, pi), bi = load_at(bias, pi);
        for (int64_t i = 0; i < spatial; ++i) {
          int64_t k = base + c * spatial + i;
          store_at(a.out[0], k, (load_at(x, k) - mean) * inv * sc + bi);
        }
      }
    }
  }
  return ok_status();
}

Status instance_norm_kernel(const KernelArgs& a) {
  KILN_ASSIGN_OR_RETURN(float eps, a.attrs.get_float("epsilon", 1e-5f));
  if (a.in[0].rank() < 2) return invalid_argument("InstanceNormalization: X must have rank >= 2");
  return grouped_norm("InstanceNormalization", a, a.in[0].shape[1], double(eps));
}

Status group_norm_kernel(const KernelArgs& a) {
  KILN_ASSIGN_OR_RETURN(float eps, a.attrs.get_float("epsilon", 1e-5f));
  KILN_ASSIGN_OR_RETURN(int64_t groups, a.attrs.get_int("num_groups", std::nullopt));
  return grouped_norm("GroupNormalization", a, groups, double(eps));
}

Status lp_norm_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(same_float_output("LpNormalization", a));
  const TensorView& x = a.in[0];
  int rank = x.rank();
  KILN_ASSIGN_OR_RETURN(int64_t axis, a.attrs.get_int("axis", -1));
  KILN_ASSIGN_OR_RETURN(int64_t p, a.attrs.get_int("p", 2));
  if (axis < -rank || axis >= rank) return invalid_argument("LpNormalization: axis out of range");
  if (p != 1 && p != 2) return invalid_argument("LpNormalization: p must be 1 or 2");
  if (axis < 0) axis += rank;
  int64_t outer = prod(x.shape, 0, int(axis)), n = x.shape[axis];
  int64_t inner = prod(x.shape, int(axis) + 1, rank);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      int64_t base = o * n * inner + i;
      double norm = 0;
      for (int64_t k = 0; k < n; ++k) {
        double v = load_at(x, base + k * inner);
        norm += p == 1 ? std::fabs(v) : v * v;
      }
      if (p == 2) norm = std::sqrt(norm);
      for (int64_t k = 0; k < n; ++k) {
        int64_t e = base + k * inner;
        // A zero vector stays zero instead of becoming NaN (onnxruntime does the same).
        store_at(a.out[0], e, norm == 0 ? 0.0 : load_at(x, e) / norm);
      }
    }
  }
  return ok_status();
}

// (X - mean) / (std + 1e-9) over `axes`, std from E[X^2] - E[X]^2 as the ONNX function body.
Status mvn_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(same_float_output("MeanVarianceNormalization", a));
  const TensorView& x = a.in[0];
  int rank = x.rank();
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> axes,
                        a.attrs.get_ints("axes", std::vector<int64_t>{0, 2, 3}));
  std::vector<bool> reduced(size_t(rank), false);
  for (int64_t ax : axes) {
    if (ax < -rank || ax >= rank) return invalid_argument("MeanVarianceNormalization: bad axis");
    reduced[size_t(ax < 0 ? ax + rank : ax)] = true;
  }
  // Output slot of each element: its index over the kept dims.
  int64_t n = x.numel(), kept_n = 1;
  for (int d = 0; d < rank; ++d) {
    if (!reduced[d]) kept_n *= x.shape[d];
  }
  std::vector<int64_t> slot(static_cast<size_t>(n));
  std::vector<int64_t> idx(size_t(rank), 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t s = 0;
    for (int d = 0; d < rank; ++d) {
      if (!reduced[d]) s = s * x.shape[d] + idx[d];
    }
    slot[e] = s;
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[d] < x.shape[d]) break;
      idx[d] = 0;
    }
  }
  std::vector<double> sum(size_t(kept_n), 0), sq(size_t(kept_n), 0), cnt(size_t(kept_n), 0);
  for (int64_t e = 0; e < n; ++e) {
    double v = load_at(x, e);
    sum[slot[e]] += v;
    sq[slot[e]] += v * v;
    cnt[slot[e]] += 1;
  }
  for (int64_t e = 0; e < n; ++e) {
    int64_t s = slot[e];
    double mean = sum[s] / cnt[s];
    double var = std::max(sq[s] / cnt[s] - mean * mean, 0.0);
    store_at(a.out[0], e, (load_at(x, e) - mean) / (std::sqrt(var) + 1e-9));
  }
  return ok_status();
}

// LRN across channels: x / (bias + alpha / size * sum of squares over the channel window)^beta.
Status lrn_kernel(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(same_float_output("LRN", a));
  const TensorView& x = a.in[0];
  if (x.rank() < 2) return invalid_argument("LRN: X must have rank >= 2");
  KILN_ASSIGN_OR_RETURN(int64_t size, a.attrs.get_int("size", std::nullopt));
  KILN_ASSIGN_OR_RETURN(float alpha, a.attrs.get_float("alpha", 1e-4f));
  KILN_ASSIGN_OR_RETURN(float beta, a.attrs.get_float("beta", 0.75f));
  KILN_ASSIGN_OR_RETURN(float bias, a.attrs.get_float("bias", 1.f));
  if (size <= 0) return invalid_argument("LRN: size must be > 0");
  int64_t batch = x.shape[0], channels = x.shape[1], spatial = prod(x.shape, 2, x.rank());
  int64_t lo = (size - 1) / 2, hi = size - 1 - lo;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t i = 0; i < spatial; ++i) {
        double sq = 0;
        for (int64_t cc = std::max<int64_t>(0, c - lo); cc <= std::min(channels - 1, c + hi);
             ++cc) {
          double v = load_at(x, (b * channels + cc) * spatial + i);
          sq += v * v;
        }
        int64_t e = (b * channels + c) * spatial + i;
        double den = std::pow(double(bias) + double(alpha) / double(size) * sq, double(beta));
        store_at(a.out[0], e, load_at(x, e) / den);
      }
    }
  }
  return ok_status();
}

template <OpsetKernel::Fn kFn>
StatusOr<std::unique_ptr<Kernel>> make_opset_kernel(const KernelQuery& q) {
  return std::unique_ptr<Kernel>(
      new OpsetKernel("cpu." + q.node.op_type, q.node.attrs, q.node.opset, kFn));
}

}  // namespace

void register_norm_kernels(KernelRegistry& r) {
  r.add(ops::OpKind::kLayerNormalization, &layer_norm_kernel);
  r.add(ops::OpKind::kBatchNormalization, &batch_norm_kernel);
  r.add_factory(ops::OpKind::kSoftmax, &make_opset_kernel<&softmax_kernel>);
  r.add_factory(ops::OpKind::kLogSoftmax, &make_opset_kernel<&log_softmax_kernel>);
  r.add(ops::OpKind::kBiasSoftmax, &bias_softmax_kernel);
  r.add(ops::OpKind::kRMSNormalization, &rms_norm_kernel);
  r.add(ops::OpKind::kInstanceNormalization, &instance_norm_kernel);
  r.add(ops::OpKind::kGroupNormalization, &group_norm_kernel);
  r.add(ops::OpKind::kLpNormalization, &lp_norm_kernel);
  r.add(ops::OpKind::kMeanVarianceNormalization, &mvn_kernel);
  r.add(ops::OpKind::kLRN, &lrn_kernel);
}

}  // namespace kiln::backends::cpu
