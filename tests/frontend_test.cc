// ONNX frontend: ModelProtos built in C++ (tensors, dims, Constant folding, attributes, external
// data confinement, hostile bytes) and, where /work/shared/models exists, the real test models.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kiln.h"
#include "model_util.h"
#include "onnx_model_builder.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using ::onnx::AttributeProto;
using ::onnx::GraphProto;
using ::onnx::ModelProto;
using ::onnx::NodeProto;
using ::onnx::TensorProto;

using testing::add_input;
using testing::add_node;
using testing::add_output;
using testing::make_model;
using testing::parse;
using testing::raw_tensor;
using testing::serialize;

const ir::Value& value(const Network& net, const std::string& name) {
  int v = net.graph.find_value(name);
  EXPECT_GE(v, 0) << name;
  return net.graph.values.at(v >= 0 ? v : 0);
}

template <typename T>
std::vector<T> contents(const Tensor& t) {
  return std::vector<T>(t.data_as<T>(), t.data_as<T>() + t.numel());
}

// A one-initializer model whose output is the initializer itself.
ModelProto model_with_initializer(const TensorProto& t) {
  ModelProto m = make_model();
  *m.mutable_graph()->add_initializer() = t;
  add_output(m.mutable_graph(), t.name(), t.data_type());
  return m;
}

TEST(Frontend, InitializerFromRawData) {
  ModelProto m = make_model();
  auto* g = m.mutable_graph();
  *g->add_initializer() = raw_tensor<float>("w", TensorProto::FLOAT, {2, 3}, {1, 2, 3, 4, 5, -6});
  *g->add_initializer() = raw_tensor<int64_t>("shape", TensorProto::INT64, {2}, {-1, 1LL << 40});
  *g->add_initializer() = raw_tensor<uint16_t>("h", TensorProto::FLOAT16, {2}, {0x3C00, 0xC000});
  *g->add_initializer() = raw_tensor<float>("scalar", TensorProto::FLOAT, {}, {2.5f});
  add_output(g, "w");
  std::vector<uint8_t> bytes = serialize(m);
  auto net = onnx::parse_bytes(bytes, "");
  ASSERT_TRUE(net.ok()) << net.status().to_string();

  uint64_t h = 14695981039346656037ull;
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  EXPECT_EQ(net->model_hash, h);
  EXPECT_EQ(net->ir_version, 8);
  EXPECT_EQ(net->producer, "kiln_test");
  EXPECT_EQ(net->graph.opsets.at(""), 18);
  EXPECT_TRUE(net->graph.inputs.empty());

  const ir::Value& w = value(*net, "w");
  ASSERT_TRUE(w.constant.has_value());
  EXPECT_EQ(w.dtype, DType::kFloat32);
  EXPECT_EQ(*w.shape, (std::vector<ir::Dim>{2, 3}));
  EXPECT_EQ(contents<float>(*w.constant), (std::vector<float>{1, 2, 3, 4, 5, -6}));
  EXPECT_EQ(contents<int64_t>(*value(*net, "shape").constant),
            (std::vector<int64_t>{-1, 1LL << 40}));
  const Tensor& half = *value(*net, "h").constant;
  EXPECT_EQ(half.dtype(), DType::kFloat16);
  EXPECT_EQ(half.float_at(0), 1.0);
  EXPECT_EQ(half.float_at(1), -2.0);
  const ir::Value& s = value(*net, "scalar");
  EXPECT_EQ(s.shape->size(), 0u);
  EXPECT_EQ(s.constant->float_at(0), 2.5);
  // The output keeps the constant's shape; nothing else is inferred here.
  ASSERT_EQ(net->graph.outputs.size(), 1u);
  EXPECT_EQ(net->graph.values[net->graph.outputs[0]].name, "w");
}

