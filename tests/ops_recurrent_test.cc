// Recurrent ops RNN, GRU and LSTM: shape inference (symbolic seq/batch, layouts, directions, the
// errors naming the input at fault) and kernels, checked against one-step values written out by
// hand and against a reference loop of this file (named gate blocks, per-row visiting order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "op_harness.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::f32;
using testing::infer_node;
using testing::kNoInput;
using testing::kOmitted;
using testing::make_f32;
using testing::NodeInput;
using testing::op;
using testing::OpNode;
using testing::run_case;

OpNode make_node(const std::string& op_type, int64_t hidden, int opset = 22) {
  OpNode n = op(op_type, opset).named("r0");
  n.i("hidden_size", hidden);
  return n;
}

void set_strings(OpNode& n, const std::string& name, std::vector<std::string> v) {
  ir::Attribute a;
  a.type = ir::AttrType::kStrings;
  a.strings = std::move(v);
  n.node.attrs.set(name, a);
}

Tensor make_i32(Shape shape, const std::vector<int32_t>& v) {
  return Tensor::from_vector(DType::kInt32, std::move(shape), v);
}

std::vector<float> wave(int64_t n, float scale, float offset) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = std::sin(float(i) * scale + offset) * 0.7f;
  return v;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// ---- shape inference ----

TEST(RecurrentInfer, SymbolicShapesPerLayoutAndDirection) {
  const Dim s = Dim::symbol("s"), b = Dim::symbol("b");
  OpNode n = make_node("LSTM", 3);
  n.s("direction", "bidirectional");
  auto r = infer_node(n, {f32({s, b, 2}), f32({2, 12, 2}), f32({2, 12, 3})}, 3);
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.dims(0), (std::vector<Dim>{s, 2, b, 3}));
  EXPECT_EQ(r.dims(1), (std::vector<Dim>{2, b, 3}));
  EXPECT_EQ(r.dims(2), (std::vector<Dim>{2, b, 3}));
  // layout 1: X [batch, seq, input], Y [batch, seq, dirs, hidden], states [batch, dirs, hidden].
  OpNode g = make_node("GRU", 4);
  g.i("layout", 1);
  r = infer_node(
      g, {f32({b, s, 5}), f32({1, 12, 5}), f32({1, 12, 4}), f32({1, 24}), kOmitted, f32({b, 1, 4})},
      2);
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.dims(0), (std::vector<Dim>{b, s, 1, 4}));
  EXPECT_EQ(r.dims(1), (std::vector<Dim>{b, 1, 4}));
  // Without hidden_size the hidden size is R's last dim, symbolic or not.
  OpNode rnn = op("RNN", 14).named("r0");
  const Dim h = Dim::symbol("h");
  r = infer_node(rnn, {f32({s, b, 2}), f32({1, h, 2}), f32({1, h, h})}, 2);
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.dims(1), (std::vector<Dim>{1, b, h}));
  // A symbolic batch in initial_h is recorded for the profile checker, not refused.
  r = infer_node(make_node("RNN", 4),
                 {f32({s, b, 2}), f32({1, 4, 2}), f32({1, 4, 4}), kOmitted, kOmitted,
                  f32({1, Dim::symbol("b2"), 4})},
                 2);
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_FALSE(r.constraints.empty());
}

