// Schemas of kiln's own ops (domain "kiln"): the fused ops the builder's passes emit. Each one is
// defined as the ONNX subgraph it replaces, and its CPU reference (backends/cpu/kiln_ops.cc) runs
// that subgraph's kernels, so a fusion is always checked against the unfused oracle.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/conv_activation.h"
#include "ops/elementwise_program.h"
#include "ops/loop_end.h"
#include "ops/schema.h"

namespace kiln::ops {
namespace {

using ir::Dim;

// kiln::BiasSoftmax(X, B) {axis=-1}: Softmax(Add(X, B), axis) over the last axis, as ONNX
// Runtime's com.microsoft BiasSoftmax: an attention's scores and their additive mask read in one
// pass (fuse_bias_softmax makes it). B broadcasts to X without growing it (B's rank at most X's,
// each of its dims 1 or X's, aligned from the right) and has X's float type; Y has X's type and
// shape. The sum is X's type's (rounded there, as the Add was), so a row whose every element
// is -inf gives NaN as the unfused graph does. The CPU reference lives in backends/cpu/norm.cc,
// beside the Softmax row routine it runs.
Status infer_bias_softmax(InferContext& ctx) {
  for (const auto& [name, attr] : ctx.attrs().all()) {
    if (name != "axis") {
      return ctx.error(StatusCode::kInvalidModel, "unknown attribute '" + name + "'");
    }
  }
  const DType t = ctx.input_dtype(0);
  if (!is_float(t) || ctx.input_dtype(1) != t) {
    return ctx.error(StatusCode::kInvalidModel, "X and B must be of one float type, not " +
                                                    std::string(dtype_name(t)) + " and " +
                                                    std::string(dtype_name(ctx.input_dtype(1))));
  }
  const auto& x = ctx.input_shape(0);
  const auto& b = ctx.input_shape(1);
  const int rank = int(x.size());
  if (rank == 0) return ctx.error(StatusCode::kInvalidModel, "X must have at least one dim");
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.attrs().get_int("axis", -1));
  KILN_ASSIGN_OR_RETURN(int a, ctx.normalize_axis(axis, rank, "attribute 'axis'"));
  if (a != rank - 1) {
    return ctx.error(StatusCode::kInvalidModel,
                     "axis " + std::to_string(axis) + " is not the last axis");
  }
  if (b.size() > x.size()) {
    return ctx.error(StatusCode::kInvalidModel, "B of rank " + std::to_string(b.size()) +
                                                    " does not broadcast to X of rank " +
                                                    std::to_string(rank));
  }
  for (size_t d = 0; d < b.size(); ++d) {
    const Dim& bd = b[d];
    const Dim& xd = x[x.size() - b.size() + d];
    if (bd.is_const() && bd.value() == 1) continue;
    KILN_RETURN_IF_ERROR(ctx.require_equal(
        bd, xd, "B's dim " + std::to_string(d) + " (1 or X's, B broadcasting to X)"));
  }
  ctx.set_output(0, t, x);
  return ok_status();
}

// kiln::Relayout(X) {perm, to, pad_last=0}: Pad(Transpose(Cast(X, to), perm), zeros after the
// last axis's end) in one pass over memory: an image input going channels last, converted to the
// engine's float16 or bfloat16 and padded to the channel count cuDNN's tensor-core kernels take
// (assign_layout's Transpose and Pad of the stem's X after assign_precision's Cast; fuse_relayout
// makes it). perm is a permutation of X's axes as Transpose's; to an ONNX dtype as Cast's (the
// conversion is Cast's, exact where the target holds the value); pad_last >= 0 zero elements
// appended to each row of Y's last axis. Y: X's dims permuted, the last grown by pad_last.
Status infer_relayout(InferContext& ctx) {
  for (const auto& [name, attr] : ctx.attrs().all()) {
    if (name != "perm" && name != "to" && name != "pad_last") {
      return ctx.error(StatusCode::kInvalidModel, "unknown attribute '" + name + "'");
    }
  }
  const auto& in = ctx.input_shape(0);
  const int r = int(in.size());
  if (r == 0) return ctx.error(StatusCode::kInvalidModel, "X must have at least one dim");
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> perm, ctx.attrs().get_ints("perm", std::nullopt));
  if (int(perm.size()) != r) {
    return ctx.error(StatusCode::kInvalidModel, "perm has " + std::to_string(perm.size()) +
                                                    " entries for X of rank " + std::to_string(r));
  }
  std::vector<bool> seen(size_t(r), false);
  std::vector<Dim> out;
  for (int64_t p : perm) {
    if (p < 0 || p >= r || seen[size_t(p)]) {
      return ctx.error(StatusCode::kInvalidModel,
                       "perm is not a permutation of 0.." + std::to_string(r - 1));
    }
    seen[size_t(p)] = true;
    out.push_back(in[size_t(p)]);
  }
  KILN_ASSIGN_OR_RETURN(int64_t to, ctx.attrs().get_int("to", std::nullopt));
  const DType dt =
      to < INT32_MIN || to > INT32_MAX ? DType::kUndefined : dtype_from_onnx(int32_t(to));
  if (dt == DType::kUndefined) {
    return ctx.error(StatusCode::kInvalidModel,
                     "attribute to " + std::to_string(to) + " is not a dtype kiln holds");
  }
  KILN_ASSIGN_OR_RETURN(int64_t pad, ctx.attrs().get_int("pad_last", 0));
  if (pad < 0 || pad > (int64_t(1) << 30)) {
    return ctx.error(StatusCode::kInvalidModel,
                     "pad_last " + std::to_string(pad) + " is outside [0, 2^30]");
  }
  out.back() = out.back() + Dim(pad);
  ctx.set_output(0, dt, out);
  return ok_status();
}

