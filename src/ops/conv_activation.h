// The activations of kiln::FusedConv and kiln::SqueezeExcite, one list for the schema (which checks
// the attribute and its parameter count), the CPU kernels and the CUDA kernels (which decode it
// once into the enum). Header-only so that nvcc-compiled files can include it.
#pragma once

#include <string>
#include <string_view>

namespace kiln::ops {

enum class ConvActivation {
  kNone,
  kRelu,
  kClip,  // params: min, max
  kHardSwish,
  kHardSigmoid,  // params: alpha, beta
  kSigmoid,
  kSilu,       // y * sigmoid(y)
  kLeakyRelu,  // params: alpha
  kGelu,       // ONNX Gelu (erf)
  kGeluTanh    // Gelu with approximate="tanh"
};

struct ConvActivationInfo {
  const char* name;  // the attribute's value
  ConvActivation kind;
  int params;  // how many activation_params it takes
};

inline constexpr ConvActivationInfo kConvActivations[] = {
    {"none", ConvActivation::kNone, 0},
    {"relu", ConvActivation::kRelu, 0},
    {"clip", ConvActivation::kClip, 2},
    {"hardswish", ConvActivation::kHardSwish, 0},
    {"hardsigmoid", ConvActivation::kHardSigmoid, 2},
    {"sigmoid", ConvActivation::kSigmoid, 0},
    {"silu", ConvActivation::kSilu, 0},
    {"leaky_relu", ConvActivation::kLeakyRelu, 1},
    {"gelu", ConvActivation::kGelu, 0},
    {"gelu_tanh", ConvActivation::kGeluTanh, 0},
};

// The entry named `name`, or null.
inline const ConvActivationInfo* find_conv_activation(std::string_view name) {
  for (const ConvActivationInfo& a : kConvActivations) {
    if (name == a.name) return &a;
  }
  return nullptr;
}

// "none, relu, clip, ...": for errors that list what is allowed.
inline std::string conv_activation_names() {
  std::string s;
  for (const ConvActivationInfo& a : kConvActivations) {
    if (!s.empty()) s += ", ";
    s += a.name;
  }
  return s;
}

}  // namespace kiln::ops
