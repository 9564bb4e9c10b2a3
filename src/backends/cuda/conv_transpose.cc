// ConvTranspose on cuDNN 9 (legacy API): the data gradient of the convolution from Y to X
// (cudnnConvolutionBackwardData), whose filter layout [C, M/group, k...] is ConvTranspose's W.
// 1-D to 3-D, groups, strides, dilations, any pads, output_padding, output_shape; strict FP32.
#include <algorithm>
#include <array>
#include <climits>
#include <optional>

#include "backends/cuda/cuda_common.h"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;

enum class AutoPad { kNotSet, kSameUpper, kSameLower, kValid };

// The attributes, each list filled to the spatial rank.
struct TransposeAttrs {
  int ns = 0;
  int64_t group = 1;
  std::vector<int64_t> strides, dilations, pads, out_pad, output_shape;
  AutoPad auto_pad = AutoPad::kNotSet;
};

// The begin pad of axis i for input size `in`, kernel size `k` and output size `out`, as the CPU
// reference derives it (C++ division, which truncates a negative SAME total toward zero).
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

// How one spatial axis runs. Let F = s*(in-1) + (k-1)*d + 1 be the full scatter, with zeros
// beyond it; Y[o] = full[o + pb]. cuDNN pads both ends alike, so where Y's window is not what
// one symmetric pad gives, cuDNN computes full[p, F - p) into the workspace with p the smaller
// pad (0 when either is negative, as output_padding and large output_shapes make the end pad),
// and Y is the window starting at pb - p of it, zero where the window leaves it.
struct AxisPlan {
  int64_t pad = 0;     // cuDNN's pad on both ends
  int64_t size = 0;    // the length cuDNN computes
  int64_t offset = 0;  // where Y's window starts in it
};
AxisPlan plan_axis(const TransposeAttrs& a, int i, int64_t in, int64_t k, int64_t out) {
  const int64_t s = a.strides[i], d = a.dilations[i];
  const int64_t pb = begin_pad(a, i, in, k, out);
  if (fits(in, k, out, s, d, pb)) return {pb, out, 0};
  const int64_t full = s * (in - 1) + (k - 1) * d + 1, pe = full - pb - out;
  const int64_t p = std::max<int64_t>(0, std::min(pb, pe));
  return {p, full - 2 * p, pb - p};
}

