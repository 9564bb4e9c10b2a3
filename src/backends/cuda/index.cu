// More index kernels: ScatterND (none/add/mul/max/min) and ReverseSequence. Indices and lengths
// are read on the device; values the reference refuses (an index or length out of range) cannot be
// reported from there: an out-of-range ScatterND index skips its update, a sequence length is
// clamped to [0, steps].
#include <string>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"

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
      C b = load_as<C>(upd, dtype, u), v = b;
      if (red != Reduction::kNone) {
        C cur = load_as<C>(out, dtype, t);
        if (red == Reduction::kAdd) v = C(cur + b);
        if (red == Reduction::kMul) v = C(cur * b);
        if (red == Reduction::kMax) v = cur > b ? cur : b;
        if (red == Reduction::kMin) v = cur < b ? cur : b;
      }
      store_as<C>(out, dtype, t, v);
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

}  // namespace

void register_index(Registry& r) {
  r.add(OpKind::kScatterND, &make_scatter_nd);
  r.add(OpKind::kReverseSequence, &make_reverse_sequence);
}

}  // namespace kiln::backends::cuda
