// CPU reference kernels of the index op family: Slice, Gather, GatherND, GatherElements, CumSum,
// Scatter*, OneHot, ReverseSequence, TensorScatter.
// Indices come from tensor data, so every one is range-checked before it is used.
#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/dtype_dispatch.h"
#include "backends/cpu/numeric.h"

namespace kiln::backends::cpu {

// Defined in shape.cc: dst[o] = src[maps[0][o_0], ...], or *fill where a map entry is -1.
void copy_by_axis_maps(const TensorView& src, const TensorView& dst,
                       std::span<const std::vector<int64_t>> maps, const void* fill);

namespace {

using ops::OpKind;

StatusOr<std::vector<int64_t>> read_ints(const TensorView& v, std::string_view op,
                                         std::string_view what) {
  std::vector<int64_t> out(size_t(v.numel()));
  if (v.dtype == DType::kInt64) {
    if (!out.empty()) std::memcpy(out.data(), v.data, out.size() * 8);
  } else if (v.dtype == DType::kInt32) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = v.as<const int32_t>()[i];
  } else {
    return invalid_argument(std::string(op) + ": " + std::string(what) + " must be int32 or int64");
  }
  return out;
}

// The index, made non-negative, or an error naming the op and the index.
StatusOr<int64_t> checked_index(int64_t i, int64_t dim, std::string_view op) {
  if (i < -dim || i >= dim) {
    return invalid_argument(std::string(op) + ": index " + std::to_string(i) +
                            " is out of range for an axis of size " + std::to_string(dim));
  }
  return i < 0 ? i + dim : i;
}

Status slice_kernel(const KernelArgs& a) {
  const TensorView& in = a.in[0];
  const TensorView& out = a.out[0];
  int r = in.rank();
  std::vector<int64_t> starts, ends, axes, steps;
  if (a.attrs.has("starts")) {
    KILN_ASSIGN_OR_RETURN(starts, a.attrs.get_ints("starts", std::nullopt));
    KILN_ASSIGN_OR_RETURN(ends, a.attrs.get_ints("ends", std::nullopt));
    KILN_ASSIGN_OR_RETURN(axes, a.attrs.get_ints("axes", std::vector<int64_t>{}));
  } else {
    if (a.in.size() < 3) return invalid_argument("Slice: needs starts and ends");
    KILN_ASSIGN_OR_RETURN(starts, read_ints(a.in[1], "Slice", "starts"));
    KILN_ASSIGN_OR_RETURN(ends, read_ints(a.in[2], "Slice", "ends"));
    if (a.in.size() > 3 && present(a.in[3])) {
      KILN_ASSIGN_OR_RETURN(axes, read_ints(a.in[3], "Slice", "axes"));
    }
    if (a.in.size() > 4 && present(a.in[4])) {
      KILN_ASSIGN_OR_RETURN(steps, read_ints(a.in[4], "Slice", "steps"));
    }
  }
  size_t n = starts.size();
  if (ends.size() != n || (!axes.empty() && axes.size() != n) ||
      (!steps.empty() && steps.size() != n)) {
    return invalid_argument("Slice: starts, ends, axes and steps differ in length");
  }
  if (out.rank() != r || out.dtype != in.dtype)
    return invalid_argument("Slice: output rank differs");
  std::vector<int64_t> first(size_t(r), 0), step(size_t(r), 1),
      len(in.shape.begin(), in.shape.end());
  std::vector<bool> seen(size_t(r), false);
  for (size_t i = 0; i < n; ++i) {
    int64_t axis = axes.empty() ? int64_t(i) : axes[i];
    if (axis < -r || axis >= r) return invalid_argument("Slice: axis out of range");
    if (axis < 0) axis += r;
    if (seen[axis]) return invalid_argument("Slice: an axis repeats");
    seen[axis] = true;
    int64_t st = steps.empty() ? 1 : steps[i];
    if (st == 0) return invalid_argument("Slice: step is 0");
    int64_t d = in.shape[axis];
    int64_t s = starts[i] < 0 ? starts[i] + d : starts[i];
    int64_t e = ends[i] < 0 ? ends[i] + d : ends[i];
    // min(max(v, lo), hi) rather than std::clamp: on an empty axis lo > hi.
    auto clamp = [](int64_t v, int64_t lo, int64_t hi) { return std::min(std::max(v, lo), hi); };
    int64_t count;
    if (st > 0) {
      s = clamp(s, 0, d);
      e = clamp(e, 0, d);
      count = e > s ? (e - s - 1) / st + 1 : 0;
    } else {
      s = clamp(s, 0, d - 1);
      e = clamp(e, -1, d - 1);
      count = s > e ? (e - s + 1) / st + 1 : 0;  // (s - e - 1) / -st, without negating INT64_MIN
    }
    first[axis] = s;
    step[axis] = st;
    len[axis] = count;
  }
  std::vector<std::vector<int64_t>> maps(static_cast<size_t>(r));
  for (int k = 0; k < r; ++k) {
    if (len[k] != out.shape[k]) {
      return invalid_argument("Slice: the output has shape " + shape_to_string(out.shape) +
                              " but the slice has " + std::to_string(len[k]) +
                              " elements on axis " + std::to_string(k));
    }
    maps[k].resize(size_t(len[k]));
    for (int64_t j = 0; j < len[k]; ++j) maps[k][j] = first[k] + j * step[k];
  }
  copy_by_axis_maps(in, out, maps, nullptr);
  return ok_status();
}

Status gather_kernel(const KernelArgs& a) {
  const TensorView& data = a.in[0];
  const TensorView& out = a.out[0];
  int r = data.rank();
  KILN_ASSIGN_OR_RETURN(int64_t axis, a.attrs.get_int("axis", 0));
  if (r < 1 || axis < -r || axis >= r) return invalid_argument("Gather: axis out of range");
  if (axis < 0) axis += r;
  KILN_ASSIGN_OR_RETURN(auto idx, read_ints(a.in[1], "Gather", "indices"));
  int64_t d = data.shape[axis];
  for (int64_t& i : idx) {
    KILN_ASSIGN_OR_RETURN(i, checked_index(i, d, "Gather"));
  }
  int64_t outer = 1, inner = 1;
  for (int k = 0; k < axis; ++k) outer *= data.shape[k];
  for (int k = int(axis) + 1; k < r; ++k) inner *= data.shape[k];
  if (out.dtype != data.dtype || out.numel() != outer * int64_t(idx.size()) * inner) {
    return invalid_argument("Gather: the output shape " + shape_to_string(out.shape) +
                            " does not match the inputs");
  }
  if (out.numel() == 0) return ok_status();
  size_t esz = dtype_size(data.dtype);
  size_t chunk = size_t(inner) * esz;
  const auto* src = static_cast<const char*>(data.data);
  auto* dst = static_cast<char*>(out.data);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i : idx) {
      std::memcpy(dst, src + size_t(o * d + i) * chunk, chunk);
      dst += chunk;
    }
  }
  return ok_status();
}

