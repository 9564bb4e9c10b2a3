// CUDA kernels of the attention op family: Attention (opsets 23-25: 3-D and 4-D inputs, GQA, past
// key/value, boolean and additive masks, is_causal, softcap, scale, sliding windows,
// nonpad_kv_seqlen, qk_matmul_output), RotaryEmbedding, and FlexAttention without mod graphs.
// Attention runs one block per (batch, head, query row) over the keys in chunks with a running max
// (no scratch for any length); scores, softmax and the weighted sum of V are float (double for
// float64 tensors), the order of scale, softcap and masks that of the CPU reference
// (cpu/attention.cc).
#include <cfloat>
#include <cmath>
#include <optional>
#include <span>
#include <string>

#include "backends/cuda/attention.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/typed.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;
constexpr int kBlock = 128;
constexpr int kChunk = 128;  // keys scored per pass of the block
// Dynamic shared memory: Q row and the V accumulator (head sizes) plus the chunk's scores, in the
// compute type; 48 KiB per block without opting in, less what the kernel declares statically.
constexpr int64_t kSharedBytes = 48 * 1024 - 512;
// The largest head size sum (Q's plus V's) the attention kernel takes for tensors of dtype t.
int64_t max_head_sum(DType t) { return kSharedBytes / (t == DType::kFloat64 ? 8 : 4) - kChunk; }

// The dtypes of the Attention and FlexAttention kernel, and of RotaryEmbedding.
constexpr unsigned kAttentionTypes = kTF32 | kTF64 | kTF16 | kTBF16;
constexpr unsigned kRotaryTypes = kTF32 | kTF16 | kTBF16;

