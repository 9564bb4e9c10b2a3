// kiln::FusedConv channels last with a 1x1 filter, stride 1 and no padding, as one cuBLASLt GEMM:
// Y[N*H*W, K] = X[N*H*W, C] * W[K, C]^T on float16/bfloat16 tensors with FP32 accumulation, the
// bias, the residual Z (beta = 1 with Z as cuBLASLt's C) and ReLU in cuBLASLt's epilogue; other
// activations in one conv_epilogue pass after it. cuDNN runs these convolutions as the same GEMMs,
// but its fused call applies the residual in a pass of its own or falls back to pre-tensor-core
// kernels (on ResNet-50 and MobileNetV3 at batch 64: 46 separate epilogue passes, 872 us, and 34
// implicit_convolve_sgemm launches, 2.76 ms, measured with ncu on an H100).
#include <cmath>

#include "backends/cuda/conv_attrs.h"
#include "backends/cuda/cublaslt.h"
#include "backends/cuda/jit.h"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;

// Ok when the node is a channels-last 1x1 convolution this kernel runs as a GEMM; else why not.
Status check_gemm_shaped(const KernelQuery& q, const ConvAttrs& c) {
  const std::string who = q.node.describe() + ": cuda.cublaslt.FusedConv";
  if (q.node.op_type != "FusedConv" || !c.nhwc)
    return unsupported(who + " runs channels-last FusedConv only");
  const DType t = q.input_dtype(0);
  if (!is_half(t))
    return unsupported(who + " takes float16 or bfloat16 tensors, not " +
                       std::string(dtype_name(t)));
  for (size_t i = 1; i < q.inputs.size(); ++i) {
    if (q.inputs[i] && q.inputs[i]->dtype != t) {
      return unsupported(who + " takes one dtype; input " + std::to_string(i) + " is " +
                         std::string(dtype_name(q.inputs[i]->dtype)));
    }
  }
  if (q.output_dtype(0) != t) return unsupported(who + " takes one dtype; Y differs from X");
  if (c.group != 1) return unsupported(who + " runs ungrouped convolutions");
  for (int64_t s : c.strides) {
    if (s != 1) return unsupported(who + " runs stride 1");
  }
  if (c.auto_pad == "NOTSET") {
    for (int64_t p : c.pads) {
      if (p != 0) return unsupported(who + " runs unpadded convolutions");
    }
  } else if (c.auto_pad != "VALID" && c.auto_pad != "SAME_UPPER" && c.auto_pad != "SAME_LOWER") {
    return invalid_argument(q.node.describe() + ": unknown auto_pad '" + c.auto_pad + "'");
  }
  // A 1x1 filter pads nothing under SAME padding either.
  const ir::Value* w = q.inputs.size() > 1 ? q.inputs[1] : nullptr;
  const ir::Value* x = q.inputs.empty() ? nullptr : q.inputs[0];
  if (!x || !x->shape || x->shape->size() != 4 || !w || !w->shape || w->shape->size() != 4) {
    return unsupported(who + " runs 2-D convolutions (rank-4 X and W)");
  }
  const auto& ws = *w->shape;
  if (!ws[1].is_const() || ws[1].value() != 1 || !ws[2].is_const() || ws[2].value() != 1) {
    return unsupported(who + " runs 1x1 filters");
  }
  // Rows of 16 bytes: every cuBLASLt tensor-core algorithm takes them, so the shape the builder
  // accepts always finds one at run time (cuDNN takes the other channel counts).
  if (!ws[0].is_const() || ws[0].value() % 8 != 0 || !ws[3].is_const() || ws[3].value() % 8 != 0) {
    return unsupported(who + " runs channel counts that are multiples of 8");
  }
  return ok_status();
}

// Column-major D^T = op(A) * B: A is the filter ([K, C] row-major, taken transposed), B is X
// ([rows, C] row-major, i.e. C x rows column-major), D is Y (K x rows, ld K); the bias is per row
// of D, one value per output channel.
Problem conv_problem(int64_t rows, int64_t c, int64_t k, bool bias, bool relu) {
  Problem p;
  p.trans_a = true;
  p.m = k, p.n = rows, p.k = c;
  p.lda = c, p.ldb = c, p.ldc = k;
  p.bias = bias, p.relu = relu;
  return p;
}

