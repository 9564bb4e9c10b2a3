// PrecisionClass of every ai.onnx op, in one reviewable place (PyTorch autocast keeps the same
// lists): what the precision pass may run in FP16/BF16, what must stay FP32, what follows its
// inputs. kiln-domain ops set their class in their own schema (ops/kiln_ops.cc).
#include "ops/schema.h"

namespace kiln::ops {
namespace {

using enum OpKind;

// Compute-bound ops whose kernels accumulate in FP32: the gain of reduced precision is here.
constexpr OpKind kReducedOps[] = {kMatMul, kGemm,      kConv,         kConvTranspose,
                                  kEinsum, kAttention, kFlexAttention};

// Numerically sensitive: long reductions, normalizations, softmax, range-expanding math and
// losses. Also the default of any op not listed (a new op stays accurate until someone decides).
constexpr OpKind kFloat32Ops[] = {
    kPow, kExp, kLog, kReciprocal, kSoftplus, kTan, kSinh, kCosh, kAsin, kAcos, kAcosh, kAtanh,
    kSoftmax, kLogSoftmax, kLayerNormalization, kRMSNormalization, kGroupNormalization,
    kInstanceNormalization, kLpNormalization, kMeanVarianceNormalization, kLRN, kReduceMean,
    kReduceSum, kReduceProd, kReduceL1, kReduceL2, kReduceLogSum, kReduceLogSumExp,
    kReduceSumSquare, kCumSum, kCumProd, kLpPool, kNegativeLogLikelihoodLoss,
    kSoftmaxCrossEntropyLoss, kDFT, kSTFT, kLinearAttention, kCausalConvWithState,
    // Recurrences: rounding errors compound over the time steps.
    kRNN, kGRU, kLSTM};

// Data movement and exact or short-range math: runs in whatever float type arrives. Elementwise
// ops and views not listed elsewhere follow too (set below from their traits).
constexpr OpKind kFollowOps[] = {kTranspose,
                                 kConcat,
                                 kSlice,
                                 kGather,
                                 kGatherND,
                                 kGatherElements,
                                 kExpand,
                                 kSplit,
                                 kTile,
                                 kPad,
                                 kTrilu,
                                 kScatterElements,
                                 kScatter,
                                 kScatterND,
                                 kResize,
                                 kDepthToSpace,
                                 kSpaceToDepth,
                                 kMaxPool,
                                 kAveragePool,
                                 kGlobalAveragePool,
                                 kGlobalMaxPool,
                                 kReduceMax,
                                 kReduceMin,
                                 kArgMax,
                                 kArgMin,
                                 kHardmax,
                                 kTopK,
                                 kBatchNormalization,
                                 kMaxUnpool,
                                 kGridSample,
                                 kAffineGrid,
                                 kCenterCropPad,
                                 kRotaryEmbedding,
                                 kDropout,
                                 kCompress};

// Dtypes fixed by the model: shape and integer ops, explicit casts, quantization, generators.
constexpr OpKind kNativeOps[] = {
    kShape, kSize, kRange, kConstantOfShape, kConstant, kCast, kCastLike, kEyeLike, kAnd, kOr, kXor,
    kNot, kBitwiseAnd, kBitwiseOr, kBitwiseXor, kBitwiseNot, kBitShift, kBitCast, kQuantizeLinear,
    kDequantizeLinear, kDynamicQuantizeLinear, kQLinearMatMul, kMatMulInteger, kQLinearConv,
    kConvInteger, kHannWindow, kHammingWindow, kBlackmanWindow, kMelWeightMatrix,
    // Data-dependent sizes: a value rounded to FP16 may become zero (NonZero) or equal another
    // (Unique), changing the output's size.
    kNonZero, kUnique};

}  // namespace

void register_precision_classes(OpRegistry& r) {
  for (size_t k = 1;; ++k) {
    OpKind kind = OpKind(k);
    if (op_name(kind) == "Unknown") break;
    if (op_domain(kind) == kKilnDomain) continue;
    const OpSchema* s = r.find(kind);
    if (s && (s->traits.elementwise || s->traits.is_view)) {
      r.set_precision(kind, PrecisionClass::kFollow);
    }
  }
  for (OpKind k : kReducedOps) r.set_precision(k, PrecisionClass::kReduced);
  for (OpKind k : kFloat32Ops) r.set_precision(k, PrecisionClass::kFloat32);
  for (OpKind k : kFollowOps) r.set_precision(k, PrecisionClass::kFollow);
  for (OpKind k : kNativeOps) r.set_precision(k, PrecisionClass::kNative);
}

}  // namespace kiln::ops
