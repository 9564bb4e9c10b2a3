// Schemas of the elementwise op family: numpy broadcasting, dtype rules, and folding of small
// integer (shape) values so that shape subgraphs such as Shape -> Mul -> Concat resolve at build
// time.
#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "core/checked.h"
#include "ops/schema.h"

namespace kiln::ops {
namespace {

using ir::Dim;
using ElemFn = std::function<std::optional<Dim>(std::span<const Dim>)>;

std::string input_label(const InferContext& ctx, int i) {
  return "input " + std::to_string(i) + " ('" + ctx.input(i).name + "')";
}

Status attr_error(const InferContext& ctx, const Status& s) {
  return ctx.error(s.code(), s.message());
}

bool is_numeric(DType d) { return is_float(d) || is_integer(d); }
bool is_signed_int(DType d) {
  return d == DType::kInt8 || d == DType::kInt16 || d == DType::kInt32 || d == DType::kInt64;
}

// All present inputs in [first, last] must have input `first`'s dtype.
Status require_same_dtype(const InferContext& ctx, int first, int last) {
  for (int i = first + 1; i <= last && i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) continue;
    if (ctx.input_dtype(i) != ctx.input_dtype(first)) {
      return ctx.error(StatusCode::kInvalidModel,
                       input_label(ctx, i) + " has dtype " +
                           std::string(dtype_name(ctx.input_dtype(i))) + " but " +
                           input_label(ctx, first) + " has dtype " +
                           std::string(dtype_name(ctx.input_dtype(first))));
    }
  }
  return ok_status();
}

Status require_dtype(const InferContext& ctx, int i, bool ok, std::string_view allowed) {
  if (ok) return ok_status();
  return ctx.error(StatusCode::kInvalidModel, input_label(ctx, i) + " has dtype " +
                                                  std::string(dtype_name(ctx.input_dtype(i))) +
                                                  "; " + ctx.node().op_type + " takes " +
                                                  std::string(allowed));
}

std::optional<std::vector<int64_t>> const_shape(const std::vector<Dim>& shape) {
  std::vector<int64_t> out;
  for (const Dim& d : shape) {
    if (!d.is_const() || d.value() < 0) return std::nullopt;
    out.push_back(d.value());
  }
  return out;
}

// Float shape math (torchvision's detection transforms size images by float32 arithmetic on their
// shape) keeps its elements as dims where float computes them exactly. A float32 holds every
// integer of magnitude <= 2^24 (float64: 2^53, exact_integer_limit), and IEEE arithmetic rounds
// the exact result; so where the inputs are such integers, the exact result of Add, Sub or Mul,
// when it lies within the limit too, is representable and is what float computes. Min, Max, Neg,
// Abs, Relu, Where, Identity, Floor, Ceil and Round give back one of their (integer) inputs.
// Div is exact only as Floor(Div) or Ceil(Div) by a positive integer constant (floor_of_div).
// `exact` says whether fn's results must then be checked against the limit: these ops' results are
// integers, but only within it are they what float computes.
bool exact_in_float(const InferContext& ctx, DType dt, const std::vector<Dim>& elements) {
  const int64_t limit = exact_integer_limit(dt);
  if (limit == 0) return false;
  for (const Dim& d : elements) {
    const ir::Interval b = ctx.dim_bounds(d);
    if (b.lo < -limit || b.hi > limit) return false;
  }
  return true;
}

// Computes output 0's elements from the inputs' known values, broadcasting over their (small,
// constant) shapes. Gives up silently when anything is unknown or an element is undecidable: the
// value is then simply computed at run time. A float output keeps its elements only where they
// are exact (exact_in_float). `inputs`: the first inputs the elements depend on (-1: all).
void fold_values(InferContext& ctx, DType out_dtype, const std::vector<Dim>& out_shape,
                 const ElemFn& fn, int inputs = -1) {
  if (!is_integer(out_dtype) && out_dtype != DType::kBool && exact_integer_limit(out_dtype) == 0)
    return;
  auto os = const_shape(out_shape);
  if (!os) return;
  auto numel = checked_numel(*os);
  if (!numel || *numel > kMaxSymbolicElements) return;
  int n = inputs < 0 ? ctx.num_inputs() : std::min(inputs, ctx.num_inputs());
  std::vector<std::vector<Dim>> values(n);
  std::vector<std::vector<int64_t>> strides(n);  // per output axis, 0 where broadcast
  size_t rank = os->size();
  for (int i = 0; i < n; ++i) {
    if (!ctx.has_input(i)) return;
    auto v = ctx.input_value(i);
    auto s = const_shape(ctx.input_shape(i));
    if (!v || !s || s->size() > rank) return;
    auto in_numel = checked_numel(*s);
    if (!in_numel || *in_numel != int64_t(v->size())) return;
    values[i] = std::move(*v);
    strides[i].assign(rank, 0);
    int64_t stride = 1;
    for (size_t d = s->size(); d-- > 0;) {
      size_t od = rank - s->size() + d;
      if ((*s)[d] != 1) {
        if ((*s)[d] != (*os)[od]) return;
        strides[i][od] = stride;
      }
      stride *= (*s)[d];
    }
  }
  std::vector<Dim> out;
  out.reserve(size_t(*numel));
  std::vector<Dim> args(n);
  for (int64_t e = 0; e < *numel; ++e) {
    int64_t rem = e;
    std::vector<int64_t> offs(n, 0);
    for (size_t d = rank; d-- > 0;) {
      int64_t idx = rem % (*os)[d];
      rem /= (*os)[d];
      for (int i = 0; i < n; ++i) offs[i] += idx * strides[i][d];
    }
    for (int i = 0; i < n; ++i) args[i] = values[i][size_t(offs[i])];
    auto r = fn(args);
    if (!r) return;
    out.push_back(std::move(*r));
  }
  if (is_float(out_dtype) && !exact_in_float(ctx, out_dtype, out)) return;
  ctx.set_output_value(0, std::move(out));
}

// The sign of a-b as far as it can be decided: -1, 0, +1 exactly, or an interval's proof.
struct Order {
  bool known_lt = false, known_le = false, known_gt = false, known_ge = false;
  bool known_eq = false, known_ne = false;
};

Order compare_dims(const Dim& a, const Dim& b) {
  Dim d = a - b;
  ir::Interval i = d.is_const() ? ir::Interval{d.value(), d.value()} : d.bounds({});
  Order o;
  o.known_lt = i.hi < 0;
  o.known_le = i.hi <= 0;
  o.known_gt = i.lo > 0;
  o.known_ge = i.lo >= 0;
  o.known_eq = i.lo == 0 && i.hi == 0;
  o.known_ne = i.lo > 0 || i.hi < 0;
  return o;
}

std::optional<Dim> decide(bool known_true, bool known_false) {
  if (known_true) return Dim(1);
  if (known_false) return Dim(0);
  return std::nullopt;
}

std::optional<bool> const_bool(const Dim& d) {
  if (!d.is_const()) return std::nullopt;
  return d.value() != 0;
}

// Wraps a constant to the range of an integer dtype, as a C++ cast to that type does.
int64_t wrap_to(DType dt, int64_t v) {
  switch (dt) {
    case DType::kInt8:
      return int8_t(v);
    case DType::kUInt8:
      return uint8_t(v);
    case DType::kInt16:
      return int16_t(v);
    case DType::kUInt16:
      return uint16_t(v);
    case DType::kInt32:
      return int32_t(v);
    case DType::kUInt32:
      return uint32_t(v);
    case DType::kBool:
      return v != 0;
    default:
      return v;
  }
}

// Dim::max/min, but settled by bounds when the difference is not constant yet provably signed
// (max(b + 2, 2) is b + 2 since dims are never negative).
Dim min_max(const Dim& a, const Dim& b, bool is_max) {
  Order o = compare_dims(a, b);
  if (o.known_ge) return is_max ? a : b;
  if (o.known_le) return is_max ? b : a;
  return is_max ? Dim::max(a, b) : Dim::min(a, b);
}

// Output shape of an elementwise node over inputs [0, n): the broadcast of their shapes.
StatusOr<std::vector<Dim>> broadcast_inputs(InferContext& ctx) {
  std::vector<std::vector<Dim>> shapes;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) {
      return ctx.error(StatusCode::kInvalidModel, "input " + std::to_string(i) + " is missing");
    }
    shapes.push_back(ctx.input_shape(i));
  }
  return ctx.broadcast_shapes(shapes);
}