// What attention computes in for storage type T: float, or double for float64.
template <typename T>
using Acc = typename DNum<T>::C;
__device__ __forceinline__ float acc_exp(float x) { return expf(x); }
__device__ __forceinline__ double acc_exp(double x) { return exp(x); }
__device__ __forceinline__ float acc_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double acc_max(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ float acc_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double acc_tanh(double x) { return tanh(x); }

// Calls f(T{}) with T the storage type of t when kSet holds it; then the launch status.
template <unsigned kSet, typename F>
Status by_float_type(DType t, const std::string& what, F&& f) {
  if (!visit_dtype<kSet>(t, f)) return unsupported(what + ": dtype " + std::string(dtype_name(t)));
  return launch_status(what.c_str());
}

bool float_type_ok(DType t, unsigned set) { return (dtype_bit(t) & set) != 0; }

struct MaxOp {
  template <typename A>
  __device__ A operator()(A a, A b) const {
    return acc_max(a, b);
  }
};

// ---- Attention ----

struct AttnArgs {
  int64_t batch, q_heads, kv_heads, s, l, past, d, dv;
  int64_t qs[3], ks[3], vs[3], ys[3];  // element strides of (batch, head, seq); head dim is 1
  const void *q, *k, *v, *past_k, *past_v;
  void *y, *qk;
  const void* mask;
  int mask_dtype;
  int64_t mshape[4];
  const void* nonpad;
  int nonpad_dtype;
  double sq;  // sqrt(scale): Q and K are each scaled by it, as the reference does
  double softcap;
  int causal, mode;
  int64_t left, right;
};

template <typename T>
__device__ __forceinline__ Acc<T> key_at(const AttnArgs& a, int64_t b, int64_t kh, int64_t j,
                                         int64_t d) {
  using N = DNum<T>;
  const T* k = static_cast<const T*>(a.k);
  if (j < a.past) {
    return N::load(static_cast<const T*>(a.past_k)[((b * a.kv_heads + kh) * a.past + j) * a.d + d]);
  }
  return N::load(k[b * a.ks[0] + kh * a.ks[1] + (j - a.past) * a.ks[2] + d]);
}
template <typename T>
__device__ __forceinline__ Acc<T> value_at(const AttnArgs& a, int64_t b, int64_t kh, int64_t j,
                                           int64_t d) {
  using N = DNum<T>;
  const T* v = static_cast<const T*>(a.v);
  if (j < a.past) {
    const T* past_v = static_cast<const T*>(a.past_v);
    return N::load(past_v[((b * a.kv_heads + kh) * a.past + j) * a.dv + d]);
  }
  return N::load(v[b * a.vs[0] + kh * a.vs[1] + (j - a.past) * a.vs[2] + d]);
}

// The additive bias of key j for query i (mask, causal, windows, padding), -inf where masked.
template <typename A>
__device__ __forceinline__ A attn_bias(const AttnArgs& a, int64_t b, int64_t h, int64_t i,
                                       int64_t j, int64_t offset, int64_t nonpad) {
  const A neg_inf = A(-INFINITY);
  A bias = A(0);
  if (a.mask) {
    const int64_t* m = a.mshape;
    if (j >= m[3]) {
      bias = neg_inf;  // the reference pads a short mask with False / -inf
    } else {
      int64_t mi =
          (((m[0] == 1 ? 0 : b) * m[1] + (m[1] == 1 ? 0 : h)) * m[2] + (m[2] == 1 ? 0 : i)) * m[3] +
          j;
      A mv = load_as<A>(a.mask, a.mask_dtype, mi);
      bias = a.mask_dtype == int(DType::kBool) ? (mv != A(0) ? A(0) : neg_inf) : mv;
    }
  }
  const int64_t diff = i + offset - j;
  if (a.causal && diff < 0) bias += neg_inf;
  if ((a.left >= 0 && diff > a.left) || (a.right >= 0 && -diff > a.right)) bias += neg_inf;
  if (a.nonpad && j >= nonpad) bias += neg_inf;
  return bias;
}

// Score of key j for the query row in `qrow` (already times sqrt(scale)): a warp's dot product,
// the same in every lane.
template <typename T>
__device__ __forceinline__ Acc<T> warp_dot(const AttnArgs& a, const Acc<T>* qrow, int64_t b,
                                           int64_t kh, int64_t j, int lane) {
  using A = Acc<T>;
  const A sq = A(a.sq), cap = A(a.softcap);
  A dot = A(0);
  for (int64_t d = lane; d < a.d; d += 32) dot += qrow[d] * (key_at<T>(a, b, kh, j, d) * sq);
  for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
  if (cap > A(0)) dot = acc_tanh(dot / cap) * cap;
  return dot;
}

template <typename T>
__global__ void attention_kernel(AttnArgs a) {
  using A = Acc<T>;
  using N = DNum<T>;
  const A neg_inf = A(-INFINITY);
  // One untyped dynamic buffer: the instantiations would otherwise declare it with clashing types.
  extern __shared__ __align__(8) unsigned char smem[];
  A* qrow = reinterpret_cast<A*>(smem);  // [d]
  A* acc = qrow + a.d;                   // [dv]
  A* sc = acc + a.dv;                    // [kChunk]
  __shared__ A red[32];
  __shared__ int unmasked;
  const int64_t row = blockIdx.x;
  const int64_t i = row % a.s, h = (row / a.s) % a.q_heads, b = row / (a.s * a.q_heads);
  const int64_t kh = h / (a.q_heads / a.kv_heads);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t nonpad = a.nonpad ? load_as<int64_t>(a.nonpad, a.nonpad_dtype, b) : 0;
  // Causal and window masks align bottom-right (see the reference): query i sits at i + offset.
  const int64_t offset = a.past == 0 && a.nonpad ? nonpad - a.s : a.past;
  const T* q = static_cast<const T*>(a.q) + b * a.qs[0] + h * a.qs[1] + i * a.qs[2];
  const A sq = A(a.sq);
  for (int64_t d = threadIdx.x; d < a.d; d += blockDim.x) qrow[d] = N::load(q[d]) * sq;
  for (int64_t d = threadIdx.x; d < a.dv; d += blockDim.x) acc[d] = A(0);
  if (threadIdx.x == 0) unmasked = 0;
  const int64_t qk_base = ((b * a.q_heads + h) * a.s + i) * a.l;
  A ref = A(0), m = neg_inf, sum = A(0);
  for (int64_t c0 = 0; c0 < a.l; c0 += kChunk) {
    const int n = int(a.l - c0 < kChunk ? a.l - c0 : kChunk);
    __syncthreads();  // the Q row is loaded; the previous chunk's scores are consumed
    for (int jj = warp; jj < n; jj += warps) {
      const int64_t j = c0 + jj;
      A raw = warp_dot<T>(a, qrow, b, kh, j, lane);
      if (lane == 0) {
        A bias = attn_bias<A>(a, b, h, i, j, offset, nonpad);
        if (bias != neg_inf) unmasked = 1;
        A biased = raw + bias;
        sc[jj] = biased;
        if (a.qk && a.mode != 3)
          static_cast<T*>(a.qk)[qk_base + j] = N::store(a.mode == 2 ? biased : raw);
      }
    }
    __syncthreads();
    A cm = neg_inf;
    for (int jj = threadIdx.x; jj < n; jj += blockDim.x) cm = acc_max(cm, sc[jj]);
    cm = block_reduce(cm, MaxOp(), red, neg_inf);
    const A m_new = acc_max(m, cm);
    const A ref_new = m_new == neg_inf ? A(0) : m_new;
    // Rescales what earlier chunks summed; nothing was summed while every score was -inf (and
    // exp(0 - ref_new) could overflow for a very negative additive mask).
    const A alpha = m == neg_inf ? A(0) : acc_exp(ref - ref_new);
    A part = A(0);
    for (int jj = threadIdx.x; jj < n; jj += blockDim.x) {
      A p = acc_exp(sc[jj] - ref_new);
      sc[jj] = p;
      part += p;
    }
    sum = sum * alpha + block_reduce(part, AddReduce(), red, A(0));
    for (int64_t d = threadIdx.x; d < a.dv; d += blockDim.x) {
      A s = acc[d] * alpha;
      for (int jj = 0; jj < n; ++jj) s += sc[jj] * value_at<T>(a, b, kh, c0 + jj, d);
      acc[d] = s;
    }
    m = m_new;
    ref = ref_new;
  }
  __syncthreads();
  // A row whose every key is masked (decided on the bias) attends nothing: 0, not NaN.
  const bool masked = a.l > 0 && !unmasked;
  const A inv = masked ? A(0) : A(1) / (sum == A(0) ? A(1) : sum);
  T* y = static_cast<T*>(a.y) + b * a.ys[0] + h * a.ys[1] + i * a.ys[2];
  for (int64_t d = threadIdx.x; d < a.dv; d += blockDim.x) y[d] = N::store(acc[d] * inv);
  if (a.qk && a.mode == 3) {
    for (int64_t j = warp; j < a.l; j += warps) {
      A raw = warp_dot<T>(a, qrow, b, kh, j, lane);
      if (lane == 0) {
        A p = acc_exp(raw + attn_bias<A>(a, b, h, i, j, offset, nonpad) - ref) * inv;
        static_cast<T*>(a.qk)[qk_base + j] = N::store(p);
      }
    }
  }
}

// present = concat(past, new) along the sequence: [B, kv_heads, P + S, head].
template <typename T>
__global__ void present_kernel(const T* past, const T* x, T* out, int64_t heads, int64_t p,
                               int64_t l, int64_t dh, int64_t xs0, int64_t xs1, int64_t xs2,
                               int64_t n) {
  KILN_GRID_LOOP(e, n) {
    int64_t d = e % dh, j = (e / dh) % l, bh = e / (dh * l);
    int64_t b = bh / heads, h = bh % heads;
    out[e] = j < p ? past[(bh * p + j) * dh + d] : x[b * xs0 + h * xs1 + (j - p) * xs2 + d];
  }
}

// Strides of (batch, head, seq) of a 4-D [B, H, S, D] or 3-D [B, S, H*D] tensor.
void head_strides(const TensorView& v, int64_t heads, int64_t dh, int64_t* st) {
  if (v.rank() == 4) {
    st[0] = v.shape[1] * v.shape[2] * v.shape[3], st[1] = v.shape[2] * v.shape[3],
    st[2] = v.shape[3];
  } else {
    st[0] = v.shape[1] * v.shape[2], st[1] = dh, st[2] = heads * dh;
  }
}

class AttentionKernel final : public CudaKernel {
 public:
  explicit AttentionKernel(std::string name = "cuda.Attention") : CudaKernel(std::move(name)) {}
  int64_t q_heads_attr = 0, kv_heads_attr = 0, causal = 0, mode = 0, left = -1, right = -1;
  float softcap = 0.f;
  std::optional<float> scale;

  std::optional<PackedLayout> packed;  // a kiln::PackedAttention node

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &q = in[0], &k = in[1], &v = in[2];
    auto opt = [](std::span<const TensorView> s, size_t i) -> const TensorView* {
      return s.size() > i && present(s[i]) ? &s[i] : nullptr;
    };
    const TensorView *mask = opt(in, 3), *pk = opt(in, 4), *pv = opt(in, 5), *nonpad = opt(in, 6);
    const TensorView *present_k = opt(out, 1), *present_v = opt(out, 2), *qk = opt(out, 3);
    AttnArgs a{};
    if (packed) return run_packed(q, k, v, mask, out[0]);
    const bool four = q.rank() == 4;
    a.batch = q.shape[0];
    a.q_heads = four ? q.shape[1] : q_heads_attr;
    a.kv_heads = four ? k.shape[1] : kv_heads_attr;
    if (a.q_heads <= 0 || a.kv_heads <= 0 || a.q_heads % a.kv_heads != 0) {
      return invalid_argument(name_ + ": Q heads must be a multiple of KV heads");
    }
    a.s = four ? q.shape[2] : q.shape[1];
    a.d = four ? q.shape[3] : q.shape[2] / a.q_heads;
    a.dv = four ? v.shape[3] : v.shape[2] / a.kv_heads;
    const int64_t new_l = four ? k.shape[2] : k.shape[1];
    a.past = pk ? pk->shape[2] : 0;
    a.l = a.past + new_l;
    if ((pk == nullptr) != (pv == nullptr) || (pv && pv->shape[2] != a.past)) {
      return invalid_argument(name_ +
                              ": past_key and past_value must come together with one length");
    }
    head_strides(q, a.q_heads, a.d, a.qs);
    head_strides(k, a.kv_heads, a.d, a.ks);
    head_strides(v, a.kv_heads, a.dv, a.vs);
    if (four) {
      a.ys[0] = a.q_heads * a.s * a.dv, a.ys[1] = a.s * a.dv, a.ys[2] = a.dv;
    } else {
      a.ys[0] = a.s * a.q_heads * a.dv, a.ys[1] = a.dv, a.ys[2] = a.q_heads * a.dv;
    }
    if (out[0].numel() != a.batch * a.q_heads * a.s * a.dv)
      return invalid_argument(name_ + ": Y has the wrong size");
    if ((a.d + a.dv) > max_head_sum(q.dtype)) return unsupported(name_ + ": head sizes too large");
    a.q = q.data, a.k = k.data, a.v = v.data;
    a.past_k = pk ? pk->data : nullptr, a.past_v = pv ? pv->data : nullptr;
    a.y = out[0].data;
    a.qk = qk ? qk->data : nullptr;
    if (mask) {
      KILN_RETURN_IF_ERROR(attention_mask_dims(*mask, a.batch, a.q_heads, a.s, a.mshape, name_));
      if (a.mshape[3] > a.l) return invalid_argument(name_ + ": attn_mask is longer than the keys");
      a.mask = mask->data;
      a.mask_dtype = int(mask->dtype);
    }
    if (nonpad) {
      if (nonpad->numel() != a.batch)
        return invalid_argument(name_ + ": nonpad_kv_seqlen must hold one int per batch");
      a.nonpad = nonpad->data;
      a.nonpad_dtype = int(nonpad->dtype);
    }
    // float64 tensors take sqrt(scale) in double, as the reference does; the float kernels keep
    // the float value they always had.
    if (q.dtype == DType::kFloat64) {
      a.sq = std::sqrt(scale ? double(*scale) : 1.0 / std::sqrt(double(a.d)));
    } else {
      a.sq = std::sqrt(scale ? *scale : 1.f / std::sqrt(float(a.d)));
    }
    a.softcap = softcap;
    a.causal = int(causal), a.mode = int(mode), a.left = left, a.right = right;
    return launch(a, q.dtype, present_k, pk, k, present_v, pv, v);
  }

 private:
  // Q, K and V read in place from the packed layout's tensors, Y written in it.
  Status run_packed(const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView* mask, const TensorView& y) {
    const PackedLayout& l = *packed;
    if (q.rank() != 3 || k.rank() != 3 || v.rank() != 3 || y.rank() < 2) {
      return invalid_argument(name_ + ": Q, K and V must be 3-D");
    }
    AttnArgs a{};
    a.q_heads = l.q_heads, a.kv_heads = l.kv_heads, a.d = l.d, a.dv = l.dv;
    const PackedDims pq = packed_dims(l, q.shape, q.shape[2], l.d),
                     pk = packed_dims(l, k.shape, k.shape[2], l.d),
                     pv = packed_dims(l, v.shape, v.shape[2], l.dv),
                     py = packed_dims(l, y.shape, l.q_heads * l.dv, l.dv);
    a.batch = pq.batch, a.s = pq.seq, a.l = pk.seq;
    if (pk.batch != a.batch || pv.batch != a.batch || pv.seq != a.l || py.batch != a.batch ||
        py.seq != a.s || y.numel() != a.batch * a.s * l.q_heads * l.dv) {
      return invalid_argument(name_ + ": Q, K, V and Y disagree on batch or sequence");
    }
    for (int i = 0; i < 3; ++i)
      a.qs[i] = pq.st[i], a.ks[i] = pk.st[i], a.vs[i] = pv.st[i], a.ys[i] = py.st[i];
    const size_t es = dtype_size(q.dtype);
    a.q = static_cast<const char*>(q.data) + l.offset[0] * int64_t(es);
    a.k = static_cast<const char*>(k.data) + l.offset[1] * int64_t(es);
    a.v = static_cast<const char*>(v.data) + l.offset[2] * int64_t(es);
    a.y = y.data;
    if (mask) {
      KILN_RETURN_IF_ERROR(attention_mask_dims(*mask, a.batch, a.q_heads, a.s, a.mshape, name_));
      if (a.mshape[3] > a.l) return invalid_argument(name_ + ": attn_mask is longer than the keys");
      a.mask = mask->data;
      a.mask_dtype = int(mask->dtype);
    }
    a.sq = std::sqrt(l.scale);
    a.causal = int(l.causal), a.left = -1, a.right = -1;
    return launch(a, q.dtype, nullptr, nullptr, k, nullptr, nullptr, v);
  }

  Status launch(AttnArgs& a, DType dtype, const TensorView* present_k, const TensorView* pk,
                const TensorView& k, const TensorView* present_v, const TensorView* pv,
                const TensorView& v) {
    const int64_t rows = a.batch * a.q_heads * a.s;
    KILN_RETURN_IF_ERROR(by_float_type<kAttentionTypes>(dtype, name_, [&](auto tag) {
      using T = decltype(tag);
      const size_t shared = size_t(a.d + a.dv + kChunk) * sizeof(Acc<T>);
      if (rows > 0) attention_kernel<T><<<unsigned(rows), kBlock, shared, stream_>>>(a);
      auto copy = [&](const TensorView* dst, const TensorView* past, const TensorView& x,
                      int64_t dh, const int64_t* xs) {
        int64_t n = dst ? dst->numel() : 0;
        if (n == 0) return;
        present_kernel<T><<<grid_for(n), 256, 0, stream_>>>(
            past ? static_cast<const T*>(past->data) : nullptr, static_cast<const T*>(x.data),
            static_cast<T*>(dst->data), a.kv_heads, a.past, a.l, dh, xs[0], xs[1], xs[2], n);
      };
      copy(present_k, pk, k, a.d, a.ks);
      copy(present_v, pv, v, a.dv, a.vs);
    }));
    return ok_status();
  }
};

