// Graph-editing helpers as IR text in -> IR text out, the verifier and topological sort, op traits
// (views, precision classes, the kiln domain), and kiln::MatMulBias end to end: a fusion made by
// replace_nodes builds on the CPU and matches the unfused ONNX subgraph bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "ir/rewrite.h"
#include "ir/text.h"
#include "kiln.h"
#include "model_util.h"
#include "ops/schema.h"

namespace kiln {
namespace {

using ir::parse_text;
using ir::to_text;

ir::Graph parse(const std::string& text, ir::ElidedTensorFn elided = nullptr) {
  auto g = parse_text(text, {std::move(elided)});
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  if (!g.ok()) return {};
  EXPECT_TRUE(ir::verify(*g).ok()) << ir::verify(*g).to_string();
  return std::move(g).value();
}

int value(const ir::Graph& g, const char* name) {
  int v = g.find_value(name);
  EXPECT_GE(v, 0) << name;
  return v;
}

ir::Attribute string_attr(std::string s) {
  ir::Attribute a;
  a.type = ir::AttrType::kString;
  a.s = std::move(s);
  return a;
}

ir::Node make_node(std::string domain, std::string op, std::vector<int> in, std::vector<int> out,
                   std::string name = "") {
  ir::Node n;
  n.domain = std::move(domain);
  n.op_type = std::move(op);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  n.name = std::move(name);
  return n;
}

// ---- replace_nodes ----

const char* kLinearRelu = R"(graph g(%x: float32[batch, 16]) -> (%y: float32[batch, 8]) {
  opset ai.onnx 17
  %w: float32[16, 8] = dense<0.5>
  %b: float32[8] = dense<[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]>
  %mm: float32[batch, 8] = MatMul(%x, %w)  # mm
  %add: float32[batch, 8] = Add(%mm, %b)  # add
  %y: float32[batch, 8] = Relu(%add)  # relu
}
)";

// MatMul -> Add -> Relu becomes kiln::MatMulBias; the chain's intermediates become orphans.
ir::Graph fuse_linear(ir::Graph g, const std::string& activation) {
  ir::Node fused = make_node("kiln", "MatMulBias", {value(g, "x"), value(g, "w"), value(g, "b")},
                             {g.outputs[0]}, "fc");
  fused.attrs.set("activation", string_attr(activation));
  std::vector<int> chain;
  for (size_t n = 0; n < g.nodes.size(); ++n) chain.push_back(int(n));
  auto n = ir::replace_nodes(&g, chain, std::move(fused));
  EXPECT_TRUE(n.ok()) << n.status().to_string();
  return g;
}

TEST(IrRewrite, ReplaceNodesFusesAChain) {
  ir::Graph g = fuse_linear(parse(kLinearRelu), "relu");
  EXPECT_EQ(to_text(g), R"(graph g(%x: float32[batch, 16]) -> (%y: float32[batch, 8]) {
  opset ai.onnx 17
  %w: float32[16, 8] = dense<0.5>
  %b: float32[8] = dense<[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]>
  %y: float32[batch, 8] = kiln::MatMulBias(%x, %w, %b) {activation="relu"}  # fc
}
)");
  // %mm and %add are orphans until compact() drops them and renumbers.
  EXPECT_EQ(g.values.size(), 6u);
  EXPECT_EQ(g.values[value(g, "mm")].producer, -1);
  std::vector<int> map = ir::compact(&g);
  EXPECT_EQ(g.values.size(), 4u);
  EXPECT_EQ(map[size_t(parse(kLinearRelu).find_value("mm"))], -1);
  EXPECT_TRUE(ir::verify(g).ok());
  EXPECT_EQ(g.find_value("mm"), -1);
}

TEST(IrRewrite, ReplaceNodesRefusesToDropAValueReadElsewhere) {
  const std::string text = R"(graph g(%x: float32[2, 2]) -> (%y: float32[2, 2], %z: float32[2, 2]) {
  %mm: float32[2, 2] = MatMul(%x, %x)  # mm
  %y: float32[2, 2] = Relu(%mm)  # relu
  %z: float32[2, 2] = Neg(%mm)  # neg
}
)";
  ir::Graph g = parse(text);
  ir::Node fused = make_node("kiln", "MatMulBias", {value(g, "x"), value(g, "x")}, {value(g, "y")});
  std::vector<int> match = {0, 1};
  auto n = ir::replace_nodes(&g, match, fused);
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("'mm' is read by node 'neg' (Neg)"), std::string::npos)
      << n.status().message();
  EXPECT_EQ(to_text(g), text);  // unchanged
  // Keeping %mm as a second output is accepted; the Neg still reads it.
  fused.outputs.push_back(value(g, "mm"));
  ASSERT_TRUE(ir::replace_nodes(&g, match, fused).ok());
  EXPECT_EQ(to_text(g), R"(graph g(%x: float32[2, 2]) -> (%y: float32[2, 2], %z: float32[2, 2]) {
  %y: float32[2, 2], %mm: float32[2, 2] = kiln::MatMulBias(%x, %x)  # MatMulBias
  %z: float32[2, 2] = Neg(%mm)  # neg
}
)");
}

