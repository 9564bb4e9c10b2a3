// The math op family on CUDA (the CPU reference is cpu/math.cc): trigonometry and parameterized
// activations, Shrink, BitwiseNot; broadcast PRelu, bitwise ops and BitShift; variadic Sum, Mean,
// Max and Min folded pairwise into the output as the reference does; inference-mode Dropout. One
// kernel template per storage type (typed.cuh), the op a runtime code, as elementwise.cu keeps it.
#include <cmath>
#include <string>
#include <type_traits>

#include "backends/cpu/broadcast.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;
constexpr int kBlock = 256;

// ---- unary ----

enum class Un : int {
  kTan,
  kAsin,
  kAcos,
  kAtan,
  kSinh,
  kCosh,
  kAsinh,
  kAcosh,
  kAtanh,
  kSoftsign,
  kSelu,
  kCelu,
  kMish,
  kThresholdedRelu,
  kSwish,
  kShrink,
  kBitwiseNot,
  kDivide  // kDivide: x / alpha (Mean's last step)
};

struct UnParams {
  double alpha = 0, gamma = 0, bias = 0, lambd = 0;
};

template <typename C>
__device__ __forceinline__ C un_apply(Un op, C x, const UnParams& p) {
  if (op == Un::kShrink) {
    // Compared and computed in double, as ONNX's reference does (numpy promotes to float): -lambd
    // converted to an unsigned type would be undefined.
    const double xd = double(x);
    if (xd < -p.lambd) return C(xd + p.bias);
    if (xd > p.lambd) return C(xd - p.bias);
    return C(0);
  }
  if constexpr (std::is_integral_v<C>) {
    return op == Un::kBitwiseNot ? C(~x) : x;
  } else {
    switch (op) {
      case Un::kTan:
        return tan(x);
      case Un::kAsin:
        return asin(x);
      case Un::kAcos:
        return acos(x);
      case Un::kAtan:
        return atan(x);
      case Un::kSinh:
        return sinh(x);
      case Un::kCosh:
        return cosh(x);
      case Un::kAsinh:
        return asinh(x);
      case Un::kAcosh:
        return acosh(x);
      case Un::kAtanh:
        return atanh(x);
      case Un::kSoftsign:
        return x / (C(1) + fabs(x));
      case Un::kSelu:
        return x > C(0) ? C(p.gamma) * x : C(p.gamma) * (C(p.alpha) * exp(x) - C(p.alpha));
      case Un::kCelu: {
        C a = C(p.alpha);
        return fmax(C(0), x) + fmin(C(0), a * expm1(x / a));
      }
      case Un::kMish: {
        C sp = x > C(0) ? x + log1p(exp(-x)) : log1p(exp(x));
        return x * tanh(sp);
      }
      case Un::kThresholdedRelu:
        return x > C(p.alpha) ? x : C(0);
      case Un::kSwish:
        return x / (C(1) + exp(-C(p.alpha) * x));
      case Un::kDivide:
        return x / C(p.alpha);
      default:
        return x;
    }
  }
}

template <typename T>
__global__ void unary_kernel(const T* x, T* y, int64_t n, Un op, UnParams p) {
  using N = DNum<T>;
  KILN_GRID_LOOP(i, n) y[i] = N::store(un_apply(op, N::load(x[i]), p));
}

// ---- binary, broadcast ----

enum class Bin : int { kAdd, kMax, kMin, kPRelu, kAnd, kOr, kXor, kShl, kShr };

template <typename C>
__device__ __forceinline__ bool is_negative(C x) {
  if constexpr (std::is_signed_v<C>) {
    return x < C(0);
  } else {
    return false;
  }
}

template <typename C>
__device__ __forceinline__ C bin_apply(Bin op, C x, C y) {
  if constexpr (std::is_integral_v<C>) {
    using W = WideOf<C>;
    // Opset 28: a shift count outside [0, bits) gives 0 (left) or the sign extension (right).
    bool in_range = !is_negative(y) && uint64_t(y) < sizeof(C) * 8;
    switch (op) {
      case Bin::kAdd:
        return C(W(x) + W(y));
      case Bin::kMax:
        return x > y ? x : y;
      case Bin::kMin:
        return x < y ? x : y;
      case Bin::kPRelu:
        return is_negative(x) ? C(W(y) * W(x)) : x;
      case Bin::kAnd:
        return C(x & y);
      case Bin::kOr:
        return C(x | y);
      case Bin::kXor:
        return C(x ^ y);
      case Bin::kShl:
        return in_range ? C(W(x) << y) : C(0);
      case Bin::kShr:
        return in_range ? C(x >> y) : (is_negative(x) ? C(-1) : C(0));
    }
    return x;
  } else {
    switch (op) {
      case Bin::kAdd:
        return x + y;
      case Bin::kMax:
        return (x > y || x != x) ? x : y;  // NaN wins
      case Bin::kMin:
        return (x < y || x != x) ? x : y;
      case Bin::kPRelu:
        return x < C(0) ? C(y * x) : x;
      default:
        return x;
    }
  }
}