// Each bad input is refused with the node and the input named.
TEST(RecurrentInfer, BadShapesNameTheInput) {
  struct Bad {
    const char* what;
    std::vector<NodeInput> inputs;
    const char* phrase;
  };
  const std::vector<Bad> cases = {
      {"W rows not 4*hidden", {f32({2, 1, 2}), f32({1, 10, 2}), f32({1, 12, 3})}, "input 1 (W)"},
      {"W input size", {f32({2, 1, 2}), f32({1, 12, 5}), f32({1, 12, 3})}, "input 1 (W)"},
      {"W directions", {f32({2, 1, 2}), f32({2, 12, 2}), f32({1, 12, 3})}, "input 1 (W)"},
      {"W rank", {f32({2, 1, 2}), f32({12, 2}), f32({1, 12, 3})}, "input 1 (W)"},
      {"R hidden", {f32({2, 1, 2}), f32({1, 12, 2}), f32({1, 12, 4})}, "input 2 (R)"},
      {"X rank", {f32({2, 2}), f32({1, 12, 2}), f32({1, 12, 3})}, "input 0 (X)"},
      {"B size", {f32({2, 1, 2}), f32({1, 12, 2}), f32({1, 12, 3}), f32({1, 12})}, "input 3 (B)"},
      {"sequence_lens batch",
       {f32({2, 1, 2}), f32({1, 12, 2}), f32({1, 12, 3}), kOmitted,
        testing::typed(DType::kInt32, {2})},
       "input 4 (sequence_lens)"},
      {"sequence_lens int64",
       {f32({2, 1, 2}), f32({1, 12, 2}), f32({1, 12, 3}), kOmitted,
        testing::typed(DType::kInt64, {1})},
       "int32"},
      {"initial_h batch",
       {f32({2, 1, 2}), f32({1, 12, 2}), f32({1, 12, 3}), kOmitted, kOmitted, f32({1, 3, 3})},
       "input 5 (initial_h)"},
      {"initial_c hidden",
       {f32({2, 1, 2}), f32({1, 12, 2}), f32({1, 12, 3}), kOmitted, kOmitted, kOmitted,
        f32({1, 1, 4})},
       "input 6 (initial_c)"},
      {"P size",
       {f32({2, 1, 2}), f32({1, 12, 2}), f32({1, 12, 3}), kOmitted, kOmitted, kOmitted, kOmitted,
        f32({1, 12})},
       "input 7 (P)"},
      {"W dtype",
       {f32({2, 1, 2}), testing::typed(DType::kFloat64, {1, 12, 2}), f32({1, 12, 3})},
       "input 1 (W) has dtype float64"},
      {"X dtype",
       {testing::typed(DType::kInt32, {2, 1, 2}), f32({1, 12, 2}), f32({1, 12, 3})},
       "input 0 (X)"},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.what);
    auto r = infer_node(make_node("LSTM", 3), c.inputs, 3);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.code(), StatusCode::kInvalidModel);
    EXPECT_NE(r.status.message().find("node 'r0' (LSTM)"), std::string::npos) << r.status.message();
    EXPECT_NE(r.status.message().find(c.phrase), std::string::npos) << r.status.message();
  }
  // The same inputs with W fixed are accepted, so the checks above are what refused them.
  auto ok = infer_node(make_node("LSTM", 3), {f32({2, 1, 2}), f32({1, 12, 2}), f32({1, 12, 3})}, 3);
  EXPECT_TRUE(ok.ok()) << ok.status.to_string();
}

TEST(RecurrentInfer, BadAttributesAreRefused) {
  const std::vector<NodeInput> in = {f32({2, 1, 2}), f32({1, 15, 2}), f32({1, 15, 5})};
  auto refused = [&](const OpNode& n, const std::string& phrase) {
    auto r = infer_node(n, in, 2);
    if (r.ok()) return ::testing::AssertionFailure() << "accepted";
    if (r.status.message().find(phrase) == std::string::npos) {
      return ::testing::AssertionFailure() << r.status.message();
    }
    return ::testing::AssertionSuccess();
  };
  OpNode n = make_node("GRU", 5);
  EXPECT_TRUE(infer_node(n, in, 2).ok());
  n.s("direction", "sideways");
  EXPECT_TRUE(refused(n, "sideways"));
  n = make_node("GRU", 5);
  set_strings(n, "activations", {"Sigmoid", "Gelu"});
  EXPECT_TRUE(refused(n, "'Gelu' is not one of"));
  set_strings(n, "activations", {"Sigmoid"});
  EXPECT_TRUE(refused(n, "expected 2 per direction"));
  set_strings(n, "activations", {"sigmoid", "softsign"});  // names are case-insensitive
  EXPECT_TRUE(infer_node(n, in, 2).ok());
  n = make_node("GRU", 5, 7);
  n.i("layout", 1);
  EXPECT_TRUE(refused(n, "opset 14"));
  n = make_node("GRU", 5);
  n.i("layout", 2);
  EXPECT_TRUE(refused(n, "layout must be 0 or 1"));
  n = make_node("GRU", 5);
  n.i("input_forget", 1);
  EXPECT_TRUE(refused(n, "input_forget is LSTM's only"));
  n = make_node("GRU", 5);
  n.f("clip", -1.0f);
  EXPECT_TRUE(refused(n, "clip"));
  n = make_node("GRU", 0);
  EXPECT_TRUE(refused(n, "hidden_size must be positive"));
}

