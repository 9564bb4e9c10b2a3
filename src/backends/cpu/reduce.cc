// CPU reference kernels of the reduce op family: ReduceMean/Sum/Max/Min/Prod over any axes, for
// float32/float64/float16/bfloat16 (accumulating in double) and int32/int64 (in int64).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cpu/cpu_backend.h"

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
    case DType::kInt32:
      return fn(int32_t{});
    case DType::kInt64:
      return fn(int64_t{});
    default:
      return unsupported(std::string(op) + ": dtype " + std::string(dtype_name(dt)) +
                         " is not supported by the CPU kernel");
  }
}

enum class Reduce { kSum, kMean, kMax, kMin, kProd };

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
  }
  return "Reduce";
}

struct Run {
  int64_t size;
  int64_t stride;  // in input elements
};

// One reduced output element: the input elements at base + the odometer over `red`.
template <typename T, Reduce kOp>
T reduce_one(const T* x, int64_t base, const std::vector<Run>& red, int64_t count,
             std::vector<int64_t>& idx) {
  using N = Num<T>;
  using C = typename N::C;
  using A = typename N::A;
  A acc = kOp == Reduce::kProd ? A(1) : A(0);
  C best{};
  if constexpr (kOp == Reduce::kMax || kOp == Reduce::kMin) {
    if constexpr (std::is_floating_point_v<C>) {
      best = kOp == Reduce::kMax ? -std::numeric_limits<C>::infinity()
                                 : std::numeric_limits<C>::infinity();
    } else {
      best = kOp == Reduce::kMax ? std::numeric_limits<C>::lowest() : std::numeric_limits<C>::max();
    }
  }
  int nr = int(red.size());
  if (count > 0) {
    std::fill(idx.begin(), idx.end(), 0);
    int64_t inner_n = nr ? red[nr - 1].size : 1, inner_s = nr ? red[nr - 1].stride : 0;
    int64_t off = base;
    while (true) {
      const T* p = x + off;
      for (int64_t k = 0; k < inner_n; ++k) {
        C v = N::load(p[k * inner_s]);
        if constexpr (kOp == Reduce::kSum || kOp == Reduce::kMean) {
          acc += A(v);
        } else if constexpr (kOp == Reduce::kProd) {
          acc *= A(v);
        } else if constexpr (kOp == Reduce::kMax) {
          if (v > best || v != v) best = v;  // NaN propagates
          if (best != best) break;
        } else {
          if (v < best || v != v) best = v;
          if (best != best) break;
        }
      }
      int d = nr - 2;
      for (; d >= 0; --d) {
        off += red[d].stride;
        if (++idx[d] < red[d].size) break;
        off -= red[d].stride * red[d].size;
        idx[d] = 0;
      }
      if (d < 0) break;
    }
  }
  if constexpr (kOp == Reduce::kMax || kOp == Reduce::kMin) {
    return N::store(best);
  } else if constexpr (kOp == Reduce::kMean) {
    if constexpr (std::is_integral_v<C>) {
      return N::store(C(count > 0 ? acc / count : 0));
    } else {
      return N::store(C(double(acc) / double(count)));
    }
  } else {
    return N::store(C(acc));
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
  return visit_numeric(x.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    reduce_all<T, kOp>(x.as<const T>(), y.as<T>(), kept, red, count);
    return ok_status();
  });
}

}  // namespace

void register_reduce_kernels(KernelRegistry& r) {
  r.add(ops::OpKind::kReduceSum, &reduce_kernel<Reduce::kSum>);
  r.add(ops::OpKind::kReduceMean, &reduce_kernel<Reduce::kMean>);
  r.add(ops::OpKind::kReduceMax, &reduce_kernel<Reduce::kMax>);
  r.add(ops::OpKind::kReduceMin, &reduce_kernel<Reduce::kMin>);
  r.add(ops::OpKind::kReduceProd, &reduce_kernel<Reduce::kProd>);
}

}  // namespace kiln::backends::cpu