StatusOr<std::unique_ptr<Kernel>> make_attention(const KernelQuery& q) {
  auto kernel = std::make_unique<AttentionKernel>();
  const auto& at = q.node.attrs;
  KILN_ASSIGN_OR_RETURN(kernel->q_heads_attr, at.get_int("q_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(kernel->kv_heads_attr, at.get_int("kv_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(kernel->causal, at.get_int("is_causal", 0));
  KILN_ASSIGN_OR_RETURN(kernel->mode, at.get_int("qk_matmul_output_mode", 0));
  KILN_ASSIGN_OR_RETURN(kernel->softcap, at.get_float("softcap", 0.f));
  KILN_ASSIGN_OR_RETURN(kernel->left, at.get_int("left_window_size", -1));
  KILN_ASSIGN_OR_RETURN(kernel->right, at.get_int("right_window_size", -1));
  if (at.has("scale")) {
    KILN_ASSIGN_OR_RETURN(float s, at.get_float("scale", std::nullopt));
    kernel->scale = s;
  }
  DType t = q.input_dtype(0);
  if (!float_type_ok(t, kAttentionTypes)) {
    return unsupported(q.node.describe() +
                       ": the CUDA Attention takes float32, float64, float16 or bfloat16, not " +
                       std::string(dtype_name(t)));
  }
  for (size_t i : {1, 2, 4, 5}) {
    if (q.input_dtype(i) != DType::kUndefined && q.input_dtype(i) != t) {
      return unsupported(q.node.describe() + ": input " + std::to_string(i) +
                         " differs in dtype from Q");
    }
  }
  for (size_t i = 0; i < q.outputs.size(); ++i) {
    if (q.output_dtype(i) != DType::kUndefined && q.output_dtype(i) != t) {
      return unsupported(q.node.describe() + ": output " + std::to_string(i) +
                         " differs in dtype from Q");
    }
  }
  DType m = q.input_dtype(3);
  if (m != DType::kUndefined && m != DType::kBool && !is_float(m)) {
    return unsupported(q.node.describe() + ": attn_mask of dtype " + std::string(dtype_name(m)));
  }
  DType np = q.input_dtype(6);
  if (np != DType::kUndefined && np != DType::kInt64 && np != DType::kInt32) {
    return unsupported(q.node.describe() + ": nonpad_kv_seqlen of dtype " +
                       std::string(dtype_name(np)));
  }
  if (!q.inputs.empty() && q.inputs[0] && q.inputs[0]->shape) {
    bool four = q.inputs[0]->shape->size() == 4;
    auto d = attention_head_size(q, 0, four ? 0 : kernel->q_heads_attr);
    auto dv = attention_head_size(q, 2, four ? 0 : kernel->kv_heads_attr);
    if (!d || !dv) {
      return unsupported(q.node.describe() + ": the CUDA Attention needs constant head sizes");
    }
    if (*d + *dv > max_head_sum(t)) {
      return unsupported(q.node.describe() + ": head sizes " + std::to_string(*d) + " + " +
                         std::to_string(*dv) + " exceed the " + std::to_string(max_head_sum(t)) +
                         " " + std::string(dtype_name(t)) + " elements of shared memory");
    }
  }
  return std::unique_ptr<Kernel>(std::move(kernel));
}

// FlexAttention without score_mod or prob_mod is 4-D attention with GQA and a scale: the
// Attention kernel. Mod graphs (arbitrary subgraphs over the scores) are refused.
StatusOr<std::unique_ptr<Kernel>> make_flex_attention(const KernelQuery& q) {
  for (const char* mod : {"score_mod", "prob_mod"}) {
    if (q.node.attrs.has(mod)) {
      return unsupported(q.node.describe() + ": the CUDA FlexAttention runs no " + mod + " graph");
    }
  }
  auto kernel = std::make_unique<AttentionKernel>("cuda.FlexAttention");
  if (q.node.attrs.has("scale")) {
    KILN_ASSIGN_OR_RETURN(float s, q.node.attrs.get_float("scale", std::nullopt));
    kernel->scale = s;
  }
  DType t = q.input_dtype(0);
  if (!float_type_ok(t, kAttentionTypes) || q.input_dtype(1) != t || q.input_dtype(2) != t ||
      q.output_dtype(0) != t) {
    return unsupported(q.node.describe() +
                       ": the CUDA FlexAttention takes one dtype of float32, float64, float16 or "
                       "bfloat16 for Q, K, V and the output");
  }
  auto d = attention_head_size(q, 0, 0), dv = attention_head_size(q, 2, 0);
  if (!d || !dv || *d + *dv > max_head_sum(t)) {
    return unsupported(
        q.node.describe() + ": the CUDA FlexAttention needs constant head sizes of at most " +
        std::to_string(max_head_sum(t)) + " " + std::string(dtype_name(t)) + " elements together");
  }
  return std::unique_ptr<Kernel>(std::move(kernel));
}

// ---- RotaryEmbedding ----

struct RotaryArgs {
  int64_t b, s, h, d, half, rows;
  int four_d, interleaved;
  int shared;       // no position_ids and caches [1, S, dim/2]: row s for every b
  const void* pos;  // int64 [B, S], or nullptr: row b * S + s (s where shared)
};

template <typename T>
__global__ void rotary_kernel(const T* x, const T* cosv, const T* sinv, T* y, RotaryArgs a,
                              int64_t n) {
  using N = DNum<T>;
  // One thread per (b, s, h, pair j) for j < d / 2 handled as: j < half rotates, the rest copies.
  const int64_t pairs = a.d - a.half;  // rotated pairs plus the pass-through tail
  KILN_GRID_LOOP(e, n) {
    int64_t j = e % pairs, r = e / pairs;
    int64_t h = r % a.h, s = (r / a.h) % a.s, b = r / (a.h * a.s);
    int64_t base = a.four_d ? ((b * a.h + h) * a.s + s) * a.d : ((b * a.s + s) * a.h + h) * a.d;
    if (j < a.half) {
      int64_t row = a.pos      ? static_cast<const int64_t*>(a.pos)[b * a.s + s]
                    : a.shared ? s
                               : b * a.s + s;
      int64_t i1 = a.interleaved ? 2 * j : j, i2 = a.interleaved ? 2 * j + 1 : j + a.half;
      float x1 = N::load(x[base + i1]), x2 = N::load(x[base + i2]);
      if (row < 0 || row >= a.rows) {  // the reference refuses it; the device cannot: NaN marks it
        y[base + i1] = N::store(NAN), y[base + i2] = N::store(NAN);
        continue;
      }
      float c = N::load(cosv[row * a.half + j]), sn = N::load(sinv[row * a.half + j]);
      y[base + i1] = N::store(c * x1 - sn * x2);
      y[base + i2] = N::store(sn * x1 + c * x2);
    } else {
      int64_t dd = 2 * a.half + (j - a.half);
      y[base + dd] = x[base + dd];
    }
  }
}

// The common case on 16-byte vectors: not interleaved, half a multiple of V = 16 / sizeof(T),
// every buffer 16-byte aligned and fewer than 2^31 vectors. A thread takes V consecutive pairs of
// one row (a (b, s, h) head vector in memory order): one 16-byte load each of x1, x2, cos and sin
// and two stores. The scalar form above, one pair a thread through 64-bit divisions, ran at about
// 0.7 TB/s on an H200 (Llama-style Q and K, [32, 16, 256, 64] float16).
template <typename T, int V>
__global__ void rotary_vec_kernel(const uint4* x, const uint4* cosv, const uint4* sinv, uint4* y,
                                  RotaryArgs a, int32_t n) {
  using N = DNum<T>;
  const int32_t chunks = int32_t(a.half / V), d = int32_t(a.d / V), half = chunks;
  const int32_t pairs_v = int32_t((a.d - a.half) / V);  // chunks this row's threads cover
  for (int32_t e = int32_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += int32_t(gridDim.x) * blockDim.x) {
    const int32_t c = e % pairs_v, r = e / pairs_v;  // r: the row in memory order
    const int32_t base = r * d;
    if (c >= chunks) {  // the pass-through tail past the rotated dims
      y[base + half + c] = x[base + half + c];
      continue;
    }
    // The (b, s) of row r: [B, H, S, D] rows run s fastest, [B, S, H*D] rows h fastest.
    const int32_t s = a.four_d ? r % int32_t(a.s) : (r / int32_t(a.h)) % int32_t(a.s);
    const int32_t b = r / int32_t(a.h * a.s);
    int64_t row = a.pos      ? static_cast<const int64_t*>(a.pos)[int64_t(b) * a.s + s]
                  : a.shared ? int64_t(s)
                             : int64_t(b) * a.s + s;
    uint4 u1 = x[base + c], u2 = x[base + half + c], o1, o2;
    const T *h1 = reinterpret_cast<const T*>(&u1), *h2 = reinterpret_cast<const T*>(&u2);
    T *g1 = reinterpret_cast<T*>(&o1), *g2 = reinterpret_cast<T*>(&o2);
    if (row < 0 || row >= a.rows) {  // the reference refuses it; the device cannot: NaN marks it
#pragma unroll
      for (int k = 0; k < V; ++k) g1[k] = g2[k] = N::store(NAN);
    } else {
      const uint4 uc = cosv[row * chunks + c], us = sinv[row * chunks + c];
      const T *hc = reinterpret_cast<const T*>(&uc), *hs = reinterpret_cast<const T*>(&us);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float x1 = N::load(h1[k]), x2 = N::load(h2[k]), co = N::load(hc[k]),
                    si = N::load(hs[k]);
        g1[k] = N::store(co * x1 - si * x2);
        g2[k] = N::store(si * x1 + co * x2);
      }
    }
    y[base + c] = o1;
    y[base + half + c] = o2;
  }
}

class RotaryKernel final : public CudaKernel {
 public:
  RotaryKernel(int64_t interleaved, int64_t heads, int64_t rot)
      : CudaKernel("cuda.RotaryEmbedding"), interleaved_(interleaved), heads_(heads), rot_(rot) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &cosv = in[1], &sinv = in[2];
    RotaryArgs a{};
    a.four_d = x.rank() == 4;
    if (a.four_d) {
      a.b = x.shape[0], a.h = x.shape[1], a.s = x.shape[2], a.d = x.shape[3];
    } else if (x.rank() == 3 && heads_ > 0 && x.shape[2] % heads_ == 0) {
      a.b = x.shape[0], a.s = x.shape[1], a.h = heads_, a.d = x.shape[2] / heads_;
    } else {
      return invalid_argument(name_ + ": input of shape " + shape_to_string(x.shape) +
                              " with num_heads " + std::to_string(heads_));
    }
    int64_t rot = rot_ == 0 ? a.d : rot_;
    if (rot > a.d || rot % 2 != 0) return invalid_argument(name_ + ": bad rotary_embedding_dim");
    a.half = rot / 2;
    a.interleaved = int(interleaved_);
    bool has_pos = in.size() > 3 && present(in[3]);
    if (has_pos && in[3].numel() != a.b * a.s) {
      return invalid_argument(name_ + ": position_ids must be [batch, sequence]");
    }
    if (cosv.shape.empty() || cosv.shape.back() != a.half || sinv.numel() != cosv.numel()) {
      return invalid_argument(name_ + ": the caches' last dim must be rotary_embedding_dim/2");
    }
    a.rows = a.half ? cosv.numel() / a.half : 0;
    // Without position_ids the caches are [B, S, dim/2], or [1, S, dim/2] for every batch row.
    a.shared = !has_pos && a.rows != a.b * a.s;
    if (a.shared && a.rows != a.s) {
      return invalid_argument(
          name_ + ": without position_ids the caches must be [B, S, dim/2] or [1, S, dim/2]");
    }
    a.pos = has_pos ? in[3].data : nullptr;
    int64_t n = a.b * a.s * a.h * (a.d - a.half);
    if (n == 0) return ok_status();
    return by_float_type<kRotaryTypes>(x.dtype, name_, [&](auto tag) {
      using T = decltype(tag);
      constexpr int64_t V = int64_t(16 / sizeof(T));
      const int64_t vecs = a.b * a.s * a.h * ((a.d - a.half) / V);
      if (!a.interleaved && a.half % V == 0 && a.d % V == 0 &&
          a.b * a.s * a.h * a.d / V < (int64_t(1) << 31) && aligned16(x.data) &&
          aligned16(cosv.data) && aligned16(sinv.data) && aligned16(out[0].data)) {
        rotary_vec_kernel<T, int(V)><<<grid_for(vecs), 256, 0, stream_>>>(
            static_cast<const uint4*>(x.data), static_cast<const uint4*>(cosv.data),
            static_cast<const uint4*>(sinv.data), static_cast<uint4*>(out[0].data), a,
            int32_t(vecs));
        return;
      }
      rotary_kernel<T><<<grid_for(n), 256, 0, stream_>>>(
          static_cast<const T*>(x.data), static_cast<const T*>(cosv.data),
          static_cast<const T*>(sinv.data), static_cast<T*>(out[0].data), a, n);
    });
  }

 private:
  int64_t interleaved_, heads_, rot_;
};

