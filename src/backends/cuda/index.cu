// The index op family's kernels on CUDA (the CPU reference is cpu/index.cc) beside data.cu's
// Gather and GatherND: GatherElements, ScatterElements (none/add/mul/max/min), OneHot, ScatterND
// and ReverseSequence. Indices and lengths are read on the device; values the reference refuses (an
// index or length out of range) cannot be reported from there: an out-of-range ScatterND or
// ScatterElements index skips its update or reads element 0, a sequence length is clamped to
// [0, steps].
#include <string>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/query_checks.h"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;
constexpr int kBlock = 256;

enum class Reduction { kNone, kAdd, kMul, kMax, kMin };

StatusOr<Reduction> read_reduction(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(std::string r, q.node.attrs.get_string("reduction", "none"));
  if (r == "none") return Reduction::kNone;
  if (r == "add") return Reduction::kAdd;
  if (r == "mul") return Reduction::kMul;
  if (r == "max") return Reduction::kMax;
  if (r == "min") return Reduction::kMin;
  return unsupported(q.node.describe() + ": unknown reduction '" + r + "'");
}

// Writes update b at out[t], folded into what is there by the reduction (ScatterND and
// ScatterElements alike).
template <typename C>
__device__ __forceinline__ void scatter_one(void* out, int dtype, int64_t t, C b, Reduction red) {
  C v = b;
  if (red != Reduction::kNone) {
    C cur = load_as<C>(out, dtype, t);
    if (red == Reduction::kAdd) v = C(cur + b);
    if (red == Reduction::kMul) v = C(cur * b);
    if (red == Reduction::kMax) v = cur > b ? cur : b;
    if (red == Reduction::kMin) v = cur < b ? cur : b;
  }
  store_as<C>(out, dtype, t, v);
}

// ---- ScatterND ----

struct ScatterNdArgs {
  int k;                      // the indices' last dim: how many leading data dims an index names
  int64_t dims[kMaxRank];     // data dims 0..k-1
  int64_t strides[kMaxRank];  // data strides of those dims
  int64_t count, slice;       // index tuples; elements each one updates
};

// One thread per element of a slice, applying the index tuples in order: two tuples meet only on
// the same slice position, so duplicates apply in the reference's order (later wins, reductions
// fold left to right).
template <typename C>
__global__ void scatter_nd_kernel(void* out, int dtype, const void* idx, int idx_dtype,
                                  const void* upd, ScatterNdArgs a, Reduction red) {
  KILN_GRID_LOOP(e, a.slice) {
    for (int64_t c = 0; c < a.count; ++c) {
      int64_t off = 0;
      bool inside = true;
      for (int d = 0; d < a.k; ++d) {
        int64_t i = load_as<int64_t>(idx, idx_dtype, c * a.k + d);
        if (i < 0) i += a.dims[d];
        if (i < 0 || i >= a.dims[d]) inside = false;
        off += i * a.strides[d];
      }
      if (!inside) continue;
      const int64_t t = off + e, u = c * a.slice + e;
      scatter_one<C>(out, dtype, t, load_as<C>(upd, dtype, u), red);
    }
  }
}

