// The plan verifier: semantic edits to a built CPU engine, re-serialized with valid checksums, are
// refused at load with a typed error naming the broken invariant; every valid engine still loads.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>

#include "kiln.h"
#include "model_util.h"
#include "plan/engine_file.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using ir::Dim;
using plan::Plan;
using plan::Storage;

// x: float32[batch, 4] -> MatMul(x, w[4, 8]) -> h -> Relu -> r -> Unsqueeze(r, [1]) -> u ->
// Reshape(u, Shape(h)) -> v (a view: canonicalize drops a Reshape to its input's own shape, so
// the view reads u) -> Add(v, v) -> y. Covers input, constant, activation, symbolic, alias and
// output storage.
Network small_network() {
  Network net;
  ir::Graph& g = net.graph;
  g.opsets[""] = 18;
  auto value = [&](const char* name) { return g.add_value(name); };
  int x = value("x"), w = value("w"), h = value("h"), s = value("s"), r = value("r"),
      axes = value("axes"), u = value("u"), v = value("v"), y = value("y");
  g.values[axes].dtype = DType::kInt64;
  g.values[axes].shape = std::vector<Dim>{1};
  g.values[axes].constant = make_i64({1}, {1});
  g.values[x].dtype = DType::kFloat32;
  g.values[x].shape = std::vector<Dim>{Dim::symbol("batch"), Dim(4)};
  std::vector<float> wdata(32);
  for (int i = 0; i < 32; ++i) wdata[i] = 0.25f * float(i % 7) - 0.5f;
  g.values[w].dtype = DType::kFloat32;
  g.values[w].shape = std::vector<Dim>{4, 8};
  g.values[w].constant = make_f32({4, 8}, wdata);
  auto node = [&](const char* name, const char* op, std::vector<int> in, int out) {
    ir::Node n;
    n.name = name;
    n.op_type = op;
    n.opset = 18;
    n.inputs = std::move(in);
    n.outputs = {out};
    g.nodes.push_back(std::move(n));
  };
  node("mm", "MatMul", {x, w}, h);
  node("shape", "Shape", {h}, s);
  node("relu", "Relu", {h}, r);
  node("unsqueeze", "Unsqueeze", {r, axes}, u);
  node("view", "Reshape", {u, s}, v);
  node("add", "Add", {v, v}, y);
  g.inputs = {x};
  g.outputs = {y};
  return net;
}

Engine build_small() {
  BuilderConfig config;
  OptimizationProfile p;
  EXPECT_TRUE(p.set_dimensions("x", {1, 4}, {4, 4}, {16, 4}).ok());
  config.add_profile(p);
  auto engine = Builder().build(small_network(), config);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  return std::move(engine).value();
}

// Index of the plan value, or plan node, of a name.
int value_of(const Plan& p, const std::string& name) {
  for (size_t v = 0; v < p.graph.values.size(); ++v) {
    if (p.graph.values[v].name == name) return int(v);
  }
  ADD_FAILURE() << "no value " << name;
  return 0;
}
int node_of(const Plan& p, const std::string& name) {
  for (size_t n = 0; n < p.graph.nodes.size(); ++n) {
    if (p.graph.nodes[n].name == name) return int(n);
  }
  ADD_FAILURE() << "no node " << name;
  return 0;
}

TEST(EngineVerify, SmallEngineHasEveryStorageKind) {
  Engine e = build_small();
  const Plan& p = e.plan();
  EXPECT_EQ(p.values[value_of(p, "x")].storage, Storage::kInput);
  EXPECT_EQ(p.values[value_of(p, "w")].storage, Storage::kConstant);
  EXPECT_EQ(p.values[value_of(p, "h")].storage, Storage::kActivation);
  EXPECT_EQ(p.values[value_of(p, "s")].storage, Storage::kSymbolic);
  EXPECT_EQ(p.values[value_of(p, "v")].storage, Storage::kAlias);
  EXPECT_EQ(p.values[value_of(p, "y")].storage, Storage::kOutput);
  // The unedited file loads: the mutation cases below fail because of their edit alone.
  auto loaded = Engine::deserialize(e.serialize());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
}

struct Mutation {
  const char* name;
  std::function<void(Plan&)> edit;
  std::vector<std::string> phrases;  // each must appear in the error
  StatusCode code = StatusCode::kInvalidArgument;
};

const int64_t kMax = std::numeric_limits<int64_t>::max();

