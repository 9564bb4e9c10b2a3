// OptimizationProfile and BuilderConfig validation.
#include "builder/config.h"

#include "core/tensor.h"

namespace kiln {

Status OptimizationProfile::set_dimensions(const std::string& input, std::vector<int64_t> min,
                                           std::vector<int64_t> opt, std::vector<int64_t> max) {
  if (min.size() != opt.size() || opt.size() != max.size()) {
    return invalid_argument("profile for input '" + input + "': min, opt and max have different ranks (" +
                            std::to_string(min.size()) + ", " + std::to_string(opt.size()) + ", " +
                            std::to_string(max.size()) + ")");
  }
  for (size_t d = 0; d < min.size(); ++d) {
    if (min[d] < 0 || !(min[d] <= opt[d] && opt[d] <= max[d])) {
      return invalid_argument("profile for input '" + input + "' dim " + std::to_string(d) +
                              ": need 0 <= min <= opt <= max, got min " + std::to_string(min[d]) +
                              ", opt " + std::to_string(opt[d]) + ", max " + std::to_string(max[d]));
    }
  }
  inputs_[input] = Dims{std::move(min), std::move(opt), std::move(max)};
  return ok_status();
}

Status BuilderConfig::set_builder_optimization_level(int level) {
  if (level < 0 || level > kMaxOptimizationLevel) {
    return invalid_argument("builder optimization level " + std::to_string(level) +
                            " is outside 0.." + std::to_string(kMaxOptimizationLevel));
  }
  optimization_level_ = level;
  return ok_status();
}

}  // namespace kiln
