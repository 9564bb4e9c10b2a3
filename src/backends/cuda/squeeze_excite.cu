// kiln::SqueezeExcite on CUDA, spread over the grid whatever the batch:
//  - few images (up to kFewImages): two launches. se_hidden_kernel, blocks (image, hidden chunk):
//    each block takes its image's channel sums itself (16-byte loads across channels for
//    channels-last float16/bfloat16 with C % 8 == 0; a warp per channel for NCHW), then a warp
//    per hidden unit of its chunk computes act1(W1 . mean + B1) into the workspace, in float.
//    At batch 1 each of up to Cs/16 blocks re-reads the image from L2 (a few hundred KB): cheaper
//    than a third launch.
//  - more images: three. se_pool_kernel takes every image's sums once into the workspace; then
//    se_hidden_kernel with blocks of kGroup images, so that each W1 row a warp loads serves all
//    of them (the product is a small GEMM there, and reading W1 once per image was what made the
//    first version slow at batch 64).
//  - se_gate_kernel, blocks (image group, channel chunk): the group's hidden units into shared
//    memory, a warp per channel of the chunk computes act2(W2 . hidden + B2), rounded once.
// Chunks are sized so that about two blocks per SM run. Where this replaces a pool, two cuBLASLt
// GEMMs on 1x1 images and an epilogue pass, a gate costs two or three launches instead of four.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/activation.cuh"
#include "backends/cuda/conv_attrs.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

constexpr int kHiddenBlock = 512;  // threads of se_hidden_kernel: 16 warps, 16 hidden units a round
constexpr int kGateBlock = 256;    // threads of se_gate_kernel and se_pool_kernel: 8 warps
constexpr int kGroup = 8;          // images a block of the three-launch form serves
constexpr int64_t kFewImages = 4;  // up to this many images: the two-launch form
constexpr unsigned kSeTypes = kTF32 | kTF16 | kTBF16;

struct SeActs {
  ConvActivation a1 = ConvActivation::kNone, a2 = ConvActivation::kNone;
  float p10 = 0, p11 = 0, p20 = 0, p21 = 0;
};

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The channel sums of one image, columns [col0, col1) of its channels, into sums[col - col0]
// (shared, zeroed here). All threads of the block take part.
template <typename T>
__device__ void channel_sums(const T* __restrict__ xb, int c, int col0, int col1, int64_t hw,
                             bool nhwc, bool vec, float* sums) {
  using N = DNum<T>;
  const int width = col1 - col0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int i = threadIdx.x; i < width; i += blockDim.x) sums[i] = 0.f;
  __syncthreads();
  if (nhwc) {
    // A thread holds one column: 8 channels (one 16-byte load) where `vec`, else one; and walks
    // pixels `rows` apart. With 32 columns or fewer, a power-of-two number of lanes per row
    // (the extra lanes idle) lets a warp add its rows with shuffles before the one shared-memory
    // atomic per column and warp (hundreds of rows adding to one address serialize).
    const int per = vec ? 8 : 1;
    const int cols = width / per, stride = vec ? c / 8 : c;
    int lanes = 1;
    while (lanes < cols && lanes < 32) lanes <<= 1;
    if (cols > 32) lanes = cols < int(blockDim.x) ? cols : int(blockDim.x);
    const int rows = int(blockDim.x) / lanes;
    const int col = int(threadIdx.x) % lanes, row = int(threadIdx.x) / lanes;
    if (row < rows) {
      // With 32 columns or fewer every thread runs the body once (its shuffles need the whole
      // warp); else each thread takes columns col, col + lanes, ...
      const int rounds = cols <= 32 ? 1 : (cols - col + lanes - 1) / lanes;
      for (int r = 0, v = col; r < rounds; ++r, v += lanes) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (v < cols) {
          if (vec) {
            const uint4* p = reinterpret_cast<const uint4*>(xb + col0) + v;
#pragma unroll 4
            for (int64_t px = row; px < hw; px += rows) {
              const uint4 raw = __ldg(p + px * stride);
              const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
              for (int k = 0; k < 8; ++k) acc[k] += N::load(e[k]);
            }
          } else {
#pragma unroll 4
            for (int64_t px = row; px < hw; px += rows)
              acc[0] += N::load(xb[px * stride + col0 + v]);
          }
        }
        if (cols <= 32) {  // every lane of the warp is here: the loop runs once for all
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            for (int o = lanes; o < 32; o <<= 1) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], o);
          }
          if (lane >= lanes || v >= cols) continue;
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          if (k < per) atomicAdd(&sums[v * per + k], acc[k]);
        }
      }
    }
  } else {
    for (int ch = warp; ch < width; ch += warps) {
      float acc = 0.f;
      for (int64_t px = lane; px < hw; px += 32) acc += N::load(xb[int64_t(col0 + ch) * hw + px]);
      acc = warp_sum(acc);
      if (lane == 0) sums[ch] = acc;
    }
  }
  __syncthreads();
}

