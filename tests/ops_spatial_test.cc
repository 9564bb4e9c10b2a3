// Spatial ops: GridSample, AffineGrid, CenterCropPad, Einsum, DFT and BitCast shape inference
// (symbolic dims, errors) and one kernel value check each, on every backend.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "op_harness.h"
#include "typed_values.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::all_close;
using testing::const_ints;
using testing::f32;
using testing::infer_node;
using testing::initializer;
using testing::make_f32;
using testing::make_i64;
using testing::op;
using testing::run_case;

TEST(SpatialOps, GridSampleShapeAndBilinear) {
  Dim n = Dim::symbol("N");
  auto r = infer_node(op("GridSample", 20), {f32({n, 3, 4, 5}), f32({n, 6, 7, 2})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[N, 3, 6, 7]");
  // The last grid dim must be 2.
  EXPECT_FALSE(infer_node(op("GridSample", 20), {f32({1, 1, 4, 4}), f32({1, 2, 2, 3})}).ok());

  // align_corners=1: (-1,-1) is pixel (0,0), (1,1) is (1,1), (0,0) the mean of all four.
  Tensor img = make_f32({1, 1, 2, 2}, {1, 2, 3, 4});
  Tensor g = make_f32({1, 1, 3, 2}, {-1, -1, 1, 1, 0, 0});
  auto got = run_case(op("GridSample", 20).i("align_corners", 1), {img, g});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({1, 1, 1, 3}, {1, 4, 2.5f}), 1e-6, 0));
  // Zeros padding: far outside reads 0.
  got = run_case(op("GridSample", 20).s("mode", "nearest"), {img, make_f32({1, 1, 1, 2}, {5, 5})});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_f32({1, 1, 1, 1}, {0}), 0, 0));
}

TEST(SpatialOps, AffineGridShapeAndIdentity) {
  auto r = infer_node(op("AffineGrid", 20), {f32({2, 2, 3}), const_ints({2, 3, 4, 5})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[2, 4, 5, 2]");
  EXPECT_FALSE(infer_node(op("AffineGrid", 20), {f32({2, 3, 4}), const_ints({2, 3, 4, 5})}).ok());

  Tensor id = make_f32({1, 2, 3}, {1, 0, 0, 0, 1, 0});
  auto got = run_case(op("AffineGrid", 20).i("align_corners", 1),
                      {id, initializer(make_i64({4}, {1, 1, 2, 2}))});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({1, 2, 2, 2}, {-1, -1, 1, -1, -1, 1, 1, 1}), 1e-6, 0));
}

TEST(SpatialOps, CenterCropPadShapeAndValues) {
  Dim b = Dim::symbol("B");
  auto r = infer_node(op("CenterCropPad", 18).ints("axes", {-2, -1}),
                      {f32({b, 10, 7}), const_ints({5, 9})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[B, 5, 9]");
  // One shape value for two axes.
  EXPECT_FALSE(infer_node(op("CenterCropPad", 18), {f32({4, 4}), const_ints({2})}).ok());

  // Crop 4 -> 2 along dim 0 (start 1), pad 1 -> 3 along dim 1 (one zero each side).
  auto got = run_case(op("CenterCropPad", 18),
                      {make_f32({4, 1}, {1, 2, 3, 4}), initializer(make_i64({2}, {2, 3}))});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 3}, {0, 2, 0, 0, 3, 0}), 0, 0));
}

TEST(SpatialOps, GridSampleModesPaddingsAndRanks) {
  // A 4x5 image sampled at points inside, on the edge and outside, under every mode and padding.
  std::vector<float> px(20),
      pts = {-1.3f, -0.9f, 0.2f, 0.45f, 1.2f, -0.1f, 0.97f, 1.0f, -2.5f, 3.1f};
  for (int i = 0; i < 20; ++i) px[size_t(i)] = float(i * i % 7) - 1.5f;
  Tensor img = make_f32({1, 1, 4, 5}, px), g = make_f32({1, 1, 5, 2}, pts);
  for (const char* mode : {"nearest", "linear", "cubic"}) {
    for (const char* pad : {"zeros", "border", "reflection"}) {
      for (int64_t align : {0, 1}) {
        auto got = run_case(
            op("GridSample", 20).s("mode", mode).s("padding_mode", pad).i("align_corners", align),
            {img, g});
        ASSERT_TRUE(got.ok()) << mode << " " << pad << ": " << got.status().to_string();
        EXPECT_EQ((*got)[0].shape(), (Shape{1, 1, 1, 5}));
      }
    }
  }
  // Opset 16's name for linear, and a volumetric (3-D) grid over two channels.
  std::vector<float> vol(2 * 2 * 3 * 3), g3 = {0.1f, -0.4f, 0.7f, -1.f, 1.f, 0.f};
  for (size_t i = 0; i < vol.size(); ++i) vol[i] = float(i % 5) * 0.5f;
  auto got = run_case(op("GridSample", 16).s("mode", "bilinear"),
                      {make_f32({1, 2, 2, 3, 3}, vol), make_f32({1, 1, 1, 2, 3}, g3)});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ((*got)[0].shape(), (Shape{1, 2, 1, 1, 2}));
}