// kiln::MatMulBias(A, B, bias?, residual?) {activation="none"}: activation(MatMul(A, B) + bias)
// + residual, the epilogue fusion of linear layers. bias broadcasts to the MatMul result without
// growing it; residual (a transformer's skip connection) has the result's shape.
// activation: "none", "relu", "gelu_erf" (Gelu approximate="none"), "gelu_tanh"
// (approximate="tanh").
Status infer_matmul_bias(InferContext& ctx) {
  for (const auto& [name, attr] : ctx.attrs().all()) {
    if (name != "activation") {
      return ctx.error(StatusCode::kInvalidModel, "unknown attribute '" + name + "'");
    }
  }
  KILN_ASSIGN_OR_RETURN(std::string act, ctx.attrs().get_string("activation", "none"));
  if (act != "none" && act != "relu" && act != "gelu_erf" && act != "gelu_tanh") {
    return ctx.error(StatusCode::kInvalidModel,
                     "activation '" + act + "' is not one of none, relu, gelu_erf, gelu_tanh");
  }
  DType t = ctx.input_dtype(0);
  if (!is_float(t)) {
    return ctx.error(StatusCode::kUnsupported,
                     "input 0 has dtype " + std::string(dtype_name(t)) + ", expected a float type");
  }
  // The MatMul part is MatMul's own inference: one meaning of the product's shape.
  KILN_RETURN_IF_ERROR(op_registry().find(OpKind::kMatMul)->infer(ctx));
  const std::vector<Dim> out = ctx.outputs()[0].shape;
  if (ctx.has_input(2)) {
    if (ctx.input_dtype(2) != t) {
      return ctx.error(StatusCode::kInvalidModel,
                       "input 2 (bias) has dtype " + std::string(dtype_name(ctx.input_dtype(2))) +
                           " but input 0 has " + std::string(dtype_name(t)));
    }
    const auto& bias = ctx.input_shape(2);
    if (bias.size() > out.size()) {
      return ctx.error(StatusCode::kInvalidModel,
                       "input 2 (bias) of rank " + std::to_string(bias.size()) +
                           " does not broadcast to the product of rank " +
                           std::to_string(out.size()));
    }
    for (size_t d = 0; d < bias.size(); ++d) {
      const Dim& target = out[out.size() - bias.size() + d];
      if (bias[d].is_const() && bias[d].value() == 1) continue;
      KILN_RETURN_IF_ERROR(ctx.require_equal(bias[d], target,
                                             "input 2 (bias) dim " + std::to_string(d) +
                                                 " matches product dim " +
                                                 std::to_string(out.size() - bias.size() + d)));
    }
  }
  if (ctx.has_input(3)) {
    if (ctx.input_dtype(3) != t) {
      return ctx.error(StatusCode::kInvalidModel, "input 3 (residual) has dtype " +
                                                      std::string(dtype_name(ctx.input_dtype(3))) +
                                                      " but input 0 has " +
                                                      std::string(dtype_name(t)));
    }
    const auto& r = ctx.input_shape(3);
    if (r.size() != out.size()) {
      return ctx.error(StatusCode::kInvalidModel,
                       "input 3 (residual) of rank " + std::to_string(r.size()) +
                           " is not of the product's rank " + std::to_string(out.size()));
    }
    for (size_t d = 0; d < r.size(); ++d) {
      KILN_RETURN_IF_ERROR(ctx.require_equal(r[d], out[d],
                                             "input 3 (residual) dim " + std::to_string(d) +
                                                 " matches product dim " + std::to_string(d)));
    }
  }
  return ok_status();
}

// The convolution part of kiln::FusedConv with layout "NHWC": Conv's own inference on the operands
// viewed as NCHW (X and W permuted [0, 3, 1, 2]), its output permuted back, so both layouts share
// one meaning of the output shape. Errors number dims as in NCHW, which the message says.
Status infer_nhwc_conv(InferContext& ctx) {
  for (int i = 0; i < 2; ++i) {
    if (ctx.input_rank(i) != 4) {
      return ctx.error(StatusCode::kInvalidModel,
                       "layout NHWC is for 2-D convolutions: input " + std::to_string(i) +
                           (i == 0 ? " (X, [N, H, W, C])" : " (W, [K, kh, kw, C/group])") +
                           " must have rank 4, got " + std::to_string(ctx.input_rank(i)));
    }
  }
  ir::Graph view;
  ir::Node conv = ctx.node();
  conv.inputs.assign(size_t(std::min(ctx.num_inputs(), 3)), -1);
  for (int i = 0; i < int(conv.inputs.size()); ++i) {
    if (!ctx.has_input(i)) continue;
    const ir::Value& in = ctx.input(i);
    ir::Value v{.name = in.name, .dtype = in.dtype, .shape = in.shape};
    if (i < 2) {
      v.shape = std::vector<Dim>{(*in.shape)[0], (*in.shape)[3], (*in.shape)[1], (*in.shape)[2]};
    }
    conv.inputs[size_t(i)] = int(view.values.size());
    view.values.push_back(std::move(v));
  }
  conv.outputs = {int(view.values.size())};
  view.values.push_back(ir::Value{.name = "y"});
  InferContext nchw = ctx.view(view, conv);
  Status st = op_registry().find(OpKind::kConv)->infer(nchw);
  if (!st.ok()) return Status(st.code(), st.message() + " (layout NHWC; dims numbered as in NCHW)");
  const std::vector<Dim>& y = nchw.outputs()[0].shape;
  ctx.set_output(0, nchw.outputs()[0].dtype, {y[0], y[2], y[3], y[1]});
  return ok_status();
}

