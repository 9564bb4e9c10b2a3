// Quant op family: shape/dtype inference of QuantizeLinear/DequantizeLinear (per tensor, per axis,
// blocked), MatMulInteger and QLinearMatMul, and the kernels on every backend against hand-computed
// values.
#include <gtest/gtest.h>

#include <vector>

#include "op_harness.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::f32;
using testing::infer_node;
using testing::initializer;
using testing::make_f32;
using testing::op;
using testing::OpNode;
using testing::run_case;
using testing::typed;

template <typename T>
Tensor make(DType dt, Shape shape, std::vector<T> v) {
  return Tensor::from_vector(dt, std::move(shape), v);
}

TEST(QuantOpsInfer, QuantizeDtypeFromZeroPointOrAttribute) {
  const Dim b = Dim::symbol("b");
  auto r = infer_node(op("QuantizeLinear", 21), {f32({b, 3}), f32({3}), typed(DType::kInt8, {3})});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outputs[0].dtype, DType::kInt8);
  EXPECT_EQ(r.outputs[0].shape[0], b);
  OpNode n = op("QuantizeLinear", 21);
  n.i("output_dtype", 5);  // int16
  r = infer_node(n, {f32({4}), f32({})});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outputs[0].dtype, DType::kInt16);
  // A per-axis scale must match the axis length.
  EXPECT_FALSE(infer_node(op("QuantizeLinear", 21), {f32({2, 3}), f32({4})}).ok());
}

TEST(QuantOpsInfer, BlockedScaleShape) {
  OpNode n = op("DequantizeLinear", 21);
  n.i("axis", 1);
  n.i("block_size", 2);
  auto r = infer_node(n, {typed(DType::kUInt8, {3, 4}), f32({3, 2}), typed(DType::kUInt8, {3, 2})});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outputs[0].dtype, DType::kFloat32);
  EXPECT_FALSE(infer_node(n, {typed(DType::kUInt8, {3, 4}), f32({3, 3})}).status.ok());
}

TEST(QuantOpsKernel, QuantizeRoundsHalfToEvenAndSaturates) {
  OpNode n = op("QuantizeLinear", 21);
  Tensor x = make_f32({6}, {0.5f, 1.5f, 2.5f, -1.f, 300.f, 1000.f});
  auto out = run_case(n, {x, initializer(make_f32({}, {1.f})),
                          initializer(make<uint8_t>(DType::kUInt8, {}, {10}))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const uint8_t* y = (*out)[0].data_as<uint8_t>();
  EXPECT_EQ(std::vector<int>(y, y + 6), (std::vector<int>{10, 12, 12, 9, 255, 255}));
}

TEST(QuantOpsKernel, PerAxisAndBlockedDequantize) {
  OpNode n = op("DequantizeLinear", 21);
  n.i("axis", 0);
  Tensor q = make<int8_t>(DType::kInt8, {2, 2}, {1, 2, 3, 4});
  auto out = run_case(n, {q, initializer(make_f32({2}, {1.f, 10.f})),
                          initializer(make<int8_t>(DType::kInt8, {2}, {1, 0}))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({2, 2}, {0, 1, 30, 40})));
  n.i("axis", 1);
  n.i("block_size", 2);
  Tensor q2 = make<int8_t>(DType::kInt8, {1, 4}, {1, 1, 1, 1});
  out = run_case(n, {q2, initializer(make_f32({1, 2}, {2.f, 3.f}))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({1, 4}, {2, 2, 3, 3})));
}

TEST(QuantOpsKernel, DynamicQuantizeCoversZero) {
  auto out = run_case(op("DynamicQuantizeLinear", 11), {make_f32({3}, {0.f, 2.f, 5.1f})}, 3);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_NEAR((*out)[1].data_as<float>()[0], 5.1f / 255.f, 1e-7f);
  EXPECT_EQ((*out)[2].data_as<uint8_t>()[0], 0);
  EXPECT_EQ((*out)[0].data_as<uint8_t>()[2], 255);
}

TEST(QuantOpsKernel, MatMulIntegerSubtractsZeroPoints) {
  Tensor a = make<uint8_t>(DType::kUInt8, {1, 2}, {3, 5});
  Tensor b = make<uint8_t>(DType::kUInt8, {2, 1}, {2, 4});
  auto out = run_case(op("MatMulInteger", 10),
                      {a, initializer(b), initializer(make<uint8_t>(DType::kUInt8, {}, {1})),
                       initializer(make<uint8_t>(DType::kUInt8, {}, {2}))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].data_as<int32_t>()[0], (3 - 1) * 0 + (5 - 1) * 2);
}

TEST(QuantOpsKernel, QLinearMatMulRequantizes) {
  Tensor a = make<uint8_t>(DType::kUInt8, {1, 2}, {10, 20});
  Tensor b = make<uint8_t>(DType::kUInt8, {2, 1}, {1, 2});
  auto zero = initializer(make<uint8_t>(DType::kUInt8, {}, {0}));
  auto half = initializer(make_f32({}, {0.5f}));
  // (10*1 + 20*2) * 0.5 * 0.5 / 1 = 12.5 -> 12 (ties to even), + 3.
  auto out = run_case(op("QLinearMatMul", 10),
                      {a, half, zero, initializer(b), half, zero, initializer(make_f32({}, {1.f})),
                       initializer(make<uint8_t>(DType::kUInt8, {}, {3}))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].data_as<uint8_t>()[0], 15);
}

}  // namespace
}  // namespace kiln