std::vector<Mutation> mutations() {
  auto val = [](Plan& p, const char* n) -> ir::Value& { return p.graph.values[value_of(p, n)]; };
  auto vplan = [](Plan& p, const char* n) -> plan::ValuePlan& { return p.values[value_of(p, n)]; };
  auto node = [](Plan& p, const char* n) -> ir::Node& { return p.graph.nodes[node_of(p, n)]; };
  auto slot_of = [](Plan& p, const char* n) -> Dim& {
    return p.slot_bytes[p.values[value_of(p, n)].slot];
  };
  return {
      {"non_io_value_as_input",
       [&](Plan& p) {
         vplan(p, "h") = {Storage::kInput, -1, -1};
       },
       {"only graph inputs have input storage",
        "value 'h' has input storage but is not a graph input"}},
      {"graph_input_as_activation",
       [&](Plan& p) {
         vplan(p, "x") = {Storage::kActivation, 0, -1};
       },
       {"only graph inputs have input storage", "'x' is a graph input but not stored as one"}},
      {"non_output_as_output",
       [&](Plan& p) {
         vplan(p, "h") = {Storage::kOutput, -1, -1};
       },
       {"only graph outputs have output storage", "value 'h'"}},
      {"output_duplicated",
       [&](Plan& p) { p.graph.outputs.push_back(p.graph.outputs[0]); },
       {"graph outputs are distinct", "value 'y' is listed twice"}},
      {"output_written_by_no_node",
       [&](Plan& p) { node(p, "add").outputs = {-1}; },
       {"every value is written by the node recorded as its producer",
        "value 'y' is written by no node", "node 'add'"}},
      {"input_duplicated",
       [&](Plan& p) { p.graph.inputs.push_back(p.graph.inputs[0]); },
       {"graph inputs are distinct", "value 'x' is listed twice"}},
      {"input_with_producer",
       [&](Plan& p) { val(p, "x").producer = 0; },
       {"graph inputs are not computed", "value 'x'"}},
      {"output_without_shape",
       [&](Plan& p) { val(p, "y").shape.reset(); },
       {"IO tensors have a dtype and shape", "value 'y'"}},
      {"activation_slot_minus_one",
       [&](Plan& p) { vplan(p, "h").slot = -1; },
       {"stored values have an arena slot", "value 'h' has slot -1"}},
      {"slot_int64_max",
       [&](Plan& p) { slot_of(p, "h") = Dim(kMax); },
       {"arena slots are non-negative and the arena fits int64", "9223372036854775807 bytes"}},
      {"slot_negative",
       [&](Plan& p) { slot_of(p, "h") = Dim(-64); },
       {"arena slots are non-negative", "is -64 bytes"}},
      {"slot_smaller_than_value",
       [&](Plan& p) { slot_of(p, "h") = Dim(16); },
       {"a value's arena slot holds its bytes", "value 'h' needs 32 bytes", "holds 16 at batch=1"}},
      {"slot_smaller_at_max_only",
       [&](Plan& p) { slot_of(p, "h") = Dim(256); },
       {"a value's arena slot holds its bytes", "value 'h' needs 512 bytes", "batch=16"}},
      // Issue 41 (engine_load_fuzz, 13th session): a slot claiming 4 GB in a small engine made
      // every run allocate it.
      {"slot_inflated_past_its_users",
       [&](Plan& p) { slot_of(p, "h") = Dim(int64_t(1) << 32); },
       {"the arena holds no more than its values and workspaces need", "its slots total 4294967",
        "at batch=1"}},
      {"slot_shared_while_live",
       [&](Plan& p) { vplan(p, "r").slot = vplan(p, "h").slot; },
       {"values sharing an arena slot are never live at once", "value 'h' (live at nodes 0..1)",
        "value 'r' (live at nodes 1.."}},
      {"slot_unknown_symbol",
       [&](Plan& p) { slot_of(p, "h") = Dim::symbol("nosuch") * 32; },
       {"formulas evaluate over every profile", "nosuch"}},
      {"constant_storage_without_data",
       [&](Plan& p) {
         vplan(p, "h") = {Storage::kConstant, -1, -1};
       },
       {"constants have data", "value 'h' has constant storage but no data"}},
      {"constant_wrong_dtype",
       [&](Plan& p) {
         val(p, "w").constant = Tensor::zeros(DType::kInt64, {4, 8}).value();
       },
       {"constant data is dtype_size*numel bytes", "value 'w' is float32 but its data is int64"}},
      {"constant_wrong_shape",
       [&](Plan& p) {
         val(p, "w").constant = Tensor::zeros(DType::kFloat32, {8, 4}).value();
       },
       {"constant data matches the value's shape", "value 'w' has shape [4, 8]"}},
      {"op_type_unknown",
       [&](Plan& p) { node(p, "relu").op_type = "Bogus"; },
       {"every node's op is known", "node 'relu' (Bogus)"}},
      {"op_domain_changed",
       [&](Plan& p) { node(p, "relu").domain = "kiln"; },
       {"every node's op is known", "domain 'kiln'"}},
      {"op_type_changed",
       [&](Plan& p) { node(p, "mm").op_type = "Add"; },
       {"stored types follow from op inference", "node 'mm' (Add)"}},
      {"opset_implausible",
       [&](Plan& p) { node(p, "relu").opset = 99999; },
       {"opsets are plausible", "opset 99999"}},
      {"input_removed",
       [&](Plan& p) { node(p, "mm").inputs.pop_back(); },
       {"arity within the op's schema", "node 'mm' (MatMul) has 1 inputs"}},
      // Found by engine_load_fuzz: a FusedConv with its weights omitted (-1) passed the arity
      // check and its inference read values[-1].
      {"required_input_omitted",
       [&](Plan& p) { node(p, "mm").inputs[1] = -1; },
       {"required inputs are present", "node 'mm' (MatMul) input 1 is omitted",
        "its first 2 input(s) are required"}},
      // Issue 41, class 4: an op whose inputs are all required (variadic Sum, kiln::SelectBranch)
      // with one past min_inputs omitted.
      {"variadic_input_omitted",
       [&](Plan& p) {
         node(p, "relu").op_type = "Sum";
         node(p, "relu").inputs.push_back(-1);
       },
       {"required inputs are present", "node 'relu' (Sum) input 1 is omitted",
        "none of its inputs may be"}},
      // Issue 41, class 8: an enumerated attribute ONNX does not allow (ops/attribute_domains.h).
      {"attribute_out_of_domain",
       [&](Plan& p) {
         node(p, "mm").op_type = "Gemm";
         node(p, "mm").attrs.set("transA", ir::Attribute{.type = ir::AttrType::kInt, .i = 5});
       },
       {"attribute values are in ONNX's domains",
        "node 'mm' (Gemm) attribute transA is 5; ONNX allows 0 or 1"}},
      {"output_added",
       [&](Plan& p) { node(p, "relu").outputs.push_back(value_of(p, "h")); },
       {"arity within the op's schema", "node 'relu' (Relu) has 1 inputs and 2 outputs"}},
      {"read_before_produced",
       [&](Plan& p) { node(p, "mm").inputs[0] = value_of(p, "r"); },
       {"values are produced before they are read", "reads value 'r'"}},
      {"writes_another_nodes_value",
       [&](Plan& p) { node(p, "relu").outputs[0] = value_of(p, "h"); },
       {"a node writes only values it produces", "node 'relu' (Relu) writes value 'h'"}},
      {"output_dtype_changed",
       [&](Plan& p) { val(p, "h").dtype = DType::kFloat16; },
       {"stored types follow from op inference", "inference gives float32"}},
      {"output_rank_changed",
       [&](Plan& p) {
         val(p, "h").shape = std::vector<Dim>{Dim::symbol("batch"), 8, 1};
       },
       {"stored types follow from op inference", "node 'mm' (MatMul) output 0 value 'h'"}},
      {"output_dim_changed",
       [&](Plan& p) {
         val(p, "h").shape = std::vector<Dim>{Dim::symbol("batch"), 2};
       },
       {"stored shapes follow from op inference", "dim 1 is stored as 2 but inference gives 8"}},
      {"alias_of_wrong_size",
       [&](Plan& p) { vplan(p, "v").alias_of = value_of(p, "x"); },
       {"aliases have their root's byte size",
        "value 'v' is 32 bytes but its root value 'x' is 16"}},
      {"alias_of_other_dtype",
       [&](Plan& p) { vplan(p, "v").alias_of = value_of(p, "s"); },
       {"aliases view a non-alias of the same dtype", "value 'v'"}},
      {"kernel_output_stored_as_alias",
       [&](Plan& p) {
         vplan(p, "h") = {Storage::kAlias, -1, value_of(p, "x")};
       },
       {"aliases are produced by views",
        "value 'h' is stored as an alias, but no view produces it"}},
      {"non_view_planned_as_alias",
       [&](Plan& p) { p.nodes[node_of(p, "relu")].impl = plan::kAliasImpl; },
       {"alias nodes are views stored as aliases", "node 'relu' (Relu) is planned as an alias"}},
      {"symbolic_value_float16",
       [&](Plan& p) { val(p, "s").dtype = DType::kFloat16; },
       {"symbolic values are small integer (or exact float) formulas", "value 's'"}},
      {"symbolic_value_short",
       [&](Plan& p) { val(p, "s").sym_value->pop_back(); },
       {"symbolic values have one formula per element", "value 's' has 1 formulas for 16 bytes"}},
      {"profile_input_dropped",
       [&](Plan& p) { p.profiles[0].inputs.clear(); },
       {"every dynamic input dim is bounded by every profile", "input 'x' dim 0 (batch)"}},
      {"profile_range_outside_box",
       [&](Plan& p) { p.profiles[0].inputs[0].max[0] = 1000; },
       {"input ranges lie inside the profile's symbol box",
        "range [1, 1000] puts batch outside [1, 16]"}},
      {"profile_names_no_input",
       [&](Plan& p) { p.profiles[0].inputs[0].name = "ghost"; },
       {"profiles name engine inputs", "'ghost'"}},
      {"profile_box_overflows_sizes",
       [&](Plan& p) {
         p.profiles[0].symbols["batch"].hi = int64_t(1) << 62;
         p.profiles[0].inputs[0].max[0] = int64_t(1) << 62;
         p.profiles[0].inputs[0].opt[0] = int64_t(1) << 62;
       },
       {"fit int64", "batch=4611686018427387904"}},
      {"kernel_of_another_op",
       [&](Plan& p) { p.nodes[node_of(p, "relu")].impl = p.nodes[node_of(p, "mm")].impl; },
       {"node 'relu' (Relu): kernel", "does not implement Relu"}},
      {"kernel_unknown",
       [&](Plan& p) { p.nodes[node_of(p, "relu")].impl = "cpu.NoSuchKernel"; },
       {"kernel 'cpu.NoSuchKernel'", "does not have"},
       StatusCode::kUnsupported},
  };
}

