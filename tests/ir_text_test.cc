// The IR text form: hand-written snippets with every construct the printer writes (symbolic dims,
// dtypes, constants inline, splat and elided, every attribute kind, domains, quoted names, nested
// graphs), errors that name line and column, and print(parse(print(g))) == print(g) on the six
// shared models as the ONNX frontend parses them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "frontend/onnx/parse.h"
#include "ir/text.h"
#include "model_util.h"

namespace kiln {
namespace {

using ir::parse_text;
using ir::to_text;

std::string round_trip(const std::string& text, const ir::TextParseOptions& options = {}) {
  auto g = parse_text(text, options);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  if (!g.ok()) return "";
  return to_text(*g);
}

// Parsing the printer's own output gives the same text back, and that text is `expected`.
void expect_canonical(const std::string& text, const std::string& expected) {
  std::string once = round_trip(text);
  EXPECT_EQ(once, expected);
  EXPECT_EQ(round_trip(once), once);
}

TEST(IrText, CanonicalSnippetRoundTripsUnchanged) {
  const std::string text =
      R"(graph main(%x: float32[batch, 16], %ids: int64[batch, seq + 1]) -> (%y: float32[batch, 8], %s: int64[2] = [batch, 16]) {
  opset ai.onnx 17
  opset kiln 1
  %w: float32[16, 8] = dense<0.25>
  %b: float32[8] = dense<[0.5, -1.0, 1e-05, 3.4028235e+38, -0.0, inf, -inf, 0.1]>
  %s: int64[2] = [batch, 16] = Shape(%x)  # shape_0
  %y: float32[batch, 8] = kiln::MatMulBias(%x, %w, %b) {activation="relu"}  # fc_0
}
)";
  expect_canonical(text, text);
}

TEST(IrText, SymbolicDimsInTheirPrintedForms) {
  const std::string text =
      R"(graph g(%x: float32[n, 3, 4*h, 4*w]) -> (%y: float32[n, 3, floor(h/2), min(a, b), n*w + 2*h - 1]) {
  %y: float32[n, 3, floor(h/2), min(a, b), n*w + 2*h - 1] = Foo(%x)  # foo
}
)";
  std::string printed = round_trip(text);
  EXPECT_EQ(round_trip(printed), printed);
  // Dims come back as the same expressions (Dim's canonical spelling).
  auto g = parse_text(printed);
  ASSERT_TRUE(g.ok());
  const auto& y = g->values[g->outputs[0]];
  ASSERT_TRUE(y.shape && y.shape->size() == 5);
  EXPECT_EQ((*y.shape)[2], ir::Dim::floor_div(ir::Dim::symbol("h"), 2));
  EXPECT_EQ((*y.shape)[3], ir::Dim::min(ir::Dim::symbol("a"), ir::Dim::symbol("b")));
  EXPECT_EQ((*y.shape)[4],
            ir::Dim::symbol("n") * ir::Dim::symbol("w") + 2 * ir::Dim::symbol("h") - 1);
}

