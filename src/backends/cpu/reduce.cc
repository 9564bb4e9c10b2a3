// CPU reference kernels of the reduce op family: ReduceMean/Sum/Max/Min/Prod/L1/L2/LogSum/
// LogSumExp/SumSquare over any axes (floats accumulate in double, integers in int64), and the
// per-axis selections ArgMax/ArgMin, Hardmax and TopK.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/numeric.h"
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

// Storage type T, compute type C (what max/min compare in) and accumulator A (sums, products).
template <typename T>
struct Num {
  using C = T;
  using A = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
  static C load(T v) { return v; }
  static T store(C v) { return v; }
};
template <>
struct Num<Half> {
  using C = float;
  using A = double;
  static float load(Half v) { return half_to_float(v.bits); }
  static Half store(float v) { return Half{float_to_half(v)}; }
};
template <>
struct Num<BF16> {
  using C = float;
  using A = double;
  static float load(BF16 v) { return bf16_to_float(v.bits); }
  static BF16 store(float v) { return BF16{float_to_bf16(v)}; }
};

template <typename Fn>
Status visit_numeric(DType dt, std::string_view op, Fn&& fn) {
  switch (dt) {
    case DType::kFloat32:
      return fn(float{});
    case DType::kFloat64:
      return fn(double{});
    case DType::kFloat16:
      return fn(Half{});
    case DType::kBFloat16:
      return fn(BF16{});
    case DType::kInt8:
      return fn(int8_t{});
    case DType::kUInt8:
    case DType::kBool:  // 0/1 bytes: max/min are Or/And
      return fn(uint8_t{});
    case DType::kInt16:
      return fn(int16_t{});
    case DType::kUInt16:
      return fn(uint16_t{});
    case DType::kInt32:
      return fn(int32_t{});
    case DType::kUInt32:
      return fn(uint32_t{});
    case DType::kInt64:
      return fn(int64_t{});
    case DType::kUInt64:
      return fn(uint64_t{});
    default:
      return unsupported(std::string(op) + ": dtype " + std::string(dtype_name(dt)) +
                         " is not supported by the CPU kernel");
  }
}

enum class Reduce { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kLogSum, kLogSumExp, kSumSquare };

const char* reduce_name(Reduce r) {
  switch (r) {
    case Reduce::kSum:
      return "ReduceSum";
    case Reduce::kMean:
      return "ReduceMean";
    case Reduce::kMax:
      return "ReduceMax";
    case Reduce::kMin:
      return "ReduceMin";
    case Reduce::kProd:
      return "ReduceProd";
    case Reduce::kL1:
      return "ReduceL1";
    case Reduce::kL2:
      return "ReduceL2";
    case Reduce::kLogSum:
      return "ReduceLogSum";
    case Reduce::kLogSumExp:
      return "ReduceLogSumExp";
    case Reduce::kSumSquare:
      return "ReduceSumSquare";
  }
  return "Reduce";
}

struct Run {
  int64_t size;
  int64_t stride;  // in input elements
};

