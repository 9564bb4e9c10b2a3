// ConvTranspose on cuDNN 9 (legacy API): the data gradient of the convolution from Y to X
// (cudnnConvolutionBackwardData), whose filter layout [C, M/group, k...] is ConvTranspose's W.
// 1-D and 2-D, groups, strides, dilations, output_padding, output_shape; strict FP32 (FMA kernels).
// cuDNN pads both ends alike: the begin pad is the convolution's pad, and the end pad must be what
// the forward convolution of Y's size implies; the factory refuses other combinations.
#include <algorithm>
#include <array>
#include <optional>

#include "backends/cuda/cuda_common.h"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;

#define KILN_DNN_CHECK(expr, what)                                                    \
  do {                                                                                \
    cudnnStatus_t kiln_s_ = (expr);                                                   \
    if (kiln_s_ != CUDNN_STATUS_SUCCESS) {                                            \
      return internal_error(std::string(what) + ": " + cudnnGetErrorString(kiln_s_)); \
    }                                                                                 \
  } while (0)

enum class AutoPad { kNotSet, kSameUpper, kSameLower, kValid };

// The attributes, each list filled to the spatial rank.
struct TransposeAttrs {
  int ns = 0;
  int64_t group = 1;
  std::vector<int64_t> strides, dilations, pads, out_pad;
  AutoPad auto_pad = AutoPad::kNotSet;
};

// The begin pad of axis i for input size `in`, kernel size `k` and output size `out`, as the CPU
// reference derives it.
int64_t begin_pad(const TransposeAttrs& a, int i, int64_t in, int64_t k, int64_t out) {
  if (a.auto_pad == AutoPad::kSameUpper || a.auto_pad == AutoPad::kSameLower) {
    int64_t total = a.strides[i] * (in - 1) + a.out_pad[i] + (k - 1) * a.dilations[i] + 1 - out;
    return a.auto_pad == AutoPad::kSameUpper ? total / 2 : total - total / 2;
  }
  return a.auto_pad == AutoPad::kNotSet ? a.pads[i] : 0;
}

// Whether cuDNN's convolution with pad `pb` on both ends maps an output of size `out` to exactly
// `in` elements, so that its data gradient is ConvTranspose's Y.
bool fits(int64_t in, int64_t k, int64_t out, int64_t stride, int64_t dil, int64_t pb) {
  int64_t span = out + 2 * pb - ((k - 1) * dil + 1);
  return pb >= 0 && span >= 0 && span / stride == in - 1;
}

