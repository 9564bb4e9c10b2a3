// Pooling kernels: MaxPool (with the optional Indices), AveragePool and LpPool over 1-D, 2-D and
// 3-D NCHW inputs, one thread per output element (1-D and 2-D max without Indices and average:
// pool_nchw.cu); kiln::Pool, the channels-last 2-D max and
// average pools, one thread per output pixel and vector of channels; GlobalAveragePool and
// GlobalMaxPool, one block per plane. The window arithmetic follows the CPU reference
// (backends/cpu/conv.cc) step by step. X and Y are float32, float16 or bfloat16 (one type); sums
// accumulate in float or double.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/pool_nchw.h"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;
constexpr int kBlock = 256;
// The storage types the pools instantiate for; float16/bfloat16 compute in float.
constexpr unsigned kPoolTypes = kTF32 | kTF16 | kTBF16;

enum class PoolOp { kMax, kAverage, kLp };
enum class AutoPad { kNotSet, kSameUpper, kSameLower, kValid };

// Three spatial axes, leading ones of size 1 for 1-D and 2-D pools (as the CPU reference).
struct PoolArgs {
  int64_t in[3], out[3], k[3], stride[3], dil[3], pb[3], pe[3];
  int64_t planes;
  bool include_pad;
  double p;
};

// The j in [0, count) with 0 <= start + j*step < limit form [*lo, *hi).
__device__ __forceinline__ void valid_range(int64_t start, int64_t step, int64_t count,
                                            int64_t limit, int64_t* lo, int64_t* hi) {
  int64_t l = start >= 0 ? 0 : (-start + step - 1) / step;
  int64_t h = start > limit - 1 ? 0 : (limit - 1 - start) / step + 1;
  l = l < count ? l : count;
  h = h < count ? h : count;
  *lo = l;
  *hi = h > l ? h : l;
}

template <PoolOp kOp, typename T>
__global__ void pool_kernel(const T* x, T* y, int64_t* indices, PoolArgs a, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    int64_t r = i;
    int64_t ow = r % a.out[2];
    r /= a.out[2];
    int64_t oh = r % a.out[1];
    r /= a.out[1];
    int64_t od = r % a.out[0];
    int64_t p = r / a.out[0];
    int64_t in_sp = a.in[0] * a.in[1] * a.in[2];
    const T* xp = x + p * in_sp;
    int64_t sd = od * a.stride[0] - a.pb[0], sh = oh * a.stride[1] - a.pb[1],
            sw = ow * a.stride[2] - a.pb[2];
    int64_t dlo, dhi, hlo, hhi, wlo, whi;
    valid_range(sd, a.dil[0], a.k[0], a.in[0], &dlo, &dhi);
    valid_range(sh, a.dil[1], a.k[1], a.in[1], &hlo, &hhi);
    valid_range(sw, a.dil[2], a.k[2], a.in[2], &wlo, &whi);
    float best = -INFINITY, sum = 0.f;
    double lp = 0;
    int64_t best_i = -1;
    for (int64_t jd = dlo; jd < dhi; ++jd) {
      for (int64_t jh = hlo; jh < hhi; ++jh) {
        int64_t row = ((sd + jd * a.dil[0]) * a.in[1] + sh + jh * a.dil[1]) * a.in[2] + sw;
        for (int64_t jw = wlo; jw < whi; ++jw) {
          int64_t e = row + jw * a.dil[2];
          float v = DNum<T>::load(xp[e]);
          if constexpr (kOp == PoolOp::kMax) {
            // The first element wins until a strictly greater one: a leading NaN stays.
            if (v > best || best_i < 0) {
              best = v;
              best_i = e;
            }
          } else if constexpr (kOp == PoolOp::kAverage) {
            sum += v;
          } else {
            lp += pow(fabs(double(v)), a.p);
          }
        }
      }
    }
    if constexpr (kOp == PoolOp::kMax) {
      y[i] = DNum<T>::store(best);
      if (indices) indices[i] = best_i < 0 ? -1 : p * in_sp + best_i;
    } else if constexpr (kOp == PoolOp::kAverage) {
      int64_t count;
      if (a.include_pad) {
        // Window positions inside the padded input, not past the end padding ceil_mode adds.
        int64_t lo, hi;
        count = 1;
        valid_range(sd + a.pb[0], a.dil[0], a.k[0], a.in[0] + a.pb[0] + a.pe[0], &lo, &hi);
        count *= hi - lo;
        valid_range(sh + a.pb[1], a.dil[1], a.k[1], a.in[1] + a.pb[1] + a.pe[1], &lo, &hi);
        count *= hi - lo;
        valid_range(sw + a.pb[2], a.dil[2], a.k[2], a.in[2] + a.pb[2] + a.pe[2], &lo, &hi);
        count *= hi - lo;
      } else {
        count = (dhi - dlo) * (hhi - hlo) * (whi - wlo);
      }
      y[i] = DNum<T>::store(count > 0 ? sum / float(count) : 0.f);
    } else {
      y[i] = DNum<T>::store(float(pow(lp, 1.0 / a.p)));
    }
  }
}

