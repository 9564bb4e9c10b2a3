// Attention in float32 on the CPU: per (batch, query head, block of query rows), the scores of
// the block by one GEMM (the shared SGEMM, gemm.h), scale, mask and is_causal in place, each row's
// softmax in float (vector_math.h's softmax_row_f32), then the output rows by a second GEMM
// written where Y keeps them. Q, K, V and Y are read and written through strides, so the 3-D
// [B, S, H*D] layout of ONNX Attention and kiln::PackedAttention's packed projections need no
// copies. Under is_causal a block's GEMMs stop at the last key its rows see. The blocks are split
// over the thread pool; each GEMM runs on the thread of its block.
//
// ONNX Attention's cases outside it (past keys and values, softcap, sliding windows,
// nonpad_kv_seqlen, present or qk outputs, other dtypes) stay with attention.cc's reference
// kernel, which computes in double and is this kernel's oracle in the tests.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"
#include "ir/graph.h"

namespace kiln::backends::cpu {

// Element (b, h, s, d) of a [B, H, S, D] tensor held at p + b * sb + h * sh + s * ss + d.
struct HeadsF32 {
  const float* p = nullptr;
  int64_t sb = 0, sh = 0, ss = 0;
};

struct AttentionF32 {
  HeadsF32 q, k, v;  // K and V have hk heads; query head h reads K/V head h / (hq / hk)
  float* y = nullptr;
  int64_t ysb = 0, ysh = 0, yss = 0;  // Y's element (b, h, s, d) at y + b*ysb + h*ysh + s*yss + d
  int64_t batch = 0, hq = 0, hk = 0, s = 0, l = 0, d = 0, dv = 0;
  float scale = 1.f;
  bool causal = false;  // key j is masked for query i where j > i (no past: top-left)
  // The mask, broadcast from [m[0], m[1], m[2], m[3]] (each 1 or the full size; m[3] <= l, keys
  // past it are masked) onto [batch, hq, s, l]: additive floats, or bools (false masks).
  const float* mask_f = nullptr;
  const uint8_t* mask_b = nullptr;
  int64_t m[4] = {1, 1, 1, 1};
};

// ONNX Attention's scale: the attribute, else 1 / sqrt(head size d).
StatusOr<double> attention_scale(const ir::Attributes& attrs, int64_t d);

// ONNX Attention's attn_mask of rank 1 to 4 as broadcast onto want = [B, q heads, S, L]: its
// shape padded with leading 1s into m; an error (the reference kernel's) where the rank is out of
// range, a dim neither 1 nor want's, or the mask is longer than the L keys (a shorter one masks
// the keys past it).
Status attention_mask_shape(const TensorView& mask, const int64_t want[4], int64_t m[4]);

// Sets a's mask from attn_mask `m` (float32 or bool) against a's sizes (batch, hq, s, l set);
// false where attention_f32 cannot take it (another dtype, a shape attention_mask_shape refuses).
bool set_attention_mask(const TensorView& m, AttentionF32* a);

// Y = softmax(scale * Q K^T + mask) V, a row whose every key is masked giving 0 (as ONNX's
// Attention and attention.cc's reference do). The caller has checked the shapes.
void attention_f32(const AttentionF32& a);

}  // namespace kiln::backends::cpu