// ---- insert_on_edge, insert_cast, insert_layout_transform ----

TEST(IrRewrite, InsertCastForSelectedConsumers) {
  ir::Graph g =
      parse(R"(graph g(%x: float32[4]) -> (%a: float32[4], %b: float32[4], %c: float32[4]) {
  %a: float32[4] = Relu(%x)  # r
  %b: float32[4] = Neg(%x)  # n
  %c: float32[4] = Abs(%x)  # abs
}
)");
  std::vector<int> consumers = {1, 2};
  auto n = ir::insert_cast(&g, value(g, "x"), DType::kFloat16, consumers);
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(*n, 1);
  EXPECT_EQ(to_text(g),
            R"(graph g(%x: float32[4]) -> (%a: float32[4], %b: float32[4], %c: float32[4]) {
  %a: float32[4] = Relu(%x)  # r
  %x_float16: float16[4] = Cast(%x) {to=10}  # x_float16
  %b: float32[4] = Neg(%x_float16)  # n
  %c: float32[4] = Abs(%x_float16)  # abs
}
)");
  // A second cast of the same value gets a fresh name; a non-consumer is refused.
  std::vector<int> relu = {0};
  ASSERT_TRUE(ir::insert_cast(&g, value(g, "x"), DType::kFloat16, relu).ok());
  EXPECT_GE(g.find_value("x_float16_1"), 0);
  std::vector<int> wrong = {0};
  auto bad = ir::insert_cast(&g, value(g, "a"), DType::kFloat16, wrong);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("does not read 'a'"), std::string::npos)
      << bad.status().message();
}

TEST(IrRewrite, InsertLayoutTransformBeforeAConsumer) {
  ir::Graph g = parse(
      R"(graph g(%x: float32[n, 3, h, w]) -> (%y: float32[n, 8, h, w], %p: float32[n, 3, h, w]) {
  %k: float32[8, 3, 1, 1] = dense<1.0>
  %y: float32[n, 8, h, w] = Conv(%x, %k)  # conv
  %p: float32[n, 3, h, w] = Relu(%x)  # relu
}
)");
  std::vector<int> conv = {0};
  auto n = ir::insert_layout_transform(&g, value(g, "x"), {0, 2, 3, 1}, conv);
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(
      to_text(g),
      R"(graph g(%x: float32[n, 3, h, w]) -> (%y: float32[n, 8, h, w], %p: float32[n, 3, h, w]) {
  %k: float32[8, 3, 1, 1] = dense<1.0>
  %x_layout: float32[n, h, w, 3] = Transpose(%x) {perm=[0, 2, 3, 1]}  # x_layout
  %y: float32[n, 8, h, w] = Conv(%x_layout, %k)  # conv
  %p: float32[n, 3, h, w] = Relu(%x)  # relu
}
)");
  EXPECT_FALSE(
      ir::insert_layout_transform(&g, value(g, "x"), {0, 2, 2, 1}).ok());     // not a permutation
  EXPECT_FALSE(ir::insert_layout_transform(&g, value(g, "x"), {1, 0}).ok());  // rank 4
  EXPECT_EQ(g.values.size(), 5u);  // failed inserts leave no values behind
}

