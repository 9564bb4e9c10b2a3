// Quant op family: shape/dtype inference of QuantizeLinear/DequantizeLinear (per tensor, per axis,
// blocked), MatMulInteger and QLinearMatMul, and the kernels on every backend against hand-computed
// values.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "op_harness.h"
#include "typed_values.h"

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


// Every float input and quantized output dtype, per tensor, per axis and blocked, with and without
// a zero point; then back (CUDA: quant.cu).
TEST(QuantOpsKernel, QuantizeDequantizeEveryDtypeAndGranularity) {
  std::vector<double> xv(24);
  for (int i = 0; i < 24; ++i) xv[i] = (i - 11.5) * 1.75;
  auto expect = [](OpNode n, std::vector<testing::CaseInput> in, int outs = 1) {
    testing::KernelCase c{.node = std::move(n), .inputs = std::move(in), .num_outputs = outs, .expect_support = true};
    auto r = run_case(c);
    EXPECT_TRUE(r.ok()) << c.node.node.describe() << ": " << r.status().to_string();
  };
  for (DType ft : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (DType qt : {DType::kInt8, DType::kUInt8, DType::kInt16, DType::kUInt16, DType::kInt32}) {
      SCOPED_TRACE(std::string(dtype_name(ft)) + " / " + std::string(dtype_name(qt)));
      bool sgn = qt != DType::kUInt8 && qt != DType::kUInt16;
      Tensor x = testing::make_typed(ft, {2, 3, 4}, xv);
      Tensor q = testing::make_typed(qt, {2, 3, 4}, sgn ? xv : std::vector<double>(24, 7));
      // per tensor
      Tensor s1 = testing::make_typed(ft, {}, {0.5}), z1 = testing::make_typed(qt, {}, {3});
      expect(op("QuantizeLinear", 21), {x, initializer(s1), initializer(z1)});
      expect(op("DequantizeLinear", 21), {q, initializer(s1), initializer(z1)});
      // per axis (axis 1), zero point omitted on dequantize
      Tensor s3 = testing::make_typed(ft, {3}, {0.25, 1.0, 3.0}), z3 = testing::make_typed(qt, {3}, {0, 5, 2});
      expect(op("QuantizeLinear", 21).i("axis", 1), {x, initializer(s3), initializer(z3)});
      expect(op("DequantizeLinear", 21).i("axis", 1), {q, initializer(s3)});
      // blocked along the last axis, blocks of 3 over 4 (a ragged last block)
      Tensor sb = testing::make_typed(ft, {2, 3, 2}, {0.5, 1, 2, 0.25, 4, 1, 1, 2, 0.5, 3, 0.75, 1.5});
      Tensor zb = testing::make_typed(qt, {2, 3, 2}, std::vector<double>(12, 1));
      expect(op("QuantizeLinear", 21).i("axis", -1).i("block_size", 3), {x, initializer(sb), initializer(zb)});
      expect(op("DequantizeLinear", 21).i("axis", 2).i("block_size", 3), {q, initializer(sb), initializer(zb)});
    }
  }
  // DynamicQuantizeLinear: all negative, all positive, mixed, and a long input.
  std::vector<float> big(5000);
  for (int i = 0; i < 5000; ++i) big[i] = float(std::sin(i * 0.01) * 7 + 1);
  for (const Tensor& x : {make_f32({4}, {-1, -2, -3, -0.5f}), make_f32({2, 2}, {1, 2, 3, 0.25f}),
                          make_f32({3}, {-2.5f, 0, 6}), make_f32({5000}, big)}) {
    expect(op("DynamicQuantizeLinear", 11), {x}, 3);
  }
}

}  // namespace
}  // namespace kiln
