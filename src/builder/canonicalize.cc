// Pass canonicalize: puts equivalent graphs in one form before the fusions match them, so a fusion
// matches what a model computes and not how an exporter wrote it. Each rule is exact (the same
// values, bit for bit, but for GELU's, which replace an op-by-op formula by the op that defines
// it):
//
//   Transpose(Transpose(x, p), q)          -> Transpose(x, p[q]); the identity -> x
//   Reshape(Reshape(x, s), t)              -> Reshape(x, t)   (t has no 0 to copy a dim by)
//   Reshape(x, t) to x's own shape         -> x
//   Cast(x) to x's own type                -> x
//   Pad(x, all zeros)                      -> x
//   Add|Sub|Mul|Div(y, Expand(a, s))       -> the op on (y, a), where broadcasting a against y
//                                             gives the same output (F.normalize's division by
//                                             the clamped norm, expanded to x's shape)
//   Div(1, x)                              -> Reciprocal(x)
//   Reshape(Transpose(Reshape(x, [L*, T..]), [0, p..]), [L.., T'..]) -> Transpose(x, [0.., p'..])
//       leading dims merged, the rest permuted, the leading dims split again: the dynamo
//       exporter's way of swapping K's last two axes for attention ([-1, S, D] and back)
//   x * 0.5 * (1 + Erf(x / sqrt(2)))      -> Gelu(x)                    the halving anywhere
//   x * 0.5 * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) -> Gelu(x) {approximate="tanh"}
//
// A chain is rewritten only where its inner nodes are read by nothing else (each rule then removes
// work; composing past a value another node reads would only move that read, and can hide the
// value a later fusion matches, as GPT-2's merged heads feeding its projection). Runs on every
// device (each rule either removes work or replaces a chain by an op every backend has).
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "builder/rewriter.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

using ir::Dim;
using Dims = std::vector<Dim>;
using rw::any;
using rw::Context;
using rw::Match;
using rw::op;
using rw::Pat;
using rw::scalar;
using rw::scalar_eq;
using rw::scaled;

bool near(double v, double want, double rel = 1e-4) {
  return std::fabs(v - want) <= rel * std::fabs(want);
}

// Every reader of `from` reads `to` instead, where `from` is no graph output (its name is the
// engine's) and the two have one dtype and shape.
StatusOr<bool> alias(Context& ctx, int from, int to) {
  if (ctx.uses->is_output(from)) return false;
  const ir::Value &f = ctx.value(from), &t = ctx.value(to);
  if (f.dtype != t.dtype || !f.shape || !t.shape || *f.shape != *t.shape) return false;
  KILN_RETURN_IF_ERROR(ir::replace_all_uses(ctx.graph, from, to));
  return true;
}

// A Transpose node reading `x` with permutation `perm` in place of the match's root.
StatusOr<bool> replace_by_transpose(Context& ctx, const Match& m, int x,
                                    std::vector<int64_t> perm) {
  const ir::Node& root = ctx.node(m.matched[0]);
  const int y = root.outputs[0];
  if (is_identity_perm(perm)) return alias(ctx, y, x);
  ir::Node t = rw::make_node(*ctx.graph, "Transpose", root.name, {x}, {y});
  t.name = root.name;
  set_ints(&t, "perm", std::move(perm));
  return rw::replace(ctx, m, std::move(t));
}

// The shape a Reshape's second input gives, when known at build time and free of 0 (a 0 copies
// the input's dim, which changes with the input).
bool target_has_no_zero(const Context& ctx, int shape) {
  const ir::Value& s = ctx.value(shape);
  if (s.sym_value) {
    for (const Dim& d : *s.sym_value) {
      if (d.is_const() && d.value() == 0) return false;
    }
    return true;
  }
  if (!s.constant) return false;
  for (int64_t i = 0; i < s.constant->numel(); ++i) {
    if (s.constant->int_at(i) == 0) return false;
  }
  return true;
}