// The 2-D window of kiln::Pool. pbh/pbw are the begin pads, peh/pew the end pads.
struct NhwcPoolArgs {
  int64_t ih, iw, oh, ow, kh, kw, sh, sw, dh, dw, pbh, pbw, peh, pew;
  bool include_pad;
};

// valid_range in the kernel's index type S.
template <typename S>
__device__ __forceinline__ void valid_range_s(S start, S step, S count, S limit, S* lo, S* hi) {
  S l = start >= 0 ? 0 : (-start + step - 1) / step;
  S h = start > limit - 1 ? 0 : (limit - 1 - start) / step + 1;
  l = l < count ? l : count;
  h = h < count ? h : count;
  *lo = l;
  *hi = h > l ? h : l;
}

// kiln::Pool over X [n, ih, iw, c] -> Y [n, oh, ow, c]: each thread computes kV adjacent channels
// of one output pixel, reading each window position with one load of kV * sizeof(T) bytes (16 on
// the vector path: 8 float16/bfloat16 or 4 float32 channels, where c % kV == 0 and both tensors
// are 16-byte aligned; kV = 1 otherwise). Adjacent threads take adjacent channel vectors, so a
// warp reads whole runs of channels. I is the flat index type and S the window's: uint32_t and int
// when every index fits (the common case; 32-bit divisions cost a fraction of 64-bit ones),
// int64_t otherwise. Max and the average's sum follow the CPU reference's window order and rules
// (the first element wins until a strictly greater one, so a leading NaN stays; sums in float,
// divided once), so results match it exactly.
template <bool kMax, typename T, int kV, typename I, typename S>
__global__ void nhwc_pool_kernel(const T* __restrict__ x, T* __restrict__ y, NhwcPoolArgs a, I c,
                                 I total) {
  static_assert(sizeof(T) * kV <= 16 && (kV & (kV - 1)) == 0, "one load of at most 16 bytes");
  struct alignas(sizeof(T) * kV) Pack {
    T v[kV];
  };
  const S ih = S(a.ih), iw = S(a.iw), oh = S(a.oh), ow = S(a.ow), kh = S(a.kh), kw = S(a.kw);
  const S sh = S(a.sh), sw = S(a.sw), dh = S(a.dh), dw = S(a.dw), pbh = S(a.pbh), pbw = S(a.pbw);
  const I groups = c / I(kV);
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I g = i % groups;
    I r = i / groups;
    const S ox = S(r % I(ow));
    r /= I(ow);
    const S oy = S(r % I(oh));
    const I b = r / I(oh);
    const S h0 = oy * sh - pbh, w0 = ox * sw - pbw;
    S hlo, hhi, wlo, whi;
    valid_range_s<S>(h0, dh, kh, ih, &hlo, &hhi);
    valid_range_s<S>(w0, dw, kw, iw, &wlo, &whi);
    const T* xb = x + b * I(ih) * I(iw) * c + g * I(kV);
    float acc[kV];
#pragma unroll
    for (int j = 0; j < kV; ++j) acc[j] = kMax ? -INFINITY : 0.f;
    bool first = true;
    for (S jh = hlo; jh < hhi; ++jh) {
      const T* row = xb + I(h0 + jh * dh) * I(iw) * c;
      for (S jw = wlo; jw < whi; ++jw) {
        const Pack p = *reinterpret_cast<const Pack*>(row + I(w0 + jw * dw) * c);
#pragma unroll
        for (int j = 0; j < kV; ++j) {
          const float v = DNum<T>::load(p.v[j]);
          if constexpr (kMax) {
            if (v > acc[j] || first) acc[j] = v;
          } else {
            acc[j] += v;
          }
        }
        first = false;
      }
    }
    Pack out;
    if constexpr (kMax) {
#pragma unroll
      for (int j = 0; j < kV; ++j) out.v[j] = DNum<T>::store(acc[j]);
    } else {
      S count;
      if (a.include_pad) {
        // Window positions inside the padded input, not past the end padding ceil_mode adds.
        S lo, hi;
        valid_range_s<S>(h0 + pbh, dh, kh, ih + pbh + S(a.peh), &lo, &hi);
        count = hi - lo;
        valid_range_s<S>(w0 + pbw, dw, kw, iw + pbw + S(a.pew), &lo, &hi);
        count *= hi - lo;
      } else {
        count = (hhi - hlo) * (whi - wlo);
      }
#pragma unroll
      for (int j = 0; j < kV; ++j) {
        out.v[j] = DNum<T>::store(count > 0 ? acc[j] / float(count) : 0.f);
      }
    }
    *reinterpret_cast<Pack*>(y + i * I(kV)) = out;
  }
}

