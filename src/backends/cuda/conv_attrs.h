// The attributes of Conv and kiln::FusedConv as the CUDA convolution kernels read them (cuDNN's in
// conv.cc, the 1x1 channels-last GEMM in conv_gemm.cc).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_common.h"

namespace kiln::backends::cuda {

// The convolution's attributes, parsed once.
struct ConvAttrs {
  std::vector<int64_t> strides, dilations, pads;
  int64_t group = 1;
  std::string auto_pad = "NOTSET";
  // kiln::FusedConv only.
  bool nhwc = false;
  ConvActivation act = ConvActivation::kNone;
  float p0 = 0.f, p1 = 0.f;
};

inline StatusOr<ConvAttrs> conv_attrs(const KernelQuery& q) {
  const ir::Attributes& at = q.node.attrs;
  ConvAttrs c;
  KILN_ASSIGN_OR_RETURN(c.strides, at.get_ints("strides", std::vector<int64_t>{}));
  KILN_ASSIGN_OR_RETURN(c.dilations, at.get_ints("dilations", std::vector<int64_t>{}));
  KILN_ASSIGN_OR_RETURN(c.pads, at.get_ints("pads", std::vector<int64_t>{}));
  KILN_ASSIGN_OR_RETURN(c.group, at.get_int("group", 1));
  KILN_ASSIGN_OR_RETURN(c.auto_pad, at.get_string("auto_pad", "NOTSET"));
  if (q.node.op_type != "FusedConv") return c;
  KILN_ASSIGN_OR_RETURN(std::string layout, at.get_string("layout", "NCHW"));
  if (layout != "NCHW" && layout != "NHWC") {
    return invalid_argument(q.node.describe() + ": layout '" + layout + "' is not NCHW or NHWC");
  }
  c.nhwc = layout == "NHWC";
  KILN_ASSIGN_OR_RETURN(std::string act, at.get_string("activation", "none"));
  KILN_ASSIGN_OR_RETURN(std::vector<float> p, at.get_floats("activation_params", std::vector<float>{}));
  constexpr std::pair<const char*, ConvActivation> kActs[] = {
      {"none", ConvActivation::kNone},           {"relu", ConvActivation::kRelu},
      {"clip", ConvActivation::kClip},           {"hardswish", ConvActivation::kHardSwish},
      {"hardsigmoid", ConvActivation::kHardSigmoid}, {"sigmoid", ConvActivation::kSigmoid},
      {"silu", ConvActivation::kSilu},           {"leaky_relu", ConvActivation::kLeakyRelu}};
  bool known = false;
  for (const auto& [name, a] : kActs) {
    if (act == name) c.act = a, known = true;
  }
  if (!known) return invalid_argument(q.node.describe() + ": unknown activation '" + act + "'");
  if (p.size() > 0) c.p0 = p[0];
  if (p.size() > 1) c.p1 = p[1];
  return c;
}

}  // namespace kiln::backends::cuda
