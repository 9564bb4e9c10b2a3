// Quant op family: shape/dtype inference of QuantizeLinear/DequantizeLinear (per tensor, per axis,
// blocked), MatMulInteger and QLinearMatMul, and the kernels on every backend (ConvInteger and
// QLinearConv too) against hand-computed values and the ONNX node tests' expected outputs.
#include <gtest/gtest.h>

#include <algorithm>
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

// ONNX Runtime's quantize_static writes a per-tensor scale of shape [1] beside a scalar zero point
// (its QDQ transformers' biases): one element each is per tensor, as ORT runs it; other shape
// mismatches of scale and zero point stay errors.
TEST(QuantOpsKernel, OneElementScaleAndScalarZeroPointArePerTensor) {
  OpNode n = op("DequantizeLinear", 21);
  auto inferred = infer_node(n, {typed(DType::kInt32, {4}), f32({1}), typed(DType::kInt32, {})});
  ASSERT_TRUE(inferred.status.ok()) << inferred.status.to_string();
  EXPECT_FALSE(infer_node(n, {typed(DType::kInt32, {4}), f32({4}), typed(DType::kInt32, {})}).ok());
  auto out = run_case(
      n, {make<int32_t>(DType::kInt32, {4}, {-3, 0, 5, 1000}), initializer(make_f32({1}, {0.5f})),
          initializer(make<int32_t>(DType::kInt32, {}, {1}))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const float* y = (*out)[0].data_as<float>();
  EXPECT_EQ(std::vector<float>(y, y + 4), (std::vector<float>{-2.f, -0.5f, 2.f, 499.5f}));
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
    testing::KernelCase c{
        .node = std::move(n), .inputs = std::move(in), .num_outputs = outs, .expect_support = true};
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
      Tensor s3 = testing::make_typed(ft, {3}, {0.25, 1.0, 3.0}),
             z3 = testing::make_typed(qt, {3}, {0, 5, 2});
      expect(op("QuantizeLinear", 21).i("axis", 1), {x, initializer(s3), initializer(z3)});
      expect(op("DequantizeLinear", 21).i("axis", 1), {q, initializer(s3)});
      // blocked along the last axis, blocks of 3 over 4 (a ragged last block)
      Tensor sb =
          testing::make_typed(ft, {2, 3, 2}, {0.5, 1, 2, 0.25, 4, 1, 1, 2, 0.5, 3, 0.75, 1.5});
      Tensor zb = testing::make_typed(qt, {2, 3, 2}, std::vector<double>(12, 1));
      expect(op("QuantizeLinear", 21).i("axis", -1).i("block_size", 3),
             {x, initializer(sb), initializer(zb)});
      expect(op("DequantizeLinear", 21).i("axis", 2).i("block_size", 3),
             {q, initializer(sb), initializer(zb)});
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

// ---- integer convolution and matmul (CUDA: quant_gemm.cu) ----

using testing::CaseInput;
using testing::kNoInput;
using testing::make_typed;

// n deterministic 8-bit values of dtype dt that cover the type's range.
Tensor pattern(DType dt, Shape shape, int seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t u = (i * 73 + seed * 41 + (i * i) % 29) % 256;
    v[size_t(i)] = dt == DType::kInt8 ? double(u - 128) : double(u);
  }
  return make_typed(dt, std::move(shape), v);
}

// Runs a case that every backend present must support; returns the reference outputs.
std::vector<Tensor> expect_case(OpNode n, std::vector<CaseInput> in,
                                std::vector<Tensor> expected = {}) {
  testing::KernelCase c{.node = std::move(n),
                        .inputs = std::move(in),
                        .expected = std::move(expected),
                        .expect_support = true};
  auto r = run_case(c);
  EXPECT_TRUE(r.ok()) << c.node.node.describe() << ": " << r.status().to_string();
  return r.ok() ? *r : std::vector<Tensor>{};
}

TEST(QuantOpsKernel, ConvIntegerOnnxCases) {
  Tensor x = make<uint8_t>(DType::kUInt8, {1, 1, 3, 3}, {2, 3, 4, 5, 6, 7, 8, 9, 10});
  Tensor xz = make<uint8_t>(DType::kUInt8, {}, {1});
  // test_convinteger_without_padding
  expect_case(op("ConvInteger", 10),
              {x, initializer(make<uint8_t>(DType::kUInt8, {1, 1, 2, 2}, {1, 1, 1, 1})), xz},
              {make<int32_t>(DType::kInt32, {1, 1, 2, 2}, {12, 16, 24, 28})});
  // test_convinteger_with_padding: the w zero point per output channel; padding adds nothing.
  std::vector<int32_t> y(32, 0);
  std::vector<int32_t> c0 = {1, 3, 5, 3, 5, 12, 16, 9, 11, 24, 28, 15, 7, 15, 17, 9};
  std::copy(c0.begin(), c0.end(), y.begin());
  expect_case(
      op("ConvInteger", 10).ints("pads", {1, 1, 1, 1}),
      {x, initializer(make<uint8_t>(DType::kUInt8, {2, 1, 2, 2}, std::vector<uint8_t>(8, 1))), xz,
       initializer(make<uint8_t>(DType::kUInt8, {2}, {0, 1}))},
      {make<int32_t>(DType::kInt32, {1, 2, 4, 4}, y)});
}

// Every operand dtype pair, with and without zero points, over groups, strides, dilations, pads
// and auto_pad, in 1-D, 2-D and 3-D.
TEST(QuantOpsKernel, ConvIntegerDtypesGeometryAndZeroPoints) {
  for (DType xt : {DType::kUInt8, DType::kInt8}) {
    for (DType wt : {DType::kUInt8, DType::kInt8}) {
      SCOPED_TRACE(std::string(dtype_name(xt)) + " x " + std::string(dtype_name(wt)));
      Tensor x = pattern(xt, {2, 4, 6, 5}, 1);
      Tensor w = pattern(wt, {6, 2, 3, 3}, 2);
      CaseInput xz = make_typed(xt, {}, {xt == DType::kInt8 ? -3.0 : 120.0});
      CaseInput wz = initializer(make_typed(wt, {}, {wt == DType::kInt8 ? 5.0 : 130.0}));
      CaseInput wz6 = initializer(make_typed(wt, {6}, {0, 1, 2, 3, 100, 120}));
      // groups 2, strides, dilations and asymmetric pads; per-tensor zero points
      expect_case(op("ConvInteger", 10)
                      .i("group", 2)
                      .ints("strides", {2, 1})
                      .ints("dilations", {1, 2})
                      .ints("pads", {1, 0, 2, 1}),
                  {x, initializer(w), xz, wz});
      // per-channel w zero point, x zero point omitted
      expect_case(op("ConvInteger", 10).i("group", 2), {x, initializer(w), kNoInput, wz6});
      // no zero points, SAME_UPPER / SAME_LOWER / VALID with stride 2
      for (const char* pad : {"SAME_UPPER", "SAME_LOWER", "VALID"}) {
        expect_case(op("ConvInteger", 10).i("group", 2).s("auto_pad", pad).ints("strides", {2, 2}),
                    {x, w});
      }
      // depthwise 1-D and a 3-D convolution
      expect_case(op("ConvInteger", 10).i("group", 3).ints("pads", {2, 1}),
                  {pattern(xt, {2, 3, 11}, 3), initializer(pattern(wt, {3, 1, 4}, 4)), xz});
      expect_case(
          op("ConvInteger", 10).ints("pads", {1, 0, 1, 0, 1, 1}).ints("strides", {1, 2, 1}),
          {pattern(xt, {1, 2, 4, 5, 3}, 5), initializer(pattern(wt, {3, 2, 2, 3, 2}, 6)), xz, wz});
    }
  }
}

TEST(QuantOpsKernel, QLinearConvOnnxCase) {
  Tensor x = make<uint8_t>(
      DType::kUInt8, {1, 1, 7, 7},
      {255, 174, 162, 25,  203, 168, 58,  15,  59,  237, 95,  129, 0,  64,  56, 242, 153,
       221, 168, 12,  166, 232, 178, 186, 195, 237, 162, 237, 188, 39, 124, 77, 80,  102,
       43,  127, 230, 21,  83,  41,  40,  134, 255, 154, 92,  141, 42, 148, 247});
  Tensor y = make<uint8_t>(
      DType::kUInt8, {1, 1, 7, 7},
      {0,   81,  93,  230, 52,  87,  197, 240, 196, 18,  160, 126, 255, 191, 199, 13,  102,
       34,  87,  243, 89,  23,  77,  69,  60,  18,  93,  18,  67,  216, 131, 178, 175, 153,
       212, 128, 25,  234, 172, 214, 215, 121, 0,   101, 163, 114, 213, 107, 8});
  expect_case(op("QLinearConv", 10),
              {x, make_f32({}, {0.00369204697f}), make<uint8_t>(DType::kUInt8, {}, {132}),
               initializer(make<uint8_t>(DType::kUInt8, {1, 1, 1, 1}, {0})),
               make_f32({1}, {0.00172794575f}), make<uint8_t>(DType::kUInt8, {1}, {255}),
               make_f32({}, {0.00162681262f}), make<uint8_t>(DType::kUInt8, {}, {123})},
              {y});
}

// Per-tensor and per-channel w scales and zero points, int32 bias, int8 and uint8 outputs, scales
// of every float dtype; a 1x1 convolution by 1 with a multiplier of 0.5, whose odd sums tie (x.5)
// and whose large ones saturate.
TEST(QuantOpsKernel, QLinearConvRequantizesPerChannel) {
  for (DType st : {DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kBFloat16}) {
    for (DType qt : {DType::kUInt8, DType::kInt8}) {
      SCOPED_TRACE(std::string(dtype_name(st)) + " scales, " + std::string(dtype_name(qt)));
      Tensor x = pattern(qt, {2, 4, 5, 5}, 7);
      Tensor w = pattern(DType::kInt8, {6, 2, 3, 3}, 8);
      CaseInput xs = make_typed(st, {}, {0.25}), ys = make_typed(st, {}, {64.0});
      CaseInput xz = make_typed(qt, {}, {qt == DType::kInt8 ? 1.0 : 128.0});
      CaseInput yz = make_typed(qt, {}, {qt == DType::kInt8 ? -2.0 : 130.0});
      Tensor ws6 = make_typed(st, {6}, {0.5, 0.25, 1.0, 2.0, 0.125, 0.75});
      Tensor wz6 = make_typed(DType::kInt8, {6}, {0, 1, -1, 3, -4, 0});
      Tensor bias = make<int32_t>(DType::kInt32, {6}, {0, 100, -300, 7, 2000, -5});
      auto node = [] { return op("QLinearConv", 10).i("group", 2).ints("pads", {1, 1, 1, 1}); };
      expect_case(node(), {x, xs, xz, initializer(w), initializer(ws6), initializer(wz6), ys, yz,
                           initializer(bias)});
      expect_case(node(), {x, xs, xz, initializer(w), make_typed(st, {}, {0.5}),
                           initializer(make_typed(DType::kInt8, {}, {2})), ys, yz});
      // strided, no bias, per-channel scale with a per-tensor zero point
      expect_case(op("QLinearConv", 10).ints("strides", {2, 2}).s("auto_pad", "SAME_UPPER"),
                  {x, xs, xz, initializer(pattern(DType::kInt8, {3, 4, 2, 2}, 9)),
                   initializer(make_typed(st, {3}, {0.5, 1.5, 0.0625})),
                   initializer(make_typed(DType::kInt8, {}, {0})), ys, yz});
      expect_case(op("QLinearConv", 10),
                  {x, make_typed(st, {}, {1.0}), xz,
                   initializer(make_typed(DType::kInt8, {3, 4, 1, 1},
                                          {1, 0, 0, 0, 0, -1, 0, 0, 0, 0, 3, 0})),
                   make_typed(st, {}, {0.5}), initializer(make_typed(DType::kInt8, {}, {0})),
                   make_typed(st, {}, {1.0}), yz});
      // scales no binary fraction holds (rounded to the scales' dtype)
      expect_case(op("QLinearConv", 10).i("group", 2),
                  {x, make_typed(st, {}, {0.00369204697}), xz, initializer(w),
                   initializer(make_typed(st, {6},
                                          {0.00172794575, 0.0031, 0.0007, 0.0123, 0.0051, 0.0009})),
                   initializer(wz6), make_typed(st, {}, {0.00162681262}), yz, initializer(bias)});
    }
  }
}

TEST(QuantOpsKernel, MatMulIntegerOnnxCase) {
  Tensor a = make<uint8_t>(DType::kUInt8, {4, 3}, {11, 7, 3, 10, 6, 2, 9, 5, 1, 8, 4, 0});
  Tensor b = make<uint8_t>(DType::kUInt8, {3, 2}, {1, 4, 2, 5, 3, 6});
  expect_case(
      op("MatMulInteger", 10),
      {a, b, make<uint8_t>(DType::kUInt8, {1}, {12}), make<uint8_t>(DType::kUInt8, {1}, {0})},
      {make<int32_t>(DType::kInt32, {4, 2}, {-38, -83, -44, -98, -50, -113, -56, -128})});
}

// Per-row a and per-column b zero points, mixed dtypes, and numpy batch broadcasting (1-D operands,
// batch dims of 1, a batch on one side only).
TEST(QuantOpsKernel, MatMulIntegerZeroPointsAndBroadcasting) {
  for (DType at : {DType::kUInt8, DType::kInt8}) {
    for (DType bt : {DType::kUInt8, DType::kInt8}) {
      SCOPED_TRACE(std::string(dtype_name(at)) + " x " + std::string(dtype_name(bt)));
      CaseInput az = initializer(make_typed(at, {}, {7}));
      CaseInput bz = initializer(make_typed(bt, {}, {bt == DType::kUInt8 ? 99.0 : -1.0}));
      expect_case(op("MatMulInteger", 10),
                  {pattern(at, {5, 7}, 1), pattern(bt, {7, 6}, 2),
                   initializer(make_typed(at, {5}, {0, 1, 2, 3, 4})),
                   initializer(make_typed(bt, {6}, {0, 5, 10, 15, 20, 25}))});
      expect_case(op("MatMulInteger", 10),
                  {pattern(at, {2, 3, 4}, 3), initializer(pattern(bt, {4, 5}, 4)), az, bz});
      expect_case(op("MatMulInteger", 10), {pattern(at, {3, 4}, 5), pattern(bt, {2, 4, 5}, 6)});
      expect_case(op("MatMulInteger", 10),
                  {pattern(at, {2, 1, 3, 4}, 7), pattern(bt, {3, 4, 5}, 8), az, bz});
      expect_case(op("MatMulInteger", 10),
                  {pattern(at, {4}, 9), pattern(bt, {2, 4, 5}, 10), az, bz});
      expect_case(op("MatMulInteger", 10),
                  {pattern(at, {2, 3, 4}, 11), pattern(bt, {4}, 12), az, bz});
      // per-row a zero point with a batch: the row index runs over every batch of A
      expect_case(op("MatMulInteger", 10), {pattern(at, {2, 3, 4}, 13), pattern(bt, {2, 4, 5}, 14),
                                            initializer(make_typed(at, {3}, {1, 2, 3})), kNoInput});
    }
  }
}

// More terms than an int32 sum can hold exactly: the reference saturates the exact sum to int32.
TEST(QuantOpsKernel, MatMulIntegerLongReductionSaturates) {
  const int64_t k = 40000;
  Tensor a = make<uint8_t>(DType::kUInt8, {1, k}, std::vector<uint8_t>(size_t(k), 255));
  std::vector<uint8_t> bv(size_t(2 * k));
  for (int64_t i = 0; i < k; ++i) bv[size_t(2 * i)] = 255, bv[size_t(2 * i + 1)] = uint8_t(i % 3);
  Tensor b = make<uint8_t>(DType::kUInt8, {k, 2}, bv);
  auto out =
      expect_case(op("MatMulInteger", 10),
                  {a, b, kNoInput, initializer(make<uint8_t>(DType::kUInt8, {2}, {0, 255}))});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].data_as<int32_t>()[0], 2147483647);
  EXPECT_EQ(out[0].data_as<int32_t>()[1], -2147483647 - 1);
}