Status gather_nd_kernel(const KernelArgs& a) {
  const TensorView& data = a.in[0];
  const TensorView& indices = a.in[1];
  const TensorView& out = a.out[0];
  int r = data.rank(), q = indices.rank();
  KILN_ASSIGN_OR_RETURN(int64_t b, a.attrs.get_int("batch_dims", 0));
  if (q < 1 || b < 0 || b >= std::min(r, q)) return invalid_argument("GatherND: bad batch_dims");
  int64_t m = indices.shape[q - 1];
  if (m < 1 || m > r - b) return invalid_argument("GatherND: bad last indices dim");
  KILN_ASSIGN_OR_RETURN(auto idx, read_ints(indices, "GatherND", "indices"));
  int64_t batches = 1, slice = 1;
  for (int k = 0; k < b; ++k) {
    if (indices.shape[k] != data.shape[k]) return invalid_argument("GatherND: batch dims differ");
    batches *= data.shape[k];
  }
  for (int k = int(b + m); k < r; ++k) slice *= data.shape[k];
  int64_t per_batch = 1;  // index tuples per batch
  for (int k = int(b); k < q - 1; ++k) per_batch *= indices.shape[k];
  // Strides of the indexed dims, in elements, within one batch.
  std::vector<int64_t> stride(static_cast<size_t>(m));
  int64_t batch_size = slice;
  for (int64_t k = m - 1; k >= 0; --k) {
    stride[k] = batch_size;
    batch_size *= data.shape[b + k];
  }
  if (out.dtype != data.dtype || out.numel() != batches * per_batch * slice) {
    return invalid_argument("GatherND: the output shape " + shape_to_string(out.shape) +
                            " does not match the inputs");
  }
  if (out.numel() == 0) return ok_status();
  size_t esz = dtype_size(data.dtype);
  const auto* src = static_cast<const char*>(data.data);
  auto* dst = static_cast<char*>(out.data);
  const int64_t* tuple = idx.data();
  for (int64_t bi = 0; bi < batches; ++bi) {
    for (int64_t t = 0; t < per_batch; ++t, tuple += m) {
      int64_t off = bi * batch_size;
      for (int64_t k = 0; k < m; ++k) {
        KILN_ASSIGN_OR_RETURN(int64_t i, checked_index(tuple[k], data.shape[b + k], "GatherND"));
        off += i * stride[k];
      }
      std::memcpy(dst, src + size_t(off) * esz, size_t(slice) * esz);
      dst += size_t(slice) * esz;
    }
  }
  return ok_status();
}

