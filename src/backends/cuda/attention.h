// What the two CUDA implementations of ONNX Attention share: attention.cu's kernel (every case the
// op has, one block per query row), which attention_sdpa.cc's cuDNN flash attention runs for the
// shapes cuDNN refuses.
#pragma once

#include <memory>
#include <optional>
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

// Attention on cuDNN's SDPA graph (attention_sdpa.cc): registered before attention.cu's kernel.
void register_attention_sdpa(Registry& r);

}  // namespace kiln::backends::cuda
