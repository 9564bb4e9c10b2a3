// The one table of the CLI's flags: kiln's own and trtexec's, each accepted, accepted with a
// warning, or refused with the reason and what to use. Commands' flags, --help, the refusals and
// warnings in Args::parse, and docs/trtexec_flags.md (kiln help-flags --markdown) all read it.
#include <cstdio>
#include <iterator>

#include "flags.h"

namespace kiln::cli {
namespace {

// One-letter names keep each row of the table on a line or two.
constexpr uint32_t B = kCmdBuild, R = kCmdRun, N = kCmdBench, I = kCmdInspect, C = kCmdCompare;
constexpr uint32_t kBuilds = B | R | N | C;  // commands that can build an engine
constexpr auto kAcc = FlagStatus::kAccepted;
constexpr auto kWarn = FlagStatus::kWarns;
constexpr auto kRef = FlagStatus::kRefused;
constexpr uint32_t T = kTrtexec;
constexpr uint32_t TB = kTrtexec | kBuildFlag;

constexpr std::string_view kNoPlugins =
    "kiln loads no plugin libraries: every op runs on a built-in kernel; `kiln inspect MODEL` "
    "lists the ops kiln does not support";
constexpr std::string_view kNoDla =
    "kiln has no DLA backend; an engine targets --device=cpu or --device=cuda";
constexpr std::string_view kNoCalibration =
    "kiln calibrates with --int8 --calib=DATA at the shapes of the data's own feeds (no separate "
    "calibration profile); a model quantized with QuantizeLinear/DequantizeLinear runs as exported";
constexpr std::string_view kNoLayerConstraints =
    "kiln assigns each layer's precision in its own pass and takes no per-layer constraints yet; "
    "`kiln inspect ENGINE` shows what each layer computes in";
constexpr std::string_view kNoRefit =
    "kiln engines are not refittable: rebuild the engine to change its weights";
constexpr std::string_view kNoLayerProfiler =
    "per-layer profiles come from kiln bench --dumpProfile / --exportProfile";
constexpr std::string_view kOneStream =
    "kiln bench drives one execution context on one stream from one thread; run several kiln "
    "processes, or one ExecutionContext per thread through the API";
constexpr std::string_view kNoImplicitBatch =
    "kiln has no implicit batch: the batch is a dim of the input shapes; give it in --shapes or "
    "--minShapes/--optShapes/--maxShapes";
constexpr std::string_view kOneRuntime =
    "kiln has one runtime; an engine records the kiln and format versions it needs, and a "
    "mismatched engine is refused with the versions named";

// In --help order. Rows of one name must have disjoint `commands` (a test checks it).
constexpr FlagDef kFlags[] = {
    // Where the engine comes from, and where it goes.
    {"onnx", "MODEL", B, kAcc, T, "the ONNX model to build"},
    {"onnx", "MODEL", R | N, kAcc, T,
     "build an engine from this ONNX model (with the build flags below) instead of --loadEngine"},
    {"onnx", "MODEL", C, kAcc, T,
     "the ONNX model: the reference runs it, and kiln builds it unless --loadEngine is given"},
    {"loadEngine", "ENGINE", R | N, kAcc, T, "the engine to load (.kiln)"},
    {"loadEngine", "ENGINE", C, kAcc, T, "an engine built from MODEL (default: build one)"},
    {"loadEngine", "ENGINE", B, kRef, T,
     "kiln build builds from --onnx; to run or time a saved engine, use kiln run or kiln bench "
     "--loadEngine=ENGINE"},
    {"saveEngine", "ENGINE", B, kAcc, T, "where to write the engine (.kiln)"},
    {"saveEngine", "ENGINE", R | N, kAcc, TB, "with --onnx: also save the engine built"},

    // Optimization profiles.
    {"minShapes", "SPEC", kBuilds, kAcc, TB | kRepeatable,
     "smallest shapes of the current profile: x:1x3x224x224,y:..."},
    {"optShapes", "SPEC", kBuilds, kAcc, TB | kRepeatable,
     "shapes the profile is tuned for (given alone: also its min and max, as in trtexec)"},
    {"maxShapes", "SPEC", kBuilds, kAcc, TB | kRepeatable, "largest shapes of the current profile"},
    {"shapeSteps", "SPEC", kBuilds, kAcc, kBuildFlag | kRepeatable,
     "steps of the current profile's dims, spelled as the shapes (x:1x1x32x32: H and W take min, "
     "min + 32, ..., max); the build proves the model for those values and runs refuse the others"},
    {"sequenceLengths", "SPEC", kBuilds, kAcc, kBuildFlag,
     "lengths of sequence inputs: xs:3 makes the engine take xs[0], xs[1] and xs[2], each a tensor "
     "input whose shapes the shape flags give (ONNX sequence(tensor) inputs are laid out at build "
     "time)"},
    {"dumpIR", "WHEN", kBuilds, kAcc, kBuildFlag,
     "print the IR text after build passes: all (every pass), or after:PASS[,PASS...] (a pass "
     "of the pipeline, such as canonicalize or fuse_attention; an unknown name lists them); each "
     "dump opens with a line '// IR after PASS'"},
    {"optionalAbsent", "NAMES", kBuilds, kAcc, kBuildFlag,
     "optional inputs to build without a value (opt,mask): the engine has no tensor for them; "
     "others are built present"},
    {"profile", "N", B | N | C, kAcc, TB | kRepeatable,
     "start profile N (0, 1, ...); the shape flags after it belong to it"},
    {"shapes", "SPEC", B, kAcc, TB,
     "without --minShapes/--optShapes/--maxShapes: the profile, as min = opt = max (as trtexec "
     "builds from --shapes)"},

    // Precision.
    {"noTF32", "", kBuilds, kAcc, TB,
     "disable TF32 for FP32 matmul/conv on GPUs (TF32 is on by default, as in TensorRT)"},
    {"fp16", "", kBuilds, kAcc, TB, "allow FP16 kernels"},
    {"bf16", "", kBuilds, kAcc, TB, "allow BF16 kernels"},
    {"int8", "", kBuilds, kAcc, TB,
     "INT8: with --calib, the model is calibrated and built with INT8 Q/DQ nodes; without, --int8 "
     "is recorded and Q/DQ nodes a model has run as exported"},
    {"best", "", kBuilds, kAcc, TB,
     "allow every precision kiln has: fp16, bf16 and tf32 (trtexec's --best enables all); not "
     "int8, which needs --calib"},
    {"fp8", "", kCmdAll, kRef, T,
     "kiln has no FP8 kernels yet (planned for Hopper GPUs); use --fp16 or --bf16"},
    {"int4", "", kCmdAll, kRef, T, "kiln has no INT4 kernels; use --fp16 or --bf16"},
    {"stronglyTyped", "", kCmdAll, kRef, T,
     "kiln has no strongly typed mode: layers compute in FP32 unless --fp16/--bf16 allow less, and "
     "the build summary says what each layer runs in"},
    {"precisionConstraints", "SPEC", kCmdAll, kRef, T, kNoLayerConstraints},
    {"layerPrecisions", "SPEC", kCmdAll, kRef, T, kNoLayerConstraints},
    {"layerOutputTypes", "SPEC", kCmdAll, kRef, T, kNoLayerConstraints},
    {"calib", "DATA", kBuilds, kAcc, T,
     "with --int8: calibrate on DATA (a folder of .npz feeds, or one .npz stacking samples along "
     "axis 0) on kiln's CPU engine in FP32 and build the model with the INT8 Q/DQ nodes that gives "
     "(kiln.quantize; Python needed); a kiln calibration cache (.json) is read as --calibCache, a "
     "TensorRT cache is refused"},
    {"calib", "FILE", I, kRef, T, "kiln inspect reads an engine; calibration is a build step"},
    {"calibCache", "FILE.json", kBuilds, kAcc, 0,
     "with --int8: read the calibration from FILE when it exists (tied to the model's bytes), else "
     "calibrate on --calib and write it there"},
    {"calibMethod", "M", kBuilds, kAcc, 0,
     "with --int8 --calib: minmax, percentile (99.99) or entropy (the default)"},
    {"minShapesCalib", "SPEC", kCmdAll, kRef, T, kNoCalibration},
    {"optShapesCalib", "SPEC", kCmdAll, kRef, T, kNoCalibration},
    {"maxShapesCalib", "SPEC", kCmdAll, kRef, T, kNoCalibration},
    {"calibProfile", "N", kCmdAll, kRef, T, kNoCalibration},
    {"sparsity", "SPEC", kCmdAll, kRef, T, "kiln has no structured-sparsity kernels"},
    {"inputIOFormats", "SPEC", kCmdAll, kRef, T,
     "kiln's IO tensors have the model's dtypes in linear (chw) layout; there is no other IO "
     "format"},
    {"outputIOFormats", "SPEC", kCmdAll, kRef, T,
     "kiln's IO tensors have the model's dtypes in linear (chw) layout; there is no other IO "
     "format"},

    // Device.
    {"device", "cpu|cuda", kBuilds, kAcc, TB,
     "the device the engine targets (default cpu); not trtexec's GPU index: --device=N is refused "
     "with a reason"},
    {"useDLACore", "N", kCmdAll, kRef, T, kNoDla},
    {"allowGPUFallback", "", kCmdAll, kRef, T, kNoDla},
    {"buildDLAStandalone", "", kCmdAll, kRef, T, kNoDla},

    // Builder resources and search.
    {"memPoolSize", "workspace:SIZE", kBuilds, kWarn, TB,
     "the workspace size, in trtexec's units (MiB, or a B/K/M/G suffix), is read and shown in "
     "kiln build's summary, but kiln's BuilderConfig has no memory pool limit yet, so it bounds no "
     "kernel; the DLA and tacticSharedMem pools are refused"},
    {"workspace", "N", kBuilds, kWarn, TB,
     "deprecated: trtexec's old spelling of --memPoolSize=workspace:N (N in MiB), gone from "
     "TensorRT 10's trtexec; taken as that, which kiln records but does not enforce"},
    {"timingCacheFile", "FILE", kBuilds, kAcc, TB,
     "the timing cache: each layer whose signature (kernel, op, attributes, shapes at the opt "
     "point, precision, optimization level, device) FILE records takes the recorded tactic "
     "without timing, so a rebuild writes a byte-identical engine; the build's new choices are "
     "written back. A missing FILE is created; one that cannot be used (corrupt, truncated, "
     "another version, not a regular file) is a warning, and the build starts from an empty "
     "cache"},
    {"noBuilderCache", "", kBuilds, kWarn, TB,
     "kiln's builder keeps a timing cache only when --timingCacheFile names one, so there is no "
     "other cache to disable; the flag changes nothing"},
    {"builderOptimizationLevel", "N", kBuilds, kAcc, TB,
     "how hard kernels search for tactics, 0..5 (default 3, as in TensorRT): at 0 each "
     "implementation takes its heuristic first choice without timing; from 1 on implementations "
     "may time their candidates on the device (the CUDA convolution does); the CPU's kernels "
     "have one tactic each. Part of the timing cache's key"},
    {"profilingVerbosity", "MODE", kBuilds, kWarn, TB,
     "kiln engines always record every layer's node, kernel and precision (kiln inspect shows "
     "them); the flag changes nothing"},
    {"tacticSources", "SPEC", kCmdAll, kRef, T,
     "kiln picks kernels from its registry, with no per-library (cuBLAS, cuDNN) switch yet; `kiln "
     "inspect ENGINE` shows each layer's kernel"},
    {"explicitBatch", "", kBuilds, kWarn, T,
     "every kiln engine has an explicit batch dim, as every TensorRT 10 network does; the flag "
     "changes nothing"},
    {"batch", "N", kCmdAll, kRef, T, kNoImplicitBatch},
    {"maxBatch", "N", kCmdAll, kRef, T, kNoImplicitBatch},
    {"refit", "", kCmdAll, kRef, T, kNoRefit},
    {"stripWeights", "", kCmdAll, kRef, T, kNoRefit},
    {"versionCompatible", "", kCmdAll, kRef, T, kOneRuntime},
    {"vc", "", kCmdAll, kRef, T, kOneRuntime},
    {"useRuntime", "RUNTIME", kCmdAll, kRef, T, kOneRuntime},
    {"hardwareCompatibilityLevel", "MODE", kCmdAll, kRef, T,
     "kiln has no hardware compatibility levels: build the engine on the kind of machine that runs "
     "it"},
    {"plugins", "FILE", kCmdAll, kRef, T, kNoPlugins},
    {"staticPlugins", "FILE", kCmdAll, kRef, T, kNoPlugins},
    {"dynamicPlugins", "FILE", kCmdAll, kRef, T, kNoPlugins},
    {"setPluginsToSerialize", "FILE", kCmdAll, kRef, T, kNoPlugins},
    {"skipInference", "", B, kWarn, T, "kiln build never runs inference; the flag changes nothing"},
    {"skipInference", "", R | N, kRef, T,
     "kiln build builds without running inference: use it instead"},

    // Inputs of a run.
    {"shapes", "SPEC", R | N | C, kAcc, T,
     "input shapes to run: x:4x3x224x224,... (default: the profile's opt shapes); with --onnx and "
     "no --minShapes/--optShapes/--maxShapes, also the profile (min = opt = max)"},
    {"loadInputs", "SPEC", R | N | C, kAcc, T,
     "input data: x:in.npy,y:in.pb (.npy or serialized onnx.TensorProto)"},
    {"seed", "N", R | N | C, kAcc, 0,
     "seed of the random inputs (default 1): floats in [-1,1), ints in [0,100)"},
    {"profile", "N", R, kAcc, 0,
     "the optimization profile to run with (default: the one whose ranges hold the shapes and "
     "whose opt is nearest)"},
    {"useProfile", "N", R | N, kAcc, T,
     "the optimization profile to run with (default: the one whose ranges hold the shapes and "
     "whose opt is nearest)"},

    // kiln run.
    {"iterations", "N", R, kAcc, T,
     "run N times (default 1) and print the outputs of the last run, with the times of all"},
    {"duration", "S", R, kAcc, T, "run for at least S seconds (with --iterations: both)"},
    {"dumpOutput", "", R, kAcc, T, "print every value of every output"},
    {"exportOutput", "DIR|FILE.json", R, kAcc, T,
     "write outputs: DIR/NAME.npy each, or one JSON file"},
    {"warmUp", "MS", R, kRef, T,
     "kiln run does not warm up: its time line says what the first run includes; kiln bench "
     "--warmUp=MS times after a warm-up"},
    {"dumpOutput", "", N | C, kRef, T,
     "this command prints no output values; kiln run --dumpOutput takes the same engine and input "
     "flags and prints them"},
    {"exportOutput", "FILE", N | C, kRef, T,
     "this command writes no outputs; kiln run --exportOutput=DIR|FILE.json takes the same engine "
     "and input flags and writes them"},
    {"dumpRawBindingsToFile", "", kCmdAll, kRef, T,
     "use kiln run --exportOutput=DIR, which writes each output as DIR/NAME.npy"},

    // kiln bench.
    {"warmUp", "MS", N, kAcc, T, "untimed warm-up time in milliseconds (default 200)"},
    {"iterations", "N", N, kAcc, T, "timed runs (at least)"},
    {"duration", "S", N, kAcc, T, "timed seconds (at least)"},
    {"avgRuns", "N", N, kAcc, T,
     "also print the mean latency of every N consecutive timed runs (trtexec's trace averages); "
     "the percentiles stay over single runs"},
    {"percentile", "P1,P2,..", N, kAcc, T,
     "the latency percentiles to report (default 90,99); 0 is the fastest run, 100 the slowest"},
    {"useCudaGraph", "", N, kAcc, T, "capture the run in a CUDA graph (GPU engines only)"},
    {"graphCacheSize", "N", N, kAcc, 0,
     "CUDA graphs kept, one per set of input shapes (default 4; the least recently used is "
     "dropped)"},
    {"batchBuckets", "B1,B2,..", N, kAcc, 0,
     "CUDA graphs: a batch that is no bucket runs at the next bucket up, inputs padded with zero "
     "rows "
     "and outputs sliced back to their exact shapes"},
    {"randomBatch", "LO:HI", N, kAcc, 0,
     "GPU engines: each of --iterations runs draws its batch from LO..HI (seeded by --seed) on "
     "device-resident buffers; reports latency and graph captures without and with --batchBuckets"},
    {"exportTimes", "FILE.json", N, kAcc, T, "write every timed latency and the summary as JSON"},
    {"streams", "N", kCmdAll, kRef, T, kOneStream},
    {"infStreams", "N", kCmdAll, kRef, T, kOneStream},
    {"threads", "N", R | N, kAcc, T,
     "CPU engines: the threads each run splits its kernels over, this one included (ONNX "
     "Runtime's intra_op_num_threads; default KILN_CPU_THREADS, else the CPUs the process may "
     "use; 0 = that default). trtexec's bare --threads (one thread per stream) has no kiln "
     "counterpart: kiln bench drives one context"},
    {"threads", "", B | I | C, kRef, T, kOneStream},
    {"noDataTransfers", "", N, kAcc, T,
     "GPU engines: inputs and outputs stay in device buffers bound once (copied there once "
     "before timing), and each timed run is execute() with no host-device copies"},
    {"useSpinWait", "", kCmdAll, kRef, T, "kiln has no spin-wait synchronization option"},
    {"sleepTime", "MS", kCmdAll, kRef, T, "kiln bench runs back to back, with no sleep"},
    {"idleTime", "MS", kCmdAll, kRef, T, "kiln bench runs back to back, with no sleep"},
    {"useManagedMemory", "", kCmdAll, kRef, T, "kiln has no managed-memory option"},
    {"separateProfileRun", "", N, kAcc, T,
     "kiln bench always profiles layers in a pass of its own after the timed runs, so the flag "
     "changes nothing"},
    {"separateProfileRun", "", kCmdAll & ~N, kRef, T, kNoLayerProfiler},
    {"dumpProfile", "", N, kAcc, T,
     "print each layer's time (total, average, median, share) from a profiled pass after the timed "
     "runs: no CUDA graph, a sync per run"},
    {"dumpProfile", "", kCmdAll & ~N, kRef, T, kNoLayerProfiler},
    {"exportProfile", "FILE", N, kAcc, T,
     "write the layer profile as JSON (trtexec's form: a count, then name, timeMs, averageMs, "
     "medianMs, percentage per layer)"},
    {"exportProfile", "FILE", kCmdAll & ~N, kRef, T, kNoLayerProfiler},
    {"dumpLayerInfo", "", kCmdAll, kRef, T,
     "use kiln inspect ENGINE, which prints every layer with its kernel and precision (or kiln "
     "build --verbose)"},
    {"exportLayerInfo", "FILE", kCmdAll, kRef, T,
     "use kiln inspect --json ENGINE > FILE: every layer's node, op, kernel and precision as JSON"},

    // kiln inspect and compare.
    {"json", "", I, kAcc, 0, "print JSON instead of text"},
    {"atol", "A", C, kAcc, 0, "absolute tolerance (default per precision; fp32: 1e-4)"},
    {"rtol", "R", C, kAcc, 0, "relative tolerance (default per precision; fp32: 1e-3)"},
    {"reference", "auto|ort|kiln", C, kAcc, 0,
     "the reference: ONNX Runtime, kiln's CPU kernels, or auto"},
    {"minCosine", "V", C, kAcc, 0,
     "an output passes only with a cosine similarity to the reference of at least V (0..1); "
     "with --minTop1 and no --atol/--rtol these judge alone (INT8 and FP16 engines, whose "
     "elementwise error near zero fails any tolerance that still catches a broken kernel)"},
    {"minTop1", "V", C, kAcc, 0,
     "an output of (batch, classes) scores passes only with a top-1 agreement of at least V "
     "(0..1); other outputs are judged by the other criteria"},

    {"verbose", "", kBuilds, kAcc, T,
     "print every stage with its time (a build: every layer too, and the shape log: symbol ranges, "
     "each node's shapes, each constraint the profile proof settled and how)"},
};

struct Named {
  uint32_t bit;
  const char* name;
};
constexpr Named kCommandNames[] = {
    {B, "build"}, {R, "run"}, {N, "bench"}, {I, "inspect"}, {C, "compare"}};

std::string md_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

std::span<const FlagDef> flag_table() { return kFlags; }

const FlagDef* find_flag_def(std::string_view name, uint32_t command) {
  for (const FlagDef& f : kFlags) {
    if (f.name == name && (f.commands & command)) return &f;
  }
  return nullptr;
}

std::string command_names(uint32_t commands) {
  if (commands == kCmdAll) return "every command";
  std::string s;
  for (const Named& c : kCommandNames) {
    if (commands & c.bit) s += (s.empty() ? "" : ", ") + std::string(c.name);
  }
  return s;
}

CommandSpec command_spec(uint32_t id, std::string name, std::string synopsis, std::string summary,
                         std::string positional) {
  CommandSpec spec{
      id, std::move(name), std::move(synopsis), std::move(summary), std::move(positional), {}};
  for (const FlagDef& f : kFlags) {
    if ((f.commands & id) && f.status != FlagStatus::kRefused) spec.flags.push_back(&f);
  }
  return spec;
}

void warn(std::string_view command, const std::string& message) {
  std::fprintf(stderr, "kiln %.*s: warning: %s\n", int(command.size()), command.data(),
               message.c_str());
}

std::string check_flag_table() {
  std::string problems;
  for (size_t i = 0; i < std::size(kFlags); ++i) {
    const FlagDef& a = kFlags[i];
    if (a.commands == 0 || a.text.empty())
      problems += "--" + std::string(a.name) + " has a row with no command or no text\n";
    for (size_t j = i + 1; j < std::size(kFlags); ++j) {
      const FlagDef& b = kFlags[j];
      if (a.name == b.name && (a.commands & b.commands)) {
        problems += "--" + std::string(a.name) + " has two rows for kiln " +
                    command_names(a.commands & b.commands) + "\n";
      }
    }
  }
  return problems;
}

std::string trtexec_flags_markdown() {
  std::string s =
      "# trtexec flags in kiln\n\n"
      "Generated by `scripts/gen_flags_doc.sh` (`kiln help-flags --markdown`) from the flag table "
      "in `tools/kiln/flag_table.cc`; do not edit. `tests/cli_test.cc` fails when this file and "
      "the table differ.\n\n"
      "Every trtexec flag kiln knows, by what kiln does with it:\n\n"
      "- **accepted**: the flag does what it does in trtexec, or what the last column says.\n"
      "- **warns**: accepted so that trtexec scripts keep working, with a warning on every use "
      "saying why it changes nothing (or is a deprecated spelling).\n"
      "- **refused**: exit 2 with the sentence in the last column.\n"
      "- **build flag**: it applies while an engine is built. Next to `--loadEngine` it has no "
      "effect, and kiln warns naming it.\n\n"
      "A flag that takes one value and is given twice warns when the values are the same, and is "
      "a usage error (exit 2) when they differ (two `--saveEngine` paths, say). The shape flags "
      "and `--profile` may repeat: `--profile=N` starts a profile, and the shape flags after it "
      "fill it. A flag this table does not name is an unknown flag (exit 2, with the nearest "
      "spelling).\n\n"
      "| flag | commands | kiln does | meaning in kiln, or why not |\n"
      "|---|---|---|---|\n";
  for (const FlagDef& f : kFlags) {
    if (!(f.traits & kTrtexec)) continue;
    std::string flag =
        "`--" + std::string(f.name) + (f.value.empty() ? "" : "=" + md_escape(f.value)) + "`";
    std::string status = f.status == FlagStatus::kAccepted ? "accepted"
                         : f.status == FlagStatus::kWarns  ? "warns"
                                                           : "refused";
    if ((f.traits & kBuildFlag) && (f.commands & kCmdLoadsEngines) &&
        f.status != FlagStatus::kRefused) {
      status += "; build flag";
    }
    s += "| " + flag + " | " + command_names(f.commands) + " | " + status + " | " +
         md_escape(f.text) + " |\n";
  }
  return s;
}

}  // namespace kiln::cli
