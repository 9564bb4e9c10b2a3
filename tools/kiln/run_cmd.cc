// kiln run: one inference of an engine on seeded random inputs or input files, printing each
// output's name, shape, dtype and a value summary; --exportOutput writes .npy files or JSON.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "commands.h"
#include "engine_source.h"
#include "inputs.h"
#include "json.h"
#include "npy.h"

namespace kiln::cli {
namespace {

CommandSpec run_spec() {
  CommandSpec spec{
      "run",
      "--loadEngine=ENGINE [--shapes=x:4x3x224x224] [--loadInputs=x:in.npy] "
      "[--exportOutput=DIR|out.json]",
      "Runs an engine once. Inputs are seeded random values unless --loadInputs gives files;\n"
      "shapes come from --shapes, the input files, or the profile's opt shapes. The profile is\n"
      "the first whose ranges hold the shapes, or --profile=N.",
      {{"loadEngine", "ENGINE", "the engine to run (.kiln)"}},
      ""};
  for (auto& f : input_flag_specs()) spec.flags.push_back(f);
  spec.flags.push_back(
      {"profile", "N", "the optimization profile to run with (default: the first that fits)"});
  spec.flags.push_back(
      {"exportOutput", "DIR|FILE.json", "write outputs: DIR/NAME.npy each, or one JSON file"});
  return spec;
}

// An output name as a file name: path separators and ':' become '_'.
std::string file_stem(const std::string& name) {
  std::string s = name;
  for (char& c : s) {
    if (c == '/' || c == '\\' || c == ':' || c == ' ') c = '_';
  }
  return s.empty() || s == "." || s == ".." ? "output" : s;
}

Check export_outputs(const std::string& target, const std::vector<std::string>& names,
                     const std::map<std::string, Tensor>& outputs) {
  if (target.size() > 5 && target.compare(target.size() - 5, 5, ".json") == 0) {
    JsonWriter j;
    j.begin_object().key("outputs").begin_array();
    for (const auto& n : names) {
      const Tensor& t = outputs.at(n);
      j.begin_object().key("name").value(n).key("dtype").value(std::string(dtype_name(t.dtype())));
      j.key("shape").array(t.shape()).key("values").begin_array();
      for (int64_t i = 0; i < t.numel(); ++i) {
        if (is_float(t.dtype()))
          j.value(t.float_at(i));
        else
          j.value(t.int_at(i));
      }
      j.end_array().end_object();
    }
    j.end_array().end_object();
    std::ofstream out(target);
    out << j.str() << "\n";
    if (!out) return failure("cannot write '" + target + "'");
    std::printf("outputs written to %s\n", target.c_str());
    return ok();
  }
  std::error_code ec;
  std::filesystem::create_directories(target, ec);
  if (ec) return failure("cannot create directory '" + target + "': " + ec.message());
  for (const auto& n : names) {
    std::string path = (std::filesystem::path(target) / (file_stem(n) + ".npy")).string();
    KILN_CLI_TRY(write_npy(path, outputs.at(n)));
    std::printf("wrote %s\n", path.c_str());
  }
  return ok();
}

}  // namespace

int run_command(const Argv& argv) {
  const CommandSpec spec = run_spec();
  auto args = Args::parse(spec, argv);
  if (!args.ok()) return report("run", args.error());
  if (args->help()) {
    std::fputs(help_text(spec).c_str(), stdout);
    return kExitOk;
  }
  auto path = args->get("loadEngine");
  if (!path)
    return report("run", usage_error("--loadEngine=ENGINE is required (see: kiln run --help)"));
  auto options = parse_input_options(*args);
  if (!options.ok()) return report("run", options.error());
  auto profile = args->get_int("profile", -1);
  if (!profile.ok()) return report("run", profile.error());
  options->profile = int(*profile);

  auto engine = load_engine(*path);
  if (!engine.ok()) return report("run", engine.error());
  auto ctx = engine->create_execution_context();
  if (!ctx.ok()) return report("run", failure(ctx.status(), "creating an execution context"));
  auto inputs = prepare_inputs(*engine, **ctx, *options);
  if (!inputs.ok()) return report("run", inputs.error());

  std::printf("engine: %s (device %s, profile %d)\n", path->c_str(),
              std::string(device_name(engine->device())).c_str(), inputs->profile);
  std::printf("inputs:\n");
  for (const auto& n : inputs->order) {
    std::printf("  %s: %s  [%s]\n", n.c_str(), tensor_summary(inputs->tensors[n]).c_str(),
                inputs->from[n].c_str());
  }
  auto t0 = std::chrono::steady_clock::now();
  auto outputs = (*ctx)->run(inputs->tensors);
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!outputs.ok()) return report("run", failure(outputs.status(), "running the engine"));
  std::vector<std::string> names;
  for (int i = 0; i < engine->num_io_tensors(); ++i) {
    std::string n = engine->io_tensor_name(i);
    if (engine->tensor_mode(n) == TensorIOMode::kOUTPUT) names.push_back(n);
  }
  std::printf("outputs:\n");
  for (const auto& n : names) {
    auto it = outputs->find(n);
    if (it == outputs->end())
      return report("run", failure("the engine returned no output '" + n + "'"));
    std::printf("  %s: %s\n", n.c_str(), tensor_summary(it->second).c_str());
  }
  std::printf(
      "time: %.2f ms (one run, including first-run arena setup; use kiln bench for latency)\n", ms);
  if (auto target = args->get("exportOutput")) {
    auto st = export_outputs(*target, names, *outputs);
    if (!st.ok()) return report("run", st.error());
  }
  return kExitOk;
}

}  // namespace kiln::cli