// The activation attribute `act_attr` (kiln::FusedConv's and kiln::SqueezeExcite's: one of
// conv_activation.h's names) with the count of parameters in `params_attr` it takes.
Status check_activation(InferContext& ctx, const char* act_attr, const char* params_attr) {
  KILN_ASSIGN_OR_RETURN(std::string act, ctx.attrs().get_string(act_attr, "none"));
  KILN_ASSIGN_OR_RETURN(std::vector<float> params,
                        ctx.attrs().get_floats(params_attr, std::vector<float>{}));
  const ConvActivationInfo* info = find_conv_activation(act);
  if (info == nullptr) {
    return ctx.error(StatusCode::kInvalidModel, std::string(act_attr) + " '" + act +
                                                    "' is not one of " + conv_activation_names());
  }
  if (params.size() != size_t(info->params)) {
    return ctx.error(StatusCode::kInvalidModel, std::string(act_attr) + " '" + act + "' takes " +
                                                    std::to_string(info->params) + " " +
                                                    params_attr + ", not " +
                                                    std::to_string(params.size()));
  }
  return ok_status();
}

// kiln::FusedConv(X, W, B?, Z?) {Conv's attributes, activation="none", activation_params=[],
// input_activation="none", input_activation_params=[], layout="NCHW"}:
// activation(Conv(input_activation(X), W, B) + Z), the epilogue fusion of convolution layers (Z: a
// residual of the output's shape). activation: "none", "relu", "clip" (params min, max),
// "hardswish", "hardsigmoid" (params alpha, beta), "sigmoid", "silu" (y * sigmoid(y)),
// "leaky_relu" (alpha), "gelu" (ONNX Gelu, erf) and "gelu_tanh" (its approximate="tanh").
// input_activation: one of the same names, with its input_activation_params, applied to X before
// the convolution (its zero padding pads the activated X): sink_conv_activation moves a producer
// FusedConv's activation there, so that a depthwise kernel applies it while it loads its input
// tile instead of the producer writing the activated tensor in a pass of its own. layout:
// "NCHW" (ONNX's) or "NHWC" (channels last, 2-D only; cuDNN's fast half-precision convolutions read
// it without transposing): X is [N, H, W, C], W is [K, kh, kw, C/group] (KRSC, cuDNN's NHWC filter
// order), B is [K], Z and Y are [N, H', W', K]; pads, strides, dilations, group and auto_pad keep
// their ONNX meaning on the spatial axes H, W.
Status infer_fused_conv(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_activation(ctx, "activation", "activation_params"));
  KILN_RETURN_IF_ERROR(check_activation(ctx, "input_activation", "input_activation_params"));
  KILN_ASSIGN_OR_RETURN(std::string layout, ctx.attrs().get_string("layout", "NCHW"));
  if (layout == "NHWC") {
    KILN_RETURN_IF_ERROR(infer_nhwc_conv(ctx));
  } else if (layout == "NCHW") {
    // The convolution part is Conv's own inference: one meaning of the output's shape.
    KILN_RETURN_IF_ERROR(op_registry().find(OpKind::kConv)->infer(ctx));
  } else {
    return ctx.error(StatusCode::kInvalidModel, "layout '" + layout + "' is not one of NCHW, NHWC");
  }
  if (ctx.has_input(3)) {
    const std::vector<Dim> out = ctx.outputs()[0].shape;
    const auto& z = ctx.input_shape(3);
    if (ctx.input_dtype(3) != ctx.input_dtype(0)) {
      return ctx.error(StatusCode::kInvalidModel,
                       "input 3 (Z) has dtype " + std::string(dtype_name(ctx.input_dtype(3))) +
                           " but input 0 has " + std::string(dtype_name(ctx.input_dtype(0))));
    }
    if (z.size() != out.size()) {
      return ctx.error(StatusCode::kInvalidModel,
                       "input 3 (Z) has rank " + std::to_string(z.size()) +
                           ", the convolution's output " + std::to_string(out.size()));
    }
    for (size_t d = 0; d < z.size(); ++d) {
      KILN_RETURN_IF_ERROR(ctx.require_equal(
          z[d], out[d],
          "input 3 (Z) dim " + std::to_string(d) + " matches the convolution's output"));
    }
  }
  return ok_status();
}

// kiln::Pool(X) {mode, kernel_shape, strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1],
// auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, layout="NHWC"}: MaxPool (mode "max",
// without Indices) or AveragePool (mode "average") of a channels-last X [N, H, W, C], Y
// [N, H', W', C]. ONNX has no channels-last pool, and assign_layout needs one so that a CNN's
// pools stay inside its NHWC convolution stack instead of transposing around them. The other
// attributes keep the ONNX pools' meaning on the spatial axes H, W; layout is "NHWC" only (an
// NCHW pool is the ONNX op).
Status infer_pool(InferContext& ctx) {
  static const char* const kKnown[] = {"mode",      "kernel_shape",      "strides",
                                       "pads",      "dilations",         "auto_pad",
                                       "ceil_mode", "count_include_pad", "layout"};
  for (const auto& [name, attr] : ctx.attrs().all()) {
    if (std::find(std::begin(kKnown), std::end(kKnown), name) == std::end(kKnown)) {
      return ctx.error(StatusCode::kInvalidModel, "unknown attribute '" + name + "'");
    }
  }
  KILN_ASSIGN_OR_RETURN(std::string mode, ctx.attrs().get_string("mode", ""));
  if (mode != "max" && mode != "average") {
    return ctx.error(StatusCode::kInvalidModel, "mode '" + mode + "' is not one of max, average");
  }
  if (mode == "max" && ctx.attrs().has("count_include_pad")) {
    return ctx.error(StatusCode::kInvalidModel, "count_include_pad is for mode average");
  }
  KILN_ASSIGN_OR_RETURN(std::string layout, ctx.attrs().get_string("layout", "NHWC"));
  if (layout != "NHWC") {
    return ctx.error(StatusCode::kInvalidModel, "layout '" + layout + "' is not NHWC");
  }
  if (ctx.input_rank(0) != 4) {
    return ctx.error(StatusCode::kInvalidModel,
                     "layout NHWC is for 2-D pools: X ([N, H, W, C]) must have rank 4, got " +
                         std::to_string(ctx.input_rank(0)));
  }
  // The ONNX pool's own inference on X viewed as NCHW: one meaning of the output's shape.
  ir::Graph view;
  ir::Node pool = ctx.node();
  pool.domain = "";
  pool.op_type = mode == "max" ? "MaxPool" : "AveragePool";
  pool.attrs = ir::Attributes{};
  for (const auto& [name, attr] : ctx.attrs().all()) {
    if (name != "mode" && name != "layout") pool.attrs.set(name, attr);
  }
  const ir::Value& x = ctx.input(0);
  const std::vector<Dim>& xs = *x.shape;
  view.values.push_back(ir::Value{
      .name = x.name, .dtype = x.dtype, .shape = std::vector<Dim>{xs[0], xs[3], xs[1], xs[2]}});
  view.values.push_back(ir::Value{.name = "y"});
  pool.inputs = {0};
  pool.outputs = {1};
  InferContext nchw = ctx.view(view, pool);
  const OpKind kind = mode == "max" ? OpKind::kMaxPool : OpKind::kAveragePool;
  Status st = op_registry().find(kind)->infer(nchw);
  if (!st.ok()) return Status(st.code(), st.message() + " (layout NHWC; dims numbered as in NCHW)");
  const std::vector<Dim>& y = nchw.outputs()[0].shape;
  ctx.set_output(0, nchw.outputs()[0].dtype, {y[0], y[2], y[3], y[1]});
  return ok_status();
}

