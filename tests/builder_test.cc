// Builder tests on small graphs made in C++: profile proofs over the whole box, unsupported ops
// listed at once, and missing profiles named.
#include <gtest/gtest.h>

#include "ir/text.h"
#include "kiln.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

// x: float32[batch, 6] -> Reshape(x, [-1, 12]) -> y. Valid only for even batch.
Network reshape_network() {
  Network net;
  ir::Graph& g = net.graph;
  g.opsets[""] = 18;
  int x = g.add_value("x");
  g.values[x].dtype = DType::kFloat32;
  g.values[x].shape = std::vector<ir::Dim>{ir::Dim::symbol("batch"), ir::Dim(6)};
  int shape = g.add_value("shape");
  g.values[shape].constant = make_i64({2}, {-1, 12});
  g.values[shape].dtype = DType::kInt64;
  g.values[shape].shape = std::vector<ir::Dim>{ir::Dim(2)};
  int y = g.add_value("y");
  ir::Node n;
  n.name = "reshape_pairs";
  n.op_type = "Reshape";
  n.opset = 18;
  n.inputs = {x, shape};
  n.outputs = {y};
  g.nodes.push_back(n);
  g.inputs = {x};
  g.outputs = {y};
  return net;
}

BuilderConfig batch_config(int64_t lo, int64_t hi) {
  BuilderConfig config;
  OptimizationProfile p;
  EXPECT_TRUE(p.set_dimensions("x", {lo, 6}, {hi, 6}, {hi, 6}).ok());
  config.add_profile(p);
  return config;
}

TEST(BuilderProfiles, ReshapeValidOnlyForEvenBatchIsRefusedNamingNodeAndRange) {
  auto engine = Builder().build(reshape_network(), batch_config(1, 8));
  ASSERT_FALSE(engine.ok());
  const std::string& m = engine.status().message();
  for (const char* part :
       {"reshape_pairs", "Reshape", "batch in [1, 8]", "{1, 3, ..., 7}", "[batch, 6]"}) {
    EXPECT_NE(m.find(part), std::string::npos) << "'" << part << "' missing in: " << m;
  }
}

TEST(BuilderProfiles, TheShapeLogShowsRangesShapesAndHowTheProofWent) {
  BuilderConfig config = batch_config(2, 8);
  std::vector<std::string> lines;
  config.set_shape_log([&](const std::string& line) { lines.push_back(line); });
  auto engine = Builder().build(reshape_network(), config);
  ASSERT_FALSE(engine.ok());  // odd batches fail, as below
  std::string log;
  for (const std::string& l : lines) log += l + "\n";
  for (const char* part : {"profile 0: batch in [2, 8]\n", "shapes after inference",
                           "node 'reshape_pairs' (Reshape): x [batch, 6], shape [2] -> y ",
                           "profile proof: 1 constraint(s) per profile",
                           "by enumerating 7 points of batch: fails at 3"}) {
    EXPECT_NE(log.find(part), std::string::npos) << "'" << part << "' missing in:\n" << log;
  }
  // The profile that builds: the same check, with no failure (intervals cannot bound a remainder
  // over a range, so this one is enumerated too).
  lines.clear();
  BuilderConfig even = batch_config(2, 2);
  even.set_shape_log([&](const std::string& line) { lines.push_back(line); });
  ASSERT_TRUE(Builder().build(reshape_network(), even).ok());
  std::string even_log;
  for (const std::string& l : lines) even_log += l + "\n";
  EXPECT_NE(even_log.find("must be divisible by 12: by enumerating 1 points of batch\n"),
            std::string::npos)
      << even_log;
}

TEST(BuilderProfiles, FailureBetweenMinAndMaxIsFound) {
  // min 2 and max 8 are both even: checking only min/opt/max would accept this profile.
  auto engine = Builder().build(reshape_network(), batch_config(2, 8));
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("batch=3"), std::string::npos)
      << engine.status().message();
}

