// Conv on cuDNN 9 (legacy convolution API): 1-D and 2-D, groups, dilations, symmetric pads.
// Strict FP32 restricts cuDNN to FMA kernels; TF32 allows tensor-core TF32; FP16/BF16 math on
// float32 tensors converts the input into the kernel's workspace (and the constant weights once per
// engine) and accumulates in FP32. Float16/bfloat16 tensors (the precision pass keeps activations
// reduced) run natively: half descriptors, FP32 accumulation, tensor-op math. Bias is added by a
// small kernel. The tactic is the forward algorithm the builder took from cuDNN's ranking at the
// opt shapes, recorded in the plan.
//
// kiln::FusedConv (fuse_conv_activation, assign_layout) runs here too: activation(Conv(X, W, B) +
// Z) in NCHW or channels-last (layout="NHWC": X [N,H,W,C], W [K,kh,kw,C/g], Y and Z [N,H',W',K],
// cuDNN's NHWC tensors and KRSC filter, on which its FP16 tensor-core kernels run without the
// transposes it inserts around NCHW). Relu or no activation goes through cuDNN's fused
// cudnnConvolutionBiasActivationForward (bias, residual and ReLU in the convolution's epilogue);
// the other activations, and shapes the fused call refuses, take the convolution and then one
// epilogue pass (conv_epilogue.cu) for bias, residual and activation together.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "backends/cuda/conv_attrs.h"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;

// The cuDNN forward algorithms by tactic name.
constexpr std::pair<const char*, cudnnConvolutionFwdAlgo_t> kAlgos[] = {
    {"implicit_gemm", CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM},
    {"implicit_precomp_gemm", CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM},
    {"gemm", CUDNN_CONVOLUTION_FWD_ALGO_GEMM},
    {"direct", CUDNN_CONVOLUTION_FWD_ALGO_DIRECT},
    {"fft", CUDNN_CONVOLUTION_FWD_ALGO_FFT},
    {"fft_tiling", CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING},
    {"winograd", CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD},
    {"winograd_nonfused", CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED},
};
const char* algo_name(cudnnConvolutionFwdAlgo_t a) {
  for (const auto& [name, algo] : kAlgos) {
    if (algo == a) return name;
  }
  return "unknown";
}

// A tactic: "algo=<name>", then optionally " epilogue=separate" (a FusedConv whose activation
// cuDNN's fused call could apply runs the convolution and then its own epilogue pass instead) and
// " small=<name> below=<N>" (the algorithm for a batch under N, timed at the profile's min shapes
// where they differ from opt). The math mode follows the node's precision.
struct ConvTactic {
  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  bool separate = false;
  cudnnConvolutionFwdAlgo_t small = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  int64_t below = 0;  // 0: one algorithm for every batch
};
StatusOr<cudnnConvolutionFwdAlgo_t> parse_algo(const std::string& name, const std::string& t) {
  for (const auto& [n, algo] : kAlgos) {
    if (name == n) return algo;
  }
  return invalid_argument("cuDNN convolution tactic '" + t + "' names '" + name +
                          "', not one of cuDNN's forward algorithms");
}
StatusOr<ConvTactic> parse_tactic(const std::string& t) {
  ConvTactic c;
  if (t.empty()) return c;
  bool has_algo = false, has_small = false, has_epilogue = false;
  size_t at = 0;
  while (at < t.size()) {
    size_t end = t.find(' ', at);
    std::string part = t.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at = end == std::string::npos ? t.size() : end + 1;
    if (part.rfind("algo=", 0) == 0 && !has_algo) {
      KILN_ASSIGN_OR_RETURN(c.algo, parse_algo(part.substr(5), t));
      has_algo = true;
    } else if (part == "epilogue=separate" && has_algo && !has_epilogue && !has_small) {
      c.separate = has_epilogue = true;
    } else if (part.rfind("small=", 0) == 0 && !has_small) {
      KILN_ASSIGN_OR_RETURN(c.small, parse_algo(part.substr(6), t));
      has_small = true;
    } else if (part.rfind("below=", 0) == 0 && c.below == 0 && part.size() > 6 &&
               part.size() < 16 && part.find_first_not_of("0123456789", 6) == std::string::npos) {
      c.below = std::stoll(part.substr(6));
    } else {
      return invalid_argument(
          "cuDNN convolution tactic '" + t +
          "' is not algo=<algorithm> [epilogue=separate] [small=<algorithm> below=<batch>]");
    }
  }
  if (!has_algo || has_small != (c.below > 0)) {
    return invalid_argument(
        "cuDNN convolution tactic '" + t +
        "' is not algo=<algorithm> [epilogue=separate] [small=<algorithm> below=<batch>]");
  }
  return c;
}