// One block per plane: the mean (summed in double) or the maximum (NaN ignored, as the CPU's
// `v > best` scan) of `size` contiguous elements.
template <bool kMax, typename T>
__global__ void global_pool_kernel(const T* x, T* y, int64_t size) {
  __shared__ double shared[kBlock / 32];
  const T* xp = x + int64_t(blockIdx.x) * size;
  double acc = kMax ? -INFINITY : 0.0;
  for (int64_t j = threadIdx.x; j < size; j += blockDim.x) {
    double v = DNum<T>::load(xp[j]);
    if constexpr (kMax) {
      acc = v > acc ? v : acc;
    } else {
      acc += v;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    double other = __shfl_xor_sync(0xffffffffu, acc, o);
    acc = kMax ? (other > acc ? other : acc) : acc + other;
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) shared[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double r = shared[0];
    for (int w = 1; w < int(blockDim.x >> 5); ++w)
      r = kMax ? (shared[w] > r ? shared[w] : r) : r + shared[w];
    y[blockIdx.x] = DNum<T>::store(kMax ? float(r) : (size > 0 ? float(r / double(size)) : 0.f));
  }
}

// Attributes read once by the factory; empty lists mean the ONNX defaults.
struct PoolAttrs {
  std::vector<int64_t> kernel, strides, dilations, pads;
  AutoPad auto_pad = AutoPad::kNotSet;
  bool ceil_mode = false;
};

// The CPU reference's resolve_axes: pads from auto_pad, and the output size checked against
// the one the attributes give.
Status resolve_pool(const std::string& name, const PoolAttrs& attrs, int ns, const int64_t* in,
                    const int64_t* out, PoolArgs* a) {
  for (int j = 0; j < 3; ++j) {
    a->in[j] = a->out[j] = a->k[j] = a->stride[j] = a->dil[j] = 1;
    a->pb[j] = a->pe[j] = 0;
  }
  for (int i = 0; i < ns; ++i) {
    int j = 3 - ns + i;
    int64_t d = in[i], k = attrs.kernel[i];
    int64_t s = attrs.strides.empty() ? 1 : attrs.strides[i];
    int64_t dl = attrs.dilations.empty() ? 1 : attrs.dilations[i];
    int64_t eff = dl * (k - 1) + 1, pb = 0, pe = 0, expect;
    if (attrs.auto_pad == AutoPad::kSameUpper || attrs.auto_pad == AutoPad::kSameLower) {
      expect = (d + s - 1) / s;
      int64_t total = std::max<int64_t>(0, (expect - 1) * s + eff - d);
      pb = attrs.auto_pad == AutoPad::kSameUpper ? total / 2 : total - total / 2;
      pe = total - pb;
    } else {
      if (attrs.auto_pad == AutoPad::kNotSet && !attrs.pads.empty())
        pb = attrs.pads[i], pe = attrs.pads[ns + i];
      int64_t num = d + pb + pe - eff;
      if (num < 0) {
        expect = 0;
      } else if (attrs.ceil_mode) {
        expect = (num + s - 1) / s + 1;
        if ((expect - 1) * s >= d + pb) --expect;
      } else {
        expect = num / s + 1;
      }
    }
    if (expect != out[i]) {
      return invalid_argument(name + ": output spatial dim " + std::to_string(i) + " is " +
                              std::to_string(out[i]) + " but the input and attributes give " +
                              std::to_string(expect));
    }
    a->in[j] = d, a->out[j] = out[i], a->k[j] = k, a->stride[j] = s, a->dil[j] = dl, a->pb[j] = pb,
    a->pe[j] = pe;
  }
  return ok_status();
}

class PoolKernel final : public CudaKernel {
 public:
  PoolKernel(std::string name, PoolOp op, PoolAttrs attrs, bool include_pad, double p)
      : CudaKernel(std::move(name)),
        op_(op),
        attrs_(std::move(attrs)),
        include_pad_(include_pad),
        p_(p) {}

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &y = out[0];
    int ns = x.rank() - 2;
    if (ns < 1 || ns > 3 || y.rank() != x.rank() || y.shape[0] != x.shape[0] ||
        y.shape[1] != x.shape[1]) {
      return invalid_argument(name_ + ": X " + shape_to_string(x.shape) + " -> Y " +
                              shape_to_string(y.shape) + " is not a 1-D, 2-D or 3-D pool");
    }
    PoolArgs a{};
    KILN_RETURN_IF_ERROR(
        resolve_pool(name_, attrs_, ns, x.shape.data() + 2, y.shape.data() + 2, &a));
    a.planes = x.shape[0] * x.shape[1];
    a.include_pad = include_pad_;
    a.p = p_;
    int64_t n = y.numel();
    if (n == 0) return ok_status();
    int64_t* indices = out.size() > 1 && present(out[1]) ? out[1].as<int64_t>() : nullptr;
    if (y.dtype != x.dtype) return invalid_argument(name_ + ": Y's dtype differs from X's");
    if (ns <= 2 && (op_ == PoolOp::kAverage || (op_ == PoolOp::kMax && !indices))) {
      // resolve_pool puts the spatial axes last of its three.
      const Pool2dWindow w{.planes = a.planes,
                           .ih = a.in[1],
                           .iw = a.in[2],
                           .oh = a.out[1],
                           .ow = a.out[2],
                           .kh = a.k[1],
                           .kw = a.k[2],
                           .sh = a.stride[1],
                           .sw = a.stride[2],
                           .dh = a.dil[1],
                           .dw = a.dil[2],
                           .ph = a.pb[1],
                           .pw = a.pb[2],
                           .peh = a.pe[1],
                           .pew = a.pe[2],
                           .include_pad = include_pad_};
      if (pool2d_nchw(op_ == PoolOp::kMax, x.dtype, x.data, y.data, w, stream_)) {
        return launch_status("pool2d_nchw_kernel");
      }
    }
    bool known = visit_dtype<kPoolTypes>(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* px = x.as<const T>();
      T* py = y.as<T>();
      switch (op_) {
        case PoolOp::kMax:
          pool_kernel<PoolOp::kMax, T><<<grid_for(n), kBlock, 0, stream_>>>(px, py, indices, a, n);
          break;
        case PoolOp::kAverage:
          pool_kernel<PoolOp::kAverage, T>
              <<<grid_for(n), kBlock, 0, stream_>>>(px, py, nullptr, a, n);
          break;
        case PoolOp::kLp:
          pool_kernel<PoolOp::kLp, T><<<grid_for(n), kBlock, 0, stream_>>>(px, py, nullptr, a, n);
          break;
      }
    });
    if (!known) return unsupported(name_ + ": dtype " + std::string(dtype_name(x.dtype)));
    return launch_status("pool_kernel");
  }

 private:
  PoolOp op_;
  PoolAttrs attrs_;
  bool include_pad_;
  double p_;
};