TEST(IrRewrite, InsertOnEdgeReordersOrRefusesACycle) {
  const std::string text = R"(graph g(%x: float32[2]) -> (%a: float32[2], %c: float32[2]) {
  %a: float32[2] = Relu(%x)  # r
  %c: float32[2] = Neg(%x)  # n
}
)";
  ir::Graph g = parse(text);
  // Add(x, a) before Relu would read Relu's own output: a cycle, refused, graph unchanged.
  int xa = ir::add_unique_value(&g, "x_plus", DType::kFloat32, std::vector<ir::Dim>{2});
  std::vector<int> relu = {0};
  auto cyc = ir::insert_on_edge(
      &g, value(g, "x"), make_node("", "Add", {value(g, "x"), value(g, "a")}, {xa}, "add"), relu);
  ASSERT_FALSE(cyc.ok());
  EXPECT_NE(cyc.status().message().find("cycle"), std::string::npos) << cyc.status().message();
  EXPECT_EQ(to_text(g), text);
  // Add(x, c) before Relu reads Neg's output, defined later: the nodes are re-sorted.
  auto n = ir::insert_on_edge(
      &g, value(g, "x"), make_node("", "Add", {value(g, "x"), value(g, "c")}, {xa}, "add"), relu);
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(*n, 1);
  EXPECT_EQ(to_text(g), R"(graph g(%x: float32[2]) -> (%a: float32[2], %c: float32[2]) {
  %c: float32[2] = Neg(%x)  # n
  %x_plus: float32[2] = Add(%x, %c)  # add
  %a: float32[2] = Relu(%x_plus)  # r
}
)");
}

// ---- replace_all_uses, remove_dead_nodes ----

TEST(IrRewrite, ReplaceAllUsesTurnsAViewIntoAnAlias) {
  ir::Graph g = parse(R"(graph g(%x: float32[2, 3]) -> (%y: float32[2, 3], %o: float32[2, 3]) {
  %i: float32[2, 3] = Identity(%x)  # id
  %y: float32[2, 3] = Relu(%i)  # r
  %o: float32[2, 3] = Identity(%y)  # out_copy
}
)");
  ASSERT_TRUE(ir::replace_all_uses(&g, value(g, "i"), value(g, "x")).ok());
  // Graph outputs keep their names unless asked: %o stays produced by its Identity.
  ASSERT_TRUE(ir::replace_all_uses(&g, value(g, "o"), value(g, "y")).ok());
  EXPECT_EQ(ir::remove_dead_nodes(&g), 1);
  EXPECT_EQ(to_text(g), R"(graph g(%x: float32[2, 3]) -> (%y: float32[2, 3], %o: float32[2, 3]) {
  %y: float32[2, 3] = Relu(%x)  # r
  %o: float32[2, 3] = Identity(%y)  # out_copy
}
)");
  ASSERT_TRUE(
      ir::replace_all_uses(&g, value(g, "o"), value(g, "y"), /*include_graph_outputs=*/true).ok());
  EXPECT_EQ(ir::remove_dead_nodes(&g), 1);
  EXPECT_EQ(to_text(g), R"(graph g(%x: float32[2, 3]) -> (%y: float32[2, 3], %y: float32[2, 3]) {
  %y: float32[2, 3] = Relu(%x)  # r
}
)");
  int h = ir::add_unique_value(&g, "h", DType::kFloat16, std::nullopt);
  auto bad = ir::replace_all_uses(&g, value(g, "x"), h);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("float32"), std::string::npos);
}

// ---- verify and sort_topologically ----

TEST(IrRewrite, SortTopologicallyOrdersWhatTheVerifierRefuses) {
  auto g = parse_text(R"(graph g(%x: float32[2]) -> (%z: float32[2]) {
  %z: float32[2] = Neg(%y)  # second
  %y: float32[2] = Relu(%x)  # first
}
)");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  Status v = ir::verify(*g);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.message().find("'y' is used before any node"), std::string::npos) << v.message();
  ASSERT_TRUE(ir::sort_topologically(&*g).ok());
  EXPECT_EQ(to_text(*g), R"(graph g(%x: float32[2]) -> (%z: float32[2]) {
  %y: float32[2] = Relu(%x)  # first
  %z: float32[2] = Neg(%y)  # second
}
)");
  auto cyc = parse_text(R"(graph g() -> (%a: float32[2]) {
  %a: float32[2] = Relu(%b)  # r
  %b: float32[2] = Neg(%a)  # n
}
)");
  ASSERT_TRUE(cyc.ok());
  Status s = ir::sort_topologically(&*cyc);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cycle"), std::string::npos) << s.message();
}

