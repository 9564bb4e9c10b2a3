// If with a condition known at build time (issue 15, item 3, first part): exporters branch on a
// tensor's rank or size, or on a constant; the builder runs such an If as the branch it takes, its
// nodes inlined in place, so nothing of the If is left at run time. An If whose condition is data
// is refused with the reason.
#include <gtest/gtest.h>

#include <string>

#include "ir/text.h"
#include "kiln.h"
#include "model_util.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

StatusOr<Engine> build(const std::string& text) {
  Network net;
  KILN_ASSIGN_OR_RETURN(net.graph, ir::parse_text(text, {}));
  BuilderConfig config;
  OptimizationProfile p;
  KILN_RETURN_IF_ERROR(p.set_dimensions("x", {1, 4}, {2, 4}, {8, 4}));
  config.add_profile(p);
  return Builder().build(net, config);
}

// x's rank decides: 2 takes then (Relu), anything else Neg. The else branch also passes x through.
const char* kByRank = R"(graph g(%x: float32[n, 4]) -> (%y: float32[?], %z: float32[?]) {
  %two: int64[] = dense<2>
  %s: int64[?] = Shape(%x)  # shape
  %r: int64[?] = Size(%s)  # rank
  %c: bool[?] = Equal(%r, %two)  # is_matrix
  %y: float32[?], %z: float32[?] = If(%c) {else_branch=graph else_body() -> (%e: float32[?], %x: float32[?]) {
    %e: float32[?] = Neg(%x)  # neg
  }, then_branch=graph then_body() -> (%t: float32[?], %k: float32[1]) {
    %k: float32[1] = dense<3.0>
    %t: float32[?] = Relu(%x)  # relu
  }}  # branch
}
)";

TEST(ControlFlow, AnIfOnTheRankRunsAsTheBranchItTakes) {
  auto engine = build(kByRank);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  bool relu = false;
  for (const LayerInfo& l : engine->layers()) {
    EXPECT_NE(l.op_type, "If");
    EXPECT_NE(l.op_type, "Neg") << "the branch not taken is gone";
    relu |= l.op_type == "Relu" && l.name == "branch/relu";
  }
  EXPECT_TRUE(relu);
  auto ctx = engine->create_execution_context();
  ASSERT_TRUE(ctx.ok());
  Tensor x = random_f32({3, 4}, 5);
  auto out = (*ctx)->run({{"x", x}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->at("y").shape(), (Shape{3, 4}));
  for (int64_t i = 0; i < 12; ++i) {
    EXPECT_EQ(out->at("y").data_as<float>()[i], std::max(x.data_as<float>()[i], 0.f)) << i;
  }
  ASSERT_EQ(out->at("z").shape(), (Shape{1}));
  EXPECT_EQ(out->at("z").data_as<float>()[0], 3.f);
}

TEST(ControlFlow, AnIfOnDataIsRefusedWithTheReason) {
  auto engine = build(R"(graph g(%x: float32[n, 4], %c: bool[]) -> (%y: float32[?]) {
  %y: float32[?] = If(%c) {else_branch=graph else_body() -> (%e: float32[?]) {
    %e: float32[?] = Neg(%x)  # neg
  }, then_branch=graph then_body() -> (%t: float32[?]) {
    %t: float32[?] = Relu(%x)  # relu
  }}  # branch
}
)");
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("its condition ('c') is computed from tensor data at run time"),
            std::string::npos)
      << engine.status().message();
}

}  // namespace
}  // namespace kiln::testing