TEST(IrText, EveryAttributeKind) {
  const std::string text = R"(graph g(%x: float32[?]) -> (%y: undefined[?]) {
  %y: undefined[?] = Everything(%x) {empty_f=floats[], empty_g=graphs[], empty_i=ints[], empty_s=strings[], empty_t=tensors[], f=1.5, fs=[1.0, -2.5, 1e-07], g=graph body(%i: int64[]) -> (%o: float32[3]) {
    %o: float32[3] = Add(%x, %i)  # inner
  }, gs=[graph a() -> (%x: float32[?]) {
  }, graph b() -> (%c: int8[2]) {
    %c: int8[2] = dense<[-128, 127]>
  }], i=-3, is=[1, 2, -1], s="say \"hi\"\n", ss=["a", ""], t=dense<[1, 2, 3]> : int64[3], ts=[dense<2.0> : float16[2, 2], dense<[true, false]> : bool[2]], whole=1.0}  # every_attr
}
)";
  std::string printed = round_trip(text);
  EXPECT_EQ(printed, text);
  auto g = parse_text(text);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const ir::Attributes& attrs = g->nodes[0].attrs;
  EXPECT_EQ(attrs.find("f")->type, ir::AttrType::kFloat);
  EXPECT_EQ(attrs.find("whole")->type, ir::AttrType::kFloat);  // 1.0 is a float, 1 an int
  EXPECT_EQ(attrs.find("i")->i, -3);
  EXPECT_EQ(attrs.find("s")->s, "say \"hi\"\n");
  EXPECT_EQ(attrs.find("empty_f")->type, ir::AttrType::kFloats);
  EXPECT_EQ(attrs.find("t")->t.int_at(2), 3);
  EXPECT_EQ(attrs.find("ts")->tensors[0].dtype(), DType::kFloat16);
  EXPECT_EQ(attrs.find("ts")->tensors[0].float_at(3), 2.0);
  // The nested graph reads %x of the enclosing graph: a plain value there, as the frontend makes.
  const ir::Graph& body = *attrs.find("g")->g;
  EXPECT_EQ(body.values[body.nodes[0].inputs[0]].name, "x");
  EXPECT_EQ(attrs.find("gs")->graphs.size(), 2u);
}

TEST(IrText, ConstantsOfEveryDtypeKeepTheirBits) {
  const std::string text =
      R"(graph g() -> (%f32: float32[4], %f64: float64[2], %f16: float16[3], %bf: bfloat16[2], %i8: int8[2], %u8: uint8[2], %i16: int16[1], %u16: uint16[1], %i32: int32[2], %u32: uint32[1], %i64: int64[2], %u64: uint64[1], %b: bool[3], %scalar: int64[], %empty: float32[0, 4]) {
  %f32: float32[4] = dense<[0.1, 1e-45, 16777216.0, -3.4028235e+38]>
  %f64: float64[2] = dense<[0.1, 5e-324]>
  %f16: float16[3] = dense<[0.099975586, 65504.0, 5.9604645e-08]>
  %bf: bfloat16[2] = dense<[0.100097656, -3.3895314e+38]>
  %i8: int8[2] = dense<[-128, 127]>
  %u8: uint8[2] = dense<[0, 255]>
  %i16: int16[1] = dense<[-32768]>
  %u16: uint16[1] = dense<[65535]>
  %i32: int32[2] = dense<[-2147483648, 2147483647]>
  %u32: uint32[1] = dense<[4294967295]>
  %i64: int64[2] = dense<[-9223372036854775808, 9223372036854775807]>
  %u64: uint64[1] = dense<[18446744073709551615]>
  %b: bool[3] = dense<[true, false, true]>
  %scalar: int64[] = dense<[7]>
  %empty: float32[0, 4] = dense<[]>
}
)";
  EXPECT_EQ(round_trip(text), text);
  auto g = parse_text(text);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  auto value = [&](const char* name) -> const Tensor& {
    return *g->values[g->find_value(name)].constant;
  };
  EXPECT_EQ(value("f32").data_as<float>()[0], 0.1f);
  EXPECT_EQ(value("f32").data_as<float>()[1], std::nextafter(0.f, 1.f));
  EXPECT_EQ(value("f64").data_as<double>()[0], 0.1);
  EXPECT_EQ(value("f16").data_as<uint16_t>()[1], 0x7bff);
  EXPECT_EQ(value("u64").data_as<uint64_t>()[0], ~uint64_t(0));
  EXPECT_EQ(value("i64").int_at(0), INT64_MIN);
  EXPECT_EQ(value("scalar").rank(), 0);
}

