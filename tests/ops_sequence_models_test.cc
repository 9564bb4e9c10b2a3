// Sequence-model ops: LinearAttention, CausalConvWithState and FlexAttention shape inference and
// CPU kernels against hand-computed recurrences.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "ops/schema.h"
#include "test_util.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::make_f32;
using testing::run_cpu_kernel;

struct Inferred {
  Status status;
  std::vector<ops::InferContext::Output> outs;
};

// Shapes with an empty entry leave that input absent.
Inferred infer(ir::Node node, const std::vector<std::vector<Dim>>& shapes, int num_outputs) {
  ir::Graph g;
  for (const auto& s : shapes) {
    if (s.empty()) {
      node.inputs.push_back(-1);
      continue;
    }
    int v = g.add_value("in" + std::to_string(g.values.size()));
    g.values[v].dtype = DType::kFloat32;
    g.values[v].shape = s;
    node.inputs.push_back(v);
  }
  for (int i = 0; i < num_outputs; ++i)
    node.outputs.push_back(g.add_value("out" + std::to_string(i)));
  g.nodes.push_back(node);
  std::vector<ops::Constraint> constraints;
  ops::InferContext ctx(g, g.nodes[0], 0, &constraints);
  const ops::OpSchema* schema = ops::find_schema(g.nodes[0]);
  if (!schema) return {internal_error("no schema for " + node.op_type), {}};
  Status s = schema->infer(ctx);
  return {s, ctx.outputs()};
}

ir::Node make_node(const std::string& op, const std::string& domain = "") {
  ir::Node n;
  n.name = "s0";
  n.op_type = op;
  n.domain = domain;
  n.opset = domain.empty() ? 27 : 1;
  return n;
}

void set_int(ir::Node& n, const std::string& name, int64_t v) {
  ir::Attribute a;
  a.type = ir::AttrType::kInt;
  a.i = v;
  n.attrs.set(name, a);
}

void set_float(ir::Node& n, const std::string& name, float v) {
  ir::Attribute a;
  a.type = ir::AttrType::kFloat;
  a.f = v;
  n.attrs.set(name, a);
}

void set_string(ir::Node& n, const std::string& name, const std::string& v) {
  ir::Attribute a;
  a.type = ir::AttrType::kString;
  a.s = v;
  n.attrs.set(name, a);
}

TEST(SequenceModelsInfer, LinearAttentionShapesAndRuleInputs) {
  const Dim t = Dim::symbol("t");
  ir::Node n = make_node("LinearAttention");
  set_int(n, "q_num_heads", 4);
  set_int(n, "kv_num_heads", 2);
  // gated_delta (the default): decay and beta are required.
  auto r = infer(n, {{2, t, 32}, {2, t, 16}, {2, t, 24}, {}, {2, t, 2}, {2, t, 2}}, 2);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outs[0].shape[2], Dim(48));  // 4 query heads x value head size 12
  EXPECT_EQ(r.outs[1].shape, (std::vector<Dim>{2, 2, 8, 12}));
  EXPECT_FALSE(infer(n, {{2, t, 32}, {2, t, 16}, {2, t, 24}}, 2).status.ok());
  set_string(n, "update_rule", "linear");
  EXPECT_TRUE(infer(n, {{2, t, 32}, {2, t, 16}, {2, t, 24}}, 2).status.ok());
  set_string(n, "update_rule", "cubic");
  EXPECT_FALSE(infer(n, {{2, t, 32}, {2, t, 16}, {2, t, 24}}, 2).status.ok());
}

TEST(SequenceModelsInfer, FlexAttentionPreviewDomainAndCausalConvState) {
  ir::Node f = make_node("FlexAttention", "ai.onnx.preview");
  auto r = infer(f, {{1, 4, 5, 8}, {1, 2, 6, 8}, {1, 2, 6, 3}}, 1);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outs[0].shape, (std::vector<Dim>{1, 4, 5, 3}));
  // Q heads must be a multiple of KV heads.
  EXPECT_FALSE(infer(f, {{1, 3, 5, 8}, {1, 2, 6, 8}, {1, 2, 6, 3}}, 1).status.ok());
  ir::Node c = make_node("CausalConvWithState");
  r = infer(c, {{2, 4, Dim::symbol("l")}, {4, 1, 3}}, 2);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.outs[1].shape, (std::vector<Dim>{2, 4, 2}));
  // A past state of the wrong length is rejected.
  EXPECT_FALSE(infer(c, {{2, 4, 8}, {4, 1, 3}, {}, {2, 4, 3}}, 2).status.ok());
}

