// Ops that make a tensor from nothing or from a shape on CUDA (schemas in ops/generators.cc):
// Range, ConstantOfShape and EyeLike, and Shape and Size when they were not folded.
#include <algorithm>
#include <cstring>
#include <optional>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;

template <typename C>
__global__ void range_kernel(const void* start, const void* delta, int dtype, void* out,
                             int64_t n) {
  C s = load_as<C>(start, dtype, 0), d = load_as<C>(delta, dtype, 0);
  KILN_GRID_LOOP(i, n) store_as<C>(out, dtype, i, C(s + C(i) * d));
}

// Range: the element count is known from the resolved output shape; start and delta are read on
// the device, so no synchronization is needed even when they are computed.
class RangeKernel final : public CudaKernel {
 public:
  using CudaKernel::CudaKernel;
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    if (in.size() < 3 || out.empty()) return invalid_argument(name_ + ": expects 3 inputs");
    int64_t n = out[0].numel();
    if (n == 0) return ok_status();
    DType dt = out[0].dtype;
    if (is_float(dt)) {
      range_kernel<double>
          <<<grid_for(n), 256, 0, stream_>>>(in[0].data, in[2].data, int(dt), out[0].data, n);
    } else {
      range_kernel<int64_t>
          <<<grid_for(n), 256, 0, stream_>>>(in[0].data, in[2].data, int(dt), out[0].data, n);
    }
    return launch_status("range_kernel");
  }
};

template <typename E>
__global__ void fill_kernel(E* out, E v, int64_t n) {
  KILN_GRID_LOOP(i, n) out[i] = v;
}

class ConstantOfShapeKernel final : public CudaKernel {
 public:
  ConstantOfShapeKernel(std::string name, uint64_t bits)
      : CudaKernel(std::move(name)), bits_(bits) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    int64_t n = out[0].numel();
    if (n == 0) return ok_status();
    switch (dtype_size(out[0].dtype)) {
      case 1:
        fill_kernel<uint8_t>
            <<<grid_for(n), 256, 0, stream_>>>(out[0].as<uint8_t>(), uint8_t(bits_), n);
        break;
      case 2:
        fill_kernel<uint16_t>
            <<<grid_for(n), 256, 0, stream_>>>(out[0].as<uint16_t>(), uint16_t(bits_), n);
        break;
      case 4:
        fill_kernel<uint32_t>
            <<<grid_for(n), 256, 0, stream_>>>(out[0].as<uint32_t>(), uint32_t(bits_), n);
        break;
      case 8:
        fill_kernel<uint64_t><<<grid_for(n), 256, 0, stream_>>>(out[0].as<uint64_t>(), bits_, n);
        break;
      default:
        return unsupported(name_ + ": dtype " + std::string(dtype_name(out[0].dtype)));
    }
    return launch_status("fill_kernel");
  }

 private:
  uint64_t bits_;
};

__global__ void eye_like_kernel(void* out, int dtype, int64_t cols, int64_t k, int64_t n) {
  KILN_GRID_LOOP(i, n) store_as<int64_t>(out, dtype, i, int64_t(i % cols - i / cols == k));
}

// EyeLike: ones on the diagonal k of a 2-D output of any dtype, zeros elsewhere.
class EyeLikeKernel final : public CudaKernel {
 public:
  explicit EyeLikeKernel(int64_t k) : CudaKernel("cuda.EyeLike"), k_(k) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& y = out[0];
    if (y.rank() != 2) return invalid_argument(name_ + ": the output must be 2-D");
    int64_t n = y.numel(), cols = y.shape[1];
    if (n == 0) return ok_status();
    // Clamped so that the difference of indices cannot miss or overflow (k may be any int64).
    int64_t k = std::clamp<int64_t>(k_, -y.shape[0] - 1, cols + 1);
    eye_like_kernel<<<grid_for(n), 256, 0, stream_>>>(y.data, int(y.dtype), cols, k, n);
    return launch_status("eye_like_kernel");
  }

 private:
  int64_t k_;
};

