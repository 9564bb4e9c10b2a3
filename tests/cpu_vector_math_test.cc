// The CPU's vectorized float32 math (backends/cpu/vector_math.h) against the C library in double:
// Gelu in float within 3 ulp of the correctly rounded value (plus 2e-7 |x| where 1 + erf cancels)
// over [-8, 8] densely, exact at 0, NaN kept, the infinities as the formula gives them, odd
// lengths and in place; Sigmoid's exp fit correctly rounded but for a handful of values; Softmax
// rows in float within 2.5e-7 relative of the exact rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backends/cpu/gemm.h"
#include "backends/cpu/vector_math.h"

namespace kiln {
namespace {

using backends::cpu::erf_f32;
using backends::cpu::gelu_erf_f32;
using backends::cpu::sigmoid_f32;
using backends::cpu::softmax_row_f32;

double gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

TEST(CpuVectorMath, GeluErfIsWithinThreeUlpOfTheCorrectlyRoundedValue) {
  std::vector<float> x;
  for (int i = -800000; i <= 800000; ++i) x.push_back(float(i) * 1e-5f);  // [-8, 8]
  for (float v : {1e-30f, -1e-30f, 3.0e-8f, 100.f, -100.f, 1e6f, -1e6f}) x.push_back(v);
  std::vector<float> y(x.size());
  gelu_erf_f32(x.data(), y.data(), int64_t(x.size()));
  int64_t off_by_one = 0;
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = gelu(double(x[i]));
    const float rounded = float(want);
    const double ulp = std::nextafter(std::fabs(rounded), std::numeric_limits<float>::infinity()) -
                       std::fabs(rounded);
    const double err = std::fabs(double(y[i]) - want);
    if (x[i] >= 0.f) worst = std::max(worst, err / std::max(ulp, 1e-45));
    // Below 0, 1 + erf cancels: erf's few float ulp near -1 are up to 2e-7 |x| in Gelu.
    ASSERT_LE(err, 3 * ulp + (x[i] < 0.f ? 2e-7 * std::fabs(double(x[i])) : 0.0))
        << "x = " << x[i] << ": got " << y[i] << ", want " << want;
    if (x[i] >= 0.f) off_by_one += y[i] != rounded;  // below 0, 1 + erf cancels
  }
  std::printf(
      "[ gelu ] %zu values, %lld not the correctly rounded float, worst %.2f ulp (x >= 0)\n",
      x.size(), static_cast<long long>(off_by_one), worst);
}

TEST(CpuVectorMath, GeluErfSpecialValuesOddLengthsAndInPlace) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {0.f, -0.f, std::nanf(""), inf, -inf, 1.f, -1.f};
  std::vector<float> y(x.size(), 7.f);
  gelu_erf_f32(x.data(), y.data(), int64_t(x.size()));
  EXPECT_EQ(y[0], 0.f);
  EXPECT_EQ(y[1], 0.f);
  EXPECT_TRUE(std::isnan(y[2]));
  EXPECT_EQ(y[3], inf);
  EXPECT_TRUE(std::isnan(y[4]));  // 0.5 * -inf * (1 + erf(-inf)) = -inf * 0
  const float g1 = float(gelu(1.0));
  EXPECT_NEAR(y[5], g1, 3 * (std::nextafter(g1, 2.f) - g1));
  // In place, and lengths that leave a vector remainder: the same values.
  for (int64_t n : {1, 3, 17, 33}) {
    std::vector<float> v(static_cast<size_t>(n)), out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(i) * 0.37f - 3.f;
    gelu_erf_f32(v.data(), out.data(), n);
    gelu_erf_f32(v.data(), v.data(), n);
    EXPECT_EQ(v, out) << n;
  }
  gelu_erf_f32(nullptr, nullptr, 0);  // nothing to do
}