class ScatterNdKernel final : public CudaKernel {
 public:
  explicit ScatterNdKernel(Reduction red) : CudaKernel("cuda.ScatterND"), red_(red) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &data = in[0], &indices = in[1], &upd = in[2], &y = out[0];
    const int r = data.rank(), qr = indices.rank();
    if (qr < 1 || y.numel() != data.numel()) return invalid_argument(name_ + ": bad ranks");
    const int64_t k = indices.shape[qr - 1];
    if (k < 1 || k > r)
      return invalid_argument(name_ + ": the last indices dim must be in [1, rank]");
    ScatterNdArgs a{};
    a.k = int(k);
    a.slice = 1;
    for (int d = int(k); d < r; ++d) a.slice *= data.shape[d];
    a.count = indices.numel() / k;
    if (upd.numel() != a.count * a.slice) {
      return invalid_argument(name_ + ": updates have " + std::to_string(upd.numel()) +
                              " elements, expected " + std::to_string(a.count * a.slice));
    }
    int64_t stride = a.slice;
    for (int d = int(k) - 1; d >= 0; --d) {
      a.dims[d] = data.shape[d], a.strides[d] = stride;
      stride *= data.shape[d];
    }
    if (y.data != data.data && y.nbytes() > 0) {
      KILN_CUDA_CHECK(
          cudaMemcpyAsync(y.data, data.data, y.nbytes(), cudaMemcpyDeviceToDevice, stream_), name_);
    }
    if (a.count == 0 || a.slice == 0) return ok_status();
    int dt = int(data.dtype), idt = int(indices.dtype);
    if (is_float(data.dtype)) {
      scatter_nd_kernel<double><<<grid_for(a.slice), kBlock, 0, stream_>>>(y.data, dt, indices.data,
                                                                           idt, upd.data, a, red_);
    } else {
      scatter_nd_kernel<int64_t><<<grid_for(a.slice), kBlock, 0, stream_>>>(
          y.data, dt, indices.data, idt, upd.data, a, red_);
    }
    return launch_status("scatter_nd_kernel");
  }

 private:
  Reduction red_;
};

// ---- GatherElements and ScatterElements ----

struct ElementsArgs {
  int rank;
  int axis;
  int64_t idx_dims[kMaxRank];      // the indices' (and updates') shape
  int64_t data_strides[kMaxRank];  // data (and output) strides
  int64_t axis_dim;                // data.shape[axis]
};

// Where an index points along the axis: negative ones wrap; out-of-range ones, which the device
// cannot report, read or write element 0 (as the CUDA Gather).
__device__ __forceinline__ int64_t wrap_index(int64_t k, int64_t d) {
  if (k < 0) k += d;
  return k < 0 || k >= d ? 0 : k;
}

template <typename E>
__global__ void gather_elements_kernel(const E* data, const void* idx, int idx_dtype, E* out,
                                       ElementsArgs a, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    int64_t r = i, off = 0;
    for (int d = a.rank - 1; d >= 0; --d) {
      int64_t c = r % a.idx_dims[d];
      r /= a.idx_dims[d];
      if (d == a.axis) c = wrap_index(load_as<int64_t>(idx, idx_dtype, i), a.axis_dim);
      off += c * a.data_strides[d];
    }
    out[i] = data[off];
  }
}

// One thread per line of the indices along the axis, applying its updates in order: updates on
// different lines differ in a coordinate other than the axis, so they never meet, and within a
// line the order is the CPU reference's (later updates win, reductions fold left to right).
template <typename C>
__global__ void scatter_elements_kernel(void* out, int dtype, const void* idx, int idx_dtype,
                                        const void* upd, ElementsArgs a, Reduction red,
                                        int64_t lines) {
  int64_t len = a.idx_dims[a.axis];
  KILN_GRID_LOOP(line, lines) {
    int64_t r = line, base = 0, src = 0, src_stride = 1, axis_src_stride = 1;
    for (int d = a.rank - 1; d >= 0; --d) {
      if (d == a.axis) {
        axis_src_stride = src_stride;
      } else {
        int64_t c = r % a.idx_dims[d];
        r /= a.idx_dims[d];
        base += c * a.data_strides[d];
        src += c * src_stride;
      }
      src_stride *= a.idx_dims[d];
    }
    for (int64_t j = 0; j < len; ++j) {
      int64_t u = src + j * axis_src_stride;
      int64_t t = base + wrap_index(load_as<int64_t>(idx, idx_dtype, u), a.axis_dim) *
                             a.data_strides[a.axis];
      scatter_one<C>(out, dtype, t, load_as<C>(upd, dtype, u), red);
    }
  }
}

// The shared checks of GatherElements and ScatterElements; fills `a` (indices shape, data strides).
Status elements_args(const std::string& name, int64_t axis_attr, const TensorView& data,
                     const TensorView& indices, ElementsArgs* a) {
  int r = data.rank();
  int64_t axis = axis_attr < 0 ? axis_attr + r : axis_attr;
  if (r < 1 || r > kMaxRank || indices.rank() != r || axis < 0 || axis >= r) {
    return invalid_argument(name + ": bad axis or ranks");
  }
  auto st = row_major_strides(data.shape);
  a->rank = r;
  a->axis = int(axis);
  a->axis_dim = data.shape[axis];
  for (int d = 0; d < r; ++d) {
    if (d != axis && indices.shape[d] > data.shape[d]) {
      return invalid_argument(name + ": indices dim " + std::to_string(d) +
                              " exceeds the data dim");
    }
    a->idx_dims[d] = indices.shape[d];
    a->data_strides[d] = st[d];
  }
  return ok_status();
}

