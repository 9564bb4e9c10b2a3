// Attention op family: shape inference of Attention (3-D and 4-D, past key/value, GQA) and
// RotaryEmbedding, and the kernels (every backend) against naive formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "op_harness.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::all_close;
using testing::CaseInput;
using testing::f32;
using testing::infer_node;
using testing::make_f32;
using testing::make_i64;
using testing::op;
using testing::OpNode;
using testing::run_case;

std::vector<float> ramp(int64_t n, float scale, float offset) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = std::sin(float(i) * scale) * 1.5f + offset;
  return v;
}
Tensor ramp_f32(Shape shape, float scale, float offset) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return make_f32(std::move(shape), ramp(n, scale, offset));
}
// A ramp in float16 or bfloat16 (rounded once from ramp's floats).
Tensor ramp_half(DType t, Shape shape, float scale, float offset) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<uint16_t> h;
  for (float f : ramp(n, scale, offset))
    h.push_back(t == DType::kFloat16 ? float_to_half(f) : float_to_bf16(f));
  return Tensor::from_vector(t, std::move(shape), h);
}
Tensor ramp_f16(Shape shape, float scale, float offset) {
  return ramp_half(DType::kFloat16, std::move(shape), scale, offset);
}
Tensor ramp_bf16(Shape shape, float scale, float offset) {
  return ramp_half(DType::kBFloat16, std::move(shape), scale, offset);
}

Tensor ramp_f64(Shape shape, float scale, float offset) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v;
  for (float f : ramp(n, scale, offset)) v.push_back(f);
  return Tensor::from_vector(DType::kFloat64, std::move(shape), v);
}

OpNode attention(int opset = 23) { return op("Attention", opset); }

TEST(AttentionInfer, ThreeDWithHeadsAndPast) {
  const Dim s = Dim::symbol("s"), p = Dim::symbol("p");
  auto r = infer_node(attention().i("q_num_heads", 4).i("kv_num_heads", 2),
                      {f32({2, s, 32}), f32({2, s, 16}), f32({2, s, 24})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.dims()[2], Dim(48));  // 4 heads x head size 12 of V
  // 4-D with a mask and past: present is [B, kv_heads, P + S, head].
  r = infer_node(attention(),
                 {f32({1, 4, s, 8}), f32({1, 2, s, 8}), f32({1, 2, s, 8}), f32({s, p + s}),
                  f32({1, 2, p, 8}), f32({1, 2, p, 8})},
                 4);
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.dims(1)[2], p + s);
  EXPECT_EQ(r.dims(3)[1], Dim(4));
  EXPECT_EQ(r.dims(3)[3], p + s);
  // Q heads must be a multiple of KV heads.
  EXPECT_FALSE(
      infer_node(attention(), {f32({1, 3, 4, 8}), f32({1, 2, 4, 8}), f32({1, 2, 4, 8})}).ok());
}

TEST(AttentionKernel, SingleHeadMatchesSoftmaxFormulaAndCausalMasks) {
  // Q, K, V: [1, 1, 2, 2]. Non-causal: y_i = sum_j softmax(q_i.k_j / sqrt(2)) v_j.
  std::vector<float> q = {1, 0, 0, 1}, k = {1, 0, 0, 1}, v = {1, 2, 3, 4};
  std::vector<CaseInput> in = {make_f32({1, 1, 2, 2}, q), make_f32({1, 1, 2, 2}, k),
                               make_f32({1, 1, 2, 2}, v)};
  auto out = run_case(attention(), in);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  double e = std::exp(1.0 / std::sqrt(2.0));
  double w0 = e / (e + 1), w1 = 1 / (e + 1);
  std::vector<float> want = {float(w0 * 1 + w1 * 3), float(w0 * 2 + w1 * 4), float(w1 * 1 + w0 * 3),
                             float(w1 * 2 + w0 * 4)};
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 2, 2}, want)));
  out = run_case(attention().i("is_causal", 1), in);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  // The first query sees only the first key.
  EXPECT_NEAR((*out)[0].data_as<float>()[0], 1.f, 1e-6f);
  EXPECT_NEAR((*out)[0].data_as<float>()[1], 2.f, 1e-6f);
}

