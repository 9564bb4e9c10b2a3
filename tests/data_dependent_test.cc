// Engines with data-dependent output sizes (issue 15, item 1): a NonZero whose count sizes the
// layers after it and two of the engine's outputs. The run learns the count when the NonZero has
// run, sizes what follows by it, and returns outputs of exactly that size through run() and
// through output allocators (TensorRT's IOutputAllocator); execute() without an allocator for such
// an output is refused by name; the engine file keeps the bound; a tampered bound is refused at
// load; on CUDA (the GPU host) the same engine gives the same outputs, CUDA graph requested or not.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ir/text.h"
#include "kiln.h"
#include "model_util.h"
#include "plan/plan.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

// idx = NonZero(x) [2, nonzero]; y = the nonzero values squared [nonzero]; k = 2*[nonzero], a
// shape formula over the count.
const char* kModel =
    R"(graph g(%x: float32[n, 4]) -> (%idx: int64[?], %y: float32[?], %k: int64[?]) {
  %idx: int64[?] = NonZero(%x)  # nz
  %t: int64[?] = Transpose(%idx) {perm=[1, 0]}  # tr
  %v: float32[?] = GatherND(%x, %t)  # gather
  %y: float32[?] = Mul(%v, %v)  # square
  %s: int64[?] = Shape(%v)  # count
  %k: int64[?] = Add(%s, %s)  # twice
}
)";

StatusOr<Engine> build(Device device) {
  Network net;
  KILN_ASSIGN_OR_RETURN(net.graph, ir::parse_text(kModel, {}));
  BuilderConfig config;
  OptimizationProfile p;
  KILN_RETURN_IF_ERROR(p.set_dimensions("x", {1, 4}, {4, 4}, {8, 4}));
  config.add_profile(p);
  return Builder(device).build(net, config);
}

// x of n rows with a zero wherever (row + col + seed) % 3 == 0.
Tensor input(int64_t n, int seed) {
  std::vector<float> v(size_t(n * 4));
  for (int64_t i = 0; i < n * 4; ++i)
    v[size_t(i)] = (i / 4 + i % 4 + seed) % 3 == 0 ? 0.f : float(i + 1) * 0.5f;
  return make_f32({n, 4}, v);
}

// What the model computes, by hand.
void expect_outputs(const Tensor& x, const std::map<std::string, Tensor>& out,
                    const std::string& where) {
  std::vector<int64_t> rows, cols;
  std::vector<float> sq;
  const float* xs = x.data_as<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (xs[i] == 0) continue;
    rows.push_back(i / 4), cols.push_back(i % 4), sq.push_back(xs[i] * xs[i]);
  }
  const int64_t c = int64_t(rows.size());
  std::vector<int64_t> idx = rows;
  idx.insert(idx.end(), cols.begin(), cols.end());
  ASSERT_EQ(out.at("idx").shape(), (Shape{2, c})) << where;
  ASSERT_EQ(out.at("y").shape(), (Shape{c})) << where;
  ASSERT_EQ(out.at("k").shape(), (Shape{1})) << where;
  EXPECT_TRUE(all_close(out.at("idx"), make_i64({2, c}, idx), 0, 0)) << where;
  EXPECT_TRUE(all_close(out.at("y"), make_f32({c}, sq), 0, 0)) << where;
  EXPECT_EQ(out.at("k").data_as<int64_t>()[0], 2 * c) << where;
}