TEST(BuilderProfiles, ValidProfileBuildsAndRuns) {
  auto engine = Builder().build(reshape_network(), batch_config(2, 2));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ(ir::dims_to_string(*engine->tensor_symbolic_shape("y")), "[1, 12]");
  auto ctx = engine->create_execution_context();
  std::vector<float> v(12);
  for (int i = 0; i < 12; ++i) v[i] = float(i);
  auto out = (*ctx)->run({{"x", make_f32({2, 6}, v)}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close(out->at("y"), make_f32({1, 12}, v)));
  // On the CPU the whole run is compute: no copies.
  const auto& timing = (*ctx)->last_run_timing();
  EXPECT_GT(timing.compute_ms, 0.0);
  EXPECT_EQ(timing.h2d_ms, 0.0);
  EXPECT_EQ(timing.d2h_ms, 0.0);
}

// A context's CPU thread count (ONNX Runtime's intra-op threads): checked, read back, and the
// runs give the same values with one thread and with three.
TEST(BuilderProfiles, AContextsCpuThreadsAreCheckedAndRunsAgree) {
  auto engine = Builder().build(reshape_network(), batch_config(2, 2));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  EXPECT_GE((*ctx)->cpu_threads(), 1);
  for (int bad : {-1, 257}) {
    Status st = (*ctx)->set_cpu_threads(bad);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("cpu threads " + std::to_string(bad) + " is outside 0..256"),
              std::string::npos)
        << st.message();
  }
  std::vector<float> v(12);
  for (int i = 0; i < 12; ++i) v[i] = float(i) * 0.5f;
  for (int threads : {1, 3, 0}) {
    ASSERT_TRUE((*ctx)->set_cpu_threads(threads).ok());
    if (threads > 0) EXPECT_EQ((*ctx)->cpu_threads(), threads);
    auto out = (*ctx)->run({{"x", make_f32({2, 6}, v)}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_TRUE(all_close(out->at("y"), make_f32({1, 12}, v))) << threads;
  }
}

TEST(BuilderProfiles, MissingProfileListsDynamicInputs) {
  auto engine = Builder().build(reshape_network(), BuilderConfig());
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("x: [batch, 6]"), std::string::npos)
      << engine.status().message();
  BuilderConfig wrong;
  OptimizationProfile p;
  ASSERT_TRUE(p.set_dimensions("z", {1}, {1}, {1}).ok());
  wrong.add_profile(p);
  auto e2 = Builder().build(reshape_network(), wrong);
  ASSERT_FALSE(e2.ok());
  EXPECT_NE(e2.status().message().find("'z'"), std::string::npos) << e2.status().message();
  OptimizationProfile bad;
  EXPECT_FALSE(bad.set_dimensions("x", {4, 6}, {2, 6}, {8, 6}).ok());
}

TEST(BuilderSupport, UnsupportedOpsAreListedAllAtOnce) {
  Network net = reshape_network();
  ir::Graph& g = net.graph;
  int a = g.add_value("a"), b = g.add_value("b");
  ir::Node n1;
  n1.name = "mystery_1";
  n1.op_type = "FancyOp";
  n1.domain = "com.example";
  n1.inputs = {0};
  n1.outputs = {a};
  ir::Node n2 = n1;
  n2.name = "mystery_2";
  n2.op_type = "NonMaxSuppressionV9";
  n2.domain = "";
  n2.outputs = {b};
  g.nodes.push_back(n1);
  g.nodes.push_back(n2);
  g.outputs = {a, b};
  auto engine = Builder().build(net, batch_config(2, 2));
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), StatusCode::kUnsupported);
  const std::string& m = engine.status().message();
  for (const char* part :
       {"2 node(s)", "FancyOp", "mystery_1", "com.example", "NonMaxSuppressionV9", "mystery_2"}) {
    EXPECT_NE(m.find(part), std::string::npos) << "'" << part << "' missing in: " << m;
  }
}

// x: [a, 4] and y: [c, 4] concatenated; two profiles, a small one and a large one.
StatusOr<Engine> two_profile_engine() {
  auto g =
      ir::parse_text(R"(graph g(%x: float32[a, 4], %y: float32[c, 4]) -> (%z: float32[a + c, 4]) {
  opset ai.onnx 17
  %z: float32[a + c, 4] = Concat(%x, %y) {axis=0}  # cat
}
)",
                     {});
  if (!g.ok()) return g.status();
  Network net;
  net.graph = std::move(g).value();
  BuilderConfig config;
  OptimizationProfile small, large;
  EXPECT_TRUE(small.set_dimensions("x", {1, 4}, {2, 4}, {4, 4}).ok());
  EXPECT_TRUE(small.set_dimensions("y", {1, 4}, {2, 4}, {4, 4}).ok());
  EXPECT_TRUE(large.set_dimensions("x", {3, 4}, {12, 4}, {16, 4}).ok());
  EXPECT_TRUE(large.set_dimensions("y", {3, 4}, {12, 4}, {16, 4}).ok());
  config.add_profile(small);
  config.add_profile(large);
  return Builder().build(net, config);
}

