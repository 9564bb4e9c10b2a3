// What the CUDA convolution kernels (cuDNN's legacy API in conv.cc, its graph API in conv_graph.cc,
// the 1x1 channels-last GEMM in conv_gemm.cc) share: the attributes of Conv and kiln::FusedConv as
// they read them, the checks of a FusedConv's bias, residual and dtypes, and tactic-timing buffers.
#pragma once

#include <algorithm>
#include <span>
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
  // input_activation: applied to X before the convolution (only conv_depthwise.cu's tile kernel
  // takes it; the other kernels refuse a node that has one).
  ConvActivation in_act = ConvActivation::kNone;
  float ip0 = 0.f, ip1 = 0.f;
};

// A FusedConv / SqueezeExcite activation by its attribute name.
inline StatusOr<ConvActivation> parse_activation(const std::string& who, const std::string& act) {
  if (const ops::ConvActivationInfo* a = ops::find_conv_activation(act)) return a->kind;
  return invalid_argument(who + ": unknown activation '" + act + "'");
}

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
  KILN_ASSIGN_OR_RETURN(std::vector<float> p,
                        at.get_floats("activation_params", std::vector<float>{}));
  KILN_ASSIGN_OR_RETURN(c.act, parse_activation(q.node.describe(), act));
  if (p.size() > 0) c.p0 = p[0];
  if (p.size() > 1) c.p1 = p[1];
  KILN_ASSIGN_OR_RETURN(std::string in_act, at.get_string("input_activation", "none"));
  KILN_ASSIGN_OR_RETURN(std::vector<float> ip,
                        at.get_floats("input_activation_params", std::vector<float>{}));
  KILN_ASSIGN_OR_RETURN(c.in_act, parse_activation(q.node.describe(), in_act));
  if (ip.size() > 0) c.ip0 = ip[0];
  if (ip.size() > 1) c.ip1 = ip[1];
  return c;
}

// The activations cuDNN's graph pointwise nodes compute exactly as kiln::FusedConv defines them
// (hard swish and hard sigmoid have no pointwise mode; they stay in conv_epilogue).
inline bool cudnn_pointwise_computes(ConvActivation a) {
  return a == ConvActivation::kNone || a == ConvActivation::kRelu || a == ConvActivation::kClip ||
         a == ConvActivation::kLeakyRelu || a == ConvActivation::kSigmoid ||
         a == ConvActivation::kSilu || a == ConvActivation::kGelu || a == ConvActivation::kGeluTanh;
}

// Ok unless the node has an input_activation, which only conv_depthwise.cu's tile kernel applies
// (cuDNN and cuBLASLt read X as it is).
inline Status check_no_input_activation(const KernelQuery& q, const ConvAttrs& c,
                                        const char* impl) {
  if (c.in_act == ConvActivation::kNone) return ok_status();
  return unsupported(q.node.describe() + ": " + impl + " applies no input_activation");
}

// B has one value per output channel, Z the output's size, and X, W, B, Z and Y are all `t`.
inline Status check_fused_operands(const std::string& who, std::span<const TensorView> in,
                                   const TensorView& y, DType t, int64_t channels) {
  if (in.size() > 2 && present(in[2]) && in[2].numel() != channels) {
    return invalid_argument(who + ": B has " + std::to_string(in[2].numel()) +
                            " elements, expected " + std::to_string(channels));
  }
  if (in.size() > 3 && present(in[3]) && in[3].numel() != y.numel()) {
    return invalid_argument(who + ": Z has " + shape_to_string(in[3].shape) + ", the output " +
                            shape_to_string(y.shape));
  }
  for (size_t i = 0; i < in.size(); ++i) {
    if (present(in[i]) && in[i].dtype != t) {
      return invalid_argument(who + ": input " + std::to_string(i) + " is " +
                              std::string(dtype_name(in[i].dtype)));
    }
  }
  if (y.dtype != t) return invalid_argument(who + ": Y is " + std::string(dtype_name(y.dtype)));
  return ok_status();
}

// Zero-filled device buffers for timing a convolution's tactics, freed together.
class TimingBuffers {
 public:
  ~TimingBuffers() {
    for (void* p : ptrs_) cudaFree(p);
  }
  void* alloc(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(bytes, 256)) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    cudaMemset(p, 0, std::max<size_t>(bytes, 256));
    ptrs_.push_back(p);
    return p;
  }

 private:
  std::vector<void*> ptrs_;
};

}  // namespace kiln::backends::cuda
