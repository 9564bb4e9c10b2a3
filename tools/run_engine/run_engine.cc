// kiln_run_engine: loads an engine file and runs it with the runtime alone
// (include/kiln_runtime.h), linking no builder or frontend code, as a deployment would;
// tests/run_engine_test.sh keeps it so. Usage: kiln_run_engine ENGINE NAME=INPUT.npy... [--out=DIR]
// (DIR/OUTPUT.npy for each output)
#include <cstdio>
#include <map>
#include <string>

#include "core/file.h"
#include "kiln_runtime.h"
#include "npy.h"

namespace {

constexpr uint64_t kMaxFileBytes = uint64_t(1) << 40;

int fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "kiln_run_engine: %s\n", message.c_str());
  return code;
}

// An output name as a file name, as kiln run --exportOutput writes it.
std::string file_stem(const std::string& name) {
  std::string s = name;
  for (char& c : s) {
    if (c == '/' || c == '\\' || c == ':' || c == ' ') c = '_';
  }
  return s.empty() || s == "." || s == ".." ? "output" : s;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln;
  std::string engine_path, out_dir;
  std::map<std::string, std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    size_t eq = a.find('=');
    if (a.rfind("--out=", 0) == 0) {
      out_dir = a.substr(6);
    } else if (!a.empty() && a[0] != '-' && eq != std::string::npos && eq > 0) {
      files[a.substr(0, eq)] = a.substr(eq + 1);
    } else if (!a.empty() && a[0] != '-' && engine_path.empty()) {
      engine_path = a;
    } else {
      return fail("usage: kiln_run_engine ENGINE NAME=INPUT.npy... [--out=DIR]", 2);
    }
  }
  if (engine_path.empty())
    return fail("usage: kiln_run_engine ENGINE NAME=INPUT.npy... [--out=DIR]", 2);

  auto bytes = read_regular_file(engine_path, kMaxFileBytes, "engine");
  if (!bytes.ok()) return fail(bytes.status().to_string());
  auto engine = Engine::deserialize(*bytes);
  if (!engine.ok()) return fail("loading '" + engine_path + "': " + engine.status().to_string());
  auto ctx = engine->create_execution_context();
  if (!ctx.ok()) return fail(ctx.status().to_string());

  std::map<std::string, Tensor> inputs;
  for (int i = 0; i < engine->num_io_tensors(); ++i) {
    std::string name = engine->io_tensor_name(i);
    if (engine->tensor_mode(name) != TensorIOMode::kINPUT) continue;
    auto it = files.find(name);
    if (it == files.end())
      return fail("no file for input '" + name + "' (give " + name + "=FILE.npy)", 2);
    auto t = cli::read_npy(it->second, kMaxFileBytes, "input");
    if (!t.ok()) return fail(t.error().message);
    inputs.emplace(name, std::move(t).value());
    files.erase(it);
  }
  if (!files.empty())
    return fail("'" + files.begin()->first + "' is not an input of this engine", 2);

  auto outputs = (*ctx)->run(inputs);
  if (!outputs.ok()) return fail("running: " + outputs.status().to_string());
  for (int i = 0; i < engine->num_io_tensors(); ++i) {
    std::string name = engine->io_tensor_name(i);
    if (engine->tensor_mode(name) != TensorIOMode::kOUTPUT) continue;
    const Tensor& t = outputs->at(name);
    std::string shape;
    for (int64_t d : t.shape()) shape += (shape.empty() ? "" : "x") + std::to_string(d);
    std::printf("%s %s [%s]\n", name.c_str(), std::string(dtype_name(t.dtype())).c_str(),
                shape.c_str());
    if (!out_dir.empty()) {
      auto written = cli::write_npy(out_dir + "/" + file_stem(name) + ".npy", t);
      if (!written.ok()) return fail(written.error().message);
    }
  }
  return 0;
}