Status gather_elements_kernel(const KernelArgs& a) {
  const TensorView& data = a.in[0];
  const TensorView& indices = a.in[1];
  const TensorView& out = a.out[0];
  int r = data.rank();
  KILN_ASSIGN_OR_RETURN(int64_t axis, a.attrs.get_int("axis", 0));
  if (r < 1 || indices.rank() != r || axis < -r || axis >= r) {
    return invalid_argument("GatherElements: bad axis or ranks");
  }
  if (axis < 0) axis += r;
  for (int k = 0; k < r; ++k) {
    if (k != axis && indices.shape[k] > data.shape[k]) {
      return invalid_argument("GatherElements: indices dim " + std::to_string(k) +
                              " exceeds the data dim");
    }
  }
  if (out.dtype != data.dtype ||
      std::vector<int64_t>(out.shape.begin(), out.shape.end()) !=
          std::vector<int64_t>(indices.shape.begin(), indices.shape.end())) {
    return invalid_argument("GatherElements: the output shape differs from the indices shape");
  }
  KILN_ASSIGN_OR_RETURN(auto idx, read_ints(indices, "GatherElements", "indices"));
  std::vector<int64_t> stride(size_t(r), 1);
  for (int k = r - 2; k >= 0; --k) stride[k] = stride[k + 1] * data.shape[k + 1];
  int64_t d = data.shape[axis];
  size_t esz = dtype_size(data.dtype);
  const auto* src = static_cast<const char*>(data.data);
  auto* dst = static_cast<char*>(out.data);
  std::vector<int64_t> pos(size_t(r), 0);
  for (size_t o = 0; o < idx.size(); ++o) {
    KILN_ASSIGN_OR_RETURN(int64_t i, checked_index(idx[o], d, "GatherElements"));
    int64_t off = 0;
    for (int k = 0; k < r; ++k) off += (k == axis ? i : pos[k]) * stride[k];
    std::memcpy(dst + o * esz, src + size_t(off) * esz, esz);
    for (int k = r - 1; k >= 0; --k) {
      if (++pos[k] < indices.shape[k]) break;
      pos[k] = 0;
    }
  }
  return ok_status();
}

template <bool kProd, typename T>
void cumsum_impl(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool exclusive,
                 bool reverse) {
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t in = 0; in < inner; ++in) {
      T acc = T(kProd ? 1 : 0);
      for (int64_t j = 0; j < n; ++j) {
        int64_t jj = reverse ? n - 1 - j : j;
        size_t p = size_t((o * n + jj) * inner + in);
        if (exclusive) {
          y[p] = acc;
          acc = kProd ? T(acc * x[p]) : T(acc + x[p]);
        } else {
          acc = kProd ? T(acc * x[p]) : T(acc + x[p]);
          y[p] = acc;
        }
      }
    }
  }
}

