// What the two CUDA implementations of ONNX Attention share: attention.cu's kernel (every case the
// op has, one block per query row), which attention_sdpa.cc's cuDNN flash attention runs for the
// shapes cuDNN refuses.
#pragma once

#include <memory>

#include "backends/cuda/cuda_common.h"

namespace kiln::backends::cuda {

// attention.cu's Attention kernel for the node of `q`, or why it cannot run it.
StatusOr<std::unique_ptr<Kernel>> make_attention_kernel(const KernelQuery& q);

// Attention on cuDNN's SDPA graph (attention_sdpa.cc): registered before attention.cu's kernel.
void register_attention_sdpa(Registry& r);

}  // namespace kiln::backends::cuda