TEST(SpatialOps, AffineGrid3dAndCenterCropPadIntegers) {
  // 3-D theta: a scale and a shift, both corner conventions.
  Tensor theta = make_f32({2, 3, 4}, {0.5f, 0,    0, 0.1f, 0, 1, 0,    0, 0, 0, 2, -0.2f,
                                      1,    0.2f, 0, 0,    0, 1, 0.3f, 0, 0, 0, 1, 0.5f});
  for (int64_t align : {0, 1}) {
    auto got = run_case(op("AffineGrid", 20).i("align_corners", align),
                        {theta, initializer(make_i64({5}, {2, 1, 2, 3, 4}))});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ((*got)[0].shape(), (Shape{2, 2, 3, 4, 3}));
  }
  // int64 data, cropped along one axis and padded along the other, with axes.
  std::vector<int64_t> x(3 * 5);
  for (size_t i = 0; i < x.size(); ++i) x[i] = int64_t(i) + 1;
  auto got = run_case(op("CenterCropPad", 18).ints("axes", {1, 0}),
                      {make_i64({3, 5}, x), initializer(make_i64({2}, {2, 6}))});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ((*got)[0].shape(), (Shape{6, 2}));
  const int64_t* y = (*got)[0].data_as<int64_t>();
  EXPECT_EQ(y[0], 0);  // padded row
  EXPECT_EQ(y[2], 2);  // input row 0, columns 1..2
  EXPECT_EQ(y[3], 3);
}

