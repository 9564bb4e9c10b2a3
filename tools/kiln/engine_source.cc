// Build flags to a BuilderConfig, and engines from --onnx or --loadEngine. The checks here are
// about the command line (names, missing shapes); everything about the model is the library's.
#include "engine_source.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "builder/builder.h"  // builder::tensor_inputs: the inputs the shape flags name

namespace kiln::cli {

Result<Device> parse_device(const std::string& text) {
  if (text == "cpu") return Device::kCPU;
  if (text == "cuda" || text == "gpu") return Device::kCUDA;
  if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos) {
    // trtexec's --device=N picks a GPU by index; kiln's --device picks the backend.
    return usage_error("--device=" + text +
                       " is trtexec's GPU index; kiln's --device is cpu or cuda. kiln runs on the "
                       "first visible GPU: pick it with CUDA_VISIBLE_DEVICES=" +
                       text + " and --device=cuda");
  }
  return usage_error("--device=" + text + " is not a device; use --device=cpu or --device=cuda");
}

Result<int64_t> parse_pool_size(std::string_view flag, std::string_view text) {
  const std::string bad = "--" + std::string(flag) + ": '" + std::string(text) +
                          "' is not a size; expected a number with an optional suffix B, K, M or "
                          "G (default M, MiB), such as 1024 or 1G";
  if (text.empty()) return usage_error(bad);
  // trtexec's suffixes, base 2: B, K, M, G (any case); a number alone is in MiB.
  constexpr std::string_view kSuffixes = "BKMG";
  std::string number(text);
  size_t suffix = kSuffixes.find(char(std::toupper(static_cast<unsigned char>(number.back()))));
  int shift = 20;
  if (suffix != std::string_view::npos) {
    shift = 10 * int(suffix);
    number.pop_back();
  }
  const int64_t unit = int64_t(1) << shift;
  if (number.empty() || number.find_first_not_of("0123456789.") != std::string::npos)
    return usage_error(bad);
  char* end = nullptr;
  double v = std::strtod(number.c_str(), &end);
  if (*end != '\0') return usage_error(bad);
  double bytes = std::floor(v * double(unit));
  if (!(bytes < 0x1p62)) return usage_error(bad + " (too large)");
  return int64_t(bytes);
}

std::string memory_pool_summary(const BuildOptions& options) {
  if (!options.workspace_bytes) return "";
  return "memory pool: workspace " + format_bytes(*options.workspace_bytes) + " (" +
         std::to_string(*options.workspace_bytes) + " bytes, from --" + options.workspace_flag +
         "), recorded but not enforced: kiln's BuilderConfig has no memory pool limit yet, so no "
         "kernel is bounded or refused by it\n";
}

namespace {

// --memPoolSize=workspace:1024,dlaSRAM:1 to the workspace size; every other pool is refused.
Result<int64_t> parse_mem_pools(const std::string& text) {
  std::optional<int64_t> workspace;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string entry = text.substr(start, comma == std::string::npos ? comma : comma - start);
    size_t colon = entry.find(':');
    if (colon == std::string::npos) {
      return usage_error("--memPoolSize: '" + entry +
                         "' has no ':'; expected POOL:SIZE such as workspace:1024 (MiB) or "
                         "workspace:1G");
    }
    std::string pool = entry.substr(0, colon);
    if (pool == "dlaSRAM" || pool == "dlaLocalDRAM" || pool == "dlaGlobalDRAM") {
      return usage_error("--memPoolSize: the " + pool +
                         " pool is not supported: kiln has no DLA backend; the one pool kiln "
                         "reads is workspace:SIZE");
    }
    if (pool == "tacticSharedMem") {
      return usage_error(
          "--memPoolSize: the tacticSharedMem pool is not supported: kiln's kernels take no "
          "shared-memory limit; the one pool kiln reads is workspace:SIZE");
    }
    if (pool != "workspace") {
      return usage_error("--memPoolSize: '" + pool +
                         "' is not a pool; trtexec's are workspace, dlaSRAM, dlaLocalDRAM, "
                         "dlaGlobalDRAM and tacticSharedMem, and kiln reads workspace");
    }
    KILN_CLI_ASSIGN(int64_t bytes, parse_pool_size("memPoolSize", entry.substr(colon + 1)));
    if (workspace && *workspace != bytes)
      return usage_error("--memPoolSize gives the workspace pool twice, with different sizes");
    workspace = bytes;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return *workspace;
}

}  // namespace