// kiln::Elementwise(x0, ..., xn) {ops, args, to, alpha, beta}: a chain of elementwise ops fused
// by fuse_elementwise (the program: ops/elementwise_program.h). Each instruction's result has the
// broadcast shape of its operands, as the op it replaced; the output is the last one's.
Status infer_elementwise(InferContext& ctx) {
  std::vector<DType> dtypes;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i))
      return ctx.error(StatusCode::kInvalidModel, "input " + std::to_string(i) + " is missing");
    dtypes.push_back(ctx.input_dtype(i));
  }
  auto program = parse_elementwise_program(ctx.attrs(), dtypes);
  if (!program.ok()) return ctx.error(StatusCode::kInvalidModel, program.status().message());
  std::vector<std::vector<Dim>> shapes;
  for (int i = 0; i < ctx.num_inputs(); ++i) shapes.push_back(ctx.input_shape(i));
  for (const EwInstruction& ins : program->code) {
    std::vector<std::vector<Dim>> operands{shapes[size_t(ins.a)]};
    if (ins.b >= 0) operands.push_back(shapes[size_t(ins.b)]);
    KILN_ASSIGN_OR_RETURN(std::vector<Dim> out, ctx.broadcast_shapes(operands));
    shapes.push_back(std::move(out));
  }
  ctx.set_output(0, program->code.back().to, shapes.back());
  return ok_status();
}