// A tactic: cuBLASLt's ("algo=.. tile=.. ..." or "heuristic", cublaslt.h), optionally followed by
// " below=N": batches under N take the heuristic's answer for their own shape rather than the
// algorithm chosen at the opt shapes (a tile for 200k rows leaves most SMs idle on 3k).
struct ConvGemmTactic {
  std::optional<AlgoConfig> algo;
  int64_t below = 0;
};
StatusOr<ConvGemmTactic> parse_conv_gemm_tactic(const std::string& t) {
  ConvGemmTactic out;
  std::string lt = t;
  const size_t at = t.rfind(" below=");
  if (at != std::string::npos) {
    const std::string n = t.substr(at + 7);
    if (n.empty() || n.size() > 12 || n.find_first_not_of("0123456789") != std::string::npos) {
      return invalid_argument("cuBLASLt convolution tactic '" + t + "': bad batch in 'below='");
    }
    out.below = std::stoll(n);
    lt = t.substr(0, at);
  }
  KILN_ASSIGN_OR_RETURN(out.algo, parse_lt_tactic(lt));
  return out;
}

class ConvGemmKernel final : public CudaKernel {
 public:
  ConvGemmKernel(DType t, ConvAttrs attrs, ConvGemmTactic tactic)
      : CudaKernel("cuda.FusedConv(cublasLt,NHWC 1x1," + std::string(dtype_name(t)) + " tensors)"),
        t_(t),
        attrs_(std::move(attrs)),
        below_(tactic.below),
        recorded_(gemm_types(t, MathMode::kFp32), tactic.algo),
        per_shape_(gemm_types(t, MathMode::kFp32), std::nullopt) {}

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &w = in[1], &y = out[0];
    if (x.rank() != 4 || w.rank() != 4 || y.rank() != 4 || w.shape[1] != 1 || w.shape[2] != 1 ||
        w.shape[3] != x.shape[3] || y.shape[3] != w.shape[0] || y.shape[0] != x.shape[0] ||
        y.shape[1] != x.shape[1] || y.shape[2] != x.shape[2]) {
      return invalid_argument(name_ + ": X " + shape_to_string(x.shape) + ", W " +
                              shape_to_string(w.shape) + " and Y " + shape_to_string(y.shape) +
                              " are no 1x1 channels-last convolution");
    }
    const int64_t k = w.shape[0], c = w.shape[3];
    KILN_RETURN_IF_ERROR(check_fused_operands(name_, in, y, t_, k));
    const bool has_bias = in.size() > 2 && present(in[2]);
    const bool has_z = in.size() > 3 && present(in[3]);
    if (y.numel() == 0) return ok_status();
    const int64_t rows = y.numel() / k;
    if (c == 0) {
      // No input channels: the GEMM sums nothing, Y = act(B + Z) (cuBLASLt refuses k = 0). Y
      // starts as zero, or as Z where the plan gave Y Z's bytes (in place).
      const void* z = has_z ? in[3].data : nullptr;
      if (z == y.data) {
        z = nullptr;
      } else {
        KILN_CUDA_CHECK(cudaMemsetAsync(y.data, 0, y.nbytes(), stream_), name_ + ": zero Y");
      }
      return conv_epilogue(t_, y.data, has_bias ? in[2].data : nullptr, z, y.numel(), k, 1,
                           attrs_.act, attrs_.p0, attrs_.p1, stream_);
    }
    KILN_ASSIGN_OR_RETURN(StreamResources * res, resources());
    const bool relu = attrs_.act == ConvActivation::kRelu;
    Problem p = conv_problem(rows, c, k, has_bias, relu);
    p.align_a = alignment_of(w.data, 0), p.align_b = alignment_of(x.data, 0);
    p.align_c = std::min(alignment_of(y.data, 0), has_z ? alignment_of(in[3].data, 0) : 256);
    LtGemm& gemm = x.shape[0] < below_ ? per_shape_ : recorded_;
    KILN_RETURN_IF_ERROR(gemm.run(p, w.data, x.data, y.data, has_bias ? in[2].data : nullptr, 1.0,
                                  has_z ? 1.0 : 0.0, res, has_z ? in[3].data : nullptr));
    if (attrs_.act == ConvActivation::kNone || relu) return ok_status();
    return conv_epilogue(t_, y.data, nullptr, nullptr, y.numel(), k, 1, attrs_.act, attrs_.p0,
                         attrs_.p1, stream_);
  }

 private:
  DType t_;
  ConvAttrs attrs_;
  int64_t below_;
  LtGemm recorded_;   // the algorithm the plan recorded (checked per shape; the heuristic where
                      // refused)
  LtGemm per_shape_;  // the heuristic's answer for each shape, for batches under below_
};

