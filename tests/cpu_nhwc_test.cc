// The CPU's channels-last convolutions (assign_layout on the CPU, conv_nhwc.cc): a stack of every
// kind of conv they serve (dense KxK with few and many (over kSmallN) output channels, strided,
// dilated, depthwise, pointwise, a 1x1 map, a residual, activations, a squeeze-excitation's
// ReduceMean and Mul, a grouped conv left to the transposing path) built for the CPU computes what
// the graph's nodes compute one by one on the NCHW reference kernels, at batch 1 and 3, with the
// same bits on one thread and on two; a lone conv stays NCHW.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "builder/build_state.h"
#include "ir/text.h"
#include "kiln.h"
#include "model_util.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

// Nine convolutions and three edges that change layout (X in, Y out, and the one ReduceMean's
// output that goes back to NCHW for nothing: it is pushed through), so the CPU takes NHWC.
const char* kStack = R"(graph g(%x: float32[N, 8, 12, 12]) -> (%y: float32[N, 112, 3, 3]) {
  opset ai.onnx 17
  %w1: float32[16, 8, 3, 3] = dense<...>
  %b1: float32[16] = dense<...>
  %w2: float32[16, 1, 5, 5] = dense<...>
  %b2: float32[16] = dense<...>
  %w3: float32[128, 16, 1, 1] = dense<...>
  %w4: float32[16, 128, 1, 1] = dense<...>
  %b4: float32[16] = dense<...>
  %wg: float32[16, 8, 1, 1] = dense<...>
  %wse: float32[16, 16, 1, 1] = dense<...>
  %w5: float32[24, 16, 3, 3] = dense<...>
  %w6: float32[24, 1, 3, 3] = dense<...>
  %w7: float32[112, 24, 3, 3] = dense<...>
  %b7: float32[112] = dense<...>
  %lo: float32[] = dense<0.0>
  %hi: float32[] = dense<0.5>
  %c1: float32[N, 16, 6, 6] = Conv(%x, %w1, %b1) {kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]}  # conv1
  %r1: float32[N, 16, 6, 6] = Relu(%c1)  # relu1
  %c2: float32[N, 16, 6, 6] = Conv(%r1, %w2, %b2) {group=16, kernel_shape=[5, 5], pads=[2, 2, 2, 2]}  # dw2
  %r2: float32[N, 16, 6, 6] = Clip(%c2, %lo, %hi)  # clip2
  %c3: float32[N, 128, 6, 6] = Conv(%r2, %w3) {kernel_shape=[1, 1]}  # pw3
  %c4: float32[N, 16, 6, 6] = Conv(%c3, %w4, %b4) {kernel_shape=[1, 1]}  # pw4
  %a4: float32[N, 16, 6, 6] = Add(%c4, %r1)  # residual
  %s: float32[N, 16, 6, 6] = Relu(%a4)  # relu4
  %g5: float32[N, 16, 6, 6] = Conv(%s, %wg) {group=2, kernel_shape=[1, 1]}  # grouped5
  %m: float32[N, 16, 1, 1] = ReduceMean(%g5) {axes=[2, 3], keepdims=1}  # se_pool
  %m2: float32[N, 16, 1, 1] = Conv(%m, %wse) {kernel_shape=[1, 1]}  # se_conv
  %e: float32[N, 16, 6, 6] = Mul(%g5, %m2)  # se_scale
  %c5: float32[N, 24, 6, 6] = Conv(%e, %w5) {dilations=[2, 2], kernel_shape=[3, 3], pads=[2, 2, 2, 2]}  # dil5
  %c6: float32[N, 24, 3, 3] = Conv(%c5, %w6) {group=24, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]}  # dw6
  %y: float32[N, 112, 3, 3] = Conv(%c6, %w7, %b7) {kernel_shape=[3, 3], pads=[1, 1, 1, 1]}  # conv7
}
)";

// IR text with its elided weights drawn from their names, scaled so that the values neither vanish
// nor grow through a stack of convolutions.
ir::Graph parse_scaled(const std::string& text) {
  ir::TextParseOptions options;
  options.elided = [](std::string_view key, DType, const Shape& shape) -> StatusOr<Tensor> {
    Tensor t = random_f32(shape, std::hash<std::string_view>{}(key));
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] *= 0.3f;
    return t;
  };
  auto g = ir::parse_text(text, options);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  return g.ok() ? std::move(g).value() : ir::Graph{};
}

// The stack with batch `n` ("N" -> n).
ir::Graph stack(const std::string& n) {
  std::string text = kStack;
  for (size_t at = 0; (at = text.find("[N,", at)) != std::string::npos; at += n.size()) {
    text.replace(at + 1, 1, n);
  }
  return parse_scaled(text);
}