// ---- binary arithmetic: Add Sub Mul Div Mod Pow Max Min ----

std::optional<Dim> fold_div(const Dim& a, const Dim& b) {
  if (a.is_const() && b.is_const()) {
    if (b.value() == 0 || (a.value() == std::numeric_limits<int64_t>::min() && b.value() == -1)) {
      return std::nullopt;
    }
    return Dim(a.value() / b.value());  // C++ truncates toward zero, as ONNX integer Div does
  }
  // floor == trunc only for a non-negative numerator.
  if (b.is_const() && b.value() > 0 && a.bounds({}).lo >= 0) return Dim::floor_div(a, b);
  return std::nullopt;
}

std::optional<Dim> fold_mod(const Dim& a, const Dim& b, bool fmod) {
  if (a.is_const() && b.is_const()) {
    if (b.value() == 0) return std::nullopt;
    if (b.value() == -1) return Dim(0);  // INT64_MIN % -1 would trap
    int64_t r = a.value() % b.value();   // sign of the dividend
    if (!fmod && r != 0 && ((r < 0) != (b.value() < 0))) r += b.value();  // sign of the divisor
    return Dim(r);
  }
  if (b.is_const() && b.value() > 0 && (!fmod || a.bounds({}).lo >= 0)) return Dim::mod(a, b);
  return std::nullopt;
}

