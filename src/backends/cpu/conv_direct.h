// Float32 2-D convolution with few taps per output (input channels x kernel rows x kernel columns,
// at most kDirectMaxTaps), group 1, undilated, strides 1 or 2: a network's first layer (an RGB
// stem: 3 channels x 3 x 3 = 27 taps). There im2col + GEMM copies every input value nine times
// into a matrix of 27 rows, gathers them with a stride at stride 2, and packs that matrix again
// for a GEMM whose k is 27: MobileNetV3's 3->16 3x3 stride-2 stem at 224x224 took 0.40 ms on one
// core (kiln bench, the 2-core development machine), most of MobileNetV3-small's largest layer.
// Here each output row reads its input rows once into zero-padded phase rows (a phase holds every
// s-th column, so every tap is a contiguous run), and the output channels accumulate 16 columns
// at a time in registers.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/cpu/window.h"

namespace kiln::backends::cpu {

inline constexpr int64_t kDirectMaxTaps = 64;

// Whether conv_direct_f32 takes this convolution (2-D: ad is the unit depth axis).
inline bool conv_direct_fits(int64_t group, int64_t cg, const Axis& ad, const Axis& ah,
                             const Axis& aw) {
  return group == 1 && ad.k == 1 && ad.in == 1 && ad.out == 1 && ad.pb == 0 && ah.dil == 1 &&
         aw.dil == 1 && (ah.stride == 1 || ah.stride == 2) && (aw.stride == 1 || aw.stride == 2) &&
         cg * ah.k * aw.k <= kDirectMaxTaps;
}

// Output rows [oh0, oh1) of one image: x is its cg input planes [cg, ah.in, aw.in], w the filter
// [mg, cg, ah.k, aw.k], bias [mg] or null, y its mg output planes [mg, ah.out, aw.out]. Each
// output is (its taps summed in (c, kh, kw) order, from 0) + bias, as the im2col + GEMM path
// sums them. scratch grows to what the rows need and is reused.
void conv_direct_f32(const float* x, int64_t cg, const float* w, const float* bias, int64_t mg,
                     const Axis& ah, const Axis& aw, int64_t oh0, int64_t oh1, float* y,
                     std::vector<float>& scratch);

}  // namespace kiln::backends::cpu