// Calls f(value) for the input elements at base + the odometer over `red`; f returns false to stop.
template <typename T, typename F>
void for_each_reduced(const T* x, int64_t base, const std::vector<Run>& red,
                      std::vector<int64_t>& idx, F&& f) {
  int nr = int(red.size());
  std::fill(idx.begin(), idx.end(), 0);
  int64_t inner_n = nr ? red[nr - 1].size : 1, inner_s = nr ? red[nr - 1].stride : 0;
  int64_t off = base;
  while (true) {
    const T* p = x + off;
    for (int64_t k = 0; k < inner_n; ++k) {
      if (!f(Num<T>::load(p[k * inner_s]))) return;
    }
    int d = nr - 2;
    for (; d >= 0; --d) {
      off += red[d].stride;
      if (++idx[d] < red[d].size) break;
      off -= red[d].stride * red[d].size;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

// One reduced output element.
template <typename T, Reduce kOp>
T reduce_one(const T* x, int64_t base, const std::vector<Run>& red, int64_t count,
             std::vector<int64_t>& idx) {
  using N = Num<T>;
  using C = typename N::C;
  using A = typename N::A;
  if constexpr (kOp == Reduce::kMax || kOp == Reduce::kMin) {
    C best{};
    if constexpr (std::is_floating_point_v<C>) {
      best = kOp == Reduce::kMax ? -std::numeric_limits<C>::infinity()
                                 : std::numeric_limits<C>::infinity();
    } else {
      best = kOp == Reduce::kMax ? std::numeric_limits<C>::lowest() : std::numeric_limits<C>::max();
    }
    if (count > 0) {
      for_each_reduced(x, base, red, idx, [&](C v) {
        if (kOp == Reduce::kMax ? (v > best) : (v < best)) best = v;
        if (v != v) best = v;  // NOLINT(misc-redundant-expression): NaN propagates
        return best == best;   // NOLINT(misc-redundant-expression): stop at NaN
      });
    }
    return N::store(best);
  } else if constexpr (kOp == Reduce::kLogSum || kOp == Reduce::kLogSumExp) {
    // In double whatever T is; LogSumExp subtracts the max so large inputs do not overflow.
    double mx = 0;
    if (kOp == Reduce::kLogSumExp && count > 0) {
      mx = -std::numeric_limits<double>::infinity();
      for_each_reduced(x, base, red, idx, [&](C v) {
        mx = std::max(mx, double(v));
        return true;
      });
      if (!std::isfinite(mx)) mx = 0;
    }
    double acc = 0;
    if (count > 0) {
      for_each_reduced(x, base, red, idx, [&](C v) {
        acc += kOp == Reduce::kLogSumExp ? std::exp(double(v) - mx) : double(v);
        return true;
      });
    }
    return N::store(C(std::log(acc) + mx));
  } else {
    A acc = kOp == Reduce::kProd ? A(1) : A(0);
    if (count > 0) {
      for_each_reduced(x, base, red, idx, [&](C v) {
        if constexpr (kOp == Reduce::kProd) {
          acc *= A(v);
        } else if constexpr (kOp == Reduce::kL1) {
          acc += A(v) < A(0) ? -A(v) : A(v);
        } else if constexpr (kOp == Reduce::kL2 || kOp == Reduce::kSumSquare) {
          acc += A(v) * A(v);
        } else {
          acc += A(v);
        }
        return true;
      });
    }
    if constexpr (kOp == Reduce::kMean) {
      if constexpr (std::is_integral_v<C>) {
        return N::store(C(count > 0 ? acc / count : 0));
      } else {
        return N::store(C(double(acc) / double(count)));
      }
    } else if constexpr (kOp == Reduce::kL2) {
      return N::store(C(std::sqrt(double(acc))));
    } else {
      return N::store(C(acc));
    }
  }
}

template <typename T, Reduce kOp>
void reduce_all(const T* x, T* y, const std::vector<Run>& kept, const std::vector<Run>& red,
                int64_t count) {
  int64_t out_n = 1;
  for (const Run& r : kept) out_n *= r.size;
  std::vector<int64_t> kidx(kept.size(), 0), ridx(red.size(), 0);
  int nk = int(kept.size());
  int64_t base = 0;
  for (int64_t o = 0; o < out_n; ++o) {
    y[o] = reduce_one<T, kOp>(x, base, red, count, ridx);
    for (int d = nk - 1; d >= 0; --d) {
      base += kept[d].stride;
      if (++kidx[d] < kept[d].size) break;
      base -= kept[d].stride * kept[d].size;
      kidx[d] = 0;
    }
  }
}

// y[r] = the sum (or mean) of x[r * n : (r + 1) * n] for r < rows, in double, rows split over
// threads as LayerNorm's are.
template <bool kMean>
void float_rows(const float* x, float* y, int64_t rows, int64_t n) {
  parallel_chunks(rows, std::max<int64_t>(1, kParallelGrain / n), [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const double s = sum_f32(x + r * n, n);
      y[r] = float(kMean ? s / double(n) : s);
    }
  });
}

// y[o * inner + i] = the sum (or mean) over r < n of x[(o * n + r) * inner + i], in double in
// order of r: a reduction over middle axes (a channels-last global average pool, [N, H, W, C]
// over H and W) as column sums (column_sums_f32), the (outer block, 64-column block) pairs split
// over threads, so a batch of one still uses every core and each column's bits are the same.
template <bool kMean>
void float_columns(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (inner + kBlock - 1) / kBlock;
  parallel_chunks(outer * blocks,
                  std::max<int64_t>(1, kParallelGrain / (n * std::min(inner, kBlock))),
                  [&](int64_t first, int64_t last) {
                    double acc[kBlock];
                    for (int64_t t = first; t < last; ++t) {
                      const int64_t o = t / blocks, c0 = (t % blocks) * kBlock;
                      const int64_t cols = std::min(kBlock, inner - c0);
                      column_sums_f32(x + o * n * inner + c0, n, inner, cols, acc);
                      for (int64_t i = 0; i < cols; ++i) {
                        y[o * inner + c0 + i] = float(kMean ? acc[i] / double(n) : acc[i]);
                      }
                    }
                  });
}

template <Reduce kOp>
Status reduce_kernel(const KernelArgs& a) {
  const char* op = reduce_name(kOp);
  const TensorView& x = a.in[0];
  const TensorView& y = a.out[0];
  int rank = x.rank();
  std::vector<int64_t> axes;
  if (a.in.size() > 1 && present(a.in[1])) {
    const TensorView& ax = a.in[1];
    for (int64_t k = 0; k < ax.numel(); ++k) {
      if (ax.dtype == DType::kInt64) {
        axes.push_back(ax.as<const int64_t>()[k]);
      } else if (ax.dtype == DType::kInt32) {
        axes.push_back(ax.as<const int32_t>()[k]);
      } else {
        return invalid_argument(std::string(op) + ": axes must be int64");
      }
    }
  } else {
    KILN_ASSIGN_OR_RETURN(axes, a.attrs.get_ints("axes", std::vector<int64_t>{}));
  }
  KILN_ASSIGN_OR_RETURN(int64_t noop, a.attrs.get_int("noop_with_empty_axes", 0));
  if (y.dtype != x.dtype) return invalid_argument(std::string(op) + ": output dtype differs");
  std::vector<bool> reduced(size_t(rank), axes.empty() && noop == 0);
  for (int64_t ax : axes) {
    if (ax < -rank || ax >= rank) {
      return invalid_argument(std::string(op) + ": axis " + std::to_string(ax) +
                              " is out of range for rank " + std::to_string(rank));
    }
    reduced[size_t(ax < 0 ? ax + rank : ax)] = true;
  }
  // Dims of size 1 do not move the index; adjacent dims of the same kind merge into one run.
  std::vector<Run> kept, red;
  int64_t stride = 1, count = 1, out_n = 1;
  for (int d = rank - 1; d >= 0; --d) {
    int64_t n = x.shape[d];
    if (reduced[d]) {
      count *= n;
    } else {
      out_n *= n;
    }
    if (n != 1) {
      std::vector<Run>& runs = reduced[d] ? red : kept;
      // Contiguous with the previous run of its kind: no other-kind dim > 1 lies between.
      if (!runs.empty() && runs.back().stride * runs.back().size == stride) {
        runs.back().size *= n;
      } else {
        runs.push_back({n, stride});
      }
    }
    stride *= n;
  }
  // Built innermost first; the odometers want outermost first.
  std::reverse(kept.begin(), kept.end());
  std::reverse(red.begin(), red.end());
  if (out_n != y.numel()) {
    return invalid_argument(std::string(op) + ": output has " + std::to_string(y.numel()) +
                            " elements; the reduction gives " + std::to_string(out_n));
  }
  if (out_n == 0) return ok_status();
  if constexpr (kOp == Reduce::kSum || kOp == Reduce::kMean) {
    // float32 rows: each output the sum of `count` contiguous elements, the outputs one after
    // another (a global average pool's [N, C, H, W] over H and W; squeeze-excitation's every
    // block in MobileNet): sum_f32's partial sums in double, the rows split over threads.
    if (x.dtype == DType::kFloat32 && count > 0 && red.size() == 1 && red[0].stride == 1 &&
        (kept.empty() || (kept.size() == 1 && kept[0].stride == count))) {
      float_rows<kOp == Reduce::kMean>(x.as<const float>(), y.as<float>(), out_n, count);
      return ok_status();
    }
    // float32 columns: one reduced run between an outer run and a contiguous inner one.
    if (x.dtype == DType::kFloat32 && count > 0 && red.size() == 1 && !kept.empty() &&
        kept.back().stride == 1 && red[0].stride == kept.back().size &&
        (kept.size() == 1 || (kept.size() == 2 && kept[0].stride == count * kept.back().size))) {
      const int64_t inner = kept.back().size, outer = kept.size() == 2 ? kept[0].size : 1;
      float_columns<kOp == Reduce::kMean>(x.as<const float>(), y.as<float>(), outer, count, inner);
      return ok_status();
    }
  }
  return visit_numeric(x.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    reduce_all<T, kOp>(x.as<const T>(), y.as<T>(), kept, red, count);
    return ok_status();
  });
}

// ---------------------------------------------------------------------------------------------
// ArgMax/ArgMin, Hardmax and TopK: per (outer, inner) line along one axis, compared in double.

struct Lines {
  int64_t outer = 1, n = 1, inner = 1;
};

Status axis_lines(const char* op, const TensorView& x, int64_t axis_attr, int* axis, Lines* l) {
  int rank = x.rank();
  if (axis_attr < -rank || axis_attr >= std::max(rank, 1)) {
    return invalid_argument(std::string(op) + ": axis " + std::to_string(axis_attr) +
                            " is out of range for rank " + std::to_string(rank));
  }
  *axis = int(axis_attr < 0 ? axis_attr + rank : axis_attr);
  l->outer = 1;
  l->inner = 1;
  l->n = rank == 0 ? 1 : x.shape[*axis];
  for (int d = 0; d < *axis; ++d) l->outer *= x.shape[d];
  for (int d = *axis + 1; d < rank; ++d) l->inner *= x.shape[d];
  return ok_status();
}

// Index of the max (kMax) or min along a line; ties go to the first, or the last with
// select_last_index. NaN wins, as in numpy.
template <bool kMax>
int64_t arg_best(const TensorView& x, int64_t base, int64_t n, int64_t stride, bool last) {
  int64_t best_i = 0;
  double best = load_f64(x, base);
  for (int64_t k = 1; k < n; ++k) {
    double v = load_f64(x, base + k * stride);
    if (best != best) break;
    bool better = kMax ? (v > best) : (v < best);
    if (better || v != v || (last && v == best)) {
      best = v;
      best_i = k;
    }
  }
  return best_i;
}

template <bool kMax>
Status arg_kernel(const KernelArgs& a) {
  const char* op = kMax ? "ArgMax" : "ArgMin";
  const TensorView& x = a.in[0];
  const TensorView& y = a.out[0];
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, a.attrs.get_int("axis", 0));
  KILN_ASSIGN_OR_RETURN(int64_t last, a.attrs.get_int("select_last_index", 0));
  if (!is_numeric_dtype(x.dtype)) {
    return unsupported(std::string(op) + ": dtype " + std::string(dtype_name(x.dtype)));
  }
  if (y.dtype != DType::kInt64) return invalid_argument(std::string(op) + ": output must be int64");
  int axis;
  Lines l;
  KILN_RETURN_IF_ERROR(axis_lines(op, x, axis_attr, &axis, &l));
  if (y.numel() != l.outer * l.inner) {
    return invalid_argument(std::string(op) + ": output has " + std::to_string(y.numel()) +
                            " elements, expected " + std::to_string(l.outer * l.inner));
  }
  if (l.n == 0) {
    if (y.numel() == 0) return ok_status();
    return invalid_argument(std::string(op) + ": the reduced axis is empty");
  }
  int64_t* out = y.as<int64_t>();
  for (int64_t o = 0; o < l.outer; ++o) {
    for (int64_t i = 0; i < l.inner; ++i) {
      out[o * l.inner + i] = arg_best<kMax>(x, o * l.n * l.inner + i, l.n, l.inner, last != 0);
    }
  }
  return ok_status();
}

