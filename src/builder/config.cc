// OptimizationProfile and BuilderConfig validation.
#include "builder/config.h"

#include "core/tensor.h"

namespace kiln {

Status OptimizationProfile::set_dimensions(const std::string& input, std::vector<int64_t> min,
                                           std::vector<int64_t> opt, std::vector<int64_t> max) {
  if (min.size() != opt.size() || opt.size() != max.size()) {
    return invalid_argument("profile for input '" + input +
                            "': min, opt and max have different ranks (" +
                            std::to_string(min.size()) + ", " + std::to_string(opt.size()) + ", " +
                            std::to_string(max.size()) + ")");
  }
  for (size_t d = 0; d < min.size(); ++d) {
    if (min[d] < 0 || !(min[d] <= opt[d] && opt[d] <= max[d])) {
      return invalid_argument("profile for input '" + input + "' dim " + std::to_string(d) +
                              ": need 0 <= min <= opt <= max, got min " + std::to_string(min[d]) +
                              ", opt " + std::to_string(opt[d]) + ", max " +
                              std::to_string(max[d]));
    }
  }
  inputs_[input] = Dims{std::move(min), std::move(opt), std::move(max), {}};
  return ok_status();
}

Status OptimizationProfile::set_dimensions(const std::string& input, std::vector<int64_t> min,
                                           std::vector<int64_t> opt, std::vector<int64_t> max,
                                           std::vector<int64_t> steps) {
  OptimizationProfile ranges;  // ranks and 0 <= min <= opt <= max first
  KILN_RETURN_IF_ERROR(ranges.set_dimensions(input, min, opt, max));
  if (steps.size() != min.size()) {
    return invalid_argument("profile for input '" + input + "': " + std::to_string(steps.size()) +
                            " steps for a rank of " + std::to_string(min.size()));
  }
  for (size_t d = 0; d < steps.size(); ++d) {
    const std::string where = "profile for input '" + input + "' dim " + std::to_string(d);
    if (steps[d] < 1)
      return invalid_argument(where + ": step " + std::to_string(steps[d]) + " is not positive");
    if (steps[d] > 1 && steps[d] > max[d] - min[d]) {
      return invalid_argument(
          where + ": step " + std::to_string(steps[d]) +
          " is larger than the range max - min = " + std::to_string(max[d] - min[d]));
    }
    for (auto [name, v] : {std::pair<const char*, int64_t>{"opt", opt[d]}, {"max", max[d]}}) {
      if ((v - min[d]) % steps[d] != 0) {
        return invalid_argument(where + ": " + name + " " + std::to_string(v) + " is not min " +
                                std::to_string(min[d]) + " plus a multiple of the step " +
                                std::to_string(steps[d]) + " (the nearest are " +
                                std::to_string(v - (v - min[d]) % steps[d]) + " and " +
                                std::to_string(v - (v - min[d]) % steps[d] + steps[d]) + ")");
      }
    }
  }
  bool any = false;
  for (int64_t k : steps) any |= k != 1;
  inputs_[input] = Dims{std::move(min), std::move(opt), std::move(max),
                        any ? std::move(steps) : std::vector<int64_t>{}};
  return ok_status();
}

Status OptimizationProfile::set_shape_values(const std::string& input, std::vector<int64_t> min,
                                             std::vector<int64_t> opt, std::vector<int64_t> max) {
  if (min.size() != opt.size() || opt.size() != max.size()) {
    return invalid_argument("shape values for input '" + input +
                            "': min, opt and max have different lengths (" +
                            std::to_string(min.size()) + ", " + std::to_string(opt.size()) + ", " +
                            std::to_string(max.size()) + ")");
  }
  for (size_t i = 0; i < min.size(); ++i) {
    if (!(min[i] <= opt[i] && opt[i] <= max[i])) {
      return invalid_argument("shape values for input '" + input + "' element " +
                              std::to_string(i) + ": need min <= opt <= max, got min " +
                              std::to_string(min[i]) + ", opt " + std::to_string(opt[i]) +
                              ", max " + std::to_string(max[i]));
    }
  }
  values_[input] = Values{std::move(min), std::move(opt), std::move(max), std::nullopt};
  return ok_status();
}

Status OptimizationProfile::set_shape_values(const std::string& input, Tensor value) {
  if (dtype_size(value.dtype()) == 0) {
    return invalid_argument("shape values for input '" + input + "': a tensor of dtype " +
                            std::string(dtype_name(value.dtype())) + " has no fixed-size elements");
  }
  values_[input] = Values{{}, {}, {}, std::move(value)};
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

Status BuilderConfig::set_sequence_length(const std::string& input, int64_t length) {
  if (length < 0 || length > kMaxSequenceLength) {
    return invalid_argument("sequence input '" + input + "': length " + std::to_string(length) +
                            " is outside 0.." + std::to_string(kMaxSequenceLength));
  }
  sequence_lengths_[input] = length;
  return ok_status();
}

}  // namespace kiln
