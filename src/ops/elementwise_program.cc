#include "ops/elementwise_program.h"

#include <array>
#include <utility>

namespace kiln::ops {
namespace {

struct OpName {
  EwOp op;
  const char* name;
  OpKind kind;
};

constexpr std::array<OpName, 27> kOps = {{
    {EwOp::kAdd, "Add", OpKind::kAdd},
    {EwOp::kSub, "Sub", OpKind::kSub},
    {EwOp::kMul, "Mul", OpKind::kMul},
    {EwOp::kDiv, "Div", OpKind::kDiv},
    {EwOp::kPow, "Pow", OpKind::kPow},
    {EwOp::kRelu, "Relu", OpKind::kRelu},
    {EwOp::kSigmoid, "Sigmoid", OpKind::kSigmoid},
    {EwOp::kTanh, "Tanh", OpKind::kTanh},
    {EwOp::kErf, "Erf", OpKind::kErf},
    {EwOp::kExp, "Exp", OpKind::kExp},
    {EwOp::kLog, "Log", OpKind::kLog},
    {EwOp::kSqrt, "Sqrt", OpKind::kSqrt},
    {EwOp::kReciprocal, "Reciprocal", OpKind::kReciprocal},
    {EwOp::kNeg, "Neg", OpKind::kNeg},
    {EwOp::kAbs, "Abs", OpKind::kAbs},
    {EwOp::kIdentity, "Identity", OpKind::kIdentity},
    {EwOp::kCast, "Cast", OpKind::kCast},
    {EwOp::kHardSigmoid, "HardSigmoid", OpKind::kHardSigmoid},
    {EwOp::kHardSwish, "HardSwish", OpKind::kHardSwish},
    {EwOp::kLeakyRelu, "LeakyRelu", OpKind::kLeakyRelu},
    {EwOp::kGelu, "Gelu", OpKind::kGelu},
    {EwOp::kGeluTanh, "GeluTanh", OpKind::kGelu},
    {EwOp::kSin, "Sin", OpKind::kSin},
    {EwOp::kCos, "Cos", OpKind::kCos},
    {EwOp::kFloor, "Floor", OpKind::kFloor},
    {EwOp::kCeil, "Ceil", OpKind::kCeil},
    {EwOp::kSoftplus, "Softplus", OpKind::kSoftplus},
}};

const OpName* find_name(std::string_view name) {
  for (const OpName& o : kOps) {
    if (name == o.name) return &o;
  }
  return nullptr;
}

const OpName& entry(EwOp op) {
  for (const OpName& o : kOps) {
    if (o.op == op) return o;
  }
  return kOps[0];  // unreachable: every EwOp has an entry
}

ir::Attribute attr_of(std::vector<std::string> v) {
  ir::Attribute a;
  a.type = ir::AttrType::kStrings;
  a.strings = std::move(v);
  return a;
}
ir::Attribute attr_of(std::vector<int64_t> v) {
  ir::Attribute a;
  a.type = ir::AttrType::kInts;
  a.ints = std::move(v);
  return a;
}
ir::Attribute attr_of(std::vector<float> v) {
  ir::Attribute a;
  a.type = ir::AttrType::kFloats;
  a.floats = std::move(v);
  return a;
}

}  // namespace

bool ew_is_binary(EwOp op) { return op <= EwOp::kPow; }

bool ew_op_of(std::string_view op_type, std::string_view gelu_approximate, EwOp* out) {
  if (op_type == "GeluTanh") return false;  // a program's spelling, no ONNX op
  const OpName* o = find_name(op_type);
  if (!o) return false;
  *out = o->op;
  if (o->op == EwOp::kGelu) {
    if (gelu_approximate == "tanh") {
      *out = EwOp::kGeluTanh;
    } else if (gelu_approximate != "none") {
      return false;
    }
  }
  return true;
}

OpKind ew_onnx_kind(EwOp op) { return entry(op).kind; }

bool ew_dtype_ok(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16;
}

StatusOr<ElementwiseProgram> parse_elementwise_program(const ir::Attributes& attrs,
                                                       std::span<const DType> input_dtypes) {
  for (const auto& [name, attr] : attrs.all()) {
    if (name != "ops" && name != "args" && name != "to" && name != "alpha" && name != "beta") {
      return invalid_argument("unknown attribute '" + name + "'");
    }
  }
  const ir::Attribute* ops = attrs.find("ops");
  if (!ops || ops->type != ir::AttrType::kStrings)
    return invalid_argument("attribute 'ops' (strings) is missing");
  const size_t k = ops->strings.size();
  if (k == 0 || k > size_t(kMaxElementwiseInstructions)) {
    return invalid_argument("has " + std::to_string(k) + " instructions, expected 1 to " +
                            std::to_string(kMaxElementwiseInstructions));
  }
  const int n = int(input_dtypes.size());
  if (n < 1 || n > kMaxElementwiseInputs) {
    return invalid_argument("has " + std::to_string(n) + " inputs, expected 1 to " +
                            std::to_string(kMaxElementwiseInputs));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> args, attrs.get_ints("args", std::nullopt));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> to, attrs.get_ints("to", std::nullopt));
  KILN_ASSIGN_OR_RETURN(std::vector<float> alpha,
                        attrs.get_floats("alpha", std::vector<float>(k, 0.0f)));
  KILN_ASSIGN_OR_RETURN(std::vector<float> beta,
                        attrs.get_floats("beta", std::vector<float>(k, 0.0f)));
  if (args.size() != 2 * k || to.size() != k || alpha.size() != k || beta.size() != k) {
    return invalid_argument(
        "attributes args (" + std::to_string(args.size()) + "), to (" + std::to_string(to.size()) +
        "), alpha (" + std::to_string(alpha.size()) + ") and beta (" + std::to_string(beta.size()) +
        ") do not fit " + std::to_string(k) + " instructions (2 args and one of the others each)");
  }
  for (int i = 0; i < n; ++i) {
    if (!ew_dtype_ok(input_dtypes[size_t(i)])) {
      return invalid_argument("input " + std::to_string(i) + " has dtype " +
                              std::string(dtype_name(input_dtypes[size_t(i)])) +
                              ", expected float32, float16 or bfloat16");
    }
  }
  ElementwiseProgram p;
  p.num_inputs = n;
  std::vector<DType> reg(input_dtypes.begin(), input_dtypes.end());
  for (size_t j = 0; j < k; ++j) {
    const std::string where = "instruction " + std::to_string(j) + " (" + ops->strings[j] + ")";
    const OpName* o = find_name(ops->strings[j]);
    if (!o) return invalid_argument(where + ": not an op a fused elementwise program runs");
    EwInstruction ins{o->op, o->name, int(-1), int(-1), DType::kUndefined, alpha[j], beta[j]};
    const int64_t limit = int64_t(n) + int64_t(j);
    const int64_t a = args[2 * j], b = args[2 * j + 1];
    if (a < 0 || a >= limit) {
      return invalid_argument(where + ": operand register " + std::to_string(a) +
                              " is not one of 0.." + std::to_string(limit - 1) +
                              " (the inputs and earlier results)");
    }
    if (ew_is_binary(o->op) ? (b < 0 || b >= limit) : b != -1) {
      return invalid_argument(where + ": second operand register " + std::to_string(b) +
                              (ew_is_binary(o->op)
                                   ? " is not one of 0.." + std::to_string(limit - 1)
                                   : " must be -1 (a unary op)"));
    }
    ins.a = int(a);
    ins.b = int(b);
    if (to[j] < 0 || to[j] > 255 || !ew_dtype_ok(dtype_from_onnx(int32_t(to[j])))) {
      return invalid_argument(where + ": result dtype code " + std::to_string(to[j]) +
                              " is not float32, float16 or bfloat16");
    }
    ins.to = dtype_from_onnx(int32_t(to[j]));
    // ONNX's type rules: a result has its operands' dtype (Pow's exponent may differ); only
    // Cast changes it.
    const DType ta = reg[size_t(a)];
    if (o->op != EwOp::kCast && ins.to != ta) {
      return invalid_argument(where + ": result dtype " + std::string(dtype_name(ins.to)) +
                              " differs from its operand's " + std::string(dtype_name(ta)));
    }
    if (ew_is_binary(o->op) && o->op != EwOp::kPow && reg[size_t(b)] != ta) {
      return invalid_argument(where + ": operands of dtypes " + std::string(dtype_name(ta)) +
                              " and " + std::string(dtype_name(reg[size_t(b)])));
    }
    reg.push_back(ins.to);
    p.code.push_back(std::move(ins));
  }
  return p;
}

