// The geometry of a convolution or pool on the CPU: its spatial attributes parsed once, and the
// axes they give for the sizes of a run (conv.cc's Conv and pools, conv_nhwc.cc's channels-last
// convolutions).
#pragma once

#include <cstdint>
#include <vector>

#include "backends/cpu/window.h"
#include "core/status.h"
#include "ir/graph.h"

namespace kiln::backends::cpu {

enum class AutoPad { kNotSet, kSameUpper, kSameLower, kValid };

// Attribute values read once (Conv) or per call (pools); empty lists mean the ONNX defaults.
struct SpatialAttrs {
  std::vector<int64_t> kernel, strides, dilations, pads;
  AutoPad auto_pad = AutoPad::kNotSet;
  bool ceil_mode = false;
};

Status parse_spatial(const char* op, const ir::Attributes& attrs, SpatialAttrs* s);

// Fills axes[3 - ns .. 3) from the runtime sizes and checks that the preallocated output size is
// the one the attributes give (the same formula as shape inference).
Status resolve_axes(const char* op, const SpatialAttrs& s, int ns, const int64_t* in,
                    const int64_t* k, const int64_t* out, Axis axes[3]);

}  // namespace kiln::backends::cpu