// ---- a reference loop, written independently of the kernel ----

using Act = std::function<double(double)>;

struct Spec {
  std::string op;  // RNN, GRU, LSTM
  int64_t S, N, I, H;
  std::string direction = "forward";
  bool linear_before_reset = false, input_forget = false;
  std::optional<double> clip;
  std::vector<Act> acts;  // per direction; empty: the defaults
  int gates() const { return op == "RNN" ? 1 : op == "GRU" ? 3 : 4; }
  int dirs() const { return direction == "bidirectional" ? 2 : 1; }
};

// Layout-0 data; empty vectors are omitted inputs.
struct Data {
  std::vector<float> X, W, R, B, h0, c0, P;
  std::vector<int32_t> lens;
};

struct Result {
  std::vector<float> Y, Yh, Yc;
};

Result reference(const Spec& s, const Data& in) {
  const int64_t G = s.gates(), ND = s.dirs(), H = s.H, I = s.I, N = s.N, S = s.S;
  std::vector<Act> acts = s.acts;
  if (acts.empty()) {
    Act tanh_fn = [](double x) { return std::tanh(x); };
    std::vector<Act> one = s.op == "RNN"   ? std::vector<Act>{tanh_fn}
                           : s.op == "GRU" ? std::vector<Act>{sigmoid, tanh_fn}
                                           : std::vector<Act>{sigmoid, tanh_fn, tanh_fn};
    for (int d = 0; d < ND; ++d) acts.insert(acts.end(), one.begin(), one.end());
  }
  auto clip = [&](double v) { return s.clip ? std::clamp(v, -*s.clip, *s.clip) : v; };
  Result out;
  out.Y.assign(size_t(S * ND * N * H), 0.0f);
  out.Yh.assign(size_t(ND * N * H), 0.0f);
  out.Yc.assign(size_t(ND * N * H), 0.0f);
  for (int64_t d = 0; d < ND; ++d) {
    const bool backward = s.direction == "reverse" || d == 1;
    const Act* act = &acts[size_t(d) * acts.size() / size_t(ND)];
    // Block `g` of this direction: row j of W / R, and its two biases.
    auto bias = [&](int64_t g, int64_t j, bool recurrent) -> double {
      if (in.B.empty()) return 0.0;
      return in.B[size_t(d * 2 * G * H + (recurrent ? G * H : 0) + g * H + j)];
    };
    auto x_part = [&](int64_t g, int64_t j, const std::vector<double>& x) {
      double acc = bias(g, j, false);
      for (int64_t i = 0; i < I; ++i)
        acc += in.W[size_t(((d * G + g) * H + j) * I + i)] * x[size_t(i)];
      return acc;
    };
    auto h_part = [&](int64_t g, int64_t j, const std::vector<double>& h) {
      double acc = bias(g, j, true);
      for (int64_t k = 0; k < H; ++k)
        acc += in.R[size_t(((d * G + g) * H + j) * H + k)] * h[size_t(k)];
      return acc;
    };
    auto peep = [&](int64_t which, int64_t j) -> double {
      return in.P.empty() ? 0.0 : in.P[size_t(d * 3 * H + which * H + j)];
    };
    for (int64_t b = 0; b < N; ++b) {
      std::vector<double> h(static_cast<size_t>(H), 0.0), c(static_cast<size_t>(H), 0.0);
      for (int64_t j = 0; j < H; ++j) {
        if (!in.h0.empty()) h[size_t(j)] = in.h0[size_t((d * N + b) * H + j)];
        if (!in.c0.empty()) c[size_t(j)] = in.c0[size_t((d * N + b) * H + j)];
      }
      const int64_t len = in.lens.empty() ? S : in.lens[size_t(b)];
      std::vector<int64_t> order;
      for (int64_t t = 0; t < len; ++t) order.push_back(t);
      if (backward) std::reverse(order.begin(), order.end());
      for (int64_t t : order) {
        std::vector<double> x(static_cast<size_t>(I));
        for (int64_t i = 0; i < I; ++i) x[size_t(i)] = in.X[size_t((t * N + b) * I + i)];
        std::vector<double> hn(static_cast<size_t>(H)), cn(static_cast<size_t>(H));
        if (s.op == "RNN") {
          for (int64_t j = 0; j < H; ++j)
            hn[size_t(j)] = act[0](clip(x_part(0, j, x) + h_part(0, j, h)));
        } else if (s.op == "GRU") {
          std::vector<double> z(static_cast<size_t>(H)), r(static_cast<size_t>(H)),
              rh(static_cast<size_t>(H));
          for (int64_t j = 0; j < H; ++j) {
            z[size_t(j)] = act[0](clip(x_part(0, j, x) + h_part(0, j, h)));
            r[size_t(j)] = act[0](clip(x_part(1, j, x) + h_part(1, j, h)));
            rh[size_t(j)] = r[size_t(j)] * h[size_t(j)];
          }
          for (int64_t j = 0; j < H; ++j) {
            double cand = s.linear_before_reset
                              ? act[1](clip(x_part(2, j, x) + r[size_t(j)] * h_part(2, j, h)))
                              : act[1](clip(x_part(2, j, x) + h_part(2, j, rh)));
            hn[size_t(j)] = (1 - z[size_t(j)]) * cand + z[size_t(j)] * h[size_t(j)];
          }
        } else {
          for (int64_t j = 0; j < H; ++j) {  // blocks i, o, f, c; peepholes i, o, f
            double ig = act[0](clip(x_part(0, j, x) + h_part(0, j, h) + peep(0, j) * c[size_t(j)]));
            double fg =
                s.input_forget
                    ? 1 - ig
                    : act[0](clip(x_part(2, j, x) + h_part(2, j, h) + peep(2, j) * c[size_t(j)]));
            double cg = act[1](clip(x_part(3, j, x) + h_part(3, j, h)));
            cn[size_t(j)] = fg * c[size_t(j)] + ig * cg;
            double og =
                act[0](clip(x_part(1, j, x) + h_part(1, j, h) + peep(1, j) * cn[size_t(j)]));
            hn[size_t(j)] = og * act[2](cn[size_t(j)]);
          }
          c = cn;
        }
        h = hn;
        for (int64_t j = 0; j < H; ++j)
          out.Y[size_t(((t * ND + d) * N + b) * H + j)] = float(h[size_t(j)]);
      }
      for (int64_t j = 0; j < H; ++j) {
        out.Yh[size_t((d * N + b) * H + j)] = float(h[size_t(j)]);
        out.Yc[size_t((d * N + b) * H + j)] = float(c[size_t(j)]);
      }
    }
  }
  return out;
}

