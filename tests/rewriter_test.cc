// The pattern rewriter (src/builder/rewriter.h) on small graphs: what a pattern binds, the
// single-use rule, alternatives and operand orders tried in turn, scalar chains, the driver.
#include "builder/rewriter.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ir/rewrite.h"
#include "ir/text.h"

namespace kiln::testing {
namespace {

using builder::rw::any;
using builder::rw::constant;
using builder::rw::Context;
using builder::rw::either;
using builder::rw::Match;
using builder::rw::op;
using builder::rw::Pat;
using builder::rw::scalar_eq;
using builder::rw::scaled;
using builder::rw::Uses;

ir::Graph parse(const std::string& text) {
  auto g = ir::parse_text(text, {});
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  return g.ok() ? std::move(g).value() : ir::Graph{};
}

int node_named(const ir::Graph& g, const std::string& name) {
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    if (g.nodes[n].name == name) return int(n);
  }
  ADD_FAILURE() << "no node " << name;
  return -1;
}

const builder::SupportsFn kYes = [](const ir::Node&, const std::vector<const ir::Value*>&,
                                    const std::vector<const ir::Value*>&) { return true; };

// %s = Add(%a, %p): both operands are products, and %a is also read by %other. The commutative
// pattern Add(MatMul, any) first binds the MatMul of %a, whose output is read outside the match;
// the match then takes the other order, with the MatMul of %p.
const char* kTwoProducts =
    R"(graph g(%x: float32[2, 2], %w: float32[2, 2]) -> (%s: float32[2, 2], %other: float32[2, 2]) {
  opset ai.onnx 17
  %a: float32[2, 2] = MatMul(%x, %w)  # shared
  %p: float32[2, 2] = MatMul(%w, %x)  # own
  %s: float32[2, 2] = Add(%a, %p)  # sum
  %other: float32[2, 2] = Relu(%a)  # reader
}
)";

TEST(Rewriter, ACommutativeMatchFailingTheSingleUseRuleTriesTheOtherOrder) {
  ir::Graph g = parse(kTwoProducts);
  Uses uses(g);
  Context ctx{&g, &uses, &kYes};
  const Pat pattern =
      op("Add", {op("MatMul", {any("l"), any("r")}).as("mm"), any("rest")}).commutative();
  auto m = builder::rw::match_at(ctx, pattern, node_named(g, "sum"));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->node("mm"), node_named(g, "own"));
  EXPECT_EQ(m->value("rest"), g.find_value("a"));
  EXPECT_EQ(m->value("l"), g.find_value("w"));
  // Without the other order there is no match: the only MatMul it may take is read elsewhere.
  const Pat ordered = op("Add", {op("MatMul", {any(), any()}), any()});
  EXPECT_FALSE(builder::rw::match_at(ctx, ordered, node_named(g, "sum")).has_value());
  // keep(): a node read elsewhere may be matched, and stays.
  const Pat kept = op("Add", {op("MatMul", {any(), any()}).keep().as("mm"), any()});
  auto k = builder::rw::match_at(ctx, kept, node_named(g, "sum"));
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->node("mm"), node_named(g, "shared"));
  EXPECT_EQ(k->kept, std::vector<int>{node_named(g, "shared")});
}

// x * 0.5 / 4 * 2 reaching a Relu: a chain of scalar steps, and alternatives.
const char* kChain = R"(graph g(%x: float32[2, 2]) -> (%y: float32[2, 2], %z: float32[2, 2]) {
  opset ai.onnx 17
  %half: float32[] = dense<0.5>
  %four: float32[] = dense<4.0>
  %two: float32[] = dense<2.0>
  %a: float32[2, 2] = Mul(%x, %half)  # half
  %b: float32[2, 2] = Div(%a, %four)  # quarter
  %c: float32[2, 2] = Mul(%two, %b)  # double
  %y: float32[2, 2] = Relu(%c)  # relu
  %d: float32[2, 2] = Mul(%x, %x)  # square
  %z: float32[2, 2] = Sigmoid(%d)  # sigmoid
}
)";