// What the descriptors say: float16/bfloat16 tensors in their own type on tensor cores (whatever
// the math mode, which the plan leaves at the tensors' own precision); float32 tensors per the
// math mode.
cudnnDataType_t data_type(DType tensors, MathMode m) {
  if (tensors == DType::kFloat16) return CUDNN_DATA_HALF;
  if (tensors == DType::kBFloat16) return CUDNN_DATA_BFLOAT16;
  return m == MathMode::kFp16   ? CUDNN_DATA_HALF
         : m == MathMode::kBf16 ? CUDNN_DATA_BFLOAT16
                                : CUDNN_DATA_FLOAT;
}
cudnnMathType_t math_type(DType tensors, MathMode m) {
  if (is_half(tensors)) return CUDNN_TENSOR_OP_MATH;
  return m == MathMode::kFp32   ? CUDNN_FMA_MATH
         : m == MathMode::kTf32 ? CUDNN_DEFAULT_MATH
                                : CUDNN_TENSOR_OP_MATH;
}

// An NHWC shape ([N,H,W,C], or a KRSC filter [K,kh,kw,C]) in NCHW order, which describe() reads.
Shape nchw_order(std::span<const int64_t> s, bool nhwc) {
  Shape out(s.begin(), s.end());
  if (nhwc && s.size() == 4) out = {s[0], s[3], s[1], s[2]};
  return out;
}