// Erf over [-6, 6] densely: within one float ulp of the correctly rounded value; +-1 beyond, NaN
// kept.
TEST(CpuVectorMath, ErfIsWithinAnUlp) {
  std::vector<float> x;
  for (int i = -600000; i <= 600000; ++i) x.push_back(float(i) * 1e-5f);
  for (float v : {100.f, -100.f, 1e-30f}) x.push_back(v);
  std::vector<float> y(x.size());
  erf_f32(x.data(), y.data(), int64_t(x.size()));
  int64_t off = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::erf(double(x[i]));
    const float rounded = float(want);
    const double ulp =
        std::max(double(std::nextafter(std::fabs(rounded), std::numeric_limits<float>::infinity()) -
                        std::fabs(rounded)),
                 1e-45);
    ASSERT_LE(std::fabs(double(y[i]) - want), ulp) << "x = " << x[i];
    off += y[i] != rounded;
  }
  std::printf("[ erf ] %zu values, %lld not the correctly rounded float\n", x.size(),
              static_cast<long long>(off));
  float nan = std::nanf("");
  erf_f32(&nan, &nan, 1);
  EXPECT_TRUE(std::isnan(nan));
}

// Sigmoid over [-120, 120] densely and past the clamp: within one ulp of 1 / (1 + exp(-x)) in
// double everywhere (correctly rounded but for a handful), NaN kept, +-inf to 1 and 0.
TEST(CpuVectorMath, SigmoidIsCorrectlyRoundedAlmostEverywhere) {
  std::vector<float> x;
  for (int i = -1200000; i <= 1200000; ++i) x.push_back(float(i) * 1e-4f);
  for (float v : {-150.f, -200.f, 150.f, 1e30f, -1e30f, 1e-30f, -0.f}) x.push_back(v);
  std::vector<float> y(x.size());
  sigmoid_f32(x.data(), y.data(), int64_t(x.size()));
  int64_t off = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = 1.0 / (1.0 + std::exp(-double(x[i])));
    const float rounded = float(want);
    const double ulp =
        std::nextafter(std::fabs(double(rounded)), std::numeric_limits<double>::infinity()) -
        std::fabs(double(rounded));
    const double fulp =
        std::max(double(std::nextafter(std::fabs(rounded), std::numeric_limits<float>::infinity()) -
                        std::fabs(rounded)),
                 ulp);
    ASSERT_LE(std::fabs(double(y[i]) - want), fulp)
        << "x = " << x[i] << ": got " << y[i] << ", want " << want;
    off += y[i] != rounded;
  }
  std::printf("[ sigmoid ] %zu values, %lld not the correctly rounded float\n", x.size(),
              static_cast<long long>(off));
  EXPECT_LT(off, 100);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> special = {std::nanf(""), inf, -inf, 0.f};
  sigmoid_f32(special.data(), special.data(), 4);
  EXPECT_TRUE(std::isnan(special[0]));
  EXPECT_EQ(special[1], 1.f);
  EXPECT_EQ(special[2], 0.f);
  EXPECT_EQ(special[3], 0.5f);
}

// Softmax of a row in double: exp(x - max) / sum.
std::vector<double> exact_softmax(const std::vector<float>& x) {
  double mx = -1e300, sum = 0;
  for (float v : x) mx = std::max(mx, double(v));
  for (float v : x) sum += std::exp(double(v) - mx);
  std::vector<double> out;
  for (float v : x) out.push_back(std::exp(double(v) - mx) / sum);
  return out;
}