class GatherElementsKernel final : public CudaKernel {
 public:
  explicit GatherElementsKernel(int64_t axis) : CudaKernel("cuda.GatherElements"), axis_(axis) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &data = in[0], &indices = in[1];
    ElementsArgs a{};
    KILN_RETURN_IF_ERROR(elements_args(name_, axis_, data, indices, &a));
    int64_t n = out[0].numel();
    if (n != indices.numel())
      return invalid_argument(name_ + ": the output shape differs from the indices shape");
    if (n == 0) return ok_status();
    if (a.axis_dim == 0) return invalid_argument(name_ + ": indexing an empty axis");
    return by_element_size(dtype_size(data.dtype), name_, [&](auto tag) {
      using E = decltype(tag);
      gather_elements_kernel<E><<<grid_for(n), kBlock, 0, stream_>>>(
          static_cast<const E*>(data.data), indices.data, int(indices.dtype),
          static_cast<E*>(out[0].data), a, n);
    });
  }

 private:
  int64_t axis_;
};

class ScatterElementsKernel final : public CudaKernel {
 public:
  ScatterElementsKernel(int64_t axis, Reduction red)
      : CudaKernel("cuda.ScatterElements"), axis_(axis), red_(red) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &data = in[0], &indices = in[1], &upd = in[2], &y = out[0];
    ElementsArgs a{};
    KILN_RETURN_IF_ERROR(elements_args(name_, axis_, data, indices, &a));
    if (upd.numel() != indices.numel() || y.numel() != data.numel()) {
      return invalid_argument(name_ + ": updates must match the indices and the output the data");
    }
    if (y.data != data.data && y.nbytes() > 0) {
      KILN_CUDA_CHECK(
          cudaMemcpyAsync(y.data, data.data, y.nbytes(), cudaMemcpyDeviceToDevice, stream_), name_);
    }
    int64_t len = indices.shape[a.axis];
    if (indices.numel() == 0) return ok_status();
    if (a.axis_dim == 0) return invalid_argument(name_ + ": indexing an empty axis");
    int64_t lines = indices.numel() / len;
    int dt = int(data.dtype), idt = int(indices.dtype);
    if (is_float(data.dtype)) {
      scatter_elements_kernel<double><<<grid_for(lines), kBlock, 0, stream_>>>(
          y.data, dt, indices.data, idt, upd.data, a, red_, lines);
    } else {
      scatter_elements_kernel<int64_t><<<grid_for(lines), kBlock, 0, stream_>>>(
          y.data, dt, indices.data, idt, upd.data, a, red_, lines);
    }
    return launch_status("scatter_elements_kernel");
  }

 private:
  int64_t axis_;
  Reduction red_;
};

// ---- OneHot ----

template <typename E>
__global__ void one_hot_kernel(const void* idx, int idx_dtype, const E* values, E* out,
                               int64_t depth, int64_t inner, int64_t n) {
  KILN_GRID_LOOP(e, n) {
    int64_t i = e % inner, d = (e / inner) % depth, o = e / (inner * depth);
    double v = load_as<double>(idx, idx_dtype, o * inner + i);
    if (v < 0) v += double(depth);
    out[e] = values[v == double(d) ? 1 : 0];
  }
}