// cuDNN descriptors of one convolution problem (shapes given in NCHW order; `nhwc` sets the
// tensors' and filter's memory format; 1-D runs as H = 1).
class ConvDesc {
 public:
  ~ConvDesc() {
    if (xd) cudnnDestroyTensorDescriptor(xd);
    if (yd) cudnnDestroyTensorDescriptor(yd);
    if (bd) cudnnDestroyTensorDescriptor(bd);
    if (ad) cudnnDestroyActivationDescriptor(ad);
    if (wd) cudnnDestroyFilterDescriptor(wd);
    if (cd) cudnnDestroyConvolutionDescriptor(cd);
  }
  Status describe(const ConvAttrs& c, DType tensors, MathMode mode, std::span<const int64_t> x,
                  std::span<const int64_t> w, std::span<const int64_t> y, const std::string& who) {
    int ns = int(x.size()) - 2;
    auto dim4 = [&](std::span<const int64_t> s) {
      std::array<int, 4> d{int(s[0]), int(s[1]), 1, 1};
      if (ns == 1)
        d[3] = int(s[2]);
      else
        d[2] = int(s[2]), d[3] = int(s[3]);
      return d;
    };
    std::array<int, 2> pad{0, 0}, str{1, 1}, dil{1, 1};
    for (int i = 0; i < ns; ++i) {
      int slot = ns == 1 ? 1 : i;
      int64_t k = w[2 + i], in = x[2 + i];
      int64_t s = c.strides.empty() ? 1 : c.strides[i],
              d = c.dilations.empty() ? 1 : c.dilations[i];
      int64_t pb = 0, pe = 0;
      if (c.auto_pad == "SAME_UPPER" || c.auto_pad == "SAME_LOWER") {
        int64_t expect = (in + s - 1) / s, eff = d * (k - 1) + 1;
        int64_t total = std::max<int64_t>(0, (expect - 1) * s + eff - in);
        pb = c.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
        pe = total - pb;
      } else if (c.auto_pad == "NOTSET" && !c.pads.empty()) {
        pb = c.pads[i], pe = c.pads[ns + i];
      }
      if (pb != pe) return unsupported(who + ": asymmetric padding is not supported on CUDA");
      pad[slot] = int(pb), str[slot] = int(s), dil[slot] = int(d);
    }
    cudnnDataType_t dt = data_type(tensors, mode);
    if (!xd) {
      KILN_DNN_CHECK(cudnnCreateTensorDescriptor(&xd), "cudnnCreateTensorDescriptor");
      KILN_DNN_CHECK(cudnnCreateTensorDescriptor(&yd), "cudnnCreateTensorDescriptor");
      KILN_DNN_CHECK(cudnnCreateTensorDescriptor(&bd), "cudnnCreateTensorDescriptor");
      KILN_DNN_CHECK(cudnnCreateFilterDescriptor(&wd), "cudnnCreateFilterDescriptor");
      KILN_DNN_CHECK(cudnnCreateActivationDescriptor(&ad), "cudnnCreateActivationDescriptor");
      KILN_DNN_CHECK(cudnnCreateConvolutionDescriptor(&cd), "cudnnCreateConvolutionDescriptor");
    }
    auto xs = dim4(x), ws = dim4(w), ys = dim4(y);
    const cudnnTensorFormat_t f = c.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    KILN_DNN_CHECK(cudnnSetTensor4dDescriptor(xd, f, dt, xs[0], xs[1], xs[2], xs[3]),
                   who + ": x descriptor");
    KILN_DNN_CHECK(cudnnSetTensor4dDescriptor(yd, f, dt, ys[0], ys[1], ys[2], ys[3]),
                   who + ": y descriptor");
    KILN_DNN_CHECK(cudnnSetFilter4dDescriptor(wd, dt, f, ws[0], ws[1], ws[2], ws[3]),
                   who + ": w descriptor");
    // The bias of the fused call: one value per output channel, in Y's type.
    KILN_DNN_CHECK(cudnnSetTensor4dDescriptor(bd, CUDNN_TENSOR_NCHW, dt, 1, ys[1], 1, 1),
                   who + ": bias descriptor");
    KILN_DNN_CHECK(
        cudnnSetConvolution2dDescriptor(cd, pad[0], pad[1], str[0], str[1], dil[0], dil[1],
                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
        who + ": convolution descriptor");
    KILN_DNN_CHECK(cudnnSetConvolutionGroupCount(cd, int(c.group)), who + ": group count");
    KILN_DNN_CHECK(cudnnSetConvolutionMathType(cd, math_type(tensors, mode)), who + ": math type");
    KILN_DNN_CHECK(
        cudnnSetActivationDescriptor(
            ad, c.act == ConvActivation::kRelu ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY,
            CUDNN_NOT_PROPAGATE_NAN, 0.0),
        who + ": activation descriptor");
    int on = 0, oc = 0, oh = 0, ow = 0;
    KILN_DNN_CHECK(cudnnGetConvolution2dForwardOutputDim(cd, xd, wd, &on, &oc, &oh, &ow),
                   who + ": output dims");
    if (on != ys[0] || oc != ys[1] || oh != ys[2] || ow != ys[3]) {
      return invalid_argument(who + ": cuDNN computes output [" + std::to_string(on) + ", " +
                              std::to_string(oc) + ", " + std::to_string(oh) + ", " +
                              std::to_string(ow) + "] but the plan has " + shape_to_string(y));
    }
    return ok_status();
  }

  cudnnTensorDescriptor_t xd = nullptr, yd = nullptr, bd = nullptr;
  cudnnFilterDescriptor_t wd = nullptr;
  cudnnConvolutionDescriptor_t cd = nullptr;
  cudnnActivationDescriptor_t ad = nullptr;
};

// The per-stream library workspace an algorithm may use (StreamResources::workspace_bytes).
constexpr size_t kLibraryWorkspace = size_t(32) << 20;

// Runs the algorithm the plan recorded. Where it cannot run a shape of the profile (cuDNN refuses
// it, or it needs more than the library workspace), IMPLICIT_GEMM, which runs every shape with no
// workspace: a fixed rule, not a new choice.
class ConvKernel final : public CudaKernel {
 public:
  ConvKernel(bool fused, DType tensors, MathMode mode, ConvAttrs attrs, ConvTactic tactic,
             const void* prepared_w)
      : CudaKernel(std::string(fused ? "cuda.FusedConv(cudnn," : "cuda.Conv(cudnn,") +
                   (attrs.nhwc ? "NHWC," : "") +
                   (is_half(tensors) ? std::string(dtype_name(tensors)) + " tensors"
                                     : std::string(math_mode_name(mode))) +
                   ")"),
        fused_(fused),
        tensors_(tensors),
        mode_(mode),
        attrs_(std::move(attrs)),
        recorded_(tactic),
        prepared_w_(prepared_w) {}

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &w = in[1], &y = out[0];
    int ns = x.rank() - 2;
    if (ns < 1 || ns > 2 || w.rank() != x.rank() || y.rank() != x.rank() ||
        (attrs_.nhwc && ns != 2)) {
      return unsupported(name_ + ": the CUDA backend runs 1-D and 2-D convolutions (input " +
                         shape_to_string(x.shape) + ")");
    }
    if (y.numel() == 0) return ok_status();
    KILN_ASSIGN_OR_RETURN(StreamResources * res, resources());
    Shape key(x.shape.begin(), x.shape.end());
    key.insert(key.end(), w.shape.begin(), w.shape.end());
    if (key != key_) KILN_RETURN_IF_ERROR(plan(x, w, y, res));
    const bool has_bias = in.size() > 2 && present(in[2]);
    const bool has_z = in.size() > 3 && present(in[3]);
    const int64_t channels = attrs_.nhwc ? y.shape[3] : y.shape[1];
    if (has_bias && in[2].numel() != channels) {
      return invalid_argument(name_ + ": B has " + std::to_string(in[2].numel()) +
                              " elements, expected " + std::to_string(channels));
    }
    if (has_z && in[3].numel() != y.numel()) {
      return invalid_argument(name_ + ": Z has " + shape_to_string(in[3].shape) + ", the output " +
                              shape_to_string(y.shape));
    }
    for (size_t i = 0; i < in.size(); ++i) {
      if (present(in[i]) && in[i].dtype != tensors_) {
        return invalid_argument(
            name_ + ": input " + std::to_string(i) + " is " + std::string(dtype_name(in[i].dtype)) +
            "; X, W, B, Z and Y must all be " + std::string(dtype_name(tensors_)));
      }
    }
    if (y.dtype != tensors_)
      return invalid_argument(name_ + ": Y must be " + std::string(dtype_name(tensors_)));
    const bool low = !is_half(tensors_) && (mode_ == MathMode::kFp16 || mode_ == MathMode::kBf16);
    if (!low) return execute_native(in, y, has_bias, has_z, channels, res);
    // Float32 tensors computing in FP16/BF16: the convolution on converted copies, then bias,
    // residual and activation on the float32 result.
    const void* px = x.data;
    const void* pw = w.data;
    void* py = y.data;
    {
      // Workspace: x, then y, then (for a filter computed at run time) w, each in FP16/BF16.
      const size_t xb = workspace_piece(size_t(x.numel()) * 2),
                   yb = workspace_piece(size_t(y.numel()) * 2);
      const size_t wb = prepared_w_ ? 0 : workspace_piece(size_t(w.numel()) * 2);
      KILN_RETURN_IF_ERROR(check_workspace(xb + yb + wb, name_));
      char* ws = static_cast<char*>(workspace_);
      auto conv = mode_ == MathMode::kFp16 ? convert_f32_to_f16 : convert_f32_to_bf16;
      KILN_RETURN_IF_ERROR(conv(x.as<const float>(), ws, x.numel(), stream_));
      if (!prepared_w_)
        KILN_RETURN_IF_ERROR(conv(w.as<const float>(), ws + xb + yb, w.numel(), stream_));
      px = ws, py = ws + xb, pw = prepared_w_ ? prepared_w_ : ws + xb + yb;
    }
    float alpha = 1.f, beta = 0.f;
    KILN_DNN_CHECK(cudnnConvolutionForward(res->dnn, &alpha, d_.xd, px, d_.wd, pw, d_.cd, algo_,
                                           res->workspace, res->workspace_bytes, &beta, d_.yd, py),
                   name_ + ": cudnnConvolutionForward");
    auto back = mode_ == MathMode::kFp16 ? convert_f16_to_f32 : convert_bf16_to_f32;
    KILN_RETURN_IF_ERROR(back(py, y.as<float>(), y.numel(), stream_));
    return epilogue(in, y, has_bias, has_z, channels);
  }