// Softmax rows of several lengths (the partial sums' remainders), with -inf entries and large
// values: within 2.5e-7 relative of the double computation; a NaN or +inf in a row makes it NaN.
TEST(CpuVectorMath, SoftmaxRowsMatchDoubleAndPropagateNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n : {1, 7, 8, 197, 1000}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] = std::sin(float(i) * 1.7f) * 30.f + 80.f;
    if (n > 2) x[1] = -inf;
    std::vector<float> y(x.size());
    softmax_row_f32(x.data(), y.data(), n);
    const std::vector<double> exact = exact_softmax(x);
    for (int64_t i = 0; i < n; ++i) {
      const double want = exact[size_t(i)];
      EXPECT_NEAR(y[size_t(i)], want, 2.5e-7 * want + 1e-30) << "n=" << n << " i=" << i;
    }
  }
  // Random rows (scores spread over about +-30, so x - max is often large and rounds): within
  // 2.5e-7 relative wherever the exact value is a normal float.
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.f, 8.f);
  double worst = 0;
  for (int rep = 0; rep < 3000; ++rep) {
    const int64_t n = 1 + int64_t(gen() % 300);
    std::vector<float> x(static_cast<size_t>(n)), y(x.size());
    for (float& v : x) v = normal(gen);
    softmax_row_f32(x.data(), y.data(), n);
    const std::vector<double> exact = exact_softmax(x);
    for (int64_t i = 0; i < n; ++i) {
      const double want = exact[size_t(i)];
      if (want > 1.2e-38) worst = std::max(worst, std::fabs(double(y[size_t(i)]) - want) / want);
    }
  }
  std::printf("[ softmax ] 3000 random rows: worst relative error %.3g\n", worst);
  EXPECT_LE(worst, 2.5e-7);
  for (float bad : {std::nanf(""), inf}) {
    std::vector<float> x = {1.f, bad, 2.f};
    softmax_row_f32(x.data(), x.data(), 3);  // in place
    for (float v : x) EXPECT_TRUE(std::isnan(v)) << bad;
  }
}

// The piecewise-linear activations give the bits of their scalar forms (double, but hardswish's in
// float), whichever instruction set ran them: every float of a sweep over [-12, 12] in
// steps that hit the kinks exactly, odd lengths, infinities, NaN and signed zeros.
TEST(CpuVectorMath, PiecewiseLinearActivationsMatchTheirScalarForms) {
  using namespace backends::cpu;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x;
  for (int i = -1200; i <= 1200; ++i) x.push_back(float(i) / 100.f);
  for (float v : {inf, -inf, std::nanf(""), -0.f, 0.f, 3.f, -3.f, 6.f, 1e-30f, -1e-30f})
    x.push_back(v);
  auto bits = [](float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return std::isnan(v) ? 0x7fc00000u : u;
  };
  auto check = [&](const char* name, void (*run)(float*, int64_t, double, double), double a,
                   double b, double (*want)(double, double, double)) {
    for (size_t n : {x.size(), size_t(1), size_t(17)}) {
      std::vector<float> y(x.begin(), x.begin() + std::ptrdiff_t(n));
      run(y.data(), int64_t(n), a, b);
      for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(bits(y[i]), bits(float(want(double(x[i]), a, b))))
            << name << "(" << x[i] << ") n=" << n;
      }
    }
  };
  check(
      "relu", [](float* y, int64_t n, double, double) { relu_f32(y, n); }, 0, 0,
      [](double v, double, double) { return v > 0 ? v : 0.0; });
  check(
      "clip", [](float* y, int64_t n, double a, double b) { clip_f32(y, n, a, b); }, -1.5, 6,
      [](double v, double a, double b) { return std::min(std::max(v, a), b); });
  check(
      "hardswish", [](float* y, int64_t n, double, double) { hardswish_f32(y, n); }, 0, 0,
      [](double v, double, double) {
        // In float, each step rounded (as ONNX Runtime computes it).
        const float f = float(v);
        return double(f * std::min(1.0f, std::max(0.0f, (f + 3.0f) * (1.0f / 6))));
      });
  check(
      "hardsigmoid", [](float* y, int64_t n, double a, double b) { hardsigmoid_f32(y, n, a, b); },
      0.2, 0.5,
      [](double v, double a, double b) { return std::max(0.0, std::min(1.0, a * v + b)); });
  check(
      "leaky_relu", [](float* y, int64_t n, double a, double) { leaky_relu_f32(y, n, a); }, 0.01, 0,
      [](double v, double a, double) { return v >= 0 ? v : a * v; });
}

