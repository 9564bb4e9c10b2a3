// Spatial ops: GridSample, AffineGrid, CenterCropPad, Einsum, DFT, STFT, MelWeightMatrix, BitCast
// and RoiAlign shape inference (symbolic dims, errors) and kernel values, on every backend.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include "op_harness.h"
#include "typed_values.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::all_close;
using testing::const_ints;
using testing::const_scalar;
using testing::constant;
using testing::f32;
using testing::infer_node;
using testing::initializer;
using testing::make_f32;
using testing::make_i64;
using testing::op;
using testing::OpNode;
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
  for (const Form& f :
       {Form{"bhid,bhjd->bhij", {{2, 3, 5, 4}, {2, 3, 6, 4}}},
        Form{"...ij,...jk->...ik", {{2, 1, 3, 4}, {3, 4, 2}}}, Form{"i,ij,j->", {{3}, {3, 5}, {5}}},
        Form{"bij->bji", {{2, 3, 4}}}, Form{"ii->i", {{4, 4}}}}) {
    std::vector<testing::CaseInput> ins;
    for (const Shape& s : f.shapes) ins.push_back(seq(s, 1.0));
    testing::KernelCase c{
        .node = op("Einsum", 12).s("equation", f.eq), .inputs = ins, .expect_support = true};
    auto r = testing::run_case(c);
    EXPECT_TRUE(r.ok()) << f.eq << ": " << r.status().to_string();
  }
  Tensor a = seq(Shape{2, 3}, 1.0);
  Tensor b = seq(Shape{3, 2}, 0.5);
  Tensor a64 = *Tensor::zeros(DType::kFloat64, {2, 3}),
         b64 = *Tensor::zeros(DType::kFloat64, {3, 2});
  for (int i = 0; i < 6; ++i) {
    a64.data_as<double>()[i] = a.data_as<float>()[i];
    b64.data_as<double>()[i] = b.data_as<float>()[i];
  }
  testing::KernelCase c{.node = op("Einsum", 12).s("equation", "ij,jk->ik"),
                        .inputs = {a64, b64},
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

// ---- DFT against a naive transform, every variant on every backend ----

struct DftSpec {
  Shape x;  // [..., signal, 1 or 2]
  int opset = 17;
  std::optional<int64_t> axis;  // opset 17: the attribute; 20: input 2 (a constant)
  bool inverse = false, onesided = false;
  std::optional<int64_t> dft_length;
  bool length_from_shape = false;  // dft_length computed at run time (Shape of a tensor)
  DType dtype = DType::kFloat32;
};

// Values the dtype holds exactly, so that the naive transform sees what the kernels see.
std::vector<double> dft_input(const DftSpec& s) {
  std::vector<double> v(size_t(shape_numel(s.x)));
  for (size_t i = 0; i < v.size(); ++i) {
    float f = float(std::sin(0.9 * double(i) + 0.3) + 0.25 * std::cos(2.3 * double(i)));
    if (s.dtype == DType::kFloat16) f = half_to_float(float_to_half(f));
    if (s.dtype == DType::kBFloat16) f = bf16_to_float(float_to_bf16(f));
    v[i] = s.dtype == DType::kFloat64 ? std::sin(0.9 * double(i) + 0.3) : double(f);
  }
  return v;
}

// The transform by definition: the signal zero-padded or truncated to n (for the inverse real
// FFT, bins 0..n/2 extended by conjugate symmetry), then sum_t z[t] e^(-+2 pi i k t / n).
Tensor naive_dft(const DftSpec& s, const std::vector<double>& x) {
  const int rank = int(s.x.size());
  int64_t axis = s.axis.value_or(s.opset >= 20 ? -2 : 1);
  if (axis < 0) axis += rank;
  const bool irfft = s.inverse && s.onesided;
  const int64_t in_len = s.x[size_t(axis)], comps = s.x.back();
  const int64_t n = s.dft_length.value_or(irfft ? 2 * (in_len - 1) : in_len);
  const int64_t out_len = s.onesided && !irfft ? n / 2 + 1 : n, out_comps = irfft ? 1 : 2;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= s.x[size_t(d)];
  for (int d = int(axis) + 1; d < rank - 1; ++d) inner *= s.x[size_t(d)];
  Shape ys = s.x;
  ys[size_t(axis)] = out_len;
  ys.back() = out_comps;
  std::vector<double> y(size_t(shape_numel(ys)));
  auto bin = [&](int64_t o, int64_t t, int64_t i) {
    const double* p = x.data() + ((o * in_len + t) * inner + i) * comps;
    return std::complex<double>(p[0], comps == 2 ? p[1] : 0.0);
  };
  const double sign = s.inverse ? 1.0 : -1.0, scale = s.inverse ? 1.0 / double(n) : 1.0;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      std::vector<std::complex<double>> z(static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t) {
        if (t < in_len) {
          z[size_t(t)] = bin(o, t, i);
        } else if (irfft && n - t < in_len) {
          z[size_t(t)] = std::conj(bin(o, n - t, i));
        }
      }
      for (int64_t k = 0; k < out_len; ++k) {
        std::complex<double> acc = 0;
        for (int64_t t = 0; t < n; ++t) {
          acc += z[size_t(t)] *
                 std::polar(1.0, sign * 2 * std::numbers::pi * double((k * t) % n) / double(n));
        }
        acc *= scale;
        double* q = y.data() + ((o * out_len + k) * inner + i) * out_comps;
        q[0] = acc.real();
        if (!irfft) q[1] = acc.imag();
      }
    }
  }
  return testing::make_typed(s.dtype, ys, y);
}

