// Conv on cuDNN 9 (legacy convolution API): 1-D and 2-D, groups, dilations, symmetric pads.
// Strict FP32 restricts cuDNN to FMA kernels; TF32 allows tensor-core TF32; FP16/BF16 convert the
// input (and the constant weights, once) and accumulate in FP32. Bias is added by a small kernel.
#include <algorithm>

#include "backends/cuda/cuda_common.h"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;

#define KILN_DNN_CHECK(expr, what)                                                                  \
  do {                                                                                              \
    cudnnStatus_t kiln_s_ = (expr);                                                                 \
    if (kiln_s_ != CUDNN_STATUS_SUCCESS) {                                                          \
      return internal_error(std::string(what) + ": " + cudnnGetErrorString(kiln_s_));               \
    }                                                                                               \
  } while (0)

class ConvKernel final : public CudaKernel {
 public:
  ConvKernel(MathMode mode, const void* prepared_w)
      : CudaKernel(std::string("cuda.Conv(cudnn,") + math_mode_name(mode) + ")"), mode_(mode),
        prepared_w_(prepared_w) {}
  ~ConvKernel() override {
    if (xd_) cudnnDestroyTensorDescriptor(xd_);
    if (yd_) cudnnDestroyTensorDescriptor(yd_);
    if (wd_) cudnnDestroyFilterDescriptor(wd_);
    if (cd_) cudnnDestroyConvolutionDescriptor(cd_);
  }