Result<BuildOptions> parse_build_options(const Args& args) {
  BuildOptions o;
  o.onnx = args.get("onnx").value_or("");
  KILN_CLI_ASSIGN(o.verbose, args.get_bool("verbose"));
  // Next to --loadEngine the build flags have no effect (Args::parse warned, naming each), so
  // their values are not read either: a typo there must not fail a run of a built engine.
  if (args.has("loadEngine")) return o;
  if (auto d = args.get("device")) {
    KILN_CLI_ASSIGN(o.device, parse_device(*d));
  }
  // --best sets what the single flags set; --noTF32 comes last, so it wins over --best.
  KILN_CLI_ASSIGN(bool best, args.get_bool("best"));
  if (best) {
    for (BuilderFlag bit : {BuilderFlag::kFP16, BuilderFlag::kBF16, BuilderFlag::kTF32})
      o.config.set_flag(bit);
    o.requested.push_back("best");
  }
  struct Precision {
    const char* flag;
    BuilderFlag bit;
    bool set;
  };
  for (const Precision& p :
       {Precision{"fp16", BuilderFlag::kFP16, true}, Precision{"bf16", BuilderFlag::kBF16, true},
        Precision{"int8", BuilderFlag::kINT8, true},
        Precision{"noTF32", BuilderFlag::kTF32, false}}) {
    KILN_CLI_ASSIGN(bool on, args.get_bool(p.flag));
    if (!on) continue;
    if (p.set)
      o.config.set_flag(p.bit);
    else
      o.config.clear_flag(p.bit);
    o.requested.push_back(p.flag);
  }
  if (auto pools = args.get("memPoolSize")) {
    KILN_CLI_ASSIGN(o.workspace_bytes, parse_mem_pools(*pools));
    o.workspace_flag = "memPoolSize=" + *pools;
  }
  if (auto ws = args.get("workspace")) {
    KILN_CLI_ASSIGN(int64_t bytes, parse_pool_size("workspace", *ws));
    if (o.workspace_bytes && *o.workspace_bytes != bytes) {
      return usage_error("--workspace=" + *ws + " and --" + o.workspace_flag +
                         " give different workspace sizes; give --memPoolSize=workspace:SIZE "
                         "alone (--workspace is its deprecated spelling)");
    }
    if (!o.workspace_bytes) o.workspace_flag = "workspace=" + *ws;
    o.workspace_bytes = bytes;
  }
  if (args.has("builderOptimizationLevel")) {
    KILN_CLI_ASSIGN(int64_t level, args.get_int("builderOptimizationLevel", 3, 0,
                                                BuilderConfig::kMaxOptimizationLevel));
    KILN_CHECK(
        o.config.set_builder_optimization_level(int(level)).ok());  // in range: checked above
  }
  o.timing_cache_file = args.get("timingCacheFile").value_or("");
  if (auto when = args.get("dumpIR")) {
    o.dump_ir = true;
    if (*when != "all") {
      if (when->rfind("after:", 0) != 0 || when->size() == 6) {
        return usage_error("--dumpIR=" + *when + ": expected all or after:PASS[,PASS...]");
      }
      for (const std::string& name : split_entries(when->substr(6))) {
        if (name.empty()) return usage_error("--dumpIR=" + *when + ": empty pass name");
        o.dump_ir_passes.push_back(name);
      }
    }
  }
  if (auto lengths = args.get("sequenceLengths")) {
    KILN_CLI_ASSIGN(auto specs, parse_shape_specs("sequenceLengths", *lengths));
    for (const ShapeSpec& s : specs) {
      if (s.dims.size() != 1) {
        return usage_error("--sequenceLengths: '" + s.name +
                           "' needs one length (NAME:N such as xs:3)");
      }
      Status st = o.config.set_sequence_length(s.name, s.dims[0]);
      if (!st.ok()) return usage_error("--sequenceLengths: " + st.message());
    }
  }
  if (auto absent = args.get("optionalAbsent")) {
    for (const std::string& name : split_entries(*absent)) {
      if (name.empty())
        return usage_error("--optionalAbsent: empty name in '" + *absent +
                           "'; expected NAME,NAME,...");
      o.config.set_optional_present(name, false);
    }
  }
  // Shape flags in command-line order; --profile=N switches which profile they fill.
  size_t current = 0;
  for (const auto& f : args.flags()) {
    if (f.name == "profile") {
      KILN_CLI_ASSIGN(int64_t v, parse_int_flag("profile", f.value, 0, kMaxCount));
      if (size_t(v) > o.profiles.size()) {
        return usage_error("--profile=" + f.value + " skips a profile: the next one to start is " +
                           std::to_string(o.profiles.size()) + " (profiles are numbered in order)");
      }
      current = size_t(v);
      continue;
    }
    if (f.name != "minShapes" && f.name != "optShapes" && f.name != "maxShapes" &&
        f.name != "shapeSteps")
      continue;
    KILN_CLI_ASSIGN(auto specs, parse_shape_specs(f.name, f.value));
    if (o.profiles.size() <= current) o.profiles.resize(current + 1);
    ProfileShapes& p = o.profiles[current];
    auto& target = f.name == "minShapes"   ? p.min
                   : f.name == "optShapes" ? p.opt
                   : f.name == "maxShapes" ? p.max
                                           : p.steps;
    for (auto& s : specs) {
      for (const auto& t : target) {
        if (t.name == s.name) {
          return usage_error("--" + f.name + " gives input '" + s.name + "' twice in profile " +
                             std::to_string(current));
        }
      }
      target.push_back(std::move(s));
    }
  }
  auto calib = args.get("calib"), cache = args.get("calibCache"), method = args.get("calibMethod");
  if (calib || cache || method) {
    if (!o.config.get_flag(BuilderFlag::kINT8)) {
      return usage_error(std::string(calib   ? "--calib"
                                     : cache ? "--calibCache"
                                             : "--calibMethod") +
                         " calibrates an INT8 build: add --int8");
    }
    if (!calib && !cache) {
      return usage_error("--calibMethod needs the data to calibrate on: --calib=DIR_OR_NPZ");
    }
    // A cache to read that is not there, with nothing to calibrate on, is refused here rather than
    // after Python has started.
    std::error_code ec;
    if (!calib && !std::filesystem::is_regular_file(*cache, ec)) {
      return usage_error("--calibCache=" + *cache +
                         " does not exist, and there is no --calib=DIR_OR_NPZ to calibrate on and "
                         "write it from");
    }
    o.calibration = CalibrationRequest{calib.value_or(""), method.value_or(""), cache.value_or("")};
  }
  if (o.profiles.empty() && args.get("shapes")) {
    KILN_CLI_ASSIGN(auto specs, parse_shape_specs("shapes", *args.get("shapes")));
    o.profiles.push_back({specs, specs, specs});
    o.profile_from_shapes = true;
  }
  return o;
}