// Hardmax: 1 at the first maximum along the axis (opset 13; older opsets flatten to 2-D at axis,
// which the schema rejects unless it is the last axis, where both agree).
Status hardmax_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const TensorView& y = a.out[0];
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, a.attrs.get_int("axis", -1));
  if (y.dtype != x.dtype || y.numel() != x.numel()) {
    return invalid_argument("Hardmax: output must match the input's dtype and shape");
  }
  int axis;
  Lines l;
  KILN_RETURN_IF_ERROR(axis_lines("Hardmax", x, axis_attr, &axis, &l));
  for (int64_t k = 0; k < y.numel(); ++k) store_f64(y, k, 0);
  if (l.n == 0) return ok_status();
  for (int64_t o = 0; o < l.outer; ++o) {
    for (int64_t i = 0; i < l.inner; ++i) {
      int64_t base = o * l.n * l.inner + i;
      int64_t b = arg_best<true>(x, base, l.n, l.inner, false);
      store_f64(y, base + b * l.inner, 1);
    }
  }
  return ok_status();
}

// TopK with K from input 1 (its output shape was fixed at build time, so K here must agree).
Status topk_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const TensorView& values = a.out[0];
  const TensorView& indices = a.out[1];
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, a.attrs.get_int("axis", -1));
  KILN_ASSIGN_OR_RETURN(int64_t largest, a.attrs.get_int("largest", 1));
  std::vector<int64_t> kv;
  if (!read_indices(a.in[1], &kv) || kv.size() != 1) {
    return invalid_argument("TopK: input 1 (K) must be one int64");
  }
  int axis;
  Lines l;
  KILN_RETURN_IF_ERROR(axis_lines("TopK", x, axis_attr, &axis, &l));
  int64_t k = kv[0];
  if (k < 0 || k > l.n) {
    return invalid_argument("TopK: K = " + std::to_string(k) + " is out of range [0, " +
                            std::to_string(l.n) + "]");
  }
  if (values.dtype != x.dtype || indices.dtype != DType::kInt64 ||
      values.numel() != l.outer * k * l.inner || indices.numel() != values.numel()) {
    return invalid_argument("TopK: outputs do not have K = " + std::to_string(k) +
                            " elements along the axis");
  }
  std::vector<int64_t> order(size_t(l.n));
  std::vector<double> line(size_t(l.n));
  int64_t* idx_out = indices.as<int64_t>();
  for (int64_t o = 0; o < l.outer; ++o) {
    for (int64_t i = 0; i < l.inner; ++i) {
      int64_t base = o * l.n * l.inner + i;
      for (int64_t j = 0; j < l.n; ++j) {
        line[j] = load_f64(x, base + j * l.inner);
        order[j] = j;
      }
      // Equal values keep the lower index first (stable sort), as the ONNX spec asks.
      std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) {
        return largest ? line[p] > line[q] : line[p] < line[q];
      });
      int64_t obase = o * k * l.inner + i;
      for (int64_t j = 0; j < k; ++j) {
        int64_t src = base + order[j] * l.inner;
        int64_t dst = obase + j * l.inner;
        idx_out[dst] = order[j];
        // Copy the element bytes rather than round-tripping int64 through double.
        size_t es = dtype_size(x.dtype);
        std::memcpy(static_cast<char*>(values.data) + dst * es,
                    static_cast<const char*>(x.data) + src * es, es);
      }
    }
  }
  return ok_status();
}