// Swaps the first two axes of a row-major [a, b, rest] tensor.
std::vector<float> swap01(const std::vector<float>& v, int64_t a, int64_t b, int64_t rest) {
  std::vector<float> out(v.size());
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j)
      for (int64_t k = 0; k < rest; ++k)
        out[size_t((j * a + i) * rest + k)] = v[size_t((i * b + j) * rest + k)];
  return out;
}

Data make_data(const Spec& s, bool bias, bool initial, bool peepholes) {
  const int64_t G = s.gates(), ND = s.dirs();
  Data d;
  d.X = wave(s.S * s.N * s.I, 0.37f, 0.1f);
  d.W = wave(ND * G * s.H * s.I, 0.53f, 0.3f);
  d.R = wave(ND * G * s.H * s.H, 0.41f, -0.2f);
  if (bias) d.B = wave(ND * 2 * G * s.H, 0.67f, 0.5f);
  if (initial) {
    d.h0 = wave(ND * s.N * s.H, 0.29f, 0.7f);
    if (s.op == "LSTM") d.c0 = wave(ND * s.N * s.H, 0.31f, -0.9f);
  }
  if (peepholes) d.P = wave(ND * 3 * s.H, 0.73f, 0.2f);
  return d;
}

// Runs the node on `d` (given in layout 0, converted for layout 1) and compares every output with
// the reference.
void check_against_reference(OpNode n, const Spec& s, const Data& d, int layout) {
  const int64_t ND = s.dirs(), G = s.gates();
  n.s("direction", s.direction);
  if (layout) n.i("layout", 1);
  std::vector<testing::CaseInput> in;
  in.push_back(layout ? make_f32({s.N, s.S, s.I}, swap01(d.X, s.S, s.N, s.I))
                      : make_f32({s.S, s.N, s.I}, d.X));
  in.push_back(testing::initializer(make_f32({ND, G * s.H, s.I}, d.W)));
  in.push_back(testing::initializer(make_f32({ND, G * s.H, s.H}, d.R)));
  in.push_back(d.B.empty() ? kNoInput : testing::CaseInput(make_f32({ND, 2 * G * s.H}, d.B)));
  in.push_back(d.lens.empty() ? kNoInput : testing::CaseInput(make_i32({s.N}, d.lens)));
  auto state = [&](const std::vector<float>& v) -> testing::CaseInput {
    if (v.empty()) return kNoInput;
    return layout ? make_f32({s.N, ND, s.H}, swap01(v, ND, s.N, s.H)) : make_f32({ND, s.N, s.H}, v);
  };
  in.push_back(state(d.h0));
  const bool lstm = s.op == "LSTM";
  if (lstm) {
    in.push_back(state(d.c0));
    in.push_back(d.P.empty() ? kNoInput : testing::CaseInput(make_f32({ND, 3 * s.H}, d.P)));
  }
  while (!in.empty() && in.back().kind == testing::CaseInput::Kind::kOmitted) in.pop_back();
  auto out = run_case(n, in, lstm ? 3 : 2);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  Result ref = reference(s, d);
  Tensor y = make_f32({s.S, ND, s.N, s.H}, ref.Y);
  if (layout) {
    // [S, ND, N, H] -> [N, S, ND, H]: move N to the front.
    std::vector<float> t(ref.Y.size());
    for (int64_t a = 0; a < s.S; ++a)
      for (int64_t e = 0; e < ND; ++e)
        for (int64_t b = 0; b < s.N; ++b)
          for (int64_t j = 0; j < s.H; ++j)
            t[size_t(((b * s.S + a) * ND + e) * s.H + j)] =
                ref.Y[size_t(((a * ND + e) * s.N + b) * s.H + j)];
    y = make_f32({s.N, s.S, ND, s.H}, t);
  }
  auto st = [&](const std::vector<float>& v) {
    return layout ? make_f32({s.N, ND, s.H}, swap01(v, ND, s.N, s.H)) : make_f32({ND, s.N, s.H}, v);
  };
  EXPECT_TRUE(testing::all_close((*out)[0], y, 1e-5, 1e-4));
  EXPECT_TRUE(testing::all_close((*out)[1], st(ref.Yh), 1e-5, 1e-4));
  if (lstm) EXPECT_TRUE(testing::all_close((*out)[2], st(ref.Yc), 1e-5, 1e-4));
}

