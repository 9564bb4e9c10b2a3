// Channels-last float32 convolutions on the CPU: kiln::FusedConv{layout="NHWC"} (assign_layout's
// form of a conv stack) computed in that layout instead of through transposes to NCHW. It is the
// layout the vector units want for the convs of mobile CNNs, whose maps are small and channels
// many: a dense conv is one GEMM whose A is the activations as they lie ([pixels, C] at 1x1,
// read in place; the pixels' patches in the filter's (kh, kw, c) order otherwise) and whose B is
// the filter, packed once per engine; a depthwise conv is vectorized over channels with its taps
// as [kh * kw][C]. Each tile of output pixels gets its bias, residual and activation while it is
// in cache.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/conv_geometry.h"
#include "backends/cpu/gemm.h"

namespace kiln::backends::cpu {

// The filter of one NHWC convolution, laid out once per engine for its kernel, with the conv's
// spatial attributes.
class NhwcConvWeights final : public PreparedNode {
 public:
  // Dense (group 1): the GEMM's B = the KRSC filter [M, kh * kw * C] transposed, packed for the
  // blocked GEMM, or for few output channels (M <= kSmallN) as sgemm_small_n's [K][M rounded up].
  std::optional<PackedB> gemm;
  std::vector<float> small;
  // Depthwise (group = C = M): the filter as [kh * kw][C].
  std::vector<float> taps;
  int64_t m = 0, kh = 0, kw = 0, c = 0;  // output channels, kernel size, input channels
  SpatialAttrs attrs;
};

// The weights of a float32 kiln::FusedConv{layout="NHWC"} without an input activation whose filter
// is a constant [M, kh, kw, C / group] that is dense or depthwise; nullptr for any other node
// (its kernel then runs the conv through NCHW).
StatusOr<std::shared_ptr<const NhwcConvWeights>> prepare_nhwc_conv(const KernelQuery& q);

// What a convolution's output tiles get while they are in cache after the bias: the residual and
// the activation.
class NhwcEpilogue {
 public:
  virtual ~NhwcEpilogue() = default;
  // y: `pixels` rows of M floats, the first being output pixel `first` in (n, oh, ow) order.
  virtual void apply(float* y, int64_t first, int64_t pixels) const = 0;
};

// Y [N, OH, OW, M] = conv(X [N, H, W, C], w) + bias [M] (none where null), then `epi` over every
// output tile. `filter` is the node's W input as the kernel receives it (the GEMM reads it in place
// for few pixels). Checks the shapes against w and its attributes. Every output element is
// computed by one task with a fixed order of sums, so the bits do not depend on the thread count.
Status conv_nhwc_f32(const NhwcConvWeights& w, const TensorView& x, const TensorView& filter,
                     const float* bias, const TensorView& y, const NhwcEpilogue& epi);

}  // namespace kiln::backends::cpu