TEST(AttentionInfer, WindowAttributesFromOpset25) {
  const std::vector<testing::NodeInput> in = {f32({1, 2, 3, 4}), f32({1, 2, 5, 4}),
                                              f32({1, 2, 5, 4})};
  auto r = infer_node(attention().i("left_window_size", 2), in);
  EXPECT_EQ(r.code(), StatusCode::kInvalidModel);  // opset 23 has no windows
  EXPECT_NE(r.status.message().find("opset 25"), std::string::npos) << r.status.message();
  r = infer_node(attention(25).i("left_window_size", 2), in);
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[1, 2, 3, 4]");
  EXPECT_EQ(
      infer_node(attention(25).i("left_window_size", 2).i("right_window_size", -2), in).code(),
      StatusCode::kInvalidModel);
}

// With all-zero Q and K every allowed key gets the same weight, so each output is the mean of the
// V rows its query may attend: the masks can be read off the values.
std::vector<float> attend_means(const OpNode& n, int64_t s, int64_t l,
                                std::vector<CaseInput> extra = {}) {
  std::vector<float> vals(static_cast<size_t>(l));
  for (int64_t j = 0; j < l; ++j) vals[size_t(j)] = float(1 << j);
  std::vector<CaseInput> in = {make_f32({1, 1, s, 1}, std::vector<float>(size_t(s), 0.f)),
                               make_f32({1, 1, l, 1}, std::vector<float>(size_t(l), 0.f)),
                               make_f32({1, 1, l, 1}, vals)};
  for (CaseInput& t : extra) in.push_back(t);
  auto out = run_case(n, in);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  if (!out.ok()) return {};
  const float* y = (*out)[0].data_as<float>();
  return std::vector<float>(y, y + s);
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5f) << i;
}

TEST(AttentionKernel, SlidingWindowsAndBottomRightOffsets) {
  // V rows are 1, 2, 4, 8: query i sees only key i.
  expect_near(attend_means(attention(25).i("left_window_size", 0).i("right_window_size", 0), 4, 4),
              {1, 2, 4, 8});
  // Causal with one key of look-back: {0}, {0,1}, {1,2}, {2,3}.
  expect_near(attend_means(attention(25).i("is_causal", 1).i("left_window_size", 1), 4, 4),
              {1, 1.5f, 3, 6});
  // Right window only (non-causal): query i sees keys 0..i+1.
  expect_near(attend_means(attention(25).i("right_window_size", 1), 2, 4), {1.5f, 7.0f / 3});
  // An external cache (nonpad_kv_seqlen, no past): causal alignment is bottom-right, offset
  // nonpad - S = 3 - 1, so the one query sees keys 0..2 (mean 7/3), not key 0 alone.
  std::vector<CaseInput> nonpad = {testing::kNoInput, testing::kNoInput, testing::kNoInput,
                                   make_i64({1}, {3})};
  expect_near(attend_means(attention().i("is_causal", 1), 1, 4, nonpad), {7.0f / 3});
}

TEST(AttentionKernel, FullyMaskedRowsAreZeroNotNaN) {
  std::vector<uint8_t> mask = {0, 0, 0, 1, 1, 0};  // query 0 may attend nothing
  auto out =
      run_case(attention().i("qk_matmul_output_mode", 3),
               {make_f32({1, 1, 2, 1}, {1, 2}), make_f32({1, 1, 3, 1}, {1, 0, -1}),
                make_f32({1, 1, 3, 1}, {1, 2, 3}), Tensor::from_vector(DType::kBool, {2, 3}, mask)},
               4);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const float* y = (*out)[0].data_as<float>();
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_FALSE(std::isnan(y[1]));
  const float* p = (*out)[3].data_as<float>();
  for (int j = 0; j < 3; ++j) EXPECT_EQ(p[j], 0.0f) << j;  // mode 3 probabilities too
  EXPECT_NEAR(p[3] + p[4], 1.0f, 1e-6f);
  EXPECT_EQ(p[5], 0.0f);
}