// The same for a convolution: 36000 terms at the centre saturate, 16000 and 24000 at the corners
// and edges do not.
TEST(QuantOpsKernel, ConvIntegerLongReductionSaturates) {
  const int64_t c = 4000;
  Tensor x = make<uint8_t>(DType::kUInt8, {1, c, 3, 3}, std::vector<uint8_t>(size_t(c * 9), 255));
  std::vector<uint8_t> wv(size_t(2 * c * 9), 0);
  std::fill(wv.begin(), wv.begin() + c * 9, uint8_t(255));
  auto out = expect_case(op("ConvInteger", 10).ints("pads", {1, 1, 1, 1}),
                         {x, initializer(make<uint8_t>(DType::kUInt8, {2, c, 3, 3}, wv)), kNoInput,
                          initializer(make<uint8_t>(DType::kUInt8, {2}, {0, 255}))});
  ASSERT_EQ(out.size(), 1u);
  const int32_t* y = out[0].data_as<int32_t>();
  EXPECT_EQ(y[4], 2147483647);
  EXPECT_EQ(y[0], 4 * c * 255 * 255);
  EXPECT_EQ(y[1], 6 * c * 255 * 255);
  EXPECT_EQ(y[9 + 4], -2147483647 - 1);
  EXPECT_EQ(y[9 + 0], -4 * c * 255 * 255);
}