template <bool kProd>
Status cumsum_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const TensorView& y = a.out[0];
  int r = x.rank();
  KILN_ASSIGN_OR_RETURN(auto axis_v, read_ints(a.in[1], "CumSum", "axis"));
  if (axis_v.size() != 1 || axis_v[0] < -r || axis_v[0] >= r) {
    return invalid_argument("CumSum: the axis must be one value in [-rank, rank)");
  }
  int64_t axis = axis_v[0] < 0 ? axis_v[0] + r : axis_v[0];
  KILN_ASSIGN_OR_RETURN(int64_t exclusive, a.attrs.get_int("exclusive", 0));
  KILN_ASSIGN_OR_RETURN(int64_t reverse, a.attrs.get_int("reverse", 0));
  if (y.dtype != x.dtype || y.numel() != x.numel())
    return invalid_argument("CumSum: output differs");
  int64_t outer = 1, inner = 1, n = x.shape[axis];
  for (int k = 0; k < axis; ++k) outer *= x.shape[k];
  for (int k = int(axis) + 1; k < r; ++k) inner *= x.shape[k];
  if (x.numel() == 0) return ok_status();
  switch (x.dtype) {
    case DType::kFloat32:
      cumsum_impl<kProd>(x.as<const float>(), y.as<float>(), outer, n, inner, exclusive, reverse);
      break;
    case DType::kFloat64:
      cumsum_impl<kProd>(x.as<const double>(), y.as<double>(), outer, n, inner, exclusive, reverse);
      break;
    case DType::kInt32:
      cumsum_impl<kProd>(x.as<const int32_t>(), y.as<int32_t>(), outer, n, inner, exclusive,
                         reverse);
      break;
    case DType::kInt64:
      cumsum_impl<kProd>(x.as<const int64_t>(), y.as<int64_t>(), outer, n, inner, exclusive,
                         reverse);
      break;
    default:
      return unsupported("CumSum: dtype " + std::string(dtype_name(x.dtype)) + " is not supported");
  }
  return ok_status();
}

enum class Reduction { kNone, kAdd, kMul, kMax, kMin };

StatusOr<Reduction> read_reduction(const KernelArgs& a, std::string_view op) {
  KILN_ASSIGN_OR_RETURN(std::string red, a.attrs.get_string("reduction", "none"));
  if (red == "none") return Reduction::kNone;
  if (red == "add") return Reduction::kAdd;
  if (red == "mul") return Reduction::kMul;
  if (red == "max") return Reduction::kMax;
  if (red == "min") return Reduction::kMin;
  return invalid_argument(std::string(op) + ": unknown reduction '" + red + "'");
}

// dst[i] = reduce(dst[i], src[j]) for the (dst, src) element pairs a scatter produced.
Status scatter_apply(const TensorView& out, const TensorView& upd, Reduction red,
                     std::span<const std::pair<int64_t, int64_t>> pairs, ops::OpKind op) {
  return dispatch<kAll>(out.dtype, op, [&]<typename T>(Tag<T>) {
    using N = Num<T>;
    using C = typename N::C;
    T* dst = out.as<T>();
    const T* src = upd.as<T>();
    for (const auto& [i, j] : pairs) {
      C a = N::load(dst[i]), b = N::load(src[j]), r = b;
      if (red == Reduction::kAdd) r = C(a + b);
      if (red == Reduction::kMul) r = C(a * b);
      if (red == Reduction::kMax) r = a > b ? a : b;
      if (red == Reduction::kMin) r = a < b ? a : b;
      dst[i] = N::store(r);
    }
    return ok_status();
  });
}