// The shape numpy broadcasting gives a and b, or none where a dim pair is neither equal nor has
// a 1.
std::optional<Dims> broadcast(const Dims& a, const Dims& b) {
  Dims out(std::max(a.size(), b.size()), Dim(1));
  for (size_t i = 0; i < out.size(); ++i) {
    const Dim x = i < a.size() ? a[a.size() - 1 - i] : Dim(1),
              y = i < b.size() ? b[b.size() - 1 - i] : Dim(1);
    if (x == y || y == Dim(1)) {
      out[out.size() - 1 - i] = x;
    } else if (x == Dim(1)) {
      out[out.size() - 1 - i] = y;
    } else {
      return std::nullopt;
    }
  }
  return out;
}

bool allowzero_off(const ir::Node& n) {
  auto a = n.attrs.get_int("allowzero", 0);
  return a.ok() && *a == 0;
}

std::vector<rw::Rule> make_rules() {
  std::vector<rw::Rule> rules;
  // Transpose(Transpose(x, p), q): out[i] = x[p[q[i]]].
  rules.push_back({"compose_transposes", op("Transpose", {op("Transpose", {any("x")}).as("inner")}),
                   [](Context& ctx, const Match& m) -> StatusOr<bool> {
                     auto p = perm_of(*ctx.graph, ctx.node(m.node("inner")));
                     auto q = perm_of(*ctx.graph, ctx.node(m.matched[0]));
                     if (!p || !q || p->size() != q->size()) return false;
                     std::vector<int64_t> r(q->size());
                     for (size_t i = 0; i < r.size(); ++i) r[i] = (*p)[size_t((*q)[i])];
                     return replace_by_transpose(ctx, m, m.value("x"), std::move(r));
                   }});
  rules.push_back({"identity_transpose", op("Transpose", {any("x")}),
                   [](Context& ctx, const Match& m) -> StatusOr<bool> {
                     auto p = perm_of(*ctx.graph, ctx.node(m.matched[0]));
                     if (!p || !is_identity_perm(*p)) return false;
                     return alias(ctx, ctx.node(m.matched[0]).outputs[0], m.value("x"));
                   }});
  rules.push_back({"compose_reshapes",
                   op("Reshape", {op("Reshape", {any("x"), any()}).as("inner"), any("shape")}),
                   [](Context& ctx, const Match& m) -> StatusOr<bool> {
                     const ir::Node& root = ctx.node(m.matched[0]);
                     if (!allowzero_off(root) || !allowzero_off(ctx.node(m.node("inner"))) ||
                         !target_has_no_zero(ctx, m.value("shape"))) {
                       return false;
                     }
                     ir::Node r = root;
                     r.replaced.clear();
                     r.inputs[0] = m.value("x");
                     return rw::replace(ctx, m, std::move(r));
                   }});
  rules.push_back({"identity_reshape", op("Reshape", {any("x"), any()}),
                   [](Context& ctx, const Match& m) -> StatusOr<bool> {
                     return alias(ctx, ctx.node(m.matched[0]).outputs[0], m.value("x"));
                   }});
  // Pad by zeros on every side, whatever the mode (torchvision's Swin pads each block's input to
  // whole windows, by nothing when the size divides).
  // Pad(x, pads), with constant_value, and with axes too.
  for (std::vector<Pat> in : {std::vector<Pat>{any("x"), any("pads")},
                              {any("x"), any("pads"), rw::optional()},
                              {any("x"), any("pads"), rw::optional(), rw::optional()}}) {
    rules.push_back({"identity_pad", op("Pad", std::move(in)),
                     [](Context& ctx, const Match& m) -> StatusOr<bool> {
                       const ir::Value& pads = ctx.value(m.value("pads"));
                       if (!pads.constant) return false;
                       for (int64_t i = 0; i < pads.constant->numel(); ++i) {
                         if (pads.constant->int_at(i) != 0) return false;
                       }
                       return alias(ctx, ctx.node(m.matched[0]).outputs[0], m.value("x"));
                     }});
  }
  // A broadcasting op reading an Expand of one operand where the other gives the output its shape:
  // the op broadcasts the operand itself, and the expanded copy goes.
  for (const char* name : {"Add", "Sub", "Mul", "Div"}) {
    for (size_t side : {size_t(0), size_t(1)}) {
      // `side`: the Expand's input index.
      std::vector<Pat> in = {op("Expand", {any("a"), any()}).as("expand"), any("other")};
      if (side == 1) std::swap(in[0], in[1]);
      rules.push_back({std::string("expand_into_") + name, op(name, std::move(in)),
                       [side](Context& ctx, const Match& m) -> StatusOr<bool> {
                         const ir::Node& root = ctx.node(m.matched[0]);
                         const Dims *as = ctx.shape(m.value("a")),
                                    *os = ctx.shape(m.value("other")),
                                    *ys = ctx.shape(root.outputs[0]);
                         if (!as || !os || !ys) return false;
                         const std::optional<Dims> b = broadcast(*as, *os);
                         if (!b || *b != *ys) return false;
                         ir::Node r = root;
                         r.replaced.clear();
                         r.inputs[side] = m.value("a");
                         return rw::replace(ctx, m, std::move(r));
                       }});
    }
  }
  // Reshape(Transpose(Reshape(x, [prod(L), T..]), [0, p..]), [L.., T permuted]).
  rules.push_back(
      {"transpose_through_flatten",
       op("Reshape",
          {op("Transpose", {op("Reshape", {any("x"), any()}).as("flat")}).as("t"), any()}),
       [](Context& ctx, const Match& m) -> StatusOr<bool> {
         const ir::Node& flat = ctx.node(m.node("flat"));
         const Dims* xs = ctx.shape(m.value("x"));
         const Dims* fs = ctx.shape(flat.outputs[0]);
         const Dims* ys = ctx.shape(ctx.node(m.matched[0]).outputs[0]);
         auto p = perm_of(*ctx.graph, ctx.node(m.node("t")));
         if (!xs || !fs || !ys || !p || fs->size() < 2 || xs->size() < fs->size() ||
             ys->size() != xs->size() || (*p)[0] != 0) {
           return false;
         }
         const size_t q = fs->size(), l = xs->size() - (q - 1);
         Dim lead(1);
         for (size_t i = 0; i < l; ++i) lead = lead * (*xs)[i];
         if ((*fs)[0] != lead) return false;
         for (size_t i = 1; i < q; ++i) {
           if ((*fs)[i] != (*xs)[l + i - 1]) return false;
         }
         for (size_t i = 0; i < l; ++i) {
           if ((*ys)[i] != (*xs)[i]) return false;
         }
         std::vector<int64_t> perm;
         for (size_t i = 0; i < l; ++i) perm.push_back(int64_t(i));
         for (size_t i = 1; i < q; ++i) {
           if ((*ys)[l + i - 1] != (*fs)[size_t((*p)[i])]) return false;
           perm.push_back(int64_t(l) + (*p)[i] - 1);
         }
         return replace_by_transpose(ctx, m, m.value("x"), std::move(perm));
       }});

  // Cast(x, to = x's own type): transformers' RMSNorm casts to float32 and back, a no-op in an FP32
  // model, and the casts stand between the ops fuse_norm matches.
  rules.push_back(
      {"identity_cast", op("Cast", {any("x")}), [](Context& ctx, const Match& m) -> StatusOr<bool> {
         const ir::Node& cast = ctx.node(m.matched[0]);
         const ir::Value& out = ctx.value(cast.outputs[0]);
         if (ctx.value(m.value("x")).dtype != out.dtype || out.dtype == DType::kUndefined)
           return false;
         return alias(ctx, cast.outputs[0], m.value("x"));
       }});
  // Div(1, x) -> Reciprocal(x): the TorchScript exporter's rsqrt is 1 / Sqrt (the same correctly
  // rounded quotient).
  rules.push_back({"reciprocal", op("Div", {scalar_eq(1), any("x")}),
                   [](Context& ctx, const Match& m) -> StatusOr<bool> {
                     const ir::Node& root = ctx.node(m.matched[0]);
                     const ir::Value &xv = ctx.value(m.value("x")),
                                     &yv = ctx.value(root.outputs[0]);
                     if (!is_float(xv.dtype) || xv.dtype != yv.dtype || !xv.shape || !yv.shape ||
                         *xv.shape != *yv.shape) {
                       return false;
                     }
                     ir::Node r = rw::make_node(*ctx.graph, "Reciprocal", root.name, {m.value("x")},
                                                {root.outputs[0]});
                     r.name = root.name;
                     return rw::replace(ctx, m, std::move(r));
                   }});

  // GELU: the root multiplies x by (1 + F(x)) with 0.5 somewhere as scalar steps (in the
  // product's operands, or as a Mul after it: the second rule of each kind).
  auto gelu = [](const char* approximate) {
    return [approximate](Context& ctx, const Match& m) -> StatusOr<bool> {
      // Constants held in float16 or bfloat16 (a module the user holds in half precision) are
      // rounded to 2^-11 or 2^-8 of their value: 0.044715 is 0.0447083 in float16.
      const DType xt = ctx.value(m.value("x")).dtype;
      const double tol = xt == DType::kFloat16 || xt == DType::kBFloat16 ? 8e-3 : 1e-4;
      const double half = m.factor("a") * m.factor("b") * m.factor("c");
      if (!near(half, 0.5, tol)) return false;
      if (std::string(approximate) == "none") {
        if (!near(m.factor("erf_in"), 1.0 / std::sqrt(2.0), tol)) return false;
      } else if (!near(m.factor("tanh_in"), std::sqrt(2.0 / M_PI), tol) ||
                 !near(m.factor("cube"), 0.044715, tol)) {
        return false;
      }
      const ir::Node& root = ctx.node(m.matched[0]);
      const int x = m.value("x");
      const ir::Value &xv = ctx.value(x), &yv = ctx.value(root.outputs[0]);
      if (!is_float(xv.dtype) || xv.dtype != yv.dtype || !xv.shape || !yv.shape ||
          *xv.shape != *yv.shape) {
        return false;
      }
      ir::Node g = rw::make_node(*ctx.graph, "Gelu", root.name, {x}, {root.outputs[0]});
      g.name = root.name;
      g.opset = 20;
      if (std::string(approximate) == "tanh") set_string(&g, "approximate", "tanh");
      return rw::replace(ctx, m, std::move(g));
    };
  };
  const Pat erf_term =
      op("Add", {op("Erf", {scaled(any("x"), "erf_in")}), scalar_eq(1)}).commutative();
  const Pat tanh_term =
      op("Add",
         {op("Tanh",
             {scaled(op("Add", {any("x"), scaled(op("Pow", {any("x"), scalar_eq(3)}), "cube")})
                         .commutative(),
                     "tanh_in")}),
          scalar_eq(1)})
          .commutative();
  struct Gelu {
    const char* name;
    Pat term;
    const char* approximate;
  };
  for (const Gelu& form :
       {Gelu{"gelu_erf", erf_term, "none"}, Gelu{"gelu_tanh", tanh_term, "tanh"}}) {
    const std::string name = form.name;
    const Pat term = form.term;
    const char* approximate = form.approximate;
    rules.push_back({name, op("Mul", {scaled(any("x"), "a"), scaled(term, "b")}).commutative(),
                     gelu(approximate)});
    rules.push_back(
        {name + "_halved_after",
         op("Mul",
            {scaled(op("Mul", {scaled(any("x"), "a"), scaled(term, "b")}).commutative(), "c"),
             scalar("half")})
             .commutative(),
         [g = gelu(approximate)](Context& ctx, const Match& m) -> StatusOr<bool> {
           Match scaled_match = m;
           scaled_match.factors["c"] = m.factor("c") * *ctx.scalar(m.value("half"));
           return g(ctx, scaled_match);
         }});
  }
  return rules;
}

}  // namespace

Status canonicalize(ir::Graph* g, const SupportsFn& supports) {
  static const std::vector<rw::Rule> rules = make_rules();
  return rw::apply(g, rules, supports).status();
}

Status canonicalize(BuildState& s) { return canonicalize(&s.graph, backend_supports(s)); }

}  // namespace kiln::builder
