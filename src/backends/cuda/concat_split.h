// Concat and Split on CUDA as one byte-moving kernel (concat_split.cu): the pieces of a row laid
// side by side in one wide tensor, copied into it (Concat) or out of it (Split).
#pragma once

#include <cstdint>
#include <span>

#include "backends/cuda/cuda_common.h"

namespace kiln::backends::cuda {

// One piece along the axis: its tensor, [outer, row_bytes], contiguous.
struct Piece {
  void* data;
  int64_t row_bytes;
};

// Copies between `wide` ([outer, sum of the pieces' row_bytes], contiguous) and the pieces, laid
// along wide's rows in order: into wide when to_wide (Concat), out of it otherwise (Split). Pieces
// of 0 bytes are skipped; any number of pieces, any alignment.
Status copy_pieces(void* wide, std::span<const Piece> pieces, int64_t outer, bool to_wide,
                   cudaStream_t s);

}  // namespace kiln::backends::cuda