// Grid (images, column chunks of `per` channels): sums[image, ch] over the image's pixels.
template <typename T>
__global__ void __launch_bounds__(kGateBlock)
    se_pool_kernel(const T* __restrict__ x, float* __restrict__ sums, int c, int per, int64_t hw,
                   bool nhwc, bool vec) {
  extern __shared__ float part[];  // [per]
  const int64_t image = blockIdx.x;
  const int col0 = int(blockIdx.y) * per, col1 = min(c, col0 + per);
  channel_sums(x + image * int64_t(c) * hw, c, col0, col1, hw, nhwc, vec, part);
  for (int i = threadIdx.x; i < col1 - col0; i += blockDim.x) sums[image * c + col0 + i] = part[i];
}

// dot(row[0, len), v[0, len)) over a warp: 16-byte loads of the row where `vec` (len % 8 == 0,
// 16-bit elements, the row aligned), else one element a lane.
template <typename T>
__device__ __forceinline__ void warp_dots(const T* __restrict__ row, const float* v, int len,
                                          int ld, int images, bool vec, float* acc) {
  using N = DNum<T>;
  const int lane = threadIdx.x & 31;
  if (vec) {
    for (int k = lane * 8; k < len; k += 256) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(row + k));
      const T* e = reinterpret_cast<const T*>(&raw);
      float w[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) w[q] = N::load(e[q]);
#pragma unroll
      for (int i = 0; i < kGroup; ++i) {
        if (i < images) {
#pragma unroll
          for (int q = 0; q < 8; ++q) acc[i] += w[q] * v[i * ld + k + q];
        }
      }
    }
  } else {
    for (int k = lane; k < len; k += 32) {
      const float w = N::load(row[k]);
#pragma unroll
      for (int i = 0; i < kGroup; ++i) {
        if (i < images) acc[i] += w * v[i * ld + k];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kGroup; ++i) acc[i] = warp_sum(acc[i]);
}

// Grid (image groups of `group`, hidden chunks of `per`): hidden[image, j] = act1(W1[j] . mean +
// B1[j]). With `pool` the block takes its (single) image's sums itself; else it reads them.
template <typename T>
__global__ void __launch_bounds__(kHiddenBlock)
    se_hidden_kernel(const T* __restrict__ x, const float* __restrict__ sums_in,
                     const T* __restrict__ w1, const T* __restrict__ b1, float* __restrict__ hidden,
                     int64_t n, int c, int cs, int group, int per, int64_t hw, bool nhwc, bool pool,
                     bool xvec, bool wvec, SeActs acts) {
  using N = DNum<T>;
  extern __shared__ float sums[];  // [group][c]
  const int64_t image0 = int64_t(blockIdx.x) * group;
  const int images = n - image0 < group ? int(n - image0) : group;
  if (pool) {
    channel_sums(x + image0 * int64_t(c) * hw, c, 0, c, hw, nhwc, xvec, sums);
  } else {
    for (int i = threadIdx.x; i < images * c; i += blockDim.x) sums[i] = sums_in[image0 * c + i];
    __syncthreads();
  }
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const float inv = hw > 0 ? 1.f / float(hw) : 0.f;
  const int j0 = int(blockIdx.y) * per, j1 = min(cs, j0 + per);
  for (int j = j0 + warp; j < j1; j += warps) {
    float acc[kGroup] = {};
    warp_dots(w1 + int64_t(j) * c, sums, c, c, images, wvec, acc);
    if ((threadIdx.x & 31) == 0) {
      const float b = N::load(b1[j]);
#pragma unroll
      for (int i = 0; i < kGroup; ++i) {
        if (i < images)
          hidden[(image0 + i) * cs + j] = activate(acts.a1, acts.p10, acts.p11, acc[i] * inv + b);
      }
    }
  }
}

// Grid (image groups of `group`, channel chunks of `per`): g[image, ch] = act2(W2[ch] . hidden +
// B2[ch]).
template <typename T>
__global__ void __launch_bounds__(kGateBlock)
    se_gate_kernel(const float* __restrict__ hidden, const T* __restrict__ w2,
                   const T* __restrict__ b2, T* __restrict__ g, int64_t n, int c, int cs, int group,
                   int per, bool wvec, SeActs acts) {
  using N = DNum<T>;
  extern __shared__ float h[];  // [group][cs]
  const int64_t image0 = int64_t(blockIdx.x) * group;
  const int images = n - image0 < group ? int(n - image0) : group;
  for (int i = threadIdx.x; i < images * cs; i += blockDim.x) h[i] = hidden[image0 * cs + i];
  __syncthreads();
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int c0 = int(blockIdx.y) * per, c1 = min(c, c0 + per);
  for (int ch = c0 + warp; ch < c1; ch += warps) {
    float acc[kGroup] = {};
    warp_dots(w2 + int64_t(ch) * cs, h, cs, cs, images, wvec, acc);
    if ((threadIdx.x & 31) == 0) {
      const float b = N::load(b2[ch]);
#pragma unroll
      for (int i = 0; i < kGroup; ++i) {
        if (i < images)
          g[(image0 + i) * c + ch] = N::store(activate(acts.a2, acts.p20, acts.p21, acc[i] + b));
      }
    }
  }
}

// Chunks of `units` so that chunks * blocks is about two blocks per SM (`step` units per round).
int chunk_size(int64_t units, int64_t blocks, int step, int sms) {
  const int64_t want = std::max<int64_t>(1, (2 * int64_t(sms) + blocks - 1) / blocks);
  const int64_t max_chunks = std::max<int64_t>(1, (units + step - 1) / step);
  const int64_t chunks = std::min(want, max_chunks);
  return int(std::max<int64_t>(1, (units + chunks - 1) / chunks));
}

class SqueezeExciteKernel final : public CudaKernel {
 public:
  SqueezeExciteKernel(bool nhwc, SeActs acts)
      : CudaKernel("cuda.SqueezeExcite"), nhwc_(nhwc), acts_(acts) {
    int dev = 0;
    if (cudaGetDevice(&dev) == cudaSuccess)
      cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev);
    if (sms_ <= 0) sms_ = 1;
  }
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
    const bool few = n <= kFewImages;
    const int group = few ? 1 : kGroup;
    if (n > INT32_MAX || size_t(group) * size_t(std::max(c, cs)) * sizeof(float) > kMaxShared) {
      return unsupported(name_ + ": " + std::to_string(c) + " channels and " + std::to_string(cs) +
                         " hidden units need more shared memory than a block has");
    }
    const size_t hidden_bytes = workspace_piece(size_t(n * cs) * sizeof(float));
    const size_t sums_bytes = few ? 0 : workspace_piece(size_t(n * c) * sizeof(float));
    KILN_RETURN_IF_ERROR(check_workspace(hidden_bytes + sums_bytes, name_));
    float* hidden = static_cast<float*>(workspace_);
    float* sums =
        few ? nullptr : reinterpret_cast<float*>(static_cast<char*>(workspace_) + hidden_bytes);
    const bool half = dtype_size(x.dtype) == 2;
    const bool xvec = half && c % 8 == 0 && aligned16(x.data);
    const bool w1vec = half && c % 8 == 0 && aligned16(in[1].data);
    const bool w2vec = half && cs % 8 == 0 && aligned16(in[3].data);
    const int64_t groups = (n + group - 1) / group;
    const int per_hidden = chunk_size(cs, groups, kHiddenBlock / 32, sms_);
    const int per_gate = chunk_size(c, groups, kGateBlock / 32, sms_);
    const dim3 g1(unsigned(groups), unsigned((cs + per_hidden - 1) / per_hidden));
    const dim3 g2(unsigned(groups), unsigned((c + per_gate - 1) / per_gate));
    // The pool of the three-launch form: column chunks of whole 16-byte vectors (or warps of
    // NCHW channels), about two blocks per SM.
    const int per_pool = xvec ? 8 * chunk_size(c / 8, n, 1, sms_)
                              : chunk_size(c, n, nhwc_ ? 1 : kGateBlock / 32, sms_);
    const dim3 g0(unsigned(n), unsigned((c + per_pool - 1) / per_pool));
    bool known = visit_dtype<kSeTypes>(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (!few) {
        se_pool_kernel<T><<<g0, kGateBlock, size_t(per_pool) * sizeof(float), stream_>>>(
            in[0].as<const T>(), sums, int(c), per_pool, hw, nhwc_, xvec);
      }
      se_hidden_kernel<T><<<g1, kHiddenBlock, size_t(group) * size_t(c) * sizeof(float), stream_>>>(
          in[0].as<const T>(), sums, in[1].as<const T>(), in[2].as<const T>(), hidden, n, int(c),
          int(cs), group, per_hidden, hw, nhwc_, few, xvec, w1vec, acts_);
      se_gate_kernel<T><<<g2, kGateBlock, size_t(group) * size_t(cs) * sizeof(float), stream_>>>(
          hidden, in[3].as<const T>(), in[4].as<const T>(), out[0].as<T>(), n, int(c), int(cs),
          group, per_gate, w2vec, acts_);
    });
    if (!known) return unsupported(name_ + ": dtype " + std::string(dtype_name(x.dtype)));
    return launch_status("squeeze-excitation kernels");
  }

 private:
  static constexpr size_t kMaxShared = 48 * 1024;  // without opting in to more per block
  bool nhwc_;
  SeActs acts_;
  int sms_ = 0;
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

