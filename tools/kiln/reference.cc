// The references kiln compare measures against. The ONNX Runtime one runs out of process (a
// Python helper), so kiln needs no ORT at build time; tensors cross as .npy files in a temp dir.
#include "reference.h"

#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "npy.h"

namespace kiln::cli {
namespace {

constexpr uint64_t kMaxReferenceBytes = uint64_t(16) << 30;

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// A temp folder removed when this goes out of scope.
struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kiln-compare-XXXXXX").string();
    if (mkdtemp(tmpl.data())) path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

std::string script_path() {
  if (const char* env = std::getenv("KILN_ORT_REFERENCE")) return env;
  return std::string(KILN_SOURCE_DIR) + "/scripts/ort_reference.py";
}

}  // namespace

Result<std::optional<Reference>> ort_reference(const std::string& model,
                                               const std::vector<std::string>& order,
                                               const std::map<std::string, Tensor>& inputs,
                                               std::string* why) {
  std::string script = script_path();
  if (!std::filesystem::exists(script)) {
    *why = "the helper " + script + " is missing (set KILN_ORT_REFERENCE)";
    return std::optional<Reference>();
  }
  TempDir dir;
  if (dir.path.empty()) return failure("cannot create a temporary directory for the reference run");
  const char* python = std::getenv("KILN_PYTHON");
  std::string cmd = shell_quote(python ? python : "python3") + " " + shell_quote(script) +
                    " --model " + shell_quote(model);
  for (size_t i = 0; i < order.size(); ++i) {
    std::string path = dir.path + "/input_" + std::to_string(i) + ".npy";
    KILN_CLI_TRY(write_npy(path, inputs.at(order[i])));
    cmd += " --input " + shell_quote(order[i] + "=" + path);
  }
  std::string out_dir = dir.path + "/out";
  std::string err_file = dir.path + "/stderr.txt";
  cmd += " --output-dir " + shell_quote(out_dir) + " 2>" + shell_quote(err_file);
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return failure("cannot start " + cmd);
  std::string text;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) text.append(buf, n);
  int status = pclose(pipe);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::string err;
  if (FILE* f = std::fopen(err_file.c_str(), "r")) {
    while (size_t n = fread(buf, 1, sizeof buf, f)) err.append(buf, n);
    std::fclose(f);
  }
  while (!err.empty() && err.back() == '\n') err.pop_back();
  if (code == 3 || code == 127) {
    *why = code == 127 ? "the Python interpreter (" + std::string(python ? python : "python3") +
                             ") was not found"
                       : err;
    return std::optional<Reference>();
  }
  if (code != 0)
    return failure("ONNX Runtime failed on " + model + " (exit " + std::to_string(code) + "):\n" +
                   err);

  Reference ref;
  std::istringstream lines(text);
  std::string line, version;
  while (std::getline(lines, line)) {
    if (line.rfind("onnxruntime ", 0) == 0) version = line.substr(12);
    if (line.rfind("output\t", 0) != 0) continue;
    size_t t1 = line.find('\t', 7);
    if (t1 == std::string::npos) return failure("cannot read the helper's line '" + line + "'");
    std::string k = line.substr(7, t1 - 7), name = line.substr(t1 + 1);
    // Written by the helper into kiln's own temporary folder; the cap only keeps a runaway
    // output from exhausting memory.
    KILN_CLI_ASSIGN(Tensor t, read_npy(out_dir + "/output_" + k + ".npy", kMaxReferenceBytes,
                                       "reference output"));
    ref.outputs[name] = std::move(t);
  }
  ref.description =
      "ONNX Runtime " + version + ", CPUExecutionProvider, FP32 (the reference computes in FP32)";
  return std::optional<Reference>(std::move(ref));
}

Result<Reference> kiln_cpu_reference(const Network& network,
                                     const std::map<std::string, Tensor>& inputs) {
  BuilderConfig config;
  config.clear_flag(BuilderFlag::kTF32);
  OptimizationProfile profile;
  for (const auto& [name, t] : inputs) {
    Status st = profile.set_dimensions(name, t.shape(), t.shape(), t.shape());
    if (!st.ok()) return failure(st, "reference profile");
  }
  config.add_profile(profile);
  auto engine = Builder(Device::kCPU).build(network, config);
  if (!engine.ok()) return failure(engine.status(), "building the kiln CPU reference");
  auto ctx = engine->create_execution_context();
  if (!ctx.ok()) return failure(ctx.status(), "kiln CPU reference");
  auto outputs = (*ctx)->run(inputs);
  if (!outputs.ok()) return failure(outputs.status(), "running the kiln CPU reference");
  return Reference{"kiln CPU reference kernels (FP32), strict FP32", std::move(outputs).value()};
}

}  // namespace kiln::cli