struct BinArgs {
  Strided<3> walk;  // operands 0 and 1 (operand 2 unused)
  int64_t n;
  Bin op;
};

template <typename T>
__global__ void binary_kernel(const T* a, const T* b, T* y, BinArgs args) {
  using N = DNum<T>;
  KILN_GRID_LOOP(i, args.n) {
    int64_t off[3];
    args.walk.offsets(i, off);
    y[i] = N::store(bin_apply(args.op, N::load(a[off[0]]), N::load(b[off[1]])));
  }
}

Status plan_walk2(std::span<const int64_t> out, std::span<const int64_t> a,
                  std::span<const int64_t> b, Strided<3>* walk) {
  cpu::BroadcastPlan<2> plan;
  KILN_RETURN_IF_ERROR(cpu::make_broadcast_plan<2>(out, {a, b}, &plan));
  if (plan.dims.size() > size_t(kMaxRank)) {
    return unsupported("broadcast over " + std::to_string(plan.dims.size()) +
                       " non-mergeable axes (at most " + std::to_string(kMaxRank) + ")");
  }
  walk->rank = int(plan.dims.size());
  for (size_t d = 0; d < plan.dims.size(); ++d) {
    walk->dims[d] = plan.dims[d];
    for (int k = 0; k < 3; ++k) walk->strides[d][k] = k < 2 ? plan.strides[d][k] : 0;
  }
  return ok_status();
}

// y = a op b, broadcast to y's shape; a or b may be y itself (the variadic fold), which is safe
// because every element reads only its own position of y.
Status launch_binary(Bin op, const TensorView& a, const TensorView& b, const TensorView& y,
                     cudaStream_t s) {
  BinArgs args{};
  KILN_RETURN_IF_ERROR(plan_walk2(y.shape, a.shape, b.shape, &args.walk));
  args.n = y.numel();
  args.op = op;
  if (args.n == 0) return ok_status();
  visit_dtype<kTNumeric>(y.dtype, [&](auto tag) {
    using T = decltype(tag);
    binary_kernel<T><<<grid_for(args.n), kBlock, 0, s>>>(static_cast<const T*>(a.data),
                                                         static_cast<const T*>(b.data),
                                                         static_cast<T*>(y.data), args);
  });
  return launch_status("binary_kernel");
}

Status launch_unary(Un op, const UnParams& p, const TensorView& x, const TensorView& y,
                    cudaStream_t s) {
  int64_t n = y.numel();
  if (n != x.numel()) return invalid_argument("the output size differs from the input's");
  if (n == 0) return ok_status();
  visit_dtype<kTNumeric>(y.dtype, [&](auto tag) {
    using T = decltype(tag);
    unary_kernel<T><<<grid_for(n), kBlock, 0, s>>>(static_cast<const T*>(x.data),
                                                   static_cast<T*>(y.data), n, op, p);
  });
  return launch_status("unary_kernel");
}

class UnaryKernel final : public CudaKernel {
 public:
  UnaryKernel(std::string name, Un op, UnParams p) : CudaKernel(std::move(name)), op_(op), p_(p) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    return launch_unary(op_, p_, in[0], out[0], stream_);
  }

 private:
  Un op_;
  UnParams p_;
};

class BinaryKernel final : public CudaKernel {
 public:
  BinaryKernel(std::string name, Bin op) : CudaKernel(std::move(name)), op_(op) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    return launch_binary(op_, in[0], in[1], out[0], stream_);
  }

 private:
  Bin op_;
};

