// CUDA graph cache and batch buckets (issue 15, item 6): graphs are kept per set of input shapes
// up to a capacity, least recently used dropped first; with buckets a batch runs at the next bucket
// up (inputs padded, outputs sliced back), so a batch that changes every call replays one of a few
// graphs while every output keeps its exact shape. The CUDA cases run on the GPU host.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ir/text.h"
#include "kiln.h"
#include "model_util.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

// y = Relu(x @ w) + 1: rows independent, [batch, 8] out.
const char* kRows = R"(graph g(%x: float32[batch, 16]) -> (%y: float32[?]) {
  %w: float32[16, 8] = dense<...>
  %one: float32[1] = dense<1.0>
  %h: float32[?] = MatMul(%x, %w)  # mm
  %r: float32[?] = Relu(%h)  # relu
  %y: float32[?] = Add(%r, %one)  # add
}
)";
// s = ReduceSum over the batch: padding rows would change it.
const char* kAcrossBatch = R"(graph g(%x: float32[batch, 16]) -> (%s: float32[?]) {
  %axes: int64[1] = dense<0>
  %s: float32[?] = ReduceSum(%x, %axes) {keepdims=0}  # sum
}
)";

StatusOr<Engine> build(const char* text, Device device) {
  Network net;
  ir::TextParseOptions options;
  options.elided = [](std::string_view key, DType, const Shape& shape) -> StatusOr<Tensor> {
    if (key == "w") return random_f32(shape, 7);
    return invalid_argument("no data for " + std::string(key));
  };
  KILN_ASSIGN_OR_RETURN(net.graph, ir::parse_text(text, options));
  BuilderConfig config;
  config.clear_flag(BuilderFlag::kTF32);
  OptimizationProfile p;
  KILN_RETURN_IF_ERROR(p.set_dimensions("x", {1, 16}, {4, 16}, {8, 16}));
  config.add_profile(p);
  return Builder(device).build(net, config);
}

TEST(GraphCache, BucketsAreRefusedOnTheCpu) {
  auto engine = build(kRows, Device::kCPU);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  Status st = (*ctx)->set_batch_buckets({1, 2, 4, 8});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "batch buckets pad runs to replay CUDA graphs; the cpu backend has none");
  EXPECT_TRUE((*ctx)->set_batch_buckets({}).ok());
}

class GraphCacheCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    Status why = device_available(Device::kCUDA);
    if (!why.ok()) GTEST_SKIP() << why.message();
  }
};

// The CPU engine's outputs for x, the reference.
Tensor reference(const Tensor& x) {
  auto engine = build(kRows, Device::kCPU);
  auto ctx = engine->create_execution_context();
  return (*ctx)->run({{"x", x}})->at("y");
}

TEST_F(GraphCacheCuda, KeepsGraphsPerShapeUpToItsCapacity) {
  auto engine = build(kRows, Device::kCUDA);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  (*ctx)->set_use_cuda_graph(true);
  (*ctx)->set_cuda_graph_cache_capacity(2);
  // Batch 8 first sizes the staging buffers, whose addresses are part of each graph's key.
  for (int64_t b : {8, 1, 2, 1, 3, 2}) {
    Tensor x = random_f32({b, 16}, uint64_t(b));
    auto out = (*ctx)->run({{"x", x}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_TRUE(all_close(out->at("y"), reference(x), 1e-5, 1e-5)) << "batch " << b;
  }
  // 8, 1, 2 captured (8 evicted by 2), 1 replayed, 3 captured (2 evicted), 2 captured (1 evicted).
  const auto s = (*ctx)->cuda_graph_stats();
  EXPECT_EQ(s.captures, 5);
  EXPECT_EQ(s.replays, 1);
  EXPECT_EQ(s.evictions, 3);
  EXPECT_EQ(s.cached, 2u);
}

TEST_F(GraphCacheCuda, BucketsPadTheBatchAndKeepOutputsExact) {
  auto across = build(kAcrossBatch, Device::kCUDA);
  ASSERT_TRUE(across.ok()) << across.status().to_string();
  auto actx = across->create_execution_context();
  ASSERT_TRUE(actx.ok());
  Status refused = (*actx)->set_batch_buckets({1, 2, 4, 8});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("does not start with the batch"), std::string::npos)
      << refused.message();

  auto engine = build(kRows, Device::kCUDA);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  (*ctx)->set_use_cuda_graph(true);
  ASSERT_TRUE((*ctx)->set_batch_buckets({1, 2, 4, 8}).ok());
  for (int64_t b : {8, 3, 5, 7, 2, 6, 1, 4, 3, 5}) {
    Tensor x = random_f32({b, 16}, uint64_t(100 + b));
    auto out = (*ctx)->run({{"x", x}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    ASSERT_EQ(out->at("y").shape(), (Shape{b, 8}));
    EXPECT_TRUE(all_close(out->at("y"), reference(x), 1e-5, 1e-5)) << "batch " << b;
    EXPECT_EQ(*(*ctx)->tensor_shape("y"), (Shape{b, 8}));
  }
  // Only the buckets' shapes were ever captured.
  const auto s = (*ctx)->cuda_graph_stats();
  EXPECT_LE(s.captures, 4);
  EXPECT_EQ(s.evictions, 0);
}

}  // namespace
}  // namespace kiln::testing
