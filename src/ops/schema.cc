// InferContext, the op registry, op lookup by (domain, name) and traits.
#include "ops/schema.h"

#include <cmath>
#include <mutex>
#include <set>

namespace kiln::ops {
namespace {

constexpr std::string_view kOpNames[] = {"Unknown",
#define KILN_OP_NAME(name) #name,
                                         KILN_OPS(KILN_OP_NAME) KILN_INTERNAL_OPS(KILN_OP_NAME)
#undef KILN_OP_NAME
};

#define KILN_OP_COUNT(name) +1
// OpKind values 1..kNumOnnxOps are ai.onnx ops; the internal ops follow.
constexpr size_t kNumOnnxOps = 0 KILN_OPS(KILN_OP_COUNT);
#undef KILN_OP_COUNT

}  // namespace

std::string_view op_name(OpKind kind) {
  size_t i = size_t(kind);
  return i < std::size(kOpNames) ? kOpNames[i] : "Unknown";
}

std::string_view op_domain(OpKind kind) {
  if (kind == OpKind::kFlexAttention) return "ai.onnx.preview";
  return size_t(kind) > kNumOnnxOps && size_t(kind) < std::size(kOpNames) ? kKilnDomain : "";
}

OpKind find_op(std::string_view domain, std::string_view op_type) {
  // FlexAttention lives only in the preview domain.
  if (domain == "ai.onnx.preview") {
    return op_type == "FlexAttention" ? OpKind::kFlexAttention : OpKind::kUnknown;
  }
  size_t first = 1, end = kNumOnnxOps + 1;
  if (domain == kKilnDomain) {
    first = kNumOnnxOps + 1;
    end = std::size(kOpNames);
  } else if (!domain.empty() && domain != "ai.onnx") {
    return OpKind::kUnknown;
  }
  for (size_t i = first; i < end; ++i) {
    if (kOpNames[i] == op_type) return OpKind(i);
  }
  return OpKind::kUnknown;
}

std::string_view precision_class_name(PrecisionClass c) {
  switch (c) {
    case PrecisionClass::kFloat32:
      return "float32";
    case PrecisionClass::kReduced:
      return "reduced";
    case PrecisionClass::kFollow:
      return "follow";
    case PrecisionClass::kNative:
      return "native";
  }
  return "?";
}

void OpRegistry::set_precision(OpKind kind, PrecisionClass c) {
  size_t i = size_t(kind);
  if (i < schemas_.size() && schemas_[i].infer) schemas_[i].traits.precision = c;
}

void OpRegistry::add(OpSchema schema) {
  size_t i = size_t(schema.kind);
  if (schemas_.size() <= i) schemas_.resize(i + 1);
  schemas_[i] = schema;
}

const OpSchema* OpRegistry::find(OpKind kind) const {
  size_t i = size_t(kind);
  if (i >= schemas_.size() || schemas_[i].infer == nullptr) return nullptr;
  return &schemas_[i];
}

const OpRegistry& op_registry() {
  static const OpRegistry registry = [] {
    OpRegistry r;
    register_elementwise_ops(r);
    register_matmul_ops(r);
    register_conv_ops(r);
    register_norm_ops(r);
    register_reduce_ops(r);
    register_resize_ops(r);
    register_shape_ops(r);
    register_generator_ops(r);
    register_index_ops(r);
    register_math_ops(r);
    register_loss_ops(r);
    register_quant_ops(r);
    register_attention_ops(r);
    register_spatial_ops(r);
    register_data_dependent_ops(r);
    register_sequence_model_ops(r);
    register_recurrent_ops(r);
    register_kiln_ops(r);
    register_precision_classes(r);
    return r;
  }();
  return registry;
}

const OpSchema* find_schema(const ir::Node& node) {
  return op_registry().find(find_op(node.domain, node.op_type));
}

const OpTraits& traits(OpKind kind) {
  static const OpTraits kNone;
  const OpSchema* s = op_registry().find(kind);
  return s ? s->traits : kNone;
}

const OpTraits& traits(const ir::Node& node) { return traits(find_op(node.domain, node.op_type)); }

const ir::Value& InferContext::absent_input() {
  static const ir::Value* absent =
      new ir::Value{.name = "(omitted)", .shape = std::vector<ir::Dim>{}};
  return *absent;
}

InferContext::InferContext(const ir::Graph& graph, const ir::Node& node, int node_index,
                           std::vector<Constraint>* constraints)
    : graph_(graph),
      node_(node),
      node_index_(node_index),
      constraints_(constraints),
      outputs_(node.outputs.size()) {}

const Tensor* InferContext::input_constant(int i) const {
  if (!has_input(i)) return nullptr;
  const auto& c = input(i).constant;
  return c ? &*c : nullptr;
}

int64_t exact_integer_limit(DType dt) {
  if (dt == DType::kFloat32) return int64_t(1) << 24;
  if (dt == DType::kFloat64) return int64_t(1) << 53;
  return 0;
}

std::optional<std::vector<ir::Dim>> value_elements(const ir::Value& v) {
  if (v.sym_value) return v.sym_value;
  if (!v.constant || v.constant->numel() > kMaxSymbolicElements) return std::nullopt;
  const Tensor& t = *v.constant;
  std::vector<ir::Dim> out;
  if (is_integer(t.dtype()) || t.dtype() == DType::kBool) {
    for (int64_t k = 0; k < t.numel(); ++k) out.push_back(ir::Dim(t.int_at(k)));
    return out;
  }
  const double limit = double(exact_integer_limit(t.dtype()));
  for (int64_t k = 0; k < t.numel(); ++k) {
    const double x = t.float_at(k);
    // -0.0 is no integer here: 1/x tells it from 0.
    if (!(std::fabs(x) <= limit) || x != std::floor(x) || (x == 0 && std::signbit(x)))
      return std::nullopt;
    out.push_back(ir::Dim(int64_t(x)));
  }
  return out;
}

std::optional<std::vector<ir::Dim>> InferContext::input_value(int i) const {
  if (!has_input(i)) return std::nullopt;
  return value_elements(input(i));
}

ir::Interval InferContext::dim_bounds(const ir::Dim& d) const {
  if (d.is_const()) return {d.value(), d.value()};
  if (!ranges_) return {};
  return d.bounds(*ranges_);
}

StatusOr<std::vector<ir::Dim>> InferContext::require_value(int i, std::string_view what) const {
  auto v = input_value(i);
  if (!v) {
    // A graph input itself: the profile can range its values (a shape-value input).
    const bool graph_input = has_input(i) && input(i).producer < 0 && !input(i).constant;
    return error(
        StatusCode::kUnsupported,
        "input " + std::to_string(i) + " ('" + (has_input(i) ? input(i).name : "") + "', the " +
            std::string(what) +
            ") is computed from tensor data at run time; kiln needs it known at build time "
            "(a constant or a function of input shapes)" +
            (graph_input
                 ? std::string(
                       "; as a model input it can take shape values: give their range in the "
                       "profile (OptimizationProfile::set_shape_values; kiln --minShapes=" +
                       input(i).name + ":v1xv2 ...)")
                 : std::string()));
  }
  return *v;
}

void InferContext::set_output(int i, DType dtype, std::vector<ir::Dim> shape) {
  if (i >= num_outputs()) return;
  outputs_[i].set = true;
  outputs_[i].dtype = dtype;
  outputs_[i].shape = std::move(shape);
}

void InferContext::set_output_value(int i, std::vector<ir::Dim> value) {
  if (i >= num_outputs()) return;
  outputs_[i].value = std::move(value);
}

StatusOr<ir::Dim> InferContext::data_dependent_dim(int output, int dim, std::string_view base,
                                                   const ir::Dim& bound, const ir::Dim& lower) {
  if (!data_dependent_) {
    return error(StatusCode::kUnsupported, "output " + std::to_string(output) +
                                               " has a size only its data decides, which needs the "
                                               "builder's shape inference");
  }
  if (!fresh_) {
    // A stored plan: the symbol at this place, which the plan's list must bound the same way.
    const int v = has_output(output) ? node_.outputs[output] : -1;
    const auto* shape = v >= 0 && graph_.values[v].shape ? &*graph_.values[v].shape : nullptr;
    const ir::Dim stored = shape && dim < int(shape->size()) ? (*shape)[dim] : ir::Dim(-1);
    for (const auto& d : *data_dependent_) {
      if (stored.is_symbol() && stored == ir::Dim::symbol(d.symbol)) {
        // The builder stores bounds simplified over the profiles' ranges (min(2^63 - 1, n) is n).
        auto same = [&](const ir::Dim& kept, const ir::Dim& given) {
          return kept == given || (ranges_ && kept == given.simplify(*ranges_));
        };
        if (same(d.bound, bound) && same(d.lower, lower)) return stored;
        return error(StatusCode::kInvalidArgument,
                     "data-dependent dim " + d.symbol + " is bounded by [" + d.lower.to_string() +
                         ", " + d.bound.to_string() + "] in the plan, but the node bounds it by [" +
                         lower.to_string() + ", " + bound.to_string() + "]");
      }
    }
    return error(StatusCode::kInvalidArgument, "output " + std::to_string(output) + " dim " +
                                                   std::to_string(dim) + " is stored as " +
                                                   stored.to_string() +
                                                   ", not one of the plan's data-dependent dims");
  }
  std::set<std::string> taken;
  for (int in : graph_.inputs) {
    if (graph_.values[in].shape) {
      for (const auto& d : *graph_.values[in].shape) d.collect_symbols(&taken);
    }
  }
  for (const auto& d : *data_dependent_) taken.insert(d.symbol);
  std::string name(base);
  for (int k = 2; taken.count(name); ++k) name = std::string(base) + "_" + std::to_string(k);
  data_dependent_->push_back({name, bound, lower});
  return ir::Dim::symbol(name);
}

StatusOr<ir::Dim> InferContext::range_bounded_dim(int output, int dim, std::string_view base,
                                                  const std::optional<ir::Dim>& bound,
                                                  std::string_view why, const ir::Dim& lower) {
  if (data_dependent_ && !fresh_) {
    const int v = has_output(output) ? node_.outputs[output] : -1;
    const auto* shape = v >= 0 && graph_.values[v].shape ? &*graph_.values[v].shape : nullptr;
    const ir::Dim stored = shape && dim < int(shape->size()) ? (*shape)[dim] : ir::Dim(-1);
    for (const auto& d : *data_dependent_) {
      if (stored.is_symbol() && stored == ir::Dim::symbol(d.symbol)) {
        return data_dependent_dim(output, dim, base, d.bound, d.lower);
      }
    }
    // Not one of the plan's: data_dependent_dim names what the plan stores there.
    return data_dependent_dim(output, dim, base, bound ? *bound : ir::Dim(0));
  }
  if (!bound) return error(StatusCode::kUnsupported, std::string(why));
  return data_dependent_dim(output, dim, base, *bound, lower);
}

Status InferContext::error(StatusCode code, const std::string& message) const {
  return Status(code, node_.describe() + ": " + message);
}

namespace {
bool fits_axis(__int128 v) { return v <= ir::Interval::kInf && v >= -ir::Interval::kInf; }
}  // namespace

StatusOr<ir::Dim> InferContext::add_dims(const ir::Dim& a, const ir::Dim& b,
                                         std::string_view what) const {
  // value() is the constant part of a symbolic dim too; the sum's constant part is theirs.
  if (!fits_axis(__int128(a.value()) + b.value())) {
    return error(StatusCode::kInvalidModel, std::string(what) + " (" + a.to_string() + " + " +
                                                b.to_string() +
                                                ") overflows the largest axis length 2^62");
  }
  return a + b;
}

StatusOr<ir::Dim> InferContext::mul_dims(const ir::Dim& a, const ir::Dim& b,
                                         std::string_view what) const {
  // A constant factor scales every coefficient and the constant part: bound it and the product of
  // the constant parts.
  bool ok = fits_axis(__int128(a.value()) * b.value());
  if (a.is_const() != b.is_const()) ok = ok && fits_axis(a.is_const() ? a.value() : b.value());
  if (!ok) {
    return error(StatusCode::kInvalidModel, std::string(what) + " (" + a.to_string() + " * " +
                                                b.to_string() +
                                                ") overflows the largest axis length 2^62");
  }
  return a * b;
}

StatusOr<int> InferContext::normalize_axis(int64_t axis, int rank, std::string_view what) const {
  if (axis < -rank || axis >= std::max(rank, 1)) {
    return error(StatusCode::kInvalidModel, std::string(what) + " " + std::to_string(axis) +
                                                " is out of range for rank " +
                                                std::to_string(rank));
  }
  return int(axis < 0 ? axis + rank : axis);
}

void InferContext::record(Constraint::Kind kind, const ir::Dim& a, const ir::Dim& b,
                          std::string what) {
  std::string inputs;
  for (size_t i = 0; i < node_.inputs.size(); ++i) {
    const int v = node_.inputs[i];
    inputs += i ? ", " : "";
    inputs += v < 0 || !graph_.values[size_t(v)].shape
                  ? "_"
                  : ir::dims_to_string(*graph_.values[size_t(v)].shape);
  }
  constraints_->push_back(
      {kind, a, b, std::move(what), node_index_, node_.describe(), std::move(inputs)});
}

Status InferContext::require_equal(const ir::Dim& a, const ir::Dim& b, std::string what) {
  ir::Dim diff = a - b;
  if (diff.is_const()) {
    if (diff.value() == 0) return ok_status();
    return error(StatusCode::kInvalidModel, what + ": " + a.to_string() + " != " + b.to_string());
  }
  record(Constraint::Kind::kEqual, a, b, std::move(what));
  return ok_status();
}

Status InferContext::require_ge(const ir::Dim& a, const ir::Dim& b, std::string what) {
  ir::Dim diff = a - b;
  if (diff.is_const()) {
    if (diff.value() >= 0) return ok_status();
    return error(StatusCode::kInvalidModel, what + ": " + a.to_string() + " < " + b.to_string());
  }
  record(Constraint::Kind::kGreaterEqual, a, b, std::move(what));
  return ok_status();
}

Status InferContext::require_divisible(const ir::Dim& a, const ir::Dim& b, std::string what) {
  if (b.is_const() && b.value() == 0) {
    return error(StatusCode::kInvalidModel, what + ": division by zero");
  }
  ir::Dim m = ir::Dim::mod(a, b);
  if (m.is_const()) {
    if (m.value() == 0) return ok_status();
    return error(StatusCode::kInvalidModel,
                 what + ": " + a.to_string() + " is not divisible by " + b.to_string());
  }
  record(Constraint::Kind::kDivisible, a, b, std::move(what));
  return ok_status();
}

StatusOr<ir::Dim> InferContext::broadcast_dim(const ir::Dim& a, const ir::Dim& b,
                                              std::string what) {
  if (a == b) return a;
  if (a.is_const() && a.value() == 1) return b;
  if (b.is_const() && b.value() == 1) return a;
  if (a.is_const() && b.is_const()) {
    return error(StatusCode::kInvalidModel,
                 what + ": dims " + a.to_string() + " and " + b.to_string() + " do not broadcast");
  }
  record(Constraint::Kind::kBroadcast, a, b, std::move(what));
  // Where both are symbolic, the result is whichever is not 1: max() of the two.
  if (a.is_const()) return a;  // b must equal a or be 1
  if (b.is_const()) return b;
  return ir::Dim::max(a, b);
}

StatusOr<std::vector<ir::Dim>> InferContext::broadcast_shapes(
    std::span<const std::vector<ir::Dim>> shapes) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<ir::Dim> out(rank, ir::Dim(1));
  for (size_t k = 0; k < shapes.size(); ++k) {
    const auto& s = shapes[k];
    size_t off = rank - s.size();
    for (size_t d = 0; d < s.size(); ++d) {
      KILN_ASSIGN_OR_RETURN(
          out[off + d], broadcast_dim(out[off + d], s[d],
                                      "input " + std::to_string(k) + " dim " + std::to_string(d) +
                                          " broadcasts against the other inputs"));
    }
  }
  return out;
}

}  // namespace kiln::ops
