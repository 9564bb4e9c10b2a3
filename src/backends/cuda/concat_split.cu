// Concat and Split (data.cu's ConcatKernel, shape.cu's SplitKernel) as one kernel launch per up to
// kMaxPieces pieces, moving the widest unit (16, 8, 4, 2 or 1 bytes) that every row and pointer
// allows. A cudaMemcpy2DAsync per piece reached 43-51% of the H200's copy bandwidth (Concat of two
// [64,197,384] fp16 on the last axis: 38 us for 39 MB; Split of [32,256,2304] into three: 55 us):
// short rows copy slowly, and the pieces' copies do not overlap.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/concat_split.h"

namespace kiln::backends::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int kMaxPieces = 8;

// The pieces of one launch, passed by value: piece k covers units [begin[k], begin[k + 1]) of the
// launch's part of each wide row.
struct PieceTable {
  void* data[kMaxPieces];
  int64_t begin[kMaxPieces + 1];
  int count;
};

// One unit of the wide tensor a thread: its row o and place j in the row, the piece holding j (the
// last whose start is at or before j), then one load and one store. I is unsigned: 32 bits
// while every index and the grid stride's overshoot stay below 2^32, else 64.
template <typename U, typename I, bool kToWide>
__global__ void copy_pieces_kernel(U* wide, I wide_row, PieceTable t, I row, I total) {
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I o = i / row, j = i - o * row;
    // Constant indices only (selects, no copy of the table to local memory).
    I b = 0, e = I(t.begin[1]);
    void* data = t.data[0];
#pragma unroll
    for (int p = 1; p < kMaxPieces; ++p) {
      if (p < t.count && j >= I(t.begin[p])) {
        b = I(t.begin[p]), e = I(t.begin[p + 1]), data = t.data[p];
      }
    }
    U* narrow = static_cast<U*>(data) + o * (e - b) + (j - b);
    U* wd = wide + o * wide_row + j;
    if constexpr (kToWide) {
      *wd = *narrow;
    } else {
      *narrow = *wd;
    }
  }
}

template <typename U, bool kToWide>
void launch(char* wide, int64_t wide_row_bytes, const PieceTable& bytes_table, int64_t outer,
            cudaStream_t s) {
  PieceTable t = bytes_table;
  for (int k = 0; k <= t.count; ++k) t.begin[k] /= int64_t(sizeof(U));
  const int64_t wide_row = wide_row_bytes / int64_t(sizeof(U)), row = t.begin[t.count];
  const int64_t total = outer * row;
  U* w = reinterpret_cast<U*>(wide);
  // grid_for caps the grid at 2^29 threads: with every index below 2^31, i + stride < 2^32.
  if (outer * wide_row < (int64_t(1) << 31)) {
    copy_pieces_kernel<U, uint32_t, kToWide><<<grid_for(total), kBlock, 0, s>>>(
        w, uint32_t(wide_row), t, uint32_t(row), uint32_t(total));
  } else {
    copy_pieces_kernel<U, uint64_t, kToWide><<<grid_for(total), kBlock, 0, s>>>(
        w, uint64_t(wide_row), t, uint64_t(row), uint64_t(total));
  }
}

template <bool kToWide>
void launch_unit(int unit, char* wide, int64_t wide_row_bytes, const PieceTable& t, int64_t outer,
                 cudaStream_t s) {
  switch (unit) {
    case 16:
      return launch<uint4, kToWide>(wide, wide_row_bytes, t, outer, s);
    case 8:
      return launch<uint2, kToWide>(wide, wide_row_bytes, t, outer, s);
    case 4:
      return launch<uint32_t, kToWide>(wide, wide_row_bytes, t, outer, s);
    case 2:
      return launch<uint16_t, kToWide>(wide, wide_row_bytes, t, outer, s);
    default:
      return launch<uint8_t, kToWide>(wide, wide_row_bytes, t, outer, s);
  }
}

}  // namespace

Status copy_pieces(void* wide, std::span<const Piece> pieces, int64_t outer, bool to_wide,
                   cudaStream_t s) {
  int64_t wide_row = 0;
  for (const Piece& p : pieces) wide_row += p.row_bytes;
  if (outer <= 0 || wide_row <= 0) return ok_status();
  // The unit: the largest power of two up to 16 dividing every row length and address, so that a
  // unit never straddles two pieces and every access is aligned.
  uint64_t bits = uint64_t(wide_row) | reinterpret_cast<uintptr_t>(wide) | 16;
  for (const Piece& p : pieces) {
    if (p.row_bytes > 0) bits |= uint64_t(p.row_bytes) | reinterpret_cast<uintptr_t>(p.data);
  }
  const int unit = int(bits & (~bits + 1));
  char* base = static_cast<char*>(wide);
  size_t next = 0;
  int64_t at = 0;  // bytes of the wide row before the launch's first piece
  while (next < pieces.size()) {
    PieceTable t{};
    t.begin[0] = 0;
    while (next < pieces.size() && t.count < kMaxPieces) {
      const Piece& p = pieces[next++];
      if (p.row_bytes <= 0) continue;
      t.data[t.count] = p.data;
      t.begin[t.count + 1] = t.begin[t.count] + p.row_bytes;
      ++t.count;
    }
    if (t.count == 0) break;
    if (to_wide) {
      launch_unit<true>(unit, base + at, wide_row, t, outer, s);
    } else {
      launch_unit<false>(unit, base + at, wide_row, t, outer, s);
    }
    KILN_RETURN_IF_ERROR(launch_status("copy_pieces_kernel"));
    at += t.begin[t.count];
  }
  return ok_status();
}

}  // namespace kiln::backends::cuda