TEST(Frontend, InitializerFromTypedFields) {
  ModelProto m = make_model();
  auto* g = m.mutable_graph();
  auto add = [&](const std::string& name, int dtype, std::vector<int64_t> dims) {
    TensorProto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(dtype);
    for (int64_t d : dims) t->add_dims(d);
    return t;
  };
  auto* f = add("f", TensorProto::FLOAT, {3});
  for (float v : {1.5f, -2.0f, 3.25f}) f->add_float_data(v);
  auto* i8 = add("i8", TensorProto::INT8, {3});
  for (int v : {-3, 0, 127}) i8->add_int32_data(v);
  auto* u8 = add("u8", TensorProto::UINT8, {2});
  for (int v : {200, 7}) u8->add_int32_data(v);
  auto* i16 = add("i16", TensorProto::INT16, {2});
  for (int v : {-300, 300}) i16->add_int32_data(v);
  auto* b = add("b", TensorProto::BOOL, {3});
  for (int v : {1, 0, 1}) b->add_int32_data(v);
  auto* f16 = add("f16", TensorProto::FLOAT16, {2});
  for (int v : {0x3C00, 0x3800}) f16->add_int32_data(v);  // 1.0, 0.5
  auto* bf = add("bf", TensorProto::BFLOAT16, {1});
  bf->add_int32_data(0x4040);  // 3.0
  auto* i64 = add("i64", TensorProto::INT64, {2, 1});
  for (int64_t v : {int64_t(-5), int64_t(1) << 50}) i64->add_int64_data(v);
  auto* d = add("d", TensorProto::DOUBLE, {1});
  d->add_double_data(0.125);
  auto* u32 = add("u32", TensorProto::UINT32, {1});
  u32->add_uint64_data(4000000000u);
  auto* u64 = add("u64", TensorProto::UINT64, {1});
  u64->add_uint64_data(18000000000000000000ull);
  add("empty", TensorProto::FLOAT, {0, 4});
  add_output(g, "f");

  auto net = parse(m);
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  EXPECT_EQ(contents<float>(*value(*net, "f").constant), (std::vector<float>{1.5f, -2.0f, 3.25f}));
  EXPECT_EQ(contents<int8_t>(*value(*net, "i8").constant), (std::vector<int8_t>{-3, 0, 127}));
  EXPECT_EQ(contents<uint8_t>(*value(*net, "u8").constant), (std::vector<uint8_t>{200, 7}));
  EXPECT_EQ(contents<int16_t>(*value(*net, "i16").constant), (std::vector<int16_t>{-300, 300}));
  EXPECT_EQ(contents<uint8_t>(*value(*net, "b").constant), (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(value(*net, "f16").constant->float_at(1), 0.5);
  EXPECT_EQ(value(*net, "bf").constant->float_at(0), 3.0);
  EXPECT_EQ(value(*net, "bf").dtype, DType::kBFloat16);
  EXPECT_EQ(contents<int64_t>(*value(*net, "i64").constant),
            (std::vector<int64_t>{-5, int64_t(1) << 50}));
  EXPECT_EQ(*value(*net, "i64").shape, (std::vector<ir::Dim>{2, 1}));
  EXPECT_EQ(contents<double>(*value(*net, "d").constant), (std::vector<double>{0.125}));
  EXPECT_EQ(contents<uint32_t>(*value(*net, "u32").constant), (std::vector<uint32_t>{4000000000u}));
  EXPECT_EQ(contents<uint64_t>(*value(*net, "u64").constant),
            (std::vector<uint64_t>{18000000000000000000ull}));
  EXPECT_EQ(value(*net, "empty").constant->numel(), 0);
}

TEST(Frontend, BadTensorsAreRefusedWithNames) {
  auto expect = [](const TensorProto& t, StatusCode code, std::vector<std::string> words) {
    auto net = parse(model_with_initializer(t));
    ASSERT_FALSE(net.ok());
    EXPECT_EQ(net.status().code(), code) << net.status().to_string();
    for (const auto& w : words) {
      EXPECT_NE(net.status().message().find(w), std::string::npos)
          << "'" << w << "' not in: " << net.status().message();
    }
  };
  TensorProto short_raw = raw_tensor<float>("w_short", TensorProto::FLOAT, {2}, {1});
  short_raw.mutable_raw_data()->push_back('x');  // 5 bytes for a float[2]
  expect(short_raw, StatusCode::kInvalidModel, {"w_short", "5 bytes", "8 bytes"});

  TensorProto few;
  few.set_name("w_few");
  few.set_data_type(TensorProto::FLOAT);
  few.add_dims(2);
  for (float v : {1.f, 2.f, 3.f}) few.add_float_data(v);
  expect(few, StatusCode::kInvalidModel, {"w_few", "3 elements", "2"});

  TensorProto wrong_field;
  wrong_field.set_name("w_field");
  wrong_field.set_data_type(TensorProto::FLOAT);
  wrong_field.add_dims(1);
  wrong_field.add_int64_data(1);
  expect(wrong_field, StatusCode::kInvalidModel, {"w_field", "int64_data"});

  TensorProto negative = raw_tensor<float>("w_neg", TensorProto::FLOAT, {-1}, {});
  expect(negative, StatusCode::kInvalidModel, {"w_neg", "negative"});

  TensorProto huge =
      raw_tensor<float>("w_huge", TensorProto::FLOAT, {int64_t(1) << 40, int64_t(1) << 40}, {});
  expect(huge, StatusCode::kInvalidModel, {"w_huge", "overflows"});

  TensorProto str;
  str.set_name("w_str");
  str.set_data_type(TensorProto::STRING);
  str.add_string_data("hello");
  expect(str, StatusCode::kUnsupported, {"w_str", "string"});

  TensorProto fp8 = raw_tensor<uint8_t>("w_fp8", TensorProto::FLOAT8E4M3FN, {1}, {0});
  expect(fp8, StatusCode::kUnsupported, {"w_fp8", "float8e4m3fn"});

  TensorProto cplx = raw_tensor<float>("w_c", TensorProto::COMPLEX64, {1}, {1, 2});
  expect(cplx, StatusCode::kUnsupported, {"w_c", "complex64"});
}

TEST(Frontend, DimParamsParseOrBecomeFreshSymbols) {
  ModelProto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x", TensorProto::FLOAT, {"batch", "4*h", "seq_len + 1", "weird name!", "", "7"});
  add_input(g, "y", TensorProto::INT64, {"weird name!", "batch"});
  add_node(g, "Relu", {"x"}, {"r"});
  add_output(g, "r");
  auto net = parse(m);
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  ASSERT_EQ(net->graph.inputs.size(), 2u);
  const ir::Value& x = net->graph.values[net->graph.inputs[0]];
  EXPECT_EQ(x.name, "x");
  EXPECT_EQ(x.dtype, DType::kFloat32);
  ASSERT_TRUE(x.shape.has_value());
  ASSERT_EQ(x.shape->size(), 6u);
  const auto& d = *x.shape;
  EXPECT_EQ(d[0], ir::Dim::symbol("batch"));
  EXPECT_EQ(d[1], ir::Dim(4) * ir::Dim::symbol("h"));
  EXPECT_EQ(d[2], ir::Dim::symbol("seq_len") + 1);
  EXPECT_EQ(d[3], ir::Dim::symbol("weird_name_"));
  EXPECT_EQ(d[4], ir::Dim::symbol("x_d4"));
  EXPECT_EQ(d[5], ir::Dim(7));
  // The same dim_param text names the same dimension across inputs.
  const ir::Value& y = net->graph.values[net->graph.inputs[1]];
  EXPECT_EQ(y.dtype, DType::kInt64);
  EXPECT_EQ((*y.shape)[0], d[3]);
  EXPECT_EQ((*y.shape)[1], d[0]);
  // Graph output shapes are left to the builder.
  const ir::Value& r = value(*net, "r");
  EXPECT_EQ(r.dtype, DType::kFloat32);
  EXPECT_FALSE(r.shape.has_value());
  ASSERT_EQ(net->graph.nodes.size(), 1u);
  EXPECT_EQ(net->graph.nodes[0].name, "Relu_0");

  ModelProto neg = make_model();
  add_input(neg.mutable_graph(), "x", TensorProto::FLOAT, {"2"});
  neg.mutable_graph()
      ->mutable_input(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim(0)
      ->set_dim_value(-3);
  add_output(neg.mutable_graph(), "x");
  auto bad = parse(neg);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'x'"), std::string::npos) << bad.status().message();

  ModelProto seq = make_model();
  auto* vi = seq.mutable_graph()->add_input();
  vi->set_name("s");
  vi->mutable_type()
      ->mutable_sequence_type()
      ->mutable_elem_type()
      ->mutable_tensor_type()
      ->set_elem_type(TensorProto::FLOAT);
  add_output(seq.mutable_graph(), "s");
  // A sequence of tensors parses, its kind recorded (the build lays it out: builder/sequences.cc).
  auto parsed = parse(seq);
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(value(*parsed, "s").kind, ir::ValueKind::kSequence);
  EXPECT_EQ(value(*parsed, "s").dtype, DType::kFloat32);
  // A map is refused by name.
  ModelProto map = make_model();
  auto* mvi = map.mutable_graph()->add_input();
  mvi->set_name("m");
  auto* mt = mvi->mutable_type()->mutable_map_type();
  mt->set_key_type(TensorProto::INT64);
  mt->mutable_value_type()->mutable_tensor_type()->set_elem_type(TensorProto::FLOAT);
  add_output(map.mutable_graph(), "m");
  auto unsup = parse(map);
  ASSERT_FALSE(unsup.ok());
  EXPECT_EQ(unsup.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(unsup.status().message().find("'m'"), std::string::npos);
  EXPECT_NE(unsup.status().message().find("map"), std::string::npos);
}

TEST(Frontend, ConstantNodesFoldIntoValues) {
  ModelProto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x", TensorProto::FLOAT, {"2"});
  auto* c = add_node(g, "Constant", {}, {"c"});
  auto* a = c->add_attribute();
  a->set_name("value");
  a->set_type(AttributeProto::TENSOR);
  *a->mutable_t() = raw_tensor<float>("", TensorProto::FLOAT, {2}, {10, 20});
  auto* k = add_node(g, "Constant", {}, {"k"});
  k->set_domain("ai.onnx");
  a = k->add_attribute();
  a->set_name("value_ints");
  a->set_type(AttributeProto::INTS);
  a->add_ints(3);
  a->add_ints(-4);
  auto* s = add_node(g, "Constant", {}, {"s"});
  a = s->add_attribute();
  a->set_name("value_float");
  a->set_type(AttributeProto::FLOAT);
  a->set_f(0.5f);
  // Used before its Constant appears: the frontend sorts nodes itself.
  add_node(g, "Add", {"x", "c"}, {"y"}, "add");
  add_node(g, "Mul", {"y", "s"}, {"z"}, "mul");
  add_output(g, "z");
  auto net = parse(m);
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  ASSERT_EQ(net->graph.nodes.size(), 2u);
  EXPECT_EQ(net->graph.nodes[0].name, "add");
  EXPECT_EQ(net->graph.nodes[1].name, "mul");
  const ir::Value& cv = value(*net, "c");
  ASSERT_TRUE(cv.constant.has_value());
  EXPECT_EQ(contents<float>(*cv.constant), (std::vector<float>{10, 20}));
  EXPECT_EQ(cv.producer, -1);
  const ir::Value& kv = value(*net, "k");
  EXPECT_EQ(kv.dtype, DType::kInt64);
  EXPECT_EQ(contents<int64_t>(*kv.constant), (std::vector<int64_t>{3, -4}));
  EXPECT_EQ(*kv.shape, (std::vector<ir::Dim>{2}));
  const ir::Value& sv = value(*net, "s");
  EXPECT_EQ(sv.shape->size(), 0u);
  EXPECT_EQ(sv.constant->float_at(0), 0.5);

  ModelProto str = make_model();
  a = add_node(str.mutable_graph(), "Constant", {}, {"t"}, "cs")->add_attribute();
  a->set_name("value_string");
  a->set_type(AttributeProto::STRING);
  a->set_s("hi");
  add_output(str.mutable_graph(), "t");
  auto bad = parse(str);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(bad.status().message().find("cs"), std::string::npos);
}

TEST(Frontend, AttributeTypes) {
  ModelProto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x", TensorProto::FLOAT, {"n"});
  auto* n = add_node(g, "Custom", {"x", ""}, {"y", ""}, "custom");
  auto attr = [&](const std::string& name, AttributeProto::AttributeType type) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(type);
    return a;
  };
  attr("f", AttributeProto::FLOAT)->set_f(1.25f);
  attr("i", AttributeProto::INT)->set_i(-7);
  attr("s", AttributeProto::STRING)->set_s("linear");
  *attr("t", AttributeProto::TENSOR)->mutable_t() =
      raw_tensor<int64_t>("", TensorProto::INT64, {3}, {1, 2, 3});
  auto* floats = attr("floats", AttributeProto::FLOATS);
  floats->add_floats(0.5f);
  floats->add_floats(-1.f);
  auto* ints = attr("ints", AttributeProto::INTS);
  for (int v : {4, 5, 6}) ints->add_ints(v);
  auto* strings = attr("strings", AttributeProto::STRINGS);
  strings->add_strings("a");
  strings->add_strings("b");
  auto* tensors = attr("tensors", AttributeProto::TENSORS);
  *tensors->add_tensors() = raw_tensor<float>("", TensorProto::FLOAT, {1}, {9});
  *tensors->add_tensors() = raw_tensor<float>("", TensorProto::FLOAT, {2}, {7, 8});
  // A body that reads `x` from the enclosing graph.
  GraphProto* body = attr("g", AttributeProto::GRAPH)->mutable_g();
  body->set_name("body");
  add_input(body, "i", TensorProto::INT64, {});
  add_node(body, "Add", {"x", "i"}, {"o"});
  add_output(body, "o");
  auto* graphs = attr("graphs", AttributeProto::GRAPHS);
  for (int k = 0; k < 2; ++k) {
    GraphProto* b = graphs->add_graphs();
    b->set_name("branch" + std::to_string(k));
    add_output(b, "x");  // an outer value returned directly
  }
  auto* untyped = n->add_attribute();  // old writers left `type` unset
  untyped->set_name("legacy");
  untyped->set_i(3);
  add_output(g, "y");

  auto net = parse(m);
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  ASSERT_EQ(net->graph.nodes.size(), 1u);
  const ir::Node& node = net->graph.nodes[0];
  EXPECT_EQ(node.opset, 18);
  ASSERT_EQ(node.inputs.size(), 2u);
  EXPECT_EQ(node.inputs[1], -1);
  ASSERT_EQ(node.outputs.size(), 2u);
  EXPECT_EQ(node.outputs[1], -1);
  const auto& at = node.attrs;
  EXPECT_EQ(at.get_float("f", std::nullopt).value(), 1.25f);
  EXPECT_EQ(at.get_int("i", std::nullopt).value(), -7);
  EXPECT_EQ(at.get_string("s", std::nullopt).value(), "linear");
  EXPECT_EQ(contents<int64_t>(at.get_tensor("t").value()), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(at.get_floats("floats", std::nullopt).value(), (std::vector<float>{0.5f, -1.f}));
  EXPECT_EQ(at.get_ints("ints", std::nullopt).value(), (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(at.find("strings")->strings, (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(at.find("tensors")->tensors.size(), 2u);
  EXPECT_EQ(contents<float>(at.find("tensors")->tensors[1]), (std::vector<float>{7, 8}));
  EXPECT_EQ(at.get_int("legacy", std::nullopt).value(), 3);

  const ir::Attribute* ga = at.find("g");
  ASSERT_TRUE(ga && ga->type == ir::AttrType::kGraph && ga->g);
  const ir::Graph& sub = *ga->g;
  EXPECT_EQ(sub.name, "body");
  ASSERT_EQ(sub.inputs.size(), 1u);  // `x` is an outer name, not a subgraph input
  EXPECT_EQ(sub.values[sub.inputs[0]].name, "i");
  ASSERT_EQ(sub.nodes.size(), 1u);
  EXPECT_EQ(sub.nodes[0].op_type, "Add");
  EXPECT_EQ(sub.values[sub.nodes[0].inputs[0]].name, "x");
  EXPECT_EQ(sub.values[sub.outputs[0]].name, "o");
  const ir::Attribute* gs = at.find("graphs");
  ASSERT_TRUE(gs && gs->type == ir::AttrType::kGraphs);
  ASSERT_EQ(gs->graphs.size(), 2u);
  EXPECT_EQ(gs->graphs[1]->name, "branch1");
  EXPECT_EQ(gs->graphs[1]->values[gs->graphs[1]->outputs[0]].name, "x");

  // A subgraph may not read a name no enclosing graph defines.
  ModelProto ghost = m;
  auto* ghost_body = ghost.mutable_graph()->mutable_node(0)->mutable_attribute(8)->mutable_g();
  ASSERT_EQ(ghost.graph().node(0).attribute(8).name(), "g");
  ghost_body->mutable_node(0)->set_input(0, "phantom");
  auto bad = parse(ghost);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("phantom"), std::string::npos) << bad.status().message();

  ModelProto sparse = m;
  auto* sp = sparse.mutable_graph()->mutable_node(0)->add_attribute();
  sp->set_name("sp");
  sp->set_type(AttributeProto::SPARSE_TENSOR);
  auto r = parse(sparse);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status().message().find("sp"), std::string::npos);

  ModelProto ref = m;
  auto* ra = ref.mutable_graph()->mutable_node(0)->add_attribute();
  ra->set_name("alpha");
  ra->set_type(AttributeProto::FLOAT);
  ra->set_ref_attr_name("outer_alpha");
  r = parse(ref);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
}

class FrontendExternal : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("kiln_fe_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    dir_ = root_ / "model";
    fs::create_directories(dir_);
    // 16 bytes of padding, then float[4].
    std::vector<float> pad = {-1, -1, -1, -1};
    write(dir_ / "weights.bin", pad, weights_);
    write(root_ / "outside.bin", weights_, {});
  }
  void TearDown() override { fs::remove_all(root_); }

  static void write(const fs::path& p, const std::vector<float>& a, const std::vector<float>& b) {
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(a.data()), a.size() * 4);
    out.write(reinterpret_cast<const char*>(b.data()), b.size() * 4);
  }

  ModelProto model(const std::string& location, int64_t offset, int64_t length) {
    TensorProto t;
    t.set_name("w_ext");
    t.set_data_type(TensorProto::FLOAT);
    t.add_dims(4);
    t.set_data_location(TensorProto::EXTERNAL);
    auto kv = [&](const std::string& k, const std::string& v) {
      auto* e = t.add_external_data();
      e->set_key(k);
      e->set_value(v);
    };
    kv("location", location);
    if (offset >= 0) kv("offset", std::to_string(offset));
    if (length >= 0) kv("length", std::to_string(length));
    return model_with_initializer(t);
  }

  StatusOr<Network> parse_in_dir(const ModelProto& m) {
    fs::path p = dir_ / "model.onnx";
    std::string s = m.SerializeAsString();
    std::ofstream(p, std::ios::binary).write(s.data(), std::streamsize(s.size()));
    return onnx::parse_file(p.string());
  }

  void expect_refused(const ModelProto& m, const std::string& path_text) {
    auto net = parse_in_dir(m);
    ASSERT_FALSE(net.ok()) << path_text;
    EXPECT_NE(net.status().message().find(path_text), std::string::npos) << net.status().message();
    EXPECT_NE(net.status().message().find("w_ext"), std::string::npos) << net.status().message();
  }

  fs::path root_, dir_;
  std::vector<float> weights_ = {1.5f, 2.5f, -3.f, 4.f};
};

TEST_F(FrontendExternal, ReadsDataInsideTheModelFolder) {
  auto net = parse_in_dir(model("weights.bin", 16, 16));
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  EXPECT_EQ(net->path, (dir_ / "model.onnx").string());
  EXPECT_EQ(contents<float>(*value(*net, "w_ext").constant), weights_);
  // No length: the rest of the file.
  net = parse_in_dir(model("weights.bin", 16, -1));
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  EXPECT_EQ(contents<float>(*value(*net, "w_ext").constant), weights_);
  // From memory there is no folder to read from.
  auto mem = parse(model("weights.bin", 16, 16));
  ASSERT_FALSE(mem.ok());
  EXPECT_NE(mem.status().message().find("weights.bin"), std::string::npos);
}

TEST_F(FrontendExternal, RefusesPathsThatLeaveTheFolder) {
  expect_refused(model("../outside.bin", 0, 16), "../outside.bin");
  expect_refused(model("/etc/passwd", 0, 16), "/etc/passwd");
  fs::create_symlink(root_ / "outside.bin", dir_ / "link.bin");
  expect_refused(model("link.bin", 0, 16), "link.bin");
  fs::create_directories(dir_ / "sub");
  fs::create_directory_symlink(root_, dir_ / "sub" / "up");
  expect_refused(model("sub/up/outside.bin", 0, 16), "sub/up/outside.bin");
}

TEST_F(FrontendExternal, RefusesRangesPastTheFile) {
  expect_refused(model("weights.bin", 16, 32), "weights.bin");
  expect_refused(model("weights.bin", 64, 16), "weights.bin");
  expect_refused(model("weights.bin", 16, 8),
                 "weights.bin");  // in range, but not the tensor's size
  expect_refused(model("weights.bin", 24, -1), "weights.bin");  // the rest of the file is too short
  expect_refused(model("missing.bin", 0, 16), "missing.bin");
}

// Found by tests/fuzz/tensor_file_fuzz (corpus/tensor_file_fuzz/regress_external_*): an 80-byte
// .pb declaring external data of a huge shape made the reader allocate the whole tensor before it
// looked at the location, so a few bytes could demand terabytes. The checks now come first.
TEST_F(FrontendExternal, HugeExternalTensorsAreRefusedBeforeAllocating) {
  TensorProto t;
  t.set_name("w_huge");
  t.set_data_type(TensorProto::FLOAT);
  t.add_dims(int64_t(1) << 40);
  t.set_data_location(TensorProto::EXTERNAL);
  auto* e = t.add_external_data();
  e->set_key("location");
  e->set_value("weights.bin");
  const std::string bytes = t.SerializeAsString();
  auto mem = onnx::tensor_from_bytes(
      std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  ASSERT_FALSE(mem.ok());
  EXPECT_EQ(mem.status().code(), StatusCode::kInvalidArgument) << mem.status().to_string();
  EXPECT_NE(mem.status().message().find("loaded from memory"), std::string::npos)
      << mem.status().message();
  const fs::path pb = dir_ / "huge.pb";
  std::ofstream(pb, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  auto file = onnx::parse_tensor_file(pb.string());
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidModel) << file.status().to_string();
  EXPECT_NE(
      file.status().message().find("holds 32 bytes, but the tensor needs 4398046511104 bytes"),
      std::string::npos)
      << file.status().message();
}

TEST(Frontend, GarbageBytesAreInvalidModels) {
  ModelProto m = make_model();
  *m.mutable_graph()->add_initializer() =
      raw_tensor<float>("w", TensorProto::FLOAT, {64}, std::vector<float>(64, 1.f));
  add_output(m.mutable_graph(), "w");
  std::vector<uint8_t> bytes = serialize(m);
  ASSERT_TRUE(onnx::parse_bytes(bytes, "").ok());
  for (size_t cut : {bytes.size() / 2, bytes.size() - 3, size_t(5)}) {
    auto r = onnx::parse_bytes(std::span(bytes.data(), cut), "");
    ASSERT_FALSE(r.ok()) << cut;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidModel) << r.status().to_string();
  }
  std::vector<uint8_t> garbage = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x34, 0x56};
  auto r = onnx::parse_bytes(garbage, "");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidModel);
  EXPECT_NE(r.status().message().find("not a valid ONNX ModelProto"), std::string::npos);
  r = onnx::parse_bytes({}, "");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidModel);
  auto missing = onnx::parse_file("/nonexistent/kiln/model.onnx");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/kiln/model.onnx"), std::string::npos);
}

TEST(Frontend, CyclesAndDoubleDefinitionsAreErrors) {
  ModelProto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x", TensorProto::FLOAT, {"1"});
  add_node(g, "Add", {"x", "b"}, {"a"}, "first");
  add_node(g, "Relu", {"a"}, {"b"}, "second");
  add_output(g, "b");
  auto r = parse(m);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidModel);
  EXPECT_NE(r.status().message().find("cycle"), std::string::npos) << r.status().message();

  ModelProto twice = make_model();
  g = twice.mutable_graph();
  add_input(g, "x", TensorProto::FLOAT, {"1"});
  add_node(g, "Relu", {"x"}, {"y"}, "r1");
  add_node(g, "Relu", {"x"}, {"y"}, "r2");
  add_output(g, "y");
  r = parse(twice);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'y'"), std::string::npos) << r.status().message();
}

