// Pass fuse_matmul_bias: a MatMul, the bias Add after it and the activation after that become
// one kiln::MatMulBias (ops/kiln_ops.cc), whose CUDA kernel applies bias and activation in one
// pass after the GEMM, the sum and the activation in float, instead of a pass per op. Rules on the
// rewriter (rewriter.h), each rooted at the last node it takes, every intermediate read by nothing
// else and no engine output:
//   Relu | Gelu (erf or tanh) (MatMul [+ bias])                        matmul_relu, matmul_gelu
//   Add(MatMul [+ bias], residual), either operand order               matmul_residual
//   Add(MatMul, bias), either operand order                            matmul_bias
// GELU written out op by op, in whichever order an exporter writes it, is one Gelu by then
// (canonicalize). A residual is a computed tensor of the product's shape (a transformer's skip
// connection; cuBLASLt adds it as its C in the GEMM's pass), a bias anything else that broadcasts
// to it. A residual is taken only by a linear layer (a constant B): a product of two computed
// tensors keeps its Add. The bias must leave the product's shape as it is (it broadcasts from
// the right). A MatMul and a constant bias without an activation become a MatMulBias only where
// no elementwise op reads the sum: otherwise the elementwise pass fuses the Add with what follows
// it (a residual), which a MatMulBias would split; where the op reading it is an activation or a
// residual Add, the longer rule takes the chain at that node. An activation with no bias gets a
// zero one, so cuBLASLt applies it in its bias epilogue. Runs after fuse_attention (which takes
// the score products and their masks first) and before assign_precision (the fused op is a
// compute-bound one).
#include <optional>
#include <string>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "builder/rewriter.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

using rw::any;
using rw::Context;
using rw::either;
using rw::Match;
using rw::op;
using rw::Pat;

// The product: its output is a float tensor of known shape.
bool float_product(const Context& ctx, const Match&, int n) {
  const ir::Node& mm = ctx.node(n);
  if (mm.inputs.size() != 2 || mm.outputs.size() != 1) return false;
  const ir::Value& y = ctx.value(mm.outputs[0]);
  return y.shape && is_float(y.dtype);
}

// An Add of `y` and `other` that keeps y's shape and dtype (other broadcasting from the right).
bool keeps_product(const Context& ctx, int y, int other, int sum) {
  const ir::Value &yv = ctx.value(y), &ov = ctx.value(sum), &bv = ctx.value(other);
  return other != y && ov.dtype == yv.dtype && bv.dtype == yv.dtype && ov.shape &&
         *ov.shape == *yv.shape && bv.shape && bv.shape->size() <= yv.shape->size();
}

// A computed operand of the product's own shape (a skip connection), not a bias.
bool is_residual(const Context& ctx, int v, int y) {
  const ir::Value& r = ctx.value(v);
  return !r.constant && r.shape && *r.shape == *ctx.value(y).shape;
}

StatusOr<bool> fuse(Context& ctx, const Match& m, std::string activation, int residual) {
  const ir::Node& matmul = ctx.node(m.node("mm"));
  const int y = m.value("y");
  int bias = m.value("bias");
  if (bias >= 0 && (!keeps_product(ctx, y, bias, ctx.node(m.node("add")).outputs[0]) ||
                    is_residual(ctx, bias, y))) {
    return false;
  }
  const int out = ctx.node(m.matched[0]).outputs[0];
  const ir::Value& yv = ctx.value(y);
  if (activation != "none" && bias < 0) {
    // An activation with no bias (the dynamo exporter drops a zero bias; models without one): a
    // zero bias of Y's last dim, so the kernel runs the activation in cuBLASLt's bias epilogue (the
    // one its tactics are timed with) and not in a pass over Y after the GEMM: GPT-2's [8192, 3072]
    // MLP GEMM at batch 32, 98 us with the pass against 72 us in the epilogue (H200).
    const ir::Value& b = ctx.value(matmul.inputs[1]);
    if (b.constant && b.constant->rank() >= 1 && !yv.shape->empty() &&
        yv.shape->back().is_const() && b.constant->shape().back() == yv.shape->back().value()) {
      KILN_ASSIGN_OR_RETURN(Tensor zeros, Tensor::zeros(yv.dtype, {b.constant->shape().back()}));
      bias = add_constant(ctx.graph, yv.name + "_zero_bias", std::move(zeros));
    }
  }
  ir::Node fused = matmul;
  fused.replaced.clear();  // replace_nodes counts the MatMul among the matched nodes
  fused.domain = "kiln";
  fused.op_type = "MatMulBias";
  fused.opset = 1;
  fused.attrs = ir::Attributes{};
  set_string(&fused, "activation", activation);
  if (bias >= 0 || residual >= 0) fused.inputs.push_back(bias);  // -1: no bias
  if (residual >= 0) fused.inputs.push_back(residual);
  fused.outputs = {out};
  // Unfused where the backend has no kernel.
  return rw::replace(ctx, m, std::move(fused));
}