// Every image's hidden units, then (for the three-launch form) its channel sums, in float:
// N * Cs * 4 and N * C * 4 bytes, each piece aligned.
ir::Dim squeeze_excite_workspace(const KernelQuery& q) {
  const ir::Value* x = q.inputs.empty() ? nullptr : q.inputs[0];
  const ir::Value* b1 = q.inputs.size() > 2 ? q.inputs[2] : nullptr;
  const ir::Value* b2 = q.inputs.size() > 4 ? q.inputs[4] : nullptr;
  if (!x || !x->shape || x->shape->empty() || !b1 || !b1->shape || !b2 || !b2->shape) return 0;
  const int64_t align = int64_t(kWorkspaceAlign);
  ir::Dim total = 0;
  for (const ir::Value* b : {b1, b2}) {
    ir::Dim bytes = (*x->shape)[0] * ir::Dim(int64_t(sizeof(float)));
    for (const ir::Dim& d : *b->shape) bytes = bytes * d;
    total = total + ir::Dim::ceil_div(bytes, align) * align;
  }
  return total;
}

}  // namespace

void register_squeeze_excite(Registry& r) {
  r.add(ops::OpKind::kSqueezeExcite, &make_squeeze_excite,
        {.workspace = &squeeze_excite_workspace});
}

}  // namespace kiln::backends::cuda
