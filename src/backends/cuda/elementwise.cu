// Broadcasting kernels of the unary and binary ops (math, comparisons, logic, Cast, Clip), with
// contiguous and channel-broadcast fast paths. One instantiation per compute type (float, double,
// int64); storage dtypes and the op are runtime codes inside the kernel, for a short compile.
#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>

#include "backends/cuda/broadcast_walk.cuh"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/ew_math.cuh"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;

template <typename C>
__global__ void binary_kernel(EwArgs a) {
  KILN_GRID_LOOP(i, a.n) {
    int64_t off[3];
    a.walk.offsets(i, off);
    C x = load_as<C>(a.in[0], a.in_dtype[0], off[0]);
    C y = load_as<C>(a.in[1], a.in_dtype[1], off[1]);
    store_as<C>(a.out, a.out_dtype, i, binary_op<C>(a.op, x, y));
  }
}

template <typename C>
__global__ void unary_kernel(EwArgs a) {
  KILN_GRID_LOOP(i, a.n) {
    int64_t off[3];
    a.walk.offsets(i, off);
    C x = load_as<C>(a.in[0], a.in_dtype[0], off[0]);
    store_as<C>(a.out, a.out_dtype, i, unary_op<C>(a.op, x, a.alpha, a.beta));
  }
}

// Contiguous operands of one float storage type T (float32, float16, bfloat16; the common case
// between layers): no walk and no per-element dtype switch, and kVec elements per thread through
// one 16-byte access where the pointers are aligned. Computes in float as the general kernels,
// float16 and bfloat16 results through unary_op_rounded. kFixed: the kernel is instantiated for
// the one op kOp, whose switch then folds away (the ops models run standalone: a float16 Relu
// took 78% of the copy rate with the op a runtime code); otherwise `op` says which.
template <typename T, int kArity, Op kOp, bool kFixed>
__global__ void flat_kernel(const T* x, const T* z, T* y, int64_t n, Op op, float alpha,
                            float beta) {
  constexpr int kVec = 16 / sizeof(T);
  using N = DNum<T>;
  const Op o = kFixed ? kOp : op;
  auto f = [&](float a, float b) {
    if constexpr (kArity == 2) return binary_op<float>(o, a, b);
    if constexpr (sizeof(T) == 2) return unary_op_rounded(o, a, alpha, beta);
    return unary_op<float>(o, a, alpha, beta);
  };
  const int64_t nv = n / kVec;
  KILN_GRID_LOOP(v, nv) {
    uint4 xr = reinterpret_cast<const uint4*>(x)[v], zr{}, out;
    if constexpr (kArity == 2) zr = reinterpret_cast<const uint4*>(z)[v];
    const T* xs = reinterpret_cast<const T*>(&xr);
    const T* zs = reinterpret_cast<const T*>(&zr);
    T* os = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      os[k] = N::store(typename N::C(f(float(N::load(xs[k])), float(N::load(zs[k])))));
    reinterpret_cast<uint4*>(y)[v] = out;
  }
  // The tail past the last whole vector.
  for (int64_t i = nv * kVec + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float b = kArity == 2 ? float(N::load(z[i])) : 0.f;
    y[i] = N::store(typename N::C(f(float(N::load(x[i])), b)));
  }
}

// Calls f(std::integral_constant<Op, k>) where op is one of the ops flat_kernel is instantiated
// for at this arity, and returns whether it was.
template <int kArity, typename F>
bool with_fixed_op(Op op, F&& f) {
  auto one = [&](auto k) {
    if (op != decltype(k)::value) return false;
    f(k);
    return true;
  };
  using O = Op;
  if constexpr (kArity == 2) {
    return one(std::integral_constant<O, O::kAdd>{}) || one(std::integral_constant<O, O::kSub>{}) ||
           one(std::integral_constant<O, O::kMul>{}) || one(std::integral_constant<O, O::kDiv>{});
  } else {
    return one(std::integral_constant<O, O::kRelu>{}) ||
           one(std::integral_constant<O, O::kSigmoid>{}) ||
           one(std::integral_constant<O, O::kTanh>{}) ||
           one(std::integral_constant<O, O::kErf>{}) ||
           one(std::integral_constant<O, O::kGelu>{}) ||
           one(std::integral_constant<O, O::kGeluTanh>{}) ||
           one(std::integral_constant<O, O::kHardSwish>{}) ||
           one(std::integral_constant<O, O::kExp>{});
  }
}

