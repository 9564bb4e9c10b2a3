// What the two CUDA implementations of ONNX Attention share: attention.cu's kernel (every case the
// op has, one block per query row), which attention_sdpa.cc's cuDNN flash attention runs for the
// shapes cuDNN refuses.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "backends/cuda/cuda_common.h"

namespace kiln::backends::cuda {

// A head size of Attention input i as a constant: 4-D its last dim, 3-D the hidden size over
// `heads` (which must divide it); nullopt where it is not known at build time.
std::optional<int64_t> attention_head_size(const KernelQuery& q, size_t i, int64_t heads);

// attn_mask's dims right-aligned to rank 4 into m (1 where it has fewer), checked to broadcast
// onto [batch, q_heads, seq_q, .]; kInvalidArgument naming `who` otherwise. The last dim (the
// keys) is the caller's to check.
Status attention_mask_dims(const TensorView& mask, int64_t batch, int64_t q_heads, int64_t seq_q,
                           int64_t m[4], const std::string& who);

// attention.cu's Attention kernel for the node of `q`, or why it cannot run it.
StatusOr<std::unique_ptr<Kernel>> make_attention_kernel(const KernelQuery& q);

// kiln::PackedAttention's layout (ops/kiln_ops.cc): the heads of Q, K and V side by side on the
// last axis of [X0, X1, N] tensors from an offset each, Y written [X0, X1, q_heads*dv]; X0 is the
// batch (seq_first false) or the sequence (true).
struct PackedLayout {
  bool seq_first = false;
  int64_t offset[3] = {0, 0, 0};  // Q, K, V, in elements
  int64_t q_heads = 0, kv_heads = 0, d = 0, dv = 0;
  float scale = 1.f;
  bool causal = false;
};
StatusOr<PackedLayout> packed_layout(const ir::Node& node);
// Batch, sequence and the element strides of (batch, head, seq) of a tensor of the layout whose
// dims are `shape` ([X0, X1, ...]; the rows hold `row` elements) and whose heads are `head` apart.
struct PackedDims {
  int64_t batch, seq, st[3];
};
PackedDims packed_dims(const PackedLayout& l, std::span<const int64_t> shape, int64_t row,
                       int64_t head);
// attention.cu's kernel for a kiln::PackedAttention node.
StatusOr<std::unique_ptr<Kernel>> make_packed_attention_kernel(const KernelQuery& q);

// attention_short.cu: attention on tensor cores of our own, for keys that fit one tile (Swin's
// windows) and, tiled, for the short sequences of encoders and decoders.
inline constexpr int64_t kShortAttentionKeys = 64, kShortAttentionHead = 64;
struct ShortAttnArgs {
  int64_t b = 0, hq = 0, hk = 0, s = 0, l = 0, d = 0, dv = 0;
  int64_t st[4][3] = {};  // element strides of (batch, head, seq) of Q, K, V and Y; head dim 1
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  void* y = nullptr;
  const void* mask = nullptr;   // additive, of Q's dtype, its last dim `l`
  int64_t m[4] = {1, 1, 1, 1};  // the mask's dims broadcast to rank 4
  float scale = 1.f;
  bool causal = false;  // aligned top left
};
// Whether short_attention runs `a` for Q, K and V of dtype t (float16 or bfloat16) whose
// elements are `element` bytes: at most kShortAttentionKeys keys, head sizes multiples of 8 up to
// kShortAttentionHead, 16-byte aligned rows. The device must be sm_80 or later.
bool short_attention_takes(const ShortAttnArgs& a, DType t, size_t element);
Status short_attention(DType t, const ShortAttnArgs& a, cudaStream_t stream);
// The same kernel's schedule over any number of keys, streamed in tiles (flash attention 2 on
// mma.sync): what short_attention_takes asks but the key count. attention_sdpa.cc times it
// beside cuDNN's plans per shape.
bool tiled_attention_takes(const ShortAttnArgs& a, DType t, size_t element);
Status tiled_attention(DType t, const ShortAttnArgs& a, cudaStream_t stream);

// Attention on cuDNN's SDPA graph (attention_sdpa.cc): registered before attention.cu's kernel.
void register_attention_sdpa(Registry& r);

}  // namespace kiln::backends::cuda
