// How often attention_short.cu's tensor-core kernels were launched in this process (the tests
// read it to know which kernel ran an Attention layer). The header needs no CUDA headers.
#pragma once

#include <cstdint>

namespace kiln::backends::cuda {

struct AttentionLaunches {
  uint64_t short_keys = 0;  // short_attention: keys that fit one tile
  uint64_t tiled = 0;       // tiled_attention: keys streamed in tiles
};
AttentionLaunches attention_launches();

}  // namespace kiln::backends::cuda