TEST(SpatialOps, EinsumShapesAndValues) {
  Dim n = Dim::symbol("N");
  auto r = infer_node(op("Einsum", 20).s("equation", "...ij,...jk->...ik"),
                      {f32({n, 2, 3}), f32({n, 3, 4})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[N, 2, 4]");
  r = infer_node(op("Einsum", 20).s("equation", "ji"), {f32({3, 5})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[5, 3]");  // implicit output: letters in alphabetical order
  EXPECT_FALSE(
      infer_node(op("Einsum", 20).s("equation", "ij,jk"), {f32({2, 3}), f32({4, 5})}).ok());

  // Batch diagonal and a matmul.
  auto got =
      run_case(op("Einsum", 20).s("equation", "...ii->...i"), {make_f32({1, 2, 2}, {1, 2, 3, 4})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({1, 2}, {1, 4}), 0, 0));
  got = run_case(op("Einsum", 20).s("equation", "ij,jk->ik"),
                 {make_f32({1, 2}, {1, 2}), make_f32({2, 2}, {1, 2, 3, 4})});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(all_close((*got)[0], make_f32({1, 2}, {7, 10}), 0, 0));
}

// The forms real models use (MaxViT's relative attention, bilinear forms), with broadcasting,
// three operands and float64: each runs on every backend against the CPU reference.
TEST(SpatialOps, EinsumKernelForms) {
  auto seq = [](Shape s, double scale) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(std::sin(double(i) * 0.37) * scale);
    return make_f32(s, v);
  };
  struct Form {
    const char* eq;
    std::vector<Shape> shapes;
  };
  for (const Form& f : {Form{"bhid,bhjd->bhij", {{2, 3, 5, 4}, {2, 3, 6, 4}}},
                        Form{"...ij,...jk->...ik", {{2, 1, 3, 4}, {3, 4, 2}}},
                        Form{"i,ij,j->", {{3}, {3, 5}, {5}}},
                        Form{"bij->bji", {{2, 3, 4}}},
                        Form{"ii->i", {{4, 4}}}}) {
    std::vector<testing::CaseInput> ins;
    for (const Shape& s : f.shapes) ins.push_back(seq(s, 1.0));
    testing::KernelCase c{.node = op("Einsum", 12).s("equation", f.eq), .inputs = ins, .expect_support = true};
    auto r = testing::run_case(c);
    EXPECT_TRUE(r.ok()) << f.eq << ": " << r.status().to_string();
  }
  Tensor a = seq(Shape{2, 3}, 1.0);
  Tensor b = seq(Shape{3, 2}, 0.5);
  Tensor a64 = *Tensor::zeros(DType::kFloat64, {2, 3}), b64 = *Tensor::zeros(DType::kFloat64, {3, 2});
  for (int i = 0; i < 6; ++i) {
    a64.data_as<double>()[i] = a.data_as<float>()[i];
    b64.data_as<double>()[i] = b.data_as<float>()[i];
  }
  testing::KernelCase c{.node = op("Einsum", 12).s("equation", "ij,jk->ik"), .inputs = {a64, b64},
                        .expect_support = true};
  auto r = testing::run_case(c);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
}

// Float16 and bfloat16 operands (accumulated in double, stored once): the forms of onnx's
// test_einsum_*_bfloat16 (batch matmul, a full sum, a transpose) and a broadcast, three-operand
// and diagonal form. A device must accept them.
TEST(SpatialOps, EinsumKernelHalfTypes) {
  struct Form {
    const char* eq;
    std::vector<Shape> shapes;
  };
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    for (const Form& f :
         {Form{"bij,bjk->bik", {{5, 2, 3}, {5, 3, 4}}}, Form{"ij->i", {{3, 4}}},
          Form{"ij->ji", {{3, 4}}}, Form{"...ij,...jk->...ik", {{2, 1, 3, 4}, {3, 4, 2}}},
          Form{"i,ij,j->", {{3}, {3, 5}, {5}}}, Form{"ii->i", {{4, 4}}}}) {
      std::vector<testing::CaseInput> ins;
      uint32_t seed = 0;
      for (const Shape& s : f.shapes) {
        std::vector<double> v(size_t(shape_numel(s)));
        for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(double(i + ++seed) * 0.37);
        ins.push_back(testing::make_typed(dt, s, v));
      }
      const std::string label = std::string(f.eq) + " on " + std::string(dtype_name(dt));
      testing::KernelCase c{.node = op("Einsum", 12).s("equation", f.eq),
                            .inputs = ins,
                            .expect_support = true,
                            .label = label};
      auto r = testing::run_case(c);
      ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
      EXPECT_EQ((*r)[0].dtype(), dt) << label;
    }
  }
  // ij,jk->ik on float16 against the hand-computed product: [1 2] x [[1 2] [3 4]] = [7 10].
  auto got = run_case(op("Einsum", 12).s("equation", "ij,jk->ik"),
                      {testing::make_typed(DType::kFloat16, {1, 2}, {1, 2}),
                       testing::make_typed(DType::kFloat16, {2, 2}, {1, 2, 3, 4})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(half_to_float((*got)[0].data_as<uint16_t>()[0]), 7.f);
  EXPECT_EQ(half_to_float((*got)[0].data_as<uint16_t>()[1]), 10.f);
}

TEST(SpatialOps, DftShapesAndValues) {
  Dim n = Dim::symbol("N");
  auto r = infer_node(op("DFT", 17).i("onesided", 1), {f32({n, 8, 1})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[N, 5, 2]");
  r = infer_node(op("DFT", 20), {f32({3, 8, 6, 2}), testing::kOmitted, const_ints({1})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[3, 8, 6, 2]");
  EXPECT_FALSE(infer_node(op("DFT", 17), {f32({4, 3})}).ok());

  // DFT of [1, 0, 0, 0] is all ones; of [1, 1, 1, 1] is [4, 0, 0, 0].
  auto got = run_case(op("DFT", 17), {make_f32({2, 4, 1}, {1, 0, 0, 0, 1, 1, 1, 1})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close(
      (*got)[0], make_f32({2, 4, 2}, {1, 0, 1, 0, 1, 0, 1, 0, 4, 0, 0, 0, 0, 0, 0, 0}), 1e-6, 0));
}

TEST(SpatialOps, BitCast) {
  auto r = infer_node(op("BitCast", 20).i("to", 6), {f32({Dim::symbol("N")})});  // int32
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.dtype(), DType::kInt32);
  EXPECT_FALSE(infer_node(op("BitCast", 20).i("to", 7), {f32({2})}).ok());  // int64: size differs
  auto got = run_case(op("BitCast", 20).i("to", 6), {make_f32({1}, {1.0f})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ((*got)[0].data_as<int32_t>()[0], 0x3f800000);
}


// Same-size BitCast among dtypes: the bytes are unchanged (CUDA: a copy, elementwise.cu).
TEST(SpatialOps, BitCastSameSizeDtypes) {
  struct P {
    DType from;
    int to;  // ONNX dtype code
  };
  for (P p : {P{DType::kFloat32, 6}, P{DType::kInt32, 1}, P{DType::kFloat64, 7}, P{DType::kInt64, 13},
              P{DType::kFloat16, 16}, P{DType::kUInt8, 3}, P{DType::kUInt16, 10}}) {
    testing::KernelCase c{.node = op("BitCast", 26).i("to", p.to),
                          .inputs = {testing::make_typed(p.from, {2, 3}, {1, 2, 3, 4, 5, 6})},
                          .expect_support = true};
    auto r = testing::run_case(c);
    EXPECT_TRUE(r.ok()) << dtype_name(p.from) << " to " << p.to << ": " << r.status().to_string();
  }
}

}  // namespace
}  // namespace kiln
