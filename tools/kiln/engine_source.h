// Where a subcommand's engine comes from: --loadEngine=E, or --onnx=M plus the build flags
// (profiles, precision, device). Shared by kiln build, bench and compare.
#pragma once

#include <string>
#include <vector>

#include "flags.h"
#include "kiln.h"
#include "plan/plan.h"  // Engine::plan(): profiles with symbol ranges, builder flags

namespace kiln::cli {

// --onnx, --minShapes/--optShapes/--maxShapes, --profile, --noTF32, --fp16, --bf16, --int8,
// --device, --verbose.
std::vector<FlagSpec> build_flag_specs();

struct ProfileShapes {
  std::vector<ShapeSpec> min, opt, max;
};

struct BuildOptions {
  std::string onnx;
  Device device = Device::kCPU;
  BuilderConfig config;                 // precision flags; profiles are added by make_config
  std::vector<ProfileShapes> profiles;  // as given, in --profile order
  std::vector<std::string> requested;   // precision flags the user asked for: "fp16", "notf32", ...
  bool verbose = false;
};

Result<Device> parse_device(const std::string& text);

// Reads the build flags. With `shapes_fallback` (bench, compare), --shapes stands for min = opt =
// max when no --minShapes/--optShapes/--maxShapes are given, as polygraphy's --input-shapes does.
Result<BuildOptions> parse_build_options(const Args& args, bool shapes_fallback);

Result<Network> load_network(const std::string& path);

// The config with its profiles, checked against the model's inputs: an unknown name lists the
// inputs; a dynamic input without shapes lists every such input with its symbolic shape and the
// flags to add. A missing one of min/opt/max defaults to opt (opt to max, else min), as in trtexec.
Result<BuilderConfig> make_config(const Network& network, const BuildOptions& options);

// make_config + Builder::build. Errors from the profile (invalid_argument) are usage errors.
Result<Engine> build_engine(const Network& network, const BuildOptions& options);

// "--minShapes=x:1x3x224x224 --optShapes=x:8x3x224x224 --maxShapes=x:32x3x224x224": every symbol
// of a dynamic input set to 1, 8 and 32, a starting point for users to replace with real ranges.
std::string example_shape_flags(const ir::Value& input);

Result<Engine> load_engine(const std::string& path);

// "every layer runs in float32 (...)" with the honest note about requested precisions.
std::string precision_summary(const Engine& engine, const std::vector<std::string>& requested);

// Builder flags as words: "tf32 fp16".
std::string flags_to_string(uint32_t flags);

// "1.2 MiB (1258291 bytes)".
std::string format_bytes(int64_t bytes);

}  // namespace kiln::cli