// flat_kernel when every operand is contiguous, of the output's size and of one float type, and
// 16-byte aligned; false (nothing launched) otherwise.
template <int kArity>
bool launch_flat(std::span<const TensorView> in, const TensorView& out, Op op, float alpha,
                 float beta, cudaStream_t s) {
  const DType t = out.dtype;
  if (t != DType::kFloat32 && t != DType::kFloat16 && t != DType::kBFloat16) return false;
  if (!aligned16(out.data)) return false;
  for (int k = 0; k < kArity; ++k) {
    if (in[k].dtype != t || in[k].numel() != out.numel() || !aligned16(in[k].data)) return false;
    if (kArity == 2 && in[k].shape.size() != out.shape.size()) return false;
    if (kArity == 2 && !std::equal(in[k].shape.begin(), in[k].shape.end(), out.shape.begin()))
      return false;
  }
  const int64_t n = out.numel();
  const void* z = kArity == 2 ? in[1].data : nullptr;
  auto go = [&](auto tag) {
    using T = decltype(tag);
    const unsigned grid = grid_for(std::max<int64_t>(n / (16 / int64_t(sizeof(T))), 1));
    const auto* xp = static_cast<const T*>(in[0].data);
    const auto* zp = static_cast<const T*>(z);
    auto* yp = static_cast<T*>(out.data);
    const bool fixed = with_fixed_op<kArity>(op, [&](auto k) {
      flat_kernel<T, kArity, decltype(k)::value, true>
          <<<grid, 256, 0, s>>>(xp, zp, yp, n, op, alpha, beta);
    });
    if (!fixed)
      flat_kernel<T, kArity, Op::kCopy, false><<<grid, 256, 0, s>>>(xp, zp, yp, n, op, alpha, beta);
  };
  return visit_dtype<kTF32 | kTF16 | kTBF16>(t, go);
}

