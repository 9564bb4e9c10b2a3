// kiln::SqueezeExcite on CUDA: one block per image computes the channel means of X (NCHW: a warp
// per channel; NHWC: threads across channels, rows of H*W split among them), then
// act1(W1 . mean + B1) with a warp per hidden unit and act2(W2 . hidden + B2) with a warp per
// channel, in float, the means and hidden units in shared memory; each gate is rounded once.
// Where this kernel replaces a pool, two cuDNN convolutions on 1x1 images and an epilogue pass, a
// squeeze-and-excitation block costs one launch.
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/activation.cuh"
#include "backends/cuda/conv_attrs.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

constexpr int kBlock = 512;
constexpr unsigned kSeTypes = kTF32 | kTF16 | kTBF16;

struct SeActs {
  ConvActivation a1 = ConvActivation::kNone, a2 = ConvActivation::kNone;
  float p10 = 0, p11 = 0, p20 = 0, p21 = 0;
};

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__global__ void se_gate_kernel(const T* __restrict__ x, const T* __restrict__ w1,
                               const T* __restrict__ b1, const T* __restrict__ w2,
                               const T* __restrict__ b2, T* __restrict__ g, int c, int cs,
                               int64_t hw, bool nhwc, SeActs acts) {
  using N = DNum<T>;
  extern __shared__ float smem[];
  float* sums = smem;        // [c]
  float* hidden = smem + c;  // [cs]
  const int64_t image = blockIdx.x;
  const T* xb = x + image * int64_t(c) * hw;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int i = threadIdx.x; i < c; i += blockDim.x) sums[i] = 0.f;
  __syncthreads();
  if (nhwc) {
    // Consecutive threads read consecutive channels of one pixel; `rows` pixels at a time.
    const int lanes = c < int(blockDim.x) ? c : int(blockDim.x);
    const int rows = int(blockDim.x) / lanes;
    const int col = int(threadIdx.x) % lanes, row = int(threadIdx.x) / lanes;
    if (row < rows) {
      for (int ch = col; ch < c; ch += lanes) {
        float s = 0.f;
        for (int64_t p = row; p < hw; p += rows) s += N::load(xb[p * c + ch]);
        atomicAdd(&sums[ch], s);
      }
    }
  } else {
    for (int ch = warp; ch < c; ch += warps) {
      float s = 0.f;
      for (int64_t p = lane; p < hw; p += 32) s += N::load(xb[int64_t(ch) * hw + p]);
      s = warp_sum(s);
      if (lane == 0) sums[ch] = s;
    }
  }
  __syncthreads();
  const float inv = hw > 0 ? 1.f / float(hw) : 0.f;
  for (int j = warp; j < cs; j += warps) {
    float acc = 0.f;
    for (int k = lane; k < c; k += 32) acc += N::load(w1[int64_t(j) * c + k]) * sums[k];
    acc = warp_sum(acc);
    if (lane == 0) hidden[j] = activate(acts.a1, acts.p10, acts.p11, acc * inv + N::load(b1[j]));
  }
  __syncthreads();
  for (int ch = warp; ch < c; ch += warps) {
    float acc = 0.f;
    for (int k = lane; k < cs; k += 32) acc += N::load(w2[int64_t(ch) * cs + k]) * hidden[k];
    acc = warp_sum(acc);
    if (lane == 0) {
      g[image * c + ch] = N::store(activate(acts.a2, acts.p20, acts.p21, acc + N::load(b2[ch])));
    }
  }
}

class SqueezeExciteKernel final : public CudaKernel {
 public:
  SqueezeExciteKernel(bool nhwc, SeActs acts)
      : CudaKernel("cuda.SqueezeExcite"), nhwc_(nhwc), acts_(acts) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    if (in.size() != 5 || out.size() != 1 || in[0].rank() != 4) {
      return invalid_argument(name_ + ": needs X of rank 4, W1, B1, W2, B2 and one output");
    }
    const TensorView& x = in[0];
    const int64_t n = x.shape[0], c = nhwc_ ? x.shape[3] : x.shape[1];
    const int64_t hw = nhwc_ ? x.shape[1] * x.shape[2] : x.shape[2] * x.shape[3];
    const int64_t cs = in[2].numel();
    if (in[1].numel() != cs * c || in[3].numel() != c * cs || in[4].numel() != c ||
        out[0].numel() != n * c) {
      return invalid_argument(name_ + ": the operands' sizes disagree with X " +
                              shape_to_string(x.shape));
    }
    for (const TensorView& v : in) {
      if (v.dtype != x.dtype) {
        return invalid_argument(name_ + ": every operand must have X's dtype");
      }
    }
    if (out[0].dtype != x.dtype) return invalid_argument(name_ + ": G must have X's dtype");
    if (n == 0) return ok_status();
    const size_t shared = size_t(c + cs) * sizeof(float);
    if (n > INT32_MAX || shared > kMaxShared) {
      return unsupported(name_ + ": " + std::to_string(c) + " channels and " + std::to_string(cs) +
                         " hidden units need more shared memory than a block has");
    }
    bool known = visit_dtype<kSeTypes>(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      se_gate_kernel<T><<<unsigned(n), kBlock, shared, stream_>>>(
          in[0].as<const T>(), in[1].as<const T>(), in[2].as<const T>(), in[3].as<const T>(),
          in[4].as<const T>(), out[0].as<T>(), int(c), int(cs), hw, nhwc_, acts_);
    });
    if (!known) return unsupported(name_ + ": dtype " + std::string(dtype_name(x.dtype)));
    return launch_status("se_gate_kernel");
  }

 private:
  static constexpr size_t kMaxShared = 48 * 1024;  // without opting in to more per block
  bool nhwc_;
  SeActs acts_;
};

StatusOr<std::unique_ptr<Kernel>> make_squeeze_excite(const KernelQuery& q) {
  const ir::Attributes& at = q.node.attrs;
  const std::string who = q.node.describe();
  if ((dtype_bit(q.input_dtype(0)) & kSeTypes) == 0) {
    return unsupported(who + ": cuda.SqueezeExcite takes float32, float16 or bfloat16, not " +
                       std::string(dtype_name(q.input_dtype(0))));
  }
  KILN_ASSIGN_OR_RETURN(std::string layout, at.get_string("layout", "NCHW"));
  if (layout != "NCHW" && layout != "NHWC") {
    return invalid_argument(who + ": layout '" + layout + "'");
  }
  SeActs acts;
  KILN_ASSIGN_OR_RETURN(std::string a1, at.get_string("activation1", "none"));
  KILN_ASSIGN_OR_RETURN(std::string a2, at.get_string("activation2", "none"));
  KILN_ASSIGN_OR_RETURN(acts.a1, parse_activation(who, a1));
  KILN_ASSIGN_OR_RETURN(acts.a2, parse_activation(who, a2));
  KILN_ASSIGN_OR_RETURN(std::vector<float> p1,
                        at.get_floats("activation1_params", std::vector<float>{}));
  KILN_ASSIGN_OR_RETURN(std::vector<float> p2,
                        at.get_floats("activation2_params", std::vector<float>{}));
  p1.resize(2, 0.f);
  p2.resize(2, 0.f);
  acts.p10 = p1[0], acts.p11 = p1[1], acts.p20 = p2[0], acts.p21 = p2[1];
  return std::unique_ptr<Kernel>(new SqueezeExciteKernel(layout == "NHWC", acts));
}

}  // namespace

void register_squeeze_excite(Registry& r) {
  r.add(ops::OpKind::kSqueezeExcite, &make_squeeze_excite);
}

}  // namespace kiln::backends::cuda
