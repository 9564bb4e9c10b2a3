// Where a subcommand's engine comes from: --loadEngine=E, or --onnx=M plus the build flags
// (profiles, precision, device). Shared by kiln build, bench and compare.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "calibrate.h"
#include "flags.h"
#include "kiln.h"
#include "plan/plan.h"  // Engine::plan(): profiles with symbol ranges, builder flags

namespace kiln::cli {

struct ProfileShapes {
  std::vector<ShapeSpec> min, opt, max;
  std::vector<ShapeSpec> steps;  // --shapeSteps
};

struct BuildOptions {
  std::string onnx;
  Device device = Device::kCPU;
  BuilderConfig config;                 // precision flags; profiles are added by make_config
  std::vector<ProfileShapes> profiles;  // as given, in --profile order
  std::vector<std::string> requested;   // precision flags the user asked for: "fp16", "noTF32", ...
  bool verbose = false;
  // --dumpIR: print the IR after these passes (every pass when empty and dump_ir is set).
  bool dump_ir = false;
  std::vector<std::string> dump_ir_passes;
  // --memPoolSize=workspace:SIZE or --workspace=N, in bytes, and the flag that gave it. Kept here
  // because BuilderConfig has no memory pool limit yet: the build summary says so.
  std::optional<int64_t> workspace_bytes;
  std::string workspace_flag;
  // --timingCacheFile: read before the build, written after it; empty when not given.
  std::string timing_cache_file;
  // --shapes stood for the profile (min = opt = max), no --minShapes/--optShapes/--maxShapes given.
  bool profile_from_shapes = false;
  // --int8 --calib / --calibCache: the engine is built from the model calibrated and written with
  // Q/DQ nodes (load_build_network makes it once; `calibrated` holds it while the options live).
  std::optional<CalibrationRequest> calibration;
  std::shared_ptr<CalibratedModel> calibrated;
};

Result<Device> parse_device(const std::string& text);

// Reads the build flags. --shapes stands for min = opt = max when no --minShapes/--optShapes/
// --maxShapes are given, as trtexec builds from --shapes and polygraphy's --input-shapes does.
// With --loadEngine only --onnx and --verbose are read: the rest has no effect on a built engine.
Result<BuildOptions> parse_build_options(const Args& args);

// trtexec's size spelling: a number (decimals allowed, rounded down to bytes) with an optional
// suffix B, K, M or G (base 2, any case); without one, MiB. "1024" and "1G" are both 1 GiB.
Result<int64_t> parse_pool_size(std::string_view flag, std::string_view text);

// The build summary's line about --memPoolSize/--workspace, or "" when neither was given.
std::string memory_pool_summary(const BuildOptions& options);

Result<Network> load_network(const std::string& path);

// The network the engine is built from: --onnx's model, or with --calib the Q/DQ model
// kiln.quantize makes of it (made at the first call; its progress and errors go to the terminal).
Result<Network> load_build_network(BuildOptions& options);

// The config with its profiles, checked against the model's inputs: an unknown name lists the
// inputs; a dynamic input without shapes lists every such input with its symbolic shape and the
// flags to add. A missing one of min/opt/max defaults to opt (opt to max, else min), as in trtexec.
Result<BuilderConfig> make_config(const Network& network, const BuildOptions& options);

// make_config + Builder::build. Errors from the profile (invalid_argument) are usage errors.
// With --timingCacheFile the cache is loaded first (a file that cannot be used is a warning from
// `command`, and the build starts from an empty cache) and written after a successful build (a
// failed write is a warning too: the engine is good). `cache_summary`, when given, receives the
// build summary's line: "timing cache: H hits, M misses (FILE, ...)".
Result<Engine> build_engine(const Network& network, const BuildOptions& options,
                            std::string_view command, std::string* cache_summary = nullptr);

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
