// The program of kiln::Elementwise: a chain of ONNX elementwise ops fused into one node by the
// builder's fuse_elementwise pass, one instruction per op it replaced. Its attributes:
//   ops   strings, one per instruction: the ONNX op type (Add, Erf, Cast...; "GeluTanh" is Gelu
//         with approximate="tanh")
//   args  ints, two per instruction: the operands' registers, -1 for a unary op's second. Register
//         r < num_inputs is node input r; num_inputs + j is instruction j's result.
//   to    ints, one per instruction: its result's dtype (ONNX TensorProto code)
//   alpha, beta  floats, one per instruction (LeakyRelu's and HardSigmoid's attributes; 0 else)
// The node's output is the last instruction's result. Every value is float32, float16 or
// bfloat16; each result has the broadcast shape of its operands and is rounded to its dtype, as
// the unfused ops round it. One parser (parse_elementwise_program) checks all of it for shape
// inference, the CPU reference and the CUDA kernel alike, so a hostile node or engine file gets
// an error naming the instruction, never an out-of-range register.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "ir/graph.h"
#include "ops/schema.h"

namespace kiln::ops {

inline constexpr int kMaxElementwiseInputs = 8;
inline constexpr int kMaxElementwiseInstructions = 24;

enum class EwOp {
  // binary
  kAdd,
  kSub,
  kMul,
  kDiv,
  kPow,
  // unary
  kRelu,
  kSigmoid,
  kTanh,
  kErf,
  kExp,
  kLog,
  kSqrt,
  kReciprocal,
  kNeg,
  kAbs,
  kIdentity,
  kCast,
  kHardSigmoid,
  kHardSwish,
  kLeakyRelu,
  kGelu,
  kGeluTanh,
  kSin,
  kCos,
  kFloor,
  kCeil,
  kSoftplus,
};

struct EwInstruction {
  EwOp op;
  std::string name;  // as in the ops attribute
  int a = -1, b = -1;
  DType to = DType::kFloat32;
  float alpha = 0, beta = 0;
};

struct ElementwiseProgram {
  int num_inputs = 0;
  std::vector<EwInstruction> code;
};

bool ew_is_binary(EwOp op);
// The instruction op of an ONNX node's op type (Gelu by its approximate attribute); false when
// the op is none the program holds.
bool ew_op_of(std::string_view op_type, std::string_view gelu_approximate, EwOp* out);
// The ONNX op an instruction runs as (GeluTanh runs as Gelu).
OpKind ew_onnx_kind(EwOp op);
bool ew_dtype_ok(DType t);  // float32, float16, bfloat16

// Checks the attributes against `input_dtypes` (one per node input): every instruction's op,
// registers (earlier ones only), operand and result dtypes.
StatusOr<ElementwiseProgram> parse_elementwise_program(const ir::Attributes& attrs,
                                                       std::span<const DType> input_dtypes);
// parse_elementwise_program of a node whose inputs are these values (a kernel factory's query):
// a missing input, or the parser's error, prefixed with the node's description.
StatusOr<ElementwiseProgram> elementwise_program_of(const ir::Node& node,
                                                    std::span<const ir::Value* const> inputs);
// The attributes of `p` (the inverse of parse_elementwise_program).
ir::Attributes elementwise_attributes(const ElementwiseProgram& p);
// The ONNX attributes instruction `i` runs its op with (LeakyRelu alpha, HardSigmoid alpha and
// beta, Cast to, Gelu approximate).
ir::Attributes ew_onnx_attributes(const EwInstruction& i);

}  // namespace kiln::ops