// The cases below compare every backend with the reference over the attribute space (the CUDA
// kernel scores keys in chunks of 128, so some cases have more keys than that).
TEST(AttentionKernel, GqaThreeDWithAdditiveMaskAndPresent) {
  auto n = attention().i("q_num_heads", 4).i("kv_num_heads", 2);
  std::vector<CaseInput> in = {ramp_f32({2, 3, 32}, 0.37f, 0.1f),
                               ramp_f32({2, 5, 16}, 0.23f, -0.2f),
                               ramp_f32({2, 5, 12}, 0.41f, 0.3f), ramp_f32({3, 5}, 0.9f, -1.0f)};
  auto out = run_case(n, in, 4);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].shape(), (Shape{2, 3, 24}));
  EXPECT_EQ((*out)[1].shape(), (Shape{2, 2, 5, 8}));
  EXPECT_EQ((*out)[3].shape(), (Shape{2, 4, 3, 5}));
  // Float16 storage, the same computation.
  out = run_case(n,
                 {ramp_f16({2, 3, 32}, 0.37f, 0.1f), ramp_f16({2, 5, 16}, 0.23f, -0.2f),
                  ramp_f16({2, 5, 12}, 0.41f, 0.3f), ramp_f16({3, 5}, 0.9f, -1.0f)},
                 4);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].dtype(), DType::kFloat16);
}

// kiln::PackedAttention is ONNX Attention over heads read in place: a packed [X0, X1, 3*H*D]
// projection, batch first and sequence first, against Attention on the heads copied out by hand
// (4-D [B, H, S, D]), with GQA (K and V of one head from their own offsets), a mask and causal.
TEST(PackedAttentionKernel, IsAttentionOverTheHeadsItReadsInPlace) {
  const int64_t b = 2, s = 5, hq = 2, hk = 1, d = 8;
  const int64_t n = (hq + 2 * hk) * d + 4;  // 4 unused columns at the end
  for (int seq_first = 0; seq_first < 2; ++seq_first) {
    for (int causal = 0; causal < 2; ++causal) {
      const Shape ps = seq_first ? Shape{s, b, n} : Shape{b, s, n};
      Tensor p = ramp_f32(ps, 0.173f, 0.05f);
      Tensor mask = ramp_f32({s, s}, 0.61f, -0.5f);
      // [B, heads, S, D] copies of the heads at `offset`.
      auto heads = [&](int64_t offset, int64_t h) {
        std::vector<float> v;
        for (int64_t bb = 0; bb < b; ++bb) {
          for (int64_t hh = 0; hh < h; ++hh) {
            for (int64_t ss = 0; ss < s; ++ss) {
              const int64_t row = seq_first ? ss * b + bb : bb * s + ss;
              for (int64_t dd = 0; dd < d; ++dd)
                v.push_back(p.data_as<float>()[row * n + offset + hh * d + dd]);
            }
          }
        }
        return make_f32({b, h, s, d}, v);
      };
      auto ref = run_case(attention().f("scale", 0.3f).i("is_causal", causal),
                          {heads(0, hq), heads(hq * d, hk), heads(hq * d + hk * d, hk), mask});
      ASSERT_TRUE(ref.ok()) << ref.status().to_string();
      std::vector<float> want;  // [X0, X1, hq*d] in the packed layout
      for (int64_t x0 = 0; x0 < ps[0]; ++x0) {
        for (int64_t x1 = 0; x1 < ps[1]; ++x1) {
          const int64_t bb = seq_first ? x1 : x0, ss = seq_first ? x0 : x1;
          for (int64_t hh = 0; hh < hq; ++hh) {
            for (int64_t dd = 0; dd < d; ++dd)
              want.push_back((*ref)[0].data_as<float>()[((bb * hq + hh) * s + ss) * d + dd]);
          }
        }
      }
      OpNode node = op("PackedAttention", 1, "kiln")
                        .i("q_num_heads", hq)
                        .i("kv_num_heads", hk)
                        .i("head_size", d)
                        .i("v_head_size", d)
                        .i("q_offset", 0)
                        .i("k_offset", hq * d)
                        .i("v_offset", hq * d + hk * d)
                        .i("seq_first", seq_first)
                        .i("is_causal", causal)
                        .f("scale", 0.3f);
      const std::string label = std::string("seq_first ") + std::to_string(seq_first) + " causal " +
                                std::to_string(causal);
      auto got = run_case({.node = node,
                           .inputs = {p, p, p, mask},
                           .expected = {make_f32({ps[0], ps[1], hq * d}, want)},
                           .expect_support = true,
                           .label = label});
      ASSERT_TRUE(got.ok()) << label << ": " << got.status().to_string();
      for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
        auto h = testing::run_reduced_case({.node = node,
                                            .inputs = {p, p, p, mask},
                                            .expect_support = true,
                                            .label = label + " " + std::string(dtype_name(dt))},
                                           dt);
        ASSERT_TRUE(h.ok()) << label << " " << dtype_name(dt) << ": " << h.status().to_string();
      }
    }
  }
  // Heads that run past the last dim are refused by name.
  auto bad = run_case(op("PackedAttention", 1, "kiln")
                          .i("q_num_heads", 2)
                          .i("kv_num_heads", 2)
                          .i("head_size", 8)
                          .i("v_head_size", 8)
                          .i("v_offset", 40),
                      {ramp_f32({1, 2, 48}, 0.1f, 0.f), ramp_f32({1, 2, 48}, 0.1f, 0.f),
                       ramp_f32({1, 2, 48}, 0.1f, 0.f)});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(
      bad.status().message().find("V's heads (v_offset 40, 2 of 8) do not fit its last dim 48"),
      std::string::npos)
      << bad.status().to_string();
}