// The ONNX node tests test_qlinearmatmul_{2D,3D}_{uint8,int8}_{float32,float16}.
TEST(QuantOpsKernel, QLinearMatMulOnnxCases) {
  for (DType qt : {DType::kUInt8, DType::kInt8}) {
    for (DType st : {DType::kFloat32, DType::kFloat16}) {
      for (bool batched : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(qt)) + " " + std::string(dtype_name(st)) +
                     (batched ? " 3-D" : " 2-D"));
        double off = qt == DType::kInt8 ? -127 : 0;
        std::vector<double> av = {208, 236, 0, 238, 3, 214, 255, 29};
        std::vector<double> bv = {152, 51, 244, 60, 26, 255, 0, 127, 246, 127, 254, 247};
        std::vector<double> yv = qt == DType::kInt8
                                     ? std::vector<double>{41, -12, -9, 1, -75, -128}
                                     : std::vector<double>{168, 115, 255, 1, 66, 151};
        for (double& v : av) v += off;
        for (double& v : bv) v += off;
        auto twice = [&](std::vector<double> v) {
          if (batched) v.insert(v.end(), v.begin(), v.end());
          return v;
        };
        Shape as = batched ? Shape{2, 2, 4} : Shape{2, 4},
              bs = batched ? Shape{2, 4, 3} : Shape{4, 3};
        Shape ys = batched ? Shape{2, 2, 3} : Shape{2, 3};
        expect_case(op("QLinearMatMul", 10),
                    {make_typed(qt, as, twice(av)), make_typed(st, {1}, {0.0066}),
                     make_typed(qt, {1}, {113 + off}), make_typed(qt, bs, twice(bv)),
                     make_typed(st, {1}, {0.00705}), make_typed(qt, {1}, {114 + off}),
                     make_typed(st, {1}, {0.0107}), make_typed(qt, {1}, {118 + off})},
                    {make_typed(qt, ys, twice(yv))});
      }
    }
  }
}