// kiln::PackedAttention(Q, K, V, attn_mask?) {q_num_heads, kv_num_heads, head_size, v_head_size,
// q_offset, k_offset, v_offset, seq_first, scale, is_causal, output_rank}: ONNX Attention whose
// Q, K and V are read in place from 3-D tensors [X0, X1, N] where the heads lie side by side on
// the last axis from an offset (one tensor may hold all three, as a packed QKV projection does),
// and whose output is written in the same layout. seq_first 0: X0 is the batch and X1 the
// sequence; 1: the reverse (nn.MultiheadAttention's sequence-first tensors). So
//   Q[b, h, s, d] = Q_in[b, s, q_offset + h*head_size + d]   (seq_first 0; [s, b, ...] when 1)
// and likewise K and V (kv_num_heads heads, V's of v_head_size), Y = Attention(Q, K, V, attn_mask)
// with `scale` and is_causal as ONNX's, written to Y[b, s, h*v_head_size + d] ([X0, X1, heads,
// v_head_size] when output_rank is 4). attn_mask broadcasts onto [B, q_heads, S, L] as
// Attention's. fuse_attention makes it from an Attention whose inputs are views of such tensors
// (a packed projection split by Gather, Split or Slice, heads split by Reshape and Transpose): the
// views, and the copies they would be, go.
Status infer_packed_attention(InferContext& ctx) {
  static const char* kAttrs[] = {"q_num_heads", "kv_num_heads", "head_size",  "v_head_size",
                                 "q_offset",    "k_offset",     "v_offset",   "seq_first",
                                 "scale",       "is_causal",    "output_rank"};
  for (const auto& entry : ctx.attrs().all()) {
    const std::string& name = entry.first;
    if (std::find_if(std::begin(kAttrs), std::end(kAttrs),
                     [&](const char* a) { return name == a; }) == std::end(kAttrs)) {
      return ctx.error(StatusCode::kInvalidModel, "unknown attribute '" + name + "'");
    }
  }
  auto attr = [&](const char* name, int64_t def) { return ctx.attrs().get_int(name, def); };
  KILN_ASSIGN_OR_RETURN(int64_t hq, attr("q_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(int64_t hk, attr("kv_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(int64_t d, attr("head_size", 0));
  KILN_ASSIGN_OR_RETURN(int64_t dv, attr("v_head_size", 0));
  KILN_ASSIGN_OR_RETURN(int64_t seq_first, attr("seq_first", 0));
  KILN_ASSIGN_OR_RETURN(int64_t causal, attr("is_causal", 0));
  KILN_ASSIGN_OR_RETURN(int64_t out_rank, attr("output_rank", 3));
  KILN_RETURN_IF_ERROR(ctx.attrs().get_float("scale", 1.f).status());
  const int64_t kMax = int64_t(1) << 24;
  if (hq <= 0 || hk <= 0 || hq % hk != 0 || hq > kMax || d <= 0 || d > kMax || dv <= 0 ||
      dv > kMax) {
    return ctx.error(StatusCode::kInvalidModel,
                     "q_num_heads and kv_num_heads must be positive with kv_num_heads dividing "
                     "q_num_heads, and head_size and v_head_size positive (at most 2^24 each)");
  }
  if ((seq_first != 0 && seq_first != 1) || (causal != 0 && causal != 1) ||
      (out_rank != 3 && out_rank != 4)) {
    return ctx.error(StatusCode::kInvalidModel,
                     "seq_first and is_causal must be 0 or 1, output_rank 3 or 4");
  }
  const DType t = ctx.input_dtype(0);
  const char* names[] = {"Q", "K", "V"};
  const int64_t heads[] = {hq, hk, hk}, sizes[] = {d, d, dv};
  const char* offsets[] = {"q_offset", "k_offset", "v_offset"};
  for (int i = 0; i < 3; ++i) {
    if (!ctx.has_input(i))
      return ctx.error(StatusCode::kInvalidModel, std::string(names[i]) + " is missing");
    if (!is_float(ctx.input_dtype(i)) || ctx.input_dtype(i) != t) {
      return ctx.error(StatusCode::kInvalidModel, "Q, K and V must have one float dtype; input " +
                                                      std::to_string(i) + " is " +
                                                      std::string(dtype_name(ctx.input_dtype(i))));
    }
    const auto& s = ctx.input_shape(i);
    if (s.size() != 3 || !s[2].is_const()) {
      return ctx.error(StatusCode::kInvalidModel,
                       std::string(names[i]) + " must be 3-D with a constant last dim");
    }
    KILN_ASSIGN_OR_RETURN(int64_t off, attr(offsets[i], 0));
    if (off < 0 || off > s[2].value() || heads[i] * sizes[i] > s[2].value() - off) {
      return ctx.error(StatusCode::kInvalidModel,
                       std::string(names[i]) + "'s heads (" + offsets[i] + " " +
                           std::to_string(off) + ", " + std::to_string(heads[i]) + " of " +
                           std::to_string(sizes[i]) + ") do not fit its last dim " +
                           std::to_string(s[2].value()));
    }
  }
  const auto &qs = ctx.input_shape(0), &ks = ctx.input_shape(1), &vs = ctx.input_shape(2);
  const int b = int(seq_first), sq = 1 - b;
  const Dim batch = qs[size_t(b)], seq = qs[size_t(sq)], keys = ks[size_t(sq)];
  KILN_RETURN_IF_ERROR(ctx.require_equal(ks[size_t(b)], batch, "K's batch matches Q's"));
  KILN_RETURN_IF_ERROR(ctx.require_equal(vs[size_t(b)], batch, "V's batch matches Q's"));
  KILN_RETURN_IF_ERROR(ctx.require_equal(vs[size_t(sq)], keys, "V's sequence matches K's"));
  if (ctx.has_input(3)) {
    const DType m = ctx.input_dtype(3);
    if (m != t && m != DType::kBool) {
      return ctx.error(StatusCode::kInvalidModel,
                       "attn_mask must be bool or Q's dtype, not " + std::string(dtype_name(m)));
    }
    const auto& ms = ctx.input_shape(3);
    const std::vector<Dim> target = {batch, Dim(hq), seq, keys};
    if (ms.size() > 4) return ctx.error(StatusCode::kInvalidModel, "attn_mask has rank above 4");
    for (size_t i = 0; i < ms.size(); ++i) {
      if (ms[i].is_const() && ms[i].value() == 1) continue;
      KILN_RETURN_IF_ERROR(ctx.require_equal(
          ms[i], target[4 - ms.size() + i],
          "attn_mask dim " + std::to_string(i) + " broadcasts onto [batch, q_heads, seq, keys]"));
    }
  }
  if (out_rank == 4) {
    ctx.set_output(0, t, {qs[0], qs[1], Dim(hq), Dim(dv)});
  } else {
    ctx.set_output(0, t, {qs[0], qs[1], Dim(hq * dv)});
  }
  return ok_status();
}

// kiln::SqueezeExcite(X, W1, B1, W2, B2) {layout, activation1(_params), activation2(_params)}: a
// squeeze-and-excitation gate, G = act2(W2 . act1(W1 . mean_HW(X) + B1) + B2), one value per image
// and channel: [N, C, 1, 1] for layout NCHW, [N, 1, 1, C] for NHWC (the same bytes). W1 and W2 are
// the two 1x1 convolutions' filters as they were ([K, C, 1, 1], or [K, 1, 1, C] in NHWC); every
// operand has X's float type. The Mul that applies the gate stays a (channel-broadcast) Mul.
Status infer_squeeze_excite(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_activation(ctx, "activation1", "activation1_params"));
  KILN_RETURN_IF_ERROR(check_activation(ctx, "activation2", "activation2_params"));
  KILN_ASSIGN_OR_RETURN(std::string layout, ctx.attrs().get_string("layout", "NCHW"));
  if (layout != "NCHW" && layout != "NHWC") {
    return ctx.error(StatusCode::kInvalidModel, "layout '" + layout + "' is not one of NCHW, NHWC");
  }
  const bool nhwc = layout == "NHWC";
  const DType t = ctx.input_dtype(0);
  if (t != DType::kFloat32 && t != DType::kFloat16 && t != DType::kBFloat16) {
    return ctx.error(StatusCode::kInvalidModel, "X must be float32, float16 or bfloat16");
  }
  for (int i = 1; i < 5; ++i) {
    if (ctx.input_dtype(i) != t) {
      return ctx.error(StatusCode::kInvalidModel, "input " + std::to_string(i) + " is " +
                                                      std::string(dtype_name(ctx.input_dtype(i))) +
                                                      ", X is " + std::string(dtype_name(t)));
    }
  }
  const auto& x = ctx.input_shape(0);
  const auto& w1 = ctx.input_shape(1);
  const auto& w2 = ctx.input_shape(3);
  if (x.size() != 4 || w1.size() != 4 || w2.size() != 4 || ctx.input_shape(2).size() != 1 ||
      ctx.input_shape(4).size() != 1) {
    return ctx.error(StatusCode::kInvalidModel, "X, W1 and W2 must have rank 4, B1 and B2 rank 1");
  }
  const ir::Dim c = nhwc ? x[3] : x[1];
  const int in_axis = nhwc ? 3 : 1;
  for (int a = 1; a < 4; ++a) {
    if (a == in_axis) continue;
    KILN_RETURN_IF_ERROR(ctx.require_equal(w1[size_t(a)], ir::Dim(1), "W1 is a 1x1 filter"));
    KILN_RETURN_IF_ERROR(ctx.require_equal(w2[size_t(a)], ir::Dim(1), "W2 is a 1x1 filter"));
  }
  KILN_RETURN_IF_ERROR(
      ctx.require_equal(w1[size_t(in_axis)], c, "W1's input channels are X's channels"));
  KILN_RETURN_IF_ERROR(
      ctx.require_equal(ctx.input_shape(2)[0], w1[0], "B1 has one value per W1 filter"));
  KILN_RETURN_IF_ERROR(ctx.require_equal(w2[size_t(in_axis)], w1[0], "W2 reads W1's outputs"));
  KILN_RETURN_IF_ERROR(ctx.require_equal(w2[0], c, "W2 makes one value per channel of X"));
  KILN_RETURN_IF_ERROR(ctx.require_equal(ctx.input_shape(4)[0], c, "B2 has one value per channel"));
  if (nhwc) {
    ctx.set_output(0, t, {x[0], ir::Dim(1), ir::Dim(1), c});
  } else {
    ctx.set_output(0, t, {x[0], c, ir::Dim(1), ir::Dim(1)});
  }
  return ok_status();
}

// kiln::SelectBranch(cond, then_0..then_{k-1}, else_0..else_{k-1}) -> k outputs: an If whose
// condition only the run knows, after its branches (the builder inlines both, each node running
// under its branch's condition: ir::Node::guards). Output j is then_j when cond is true, else_j
// otherwise. Each dim the branches give alike is kept; one they give differently is a
// data-dependent dim bounded by the larger, bound by the run once the node has chosen.
Status infer_select_branch(InferContext& ctx) {
  if (!ctx.attrs().all().empty()) {
    return ctx.error(StatusCode::kInvalidModel,
                     "unknown attribute '" + ctx.attrs().all().begin()->first + "'");
  }
  const int k = ctx.num_outputs();
  if (ctx.num_inputs() != 1 + 2 * k) {
    return ctx.error(StatusCode::kInvalidModel, "takes a condition and two values per output (" +
                                                    std::to_string(1 + 2 * k) + " inputs), not " +
                                                    std::to_string(ctx.num_inputs()));
  }
  if (ctx.input_dtype(0) != DType::kBool || ctx.input_rank(0) > 1 ||
      (ctx.input_rank(0) == 1 && ctx.input_shape(0)[0] != Dim(1))) {
    return ctx.error(StatusCode::kInvalidModel, "its condition must be one bool, not " +
                                                    std::string(dtype_name(ctx.input_dtype(0))) +
                                                    " " + ir::dims_to_string(ctx.input_shape(0)));
  }
  for (int j = 0; j < k; ++j) {
    const int t = 1 + j, e = 1 + k + j;
    const std::string what = "output " + std::to_string(j) + " ('" + ctx.input(t).name + "' or '" +
                             ctx.input(e).name + "')";
    if (ctx.input_dtype(t) != ctx.input_dtype(e)) {
      return ctx.error(StatusCode::kUnsupported,
                       what + ": the branches give " + std::string(dtype_name(ctx.input_dtype(t))) +
                           " and " + std::string(dtype_name(ctx.input_dtype(e))));
    }
    const auto& a = ctx.input_shape(t);
    const auto& b = ctx.input_shape(e);
    if (a.size() != b.size()) {
      return ctx.error(StatusCode::kUnsupported,
                       what + ": the branches give ranks " + std::to_string(a.size()) + " and " +
                           std::to_string(b.size()) +
                           "; kiln runs an If on data whose branches agree on each output's rank");
    }
    std::vector<Dim> shape(a.size());
    for (size_t d = 0; d < a.size(); ++d) {
      if (a[d] == b[d]) {
        shape[d] = a[d];
      } else {
        KILN_ASSIGN_OR_RETURN(shape[d], ctx.data_dependent_dim(j, int(d), "branch_dim",
                                                               Dim::max(Dim::max(a[d], b[d]), 0)));
      }
    }
    ctx.set_output(j, ctx.input_dtype(t), shape);
    const auto va = ctx.input(t).sym_value, vb = ctx.input(e).sym_value;
    if (va && vb && *va == *vb && shape == a) ctx.set_output_value(j, *va);
  }
  return ok_status();
}

// A bool scalar (rank 0, or [1]): the form of every condition.
bool is_bool_scalar(InferContext& ctx, int i) {
  return ctx.input_dtype(i) == DType::kBool &&
         (ctx.input_rank(i) == 0 || (ctx.input_rank(i) == 1 && ctx.input_shape(i)[0] == Dim(1)));
}

// A Loop whose trip count or condition only the run knows (builder/control_flow.cc keeps one copy
// of its body between the two; the execution context runs the iterations, plan/loops.h):
// kiln::LoopBegin(M?, cond?, v_init_0..v_init_{k-1}) -> (i, cond_in, v_0..v_{k-1}). M (an int64
// scalar) and cond (a bool scalar) may be omitted: no bound, or a condition that starts true. i is
// the iteration (int64 scalar), cond_in the body's condition input; v_j has v_init_j's type and
// shape, and no value known at build time (each iteration rewrites it).
//
// Attribute `grow` (ints, triples j, d, c): carried value j's dim d grows by c per iteration (a
// list the body appends to). That dim of v_j is a data-dependent dim the run binds at the start
// and after each iteration, sized for the longest run: v_init_j's dim + c * max(M, 0), which needs
// M known as a formula of the input shapes (a constant, a shape, or a shape-value input).
Status infer_loop_begin(InferContext& ctx) {
  for (const auto& [name, a] : ctx.attrs().all()) {
    if (name != "grow")
      return ctx.error(StatusCode::kInvalidModel, "unknown attribute '" + name + "'");
  }
  const int k = ctx.num_inputs() - 2;
  if (k < 0 || ctx.num_outputs() != k + 2) {
    return ctx.error(StatusCode::kInvalidModel,
                     "takes M, cond and k carried values and gives i, cond_in and k values (" +
                         std::to_string(ctx.num_inputs()) + " inputs, " +
                         std::to_string(ctx.num_outputs()) + " outputs)");
  }
  if (ctx.has_input(0) && (ctx.input_dtype(0) != DType::kInt64 || ctx.input_rank(0) > 1 ||
                           (ctx.input_rank(0) == 1 && ctx.input_shape(0)[0] != Dim(1)))) {
    return ctx.error(StatusCode::kInvalidModel,
                     "its trip count M must be one int64, not " + ir::type_to_string(ctx.input(0)));
  }
  if (ctx.has_input(1) && !is_bool_scalar(ctx, 1)) {
    return ctx.error(StatusCode::kInvalidModel,
                     "its condition must be one bool, not " + ir::type_to_string(ctx.input(1)));
  }
  ctx.set_output(0, DType::kInt64, {});
  ctx.set_output(1, DType::kBool, {});
  std::vector<std::vector<Dim>> shapes;
  for (int j = 0; j < k; ++j) {
    if (!ctx.has_input(2 + j))
      return ctx.error(StatusCode::kInvalidModel,
                       "carried value " + std::to_string(j) + " is omitted");
    shapes.push_back(ctx.input_shape(2 + j));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> grow,
                        ctx.attrs().get_ints("grow", std::vector<int64_t>{}));
  if (grow.size() % 3 != 0)
    return ctx.error(StatusCode::kInvalidModel, "attribute grow holds triples (value, dim, step)");
  for (size_t t = 0; t < grow.size(); t += 3) {
    const int64_t j = grow[t], d = grow[t + 1], c = grow[t + 2];
    if (j < 0 || j >= k || d < 0 || d >= int64_t(shapes[size_t(j)].size()) || c < 1) {
      return ctx.error(StatusCode::kInvalidModel,
                       "attribute grow names carried value " + std::to_string(j) + " dim " +
                           std::to_string(d) + " step " + std::to_string(c) +
                           ", which it does not have");
    }
    const std::optional<std::vector<Dim>> m = ctx.has_input(0) ? ctx.input_value(0) : std::nullopt;
    if (!m || m->size() != 1) {
      return ctx.error(
          StatusCode::kUnsupported,
          "carried value " + std::to_string(j) + " ('" + ctx.input(2 + int(j)).name +
              "') grows by " + std::to_string(c) + " along dim " + std::to_string(d) +
              " per iteration; kiln sizes it for the longest run, which needs a trip count the "
              "profile "
              "bounds (a constant, a function of input shapes, or a shape-value input), and " +
              (ctx.has_input(0) ? "'" + ctx.input(0).name + "' is computed from tensor data"
                                : std::string("the loop has none")));
    }
    Dim& dim = shapes[size_t(j)][size_t(d)];
    const Dim longest = dim + Dim(c) * Dim::max((*m)[0], Dim(0));
    KILN_ASSIGN_OR_RETURN(dim,
                          ctx.data_dependent_dim(2 + int(j), int(d), "loop_len", longest, dim));
  }
  for (int j = 0; j < k; ++j) ctx.set_output(2 + j, ctx.input_dtype(2 + j), shapes[size_t(j)]);
  return ok_status();
}

// The step by which LoopBegin `begin`'s `grow` attribute grows carried value j's dim d, or 0.
int64_t growth_of(const ir::Node* begin, size_t j, size_t d) {
  if (!begin) return 0;
  auto grow = begin->attrs.get_ints("grow", std::vector<int64_t>{});
  if (!grow.ok()) return 0;
  for (size_t t = 0; t + 2 < grow->size(); t += 3) {
    if ((*grow)[t] == int64_t(j) && (*grow)[t + 1] == int64_t(d)) return (*grow)[t + 2];
  }
  return 0;
}

// kiln::LoopEnd (its inputs and outputs: ops/loop_end.h): the end of the body kiln::LoopBegin
// began, whose outputs it takes last (which pairs the two). After an iteration the run writes each
// scan value scan_j as row i of stacked_j, copies next_j into v_j, and goes back while i + 1 < M
// and cond_out holds (omitted: the body keeps the condition true); final_j is the last v_j. A
// carried value keeps its dtype and shape from one iteration to the next: the body must give next_j
// as v_j is, but for the dims the LoopBegin's `grow` lets grow by their step. Scan outputs need the
// trip count as a formula (`trips`, M known from the input shapes) and no cond_out: stacked_j is
// then [max(M, 0)] + scan_j's shape.
Status infer_loop_end(InferContext& ctx) {
  if (!ctx.attrs().all().empty()) {
    return ctx.error(StatusCode::kInvalidModel,
                     "unknown attribute '" + ctx.attrs().all().begin()->first + "'");
  }
  const auto layout = LoopEndLayout::of(size_t(ctx.num_inputs()), size_t(ctx.num_outputs()));
  if (!layout) {
    return ctx.error(StatusCode::kInvalidModel,
                     "takes cond_out, trips, k next values, q scan values, i, cond_in and k "
                     "carried values for k + q outputs, not " +
                         std::to_string(ctx.num_inputs()) + " inputs for " +
                         std::to_string(ctx.num_outputs()) + " outputs");
  }
  const LoopEndLayout l = *layout;
  for (int i = 2; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i))
      return ctx.error(StatusCode::kInvalidModel, "input " + std::to_string(i) + " is omitted");
  }
  if (ctx.has_input(0) && !is_bool_scalar(ctx, 0)) {
    return ctx.error(StatusCode::kInvalidModel, "the body's condition '" + ctx.input(0).name +
                                                    "' must be one bool, not " +
                                                    ir::type_to_string(ctx.input(0)));
  }
  const int counter = int(l.begin_outputs());
  if (ctx.input_dtype(counter) != DType::kInt64 || ctx.input_rank(counter) != 0 ||
      !is_bool_scalar(ctx, counter + 1)) {
    return ctx.error(StatusCode::kInvalidModel, "its loop's counter and condition are " +
                                                    ir::type_to_string(ctx.input(counter)) +
                                                    " and " +
                                                    ir::type_to_string(ctx.input(counter + 1)));
  }
  // The LoopBegin, whose `grow` attribute lets a carried dim grow by its step.
  const int counter_producer = ctx.input(counter).producer;
  const ir::Node* begin =
      counter_producer >= 0 && size_t(counter_producer) < ctx.graph().nodes.size()
          ? &ctx.graph().nodes[size_t(counter_producer)]
          : nullptr;
  for (size_t j = 0; j < l.k; ++j) {
    const ir::Value& out = ctx.input(int(l.next(j)));
    const ir::Value& v = ctx.input(int(l.carried(j)));
    bool same = out.dtype == v.dtype && out.shape->size() == v.shape->size();
    for (size_t d = 0; same && d < v.shape->size(); ++d) {
      const int64_t step = growth_of(begin, j, d);
      same = (*out.shape)[d] == (step ? (*v.shape)[d] + Dim(step) : (*v.shape)[d]);
    }
    if (!same) {
      return ctx.error(StatusCode::kUnsupported,
                       "loop-carried value " + std::to_string(j) + " ('" + v.name + "') is " +
                           ir::type_to_string(v) + " but the body gives " +
                           ir::type_to_string(out) + " ('" + out.name +
                           "'); kiln runs a loop at run time only when each carried value keeps "
                           "its type and shape "
                           "(a loop whose shapes change per iteration is unrolled, which needs its "
                           "trip count at "
                           "build time and a condition the body passes through)");
    }
    ctx.set_output(int(j), v.dtype, *v.shape);
  }
  if (l.q == 0) return ok_status();
  std::optional<std::vector<Dim>> trips = ctx.has_input(1) ? ctx.input_value(1) : std::nullopt;
  if (ctx.has_input(0) || !trips || trips->size() != 1 || ctx.input_dtype(1) != DType::kInt64) {
    return ctx.error(StatusCode::kUnsupported,
                     "its " + std::to_string(l.q) +
                         " scan output(s) need a trip count the input shapes decide and a body "
                         "that keeps the condition true");
  }
  const Dim rows = Dim::max((*trips)[0], Dim(0));
  for (size_t j = 0; j < l.q; ++j) {
    std::vector<Dim> shape = {rows};
    const auto& slice = ctx.input_shape(int(l.scan(j)));
    shape.insert(shape.end(), slice.begin(), slice.end());
    ctx.set_output(int(l.stacked(j)), ctx.input_dtype(int(l.scan(j))), shape);
  }
  return ok_status();
}

}  // namespace