Result<Network> load_network(const std::string& path) {
  auto net = onnx::parse_file(path);
  if (!net.ok()) return failure(net.status(), "loading the model '" + path + "'");
  return std::move(net).value();
}

Result<Network> load_build_network(BuildOptions& options) {
  if (!options.calibration) return load_network(options.onnx);
  if (!options.calibrated) {
    std::printf("calibrating %s for INT8 (kiln.quantize on the CPU engine in FP32)\n",
                options.onnx.c_str());
    KILN_CLI_ASSIGN(options.calibrated, CalibratedModel::make(options.onnx, *options.calibration));
  }
  return load_network(options.calibrated->path());
}

namespace {

std::string inputs_list(const ir::Graph& g) {
  std::string s;
  for (int v : g.inputs)
    s += "\n  " + g.values[v].name + ": " +
         (g.values[v].shape ? ir::dims_to_string(*g.values[v].shape) : "?");
  return s;
}

// An example spec for a dynamic input: every symbol set to `value`.
std::string example_spec(const ir::Value& v, int64_t value) {
  std::set<std::string> syms;
  for (const auto& d : *v.shape) d.collect_symbols(&syms);
  ir::SymbolValues values;
  for (const auto& s : syms) values[s] = value;
  std::string out = v.name + ":";
  for (size_t i = 0; i < v.shape->size(); ++i) {
    auto x = (*v.shape)[i].eval(values);
    out += (i ? "x" : "") + (x ? std::to_string(*x) : "N");
  }
  return out;
}

}  // namespace

std::string example_shape_flags(const ir::Value& input) {
  return "--minShapes=" + example_spec(input, 1) + " --optShapes=" + example_spec(input, 8) +
         " --maxShapes=" + example_spec(input, 32);
}