TEST(BuilderProfiles, AnUnpinnedContextPicksTheProfileWhoseOptIsNearest) {
  auto engine = two_profile_engine();
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  ExecutionContext& c = **ctx;
  EXPECT_FALSE(c.profile_pinned());
  auto run = [&](int64_t a, int64_t b) -> StatusOr<int> {
    auto out = c.run({{"x", make_f32({a, 4}, std::vector<float>(size_t(a * 4), 1.f))},
                      {"y", make_f32({b, 4}, std::vector<float>(size_t(b * 4), 2.f))}});
    if (!out.ok()) return out.status();
    EXPECT_EQ(out->at("z").shape(), (Shape{a + b, 4}));
    return c.optimization_profile();
  };
  EXPECT_EQ(run(2, 2).value(), 0);    // only the small profile holds 2
  EXPECT_EQ(run(14, 14).value(), 1);  // only the large one holds 14
  // 4 is in both: |4 - 2| / 2 per dim against |4 - 12| / 12, so the large profile is nearer.
  EXPECT_EQ(run(4, 4).value(), 1);
  EXPECT_EQ(run(3, 1).value(), 0);  // y = 1 is in the small profile only
  // A shape no profile holds: every profile's range is named.
  Status none = c.set_input_shape("x", {20, 4});
  ASSERT_FALSE(none.ok());
  for (const char* part :
       {"fits none of the engine's 2 optimization profiles", "[1, 4] of optimization profile 0",
        "[3, 16] of optimization profile 1"}) {
    EXPECT_NE(none.message().find(part), std::string::npos) << part << " in: " << none.message();
  }
  // Each shape fits a profile, but no profile holds both: the run says so.
  auto split = run(1, 16);
  ASSERT_FALSE(split.ok());
  EXPECT_NE(
      split.status().message().find("no optimization profile holds every input's shape at once"),
      std::string::npos)
      << split.status().message();
  // Pinned, a context checks that profile alone, as before.
  ASSERT_TRUE(c.set_optimization_profile(0).ok());
  EXPECT_TRUE(c.profile_pinned());
  Status pinned = c.set_input_shape("x", {14, 4});
  ASSERT_FALSE(pinned.ok());
  EXPECT_NE(pinned.message().find("outside the range [1, 4] of optimization profile 0"),
            std::string::npos)
      << pinned.message();
  EXPECT_EQ(run(4, 4).value(), 0);
}

// Issue 15's case: three batch profiles, 1-8, 9-32 and 33-128; an unpinned context takes the one
// holding the batch for 4, 20 and 100, and any batch in a range always picks that range's profile.
TEST(BuilderProfiles, ThreeBatchProfilesEachBatchTakesItsOwn) {
  auto g = ir::parse_text(R"(graph g(%x: float32[n, 4]) -> (%y: float32[n, 4]) {
  opset ai.onnx 17
  %y: float32[n, 4] = Relu(%x)  # relu
}
)",
                          {});
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  Network net;
  net.graph = std::move(g).value();
  BuilderConfig config;
  const int64_t ranges[3][3] = {{1, 4, 8}, {9, 20, 32}, {33, 64, 128}};
  for (const auto& r : ranges) {
    OptimizationProfile p;
    ASSERT_TRUE(p.set_dimensions("x", {r[0], 4}, {r[1], 4}, {r[2], 4}).ok());
    config.add_profile(p);
  }
  auto engine = Builder().build(net, config);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  for (int64_t batch : {4, 20, 100, 1, 8, 9, 32, 33, 128}) {
    auto out =
        (*ctx)->run({{"x", make_f32({batch, 4}, std::vector<float>(size_t(batch * 4), -1.f))}});
    ASSERT_TRUE(out.ok()) << batch << ": " << out.status().to_string();
    EXPECT_EQ(out->at("y").shape(), (Shape{batch, 4}));
    const int want = batch <= 8 ? 0 : batch <= 32 ? 1 : 2;
    EXPECT_EQ((*ctx)->optimization_profile(), want) << "batch " << batch;
  }
}

}  // namespace
}  // namespace kiln::testing