// A binary op of one operand that is the whole output [N, H, ..., W, C] and a gate that broadcasts
// over its middle axes: [N, 1, ..., 1, C] (per_batch: a squeeze-excitation scale channels last)
// or [1, ..., 1, C] and [C] (a per-channel bias); or over its leading axes alone, [1, ..., 1, D..C]
// (c is then the gate's size). The general walk's per-element division over
// every axis and dtype switch took MobileNetV3's channels-last gates 435 us at batch 64; here a
// thread takes kVec elements of one row of channels (one 16-byte access of X, the gate and Y where
// C % kVec == 0 and the pointers are aligned; kVec = 1 otherwise), two divisions per thread.
// gate_first keeps the operand order for Sub, Div and Pow. Computes in float as the general
// kernels do, so the results are the same. I: int32_t when n is below 2^30 (the grid stride's
// overshoot then stays below 2^31), int64_t otherwise.
template <typename T, int kVec, typename I>
__global__ void channel_broadcast_kernel(const T* __restrict__ x, const T* __restrict__ gate,
                                         T* __restrict__ y, I n, I c, I plane, bool per_batch,
                                         bool gate_first, Op op) {
  struct alignas(sizeof(T) * kVec) Pack {
    T v[kVec];
  };
  using N = DNum<T>;
  for (I i = (I(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; i < n;
       i += I(gridDim.x) * blockDim.x * kVec) {
    const I ch = i % c;
    const I gi = per_batch ? i / plane * c + ch : ch;
    const Pack xs = *reinterpret_cast<const Pack*>(x + i);
    const Pack gs = *reinterpret_cast<const Pack*>(gate + gi);
    Pack out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float a = float(N::load(xs.v[k])), b = float(N::load(gs.v[k]));
      out.v[k] = N::store(
          typename N::C(gate_first ? binary_op<float>(op, b, a) : binary_op<float>(op, a, b)));
    }
    *reinterpret_cast<Pack*>(y + i) = out;
  }
}

// A float binary op's operands seen as a full one (the output's shape) and a gate broadcast to
// it, the gate's dims aligned to the output's from the right (numpy broadcasting).
struct GateOperands {
  int full;             // the operand of the output's shape
  const TensorView* g;  // the other one, of rank 1..r
  int r;                // the output's rank
  int64_t dim(int d) const {
    const int gr = g->rank();
    return d < r - gr ? int64_t(1) : g->shape[size_t(d - (r - gr))];
  }
};

// The GateOperands of in, or nullopt where the operands and the output are not of one float type,
// the output's rank is below 2, or neither operand has the output's shape.
std::optional<GateOperands> gate_operands(std::span<const TensorView> in, const TensorView& out) {
  const DType t = out.dtype;
  if (t != DType::kFloat32 && t != DType::kFloat16 && t != DType::kBFloat16) return std::nullopt;
  if (in[0].dtype != t || in[1].dtype != t || out.rank() < 2) return std::nullopt;
  const auto same = [&](const TensorView& v) {
    return std::equal(v.shape.begin(), v.shape.end(), out.shape.begin(), out.shape.end());
  };
  const int full = same(in[0]) ? 0 : same(in[1]) ? 1 : -1;
  if (full < 0) return std::nullopt;
  const TensorView& g = in[size_t(1 - full)];
  if (g.rank() < 1 || g.rank() > out.rank()) return std::nullopt;
  return GateOperands{full, &g, out.rank()};
}

// channel_broadcast_kernel where it applies (both operands and the output of one float type,
// output rank >= 2, one operand of the output's shape, the other of the gate's); false (nothing
// launched) otherwise.
bool launch_channel_broadcast(std::span<const TensorView> in, const TensorView& out, Op op,
                              cudaStream_t s) {
  const std::optional<GateOperands> ops = gate_operands(in, out);
  if (!ops) return false;
  const DType t = out.dtype;
  const int full = ops->full, r = ops->r;
  const TensorView& g = *ops->g;
  const auto gate_dim = [&](int d) { return ops->dim(d); };
  // A gate of the output's trailing dims after leading ones ([1, S, E] onto [B, S, E]: ViT's
  // position embedding, 105 us at batch 64 on the general walk) repeats with the period of its
  // size: the per-channel case with c the whole period.
  int lead = 0;
  while (lead < r && gate_dim(lead) == 1) ++lead;
  bool trailing = lead > 0;
  int64_t period = 1;
  for (int d = lead; d < r; ++d) {
    trailing = trailing && gate_dim(d) == out.shape[size_t(d)];
    period *= out.shape[size_t(d)];
  }
  int64_t c = trailing ? period : out.shape[size_t(r - 1)];
  bool per_batch = false;
  if (!trailing) {
    if (gate_dim(r - 1) != c) return false;
    for (int d = 1; d < r - 1; ++d) {
      if (gate_dim(d) != 1) return false;
    }
    per_batch = gate_dim(0) != 1;
    if (per_batch && gate_dim(0) != out.shape[0]) return false;
  }
  const int64_t n = out.numel();
  if (n == 0) return false;
  const int64_t plane = n / out.shape[0];  // H * ... * W * C
  const bool aligned = aligned16(out.data) && aligned16(in[0].data) && aligned16(in[1].data);
  const bool small = n < (int64_t(1) << 30);
  const bool gate_first = full == 1;
  auto go = [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = int(16 / sizeof(T));
    const auto* x = static_cast<const T*>(in[size_t(full)].data);
    const auto* gp = static_cast<const T*>(g.data);
    auto* y = static_cast<T*>(out.data);
    auto launch = [&](auto vec) {
      constexpr int kV = decltype(vec)::value;
      const unsigned grid = grid_for(n / kV);
      if (small) {
        channel_broadcast_kernel<T, kV, int32_t><<<grid, 256, 0, s>>>(
            x, gp, y, int32_t(n), int32_t(c), int32_t(plane), per_batch, gate_first, op);
      } else {
        channel_broadcast_kernel<T, kV, int64_t>
            <<<grid, 256, 0, s>>>(x, gp, y, n, c, plane, per_batch, gate_first, op);
      }
    };
    if (aligned && c % kVec == 0) {
      launch(std::integral_constant<int, kVec>{});
    } else {
      launch(std::integral_constant<int, 1>{});
    }
  };
  return visit_dtype<kTF32 | kTF16 | kTBF16>(t, go);
}

// A binary op of one operand that is the whole output and a gate constant over the output's
// trailing "plane" axes: [N, C, 1, 1] onto [N, C, H, W] (a squeeze-excitation scale channels
// first), [1, C, 1, 1] or [C, 1, 1] (a per-channel scale or bias), generally a gate whose dims
// equal the output's over a run of axes before the plane and are 1 elsewhere, so that element i
// takes gate[i / plane % period]. The general walk took 478 us for [64, 256, 56, 56] * [64, 256, 1,
// 1] in float16 on an H200 (430 GB/s, 12% of copy bandwidth); here a thread takes kVec elements of
// one plane (one 16-byte access of X and Y where the plane is a multiple of kVec and the pointers
// are aligned; kVec = 1 otherwise) and one gate value, one division and one remainder per thread,
// looping over at most 8 blocks per SM.
// gate_first keeps the operand order for Sub, Div and Pow; computes in float as the general
// kernels do, Mul, Add and Sub as one FMA each (kAffine: the runtime op switch per element held
// float16 at ~2.7 TB/s). I as in channel_broadcast_kernel.
template <typename T, int kVec, typename I, bool kAffine>
__global__ void plane_broadcast_kernel(const T* __restrict__ x, const T* __restrict__ gate,
                                       T* __restrict__ y, I n, I plane, I period, bool gate_first,
                                       Op op) {
  struct alignas(sizeof(T) * kVec) Pack {
    T v[kVec];
  };
  using N = DNum<T>;
  for (I i = (I(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; i < n;
       i += I(gridDim.x) * blockDim.x * kVec) {
    const float b = float(N::load(gate[i / plane % period]));
    const Pack xs = *reinterpret_cast<const Pack*>(x + i);
    Pack out;
    if constexpr (kAffine) {
      // Mul, Add and Sub as one FMA, m = +-1 or the gate, rounded once as the op is: x * g + (-0)
      // keeps the sign of a zero product.
      const float m = op == Op::kMul ? b : op == Op::kSub && gate_first ? -1.f : 1.f;
      const float c = op == Op::kMul ? -0.f : op == Op::kAdd || gate_first ? b : -b;
#pragma unroll
      for (int k = 0; k < kVec; ++k) out.v[k] = N::store(__fmaf_rn(float(N::load(xs.v[k])), m, c));
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float a = float(N::load(xs.v[k]));
        out.v[k] = N::store(
            typename N::C(gate_first ? binary_op<float>(op, b, a) : binary_op<float>(op, a, b)));
      }
    }
    *reinterpret_cast<Pack*>(y + i) = out;
  }
}

// plane_broadcast_kernel where it applies (both operands and the output of one float type, one
// operand of the output's shape, the other 1 over the output's last axis and beyond its run of
// matching dims); false (nothing launched) otherwise. Gates over the last axis are
// launch_channel_broadcast's.
bool launch_plane_broadcast(std::span<const TensorView> in, const TensorView& out, Op op, int sms,
                            cudaStream_t s) {
  const std::optional<GateOperands> ops = gate_operands(in, out);
  if (!ops) return false;
  const DType t = out.dtype;
  const int full = ops->full, r = ops->r;
  const TensorView& g = *ops->g;
  const auto gate_dim = [&](int d) { return ops->dim(d); };
  // b: the gate's last axis of more than one element; the plane is the output's axes after it.
  int b = r - 1;
  while (b >= 0 && gate_dim(b) == 1) --b;
  if (b < 0 || b == r - 1) return false;
  int64_t period = 1, plane = 1;
  for (int d = b + 1; d < r; ++d) plane *= out.shape[size_t(d)];
  int d = b;
  for (; d >= 0 && gate_dim(d) == out.shape[size_t(d)]; --d) period *= out.shape[size_t(d)];
  for (; d >= 0; --d) {
    if (gate_dim(d) != 1) return false;
  }
  const int64_t n = out.numel();
  if (n == 0 || plane == 0 || g.numel() != period) return false;
  const bool aligned = aligned16(out.data) && aligned16(in[size_t(full)].data);
  const bool small = n < (int64_t(1) << 30);
  const bool gate_first = full == 1;
  auto go = [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = int(16 / sizeof(T));
    const auto* x = static_cast<const T*>(in[size_t(full)].data);
    const auto* gp = static_cast<const T*>(g.data);
    auto* y = static_cast<T*>(out.data);
    auto launch = [&](auto vec, auto affine) {
      constexpr int kV = decltype(vec)::value;
      constexpr bool kA = decltype(affine)::value;
      const unsigned grid = std::min<unsigned>(grid_for(n / kV), unsigned(sms) * 8u);
      if (small) {
        plane_broadcast_kernel<T, kV, int32_t, kA><<<grid, 256, 0, s>>>(
            x, gp, y, int32_t(n), int32_t(plane), int32_t(period), gate_first, op);
      } else {
        plane_broadcast_kernel<T, kV, int64_t, kA>
            <<<grid, 256, 0, s>>>(x, gp, y, n, plane, period, gate_first, op);
      }
    };
    auto with_vec = [&](auto vec) {
      if (op == Op::kMul || op == Op::kAdd || op == Op::kSub) {
        launch(vec, std::true_type{});
      } else {
        launch(vec, std::false_type{});
      }
    };
    if (aligned && plane % kVec == 0) {
      with_vec(std::integral_constant<int, kVec>{});
    } else {
      with_vec(std::integral_constant<int, 1>{});
    }
  };
  return visit_dtype<kTF32 | kTF16 | kTBF16>(t, go);
}

enum class Compute { kFloat, kDouble, kInt };

Compute compute_for(std::initializer_list<DType> dts) {
  bool any_float = false, any_double = false;
  for (DType d : dts) {
    if (d == DType::kFloat64) any_double = true;
    if (d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16) any_float = true;
  }
  return any_double ? Compute::kDouble : any_float ? Compute::kFloat : Compute::kInt;
}

class BinaryKernel final : public CudaKernel {
 public:
  BinaryKernel(std::string name, Op op)
      : CudaKernel(std::move(name)), op_(op), sms_(current_sms()) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    if (in.size() < 2 || out.empty())
      return invalid_argument(name_ + ": expects 2 inputs and 1 output");
    EwArgs a{};
    KILN_RETURN_IF_ERROR(plan_walk<2>(out[0].shape, {in[0].shape, in[1].shape}, &a.walk));
    a.n = out[0].numel();
    if (a.n == 0) return ok_status();
    a.in[0] = in[0].data, a.in[1] = in[1].data;
    a.in_dtype[0] = int(in[0].dtype), a.in_dtype[1] = int(in[1].dtype);
    a.out = out[0].data, a.out_dtype = int(out[0].dtype);
    a.op = op_;
    if (launch_flat<2>(in, out[0], op_, 0.f, 0.f, stream_))
      return launch_status("flat binary kernel");
    if (launch_channel_broadcast(in, out[0], op_, stream_)) {
      return launch_status("channel_broadcast_kernel");
    }
    if (launch_plane_broadcast(in, out[0], op_, sms_, stream_)) {
      return launch_status("plane_broadcast_kernel");
    }
    switch (compute_for({in[0].dtype, in[1].dtype})) {
      case Compute::kFloat:
        binary_kernel<float><<<grid_for(a.n), 256, 0, stream_>>>(a);
        break;
      case Compute::kDouble:
        binary_kernel<double><<<grid_for(a.n), 256, 0, stream_>>>(a);
        break;
      case Compute::kInt:
        binary_kernel<int64_t><<<grid_for(a.n), 256, 0, stream_>>>(a);
        break;
    }
    return launch_status("binary_kernel");
  }

 private:
  Op op_;
  int sms_;  // plane_broadcast_kernel's grid: at most 8 blocks per SM
};

class UnaryKernel final : public CudaKernel {
 public:
  UnaryKernel(std::string name, Op op, float alpha, float beta)
      : CudaKernel(std::move(name)), op_(op), alpha_(alpha), beta_(beta) {}
  HostParam clip_min, clip_max;  // Clip (opset >= 11) bounds
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    if (in.empty() || out.empty())
      return invalid_argument(name_ + ": expects 1 input and 1 output");
    EwArgs a{};
    a.n = out[0].numel();
    if (a.n != in[0].numel()) return invalid_argument(name_ + ": input and output sizes differ");
    if (a.n == 0) return ok_status();
    a.walk.rank = 1;
    a.walk.dims[0] = a.n;
    a.walk.strides[0][0] = 1;
    a.in[0] = in[0].data, a.in_dtype[0] = int(in[0].dtype);
    a.out = out[0].data, a.out_dtype = int(out[0].dtype);
    a.op = op_, a.alpha = alpha_, a.beta = beta_;
    if (op_ == Op::kClip) {
      a.alpha = -INFINITY, a.beta = INFINITY;
      if (!is_float(in[0].dtype)) a.alpha = -9.2e18f, a.beta = 9.2e18f;
      if (clip_min.present() && in.size() > 1 && present(in[1])) {
        KILN_ASSIGN_OR_RETURN(auto v, clip_min.get(in[1], stream_));
        if (v.size() != 1) return invalid_argument(name_ + ": min must have one element");
        a.alpha = float(v[0]);
      } else if (!clip_min.present()) {
        a.alpha = alpha_;
      }
      if (clip_max.present() && in.size() > 2 && present(in[2])) {
        KILN_ASSIGN_OR_RETURN(auto v, clip_max.get(in[2], stream_));
        if (v.size() != 1) return invalid_argument(name_ + ": max must have one element");
        a.beta = float(v[0]);
      } else if (!clip_max.present() && !clip_min.present()) {
        a.beta = beta_;
      }
    }
    if (launch_flat<1>(in, out[0], op_, a.alpha, a.beta, stream_))
      return launch_status("flat unary kernel");
    // Casts between float32 and float16/bfloat16 (the precision pass's, at an engine's IO): the
    // conversion kernels, with no walk and no per-element dtype switch (the general kernel took
    // 60 us for a batch of 64 RGB images on an H100).
    if (op_ == Op::kCopy && in[0].dtype == DType::kFloat32) {
      if (out[0].dtype == DType::kFloat16)
        return convert_f32_to_f16(in[0].as<const float>(), out[0].data, a.n, stream_);
      if (out[0].dtype == DType::kBFloat16)
        return convert_f32_to_bf16(in[0].as<const float>(), out[0].data, a.n, stream_);
    }
    if (op_ == Op::kCopy && out[0].dtype == DType::kFloat32) {
      if (in[0].dtype == DType::kFloat16)
        return convert_f16_to_f32(in[0].data, out[0].as<float>(), a.n, stream_);
      if (in[0].dtype == DType::kBFloat16)
        return convert_bf16_to_f32(in[0].data, out[0].as<float>(), a.n, stream_);
    }
    switch (compute_for({in[0].dtype, out[0].dtype})) {
      case Compute::kFloat:
        unary_kernel<float><<<grid_for(a.n), 256, 0, stream_>>>(a);
        break;
      case Compute::kDouble:
        unary_kernel<double><<<grid_for(a.n), 256, 0, stream_>>>(a);
        break;
      case Compute::kInt:
        unary_kernel<int64_t><<<grid_for(a.n), 256, 0, stream_>>>(a);
        break;
    }
    return launch_status("unary_kernel");
  }

 private:
  Op op_;
  float alpha_, beta_;
};