// Shape and Size when they were not folded: the values are the resolved shapes, passed to the
// kernel by value (no host buffer, nothing to synchronize, capturable in a graph).
struct ShapeValues {
  int64_t v[kMaxRank * 2];
};
__global__ void shape_values_kernel(int64_t* out, ShapeValues vals, int n) {
  int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = vals.v[i];
}

class ShapeKernel final : public CudaKernel {
 public:
  ShapeKernel(std::string name, bool size, int64_t start, std::optional<int64_t> end)
      : CudaKernel(std::move(name)), size_(size), start_(start), end_(end) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    ShapeValues vals{};
    int n = 0;
    if (size_) {
      vals.v[n++] = in[0].numel();
    } else {
      int64_t r = in[0].rank();
      int64_t s = start_ < 0 ? std::max<int64_t>(start_ + r, 0) : std::min(start_, r);
      int64_t e = end_ ? (*end_ < 0 ? std::max<int64_t>(*end_ + r, 0) : std::min(*end_, r)) : r;
      if (e - s > int64_t(kMaxRank * 2))
        return internal_error(name_ + ": rank " + std::to_string(r) + " is too large");
      for (int64_t d = s; d < e; ++d) vals.v[n++] = in[0].shape[d];
    }
    if (int64_t(n) != out[0].numel())
      return internal_error(name_ + ": output size does not match the shape");
    if (n == 0) return ok_status();
    shape_values_kernel<<<1, kMaxRank * 2, 0, stream_>>>(out[0].as<int64_t>(), vals, n);
    return launch_status("shape_values_kernel");
  }

 private:
  bool size_;
  int64_t start_;
  std::optional<int64_t> end_;
};

StatusOr<std::unique_ptr<Kernel>> make_range(const KernelQuery& q) {
  return std::unique_ptr<Kernel>(new RangeKernel("cuda.Range"));
}
StatusOr<std::unique_ptr<Kernel>> make_constant_of_shape(const KernelQuery& q) {
  uint64_t bits = 0;
  if (q.node.attrs.has("value")) {
    KILN_ASSIGN_OR_RETURN(Tensor t, q.node.attrs.get_tensor("value"));
    if (t.numel() != 1)
      return invalid_argument(q.node.describe() + ": value must have one element");
    std::memcpy(&bits, t.data(), std::min<size_t>(t.nbytes(), 8));
  }
  return std::unique_ptr<Kernel>(new ConstantOfShapeKernel("cuda.ConstantOfShape", bits));
}
StatusOr<std::unique_ptr<Kernel>> make_eye_like(const KernelQuery& q) {
  DType t = q.output_dtype(0);
  if (!is_float(t) && !is_integer(t) && t != DType::kBool) {
    return unsupported(q.node.describe() + ": dtype " + std::string(dtype_name(t)) +
                       " is not supported on CUDA");
  }
  KILN_ASSIGN_OR_RETURN(int64_t k, q.node.attrs.get_int("k", 0));
  return std::unique_ptr<Kernel>(new EyeLikeKernel(k));
}
StatusOr<std::unique_ptr<Kernel>> make_shape(const KernelQuery& q) {
  bool size = q.node.op_type == "Size";
  KILN_ASSIGN_OR_RETURN(int64_t start, q.node.attrs.get_int("start", 0));
  std::optional<int64_t> end;
  if (q.node.attrs.has("end")) {
    KILN_ASSIGN_OR_RETURN(int64_t e, q.node.attrs.get_int("end", 0));
    end = e;
  }
  return std::unique_ptr<Kernel>(new ShapeKernel("cuda." + q.node.op_type, size, start, end));
}

}  // namespace

void register_generators(Registry& r) {
  r.add(OpKind::kRange, &make_range);
  r.add(OpKind::kConstantOfShape, &make_constant_of_shape);
  r.add(OpKind::kEyeLike, &make_eye_like);
  r.add(OpKind::kShape, &make_shape);
  r.add(OpKind::kSize, &make_shape);
}

}  // namespace kiln::backends::cuda
