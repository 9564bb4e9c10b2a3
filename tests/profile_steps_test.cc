// Profiles with steps (issue 15, item 4): a model valid only for even H (a stride-2 pool whose
// output is stacked back to H rows and added to the input, as an FPN adds upsampled maps to its
// lateral ones) is refused over H in 64..96, builds with a step of 2 or 32, runs on the steps
// with exact outputs, and refuses a shape off them naming the dim, the value and the step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "ir/text.h"
#include "kiln.h"
#include "model_util.h"

namespace kiln::testing {
namespace {

// y = x + concat(p, p) along H, p = MaxPool 2x1 stride 2 of x: [1, 1, 2*floor(h/2), 4] must
// equal x's [1, 1, h, 4], so h must be even.
const char* kEvenOnly = R"(graph g(%x: float32[1, 1, h, 4]) -> (%y: float32[?]) {
  %p: float32[?] = MaxPool(%x) {kernel_shape=[2, 1], strides=[2, 1]}  # pool
  %c: float32[?] = Concat(%p, %p) {axis=2}  # stack
  %y: float32[?] = Add(%x, %c)  # add
}
)";

Network even_only() {
  Network net;
  auto g = ir::parse_text(kEvenOnly, {});
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  if (g.ok()) net.graph = std::move(g).value();
  return net;
}

StatusOr<Engine> build(int64_t lo, int64_t opt, int64_t hi, int64_t step,
                       std::vector<std::string>* log = nullptr) {
  BuilderConfig config;
  OptimizationProfile p;
  Status st = step == 1 ? p.set_dimensions("x", {1, 1, lo, 4}, {1, 1, opt, 4}, {1, 1, hi, 4})
                        : p.set_dimensions("x", {1, 1, lo, 4}, {1, 1, opt, 4}, {1, 1, hi, 4},
                                           {1, 1, step, 1});
  if (!st.ok()) return st;
  config.add_profile(p);
  if (log) config.set_shape_log([log](const std::string& line) { log->push_back(line); });
  return Builder().build(even_only(), config);
}

TEST(ProfileSteps, AnEvenOnlyModelBuildsOnItsStepsAndRefusesShapesOffThem) {
  // Every H: odd ones break the Add, and the proof says so.
  auto refused = build(64, 64, 96, 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("add"), std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("(every 2nd value)"), std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find(
                "which values pass repeats every 2: a profile that steps h by 2 from 64"),
            std::string::npos)
      << refused.status().message();
  std::printf("[ info ] without steps: %s\n", refused.status().message().c_str());

  for (int64_t step : {2, 32}) {
    std::vector<std::string> log;
    auto engine = build(64, 64, 96, step, &log);
    ASSERT_TRUE(engine.ok()) << "step " << step << ": " << engine.status().to_string();
    bool logged = false;
    for (const auto& line : log)
      logged |= line.find("steps: h = " + std::to_string(step) + "*h_step") == 0;
    EXPECT_TRUE(logged) << "the shape log names the stepped symbol";
    auto ctx = engine->create_execution_context();
    ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
    for (int64_t h = 64; h <= 96; h += step) {
      Tensor x = random_f32({1, 1, h, 4}, uint64_t(h));
      auto out = (*ctx)->run({{"x", x}});
      ASSERT_TRUE(out.ok()) << "h " << h << ": " << out.status().to_string();
      const Tensor& y = out->at("y");
      ASSERT_EQ(y.shape(), (Shape{1, 1, h, 4})) << "h " << h;
      const float* xs = x.data_as<float>();
      const float* ys = y.data_as<float>();
      for (int64_t r = 0; r < h; ++r) {
        const int64_t pr = r % (h / 2);  // the stacked copies of the pooled rows
        for (int64_t c = 0; c < 4; ++c) {
          const float pooled = std::max(xs[(2 * pr) * 4 + c], xs[(2 * pr + 1) * 4 + c]);
          ASSERT_FLOAT_EQ(ys[r * 4 + c], xs[r * 4 + c] + pooled) << "h " << h << " row " << r;
        }
      }
    }
    // Inside [64, 96] but off the steps: refused by name, with the step and the nearest values.
    Status off = (*ctx)->set_input_shape("x", {1, 1, 65, 4});
    ASSERT_FALSE(off.ok()) << "step " << step;
    const std::string msg = off.message();
    std::printf("[ info ] step %lld, h 65: %s\n", static_cast<long long>(step), msg.c_str());
    EXPECT_NE(msg.find("input 'x' dim 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("= 65"), std::string::npos) << msg;
    EXPECT_NE(msg.find("steps of " + std::to_string(step)), std::string::npos) << msg;
    EXPECT_NE(msg.find("64 and " + std::to_string(64 + step)), std::string::npos) << msg;
  }
}

TEST(ProfileSteps, BadStepsAreRefusedByName) {
  OptimizationProfile p;
  Status st = p.set_dimensions("x", {1, 1, 64, 4}, {1, 1, 80, 4}, {1, 1, 960, 4}, {1, 1, 32, 1});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(
                "opt 80 is not min 64 plus a multiple of the step 32 (the nearest are 64 and 96)"),
            std::string::npos)
      << st.message();
  st = p.set_dimensions("x", {1, 1, 64, 4}, {1, 1, 64, 4}, {1, 1, 100, 4}, {1, 1, 32, 1});
  EXPECT_NE(st.message().find("max 100"), std::string::npos) << st.message();
  st = p.set_dimensions("x", {1, 1, 64, 4}, {1, 1, 64, 4}, {1, 1, 64, 4}, {1, 1, 32, 1});
  EXPECT_NE(st.message().find("step 32 is larger than the range max - min = 0"), std::string::npos)
      << st.message();
  st = p.set_dimensions("x", {1, 1, 64, 4}, {1, 1, 64, 4}, {1, 1, 96, 4}, {1, 1, 0, 1});
  EXPECT_NE(st.message().find("step 0 is not positive"), std::string::npos) << st.message();
  st = p.set_dimensions("x", {1, 1, 64, 4}, {1, 1, 64, 4}, {1, 1, 96, 4}, {1, 32});
  EXPECT_NE(st.message().find("2 steps for a rank of 4"), std::string::npos) << st.message();

  // A step on a dim the model fixes.
  BuilderConfig fixed;
  OptimizationProfile f;
  ASSERT_TRUE(
      f.set_dimensions("x", {1, 1, 64, 2}, {1, 1, 64, 4}, {1, 1, 96, 8}, {1, 1, 32, 2}).ok());
  fixed.add_profile(f);
  auto e = Builder().build(even_only(), fixed);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("dim 3 (4) is fixed by the model; it takes no step"),
            std::string::npos)
      << e.status().message();

  // Two profiles that step h differently: the engine has one formula for x's dim 2.
  BuilderConfig two;
  OptimizationProfile a, b;
  ASSERT_TRUE(
      a.set_dimensions("x", {1, 1, 64, 4}, {1, 1, 64, 4}, {1, 1, 96, 4}, {1, 1, 32, 1}).ok());
  ASSERT_TRUE(b.set_dimensions("x", {1, 1, 128, 4}, {1, 1, 128, 4}, {1, 1, 192, 4}).ok());
  two.add_profile(a);
  two.add_profile(b);
  e = Builder().build(even_only(), two);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("every profile must give a symbol the same steps"),
            std::string::npos)
      << e.status().message();
}

}  // namespace
}  // namespace kiln::testing