TEST(AttentionKernel, PastCausalBoolMaskSoftcapScaleAndOutputModes) {
  std::vector<uint8_t> mask(2 * 3 * 7);
  for (size_t e = 0; e < mask.size(); ++e) mask[e] = (e * 7 + 3) % 5 != 0;
  Tensor past_k = ramp_f32({2, 2, 4, 8}, 0.19f, 0.0f), k = ramp_f32({2, 2, 3, 8}, 0.27f, -0.1f);
  for (int64_t mode : {0, 1, 2, 3}) {
    auto out =
        run_case(attention()
                     .i("is_causal", 1)
                     .f("softcap", 2.5f)
                     .f("scale", 0.3f)
                     .i("qk_matmul_output_mode", mode),
                 {ramp_f32({2, 4, 3, 8}, 0.31f, 0.2f), k, ramp_f32({2, 2, 3, 5}, 0.53f, 0.4f),
                  Tensor::from_vector(DType::kBool, {2, 1, 3, 7}, mask), past_k,
                  ramp_f32({2, 2, 4, 5}, 0.61f, -0.3f)},
                 4);
    ASSERT_TRUE(out.ok()) << mode << ": " << out.status().to_string();
    // present_key is the past, then the new keys.
    const float* pk = (*out)[1].data_as<float>();
    EXPECT_EQ(pk[8], past_k.data_as<float>()[8]);
    EXPECT_EQ(pk[8 * 4 + 1], k.data_as<float>()[1]);
  }
}

TEST(AttentionKernel, ManyKeysSoftmaxRowsSumToOne) {
  // 300 keys (three chunks of the CUDA kernel) and a causal past of 298: mode 3 rows sum to 1.
  auto out =
      run_case(attention().i("is_causal", 1).i("qk_matmul_output_mode", 3),
               {ramp_f32({1, 2, 2, 16}, 0.13f, 0.0f), ramp_f32({1, 2, 2, 16}, 0.17f, 0.1f),
                ramp_f32({1, 2, 2, 4}, 0.29f, 0.0f), testing::kNoInput,
                ramp_f32({1, 2, 298, 16}, 0.011f, 0.2f), ramp_f32({1, 2, 298, 4}, 0.07f, -0.1f)},
               4);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const Tensor& p = (*out)[3];
  ASSERT_EQ(p.shape(), (Shape{1, 2, 2, 300}));
  const float* pv = p.data_as<float>();
  for (int r = 0; r < 4; ++r) {
    double sum = 0;
    for (int j = 0; j < 300; ++j) sum += pv[r * 300 + j];
    EXPECT_NEAR(sum, 1.0, 1e-5) << r;
    if (r % 2 == 0) {
      EXPECT_EQ(pv[r * 300 + 299], 0.0f) << r;  // query 0 cannot see key 299
    }
  }
}