Status scatter_elements_kernel(const KernelArgs& a) {
  const TensorView& data = a.in[0];
  const TensorView& indices = a.in[1];
  const TensorView& upd = a.in[2];
  const TensorView& out = a.out[0];
  int r = data.rank();
  KILN_ASSIGN_OR_RETURN(int64_t axis, a.attrs.get_int("axis", 0));
  KILN_ASSIGN_OR_RETURN(Reduction red, read_reduction(a, "ScatterElements"));
  if (r < 1 || indices.rank() != r || upd.rank() != r || axis < -r || axis >= r ||
      out.numel() != data.numel() || out.dtype != data.dtype || upd.dtype != data.dtype ||
      upd.numel() != indices.numel()) {
    return invalid_argument("ScatterElements: bad axis, ranks or shapes");
  }
  if (axis < 0) axis += r;
  for (int k = 0; k < r; ++k) {
    if (indices.shape[k] != upd.shape[k] || (k != axis && indices.shape[k] > data.shape[k])) {
      return invalid_argument("ScatterElements: indices dim " + std::to_string(k) +
                              " does not fit updates or data");
    }
  }
  if (out.data != data.data && out.nbytes() > 0) std::memcpy(out.data, data.data, out.nbytes());
  KILN_ASSIGN_OR_RETURN(auto idx, read_ints(indices, "ScatterElements", "indices"));
  std::vector<int64_t> stride(size_t(r), 1);
  for (int k = r - 2; k >= 0; --k) stride[k] = stride[k + 1] * data.shape[k + 1];
  std::vector<std::pair<int64_t, int64_t>> pairs;
  pairs.reserve(idx.size());
  std::vector<int64_t> pos(size_t(r), 0);
  for (size_t o = 0; o < idx.size(); ++o) {
    KILN_ASSIGN_OR_RETURN(int64_t i, checked_index(idx[o], data.shape[axis], "ScatterElements"));
    int64_t off = 0;
    for (int k = 0; k < r; ++k) off += (k == axis ? i : pos[k]) * stride[k];
    pairs.emplace_back(off, int64_t(o));
    for (int k = r - 1; k >= 0; --k) {
      if (++pos[k] < indices.shape[k]) break;
      pos[k] = 0;
    }
  }
  return scatter_apply(out, upd, red, pairs, OpKind::kScatterElements);
}

Status scatter_nd_kernel(const KernelArgs& a) {
  const TensorView& data = a.in[0];
  const TensorView& indices = a.in[1];
  const TensorView& upd = a.in[2];
  const TensorView& out = a.out[0];
  KILN_ASSIGN_OR_RETURN(Reduction red, read_reduction(a, "ScatterND"));
  const int r = data.rank(), q = indices.rank();
  if (q < 1 || out.numel() != data.numel() || out.dtype != data.dtype || upd.dtype != data.dtype) {
    return invalid_argument("ScatterND: bad ranks or dtypes");
  }
  const int64_t k = indices.shape[q - 1];
  if (k < 1 || k > r) return invalid_argument("ScatterND: the last indices dim must be in [1, r]");
  int64_t slice = 1;
  for (int d = int(k); d < r; ++d) slice *= data.shape[d];
  const int64_t count = k == 0 ? 0 : indices.numel() / k;
  if (upd.numel() != count * slice) {
    return invalid_argument("ScatterND: updates have " + std::to_string(upd.numel()) +
                            " elements, expected " + std::to_string(count * slice));
  }
  if (out.data != data.data && out.nbytes() > 0) std::memcpy(out.data, data.data, out.nbytes());
  KILN_ASSIGN_OR_RETURN(auto idx, read_ints(indices, "ScatterND", "indices"));
  std::vector<int64_t> stride(size_t(r), 1);
  for (int d = r - 2; d >= 0; --d) stride[d] = stride[d + 1] * data.shape[d + 1];
  std::vector<std::pair<int64_t, int64_t>> pairs;
  pairs.reserve(size_t(count * slice));
  for (int64_t c = 0; c < count; ++c) {
    int64_t off = 0;
    for (int64_t d = 0; d < k; ++d) {
      KILN_ASSIGN_OR_RETURN(int64_t i,
                            checked_index(idx[size_t(c * k + d)], data.shape[d], "ScatterND"));
      off += i * stride[d];
    }
    for (int64_t e = 0; e < slice; ++e) pairs.emplace_back(off + e, c * slice + e);
  }
  return scatter_apply(out, upd, red, pairs, OpKind::kScatterND);
}

