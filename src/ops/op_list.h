// The ai.onnx operators kiln knows, listed once; the OpKind enum and name table are generated here.
// Adding an op: add it here, give it a schema in its family file (docs/adding_an_op.md).
#pragma once

#define KILN_OPS(X)                                                                             \
  /* elementwise */                                                                             \
  X(Add) X(Sub) X(Mul) X(Div) X(Pow) X(Mod) X(Max) X(Min) X(Equal) X(Less) X(LessOrEqual)      \
  X(Greater) X(GreaterOrEqual) X(And) X(Or) X(Xor) X(Not) X(Neg) X(Abs) X(Reciprocal) X(Sqrt)   \
  X(Exp) X(Log) X(Erf) X(Relu) X(Sigmoid) X(Tanh) X(HardSigmoid) X(HardSwish) X(Sin) X(Cos)     \
  X(IsNaN) X(IsInf) X(Floor) X(Ceil) X(Where) X(Cast) X(Identity) X(LeakyRelu) X(Clip)           \
  X(Softplus) X(Elu) X(Gelu) X(Sign) X(Round)                                                    \
  /* matmul, conv, norm, reduce, resize */                                                      \
  X(MatMul) X(Gemm) X(Conv) X(MaxPool) X(AveragePool) X(GlobalAveragePool) X(GlobalMaxPool)     \
  X(LayerNormalization) X(BatchNormalization) X(Softmax) X(LogSoftmax) X(ReduceMean)            \
  X(ReduceSum) X(ReduceMax) X(ReduceMin) X(ReduceProd) X(Resize) X(DepthToSpace)                \
  X(SpaceToDepth) X(Flatten)                                                                     \
  /* shape and index */                                                                         \
  X(Shape) X(Size) X(Reshape) X(Squeeze) X(Unsqueeze) X(Concat) X(Slice) X(Gather) X(GatherND)  \
  X(GatherElements) X(Expand) X(Transpose) X(Range) X(ConstantOfShape) X(Constant) X(CumSum)    \
  X(Split) X(Tile) X(Pad) X(Trilu)