// kiln::Pool: MaxPool or AveragePool of a channels-last 2-D X [N, H, W, C].
class NhwcPoolKernel final : public CudaKernel {
 public:
  NhwcPoolKernel(std::string name, bool is_max, PoolAttrs attrs, bool include_pad)
      : CudaKernel(std::move(name)),
        max_(is_max),
        attrs_(std::move(attrs)),
        include_pad_(include_pad) {}

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &y = out[0];
    if (x.rank() != 4 || y.rank() != 4 || y.shape[0] != x.shape[0] || y.shape[3] != x.shape[3]) {
      return invalid_argument(name_ + ": X " + shape_to_string(x.shape) + " -> Y " +
                              shape_to_string(y.shape) + " is not an NHWC 2-D pool");
    }
    if (y.dtype != x.dtype) return invalid_argument(name_ + ": Y's dtype differs from X's");
    const int64_t in_hw[2] = {x.shape[1], x.shape[2]}, out_hw[2] = {y.shape[1], y.shape[2]};
    PoolArgs p{};
    KILN_RETURN_IF_ERROR(resolve_pool(name_, attrs_, 2, in_hw, out_hw, &p));
    if (y.numel() == 0) return ok_status();
    // resolve_pool puts the two spatial axes last of its three.
    const NhwcPoolArgs a{.ih = p.in[1],
                         .iw = p.in[2],
                         .oh = p.out[1],
                         .ow = p.out[2],
                         .kh = p.k[1],
                         .kw = p.k[2],
                         .sh = p.stride[1],
                         .sw = p.stride[2],
                         .dh = p.dil[1],
                         .dw = p.dil[2],
                         .pbh = p.pb[1],
                         .pbw = p.pb[2],
                         .peh = p.pe[1],
                         .pew = p.pe[2],
                         .include_pad = include_pad_};
    // 32-bit indices when every flat index and window coordinate fits: sums of the window terms
    // stay below 2^31 when each is below 2^28.
    bool small = x.numel() < INT32_MAX && y.numel() < INT32_MAX;
    for (int64_t v : {a.ih, a.iw, a.oh, a.ow, a.kh * a.dh, a.sh, a.sw, a.kw * a.dw, a.pbh, a.pbw,
                      a.peh, a.pew}) {
      small = small && v < (int64_t(1) << 28);
    }
    const int64_t c = x.shape[3];
    const bool aligned = aligned16(x.data) && aligned16(y.data);
    bool known = visit_dtype<kPoolTypes>(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      constexpr int kVec = int(16 / sizeof(T));
      if (aligned && c % kVec == 0) {
        launch<T, kVec>(x.as<const T>(), y.as<T>(), a, c, y.numel() / kVec, small);
      } else {
        launch<T, 1>(x.as<const T>(), y.as<T>(), a, c, y.numel(), small);
      }
    });
    if (!known) return unsupported(name_ + ": dtype " + std::string(dtype_name(x.dtype)));
    return launch_status("nhwc_pool_kernel");
  }

 private:
  template <typename T, int kV>
  void launch(const T* x, T* y, const NhwcPoolArgs& a, int64_t c, int64_t threads, bool small) {
    const unsigned grid = grid_for(threads);
    if (small && max_) {
      nhwc_pool_kernel<true, T, kV, uint32_t, int>
          <<<grid, kBlock, 0, stream_>>>(x, y, a, uint32_t(c), uint32_t(threads));
    } else if (small) {
      nhwc_pool_kernel<false, T, kV, uint32_t, int>
          <<<grid, kBlock, 0, stream_>>>(x, y, a, uint32_t(c), uint32_t(threads));
    } else if (max_) {
      nhwc_pool_kernel<true, T, kV, int64_t, int64_t>
          <<<grid, kBlock, 0, stream_>>>(x, y, a, c, threads);
    } else {
      nhwc_pool_kernel<false, T, kV, int64_t, int64_t>
          <<<grid, kBlock, 0, stream_>>>(x, y, a, c, threads);
    }
  }

  bool max_;
  PoolAttrs attrs_;
  bool include_pad_;
};

