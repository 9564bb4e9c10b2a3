// QuantizeLinear and DequantizeLinear (per tensor, per axis, blocked) and DynamicQuantizeLinear on
// CUDA, with the CPU reference's arithmetic (cpu/quant.cc): divide in the input's precision, round
// half to even, saturate. Scales and zero points are read on the device; DynamicQuantizeLinear
// writes its scale and zero point outputs first (one block) and the quantize kernel reads them.
#include <string>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;
constexpr int kBlock = 256;

// Maps each element of X to its scale / zero-point index (the reference's ParamMap).
struct ParamMap {
  int kind;  // 0 per tensor, 1 per axis, 2 blocked
  int64_t dim, inner, block, blocks;
  __device__ int64_t at(int64_t e) const {
    if (kind == 0) return 0;
    int64_t a = (e / inner) % dim;
    if (kind == 1) return a;
    int64_t o = e / (inner * dim);
    return (o * blocks + a / block) * inner + e % inner;
  }
};

struct QuantArgs {
  const void* x;
  const void* scale;
  const void* zp;  // nullptr: 0
  void* y;
  int x_dtype, s_dtype, zp_dtype, y_dtype;
  double lo, hi;  // the quantized type's range
  int64_t n;
  ParamMap map;
};

__global__ void quantize_kernel(QuantArgs a) {
  KILN_GRID_LOOP(e, a.n) {
    int64_t p = a.map.at(e);
    double q;
    if (DType(a.x_dtype) == DType::kFloat64) {
      q = load_as<double>(a.x, a.x_dtype, e) / load_as<double>(a.scale, a.s_dtype, p);
    } else {
      float f = load_as<float>(a.x, a.x_dtype, e) / load_as<float>(a.scale, a.s_dtype, p);
      if (DType(a.x_dtype) == DType::kFloat16) f = __half2float(__float2half_rn(f));
      if (DType(a.x_dtype) == DType::kBFloat16) f = __bfloat162float(__float2bfloat16_rn(f));
      q = f;
    }
    double zp = a.zp ? load_as<double>(a.zp, a.zp_dtype, p) : 0.0;
    store_as<double>(a.y, a.y_dtype, e, fmin(fmax(rint(q) + zp, a.lo), a.hi));
  }
}

__global__ void dequantize_kernel(QuantArgs a) {
  KILN_GRID_LOOP(e, a.n) {
    int64_t p = a.map.at(e);
    double v =
        load_as<double>(a.x, a.x_dtype, e) - (a.zp ? load_as<double>(a.zp, a.zp_dtype, p) : 0.0);
    double s = load_as<double>(a.scale, a.s_dtype, p);
    double r = DType(a.y_dtype) == DType::kFloat64 ? v * s : double(float(v) * float(s));
    store_as<double>(a.y, a.y_dtype, e, r);
  }
}

bool quantized_type(DType t) {
  return t == DType::kInt8 || t == DType::kUInt8 || t == DType::kInt16 || t == DType::kUInt16 ||
         t == DType::kInt32;
}

class QuantKernel final : public CudaKernel {
 public:
  QuantKernel(bool quantize, int64_t axis, int64_t block)
      : CudaKernel(quantize ? "cuda.QuantizeLinear" : "cuda.DequantizeLinear"),
        quantize_(quantize),
        axis_(axis),
        block_(block) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &s = in[1], &y = out[0];
    bool has_zp = in.size() > 2 && present(in[2]);
    if (y.numel() != x.numel()) return invalid_argument(name_ + ": the output size differs");
    if (has_zp && in[2].numel() != s.numel())
      return invalid_argument(name_ + ": zero point and scale sizes differ");
    QuantArgs a{};
    ParamMap& m = a.map;
    m.dim = m.inner = m.block = m.blocks = 1;
    int rank = x.rank();
    if (!(s.numel() == 1 && block_ == 0)) {
      if (axis_ < -rank || axis_ >= rank) return invalid_argument(name_ + ": axis out of range");
      int64_t axis = axis_ < 0 ? axis_ + rank : axis_;
      m.dim = x.shape[axis];
      for (int d = int(axis) + 1; d < rank; ++d) m.inner *= x.shape[d];
      if (block_ == 0) {
        if (s.numel() != m.dim)
          return invalid_argument(name_ + ": the scale does not match the axis");
        m.kind = 1;
      } else {
        m.kind = 2;
        m.block = block_;
        m.blocks = (m.dim + block_ - 1) / block_;
        int64_t outer = m.dim ? x.numel() / (m.dim * m.inner) : 0;
        if (s.numel() != outer * m.blocks * m.inner)
          return invalid_argument(name_ + ": the blocked scale's size differs");
      }
    }
    a.x = x.data, a.scale = s.data, a.zp = has_zp ? in[2].data : nullptr, a.y = y.data;
    a.x_dtype = int(x.dtype), a.s_dtype = int(s.dtype), a.zp_dtype = has_zp ? int(in[2].dtype) : 0;
    a.y_dtype = int(y.dtype);
    a.n = y.numel();
    switch (y.dtype) {
      case DType::kInt8:
        a.lo = -128, a.hi = 127;
        break;
      case DType::kUInt8:
        a.lo = 0, a.hi = 255;
        break;
      case DType::kInt16:
        a.lo = -32768, a.hi = 32767;
        break;
      case DType::kUInt16:
        a.lo = 0, a.hi = 65535;
        break;
      case DType::kInt32:
        a.lo = -2147483648.0, a.hi = 2147483647.0;
        break;
      default:
        break;
    }
    if (a.n == 0) return ok_status();
    if (quantize_) {
      quantize_kernel<<<grid_for(a.n), kBlock, 0, stream_>>>(a);
    } else {
      dequantize_kernel<<<grid_for(a.n), kBlock, 0, stream_>>>(a);
    }
    return launch_status(quantize_ ? "quantize_kernel" : "dequantize_kernel");
  }

 private:
  bool quantize_;
  int64_t axis_, block_;
};