// TopK as the runtime runs it: K may be data (a data-dependent dim), in which case the outputs'
// views have the axis at its bound; the kernel runs on views of exactly K and reports that shape.
Status topk_sized(const KernelArgs& a, std::vector<Shape>* shapes) {
  const TensorView& x = a.in[0];
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, a.attrs.get_int("axis", -1));
  std::vector<int64_t> kv;
  if (a.in.size() < 2 || !read_indices(a.in[1], &kv) || kv.size() != 1) {
    return invalid_argument("TopK: input 1 (K) must be one int64");
  }
  const int64_t axis = axis_attr < 0 ? axis_attr + x.rank() : axis_attr;
  if (axis < 0 || axis >= x.rank() || a.out.size() < 2)
    return invalid_argument("TopK: axis out of range");
  Shape s(a.out[0].shape.begin(), a.out[0].shape.end());
  if (kv[0] < 0 || kv[0] > x.shape[size_t(axis)]) {
    return invalid_argument("TopK: K = " + std::to_string(kv[0]) + " is out of range [0, " +
                            std::to_string(x.shape[size_t(axis)]) + "]");
  }
  if (size_t(axis) >= s.size() || kv[0] > s[size_t(axis)]) {
    return internal_error("TopK: K = " + std::to_string(kv[0]) +
                          " exceeds what the plan sized the outputs for");
  }
  s[size_t(axis)] = kv[0];
  TensorView outs[2] = {a.out[0], a.out[1]};
  outs[0].shape = s;
  outs[1].shape = s;
  KILN_RETURN_IF_ERROR(topk_kernel(KernelArgs{a.attrs, a.in, outs}));
  (*shapes)[0] = s;
  (*shapes)[1] = s;
  return ok_status();
}

}  // namespace