// ---- kernels: one step by hand ----

TEST(RecurrentKernel, RnnTwoStepsByHand) {
  // h1 = tanh(2*0.5 + 0.1 + 0.2), h2 = tanh(2*(-1) + 0.5*h1 + 0.3).
  auto out = run_case(make_node("RNN", 1),
                      {make_f32({2, 1, 1}, {0.5f, -1.0f}), make_f32({1, 1, 1}, {2}),
                       make_f32({1, 1, 1}, {0.5f}), make_f32({1, 2}, {0.1f, 0.2f})},
                      2);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const double h1 = std::tanh(1.3), h2 = std::tanh(-2 + 0.5 * h1 + 0.3);
  EXPECT_TRUE(
      testing::all_close((*out)[0], make_f32({2, 1, 1, 1}, {float(h1), float(h2)}), 1e-6, 1e-5));
  EXPECT_TRUE(testing::all_close((*out)[1], make_f32({1, 1, 1}, {float(h2)}), 1e-6, 1e-5));
}

TEST(RecurrentKernel, GruOneStepByHandBothResetOrders) {
  // Blocks z, r, h: W = (0.5, -0.4, 0.9), R = (0.3, 0.6, -0.7), Wb = (0.1, 0.2, 0.3),
  // Rb = (-0.1, 0.05, 0.15); x = 1, h0 = 0.4.
  const double x = 1, h0 = 0.4;
  const double z = sigmoid(0.5 * x + 0.1 + 0.3 * h0 - 0.1);
  const double r = sigmoid(-0.4 * x + 0.2 + 0.6 * h0 + 0.05);
  for (int lbr : {0, 1}) {
    SCOPED_TRACE(lbr);
    OpNode n = make_node("GRU", 1);
    n.i("linear_before_reset", lbr);
    auto out = run_case(n,
                        {make_f32({1, 1, 1}, {1}), make_f32({1, 3, 1}, {0.5f, -0.4f, 0.9f}),
                         make_f32({1, 3, 1}, {0.3f, 0.6f, -0.7f}),
                         make_f32({1, 6}, {0.1f, 0.2f, 0.3f, -0.1f, 0.05f, 0.15f}), kNoInput,
                         make_f32({1, 1, 1}, {0.4f})},
                        2);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    const double cand = lbr ? std::tanh(0.9 * x + 0.3 + r * (-0.7 * h0 + 0.15))
                            : std::tanh(0.9 * x + 0.3 + -0.7 * (r * h0) + 0.15);
    const double h = (1 - z) * cand + z * h0;
    EXPECT_NEAR((*out)[1].data_as<float>()[0], h, 1e-6);
  }
}