struct FmaxF {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct FminF {
  __device__ float operator()(float a, float b) const { return fminf(a, b); }
};

// One block: the range [min(0, x), max(0, x)] (NaN ignored, as std::max/min in the reference)
// and the scale and zero point mapping it onto [0, 255].
__global__ void dynamic_params_kernel(const float* x, int64_t n, float* scale_out,
                                      uint8_t* zp_out) {
  __shared__ float sh[32];
  float mx = 0, mn = 0;
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
    mx = fmaxf(mx, x[e]);
    mn = fminf(mn, x[e]);
  }
  mx = block_reduce(mx, FmaxF(), sh, 0.0f);
  mn = block_reduce(mn, FminF(), sh, 0.0f);
  if (threadIdx.x == 0) {
    float scale = (mx == mn ? 1.0f : mx - mn) / 255.0f;
    float zp = rintf(fminf(fmaxf(0.0f - mn / scale, 0.0f), 255.0f));
    *scale_out = scale;
    *zp_out = uint8_t(zp);
  }
}

__global__ void dynamic_quantize_kernel(const float* x, int64_t n, const float* scale,
                                        const uint8_t* zp, uint8_t* y) {
  float s = *scale, z = float(*zp);
  KILN_GRID_LOOP(e, n) y[e] = uint8_t(fminf(fmaxf(rintf(x[e] / s) + z, 0.0f), 255.0f));
}

class DynamicQuantKernel final : public CudaKernel {
 public:
  DynamicQuantKernel() : CudaKernel("cuda.DynamicQuantizeLinear") {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    int64_t n = x.numel();
    if (out[0].numel() != n || out[1].numel() != 1 || out[2].numel() != 1) {
      return invalid_argument(name_ +
                              ": outputs must be Y of X's size and one scale and zero point");
    }
    float* scale = out[1].as<float>();
    uint8_t* zp = out[2].as<uint8_t>();
    dynamic_params_kernel<<<1, 1024, 0, stream_>>>(x.as<const float>(), n, scale, zp);
    KILN_RETURN_IF_ERROR(launch_status("dynamic_params_kernel"));
    if (n == 0) return ok_status();
    dynamic_quantize_kernel<<<grid_for(n), kBlock, 0, stream_>>>(x.as<const float>(), n, scale, zp,
                                                                 out[0].as<uint8_t>());
    return launch_status("dynamic_quantize_kernel");
  }
};

StatusOr<std::unique_ptr<Kernel>> make_quant(const KernelQuery& q) {
  bool quantize = ops::find_op(q.node.domain, q.node.op_type) == OpKind::kQuantizeLinear;
  DType x = q.input_dtype(0), y = q.output_dtype(0);
  DType data = quantize ? x : y, qt = quantize ? y : x;
  if (!is_float(data) || !quantized_type(qt)) {
    return unsupported(q.node.describe() +
                       ": the CUDA kernel quantizes float32/float64/float16/bfloat16 to " +
                       "int8/uint8/int16/uint16/int32, not " + std::string(dtype_name(data)) +
                       " and " + std::string(dtype_name(qt)));
  }
  if (!is_float(q.input_dtype(1)))
    return invalid_argument(q.node.describe() + ": the scale must be a float");
  DType zt = q.input_dtype(2);
  if (zt != DType::kUndefined && zt != qt) {
    return unsupported(q.node.describe() + ": zero point of dtype " + std::string(dtype_name(zt)));
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, q.node.attrs.get_int("axis", 1));
  KILN_ASSIGN_OR_RETURN(int64_t block, q.node.attrs.get_int("block_size", 0));
  if (block < 0) return invalid_argument(q.node.describe() + ": block_size must be >= 0");
  return std::unique_ptr<Kernel>(new QuantKernel(quantize, axis, block));
}

StatusOr<std::unique_ptr<Kernel>> make_dynamic_quant(const KernelQuery& q) {
  if (q.input_dtype(0) != DType::kFloat32 || q.output_dtype(0) != DType::kUInt8 ||
      q.output_dtype(1) != DType::kFloat32 || q.output_dtype(2) != DType::kUInt8) {
    return unsupported(q.node.describe() +
                       ": the CUDA kernel takes float32 to uint8 with all three outputs");
  }
  return std::unique_ptr<Kernel>(new DynamicQuantKernel());
}

}  // namespace

void register_quant(Registry& r) {
  r.add(OpKind::kQuantizeLinear, &make_quant);
  r.add(OpKind::kDequantizeLinear, &make_quant);
  r.add(OpKind::kDynamicQuantizeLinear, &make_dynamic_quant);
}

}  // namespace kiln::backends::cuda