 private:
  // X, W, B, Z and Y in one type (float32 in FP32/TF32 math, or float16/bfloat16 with FP32
  // accumulation), read and written by cuDNN as they are. ReLU or no activation: the fused call
  // (a zero bias from the workspace where B is absent; Z added with alpha2 = 1). Otherwise, or
  // where the fused call refuses the problem: the convolution, then one epilogue pass.
  Status execute_native(std::span<const TensorView> in, const TensorView& y, bool has_bias,
                        bool has_z, int64_t channels, StreamResources* res) {
    const TensorView &x = in[0], &w = in[1];
    float alpha = 1.f, beta = 0.f;
    if (fused_ && fused_call_ok_) {
      const void* bias = has_bias ? in[2].data : workspace_;
      if (!has_bias) {
        KILN_RETURN_IF_ERROR(check_workspace(size_t(channels) * dtype_size(tensors_), name_));
        KILN_CUDA_CHECK(
            cudaMemsetAsync(workspace_, 0, size_t(channels) * dtype_size(tensors_), stream_),
            name_ + ": zero bias");
      }
      float alpha2 = has_z ? 1.f : 0.f;
      const void* z = has_z ? in[3].data : y.data;
      cudnnStatus_t st = cudnnConvolutionBiasActivationForward(
          res->dnn, &alpha, d_.xd, x.data, d_.wd, w.data, d_.cd, fused_algo_, res->workspace,
          res->workspace_bytes, &alpha2, d_.yd, z, d_.bd, bias, d_.ad, d_.yd, y.data);
      if (st == CUDNN_STATUS_SUCCESS) return ok_status();
      // cuDNN checks a problem before it enqueues anything: the refusal leaves Y untouched, and
      // the convolution plus epilogue below computes the same.
      if (st != CUDNN_STATUS_NOT_SUPPORTED && st != CUDNN_STATUS_BAD_PARAM) {
        KILN_DNN_CHECK(st, name_ + ": cudnnConvolutionBiasActivationForward");
      }
      fused_call_ok_ = false;
    }
    KILN_DNN_CHECK(
        cudnnConvolutionForward(res->dnn, &alpha, d_.xd, x.data, d_.wd, w.data, d_.cd, algo_,
                                res->workspace, res->workspace_bytes, &beta, d_.yd, y.data),
        name_ + ": cudnnConvolutionForward");
    return epilogue(in, y, has_bias, has_z, channels);
  }

  // Bias, residual and activation over the convolution's Y, in one pass (none when there are none).
  Status epilogue(std::span<const TensorView> in, const TensorView& y, bool has_bias, bool has_z,
                  int64_t channels) {
    if (!has_bias && !has_z && attrs_.act == ConvActivation::kNone) return ok_status();
    const int64_t inner = attrs_.nhwc ? 1 : y.numel() / (y.shape[0] * channels);
    return conv_epilogue(y.dtype, y.data, has_bias ? in[2].data : nullptr,
                         has_z ? in[3].data : nullptr, y.numel(), channels, inner, attrs_.act,
                         attrs_.p0, attrs_.p1, stream_);
  }

