// select_kernels' choice between implementations that all run a node (builder::weigh_rivals): the
// fastest by their measured times at the opt and min shapes, the registry's order where the
// preferred one measures nothing. The CUDA side (cuDNN's graph convolution against our depthwise
// kernels, the timing cache's entry) is CudaDepthwise.BuilderWeighsCudnnAgainstOurKernels.
#include <gtest/gtest.h>

#include "backends/kernel_registry.h"
#include "builder/build_state.h"
#include "ir/graph.h"

namespace kiln::testing {
namespace {

// An implementation that supports everything and reports fixed timed tactics.
class Timed final : public backends::KernelImpl {
 public:
  Timed(std::string id, std::vector<backends::TimedTactic> timed)
      : id_(std::move(id)), timed_(std::move(timed)) {}
  const std::string& id() const override { return id_; }
  Device device() const override { return Device::kCPU; }
  Status supports(const backends::KernelQuery&) const override { return ok_status(); }
  std::vector<backends::TimedTactic> timed_tactics(const backends::KernelQuery&) const override {
    return timed_;
  }
  StatusOr<std::unique_ptr<backends::Kernel>> instantiate(
      const backends::KernelQuery&, std::shared_ptr<const backends::PreparedNode>) const override {
    return unsupported("a test double runs nothing");
  }

 private:
  std::string id_;
  std::vector<backends::TimedTactic> timed_;
};

std::optional<std::pair<size_t, std::string>> weigh(const std::vector<const Timed*>& impls) {
  ir::Node node;
  node.op_type = "Conv";
  backends::KernelQuery q{node, {}, {}, PrecisionPolicy{}};
  std::vector<const backends::KernelImpl*> rivals(impls.begin(), impls.end());
  return builder::weigh_rivals(rivals, q);
}

TEST(WeighRivals, TheFastestAtTheOptShapesWinsWhereNoneTimedTheMinShapes) {
  Timed ours("ours", {{"strip", 0.050, -1}, {"pixel", 0.060, -1}});
  Timed cudnn("cudnn", {{"engine=8", 0.030, -1}});
  auto won = weigh({&ours, &cudnn});
  ASSERT_TRUE(won.has_value());
  EXPECT_EQ(won->first, 1u);
  EXPECT_EQ(won->second, "engine=8");
  // Swapped in the registry's order, the same one wins.
  won = weigh({&cudnn, &ours});
  ASSERT_TRUE(won.has_value());
  EXPECT_EQ(won->first, 0u);
}

TEST(WeighRivals, TheMinShapesCountWhereEveryRivalTimedThem) {
  // 10% faster at the opt batch but 40% slower at the min batch: 1.0 + 1.4 against 1.1 + 1.0.
  Timed ours("ours", {{"pixel", 0.055, 0.010}});
  Timed cudnn("cudnn", {{"engine=57 | below=8 engine=0", 0.050, 0.014}});
  auto won = weigh({&ours, &cudnn});
  ASSERT_TRUE(won.has_value());
  EXPECT_EQ(won->first, 0u);
  EXPECT_EQ(won->second, "pixel");
  // One rival without min-shape times: the opt shapes alone decide.
  Timed cudnn_opt_only("cudnn", {{"engine=57", 0.050, -1}});
  won = weigh({&ours, &cudnn_opt_only});
  ASSERT_TRUE(won.has_value());
  EXPECT_EQ(won->first, 1u);
}

TEST(WeighRivals, ATieGoesToTheEarlierAndUntimedRivalsAreLeftOut) {
  Timed a("a", {{"x", 0.040, 0.010}});
  Timed b("b", {{"y", 0.040, 0.010}});
  Timed untimed("c", {});
  auto won = weigh({&a, &untimed, &b});
  ASSERT_TRUE(won.has_value());
  EXPECT_EQ(won->first, 0u);
  EXPECT_EQ(won->second, "x");
  // Alone with untimed rivals, the first keeps its own fastest tactic.
  won = weigh({&a, &untimed});
  ASSERT_TRUE(won.has_value());
  EXPECT_EQ(won->first, 0u);
}

TEST(WeighRivals, NothingIsWeighedWhereThePreferredOneTimesNothing) {
  Timed untimed("first", {});
  Timed fast("second", {{"engine=1", 0.001, 0.001}});
  EXPECT_FALSE(weigh({&untimed, &fast}).has_value());
  // A tactic whose opt time failed (negative) counts as untimed.
  Timed failed("first", {{"pixel", -1, -1}});
  EXPECT_FALSE(weigh({&failed, &fast}).has_value());
}

}  // namespace
}  // namespace kiln::testing
