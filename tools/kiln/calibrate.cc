#include "calibrate.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

extern char** environ;

namespace kiln::cli {

std::string kiln_python() {
  const char* env = std::getenv("KILN_PYTHON");
  return env && *env ? env : "python3";
}

namespace {

// TensorRT's calibration caches are text that starts with "TRT-" and its version: trtexec's
// habit is --calib=calib.cache, which kiln cannot read.
bool is_tensorrt_cache(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char head[4] = {};
  return f.read(head, 4) && std::memcmp(head, "TRT-", 4) == 0;
}

}  // namespace

Result<std::shared_ptr<CalibratedModel>> CalibratedModel::make(const std::string& onnx,
                                                               const CalibrationRequest& request) {
  namespace fs = std::filesystem;
  std::string data = request.data, cache = request.cache;
  if (!data.empty() && fs::is_regular_file(data) && is_tensorrt_cache(data)) {
    return usage_error("--calib=" + data +
                       " is a TensorRT calibration cache, which kiln cannot read; give the "
                       "calibration data (a folder of .npz feeds, or one .npz stacking samples), "
                       "or a kiln calibration cache (.json, written by --calibCache)");
  }
  // trtexec's --calib names a cache: a kiln cache given there is read as --calibCache.
  if (!data.empty() && fs::path(data).extension() == ".json") {
    if (!cache.empty() && cache != data) {
      return usage_error("--calib=" + data + " is a calibration cache and --calibCache=" + cache +
                         " another; give one");
    }
    if (!fs::is_regular_file(data)) {
      return usage_error("--calib=" + data + ": no such calibration cache");
    }
    cache = data;
    data.clear();
  }
  std::string templ = (fs::temp_directory_path() / "kiln-calib-XXXXXX").string();
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) {
    return failure("--calib: could not make a temporary folder (" +
                   std::string(std::strerror(errno)) + ")");
  }
  std::shared_ptr<CalibratedModel> model(new CalibratedModel());
  model->dir_ = buf.data();
  model->path_ = model->dir_ + "/model.int8.onnx";
  const std::string python = kiln_python();
  std::vector<std::string> argv = {python, "-m", "kiln.quantize", "--onnx=" + onnx,
                                   "--output=" + model->path_};
  if (!data.empty()) argv.push_back("--calib=" + data);
  if (!request.method.empty()) argv.push_back("--calibMethod=" + request.method);
  if (!cache.empty()) argv.push_back("--calibCache=" + cache);
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, python.c_str(), nullptr, nullptr, cargv.data(), environ);
  if (err != 0) {
    return failure("--calib: could not start " + python + " (" + std::strerror(err) +
                   "); calibration runs kiln.quantize from the Python package: pip install "
                   "'.[quantize]'");
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return failure("--calib: waiting for kiln.quantize failed");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return failure("--calib: calibrating '" + onnx + "' failed (kiln.quantize " +
                   (WIFEXITED(status) ? "exited " + std::to_string(WEXITSTATUS(status))
                                      : std::string("was killed")) +
                   "; its error is above)");
  }
  if (!fs::is_regular_file(model->path_)) {
    return failure("--calib: kiln.quantize wrote no model");
  }
  return model;
}

CalibratedModel::~CalibratedModel() {
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

}  // namespace kiln::cli
