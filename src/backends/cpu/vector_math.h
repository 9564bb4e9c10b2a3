// Float32 math over arrays that the compiler vectorizes (AVX-512, AVX2 or SSE2, picked once for
// the running CPU), where the C library's scalar functions dominate a layer's time.
#pragma once

#include <cstdint>

namespace kiln::backends::cpu {

// y[i] = Gelu(x[i]) = 0.5 x (1 + erf(x / sqrt 2)) for i < n, in float (sixteen lanes): erf is a
// rational fit of our own (t P(t^2) / Q(t^2) on |t| <= 4, +-1 beyond; fitted by reweighted least
// squares, at most 1.5e-8 from erf) evaluated in float. For x >= 0 within 3 float ulp of the
// correctly rounded value (2.74 at worst over [0, 8] in steps of 1e-5); below 0, where 1 + erf
// cancels as in any float Gelu (ONNX Runtime's and PyTorch's), within 3 ulp + 2e-7 |x|. In double
// it took twice as long (ViT-tiny's four Gelu layers, 0.29 ms each at batch 4 on two threads, now
// 0.13). NaN stays NaN; Gelu(-inf) is NaN, as 0.5 * -inf * (1 + erf(-inf)) is. x and y may be the
// same array.
void gelu_erf_f32(const float* x, float* y, int64_t n);

// y[i] = erf(x[i]) for i < n through the same fit (at most 1.5e-8 from erf, so within one float ulp
// of the correctly rounded value), +-1 past |x| = 4; NaN stays NaN. x and y may be one array.
void erf_f32(const float* x, float* y, int64_t n);

// y[i] = Sigmoid(x[i]) = 1 / (1 + exp(-x[i])) for i < n, in double and rounded once: exp from a
// degree-11 Taylor polynomial on |r| <= ln 2 / 2 after x = k ln 2 + r (relative error below
// 1e-14), so the float result is the correctly rounded one but for rare ties. x is clamped to
// [-150, 150], past which Sigmoid is 0 or 1 in float; NaN stays NaN. x and y may be one array.
void sigmoid_f32(const float* x, float* y, int64_t n);

// One contiguous row of Softmax, in float (sixteen lanes): y = e / sum(e) with e = exp(x - max(x))
// (vector_math.cc's exp_minus_f: the rounding of x - max carried into the reduced argument, a
// degree-7 polynomial), summed in double, each y then e times the float of 1 / sum: within 2.5e-7
// of the exact value, relative (1.8e-7 at worst over 20,000 random rows). e below 2^-126 is 0.
// NaN and infinities as the formula gives them (a row holding NaN or +inf is NaN). In double it
// took twice as long (ViT-tiny's attention scores, 0.36 ms a layer at batch 4 on two threads,
// now 0.17).
void softmax_row_f32(const float* x, float* y, int64_t n);

// In place, y[i] = the piecewise-linear activations of kiln::FusedConv, each in double and
// rounded once by the same expressions as the CPU FusedConv kernel's scalar ones (so the bits do
// not depend on which instruction set ran them): relu y > 0 ? y : 0; clip min(max(y, lo), hi);
// hardsigmoid max(0, min(1, a y + b)); leaky_relu y >= 0 ? y : a y. hardswish
// y max(0, min(1, (y + 3) * (1/6))) is computed in float (each step rounded, the same steps in
// every lane and instruction set).
void relu_f32(float* y, int64_t n);
void clip_f32(float* y, int64_t n, double lo, double hi);
void hardswish_f32(float* y, int64_t n);
void hardsigmoid_f32(float* y, int64_t n, double a, double b);
void leaky_relu_f32(float* y, int64_t n, double a);

// The sum of x[0:n] in double, over sixteen partial sums (so the additions do not wait on one
// another), added pairwise at the end, then the tail in order.
double sum_f32(const float* x, int64_t n);

// out[c] = the sum over r < rows of x[r * stride + c] for c < cols, in double, each column in
// order of r (so the bits do not depend on how the columns are split): a channels-last pool's
// column sums, 32 columns at a time in registers (then 16, then 8).
void column_sums_f32(const float* x, int64_t rows, int64_t stride, int64_t cols, double* out);

// One float32 row of LayerNormalization, in double as the reference computes it: mean, then the
// mean squared deviation from it (each over sixteen partial sums, as sum_f32), inv = 1 /
// sqrt(var + eps), y[j] = float((x[j] - mean) * inv * scale[j] + bias[j]) (bias may be null).
// Writes the mean and inv to *mean and *inv. x and y may be one array.
void layer_norm_row_f32(const float* x, float* y, int64_t n, const float* scale, const float* bias,
                        double eps, double* mean, double* inv);

// One float32 row of RMSNormalization, in double as the reference computes it: the mean square
// over sixteen partial sums (as sum_f32), inv = 1 / sqrt(ms + eps), y[j] = float(x[j] * inv *
// scale[j]). x and y may be one array.
void rms_norm_row_f32(const float* x, float* y, int64_t n, const float* scale, double eps);

// dst[j] = src[j * stride] for j < n (a depthwise convolution's phase split); stride 2, the
// common one, deinterleaves 32 floats at a time.
void strided_copy_f32(float* dst, const float* src, int64_t stride, int64_t n);

}  // namespace kiln::backends::cpu