OpNode dft_node(const DftSpec& s) {
  OpNode node = op("DFT", s.opset).named("dft0");
  if (s.inverse) node.i("inverse", 1);
  if (s.onesided) node.i("onesided", 1);
  if (s.opset < 20 && s.axis) node.i("axis", *s.axis);
  return node;
}

std::vector<testing::CaseInput> dft_inputs(const DftSpec& s, Tensor x) {
  std::vector<testing::CaseInput> in = {std::move(x)};
  if (s.dft_length) {
    in.push_back(s.length_from_shape ? testing::shape_of({*s.dft_length})
                                     : initializer(make_i64({1}, {*s.dft_length})));
  } else if (s.opset >= 20 && s.axis) {
    in.push_back(testing::kNoInput);
  }
  if (s.opset >= 20 && s.axis) in.push_back(initializer(make_i64({}, {*s.axis})));
  return in;
}

// Runs the case (CUDA must accept it) and checks the reference against the naive transform.
StatusOr<Tensor> check_dft(const DftSpec& s, const std::string& label) {
  std::vector<double> xv = dft_input(s);
  Tensor x = testing::make_typed(s.dtype, s.x, xv);
  auto r = run_case(
      {.node = dft_node(s), .inputs = dft_inputs(s, x), .expect_support = true, .label = label});
  if (!r.ok()) return r.status();
  testing::Tolerance tol = testing::op_tolerance(s.dtype);
  EXPECT_TRUE(all_close((*r)[0], naive_dft(s, xv), tol.atol, tol.rtol)) << label;
  return (*r)[0];
}

