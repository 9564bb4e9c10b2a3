// Conv and the pools: symbolic output sizes (4*h stride 2 -> 2*h, SAME, ceil_mode), channel and
// group checks, and the CPU kernels (1x1, im2col, depthwise, pools) against naive loops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backends/kernel_registry.h"
#include "ir/graph.h"
#include "ops/schema.h"
#include "test_util.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::all_close;
using testing::make_f32;
using testing::run_cpu_kernel;

struct InferCase {
  ir::Graph g;
  std::vector<ops::Constraint> constraints;
  std::vector<ops::InferContext::Output> outputs;

  int input(DType dt, std::vector<Dim> shape) {
    int v = g.add_value("in" + std::to_string(g.values.size()));
    g.values[v].dtype = dt;
    g.values[v].shape = std::move(shape);
    return v;
  }
  Status run(const std::string& op, std::vector<int> inputs, ir::Attributes attrs = {},
             int num_outputs = 1) {
    ir::Node n;
    n.name = "conv0";
    n.op_type = op;
    n.opset = 17;
    n.inputs = std::move(inputs);
    for (int i = 0; i < num_outputs; ++i) n.outputs.push_back(g.add_value("out" + std::to_string(i)));
    n.attrs = std::move(attrs);
    g.nodes.push_back(n);
    const ops::OpSchema* schema = ops::find_schema(g.nodes.back());
    if (!schema) return not_found("no schema for " + op);
    ops::InferContext ctx(g, g.nodes.back(), 0, &constraints);
    KILN_RETURN_IF_ERROR(schema->infer(ctx));
    outputs = ctx.outputs();
    return ok_status();
  }
  std::string shape(int i = 0) const { return ir::dims_to_string(outputs.at(i).shape); }
};

ir::Attribute int_attr(int64_t v) {
  ir::Attribute a;
  a.type = ir::AttrType::kInt;
  a.i = v;
  return a;
}
ir::Attribute ints_attr(std::vector<int64_t> v) {
  ir::Attribute a;
  a.type = ir::AttrType::kInts;
  a.ints = std::move(v);
  return a;
}
ir::Attribute string_attr(std::string v) {
  ir::Attribute a;
  a.type = ir::AttrType::kString;
  a.s = std::move(v);
  return a;
}

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 7;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = float(s >> 8) / float(1 << 23) - 1.f;
  }
  return v;
}

const Dim kB = Dim::symbol("b");
const Dim kH = Dim::symbol("h");
const Dim kW = Dim::symbol("w");

TEST(ConvInfer, StrideTwoOnFourHGivesTwoH) {
  InferCase c;
  int x = c.input(DType::kFloat32, {kB, 3, kH * 4, kW * 4});
  int w = c.input(DType::kFloat32, {16, 3, 3, 3});
  int bias = c.input(DType::kFloat32, {16});
  ir::Attributes at;
  at.set("strides", ints_attr({2, 2}));
  at.set("pads", ints_attr({1, 1, 1, 1}));
  at.set("kernel_shape", ints_attr({3, 3}));
  ASSERT_TRUE(c.run("Conv", {x, w, bias}, at).ok());
  EXPECT_EQ(c.shape(), "[b, 16, 2*h, 2*w]");
  EXPECT_EQ(c.outputs[0].shape[2], kH * 2);
  // Output >= 1 is recorded for the profile checker (h could be 0).
  bool has_ge = false;
  for (const auto& k : c.constraints) has_ge |= k.kind == ops::Constraint::Kind::kGreaterEqual;
  EXPECT_TRUE(has_ge);
}

TEST(ConvInfer, ConstantSizesDilationAndOneD) {
  {
    InferCase c;  // floor((10 + 0 + 1 - 2*2 - 1)/2) + 1 = 4
    int x = c.input(DType::kFloat32, {1, 4, 10});
    int w = c.input(DType::kFloat32, {8, 4, 3});
    ir::Attributes at;
    at.set("strides", ints_attr({2}));
    at.set("pads", ints_attr({0, 1}));
    at.set("dilations", ints_attr({2}));
    ASSERT_TRUE(c.run("Conv", {x, w}, at).ok());
    EXPECT_EQ(c.shape(), "[1, 8, 4]");
  }
  {
    InferCase c;  // 3-D
    int x = c.input(DType::kFloat32, {kB, 2, 5, 6, 7});
    int w = c.input(DType::kFloat32, {4, 2, 3, 3, 3});
    ASSERT_TRUE(c.run("Conv", {x, w}).ok());
    EXPECT_EQ(c.shape(), "[b, 4, 3, 4, 5]");
  }
}