TEST(RecurrentKernel, LstmOneStepByHandWithPeepholes) {
  // Blocks i, o, f, c; peepholes i, o, f. x = 0.5, h0 = -0.3, c0 = 0.8.
  const double x = 0.5, h0 = -0.3, c0 = 0.8;
  const double w[4] = {0.2, -0.5, 0.7, 0.4}, r[4] = {0.1, 0.3, -0.2, 0.6};
  const double wb[4] = {0.05, -0.1, 0.2, 0.0}, rb[4] = {0.0, 0.1, 0.1, -0.3};
  const double p[3] = {0.5, -0.4, 0.3};
  const double i = sigmoid(w[0] * x + r[0] * h0 + wb[0] + rb[0] + p[0] * c0);
  const double f = sigmoid(w[2] * x + r[2] * h0 + wb[2] + rb[2] + p[2] * c0);
  const double g = std::tanh(w[3] * x + r[3] * h0 + wb[3] + rb[3]);
  const double c = f * c0 + i * g;
  const double o = sigmoid(w[1] * x + r[1] * h0 + wb[1] + rb[1] + p[1] * c);
  const double h = o * std::tanh(c);
  auto f32v = [](std::initializer_list<double> v) {
    return std::vector<float>(v.begin(), v.end());
  };
  auto out =
      run_case(make_node("LSTM", 1),
               {make_f32({1, 1, 1}, {0.5f}), make_f32({1, 4, 1}, f32v({w[0], w[1], w[2], w[3]})),
                make_f32({1, 4, 1}, f32v({r[0], r[1], r[2], r[3]})),
                make_f32({1, 8}, f32v({wb[0], wb[1], wb[2], wb[3], rb[0], rb[1], rb[2], rb[3]})),
                make_i32({1}, {1}), make_f32({1, 1, 1}, {-0.3f}), make_f32({1, 1, 1}, {0.8f}),
                make_f32({1, 3}, f32v({p[0], p[1], p[2]}))},
               3);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_NEAR((*out)[0].data_as<float>()[0], h, 1e-6);
  EXPECT_NEAR((*out)[1].data_as<float>()[0], h, 1e-6);
  EXPECT_NEAR((*out)[2].data_as<float>()[0], c, 1e-6);
}