StatusOr<ElementwiseProgram> elementwise_program_of(const ir::Node& node,
                                                    std::span<const ir::Value* const> inputs) {
  std::vector<DType> dtypes;
  for (const ir::Value* v : inputs) {
    if (!v) return invalid_argument(node.describe() + ": an input is missing");
    dtypes.push_back(v->dtype);
  }
  auto p = parse_elementwise_program(node.attrs, dtypes);
  if (!p.ok()) return Status(p.status().code(), node.describe() + ": " + p.status().message());
  return p;
}

ir::Attributes elementwise_attributes(const ElementwiseProgram& p) {
  std::vector<std::string> ops;
  std::vector<int64_t> args, to;
  std::vector<float> alpha, beta;
  for (const EwInstruction& i : p.code) {
    ops.push_back(entry(i.op).name);
    args.push_back(i.a);
    args.push_back(i.b);
    to.push_back(int64_t(i.to));
    alpha.push_back(i.alpha);
    beta.push_back(i.beta);
  }
  ir::Attributes attrs;
  attrs.set("ops", attr_of(std::move(ops)));
  attrs.set("args", attr_of(std::move(args)));
  attrs.set("to", attr_of(std::move(to)));
  attrs.set("alpha", attr_of(std::move(alpha)));
  attrs.set("beta", attr_of(std::move(beta)));
  return attrs;
}

ir::Attributes ew_onnx_attributes(const EwInstruction& i) {
  ir::Attributes attrs;
  auto set_float = [&](const char* name, float v) {
    ir::Attribute a;
    a.type = ir::AttrType::kFloat;
    a.f = v;
    attrs.set(name, a);
  };
  switch (i.op) {
    case EwOp::kLeakyRelu:
      set_float("alpha", i.alpha);
      break;
    case EwOp::kHardSigmoid:
      set_float("alpha", i.alpha);
      set_float("beta", i.beta);
      break;
    case EwOp::kCast: {
      ir::Attribute a;
      a.type = ir::AttrType::kInt;
      a.i = int64_t(i.to);
      attrs.set("to", a);
      break;
    }
    case EwOp::kGelu:
    case EwOp::kGeluTanh: {
      ir::Attribute a;
      a.type = ir::AttrType::kString;
      a.s = i.op == EwOp::kGelu ? "none" : "tanh";
      attrs.set("approximate", a);
      break;
    }
    default:
      break;
  }
  return attrs;
}

}  // namespace kiln::ops
