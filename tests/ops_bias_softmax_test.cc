// kiln::BiasSoftmax (made by fuse_bias_softmax): shape inference, the kernels on every backend
// against the unfused Add and Softmax (the CPU reference bit for bit in every float type), rows of
// each length class of the CUDA kernels with each mask broadcast, fully masked rows, and a CPU
// engine of the written-out graph (one layer) against that graph run node by node.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/kernel_registry.h"
#include "builder/builder.h"
#include "ir/text.h"
#include "model_util.h"
#include "op_harness.h"
#include "typed_values.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::f32;
using testing::infer_node;
using testing::op;
using testing::OpNode;
using testing::run_case;
using testing::typed;

OpNode bias_softmax() { return op("BiasSoftmax", 1, "kiln"); }

// Add then Softmax over the last axis, each by its CPU reference kernel, in x's dtype.
Tensor unfused(const Tensor& x, const Tensor& m) {
  auto sum = testing::run_cpu_kernel(op("Add", 14).node, {x, m}, {{x.dtype(), x.shape()}});
  EXPECT_TRUE(sum.ok()) << sum.status().to_string();
  if (!sum.ok()) return Tensor();
  auto y = testing::run_cpu_kernel(op("Softmax", 13).i("axis", -1).node, {(*sum)[0]},
                                   {{x.dtype(), x.shape()}});
  EXPECT_TRUE(y.ok()) << y.status().to_string();
  return y.ok() ? (*y)[0] : Tensor();
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

std::vector<double> values(const Shape& shape, uint64_t seed, double scale) {
  Tensor t = testing::random_f32(shape, seed);
  std::vector<double> v(size_t(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * t.data_as<float>()[i];
  return v;
}

TEST(BiasSoftmaxInfer, KeepsXsShapeAndChecksTheBroadcast) {
  const Dim n = Dim::symbol("n"), t = Dim::symbol("t");
  auto r = infer_node(bias_softmax(), {f32({n, 12, t, t}), f32({n, 1, 1, t})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[n, 12, t, t]");
  EXPECT_EQ(r.dtype(), DType::kFloat32);
  EXPECT_TRUE(infer_node(bias_softmax(), {f32({n, 12, t, t}), f32({t})}).ok());
  EXPECT_TRUE(
      infer_node(bias_softmax().i("axis", 3), {f32({n, 12, t, t}), f32({1, 1, t, t})}).ok());
  auto h =
      infer_node(bias_softmax(), {typed(DType::kFloat16, {2, 5}), typed(DType::kFloat16, {5})});
  ASSERT_TRUE(h.ok()) << h.status.to_string();
  EXPECT_EQ(h.dtype(), DType::kFloat16);
  // Not the last axis, B of higher rank than X, B that would grow X, dtypes apart.
  EXPECT_FALSE(infer_node(bias_softmax().i("axis", 1), {f32({2, 3, 4}), f32({4})}).ok());
  EXPECT_FALSE(infer_node(bias_softmax(), {f32({3, 4}), f32({2, 3, 4})}).ok());
  EXPECT_FALSE(infer_node(bias_softmax(), {f32({2, 1, 4}), f32({2, 3, 4})}).ok());
  EXPECT_FALSE(infer_node(bias_softmax(), {f32({2, 3, 4}), typed(DType::kFloat16, {4})}).ok());
  EXPECT_FALSE(infer_node(bias_softmax(), {f32({}), f32({})}).ok());
}

// The masks attention uses, over scores x of [N=2, H=3, S=4, T]: BERT's padding [N, 1, 1, T], a
// causal [1, 1, S, T] (a constant), a [T] bias, a full-size one and a per-row [N, H, S, 1] (a
// bias the rows do not share along their length). -inf marks masked keys, -10000 the older
// exporters' padding; no row is masked whole here (see FullyMaskedRowsAreNaN).
struct MaskForm {
  const char* name;
  Shape shape;
  bool constant;
};

std::vector<double> mask_values(const MaskForm& f, int64_t t, uint64_t seed) {
  std::vector<double> v = values(f.shape, seed, 1.0);
  const int64_t cols = f.shape.back();
  for (size_t i = 0; i < v.size(); ++i) {
    const int64_t j = int64_t(i) % cols, row = int64_t(i) / cols;
    if (cols == 1) continue;
    if (std::string(f.name) == "causal") {
      if (j > row + t - 4) v[i] = -INFINITY;  // S = 4 queries: the last sees every key
    } else if (j == cols - 1 && row % 2 == 1) {
      v[i] = -INFINITY;
    } else if (j == 0 && row % 3 == 2) {
      v[i] = -10000.0;
    }
  }
  return v;
}

TEST(BiasSoftmaxKernel, EveryMaskAndRowLengthMatchesAddThenSoftmax) {
  for (int64_t t : {7, 64, 128, 256, 1000}) {
    const Shape xs = {2, 3, 4, t};
    const std::vector<double> x = values(xs, uint64_t(t), 4.0);
    for (const MaskForm& f :
         {MaskForm{"padding", {2, 1, 1, t}, false}, MaskForm{"causal", {1, 1, 4, t}, true},
          MaskForm{"bias", {t}, true}, MaskForm{"full", {2, 3, 4, t}, false},
          MaskForm{"per-row", {2, 3, 4, 1}, false}}) {
      const std::vector<double> m = mask_values(f, t, uint64_t(t) + 7);
      for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
        const std::string label = std::string(f.name) + " mask, rows of " + std::to_string(t) +
                                  ", " + std::string(dtype_name(dt));
        // The float32 case rounded to dt is what run_reduced_case runs: the same tensors here.
        const Tensor xt = testing::make_typed(dt, xs, x);
        const Tensor mt = testing::make_typed(dt, f.shape, m);
        const Tensor expected = unfused(xt, mt);
        auto input = [&](Tensor v) {
          return f.constant ? testing::initializer(std::move(v)) : testing::CaseInput(std::move(v));
        };
        auto run = [&]() -> StatusOr<std::vector<Tensor>> {
          if (dt == DType::kFloat32) {
            return run_case({.node = bias_softmax(),
                             .inputs = {input(xt), input(mt)},
                             .expected = {expected},
                             .expect_support = true,
                             .label = label});
          }
          const Tensor x32 = testing::make_typed(DType::kFloat32, xs, x);
          const Tensor m32 = testing::make_typed(DType::kFloat32, f.shape, m);
          return testing::run_reduced_case({.node = bias_softmax(),
                                            .inputs = {input(x32), input(m32)},
                                            .expect_support = true,
                                            .label = label},
                                           dt);
        };
        auto out = run();
        ASSERT_TRUE(out.ok()) << label << ": " << out.status().to_string();
        // The reference gives the unfused kernels' bits: engines do not change results on the CPU.
        EXPECT_TRUE(same_bits((*out)[0], expected)) << label;
      }
    }
  }
}

// A row whose every key is masked by -inf is NaN, as Add then Softmax give it on every device
// (-inf - -inf); the other rows are as before.
TEST(BiasSoftmaxKernel, FullyMaskedRowsAreNaN) {
  for (int64_t t : {7, 64, 1000}) {
    const Shape xs = {2, 3, 4, t};
    const Tensor x = testing::make_typed(DType::kFloat32, xs, values(xs, 3, 4.0));
    std::vector<double> m(size_t(2 * t), 0.0);
    for (int64_t j = 0; j < t; ++j) m[size_t(t + j)] = -INFINITY;  // batch 1: every key masked
    const Tensor mt = testing::make_typed(DType::kFloat32, {2, 1, 1, t}, m);
    auto out = run_case({.node = bias_softmax(),
                         .inputs = {x, mt},
                         .expected = {unfused(x, mt)},
                         .expect_support = true,
                         .label = "fully masked, rows of " + std::to_string(t)});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    const float* y = (*out)[0].data_as<float>();
    const int64_t half = 3 * 4 * t;
    for (int64_t i = 0; i < half; ++i) ASSERT_TRUE(std::isfinite(y[i])) << t << " " << i;
    for (int64_t i = half; i < 2 * half; ++i) ASSERT_TRUE(std::isnan(y[i])) << t << " " << i;
  }
}

// Add then Softmax written out, built into a CPU engine: fuse_bias_softmax makes it one layer,
// whose float32 output has the bits of the graph run node by node on the reference kernels.
TEST(BiasSoftmaxEngine, Float32CpuEngineGivesTheUnfusedBits) {
  const int64_t s = 4, t = 64;
  std::string mask;
  for (int64_t i = 0; i < s; ++i) {
    for (int64_t j = 0; j < t; ++j) {
      char buf[32];
      if (j > i * 16 + 20) {
        std::snprintf(buf, sizeof buf, "-inf");
      } else {
        std::snprintf(buf, sizeof buf, "%.9g", 0.01 * double(j % 13) - 0.05 * double(i));
      }
      mask += (mask.empty() ? "" : ", ") + std::string(buf);
    }
  }
  const std::string text =
      "graph g(%x: float32[2, 3, 4, 64]) -> (%y: float32[2, 3, 4, 64]) {\n"
      "  opset ai.onnx 17\n"
      "  %m: float32[1, 1, 4, 64] = dense<[" +
      mask +
      "]>\n"
      "  %s: float32[2, 3, 4, 64] = Add(%x, %m)  # mask\n"
      "  %y: float32[2, 3, 4, 64] = Softmax(%s) {axis=-1}  # softmax\n"
      "}\n";
  auto g = ir::parse_text(text, {});
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  auto engine = testing::build_cpu(*g, {2, 3, 4, 64}, {2, 3, 4, 64});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  ASSERT_EQ(engine->num_layers(), 1);
  EXPECT_EQ(engine->layers()[0].op_type, "BiasSoftmax");
  EXPECT_EQ(engine->layers()[0].kernel, "cpu.BiasSoftmax");
  Tensor x = testing::random_f32({2, 3, 4, 64}, 5);
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] *= 8.0f;
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  auto out = (*ctx)->run({{"x", x}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  std::map<int, Tensor> reference = testing::run_unfused(*g, x);
  const Tensor& y = reference.at(g->find_value("y"));
  EXPECT_TRUE(same_bits(out->at("y"), y));
  testing::ErrorStats e = testing::error_stats(out->at("y"), y);
  EXPECT_EQ(e.max_abs, 0.0);
}

// The written-out graph built for CUDA in float32, float16 and bfloat16 data: one layer, the CUDA
// kernel (its factory accepts each type; a GPU run is the harness's case above).
TEST(BiasSoftmaxEngine, CudaPlansRunTheFusedKernel) {
  if (!backends::kernel_registry().has(ops::OpKind::kBiasSoftmax, Device::kCUDA)) {
    GTEST_SKIP() << "this build has no CUDA implementations (built without nvcc)";
  }
  for (const char* dt : {"float32", "float16", "bfloat16"}) {
    const std::string t(dt);
    const std::string text = "graph g(%x: " + t + "[2, 3, 4, 64], %pad: " + t +
                             "[2, 1, 1, 64]) -> (%y: " + t +
                             "[2, 3, 4, 64]) {\n"
                             "  opset ai.onnx 17\n"
                             "  %s: " +
                             t +
                             "[2, 3, 4, 64] = Add(%x, %pad)  # mask\n"
                             "  %y: " +
                             t +
                             "[2, 3, 4, 64] = Softmax(%s) {axis=-1}  # softmax\n"
                             "}\n";
    auto g = ir::parse_text(text, {});
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    testing::DeviceStub cuda(Device::kCUDA);
    auto plan = builder::build_plan(*g, 0, BuilderConfig(), cuda);
    ASSERT_TRUE(plan.ok()) << dt << ": " << plan.status().to_string();
    ASSERT_EQ(plan->graph.nodes.size(), 1u) << dt;
    EXPECT_EQ(plan->graph.nodes[0].op_type, "BiasSoftmax") << dt;
    EXPECT_EQ(plan->nodes[0].impl, "cuda.BiasSoftmax") << dt;
  }
}

}  // namespace
}  // namespace kiln