// Every activation ONNX lists, through an RNN step whose pre-activation is x itself (W = 1,
// R = 0): with the ONNX ops' default alpha/beta, then with given ones.
TEST(RecurrentKernel, EveryActivationWithDefaultAndGivenParameters) {
  struct Case {
    const char* name;
    std::vector<float> alpha, beta;
    std::function<double(double)> fn;
  };
  const std::vector<Case> cases = {
      {"Relu", {}, {}, [](double x) { return std::max(x, 0.0); }},
      {"Tanh", {}, {}, [](double x) { return std::tanh(x); }},
      {"Sigmoid", {}, {}, sigmoid},
      {"Affine", {}, {}, [](double x) { return x; }},
      {"Affine", {2.0f}, {0.5f}, [](double x) { return 2 * x + 0.5; }},
      {"LeakyRelu", {}, {}, [](double x) { return x >= 0 ? x : 0.01 * x; }},
      {"LeakyRelu", {0.3f}, {}, [](double x) { return x >= 0 ? x : 0.3 * x; }},
      {"ThresholdedRelu", {}, {}, [](double x) { return x >= 1.0 ? x : 0; }},
      {"ThresholdedRelu", {0.5f}, {}, [](double x) { return x >= 0.5 ? x : 0; }},
      {"ScaledTanh", {}, {}, [](double x) { return std::tanh(x); }},
      {"ScaledTanh", {2.0f}, {0.5f}, [](double x) { return 2 * std::tanh(0.5 * x); }},
      {"HardSigmoid", {}, {}, [](double x) { return std::clamp(0.2 * x + 0.5, 0.0, 1.0); }},
      {"HardSigmoid", {0.6f}, {0.1f}, [](double x) { return std::clamp(0.6 * x + 0.1, 0.0, 1.0); }},
      {"Elu", {}, {}, [](double x) { return x >= 0 ? x : std::exp(x) - 1; }},
      {"Elu", {0.5f}, {}, [](double x) { return x >= 0 ? x : 0.5 * (std::exp(x) - 1); }},
      {"Softsign", {}, {}, [](double x) { return x / (1 + std::fabs(x)); }},
      {"Softplus", {}, {}, [](double x) { return std::log(1 + std::exp(x)); }},
  };
  // 0.5 and 1 sit on ThresholdedRelu's thresholds (x >= alpha passes).
  const std::vector<float> xs = {-1.5f, -0.25f, 0.5f, 0.7f, 1.0f, 1.2f, 3.0f};
  const int64_t n = int64_t(xs.size());
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    OpNode node = make_node("RNN", 1);
    set_strings(node, "activations", {c.name});
    if (!c.alpha.empty()) node.floats("activation_alpha", c.alpha);
    if (!c.beta.empty()) node.floats("activation_beta", c.beta);
    // One step over a batch of n rows, x = xs[row].
    auto out = run_case(
        node, {make_f32({1, n, 1}, xs), make_f32({1, 1, 1}, {1}), make_f32({1, 1, 1}, {0})}, 2);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    for (int64_t b = 0; b < n; ++b) {
      EXPECT_NEAR((*out)[1].data_as<float>()[b], c.fn(xs[size_t(b)]), 1e-6)
          << "x = " << xs[size_t(b)];
    }
  }
}

// ---- kernels against the reference loop ----

TEST(RecurrentKernel, LstmBidirectionalSequenceLensBothLayouts) {
  Spec s{.op = "LSTM", .S = 4, .N = 3, .I = 3, .H = 2, .direction = "bidirectional"};
  Data d = make_data(s, true, true, true);
  d.lens = {4, 2, 0};  // a full row, a short one, and an empty one (which keeps initial_h)
  for (int layout : {0, 1}) {
    SCOPED_TRACE(layout);
    check_against_reference(make_node("LSTM", 2), s, d, layout);
  }
  // The rows past their length are zero in Y and Y_h holds the last step run: row 1's backward
  // direction ends at t = 0, so its Y_h equals Y[0, 1, 1].
  Result ref = reference(s, d);
  for (int64_t j = 0; j < s.H; ++j) {
    EXPECT_EQ(ref.Y[size_t(((3 * 2 + 0) * 3 + 1) * 2 + j)], 0.0f);
    EXPECT_EQ(ref.Yh[size_t((1 * 3 + 1) * 2 + j)], ref.Y[size_t(((0 * 2 + 1) * 3 + 1) * 2 + j)]);
    EXPECT_EQ(ref.Yh[size_t((0 * 3 + 2) * 2 + j)], d.h0[size_t((0 * 3 + 2) * 2 + j)]);
  }
}

TEST(RecurrentKernel, GruDirectionsLayoutsAndResetOrder) {
  for (std::string dir : {"forward", "reverse", "bidirectional"}) {
    for (int lbr : {0, 1}) {
      SCOPED_TRACE(dir + " linear_before_reset " + std::to_string(lbr));
      Spec s{.op = "GRU",
             .S = 3,
             .N = 2,
             .I = 4,
             .H = 3,
             .direction = dir,
             .linear_before_reset = lbr != 0};
      Data d = make_data(s, lbr != 0, true, false);
      d.lens = {3, 1};
      OpNode n = make_node("GRU", 3);
      n.i("linear_before_reset", lbr);
      check_against_reference(n, s, d, lbr);
    }
  }
}

