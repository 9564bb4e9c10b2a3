// kiln run: inference of an engine (loaded, or built from --onnx) on seeded random inputs or input
// files, printing each output's name, shape, dtype and a value summary (--dumpOutput: every
// value); --exportOutput writes .npy files or JSON.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "commands.h"
#include "core/file.h"
#include "engine_source.h"
#include "inputs.h"
#include "json.h"
#include "npy.h"
#include "progress.h"

namespace kiln::cli {
namespace {

CommandSpec run_spec() {
  return command_spec(
      kCmdRun, "run",
      "(--loadEngine=ENGINE | --onnx=MODEL [build flags]) [--shapes=x:4x3x224x224] "
      "[--loadInputs=x:in.npy] [--iterations=N] [--dumpOutput] [--exportOutput=DIR|out.json]",
      "Runs an engine, loaded or built from --onnx with the build flags (or --shapes as\n"
      "min = opt = max). Inputs are seeded random values unless --loadInputs gives files;\n"
      "shapes come from --shapes, the input files, or the profile's opt shapes. The profile is\n"
      "--profile=N, else the one whose ranges hold the shapes and whose opt shapes are nearest\n"
      "(relative distance per dim), else the first that holds them. Prints the outputs of the "
      "last\n"
      "run (--dumpOutput: every value) and the time of each run.");
}

// Every value of `t`, one line per row of its last dim, each row led by its index.
std::string dump_values(const Tensor& t) {
  std::string s;
  const Shape& shape = t.shape();
  int64_t cols = shape.empty() ? 1 : std::max<int64_t>(shape.back(), 1);
  int64_t n = t.numel();
  char buf[48];
  for (int64_t start = 0; start < n; start += cols) {
    std::string index;
    int64_t rest = start / cols;
    for (size_t d = shape.size() > 0 ? shape.size() - 1 : 0; d-- > 0;) {
      index = std::to_string(rest % shape[d]) + (index.empty() ? "" : ",") + index;
      rest /= shape[d];
    }
    s += "    [" + index + (shape.empty() ? "" : index.empty() ? ":" : ",:") + "]";
    for (int64_t i = start; i < std::min(n, start + cols); ++i) {
      if (is_float(t.dtype()))
        std::snprintf(buf, sizeof buf, " %.6g", t.float_at(i));
      else
        std::snprintf(buf, sizeof buf, " %lld", static_cast<long long>(t.int_at(i)));
      s += buf;
    }
    s += "\n";
  }
  return s;
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
    if (Status w = write_regular_file(target, j.str() + "\n", "output"); !w.ok())
      return failure(w.message());
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
  auto build = parse_build_options(*args);
  if (!build.ok()) return report("run", build.error());
  if (!path == build->onnx.empty()) {
    return report("run", usage_error("give exactly one of --loadEngine=ENGINE or --onnx=MODEL "
                                     "(see: kiln run --help)"));
  }
  auto options = parse_input_options(*args);
  if (!options.ok()) return report("run", options.error());
  auto profile = args->get_int("profile", -1, 0, kMaxCount);
  if (!profile.ok()) return report("run", profile.error());
  if (args->has("profile") && args->has("useProfile") && *profile != options->profile) {
    return report("run", usage_error("--profile and --useProfile name different profiles; they "
                                     "are two spellings of one flag, give one"));
  }
  if (args->has("profile")) options->profile = int(*profile);
  auto iterations = args->get_int("iterations", 1, 1, kMaxCount);
  if (!iterations.ok()) return report("run", iterations.error());
  auto duration_s = args->get_double("duration", 0, 0, kMaxSeconds);
  if (!duration_s.ok()) return report("run", duration_s.error());
  auto dump = args->get_bool("dumpOutput");
  if (!dump.ok()) return report("run", dump.error());
  auto threads = args->get_int("threads", 0, 0, 256);
  if (!threads.ok()) return report("run", threads.error());
  const std::string save = args->get("saveEngine").value_or("");

  // Stage lines for a build (as bench --onnx prints them) or with --verbose; on a pipe, a plain
  // run of a loaded engine prints none.
  Stages stages("run", path ? 2 : save.empty() ? 3 : 4, build->verbose, /*plain_lines=*/!path);
  Result<Engine> engine = failure("no engine");
  if (path) {
    stages.begin("loading " + *path);
    engine = load_engine(*path);
  } else {
    stages.begin("parsing " + build->onnx);
    auto network = load_build_network(*build);
    if (!network.ok()) return report("run", network.error());
    stages.end();
    stages.begin("building the engine for " + std::string(device_name(build->device)));
    engine = build_engine(*network, *build, "run");
    if (engine.ok() && !save.empty()) {
      stages.end();
      stages.begin("saving " + save);
      Status st = engine->save(save);
      if (!st.ok()) return report("run", failure(st, "saving the engine"));
    }
  }
  if (!engine.ok()) return report("run", engine.error());
  stages.end();
  auto ctx = engine->create_execution_context();
  if (!ctx.ok()) return report("run", failure(ctx.status(), "creating an execution context"));
  if (Status st = (*ctx)->set_cpu_threads(int(*threads)); !st.ok())
    return report("run", failure(st, "--threads"));
  auto inputs = prepare_inputs(*engine, **ctx, *options);
  if (!inputs.ok()) return report("run", inputs.error());

  std::printf("engine: %s (device %s, profile %d%s)\n", path ? path->c_str() : build->onnx.c_str(),
              std::string(device_name(engine->device())).c_str(), inputs->profile,
              inputs->profile_chosen ? ": its ranges hold the shapes and its opt is nearest" : "");
  std::printf("inputs:\n");
  for (const auto& n : inputs->order) {
    std::printf("  %s: %s  [%s]\n", n.c_str(), tensor_summary(inputs->tensors[n]).c_str(),
                inputs->from[n].c_str());
  }
  // Until both --iterations and --duration are reached, as kiln bench does; the outputs printed
  // are the last run's.
  stages.begin("running");
  Result<std::map<std::string, Tensor>> outputs = failure("no run");
  std::vector<double> times;
  auto t_start = std::chrono::steady_clock::now();
  while (int64_t(times.size()) < *iterations ||
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count() <
             *duration_s) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = (*ctx)->run(inputs->tensors);
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (!r.ok()) return report("run", failure(r.status(), "running the engine"));
    outputs = std::move(r).value();
  }
  stages.end();
  std::vector<std::string> names;
  for (int i = 0; i < engine->num_io_tensors(); ++i) {
    std::string n = engine->io_tensor_name(i);
    if (engine->tensor_mode(n) == TensorIOMode::kOUTPUT) names.push_back(n);
  }
  std::printf("outputs%s:\n", times.size() > 1 ? " (of the last run)" : "");
  for (const auto& n : names) {
    auto it = outputs->find(n);
    if (it == outputs->end())
      return report("run", failure("the engine returned no output '" + n + "'"));
    std::printf("  %s: %s\n", n.c_str(), tensor_summary(it->second).c_str());
    if (*dump) std::printf("%s", dump_values(it->second).c_str());
  }
  if (times.size() == 1) {
    std::printf(
        "time: %.2f ms (one run, including first-run arena setup; use kiln bench for latency)\n",
        times[0]);
  } else {
    double mn = times[1], mx = times[1], sum = 0;
    for (size_t i = 1; i < times.size(); ++i)
      mn = std::min(mn, times[i]), mx = std::max(mx, times[i]), sum += times[i];
    std::printf(
        "time: %zu runs; the first %.2f ms (including first-run arena setup), the other %zu: min "
        "%.2f mean %.2f max %.2f ms (use kiln bench for latency)\n",
        times.size(), times[0], times.size() - 1, mn, sum / double(times.size() - 1), mx);
  }
  if (auto target = args->get("exportOutput")) {
    auto st = export_outputs(*target, names, *outputs);
    if (!st.ok()) return report("run", st.error());
  }
  return kExitOk;
}

}  // namespace kiln::cli
