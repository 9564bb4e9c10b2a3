// kiln::Elementwise, the chains fuse_elementwise makes: its programs against each instruction's
// ONNX kernel on the CPU (bit for bit in float32) and on each device present, the CUDA kernel's
// vector and broadcast-walk forms, and the errors inference gives for a malformed program.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "op_harness.h"

namespace kiln {
namespace {

using testing::f32;
using testing::infer_node;
using testing::make_f32;
using testing::op;
using testing::OpNode;
using testing::run_case;

// One instruction of a kiln::Elementwise program: op on registers a and b (-1: none), its alpha
// and beta, the dtype its result is rounded to (1: float32).
struct EwIns {
  const char* op;
  int a, b;
  float alpha = 0, beta = 0;
  int to = 1;
};

// A kiln::Elementwise node named `name` running `program` (its ops/args/to/alpha/beta attributes).
OpNode elementwise_node(const std::string& name, const std::vector<EwIns>& program) {
  OpNode node = op("Elementwise", 1, "kiln").named(name);
  ir::Attribute ops_attr, args, to, alpha, beta;
  ops_attr.type = ir::AttrType::kStrings;
  args.type = to.type = ir::AttrType::kInts;
  alpha.type = beta.type = ir::AttrType::kFloats;
  for (const EwIns& i : program) {
    ops_attr.strings.push_back(i.op);
    args.ints.insert(args.ints.end(), {i.a, i.b});
    to.ints.push_back(i.to);
    alpha.floats.push_back(i.alpha);
    beta.floats.push_back(i.beta);
  }
  for (auto& [n, a] : std::vector<std::pair<std::string, ir::Attribute>>{
           {"ops", ops_attr}, {"args", args}, {"to", to}, {"alpha", alpha}, {"beta", beta}}) {
    node.node.attrs.set(n, a);
  }
  return node;
}

// The CPU's float32 program path (run_float32_program: 256 elements at a time, rows split over the
// threads) against each instruction's ONNX kernel run on whole tensors, bit for bit: every op it
// holds, on tensors long enough for many chunks and threads, with operands of the output's shape, a
// trailing row, a per-row scalar (broadcast along the row: copied into a register) and one element.
TEST(ElementwiseKernel, Float32ProgramsGiveTheUnfusedChainsBits) {
  using Ins = EwIns;
  // Registers: 0 x [3, 1000] in [-4, 4], 1 row [1000], 2 per-row [3, 1], 3 scalar [1]; results.
  const std::vector<std::vector<Ins>> programs = {
      {{"Add", 0, 1},         {"Mul", 4, 2},   {"Sigmoid", 5, -1}, {"Mul", 0, 6},
       {"Sub", 7, 3},         {"Div", 8, 1},   {"Pow", 9, 3},      {"Tanh", 0, -1},
       {"Add", 10, 11},       {"Erf", 0, -1},  {"Add", 12, 13},    {"Gelu", 0, -1},
       {"Add", 14, 15},       {"Exp", 2, -1},  {"Mul", 16, 17},    {"Abs", 0, -1},
       {"Sqrt", 19, -1},      {"Add", 18, 20}, {"Log", 1, -1},     {"Add", 21, 22},
       {"Reciprocal", 1, -1}, {"Mul", 23, 24}},
      {{"GeluTanh", 0, -1}, {"HardSigmoid", 0, -1, 0.3f, 0.4f},
       {"Add", 4, 5},       {"HardSwish", 0, -1},
       {"Add", 6, 7},       {"LeakyRelu", 0, -1, 0.2f},
       {"Add", 8, 9},       {"Relu", 0, -1},
       {"Add", 10, 11},     {"Neg", 12, -1},
       {"Sin", 13, -1},     {"Cos", 0, -1},
       {"Add", 14, 15},     {"Floor", 0, -1},
       {"Add", 16, 17},     {"Ceil", 1, -1},
       {"Add", 18, 19},     {"Softplus", 0, -1},
       {"Add", 20, 21},     {"Identity", 22, -1},
       {"Cast", 23, -1},    {"Mul", 24, 2},
       {"Pow", 25, 3}},
  };
  const int64_t rows = 3, n = 1000;
  std::vector<float> xv(static_cast<size_t>(rows * n)), rv(static_cast<size_t>(n)),
      gv = {0.75f, -1.25f, 1.5f};
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = -4.0f + 8.0f * float((i * 37) % 1001) / 1000.0f;
  for (size_t i = 0; i < rv.size(); ++i) rv[i] = 0.5f + float(i % 7) * 0.25f;
  std::vector<Tensor> regs = {make_f32({rows, n}, xv), make_f32({n}, rv), make_f32({rows, 1}, gv),
                              make_f32({1}, {2.0f})};
  for (size_t k = 0; k < programs.size(); ++k) {
    const OpNode node = elementwise_node("ew" + std::to_string(k), programs[k]);
    std::vector<Tensor> chain(regs.begin(), regs.end());
    for (const Ins& i : programs[k]) {
      // The instruction as the ONNX op it replaced, on the whole tensors.
      const bool tanh = std::string(i.op) == "GeluTanh";
      OpNode one = op(tanh ? "Gelu" : i.op, std::string(i.op) == "Gelu" || tanh ? 20 : 18);
      if (tanh) one.s("approximate", "tanh");
      if (std::string(i.op) == "HardSigmoid") one.f("alpha", i.alpha).f("beta", i.beta);
      if (std::string(i.op) == "LeakyRelu") one.f("alpha", i.alpha);
      if (std::string(i.op) == "Cast") one.i("to", 1);
      std::vector<Tensor> operands = {chain[size_t(i.a)]};
      if (i.b >= 0) operands.push_back(chain[size_t(i.b)]);
      Shape shape;  // numpy's broadcast of the operands' shapes
      for (const Tensor& t : operands) {
        const Shape& v = t.shape();
        if (v.size() > shape.size()) shape.insert(shape.begin(), v.size() - shape.size(), 1);
        for (size_t d = 0; d < v.size(); ++d) {
          int64_t& o = shape[shape.size() - v.size() + d];
          if (o == 1) o = v[d];
        }
      }
      auto r = testing::run_cpu_kernel(one.node, operands, {{DType::kFloat32, shape}});
      ASSERT_TRUE(r.ok()) << i.op << ": " << r.status().to_string();
      chain.push_back((*r)[0]);
    }
    auto fused = testing::run_cpu_kernel(node.node, regs, {{DType::kFloat32, Shape{rows, n}}});
    ASSERT_TRUE(fused.ok()) << "program " << k << ": " << fused.status().to_string();
    const Tensor& want = chain.back();
    ASSERT_EQ(want.shape(), (Shape{rows, n})) << "program " << k;
    for (int64_t e = 0; e < rows * n; ++e) {
      const float a = (*fused)[0].data_as<float>()[e], b = want.data_as<float>()[e];
      ASSERT_TRUE(std::memcmp(&a, &b, 4) == 0)
          << "program " << k << " element " << e << ": " << a << " vs " << b;
    }
  }
}

// kiln::Elementwise, the fused chains of fuse_elementwise: every instruction op, operands that
// broadcast three ways (the output's shape [2, 3, 5], a trailing row [5], a per-sample [2, 1, 1]),
// results accumulated so each one reaches the output. The CPU reference runs each instruction's
// ONNX kernel; each device present runs its kernel against it.
TEST(ElementwiseKernel, FusedProgramsOfEveryOp) {
  using Ins = EwIns;
  // Registers: 0 x [2, 3, 5] in [-2, 2], 1 bias [5] in [0.5, 1.5], 2 gate [2, 1, 1]; then results.
  const std::vector<std::vector<Ins>> programs = {
      {{"Add", 0, 1},
       {"Sub", 3, 2},
       {"Mul", 4, 0},
       {"Div", 5, 1},
       {"Pow", 1, 0},
       {"Add", 6, 7},
       {"Sqrt", 1, -1},
       {"Add", 8, 9},
       {"Log", 1, -1},
       {"Add", 10, 11},
       {"Reciprocal", 1, -1},
       {"Mul", 12, 13},
       {"Exp", 0, -1},
       {"Sub", 14, 15},
       {"Abs", 16, -1},
       {"Neg", 17, -1},
       {"Relu", 16, -1},
       {"Add", 18, 19}},
      {{"Sigmoid", 0, -1},
       {"Tanh", 0, -1},
       {"Add", 3, 4},
       {"Erf", 0, -1},
       {"Add", 5, 6},
       {"Identity", 0, -1},
       {"Add", 7, 8},
       {"HardSigmoid", 0, -1, 0.3f, 0.4f},
       {"Add", 9, 10},
       {"HardSwish", 0, -1},
       {"Add", 11, 12},
       {"LeakyRelu", 0, -1, 0.2f},
       {"Add", 13, 14},
       {"Gelu", 0, -1},
       {"Add", 15, 16}},
      {{"GeluTanh", 0, -1},
       {"Sin", 0, -1},
       {"Add", 3, 4},
       {"Cos", 0, -1},
       {"Add", 5, 6},
       {"Floor", 0, -1},
       {"Add", 7, 8},
       {"Ceil", 0, -1},
       {"Add", 9, 10},
       {"Softplus", 0, -1},
       {"Add", 11, 12},
       {"Cast", 13, -1, 0, 0, 10},
       {"Cast", 14, -1, 0, 0, 1},
       {"Mul", 15, 2}},
  };
  std::vector<float> xv(30), bv(5), gv = {0.75f, -1.25f};
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = -2.0f + 4.0f * float((i * 37) % 30) / 29.0f;
  for (size_t i = 0; i < bv.size(); ++i) bv[i] = 0.5f + 0.25f * float(i);
  const Tensor x = make_f32({2, 3, 5}, xv), bias = make_f32({5}, bv),
               gate = make_f32({2, 1, 1}, gv);
  for (size_t k = 0; k < programs.size(); ++k) {
    const OpNode node = elementwise_node("ew" + std::to_string(k), programs[k]);
    auto r = run_case({.node = node,
                       .inputs = {x, bias, gate},
                       .expect_support = true,
                       .label = "program " + std::to_string(k)});
    ASSERT_TRUE(r.ok()) << "program " << k << ": " << r.status().to_string();
    ASSERT_EQ((*r)[0].shape(), (Shape{2, 3, 5}));
  }
  // The CUDA kernel's vector form: an input of Y's shape, a trailing bias whose length is a
  // multiple of 4 and a scalar, a program of few slots.
  {
    const OpNode node =
        elementwise_node("ew_vec", {{"Add", 0, 1}, {"Mul", 3, 2}, {"Tanh", 4, -1}, {"Add", 5, 0}});
    std::vector<float> xv4(6 * 16), bv4(16);
    for (size_t i = 0; i < xv4.size(); ++i) xv4[i] = 0.05f * float(int(i * 13 % 40) - 20);
    for (size_t i = 0; i < bv4.size(); ++i) bv4[i] = 0.1f * float(i) - 0.7f;
    auto r =
        run_case({.node = node,
                  .inputs = {make_f32({6, 16}, xv4), make_f32({16}, bv4), make_f32({1}, {1.5f})},
                  .expect_support = true,
                  .label = "vector"});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    // Element [5, 9]: tanh((x + b) * 1.5) + x.
    const float xe = xv4[5 * 16 + 9];
    EXPECT_NEAR((*r)[0].float_at(5 * 16 + 9), std::tanh((xe + bv4[9]) * 1.5f) + xe, 1e-6f);
  }
  // Broadcasts of three runs (the CUDA kernel's general walk) and of two, against each other.
  {
    const OpNode node = elementwise_node("ew_walk", {{"Sub", 0, 1}, {"Tanh", 2, -1}});
    std::vector<float> av(12), bv(20);
    for (size_t i = 0; i < av.size(); ++i) av[i] = 0.25f * float(i) - 1.0f;
    for (size_t i = 0; i < bv.size(); ++i) bv[i] = 0.1f * float(i * 7 % 20);
    auto r = run_case({.node = node,
                       .inputs = {make_f32({2, 1, 3, 1, 2}, av), make_f32({1, 4, 1, 5, 1}, bv)},
                       .expect_support = true,
                       .label = "walk"});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ((*r)[0].shape(), (Shape{2, 4, 3, 5, 2}));
    // Element [1, 2, 0, 3, 1]: tanh(a[1, 0, 0, 0, 1] - b[0, 2, 0, 3, 0]).
    const float want = std::tanh(av[1 * 6 + 1] - bv[2 * 5 + 3]);
    EXPECT_NEAR((*r)[0].float_at((((1 * 4 + 2) * 3 + 0) * 5 + 3) * 2 + 1), want, 1e-6f);
  }
  // Inference refuses what the program's parser refuses, naming the node.
  OpNode bad = op("Elementwise", 1, "kiln").named("ew_bad");
  ir::Attribute o;
  o.type = ir::AttrType::kStrings;
  o.strings = {"Add"};
  bad.node.attrs.set("ops", o);
  ir::Attribute a;
  a.type = ir::AttrType::kInts;
  a.ints = {0, 5};
  bad.node.attrs.set("args", a);
  a.ints = {1};
  bad.node.attrs.set("to", a);
  testing::Inferred r = infer_node(bad, {f32({2}), f32({2})});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status.message().find("second operand register 5"), std::string::npos)
      << r.status.message();
  EXPECT_NE(r.status.message().find("ew_bad"), std::string::npos) << r.status.message();
}

}  // namespace
}  // namespace kiln