void register_reduce_kernels(KernelRegistry& r) {
  r.add(ops::OpKind::kReduceSum, &reduce_kernel<Reduce::kSum>);
  r.add(ops::OpKind::kReduceMean, &reduce_kernel<Reduce::kMean>);
  r.add(ops::OpKind::kReduceMax, &reduce_kernel<Reduce::kMax>);
  r.add(ops::OpKind::kReduceMin, &reduce_kernel<Reduce::kMin>);
  r.add(ops::OpKind::kReduceProd, &reduce_kernel<Reduce::kProd>);
  r.add(ops::OpKind::kReduceL1, &reduce_kernel<Reduce::kL1>);
  r.add(ops::OpKind::kReduceL2, &reduce_kernel<Reduce::kL2>);
  r.add(ops::OpKind::kReduceLogSum, &reduce_kernel<Reduce::kLogSum>);
  r.add(ops::OpKind::kReduceLogSumExp, &reduce_kernel<Reduce::kLogSumExp>);
  r.add(ops::OpKind::kReduceSumSquare, &reduce_kernel<Reduce::kSumSquare>);
  r.add(ops::OpKind::kArgMax, &arg_kernel<true>);
  r.add(ops::OpKind::kArgMin, &arg_kernel<false>);
  r.add(ops::OpKind::kHardmax, &hardmax_kernel);
  add_sized_kernel(r, ops::OpKind::kTopK, &topk_sized);
}

}  // namespace kiln::backends::cpu