TEST(RecurrentKernel, RnnActivationsAlphaBetaAndClip) {
  // Bidirectional with one function per direction: Affine(0.5, 0.1) forward, LeakyRelu(0.2)
  // backward (alphas are consumed by the functions that take one), pre-activations clipped to 0.6.
  Spec s{.op = "RNN", .S = 3, .N = 2, .I = 2, .H = 3, .direction = "bidirectional"};
  s.clip = 0.6;
  s.acts = {[](double v) { return 0.5 * v + 0.1; }, [](double v) { return v >= 0 ? v : 0.2 * v; }};
  OpNode n = make_node("RNN", 3);
  set_strings(n, "activations", {"Affine", "LeakyRelu"});
  n.floats("activation_alpha", {0.5f, 0.2f});
  n.floats("activation_beta", {0.1f});
  n.f("clip", 0.6f);
  check_against_reference(n, s, make_data(s, true, true, false), 0);
  // Without the clip the outputs differ (the clip is reached), so the check above can fail.
  Spec unclipped = s;
  unclipped.clip.reset();
  Result a = reference(s, make_data(s, true, true, false));
  Result b = reference(unclipped, make_data(s, true, true, false));
  EXPECT_NE(a.Y, b.Y);
}

TEST(RecurrentKernel, LstmInputForgetAndOtherActivations) {
  // f = HardSigmoid(0.3, 0.4), g = Softsign, h = Elu(default alpha 1); input and forget coupled.
  Spec s{
      .op = "LSTM", .S = 3, .N = 2, .I = 2, .H = 2, .direction = "reverse", .input_forget = true};
  s.acts = {[](double v) { return std::clamp(0.3 * v + 0.4, 0.0, 1.0); },
            [](double v) { return v / (1 + std::fabs(v)); },
            [](double v) { return v >= 0 ? v : std::exp(v) - 1; }};
  OpNode n = make_node("LSTM", 2);
  set_strings(n, "activations", {"HardSigmoid", "Softsign", "Elu"});
  n.floats("activation_alpha", {0.3f});
  n.floats("activation_beta", {0.4f});
  n.i("input_forget", 1);
  check_against_reference(n, s, make_data(s, true, true, true), 1);
}

TEST(RecurrentKernel, Float64AndOpsetSevenDefaults) {
  // LSTM-7 without B, initial states or P, in float64; the reference matches to double precision.
  Spec s{.op = "LSTM", .S = 2, .N = 1, .I = 3, .H = 2};
  Data d = make_data(s, false, false, false);
  auto f64 = [](Shape shape, const std::vector<float>& v) {
    return Tensor::from_vector(DType::kFloat64, std::move(shape),
                               std::vector<double>(v.begin(), v.end()));
  };
  testing::KernelCase c{.node = make_node("LSTM", 2, 7),
                        .inputs = {f64({2, 1, 3}, d.X), f64({1, 8, 3}, d.W), f64({1, 8, 2}, d.R)},
                        .num_outputs = 3,
                        .label = "LSTM-7 float64"};
  auto out = run_case(c);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ((*out)[1].dtype(), DType::kFloat64);
  Result ref = reference(s, d);
  for (size_t j = 0; j < 2; ++j) {
    EXPECT_NEAR((*out)[1].data_as<double>()[j], ref.Yh[j], 1e-6);
    EXPECT_NEAR((*out)[2].data_as<double>()[j], ref.Yc[j], 1e-6);
  }
}

TEST(RecurrentKernel, SequenceLensOutOfRangeIsAnError) {
  auto out = run_case(make_node("RNN", 1),
                      {make_f32({2, 1, 1}, {0.5f, -1.0f}), make_f32({1, 1, 1}, {2}),
                       make_f32({1, 1, 1}, {0.5f}), kNoInput, make_i32({1}, {3})},
                      2);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("sequence_lens[0] = 3 is outside [0, 2]"),
            std::string::npos)
      << out.status().message();
}

}  // namespace
}  // namespace kiln