TEST(ConvInfer, SamePaddingAndDepthwise) {
  InferCase c;
  int x = c.input(DType::kFloat32, {kB, 32, kH, kW});
  int w = c.input(DType::kFloat32, {32, 1, 5, 5});
  ir::Attributes at;
  at.set("group", int_attr(32));
  at.set("strides", ints_attr({2, 2}));
  at.set("auto_pad", string_attr("SAME_UPPER"));
  ASSERT_TRUE(c.run("Conv", {x, w}, at).ok());
  auto out = c.outputs[0].shape;
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[1], Dim(32));
  EXPECT_EQ(out[2], Dim::ceil_div(kH, Dim(2)));
  EXPECT_EQ(out[2].eval({{"h", 7}}), 4);
}

TEST(ConvInfer, InvalidChannelsNameTheNode) {
  {
    InferCase c;
    int x = c.input(DType::kFloat32, {1, 3, 8, 8});
    int w = c.input(DType::kFloat32, {16, 4, 3, 3});
    Status s = c.run("Conv", {x, w});
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kInvalidModel);
    EXPECT_NE(s.message().find("conv0"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("channels"), std::string::npos) << s.message();
  }
  {
    InferCase c;  // group 2: C_in must be 2 * W.C
    int x = c.input(DType::kFloat32, {1, 6, 8, 8});
    int w = c.input(DType::kFloat32, {4, 6, 3, 3});
    ir::Attributes at;
    at.set("group", int_attr(2));
    EXPECT_FALSE(c.run("Conv", {x, w}, at).ok());
  }
  {
    InferCase c;  // M = 5 not divisible by group 2
    int x = c.input(DType::kFloat32, {1, 6, 8, 8});
    int w = c.input(DType::kFloat32, {5, 3, 3, 3});
    ir::Attributes at;
    at.set("group", int_attr(2));
    EXPECT_FALSE(c.run("Conv", {x, w}, at).ok());
  }
  {
    InferCase c;  // kernel larger than the input
    int x = c.input(DType::kFloat32, {1, 3, 2, 2});
    int w = c.input(DType::kFloat32, {4, 3, 3, 3});
    Status s = c.run("Conv", {x, w});
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("conv0"), std::string::npos);
  }
  {
    InferCase c;  // symbolic channels are recorded, not rejected
    int x = c.input(DType::kFloat32, {1, Dim::symbol("c"), 8, 8});
    int w = c.input(DType::kFloat32, {4, 3, 3, 3});
    ASSERT_TRUE(c.run("Conv", {x, w}).ok());
    EXPECT_FALSE(c.constraints.empty());
  }
  {
    InferCase c;  // bad pads length
    int x = c.input(DType::kFloat32, {1, 3, 8, 8});
    int w = c.input(DType::kFloat32, {4, 3, 3, 3});
    ir::Attributes at;
    at.set("pads", ints_attr({1, 1}));
    EXPECT_FALSE(c.run("Conv", {x, w}, at).ok());
  }
}