class GlobalPoolKernel final : public CudaKernel {
 public:
  GlobalPoolKernel(std::string name, bool is_max) : CudaKernel(std::move(name)), max_(is_max) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& x = in[0];
    int64_t planes = x.rank() < 2 ? 0 : x.shape[0] * x.shape[1];
    if (x.rank() < 3 || out[0].numel() != planes) {
      return invalid_argument(name_ + ": X " + shape_to_string(x.shape) + " -> Y " +
                              shape_to_string(out[0].shape) + " is inconsistent");
    }
    if (planes == 0) return ok_status();
    if (planes > INT32_MAX) return invalid_argument(name_ + ": more than 2^31 planes");
    int64_t size = x.numel() / planes;
    if (out[0].dtype != x.dtype) return invalid_argument(name_ + ": Y's dtype differs from X's");
    bool known = visit_dtype<kPoolTypes>(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (max_) {
        global_pool_kernel<true, T>
            <<<unsigned(planes), kBlock, 0, stream_>>>(x.as<const T>(), out[0].as<T>(), size);
      } else {
        global_pool_kernel<false, T>
            <<<unsigned(planes), kBlock, 0, stream_>>>(x.as<const T>(), out[0].as<T>(), size);
      }
    });
    if (!known) return unsupported(name_ + ": dtype " + std::string(dtype_name(x.dtype)));
    return launch_status("global_pool_kernel");
  }

 private:
  bool max_;
};