StatusOr<std::unique_ptr<Kernel>> make_rotary(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(int64_t interleaved, q.node.attrs.get_int("interleaved", 0));
  KILN_ASSIGN_OR_RETURN(int64_t heads, q.node.attrs.get_int("num_heads", 0));
  KILN_ASSIGN_OR_RETURN(int64_t rot, q.node.attrs.get_int("rotary_embedding_dim", 0));
  DType t = q.input_dtype(0);
  if (!float_type_ok(t, kRotaryTypes)) {
    return unsupported(q.node.describe() +
                       ": the CUDA RotaryEmbedding takes float32, float16 or bfloat16, not " +
                       std::string(dtype_name(t)));
  }
  if (q.input_dtype(1) != t || q.input_dtype(2) != t) {
    return unsupported(q.node.describe() + ": cos_cache and sin_cache must have X's dtype");
  }
  if (q.input_dtype(3) != DType::kUndefined && q.input_dtype(3) != DType::kInt64) {
    return unsupported(q.node.describe() + ": position_ids must be int64");
  }
  return std::unique_ptr<Kernel>(new RotaryKernel(interleaved, heads, rot));
}

}  // namespace

std::optional<int64_t> attention_head_size(const KernelQuery& q, size_t i, int64_t heads) {
  if (i >= q.inputs.size() || !q.inputs[i] || !q.inputs[i]->shape) return std::nullopt;
  const auto& s = *q.inputs[i]->shape;
  if (s.empty() || !s.back().is_const()) return std::nullopt;
  if (s.size() == 4) return s.back().value();
  if (s.size() == 3 && heads > 0 && s.back().value() % heads == 0) return s.back().value() / heads;
  return std::nullopt;
}