TEST(Frontend, UndefinedInputIsNamed) {
  ModelProto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x", TensorProto::FLOAT, {"1"});
  add_node(g, "Add", {"x", "ghost"}, {"y"}, "adder");
  add_output(g, "y");
  auto r = parse(m);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidModel);
  EXPECT_NE(r.status().message().find("ghost"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("adder"), std::string::npos) << r.status().message();

  ModelProto no_out = make_model();
  add_input(no_out.mutable_graph(), "x", TensorProto::FLOAT, {"1"});
  add_output(no_out.mutable_graph(), "nowhere");
  r = parse(no_out);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nowhere"), std::string::npos);
}

// Opset 6 (PyTorch's first exporter): `broadcast=1, axis=k` aligns input 1 with input 0 from dim
// k, and PRelu's [C] slope is per channel; kiln follows both for constants, and refuses the
// training-mode BatchNormalization that is_test's default asks for.
TEST(Frontend, Opset6BroadcastAxisAndPerChannelSlope) {
  ModelProto m = make_model(6);
  GraphProto* g = m.mutable_graph();
  add_input(g, "x", TensorProto::FLOAT, {"2", "3", "2"});
  *g->add_initializer() = raw_tensor<float>("c", TensorProto::FLOAT, {3}, {10, 20, 30});
  *g->add_initializer() = raw_tensor<float>("slope", TensorProto::FLOAT, {3}, {0.5f, 2, -1});
  NodeProto* add = add_node(g, "Add", {"x", "c"}, {"y"}, "add");
  auto* a = add->add_attribute();
  a->set_name("broadcast"), a->set_type(::onnx::AttributeProto::INT), a->set_i(1);
  a = add->add_attribute();
  a->set_name("axis"), a->set_type(::onnx::AttributeProto::INT), a->set_i(1);
  add_node(g, "PRelu", {"x", "slope"}, {"z"}, "prelu");
  add_output(g, "y");
  add_output(g, "z");
  auto net = parse(m);
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  BuilderConfig config;
  auto engine = Builder().build(*net, config);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  std::vector<float> xs(12);
  for (int i = 0; i < 12; ++i) xs[size_t(i)] = float(i % 5) - 2.f;  // -2..2
  auto out = (*ctx)->run({{"x", testing::make_f32({2, 3, 2}, xs)}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const float c[3] = {10, 20, 30}, slope[3] = {0.5f, 2, -1};
  for (int i = 0; i < 12; ++i) {
    const int ch = i / 2 % 3;  // dim 1 of [2, 3, 2]
    EXPECT_EQ(out->at("y").data_as<float>()[i], xs[size_t(i)] + c[ch]) << i;
    EXPECT_EQ(out->at("z").data_as<float>()[i],
              xs[size_t(i)] >= 0 ? xs[size_t(i)] : xs[size_t(i)] * slope[ch])
        << i;
  }

  ModelProto bn = make_model(6);
  g = bn.mutable_graph();
  add_input(g, "x", TensorProto::FLOAT, {"1", "3", "2"});
  for (const char* w : {"s", "b", "mean", "var"}) {
    *g->add_initializer() = raw_tensor<float>(w, TensorProto::FLOAT, {3}, {1, 1, 1});
  }
  add_node(g, "BatchNormalization", {"x", "s", "b", "mean", "var"}, {"y"}, "bn");
  add_output(g, "y");
  net = parse(bn);
  ASSERT_TRUE(net.ok()) << net.status().to_string();
  auto refused = Builder().build(*net, config);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("without is_test=1 runs in training mode"),
            std::string::npos)
      << refused.status().message();
}

// Upsample (opsets 7-9) reads as Resize-10: nearest 2x of a 2x2 input, the scales an attribute
// (opset 7) or an input (opset 9), on the CPU and, where present, on CUDA.
TEST(Frontend, UpsampleRunsAsResize) {
  for (int64_t opset : {7, 9}) {
    ModelProto m = make_model(opset);
    GraphProto* g = m.mutable_graph();
    add_input(g, "x", TensorProto::FLOAT, {"1", "1", "2", "2"});
    NodeProto* up = add_node(g, "Upsample", {"x"}, {"y"}, "up");
    if (opset == 7) {
      auto* a = up->add_attribute();
      a->set_name("scales"), a->set_type(::onnx::AttributeProto::FLOATS);
      for (float f : {1.f, 1.f, 2.f, 2.f}) a->add_floats(f);
    } else {
      *g->add_initializer() = raw_tensor<float>("scales", TensorProto::FLOAT, {4}, {1, 1, 2, 2});
      up->add_input("scales");
    }
    add_output(g, "y");
    auto net = parse(m);
    ASSERT_TRUE(net.ok()) << net.status().to_string();
    EXPECT_EQ(net->graph.nodes[0].op_type, "Resize");
    for (Device device : {Device::kCPU, Device::kCUDA}) {
      if (device == Device::kCUDA && !testing::device_available(device).ok()) continue;
      auto engine = Builder(device).build(*net, BuilderConfig());
      ASSERT_TRUE(engine.ok()) << engine.status().to_string();
      auto ctx = engine->create_execution_context();
      auto out = (*ctx)->run({{"x", testing::make_f32({1, 1, 2, 2}, {1, 2, 3, 4})}});
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      EXPECT_TRUE(testing::all_close(
          out->at("y"),
          testing::make_f32({1, 1, 4, 4}, {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}), 0, 0))
          << "opset " << opset << " on " << device_name(device);
    }
  }
}

TEST(Frontend, OpsetsOutsideTheSupportedRangeAreRefused) {
  for (int64_t opset : {5, 29}) {  // kiln reads opsets 6 to 28
    ModelProto m = make_model(opset);
    add_input(m.mutable_graph(), "x", TensorProto::FLOAT, {"1"});
    add_output(m.mutable_graph(), "x");
    auto r = parse(m);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
    EXPECT_NE(r.status().message().find("opset " + std::to_string(opset)), std::string::npos)
        << r.status().message();
  }
  // Other domains are recorded, and nodes carry their own domain's version.
  ModelProto m = make_model(9);
  auto* op = m.add_opset_import();
  op->set_domain("com.microsoft");
  op->set_version(1);
  add_input(m.mutable_graph(), "x", TensorProto::FLOAT, {"1"});
  add_node(m.mutable_graph(), "Gelu", {"x"}, {"y"})->set_domain("com.microsoft");
  add_node(m.mutable_graph(), "Relu", {"y"}, {"z"})->set_domain("ai.onnx");
  add_output(m.mutable_graph(), "z");
  auto r = parse(m);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->graph.opsets.at("com.microsoft"), 1);
  EXPECT_EQ(r->graph.nodes[0].opset, 1);
  EXPECT_EQ(r->graph.nodes[0].domain, "com.microsoft");
  EXPECT_EQ(r->graph.nodes[1].opset, 9);
  EXPECT_EQ(r->graph.nodes[1].domain, "");

  add_node(m.mutable_graph(), "Thing", {"z"}, {"w"}, "thing")->set_domain("org.unknown");
  r = parse(m);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("org.unknown"), std::string::npos);
}