// Sum, Mean, Max, Min of any number of inputs: y = x0 op x1, then y = y op xk; one input is
// copied; Mean divides at the end.
class VariadicKernel final : public CudaKernel {
 public:
  VariadicKernel(std::string name, Bin op, bool mean)
      : CudaKernel(std::move(name)), op_(op), mean_(mean) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& y = out[0];
    if (in.size() == 1) {
      if (in[0].nbytes() != y.nbytes())
        return invalid_argument(name_ + ": the output size differs");
      if (y.nbytes() > 0 && y.data != in[0].data) {
        KILN_CUDA_CHECK(
            cudaMemcpyAsync(y.data, in[0].data, y.nbytes(), cudaMemcpyDeviceToDevice, stream_),
            name_);
      }
    } else {
      KILN_RETURN_IF_ERROR(launch_binary(op_, in[0], in[1], y, stream_));
      for (size_t k = 2; k < in.size(); ++k)
        KILN_RETURN_IF_ERROR(launch_binary(op_, y, in[k], y, stream_));
    }
    if (!mean_) return ok_status();
    UnParams p;
    p.alpha = double(in.size());
    return launch_unary(Un::kDivide, p, y, y, stream_);
  }

 private:
  Bin op_;
  bool mean_;
};

// Inference-mode Dropout: Y = X, and the mask, when asked for, all true.
class DropoutKernel final : public CudaKernel {
 public:
  DropoutKernel() : CudaKernel("cuda.Dropout") {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &y = out[0];
    if (x.nbytes() != y.nbytes()) return invalid_argument(name_ + ": the output size differs");
    if (y.nbytes() > 0 && y.data != x.data) {
      KILN_CUDA_CHECK(
          cudaMemcpyAsync(y.data, x.data, y.nbytes(), cudaMemcpyDeviceToDevice, stream_), name_);
    }
    if (out.size() > 1 && present(out[1]) && out[1].nbytes() > 0) {
      KILN_CUDA_CHECK(cudaMemsetAsync(out[1].data, 1, out[1].nbytes(), stream_), name_);
    }
    return ok_status();
  }
};

// ---- factories ----

// Every input and output present has input 0's dtype, which is in `set`.
Status require_types(const KernelQuery& q, unsigned set, size_t inputs_checked) {
  DType t = q.input_dtype(0);
  if ((dtype_bit(t) & set) == 0 || t == DType::kBool) {
    return unsupported(q.node.describe() + ": dtype " + std::string(dtype_name(t)) +
                       " is not supported on CUDA");
  }
  for (size_t i = 1; i < inputs_checked && i < q.inputs.size(); ++i) {
    if (q.inputs[i] && q.inputs[i]->dtype != t) {
      return invalid_argument(q.node.describe() + ": input " + std::to_string(i) +
                              " differs in dtype from input 0");
    }
  }
  if (q.output_dtype(0) != t)
    return invalid_argument(q.node.describe() + ": the output dtype differs from the input's");
  return ok_status();
}

StatusOr<std::unique_ptr<Kernel>> make_unary(const KernelQuery& q) {
  const ir::Attributes& at = q.node.attrs;
  UnParams p;
  Un op;
  switch (ops::find_op(q.node.domain, q.node.op_type)) {
    case OpKind::kTan:
      op = Un::kTan;
      break;
    case OpKind::kAsin:
      op = Un::kAsin;
      break;
    case OpKind::kAcos:
      op = Un::kAcos;
      break;
    case OpKind::kAtan:
      op = Un::kAtan;
      break;
    case OpKind::kSinh:
      op = Un::kSinh;
      break;
    case OpKind::kCosh:
      op = Un::kCosh;
      break;
    case OpKind::kAsinh:
      op = Un::kAsinh;
      break;
    case OpKind::kAcosh:
      op = Un::kAcosh;
      break;
    case OpKind::kAtanh:
      op = Un::kAtanh;
      break;
    case OpKind::kSoftsign:
      op = Un::kSoftsign;
      break;
    case OpKind::kMish:
      op = Un::kMish;
      break;
    case OpKind::kSelu: {
      op = Un::kSelu;
      KILN_ASSIGN_OR_RETURN(float alpha, at.get_float("alpha", 1.67326319217681884765625f));
      KILN_ASSIGN_OR_RETURN(float gamma, at.get_float("gamma", 1.05070102214813232421875f));
      p.alpha = alpha, p.gamma = gamma;
      break;
    }
    case OpKind::kCelu:
    case OpKind::kThresholdedRelu:
    case OpKind::kSwish: {
      OpKind k = ops::find_op(q.node.domain, q.node.op_type);
      op = k == OpKind::kCelu ? Un::kCelu : k == OpKind::kSwish ? Un::kSwish : Un::kThresholdedRelu;
      KILN_ASSIGN_OR_RETURN(float alpha, at.get_float("alpha", 1.0f));
      if (op == Un::kCelu && alpha == 0)
        return invalid_argument(q.node.describe() + ": alpha must not be 0");
      p.alpha = alpha;
      break;
    }
    case OpKind::kShrink: {
      op = Un::kShrink;
      KILN_ASSIGN_OR_RETURN(float bias, at.get_float("bias", 0.0f));
      KILN_ASSIGN_OR_RETURN(float lambd, at.get_float("lambd", 0.5f));
      p.bias = bias, p.lambd = lambd;
      break;
    }
    case OpKind::kBitwiseNot:
      op = Un::kBitwiseNot;
      break;
    default:
      return unsupported(q.node.describe() + ": not a math unary op");
  }
  unsigned set = op == Un::kShrink ? kTNumeric : op == Un::kBitwiseNot ? kTInts : kTFloats;
  KILN_RETURN_IF_ERROR(require_types(q, set, 1));
  return std::unique_ptr<Kernel>(new UnaryKernel("cuda." + q.node.op_type, op, p));
}