// OneHot: out[..., d, ...] = values[1] where the index (a negative one wrapped by depth) equals d,
// else values[0]; out-of-range and non-integral indices match nothing. The depth is the output's
// size along axis, which the schema read at build time.
Status one_hot_kernel(const KernelArgs& a) {
  const TensorView& idx = a.in[0];
  const TensorView& values = a.in[2];
  const TensorView& out = a.out[0];
  KILN_ASSIGN_OR_RETURN(int64_t axis, a.attrs.get_int("axis", -1));
  const int r = out.rank();
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r || idx.rank() != r - 1 || values.numel() != 2 ||
      values.dtype != out.dtype || !(is_integer(idx.dtype) || is_float(idx.dtype))) {
    return invalid_argument("OneHot: indices " + shape_to_string(idx.shape) + ", values " +
                            shape_to_string(values.shape) + " and output " +
                            shape_to_string(out.shape) + " do not fit axis " +
                            std::to_string(axis));
  }
  for (int d = 0; d < r - 1; ++d) {
    if (idx.shape[d] != out.shape[d < axis ? d : d + 1]) {
      return invalid_argument("OneHot: the output's shape does not extend the indices'");
    }
  }
  const int64_t depth = out.shape[axis];
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= out.shape[d];
  for (int d = int(axis) + 1; d < r; ++d) inner *= out.shape[d];
  const size_t es = dtype_size(out.dtype);
  const auto* vals = static_cast<const unsigned char*>(values.data);
  auto* dst = static_cast<unsigned char*>(out.data);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      double v = load_f64(idx, o * inner + i);
      if (v < 0) v += double(depth);
      for (int64_t d = 0; d < depth; ++d) {
        const bool on = v == double(d);
        std::memcpy(dst + size_t((o * depth + d) * inner + i) * es, vals + (on ? es : 0), es);
      }
    }
  }
  return ok_status();
}

// ReverseSequence: per batch entry b, the first sequence_lens[b] steps along the time axis are
// reversed and the rest copied; batch and time are axes 0 and 1 in either order.
Status reverse_sequence_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const TensorView& out = a.out[0];
  KILN_ASSIGN_OR_RETURN(int64_t batch_axis, a.attrs.get_int("batch_axis", 1));
  KILN_ASSIGN_OR_RETURN(int64_t time_axis, a.attrs.get_int("time_axis", 0));
  if (x.rank() < 2 || batch_axis + time_axis != 1 || batch_axis < 0 || time_axis < 0 ||
      out.dtype != x.dtype || !std::ranges::equal(out.shape, x.shape)) {
    return invalid_argument("ReverseSequence: input " + shape_to_string(x.shape) +
                            " with batch_axis " + std::to_string(batch_axis) + ", time_axis " +
                            std::to_string(time_axis));
  }
  KILN_ASSIGN_OR_RETURN(auto lens, read_ints(a.in[1], "ReverseSequence", "sequence_lens"));
  const int64_t batch = x.shape[batch_axis], steps = x.shape[time_axis];
  if (int64_t(lens.size()) != batch) {
    return invalid_argument("ReverseSequence: " + std::to_string(lens.size()) +
                            " sequence lengths for a batch of " + std::to_string(batch));
  }
  int64_t inner = 1;
  for (int d = 2; d < x.rank(); ++d) inner *= x.shape[d];
  const size_t row = size_t(inner) * dtype_size(x.dtype);
  // The output may share the input's buffer: read from a copy then.
  std::vector<unsigned char> copy;
  const auto* src = static_cast<const unsigned char*>(x.data);
  if (out.data == x.data && x.nbytes() > 0) {
    copy.assign(src, src + x.nbytes());
    src = copy.data();
  }
  auto* dst = static_cast<unsigned char*>(out.data);
  auto offset = [&](int64_t b, int64_t t) {
    return size_t(batch_axis == 0 ? b * steps + t : t * batch + b) * row;
  };
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = lens[size_t(b)];
    if (len < 0 || len > steps) {
      return invalid_argument("ReverseSequence: sequence length " + std::to_string(len) +
                              " is outside [0, " + std::to_string(steps) + "]");
    }
    for (int64_t t = 0; t < steps; ++t) {
      if (row > 0) std::memcpy(dst + offset(b, t), src + offset(b, t < len ? len - 1 - t : t), row);
    }
  }
  return ok_status();
}