TEST(SequenceModelsKernel, LinearAttentionRecurrences) {
  // linear, one head of size 1, scale 1: S_0 = 1*3 = 3, S_1 = 3 + 2*4 = 11; o_t = q_t * S_t.
  ir::Node n = make_node("LinearAttention");
  set_int(n, "q_num_heads", 1);
  set_int(n, "kv_num_heads", 1);
  set_float(n, "scale", 1.0f);
  set_string(n, "update_rule", "linear");
  auto out = run_cpu_kernel(
      n, {make_f32({1, 2, 1}, {1, 2}), make_f32({1, 2, 1}, {1, 2}), make_f32({1, 2, 1}, {3, 4})},
      {{DType::kFloat32, {1, 2, 1}}, {DType::kFloat32, {1, 1, 1, 1}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({1, 2, 1}, {3, 22})));
  EXPECT_TRUE(testing::all_close((*out)[1], make_f32({1, 1, 1, 1}, {11})));
  // gated_delta from past 2: decay ln 0.5 gives 1; v' = 0.5 * (3 - 1 * 1) = 1; S = 1 + 1 = 2.
  ir::Node g = make_node("LinearAttention");
  set_int(g, "q_num_heads", 1);
  set_int(g, "kv_num_heads", 1);
  set_float(g, "scale", 1.0f);
  out = run_cpu_kernel(g,
                       {make_f32({1, 1, 1}, {1}), make_f32({1, 1, 1}, {1}),
                        make_f32({1, 1, 1}, {3}), make_f32({1, 1, 1, 1}, {2}),
                        make_f32({1, 1, 1}, {std::log(0.5f)}), make_f32({1, 1, 1}, {0.5f})},
                       {{DType::kFloat32, {1, 1, 1}}, {DType::kFloat32, {1, 1, 1, 1}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_NEAR((*out)[0].data_as<float>()[0], 2.f, 1e-5f);
  EXPECT_NEAR((*out)[1].data_as<float>()[0], 2.f, 1e-5f);
}

TEST(SequenceModelsKernel, CausalConvCarriesStateAndFlexAttentionSharesKvHeads) {
  // padded = [5 | 1 2 3], weight (1, 10): y = 15, 21, 32; present = the last input, 3.
  ir::Node c = make_node("CausalConvWithState");
  auto out = run_cpu_kernel(c,
                            {make_f32({1, 1, 3}, {1, 2, 3}), make_f32({1, 1, 2}, {1, 10}), Tensor(),
                             make_f32({1, 1, 1}, {5})},
                            {{DType::kFloat32, {1, 1, 3}}, {DType::kFloat32, {1, 1, 1}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({1, 1, 3}, {15, 21, 32})));
  EXPECT_TRUE(testing::all_close((*out)[1], make_f32({1, 1, 1}, {3})));
  // silu(y) = y * sigmoid(y).
  set_string(c, "activation", "silu");
  out = run_cpu_kernel(c, {make_f32({1, 1, 1}, {1}), make_f32({1, 1, 1}, {1})},
                       {{DType::kFloat32, {1, 1, 1}}, {DType::kFloat32, {1, 1, 0}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_NEAR((*out)[0].data_as<float>()[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  // Two query heads on one KV head: key weights 0.5/0.5 average the values (equal scores).
  ir::Node f = make_node("FlexAttention", "ai.onnx.preview");
  out = run_cpu_kernel(f,
                       {make_f32({1, 2, 1, 1}, {1, -1}), make_f32({1, 1, 2, 1}, {0, 0}),
                        make_f32({1, 1, 2, 1}, {2, 4})},
                       {{DType::kFloat32, {1, 2, 1, 1}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(testing::all_close((*out)[0], make_f32({1, 2, 1, 1}, {3, 3})));
}

TEST(SequenceModelsKernel, FlexAttentionRunsProbMod) {
  // prob_mod = probs * 2 doubles the output; an op the evaluator lacks is an error.
  auto g = std::make_shared<ir::Graph>();
  int x = g->add_value("probs"), two = g->add_value("two"), y = g->add_value("out");
  g->values[two].constant = make_f32({}, {2});
  ir::Node mul = make_node("Mul");
  mul.inputs = {x, two};
  mul.outputs = {y};
  g->nodes.push_back(mul);
  g->inputs = {x};
  g->outputs = {y};
  ir::Node f = make_node("FlexAttention", "ai.onnx.preview");
  ir::Attribute a;
  a.type = ir::AttrType::kGraph;
  a.g = g;
  f.attrs.set("prob_mod", a);
  std::vector<Tensor> in = {make_f32({1, 1, 1, 1}, {1}), make_f32({1, 1, 2, 1}, {0, 0}),
                            make_f32({1, 1, 2, 1}, {2, 4})};
  auto out = run_cpu_kernel(f, in, {{DType::kFloat32, {1, 1, 1, 1}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_NEAR((*out)[0].data_as<float>()[0], 6.f, 1e-5f);
  g->nodes[0].op_type = "Einsum";
  EXPECT_FALSE(run_cpu_kernel(f, in, {{DType::kFloat32, {1, 1, 1, 1}}}).ok());
}

}  // namespace
}  // namespace kiln