TEST(SpatialOps, DftVariantsAgainstNaive) {
  struct Case {
    DftSpec spec;
    const char* label;
  };
  const Case cases[] = {
      {{.x = {2, 5, 3, 2}}, "complex, axis 1 with inner dims (test_dft_axis)"},
      {{.x = {3, 8, 1}, .onesided = true}, "real onesided (test_dft_rfft)"},
      {{.x = {2, 7, 1}, .onesided = true}, "real onesided, odd length"},
      {{.x = {2, 6, 1}, .dft_length = 9}, "real, dft_length zero-pads"},
      {{.x = {2, 7, 2}, .inverse = true, .dft_length = 5}, "complex inverse, dft_length truncates"},
      {{.x = {2, 1, 2}, .onesided = true}, "length 1"},
      {{.x = {4, 3, 2}, .axis = 0}, "axis 0 (no outer dims)"},
      {{.x = {2, 5, 2}, .opset = 20, .inverse = true, .onesided = true},
       "inverse real FFT, default axis (test_dft_irfft_opset19)"},
      {{.x = {2, 4, 2}, .opset = 20, .inverse = true, .onesided = true, .dft_length = 7},
       "inverse real FFT, odd dft_length"},
      {{.x = {3, 4, 6, 2}, .opset = 20, .axis = 1}, "opset 20, axis input 1"},
      {{.x = {3, 4, 6, 1}, .opset = 20, .axis = -3, .onesided = true}, "opset 20, negative axis"},
      {{.x = {2, 8, 1}, .opset = 20, .onesided = true, .dft_length = 7, .length_from_shape = true},
       "onesided, dft_length computed at run time"},
      {{.x = {2, 6, 2}, .dtype = DType::kFloat64}, "float64"},
      {{.x = {2, 4, 2}, .opset = 20, .inverse = true, .onesided = true, .dtype = DType::kFloat64},
       "float64 inverse real FFT"},
      {{.x = {2, 6, 2}, .inverse = true, .dtype = DType::kFloat16}, "float16 inverse"},
      {{.x = {2, 6, 1}, .onesided = true, .dtype = DType::kBFloat16}, "bfloat16 onesided"},
  };
  for (const Case& c : cases) {
    auto r = check_dft(c.spec, c.label);
    EXPECT_TRUE(r.ok()) << c.label << ": " << r.status().to_string();
  }
}

// The inverse real FFT of the onesided transform gives the signal back, for even and odd n.
TEST(SpatialOps, DftRoundTripsThroughTheInverseRealFft) {
  for (int64_t n : {8, 7}) {
    DftSpec fwd{.x = {3, n, 1}, .onesided = true};
    auto bins = check_dft(fwd, "rfft of " + std::to_string(n));
    ASSERT_TRUE(bins.ok()) << bins.status().to_string();
    OpNode inv = dft_node({.inverse = true, .onesided = true});
    auto back = run_case({.node = inv,
                          .inputs = {*bins, initializer(make_i64({1}, {n}))},
                          .expect_support = true,
                          .label = "irfft of " + std::to_string(n)});
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_TRUE(
        all_close((*back)[0], testing::make_typed(DType::kFloat32, {3, n, 1}, dft_input(fwd))))
        << "n = " << n;
  }
}

// ---- STFT ----