StatusOr<std::unique_ptr<Kernel>> make_binary(const KernelQuery& q) {
  OpKind k = ops::find_op(q.node.domain, q.node.op_type);
  Op op;
  switch (k) {
    case OpKind::kAdd:
      op = Op::kAdd;
      break;
    case OpKind::kSub:
      op = Op::kSub;
      break;
    case OpKind::kMul:
      op = Op::kMul;
      break;
    case OpKind::kDiv:
      op = Op::kDiv;
      break;
    case OpKind::kPow:
      op = Op::kPow;
      break;
    case OpKind::kMod: {
      KILN_ASSIGN_OR_RETURN(int64_t fmod, q.node.attrs.get_int("fmod", 0));
      op = fmod ? Op::kModTrunc : Op::kModFloor;
      break;
    }
    case OpKind::kEqual:
      op = Op::kEq;
      break;
    case OpKind::kLess:
      op = Op::kLt;
      break;
    case OpKind::kLessOrEqual:
      op = Op::kLe;
      break;
    case OpKind::kGreater:
      op = Op::kGt;
      break;
    case OpKind::kGreaterOrEqual:
      op = Op::kGe;
      break;
    case OpKind::kAnd:
      op = Op::kAnd;
      break;
    case OpKind::kOr:
      op = Op::kOr;
      break;
    case OpKind::kXor:
      op = Op::kXor;
      break;
    default:
      return unsupported(q.node.describe() + ": not a binary op");
  }
  return std::unique_ptr<Kernel>(new BinaryKernel("cuda." + q.node.op_type, op));
}

