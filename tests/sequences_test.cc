// Sequences and optionals laid out at build time (issue 15, item 3; builder/sequences.cc): a
// sequence input of the length the config gives is one tensor input per element ("xs[0]", ...,
// each with dims of its own), sequence ops become the tensor nodes they stand for, a sequence
// output is one tensor output per element, and an optional input present or absent is built for.
// Positions and lengths only the run knows are refused with the reason.
#include <gtest/gtest.h>

#include <string>

#include "kiln.h"
#include "model_util.h"
#include "onnx_model_builder.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

constexpr int kFloat = 1, kInt64 = 7, kBool = 9;

// A graph input or output of sequence (or optional) type whose elements are `elem_type[dims]`.
::onnx::TypeProto* element_type(::onnx::TypeProto* t, bool optional, bool sequence) {
  if (optional) t = t->mutable_optional_type()->mutable_elem_type();
  if (sequence) t = t->mutable_sequence_type()->mutable_elem_type();
  return t;
}

void add_kind_input(::onnx::GraphProto* g, const std::string& name, int elem_type,
                    const std::vector<std::string>& dims, bool optional, bool sequence) {
  auto* vi = g->add_input();
  vi->set_name(name);
  auto* tt = element_type(vi->mutable_type(), optional, sequence)->mutable_tensor_type();
  tt->set_elem_type(elem_type);
  auto* shape = tt->mutable_shape();
  for (const auto& d : dims) {
    auto* dim = shape->add_dim();
    if (d.find_first_not_of("0123456789") == std::string::npos) {
      dim->set_dim_value(std::stoll(d));
    } else {
      dim->set_dim_param(d);
    }
  }
}

void add_kind_output(::onnx::GraphProto* g, const std::string& name, int elem_type, bool optional,
                     bool sequence) {
  auto* vi = g->add_output();
  vi->set_name(name);
  element_type(vi->mutable_type(), optional, sequence)
      ->mutable_tensor_type()
      ->set_elem_type(elem_type);
}

void add_int_attr(::onnx::NodeProto* n, const std::string& name, int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(::onnx::AttributeProto::INT);
  a->set_i(v);
}

// A graph attribute `name` of node n (an If's branch, SequenceMap's body), named so too.
::onnx::GraphProto* add_graph_attr(::onnx::NodeProto* n, const std::string& name) {
  auto* attr = n->add_attribute();
  attr->set_name(name);
  attr->set_type(::onnx::AttributeProto::GRAPH);
  auto* g = attr->mutable_g();
  g->set_name(name);
  return g;
}

void add_constant(::onnx::GraphProto* g, const std::string& name, int64_t v) {
  *g->add_initializer() = raw_tensor<int64_t>(name, kInt64, {}, {v});
}

// xs: a sequence of float[n, 4] (n per element). y = ConcatFromSequence(xs, axis 0); len =
// SequenceLength(xs); last = SequenceAt(xs, -1); grown = SequenceInsert(xs, t, 1) (a sequence
// output); trimmed = SequenceErase(grown, 0), and its elements concatenated along a new axis 1 as
// z (every element of xs must then be [2, 4]: the test gives them so).
::onnx::ModelProto sequence_model() {
  auto m = make_model(18);
  auto* g = m.mutable_graph();
  add_kind_input(g, "xs", kFloat, {"n", "4"}, false, true);
  add_input(g, "t", kFloat, {"2", "4"});
  add_constant(g, "minus_one", -1);
  add_constant(g, "one", 1);
  add_constant(g, "zero", 0);
  add_int_attr(add_node(g, "ConcatFromSequence", {"xs"}, {"y"}, "concat"), "axis", 0);
  add_node(g, "SequenceLength", {"xs"}, {"len"}, "length");
  add_node(g, "SequenceAt", {"xs", "minus_one"}, {"last"}, "at");
  add_node(g, "SequenceInsert", {"xs", "t", "one"}, {"grown"}, "insert");
  add_node(g, "SequenceErase", {"grown", "zero"}, {"trimmed"}, "erase");
  auto* stack = add_node(g, "ConcatFromSequence", {"trimmed"}, {"z"}, "stack");
  add_int_attr(stack, "axis", 1);
  add_int_attr(stack, "new_axis", 1);
  add_output(g, "y");
  add_output(g, "len", kInt64);
  add_output(g, "last");
  add_kind_output(g, "grown", kFloat, false, true);
  add_output(g, "z");
  return m;
}