Status infer_arith(InferContext& ctx) {
  OpKind op = find_op(ctx.node().domain, ctx.node().op_type);
  KILN_ASSIGN_OR_RETURN(auto shape, broadcast_inputs(ctx));
  DType dt = ctx.input_dtype(0);
  if (op == OpKind::kPow) {
    KILN_RETURN_IF_ERROR(require_dtype(ctx, 0, is_numeric(dt), "numeric tensors"));
    KILN_RETURN_IF_ERROR(require_dtype(ctx, 1, is_numeric(ctx.input_dtype(1)), "numeric tensors"));
  } else {
    KILN_RETURN_IF_ERROR(require_dtype(ctx, 0, is_numeric(dt), "numeric tensors"));
    KILN_RETURN_IF_ERROR(require_same_dtype(ctx, 0, ctx.num_inputs() - 1));
  }
  bool fmod = false;
  if (op == OpKind::kMod) {
    auto f = ctx.attrs().get_int("fmod", 0);
    if (!f.ok()) return attr_error(ctx, f.status());
    if (*f != 0 && *f != 1) {
      return ctx.error(StatusCode::kInvalidModel,
                       "attribute fmod must be 0 or 1, got " + std::to_string(*f));
    }
    fmod = *f == 1;
    // Opset 28 defined fmod=0 on floats: A - floor(A / B) * B, the sign of B.
    if (!fmod && is_float(dt) && ctx.opset() > 0 && ctx.opset() < 28) {
      return ctx.error(StatusCode::kInvalidModel,
                       "Mod on floating-point inputs requires fmod=1 before opset 28");
    }
  }
  ctx.set_output(0, dt, shape);
  switch (op) {
    case OpKind::kAdd:
      fold_values(ctx, dt, shape, [](auto v) { return std::optional<Dim>(v[0] + v[1]); });
      break;
    case OpKind::kSub:
      fold_values(ctx, dt, shape, [](auto v) { return std::optional<Dim>(v[0] - v[1]); });
      break;
    case OpKind::kMul:
      fold_values(ctx, dt, shape, [](auto v) { return std::optional<Dim>(v[0] * v[1]); });
      break;
    case OpKind::kDiv:
      // A float quotient is rarely an integer; Floor and Ceil read it exactly (floor_of_div).
      if (!is_float(dt)) fold_values(ctx, dt, shape, [](auto v) { return fold_div(v[0], v[1]); });
      break;
    case OpKind::kMod:
      if (is_float(dt)) break;
      fold_values(ctx, dt, shape, [fmod](auto v) { return fold_mod(v[0], v[1], fmod); });
      break;
    case OpKind::kMax:
    case OpKind::kMin: {
      bool is_max = op == OpKind::kMax;
      fold_values(ctx, dt, shape, [is_max](auto v) {
        Dim r = v[0];
        for (size_t k = 1; k < v.size(); ++k) r = min_max(r, v[k], is_max);
        return std::optional<Dim>(r);
      });
      break;
    }
    case OpKind::kPow:
      if (is_float(dt)) break;
      fold_values(ctx, dt, shape, [](auto v) -> std::optional<Dim> {
        if (!v[0].is_const() || !v[1].is_const() || v[1].value() < 0 || v[1].value() > 62) {
          return std::nullopt;
        }
        int64_t r = 1;
        for (int64_t k = 0; k < v[1].value(); ++k) {
          auto m = checked_mul(r, v[0].value());
          if (!m) return std::nullopt;
          r = *m;
        }
        return Dim(r);
      });
      break;
    default:
      break;
  }
  return ok_status();
}

