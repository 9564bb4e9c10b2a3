// Op schemas: one record per op with its arity, type and symbolic shape inference, and traits.
// InferContext is what an inference function sees of a node: inputs' types, shapes, constant and
// symbolic values, and where it records outputs and the constraints the profile checker must prove.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "ir/graph.h"
#include "ops/op_list.h"

namespace kiln::ops {

enum class OpKind {
  kUnknown = 0,
#define KILN_OP_ENUM(name) k##name,
  KILN_OPS(KILN_OP_ENUM) KILN_INTERNAL_OPS(KILN_OP_ENUM)
#undef KILN_OP_ENUM
};

// The domain of kiln's own ops (fused ops the passes emit), beside "" (ai.onnx).
inline constexpr std::string_view kKilnDomain = "kiln";

std::string_view op_name(OpKind kind);
// "" for ai.onnx ops, "ai.onnx.preview" for FlexAttention, kKilnDomain for internal ops.
std::string_view op_domain(OpKind kind);

// A condition on symbolic dims that must hold for every shape in a profile.
struct Constraint {
  enum class Kind { kEqual, kGreaterEqual, kBroadcast, kDivisible };
  Kind kind;
  ir::Dim a, b;      // a == b | a >= b | a,b broadcastable | a % b == 0
  std::string what;  // "input 1 dim 2 matches input 0 dim 2", shown when it fails
  int node = -1;     // index of the node that required it, in the graph shape inference saw
  // That node as errors name it, and its input shapes, kept as shape inference saw them: later
  // passes rewrite the graph before the profile proof runs, so the index may name another node.
  std::string node_desc, node_inputs;
};

class InferContext {
 public:
  InferContext(const ir::Graph& graph, const ir::Node& node, int node_index,
               std::vector<Constraint>* constraints);

  const ir::Node& node() const { return node_; }
  const ir::Attributes& attrs() const { return node_.attrs; }
  int opset() const { return node_.opset; }
  int num_inputs() const { return int(node_.inputs.size()); }
  int num_outputs() const { return int(node_.outputs.size()); }
  bool has_input(int i) const { return i >= 0 && i < num_inputs() && node_.inputs[size_t(i)] >= 0; }
  bool has_output(int i) const {
    return i >= 0 && i < num_outputs() && node_.outputs[size_t(i)] >= 0;
  }
  // An omitted ("") or missing input reads as a placeholder (no dtype, rank 0) instead of out of
  // bounds: inference that forgets has_input() meets a value of the wrong type and errs, never
  // undefined behaviour. check_supported and the plan verifier refuse, before inference, an
  // omitted input the schema requires (OpSchema::min_inputs, OpTraits::inputs_required).
  const ir::Value& input(int i) const {
    return has_input(i) ? graph_.values[size_t(node_.inputs[size_t(i)])] : absent_input();
  }
  static const ir::Value& absent_input();
  DType input_dtype(int i) const { return input(i).dtype; }
  // Inputs always have a known shape by the time a node is inferred (the builder checks).
  const std::vector<ir::Dim>& input_shape(int i) const { return *input(i).shape; }
  int input_rank(int i) const { return int(input(i).shape->size()); }
  const Tensor* input_constant(int i) const;
  // The input's elements as dims: its symbolic value, or its data when it is a small integer
  // constant. nullopt when the values are only known at run time.
  std::optional<std::vector<ir::Dim>> input_value(int i) const;
  // Like input_value, but an error naming the input when it is not known at build time.
  StatusOr<std::vector<ir::Dim>> require_value(int i, std::string_view what) const;

  void set_output(int i, DType dtype, std::vector<ir::Dim> shape);
  // Records the elements of a small integer output, for shape folding. The shape must be set.
  void set_output_value(int i, std::vector<ir::Dim> value);

  // Constraints. Each returns an error at once when it is false on constants; otherwise it is
  // simplified and, unless proven, recorded for the profile checker.
  Status require_equal(const ir::Dim& a, const ir::Dim& b, std::string what);
  Status require_ge(const ir::Dim& a, const ir::Dim& b, std::string what);
  Status require_divisible(const ir::Dim& a, const ir::Dim& b, std::string what);
  // The broadcast of two dims (numpy rules), recording that they are compatible.
  StatusOr<ir::Dim> broadcast_dim(const ir::Dim& a, const ir::Dim& b, std::string what);
  StatusOr<std::vector<ir::Dim>> broadcast_shapes(std::span<const std::vector<ir::Dim>> shapes);