TEST(Sequences, ASequenceInputIsOneTensorInputPerElement) {
  auto net = parse(sequence_model());
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  BuilderConfig config;
  ASSERT_TRUE(config.set_sequence_length("xs", 3).ok());
  // Each element has dims of its own: xs[0] (erased before z stacks) takes 1..8 rows, the others 2.
  OptimizationProfile p;
  ASSERT_TRUE(p.set_dimensions("xs[0]", {1, 4}, {2, 4}, {8, 4}).ok());
  ASSERT_TRUE(p.set_dimensions("xs[1]", {2, 4}, {2, 4}, {2, 4}).ok());
  ASSERT_TRUE(p.set_dimensions("xs[2]", {2, 4}, {2, 4}, {2, 4}).ok());
  config.add_profile(p);
  auto engine = Builder().build(*net, config);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  std::vector<std::string> inputs, outputs;
  for (int i = 0; i < engine->num_io_tensors(); ++i) {
    const std::string name = engine->io_tensor_name(i);
    (engine->tensor_mode(name) == TensorIOMode::kINPUT ? inputs : outputs).push_back(name);
  }
  EXPECT_EQ(inputs, (std::vector<std::string>{"xs[0]", "xs[1]", "xs[2]", "t"}));
  EXPECT_EQ(outputs, (std::vector<std::string>{"y", "len", "last", "grown[0]", "grown[1]",
                                               "grown[2]", "grown[3]", "z"}));
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());

  const Tensor a = random_f32({2, 4}, 1), b = random_f32({2, 4}, 2), c = random_f32({2, 4}, 3),
               t = random_f32({2, 4}, 4);
  auto out = (*ctx)->run({{"xs[0]", a}, {"xs[1]", b}, {"xs[2]", c}, {"t", t}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->at("y").shape(), (Shape{6, 4}));
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(out->at("y").data_as<float>()[i], a.data_as<float>()[i]);
    EXPECT_EQ(out->at("y").data_as<float>()[16 + i], c.data_as<float>()[i]);
  }
  EXPECT_EQ(out->at("len").data_as<int64_t>()[0], 3);
  EXPECT_EQ(out->at("last").data_as<float>()[5], c.data_as<float>()[5]);
  EXPECT_EQ(out->at("grown[0]").data_as<float>()[3], a.data_as<float>()[3]);
  EXPECT_EQ(out->at("grown[1]").data_as<float>()[3], t.data_as<float>()[3]);
  EXPECT_EQ(out->at("grown[3]").data_as<float>()[3], c.data_as<float>()[3]);
  // z stacks t, b, c (grown without a) along axis 1: [2, 3, 4].
  ASSERT_EQ(out->at("z").shape(), (Shape{2, 3, 4}));
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t k = 0; k < 4; ++k) {
      EXPECT_EQ(out->at("z").data_as<float>()[r * 12 + k], t.data_as<float>()[r * 4 + k]);
      EXPECT_EQ(out->at("z").data_as<float>()[r * 12 + 4 + k], b.data_as<float>()[r * 4 + k]);
      EXPECT_EQ(out->at("z").data_as<float>()[r * 12 + 8 + k], c.data_as<float>()[r * 4 + k]);
    }
  }

  // xs[0] of 5 rows: y has 9, grown[0] is it.
  const Tensor a5 = random_f32({5, 4}, 5);
  out = (*ctx)->run({{"xs[0]", a5}, {"xs[1]", b}, {"xs[2]", c}, {"t", t}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->at("y").shape(), (Shape{9, 4}));
  EXPECT_EQ(out->at("y").data_as<float>()[19], a5.data_as<float>()[19]);
  ASSERT_EQ(out->at("grown[0]").shape(), (Shape{5, 4}));
  // An element outside its profile is refused by its name.
  out = (*ctx)->run({{"xs[0]", a}, {"xs[1]", b}, {"xs[2]", a5}, {"t", t}});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("xs[2]"), std::string::npos) << out.status().message();
}