TEST(PoolInfer, CeilModeSameAndGlobal) {
  {
    InferCase c;  // floor((112 + 2 - 3)/2) + 1 = 56
    int x = c.input(DType::kFloat32, {kB, 64, 112, 112});
    ir::Attributes at;
    at.set("kernel_shape", ints_attr({3, 3}));
    at.set("strides", ints_attr({2, 2}));
    at.set("pads", ints_attr({1, 1, 1, 1}));
    ASSERT_TRUE(c.run("MaxPool", {x}, at).ok());
    EXPECT_EQ(c.shape(), "[b, 64, 56, 56]");
  }
  {
    InferCase c;  // ceil((6 - 3)/2) + 1 = 3 (floor would give 2)
    int x = c.input(DType::kFloat32, {1, 1, 6, 6});
    ir::Attributes at;
    at.set("kernel_shape", ints_attr({3, 3}));
    at.set("strides", ints_attr({2, 2}));
    at.set("ceil_mode", int_attr(1));
    ASSERT_TRUE(c.run("AveragePool", {x}, at).ok());
    EXPECT_EQ(c.shape(), "[1, 1, 3, 3]");
  }
  {
    InferCase c;  // ceil mode on 4*h: ceil((4h - 2)/2) + 1 = 2h
    int x = c.input(DType::kFloat32, {1, 1, kH * 4, 8});
    ir::Attributes at;
    at.set("kernel_shape", ints_attr({2, 2}));
    at.set("strides", ints_attr({2, 2}));
    at.set("ceil_mode", int_attr(1));
    ASSERT_TRUE(c.run("MaxPool", {x}, at).ok());
    EXPECT_EQ(c.shape(), "[1, 1, 2*h, 4]");
  }
  {
    InferCase c;
    int x = c.input(DType::kFloat32, {kB, 3, kH, 9});
    ir::Attributes at;
    at.set("kernel_shape", ints_attr({2, 2}));
    at.set("strides", ints_attr({2, 2}));
    at.set("auto_pad", string_attr("SAME_LOWER"));
    ASSERT_TRUE(c.run("MaxPool", {x}, at, 2).ok());
    EXPECT_EQ(c.outputs[0].shape[3], Dim(5));
    EXPECT_EQ(c.outputs[1].dtype, DType::kInt64);
  }
  {
    InferCase c;
    int x = c.input(DType::kFloat32, {kB, 3, kH, kW});
    ASSERT_TRUE(c.run("GlobalAveragePool", {x}).ok());
    EXPECT_EQ(c.shape(), "[b, 3, 1, 1]");
  }
  {
    InferCase c;  // kernel_shape is required
    int x = c.input(DType::kFloat32, {1, 3, 8, 8});
    Status s = c.run("MaxPool", {x});
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("kernel_shape"), std::string::npos);
  }
}

// ---- naive references ----

struct ConvSpec {
  int64_t n, c, m, group;
  std::vector<int64_t> in, k, stride, dil, pads;  // pads: begins then ends
  bool bias;
};

std::vector<int64_t> conv_out_dims(const ConvSpec& s) {
  std::vector<int64_t> out;
  size_t ns = s.in.size();
  for (size_t i = 0; i < ns; ++i) {
    out.push_back((s.in[i] + s.pads[i] + s.pads[ns + i] - s.dil[i] * (s.k[i] - 1) - 1) / s.stride[i] + 1);
  }
  return out;
}

// Straightforward nested loops over 3 spatial axes (unused ones have size 1).
Tensor naive_conv(const ConvSpec& s, const Tensor& x, const Tensor& w, const Tensor* b) {
  size_t ns = s.in.size();
  auto o = conv_out_dims(s);
  auto pad3 = [&](const std::vector<int64_t>& v, int64_t fill, size_t off) {
    std::vector<int64_t> r(3, fill);
    for (size_t i = 0; i < ns; ++i) r[3 - ns + i] = v[off + i];
    return r;
  };
  auto in = pad3(s.in, 1, 0), k = pad3(s.k, 1, 0), st = pad3(s.stride, 1, 0), dl = pad3(s.dil, 1, 0),
       pb = pad3(s.pads, 0, 0), out = pad3(o, 1, 0);
  int64_t cg = s.c / s.group, mg = s.m / s.group;
  Shape shape = {s.n, s.m};
  shape.insert(shape.end(), o.begin(), o.end());
  std::vector<float> y(size_t(shape_numel(shape)));
  const float* xp = x.data_as<float>();
  const float* wp = w.data_as<float>();
  size_t yi = 0;
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t m = 0; m < s.m; ++m) {
      int64_t g = m / mg;
      for (int64_t od = 0; od < out[0]; ++od) {
        for (int64_t oh = 0; oh < out[1]; ++oh) {
          for (int64_t ow = 0; ow < out[2]; ++ow) {
            double acc = b ? b->data_as<float>()[m] : 0.0;
            for (int64_t c = 0; c < cg; ++c) {
              for (int64_t kd = 0; kd < k[0]; ++kd) {
                for (int64_t kh = 0; kh < k[1]; ++kh) {
                  for (int64_t kw = 0; kw < k[2]; ++kw) {
                    int64_t id = od * st[0] - pb[0] + kd * dl[0];
                    int64_t ih = oh * st[1] - pb[1] + kh * dl[1];
                    int64_t iw = ow * st[2] - pb[2] + kw * dl[2];
                    if (id < 0 || id >= in[0] || ih < 0 || ih >= in[1] || iw < 0 || iw >= in[2]) continue;
                    double xv = xp[(((n * s.c + g * cg + c) * in[0] + id) * in[1] + ih) * in[2] + iw];
                    double wv = wp[(((m * cg + c) * k[0] + kd) * k[1] + kh) * k[2] + kw];
                    acc += xv * wv;
                  }
                }
              }
            }
            y[yi++] = float(acc);
          }
        }
      }
    }
  }
  return make_f32(shape, y);
}