void register_kiln_ops(OpRegistry& r) {
  // Run by the execution context (plan::kControlImpl): copies, any dtype, as it is.
  r.add(OpSchema{OpKind::kLoopBegin, 0, 1 << 20, 2, 1 << 20, &infer_loop_begin,
                 OpTraits{.precision = PrecisionClass::kNative}});
  r.add(OpSchema{OpKind::kLoopEnd, 0, 1 << 20, 0, 1 << 20, &infer_loop_end,
                 OpTraits{.precision = PrecisionClass::kNative}});
  // Copies what one branch computed: any dtype, as it is.
  r.add(OpSchema{OpKind::kSelectBranch, 1, 1 << 20, 1, 1 << 20, &infer_select_branch,
                 OpTraits{.precision = PrecisionClass::kNative, .inputs_required = true}});
  r.add(OpSchema{OpKind::kFusedConv, 2, 4, 1, 1, &infer_fused_conv,
                 OpTraits{.precision = PrecisionClass::kReduced}});
  r.add(OpSchema{OpKind::kMatMulBias, 2, 4, 1, 1, &infer_matmul_bias,
                 OpTraits{.precision = PrecisionClass::kReduced}});
  // As MaxPool and AveragePool: data movement and short sums, in whatever float type arrives.
  r.add(OpSchema{OpKind::kPool, 1, 1, 1, 1, &infer_pool,
                 OpTraits{.precision = PrecisionClass::kFollow}});
  // Made after precision assignment, of values already typed: computes in the dtypes it holds.
  // As Attention: the products on tensor cores in the reduced type, the softmax in float.
  r.add(OpSchema{OpKind::kPackedAttention, 3, 4, 1, 1, &infer_packed_attention,
                 OpTraits{.precision = PrecisionClass::kReduced}});
  r.add(OpSchema{
      OpKind::kElementwise, 1, kMaxElementwiseInputs, 1, 1, &infer_elementwise,
      OpTraits{
          .elementwise = true, .precision = PrecisionClass::kFollow, .inputs_required = true}});
  // Made after precision assignment: a mean and two small products accumulated in float, in
  // whatever float type its operands hold.
  r.add(OpSchema{OpKind::kSqueezeExcite, 5, 5, 1, 1, &infer_squeeze_excite,
                 OpTraits{.precision = PrecisionClass::kFollow}});
  // As Softmax: numerically sensitive, follows a float16/bfloat16 X (its kernels compute in float;
  // assign_precision's accumulates_in_float).
  r.add(OpSchema{OpKind::kBiasSoftmax, 2, 2, 1, 1, &infer_bias_softmax,
                 OpTraits{.precision = PrecisionClass::kFloat32, .inputs_required = true}});
  // Made after precision assignment: converts to the dtype it names, whatever X holds.
  r.add(OpSchema{OpKind::kRelayout, 1, 1, 1, 1, &infer_relayout,
                 OpTraits{.precision = PrecisionClass::kNative, .inputs_required = true}});
}

}  // namespace kiln::ops