TEST(IrText, QuotedNamesDomainsAndOmittedSlots) {
  const std::string text =
      R"(graph "my model"(%"input 0": float32[2], %onnx::Mul_3: float32[2]) -> (%"y:": float32[2]) {
  opset ai.onnx 13
  opset com.example 2
  %"y:": float32[2], _ = com.example::Fancy@1(%"input 0", _, %onnx::Mul_3) {"odd key"=1}  # "node with spaces"
  = Print(%"y:")  # sink
}
)";
  expect_canonical(text, text);
  auto g = parse_text(text);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->name, "my model");
  EXPECT_EQ(g->nodes[0].domain, "com.example");
  EXPECT_EQ(g->nodes[0].opset, 1);       // written @1: differs from the import
  EXPECT_EQ(g->nodes[1].opset, 13);      // from `opset ai.onnx 13`
  EXPECT_EQ(g->nodes[0].inputs[1], -1);  // `_`
  EXPECT_EQ(g->nodes[0].outputs[1], -1);
  EXPECT_TRUE(g->nodes[1].outputs.empty());
  EXPECT_EQ(g->nodes[0].name, "node with spaces");
}

TEST(IrText, HandWrittenShorthandsAreAccepted) {
  // Comments, free spacing, no node names, an ai.onnx:: prefix, [1, 2.5] as floats.
  auto g = parse_text(R"(
    // a hand-written test input
    graph g(%x: float32[2]) -> (%y: float32[2]) {
      %y: float32[2] = ai.onnx::LeakyRelu(%x) {alpha = 1, betas = [1, 2.5]}
    })");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->nodes[0].name, "LeakyRelu_0");
  EXPECT_EQ(g->nodes[0].domain, "");
  EXPECT_EQ(g->nodes[0].attrs.find("betas")->type, ir::AttrType::kFloats);
  EXPECT_TRUE(ir::verify(*g).ok());
}

TEST(IrText, LargeConstantsAreElidedAndSuppliedByTheCaller) {
  ir::Graph g;
  g.name = "g";
  int w = g.add_value("w");
  std::vector<float> data(100);
  for (int i = 0; i < 100; ++i) data[i] = float(i) / 7.f;
  g.values[w].constant = Tensor::from_vector(DType::kFloat32, {10, 10}, data);
  g.values[w].dtype = DType::kFloat32;
  g.values[w].shape = std::vector<ir::Dim>{10, 10};
  g.outputs = {w};
  const std::string text = to_text(g);
  EXPECT_EQ(text, "graph g() -> (%w: float32[10, 10]) {\n  %w: float32[10, 10] = dense<...>\n}\n");
  // Without a supplier the parse fails naming the value; with one it round-trips.
  auto bad = parse_text(text);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 2, column "), std::string::npos)
      << bad.status().message();
  EXPECT_NE(bad.status().message().find("'w'"), std::string::npos) << bad.status().message();
  auto good = parse_text(text, {ir::elided_from(g)});
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_EQ(std::memcmp(good->values[0].constant->data(), data.data(), 400), 0);
  // max_inline_elements < 0 prints every element, and that parses back bit-exactly too.
  auto full = parse_text(to_text(g, {.max_inline_elements = -1}));
  ASSERT_TRUE(full.ok()) << full.status().to_string();
  EXPECT_EQ(std::memcmp(full->values[0].constant->data(), data.data(), 400), 0);
}

struct BadCase {
  const char* text;
  const char* where;  // "line L, column C"
  const char* what;
};