StatusOr<std::unique_ptr<Kernel>> make_unary(const KernelQuery& q) {
  OpKind k = ops::find_op(q.node.domain, q.node.op_type);
  const ir::Attributes& at = q.node.attrs;
  float alpha = 0, beta = 0;
  Op op;
  switch (k) {
    case OpKind::kNot:
      op = Op::kNot;
      break;
    case OpKind::kNeg:
      op = Op::kNeg;
      break;
    case OpKind::kAbs:
      op = Op::kAbs;
      break;
    case OpKind::kReciprocal:
      op = Op::kReciprocal;
      break;
    case OpKind::kSqrt:
      op = Op::kSqrt;
      break;
    case OpKind::kExp:
      op = Op::kExp;
      break;
    case OpKind::kLog:
      op = Op::kLog;
      break;
    case OpKind::kErf:
      op = Op::kErf;
      break;
    case OpKind::kRelu:
      op = Op::kRelu;
      break;
    case OpKind::kSigmoid:
      op = Op::kSigmoid;
      break;
    case OpKind::kTanh:
      op = Op::kTanh;
      break;
    case OpKind::kHardSigmoid: {
      op = Op::kHardSigmoid;
      KILN_ASSIGN_OR_RETURN(alpha, at.get_float("alpha", 0.2f));
      KILN_ASSIGN_OR_RETURN(beta, at.get_float("beta", 0.5f));
      break;
    }
    case OpKind::kHardSwish:
      op = Op::kHardSwish;
      break;
    case OpKind::kSin:
      op = Op::kSin;
      break;
    case OpKind::kCos:
      op = Op::kCos;
      break;
    case OpKind::kIsNaN:
      op = Op::kIsNaN;
      break;
    case OpKind::kIsInf: {
      op = Op::kIsInf;
      KILN_ASSIGN_OR_RETURN(int64_t pos, at.get_int("detect_positive", 1));
      KILN_ASSIGN_OR_RETURN(int64_t neg, at.get_int("detect_negative", 1));
      alpha = float(pos), beta = float(neg);
      break;
    }
    case OpKind::kFloor:
      op = Op::kFloor;
      break;
    case OpKind::kCeil:
      op = Op::kCeil;
      break;
    case OpKind::kRound:
      op = Op::kRound;
      break;
    case OpKind::kSign:
      op = Op::kSign;
      break;
    case OpKind::kLeakyRelu: {
      op = Op::kLeakyRelu;
      KILN_ASSIGN_OR_RETURN(alpha, at.get_float("alpha", 0.01f));
      break;
    }
    case OpKind::kElu: {
      op = Op::kElu;
      KILN_ASSIGN_OR_RETURN(alpha, at.get_float("alpha", 1.0f));
      break;
    }
    case OpKind::kSoftplus:
      op = Op::kSoftplus;
      break;
    case OpKind::kGelu: {
      KILN_ASSIGN_OR_RETURN(std::string approx, at.get_string("approximate", "none"));
      if (approx != "none" && approx != "tanh")
        return invalid_argument(q.node.describe() + ": approximate must be 'none' or 'tanh'");
      op = approx == "tanh" ? Op::kGeluTanh : Op::kGelu;
      break;
    }
    case OpKind::kCast:
    case OpKind::kCastLike:
      op = Op::kCopy;
      break;
    case OpKind::kClip: {
      op = Op::kClip;
      KILN_ASSIGN_OR_RETURN(alpha, at.get_float("min", -3.402823466e38f));
      KILN_ASSIGN_OR_RETURN(beta, at.get_float("max", 3.402823466e38f));
      auto kernel = std::make_unique<UnaryKernel>("cuda.Clip", op, alpha, beta);
      kernel->clip_min.init(q, 1);
      kernel->clip_max.init(q, 2);
      return std::unique_ptr<Kernel>(std::move(kernel));
    }
    default:
      return unsupported(q.node.describe() + ": not a unary op");
  }
  return std::unique_ptr<Kernel>(new UnaryKernel("cuda." + q.node.op_type, op, alpha, beta));
}

}  // namespace