// saxpy_taps, which keeps a depthwise plane's output run in registers across its taps, sums the
// taps as one saxpy per tap does, in the same order, for runs of whole vectors, of a partial one,
// of more than the 64 floats a register block holds, and for one tap and none. Not bit for bit:
// whether a product and its sum round once (FMA) or twice is the compiler's choice per function
// (GCC 13 on the GPU host rounded 16-float runs differently in the two), so each
// element must lie within a few roundings of the exact sum, as one saxpy per tap does.
TEST(CpuVectorMath, TapsAxpyMatchesOneAxpyPerTap) {
  using namespace backends::cpu;
  std::vector<float> src(4096);
  uint32_t state = 12345;
  for (float& v : src) {
    state = state * 1664525u + 1013904223u;
    v = float(int32_t(state >> 8) % 20001 - 10000) / 1234.5f;
  }
  for (int64_t taps : {0, 1, 9, 25}) {
    std::vector<int64_t> off;
    std::vector<float> w;
    for (int64_t t = 0; t < taps; ++t) {
      off.push_back((t * 37) % 211);
      w.push_back(float(t % 7) * 0.37f - 1.1f);
    }
    for (int64_t n : {1, 15, 16, 17, 48, 63, 64, 77, 80, 130, 200}) {
      std::vector<float> per_tap(size_t(n), 0.25f), got(size_t(n), 0.25f);
      for (int64_t t = 0; t < taps; ++t)
        saxpy(per_tap.data(), src.data() + off[size_t(t)], w[size_t(t)], n);
      saxpy_taps(got.data(), src.data(), off.data(), w.data(), taps, n);
      for (int64_t i = 0; i < n; ++i) {
        double exact = 0.25, magnitude = 0.25;
        for (int64_t t = 0; t < taps; ++t) {
          const double p = double(w[size_t(t)]) * double(src[size_t(off[size_t(t)] + i)]);
          exact += p;
          magnitude += std::fabs(p);
        }
        // Each of the `taps` steps rounds at most twice (product and sum).
        const double bound = 2.0 * double(taps + 1) * 0x1p-24 * magnitude;
        EXPECT_LE(std::fabs(double(got[size_t(i)]) - exact), bound)
            << "saxpy_taps, taps " << taps << " n " << n << " element " << i;
        EXPECT_LE(std::fabs(double(per_tap[size_t(i)]) - exact), bound)
            << "saxpy per tap, taps " << taps << " n " << n << " element " << i;
      }
      if (taps == 0) {
        EXPECT_EQ(std::memcmp(per_tap.data(), got.data(), size_t(n) * sizeof(float)), 0) << n;
      }
    }
  }
}