// cuDNN runs 1-D as 2-D with H = 1, so descriptors have 4 or 5 dims.
int cudnn_dims(int ns) { return std::max(ns, 2) + 2; }

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
      void* dst = y.data;
      if (windowed_) {
        KILN_RETURN_IF_ERROR(
            check_workspace(workspace_piece(size_t(shape_numel(full_)) * sizeof(float)), name_));
        dst = workspace_;
      }
      float alpha = 1.f, beta = 0.f;
      KILN_DNN_CHECK(
          cudnnConvolutionBackwardData(res->dnn, &alpha, wd_, w.data, xd_, x.data, cd_, algo_,
                                       res->workspace, res->workspace_bytes, &beta, yd_, dst),
          name_ + ": cudnnConvolutionBackwardData");
      if (windowed_) {
        TensorView full{workspace_, DType::kFloat32, full_};
        KILN_RETURN_IF_ERROR(copy_window(full, y, offsets_, stream_));
      }
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
    key_.clear();
    const int ns = a_.ns, nd = cudnn_dims(ns), lead = nd - 2 - ns;  // lead: 1 for 1-D
    if (w.shape[0] != x.shape[1] || w.shape[1] * a_.group != y.shape[1] ||
        y.shape[0] != x.shape[0]) {
      return invalid_argument(name_ + ": X " + shape_to_string(x.shape) + ", W " +
                              shape_to_string(w.shape) + " and Y " + shape_to_string(y.shape) +
                              " do not agree with group " + std::to_string(a_.group));
    }
    // full_: what cuDNN computes ([N, M, size...]); offsets_: where Y starts in it.
    full_.assign({y.shape[0], y.shape[1]});
    offsets_.assign(size_t(ns) + 2, 0);
    windowed_ = false;
    std::array<int, 3> pad{0, 0, 0}, str{1, 1, 1}, dil{1, 1, 1};
    for (int i = 0; i < ns; ++i) {
      int64_t in = x.shape[2 + i], k = w.shape[2 + i], o = y.shape[2 + i];
      AxisPlan p = plan_axis(a_, i, in, k, o);
      full_.push_back(p.size);
      offsets_[size_t(2 + i)] = p.offset;
      windowed_ = windowed_ || p.size != o || p.offset != 0;
      pad[size_t(lead + i)] = int(p.pad), str[size_t(lead + i)] = int(a_.strides[i]);
      dil[size_t(lead + i)] = int(a_.dilations[i]);
    }
    for (std::span<const int64_t> s : {x.shape, w.shape, std::span<const int64_t>(full_)}) {
      for (int64_t v : s) {
        if (v > INT_MAX) {
          return unsupported(name_ + ": cuDNN takes dims below 2^31, not " + shape_to_string(s));
        }
      }
    }
    // Descriptor dims: N, C, then the spatial dims, led by H = 1 for 1-D.
    auto dims = [&](std::span<const int64_t> s) {
      std::array<int, 5> d{1, 1, 1, 1, 1};
      d[0] = int(s[0]), d[1] = int(s[1]);
      for (int i = 0; i < ns; ++i) d[size_t(2 + lead + i)] = int(s[size_t(2 + i)]);
      return d;
    };
    auto strides = [&](const std::array<int, 5>& d) {
      std::array<int, 5> st{1, 1, 1, 1, 1};
      for (int i = nd - 1; i-- > 0;) st[size_t(i)] = st[size_t(i) + 1] * d[size_t(i) + 1];
      return st;
    };
    if (!xd_) {
      KILN_DNN_CHECK(cudnnCreateTensorDescriptor(&xd_), "cudnnCreateTensorDescriptor");
      KILN_DNN_CHECK(cudnnCreateTensorDescriptor(&yd_), "cudnnCreateTensorDescriptor");
      KILN_DNN_CHECK(cudnnCreateFilterDescriptor(&wd_), "cudnnCreateFilterDescriptor");
      KILN_DNN_CHECK(cudnnCreateConvolutionDescriptor(&cd_), "cudnnCreateConvolutionDescriptor");
    }
    // In cuDNN's terms the forward convolution runs from Y ("x", M channels) to X ("y", C
    // channels); its "x" is full_ (Y itself unless windowed).
    auto xs = dims(x.shape), ws = dims(w.shape), ys = dims(full_);
    auto xst = strides(xs), yst = strides(ys);
    cudnnDataType_t dt = CUDNN_DATA_FLOAT;
    KILN_DNN_CHECK(cudnnSetTensorNdDescriptor(xd_, dt, nd, xs.data(), xst.data()),
                   name_ + ": X descriptor");
    KILN_DNN_CHECK(cudnnSetTensorNdDescriptor(yd_, dt, nd, ys.data(), yst.data()),
                   name_ + ": Y descriptor");
    KILN_DNN_CHECK(cudnnSetFilterNdDescriptor(wd_, dt, CUDNN_TENSOR_NCHW, nd, ws.data()),
                   name_ + ": W descriptor");
    KILN_DNN_CHECK(cudnnSetConvolutionNdDescriptor(cd_, nd - 2, pad.data(), str.data(), dil.data(),
                                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                   name_ + ": convolution descriptor");
    KILN_DNN_CHECK(cudnnSetConvolutionGroupCount(cd_, int(a_.group)), name_ + ": group count");
    KILN_DNN_CHECK(cudnnSetConvolutionMathType(cd_, CUDNN_FMA_MATH), name_ + ": math type");
    std::array<int, 5> got{0, 0, 0, 0, 0};
    KILN_DNN_CHECK(cudnnGetConvolutionNdForwardOutputDim(cd_, yd_, wd_, nd, got.data()),
                   name_ + ": output dims");
    if (!std::equal(got.begin(), got.begin() + nd, xs.begin())) {
      Shape mapped(got.begin(), got.begin() + nd);
      return invalid_argument(name_ + ": cuDNN maps " + shape_to_string(full_) + " to " +
                              shape_to_string(mapped) + ", not X " + shape_to_string(x.shape));
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
    // Where the heuristic ranks nothing in FMA math (it may for some 3-D problems), the two
    // direct algorithms, which run every shape without tensor cores.
    for (cudnnConvolutionBwdDataAlgo_t alg :
         {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, CUDNN_CONVOLUTION_BWD_DATA_ALGO_0}) {
      size_t need = 0;
      if (chosen) break;
      if (cudnnGetConvolutionBackwardDataWorkspaceSize(res->dnn, wd_, xd_, cd_, yd_, alg, &need) ==
              CUDNN_STATUS_SUCCESS &&
          need <= res->workspace_bytes) {
        algo_ = alg;
        chosen = true;
      }
    }
    if (!chosen)
      return unsupported(name_ + ": cuDNN offers no FP32 algorithm for X " +
                         shape_to_string(x.shape));
    key_ = key;
    return ok_status();
  }

  TransposeAttrs a_;
  Shape key_;
  Shape full_;
  std::vector<int64_t> offsets_;
  bool windowed_ = false;
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

StatusOr<TransposeAttrs> transpose_attrs(const KernelQuery& q) {
  const ir::Attributes& at = q.node.attrs;
  if (q.inputs.size() < 2 || !q.inputs[0] || !q.inputs[0]->shape || !q.inputs[1]) {
    return invalid_argument(q.node.describe() + ": X has no shape");
  }
  size_t rank = q.inputs[0]->shape->size();
  if (rank < 3 || rank > 5) {
    return unsupported(q.node.describe() +
                       ": the CUDA backend runs 1-D to 3-D ConvTranspose, not rank " +
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
  KILN_ASSIGN_OR_RETURN(a.output_shape, at.get_ints("output_shape", std::vector<int64_t>{}));
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
    if (a.strides[i] < 1 || a.dilations[i] < 1 || a.strides[i] > INT_MAX ||
        a.dilations[i] > INT_MAX || a.group > INT_MAX) {
      return invalid_argument(q.node.describe() +
                              ": strides, dilations and group must be in [1, 2^31)");
    }
  }
  return a;
}

// Whether every run of the node may need the window (cuDNN into the workspace, then a copy):
// false when one symmetric pad gives Y on every axis for every size the profile allows, from the
// sizes where they are known at build time, else from the attributes (Y's size follows the
// input's: Y = s*(in-1) + op + (k-1)*d + 1 - pb - pe fits when 0 <= op + pb - pe < s).
bool may_window(const KernelQuery& q, const TransposeAttrs& a) {
  const ir::Value* x = q.inputs[0];
  const ir::Value* w = q.inputs[1];
  const ir::Value* y = q.outputs.empty() ? nullptr : q.outputs[0];
  const size_t ns = size_t(a.ns);
  for (size_t i = 0; i < ns; ++i) {
    std::optional<int64_t> k = known(w, 2 + i), in = known(x, 2 + i), o = known(y, 2 + i);
    int64_t s = a.strides[i], d = a.dilations[i], op = a.out_pad[i];
    if (!k) return true;
    if (in && o) {
      AxisPlan p = plan_axis(a, int(i), *in, *k, *o);
      if (p.size != *o || p.offset != 0) return true;
      continue;
    }
    if (!a.output_shape.empty()) return true;
    int64_t pb = 0, pe = 0;
    if (a.auto_pad == AutoPad::kNotSet) {
      pb = a.pads[i], pe = a.pads[ns + i];
    } else if (a.auto_pad != AutoPad::kValid) {  // SAME: Y = in*s
      int64_t total = op + (*k - 1) * d + 1 - s;
      pb = a.auto_pad == AutoPad::kSameUpper ? total / 2 : total - total / 2;
      pe = total - pb;
    }
    if (pb < 0 || op + pb - pe < 0 || op + pb - pe >= s) return true;
  }
  return false;
}

StatusOr<std::unique_ptr<Kernel>> make_conv_transpose(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(TransposeAttrs a, transpose_attrs(q));
  return std::unique_ptr<Kernel>(new ConvTransposeKernel(std::move(a)));
}

// The window's workspace: what cuDNN computes, [N, M, max(F, Y)...] float32 at most, with
// F = s*(in-1) + (k-1)*d + 1 the full scatter of each axis (plan_axis's size is F - 2p, or Y's).
ir::Dim conv_transpose_workspace(const KernelQuery& q) {
  auto a = transpose_attrs(q);
  const ir::Value* y = q.outputs.empty() ? nullptr : q.outputs[0];
  if (!a.ok() || !y || !y->shape || !q.inputs[1]->shape || !may_window(q, *a)) return 0;
  const auto& xs = *q.inputs[0]->shape;
  const auto& ws = *q.inputs[1]->shape;
  const auto& ys = *y->shape;
  if (ws.size() != xs.size() || ys.size() != xs.size()) return 0;
  ir::Dim bytes = ys[0] * ys[1] * int64_t(sizeof(float));
  for (size_t i = 0; i < size_t(a->ns); ++i) {
    // An axis one symmetric pad gives is computed at Y's own size, which can pass F (a floor
    // division in cuDNN's output size), so the axis needs max(F, Y).
    ir::Dim full = (xs[2 + i] - 1) * a->strides[i] + (ws[2 + i] - 1) * a->dilations[i] + 1;
    bytes = bytes * ir::Dim::max(ir::Dim::max(full, ys[2 + i]), 0);
  }
  const int64_t align = int64_t(kWorkspaceAlign);
  return ir::Dim::ceil_div(bytes, align) * align;
}

}  // namespace

void register_conv_transpose(Registry& r) {
  r.add(OpKind::kConvTranspose, &make_conv_transpose,
        {.library = "cudnn", .float32_only = true, .workspace = &conv_transpose_workspace});
}

}  // namespace kiln::backends::cuda