  Status plan(const TensorView& x, const TensorView& w, const TensorView& y, StreamResources* res) {
    key_.clear();
    Shape xs = nchw_order(x.shape, attrs_.nhwc), ws = nchw_order(w.shape, attrs_.nhwc),
          ys = nchw_order(y.shape, attrs_.nhwc);
    KILN_RETURN_IF_ERROR(d_.describe(attrs_, tensors_, mode_, xs, ws, ys, name_));
    auto runs = [&](cudnnConvolutionFwdAlgo_t a) {
      size_t need = 0;
      return cudnnGetConvolutionForwardWorkspaceSize(res->dnn, d_.xd, d_.wd, d_.cd, d_.yd, a,
                                                     &need) == CUDNN_STATUS_SUCCESS &&
             need <= res->workspace_bytes;
    };
    const cudnnConvolutionFwdAlgo_t want =
        x.shape[0] < recorded_.below ? recorded_.small : recorded_.algo;
    algo_ = runs(want) ? want : CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    // The fused call with no activation runs only IMPLICIT_PRECOMP_GEMM (cuDNN's rule); with ReLU
    // the recorded algorithm.
    fused_call_ok_ = fused_ && !recorded_.separate &&
                     (attrs_.act == ConvActivation::kRelu || attrs_.act == ConvActivation::kNone);
    fused_algo_ = attrs_.act == ConvActivation::kRelu
                      ? algo_
                      : CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
    if (fused_call_ok_ && !runs(fused_algo_)) fused_call_ok_ = false;
    key_.assign(x.shape.begin(), x.shape.end());
    key_.insert(key_.end(), w.shape.begin(), w.shape.end());
    return ok_status();
  }

  bool fused_;     // kiln::FusedConv: bias, Z and activation in the epilogue
  DType tensors_;  // X, W, B, Z and Y: float32, or float16/bfloat16 run natively
  MathMode mode_;
  ConvAttrs attrs_;
  ConvTactic recorded_;
  cudnnConvolutionFwdAlgo_t algo_ = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  cudnnConvolutionFwdAlgo_t fused_algo_ = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  bool fused_call_ok_ = false;
  Shape key_;
  ConvDesc d_;
  const void* prepared_w_;  // the FP16/BF16 filter of float32 tensors, prepared once per engine
};

// cuDNN's algorithms for one problem that run in the math mode within the library workspace,
// fastest first (measured; at optimization level 0, cuDNN's heuristic order, nothing run); empty
// where cuDNN has no answer.
std::vector<cudnnConvolutionFwdAlgo_t> timed_algos(cudnnHandle_t handle, const KernelQuery& q,
                                                   const ConvAttrs& attrs, const Shape& x,
                                                   const Shape& w, const Shape& y) {
  std::vector<cudnnConvolutionFwdAlgo_t> out;
  if (!(x.size() == 3 || x.size() == 4) || shape_numel(y) == 0) return out;
  MathMode mode = math_mode(q);
  DType tensors = q.input_dtype(0);
  ConvDesc d;
  if (!d.describe(attrs, tensors, mode, nchw_order(x, attrs.nhwc), nchw_order(w, attrs.nhwc),
                  nchw_order(y, attrs.nhwc), q.node.describe())
           .ok()) {
    return out;
  }
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int found = 0;
  const cudnnStatus_t st =
      q.optimization_level == 0
          ? cudnnGetConvolutionForwardAlgorithm_v7(handle, d.xd, d.wd, d.cd, d.yd,
                                                   CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &found, perf)
          : cudnnFindConvolutionForwardAlgorithm(handle, d.xd, d.wd, d.cd, d.yd,
                                                 CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &found, perf);
  if (st != CUDNN_STATUS_SUCCESS) return out;
  for (int i = 0; i < found; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > kLibraryWorkspace) continue;
    if (!is_half(tensors) && mode == MathMode::kFp32 && perf[i].mathType != CUDNN_FMA_MATH)
      continue;
    if (std::find(out.begin(), out.end(), perf[i].algo) == out.end()) out.push_back(perf[i].algo);
  }
  return out;
}

StatusOr<std::unique_ptr<Kernel>> make_conv(const KernelQuery& q);