TEST(IrRewrite, VerifierNamesEachBrokenInvariant) {
  const char* text = R"(graph g(%x: float32[2]) -> (%y: float32[2]) {
  %y: float32[2] = Relu(%x)  # r
}
)";
  struct Case {
    const char* what;
    void (*corrupt)(ir::Graph&);
  };
  const Case cases[] = {
      {"input index out of range", [](ir::Graph& g) { g.nodes[0].inputs[0] = 99; }},
      {"records producer", [](ir::Graph& g) { g.values[1].producer = -1; }},
      {"already defined by", [](ir::Graph& g) { g.nodes.push_back(g.nodes[0]); }},
      {"two values are named 'x'", [](ir::Graph& g) { g.values[1].name = "x"; }},
      {"graph input 'x' is also produced", [](ir::Graph& g) { g.nodes[0].outputs.push_back(0); }},
      {"never produced", [](ir::Graph& g) { g.outputs.push_back(g.add_value("ghost")); }},
  };
  for (const Case& c : cases) {
    ir::Graph g = parse(text);
    ASSERT_TRUE(ir::verify(g).ok());
    c.corrupt(g);
    Status s = ir::verify(g);
    ASSERT_FALSE(s.ok()) << c.what;
    EXPECT_NE(s.message().find(c.what), std::string::npos)
        << "want '" << c.what << "' in: " << s.message();
  }
}

// ---- op traits and the kiln domain ----

TEST(OpTraits, ViewsAreExactlyTheByteIdentityOps) {
  std::set<std::string> views;
  for (int k = 1; ops::op_name(ops::OpKind(k)) != "Unknown"; ++k) {
    if (ops::is_view(ops::OpKind(k))) views.insert(std::string(ops::op_name(ops::OpKind(k))));
  }
  EXPECT_EQ(views,
            (std::set<std::string>{"Flatten", "Identity", "Reshape", "Squeeze", "Unsqueeze"}));
}

TEST(OpTraits, PrecisionClassesAndElementwise) {
  using ops::OpKind;
  using ops::PrecisionClass;
  for (OpKind k : {OpKind::kMatMul, OpKind::kGemm, OpKind::kConv, OpKind::kMatMulBias}) {
    EXPECT_EQ(ops::precision_class(k), PrecisionClass::kReduced) << ops::op_name(k);
  }
  for (OpKind k : {OpKind::kReduceMean, OpKind::kLayerNormalization, OpKind::kSoftmax, OpKind::kExp,
                   OpKind::kPow, OpKind::kCumSum}) {
    EXPECT_EQ(ops::precision_class(k), PrecisionClass::kFloat32) << ops::op_name(k);
  }
  for (OpKind k :
       {OpKind::kShape, OpKind::kCast, OpKind::kRange, OpKind::kQuantizeLinear, OpKind::kAnd}) {
    EXPECT_EQ(ops::precision_class(k), PrecisionClass::kNative) << ops::op_name(k);
  }
  for (OpKind k :
       {OpKind::kAdd, OpKind::kRelu, OpKind::kTranspose, OpKind::kReshape, OpKind::kMaxPool}) {
    EXPECT_EQ(ops::precision_class(k), PrecisionClass::kFollow) << ops::op_name(k);
  }
  EXPECT_TRUE(ops::is_elementwise(OpKind::kAdd));
  EXPECT_FALSE(ops::is_elementwise(OpKind::kMatMul));
  EXPECT_FALSE(ops::is_elementwise(OpKind::kMatMulBias));
  EXPECT_EQ(ops::precision_class(OpKind::kUnknown), PrecisionClass::kFloat32);
}

TEST(OpTraits, KilnDomainIsItsOwnNamespace) {
  EXPECT_EQ(ops::find_op("kiln", "MatMulBias"), ops::OpKind::kMatMulBias);
  EXPECT_EQ(ops::find_op("", "MatMulBias"), ops::OpKind::kUnknown);
  EXPECT_EQ(ops::find_op("ai.onnx", "MatMulBias"), ops::OpKind::kUnknown);
  EXPECT_EQ(ops::find_op("kiln", "MatMul"), ops::OpKind::kUnknown);
  EXPECT_EQ(ops::find_op("", "MatMul"), ops::OpKind::kMatMul);
  EXPECT_EQ(ops::op_domain(ops::OpKind::kMatMulBias), "kiln");
  EXPECT_EQ(ops::op_domain(ops::OpKind::kMatMul), "");
  EXPECT_EQ(ops::op_name(ops::OpKind::kMatMulBias), "MatMulBias");
}

// ---- kiln::MatMulBias: schema ----

struct Inferred {
  Status status;
  std::string shape;
  size_t constraints = 0;
};