TEST(DataDependent, NonZeroSizesTheLayersAfterItAndTheOutputs) {
  auto engine = build(Device::kCPU);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ(ir::dims_to_string(*engine->tensor_symbolic_shape("idx")), "[2, nonzero]");
  EXPECT_EQ(ir::dims_to_string(*engine->tensor_symbolic_shape("y")), "[nonzero]");
  EXPECT_EQ(*engine->tensor_shape("idx"), (Shape{2, -1}));
  ASSERT_EQ(engine->plan().data_dependent.size(), 1u);
  EXPECT_EQ(engine->plan().data_dependent[0].bound.to_string(), "4*n");
  for (const LayerInfo& l : engine->layers()) EXPECT_EQ(l.data_dependent, l.name == "nz") << l.name;

  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  for (auto [n, seed] : {std::pair<int64_t, int>{2, 0}, {5, 1}, {8, 2}, {3, 0}}) {
    Tensor x = input(n, seed);
    auto out = (*ctx)->run({{"x", x}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    expect_outputs(x, *out, "n " + std::to_string(n));
    EXPECT_EQ((*ctx)->tensor_shape("y")->at(0), out->at("y").shape()[0])
        << "the shape of the last run";
  }
  // All zeros: a count of 0 empties what follows.
  auto none = (*ctx)->run({{"x", make_f32({2, 4}, std::vector<float>(8, 0.f))}});
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_EQ(none->at("idx").shape(), (Shape{2, 0}));
  EXPECT_EQ(none->at("y").shape(), (Shape{0}));
  EXPECT_EQ(none->at("k").data_as<int64_t>()[0], 0);
  // The arena was sized at the bound for the shapes run (4*n at n = 8 at most), never past it.
  EXPECT_LE(int64_t((*ctx)->arena_bytes()), *engine->activation_bytes(0, OptProfileSelector::kMAX));
}

// TensorRT's way: an output allocator per output of data-dependent size.
class Recorder : public OutputAllocator {
 public:
  void* reallocate_output(const std::string& name, void*, size_t bytes, size_t) override {
    buffer.assign(bytes + 1, 0);
    requested = bytes;
    return buffer.data();
  }
  void notify_shape(const std::string&, const Shape& s) override { shape = s; }
  std::vector<uint8_t> buffer;
  size_t requested = 0;
  Shape shape;
};

TEST(DataDependent, ExecuteNeedsAnAllocatorForSuchOutputs) {
  auto engine = build(Device::kCPU);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  Tensor x = input(3, 1);
  int64_t k = -1;
  ASSERT_TRUE((*ctx)->set_input_shape("x", x.shape()).ok());
  ASSERT_TRUE((*ctx)->set_tensor_address("x", x.data()).ok());
  ASSERT_TRUE((*ctx)->set_tensor_address("k", &k).ok());
  EXPECT_EQ(*(*ctx)->tensor_shape("idx"), (Shape{2, -1})) << "unknown until a run";
  EXPECT_EQ(*(*ctx)->tensor_shape("k"), (Shape{1})) << "its shape does not wait for the data";
  Status st = (*ctx)->execute();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "output 'idx' has a data-dependent shape [2, nonzero]: give it an output allocator "
            "(set_output_allocator), or use run()");
  Recorder idx, y;
  ASSERT_TRUE((*ctx)->set_output_allocator("idx", &idx).ok());
  ASSERT_TRUE((*ctx)->set_output_allocator("y", &y).ok());
  st = (*ctx)->execute();
  ASSERT_TRUE(st.ok()) << st.to_string();
  std::map<std::string, Tensor> out;
  out["idx"] = Tensor::wrap(DType::kInt64, idx.shape, idx.buffer.data(), nullptr);
  out["y"] = Tensor::wrap(DType::kFloat32, y.shape, y.buffer.data(), nullptr);
  out["k"] = Tensor::wrap(DType::kInt64, {1}, &k, nullptr);
  expect_outputs(x, out, "execute");
  EXPECT_EQ(idx.requested, size_t(shape_numel(idx.shape)) * 8) << "the exact size, not the bound";
  EXPECT_EQ(*(*ctx)->tensor_shape("idx"), idx.shape);
}

TEST(DataDependent, TheEngineFileKeepsTheBoundAndATamperedOneIsRefused) {
  auto engine = build(Device::kCPU);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto loaded = Engine::deserialize(engine->serialize());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  ASSERT_EQ(loaded->plan().data_dependent.size(), 1u);
  EXPECT_EQ(loaded->plan().data_dependent[0].symbol, "nonzero");
  auto ctx = loaded->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  Tensor x = input(6, 2);
  auto out = (*ctx)->run({{"x", x}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  expect_outputs(x, *out, "loaded");

  // A smaller bound would let the NonZero write past its buffer: refused before anything runs.
  plan::Plan tampered = engine->plan();
  tampered.data_dependent[0].bound = ir::Dim(1);
  auto bad = Engine::from_plan(tampered);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("data-dependent dim nonzero is bounded by [0, 1] in the "
                                        "plan, but the node bounds it by [0, 4*n]"),
            std::string::npos)
      << bad.status().message();
  // An output of data-dependent size stored as the caller's buffer is refused too.
  tampered = engine->plan();
  for (int v : tampered.graph.outputs) {
    if (tampered.graph.values[v].name == "y") tampered.values[v].storage = plan::Storage::kOutput;
  }
  bad = Engine::from_plan(tampered);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(
      bad.status().message().find("outputs of data-dependent size are written into the arena"),
      std::string::npos)
      << bad.status().message();
}

TEST(DataDependent, CudaGivesTheSameOutputs) {
  Status why = device_available(Device::kCUDA);
  if (!why.ok()) GTEST_SKIP() << why.message();
  auto engine = build(Device::kCUDA);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  bool host_kernel = false;
  for (const LayerInfo& l : engine->layers())
    host_kernel |= l.kernel == "cuda.host.NonZero" && l.data_dependent;
  EXPECT_TRUE(host_kernel);
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  for (bool graph : {false, true}) {
    (*ctx)->set_use_cuda_graph(graph);
    for (auto [n, seed] : {std::pair<int64_t, int>{8, 0}, {2, 1}, {8, 2}}) {
      Tensor x = input(n, seed);
      auto out = (*ctx)->run({{"x", x}});
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      expect_outputs(x, *out, "cuda n " + std::to_string(n) + (graph ? " graph" : ""));
    }
  }
}

}  // namespace
}  // namespace kiln::testing
