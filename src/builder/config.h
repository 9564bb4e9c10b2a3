// Builder configuration: optimization profiles, the precision policy, the optimization level and
// the timing cache, named as in TensorRT.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "builder/timing_cache.h"
#include "core/precision.h"
#include "core/status.h"
#include "core/tensor.h"

namespace kiln {

class OptimizationProfile {
 public:
  // Shapes of one input; min <= opt <= max elementwise, checked when the engine is built.
  Status set_dimensions(const std::string& input, std::vector<int64_t> min,
                        std::vector<int64_t> opt, std::vector<int64_t> max);
  // The same with a step per dim (1: every value): a dim of step k takes the values min, min + k,
  // ..., max only, so opt and max must be min plus a multiple of k. The build proves the model
  // for exactly those values (an FPN valid for multiples of 32 builds for 64..960 step 32), and
  // set_input_shape refuses a shape off the steps, naming the dim, the value and the step.
  // Profiles that step a dim must agree on its steps (the engine has one formula per input dim).
  Status set_dimensions(const std::string& input, std::vector<int64_t> min,
                        std::vector<int64_t> opt, std::vector<int64_t> max,
                        std::vector<int64_t> steps);
  struct Dims {
    std::vector<int64_t> min, opt, max;
    std::vector<int64_t> steps;  // empty, or one per dim (1: every value)
  };
  const std::map<std::string, Dims>& inputs() const { return inputs_; }

  // Shape-value inputs (TensorRT's shape tensors): an integer or bool input whose values decide
  // shapes (a Reshape target, Resize sizes, Pad pads, Slice starts, Range limits, TopK's K) is
  // given at run time, each element between its min and max here (its host memory is bound with
  // set_tensor_address; run() takes it as any input). The build treats each element whose min and
  // max differ as a symbol ranging over [min, max] (the profile proof covers every value), and one
  // whose min equals its max in every profile as that number; the run checks the values given
  // against the profile and refuses others by name. The input's shape must be fixed by the model,
  // with at most 64 elements. Every profile of an engine gives values for the same inputs.
  Status set_shape_values(const std::string& input, std::vector<int64_t> min,
                          std::vector<int64_t> opt, std::vector<int64_t> max);
  // The one value an input of any dtype takes (Resize's float scales, Range's float limits, a bool
  // flag): the engine is built for exactly it, and a run given another is refused. A host tensor
  // of the input's dtype and shape.
  Status set_shape_values(const std::string& input, Tensor value);
  struct Values {
    std::vector<int64_t> min, opt, max;  // per element (integer and bool inputs)
    std::optional<Tensor> fixed;         // or the one value, of any dtype
  };
  const std::map<std::string, Values>& shape_values() const { return values_; }

 private:
  std::map<std::string, Dims> inputs_;
  std::map<std::string, Values> values_;
};

// The tensor that element `index` of sequence input or output `sequence` is ("xs[0]"), as
// BuilderConfig::set_sequence_length lays sequences out.
inline std::string sequence_element_name(const std::string& sequence, int64_t index) {
  return sequence + "[" + std::to_string(index) + "]";
}

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

  // How hard implementations may search, 0..5 (TensorRT's builder optimization level; default 3).
  // At 0 each implementation takes its heuristic first choice without timing; from 1 on it may
  // time its candidates on the device (the CUDA convolution does). kInvalidArgument outside 0..5.
  static constexpr int kMaxOptimizationLevel = 5;
  Status set_builder_optimization_level(int level);
  int builder_optimization_level() const { return optimization_level_; }

  // The cache the build reads tactics from and records new choices in (TensorRT's
  // IBuilderConfig::setTimingCache). nullptr, the default: every build ranks tactics afresh. A
  // cache is used by one build at a time.
  void set_timing_cache(std::shared_ptr<TimingCache> cache) { timing_cache_ = std::move(cache); }
  TimingCache* timing_cache() const { return timing_cache_.get(); }

  // A verbose log of the shape work, for debugging dynamic shapes (`kiln build --verbose`): each
  // profile's symbol ranges, every node's symbolic input and output shapes after inference, and
  // each constraint the profile proof checked with how it was settled (by intervals, or by
  // enumerating N points). One call per line; unset (the default), nothing is formatted.
  using ShapeLog = std::function<void(const std::string& line)>;
  void set_shape_log(ShapeLog log) { shape_log_ = std::move(log); }
  const ShapeLog& shape_log() const { return shape_log_; }

  // The IR after build passes (`kiln build --dumpIR`): after each pass `passes` names (every pass
  // when it is empty), the pass's name and the graph's text form (ir::to_text). Unset (the
  // default), nothing is printed. A name that is no pass of the pipeline is refused by the build.
  using IrDump = std::function<void(const std::string& pass, const std::string& ir_text)>;
  void set_ir_dump(std::vector<std::string> passes, IrDump dump) {
    ir_dump_passes_ = std::move(passes);
    ir_dump_ = std::move(dump);
  }
  const IrDump& ir_dump() const { return ir_dump_; }
  const std::vector<std::string>& ir_dump_passes() const { return ir_dump_passes_; }

  // Sequence and optional inputs (ONNX's sequence(tensor) and optional(...) types) are laid out at
  // build time as the tensors they hold (builder/sequences.cc), the same in every profile:
  // - a sequence input `s` of length n is the tensor inputs "s[0]" .. "s[n-1]", each element its
  //   own shape (profiles give dynamic ones under those names);
  // - an optional input is present unless set absent here: a tensor input of its name (or, for an
  //   optional sequence, the elements as above); an absent one has no input at all.
  // Outputs are named the same way: a sequence output `y` of n elements is "y[0]" .. "y[n-1]", a
  // present optional tensor `y` is "y", and an empty optional output has no tensor. A sequence
  // input with no length set is refused at build time, naming it. kInvalidArgument for a length
  // outside 0..kMaxSequenceLength.
  static constexpr int64_t kMaxSequenceLength = 4096;
  Status set_sequence_length(const std::string& input, int64_t length);
  const std::map<std::string, int64_t>& sequence_lengths() const { return sequence_lengths_; }
  void set_optional_present(const std::string& input, bool present) {
    optional_present_[input] = present;
  }
  const std::map<std::string, bool>& optional_present() const { return optional_present_; }

 private:
  uint32_t flags_ = 0;
  std::vector<OptimizationProfile> profiles_;
  int optimization_level_ = 3;
  std::shared_ptr<TimingCache> timing_cache_;
  ShapeLog shape_log_;
  IrDump ir_dump_;
  std::vector<std::string> ir_dump_passes_;
  std::map<std::string, int64_t> sequence_lengths_;
  std::map<std::string, bool> optional_present_;
};

}  // namespace kiln
