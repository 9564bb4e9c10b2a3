// The operators kiln knows, listed once; the OpKind enum and name table are generated here:
// KILN_OPS are ai.onnx (and ai.onnx.preview) ops, KILN_INTERNAL_OPS live in kiln's own domain
// "kiln" (fused ops the builder's passes emit). Adding an op: docs/adding_an_op.md.
#pragma once

// The lists keep their own layout, grouped by family.
// clang-format off
#define KILN_OPS(X)                                                                             \
  /* elementwise */                                                                             \
  X(Add) X(Sub) X(Mul) X(Div) X(Pow) X(Mod) X(Max) X(Min) X(Equal) X(Less) X(LessOrEqual)      \
  X(Greater) X(GreaterOrEqual) X(And) X(Or) X(Xor) X(Not) X(Neg) X(Abs) X(Reciprocal) X(Sqrt)   \
  X(Exp) X(Log) X(Erf) X(Relu) X(Sigmoid) X(Tanh) X(HardSigmoid) X(HardSwish) X(Sin) X(Cos)     \
  X(IsNaN) X(IsInf) X(Floor) X(Ceil) X(Where) X(Cast) X(Identity) X(LeakyRelu) X(Clip)           \
  X(Softplus) X(Elu) X(Gelu) X(Sign) X(Round)                                                    \
  X(CastLike) X(Dropout) X(Tan) X(Asin) X(Acos) X(Atan) X(Sinh) X(Cosh) X(Asinh) X(Acosh)        \
  X(Atanh) X(Softsign) X(Selu) X(Celu) X(Mish) X(ThresholdedRelu) X(Swish) X(Shrink) X(PRelu)    \
  X(Sum) X(Mean) X(BitwiseAnd) X(BitwiseOr) X(BitwiseXor) X(BitwiseNot) X(BitShift) X(SwiGLU)    \
  X(NegativeLogLikelihoodLoss) X(SoftmaxCrossEntropyLoss)                                        \
  /* matmul, conv, norm, reduce, resize */                                                      \
  X(MatMul) X(Gemm) X(Conv) X(MaxPool) X(AveragePool) X(GlobalAveragePool) X(GlobalMaxPool)     \
  X(LayerNormalization) X(BatchNormalization) X(Softmax) X(LogSoftmax) X(ReduceMean)            \
  X(ReduceSum) X(ReduceMax) X(ReduceMin) X(ReduceProd) X(Resize) X(DepthToSpace)                \
  X(SpaceToDepth) X(Flatten)                                                                     \
  X(ReduceL1) X(ReduceL2) X(ReduceLogSum) X(ReduceLogSumExp) X(ReduceSumSquare) X(ArgMax)      \
  X(ArgMin) X(Hardmax) X(TopK) X(RMSNormalization) X(GroupNormalization)                        \
  X(InstanceNormalization) X(LpNormalization) X(MeanVarianceNormalization) X(LRN)               \
  X(ConvTranspose) X(LpPool) X(MaxUnpool) X(Einsum) X(DeformConv) X(Col2Im) X(Det)            \
  /* quant, attention */                                                                        \
  X(QuantizeLinear) X(DequantizeLinear) X(DynamicQuantizeLinear) X(QLinearMatMul)               \
  X(MatMulInteger) X(QLinearConv) X(ConvInteger) X(Attention) X(RotaryEmbedding)                \
  /* shape and index */                                                                         \
  X(Shape) X(Size) X(Reshape) X(Squeeze) X(Unsqueeze) X(Concat) X(Slice) X(Gather) X(GatherND)  \
  X(GatherElements) X(Expand) X(Transpose) X(Range) X(ConstantOfShape) X(Constant) X(CumSum)    \
  X(Split) X(Tile) X(Pad) X(Trilu) X(CumProd) X(ScatterElements) X(Scatter) X(ScatterND)      \
  X(OneHot) X(ReverseSequence) X(TensorScatter)                                                  \
  /* data-dependent output shapes */ X(NonZero) X(Compress) X(Unique) X(NonMaxSuppression)      \
  /* control flow */ X(If) X(Loop) X(Scan)                                                    \
  /* sequences, optionals */ X(SequenceEmpty) X(SequenceConstruct) X(SequenceInsert)            \
  X(SequenceErase) X(SequenceAt) X(SequenceLength) X(SplitToSequence) X(ConcatFromSequence)      \
  X(SequenceMap) X(Optional) X(OptionalHasElement) X(OptionalGetElement)                         \
  /* spatial, signal */ X(GridSample) X(AffineGrid) X(CenterCropPad) X(DFT) X(STFT)            \
  X(MelWeightMatrix) X(BitCast) X(HannWindow) X(HammingWindow) X(BlackmanWindow) X(EyeLike)     \
  X(RoiAlign)                                                                                    \
  /* sequence models (conf4) */ X(LinearAttention) X(CausalConvWithState) X(FlexAttention)      \
  /* recurrent */ X(RNN) X(GRU) X(LSTM)

// Domain "kiln": spelled `kiln::Name` in IR text. Schemas in ops/kiln_ops.cc, CPU references in
// backends/cpu/kiln_ops.cc.
#define KILN_INTERNAL_OPS(X)                                                                    \
  X(MatMulBias) X(FusedConv) X(Pool) X(Elementwise) X(PackedAttention) X(SqueezeExcite)         \
  X(SelectBranch) X(LoopBegin) X(LoopEnd) X(BiasSoftmax) X(Relayout)
// clang-format on