// X and Y of one type among kPoolTypes (the CUDA pools do not run float64), or why not.
Status check_pool_dtypes(const KernelQuery& q) {
  DType t = q.input_dtype(0);
  if ((dtype_bit(t) & kPoolTypes) == 0) {
    return unsupported(q.node.describe() +
                       ": the CUDA pools take float32, float16 or bfloat16 X, not " +
                       std::string(dtype_name(t)));
  }
  if (q.output_dtype(0) != t) {
    return unsupported(q.node.describe() + ": Y is " + std::string(dtype_name(q.output_dtype(0))) +
                       " while X is " + std::string(dtype_name(t)));
  }
  return ok_status();
}

// The spatial rank of X (1..3) known at build time, or why the node cannot run.
StatusOr<int> pool_spatial_rank(const KernelQuery& q) {
  if (q.inputs.empty() || !q.inputs[0] || !q.inputs[0]->shape) {
    return unsupported(q.node.describe() + ": X has no known rank");
  }
  int ns = int(q.inputs[0]->shape->size()) - 2;
  if (ns < 1 || ns > 3) {
    return unsupported(q.node.describe() +
                       ": the CUDA backend pools 1-D, 2-D and 3-D inputs, not rank " +
                       std::to_string(ns + 2));
  }
  return ns;
}