void check_conv(const ConvSpec& s, const std::string& label) {
  Shape xs = {s.n, s.c}, ws = {s.m, s.c / s.group};
  xs.insert(xs.end(), s.in.begin(), s.in.end());
  ws.insert(ws.end(), s.k.begin(), s.k.end());
  Tensor x = make_f32(xs, random_values(size_t(shape_numel(xs)), 11));
  Tensor w = make_f32(ws, random_values(size_t(shape_numel(ws)), 12));
  Tensor b = make_f32({s.m}, random_values(size_t(s.m), 13));
  ir::Node node;
  node.name = "conv0";
  node.op_type = "Conv";
  node.opset = 17;
  node.attrs.set("group", int_attr(s.group));
  node.attrs.set("strides", ints_attr(s.stride));
  node.attrs.set("dilations", ints_attr(s.dil));
  node.attrs.set("pads", ints_attr(s.pads));
  node.attrs.set("kernel_shape", ints_attr(s.k));
  Shape ys = {s.n, s.m};
  auto o = conv_out_dims(s);
  ys.insert(ys.end(), o.begin(), o.end());
  std::vector<Tensor> inputs = {x, w};
  if (s.bias) inputs.push_back(b);
  auto r = run_cpu_kernel(node, inputs, {{DType::kFloat32, ys}});
  ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], naive_conv(s, x, w, s.bias ? &b : nullptr))) << label;
}

