// Schemas of the sequence-model ops: LinearAttention and CausalConvWithState (ai.onnx opset 27,
// recurrent state in and out) and FlexAttention (ai.onnx.preview 1; rank-4 Q/K/V, GQA).
#include <string>
#include <vector>

#include "ops/schema.h"

namespace kiln::ops {
namespace {

using ir::Dim;

Status require_float_input(InferContext& ctx, int i, const char* name) {
  if (!is_float(ctx.input_dtype(i))) {
    return ctx.error(StatusCode::kInvalidModel,
                     std::string("input ") + std::to_string(i) + " (" + name + ") has dtype " +
                         std::string(dtype_name(ctx.input_dtype(i))) + ", expected a float type");
  }
  return ok_status();
}

Status require_rank(InferContext& ctx, int i, int rank, const char* name) {
  if (ctx.input_rank(i) != rank) {
    return ctx.error(StatusCode::kInvalidModel, std::string("input ") + std::to_string(i) + " (" +
                                                    name + ") must be " + std::to_string(rank) +
                                                    "-D, got rank " +
                                                    std::to_string(ctx.input_rank(i)));
  }
  return ok_status();
}

// LinearAttention: query/key/value [B, T, heads*d]; past_state [B, H_kv, d_k, d_v]; decay
// [B, T, H_kv or H_kv*d_k]; beta [B, T, H_kv or 1]. Outputs [B, T, H_q*d_v] and the state.
Status infer_linear_attention(InferContext& ctx) {
  static const char* kNames[] = {"query", "key", "value", "past_state", "decay", "beta"};
  for (int i = 0; i < 6; ++i) {
    if (!ctx.has_input(i)) continue;
    KILN_RETURN_IF_ERROR(require_float_input(ctx, i, kNames[i]));
    KILN_RETURN_IF_ERROR(require_rank(ctx, i, i == 3 ? 4 : 3, kNames[i]));
  }
  KILN_ASSIGN_OR_RETURN(int64_t qh, ctx.attrs().get_int("q_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(int64_t kvh, ctx.attrs().get_int("kv_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(std::string rule, ctx.attrs().get_string("update_rule", "gated_delta"));
  KILN_RETURN_IF_ERROR(ctx.attrs().get_float("scale", 0.0f).status());
  if (qh <= 0 || kvh <= 0 || qh % kvh != 0) {
    return ctx.error(StatusCode::kInvalidModel, "attributes q_num_heads (" + std::to_string(qh) +
                                                    ") and kv_num_heads (" + std::to_string(kvh) +
                                                    ") must be positive with q a multiple of kv");
  }
  bool gating = rule == "gated" || rule == "gated_delta";
  bool delta = rule == "delta" || rule == "gated_delta";
  if (!gating && !delta && rule != "linear") {
    return ctx.error(
        StatusCode::kInvalidModel,
        "attribute update_rule '" + rule + "' is not one of linear, gated, delta, gated_delta");
  }
  if (gating != ctx.has_input(4)) {
    return ctx.error(
        StatusCode::kInvalidModel,
        "update_rule '" + rule + (gating ? "' requires" : "' forbids") + " input 4 (decay)");
  }
  if (delta != ctx.has_input(5)) {
    return ctx.error(
        StatusCode::kInvalidModel,
        "update_rule '" + rule + (delta ? "' requires" : "' forbids") + " input 5 (beta)");
  }
  const auto& q = ctx.input_shape(0);
  const auto& k = ctx.input_shape(1);
  const auto& v = ctx.input_shape(2);
  KILN_RETURN_IF_ERROR(
      ctx.require_divisible(q[2], Dim(qh), "query hidden size divisible by q_num_heads"));
  KILN_RETURN_IF_ERROR(
      ctx.require_divisible(k[2], Dim(kvh), "key hidden size divisible by kv_num_heads"));
  KILN_RETURN_IF_ERROR(
      ctx.require_divisible(v[2], Dim(kvh), "value hidden size divisible by kv_num_heads"));
  Dim dk = Dim::floor_div(q[2], Dim(qh));
  Dim dv = Dim::floor_div(v[2], Dim(kvh));
  KILN_RETURN_IF_ERROR(ctx.require_equal(Dim::floor_div(k[2], Dim(kvh)), dk,
                                         "key head size matches query head size"));
  for (int i = 1; i < 3; ++i) {
    KILN_RETURN_IF_ERROR(ctx.require_equal(ctx.input_shape(i)[0], q[0], "batch matches query"));
    KILN_RETURN_IF_ERROR(ctx.require_equal(ctx.input_shape(i)[1], q[1], "length matches query"));
  }
  DType state_dt = ctx.input_dtype(0);
  if (ctx.has_input(3)) {
    const auto& s = ctx.input_shape(3);
    KILN_RETURN_IF_ERROR(ctx.require_equal(s[0], q[0], "past_state dim 0 matches batch"));
    KILN_RETURN_IF_ERROR(ctx.require_equal(s[1], Dim(kvh), "past_state dim 1 is kv_num_heads"));
    KILN_RETURN_IF_ERROR(ctx.require_equal(s[2], dk, "past_state dim 2 is the key head size"));
    KILN_RETURN_IF_ERROR(ctx.require_equal(s[3], dv, "past_state dim 3 is the value head size"));
    state_dt = ctx.input_dtype(3);
  }
  ctx.set_output(0, ctx.input_dtype(0), {q[0], q[1], Dim(qh) * dv});
  if (ctx.has_output(1)) ctx.set_output(1, state_dt, {q[0], Dim(kvh), dk, dv});
  return ok_status();
}

// CausalConvWithState: input [B, C, L], weight [C, 1, k], bias [C], past_state [B, C, k-1].
Status infer_causal_conv(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_float_input(ctx, 0, "input"));
  KILN_RETURN_IF_ERROR(require_rank(ctx, 0, 3, "input"));
  KILN_RETURN_IF_ERROR(require_rank(ctx, 1, 3, "weight"));
  KILN_ASSIGN_OR_RETURN(std::string act, ctx.attrs().get_string("activation", "none"));
  if (act != "none" && act != "silu" && act != "swish") {
    return ctx.error(StatusCode::kInvalidModel,
                     "attribute activation '" + act + "' is not one of none, silu, swish");
  }
  const auto& x = ctx.input_shape(0);
  const auto& w = ctx.input_shape(1);
  KILN_RETURN_IF_ERROR(ctx.require_equal(w[0], x[1], "weight dim 0 matches channels"));
  KILN_RETURN_IF_ERROR(ctx.require_equal(w[1], Dim(1), "weight dim 1 is 1 (depthwise)"));
  KILN_RETURN_IF_ERROR(ctx.require_ge(w[2], Dim(1), "kernel size is at least 1"));
  Dim km1 = w[2] - Dim(1);
  if (ctx.has_input(2)) {
    KILN_RETURN_IF_ERROR(require_rank(ctx, 2, 1, "bias"));
    KILN_RETURN_IF_ERROR(ctx.require_equal(ctx.input_shape(2)[0], x[1], "bias matches channels"));
  }
  if (ctx.has_input(3)) {
    KILN_RETURN_IF_ERROR(require_rank(ctx, 3, 3, "past_state"));
    const auto& s = ctx.input_shape(3);
    KILN_RETURN_IF_ERROR(ctx.require_equal(s[0], x[0], "past_state dim 0 matches batch"));
    KILN_RETURN_IF_ERROR(ctx.require_equal(s[1], x[1], "past_state dim 1 matches channels"));
    KILN_RETURN_IF_ERROR(ctx.require_equal(s[2], km1, "past_state dim 2 is kernel size - 1"));
  }
  ctx.set_output(0, ctx.input_dtype(0), x);
  if (ctx.has_output(1)) ctx.set_output(1, ctx.input_dtype(0), {x[0], x[1], km1});
  return ok_status();
}

// FlexAttention: Q [B, Hq, L, E], K [B, Hkv, S, E], V [B, Hkv, S, Ev] -> [B, Hq, L, Ev].
// score_mod / prob_mod are one-in one-out graphs over the [B, Hq, L, S] scores / probabilities.
Status infer_flex_attention(InferContext& ctx) {
  static const char* kNames[] = {"Q", "K", "V"};
  for (int i = 0; i < 3; ++i) {
    KILN_RETURN_IF_ERROR(require_float_input(ctx, i, kNames[i]));
    KILN_RETURN_IF_ERROR(require_rank(ctx, i, 4, kNames[i]));
  }
  for (const char* mod : {"score_mod", "prob_mod"}) {
    const ir::Attribute* a = ctx.attrs().find(mod);
    if (a && (a->type != ir::AttrType::kGraph || !a->g || a->g->inputs.size() != 1 ||
              a->g->outputs.size() != 1)) {
      return ctx.error(
          StatusCode::kInvalidModel,
          std::string("attribute ") + mod + " must be a graph of one input and one output");
    }
  }
  KILN_RETURN_IF_ERROR(ctx.attrs().get_float("scale", 0.0f).status());
  KILN_ASSIGN_OR_RETURN(int64_t sp, ctx.attrs().get_int("softmax_precision", 1));
  (void)sp;
  const auto& q = ctx.input_shape(0);
  const auto& k = ctx.input_shape(1);
  const auto& v = ctx.input_shape(2);
  KILN_RETURN_IF_ERROR(ctx.require_equal(k[0], q[0], "K batch matches Q"));
  KILN_RETURN_IF_ERROR(ctx.require_equal(v[0], q[0], "V batch matches Q"));
  KILN_RETURN_IF_ERROR(ctx.require_equal(v[1], k[1], "V heads match K heads"));
  KILN_RETURN_IF_ERROR(ctx.require_equal(v[2], k[2], "V sequence length matches K"));
  KILN_RETURN_IF_ERROR(ctx.require_equal(k[3], q[3], "K head size matches Q"));
  KILN_RETURN_IF_ERROR(ctx.require_divisible(q[1], k[1], "Q heads divisible by KV heads"));
  ctx.set_output(0, ctx.input_dtype(0), {q[0], q[1], q[2], v[3]});
  return ok_status();
}

}  // namespace

void register_sequence_model_ops(OpRegistry& r) {
  r.add(OpSchema{OpKind::kLinearAttention, 3, 6, 1, 2, &infer_linear_attention});
  r.add(OpSchema{OpKind::kCausalConvWithState, 2, 4, 1, 2, &infer_causal_conv});
  r.add(OpSchema{OpKind::kFlexAttention, 3, 3, 1, 1, &infer_flex_attention});
}

}  // namespace kiln::ops