// The kernel as the engine will run it under `tactic` (cuDNN's fused call or the convolution plus
// the epilogue pass, and whatever cuDNN picks inside the algorithm for these shapes): the mean of
// five runs after one that plans it, in ms; infinity where it does not run.
double time_tactic(const KernelQuery& q, const std::string& tactic, std::span<const TensorView> in,
                   const TensorView& y, void* workspace, size_t workspace_bytes, cudaStream_t s) {
  constexpr double kNever = std::numeric_limits<double>::infinity();
  KernelQuery tq = q;
  tq.tactic = tactic;
  auto kernel = make_conv(tq);
  if (!kernel.ok()) return kNever;
  (*kernel)->set_stream(s);
  (*kernel)->set_workspace(workspace, workspace_bytes);
  std::array<TensorView, 1> out{y};
  if (!(*kernel)->execute(in, out).ok() || cudaStreamSynchronize(s) != cudaSuccess) {
    cudaGetLastError();
    return kNever;
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, s);
  bool ok = true;
  for (int i = 0; i < 5 && ok; ++i) ok = (*kernel)->execute(in, out).ok();
  cudaEventRecord(stop, s);
  float ms = 0;
  ok = ok && cudaEventSynchronize(stop) == cudaSuccess &&
       cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGetLastError();
  return ok ? double(ms) / 5 : kNever;
}

// The tactics, the default first. The candidates: the algorithms that run in the node's math mode
// (for float16/bfloat16 tensors, on their half descriptors, in the node's layout) within the
// library workspace, each with cuDNN's fused epilogue and with the separate one where a FusedConv's
// activation allows both. From optimization level 1, each candidate is timed as the kernel runs it
// (time_tactic) on zero-filled operands at the opt shapes, fastest first, and again at the min
// shapes for a small-batch choice (see ConvTactic); float32 tensors computing in FP16/BF16 take
// cudnnFindConvolutionForwardAlgorithm's ranking of the bare convolution. cuDNN's own ranking
// alone misleads: on MobileNetV3 its fastest bare algorithm, run through the fused call, took the
// pre-tensor-core implicit_convolve_sgemm or the grouped direct kernel (up to 980 us a layer).
// implicit_gemm (which runs every shape) is always last.
std::vector<std::string> conv_tactics(const KernelQuery& q) {
  std::vector<std::string> out;
  const ir::Value* xv = q.inputs.size() > 0 ? q.inputs[0] : nullptr;
  const ir::Value* wv = q.inputs.size() > 1 ? q.inputs[1] : nullptr;
  const ir::Value* yv = q.outputs.empty() ? nullptr : q.outputs[0];
  auto x = q.opt_shape(xv), w = q.opt_shape(wv), y = q.opt_shape(yv);
  auto attrs = conv_attrs(q);
  static cudnnHandle_t handle = [] {
    cudnnHandle_t h = nullptr;
    return cudnnCreate(&h) == CUDNN_STATUS_SUCCESS ? h : nullptr;
  }();
  const std::string fallback = "algo=implicit_gemm";
  auto finish = [&] {
    if (std::find(out.begin(), out.end(), fallback) == out.end()) out.push_back(fallback);
    return out;
  };
  if (!handle || !x || !w || !y || !attrs.ok()) return finish();
  std::vector<cudnnConvolutionFwdAlgo_t> ranked = timed_algos(handle, q, *attrs, *x, *w, *y);
  const bool fusable = q.node.op_type == "FusedConv" &&
                       (attrs->act == ConvActivation::kRelu || attrs->act == ConvActivation::kNone);
  std::vector<std::string> candidates;
  for (cudnnConvolutionFwdAlgo_t a : ranked) {
    candidates.push_back(std::string("algo=") + algo_name(a));
    if (fusable) candidates.push_back(candidates.back() + " epilogue=separate");
  }
  const DType t = q.input_dtype(0);
  const MathMode mode = math_mode(q);
  const bool measurable =
      q.optimization_level > 0 && !candidates.empty() &&
      (is_half(t) || (t == DType::kFloat32 && mode != MathMode::kFp16 && mode != MathMode::kBf16));
  if (!measurable) {
    for (const auto& c : candidates) out.push_back(c);
    return finish();
  }
  // Operands at the opt shapes (the min shapes fit in them), and a stream of the build's own.
  static cudaStream_t stream = [] {
    cudaStream_t st = nullptr;
    return cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess ? st : nullptr;
  }();
  const size_t es = dtype_size(t);
  TimingBuffers buffers;
  std::vector<Shape> shapes(q.inputs.size());
  std::vector<TensorView> in(q.inputs.size());
  bool allocated = stream != nullptr;
  for (size_t i = 0; i < q.inputs.size() && allocated; ++i) {
    if (!q.inputs[i]) continue;
    auto shape = i == 3 ? y : q.opt_shape(q.inputs[i]);
    if (!shape) {
      allocated = false;
      break;
    }
    shapes[i] = *shape;
    in[i] = TensorView{buffers.alloc(size_t(shape_numel(*shape)) * es), t, shapes[i]};
    allocated = in[i].data != nullptr;
  }
  Shape y_shape = *y;
  TensorView y_view{allocated ? buffers.alloc(size_t(shape_numel(*y)) * es) : nullptr, t, y_shape};
  const size_t ws_bytes = workspace_piece(size_t((*w)[0]) * es);
  void* ws = allocated ? buffers.alloc(ws_bytes) : nullptr;
  if (!allocated || !y_view.data || !ws) {
    for (const auto& c : candidates) out.push_back(c);
    return finish();
  }
  std::vector<std::pair<double, std::string>> timed;
  for (const auto& c : candidates)
    timed.emplace_back(time_tactic(q, c, in, y_view, ws, ws_bytes, stream), c);
  std::stable_sort(timed.begin(), timed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [ms, c] : timed) {
    if (ms < std::numeric_limits<double>::infinity()) out.push_back(c);
  }
  // A profile whose min batch is smaller: the fastest algorithm there (with the epilogue chosen at
  // opt), for batches nearer min than opt (below their geometric mean), when it is another one.
  auto xm = q.min_shape(xv), ym = q.min_shape(yv);
  if (!out.empty() && xm && ym && xm->size() == x->size() && (*xm)[0] < (*x)[0] && (*xm)[0] > 0) {
    const std::string best = out.front();
    const bool separate = best.find(" epilogue=separate") != std::string::npos;
    std::vector<Shape> min_shapes = shapes;
    std::vector<TensorView> min_in = in;
    min_shapes[0] = *xm;
    min_in[0].shape = min_shapes[0];
    if (min_in.size() > 3 && present(min_in[3])) {
      min_shapes[3] = *ym;
      min_in[3].shape = min_shapes[3];
    }
    Shape ym_shape = *ym;
    TensorView ym_view{y_view.data, t, ym_shape};
    double best_ms = std::numeric_limits<double>::infinity();
    std::string small;
    for (cudnnConvolutionFwdAlgo_t a : ranked) {
      std::string c = std::string("algo=") + algo_name(a) + (separate ? " epilogue=separate" : "");
      double ms = time_tactic(q, c, min_in, ym_view, ws, ws_bytes, stream);
      if (ms < best_ms) best_ms = ms, small = algo_name(a);
    }
    const std::string best_algo = best.substr(
        5, best.find(' ') == std::string::npos ? std::string::npos : best.find(' ') - 5);
    if (!small.empty() && small != best_algo) {
      auto below = int64_t(std::ceil(std::sqrt(double((*xm)[0]) * double((*x)[0]))));
      out.insert(out.begin(), best + " small=" + small + " below=" + std::to_string(below));
    }
  }
  return finish();
}