// ---- comparisons and logic ----

Status infer_compare(InferContext& ctx) {
  OpKind op = find_op(ctx.node().domain, ctx.node().op_type);
  KILN_ASSIGN_OR_RETURN(auto shape, broadcast_inputs(ctx));
  KILN_RETURN_IF_ERROR(require_same_dtype(ctx, 0, 1));
  ctx.set_output(0, DType::kBool, shape);
  fold_values(ctx, DType::kBool, shape, [op](auto v) -> std::optional<Dim> {
    Order o = compare_dims(v[0], v[1]);
    switch (op) {
      case OpKind::kEqual:
        return decide(o.known_eq, o.known_ne);
      case OpKind::kLess:
        return decide(o.known_lt, o.known_ge);
      case OpKind::kLessOrEqual:
        return decide(o.known_le, o.known_gt);
      case OpKind::kGreater:
        return decide(o.known_gt, o.known_le);
      case OpKind::kGreaterOrEqual:
        return decide(o.known_ge, o.known_lt);
      default:
        return std::nullopt;
    }
  });
  return ok_status();
}

Status infer_logic(InferContext& ctx) {
  OpKind op = find_op(ctx.node().domain, ctx.node().op_type);
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    KILN_RETURN_IF_ERROR(require_dtype(ctx, i, ctx.input_dtype(i) == DType::kBool, "bool tensors"));
  }
  KILN_ASSIGN_OR_RETURN(auto shape, broadcast_inputs(ctx));
  ctx.set_output(0, DType::kBool, shape);
  fold_values(ctx, DType::kBool, shape, [op](auto v) -> std::optional<Dim> {
    auto a = const_bool(v[0]);
    if (!a) return std::nullopt;
    if (op == OpKind::kNot) return Dim(!*a);
    auto b = const_bool(v[1]);
    if (!b) return std::nullopt;
    switch (op) {
      case OpKind::kAnd:
        return Dim(*a && *b);
      case OpKind::kOr:
        return Dim(*a || *b);
      case OpKind::kXor:
        return Dim(*a != *b);
      default:
        return std::nullopt;
    }
  });
  return ok_status();
}

// ---- unary ----

// Ops whose ONNX type constraint is float tensors only.
bool float_only(OpKind op) {
  switch (op) {
    case OpKind::kReciprocal:
    case OpKind::kSqrt:
    case OpKind::kExp:
    case OpKind::kLog:
    case OpKind::kSigmoid:
    case OpKind::kTanh:
    case OpKind::kHardSigmoid:
    case OpKind::kHardSwish:
    case OpKind::kSin:
    case OpKind::kCos:
    case OpKind::kFloor:
    case OpKind::kCeil:
    case OpKind::kLeakyRelu:
    case OpKind::kSoftplus:
    case OpKind::kElu:
    case OpKind::kGelu:
    case OpKind::kRound:
    case OpKind::kIsNaN:
    case OpKind::kIsInf:
      return true;
    default:
      return false;
  }
}