TEST(Rewriter, ScalarChainsAlternativesAndNamesBoundTwice) {
  ir::Graph g = parse(kChain);
  Uses uses(g);
  Context ctx{&g, &uses, &kYes};
  auto m = builder::rw::match_at(ctx, op("Relu", {scaled(any("x"), "k")}), node_named(g, "relu"));
  ASSERT_TRUE(m.has_value());
  EXPECT_DOUBLE_EQ(m->factor("k"), 0.25);
  EXPECT_EQ(m->value("x"), g.find_value("x"));
  EXPECT_EQ(m->matched.size(), 4u);  // the Relu and three steps
  // A name bound twice must be the same value: Mul(x, x) matches, Mul(x, y) with x == y too.
  const Pat square = either({op("Pow", {any("v"), scalar_eq(2)}), op("Mul", {any("v"), any("v")})});
  auto s = builder::rw::match_at(ctx, op("Sigmoid", {square}), node_named(g, "sigmoid"));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->value("v"), g.find_value("x"));
  EXPECT_FALSE(builder::rw::match_at(ctx, op("Sigmoid", {op("Mul", {any("v"), constant()})}),
                                     node_named(g, "sigmoid"))
                   .has_value());
}

TEST(Rewriter, TheDriverAppliesRulesToAFixedPointAndDropsWhatNoOneReads) {
  // Relu(Relu(x)) -> Relu(x), to a fixed point: four nested Relus become one.
  ir::Graph g = parse(R"(graph g(%x: float32[2]) -> (%y: float32[2]) {
  opset ai.onnx 17
  %a: float32[2] = Relu(%x)  # r1
  %b: float32[2] = Relu(%a)  # r2
  %c: float32[2] = Relu(%b)  # r3
  %y: float32[2] = Relu(%c)  # r4
}
)");
  std::vector<builder::rw::Rule> rules = {{"relu_relu", op("Relu", {op("Relu", {any("x")})}),
                                           [](Context& ctx, const Match& m) -> StatusOr<bool> {
                                             ir::Node r = ctx.node(m.matched[0]);
                                             r.replaced.clear();
                                             r.inputs = {m.value("x")};
                                             return builder::rw::replace(ctx, m, std::move(r));
                                           }}};
  auto n = builder::rw::apply(&g, rules, kYes);
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(*n, 3);
  ASSERT_EQ(g.nodes.size(), 1u) << ir::to_text(g);
  EXPECT_EQ(g.nodes[0].inputs[0], g.find_value("x"));
  EXPECT_TRUE(ir::verify(g).ok());
}

TEST(Rewriter, NodeOfMatchesANodeWhateverItsInputsAndBindsNothingBelow) {
  ir::Graph g = parse(
      R"(graph g(%a: float32[2], %b: float32[2], %c: float32[2]) -> (%y: float32[6], %z: float32[4]) {
  opset ai.onnx 17
  %y: float32[6] = Concat(%a, %b, %c) {axis=0}  # three
  %z: float32[4] = Concat(%a, %b) {axis=0}  # two
}
)");
  Uses uses(g);
  Context ctx{&g, &uses, &kYes};
  for (const char* name : {"three", "two"}) {
    auto m = builder::rw::match_at(ctx, builder::rw::node_of("Concat"), node_named(g, name));
    ASSERT_TRUE(m.has_value()) << name;
    EXPECT_EQ(m->matched, std::vector<int>{node_named(g, name)});
    EXPECT_TRUE(m->values.empty());
  }
  // An op pattern still asks for its exact arity, and node_of for its op.
  EXPECT_FALSE(
      builder::rw::match_at(ctx, op("Concat", {any(), any()}), node_named(g, "three")).has_value());
  EXPECT_FALSE(
      builder::rw::match_at(ctx, builder::rw::node_of("Relu"), node_named(g, "two")).has_value());
}

}  // namespace
}  // namespace kiln::testing