  // a + b and a * b for output dims computed from the model's numbers (pads, repeats, scales,
  // blocksizes). Dim arithmetic wraps, so a huge pad could land on a small positive dim; these
  // refuse a result whose constant part passes 2^62 (Interval::kInf, the largest axis length kiln
  // sizes), with `what` and both operands in the message. Coefficients of symbols are not checked:
  // the profile checker evaluates them with overflow checks.
  StatusOr<ir::Dim> add_dims(const ir::Dim& a, const ir::Dim& b, std::string_view what) const;
  StatusOr<ir::Dim> mul_dims(const ir::Dim& a, const ir::Dim& b, std::string_view what) const;

  // Data-dependent output dims (NonZero, Unique, Compress, NonMaxSuppression). The builder's
  // inference gives the context its list: each call then makes a fresh symbol named after `base`
  // (base, base_2, ...; never an input symbol), bounded by `bound`, and appends it. A verifier
  // passes the plan's list with fresh = false: the call then returns the symbol the plan stores at
  // output `output` dim `dim`, which must be on the list with this bound. Without a list the call
  // is an error naming the node (a context outside a build, such as a one-node test, has none).
  void set_data_dependent(std::vector<ir::DataDependentDim>* list, bool fresh) {
    data_dependent_ = list;
    fresh_ = fresh;
  }
  StatusOr<ir::Dim> data_dependent_dim(int output, int dim, std::string_view base,
                                       const ir::Dim& bound, const ir::Dim& lower = ir::Dim(0));
  // The same for a size read from a tensor computed at run time (Resize's sizes, Pad's pads),
  // bounded by an analysis of the graph's values (ops/value_range.h) rather than by a formula over
  // the node's inputs. nullopt: the analysis found no finite bound, an error that says `why`. A
  // verifier takes the bound its plan stores: passes after inference may rewrite the producers the
  // analysis walked, and the kernel refuses a size past the bound at run time. `lower` is the least
  // size the analysis proves (0 where it proves none).
  StatusOr<ir::Dim> range_bounded_dim(int output, int dim, std::string_view base,
                                      const std::optional<ir::Dim>& bound, std::string_view why,
                                      const ir::Dim& lower = ir::Dim(0));

  // The hull of the profiles' symbol ranges, with the data-dependent dims made so far (infer_shapes
  // sets it). nullptr (a verifier, a one-node test): analyses that need ranges then prove nothing.
  void set_symbol_ranges(const ir::SymbolRanges* ranges) { ranges_ = ranges; }
  const ir::SymbolRanges* symbol_ranges() const { return ranges_; }
  // Bounds of a dim over symbol_ranges(); unbounded where a symbol has no range.
  ir::Interval dim_bounds(const ir::Dim& d) const;
  const ir::Graph& graph() const { return graph_; }

  // Normalizes an axis attribute against a rank, naming the attribute in the error.
  StatusOr<int> normalize_axis(int64_t axis, int rank, std::string_view what) const;

  // An error about this node, with the node's description in front.
  Status error(StatusCode code, const std::string& message) const;

  // A context for `node` of `graph` whose constraints are recorded as this node's: an op runs
  // another op's inference on a view of its inputs (kiln::FusedConv's NHWC shapes seen as NCHW).
  InferContext view(const ir::Graph& graph, const ir::Node& node) const {
    InferContext c(graph, node, node_index_, constraints_);
    c.set_data_dependent(data_dependent_, fresh_);
    c.set_symbol_ranges(ranges_);
    return c;
  }

  struct Output {
    bool set = false;
    DType dtype = DType::kUndefined;
    std::vector<ir::Dim> shape;
    std::optional<std::vector<ir::Dim>> value;
  };
  const std::vector<Output>& outputs() const { return outputs_; }

 private:
  void record(Constraint::Kind kind, const ir::Dim& a, const ir::Dim& b, std::string what);