// TensorScatter: the cache copied, then each (prefix, s) row of update written at sequence
// position write_indices[batch] + s (modulo max_seq in circular mode; linear mode refuses a
// position outside the cache). Bytes are moved, so every dtype works.
Status tensor_scatter_kernel(const KernelArgs& a) {
  const TensorView& cache = a.in[0];
  const TensorView& upd = a.in[1];
  const TensorView& out = a.out[0];
  const int r = cache.rank();
  KILN_ASSIGN_OR_RETURN(int64_t axis, a.attrs.get_int("axis", -2));
  KILN_ASSIGN_OR_RETURN(std::string mode, a.attrs.get_string("mode", "linear"));
  if (axis < 0) axis += r;
  bool ok = r >= 2 && axis >= 1 && axis < r && upd.rank() == r && upd.dtype == cache.dtype &&
            out.dtype == cache.dtype && out.numel() == cache.numel() &&
            upd.shape[size_t(axis)] <= cache.shape[size_t(axis)];
  for (int d = 0; ok && d < r; ++d) ok = d == axis || upd.shape[d] == cache.shape[d];
  if (!ok) {
    return invalid_argument("TensorScatter: past_cache " + shape_to_string(cache.shape) +
                            " and update " + shape_to_string(upd.shape) + " do not agree");
  }
  const int64_t batch = cache.shape[0], max_seq = cache.shape[size_t(axis)],
                seq = upd.shape[size_t(axis)];
  std::vector<int64_t> write(size_t(batch), 0);
  if (a.in.size() > 2 && present(a.in[2])) {
    KILN_ASSIGN_OR_RETURN(write, read_ints(a.in[2], "TensorScatter", "write_indices"));
    if (int64_t(write.size()) != batch) {
      return invalid_argument("TensorScatter: write_indices has " + std::to_string(write.size()) +
                              " values, expected the batch (" + std::to_string(batch) + ")");
    }
  }
  if (out.data != cache.data && out.nbytes() > 0) std::memcpy(out.data, cache.data, out.nbytes());
  int64_t prefix = 1, inner = 1;
  for (int d = 0; d < axis; ++d) prefix *= cache.shape[d];
  for (int d = int(axis) + 1; d < r; ++d) inner *= cache.shape[d];
  const int64_t per_batch = batch > 0 ? prefix / batch : 0;
  const size_t row = size_t(inner) * dtype_size(cache.dtype);
  const bool circular = mode == "circular";
  for (int64_t b = 0; b < batch && seq > 0; ++b) {
    const int64_t w = write[size_t(b)];
    // Checked once per batch: linear positions w .. w+seq-1 must lie in the cache.
    if (!circular && (w < 0 || w > max_seq - seq)) {
      return invalid_argument("TensorScatter: write_indices[" + std::to_string(b) + "] is " +
                              std::to_string(w) + "; with " + std::to_string(seq) +
                              " updates it must be in [0, " + std::to_string(max_seq - seq) + "]");
    }
    for (int64_t p = b * per_batch; p < (b + 1) * per_batch; ++p) {
      for (int64_t s = 0; s < seq; ++s) {
        // Circular: the position modulo max_seq (>= seq >= 1), taken as a nonnegative remainder.
        int64_t pos = circular ? ((w % max_seq) + s % max_seq) % max_seq : w + s;
        if (pos < 0) pos += max_seq;
        std::memcpy(static_cast<char*>(out.data) + size_t(p * max_seq + pos) * row,
                    static_cast<const char*>(upd.data) + size_t(p * seq + s) * row, row);
      }
    }
  }
  return ok_status();
}

}  // namespace

void register_index_kernels(KernelRegistry& r) {
  r.add(OpKind::kSlice, &slice_kernel);
  r.add(OpKind::kGather, &gather_kernel);
  r.add(OpKind::kGatherND, &gather_nd_kernel);
  r.add(OpKind::kGatherElements, &gather_elements_kernel);
  r.add(OpKind::kCumSum, &cumsum_kernel<false>);
  r.add(OpKind::kCumProd, &cumsum_kernel<true>);
  r.add(OpKind::kScatterElements, &scatter_elements_kernel);
  r.add(OpKind::kScatter, &scatter_elements_kernel);
  r.add(OpKind::kScatterND, &scatter_nd_kernel);
  r.add(OpKind::kOneHot, &one_hot_kernel);
  r.add(OpKind::kReverseSequence, &reverse_sequence_kernel);
  r.add(OpKind::kTensorScatter, &tensor_scatter_kernel);
}

}  // namespace kiln::backends::cpu