// Floor(a / c) and Ceil(a / c) in float, for integers a with |a| < limit (2^24 for float32) and a
// constant positive integer c <= limit, are floor_div(a, c) and ceil_div(a, c). Where q = a / c is
// an integer it is representable (|q| <= |a|) and the division exact. Otherwise n < q < n + 1
// with n = floor(q), and q lies at least 1/c from both n and n + 1 (its denominator is c). Round
// to nearest moves q by at most 2^-24 |q| = 2^-24 |a| / c < 1/c (q is normal: |q| >= 1/c >= 2^-24),
// and n and n + 1 are representable, so the rounded quotient stays strictly between them: Floor
// gives n and Ceil n + 1, as exact arithmetic does. Float64 is the same with 2^53.
void floor_of_div(InferContext& ctx, bool ceil) {
  const ir::Value& in = ctx.input(0);
  if (in.producer < 0) return;
  const ir::Node& div = ctx.graph().nodes[size_t(in.producer)];
  if (find_op(div.domain, div.op_type) != OpKind::kDiv || div.inputs.size() != 2 ||
      div.inputs[0] < 0 || div.inputs[1] < 0) {
    return;
  }
  const DType dt = in.dtype;
  const int64_t limit = exact_integer_limit(dt);
  const ir::Value& a = ctx.graph().values[size_t(div.inputs[0])];
  const ir::Value& b = ctx.graph().values[size_t(div.inputs[1])];
  auto av = value_elements(a);
  auto bv = value_elements(b);
  auto as = a.shape ? const_shape(*a.shape) : std::nullopt;
  auto os = const_shape(ctx.input_shape(0));
  // The divisor one constant; the numerator's shape is the quotient's.
  if (limit == 0 || !av || !bv || bv->size() != 1 || !as || !os || *as != *os ||
      av->size() != size_t(shape_numel(*os))) {
    return;
  }
  const Dim& c = (*bv)[0];
  if (!c.is_const() || c.value() <= 0 || c.value() > limit) return;
  std::vector<Dim> out;
  for (const Dim& x : *av) {
    const ir::Interval r = ctx.dim_bounds(x);
    if (r.lo <= -limit || r.hi >= limit) return;
    out.push_back(ceil ? Dim::ceil_div(x, c) : Dim::floor_div(x, c));
  }
  ctx.set_output_value(0, std::move(out));
}

Status infer_unary(InferContext& ctx) {
  OpKind op = find_op(ctx.node().domain, ctx.node().op_type);
  DType dt = ctx.input_dtype(0);
  if (float_only(op)) {
    KILN_RETURN_IF_ERROR(require_dtype(ctx, 0, is_float(dt), "float tensors"));
  } else if (op == OpKind::kNeg) {
    KILN_RETURN_IF_ERROR(
        require_dtype(ctx, 0, is_float(dt) || is_signed_int(dt), "signed numeric tensors"));
  } else if (op != OpKind::kIdentity) {
    KILN_RETURN_IF_ERROR(require_dtype(ctx, 0, is_numeric(dt), "numeric tensors"));
  }
  if (op == OpKind::kGelu) {
    auto approx = ctx.attrs().get_string("approximate", "none");
    if (!approx.ok()) return attr_error(ctx, approx.status());
    if (*approx != "none" && *approx != "tanh") {
      return ctx.error(StatusCode::kInvalidModel,
                       "attribute approximate must be 'none' or 'tanh', got '" + *approx + "'");
    }
  }
  for (const char* name : {"alpha", "beta"}) {
    auto f = ctx.attrs().get_float(name, 0.0f);
    if (!f.ok()) return attr_error(ctx, f.status());
  }
  if (op == OpKind::kIsInf) {
    for (const char* name : {"detect_positive", "detect_negative"}) {
      auto f = ctx.attrs().get_int(name, 1);
      if (!f.ok()) return attr_error(ctx, f.status());
    }
  }
  const auto& shape = ctx.input_shape(0);
  DType out = (op == OpKind::kIsNaN || op == OpKind::kIsInf) ? DType::kBool : dt;
  ctx.set_output(0, out, shape);
  switch (op) {
    case OpKind::kIdentity:
      fold_values(ctx, out, shape, [](auto v) { return std::optional<Dim>(v[0]); });
      break;
    case OpKind::kNeg:
      fold_values(ctx, out, shape, [](auto v) { return std::optional<Dim>(-v[0]); });
      break;
    case OpKind::kAbs:
      fold_values(ctx, out, shape, [](auto v) -> std::optional<Dim> {
        Order o = compare_dims(v[0], Dim(0));
        if (o.known_ge) return v[0];
        if (o.known_le) return -v[0];
        return std::nullopt;
      });
      break;
    case OpKind::kRelu:
      fold_values(ctx, out, shape,
                  [](auto v) { return std::optional<Dim>(min_max(v[0], Dim(0), true)); });
      break;
    case OpKind::kFloor:
    case OpKind::kCeil:
    case OpKind::kRound:
      fold_values(ctx, out, shape, [](auto v) { return std::optional<Dim>(v[0]); });
      if (!ctx.outputs()[0].value && op != OpKind::kRound) floor_of_div(ctx, op == OpKind::kCeil);
      break;
    case OpKind::kSign:
      fold_values(ctx, out, shape, [](auto v) -> std::optional<Dim> {
        Order o = compare_dims(v[0], Dim(0));
        if (o.known_gt) return Dim(1);
        if (o.known_lt) return Dim(-1);
        if (o.known_eq) return Dim(0);
        return std::nullopt;
      });
      break;
    default:
      break;
  }
  return ok_status();
}

