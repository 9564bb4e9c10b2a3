// kiln build: an ONNX model and shape/precision flags to a saved engine, with a summary of what
// was built (profiles, output shape formulas, layers, precisions, activation memory, build time).
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "describe.h"
#include "engine_source.h"
#include "progress.h"

namespace kiln::cli {
namespace {

CommandSpec build_spec() {
  return command_spec(
      kCmdBuild, "build",
      "--onnx=MODEL [--saveEngine=ENGINE] [--minShapes=.. --optShapes=.. --maxShapes=..] [flags]",
      "Builds an engine for one or more optimization profiles. Every dynamic input needs\n"
      "min/opt/max shapes (or --shapes, as min = opt = max); --profile=1 starts a second\n"
      "profile. Prints a summary: profiles, output shape formulas, layers, what each layer\n"
      "computes in, activation memory at min/opt/max, the timing cache's hits and misses,\n"
      "build time.");
}

}  // namespace

int build_command(const Argv& argv) {
  const CommandSpec spec = build_spec();
  auto args = Args::parse(spec, argv);
  if (!args.ok()) return report("build", args.error());
  if (args->help()) {
    std::fputs(help_text(spec).c_str(), stdout);
    return kExitOk;
  }
  auto options = parse_build_options(*args);
  if (!options.ok()) return report("build", options.error());
  if (args->has("shapes") && !options->profile_from_shapes) {
    warn("build",
         "--shapes has no effect: --minShapes/--optShapes/--maxShapes give the profile, and kiln "
         "build runs no inference (use --shapes with kiln run or bench)");
  }
  if (options->onnx.empty())
    return report("build", usage_error("--onnx=MODEL is required (see: kiln build --help)"));
  std::string save = args->get("saveEngine").value_or("");

  auto t0 = std::chrono::steady_clock::now();
  Stages stages("build", save.empty() ? 2 : 3, options->verbose);
  stages.begin("parsing " + options->onnx);
  auto network = load_build_network(*options);
  if (!network.ok()) return report("build", network.error());
  stages.end();
  stages.begin("building the engine for " + std::string(device_name(options->device)));
  std::string cache_summary;
  auto engine = build_engine(*network, *options, "build", &cache_summary);
  if (!engine.ok()) return report("build", engine.error());
  stages.end();
  double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!save.empty()) {
    stages.begin("saving " + save);
    Status st = engine->save(save);
    if (!st.ok()) return report("build", failure(st, "saving the engine"));
    stages.end();
  }

  std::printf("\n=== build summary ===\n");
  std::printf("model: %s (%zu nodes, model hash %016llx)\n", options->onnx.c_str(),
              network->graph.nodes.size(), static_cast<unsigned long long>(network->model_hash));
  if (!save.empty()) {
    std::error_code ec;
    auto size = std::filesystem::file_size(save, ec);
    std::printf("engine: %s (%s)\n", save.c_str(), ec ? "?" : format_bytes(int64_t(size)).c_str());
  } else {
    std::printf("engine: not saved (no --saveEngine)\n");
  }
  std::printf("device: %s   builder flags: %s\n",
              std::string(device_name(engine->device())).c_str(),
              flags_to_string(engine->plan().builder_flags).c_str());
  std::printf("%s%s", describe_profiles(*engine).c_str(), describe_io(*engine).c_str());
  std::printf("%s", describe_layers(*engine, options->verbose).c_str());
  std::printf("precision: %s\n", precision_summary(*engine, options->requested).c_str());
  std::printf("%s", describe_memory(*engine).c_str());
  std::printf("%s", memory_pool_summary(*options).c_str());
  std::printf("%s", cache_summary.c_str());
  std::printf("build time: %.2f s (parse + build)\n", build_s);
  return kExitOk;
}

}  // namespace kiln::cli