Result<BuilderConfig> make_config(const Network& network, const BuildOptions& options) {
  BuilderConfig config = options.config;
  ir::Graph g;  // the engine's tensor inputs, which the shape flags name
  for (ir::Value& v : builder::tensor_inputs(network.graph, config)) {
    g.inputs.push_back(int(g.values.size()));
    g.values.push_back(std::move(v));
  }
  auto find_input = [&](const std::string& name) -> const ir::Value* {
    for (int v : g.inputs) {
      if (g.values[v].name == name) return &g.values[v];
    }
    return nullptr;
  };
  std::vector<const ir::Value*> dynamic;
  for (int v : g.inputs) {
    const ir::Value& val = g.values[v];
    bool dyn = false;
    if (val.shape) {
      for (const auto& d : *val.shape) dyn |= !d.is_const();
    }
    if (dyn) dynamic.push_back(&val);
  }
  for (size_t p = 0; p < std::max<size_t>(options.profiles.size(), 1); ++p) {
    ProfileShapes given = p < options.profiles.size() ? options.profiles[p] : ProfileShapes{};
    std::map<std::string, OptimizationProfile::Dims> dims;
    auto add = [&](const std::vector<ShapeSpec>& specs, const char* flag, int which) -> Check {
      for (const auto& s : specs) {
        if (!find_input(s.name)) {
          return usage_error("--" + std::string(flag) + " names '" + s.name +
                             "', which is not an input of " + options.onnx +
                             "; its inputs are:" + inputs_list(g));
        }
        if (which == 3 && !dims.count(s.name)) {
          return usage_error("--shapeSteps gives steps for '" + s.name +
                             "', which has no --minShapes/--optShapes/"
                             "--maxShapes in profile " +
                             std::to_string(p));
        }
        auto& d = dims[s.name];
        (which == 0 ? d.min : which == 1 ? d.opt : which == 2 ? d.max : d.steps) = s.dims;
      }
      return ok();
    };
    KILN_CLI_TRY(add(given.min, "minShapes", 0));
    KILN_CLI_TRY(add(given.opt, "optShapes", 1));
    KILN_CLI_TRY(add(given.max, "maxShapes", 2));
    KILN_CLI_TRY(add(given.steps, "shapeSteps", 3));  // after the shapes: steps need them
    std::string missing, examples;
    for (const ir::Value* v : dynamic) {
      if (dims.count(v->name)) continue;
      missing += "\n  " + v->name + ": " + ir::dims_to_string(*v->shape);
      examples += "\n  " + example_shape_flags(*v);
    }
    if (!missing.empty()) {
      std::string where = options.profiles.size() > 1 ? " in profile " + std::to_string(p) : "";
      return usage_error("the model has dynamic inputs without shapes" + where +
                         "; give min/opt/max shapes for each:" + missing +
                         "\nadd, for example (pick real ranges):" + examples);
    }
    OptimizationProfile profile;
    for (auto& [name, d] : dims) {
      if (d.opt.empty()) d.opt = !d.max.empty() ? d.max : d.min;
      if (d.min.empty()) d.min = d.opt;
      if (d.max.empty()) d.max = d.opt;
      // An integer input whose shape the model fixes, given other numbers than that shape: they
      // are its values (a shape-value input, as trtexec reads its shape flags for shape tensors).
      const ir::Value* in = find_input(name);
      std::vector<int64_t> fixed_shape;
      bool is_static = in && in->shape && (is_integer(in->dtype) || in->dtype == DType::kBool);
      if (is_static) {
        for (const auto& dim : *in->shape) {
          is_static = is_static && dim.is_const();
          if (dim.is_const()) fixed_shape.push_back(dim.value());
        }
      }
      if (is_static && !(d.min == fixed_shape && d.opt == fixed_shape && d.max == fixed_shape)) {
        if (!d.steps.empty())
          return usage_error("--shapeSteps: '" + name +
                             "' takes shape values, which have no steps");
        Status st = profile.set_shape_values(name, d.min, d.opt, d.max);
        if (!st.ok()) return usage_error("profile " + std::to_string(p) + ": " + st.message());
        continue;
      }
      Status st = d.steps.empty() ? profile.set_dimensions(name, d.min, d.opt, d.max)
                                  : profile.set_dimensions(name, d.min, d.opt, d.max, d.steps);
      if (!st.ok()) return usage_error("profile " + std::to_string(p) + ": " + st.message());
    }
    if (!dims.empty()) config.add_profile(profile);
  }
  return config;
}

