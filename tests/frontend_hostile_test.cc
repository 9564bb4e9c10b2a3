// Hostile models built in memory: each must come back from the parse or the build as a typed error
// naming what was wrong (issue 13), never a crash, a hang or a wrong engine.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kiln.h"
#include "onnx_model_builder.h"
#include "ops/schema.h"

namespace kiln {
namespace {

using ::onnx::AttributeProto;
using ::onnx::GraphProto;
using ::onnx::ModelProto;
using ::onnx::TensorProto;
using testing::add_input;
using testing::add_node;
using testing::add_output;
using testing::make_model;
using testing::parse;
using testing::raw_tensor;

constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
constexpr int64_t kPow62 = int64_t(1) << 62;  // Interval::kInf, the largest axis length

// Parses and builds a CPU engine; a dynamic input's profile fixes each of its symbolic dims at 4.
StatusOr<Engine> parse_and_build(const ModelProto& m) {
  KILN_ASSIGN_OR_RETURN(Network net, parse(m));
  BuilderConfig config;
  OptimizationProfile profile;
  bool dynamic = false;
  for (int v : net.graph.inputs) {
    const ir::Value& input = net.graph.values[v];
    Shape shape;
    bool symbolic = false;
    for (const auto& d : *input.shape) {
      symbolic |= !d.is_const();
      shape.push_back(d.is_const() ? d.value() : 4);
    }
    if (symbolic) {
      dynamic = true;
      KILN_RETURN_IF_ERROR(profile.set_dimensions(input.name, shape, shape, shape));
    }
  }
  if (dynamic) config.add_profile(profile);
  return Builder().build(net, config);
}

void expect_error(const Status& st, StatusCode code, const std::vector<std::string>& phrases) {
  ASSERT_FALSE(st.ok()) << "the model was accepted";
  EXPECT_EQ(st.code(), code) << st.to_string();
  for (const auto& p : phrases) {
    EXPECT_NE(st.message().find(p), std::string::npos) << "'" << p << "' not in: " << st.message();
  }
}

TensorProto int64_tensor(const std::string& name, std::vector<int64_t> dims,
                         const std::vector<int64_t>& values) {
  return raw_tensor<int64_t>(name, TensorProto::INT64, std::move(dims), values);
}

// x: float [3, 4] (or x_dims) -> op(inputs) -> y, with the given initializers.
ModelProto one_node(const std::string& op, const std::vector<std::string>& inputs,
                    const std::vector<TensorProto>& initializers = {},
                    const std::vector<std::string>& x_dims = {"3", "4"}) {
  ModelProto m = make_model();
  GraphProto* g = m.mutable_graph();
  add_input(g, "x", TensorProto::FLOAT, x_dims);
  for (const auto& t : initializers) *g->add_initializer() = t;
  add_node(g, op, inputs, {"y"}, "hostile");
  add_output(g, "y");
  return m;
}

void set_attr_float(ModelProto& m, const std::string& name, float v) {
  auto* a = m.mutable_graph()->mutable_node(0)->add_attribute();
  a->set_name(name);
  a->set_type(AttributeProto::FLOAT);
  a->set_f(v);
}

void set_attr_ints(ModelProto& m, const std::string& name, const std::vector<int64_t>& v) {
  auto* a = m.mutable_graph()->mutable_node(0)->add_attribute();
  a->set_name(name);
  a->set_type(AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}

void set_attr_int(ModelProto& m, const std::string& name, int64_t v) {
  auto* a = m.mutable_graph()->mutable_node(0)->add_attribute();
  a->set_name(name);
  a->set_type(AttributeProto::INT);
  a->set_i(v);
}

void set_attr_string(ModelProto& m, const std::string& name, const std::string& v) {
  auto* a = m.mutable_graph()->mutable_node(0)->add_attribute();
  a->set_name(name);
  a->set_type(AttributeProto::STRING);
  a->set_s(v);
}

std::string pow2(int k) { return std::to_string(int64_t(1) << k); }

struct HostileCase {
  const char* name;
  std::function<ModelProto()> make;
  StatusCode code;
  std::vector<std::string> phrases;
};

std::vector<HostileCase> hostile_cases() {
  return {
      {"graph output listed twice",
       [] {
         ModelProto m = one_node("Relu", {"x"});
         add_output(m.mutable_graph(), "y");
         return m;
       },
       StatusCode::kInvalidModel,
       {"graph output 'y'", "listed twice"}},
      {"graph input listed twice as an output",
       [] {
         ModelProto m = one_node("Relu", {"x"});
         add_output(m.mutable_graph(), "x");
         add_output(m.mutable_graph(), "x");
         return m;
       },
       StatusCode::kInvalidModel,
       {"graph output 'x'", "listed twice"}},
      {"two producers of one value",
       [] {
         ModelProto m = one_node("Relu", {"x"});
         add_node(m.mutable_graph(), "Neg", {"x"}, {"y"}, "second");
         return m;
       },
       StatusCode::kInvalidModel,
       {"'y'", "second"}},
      {"a node output redefines a graph input",
       [] {
         ModelProto m = one_node("Relu", {"x"});
         add_node(m.mutable_graph(), "Neg", {"y"}, {"x"}, "shadow");
         return m;
       },
       StatusCode::kInvalidModel,
       {"'x'", "shadow", "already defined as a graph input"}},
      {"a node output redefines an initializer",
       [] {
         ModelProto m =
             one_node("Add", {"x", "b"}, {raw_tensor<float>("b", TensorProto::FLOAT, {1}, {1})});
         add_node(m.mutable_graph(), "Neg", {"x"}, {"b"}, "shadow");
         return m;
       },
       StatusCode::kInvalidModel,
       {"'b'", "shadow", "already defined as a graph input or initializer"}},
      {"dangling input",
       [] {
         return one_node("Add", {"x", "ghost"});
       },
       StatusCode::kInvalidModel,
       {"ghost", "hostile", "not produced"}},
      {"cycle of two nodes",
       [] {
         ModelProto m = one_node("Add", {"x", "z"});
         add_node(m.mutable_graph(), "Relu", {"y"}, {"z"}, "back");
         return m;
       },
       StatusCode::kInvalidModel,
       {"cycle"}},
      {"node reading its own output",
       [] { return one_node("Relu", {"y"}); },
       StatusCode::kInvalidModel,
       {"cycle", "hostile"}},
      {"omitted first input of Relu",
       [] { return one_node("Relu", {""}); },
       StatusCode::kInvalidModel,
       {"hostile", "input 0", "omitted"}},
      {"omitted indices of Gather",
       [] {
         return one_node("Gather", {"x", ""});
       },
       StatusCode::kInvalidModel,
       {"hostile", "input 1", "omitted"}},
      {"Gather axis as a float",
       [] {
         ModelProto m = one_node("Gather", {"x", "i"}, {int64_tensor("i", {1}, {0})});
         set_attr_float(m, "axis", 0.5f);
         return m;
       },
       StatusCode::kInvalidModel,
       {"hostile", "axis", "int"}},
      {"Transpose perm as a string",
       [] {
         ModelProto m = one_node("Transpose", {"x"});
         auto* a = m.mutable_graph()->mutable_node(0)->add_attribute();
         a->set_name("perm");
         a->set_type(AttributeProto::STRING);
         a->set_s("1,0");
         return m;
       },
       StatusCode::kInvalidModel,
       {"hostile", "perm"}},
      {"Softmax axis as a float",
       [] {
         ModelProto m = one_node("Softmax", {"x"});
         set_attr_float(m, "axis", 1.0f);
         return m;
       },
       StatusCode::kInvalidModel,
       {"hostile", "axis", "int"}},
      {"Constant value_int holding a float",
       [] {
         ModelProto m = one_node("Add", {"x", "c"});
         auto* n = add_node(m.mutable_graph(), "Constant", {}, {"c"}, "const");
         auto* a = n->add_attribute();
         a->set_name("value_int");
         a->set_type(AttributeProto::FLOAT);
         a->set_f(1.5f);
         return m;
       },
       StatusCode::kInvalidModel,
       {"const", "value_int", "an int"}},
      {"initializer with short raw_data",
       [] {
         TensorProto b = raw_tensor<float>("b", TensorProto::FLOAT, {4}, {1, 2, 3});
         return one_node("Add", {"x", "b"}, {b});
       },
       StatusCode::kInvalidModel,
       {"'b'", "12 bytes", "16 bytes"}},
      {"initializer with long raw_data",
       [] {
         TensorProto b = raw_tensor<float>("b", TensorProto::FLOAT, {2}, {1, 2, 3});
         return one_node("Add", {"x", "b"}, {b});
       },
       StatusCode::kInvalidModel,
       {"'b'", "12 bytes", "8 bytes"}},
      {"initializer dims whose product overflows",
       [] {
         TensorProto b =
             raw_tensor<float>("b", TensorProto::FLOAT, {int64_t(1) << 40, int64_t(1) << 40}, {});
         return one_node("Add", {"x", "b"}, {b});
       },
       StatusCode::kInvalidModel,
       {"'b'", "overflows"}},
      {"graph input dims whose product overflows",
       [] {
         ModelProto m = make_model();
         add_input(m.mutable_graph(), "x", TensorProto::FLOAT,
                   {std::to_string(int64_t(1) << 40), std::to_string(int64_t(1) << 40)});
         add_node(m.mutable_graph(), "Relu", {"x"}, {"y"});
         add_output(m.mutable_graph(), "y");
         return m;
       },
       StatusCode::kInvalidModel,
       {"graph input 'x'", "overflows"}},
      {"graph input dims whose byte size overflows",
       [] {
         ModelProto m = make_model();
         add_input(m.mutable_graph(), "x", TensorProto::FLOAT,
                   {std::to_string(int64_t(1) << 31), std::to_string(int64_t(1) << 31)});
         add_node(m.mutable_graph(), "Relu", {"x"}, {"y"});
         add_output(m.mutable_graph(), "y");
         return m;
       },
       StatusCode::kInvalidModel,
       {"graph input 'x'", "overflows"}},
      {"ConstantOfShape whose output size overflows",
       [] {
         ModelProto m = make_model();
         GraphProto* g = m.mutable_graph();
         *g->add_initializer() = int64_tensor("s", {2}, {int64_t(1) << 40, int64_t(1) << 40});
         add_node(g, "ConstantOfShape", {"s"}, {"y"}, "hostile");
         add_output(g, "y");
         return m;
       },
       StatusCode::kInvalidModel,
       {"hostile", "output 'y'", "overflows"}},
      {"Expand whose output size overflows",
       [] {
         return one_node("Expand", {"x", "s"},
                         {int64_tensor("s", {4}, {int64_t(1) << 40, int64_t(1) << 30, 1, 1})});
       },
       StatusCode::kInvalidModel,
       {"hostile", "output 'y'", "overflows"}},
      {"Tile whose output size overflows",
       [] {
         return one_node("Tile", {"x", "r"},
                         {int64_tensor("r", {2}, {int64_t(1) << 40, int64_t(1) << 30})});
       },
       StatusCode::kInvalidModel,
       {"hostile", "overflows"}},
      {"graph input with a negative dim",
       [] {
         ModelProto m = one_node("Relu", {"x"});
         m.mutable_graph()
             ->mutable_input(0)
             ->mutable_type()
             ->mutable_tensor_type()
             ->mutable_shape()
             ->mutable_dim(0)
             ->set_dim_value(-3);
         return m;
       },
       StatusCode::kInvalidModel,
       {"graph input 'x'", "negative"}},
      {"Gather index INT64_MIN",
       [] {
         return one_node("Gather", {"x", "i"}, {int64_tensor("i", {1}, {kMin64})});
       },
       StatusCode::kInvalidModel,
       {"hostile", "index -9223372036854775808", "out of range"}},
      {"Gather index INT64_MAX",
       [] {
         return one_node("Gather", {"x", "i"}, {int64_tensor("i", {1}, {kMax64})});
       },
       StatusCode::kInvalidModel,
       {"hostile", "index 9223372036854775807", "out of range"}},
      {"Slice step INT64_MIN",
       [] {
         return one_node("Slice", {"x", "s", "e", "a", "st"},
                         {int64_tensor("s", {1}, {kMax64}), int64_tensor("e", {1}, {kMin64}),
                          int64_tensor("a", {1}, {0}), int64_tensor("st", {1}, {kMin64})});
       },
       StatusCode::kUnsupported,
       {"hostile", "step -9223372036854775808"}},
      {"Range over the whole int64 line",
       [] {
         ModelProto m = make_model();
         GraphProto* g = m.mutable_graph();
         *g->add_initializer() = int64_tensor("start", {}, {kMin64});
         *g->add_initializer() = int64_tensor("limit", {}, {kMax64});
         *g->add_initializer() = int64_tensor("delta", {}, {1});
         add_node(g, "Range", {"start", "limit", "delta"}, {"y"}, "hostile");
         add_output(g, "y", TensorProto::INT64);
         return m;
       },
       StatusCode::kInvalidModel,
       {"hostile", "Range length", "overflows"}},
      {"Range with delta INT64_MIN",
       [] {
         ModelProto m = make_model();
         GraphProto* g = m.mutable_graph();
         // A symbolic limit (the element count of x), so the length is a formula dividing by
         // |delta|.
         add_input(g, "x", TensorProto::FLOAT, {"n"});
         add_node(g, "Size", {"x"}, {"n"});
         *g->add_initializer() = int64_tensor("start", {}, {0});
         *g->add_initializer() = int64_tensor("delta", {}, {kMin64});
         add_node(g, "Range", {"start", "n", "delta"}, {"y"}, "hostile");
         add_output(g, "y", TensorProto::INT64);
         return m;
       },
       StatusCode::kUnsupported,
       {"hostile", "delta -9223372036854775808"}},
      // Found by onnx_build_fuzz: axis 0 of a scalar passed normalize_axis and read in[0].
      {"Split of a scalar",
       [] { return one_node("Split", {"x"}, {}, {}); },
       StatusCode::kInvalidModel,
       {"hostile", "input 0 ('x') is a scalar", "Split needs rank >= 1"}},
  };
}

// Output dims computed from the model's numbers (pads, repeats, strides, scales, blocksizes). Dim
// arithmetic wraps, so before these checks a pad of INT64_MAX on both ends of a dim of 4 built an
// engine whose output dim was 2, and ConvTranspose's pads overflowed int64 (undefined behaviour).
std::vector<HostileCase> shape_overflow_cases() {
  const std::string kTooLong = "overflows the largest axis length 2^62";
  const TensorProto conv_w = raw_tensor<float>("w", TensorProto::FLOAT, {1, 1, 1, 1}, {1.0f});
  return {
      {"Pad of INT64_MAX on both ends",
       [] {
         return one_node("Pad", {"x", "p"}, {int64_tensor("p", {4}, {0, kMax64, 0, kMax64})});
       },
       StatusCode::kInvalidModel,
       {"hostile", "dim 1 padded by input 1 ('p') (pads) elements 1 and 3",
        "4 + 9223372036854775807", kTooLong}},
      {"Pad of 2^62 on both ends of a symbolic dim",
       [] {
         return one_node("Pad", {"x", "p"}, {int64_tensor("p", {4}, {kPow62, 0, kPow62, 0})},
                         {"n", "4"});
       },
       StatusCode::kInvalidModel,
       {"hostile", "dim 0 padded by input 1 ('p') (pads) elements 0 and 2", kTooLong}},
      {"Tile repeat 2^62 of a dim of 3",
       [] {
         return one_node("Tile", {"x", "r"}, {int64_tensor("r", {2}, {kPow62, 1})});
       },
       StatusCode::kInvalidModel,
       {"hostile", "dim 0 times input 1 ('r') element 0", "3 * 4611686018427387904", kTooLong}},
      {"Conv pads INT64_MAX",
       [conv_w] {
         ModelProto m = one_node("Conv", {"x", "w"}, {conv_w}, {"1", "1", "3", "4"});
         set_attr_ints(m, "pads", {kMax64, 0, kMax64, 0});
         return m;
       },
       StatusCode::kInvalidModel,
       {"hostile", "input dim 2 with pads", "3 + 9223372036854775807", kTooLong}},
      {"ConvTranspose pads INT64_MAX",
       [conv_w] {
         ModelProto m = one_node("ConvTranspose", {"x", "w"}, {conv_w}, {"1", "1", "3", "4"});
         set_attr_ints(m, "pads", {kMax64, 0, kMax64, 0});
         return m;
       },
       StatusCode::kInvalidModel,
       {"hostile", "output dim 2 pads", "9223372036854775807 + 9223372036854775807", kTooLong}},
      {"ConvTranspose stride 2^62",
       [conv_w] {
         ModelProto m = one_node("ConvTranspose", {"x", "w"}, {conv_w}, {"1", "1", "3", "4"});
         set_attr_ints(m, "strides", {kPow62, 1});
         return m;
       },
       StatusCode::kInvalidModel,
       {"hostile", "output dim 2 stride", "2 * 4611686018427387904", kTooLong}},
      {"Resize scale 2^30 of a dim of 2^40",
       [] {
         return one_node("Resize", {"x", "", "s"},
                         {raw_tensor<float>("s", TensorProto::FLOAT, {2}, {1.0f, 1073741824.0f})},
                         {"1", pow2(40)});
       },
       StatusCode::kInvalidModel,
       {"hostile", "output dim 1 scaled by", kTooLong}},
      {"Resize sizes 2^62 under keep_aspect_ratio_policy not_smaller",
       [] {
         ModelProto m = one_node("Resize", {"x", "", "", "z"},
                                 {int64_tensor("z", {2}, {kPow62, 1})}, {"1", pow2(30)});
         set_attr_string(m, "keep_aspect_ratio_policy", "not_smaller");
         return m;
       },
       StatusCode::kInvalidModel,
       {"hostile", "output dim 1", "keep_aspect_ratio_policy 'not_smaller'", kTooLong}},
      {"Concat of one bool [2^61] input nine times",
       [] {
         ModelProto m = make_model();
         GraphProto* g = m.mutable_graph();
         add_input(g, "x", TensorProto::BOOL, {pow2(61)});
         auto* n = add_node(g, "Concat", std::vector<std::string>(9, "x"), {"y"}, "hostile");
         auto* a = n->add_attribute();
         a->set_name("axis");
         a->set_type(AttributeProto::INT);
         a->set_i(0);
         add_output(g, "y", TensorProto::BOOL);
         return m;
       },
       StatusCode::kInvalidModel,
       {"hostile", "dim 0 of inputs 0..2", kTooLong}},
      {"MaxUnpool stride 2^62",
       [] {
         ModelProto m = one_node("MaxUnpool", {"x", "i"}, {}, {"1", "1", "3", "4"});
         GraphProto* g = m.mutable_graph();
         add_input(g, "i", TensorProto::INT64, {"1", "1", "3", "4"});
         set_attr_ints(m, "kernel_shape", {1, 1});
         set_attr_ints(m, "strides", {kPow62, 1});
         return m;
       },
       StatusCode::kInvalidModel,
       {"hostile", "output dim 2 stride", kTooLong}},
  };
}

// Static shapes cannot overflow DepthToSpace or SpaceToDepth (the input's byte size bounds the
// output's); a dim_param whose constant part is near 2^62 can. A profile refuses such a dim before
// inference (no value of h fits it), so these run the node's inference alone.
TEST(FrontendHostile, BlocksizeOverflowOfASymbolicDimIsAnError) {
  const std::string kTooLong = "overflows the largest axis length 2^62";
  ModelProto d2s = one_node("DepthToSpace", {"x"}, {}, {"1", "4", "h + " + pow2(62), "1"});
  set_attr_int(d2s, "blocksize", 2);
  ModelProto s2d = one_node("SpaceToDepth", {"x"}, {}, {"1", "c + " + pow2(61), "2", "2"});
  set_attr_int(s2d, "blocksize", 2);
  for (const auto& [m, phrase] :
       {std::pair{d2s, "height times blocksize"}, std::pair{s2d, "channels times blocksize^2"}}) {
    SCOPED_TRACE(phrase);
    auto net = parse(m);
    ASSERT_TRUE(net.ok()) << net.status().to_string();
    const ir::Graph& g = net->graph;
    std::vector<ops::Constraint> constraints;
    ops::InferContext ctx(g, g.nodes[0], 0, &constraints);
    const ops::OpSchema* schema = ops::find_schema(g.nodes[0]);
    ASSERT_NE(schema, nullptr);
    expect_error(schema->infer(ctx), StatusCode::kInvalidModel, {"hostile", phrase, kTooLong});
  }
}

TEST(FrontendHostile, ShapeArithmeticOverflowIsAnErrorNamingTheNodeAndInput) {
  for (const HostileCase& c : shape_overflow_cases()) {
    SCOPED_TRACE(c.name);
    auto engine = parse_and_build(c.make());
    expect_error(engine.status(), c.code, c.phrases);
  }
}

// Pads and repeats that fit still build: the checks refuse only what overflows.
TEST(FrontendHostile, LargePadAndTileThatFitBuild) {
  ModelProto m = one_node("Pad", {"x", "p"}, {int64_tensor("p", {4}, {0, int64_t(1) << 40, 0, 1})});
  auto engine = parse_and_build(m);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto shape = engine->tensor_shape("y");
  ASSERT_TRUE(shape.ok()) << shape.status().to_string();
  EXPECT_EQ(*shape, (Shape{3, 4 + (int64_t(1) << 40) + 1}));
  ModelProto t = one_node("Tile", {"x", "r"}, {int64_tensor("r", {2}, {int64_t(1) << 40, 2})});
  auto tiled = parse_and_build(t);
  ASSERT_TRUE(tiled.ok()) << tiled.status().to_string();
  auto tshape = tiled->tensor_shape("y");
  ASSERT_TRUE(tshape.ok()) << tshape.status().to_string();
  EXPECT_EQ(*tshape, (Shape{3 * (int64_t(1) << 40), 8}));
}

TEST(FrontendHostile, EveryCaseIsATypedErrorNamingTheProblem) {
  for (const HostileCase& c : hostile_cases()) {
    SCOPED_TRACE(c.name);
    auto engine = parse_and_build(c.make());
    expect_error(engine.status(), c.code, c.phrases);
  }
}

// An omitted input ("") in a position the schema requires is refused for every registered ai.onnx
// op before its inference runs (inference reads required inputs without checking them).
TEST(FrontendHostile, OmittedRequiredInputOfEveryOp) {
  int checked = 0;
  for (int k = 1;; ++k) {
    const auto kind = ops::OpKind(k);
    if (!ops::op_domain(kind).empty()) break;  // the ai.onnx ops come first
    const ops::OpSchema* schema = ops::op_registry().find(kind);
    if (!schema || schema->min_inputs == 0) continue;
    const std::string op(ops::op_name(kind));
    for (int omitted = 0; omitted < schema->min_inputs; ++omitted) {
      SCOPED_TRACE(op + " without input " + std::to_string(omitted));
      std::vector<std::string> inputs(size_t(schema->min_inputs), "x");
      inputs[size_t(omitted)] = "";
      std::vector<std::string> outputs;
      for (int o = 0; o < schema->min_outputs; ++o) outputs.push_back("y" + std::to_string(o));
      ModelProto m = make_model();
      add_input(m.mutable_graph(), "x", TensorProto::FLOAT, {"2", "3"});
      add_node(m.mutable_graph(), op, inputs, outputs, "victim");
      add_output(m.mutable_graph(), "y0");
      auto engine = parse_and_build(m);
      expect_error(engine.status(), StatusCode::kInvalidModel,
                   {"victim", "input " + std::to_string(omitted), "omitted", "required"});
    }
    ++checked;
  }
  // Enough ops to be a census, not a sample: more than 100 ai.onnx ops have schemas.
  EXPECT_GE(checked, 100);
}

// Inputs past the required ones omitted, for every op kiln knows, kiln's own domain included (a
// model may name them: kiln::SelectBranch's inference read input -1 so, issue 41 class 4): each
// build ends in an engine or a clean error, never a crash (CI runs this under ASan+UBSan), and an
// op whose inputs are all required (OpTraits::inputs_required) names the omitted one.
TEST(FrontendHostile, OmittedOptionalPositionsOfEveryOpIncludingKilns) {
  int checked = 0;
  for (int k = 1;; ++k) {
    const auto kind = ops::OpKind(k);
    if (ops::op_name(kind) == "Unknown") break;  // past the last op
    const ops::OpSchema* schema = ops::op_registry().find(kind);
    if (!schema) continue;
    const std::string op(ops::op_name(kind)), domain(ops::op_domain(kind));
    const int last = std::min(schema->max_inputs, schema->min_inputs + 3);
    for (int omitted = std::max(schema->min_inputs, 1); omitted < last; ++omitted) {
      SCOPED_TRACE(domain + "::" + op + " without input " + std::to_string(omitted));
      std::vector<std::string> inputs(size_t(omitted + 1), "x");
      inputs[size_t(omitted)] = "";
      std::vector<std::string> outputs;
      for (int o = 0; o < std::max(schema->min_outputs, 1); ++o)
        outputs.push_back("y" + std::to_string(o));
      ModelProto m = make_model(23);
      if (!domain.empty()) {
        auto* imp = m.add_opset_import();
        imp->set_domain(domain);
        imp->set_version(1);
      }
      add_input(m.mutable_graph(), "x", TensorProto::FLOAT, {"2", "3"});
      add_node(m.mutable_graph(), op, inputs, outputs, "victim")->set_domain(domain);
      add_output(m.mutable_graph(), "y0");
      auto engine = parse_and_build(m);
      if (schema->traits.inputs_required) {
        expect_error(engine.status(), StatusCode::kInvalidModel,
                     {"victim", "input " + std::to_string(omitted), "omitted"});
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 100);
}

// A [2^40, 1] input is a valid static shape: the checks must not refuse it, and folding must not
// materialize the 4 TiB ConstantOfShape of its shape at build time.
TEST(FrontendHostile, HugeButValidShapesBuildWithoutMaterializing) {
  ModelProto m = make_model();
  GraphProto* g = m.mutable_graph();
  add_input(g, "x", TensorProto::FLOAT, {std::to_string(int64_t(1) << 40), "1"});
  add_node(g, "Shape", {"x"}, {"s"});
  add_node(g, "ConstantOfShape", {"s"}, {"c"});
  add_node(g, "Add", {"x", "c"}, {"y"});
  add_output(g, "y");
  auto net = parse(m);
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  auto engine = Builder().build(*net, BuilderConfig());
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto shape = engine->tensor_shape("y");
  ASSERT_TRUE(shape.ok()) << shape.status().to_string();
  EXPECT_EQ(*shape, (Shape{int64_t(1) << 40, 1}));
}

// INT64_MIN and INT64_MAX starts and ends are valid ONNX ("from the very end"): the range checks
// must clamp them to the axis, forward on axis 0 and backward on axis 1, not refuse them.
TEST(FrontendHostile, SliceWithExtremeStartsAndEndsClamps) {
  ModelProto m =
      one_node("Slice", {"x", "s", "e", "a", "st"},
               {int64_tensor("s", {2}, {kMin64, kMax64}), int64_tensor("e", {2}, {kMax64, kMin64}),
                int64_tensor("a", {2}, {0, 1}), int64_tensor("st", {2}, {1, -1})});
  auto engine = parse_and_build(m);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto shape = engine->tensor_shape("y");
  ASSERT_TRUE(shape.ok()) << shape.status().to_string();
  EXPECT_EQ(*shape, (Shape{3, 4}));
  std::vector<float> x(12);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  auto out = (*ctx)->run({{"x", Tensor::from_vector<float>(DType::kFloat32, {3, 4}, x)}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const float* y = out->at("y").data_as<float>();
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 4; ++c) EXPECT_EQ(y[r * 4 + c], x[size_t(r * 4 + 3 - c)]) << r << "," << c;
  }
}

}  // namespace
}  // namespace kiln