StatusOr<std::unique_ptr<Kernel>> make_conv_gemm(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(ConvAttrs c, conv_attrs(q));
  KILN_RETURN_IF_ERROR(check_no_input_activation(q, c, "cuda.cublaslt.FusedConv"));
  KILN_RETURN_IF_ERROR(check_gemm_shaped(q, c));
  KILN_ASSIGN_OR_RETURN(ConvGemmTactic tactic, parse_conv_gemm_tactic(q.tactic));
  return std::unique_ptr<Kernel>(new ConvGemmKernel(q.input_dtype(0), std::move(c), tactic));
}

// At optimization level 3 and up, a 1x1 convolution whose activation cuBLASLt's epilogue lacks
// (all but ReLU) and cuDNN's pointwise nodes compute goes to cuDNN's graph API, whose
// runtime-fusion engines apply it in the convolution's epilogue instead of a pass over Y of its
// own (EfficientNetV2-S's SiLU expansions and squeeze-excitation FCs on an H200, FP16, batch 32:
// 5.48 ms with cuDNN's jit on its 3x3 convolutions alone, 5.04 with these too). Hard swish and
// hard sigmoid stay here: cuDNN would run them as a pass too.
Status conv_gemm_declines(const KernelQuery& q) {
  auto c = conv_attrs(q);
  if (q.optimization_level < 3 || !c.ok() || c->act == ConvActivation::kNone ||
      c->act == ConvActivation::kRelu || !cudnn_pointwise_computes(c->act) ||
      !cudnn_runtime_fusion()) {
    return ok_status();
  }
  auto name = q.node.attrs.get_string("activation", "none");
  return unsupported(q.node.describe() +
                     ": cuda.cublaslt.FusedConv's epilogue has no activation '" +
                     (name.ok() ? *name : std::string("?")) +
                     "'; cuDNN's runtime fusion applies it inside the convolution");
}

// cuBLASLt's ranking at the opt shapes, then "heuristic"; each ranked algorithm with " below=N"
// when the profile's min batch is smaller, N the geometric mean of the min and opt batches.
std::vector<std::string> conv_gemm_tactics(const KernelQuery& q) {
  const ir::Value* xv = q.inputs.empty() ? nullptr : q.inputs[0];
  const ir::Value* wv = q.inputs.size() > 1 ? q.inputs[1] : nullptr;
  auto x = q.opt_shape(xv), w = q.opt_shape(wv), xm = q.min_shape(xv);
  auto attrs = conv_attrs(q);
  std::optional<Problem> p;
  if (x && w && attrs.ok() && x->size() == 4 && w->size() == 4 && shape_numel(*x) > 0 &&
      (*x)[3] > 0 && (*w)[0] > 0 && (*w)[3] > 0) {
    const bool bias = q.inputs.size() > 2 && q.inputs[2];
    p = conv_problem(shape_numel(*x) / (*x)[3], (*w)[3], (*w)[0], bias,
                     attrs->act == ConvActivation::kRelu);
    p->align_a = p->align_b = p->align_c = 16;
  }
  std::vector<std::string> out = rank_tactics(p, gemm_types(q.input_dtype(0), MathMode::kFp32));
  if (x && xm && xm->size() == x->size() && !x->empty() && (*xm)[0] > 0 && (*xm)[0] < (*x)[0]) {
    const auto below = int64_t(std::ceil(std::sqrt(double((*xm)[0]) * double((*x)[0]))));
    for (std::string& t : out) {
      if (t != kHeuristicTactic) t += " below=" + std::to_string(below);
    }
  }
  return out;
}

}  // namespace

// Registered before cuDNN's convolutions (register_kernels calls it first), so the builder takes
// it for the convolutions it accepts.
void register_conv_gemm(Registry& r) {
  // Z is cuBLASLt's C, of D's layout: C == D is its in-place form, so Y may take Z's bytes.
  r.add(OpKind::kFusedConv, &make_conv_gemm,
        {.library = "cublaslt",
         .tactics = &conv_gemm_tactics,
         .declines = &conv_gemm_declines,
         .in_place_input = 3});
}

}  // namespace kiln::backends::cuda