class ConvTransposeKernel final : public CudaKernel {
 public:
  explicit ConvTransposeKernel(TransposeAttrs a)
      : CudaKernel("cuda.ConvTranspose(cudnn,float32)"), a_(std::move(a)) {}
  ~ConvTransposeKernel() override {
    if (xd_) cudnnDestroyTensorDescriptor(xd_);
    if (yd_) cudnnDestroyTensorDescriptor(yd_);
    if (wd_) cudnnDestroyFilterDescriptor(wd_);
    if (cd_) cudnnDestroyConvolutionDescriptor(cd_);
  }

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &w = in[1], &y = out[0];
    if (x.rank() != a_.ns + 2 || w.rank() != x.rank() || y.rank() != x.rank()) {
      return invalid_argument(name_ + ": X " + shape_to_string(x.shape) + ", W " +
                              shape_to_string(w.shape) + " and Y " + shape_to_string(y.shape) +
                              " differ in rank");
    }
    if (y.numel() == 0) return ok_status();
    if (x.numel() == 0 || w.numel() == 0) {  // nothing scatters into Y: the bias alone
      KILN_CUDA_CHECK(cudaMemsetAsync(y.data, 0, y.nbytes(), stream_), name_);
    } else {
      Shape key(x.shape.begin(), x.shape.end());
      key.insert(key.end(), w.shape.begin(), w.shape.end());
      key.insert(key.end(), y.shape.begin(), y.shape.end());
      if (key != key_) KILN_RETURN_IF_ERROR(plan(x, w, y, key));
      KILN_ASSIGN_OR_RETURN(StreamResources * res, resources());
      float alpha = 1.f, beta = 0.f;
      KILN_DNN_CHECK(
          cudnnConvolutionBackwardData(res->dnn, &alpha, wd_, w.data, xd_, x.data, cd_, algo_,
                                       res->workspace, res->workspace_bytes, &beta, yd_, y.data),
          name_ + ": cudnnConvolutionBackwardData");
    }
    if (in.size() > 2 && present(in[2])) {
      int64_t m = y.shape[1], inner = y.numel() / (y.shape[0] * m);
      if (in[2].numel() != m) {
        return invalid_argument(name_ + ": B has " + std::to_string(in[2].numel()) +
                                " elements, expected " + std::to_string(m));
      }
      KILN_RETURN_IF_ERROR(add_channel_bias(y.as<float>(), in[2].as<const float>(), y.numel(), m,
                                            inner, 0, stream_));
    }
    return ok_status();
  }

 private:
  Status plan(const TensorView& x, const TensorView& w, const TensorView& y, const Shape& key) {
    int ns = a_.ns;
    if (w.shape[0] != x.shape[1] || w.shape[1] * a_.group != y.shape[1] ||
        y.shape[0] != x.shape[0]) {
      return invalid_argument(name_ + ": X " + shape_to_string(x.shape) + ", W " +
                              shape_to_string(w.shape) + " and Y " + shape_to_string(y.shape) +
                              " do not agree with group " + std::to_string(a_.group));
    }
    std::array<int, 2> pad{0, 0}, str{1, 1}, dil{1, 1};
    for (int i = 0; i < ns; ++i) {
      int slot = ns == 1 ? 1 : i;
      int64_t in = x.shape[2 + i], k = w.shape[2 + i], o = y.shape[2 + i];
      int64_t pb = begin_pad(a_, i, in, k, o);
      if (!fits(in, k, o, a_.strides[i], a_.dilations[i], pb)) {
        return invalid_argument(name_ + ": axis " + std::to_string(2 + i) + " (input " +
                                std::to_string(in) + ", output " + std::to_string(o) +
                                ") pads unevenly, which cuDNN cannot express");
      }
      pad[slot] = int(pb), str[slot] = int(a_.strides[i]), dil[slot] = int(a_.dilations[i]);
    }
    auto dim4 = [&](std::span<const int64_t> s) {
      std::array<int, 4> d{int(s[0]), int(s[1]), 1, 1};
      if (ns == 1)
        d[3] = int(s[2]);
      else
        d[2] = int(s[2]), d[3] = int(s[3]);
      return d;
    };
    if (!xd_) {
      KILN_DNN_CHECK(cudnnCreateTensorDescriptor(&xd_), "cudnnCreateTensorDescriptor");
      KILN_DNN_CHECK(cudnnCreateTensorDescriptor(&yd_), "cudnnCreateTensorDescriptor");
      KILN_DNN_CHECK(cudnnCreateFilterDescriptor(&wd_), "cudnnCreateFilterDescriptor");
      KILN_DNN_CHECK(cudnnCreateConvolutionDescriptor(&cd_), "cudnnCreateConvolutionDescriptor");
    }
    // In cuDNN's terms the forward convolution runs from Y ("x", M channels) to X ("y", C
    // channels).
    auto xs = dim4(x.shape), ws = dim4(w.shape), ys = dim4(y.shape);
    cudnnDataType_t dt = CUDNN_DATA_FLOAT;
    KILN_DNN_CHECK(
        cudnnSetTensor4dDescriptor(xd_, CUDNN_TENSOR_NCHW, dt, xs[0], xs[1], xs[2], xs[3]),
        name_ + ": X descriptor");
    KILN_DNN_CHECK(
        cudnnSetTensor4dDescriptor(yd_, CUDNN_TENSOR_NCHW, dt, ys[0], ys[1], ys[2], ys[3]),
        name_ + ": Y descriptor");
    KILN_DNN_CHECK(
        cudnnSetFilter4dDescriptor(wd_, dt, CUDNN_TENSOR_NCHW, ws[0], ws[1], ws[2], ws[3]),
        name_ + ": W descriptor");
    KILN_DNN_CHECK(
        cudnnSetConvolution2dDescriptor(cd_, pad[0], pad[1], str[0], str[1], dil[0], dil[1],
                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
        name_ + ": convolution descriptor");
    KILN_DNN_CHECK(cudnnSetConvolutionGroupCount(cd_, int(a_.group)), name_ + ": group count");
    KILN_DNN_CHECK(cudnnSetConvolutionMathType(cd_, CUDNN_FMA_MATH), name_ + ": math type");
    int on = 0, oc = 0, oh = 0, ow = 0;
    KILN_DNN_CHECK(cudnnGetConvolution2dForwardOutputDim(cd_, yd_, wd_, &on, &oc, &oh, &ow),
                   name_ + ": output dims");
    if (on != xs[0] || oc != xs[1] || oh != xs[2] || ow != xs[3]) {
      return invalid_argument(name_ + ": cuDNN maps Y " + shape_to_string(y.shape) + " to [" +
                              std::to_string(on) + ", " + std::to_string(oc) + ", " +
                              std::to_string(oh) + ", " + std::to_string(ow) + "], not X " +
                              shape_to_string(x.shape));
    }
    KILN_ASSIGN_OR_RETURN(StreamResources * res, resources());
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int found = 0;
    KILN_DNN_CHECK(
        cudnnGetConvolutionBackwardDataAlgorithm_v7(
            res->dnn, wd_, xd_, cd_, yd_, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &found, perf),
        name_ + ": choosing an algorithm");
    bool chosen = false;
    for (int i = 0; i < found && !chosen; ++i) {
      if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > res->workspace_bytes) continue;
      if (perf[i].mathType != CUDNN_FMA_MATH) continue;  // strict FP32
      algo_ = perf[i].algo;
      chosen = true;
    }
    if (!chosen)
      return unsupported(name_ + ": cuDNN offers no FP32 algorithm for X " +
                         shape_to_string(x.shape));
    key_ = key;
    return ok_status();
  }

  TransposeAttrs a_;
  Shape key_;
  cudnnTensorDescriptor_t xd_ = nullptr, yd_ = nullptr;
  cudnnFilterDescriptor_t wd_ = nullptr;
  cudnnConvolutionDescriptor_t cd_ = nullptr;
  cudnnConvolutionBwdDataAlgo_t algo_ = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
};