  const ir::Graph& graph_;
  const ir::Node& node_;
  int node_index_;
  std::vector<Constraint>* constraints_;
  std::vector<Output> outputs_;
  std::vector<ir::DataDependentDim>* data_dependent_ = nullptr;
  bool fresh_ = true;
  const ir::SymbolRanges* ranges_ = nullptr;
};

// The elements of a value as dims, where shape math knows them: its symbolic value, the data of a
// small integer constant, or of a small float32/float64 constant whose elements are integers that
// float holds exactly (exact_integer_limit). nullopt otherwise.
std::optional<std::vector<ir::Dim>> value_elements(const ir::Value& v);

// The magnitude up to which float dtype `dt` holds every integer exactly, the range in which kiln
// carries float shape math as dims: 2^24 for float32, 2^53 for float64; 0 for every other dtype
// (float16 and bfloat16 shape math is computed at run time).
int64_t exact_integer_limit(DType dt);

// Small integer tensors (shape tensors) up to this many elements carry symbolic values.
inline constexpr int64_t kMaxSymbolicElements = 64;

// What a precision-assignment pass may do with an op's floating-point math (the categories of
// PyTorch's autocast lists). The lists live in ops/precision_classes.cc.
enum class PrecisionClass {
  kFloat32,  // numerically sensitive: stays FP32 under FP16/BF16 (reductions, normalizations,
             // softmax, exp/log/pow, losses); the default of an op nobody classified
  kReduced,  // compute-bound, gains from FP16/BF16/TF32 with FP32 accumulation (MatMul, Gemm, Conv)
  kFollow,   // computes in whatever float type its inputs arrive in (elementwise, data movement)
  kNative,   // dtypes fixed by the model, never changed by the pass (shape, integer, quant, Cast)
};
std::string_view precision_class_name(PrecisionClass c);

// Traits passes query instead of switching on op names.
struct OpTraits {
  // Each output element depends only on the input elements at the same (broadcast) index.
  bool elementwise = false;
  // Output 0 has exactly input 0's bytes in the same order, so it may alias input 0's buffer:
  // Reshape, Flatten, Squeeze, Unsqueeze, Identity.
  bool is_view = false;
  PrecisionClass precision = PrecisionClass::kFloat32;
  // No input may be omitted ("" in ONNX), not only the first min_inputs: the variadic ops (Sum,
  // Concat, Einsum...) and kiln's own whose inputs are all data (SelectBranch, Elementwise).
  bool inputs_required = false;
};

struct OpSchema {
  OpKind kind = OpKind::kUnknown;
  int min_inputs = 1, max_inputs = 1;
  int min_outputs = 1, max_outputs = 1;
  Status (*infer)(InferContext& ctx) = nullptr;
  // Family files may write `..., &infer, elementwise, is_view}` (brace elision fills traits).
  OpTraits traits;
};

class OpRegistry {
 public:
  void add(OpSchema schema);
  const OpSchema* find(OpKind kind) const;
  // Sets the precision class of a registered op (precision_classes.cc); unregistered ops are
  // skipped.
  void set_precision(OpKind kind, PrecisionClass c);

 private:
  std::vector<OpSchema> schemas_;  // indexed by OpKind
};

// The registry of every schema, built once on first use from the list in registry.cc.
const OpRegistry& op_registry();
// OpKind for a (domain, op_type): "" or "ai.onnx", "ai.onnx.preview", or "kiln"; kUnknown when
// kiln does not know it (an ONNX name in the kiln domain, or the reverse, is unknown too).
OpKind find_op(std::string_view domain, std::string_view op_type);
// The schema of a node, or nullptr when the op is unknown or not registered.
const OpSchema* find_schema(const ir::Node& node);

// An op's traits; the defaults (nothing elementwise or a view, FP32) for an unregistered op.
const OpTraits& traits(OpKind kind);
const OpTraits& traits(const ir::Node& node);
inline bool is_view(OpKind kind) { return traits(kind).is_view; }
inline bool is_elementwise(OpKind kind) { return traits(kind).elementwise; }
inline PrecisionClass precision_class(OpKind kind) { return traits(kind).precision; }

void register_elementwise_ops(OpRegistry& r);
void register_matmul_ops(OpRegistry& r);
void register_conv_ops(OpRegistry& r);
void register_norm_ops(OpRegistry& r);
void register_reduce_ops(OpRegistry& r);
void register_resize_ops(OpRegistry& r);
void register_shape_ops(OpRegistry& r);
void register_generator_ops(OpRegistry& r);  // Range, ConstantOfShape, Constant, windows, EyeLike
void register_index_ops(OpRegistry& r);
void register_math_ops(OpRegistry& r);
void register_loss_ops(OpRegistry& r);
void register_quant_ops(OpRegistry& r);
void register_sequence_model_ops(OpRegistry& r);
void register_recurrent_ops(OpRegistry& r);  // RNN, GRU, LSTM (recurrent.cc)
void register_attention_ops(OpRegistry& r);
void register_spatial_ops(OpRegistry& r);
void register_data_dependent_ops(OpRegistry& r);
void register_kiln_ops(OpRegistry& r);
// Runs after every family: sets PrecisionClass from the lists in precision_classes.cc.
void register_precision_classes(OpRegistry& r);

}  // namespace kiln::ops