Result<Engine> build_engine(const Network& network, const BuildOptions& options,
                            std::string_view command, std::string* cache_summary) {
  KILN_CLI_ASSIGN(BuilderConfig config, make_config(network, options));
  const std::string& cache_file = options.timing_cache_file;
  std::string cache_note;
  if (!cache_file.empty()) {
    auto loaded = TimingCache::load(cache_file);
    if (loaded.ok()) {
      config.set_timing_cache(std::make_shared<TimingCache>(std::move(loaded).value()));
    } else {
      warn(command, loaded.status().message() + "; building with an empty timing cache");
      config.set_timing_cache(std::make_shared<TimingCache>());
      cache_note = ", unusable before this build";
    }
  }
  if (options.verbose) {
    // --verbose: the builder's shape log (symbol ranges, every node's shapes, the proof's steps).
    config.set_shape_log(
        [](const std::string& line) { std::printf("shape log: %s\n", line.c_str()); });
  }
  if (options.dump_ir) {
    config.set_ir_dump(options.dump_ir_passes,
                       [](const std::string& pass, const std::string& text) {
                         std::printf("// IR after %s\n%s", pass.c_str(), text.c_str());
                       });
  }
  auto engine = Builder(options.device).build(network, config);
  if (!engine.ok()) {
    // The model parsed, so an invalid argument here is about the profiles the flags gave.
    Error e = failure(engine.status(), "building the engine");
    if (engine.status().code() == StatusCode::kInvalidArgument) e.exit_code = kExitUsage;
    return e;
  }
  if (TimingCache* cache = config.timing_cache()) {
    Status saved = cache->save(cache_file);
    if (!saved.ok()) {
      warn(command, saved.message() + "; the engine is built, but the cache was not updated");
    }
    if (cache_summary) {
      *cache_summary = "timing cache: " + std::to_string(cache->hits()) + " hits, " +
                       std::to_string(cache->misses()) + " misses (" + cache_file + cache_note +
                       ", " + std::to_string(cache->size()) + " entries" +
                       (saved.ok() ? ", written" : ", not written") + ")\n";
    }
  } else if (cache_summary) {
    *cache_summary = "timing cache: none (no --timingCacheFile)\n";
  }
  return std::move(engine).value();
}

Result<Engine> load_engine(const std::string& path) {
  auto engine = Engine::load(path);
  if (!engine.ok()) return failure(engine.status(), "loading the engine '" + path + "'");
  return std::move(engine).value();
}

std::string precision_summary(const Engine& engine, const std::vector<std::string>& requested) {
  std::map<std::string, int> counts;
  auto layers = engine.layers();
  for (const auto& l : layers) {
    if (l.kernel != "alias") counts[l.precision]++;
  }
  size_t views = layers.size();
  for (const auto& [p, n] : counts) views -= size_t(n);
  std::string s;
  if (counts.size() == 1) {
    s = std::string(views ? "every layer that runs (" : "every layer (") +
        std::to_string(layers.size() - views) + ") runs in " + counts.begin()->first;
  } else {
    for (const auto& [p, n] : counts)
      s += (s.empty() ? "" : ", ") + std::to_string(n) + " layers in " + p;
  }
  if (views) s += "; " + std::to_string(views) + " views run nothing (aliases)";
  // int8 layers come from the model's Q/DQ nodes (QuantizeLinear's outputs: a calibrated
  // --int8 build, or a Q/DQ model), not from --int8, which picks no kernel by itself.
  const bool qdq = counts.count("int8") > 0;
  std::string asked;
  bool int8_asked = false;
  for (const auto& r : requested) {
    int8_asked |= r == "int8";
    if (r != "noTF32" && !(qdq && r == "int8")) asked += (asked.empty() ? "--" : ", --") + r;
  }
  if (qdq && int8_asked) {
    s += "; the int8 layers are the Q/DQ model's QuantizeLinear nodes, the layers between them "
         "compute in float";
  }
  if (!asked.empty() && engine.device() == Device::kCPU) {
    s += "; " + asked +
         " recorded in the engine, but the cpu backend computes in fp32, so no layer uses it";
  }
  bool notf32 = false;
  for (const auto& r : requested) notf32 |= r == "noTF32";
  if (engine.device() == Device::kCPU)
    s += notf32 ? "; TF32 off" : "; TF32 has no effect on the cpu backend";
  return s;
}

std::string flags_to_string(uint32_t flags) {
  PrecisionPolicy p = PrecisionPolicy::from_flags(flags);
  std::string s;
  for (auto [on, name] :
       {std::pair{p.tf32, "tf32"}, {p.fp16, "fp16"}, {p.bf16, "bf16"}, {p.int8, "int8"}}) {
    if (on) s += (s.empty() ? "" : " ") + std::string(name);
  }
  return s.empty() ? "none (strict fp32)" : s;
}

std::string format_bytes(int64_t bytes) {
  char buf[64];
  if (bytes >= (int64_t(1) << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(int64_t(1) << 30));
  } else if (bytes >= (1 << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", double(bytes) / double(1 << 20));
  } else if (bytes >= 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(bytes) / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  }
  return buf;
}

}  // namespace kiln::cli