StatusOr<bool> fuse_relu(Context& ctx, const Match& m) { return fuse(ctx, m, "relu", -1); }

StatusOr<bool> fuse_gelu(Context& ctx, const Match& m) {
  auto approx = ctx.node(m.matched[0]).attrs.get_string("approximate", "none");
  if (!approx.ok() || (*approx != "none" && *approx != "tanh")) return false;
  return fuse(ctx, m, *approx == "none" ? "gelu_erf" : "gelu_tanh", -1);
}

// (bias +) residual, as linear layers before a skip connection have it: cuBLASLt adds the
// residual as its C in the GEMM's own pass.
StatusOr<bool> fuse_residual(Context& ctx, const Match& m) {
  const int y = m.value("y"), residual = m.value("residual");
  const int sum = ctx.node(m.matched[0]).outputs[0];
  if (!is_residual(ctx, residual, y) || !keeps_product(ctx, y, residual, sum) ||
      !ctx.value(ctx.node(m.node("mm")).inputs[1]).constant) {
    return false;
  }
  return fuse(ctx, m, "none", residual);
}

// A constant bias alone (a linear layer's, not attention's mask): fused where no elementwise op
// reads the sum (the elementwise pass would take the Add with that op, and an activation or a
// residual Add after it is a longer rule's root), e.g. attention's Q, K and V projections.
StatusOr<bool> fuse_bias(Context& ctx, const Match& m) {
  if (!ctx.value(m.value("bias")).constant) return false;
  for (int r : ctx.uses->readers(ctx.node(m.matched[0]).outputs[0])) {
    if (ops::traits(ctx.node(r)).elementwise) return false;
  }
  return fuse(ctx, m, "none", -1);
}

std::vector<rw::Rule> make_rules() {
  const Pat mm = op("MatMul", {any(), any()}).when(float_product).as("mm").out("y");
  const Pat biased = op("Add", {mm, any("bias")}).commutative().as("add");
  const Pat pre = either({biased, mm});
  return {{"matmul_relu", op("Relu", {pre}), fuse_relu},
          {"matmul_gelu", op("Gelu", {pre}), fuse_gelu},
          {"matmul_residual", op("Add", {pre, any("residual")}).commutative(), fuse_residual},
          {"matmul_bias", biased, fuse_bias}};
}

}  // namespace

Status fuse_matmul_bias(ir::Graph* g, const SupportsFn& supports) {
  static const std::vector<rw::Rule> rules = make_rules();
  return rw::apply(g, rules, supports).status();
}

// Both devices (pipeline.cc): the CPU kernel starts its GEMM from the bias rows instead of zeros
// (ViT-tiny's eight bias Adds were 1.0 of 25.8 ms at batch 4 on two threads).
Status fuse_matmul_bias(BuildState& s) { return fuse_matmul_bias(&s.graph, backend_supports(s)); }

}  // namespace kiln::builder