// strided_copy_f32 gathers every stride-th float, reading nothing past the last one it copies
// (each source is exactly (n - 1) * stride + 1 floats, so ASan sees an over-read).
// depthwise_band_f32 (the CPU's channels-last 3x3 and 5x5 depthwise rows) against a loop in
// double: strides 1 and 2, widths that leave every remainder of its eight-pixel step, channels
// in 16- and 8-wide blocks with some left past cv (untouched), pads on one side only, bands that
// start and end inside the image, bands taller than its copy holds, with and without a bias.
TEST(CpuVectorMath, DepthwiseBandMatchesTheTapsInDouble) {
  using namespace backends::cpu;
  uint32_t state = 777;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return float(int32_t(state >> 8) % 20001 - 10000) / 5000.f;
  };
  struct Case {
    int64_t k, s, h, w, c, cv, pt, pl, oh0, oh1;
    bool bias;
  };
  const Case cases[] = {
      {3, 1, 7, 15, 24, 24, 1, 1, 0, 7, true},      // every remainder: 15 = 8 + 4 + 2 + 1
      {5, 1, 14, 14, 240, 240, 2, 2, 0, 14, true},  // MobileNetV3-small's 5x5 layer
      {5, 1, 9, 13, 40, 32, 2, 0, 3, 8, false},     // channels past cv, left pad 0, a mid band
      {3, 2, 11, 12, 16, 16, 1, 1, 0, 6, true},     // stride 2
      {5, 2, 14, 14, 72, 72, 2, 2, 1, 7, false},
      {3, 1, 40, 120, 16, 16, 1, 1, 0, 40, true},  // bands of fewer rows than the image
  };
  for (const Case& z : cases) {
    const int64_t ow = (z.w + 2 * z.pl - z.k) / z.s + 1;
    std::vector<float> img(size_t(z.h * z.w * z.c)), taps(size_t(z.k * z.k * z.c)),
        bias(size_t(z.c));
    for (float& v : img) v = next();
    for (float& v : taps) v = next() * 0.3f;
    for (float& v : bias) v = next();
    const int64_t rows = z.oh1 - z.oh0;
    std::vector<float> y(size_t(rows * ow * z.c), -7.f);
    std::vector<float> scratch(size_t(depthwise_band_scratch_floats(z.k, z.s, ow)));
    ASSERT_TRUE(depthwise_band_f32(y.data(), img.data(), taps.data(),
                                   z.bias ? bias.data() : nullptr, z.k, z.s, z.c, z.cv, z.h, z.w,
                                   z.oh0, z.oh1, ow, z.pt, z.pl, scratch.data()));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < ow; ++o) {
        for (int64_t ch = 0; ch < z.c; ++ch) {
          const float got = y[size_t((r * ow + o) * z.c + ch)];
          if (ch >= z.cv) {
            ASSERT_EQ(got, -7.f) << "channel " << ch << " past cv was written";
            continue;
          }
          double want = z.bias ? bias[size_t(ch)] : 0.0, mag = std::fabs(want);
          for (int64_t a = 0; a < z.k; ++a) {
            const int64_t ih = (z.oh0 + r) * z.s - z.pt + a;
            if (ih < 0 || ih >= z.h) continue;
            for (int64_t b = 0; b < z.k; ++b) {
              const int64_t iw = o * z.s - z.pl + b;
              if (iw < 0 || iw >= z.w) continue;
              const double p = double(img[size_t((ih * z.w + iw) * z.c + ch)]) *
                               taps[size_t((a * z.k + b) * z.c + ch)];
              want += p, mag += std::fabs(p);
            }
          }
          ASSERT_NEAR(got, want, 1e-6 * mag + 1e-7)
              << "k=" << z.k << " s=" << z.s << " row " << r << " pixel " << o << " channel " << ch;
        }
      }
    }
  }
  float dummy = 0;
  EXPECT_FALSE(
      depthwise_band_f32(&dummy, &dummy, &dummy, nullptr, 7, 1, 8, 8, 1, 1, 0, 1, 1, 3, 3, &dummy))
      << "a 7x7 filter is not the band kernel's";
}

TEST(CpuVectorMath, StridedCopyReadsOnlyWhatItCopies) {
  using namespace backends::cpu;
  for (int64_t stride : {1, 2, 3}) {
    for (int64_t n : {1, 2, 15, 16, 17, 31, 32, 33, 100}) {
      std::vector<float> src(size_t((n - 1) * stride + 1));
      for (size_t i = 0; i < src.size(); ++i) src[i] = float(i) * 0.5f - 3.f;
      std::vector<float> dst(size_t(n), -1.f);
      strided_copy_f32(dst.data(), src.data(), stride, n);
      for (int64_t j = 0; j < n; ++j)
        EXPECT_EQ(dst[size_t(j)], src[size_t(j * stride)]) << stride << " " << n << " " << j;
    }
  }
}

