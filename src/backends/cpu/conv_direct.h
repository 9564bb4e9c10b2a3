// Float32 2-D convolution with few taps per output (input channels x kernel rows x kernel columns:
// at most kDirectFewTaps, or at most kDirectMaxTaps for at most kDirectFewOutputs output
// channels), group 1, undilated, strides 1 or 2. A network's first layer (an RGB stem: 3 channels
// x 3 x 3 = 27 taps): there im2col + GEMM copies every input value nine times into a matrix of 27
// rows, gathers them with a stride at stride 2, and packs that matrix again for a GEMM whose k is
// 27: MobileNetV3's 3->16 3x3 stride-2 stem at 224x224 took 0.40 ms on one core (kiln bench, the
// 2-core development machine). And a layer of few outputs (UNet's 24 -> 8 3x3 at 200x200, 216
// taps): the GEMM's few-rows path added each product into C in memory, 7.4 ms at batch 2.
// Here each output row reads its input rows once into zero-padded phase rows (a phase holds every
// s-th column, so every tap is a contiguous run), and the output channels accumulate 16 columns
// at a time in registers, 8 channels a pass over the taps.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/cpu/window.h"

namespace kiln::backends::cpu {

inline constexpr int64_t kDirectFewTaps = 64;
inline constexpr int64_t kDirectFewOutputs = 16;
inline constexpr int64_t kDirectMaxTaps = 1024;

// Whether conv_direct_f32 takes this convolution of mg output channels (2-D: ad is the unit depth
// axis). Past a few output channels with many taps, the GEMM's packed blocks reuse each input
// value more than the passes of 8 channels over the taps do.
inline bool conv_direct_fits(int64_t group, int64_t cg, int64_t mg, const Axis& ad, const Axis& ah,
                             const Axis& aw) {
  const int64_t taps = cg * ah.k * aw.k;
  return group == 1 && ad.k == 1 && ad.in == 1 && ad.out == 1 && ad.pb == 0 && ah.dil == 1 &&
         aw.dil == 1 && (ah.stride == 1 || ah.stride == 2) && (aw.stride == 1 || aw.stride == 2) &&
         (taps <= kDirectFewTaps || (mg <= kDirectFewOutputs && taps <= kDirectMaxTaps));
}

// Output rows [oh0, oh1) of one image: x is its cg input planes [cg, ah.in, aw.in], w the filter
// [mg, cg, ah.k, aw.k], bias [mg] or null, y its mg output planes [mg, ah.out, aw.out]. Each
// output is (its taps summed in (c, kh, kw) order, from 0) + bias, as the im2col + GEMM path
// sums them. scratch grows to what the rows need and is reused.
void conv_direct_f32(const float* x, int64_t cg, const float* w, const float* bias, int64_t mg,
                     const Axis& ah, const Axis& aw, int64_t oh0, int64_t oh1, float* y,
                     std::vector<float>& scratch);

}  // namespace kiln::backends::cpu
