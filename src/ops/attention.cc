// Schemas of the attention op family (opset 23+): Attention (3-D inputs with q/kv_num_heads or
// 4-D [B, heads, seq, head_size]; GQA, past key/value, masks, causal, softcap, opset 25's sliding
// windows) and RotaryEmbedding.
#include <string>
#include <vector>

#include "ops/schema.h"

namespace kiln::ops {
namespace {

using ir::Dim;

Status require_float(InferContext& ctx, int i) {
  if (!is_float(ctx.input_dtype(i))) {
    return ctx.error(StatusCode::kInvalidModel, "input " + std::to_string(i) + " has dtype " +
                                                    std::string(dtype_name(ctx.input_dtype(i))) +
                                                    ", expected a float type");
  }
  return ok_status();
}

// Q, K, V as [B, heads, seq, head] dims (3-D inputs split by the num_heads attributes).
struct Heads {
  Dim batch, heads, seq, head;
};

StatusOr<Heads> split_heads(InferContext& ctx, int i, int64_t num_heads, const char* attr) {
  const auto& s = ctx.input_shape(i);
  if (s.size() == 4) return Heads{s[0], s[1], s[2], s[3]};
  if (s.size() != 3) {
    return ctx.error(
        StatusCode::kInvalidModel,
        "input " + std::to_string(i) + " must be 3-D or 4-D, got rank " + std::to_string(s.size()));
  }
  if (num_heads <= 0) {
    return ctx.error(StatusCode::kInvalidModel,
                     std::string("3-D inputs need the attribute ") + attr + " > 0");
  }
  KILN_RETURN_IF_ERROR(ctx.require_divisible(
      s[2], Dim(num_heads), "input " + std::to_string(i) + " hidden size is divisible by " + attr));
  return Heads{s[0], Dim(num_heads), s[1], Dim::floor_div(s[2], Dim(num_heads))};
}

Status infer_attention(InferContext& ctx) {
  for (int i = 0; i < 3; ++i) KILN_RETURN_IF_ERROR(require_float(ctx, i));
  int rank = ctx.input_rank(0);
  if (ctx.input_rank(1) != rank || ctx.input_rank(2) != rank) {
    return ctx.error(StatusCode::kInvalidModel, "Q, K and V must have the same rank");
  }
  KILN_ASSIGN_OR_RETURN(int64_t qh_attr, ctx.attrs().get_int("q_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(int64_t kvh_attr, ctx.attrs().get_int("kv_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(int64_t mode, ctx.attrs().get_int("qk_matmul_output_mode", 0));
  KILN_RETURN_IF_ERROR(ctx.attrs().get_int("is_causal", 0).status());
  if (mode < 0 || mode > 3) {
    return ctx.error(StatusCode::kInvalidModel, "attribute qk_matmul_output_mode must be 0..3");
  }
  // Opset 25: sliding windows, -1 (the default) for an unbounded side.
  for (const char* name : {"left_window_size", "right_window_size"}) {
    KILN_ASSIGN_OR_RETURN(int64_t w, ctx.attrs().get_int(name, -1));
    if (w < -1) {
      return ctx.error(StatusCode::kInvalidModel, std::string("attribute ") + name +
                                                      " must be -1 or nonnegative, got " +
                                                      std::to_string(w));
    }
    if (ctx.attrs().has(name) && ctx.opset() > 0 && ctx.opset() < 25) {
      return ctx.error(StatusCode::kInvalidModel,
                       std::string("attribute ") + name + " needs opset 25");
    }
  }
  KILN_ASSIGN_OR_RETURN(Heads q, split_heads(ctx, 0, qh_attr, "q_num_heads"));
  KILN_ASSIGN_OR_RETURN(Heads k, split_heads(ctx, 1, kvh_attr, "kv_num_heads"));
  KILN_ASSIGN_OR_RETURN(Heads v, split_heads(ctx, 2, kvh_attr, "kv_num_heads"));
  KILN_RETURN_IF_ERROR(ctx.require_equal(k.head, q.head, "K head size matches Q head size"));
  KILN_RETURN_IF_ERROR(ctx.require_equal(v.seq, k.seq, "V sequence length matches K"));
  KILN_RETURN_IF_ERROR(ctx.require_equal(v.heads, k.heads, "V heads match K heads"));
  KILN_RETURN_IF_ERROR(ctx.require_divisible(q.heads, k.heads, "Q heads divisible by KV heads"));
  Dim total = k.seq;
  if (ctx.has_input(4)) {
    const auto& pk = ctx.input_shape(4);
    if (pk.size() != 4)
      return ctx.error(StatusCode::kInvalidModel, "input 4 (past_key) must be 4-D");
    KILN_ASSIGN_OR_RETURN(total, ctx.add_dims(pk[2], k.seq, "past_key dim 2 plus K's sequence"));
  }
  if (ctx.has_input(5) && ctx.input_rank(5) != 4) {
    return ctx.error(StatusCode::kInvalidModel, "input 5 (past_value) must be 4-D");
  }
  DType dt = ctx.input_dtype(0);
  if (rank == 3) {
    ctx.set_output(0, dt, {q.batch, q.seq, q.heads * v.head});
  } else {
    ctx.set_output(0, dt, {q.batch, q.heads, q.seq, v.head});
  }
  if (ctx.has_output(1)) ctx.set_output(1, dt, {k.batch, k.heads, total, k.head});
  if (ctx.has_output(2)) ctx.set_output(2, dt, {v.batch, v.heads, total, v.head});
  if (ctx.has_output(3)) ctx.set_output(3, dt, {q.batch, q.heads, q.seq, total});
  return ok_status();
}

Status infer_rotary(InferContext& ctx) {
  for (int i = 0; i < 3; ++i) KILN_RETURN_IF_ERROR(require_float(ctx, i));
  int rank = ctx.input_rank(0);
  if (rank != 3 && rank != 4) {
    return ctx.error(StatusCode::kInvalidModel, "input 0 must be 3-D or 4-D");
  }
  KILN_ASSIGN_OR_RETURN(int64_t heads, ctx.attrs().get_int("num_heads", 0));
  if (rank == 3 && heads <= 0) {
    return ctx.error(StatusCode::kInvalidModel, "3-D input needs the attribute num_heads > 0");
  }
  if (ctx.has_input(3) && ctx.input_dtype(3) != DType::kInt64) {
    return ctx.error(StatusCode::kInvalidModel, "input 3 (position_ids) must be int64");
  }
  ctx.set_output(0, ctx.input_dtype(0), ctx.input_shape(0));
  return ok_status();
}

}  // namespace

void register_attention_ops(OpRegistry& r) {
  r.add(OpSchema{OpKind::kAttention, 3, 7, 1, 4, &infer_attention});
  r.add(OpSchema{OpKind::kRotaryEmbedding, 3, 4, 1, 1, &infer_rotary});
}

}  // namespace kiln::ops