TEST(Frontend, DeepSubgraphNestingIsAnError) {
  ModelProto m = make_model();
  add_input(m.mutable_graph(), "x", TensorProto::FLOAT, {"1"});
  GraphProto* g = m.mutable_graph();
  for (int depth = 0; depth < 80; ++depth) {
    auto* a = add_node(g, "If", {"x"}, {"y" + std::to_string(depth)})->add_attribute();
    a->set_name("then_branch");
    a->set_type(AttributeProto::GRAPH);
    g = a->mutable_g();
  }
  add_output(m.mutable_graph(), "y0");
  auto r = parse(m);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidModel);
}

TEST(Frontend, TensorFiles) {
  TensorProto t = raw_tensor<int32_t>("t", TensorProto::INT32, {2, 2}, {1, -2, 3, -4});
  std::string s = t.SerializeAsString();
  auto r = onnx::tensor_from_bytes(std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->dtype(), DType::kInt32);
  EXPECT_EQ(r->shape(), (Shape{2, 2}));
  EXPECT_EQ(contents<int32_t>(*r), (std::vector<int32_t>{1, -2, 3, -4}));
  std::vector<uint8_t> junk = {0x0a, 0x80};
  EXPECT_FALSE(onnx::tensor_from_bytes(junk).ok());
}