// The engine's y for x on each thread count matches g's nodes run one by one on the reference
// kernels, and every thread count gives the first one's bits.
void expect_nodes_bitwise_over_threads(const Engine& engine, const ir::Graph& g, const Tensor& x,
                                       std::initializer_list<int> thread_counts,
                                       const std::string& what) {
  const std::map<int, Tensor> ref = run_unfused(g, x);
  const Tensor& want = ref.at(g.find_value("y"));
  std::vector<Tensor> got;
  for (int threads : thread_counts) {
    auto ctx = engine.create_execution_context();
    ASSERT_TRUE(ctx.ok());
    (*ctx)->set_cpu_threads(threads);
    auto out = (*ctx)->run({{"x", x}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    got.push_back(out->at("y"));
    ErrorStats e = error_stats(got.back(), want);
    EXPECT_LE(e.max_abs, 1e-5 * std::max(1.0, e.ref_max_abs))
        << what << ", " << threads << " threads (reference max " << e.ref_max_abs << ")";
    EXPECT_GT(e.ref_max_abs, 0.1) << "a degenerate stack checks nothing";
  }
  for (size_t t = 1; t < got.size(); ++t) {
    EXPECT_EQ(std::memcmp(got[0].data(), got[t].data(), size_t(got[0].nbytes())), 0)
        << what << ": " << *thread_counts.begin() << " and " << *(thread_counts.begin() + t)
        << " threads differ";
  }
}

int count_nodes(const Engine& e, const std::string& op, const std::string& layout) {
  int n = 0;
  for (const ir::Node& node : e.plan().graph.nodes) {
    auto l = node.attrs.get_string("layout", "");
    n += node.op_type == op && l.ok() && *l == layout;
  }
  return n;
}

TEST(CpuNhwc, ConvStackMatchesTheNodesOnTheReferenceKernels) {
  auto engine = build_cpu(stack("N"), {1, 8, 12, 12}, {3, 8, 12, 12});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  // Every conv in NHWC, two layout changes left (X in and Y out).
  EXPECT_EQ(count_nodes(*engine, "FusedConv", "NHWC"), 9);
  EXPECT_EQ(count_nodes(*engine, "Conv", ""), 0);
  int transposes = 0;
  for (const ir::Node& node : engine->plan().graph.nodes) transposes += node.op_type == "Transpose";
  EXPECT_EQ(transposes, 2);
  for (int64_t n : {1, 3}) {
    expect_nodes_bitwise_over_threads(*engine, stack(std::to_string(n)),
                                      random_f32({n, 8, 12, 12}, 7 + uint64_t(n)), {1, 2},
                                      "batch " + std::to_string(n));
  }
}

TEST(CpuNhwc, ALoneConvStaysNchw) {
  // One conv in NHWC needs two transposes: more passes over memory than it saves on the CPU.
  const char* one = R"(graph g(%x: float32[1, 8, 12, 12]) -> (%y: float32[1, 16, 12, 12]) {
  opset ai.onnx 17
  %w: float32[16, 8, 3, 3] = dense<0.1>
  %y: float32[1, 16, 12, 12] = Conv(%x, %w) {kernel_shape=[3, 3], pads=[1, 1, 1, 1]}  # conv
}
)";
  auto g = ir::parse_text(one, {});
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  auto engine = build_cpu(*g, {1, 8, 12, 12}, {1, 8, 12, 12});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ(engine->num_layers(), 1);
  EXPECT_EQ(count_nodes(*engine, "FusedConv", "NHWC"), 0);
}

// 1x1 convs on a 28x28 map, each over a million multiply-adds but one GEMM tile: their pixels are
// split evenly over the threads (small_n convs and packed ones), and every thread count gives the
// same bits, which match the nodes run one by one.
TEST(CpuNhwc, FewTilesSplitOverTheThreadsWithTheSameBits) {
  // Eight convs, so the CPU takes NHWC with its two transposes (X in, Y out).
  const int64_t ch[] = {32, 48, 128, 40, 64, 48, 96, 40, 64};
  std::string text =
      "graph g(%x: float32[1, 32, 28, 28]) -> (%y: float32[1, 64, 28, 28]) {\n"
      "  opset ai.onnx 17\n";
  std::string prev = "x";
  for (int i = 1; i <= 8; ++i) {
    const std::string in = std::to_string(ch[i - 1]), out = std::to_string(ch[i]);
    const std::string w = "w" + std::to_string(i), c = i == 8 ? "y" : "c" + std::to_string(i);
    text += "  %" + w + ": float32[" + out + ", " + in + ", 1, 1] = dense<...>\n";
    text += "  %" + c + ": float32[1, " + out + ", 28, 28] = Conv(%" + prev + ", %" + w +
            ") {kernel_shape=[1, 1]}  # " + c + "\n";
    prev = c;
  }
  text += "}\n";
  const ir::Graph g = parse_scaled(text);
  auto engine = build_cpu(g, {1, 32, 28, 28}, {1, 32, 28, 28});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ(count_nodes(*engine, "FusedConv", "NHWC"), 8);
  expect_nodes_bitwise_over_threads(*engine, g, random_f32({1, 32, 28, 28}, 5), {1, 2, 3},
                                    "eight 1x1 convs");
}