class OneHotKernel final : public CudaKernel {
 public:
  explicit OneHotKernel(int64_t axis) : CudaKernel("cuda.OneHot"), axis_(axis) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &idx = in[0], &values = in[2], &y = out[0];
    int r = y.rank();
    int64_t axis = axis_ < 0 ? axis_ + r : axis_;
    if (axis < 0 || axis >= r || idx.rank() != r - 1 || values.numel() != 2) {
      return invalid_argument(name_ + ": indices " + shape_to_string(idx.shape) + " and output " +
                              shape_to_string(y.shape) + " do not fit axis " +
                              std::to_string(axis_));
    }
    int64_t depth = y.shape[axis], inner = 1;
    for (int d = int(axis) + 1; d < r; ++d) inner *= y.shape[d];
    int64_t n = y.numel();
    if (n == 0) return ok_status();
    return by_element_size(dtype_size(y.dtype), name_, [&](auto tag) {
      using E = decltype(tag);
      one_hot_kernel<E><<<grid_for(n), kBlock, 0, stream_>>>(
          idx.data, int(idx.dtype), static_cast<const E*>(values.data), static_cast<E*>(y.data),
          depth, inner, n);
    });
  }

 private:
  int64_t axis_;
};

Status require_int_indices(const KernelQuery& q, size_t i, const char* what) {
  DType t = q.input_dtype(i);
  if (t != DType::kInt64 && t != DType::kInt32) {
    return unsupported(q.node.describe() + ": " + what + " must be int32 or int64, not " +
                       std::string(dtype_name(t)));
  }
  return ok_status();
}

StatusOr<std::unique_ptr<Kernel>> make_scatter_nd(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(Reduction red, read_reduction(q));
  KILN_RETURN_IF_ERROR(require_int_indices(q, 1, "indices"));
  DType t = q.input_dtype(0);
  if (q.input_dtype(2) != t)
    return unsupported(q.node.describe() + ": updates' dtype differs from the data's");
  // Values go through double (floats) or int64 (integers and bool), as the ScatterElements kernel.
  if (dtype_size(t) == 0 || (is_float(t) && dtype_size(t) < 2)) {
    return unsupported(q.node.describe() + ": dtype " + std::string(dtype_name(t)));
  }
  if (red != Reduction::kNone && t == DType::kBool) {
    return unsupported(q.node.describe() + ": a reduction over bool");
  }
  return std::unique_ptr<Kernel>(new ScatterNdKernel(red));
}

// ---- ReverseSequence ----

template <typename E>
__global__ void reverse_sequence_kernel(const E* x, E* y, const void* lens, int lens_dtype,
                                        int64_t batch, int64_t steps, int64_t inner, int batch_axis,
                                        int64_t n) {
  KILN_GRID_LOOP(e, n) {
    int64_t i = e % inner, outer = e / inner;
    int64_t b = batch_axis == 0 ? outer / steps : outer % batch;
    int64_t t = batch_axis == 0 ? outer % steps : outer / batch;
    int64_t len = load_as<int64_t>(lens, lens_dtype, b);
    len = len < 0 ? 0 : len > steps ? steps : len;
    int64_t src_t = t < len ? len - 1 - t : t;
    int64_t src = batch_axis == 0 ? b * steps + src_t : src_t * batch + b;
    y[e] = x[src * inner + i];
  }
}

class ReverseSequenceKernel final : public CudaKernel {
 public:
  ReverseSequenceKernel(int batch_axis)
      : CudaKernel("cuda.ReverseSequence"), batch_axis_(batch_axis) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &lens = in[1], &y = out[0];
    if (x.rank() < 2 || y.numel() != x.numel()) return invalid_argument(name_ + ": bad input rank");
    const int64_t batch = x.shape[batch_axis_], steps = x.shape[1 - batch_axis_];
    if (lens.numel() != batch) {
      return invalid_argument(name_ + ": " + std::to_string(lens.numel()) +
                              " sequence lengths for a batch of " + std::to_string(batch));
    }
    int64_t inner = 1;
    for (int d = 2; d < x.rank(); ++d) inner *= x.shape[d];
    const int64_t n = x.numel();
    if (n == 0) return ok_status();
    auto launch = [&](auto tag) {
      using E = decltype(tag);
      reverse_sequence_kernel<E><<<grid_for(n), kBlock, 0, stream_>>>(
          static_cast<const E*>(x.data), static_cast<E*>(y.data), lens.data, int(lens.dtype), batch,
          steps, inner, batch_axis_, n);
    };
    return by_element_size(dtype_size(x.dtype), name_, launch, "reverse_sequence_kernel");
  }

 private:
  int batch_axis_;
};