Status infer_not(InferContext& ctx) { return infer_logic(ctx); }

// ---- Where, Cast, Clip ----

Status infer_where(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(
      require_dtype(ctx, 0, ctx.input_dtype(0) == DType::kBool, "a bool condition"));
  KILN_RETURN_IF_ERROR(require_same_dtype(ctx, 1, 2));
  KILN_ASSIGN_OR_RETURN(auto shape, broadcast_inputs(ctx));
  DType dt = ctx.input_dtype(1);
  ctx.set_output(0, dt, shape);
  fold_values(ctx, dt, shape, [](auto v) -> std::optional<Dim> {
    auto c = const_bool(v[0]);
    if (!c) return std::nullopt;
    return *c ? v[1] : v[2];
  });
  return ok_status();
}

// The known elements of input 0 converted to dt (Cast's and CastLike's).
void fold_cast(InferContext& ctx, DType dt, const std::vector<Dim>& shape) {
  DType src = ctx.input_dtype(0);
  if (is_integer(src) || src == DType::kBool) {
    // To float, fold_values keeps only elements the float holds exactly.
    fold_values(
        ctx, dt, shape,
        [dt](auto v) -> std::optional<Dim> {
          if (is_float(dt)) return v[0];
          if (v[0].is_const()) return Dim(wrap_to(dt, v[0].value()));
          if (dt != DType::kBool) return v[0];
          Order o = compare_dims(v[0], Dim(0));
          return decide(o.known_ne, o.known_eq);
        },
        1);
  } else if (exact_integer_limit(src) != 0) {
    // A float's known elements are integers within 2^24 (float32) or 2^53: int32 and int64 hold
    // them; a narrower integer only a constant it holds.
    fold_values(
        ctx, dt, shape,
        [dt](auto v) -> std::optional<Dim> {
          if (is_float(dt) || dt == DType::kInt64 || dt == DType::kInt32) return v[0];
          if (v[0].is_const() && wrap_to(dt, v[0].value()) == v[0].value()) return v[0];
          return std::nullopt;
        },
        1);
  }
}

Status infer_cast(InferContext& ctx) {
  auto to = ctx.attrs().get_int("to", std::nullopt);
  if (!to.ok()) return attr_error(ctx, to.status());
  if (*to < INT32_MIN || *to > INT32_MAX) {
    return ctx.error(StatusCode::kInvalidModel,
                     "attribute to " + std::to_string(*to) + " is not a dtype");
  }
  DType dt = dtype_from_onnx(int32_t(*to));
  if (dt == DType::kUndefined) {
    return ctx.error(StatusCode::kUnsupported,
                     "Cast to ONNX dtype " + std::to_string(*to) + " is not supported");
  }
  auto sat = ctx.attrs().get_int("saturate", 1);  // only meaningful for float8 targets
  if (!sat.ok()) return attr_error(ctx, sat.status());
  const auto& shape = ctx.input_shape(0);
  ctx.set_output(0, dt, shape);
  fold_cast(ctx, dt, shape);
  return ok_status();
}

// CastLike: Cast to the dtype of input 1 (only its dtype: its elements need not be known for
// input 0's to fold, as the dynamo exporter's CastLike(1, batch) of a Range's start needs).
Status infer_cast_like(InferContext& ctx) {
  if (!ctx.has_input(1)) {
    return ctx.error(StatusCode::kInvalidModel, "input 1 (target_type) is missing");
  }
  auto sat = ctx.attrs().get_int("saturate", 1);
  if (!sat.ok()) return attr_error(ctx, sat.status());
  ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(0));
  fold_cast(ctx, ctx.input_dtype(1), ctx.input_shape(0));
  return ok_status();
}