TEST(IrText, ErrorsNameLineAndColumn) {
  const BadCase cases[] = {
      {"graph g() -> (%y: float32[1]) {\n  %y: float32[1] = Relu(%nope)  # r\n}",
       "line 2, column 25", "undefined value %nope"},
      {"graph g(%x: float32[1]) -> (%x: float32[1]) {\n  %x: float32[1] = Relu(%x)\n}",
       "line 2, column 3", "defined twice"},
      {"graph g(%x: float33[1]) -> () {\n}", "line 1, column 13", "unknown dtype 'float33'"},
      {"graph g(%x: float32[a +]) -> () {\n}", "line 1, column 21", "not a dim expression"},
      {"graph g() -> (%c: int64[3]) {\n  %c: int64[3] = dense<[1, 2]>\n}", "line 2, column 23",
       "has 2 elements but its type has 3"},
      {"graph g() -> (%c: int8[1]) {\n  %c: int8[1] = dense<[300]>\n}", "line 2, column 24",
       "out of range for int8"},
      {"graph g() -> (%c: int64[n]) {\n  %c: int64[n] = dense<[1]>\n}", "line 2, column 3",
       "non-negative integers"},
      {"graph g(%x: float32[1]) -> (%y: float32[2]) {\n  %y: float32[1] = Relu(%x)\n}",
       "line 1, column 29", "declared float32[2] but defined as float32[1]"},
      {"graph g(%x: float32[1]) -> () {\n  %y: float32[1] = Relu(%x) {a=[]}\n}",
       "line 2, column 32", "empty list needs its type"},
      {"graph g(%x: float32[1]) -> () {\n  %y: float32[1] = Relu(%x) {s=\"abc}\n}",
       "line 2, column 32", "unterminated string"},
      {"graph g() -> () {\n}\nextra", "line 3, column 1", "unexpected text"},
      {"graph g() -> () {\n  opset ai.onnx 17\n  opset ai.onnx 18\n}", "line 3, column 3",
       "given twice"},
  };
  for (const BadCase& c : cases) {
    auto g = parse_text(c.text);
    ASSERT_FALSE(g.ok()) << c.text;
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    const std::string& m = g.status().message();
    EXPECT_EQ(m.rfind(c.where, 0), 0u) << "want '" << c.where << "' in: " << m;
    EXPECT_NE(m.find(c.what), std::string::npos) << "want '" << c.what << "' in: " << m;
  }
}

TEST(IrText, SharedModelsRoundTrip) {
  const std::string dir = testing::models_dir();
  if (dir.empty()) GTEST_SKIP() << "the shared models are absent (set KILN_MODELS_DIR)";
  const char* models[] = {"mobilenet_v3_small", "vit_tiny",       "vit_tiny_legacy",
                          "unet_pixelshuffle",  "testmod_linear", "llama_tiny"};
  int tested = 0;
  for (const char* m : models) {
    const std::string path = dir + "/" + m + "/model.onnx";
    if (!std::filesystem::exists(path)) {
      std::printf("[  SKIPPED ] %s: %s is absent\n", m, path.c_str());
      continue;
    }
    auto net = onnx::parse_file(path);
    ASSERT_TRUE(net.ok()) << m << ": " << net.status().to_string();
    const std::string printed = to_text(net->graph);
    auto parsed = parse_text(printed, {ir::elided_from(net->graph)});
    ASSERT_TRUE(parsed.ok()) << m << ": " << parsed.status().to_string();
    EXPECT_EQ(to_text(*parsed), printed) << m;
    EXPECT_TRUE(ir::verify(*parsed).ok()) << m;
    EXPECT_EQ(parsed->nodes.size(), net->graph.nodes.size()) << m;
    ++tested;
  }
  // The small model's weights print in full and come back bit-exactly.
  const std::string linear = dir + "/testmod_linear/model.onnx";
  if (std::filesystem::exists(linear)) {
    auto net = onnx::parse_file(linear);
    ASSERT_TRUE(net.ok());
    auto full = parse_text(to_text(net->graph, {.max_inline_elements = -1}));
    ASSERT_TRUE(full.ok()) << full.status().to_string();
    int compared = 0;
    for (const ir::Value& v : full->values) {
      if (!v.constant) continue;
      const ir::Value& orig = net->graph.values[net->graph.find_value(v.name)];
      ASSERT_EQ(v.constant->nbytes(), orig.constant->nbytes()) << v.name;
      EXPECT_EQ(std::memcmp(v.constant->data(), orig.constant->data(), v.constant->nbytes()), 0)
          << v.name;
      ++compared;
    }
    EXPECT_GT(compared, 0);
  }
  if (tested == 0) GTEST_SKIP() << "none of the six shared models is present";
}

}  // namespace
}  // namespace kiln
