#include "backends/cpu/vector_math.h"

#include "backends/cpu/multiversion.h"

namespace kiln::backends::cpu {
namespace {

// erf(t) ~ t P(t^2) / Q(t^2) for |t| <= 4 (erf(4) = 1 - 1.5e-8): coefficients from a reweighted
// least-squares fit to erf at 6,000 Chebyshev points of [0, 4] (numpy and scipy.special.erf).
constexpr double kP0 = 1.12837917867899, kP1 = 0.18478835869641916, kP2 = 0.054329916848768964,
                 kP3 = 0.0038410709513553246, kP4 = 0.0003822004082780323,
                 kP5 = 4.765513851814795e-06, kP6 = -1.3595065060599956e-08;
constexpr double kQ1 = 0.4970979344890345, kQ2 = 0.11384705624444107, kQ3 = 0.015454760690352454,
                 kQ4 = 0.001309239956308025, kQ5 = 6.386724664934407e-05;

// Past |t| = 4, +-1 exactly, so that 1 + erf(t) is 0 there (as 1 + erf in float is) instead of the
// fit's 1.5e-8. Comparisons, so that NaN passes through.
inline double erf_fit(double t) {
  const double c = t > 4.0 ? 4.0 : (t < -4.0 ? -4.0 : t);
  const double u = c * c;
  const double p = (((((kP6 * u + kP5) * u + kP4) * u + kP3) * u + kP2) * u + kP1) * u + kP0;
  const double q = ((((kQ5 * u + kQ4) * u + kQ3) * u + kQ2) * u + kQ1) * u + 1.0;
  const double r = c * p / q;
  return t > 4.0 ? 1.0 : (t < -4.0 ? -1.0 : r);
}

inline void gelu_loop(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    y[i] = float(0.5 * v * (1.0 + erf_fit(v * 0.70710678118654752440)));
  }
}

}  // namespace

#if KILN_MULTIVERSION
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void gelu_erf_f32(const float* x, float* y, int64_t n) {
  gelu_loop(x, y, n);
}

}  // namespace kiln::backends::cpu