Status infer_clip(InferContext& ctx) {
  DType dt = ctx.input_dtype(0);
  KILN_RETURN_IF_ERROR(require_dtype(ctx, 0, is_numeric(dt), "numeric tensors"));
  KILN_RETURN_IF_ERROR(require_same_dtype(ctx, 0, 2));
  for (int i = 1; i < 3; ++i) {
    if (!ctx.has_input(i)) continue;
    const auto& s = ctx.input_shape(i);
    for (size_t d = 0; d < s.size(); ++d) {
      KILN_RETURN_IF_ERROR(ctx.require_equal(
          s[d], Dim(1),
          input_label(ctx, i) + " dim " + std::to_string(d) + " is 1 (min and max are scalars)"));
    }
  }
  if (ctx.opset() > 0 && ctx.opset() < 11 && ctx.num_inputs() > 1) {
    return ctx.error(StatusCode::kInvalidModel, "Clip before opset 11 takes min/max as attributes");
  }
  for (const char* name : {"min", "max"}) {
    auto f = ctx.attrs().get_float(name, 0.0f);
    if (!f.ok()) return attr_error(ctx, f.status());
  }
  ctx.set_output(0, dt, ctx.input_shape(0));
  return ok_status();
}

constexpr int kVariadic = 1 << 30;

}  // namespace

void register_elementwise_ops(OpRegistry& r) {
  for (OpKind k :
       {OpKind::kAdd, OpKind::kSub, OpKind::kMul, OpKind::kDiv, OpKind::kPow, OpKind::kMod}) {
    r.add(OpSchema{k, 2, 2, 1, 1, &infer_arith, true, false});
  }
  r.add(OpSchema{OpKind::kMax, 1, kVariadic, 1, 1, &infer_arith,
                 OpTraits{.elementwise = true, .inputs_required = true}});
  r.add(OpSchema{OpKind::kMin, 1, kVariadic, 1, 1, &infer_arith,
                 OpTraits{.elementwise = true, .inputs_required = true}});
  for (OpKind k : {OpKind::kEqual, OpKind::kLess, OpKind::kLessOrEqual, OpKind::kGreater,
                   OpKind::kGreaterOrEqual}) {
    r.add(OpSchema{k, 2, 2, 1, 1, &infer_compare, true, false});
  }
  for (OpKind k : {OpKind::kAnd, OpKind::kOr, OpKind::kXor}) {
    r.add(OpSchema{k, 2, 2, 1, 1, &infer_logic, true, false});
  }
  r.add(OpSchema{OpKind::kNot, 1, 1, 1, 1, &infer_not, true, false});
  for (OpKind k : {OpKind::kNeg,     OpKind::kAbs,  OpKind::kReciprocal,  OpKind::kSqrt,
                   OpKind::kExp,     OpKind::kLog,  OpKind::kErf,         OpKind::kRelu,
                   OpKind::kSigmoid, OpKind::kTanh, OpKind::kHardSigmoid, OpKind::kHardSwish,
                   OpKind::kSin,     OpKind::kCos,  OpKind::kIsNaN,       OpKind::kIsInf,
                   OpKind::kFloor,   OpKind::kCeil, OpKind::kLeakyRelu,   OpKind::kSoftplus,
                   OpKind::kElu,     OpKind::kGelu, OpKind::kSign,        OpKind::kRound}) {
    r.add(OpSchema{k, 1, 1, 1, 1, &infer_unary, true, false});
  }
  r.add(OpSchema{OpKind::kIdentity, 1, 1, 1, 1, &infer_unary, true, true});
  r.add(OpSchema{OpKind::kWhere, 3, 3, 1, 1, &infer_where, true, false});
  r.add(OpSchema{OpKind::kCast, 1, 1, 1, 1, &infer_cast, true, false});
  r.add(OpSchema{OpKind::kCastLike, 2, 2, 1, 1, &infer_cast_like, true, false});
  r.add(OpSchema{OpKind::kClip, 1, 3, 1, 1, &infer_clip, true, false});
}

}  // namespace kiln::ops
