// kiln: the command-line tool. trtexec's spellings for build/run/bench, polygraphy's habits for
// compare; every subcommand parses flags, calls the public API, and prints.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "calibrate.h"
#include "commands.h"
#include "plan/plan.h"

namespace kiln::cli {

int report(const std::string& command, const Error& error) {
  std::fprintf(stderr, "kiln %s: error: %s\n", command.c_str(), error.message.c_str());
  return error.exit_code;
}

namespace {

constexpr const char* kUsage =
    "usage: kiln COMMAND [flags]\n"
    "\n"
    "kiln builds an optimized engine from an ONNX model for optimization profiles (min/opt/max\n"
    "shapes of every dynamic input) and runs it at any shape inside them.\n"
    "\n"
    "commands:\n"
    "  build     build an engine:  kiln build --onnx=m.onnx --saveEngine=m.kiln \\\n"
    "              --minShapes=x:1x3x224x224 --optShapes=x:8x3x224x224 --maxShapes=x:32x3x224x224\n"
    "  run       run an engine on seeded random inputs or files:  kiln run --loadEngine=m.kiln "
    "--shapes=x:4x3x224x224\n"
    "  bench     time an engine: latency percentiles and throughput\n"
    "  inspect   describe a model (and what kiln does not support) or an engine\n"
    "  compare   compare kiln's outputs with ONNX Runtime's FP32 outputs (exit 0 pass, 1 fail)\n"
    "  serve     serve an engine on Ray Serve (the Python package's kiln.serve):  kiln serve \\\n"
    "              --loadEngine=m.kiln --replicas=2 --maxBatch=32 --port=8000\n"
    "  quantize  calibrate a model and write it with int8 or fp8 Q/DQ nodes (kiln.quantize):\n"
    "              kiln quantize --onnx=m.onnx --calib=data.npz --output=m.int8.onnx\n"
    "\n"
    "kiln COMMAND --help shows a command's flags; kiln help-flags, what kiln does with each\n"
    "trtexec flag. Exit status: 0 ok, 1 failure, 2 bad command line, 3 internal error.\n";

int dispatch(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return kExitUsage;
  }
  std::string command = argv[1];
  Argv rest(argv + 2, argv + argc);
  if (command == "-h" || command == "--help" || command == "help") {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (command == "--version" || command == "version") {
    std::printf("kiln %s (engine format %u)\n", kiln::plan::kKilnVersion,
                kiln::plan::kFormatVersion);
    return kExitOk;
  }
  if (command.rfind("--", 0) == 0) {
    // trtexec has no subcommands: say which one its users mean instead of guessing.
    std::fprintf(stderr,
                 "kiln: '%s' is a flag, but a COMMAND comes first; trtexec's "
                 "`trtexec --onnx=m.onnx --saveEngine=m.kiln` is `kiln build --onnx=m.onnx "
                 "--saveEngine=m.kiln`, "
                 "and `trtexec --loadEngine=m.kiln` is `kiln bench --loadEngine=m.kiln`\n\n%s",
                 argv[1], kUsage);
    return kExitUsage;
  }
  if (command == "build") return build_command(rest);
  if (command == "run") return run_command(rest);
  if (command == "bench") return bench_command(rest);
  if (command == "inspect") return inspect_command(rest);
  if (command == "compare") return compare_command(rest);
  if (command == "serve" || command == "quantize") {
    // Serving (Ray Serve) and quantization (calibration writes an ONNX model) run in Python: the
    // Python that installed kiln (the wheel's `kiln` sets KILN_PYTHON), else python3 from PATH.
    const std::string python = kiln_python();
    const std::string module = "kiln." + command;
    std::vector<char*> args = {const_cast<char*>(python.c_str()), const_cast<char*>("-m"),
                               const_cast<char*>(module.c_str())};
    for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
    args.push_back(nullptr);
    std::fflush(stdout);
    execvp(python.c_str(), args.data());
    std::fprintf(stderr,
                 "kiln %s: error: could not start %s (%s); kiln %s runs %s from the Python "
                 "package: pip install '.%s'\n",
                 command.c_str(), python.c_str(), std::strerror(errno), command.c_str(),
                 module.c_str(), command == "serve" ? "[serve]" : "[quantize]");
    return kExitFail;
  }
  if (command == "help-flags") {
    // Hidden: the flag table, for scripts/gen_flags_doc.sh (docs/trtexec_flags.md) and for users
    // who ask what kiln does with a trtexec flag.
    if (rest.size() > 1 || (rest.size() == 1 && rest[0] != "--markdown")) {
      std::fputs("usage: kiln help-flags [--markdown]\n", stderr);
      return kExitUsage;
    }
    if (std::string problems = check_flag_table(); !problems.empty()) {
      std::fprintf(stderr, "kiln help-flags: the flag table is inconsistent:\n%s",
                   problems.c_str());
      return kExitFail;
    }
    if (rest.empty()) {
      for (const FlagDef& f : flag_table()) {
        if (!(f.traits & kTrtexec)) continue;
        const char* status = f.status == FlagStatus::kAccepted ? "accepted"
                             : f.status == FlagStatus::kWarns  ? "warns"
                                                               : "refused";
        std::printf("--%.*s  [%s] %s: %.*s\n", int(f.name.size()), f.name.data(),
                    command_names(f.commands).c_str(), status, int(f.text.size()), f.text.data());
      }
      return kExitOk;
    }
    std::fputs(trtexec_flags_markdown().c_str(), stdout);
    return kExitOk;
  }
  std::fprintf(stderr, "kiln: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return kExitUsage;
}

}  // namespace
}  // namespace kiln::cli

// The library returns Status and never throws on user input, but the standard library can (an
// allocation, a filesystem call): whatever escapes is reported as a bug with an exit code of its
// own, never left to std::terminate.
int main(int argc, char** argv) {
  using namespace kiln::cli;
  try {
    return dispatch(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln: internal error: %s (please report this with the command line)\n",
                 e.what());
  } catch (...) {
    std::fputs(
        "kiln: internal error: an unknown exception (please report this with the command "
        "line)\n",
        stderr);
  }
  return kExitInternal;
}