// Reads "nodes" for a model from manifest.json without a JSON library.
int manifest_nodes(const std::string& manifest, const std::string& model) {
  size_t at = manifest.find("\"" + model + "\": {");
  if (at == std::string::npos) return -1;
  at = manifest.find("\"nodes\":", at);
  if (at == std::string::npos) return -1;
  return std::atoi(manifest.c_str() + at + 8);
}

// KILN_MODELS_DIR if set, else the shared models beside the repository.
fs::path shared_models_dir() {
  if (const char* env = std::getenv("KILN_MODELS_DIR")) return env;
#ifdef KILN_DEFAULT_MODELS_DIR
  return KILN_DEFAULT_MODELS_DIR;
#else
  return "/work/shared/models";
#endif
}

TEST(Frontend, SharedModels) {
  const fs::path dir = shared_models_dir();
  if (!fs::exists(dir / "manifest.json")) GTEST_SKIP() << dir << " not present";
  std::ifstream in(dir / "manifest.json");
  std::string manifest((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  struct Case {
    std::string name;
    int constants;  // Constant nodes the manifest counts but the frontend folds away
    DType dtype;
    Shape input0;
  };
  const std::vector<Case> cases = {
      {"vit_tiny", 0, DType::kFloat32, {4, 3, 224, 224}},
      {"testmod_linear", 0, DType::kFloat32, {1, 1, 16}},
      {"mobilenet_v3_small", 0, DType::kFloat32, {1, 3, 224, 224}},
      {"unet_pixelshuffle", 0, DType::kFloat32, {2, 3, 200, 200}},
      {"llama_tiny", 0, DType::kInt64, {1, 7}},
      {"vit_tiny_legacy", 233, DType::kFloat32, {4, 3, 224, 224}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto net = onnx::parse_file((dir / c.name / "model.onnx").string());
    ASSERT_TRUE(net.ok()) << net.status().to_string();
    const int expected = manifest_nodes(manifest, c.name);
    ASSERT_GT(expected, 0);
    EXPECT_EQ(int(net->graph.nodes.size()), expected - c.constants);
    ASSERT_EQ(net->graph.inputs.size(), 1u);
    EXPECT_EQ(net->graph.values[net->graph.inputs[0]].dtype, c.dtype);
    EXPECT_EQ(net->producer, "pytorch");
    auto t = onnx::parse_tensor_file((dir / c.name / "test_data_set_0" / "input_0.pb").string());
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_EQ(t->dtype(), c.dtype);
    EXPECT_EQ(t->shape(), c.input0);
  }
  auto unet = onnx::parse_file((dir / "unet_pixelshuffle" / "model.onnx").string());
  ASSERT_TRUE(unet.ok());
  const auto& x = unet->graph.values[unet->graph.inputs[0]];
  ASSERT_TRUE(x.shape.has_value());
  EXPECT_EQ(*x.shape, (std::vector<ir::Dim>{ir::Dim::symbol("n"), 3, ir::Dim::symbol("h") * 4,
                                            ir::Dim::symbol("w") * 4}));
}

}  // namespace
}  // namespace kiln