TEST(Sequences, ASequenceInputNeedsItsLength) {
  auto net = parse(sequence_model());
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  auto engine = Builder().build(*net, BuilderConfig());
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("'xs'"), std::string::npos) << engine.status().message();
  EXPECT_NE(engine.status().message().find("set_sequence_length"), std::string::npos)
      << engine.status().message();
  BuilderConfig config;
  ASSERT_TRUE(config.set_sequence_length("t", 2).ok());
  engine = Builder().build(*net, config);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("'t'"), std::string::npos) << engine.status().message();
  EXPECT_NE(engine.status().message().find("not a sequence"), std::string::npos)
      << engine.status().message();
  EXPECT_FALSE(config.set_sequence_length("xs", -1).ok());
}

// x: float[6, 4] split into a sequence of [2, 4] pieces, each through SequenceMap's body (a Relu),
// the results stacked along a new axis 1; and split into its rows (pieces of 1, axis dropped).
TEST(Sequences, SplitToSequenceAndSequenceMapUnrollPerElement) {
  auto m = make_model(18);
  auto* g = m.mutable_graph();
  add_input(g, "x", kFloat, {"6", "4"});
  add_constant(g, "two", 2);
  add_node(g, "SplitToSequence", {"x", "two"}, {"parts"}, "split");
  auto* map = add_node(g, "SequenceMap", {"parts"}, {"mapped"}, "map");
  auto* body = add_graph_attr(map, "body");
  add_input(body, "p", kFloat, {"2", "4"});
  add_node(body, "Relu", {"p"}, {"r"}, "relu");
  add_output(body, "r");
  auto* stack = add_node(g, "ConcatFromSequence", {"mapped"}, {"y"}, "stack");
  add_int_attr(stack, "axis", 1);
  add_int_attr(stack, "new_axis", 1);
  // Single-element pieces, their axis dropped (keepdims 0): x's rows.
  auto* rows = add_node(g, "SplitToSequence", {"x"}, {"rows"}, "rows");
  add_int_attr(rows, "keepdims", 0);
  add_node(g, "SequenceLength", {"rows"}, {"n_rows"}, "count");
  add_output(g, "y");
  add_kind_output(g, "rows", kFloat, false, true);
  add_output(g, "n_rows", kInt64);
  auto net = parse(m);
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  auto engine = Builder().build(*net, BuilderConfig());
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  const Tensor x = random_f32({6, 4}, 11);
  auto out = (*ctx)->run({{"x", x}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->at("y").shape(), (Shape{2, 3, 4}));
  const float* xp = x.data_as<float>();
  for (int64_t part = 0; part < 3; ++part) {
    for (int64_t r = 0; r < 2; ++r) {
      for (int64_t k = 0; k < 4; ++k) {
        EXPECT_EQ(out->at("y").data_as<float>()[r * 12 + part * 4 + k],
                  std::max(xp[(part * 2 + r) * 4 + k], 0.f));
      }
    }
  }
  EXPECT_EQ(out->at("n_rows").data_as<int64_t>()[0], 6);
  for (int64_t r = 0; r < 6; ++r) {
    const Tensor& row = out->at("rows[" + std::to_string(r) + "]");
    ASSERT_EQ(row.shape(), (Shape{4}));
    EXPECT_EQ(row.data_as<float>()[2], xp[r * 4 + 2]);
  }
}

// A sequence's length from a dynamic dim: built where every profile fixes the dim, refused (naming
// the dim) where it ranges.
TEST(Sequences, ASplitOfADimTheProfileFixesHasThatLength) {
  auto m = make_model(18);
  auto* g = m.mutable_graph();
  add_input(g, "x", kFloat, {"n", "4"});
  add_node(g, "SplitToSequence", {"x"}, {"rows"}, "rows");
  add_kind_output(g, "rows", kFloat, false, true);
  auto net = parse(m);
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  for (bool fixed : {true, false}) {
    BuilderConfig config;
    OptimizationProfile p;
    ASSERT_TRUE(p.set_dimensions("x", {fixed ? 3 : 2, 4}, {3, 4}, {3, 4}).ok());
    config.add_profile(p);
    auto engine = Builder().build(*net, config);
    if (!fixed) {
      ASSERT_FALSE(engine.ok());
      EXPECT_NE(engine.status().message().find("splits dim 0 of 'x'"), std::string::npos)
          << engine.status().message();
      continue;
    }
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    ASSERT_EQ(engine->num_io_tensors(), 4);
    auto ctx = engine->create_execution_context();
    ASSERT_TRUE(ctx.ok());
    const Tensor x = random_f32({3, 4}, 21);
    auto out = (*ctx)->run({{"x", x}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    ASSERT_EQ(out->at("rows[2]").shape(), (Shape{1, 4}));
    EXPECT_EQ(out->at("rows[2]").data_as<float>()[1], x.data_as<float>()[9]);
  }
}

// opt: an optional float[4]. has = OptionalHasElement(opt); y = If(has) then Neg(OptionalGetElement
// (opt)) else a constant. Built present and absent.
::onnx::ModelProto optional_model() {
  auto m = make_model(18);
  auto* g = m.mutable_graph();
  add_kind_input(g, "opt", kFloat, {"4"}, true, false);
  add_node(g, "OptionalHasElement", {"opt"}, {"has"}, "has");
  auto* branch = add_node(g, "If", {"has"}, {"y"}, "branch");
  auto* then_g = add_graph_attr(branch, "then_branch");
  add_node(then_g, "OptionalGetElement", {"opt"}, {"v"}, "get");
  add_node(then_g, "Neg", {"v"}, {"nv"}, "neg");
  add_output(then_g, "nv");
  auto* else_g = add_graph_attr(branch, "else_branch");
  *else_g->add_initializer() = raw_tensor<float>("fallback", kFloat, {4}, {7, 7, 7, 7});
  add_output(else_g, "fallback");
  add_output(g, "y");
  add_output(g, "has", kBool);
  return m;
}

TEST(Sequences, AnOptionalInputIsBuiltPresentOrAbsent) {
  auto net = parse(optional_model());
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  {
    auto engine = Builder().build(*net, BuilderConfig());  // present by default
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    ASSERT_EQ(engine->num_io_tensors(), 3);
    EXPECT_EQ(engine->io_tensor_name(0), "opt");
    auto ctx = engine->create_execution_context();
    ASSERT_TRUE(ctx.ok());
    const Tensor x = random_f32({4}, 12);
    auto out = (*ctx)->run({{"opt", x}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(out->at("y").data_as<float>()[1], -x.data_as<float>()[1]);
    EXPECT_EQ(out->at("has").data_as<uint8_t>()[0], 1);
  }
  BuilderConfig absent;
  absent.set_optional_present("opt", false);
  auto engine = Builder().build(*net, absent);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  ASSERT_EQ(engine->num_io_tensors(), 2) << "an absent optional input has no tensor";
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  auto out = (*ctx)->run({});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->at("y").data_as<float>()[3], 7.f);
  EXPECT_EQ(out->at("has").data_as<uint8_t>()[0], 0);
  BuilderConfig wrong;
  wrong.set_optional_present("y", false);
  auto refused = Builder().build(*net, wrong);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("not an input"), std::string::npos)
      << refused.status().message();
}

// A position only the run knows is refused with the reason (a shape-value input would do).
TEST(Sequences, APositionFromDataIsRefusedWithTheReason) {
  auto m = make_model(18);
  auto* g = m.mutable_graph();
  add_input(g, "a", kFloat, {"3"});
  add_input(g, "pos", kInt64, {});
  add_node(g, "SequenceConstruct", {"a", "a"}, {"s"}, "make");
  add_node(g, "SequenceAt", {"s", "pos"}, {"y"}, "at");
  add_output(g, "y");
  auto net = parse(m);
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  auto engine = Builder().build(*net, BuilderConfig());
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("node 'at'"), std::string::npos)
      << engine.status().message();
  EXPECT_NE(engine.status().message().find("'pos'"), std::string::npos)
      << engine.status().message();
  EXPECT_NE(engine.status().message().find("at run time"), std::string::npos)
      << engine.status().message();
  // Given as a shape-value input, the position is known to the build.
  BuilderConfig config;
  OptimizationProfile p;
  ASSERT_TRUE(p.set_shape_values("pos", {1}, {1}, {1}).ok());
  config.add_profile(p);
  engine = Builder().build(*net, config);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  const Tensor a = random_f32({3}, 13);
  auto out = (*ctx)->run({{"a", a}, {"pos", Tensor::from_vector<int64_t>(DType::kInt64, {}, {1})}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->at("y").data_as<float>()[2], a.data_as<float>()[2]);
}

// An If on data whose branches give sequences: element by element when they agree on the length,
// refused naming the condition when they do not.
TEST(Sequences, AnIfOnDataPassesSequencesOfOneLength) {
  for (bool same_length : {true, false}) {
    auto m = make_model(18);
    auto* g = m.mutable_graph();
    add_input(g, "a", kFloat, {"3"});
    add_input(g, "c", kBool, {});
    auto* branch = add_node(g, "If", {"c"}, {"s"}, "branch");
    for (const char* which : {"then_branch", "else_branch"}) {
      auto* b = add_graph_attr(branch, which);
      const bool then = which[0] == 't';
      add_node(b, then ? "Neg" : "Relu", {"a"}, {"e"}, "e");
      std::vector<std::string> parts = {"e", "a"};
      if (!then && !same_length) parts.push_back("a");
      add_node(b, "SequenceConstruct", parts, {"seq"}, "make");
      add_kind_output(b, "seq", kFloat, false, true);
    }
    add_kind_output(g, "s", kFloat, false, true);
    auto net = parse(m);
    ASSERT_TRUE(net.ok()) << net.status().to_string();
    auto engine = Builder().build(*net, BuilderConfig());
    if (!same_length) {
      ASSERT_FALSE(engine.ok());
      EXPECT_NE(engine.status().message().find("'c'"), std::string::npos)
          << engine.status().message();
      EXPECT_NE(engine.status().message().find(
                    "a sequence of 2 tensors in one branch and a sequence of 3"),
                std::string::npos)
          << engine.status().message();
      continue;
    }
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    auto ctx = engine->create_execution_context();
    ASSERT_TRUE(ctx.ok());
    const Tensor a = Tensor::from_vector<float>(DType::kFloat32, {3}, {-1, 2, -3});
    for (bool c : {true, false}) {
      auto out = (*ctx)->run(
          {{"a", a}, {"c", Tensor::from_vector<uint8_t>(DType::kBool, {}, {uint8_t(c)})}});
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      EXPECT_EQ(out->at("s[0]").data_as<float>()[0], c ? 1.f : 0.f);
      EXPECT_EQ(out->at("s[0]").data_as<float>()[1], c ? -2.f : 2.f);
      EXPECT_EQ(out->at("s[1]").data_as<float>()[2], -3.f);
    }
  }
}

// A subgraph's nodes are not checked before the build reaches them: a sequence op there with too
// few inputs, or a required one omitted, is refused by name, never read out of range.
TEST(Sequences, MalformedSequenceNodesInABranchAreRefused) {
  for (int variant = 0; variant < 2; ++variant) {
    auto m = make_model(18);
    auto* g = m.mutable_graph();
    add_input(g, "a", kFloat, {"3"});
    *g->add_initializer() = raw_tensor<uint8_t>("yes", kBool, {}, {1});
    auto* branch = add_node(g, "If", {"yes"}, {"y"}, "branch");
    for (const char* which : {"then_branch", "else_branch"}) {
      auto* b = add_graph_attr(branch, which);
      add_node(b, "SequenceConstruct", {"a"}, {"s"}, "make");
      if (variant == 0) {
        add_node(b, "SequenceInsert", {"s"}, {"t"}, "insert");  // needs 2 inputs
      } else {
        add_node(b, "SequenceInsert", {"s", ""}, {"t"}, "insert");  // its tensor omitted
      }
      add_int_attr(add_node(b, "ConcatFromSequence", {"t"}, {"c"}, "concat"), "axis", 0);
      add_output(b, "c");
    }
    add_output(g, "y");
    auto net = parse(m);
    ASSERT_TRUE(net.ok()) << net.status().to_string();
    auto engine = Builder().build(*net, BuilderConfig());
    ASSERT_FALSE(engine.ok());
    EXPECT_NE(engine.status().message().find("insert"), std::string::npos)
        << engine.status().message();
    EXPECT_NE(engine.status().message().find(variant == 0 ? "1 inputs" : "omitted"),
              std::string::npos)
        << engine.status().message();
  }
}

}  // namespace
}  // namespace kiln::testing