TEST(SpatialOps, StftShapes) {
  const Dim b = Dim::symbol("B");
  // 128 samples in frames of 16 every 8: 15 frames of 9 onesided bins (test_stft).
  auto r = infer_node(op("STFT", 17),
                      {f32({b, 128, 1}), const_scalar(8), testing::kOmitted, const_scalar(16)});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[B, 15, 9, 2]");
  // The window sets the frame length; two-sided keeps all 16 bins.
  r = infer_node(op("STFT", 17).i("onesided", 0), {f32({2, 100, 2}), const_scalar(10), f32({16})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[2, 9, 16, 2]");
  // Neither: one frame of the whole signal.
  r = infer_node(op("STFT", 17), {f32({1, 10, 1}), const_scalar(3)});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[1, 1, 6, 2]");
  // A symbolic signal length gives a symbolic frame count.
  r = infer_node(op("STFT", 17), {f32({1, Dim::symbol("L"), 1}), const_scalar(4), testing::kOmitted,
                                  const_scalar(8)});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.dims()[1].eval({{"L", 20}}), 4);

  // Errors name what is wrong.
  auto err =
      infer_node(op("STFT", 17), {f32({1, 64, 1}), const_scalar(8), f32({16}), const_scalar(12)});
  EXPECT_FALSE(err.ok());
  EXPECT_NE(err.status.message().find("window"), std::string::npos) << err.status.to_string();
  err = infer_node(op("STFT", 17), {f32({1, 64, 1}), const_scalar(0), f32({16})});
  EXPECT_NE(err.status.message().find("frame_step"), std::string::npos) << err.status.to_string();
  err = infer_node(op("STFT", 17), {f32({64, 1}), const_scalar(8), f32({16})});
  EXPECT_EQ(err.code(), StatusCode::kInvalidModel);
  err = infer_node(op("STFT", 17), {f32({1, 64, 3}), const_scalar(8), f32({16})});
  EXPECT_FALSE(err.ok());
  err = infer_node(op("STFT", 17), {f32({1, 8, 1}), const_scalar(2), f32({16})});
  EXPECT_NE(err.status.message().find("at least one frame"), std::string::npos)
      << err.status.to_string();
  err = infer_node(op("STFT", 17).i("onesided", 2), {f32({1, 64, 1}), const_scalar(8), f32({16})});
  EXPECT_NE(err.status.message().find("onesided"), std::string::npos) << err.status.to_string();
  // frame_step must be known at build time: a runtime tensor is refused, naming it.
  err = infer_node(op("STFT", 17), {f32({1, 64, 1}), testing::typed(DType::kInt64, {}), f32({16})});
  EXPECT_EQ(err.code(), StatusCode::kUnsupported);
  EXPECT_NE(err.status.message().find("frame_step"), std::string::npos) << err.status.to_string();
  err = infer_node(op("STFT", 17),
                   {f32({1, 64, 1}), const_scalar(8), testing::typed(DType::kFloat64, {16})});
  EXPECT_EQ(err.code(), StatusCode::kInvalidModel);
}

struct StftSpec {
  Shape x;  // [batch, length, 1 or 2]
  int64_t step;
  std::optional<int64_t> length;  // the frame_length input
  bool window = false;            // a window input of the frame length
  bool onesided = true;
  bool step_from_shape = false;  // frame_step computed from a runtime tensor's shape
  DType dtype = DType::kFloat32;
};

// sum_t w[t] x[f * step + t] e^(-2 pi i k t / n), by definition.
Tensor naive_stft(const StftSpec& s, const std::vector<double>& x, const std::vector<double>& w) {
  const int64_t n = s.length.value_or(s.window ? int64_t(w.size()) : s.x[1]);
  const int64_t frames = (s.x[1] - n) / s.step + 1, bins = s.onesided ? n / 2 + 1 : n;
  const int64_t comps = s.x[2];
  std::vector<double> y;
  for (int64_t b = 0; b < s.x[0]; ++b) {
    for (int64_t f = 0; f < frames; ++f) {
      for (int64_t k = 0; k < bins; ++k) {
        std::complex<double> acc = 0;
        for (int64_t t = 0; t < n; ++t) {
          const double* p = x.data() + (b * s.x[1] + f * s.step + t) * comps;
          std::complex<double> v(p[0], comps == 2 ? p[1] : 0.0);
          acc += (s.window ? w[size_t(t)] : 1.0) * v *
                 std::polar(1.0, -2 * std::numbers::pi * double((k * t) % n) / double(n));
        }
        y.push_back(acc.real());
        y.push_back(acc.imag());
      }
    }
  }
  return testing::make_typed(s.dtype, {s.x[0], frames, bins, 2}, y);
}

TEST(SpatialOps, StftAgainstNaive) {
  struct Case {
    StftSpec spec;
    const char* label;
  };
  const Case cases[] = {
      {{.x = {1, 128, 1}, .step = 8, .length = 16}, "real, frame_length (test_stft)"},
      {{.x = {1, 128, 1}, .step = 8, .window = true}, "real, window (test_stft_with_window)"},
      {{.x = {2, 40, 2}, .step = 6, .length = 9, .window = true, .onesided = false},
       "complex, odd window and frame_length, two-sided"},
      {{.x = {3, 21, 1}, .step = 5, .length = 7}, "frames that leave a tail unread"},
      {{.x = {2, 12, 1}, .step = 4}, "neither: one frame of the whole signal"},
      {{.x = {2, 30, 1}, .step = 7, .length = 8, .step_from_shape = true},
       "frame_step computed at run time"},
      {{.x = {2, 32, 2}, .step = 8, .window = true, .dtype = DType::kFloat64}, "float64"},
      {{.x = {1, 24, 1}, .step = 4, .window = true, .dtype = DType::kFloat16}, "float16"},
  };
  for (const Case& c : cases) {
    const StftSpec& s = c.spec;
    DftSpec as_dft{.x = s.x, .dtype = s.dtype};  // dft_input's values: exact in the dtype
    const std::vector<double> xv = dft_input(as_dft);
    std::vector<double> wv;
    const int64_t wn = s.length.value_or(8);
    for (int64_t t = 0; t < wn; ++t) {
      wv.push_back(testing::make_typed(s.dtype, {1}, {0.5 - 0.5 * std::cos(0.7 * double(t + 1))})
                       .float_at(0));
    }
    std::vector<testing::CaseInput> in = {testing::make_typed(s.dtype, s.x, xv)};
    in.push_back(s.step_from_shape ? testing::shape_of({s.step})
                                   : initializer(make_i64({}, {s.step})));
    in.push_back(s.window ? initializer(testing::make_typed(s.dtype, {wn}, wv))
                          : testing::kNoInput);
    if (s.length) in.push_back(initializer(make_i64({}, {*s.length})));
    OpNode node = op("STFT", 17).named("stft0");
    if (!s.onesided) node.i("onesided", 0);
    auto r =
        run_case({.node = node, .inputs = std::move(in), .expect_support = true, .label = c.label});
    ASSERT_TRUE(r.ok()) << c.label << ": " << r.status().to_string();
    testing::Tolerance tol = testing::op_tolerance(s.dtype);
    EXPECT_TRUE(all_close((*r)[0], naive_stft(s, xv, wv), tol.atol, tol.rtol)) << c.label;
  }
}

// ---- MelWeightMatrix ----

TEST(SpatialOps, MelWeightMatrixShapesAndErrors) {
  auto in = [](int64_t mels, int64_t dft, int64_t rate, float lo, float hi) {
    return std::vector<testing::NodeInput>{const_scalar(mels), const_scalar(dft),
                                           const_scalar(rate), constant(make_f32({}, {lo})),
                                           constant(make_f32({}, {hi}))};
  };
  auto r = infer_node(op("MelWeightMatrix", 17), in(8, 16, 8192, 0, 4096));
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[9, 8]");
  EXPECT_EQ(r.dtype(), DType::kFloat32);
  r = infer_node(op("MelWeightMatrix", 17).i("output_datatype", 11), in(4, 31, 16000, 20, 8000));
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[16, 4]");
  EXPECT_EQ(r.dtype(), DType::kFloat64);

  EXPECT_EQ(infer_node(op("MelWeightMatrix", 17).i("output_datatype", 7), in(8, 16, 8192, 0, 4096))
                .code(),
            StatusCode::kUnsupported);
  auto err = infer_node(op("MelWeightMatrix", 17), in(0, 16, 8192, 0, 4096));
  EXPECT_NE(err.status.message().find("num_mel_bins"), std::string::npos) << err.status.to_string();
  err = infer_node(op("MelWeightMatrix", 17), in(8, 16, 8192, 100, 50));
  EXPECT_NE(err.status.message().find("lower_edge_hertz"), std::string::npos)
      << err.status.to_string();
  err = infer_node(op("MelWeightMatrix", 17), in(8, 16, 0, 0, 4096));
  EXPECT_NE(err.status.message().find("sample_rate"), std::string::npos) << err.status.to_string();
  // A float where an integer belongs, and an edge known only at run time (the op always folds).
  auto bad = in(8, 16, 8192, 0, 4096);
  bad[0] = constant(make_f32({}, {8}));
  EXPECT_EQ(infer_node(op("MelWeightMatrix", 17), bad).code(), StatusCode::kInvalidModel);
  bad = in(8, 16, 8192, 0, 4096);
  bad[4] = f32({});
  err = infer_node(op("MelWeightMatrix", 17), bad);
  EXPECT_EQ(err.code(), StatusCode::kUnsupported);
  EXPECT_NE(err.status.message().find("upper_edge_hertz"), std::string::npos)
      << err.status.to_string();
}

// Filter m rises linearly from edge m to edge m + 1 and falls to edge m + 2; the edges are
// num_mel_bins + 2 points evenly spaced in mel (2595 log10(1 + hz / 700)), as spectrogram bins
// floor((dft_length + 1) * hz / sample_rate).
Tensor naive_mel(int64_t mels, int64_t dft, int64_t rate, float lo, float hi) {
  auto mel = [](float hz) { return double(2595.f * std::log1p(hz / 700.f)) / std::log(10.0); };
  const double m0 = mel(lo), step = (mel(hi) - m0) / double(mels + 2);
  std::vector<int64_t> e;
  for (int64_t i = 0; i < mels + 2; ++i) {
    const double hz = 700 * (std::pow(10.0, (m0 + double(i) * step) / 2595) - 1);
    e.push_back(int64_t(std::floor(double(dft + 1) * hz / double(rate))));
  }
  const int64_t bins = dft / 2 + 1;
  std::vector<float> w(size_t(bins * mels), 0.f);
  for (int64_t j = 0; j < bins; ++j) {
    for (int64_t m = 0; m < mels; ++m) {
      const int64_t l = e[size_t(m)], c = e[size_t(m + 1)], r = e[size_t(m + 2)];
      double v = 0;
      if (j >= c && j < r) {
        v = double(r - j) / double(r - c);
      } else if (j == c) {
        v = 1;  // a filter whose rise is empty peaks at its centre
      } else if (j >= l && j < c) {
        v = double(j - l) / double(c - l);
      }
      w[size_t(j * mels + m)] = float(v);
    }
  }
  return make_f32({bins, mels}, w);
}

TEST(SpatialOps, MelWeightMatrixFoldsToTheTriangularFilters) {
  struct Case {
    int64_t mels, dft, rate;
    float lo, hi;
  };
  // test_melweightmatrix's numbers, a wider bank, and one whose low filters collapse onto a bin.
  for (const Case& c :
       {Case{8, 16, 8192, 0, 4096}, Case{10, 64, 16000, 100, 7000}, Case{12, 32, 16000, 0, 8000}}) {
    const std::string label =
        std::to_string(c.mels) + " mels of a " + std::to_string(c.dft) + "-point transform";
    auto r = run_case(
        {.node = op("MelWeightMatrix", 17).named("mel0"),
         .inputs = {initializer(make_i64({}, {c.mels})), initializer(make_i64({}, {c.dft})),
                    initializer(make_i64({}, {c.rate})), initializer(make_f32({}, {c.lo})),
                    initializer(make_f32({}, {c.hi}))},
         .expect_support = true,
         .label = label});
    ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
    EXPECT_TRUE(all_close((*r)[0], naive_mel(c.mels, c.dft, c.rate, c.lo, c.hi), 1e-6, 0)) << label;
  }
  // float64 output of the same filters.
  auto r = run_case({.node = op("MelWeightMatrix", 17).i("output_datatype", 11),
                     .inputs = {initializer(make_i64({}, {8})), initializer(make_i64({}, {16})),
                                initializer(make_i64({}, {8192})), initializer(make_f32({}, {0})),
                                initializer(make_f32({}, {4096}))}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ((*r)[0].dtype(), DType::kFloat64);
  EXPECT_TRUE(all_close(testing::as_dtype((*r)[0], DType::kFloat32),
                        naive_mel(8, 16, 8192, 0, 4096), 1e-6, 0));
  // An upper edge far past the Nyquist frequency lands past the last bin (the top edge, 5/6 of the
  // way up in mel, is about 11 kHz: bin 23 of 9): a clear error, not a write past the output.
  r = run_case(op("MelWeightMatrix", 17),
               {initializer(make_i64({}, {4})), initializer(make_i64({}, {16})),
                initializer(make_i64({}, {8000})), initializer(make_f32({}, {0})),
                initializer(make_f32({}, {20000}))});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("Nyquist"), std::string::npos) << r.status().to_string();
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

// Same-size BitCast among dtypes: the bytes are unchanged (CUDA: a copy, broadcast_copy.cu).
TEST(SpatialOps, BitCastSameSizeDtypes) {
  struct P {
    DType from;
    int to;  // ONNX dtype code
  };
  for (P p :
       {P{DType::kFloat32, 6}, P{DType::kInt32, 1}, P{DType::kFloat64, 7}, P{DType::kInt64, 13},
        P{DType::kFloat16, 16}, P{DType::kUInt8, 3}, P{DType::kUInt16, 10}}) {
    testing::KernelCase c{.node = op("BitCast", 26).i("to", p.to),
                          .inputs = {testing::make_typed(p.from, {2, 3}, {1, 2, 3, 4, 5, 6})},
                          .expect_support = true};
    auto r = testing::run_case(c);
    EXPECT_TRUE(r.ok()) << dtype_name(p.from) << " to " << p.to << ": " << r.status().to_string();
  }
}

// ---- RoiAlign ----

// A 4x4 plane whose value is linear in the position (4*y + x): bilinear sampling reproduces it
// exactly inside the plane, so bin averages are the plane at the bins' centers.
Tensor linear_plane(int64_t batch, float per_batch) {
  std::vector<float> v;
  for (int64_t b = 0; b < batch; ++b) {
    for (int i = 0; i < 16; ++i) v.push_back(float(4 * (i / 4) + i % 4) + per_batch * float(b));
  }
  return make_f32({batch, 1, 4, 4}, v);
}

TEST(SpatialOps, RoiAlignShapeAndErrors) {
  Dim r = Dim::symbol("R"), n = Dim::symbol("N");
  auto node = op("RoiAlign", 16).i("output_height", 7).i("output_width", 5).named("roi");
  auto got =
      infer_node(node, {f32({n, 256, 50, 68}), f32({r, 4}), testing::typed(DType::kInt64, {r})});
  ASSERT_TRUE(got.ok()) << got.status.to_string();
  EXPECT_EQ(got.shape(), "[R, 256, 7, 5]");
  // rois must have 4 columns, batch_indices must be int64 and match the rois, mode avg or max.
  auto bad = infer_node(node, {f32({1, 3, 8, 8}), f32({2, 5}), testing::typed(DType::kInt64, {2})});
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status.message().find("roi"), std::string::npos) << bad.status.to_string();
  EXPECT_FALSE(
      infer_node(node, {f32({1, 3, 8, 8}), f32({2, 4}), testing::typed(DType::kInt32, {2})}).ok());
  EXPECT_FALSE(
      infer_node(node, {f32({1, 3, 8, 8}), f32({2, 4}), testing::typed(DType::kInt64, {3})}).ok());
  EXPECT_FALSE(infer_node(op("RoiAlign", 16).s("mode", "sum"),
                          {f32({1, 3, 8, 8}), f32({2, 4}), testing::typed(DType::kInt64, {2})})
                   .ok());
  EXPECT_FALSE(infer_node(op("RoiAlign", 16).i("output_height", 0),
                          {f32({1, 3, 8, 8}), f32({2, 4}), testing::typed(DType::kInt64, {2})})
                   .ok());
}

TEST(SpatialOps, RoiAlignAveragesBinsOfALinearPlane) {
  // roi (0,0)-(2,2) in 2x2 bins of one pixel: the bins' centers are (0.5, 0.5) ... (1.5, 1.5), so
  // the plane 4y + x gives 2.5, 3.5, 6.5, 7.5, with one sample per bin (adaptive) or four (ratio
  // 2).
  const Tensor want = make_f32({1, 1, 2, 2}, {2.5f, 3.5f, 6.5f, 7.5f});
  for (int64_t ratio : {0, 2}) {
    auto got = run_case(op("RoiAlign", 16)
                            .s("coordinate_transformation_mode", "output_half_pixel")
                            .i("output_height", 2)
                            .i("output_width", 2)
                            .i("sampling_ratio", ratio),
                        {linear_plane(1, 0), make_f32({1, 4}, {0, 0, 2, 2}), make_i64({1}, {0})});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(all_close((*got)[0], want, 1e-5, 0)) << "sampling_ratio " << ratio;
  }
  // half_pixel shifts the box by half a pixel; spatial_scale 0.5 halves it; batch index 1 reads the
  // second image (the first plus 100). Opset 10 (no coordinate_transformation_mode) is
  // output_half_pixel.
  auto got = run_case(
      op("RoiAlign", 16).i("output_height", 2).i("output_width", 2).f("spatial_scale", 0.5f),
      {linear_plane(2, 100), make_f32({2, 4}, {1, 1, 5, 5, 1, 1, 5, 5}), make_i64({2}, {0, 1})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close(
      (*got)[0], make_f32({2, 1, 2, 2}, {2.5f, 3.5f, 6.5f, 7.5f, 102.5f, 103.5f, 106.5f, 107.5f}),
      1e-5, 0));
  got = run_case(op("RoiAlign", 10).i("output_height", 2).i("output_width", 2),
                 {linear_plane(1, 0), make_f32({1, 4}, {0, 0, 2, 2}), make_i64({1}, {0})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], want, 1e-5, 0));
  // A box past the plane: points more than a pixel outside read 0, nearer ones clamp to the edge.
  // One bin, ratio 1, output_half_pixel: the point is the box's center.
  auto one = op("RoiAlign", 16)
                 .s("coordinate_transformation_mode", "output_half_pixel")
                 .i("sampling_ratio", 1);
  got = run_case(
      one, {linear_plane(1, 0), make_f32({2, 4}, {4, 4, 6, 6, 3, 3, 5, 5}), make_i64({2}, {0, 0})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({2, 1, 1, 1}, {0, 15}), 1e-5, 0));
}

TEST(SpatialOps, RoiAlignMaxTakesTheLargestWeightedCorner) {
  // ONNX's max: per sample point the largest of w_i * x_i over its four corners. The point (0.5,
  // 0.5) has weights 1/4 on 0, 1, 4, 5: 1.25 (a bilinear max would be 2.5).
  auto node = op("RoiAlign", 16)
                  .s("coordinate_transformation_mode", "output_half_pixel")
                  .s("mode", "max")
                  .i("sampling_ratio", 1);
  auto got =
      run_case(node, {linear_plane(1, 0), make_f32({1, 4}, {0, 0, 1, 1}), make_i64({1}, {0})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({1, 1, 1, 1}, {1.25f}), 1e-6, 0));
  // Two points per axis over (0,0)-(2,2): (0.5|1.5, 0.5|1.5); the largest term is at (1.5, 1.5):
  // corners 5, 6, 9, 10 at 1/4 each, so 2.5.
  got = run_case(node.i("sampling_ratio", 2),
                 {linear_plane(1, 0), make_f32({1, 4}, {0, 0, 2, 2}), make_i64({1}, {0})});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(all_close((*got)[0], make_f32({1, 1, 1, 1}, {2.5f}), 1e-6, 0));
}

TEST(SpatialOps, RoiAlignRejectsBadBatchIndicesAndBoxesAtRunTime) {
  auto node = op("RoiAlign", 16).named("roi");
  Tensor x = linear_plane(1, 0);
  for (int64_t b : {1, -1}) {
    auto got = run_case(node, {x, make_f32({1, 4}, {0, 0, 2, 2}), make_i64({1}, {b})});
    ASSERT_FALSE(got.ok());
    EXPECT_NE(got.status().message().find("batch_indices[0]"), std::string::npos)
        << got.status().to_string();
  }
  auto got = run_case(node, {x, make_f32({1, 4}, {0, 0, NAN, 2}), make_i64({1}, {0})});
  EXPECT_FALSE(got.ok());
  // An adaptive grid over a huge box would sample for hours: refused.
  got = run_case(node, {x, make_f32({1, 4}, {0, 0, 1e9f, 1e9f}), make_i64({1}, {0})});
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("sample points"), std::string::npos)
      << got.status().to_string();
}

}  // namespace
}  // namespace kiln