  std::vector<int64_t> strides, dilations, pads;
  int64_t group = 1;
  std::string auto_pad = "NOTSET";

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &w = in[1], &y = out[0];
    if (x.dtype != DType::kFloat32 || w.dtype != DType::kFloat32) return unsupported(name_ + ": float32 only on CUDA");
    int ns = x.rank() - 2;
    if (ns < 1 || ns > 2 || w.rank() != x.rank() || y.rank() != x.rank()) {
      return unsupported(name_ + ": the CUDA backend runs 1-D and 2-D convolutions (input " + shape_to_string(x.shape) + ")");
    }
    if (y.numel() == 0) return ok_status();
    Shape key(x.shape.begin(), x.shape.end());
    key.insert(key.end(), w.shape.begin(), w.shape.end());
    if (key != key_) KILN_RETURN_IF_ERROR(plan(x, w, y));
    KILN_ASSIGN_OR_RETURN(StreamResources * res, resources());
    const void* px = x.data;
    const void* pw = w.data;
    void* py = y.data;
    bool low = mode_ == MathMode::kFp16 || mode_ == MathMode::kBf16;
    if (low) {
      KILN_RETURN_IF_ERROR(xbuf_.reserve(x.numel() * 2));
      KILN_RETURN_IF_ERROR(ybuf_.reserve(y.numel() * 2));
      auto conv = mode_ == MathMode::kFp16 ? convert_f32_to_f16 : convert_f32_to_bf16;
      KILN_RETURN_IF_ERROR(conv(x.as<const float>(), xbuf_.data(), x.numel(), stream_));
      if (!prepared_w_) {  // a filter computed at run time; constant ones were prepared once
        KILN_RETURN_IF_ERROR(wbuf_.reserve(w.numel() * 2));
        KILN_RETURN_IF_ERROR(conv(w.as<const float>(), wbuf_.data(), w.numel(), stream_));
      }
      px = xbuf_.data(), pw = prepared_w_ ? prepared_w_ : wbuf_.data(), py = ybuf_.data();
    }
    float alpha = 1.f, beta = 0.f;
    KILN_DNN_CHECK(cudnnConvolutionForward(res->dnn, &alpha, xd_, px, wd_, pw, cd_, algo_, res->workspace,
                                           res->workspace_bytes, &beta, yd_, py),
                   name_ + ": cudnnConvolutionForward");
    if (low) {
      auto back = mode_ == MathMode::kFp16 ? convert_f16_to_f32 : convert_bf16_to_f32;
      KILN_RETURN_IF_ERROR(back(ybuf_.data(), y.as<float>(), y.numel(), stream_));
    }
    if (in.size() > 2 && present(in[2])) {
      int64_t c = y.shape[1], inner = y.numel() / (y.shape[0] * c);
      if (in[2].numel() != c) return invalid_argument("Conv: B has " + std::to_string(in[2].numel()) + " elements, expected " + std::to_string(c));
      KILN_RETURN_IF_ERROR(add_channel_bias(y.as<float>(), in[2].as<const float>(), y.numel(), c, inner, 0, stream_));
    }
    return ok_status();
  }

 private:
  Status plan(const TensorView& x, const TensorView& w, const TensorView& y) {
    int ns = x.rank() - 2;
    auto dim4 = [&](std::span<const int64_t> s) {
      std::array<int, 4> d{int(s[0]), int(s[1]), 1, 1};
      if (ns == 1) d[3] = int(s[2]);
      else d[2] = int(s[2]), d[3] = int(s[3]);
      return d;
    };
    std::array<int, 2> pad{0, 0}, str{1, 1}, dil{1, 1};
    for (int i = 0; i < ns; ++i) {
      int slot = ns == 1 ? 1 : i;
      int64_t k = w.shape[2 + i], in = x.shape[2 + i];
      int64_t s = strides.empty() ? 1 : strides[i], d = dilations.empty() ? 1 : dilations[i];
      int64_t pb = 0, pe = 0;
      if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
        int64_t expect = (in + s - 1) / s, eff = d * (k - 1) + 1;
        int64_t total = std::max<int64_t>(0, (expect - 1) * s + eff - in);
        pb = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
        pe = total - pb;
      } else if (auto_pad == "NOTSET" && !pads.empty()) {
        pb = pads[i], pe = pads[ns + i];
      }
      if (pb != pe) return unsupported(name_ + ": asymmetric padding is not supported on CUDA");
      pad[slot] = int(pb), str[slot] = int(s), dil[slot] = int(d);
    }
    cudnnDataType_t dt = mode_ == MathMode::kFp16 ? CUDNN_DATA_HALF
                         : mode_ == MathMode::kBf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    if (!xd_) {
      KILN_DNN_CHECK(cudnnCreateTensorDescriptor(&xd_), "cudnnCreateTensorDescriptor");
      KILN_DNN_CHECK(cudnnCreateTensorDescriptor(&yd_), "cudnnCreateTensorDescriptor");
      KILN_DNN_CHECK(cudnnCreateFilterDescriptor(&wd_), "cudnnCreateFilterDescriptor");
      KILN_DNN_CHECK(cudnnCreateConvolutionDescriptor(&cd_), "cudnnCreateConvolutionDescriptor");
    }
    auto xs = dim4(x.shape), ws = dim4(w.shape), ys = dim4(y.shape);
    KILN_DNN_CHECK(cudnnSetTensor4dDescriptor(xd_, CUDNN_TENSOR_NCHW, dt, xs[0], xs[1], xs[2], xs[3]), name_ + ": x descriptor");
    KILN_DNN_CHECK(cudnnSetTensor4dDescriptor(yd_, CUDNN_TENSOR_NCHW, dt, ys[0], ys[1], ys[2], ys[3]), name_ + ": y descriptor");
    KILN_DNN_CHECK(cudnnSetFilter4dDescriptor(wd_, dt, CUDNN_TENSOR_NCHW, ws[0], ws[1], ws[2], ws[3]), name_ + ": w descriptor");
    KILN_DNN_CHECK(cudnnSetConvolution2dDescriptor(cd_, pad[0], pad[1], str[0], str[1], dil[0], dil[1],
                                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                   name_ + ": convolution descriptor");
    KILN_DNN_CHECK(cudnnSetConvolutionGroupCount(cd_, int(group)), name_ + ": group count");
    cudnnMathType_t math = mode_ == MathMode::kFp32 ? CUDNN_FMA_MATH
                           : mode_ == MathMode::kTf32 ? CUDNN_DEFAULT_MATH : CUDNN_TENSOR_OP_MATH;
    KILN_DNN_CHECK(cudnnSetConvolutionMathType(cd_, math), name_ + ": math type");
    int on = 0, oc = 0, oh = 0, ow = 0;
    KILN_DNN_CHECK(cudnnGetConvolution2dForwardOutputDim(cd_, xd_, wd_, &on, &oc, &oh, &ow), name_ + ": output dims");
    if (on != ys[0] || oc != ys[1] || oh != ys[2] || ow != ys[3]) {
      return invalid_argument(name_ + ": cuDNN computes output [" + std::to_string(on) + ", " + std::to_string(oc) + ", " +
                              std::to_string(oh) + ", " + std::to_string(ow) + "] but the plan has " + shape_to_string(y.shape));
    }
    KILN_ASSIGN_OR_RETURN(StreamResources * res, resources());
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int found = 0;
    KILN_DNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(res->dnn, xd_, wd_, cd_, yd_, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                          &found, perf),
                   name_ + ": choosing an algorithm");
    bool chosen = false;
    for (int i = 0; i < found && !chosen; ++i) {
      if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > res->workspace_bytes) continue;
      if (mode_ == MathMode::kFp32 && perf[i].mathType != CUDNN_FMA_MATH) continue;
      algo_ = perf[i].algo;
      KILN_DNN_CHECK(cudnnSetConvolutionMathType(cd_, perf[i].mathType), name_ + ": math type");
      chosen = true;
    }
    if (!chosen) return unsupported(name_ + ": cuDNN offers no algorithm for input " + shape_to_string(x.shape));
    key_.assign(x.shape.begin(), x.shape.end());
    key_.insert(key_.end(), w.shape.begin(), w.shape.end());
    return ok_status();
  }

  MathMode mode_;
  Shape key_;
  cudnnTensorDescriptor_t xd_ = nullptr, yd_ = nullptr;
  cudnnFilterDescriptor_t wd_ = nullptr;
  cudnnConvolutionDescriptor_t cd_ = nullptr;
  cudnnConvolutionFwdAlgo_t algo_ = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  DeviceBuffer xbuf_, wbuf_, ybuf_;
  const void* prepared_w_;  // the FP16/BF16 filter, prepared once per engine
};