Inferred infer_first_node(const std::string& text) {
  ir::Graph g = parse(text);
  std::vector<ops::Constraint> constraints;
  const ops::OpSchema* schema = ops::find_schema(g.nodes[0]);
  EXPECT_NE(schema, nullptr);
  ops::InferContext ctx(g, g.nodes[0], 0, &constraints);
  Inferred r{schema->infer(ctx)};
  if (r.status.ok())
    r.shape = std::string(dtype_name(ctx.outputs()[0].dtype)) +
              ir::dims_to_string(ctx.outputs()[0].shape);
  r.constraints = constraints.size();
  return r;
}

std::string mmb(const char* a, const char* b, const char* bias, const char* attrs) {
  return std::string("graph g(%a: ") + a + ", %b: " + b + ", %c: " + bias +
         ") -> () {\n  %y: float32[?] = kiln::MatMulBias(%a, %b, %c)" + attrs + "  # fc\n}\n";
}

TEST(KilnMatMulBias, InfersSymbolicShapesAndValidatesAttributes) {
  Inferred ok =
      infer_first_node(mmb("float32[batch, seq, 16]", "float32[16, n]", "float32[n]", ""));
  ASSERT_TRUE(ok.status.ok()) << ok.status.to_string();
  EXPECT_EQ(ok.shape, "float32[batch, seq, n]");
  EXPECT_EQ(ok.constraints, 0u);  // bias dim n matches the product's n exactly
  Inferred sym = infer_first_node(
      mmb("float32[b, k]", "float32[k2, 8]", "float32[1, 8]", " {activation=\"gelu_tanh\"}"));
  ASSERT_TRUE(sym.status.ok()) << sym.status.to_string();
  EXPECT_EQ(sym.shape, "float32[b, 8]");
  EXPECT_EQ(sym.constraints, 1u);  // k == k2, left to the profile checker
  struct Bad {
    std::string text;
    const char* what;
  };
  const Bad bad[] = {
      {mmb("float32[2, 4]", "float32[4, 8]", "float32[8]", " {activation=\"swish\"}"),
       "activation 'swish'"},
      {mmb("float32[2, 4]", "float32[4, 8]", "float32[8]", " {alpha=1.0}"),
       "unknown attribute 'alpha'"},
      {mmb("float32[2, 4]", "float32[4, 8]", "float32[3]", ""),
       "bias) dim 0 matches product dim 1"},
      {mmb("float32[2, 4]", "float32[4, 8]", "float32[3, 2, 8]", ""), "does not broadcast"},
      {mmb("float32[2, 4]", "float32[4, 8]", "float16[8]", ""), "input 2 (bias) has dtype float16"},
      {mmb("int64[2, 4]", "int64[4, 8]", "int64[8]", ""), "expected a float type"},
      {mmb("float32[2, 4]", "float32[5, 8]", "float32[8]", ""), "(K)"},
  };
  for (const Bad& b : bad) {
    Inferred r = infer_first_node(b.text);
    ASSERT_FALSE(r.status.ok()) << b.text;
    EXPECT_NE(r.status.message().find(b.what), std::string::npos)
        << "want '" << b.what << "' in: " << r.status.message();
  }
}

// ---- kiln::MatMulBias: end to end against the unfused subgraph ----

std::string linear_text(const std::string& activation_line) {
  return R"(graph g(%x: float32[batch, seq, 16]) -> (%y: float32[?]) {
  opset ai.onnx 20
  %w: float32[16, 8] = dense<...>
  %b: float32[8] = dense<...>
  %mm: float32[?] = MatMul(%x, %w)  # mm
)" + activation_line +
         "}\n";
}

// Builds `graph` on the CPU for x: [1..4, 1..8, 16], runs it on x; `kernels` gets the layers'
// kernels.
StatusOr<Tensor> build_and_run(ir::Graph graph, const Tensor& x, std::string* kernels = nullptr) {
  Network net;
  net.graph = std::move(graph);
  BuilderConfig config;
  OptimizationProfile p;
  KILN_RETURN_IF_ERROR(p.set_dimensions("x", {1, 1, 16}, {2, 5, 16}, {4, 8, 16}));
  config.add_profile(p);
  KILN_ASSIGN_OR_RETURN(Engine engine, Builder(Device::kCPU).build(net, config));
  for (const LayerInfo& layer : engine.layers()) {
    if (kernels) *kernels += (kernels->empty() ? "" : " ") + layer.kernel;
  }
  KILN_ASSIGN_OR_RETURN(auto ctx, engine.create_execution_context());
  KILN_ASSIGN_OR_RETURN(auto outputs, ctx->run({{"x", x}}));
  return outputs.at("y");
}