StatusOr<std::unique_ptr<Kernel>> make_pool(const KernelQuery& q) {
  const ir::Attributes& at = q.node.attrs;
  OpKind kind = ops::find_op(q.node.domain, q.node.op_type);
  PoolOp op = kind == OpKind::kMaxPool       ? PoolOp::kMax
              : kind == OpKind::kAveragePool ? PoolOp::kAverage
                                             : PoolOp::kLp;
  const bool nhwc = kind == OpKind::kPool;
  if (nhwc) {
    KILN_ASSIGN_OR_RETURN(std::string mode, at.get_string("mode", ""));
    KILN_ASSIGN_OR_RETURN(std::string layout, at.get_string("layout", "NHWC"));
    if ((mode != "max" && mode != "average") || layout != "NHWC") {
      return invalid_argument(q.node.describe() + ": mode '" + mode + "' with layout '" + layout +
                              "' is not a max or average pool in NHWC");
    }
    op = mode == "max" ? PoolOp::kMax : PoolOp::kAverage;
  }
  KILN_RETURN_IF_ERROR(check_pool_dtypes(q));
  KILN_ASSIGN_OR_RETURN(int ns, pool_spatial_rank(q));
  if (nhwc && ns != 2) {
    return unsupported(q.node.describe() + ": layout NHWC is for 2-D pools, X has rank " +
                       std::to_string(ns + 2));
  }
  PoolAttrs s;
  KILN_ASSIGN_OR_RETURN(s.kernel, at.get_ints("kernel_shape", std::nullopt));
  KILN_ASSIGN_OR_RETURN(s.strides, at.get_ints("strides", std::vector<int64_t>{}));
  KILN_ASSIGN_OR_RETURN(s.dilations, at.get_ints("dilations", std::vector<int64_t>{}));
  KILN_ASSIGN_OR_RETURN(s.pads, at.get_ints("pads", std::vector<int64_t>{}));
  KILN_ASSIGN_OR_RETURN(int64_t ceil_mode, at.get_int("ceil_mode", 0));
  KILN_ASSIGN_OR_RETURN(std::string auto_pad, at.get_string("auto_pad", "NOTSET"));
  s.ceil_mode = ceil_mode != 0;
  if (auto_pad == "NOTSET")
    s.auto_pad = AutoPad::kNotSet;
  else if (auto_pad == "SAME_UPPER")
    s.auto_pad = AutoPad::kSameUpper;
  else if (auto_pad == "SAME_LOWER")
    s.auto_pad = AutoPad::kSameLower;
  else if (auto_pad == "VALID")
    s.auto_pad = AutoPad::kValid;
  else
    return invalid_argument(q.node.describe() + ": unknown auto_pad '" + auto_pad + "'");
  auto bad = [&](const std::string& what) {
    return invalid_argument(q.node.describe() + ": " + what);
  };
  if (int(s.kernel.size()) != ns)
    return bad("kernel_shape must have " + std::to_string(ns) + " values");
  if (!s.strides.empty() && int(s.strides.size()) != ns)
    return bad("strides must have " + std::to_string(ns) + " values");
  if (!s.dilations.empty() && int(s.dilations.size()) != ns)
    return bad("dilations must have " + std::to_string(ns) + " values");
  if (!s.pads.empty() && int(s.pads.size()) != 2 * ns)
    return bad("pads must have " + std::to_string(2 * ns) + " values");
  for (int64_t v : s.kernel)
    if (v < 1) return bad("kernel_shape values must be >= 1");
  for (int64_t v : s.strides)
    if (v < 1) return bad("strides must be >= 1");
  for (int64_t v : s.dilations)
    if (v < 1) return bad("dilations must be >= 1");
  for (int64_t v : s.pads)
    if (v < 0) return bad("pads must be >= 0");
  bool include_pad = false;
  double p = 2;
  if (op == PoolOp::kMax && !nhwc) {  // kiln::Pool has no Indices output
    KILN_ASSIGN_OR_RETURN(int64_t storage_order, at.get_int("storage_order", 0));
    bool indices = q.outputs.size() > 1 && q.outputs[1];
    if (indices && storage_order != 0) {
      return unsupported(q.node.describe() +
                         ": Indices with storage_order=1 (column-major) are not supported");
    }
    if (indices && q.outputs[1]->dtype != DType::kInt64) return bad("Indices must be int64");
  } else if (op == PoolOp::kAverage) {
    KILN_ASSIGN_OR_RETURN(int64_t cip, at.get_int("count_include_pad", 0));
    include_pad = cip != 0;
  } else if (op == PoolOp::kLp) {
    KILN_ASSIGN_OR_RETURN(int64_t pv, at.get_int("p", 2));
    if (pv < 1) return bad("p must be >= 1");
    p = double(pv);
  }
  if (nhwc) {
    return std::unique_ptr<Kernel>(
        new NhwcPoolKernel("cuda.Pool", op == PoolOp::kMax, std::move(s), include_pad));
  }
  return std::unique_ptr<Kernel>(
      new PoolKernel("cuda." + q.node.op_type, op, std::move(s), include_pad, p));
}

StatusOr<std::unique_ptr<Kernel>> make_global_pool(const KernelQuery& q) {
  if (q.inputs.empty() || !q.inputs[0] || !q.inputs[0]->shape || q.inputs[0]->shape->size() < 3) {
    return unsupported(q.node.describe() + ": the CUDA global pools need X of known rank >= 3");
  }
  KILN_RETURN_IF_ERROR(check_pool_dtypes(q));
  bool is_max = ops::find_op(q.node.domain, q.node.op_type) == OpKind::kGlobalMaxPool;
  return std::unique_ptr<Kernel>(new GlobalPoolKernel("cuda." + q.node.op_type, is_max));
}

}  // namespace

void register_pool(Registry& r) {
  for (OpKind k : {OpKind::kMaxPool, OpKind::kAveragePool, OpKind::kLpPool, OpKind::kPool}) {
    r.add(k, &make_pool);
  }
  r.add(OpKind::kGlobalAveragePool, &make_global_pool);
  r.add(OpKind::kGlobalMaxPool, &make_global_pool);
}

}  // namespace kiln::backends::cuda
