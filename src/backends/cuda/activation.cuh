// The activations of kiln::FusedConv and kiln::SqueezeExcite on one float, as their epilogues
// apply them (conv_epilogue.cu, squeeze_excite.cu).
#pragma once

#include "backends/cuda/cuda_common.h"

namespace kiln::backends::cuda {

__device__ __forceinline__ float activate(ConvActivation act, float p0, float p1, float y) {
  switch (act) {
    case ConvActivation::kRelu:
      return y > 0.f ? y : 0.f;
    case ConvActivation::kClip:
      return fminf(fmaxf(y, p0), p1);
    case ConvActivation::kHardSwish:
      return y * fminf(fmaxf(y / 6.f + 0.5f, 0.f), 1.f);
    case ConvActivation::kHardSigmoid:
      return fminf(fmaxf(p0 * y + p1, 0.f), 1.f);
    case ConvActivation::kSigmoid:
      return 1.f / (1.f + __expf(-y));
    case ConvActivation::kSilu:
      return y / (1.f + __expf(-y));
    case ConvActivation::kLeakyRelu:
      return y >= 0.f ? y : p0 * y;
    case ConvActivation::kGelu:
      return 0.5f * y * (1.f + erff(y * 0.70710678118654752440f));
    case ConvActivation::kGeluTanh:
      return 0.5f * y * (1.f + tanhf(0.79788456080286535588f * (y + 0.044715f * y * y * y)));
    case ConvActivation::kNone:
      break;
  }
  return y;
}

}  // namespace kiln::backends::cuda