// A dim's value when known at build time.
std::optional<int64_t> known(const ir::Value* v, size_t d) {
  if (!v || !v->shape || d >= v->shape->size() || !(*v->shape)[d].is_const()) return std::nullopt;
  return (*v->shape)[d].value();
}

StatusOr<std::unique_ptr<Kernel>> make_conv_transpose(const KernelQuery& q) {
  const ir::Attributes& at = q.node.attrs;
  if (q.inputs.size() < 2 || !q.inputs[0] || !q.inputs[0]->shape || !q.inputs[1]) {
    return invalid_argument(q.node.describe() + ": X has no shape");
  }
  size_t rank = q.inputs[0]->shape->size();
  if (rank != 3 && rank != 4) {
    return unsupported(q.node.describe() +
                       ": the CUDA backend runs 1-D and 2-D ConvTranspose, not rank " +
                       std::to_string(rank));
  }
  TransposeAttrs a;
  a.ns = int(rank) - 2;
  size_t ns = size_t(a.ns);
  KILN_ASSIGN_OR_RETURN(a.group, at.get_int("group", 1));
  auto list = [&](const char* name, size_t n, int64_t fallback,
                  std::vector<int64_t>* out) -> Status {
    KILN_ASSIGN_OR_RETURN(*out, at.get_ints(name, std::vector<int64_t>{}));
    if (out->empty()) out->assign(n, fallback);
    if (out->size() != n) {
      return invalid_argument(q.node.describe() + ": attribute " + name + " has " +
                              std::to_string(out->size()) + " values, expected " +
                              std::to_string(n));
    }
    return ok_status();
  };
  KILN_RETURN_IF_ERROR(list("strides", ns, 1, &a.strides));
  KILN_RETURN_IF_ERROR(list("dilations", ns, 1, &a.dilations));
  KILN_RETURN_IF_ERROR(list("pads", 2 * ns, 0, &a.pads));
  KILN_RETURN_IF_ERROR(list("output_padding", ns, 0, &a.out_pad));
  KILN_ASSIGN_OR_RETURN(std::string auto_pad, at.get_string("auto_pad", "NOTSET"));
  KILN_ASSIGN_OR_RETURN(auto output_shape, at.get_ints("output_shape", std::vector<int64_t>{}));
  if (auto_pad == "NOTSET")
    a.auto_pad = AutoPad::kNotSet;
  else if (auto_pad == "SAME_UPPER")
    a.auto_pad = AutoPad::kSameUpper;
  else if (auto_pad == "SAME_LOWER")
    a.auto_pad = AutoPad::kSameLower;
  else if (auto_pad == "VALID")
    a.auto_pad = AutoPad::kValid;
  else
    return invalid_argument(q.node.describe() + ": unknown auto_pad '" + auto_pad + "'");
  if (a.group < 1) return invalid_argument(q.node.describe() + ": group must be >= 1");
  for (size_t i = 0; i < ns; ++i) {
    if (a.strides[i] < 1 || a.dilations[i] < 1) {
      return invalid_argument(q.node.describe() + ": strides and dilations must be >= 1");
    }
  }
  // Whether cuDNN's symmetric padding gives Y's size: from the attributes alone where Y's size
  // follows the input's (no output_shape), else from the sizes known at build time.
  const ir::Value* x = q.inputs[0];
  const ir::Value* w = q.inputs[1];
  const ir::Value* y = q.outputs.empty() ? nullptr : q.outputs[0];
  for (size_t i = 0; i < ns; ++i) {
    std::optional<int64_t> k = known(w, 2 + i), in = known(x, 2 + i), o = known(y, 2 + i);
    int64_t s = a.strides[i], d = a.dilations[i], op = a.out_pad[i];
    std::string axis = "axis " + std::to_string(2 + i);
    if (!k)
      return unsupported(q.node.describe() +
                         ": the CUDA ConvTranspose needs W's spatial size at build time");
    if (in && o) {
      int64_t pb = begin_pad(a, int(i), *in, *k, *o);
      if (!fits(*in, *k, *o, s, d, pb)) {
        return unsupported(q.node.describe() + ": " + axis + " pads " + std::to_string(pb) +
                           " at the start and " +
                           std::to_string(s * (*in - 1) + op + (*k - 1) * d + 1 - pb - *o) +
                           " at the end, which cuDNN's symmetric padding cannot express");
      }
      continue;
    }
    if (!output_shape.empty()) {
      return unsupported(q.node.describe() +
                         ": output_shape with an input size known only at run time may pad "
                         "asymmetrically, which the CUDA ConvTranspose does not support");
    }
    // Y = s*(in-1) + op + (k-1)*d + 1 - pb - pe, so cuDNN fits when 0 <= op + pb - pe < s.
    int64_t pb = 0, pe = 0;
    if (a.auto_pad == AutoPad::kNotSet) {
      pb = a.pads[i], pe = a.pads[ns + i];
    } else if (a.auto_pad != AutoPad::kValid) {  // SAME: Y = in*s
      int64_t total = op + (*k - 1) * d + 1 - s;
      pb = a.auto_pad == AutoPad::kSameUpper ? total / 2 : total - total / 2;
      pe = total - pb;
    }
    if (pb < 0 || op + pb - pe < 0 || op + pb - pe >= s) {
      return unsupported(q.node.describe() + ": " + axis + " pads " + std::to_string(pb) +
                         " at the start and " + std::to_string(pe) +
                         " at the end with output_padding " + std::to_string(op) +
                         ", which cuDNN's symmetric padding cannot express");
    }
  }
  return std::unique_ptr<Kernel>(new ConvTransposeKernel(std::move(a)));
}

}  // namespace

void register_conv_transpose(Registry& r) {
  r.add(OpKind::kConvTranspose, &make_conv_transpose, {.library = "cudnn", .float32_only = true});
}

}  // namespace kiln::backends::cuda
