// Precision as data: the policy a build runs under (decoded from the builder flags in one place)
// and the precision each node was assigned, which the plan records and inspect/compare read.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace kiln {

// The bits of BuilderConfig::flags(); the engine header stores them as they are.
enum class BuilderFlag : uint32_t { kTF32 = 0, kFP16 = 1, kBF16 = 2, kINT8 = 3 };

inline constexpr uint32_t builder_flag_bit(BuilderFlag f) { return 1u << uint32_t(f); }

// What a build may compute floating-point layers in. Strict FP32 is every flag off.
struct PrecisionPolicy {
  bool tf32 = false;  // FP32 matmul/conv may use TF32 tensor cores (FP32 storage)
  bool fp16 = false;  // layers may compute in FP16 (FP32 accumulation)
  bool bf16 = false;  // layers may compute in BF16 (FP32 accumulation)
  bool int8 = false;  // recorded; no INT8 kernels yet

  static PrecisionPolicy from_flags(uint32_t flags) {
    PrecisionPolicy p;
    p.tf32 = flags & builder_flag_bit(BuilderFlag::kTF32);
    p.fp16 = flags & builder_flag_bit(BuilderFlag::kFP16);
    p.bf16 = flags & builder_flag_bit(BuilderFlag::kBF16);
    p.int8 = flags & builder_flag_bit(BuilderFlag::kINT8);
    return p;
  }
  uint32_t to_flags() const {
    return (tf32 ? builder_flag_bit(BuilderFlag::kTF32) : 0) |
           (fp16 ? builder_flag_bit(BuilderFlag::kFP16) : 0) |
           (bf16 ? builder_flag_bit(BuilderFlag::kBF16) : 0) |
           (int8 ? builder_flag_bit(BuilderFlag::kINT8) : 0);
  }
  // The reduced float type a float32 layer computes in when the policy allows one: FP16 is
  // preferred over BF16 when both are on (as TensorRT does for --best), kFloat32 when neither is.
  DType reduced_float() const {
    return fp16 ? DType::kFloat16 : bf16 ? DType::kBFloat16 : DType::kFloat32;
  }
  // "tf32", "fp16+tf32", "strict fp32": the flags as users spell them.
  std::string to_string() const {
    std::string s;
    auto add = [&](bool on, const char* name) {
      if (on) s += (s.empty() ? "" : "+") + std::string(name);
    };
    add(fp16, "fp16");
    add(bf16, "bf16");
    add(int8, "int8");
    add(tf32, "tf32");
    return s.empty() ? "strict fp32" : s;
  }
};

// The precision a node computes in, assigned at build and stored in the plan.
struct NodePrecision {
  DType compute =
      DType::kUndefined;  // kUndefined: the node computes in its own dtypes (ints, bool, copies)
  bool tf32 = false;      // FP32 storage, TF32 tensor-core math

  bool operator==(const NodePrecision&) const = default;
  // "float32", "tf32", "float16", or `native` (a caller passes the output dtype's name).
  std::string to_string(std::string_view native = "native") const {
    if (tf32) return "tf32";
    if (compute == DType::kUndefined) return std::string(native);
    return std::string(dtype_name(compute));
  }
};

}  // namespace kiln