TEST(ConvKernel, HandComputed) {
  // 1x1x3x3 input, 2x2 kernel of ones, bias 1: window sums + 1.
  ir::Node node;
  node.name = "conv0";
  node.op_type = "Conv";
  Tensor x = make_f32({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor w = make_f32({1, 1, 2, 2}, {1, 1, 1, 1});
  Tensor b = make_f32({1}, {1});
  auto r = run_cpu_kernel(node, {x, w, b}, {{DType::kFloat32, {1, 1, 2, 2}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_f32({1, 1, 2, 2}, {13, 17, 25, 29})));
}

TEST(ConvKernel, AgainstNaive) {
  // n, c, m, group, in, k, stride, dil, pads, bias
  check_conv({2, 8, 16, 1, {5, 7}, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, true}, "1x1");
  check_conv({1, 8, 6, 1, {9, 9}, {1, 1}, {2, 2}, {1, 1}, {0, 0, 0, 0}, false}, "1x1 stride 2");
  check_conv({2, 3, 16, 1, {15, 14}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, true}, "3x3 s2 stem");
  check_conv({1, 6, 9, 3, {11, 10}, {3, 2}, {1, 2}, {2, 1}, {2, 0, 1, 1}, true}, "groups dilated");
  check_conv({2, 16, 16, 16, {13, 13}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true}, "depthwise 3x3");
  check_conv({1, 24, 24, 24, {14, 15}, {5, 5}, {2, 2}, {1, 1}, {2, 2, 2, 2}, true}, "depthwise 5x5 s2");
  check_conv({1, 4, 4, 4, {40, 37}, {3, 3}, {1, 1}, {2, 3}, {2, 1, 3, 0}, false}, "depthwise dilated");
  check_conv({1, 4, 8, 4, {9, 9}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true}, "depthwise x2");
  check_conv({2, 5, 7, 1, {20}, {4}, {3}, {2}, {3, 1}, true}, "1-D");
  check_conv({1, 4, 6, 2, {5, 6, 7}, {3, 2, 3}, {1, 2, 1}, {1, 1, 2}, {1, 0, 1, 1, 1, 0}, true}, "3-D");
  check_conv({1, 64, 32, 1, {28, 28}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, true}, "K = 576");
  check_conv({1, 560, 2, 1, {4, 4}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, false}, "K = 5040");
}

TEST(ConvKernel, AutoPadSameLowerMatchesExplicitPads) {
  // in 6, k 3, stride 2: out 3, total pad (3-1)*2 + 3 - 6 = 1; SAME_LOWER puts it at the start.
  Shape xs = {1, 2, 6, 6};
  Tensor x = make_f32(xs, random_values(72, 21));
  Tensor w = make_f32({3, 2, 3, 3}, random_values(54, 22));
  ir::Node node;
  node.name = "conv0";
  node.op_type = "Conv";
  node.attrs.set("strides", ints_attr({2, 2}));
  node.attrs.set("auto_pad", string_attr("SAME_LOWER"));
  auto r = run_cpu_kernel(node, {x, w}, {{DType::kFloat32, {1, 3, 3, 3}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ConvSpec s{1, 2, 3, 1, {6, 6}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 0, 0}, false};
  EXPECT_TRUE(all_close((*r)[0], naive_conv(s, x, w, nullptr)));
}

TEST(ConvKernel, ReusesScratchAcrossShapesAndRejectsBadShapes) {
  ir::Node node;
  node.name = "conv0";
  node.op_type = "Conv";
  node.attrs.set("pads", ints_attr({1, 1, 1, 1}));
  ir::Graph g;
  for (int i = 0; i < 3; ++i) g.add_value("v" + std::to_string(i));
  backends::KernelQuery q{node, {&g.values[0], &g.values[1]}, {&g.values[2]}};
  auto kernel = backends::create_reference_kernel(q);
  ASSERT_TRUE(kernel.ok()) << kernel.status().to_string();
  for (int64_t h : {8, 4, 12}) {
    ConvSpec s{1, 3, 5, 1, {h, h}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, false};
    Tensor x = make_f32({1, 3, h, h}, random_values(size_t(3 * h * h), 30));
    Tensor w = make_f32({5, 3, 3, 3}, random_values(135, 31));
    Tensor y = Tensor::zeros(DType::kFloat32, {1, 5, h, h}).value();
    std::vector<TensorView> in = {x.view(), w.view()}, out = {y.view()};
    ASSERT_TRUE((*kernel)->execute(in, out).ok());
    EXPECT_TRUE(all_close(y, naive_conv(s, x, w, nullptr))) << "h = " << h;
  }
  // A channel mismatch at run time is an error, not a crash.
  Tensor x = make_f32({1, 4, 5, 5}, random_values(100, 1));
  Tensor w = make_f32({5, 3, 3, 3}, random_values(135, 2));
  Tensor y = Tensor::zeros(DType::kFloat32, {1, 5, 5, 5}).value();
  std::vector<TensorView> in = {x.view(), w.view()}, out = {y.view()};
  Status s = (*kernel)->execute(in, out);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST(ConvKernel, ZeroBatch) {
  ir::Node node;
  node.name = "conv0";
  node.op_type = "Conv";
  auto r = run_cpu_kernel(node, {make_f32({0, 2, 4, 4}, {}), make_f32({3, 2, 3, 3}, random_values(54, 1))},
                          {{DType::kFloat32, {0, 3, 2, 2}}});
  EXPECT_TRUE(r.ok()) << r.status().to_string();
}

struct PoolSpec {
  std::vector<int64_t> in, k, stride, dil, pads;
  bool ceil_mode;
  bool include_pad;
};

// Output size with ONNX's ceil_mode rule (a window starting in the end padding is dropped).
std::vector<int64_t> pool_out_dims(const PoolSpec& s) {
  std::vector<int64_t> out;
  size_t ns = s.in.size();
  for (size_t i = 0; i < ns; ++i) {
    double v = double(s.in[i] + s.pads[i] + s.pads[ns + i] - s.dil[i] * (s.k[i] - 1) - 1) / s.stride[i];
    int64_t o = int64_t(s.ceil_mode ? std::ceil(v) : std::floor(v)) + 1;
    if (s.ceil_mode && (o - 1) * s.stride[i] >= s.in[i] + s.pads[i]) --o;
    out.push_back(o);
  }
  return out;
}

// 2-D naive pools over [1, C, H, W]; returns max (with flat indices) or average.
void naive_pool_2d(const PoolSpec& s, const Tensor& x, int64_t c, bool is_max, std::vector<float>* y,
                   std::vector<int64_t>* idx) {
  auto o = pool_out_dims(s);
  const float* xp = x.data_as<float>();
  int64_t H = s.in[0], W = s.in[1];
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t oh = 0; oh < o[0]; ++oh) {
      for (int64_t ow = 0; ow < o[1]; ++ow) {
        float best = -std::numeric_limits<float>::infinity();
        int64_t best_i = -1, count = 0, padded = 0;
        double sum = 0;
        for (int64_t kh = 0; kh < s.k[0]; ++kh) {
          for (int64_t kw = 0; kw < s.k[1]; ++kw) {
            int64_t ih = oh * s.stride[0] - s.pads[0] + kh * s.dil[0];
            int64_t iw = ow * s.stride[1] - s.pads[1] + kw * s.dil[1];
            if (ih < H + s.pads[2] && iw < W + s.pads[3]) ++padded;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            int64_t i = (ch * H + ih) * W + iw;
            if (xp[i] > best) {
              best = xp[i];
              best_i = i;
            }
            sum += xp[i];
            ++count;
          }
        }
        if (is_max) {
          y->push_back(best);
          idx->push_back(best_i);
        } else {
          y->push_back(float(sum / double(s.include_pad ? padded : count)));
        }
      }
    }
  }
}

void check_pool(const PoolSpec& s, const std::string& label) {
  int64_t c = 3;
  Shape xs = {1, c, s.in[0], s.in[1]};
  Tensor x = make_f32(xs, random_values(size_t(shape_numel(xs)), 41));
  auto o = pool_out_dims(s);
  Shape ys = {1, c, o[0], o[1]};
  for (bool is_max : {true, false}) {
    ir::Node node;
    node.name = "pool0";
    node.op_type = is_max ? "MaxPool" : "AveragePool";
    node.opset = 19;
    node.attrs.set("kernel_shape", ints_attr(s.k));
    node.attrs.set("strides", ints_attr(s.stride));
    node.attrs.set("dilations", ints_attr(s.dil));
    node.attrs.set("pads", ints_attr(s.pads));
    node.attrs.set("ceil_mode", int_attr(s.ceil_mode));
    if (!is_max) node.attrs.set("count_include_pad", int_attr(s.include_pad));
    std::vector<std::pair<DType, Shape>> outs = {{DType::kFloat32, ys}};
    if (is_max) outs.push_back({DType::kInt64, ys});
    auto r = run_cpu_kernel(node, {x}, outs);
    ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
    std::vector<float> e;
    std::vector<int64_t> ei;
    naive_pool_2d(s, x, c, is_max, &e, &ei);
    EXPECT_TRUE(all_close((*r)[0], make_f32(ys, e))) << label << (is_max ? " max" : " avg");
    if (is_max) {
      const int64_t* got = (*r)[1].data_as<int64_t>();
      for (size_t i = 0; i < ei.size(); ++i) ASSERT_EQ(got[i], ei[i]) << label << " index " << i;
    }
  }
}

TEST(PoolKernel, AgainstNaive) {
  // in, k, stride, dil, pads, ceil_mode, count_include_pad
  check_pool({{8, 8}, {2, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}, false, false}, "2x2 s2");
  check_pool({{9, 11}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, false, false}, "3x3 s2 pad");
  check_pool({{9, 11}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, false, true}, "include pad");
  check_pool({{6, 7}, {3, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}, true, false}, "ceil");
  check_pool({{7, 7}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, true, true}, "ceil include pad");
  check_pool({{5, 5}, {2, 2}, {3, 3}, {1, 1}, {0, 0, 1, 1}, true, false}, "ceil drops last");
  check_pool({{10, 9}, {2, 3}, {1, 2}, {2, 2}, {1, 0, 2, 1}, false, true}, "dilated");
}

TEST(PoolKernel, HandComputedAndGlobal) {
  Tensor x = make_f32({1, 1, 2, 4}, {1, 5, 2, 0, -1, 3, 8, 7});
  ir::Node mp;
  mp.name = "pool0";
  mp.op_type = "MaxPool";
  mp.attrs.set("kernel_shape", ints_attr({2, 2}));
  mp.attrs.set("strides", ints_attr({2, 2}));
  auto r = run_cpu_kernel(mp, {x}, {{DType::kFloat32, {1, 1, 1, 2}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_f32({1, 1, 1, 2}, {5, 8})));

  ir::Node ap = mp;
  ap.op_type = "AveragePool";
  auto a = run_cpu_kernel(ap, {x}, {{DType::kFloat32, {1, 1, 1, 2}}});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_TRUE(all_close((*a)[0], make_f32({1, 1, 1, 2}, {2, 4.25f})));

  Tensor g = make_f32({2, 2, 3}, {1, 2, 3, -4, -5, -6, 0, 0, 9, 1, 1, 1});
  ir::Node gap;
  gap.name = "gap0";
  gap.op_type = "GlobalAveragePool";
  auto ga = run_cpu_kernel(gap, {g}, {{DType::kFloat32, {2, 2, 1}}});
  ASSERT_TRUE(ga.ok()) << ga.status().to_string();
  EXPECT_TRUE(all_close((*ga)[0], make_f32({2, 2, 1}, {2, -5, 3, 1})));
  gap.op_type = "GlobalMaxPool";
  auto gm = run_cpu_kernel(gap, {g}, {{DType::kFloat32, {2, 2, 1}}});
  ASSERT_TRUE(gm.ok()) << gm.status().to_string();
  EXPECT_TRUE(all_close((*gm)[0], make_f32({2, 2, 1}, {3, -4, 9, 1})));
}

TEST(PoolKernel, WrongOutputShapeIsAnError) {
  ir::Node mp;
  mp.name = "pool0";
  mp.op_type = "MaxPool";
  mp.attrs.set("kernel_shape", ints_attr({2, 2}));
  auto r = run_cpu_kernel(mp, {make_f32({1, 1, 3, 3}, std::vector<float>(9, 1))},
                          {{DType::kFloat32, {1, 1, 3, 3}}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("MaxPool"), std::string::npos);
}


// ---- ConvTranspose, LpPool, MaxUnpool, ConvInteger ----

TEST(ConvTransposeInfer, StridesPadsOutputPaddingAndOutputShape) {
  InferCase c;
  int x = c.input(DType::kFloat32, {kB, 4, kH, 5});
  int w = c.input(DType::kFloat32, {4, 3, 3, 3});
  ir::Attributes at;
  at.set("strides", ints_attr({2, 2}));
  at.set("pads", ints_attr({1, 1, 1, 1}));
  at.set("output_padding", ints_attr({1, 0}));
  at.set("group", int_attr(2));
  ASSERT_TRUE(c.run("ConvTranspose", {x, w}, at).ok());
  // (in-1)*2 + out_pad + 3 - 2; channels W[1]*group.
  EXPECT_EQ(c.outputs[0].shape[1], Dim(6));
  EXPECT_EQ(c.outputs[0].shape[2], (kH - 1) * 2 + 2);
  EXPECT_EQ(c.outputs[0].shape[3], Dim(9));
  InferCase d;
  x = d.input(DType::kFloat32, {1, 4, 3, 3});
  w = d.input(DType::kFloat32, {4, 1, 3, 3});
  ir::Attributes at2;
  at2.set("output_shape", ints_attr({10, 8}));
  at2.set("strides", ints_attr({3, 2}));
  ASSERT_TRUE(d.run("ConvTranspose", {x, w}, at2).ok());
  EXPECT_EQ(d.shape(), "[1, 1, 10, 8]");
  // W dim 0 must equal the input channels.
  InferCase e;
  x = e.input(DType::kFloat32, {1, 4, 3, 3});
  w = e.input(DType::kFloat32, {2, 1, 3, 3});
  EXPECT_FALSE(e.run("ConvTranspose", {x, w}).ok());
}

TEST(ConvTransposeKernel, ScattersThroughTheKernel) {
  // 1-D: x = [1, 2], w = [1, 10, 100], stride 2 -> y[0..4] = [1, 10, 102, 20, 200].
  ir::Node n;
  n.name = "ct";
  n.op_type = "ConvTranspose";
  n.opset = 17;
  n.attrs.set("strides", ints_attr({2}));
  auto out = run_cpu_kernel(n, {make_f32({1, 1, 2}, {1, 2}), make_f32({1, 1, 3}, {1, 10, 100})},
                            {{DType::kFloat32, {1, 1, 5}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 5}, {1, 10, 102, 20, 200})));
  // pads [1, 1] crop one element from each end.
  n.attrs.set("pads", ints_attr({1, 1}));
  out = run_cpu_kernel(n, {make_f32({1, 1, 2}, {1, 2}), make_f32({1, 1, 3}, {1, 10, 100})},
                       {{DType::kFloat32, {1, 1, 3}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 3}, {10, 102, 20})));
}

TEST(PoolKernel, LpPoolP2IsTheWindowNorm) {
  ir::Node n;
  n.name = "lp";
  n.op_type = "LpPool";
  n.opset = 18;
  n.attrs.set("kernel_shape", ints_attr({2}));
  n.attrs.set("strides", ints_attr({2}));
  auto out = run_cpu_kernel(n, {make_f32({1, 1, 4}, {3, -4, 1, 0})}, {{DType::kFloat32, {1, 1, 2}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 2}, {5, 1})));
}

TEST(PoolKernel, MaxUnpoolScattersByIndex) {
  ir::Node n;
  n.name = "unpool";
  n.op_type = "MaxUnpool";
  n.opset = 11;
  n.attrs.set("kernel_shape", ints_attr({2, 2}));
  n.attrs.set("strides", ints_attr({2, 2}));
  Tensor idx = testing::make_i64({1, 1, 1, 2}, {1, 7});
  auto out = run_cpu_kernel(n, {make_f32({1, 1, 1, 2}, {5, 6}), idx}, {{DType::kFloat32, {1, 1, 2, 4}}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(all_close((*out)[0], make_f32({1, 1, 2, 4}, {0, 5, 0, 0, 0, 0, 0, 6})));
  // An index past the end is an error, not a write out of bounds.
  idx = testing::make_i64({1, 1, 1, 2}, {1, 8});
  EXPECT_FALSE(run_cpu_kernel(n, {make_f32({1, 1, 1, 2}, {5, 6}), idx}, {{DType::kFloat32, {1, 1, 2, 4}}}).ok());
}

TEST(ConvIntegerInfer, Int32OutputWithConvShape) {
  InferCase c;
  int x = c.input(DType::kUInt8, {1, 1, kH, 3});
  int w = c.input(DType::kUInt8, {2, 1, 2, 2});
  ir::Attributes at;
  at.set("pads", ints_attr({1, 1, 1, 1}));
  ASSERT_TRUE(c.run("ConvInteger", {x, w}, at).ok());
  EXPECT_EQ(c.outputs[0].dtype, DType::kInt32);
  EXPECT_EQ(c.outputs[0].shape[3], Dim(4));
  InferCase d;
  x = d.input(DType::kFloat32, {1, 1, 3, 3});
  w = d.input(DType::kUInt8, {2, 1, 2, 2});
  EXPECT_FALSE(d.run("ConvInteger", {x, w}).ok());
}

}  // namespace
}  // namespace kiln