StatusOr<std::unique_ptr<Kernel>> make_conv(const KernelQuery& q) {
  const ir::Attributes& at = q.node.attrs;
  auto k = std::make_unique<ConvKernel>(math_mode(q), PreparedOperands::operand(q, 1));
  KILN_ASSIGN_OR_RETURN(k->strides, at.get_ints("strides", std::vector<int64_t>{}));
  KILN_ASSIGN_OR_RETURN(k->dilations, at.get_ints("dilations", std::vector<int64_t>{}));
  KILN_ASSIGN_OR_RETURN(k->pads, at.get_ints("pads", std::vector<int64_t>{}));
  KILN_ASSIGN_OR_RETURN(k->group, at.get_int("group", 1));
  KILN_ASSIGN_OR_RETURN(k->auto_pad, at.get_string("auto_pad", "NOTSET"));
  if (k->auto_pad != "NOTSET" && k->auto_pad != "SAME_UPPER" && k->auto_pad != "SAME_LOWER" && k->auto_pad != "VALID") {
    return invalid_argument(q.node.describe() + ": unknown auto_pad '" + k->auto_pad + "'");
  }
  if (q.inputs.empty() || !q.inputs[0] || !q.inputs[0]->shape) return invalid_argument(q.node.describe() + ": X has no shape");
  size_t rank = q.inputs[0]->shape->size();
  if (rank != 3 && rank != 4) {
    return unsupported(q.node.describe() + ": the CUDA backend runs 1-D and 2-D convolutions, not rank " + std::to_string(rank));
  }
  size_t ns = rank - 2;
  // SAME padding splits an odd total unevenly, which cuDNN's symmetric padding cannot express.
  // The total is (k-1)*dilation at stride 1 whatever the input size; otherwise the input size
  // must be known at build time to tell.
  if (k->auto_pad == "SAME_UPPER" || k->auto_pad == "SAME_LOWER") {
    const ir::Value* w = q.inputs.size() > 1 ? q.inputs[1] : nullptr;
    for (size_t i = 0; i < ns; ++i) {
      int64_t stride = i < k->strides.size() ? k->strides[i] : 1;
      int64_t dil = i < k->dilations.size() ? k->dilations[i] : 1;
      const ir::Dim* kd = w && w->shape && w->shape->size() == rank ? &(*w->shape)[2 + i] : nullptr;
      const ir::Dim& xd = (*q.inputs[0]->shape)[2 + i];
      if (!kd || !kd->is_const() || (stride != 1 && !xd.is_const())) {
        return unsupported(q.node.describe() + ": auto_pad " + k->auto_pad + " with stride " +
                           std::to_string(stride) + " over a spatial size known only at run time may " +
                           "pad asymmetrically, which the CUDA backend does not support");
      }
      int64_t in = xd.is_const() ? xd.value() : 0;
      int64_t span = (kd->value() - 1) * dil + 1;
      int64_t total = stride == 1 ? span - 1 : std::max<int64_t>(((in + stride - 1) / stride - 1) * stride + span - in, 0);
      if (total % 2 != 0) {
        return unsupported(q.node.describe() + ": auto_pad " + k->auto_pad + " pads axis " +
                           std::to_string(2 + i) + " by " + std::to_string(total) +
                           " in all (uneven), which the CUDA backend does not support");
      }
    }
  }
  if (k->pads.size() == 2 * ns) {
    for (size_t i = 0; i < ns; ++i) {
      if (k->pads[i] != k->pads[ns + i] && k->auto_pad == "NOTSET") {
        return unsupported(q.node.describe() + ": asymmetric padding is not supported on CUDA");
      }
    }
  }
  return std::unique_ptr<Kernel>(std::move(k));
}

StatusOr<std::shared_ptr<const PreparedNode>> prepare_conv(const KernelQuery& q) {
  return prepare_low_precision_operands(q, {1});
}

}  // namespace

void register_conv(Registry& r) {
  r.add(OpKind::kConv, &make_conv,
        {.library = "cudnn", .reduced_precision = true, .float32_only = true, .prepare = &prepare_conv});
}

}  // namespace kiln::backends::cuda