TEST(KilnMatMulBias, FusedNodeMatchesTheUnfusedSubgraphExactly) {
  auto weights = [](std::string_view key, DType dtype, const Shape& shape) -> StatusOr<Tensor> {
    return testing::random_f32(shape, key == "w" ? 7 : 11);
  };
  const Tensor x = testing::random_f32({3, 5, 16}, 3);
  struct Case {
    const char* activation;
    std::string unfused_tail;  // after %mm
  };
  const Case cases[] = {
      {"none", "  %y: float32[?] = Add(%mm, %b)  # add\n"},
      {"relu", "  %add: float32[?] = Add(%mm, %b)  # add\n  %y: float32[?] = Relu(%add)  # act\n"},
      {"gelu_erf",
       "  %add: float32[?] = Add(%mm, %b)  # add\n  %y: float32[?] = Gelu(%add)  # act\n"},
      {"gelu_tanh",
       "  %add: float32[?] = Add(%mm, %b)  # add\n  %y: float32[?] = Gelu(%add) "
       "{approximate=\"tanh\"}  # act\n"},
  };
  for (const Case& c : cases) {
    ir::Graph unfused = parse(linear_text(c.unfused_tail), weights);
    // The fusion a pass would make, with the rewrite helper.
    ir::Graph fused = unfused;
    ir::Node node =
        make_node("kiln", "MatMulBias", {value(fused, "x"), value(fused, "w"), value(fused, "b")},
                  {fused.outputs[0]}, "fc");
    node.attrs.set("activation", string_attr(c.activation));
    std::vector<int> all;
    for (size_t n = 0; n < fused.nodes.size(); ++n) all.push_back(int(n));
    ASSERT_TRUE(ir::replace_nodes(&fused, all, node).ok());
    ir::compact(&fused);
    // It prints, and reads back, as IR text.
    const std::string text = to_text(fused);
    EXPECT_NE(text.find("kiln::MatMulBias(%x, %w, %b) {activation=\"" + std::string(c.activation) +
                        "\"}"),
              std::string::npos)
        << text;
    ir::Graph reparsed = parse(text, ir::elided_from(fused));

    auto want = build_and_run(unfused, x);
    ASSERT_TRUE(want.ok()) << c.activation << ": " << want.status().to_string();
    std::string kernels;
    auto got = build_and_run(reparsed, x, &kernels);
    ASSERT_TRUE(got.ok()) << c.activation << ": " << got.status().to_string();
    EXPECT_EQ(kernels, "cpu.MatMulBias");
    ASSERT_EQ(got->shape(), (Shape{3, 5, 8}));
    ASSERT_EQ(want->shape(), got->shape());
    EXPECT_EQ(std::memcmp(got->data(), want->data(), got->nbytes()), 0) << c.activation;
    // Not trivially equal: the activation did something, and the outputs are not all zero.
    int nonzero = 0;
    for (int64_t i = 0; i < got->numel(); ++i) nonzero += got->data_as<float>()[i] != 0.f;
    EXPECT_GT(nonzero, 0) << c.activation;
  }
}

TEST(KilnMatMulBias, WithoutBiasIsAPlainMatMul) {
  auto weights = [](std::string_view, DType, const Shape& shape) -> StatusOr<Tensor> {
    return testing::random_f32(shape, 5);
  };
  const std::string body = R"(graph g(%x: float32[batch, seq, 16]) -> (%y: float32[?]) {
  opset ai.onnx 20
  %w: float32[16, 8] = dense<...>
  %y: float32[?] = )";
  ir::Graph unfused = parse(body + "MatMul(%x, %w)  # mm\n}\n", weights);
  ir::Graph fused =
      parse(body + "kiln::MatMulBias(%x, %w, _) {activation=\"relu\"}  # fc\n}\n", weights);
  const Tensor x = testing::random_f32({2, 3, 16}, 9);
  auto want = build_and_run(unfused, x);
  auto got = build_and_run(fused, x);
  ASSERT_TRUE(want.ok() && got.ok()) << want.status().to_string() << got.status().to_string();
  for (int64_t i = 0; i < got->numel(); ++i) {
    EXPECT_EQ(got->data_as<float>()[i], std::max(want->data_as<float>()[i], 0.f)) << i;
  }
}

}  // namespace
}  // namespace kiln