TEST(AttentionKernel, VeryNegativeAdditiveMaskOverAWholeChunk) {
  // Keys 0..149 carry -1e9 (more than the CUDA kernel's first chunk of 128), keys 150..199 are
  // free: with Q = K = 0 the output is the mean of V over the free keys, finite.
  const int64_t l = 200;
  std::vector<float> mask(static_cast<size_t>(l), 0.f), vals(static_cast<size_t>(l));
  for (int64_t j = 0; j < l; ++j) {
    if (j < 150) mask[size_t(j)] = -1e9f;
    vals[size_t(j)] = float(j % 7);
  }
  double want = 0;
  for (int64_t j = 150; j < l; ++j) want += vals[size_t(j)] / 50.0;
  auto out = run_case(attention(), {make_f32({1, 1, 1, 1}, {0}),
                                    make_f32({1, 1, l, 1}, std::vector<float>(size_t(l), 0.f)),
                                    make_f32({1, 1, l, 1}, vals), make_f32({1, l}, mask)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_NEAR((*out)[0].data_as<float>()[0], want, 1e-5);
}

// Float64 tensors compute in double on every backend (held to the float64 tolerance): GQA with an
// additive float64 mask and present outputs, then a past of more keys than one CUDA chunk with a
// causal bool mask, softcap, scale and every qk output mode. A device must accept them.
TEST(AttentionKernel, Float64ComputesInDouble) {
  testing::KernelCase gqa{
      .node = attention().i("q_num_heads", 4).i("kv_num_heads", 2),
      .inputs = {ramp_f64({2, 3, 32}, 0.37f, 0.1f), ramp_f64({2, 5, 16}, 0.23f, -0.2f),
                 ramp_f64({2, 5, 12}, 0.41f, 0.3f), ramp_f64({3, 5}, 0.9f, -1.0f)},
      .num_outputs = 4,
      .expect_support = true,
      .label = "float64 GQA with an additive mask"};
  auto out = run_case(gqa);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].dtype(), DType::kFloat64);
  EXPECT_EQ((*out)[0].shape(), (Shape{2, 3, 24}));
  std::vector<uint8_t> mask(2 * 3 * 153);
  for (size_t e = 0; e < mask.size(); ++e) mask[e] = (e * 7 + 3) % 5 != 0;
  for (int64_t mode : {0, 1, 2, 3}) {
    testing::KernelCase past{
        .node = attention()
                    .i("is_causal", 1)
                    .f("softcap", 2.5f)
                    .f("scale", 0.3f)
                    .i("qk_matmul_output_mode", mode),
        .inputs = {ramp_f64({2, 4, 3, 8}, 0.31f, 0.2f), ramp_f64({2, 2, 3, 8}, 0.27f, -0.1f),
                   ramp_f64({2, 2, 3, 5}, 0.53f, 0.4f),
                   Tensor::from_vector(DType::kBool, {2, 1, 3, 153}, mask),
                   ramp_f64({2, 2, 150, 8}, 0.019f, 0.0f), ramp_f64({2, 2, 150, 5}, 0.061f, -0.3f)},
        .num_outputs = 4,
        .expect_support = true,
        .label = "float64 past, mode " + std::to_string(mode)};
    out = run_case(past);
    ASSERT_TRUE(out.ok()) << mode << ": " << out.status().to_string();
    EXPECT_EQ((*out)[3].shape(), (Shape{2, 4, 3, 153}));
  }
}