void register_elementwise(Registry& r) {
  for (OpKind k :
       {OpKind::kAdd, OpKind::kSub, OpKind::kMul, OpKind::kDiv, OpKind::kPow, OpKind::kMod,
        OpKind::kEqual, OpKind::kLess, OpKind::kLessOrEqual, OpKind::kGreater,
        OpKind::kGreaterOrEqual, OpKind::kAnd, OpKind::kOr, OpKind::kXor}) {
    r.add(k, &make_binary);
  }
  for (OpKind k : {OpKind::kNot,       OpKind::kNeg,       OpKind::kAbs,      OpKind::kReciprocal,
                   OpKind::kSqrt,      OpKind::kExp,       OpKind::kLog,      OpKind::kErf,
                   OpKind::kRelu,      OpKind::kSigmoid,   OpKind::kTanh,     OpKind::kHardSigmoid,
                   OpKind::kHardSwish, OpKind::kSin,       OpKind::kCos,      OpKind::kIsNaN,
                   OpKind::kIsInf,     OpKind::kFloor,     OpKind::kCeil,     OpKind::kRound,
                   OpKind::kSign,      OpKind::kLeakyRelu, OpKind::kElu,      OpKind::kSoftplus,
                   OpKind::kGelu,      OpKind::kCast,      OpKind::kCastLike, OpKind::kClip}) {
    r.add(k, &make_unary);
  }
}

}  // namespace kiln::backends::cuda
