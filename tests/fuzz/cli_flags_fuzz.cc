// libFuzzer target: bytes as a kiln command line, parsed as the CLI parses one. The arguments are
// separated by NUL bytes; the first byte of the first picks the command (build, run, bench,
// inspect, compare). Args::parse reads them against that command's flags, then every typed
// reading the commands make runs on what it accepted: switches, numbers with their ranges, shape
// specs, named input files, pool sizes and the whole build options (profiles, precisions,
// --dumpIR, the device). Nothing is built, loaded or run: each reading must end in a value or a
// usage error, never a crash, a hang or an allocation without bound.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "engine_source.h"
#include "flags.h"

namespace {

using namespace kiln::cli;

// What the commands read of a flag, by its value hint.
void read_flag(const Args& args, const FlagDef& def) {
  const std::string_view name = def.name;
  const std::string key(name);
  if (def.value.empty()) {
    (void)args.get_bool(key);
    return;
  }
  const std::optional<std::string> value = args.get(key);
  if (!value) return;
  if (def.value == "N") {
    (void)args.get_int(key, 1, 0, kMaxCount);
  } else if (def.value == "S" || def.value == "MS") {
    (void)args.get_double(key, 0, 0, def.value == "S" ? kMaxSeconds : kMaxMilliseconds);
  }
  if (name.find("Shapes") != std::string_view::npos || name == "shapes" || name == "shapeSteps") {
    (void)parse_shape_specs(key, *value);
  }
  if (name == "loadInputs") (void)parse_named_files(key, *value);
  if (name == "memPoolSize" || name == "workspace") (void)parse_pool_size(key, *value);
  if (name == "device") (void)parse_device(*value);
  (void)split_entries(*value);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > 4096) return 0;
  static constexpr uint32_t kIds[] = {kCmdBuild, kCmdRun, kCmdBench, kCmdInspect, kCmdCompare};
  static constexpr const char* kNames[] = {"build", "run", "bench", "inspect", "compare"};
  const int c = data[0] % 5;
  std::vector<std::string> argv;
  std::string arg;
  for (size_t i = 1; i < size; ++i) {
    if (data[i] == 0) {
      argv.push_back(std::move(arg));
      arg.clear();
    } else {
      arg.push_back(char(data[i]));
    }
  }
  argv.push_back(std::move(arg));
  static const std::vector<CommandSpec> specs = [] {
    std::vector<CommandSpec> s;
    for (int k = 0; k < 5; ++k)
      s.push_back(command_spec(kIds[k], kNames[k], "", "", "MODEL_OR_ENGINE"));
    return s;
  }();
  const CommandSpec& spec = specs[size_t(c)];
  Result<Args> args = Args::parse(spec, argv);
  if (!args.ok()) return 0;
  for (const FlagDef* def : spec.flags) read_flag(*args, *def);
  if (kIds[c] == kCmdBuild || kIds[c] == kCmdBench || kIds[c] == kCmdCompare) {
    Result<BuildOptions> options = parse_build_options(*args);
    if (options.ok()) (void)memory_pool_summary(*options);
  }
  return 0;
}