// Float32 Attention without past, softcap, windows or extra outputs runs attention_f32's GEMM
// kernel (float accumulation, float softmax); float64 runs the reference in double. The same
// problems in both: 3-D and 4-D, grouped heads, scale, causal with as many, fewer and more queries
// than keys, float and bool masks of every rank (one short of the keys), rows with every key
// masked, and sizes past one block of 64 query rows; and kiln::PackedAttention. Each float32 output
// within 2e-6 + 2e-5 |ref| of the double one; the masked rows exactly 0.
TEST(AttentionKernel, Float32GemmKernelMatchesTheDoubleReference) {
  struct Problem {
    OpNode node;
    Shape q, k, v;
    Shape mask;  // empty: none
    bool bool_mask = false;
    const char* label;
  };
  auto a3 = [](int64_t hq, int64_t hk) {
    return attention().i("q_num_heads", hq).i("kv_num_heads", hk);
  };
  const std::vector<Problem> problems = {
      {attention(),
       {2, 3, 70, 16},
       {2, 3, 70, 16},
       {2, 3, 70, 8},
       {},
       false,
       "4-D, two row blocks"},
      {a3(4, 2), {2, 130, 64}, {2, 97, 32}, {2, 97, 40}, {130, 97}, false, "3-D GQA, 2-D mask"},
      {a3(3, 3).f("scale", 0.3f),
       {1, 5, 24},
       {1, 9, 24},
       {1, 9, 24},
       {1, 3, 5, 8},
       false,
       "scale, per-head mask one key short"},
      {attention().i("is_causal", 1),
       {2, 2, 150, 8},
       {2, 2, 150, 8},
       {2, 2, 150, 8},
       {},
       false,
       "causal, square"},
      {attention().i("is_causal", 1),
       {1, 2, 40, 8},
       {1, 2, 90, 8},
       {1, 2, 90, 4},
       {40, 90},
       true,
       "causal, fewer queries, bool mask"},
      {a3(2, 1).i("is_causal", 1),
       {2, 100, 16},
       {2, 30, 8},
       {2, 30, 8},
       {30},
       false,
       "causal, more queries than keys, 1-D mask"},
      {attention(),
       {1, 1, 3, 4},
       {1, 1, 6, 4},
       {1, 1, 6, 4},
       {1, 1, 3, 6},
       true,
       "bool mask with a row of no keys"},
  };
  for (const Problem& p : problems) {
    float seed = 0.1f;
    auto inputs = [&](bool f64) {
      std::vector<CaseInput> in;
      for (const Shape* s : {&p.q, &p.k, &p.v}) {
        in.push_back(f64 ? ramp_f64(*s, 0.37f + seed, 0.1f) : ramp_f32(*s, 0.37f + seed, 0.1f));
        seed += 0.11f;
      }
      if (!p.mask.empty()) {
        int64_t n = 1;
        for (int64_t d : p.mask) n *= d;
        if (p.bool_mask) {
          std::vector<uint8_t> m(static_cast<size_t>(n));
          for (int64_t e = 0; e < n; ++e) m[size_t(e)] = (e * 7 + 3) % 5 != 0;
          if (p.q[2] == 3) std::fill(m.begin(), m.begin() + 6, uint8_t{0});  // query 0: no keys
          in.push_back(Tensor::from_vector(DType::kBool, p.mask, m));
        } else {
          std::vector<float> m = ramp(n, 0.9f, -1.0f);
          for (int64_t e = 0; e < n; e += 7) m[size_t(e)] = -INFINITY;
          if (f64) {
            in.push_back(Tensor::from_vector(DType::kFloat64, p.mask,
                                             std::vector<double>(m.begin(), m.end())));
          } else {
            in.push_back(make_f32(p.mask, m));
          }
        }
      }
      seed = 0.1f;
      return in;
    };
    auto f32_out = run_case(p.node, inputs(false));
    auto f64_out = run_case(p.node, inputs(true));
    ASSERT_TRUE(f32_out.ok()) << p.label << ": " << f32_out.status().to_string();
    ASSERT_TRUE(f64_out.ok()) << p.label << ": " << f64_out.status().to_string();
    const Tensor& got = (*f32_out)[0];
    const Tensor& want = (*f64_out)[0];
    ASSERT_EQ(got.shape(), want.shape()) << p.label;
    const float* g = got.data_as<float>();
    const double* w = want.data_as<double>();
    double worst = 0;
    for (int64_t e = 0; e < got.numel(); ++e) {
      const double err = std::abs(double(g[e]) - w[e]);
      worst = std::max(worst, err / (2e-6 + 2e-5 * std::abs(w[e])));
      if (w[e] == 0.0) {
        EXPECT_EQ(g[e], 0.0f) << p.label << " at " << e;
      }
    }
    EXPECT_LE(worst, 1.0) << p.label;
    std::printf("[f32 attention] %s: worst error / bound %.3f\n", p.label, worst);
  }
  // kiln::PackedAttention's float32 form reads the heads in place (batch or sequence first) with
  // the same kernel; its float64 form gathers them for the reference.
  const int64_t b = 2, s = 70, hq = 4, hk = 2, d = 16, n = (hq + 2 * hk) * d + 8;
  for (int seq_first = 0; seq_first < 2; ++seq_first) {
    OpNode node = op("PackedAttention", 1, "kiln")
                      .i("q_num_heads", hq)
                      .i("kv_num_heads", hk)
                      .i("head_size", d)
                      .i("v_head_size", d)
                      .i("q_offset", 8)
                      .i("k_offset", 8 + hq * d)
                      .i("v_offset", 8 + (hq + hk) * d)
                      .i("seq_first", seq_first)
                      .i("is_causal", 1);
    const Shape ps = seq_first ? Shape{s, b, n} : Shape{b, s, n};
    auto f32_out = run_case(node, {ramp_f32(ps, 0.173f, 0.05f), ramp_f32(ps, 0.173f, 0.05f),
                                   ramp_f32(ps, 0.173f, 0.05f), ramp_f32({s, s}, 0.61f, -0.5f)});
    auto f64_out = run_case(node, {ramp_f64(ps, 0.173f, 0.05f), ramp_f64(ps, 0.173f, 0.05f),
                                   ramp_f64(ps, 0.173f, 0.05f), ramp_f64({s, s}, 0.61f, -0.5f)});
    ASSERT_TRUE(f32_out.ok()) << f32_out.status().to_string();
    ASSERT_TRUE(f64_out.ok()) << f64_out.status().to_string();
    const float* g = (*f32_out)[0].data_as<float>();
    const double* w = (*f64_out)[0].data_as<double>();
    ASSERT_EQ((*f32_out)[0].numel(), b * s * hq * d);
    for (int64_t e = 0; e < b * s * hq * d; ++e) {
      ASSERT_NEAR(g[e], w[e], 2e-6 + 2e-5 * std::abs(w[e]))
          << "seq_first " << seq_first << " at " << e;
    }
  }
}