TEST(EngineVerify, SemanticEditsBehindValidChecksumsAreRefusedByInvariant) {
  const Engine engine = build_small();
  const std::vector<Mutation> cases = mutations();
  ASSERT_GE(cases.size(), 25u);
  for (const Mutation& m : cases) {
    SCOPED_TRACE(m.name);
    Plan p = engine.plan();
    m.edit(p);
    // serialize recomputes every checksum: the edit reaches the loader as a well-formed file.
    auto bytes = plan::try_serialize(p);
    ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
    auto loaded = Engine::deserialize(*bytes);
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().code(), m.code) << loaded.status().to_string();
    for (const std::string& phrase : m.phrases) {
      EXPECT_NE(loaded.status().message().find(phrase), std::string::npos)
          << "'" << phrase << "' missing in: " << loaded.status().message();
    }
    // from_plan takes the same path: a plan handed over in memory is verified too.
    auto direct = Engine::from_plan(p);
    ASSERT_FALSE(direct.ok());
    EXPECT_EQ(direct.status().message(), loaded.status().message());
  }
}

TEST(EngineVerify, HostileFileOnDiskIsRefusedByLoad) {
  Plan p = build_small().plan();
  p.slot_bytes[p.values[value_of(p, "h")].slot] = Dim(kMax);
  const std::string path =
      (std::filesystem::temp_directory_path() / "kiln_verify_hostile.kiln").string();
  ASSERT_TRUE(plan::save_file(p, path).ok());
  auto loaded = Engine::load(path);
  std::filesystem::remove(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(loaded.status().message().find("arena fits int64"), std::string::npos)
      << loaded.status().message();
}

TEST(EngineVerify, EverySharedModelEngineStillLoads) {
  if (models_dir().empty()) {
    GTEST_SKIP() << "../shared/models is absent (set KILN_MODELS_DIR to run this test)";
  }
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(models_dir())) {
    const std::string name = entry.path().filename().string();
    if (!std::filesystem::exists(entry.path() / "model.onnx")) continue;
    SCOPED_TRACE(name);
    auto built = build_model((entry.path() / "model.onnx").string(), shared_model_profile(name));
    ASSERT_TRUE(built.ok()) << built.status().to_string();
    auto loaded = Engine::deserialize(built->serialize());
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    auto bytes = loaded->activation_bytes(0, OptProfileSelector::kMAX);
    EXPECT_TRUE(bytes.ok()) << bytes.status().to_string();
    ++checked;
  }
  EXPECT_GT(checked, 0) << "no model.onnx under " << models_dir();
}

}  // namespace
}  // namespace kiln::testing