// Batch broadcasting and every scale dtype; then K = 1 with a multiplier of 0.5, whose odd products
// tie (x.5) and whose large ones saturate at both ends.
TEST(QuantOpsKernel, QLinearMatMulBroadcastAndScaleDtypes) {
  for (DType st : {DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kBFloat16}) {
    for (DType qt : {DType::kUInt8, DType::kInt8}) {
      SCOPED_TRACE(std::string(dtype_name(st)) + " scales, " + std::string(dtype_name(qt)));
      CaseInput half = make_typed(st, {}, {0.5}), quarter = make_typed(st, {}, {0.25});
      CaseInput az = make_typed(qt, {}, {qt == DType::kInt8 ? 3.0 : 127.0});
      CaseInput bz = initializer(make_typed(DType::kInt8, {}, {-2}));
      CaseInput yz = make_typed(qt, {}, {qt == DType::kInt8 ? 1.0 : 128.0});
      expect_case(op("QLinearMatMul", 10), {pattern(qt, {2, 3, 6}, 1), half, az,
                                            initializer(pattern(DType::kInt8, {6, 4}, 2)), half, bz,
                                            make_typed(st, {}, {8.0}), yz});
      expect_case(op("QLinearMatMul", 10),
                  {pattern(qt, {3, 5}, 3), quarter, az, pattern(DType::kInt8, {2, 1, 5, 2}, 4),
                   half, bz, make_typed(st, {}, {0.75}), yz});
      expect_case(op("QLinearMatMul", 10),
                  {pattern(qt, {5}, 5), half, az, pattern(DType::kInt8, {2, 5, 3}, 6), half, bz,
                   make_typed(st, {}, {2.0}), yz});
      expect_case(op("QLinearMatMul", 10),
                  {pattern(qt, {2, 16, 1}, 7), half, az,
                   initializer(make_typed(DType::kInt8, {1, 3}, {1, -1, 3})), half,
                   initializer(make_typed(DType::kInt8, {}, {0})), half, yz});
    }
  }
}

}  // namespace
}  // namespace kiln
