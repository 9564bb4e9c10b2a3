// Schemas of the recurrent ops RNN, GRU and LSTM (opsets 1/3 read as 7, 7, 14, 22): the shapes of
// X, W, R, B, sequence_lens, initial_h/c and P checked against num_directions, hidden_size and
// layout; Y, Y_h and Y_c inferred. Also the attribute parser the CPU kernel shares (recurrent.h).
#include "ops/recurrent.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

namespace kiln::ops {
namespace {

using ir::Dim;

struct ActivationInfo {
  const char* name;
  RnnActivationKind kind;
  // Whether the function reads alpha / beta, and their defaults (those of the ONNX op of that
  // name: LeakyRelu 0.01, ThresholdedRelu 1, HardSigmoid 0.2/0.5, Elu 1, Affine 1/0).
  bool has_alpha, has_beta;
  double alpha, beta;
};

constexpr ActivationInfo kActivations[] = {
    {"Relu", RnnActivationKind::kRelu, false, false, 0, 0},
    {"Tanh", RnnActivationKind::kTanh, false, false, 0, 0},
    {"Sigmoid", RnnActivationKind::kSigmoid, false, false, 0, 0},
    {"Affine", RnnActivationKind::kAffine, true, true, 1.0, 0.0},
    {"LeakyRelu", RnnActivationKind::kLeakyRelu, true, false, 0.01, 0},
    {"ThresholdedRelu", RnnActivationKind::kThresholdedRelu, true, false, 1.0, 0},
    {"ScaledTanh", RnnActivationKind::kScaledTanh, true, true, 1.0, 1.0},
    {"HardSigmoid", RnnActivationKind::kHardSigmoid, true, true, 0.2, 0.5},
    {"Elu", RnnActivationKind::kElu, true, false, 1.0, 0},
    {"Softsign", RnnActivationKind::kSoftsign, false, false, 0, 0},
    {"Softplus", RnnActivationKind::kSoftplus, false, false, 0, 0},
};

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

const ActivationInfo* find_activation(const std::string& name) {
  for (const ActivationInfo& a : kActivations) {
    if (lower(a.name) == lower(name)) return &a;
  }
  return nullptr;
}

}  // namespace

StatusOr<RecurrentAttrs> parse_recurrent_attrs(OpKind op, const ir::Node& node) {
  const ir::Attributes& attrs = node.attrs;
  RecurrentAttrs r;
  std::vector<std::string> defaults;
  switch (op) {
    case OpKind::kRNN:
      r.gates = 1;
      defaults = {"Tanh"};
      break;
    case OpKind::kGRU:
      r.gates = 3;
      defaults = {"Sigmoid", "Tanh"};
      break;
    case OpKind::kLSTM:
      r.gates = 4;
      defaults = {"Sigmoid", "Tanh", "Tanh"};
      break;
    default:
      return internal_error("parse_recurrent_attrs: not a recurrent op");
  }
  r.activations_per_direction = int(defaults.size());

  KILN_ASSIGN_OR_RETURN(std::string direction, attrs.get_string("direction", "forward"));
  if (direction == "bidirectional") {
    r.num_directions = 2;
  } else if (direction == "reverse") {
    r.reverse = true;
  } else if (direction != "forward") {
    return invalid_model("attribute direction '" + direction +
                         "' is not one of forward, reverse, bidirectional");
  }
  if (attrs.has("hidden_size")) {
    KILN_ASSIGN_OR_RETURN(int64_t hs, attrs.get_int("hidden_size", std::nullopt));
    if (hs <= 0) {
      return invalid_model("attribute hidden_size must be positive, got " + std::to_string(hs));
    }
    r.hidden_size = hs;
  }
  KILN_ASSIGN_OR_RETURN(int64_t layout, attrs.get_int("layout", 0));
  if (layout != 0 && layout != 1) {
    return invalid_model("attribute layout must be 0 or 1, got " + std::to_string(layout));
  }
  if (layout != 0 && node.opset < 14) {
    return invalid_model("attribute layout=1 needs opset 14 or later; the node has opset " +
                         std::to_string(node.opset));
  }
  r.layout = int(layout);
  if (attrs.has("clip")) {
    KILN_ASSIGN_OR_RETURN(float clip, attrs.get_float("clip", std::nullopt));
    if (!(clip >= 0)) {
      return invalid_model("attribute clip must be a non-negative threshold, got " +
                           std::to_string(clip));
    }
    r.clip = clip;
  }
  KILN_ASSIGN_OR_RETURN(int64_t lbr, attrs.get_int("linear_before_reset", 0));
  KILN_ASSIGN_OR_RETURN(int64_t input_forget, attrs.get_int("input_forget", 0));
  if (op != OpKind::kGRU && attrs.has("linear_before_reset")) {
    return invalid_model("attribute linear_before_reset is GRU's only");
  }
  if (op != OpKind::kLSTM && attrs.has("input_forget")) {
    return invalid_model("attribute input_forget is LSTM's only");
  }
  r.linear_before_reset = lbr != 0;
  r.input_forget = input_forget != 0;
  // RNN-1, GRU-3 and LSTM-1 (opset 6 models) carry output_sequence; Y is simply an optional
  // output in every version, so it changes nothing.
  KILN_RETURN_IF_ERROR(attrs.get_int("output_sequence", 0).status());

  // activations: `per direction` names, for each direction (forward's first). A bidirectional
  // node given one direction's list uses it for both.
  std::vector<std::string> names = defaults;
  if (const ir::Attribute* a = attrs.find("activations")) {
    if (a->type != ir::AttrType::kStrings && a->type != ir::AttrType::kString) {
      return invalid_model("attribute activations must be a list of strings");
    }
    names = a->type == ir::AttrType::kString ? std::vector<std::string>{a->s} : a->strings;
  }
  size_t per = defaults.size(), want = per * size_t(r.num_directions);
  if (names.size() == per && r.num_directions == 2) {
    std::vector<std::string> both = names;
    both.insert(both.end(), names.begin(), names.end());
    names = both;
  }
  if (names.size() != want) {
    return invalid_model("attribute activations has " + std::to_string(names.size()) +
                         " functions, expected " + std::to_string(per) + " per direction (" +
                         std::to_string(want) + " for direction " + direction + ")");
  }
  // activation_alpha / activation_beta are consumed in order by the functions that take them
  // (ONNX Runtime's reading of "consumed in the order of activation functions"); a function past
  // the end of the list takes its ONNX op's default.
  KILN_ASSIGN_OR_RETURN(std::vector<float> alphas,
                        attrs.get_floats("activation_alpha", std::vector<float>{}));
  KILN_ASSIGN_OR_RETURN(std::vector<float> betas,
                        attrs.get_floats("activation_beta", std::vector<float>{}));
  size_t next_alpha = 0, next_beta = 0;
  for (const std::string& name : names) {
    const ActivationInfo* info = find_activation(name);
    if (!info) {
      return invalid_model("attribute activations: '" + name +
                           "' is not one of Relu, Tanh, Sigmoid, Affine, LeakyRelu, "
                           "ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus");
    }
    RnnActivation act{info->kind, info->alpha, info->beta};
    if (info->has_alpha && next_alpha < alphas.size()) act.alpha = alphas[next_alpha++];
    if (info->has_beta && next_beta < betas.size()) act.beta = betas[next_beta++];
    r.activations.push_back(act);
  }
  return r;
}

namespace {

const char* const kInputNames[] = {"X",         "W",         "R", "B", "sequence_lens",
                                   "initial_h", "initial_c", "P"};

std::string input_label(int i) {
  return "input " + std::to_string(i) + " (" + kInputNames[i] + ")";
}

Status require_rank(InferContext& ctx, int i, int rank) {
  if (ctx.input_rank(i) != rank) {
    return ctx.error(StatusCode::kInvalidModel, input_label(i) + " must be " +
                                                    std::to_string(rank) + "-D, got shape " +
                                                    ir::dims_to_string(ctx.input_shape(i)));
  }
  return ok_status();
}

// Each dim of input i equals the expected dim; `names` says what each dim is.
Status require_dims(InferContext& ctx, int i, const std::vector<Dim>& expected,
                    const std::vector<const char*>& names) {
  KILN_RETURN_IF_ERROR(require_rank(ctx, i, int(expected.size())));
  const auto& s = ctx.input_shape(i);
  for (size_t d = 0; d < expected.size(); ++d) {
    KILN_RETURN_IF_ERROR(ctx.require_equal(
        s[d], expected[d], input_label(i) + " dim " + std::to_string(d) + " is " + names[d]));
  }
  return ok_status();
}

bool is_rnn_float(DType dt) {
  return dt == DType::kFloat32 || dt == DType::kFloat64 || dt == DType::kFloat16 ||
         dt == DType::kBFloat16;
}

Status infer_recurrent(InferContext& ctx, OpKind op) {
  auto parsed = parse_recurrent_attrs(op, ctx.node());
  if (!parsed.ok()) return ctx.error(parsed.status().code(), parsed.status().message());
  const RecurrentAttrs& a = *parsed;
  DType dt = ctx.input_dtype(0);
  if (!is_rnn_float(dt)) {
    return ctx.error(StatusCode::kInvalidModel,
                     input_label(0) + " has dtype " + std::string(dtype_name(dt)) +
                         ", expected float32, float64, float16 or bfloat16");
  }
  for (int i = 1; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i) || i == 4) continue;
    if (ctx.input_dtype(i) != dt) {
      return ctx.error(StatusCode::kInvalidModel, input_label(i) + " has dtype " +
                                                      std::string(dtype_name(ctx.input_dtype(i))) +
                                                      ", expected X's " +
                                                      std::string(dtype_name(dt)));
    }
  }
  KILN_RETURN_IF_ERROR(require_rank(ctx, 0, 3));
  KILN_RETURN_IF_ERROR(require_rank(ctx, 2, 3));
  const auto& x = ctx.input_shape(0);
  Dim seq = a.layout == 0 ? x[0] : x[1];
  Dim batch = a.layout == 0 ? x[1] : x[0];
  Dim input_size = x[2];
  Dim nd(a.num_directions);
  Dim hidden = a.hidden_size ? Dim(*a.hidden_size) : ctx.input_shape(2)[2];
  Dim gates = Dim(a.gates) * hidden;
  KILN_RETURN_IF_ERROR(require_dims(ctx, 1, {nd, gates, input_size},
                                    {"num_directions", "gates*hidden_size", "X's input_size"}));
  KILN_RETURN_IF_ERROR(require_dims(ctx, 2, {nd, gates, hidden},
                                    {"num_directions", "gates*hidden_size", "hidden_size"}));
  if (ctx.has_input(3)) {
    KILN_RETURN_IF_ERROR(require_dims(ctx, 3, {nd, Dim(2 * a.gates) * hidden},
                                      {"num_directions", "2*gates*hidden_size"}));
  }
  if (ctx.has_input(4)) {
    if (ctx.input_dtype(4) != DType::kInt32) {
      return ctx.error(StatusCode::kInvalidModel, input_label(4) + " has dtype " +
                                                      std::string(dtype_name(ctx.input_dtype(4))) +
                                                      ", expected int32");
    }
    KILN_RETURN_IF_ERROR(require_dims(ctx, 4, {batch}, {"batch_size"}));
  }
  std::vector<Dim> state =
      a.layout == 0 ? std::vector<Dim>{nd, batch, hidden} : std::vector<Dim>{batch, nd, hidden};
  std::vector<const char*> state_names =
      a.layout == 0 ? std::vector<const char*>{"num_directions", "batch_size", "hidden_size"}
                    : std::vector<const char*>{"batch_size", "num_directions", "hidden_size"};
  if (ctx.has_input(5)) KILN_RETURN_IF_ERROR(require_dims(ctx, 5, state, state_names));
  if (op == OpKind::kLSTM) {
    if (ctx.has_input(6)) KILN_RETURN_IF_ERROR(require_dims(ctx, 6, state, state_names));
    if (ctx.has_input(7)) {
      KILN_RETURN_IF_ERROR(
          require_dims(ctx, 7, {nd, Dim(3) * hidden}, {"num_directions", "3*hidden_size"}));
    }
  }
  if (ctx.has_output(0)) {
    ctx.set_output(0, dt,
                   a.layout == 0 ? std::vector<Dim>{seq, nd, batch, hidden}
                                 : std::vector<Dim>{batch, seq, nd, hidden});
  }
  for (int o = 1; o < ctx.num_outputs(); ++o) {
    if (ctx.has_output(o)) ctx.set_output(o, dt, state);
  }
  return ok_status();
}

Status infer_rnn(InferContext& ctx) { return infer_recurrent(ctx, OpKind::kRNN); }
Status infer_gru(InferContext& ctx) { return infer_recurrent(ctx, OpKind::kGRU); }
Status infer_lstm(InferContext& ctx) { return infer_recurrent(ctx, OpKind::kLSTM); }

}  // namespace

void register_recurrent_ops(OpRegistry& r) {
  // Inputs X, W, R, B, sequence_lens, initial_h (LSTM: initial_c, P); outputs Y, Y_h (LSTM: Y_c),
  // each optional.
  r.add(OpSchema{OpKind::kRNN, 3, 6, 1, 2, &infer_rnn});
  r.add(OpSchema{OpKind::kGRU, 3, 6, 1, 2, &infer_gru});
  r.add(OpSchema{OpKind::kLSTM, 3, 8, 1, 3, &infer_lstm});
}

}  // namespace kiln::ops