// layer_norm_row_f32 against the reference's sequential loops in double, rows shorter than one
// 16-wide block, of whole blocks and with a tail, with and without B, in place too: the mean and
// inv within double rounding of the loops', every output within one float ulp of the loop's.
TEST(CpuVectorMath, LayerNormRowMatchesTheSequentialLoops) {
  using namespace backends::cpu;
  for (int64_t n : {1, 15, 16, 17, 192, 200}) {
    const size_t sz = static_cast<size_t>(n);
    std::vector<float> x(sz), scale(sz), bias(sz);
    for (int64_t j = 0; j < n; ++j) {
      x[size_t(j)] = std::sin(float(j) * 0.7f) * 4.f + 1.5f;
      scale[size_t(j)] = 0.5f + float(j % 5) * 0.25f;
      bias[size_t(j)] = float(j % 3) - 1.f;
    }
    for (bool with_bias : {false, true}) {
      double sum = 0;
      for (float v : x) sum += double(v);
      const double mean = sum / double(n);
      double sq = 0;
      for (float v : x) sq += (double(v) - mean) * (double(v) - mean);
      const double inv = 1.0 / std::sqrt(sq / double(n) + 1e-5);
      std::vector<float> y(sz), in_place = x;
      double got_mean = 0, got_inv = 0, m2 = 0, i2 = 0;
      layer_norm_row_f32(x.data(), y.data(), n, scale.data(), with_bias ? bias.data() : nullptr,
                         1e-5, &got_mean, &got_inv);
      layer_norm_row_f32(in_place.data(), in_place.data(), n, scale.data(),
                         with_bias ? bias.data() : nullptr, 1e-5, &m2, &i2);
      EXPECT_NEAR(got_mean, mean, 1e-12 * (1 + std::fabs(mean))) << n;
      EXPECT_NEAR(got_inv, inv, 1e-12 * inv) << n;
      for (int64_t j = 0; j < n; ++j) {
        const double want = (double(x[size_t(j)]) - mean) * inv * double(scale[size_t(j)]) +
                            (with_bias ? double(bias[size_t(j)]) : 0.0);
        const float w = float(want);
        EXPECT_LE(std::fabs(y[size_t(j)] - w),
                  std::nextafter(std::fabs(w), INFINITY) - std::fabs(w))
            << "n " << n << " j " << j << " bias " << with_bias;
        EXPECT_EQ(in_place[size_t(j)], y[size_t(j)]) << "in place, n " << n << " j " << j;
      }
    }
  }
}

// rms_norm_row_f32 against the reference's sequential loop in double, the same row lengths, in
// place too: every output within one float ulp of the loop's.
TEST(CpuVectorMath, RmsNormRowMatchesTheSequentialLoop) {
  using namespace backends::cpu;
  for (int64_t n : {1, 15, 16, 17, 192, 200}) {
    const size_t sz = static_cast<size_t>(n);
    std::vector<float> x(sz), scale(sz);
    for (int64_t j = 0; j < n; ++j) {
      x[size_t(j)] = std::sin(float(j) * 0.7f) * 4.f + 1.5f;
      scale[size_t(j)] = 0.5f + float(j % 5) * 0.25f;
    }
    double sq = 0;
    for (float v : x) sq += double(v) * double(v);
    const double inv = 1.0 / std::sqrt(sq / double(n) + 1e-6);
    std::vector<float> y(sz), in_place = x;
    rms_norm_row_f32(x.data(), y.data(), n, scale.data(), 1e-6);
    rms_norm_row_f32(in_place.data(), in_place.data(), n, scale.data(), 1e-6);
    for (int64_t j = 0; j < n; ++j) {
      const float w = float(double(x[size_t(j)]) * inv * double(scale[size_t(j)]));
      EXPECT_LE(std::fabs(y[size_t(j)] - w), std::nextafter(std::fabs(w), INFINITY) - std::fabs(w))
          << "n " << n << " j " << j;
      EXPECT_EQ(in_place[size_t(j)], y[size_t(j)]) << "in place, n " << n << " j " << j;
    }
  }
}

// column_sums_f32 sums each column in double in order of the rows, whatever its place in the
// 32- and 8-column blocks or the tail: equal to the plain loop for every width up to 70.
TEST(CpuVectorMath, ColumnSumsEqualThePlainLoop) {
  using namespace backends::cpu;
  const int64_t stride = 75, rows = 7;
  std::vector<float> x(size_t(rows * stride));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(double(i) * 0.37)) * 1e3f;
  for (int64_t cols = 1; cols <= 70; ++cols) {
    std::vector<double> got(size_t(cols), -1.0);
    column_sums_f32(x.data() + 3, rows, stride, cols, got.data());
    for (int64_t c = 0; c < cols; ++c) {
      double want = 0;
      for (int64_t r = 0; r < rows; ++r) want += double(x[size_t(r * stride + 3 + c)]);
      EXPECT_EQ(got[size_t(c)], want) << "cols " << cols << ", column " << c;
    }
  }
}

}  // namespace

}  // namespace kiln