StatusOr<std::unique_ptr<Kernel>> make_reverse_sequence(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(int64_t batch_axis, q.node.attrs.get_int("batch_axis", 1));
  KILN_ASSIGN_OR_RETURN(int64_t time_axis, q.node.attrs.get_int("time_axis", 0));
  if (batch_axis + time_axis != 1 || batch_axis < 0 || time_axis < 0) {
    return unsupported(q.node.describe() + ": batch_axis and time_axis must be 0 and 1");
  }
  KILN_RETURN_IF_ERROR(require_int_indices(q, 1, "sequence_lens"));
  size_t es = dtype_size(q.input_dtype(0));
  if (es != 1 && es != 2 && es != 4 && es != 8) {
    return unsupported(q.node.describe() + ": dtype " + std::string(dtype_name(q.input_dtype(0))));
  }
  return std::unique_ptr<Kernel>(new ReverseSequenceKernel(int(batch_axis)));
}

StatusOr<std::unique_ptr<Kernel>> make_gather_elements(const KernelQuery& q) {
  KILN_RETURN_IF_ERROR(require_element_size(q, q.input_dtype(0)));
  KILN_RETURN_IF_ERROR(require_int_indices(q, 1, "indices"));
  KILN_RETURN_IF_ERROR(known_rank(q, 0).status());
  KILN_ASSIGN_OR_RETURN(int64_t axis, q.node.attrs.get_int("axis", 0));
  return std::unique_ptr<Kernel>(new GatherElementsKernel(axis));
}

StatusOr<std::unique_ptr<Kernel>> make_scatter_elements(const KernelQuery& q) {
  KILN_RETURN_IF_ERROR(require_element_size(q, q.input_dtype(0)));
  KILN_RETURN_IF_ERROR(require_int_indices(q, 1, "indices"));
  KILN_RETURN_IF_ERROR(known_rank(q, 0).status());
  KILN_ASSIGN_OR_RETURN(int64_t axis, q.node.attrs.get_int("axis", 0));
  KILN_ASSIGN_OR_RETURN(std::string red_s, q.node.attrs.get_string("reduction", "none"));
  Reduction red;
  if (red_s == "none")
    red = Reduction::kNone;
  else if (red_s == "add")
    red = Reduction::kAdd;
  else if (red_s == "mul")
    red = Reduction::kMul;
  else if (red_s == "max")
    red = Reduction::kMax;
  else if (red_s == "min")
    red = Reduction::kMin;
  else
    return invalid_argument(q.node.describe() + ": unknown reduction '" + red_s + "'");
  if (q.input_dtype(2) != q.input_dtype(0))
    return invalid_argument(q.node.describe() + ": updates' dtype differs");
  return std::unique_ptr<Kernel>(new ScatterElementsKernel(axis, red));
}

StatusOr<std::unique_ptr<Kernel>> make_one_hot(const KernelQuery& q) {
  KILN_RETURN_IF_ERROR(require_element_size(q, q.output_dtype(0)));
  DType it = q.input_dtype(0);
  if (!is_integer(it) && !is_float(it)) {
    return unsupported(q.node.describe() + ": indices of dtype " + std::string(dtype_name(it)));
  }
  if (q.input_dtype(2) != q.output_dtype(0))
    return invalid_argument(q.node.describe() + ": values' dtype differs");
  KILN_ASSIGN_OR_RETURN(int64_t axis, q.node.attrs.get_int("axis", -1));
  return std::unique_ptr<Kernel>(new OneHotKernel(axis));
}

}  // namespace

void register_index(Registry& r) {
  r.add(OpKind::kGatherElements, &make_gather_elements);
  r.add(OpKind::kScatterElements, &make_scatter_elements);
  r.add(OpKind::kScatter,
        &make_scatter_elements);  // opsets 9-10: ScatterElements without reduction
  r.add(OpKind::kOneHot, &make_one_hot);
  r.add(OpKind::kScatterND, &make_scatter_nd);
  r.add(OpKind::kReverseSequence, &make_reverse_sequence);
}

}  // namespace kiln::backends::cuda
