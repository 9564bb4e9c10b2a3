// Builder configuration: optimization profiles and the precision policy, named as in TensorRT.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/precision.h"
#include "core/status.h"

namespace kiln {

enum class OptProfileSelector { kMIN = 0, kOPT = 1, kMAX = 2 };

class OptimizationProfile {
 public:
  // Shapes of one input; min <= opt <= max elementwise, checked when the engine is built.
  Status set_dimensions(const std::string& input, std::vector<int64_t> min, std::vector<int64_t> opt,
                        std::vector<int64_t> max);
  struct Dims {
    std::vector<int64_t> min, opt, max;
  };
  const std::map<std::string, Dims>& inputs() const { return inputs_; }

 private:
  std::map<std::string, Dims> inputs_;
};

class BuilderConfig {
 public:
  BuilderConfig() { set_flag(BuilderFlag::kTF32); }  // TF32 is on by default, as in TensorRT
  void set_flag(BuilderFlag f) { flags_ |= 1u << uint32_t(f); }
  void clear_flag(BuilderFlag f) { flags_ &= ~(1u << uint32_t(f)); }
  bool get_flag(BuilderFlag f) const { return flags_ & (1u << uint32_t(f)); }
  uint32_t flags() const { return flags_; }
  // The flags decoded: the one place the bits become a policy.
  PrecisionPolicy precision() const { return PrecisionPolicy::from_flags(flags_); }
  void add_profile(OptimizationProfile p) { profiles_.push_back(std::move(p)); }
  const std::vector<OptimizationProfile>& profiles() const { return profiles_; }

 private:
  uint32_t flags_ = 0;
  std::vector<OptimizationProfile> profiles_;
};

}  // namespace kiln