TEST(RotaryEmbeddingKernel, ThreeDInterleavedPartialAndFloat16) {
  // 3-D X [1, 2, 2 heads * 6], rotating 4 of 6 values, caches [B, S, 2] without position_ids.
  auto n =
      op("RotaryEmbedding", 23).i("num_heads", 2).i("interleaved", 1).i("rotary_embedding_dim", 4);
  auto out = run_case(n, {ramp_f32({1, 2, 12}, 0.3f, 0.1f), ramp_f32({1, 2, 2}, 0.7f, 0.0f),
                          ramp_f32({1, 2, 2}, 0.9f, 0.2f)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const float* y = (*out)[0].data_as<float>();
  std::vector<float> x = ramp(12, 0.3f, 0.1f);
  EXPECT_EQ(y[4], x[4]);  // the pass-through tail of head 0
  EXPECT_EQ(y[11], x[11]);
  // 4-D float16 with position ids, not interleaved.
  out = run_case(op("RotaryEmbedding", 23),
                 {ramp_f16({2, 2, 3, 8}, 0.21f, 0.0f), ramp_f16({5, 4}, 0.5f, 0.1f),
                  ramp_f16({5, 4}, 0.8f, -0.1f), make_i64({2, 3}, {0, 1, 2, 4, 3, 0})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].dtype(), DType::kFloat16);
}

TEST(RotaryEmbeddingKernel, SixteenByteVectorShapes) {
  // Shapes the CUDA kernel's 16-byte path takes (half the rotated dim a multiple of 8 float16 or 4
  // float32 values): 4-D with position ids and a pass-through tail, 3-D [B, S, H*D] with caches
  // [B, S, D/2], and the batch-1 cache the fuse_rotary pass makes for a [1, B*H, S, D] view.
  auto out =
      run_case(op("RotaryEmbedding", 23).i("rotary_embedding_dim", 32),
               {ramp_f16({2, 3, 5, 48}, 0.013f, -0.4f), ramp_f16({7, 16}, 0.05f, -0.3f),
                ramp_f16({7, 16}, 0.07f, 0.2f), make_i64({2, 5}, {0, 1, 2, 3, 4, 6, 5, 4, 3, 2})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  out = run_case(op("RotaryEmbedding", 23).i("num_heads", 3),
                 {ramp_f32({2, 4, 3 * 16}, 0.011f, 0.1f), ramp_f32({2, 4, 8}, 0.03f, -0.2f),
                  ramp_f32({2, 4, 8}, 0.05f, 0.3f)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  out = run_case(op("RotaryEmbedding", 23),
                 {ramp_bf16({1, 6, 9, 64}, 0.009f, 0.0f), ramp_bf16({1, 9, 32}, 0.04f, -0.5f),
                  ramp_bf16({1, 9, 32}, 0.06f, 0.1f)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].shape(), (Shape{1, 6, 9, 64}));
}

TEST(RotaryEmbeddingKernel, ABatchOneCacheServesEveryBatchRow) {
  // Without position_ids, caches [1, S, D/2] rotate every batch row as [B, S, D/2] copies of them
  // would (the ONNX reference broadcasts them so; fuse_rotary gives the node transformers' batch-1
  // cos and sin): 3-D float32 and 4-D float16 on the 16-byte path, and a scalar-path size.
  struct Case {
    Tensor x, cos1, sin1;
    int64_t heads;
  };
  auto tile = [](const Tensor& t, int64_t b) {
    Shape s = t.shape();
    s[0] = b;
    std::vector<float> v;
    for (int64_t r = 0; r < b; ++r) {
      for (int64_t i = 0; i < t.numel(); ++i) v.push_back(float(t.float_at(i)));
    }
    auto out = Tensor::zeros(t.dtype(), s);
    for (int64_t i = 0; i < out->numel(); ++i) out->set_float_at(i, v[size_t(i)]);
    return std::move(*out);
  };
  for (const Case& c :
       {Case{ramp_f32({3, 4, 2 * 16}, 0.011f, 0.1f), ramp_f32({1, 4, 8}, 0.03f, -0.2f),
             ramp_f32({1, 4, 8}, 0.05f, 0.3f), 2},
        Case{ramp_f16({2, 4, 5, 32}, 0.009f, 0.0f), ramp_f16({1, 5, 16}, 0.04f, -0.5f),
             ramp_f16({1, 5, 16}, 0.06f, 0.1f), 0},
        Case{ramp_f32({2, 3, 3, 6}, 0.02f, 0.2f), ramp_f32({1, 3, 3}, 0.07f, -0.1f),
             ramp_f32({1, 3, 3}, 0.08f, 0.4f), 0}}) {
    const int64_t b = c.x.shape()[0];
    auto node = op("RotaryEmbedding", 23);
    if (c.heads) node.i("num_heads", c.heads);
    auto shared = run_case(node, {c.x, c.cos1, c.sin1});
    ASSERT_TRUE(shared.ok()) << shape_to_string(c.x.shape()) << ": " << shared.status().to_string();
    auto tiled = run_case(node, {c.x, tile(c.cos1, b), tile(c.sin1, b)});
    ASSERT_TRUE(tiled.ok()) << tiled.status().to_string();
    EXPECT_TRUE(all_close((*shared)[0], (*tiled)[0], 0.0, 0.0)) << shape_to_string(c.x.shape());
  }
  // Caches of neither B*S nor S rows are refused.
  auto bad = run_case(op("RotaryEmbedding", 23),
                      {ramp_f32({2, 1, 3, 4}, 0.1f, 0.0f), ramp_f32({2, 2, 2}, 0.1f, 0.0f),
                       ramp_f32({2, 2, 2}, 0.1f, 0.0f)});
  EXPECT_FALSE(bad.ok());
}

TEST(RotaryEmbeddingKernel, RotatesPairsByPosition) {
  // One head of size 2 at positions 0 and 1: angle 0 keeps x, angle pi/2 rotates (1, 0) to (0, 1).
  Tensor x = make_f32({1, 1, 2, 2}, {1, 0, 1, 0});
  Tensor cos = make_f32({2, 1}, {1, 0}), sin = make_f32({2, 1}, {0, 1});
  auto out = run_case(op("RotaryEmbedding", 23), {x, cos, sin, make_i64({1, 2}, {0, 1})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 2, 2}, {1, 0, 0, 1})));
  // A position outside the cache is an error.
  out = run_case(op("RotaryEmbedding", 23), {x, cos, sin, make_i64({1, 2}, {0, 5})});
  EXPECT_FALSE(out.ok());
}

}  // namespace
}  // namespace kiln