StatusOr<std::unique_ptr<Kernel>> make_binary(const KernelQuery& q) {
  Bin op;
  unsigned set = kTInts;
  switch (ops::find_op(q.node.domain, q.node.op_type)) {
    case OpKind::kPRelu:
      op = Bin::kPRelu, set = kTNumeric;
      break;
    case OpKind::kBitwiseAnd:
      op = Bin::kAnd;
      break;
    case OpKind::kBitwiseOr:
      op = Bin::kOr;
      break;
    case OpKind::kBitwiseXor:
      op = Bin::kXor;
      break;
    case OpKind::kBitShift: {
      KILN_ASSIGN_OR_RETURN(std::string dir, q.node.attrs.get_string("direction", std::nullopt));
      if (dir != "LEFT" && dir != "RIGHT") {
        return invalid_argument(q.node.describe() + ": direction must be 'LEFT' or 'RIGHT', got '" +
                                dir + "'");
      }
      op = dir == "LEFT" ? Bin::kShl : Bin::kShr;
      break;
    }
    default:
      return unsupported(q.node.describe() + ": not a math binary op");
  }
  KILN_RETURN_IF_ERROR(require_types(q, set, 2));
  return std::unique_ptr<Kernel>(new BinaryKernel("cuda." + q.node.op_type, op));
}

StatusOr<std::unique_ptr<Kernel>> make_variadic(const KernelQuery& q) {
  OpKind k = ops::find_op(q.node.domain, q.node.op_type);
  Bin op = k == OpKind::kMax ? Bin::kMax : k == OpKind::kMin ? Bin::kMin : Bin::kAdd;
  bool mean = k == OpKind::kMean;
  KILN_RETURN_IF_ERROR(require_types(q, mean ? kTFloats : kTNumeric, q.inputs.size()));
  for (size_t i = 0; i < q.inputs.size(); ++i) {
    if (!q.inputs[i])
      return unsupported(q.node.describe() + ": input " + std::to_string(i) + " is omitted");
  }
  return std::unique_ptr<Kernel>(new VariadicKernel("cuda." + q.node.op_type, op, mean));
}

StatusOr<std::unique_ptr<Kernel>> make_dropout(const KernelQuery& q) {
  if (q.outputs.size() > 1 && q.outputs[1] && q.output_dtype(1) != DType::kBool) {
    return invalid_argument(q.node.describe() + ": the mask must be bool");
  }
  if (q.output_dtype(0) != q.input_dtype(0))
    return invalid_argument(q.node.describe() + ": the output dtype differs");
  return std::unique_ptr<Kernel>(new DropoutKernel());
}

}  // namespace

void register_math(Registry& r) {
  for (OpKind k : {OpKind::kTan, OpKind::kAsin, OpKind::kAcos, OpKind::kAtan, OpKind::kSinh,
                   OpKind::kCosh, OpKind::kAsinh, OpKind::kAcosh, OpKind::kAtanh, OpKind::kSoftsign,
                   OpKind::kSelu, OpKind::kCelu, OpKind::kMish, OpKind::kThresholdedRelu,
                   OpKind::kSwish, OpKind::kShrink, OpKind::kBitwiseNot}) {
    r.add(k, &make_unary);
  }
  for (OpKind k : {OpKind::kPRelu, OpKind::kBitwiseAnd, OpKind::kBitwiseOr, OpKind::kBitwiseXor,
                   OpKind::kBitShift}) {
    r.add(k, &make_binary);
  }
  for (OpKind k : {OpKind::kSum, OpKind::kMean, OpKind::kMax, OpKind::kMin})
    r.add(k, &make_variadic);
  r.add(OpKind::kDropout, &make_dropout);
}

}  // namespace kiln::backends::cuda
