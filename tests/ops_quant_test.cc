// Quant op family: shape/dtype inference of QuantizeLinear/DequantizeLinear (per tensor, per axis,
// blocked), MatMulInteger and QLinearMatMul, and the CPU kernels against hand-computed values.
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "ops/schema.h"
#include "test_util.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::make_f32;
using testing::run_cpu_kernel;

struct In {
  DType dtype;
  std::vector<Dim> shape;
};

struct Inferred {
  Status status;
  std::vector<ops::InferContext::Output> outs;
};

Inferred infer(ir::Node node, const std::vector<In>& inputs, int num_outputs = 1) {
  ir::Graph g;
  for (const auto& in : inputs) {
    int v = g.add_value("in" + std::to_string(g.values.size()));
    g.values[v].dtype = in.dtype;
    g.values[v].shape = in.shape;
    node.inputs.push_back(v);
  }
  for (int i = 0; i < num_outputs; ++i)
    node.outputs.push_back(g.add_value("out" + std::to_string(i)));
  g.nodes.push_back(node);
  std::vector<ops::Constraint> constraints;
  ops::InferContext ctx(g, g.nodes[0], 0, &constraints);
  const ops::OpSchema* schema = ops::find_schema(g.nodes[0]);
  if (!schema) return {internal_error("no schema for " + node.op_type), {}};
  Status s = schema->infer(ctx);
  return {s, ctx.outputs()};
}

ir::Node make_node(const std::string& op, int opset) {
  ir::Node n;
  n.name = "q0";
  n.op_type = op;
  n.opset = opset;
  return n;
}

void set_int(ir::Node& n, const std::string& name, int64_t v) {
  ir::Attribute a;
  a.type = ir::AttrType::kInt;
  a.i = v;
  n.attrs.set(name, a);
}

template <typename T>
Tensor make(DType dt, Shape shape, std::vector<T> v) {
  return Tensor::from_vector(dt, std::move(shape), v);
}

TEST(QuantOpsInfer, QuantizeDtypeFromZeroPointOrAttribute) {
  const Dim b = Dim::symbol("b");
  auto r = infer(make_node("QuantizeLinear", 21),
                 {{DType::kFloat32, {b, 3}}, {DType::kFloat32, {3}}, {DType::kInt8, {3}}});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outs[0].dtype, DType::kInt8);
  EXPECT_EQ(r.outs[0].shape[0], b);
  ir::Node n = make_node("QuantizeLinear", 21);
  set_int(n, "output_dtype", 5);  // int16
  r = infer(n, {{DType::kFloat32, {4}}, {DType::kFloat32, {}}});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outs[0].dtype, DType::kInt16);
  // A per-axis scale must match the axis length.
  EXPECT_FALSE(
      infer(make_node("QuantizeLinear", 21), {{DType::kFloat32, {2, 3}}, {DType::kFloat32, {4}}})
          .status.ok());
}

TEST(QuantOpsInfer, BlockedScaleShape) {
  ir::Node n = make_node("DequantizeLinear", 21);
  set_int(n, "axis", 1);
  set_int(n, "block_size", 2);
  auto r = infer(n, {{DType::kUInt8, {3, 4}}, {DType::kFloat32, {3, 2}}, {DType::kUInt8, {3, 2}}});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outs[0].dtype, DType::kFloat32);
  EXPECT_FALSE(infer(n, {{DType::kUInt8, {3, 4}}, {DType::kFloat32, {3, 3}}}).status.ok());
}

TEST(QuantOpsKernel, QuantizeRoundsHalfToEvenAndSaturates) {
  ir::Node n = make_node("QuantizeLinear", 21);
  Tensor x = make_f32({6}, {0.5f, 1.5f, 2.5f, -1.f, 300.f, 1000.f});
  auto out = run_cpu_kernel(n, {x, make_f32({}, {1.f}), make<uint8_t>(DType::kUInt8, {}, {10})},
                            {{DType::kUInt8, {6}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const uint8_t* y = (*out)[0].data_as<uint8_t>();
  EXPECT_EQ(std::vector<int>(y, y + 6), (std::vector<int>{10, 12, 12, 9, 255, 255}));
}

TEST(QuantOpsKernel, PerAxisAndBlockedDequantize) {
  ir::Node n = make_node("DequantizeLinear", 21);
  set_int(n, "axis", 0);
  Tensor q = make<int8_t>(DType::kInt8, {2, 2}, {1, 2, 3, 4});
  auto out =
      run_cpu_kernel(n, {q, make_f32({2}, {1.f, 10.f}), make<int8_t>(DType::kInt8, {2}, {1, 0})},
                     {{DType::kFloat32, {2, 2}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({2, 2}, {0, 1, 30, 40})));
  set_int(n, "axis", 1);
  set_int(n, "block_size", 2);
  Tensor q2 = make<int8_t>(DType::kInt8, {1, 4}, {1, 1, 1, 1});
  out = run_cpu_kernel(n, {q2, make_f32({1, 2}, {2.f, 3.f})}, {{DType::kFloat32, {1, 4}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({1, 4}, {2, 2, 3, 3})));
}

TEST(QuantOpsKernel, DynamicQuantizeCoversZero) {
  auto out =
      run_cpu_kernel(make_node("DynamicQuantizeLinear", 11), {make_f32({3}, {0.f, 2.f, 5.1f})},
                     {{DType::kUInt8, {3}}, {DType::kFloat32, {}}, {DType::kUInt8, {}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_NEAR((*out)[1].data_as<float>()[0], 5.1f / 255.f, 1e-7f);
  EXPECT_EQ((*out)[2].data_as<uint8_t>()[0], 0);
  EXPECT_EQ((*out)[0].data_as<uint8_t>()[2], 255);
}

TEST(QuantOpsKernel, MatMulIntegerSubtractsZeroPoints) {
  Tensor a = make<uint8_t>(DType::kUInt8, {1, 2}, {3, 5});
  Tensor b = make<uint8_t>(DType::kUInt8, {2, 1}, {2, 4});
  auto out = run_cpu_kernel(
      make_node("MatMulInteger", 10),
      {a, b, make<uint8_t>(DType::kUInt8, {}, {1}), make<uint8_t>(DType::kUInt8, {}, {2})},
      {{DType::kInt32, {1, 1}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].data_as<int32_t>()[0], (3 - 1) * 0 + (5 - 1) * 2);
}

TEST(QuantOpsKernel, QLinearMatMulRequantizes) {
  Tensor a = make<uint8_t>(DType::kUInt8, {1, 2}, {10, 20});
  Tensor b = make<uint8_t>(DType::kUInt8, {2, 1}, {1, 2});
  Tensor zero = make<uint8_t>(DType::kUInt8, {}, {0});
  // (10*1 + 20*2) * 0.5 * 0.5 / 1 = 12.5 -> 12 (ties to even), + 3.
  auto out = run_cpu_kernel(make_node("QLinearMatMul", 10),
                            {a, make_f32({}, {0.5f}), zero, b, make_f32({}, {0.5f}), zero,
                             make_f32({}, {1.f}), make<uint8_t>(DType::kUInt8, {}, {3})},
                            {{DType::kUInt8, {1, 1}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].data_as<uint8_t>()[0], 15);
}

}  // namespace
}  // namespace kiln