// The workspace: FP16/BF16 copies of float32 x, y and a filter computed at run time (none for
// float16/bfloat16 tensors, which cuDNN reads as they are).
ir::Dim conv_workspace(const KernelQuery& q) {
  MathMode mode = math_mode(q);
  if (mode != MathMode::kFp16 && mode != MathMode::kBf16) return 0;
  if (is_half(q.input_dtype(0))) return 0;
  ir::Dim total = workspace_piece(q.inputs.empty() ? nullptr : q.inputs[0], 2) +
                  workspace_piece(q.outputs.empty() ? nullptr : q.outputs[0], 2);
  if (!q.input_is_constant(1) && q.inputs.size() > 1)
    total = total + workspace_piece(q.inputs[1], 2);
  return total;
}

// X, W, B and Y of one type: float32, float16 or bfloat16.
Status check_conv_dtypes(const KernelQuery& q) {
  DType t = q.input_dtype(0);
  if (t != DType::kFloat32 && !is_half(t)) {
    return unsupported(q.node.describe() +
                       ": the cuDNN convolution takes float32, float16 or bfloat16 X, not " +
                       std::string(dtype_name(t)));
  }
  const std::pair<DType, const char*> others[] = {
      {q.input_dtype(1), "W"}, {q.input_dtype(2), "B"}, {q.output_dtype(0), "Y"}};
  for (const auto& [dt, what] : others) {
    if (dt != DType::kUndefined && dt != t) {
      return unsupported(q.node.describe() + ": " + what + " is " + std::string(dtype_name(dt)) +
                         " while X is " + std::string(dtype_name(t)) +
                         "; the cuDNN convolution takes one type");
    }
  }
  return ok_status();
}