// The layout's input Transpose (NCHW -> NHWC) of an image of 2, 3 or 4 channels interleaves the
// planes (a vectorized loop of its own); 5 channels take the tiled loop. Both move every element
// to its place: checked element by element at batch 2 and odd sizes.
TEST(CpuNhwc, InputTransposeInterleavesThePlanes) {
  for (int64_t c : {2, 3, 4, 5}) {
    const std::string cs = std::to_string(c);
    const std::string text = "graph g(%x: float32[N, " + cs + ", 5, 7]) -> (%y: float32[N, 5, 7, " +
                             cs +
                             "]) {\n  opset ai.onnx 17\n"
                             "  %y: float32[N, 5, 7, " +
                             cs + "] = Transpose(%x) {perm=[0, 2, 3, 1]}  # t\n}\n";
    auto g = ir::parse_text(text, {});
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    auto engine = build_cpu(*g, {1, c, 5, 7}, {2, c, 5, 7});
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    auto ctx = engine->create_execution_context();
    ASSERT_TRUE(ctx.ok());
    Tensor x = random_f32({2, c, 5, 7}, 11 + uint64_t(c));
    auto out = (*ctx)->run({{"x", x}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    const Tensor& y = out->at("y");
    ASSERT_EQ(y.shape(), (Shape{2, 5, 7, c}));
    const float* xp = x.data_as<float>();
    const float* yp = y.data_as<float>();
    int64_t wrong = 0;
    for (int64_t n = 0; n < 2; ++n) {
      for (int64_t p = 0; p < 35; ++p) {
        for (int64_t ch = 0; ch < c; ++ch) {
          wrong += yp[(n * 35 + p) * c + ch] != xp[(n * c + ch) * 35 + p];
        }
      }
    }
    EXPECT_EQ(wrong, 0) << c << " channels";
  }
}

// Transposes large enough to split over the threads (ViT's patch tokens [4, 192, 196] swapped, the
// in-projection's [1, 197, 4, 3, 192] heads moved first, a 3-channel image to channels-last in
// runs of pixels, odd tiles): every element lands where the permutation puts it on 1, 2 and 3
// threads.
TEST(CpuNhwc, LargeTransposesSplitOverTheThreadsMoveEveryElement) {
  struct Case {
    Shape in;
    std::vector<int64_t> perm;
  };
  for (const Case& c : {Case{{4, 192, 196}, {0, 2, 1}}, Case{{1, 197, 4, 3, 192}, {3, 1, 2, 0, 4}},
                        Case{{2, 3, 150, 301}, {0, 2, 3, 1}}, Case{{3, 70, 190}, {2, 0, 1}}}) {
    const int r = int(c.in.size());
    Shape out(c.in.size());
    std::string dims, odims, perm;
    for (int k = 0; k < r; ++k) {
      out[size_t(k)] = c.in[size_t(c.perm[size_t(k)])];
      dims += (k ? ", " : "") + std::to_string(c.in[size_t(k)]);
      odims += (k ? ", " : "") + std::to_string(out[size_t(k)]);
      perm += (k ? ", " : "") + std::to_string(c.perm[size_t(k)]);
    }
    const std::string text = "graph g(%x: float32[" + dims + "]) -> (%y: float32[" + odims +
                             "]) {\n  opset ai.onnx 17\n  %y: float32[" + odims +
                             "] = Transpose(%x) {perm=[" + perm + "]}  # t\n}\n";
    auto g = ir::parse_text(text, {});
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    auto engine = build_cpu(*g, c.in, c.in);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    const Tensor x = random_f32(c.in, 31);
    // The source offset of each output element, walked in output order.
    std::vector<int64_t> in_stride(size_t(r), 1);
    for (int k = r - 2; k >= 0; --k)
      in_stride[size_t(k)] = in_stride[size_t(k + 1)] * c.in[size_t(k + 1)];
    for (int threads : {1, 2, 3}) {
      auto ctx = engine->create_execution_context();
      ASSERT_TRUE(ctx.ok());
      (*ctx)->set_cpu_threads(threads);
      auto y = (*ctx)->run({{"x", x}});
      ASSERT_TRUE(y.ok()) << y.status().to_string();
      const float* xp = x.data_as<float>();
      const float* yp = y->at("y").data_as<float>();
      std::vector<int64_t> idx(size_t(r), 0);
      int64_t wrong = 0;
      for (int64_t e = 0; e < x.numel(); ++e) {
        int64_t src = 0;
        for (int k = 0; k < r; ++k) src += idx[size_t(k)] * in_stride[size_t(c.perm[size_t(k)])];
        wrong += yp[e] != xp[src];
        for (int k = r - 1; k >= 0; --k) {
          if (++idx[size_t(k)] < out[size_t(k)]) break;
          idx[size_t(k)] = 0;
        }
      }
      EXPECT_EQ(wrong, 0) << text << threads << " threads";
    }
  }
}

}  // namespace
}  // namespace kiln::testing