Status attention_mask_dims(const TensorView& mask, int64_t batch, int64_t q_heads, int64_t seq_q,
                           int64_t m[4], const std::string& who) {
  const int r = mask.rank();
  if (r < 1 || r > 4) return invalid_argument(who + ": attn_mask must have rank 1 to 4");
  for (int d = 0; d < 4; ++d) m[d] = d < 4 - r ? 1 : mask.shape[size_t(d - (4 - r))];
  const int64_t want[3] = {batch, q_heads, seq_q};
  for (int d = 0; d < 3; ++d) {
    if (m[d] != 1 && m[d] != want[d]) {
      return invalid_argument(who + ": attn_mask of shape " + shape_to_string(mask.shape) +
                              " does not broadcast onto the scores");
    }
  }
  return ok_status();
}

StatusOr<std::unique_ptr<Kernel>> make_attention_kernel(const KernelQuery& q) {
  return make_attention(q);
}

StatusOr<PackedLayout> packed_layout(const ir::Node& node) {
  const ir::Attributes& at = node.attrs;
  PackedLayout l;
  KILN_ASSIGN_OR_RETURN(int64_t seq_first, at.get_int("seq_first", 0));
  KILN_ASSIGN_OR_RETURN(l.offset[0], at.get_int("q_offset", 0));
  KILN_ASSIGN_OR_RETURN(l.offset[1], at.get_int("k_offset", 0));
  KILN_ASSIGN_OR_RETURN(l.offset[2], at.get_int("v_offset", 0));
  KILN_ASSIGN_OR_RETURN(l.q_heads, at.get_int("q_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(l.kv_heads, at.get_int("kv_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(l.d, at.get_int("head_size", 0));
  KILN_ASSIGN_OR_RETURN(l.dv, at.get_int("v_head_size", 0));
  KILN_ASSIGN_OR_RETURN(int64_t causal, at.get_int("is_causal", 0));
  l.seq_first = seq_first != 0, l.causal = causal != 0;
  if (l.q_heads <= 0 || l.kv_heads <= 0 || l.q_heads % l.kv_heads != 0 || l.d <= 0 || l.dv <= 0) {
    return invalid_argument(node.describe() +
                            ": PackedAttention's heads and head sizes are invalid");
  }
  // ONNX Attention's default, 1 / sqrt(head_size), as the schema and the CPU reference take it
  // (pack_attention always writes the attribute; a node written by hand may leave it out, and
  // this read 1 until AttentionKernel.Float32GemmKernelMatchesTheDoubleReference ran on CUDA).
  l.scale = 1.f / std::sqrt(float(l.d));
  if (at.has("scale")) {
    KILN_ASSIGN_OR_RETURN(l.scale, at.get_float("scale", std::nullopt));
  }
  return l;
}

PackedDims packed_dims(const PackedLayout& l, std::span<const int64_t> shape, int64_t row,
                       int64_t head) {
  PackedDims p{};
  if (shape.size() < 2) return p;
  const int64_t x1 = shape[1];
  if (l.seq_first) {
    p.seq = shape[0], p.batch = x1;
    p.st[0] = row, p.st[1] = head, p.st[2] = x1 * row;
  } else {
    p.batch = shape[0], p.seq = x1;
    p.st[0] = x1 * row, p.st[1] = head, p.st[2] = row;
  }
  return p;
}

StatusOr<std::unique_ptr<Kernel>> make_packed_attention_kernel(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(PackedLayout l, packed_layout(q.node));
  const DType t = q.input_dtype(0);
  if (!float_type_ok(t, kAttentionTypes) || q.input_dtype(1) != t || q.input_dtype(2) != t ||
      q.output_dtype(0) != t) {
    return unsupported(q.node.describe() +
                       ": the CUDA PackedAttention takes one dtype of float32, float64, float16 or "
                       "bfloat16 for Q, K, V and Y");
  }
  const DType m = q.input_dtype(3);
  if (m != DType::kUndefined && m != DType::kBool && !is_float(m)) {
    return unsupported(q.node.describe() + ": attn_mask of dtype " + std::string(dtype_name(m)));
  }
  if (l.d + l.dv > max_head_sum(t)) {
    return unsupported(q.node.describe() + ": head sizes " + std::to_string(l.d) + " + " +
                       std::to_string(l.dv) + " exceed the " + std::to_string(max_head_sum(t)) +
                       " " + std::string(dtype_name(t)) + " elements of shared memory");
  }
  auto kernel = std::make_unique<AttentionKernel>("cuda.PackedAttention");
  kernel->packed = l;
  return std::unique_ptr<Kernel>(std::move(kernel));
}

void register_attention(Registry& r) {
  r.add(OpKind::kAttention, &make_attention);
  r.add(OpKind::kRotaryEmbedding, &make_rotary);
  r.add(OpKind::kFlexAttention, &make_flex_attention);
  r.add(OpKind::kPackedAttention, &make_packed_attention_kernel);
}

}  // namespace kiln::backends::cuda