StatusOr<std::unique_ptr<Kernel>> make_conv(const KernelQuery& q) {
  KILN_RETURN_IF_ERROR(check_conv_dtypes(q));
  KILN_ASSIGN_OR_RETURN(ConvAttrs c, conv_attrs(q));
  KILN_RETURN_IF_ERROR(check_no_input_activation(q, c, "cuda.cudnn.Conv"));
  const bool fused = q.node.op_type == "FusedConv";
  if (fused) {
    const std::pair<DType, const char*> z{q.input_dtype(3), "Z"};
    if (z.first != DType::kUndefined && z.first != q.input_dtype(0)) {
      return unsupported(q.node.describe() + ": Z is " + std::string(dtype_name(z.first)) +
                         " while X is " + std::string(dtype_name(q.input_dtype(0))));
    }
  }
  KILN_ASSIGN_OR_RETURN(ConvTactic algo, parse_tactic(q.tactic));
  const ConvAttrs* k = &c;
  if (k->auto_pad != "NOTSET" && k->auto_pad != "SAME_UPPER" && k->auto_pad != "SAME_LOWER" &&
      k->auto_pad != "VALID") {
    return invalid_argument(q.node.describe() + ": unknown auto_pad '" + k->auto_pad + "'");
  }
  if (q.inputs.empty() || !q.inputs[0] || !q.inputs[0]->shape)
    return invalid_argument(q.node.describe() + ": X has no shape");
  size_t rank = q.inputs[0]->shape->size();
  if (rank != 3 && rank != 4) {
    return unsupported(q.node.describe() +
                       ": the CUDA backend runs 1-D and 2-D convolutions, not rank " +
                       std::to_string(rank));
  }
  size_t ns = rank - 2;
  if (c.nhwc && ns != 2) {
    return unsupported(q.node.describe() +
                       ": the channels-last convolution is 2-D (rank 4), not rank " +
                       std::to_string(rank));
  }
  const size_t spatial0 = c.nhwc ? 1 : 2;  // the first spatial axis of X and W
  // SAME padding splits an odd total unevenly, which cuDNN's symmetric padding cannot express.
  // The total is (k-1)*dilation at stride 1 whatever the input size; otherwise the input size
  // must be known at build time to tell.
  if (k->auto_pad == "SAME_UPPER" || k->auto_pad == "SAME_LOWER") {
    const ir::Value* w = q.inputs.size() > 1 ? q.inputs[1] : nullptr;
    for (size_t i = 0; i < ns; ++i) {
      int64_t stride = i < k->strides.size() ? k->strides[i] : 1;
      int64_t dil = i < k->dilations.size() ? k->dilations[i] : 1;
      const ir::Dim* kd =
          w && w->shape && w->shape->size() == rank ? &(*w->shape)[spatial0 + i] : nullptr;
      const ir::Dim& xd = (*q.inputs[0]->shape)[spatial0 + i];
      if (!kd || !kd->is_const() || (stride != 1 && !xd.is_const())) {
        return unsupported(q.node.describe() + ": auto_pad " + k->auto_pad + " with stride " +
                           std::to_string(stride) +
                           " over a spatial size known only at run time may " +
                           "pad asymmetrically, which the CUDA backend does not support");
      }
      int64_t in = xd.is_const() ? xd.value() : 0;
      int64_t span = (kd->value() - 1) * dil + 1;
      int64_t total =
          stride == 1 ? span - 1
                      : std::max<int64_t>(((in + stride - 1) / stride - 1) * stride + span - in, 0);
      if (total % 2 != 0) {
        return unsupported(q.node.describe() + ": auto_pad " + k->auto_pad + " pads axis " +
                           std::to_string(spatial0 + i) + " by " + std::to_string(total) +
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
  // A float16/bfloat16 filter is used as it is: prepare_low_precision_operands converts float32
  // constants only, and the kernel ignores a prepared operand for half tensors.
  const void* prepared_w = is_half(q.input_dtype(0)) ? nullptr : PreparedOperands::operand(q, 1);
  return std::unique_ptr<Kernel>(
      new ConvKernel(fused, q.input_dtype(0), math_mode(q), std::move(c), algo, prepared_w));
}

// kiln::FusedConv's workspace: Conv's conversions for float32 tensors computing in FP16/BF16;
// otherwise a zero bias for the fused call when B is absent.
ir::Dim fused_conv_workspace(const KernelQuery& q) {
  MathMode mode = math_mode(q);
  if (!is_half(q.input_dtype(0)) && (mode == MathMode::kFp16 || mode == MathMode::kBf16)) {
    return conv_workspace(q);
  }
  if (q.inputs.size() > 2 && q.inputs[2]) return 0;
  const ir::Value* w = q.inputs.size() > 1 ? q.inputs[1] : nullptr;
  if (!w || !w->shape || w->shape->empty() || !(*w->shape)[0].is_const()) return 0;
  return ir::Dim(
      int64_t(workspace_piece(size_t((*w->shape)[0].value()) * dtype_size(q.input_dtype(0)))));
}

StatusOr<std::shared_ptr<const PreparedNode>> prepare_conv(const KernelQuery& q) {
  return prepare_low_precision_operands(q, {1});
}

}  // namespace

void register_conv(Registry& r) {
  r.add(OpKind::kConv, &make_conv,
        {.library = "cudnn",
         .reduced_precision = true,
         .prepare = &prepare_conv,
         .workspace = &conv_workspace,
         .tactics = &conv_tactics});
  r.add(OpKind::kFusedConv, &make_conv,
        {.library = "cudnn",
         .reduced_precision = true,
         .prepare = &prepare_conv,
         .workspace = &fused_conv_workspace,
         .tactics = &conv_tactics});
}

}  // namespace kiln::backends::cuda
