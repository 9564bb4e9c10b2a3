// External tensor data and whole-file reads. An external location is untrusted: it must be a
// relative path that, after symlinks are resolved, stays inside the model's folder.
#include <charconv>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "core/checked.h"
#include "frontend/onnx/tensor_proto.h"

namespace kiln::onnx {
namespace fs = std::filesystem;
namespace {

std::optional<int64_t> parse_nonnegative(const std::string& s) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty() || v < 0) return std::nullopt;
  return v;
}

// True when `path` names `base` or something below it; both are canonical.
bool is_inside(const fs::path& path, const fs::path& base) {
  auto p = path.begin();
  for (auto b = base.begin(); b != base.end(); ++b, ++p) {
    if (b->empty()) continue;  // a trailing separator in base
    if (p == path.end() || *p != *b) return false;
  }
  return true;
}

}  // namespace

Status read_external_data(const ::onnx::TensorProto& tp, const std::string& model_dir,
                          int64_t nbytes, void* dst) {
  const std::string label = tensor_label(tp);
  std::string location;
  std::optional<std::string> offset_text, length_text;
  bool has_location = false;
  for (const auto& kv : tp.external_data()) {
    if (kv.key() == "location") {
      location = kv.value();
      has_location = true;
    } else if (kv.key() == "offset") {
      offset_text = kv.value();
    } else if (kv.key() == "length") {
      length_text = kv.value();
    }
  }
  if (!has_location || location.empty()) {
    return invalid_model(label + " is stored externally but has no 'location'");
  }
  const std::string where = label + " (external data '" + location + "')";
  if (model_dir.empty()) {
    return invalid_argument(where +
                            ": the model was loaded from memory, so there is no folder "
                            "to read external data from; load it with parse_file");
  }
  if (location.find('\0') != std::string::npos) {
    return invalid_model(where + ": the location contains a NUL byte");
  }
  const fs::path rel(location);
  if (rel.is_absolute() || rel.has_root_name() || rel.has_root_directory()) {
    return invalid_model(where + ": the location must be relative to the model's folder");
  }
  for (const auto& part : rel) {
    if (part == "..") {
      return invalid_model(where + ": the location may not contain '..'");
    }
  }

  std::error_code ec;
  const fs::path base = fs::weakly_canonical(fs::path(model_dir), ec);
  if (ec) return not_found(where + ": cannot resolve the model folder '" + model_dir + "'");
  const fs::path full = fs::weakly_canonical(fs::path(model_dir) / rel, ec);
  if (ec) return not_found(where + ": cannot resolve the path: " + ec.message());
  if (!is_inside(full, base)) {
    return invalid_model(where + ": the path resolves to '" + full.string() +
                         "', outside the model's folder '" + base.string() + "'");
  }
  if (!fs::is_regular_file(full, ec)) {
    return not_found(where + ": '" + full.string() + "' is not a readable file");
  }
  const uintmax_t file_size = fs::file_size(full, ec);
  if (ec) return not_found(where + ": cannot read the size of '" + full.string() + "'");

  int64_t offset = 0;
  if (offset_text) {
    auto v = parse_nonnegative(*offset_text);
    if (!v) return invalid_model(where + ": offset '" + *offset_text + "' is not a valid offset");
    offset = *v;
  }
  const int64_t size = int64_t(file_size);
  if (offset > size) {
    return invalid_model(where + ": offset " + std::to_string(offset) + " is past the end of the " +
                         std::to_string(size) + "-byte file");
  }
  int64_t length = size - offset;
  if (length_text) {
    auto v = parse_nonnegative(*length_text);
    if (!v) return invalid_model(where + ": length '" + *length_text + "' is not a valid length");
    length = *v;
  }
  auto end = checked_add(offset, length);
  if (!end || *end > size) {
    return invalid_model(where + ": offset " + std::to_string(offset) + " + length " +
                         std::to_string(length) + " runs past the end of the " +
                         std::to_string(size) + "-byte file");
  }
  if (length != nbytes) {
    return invalid_model(where + ": holds " + std::to_string(length) +
                         " bytes, but the tensor needs " + std::to_string(nbytes) + " bytes");
  }
  if (nbytes == 0) return ok_status();
  std::ifstream in(full, std::ios::binary);
  if (!in) return not_found(where + ": cannot open '" + full.string() + "'");
  in.seekg(std::streamoff(offset));
  in.read(static_cast<char*>(dst), std::streamsize(nbytes));
  if (!in || in.gcount() != std::streamsize(nbytes)) {
    return invalid_model(where + ": reading " + std::to_string(nbytes) + " bytes at offset " +
                         std::to_string(offset) + " failed");
  }
  return ok_status();
}

StatusOr<std::vector<uint8_t>> read_file_bytes(const std::string& path, uint64_t max_bytes,
                                               const std::string& what) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(path), ec)) {
    return not_found(what + " file '" + path + "' does not exist or is not a regular file");
  }
  const uintmax_t size = fs::file_size(fs::path(path), ec);
  if (ec) return not_found("cannot read the size of " + what + " file '" + path + "'");
  if (size > max_bytes) {
    return invalid_model(what + " file '" + path + "' is " + std::to_string(size) +
                         " bytes; protobuf files are limited to 2 GiB (store weights as external "
                         "data next to the model)");
  }
  std::vector<uint8_t> bytes(size);
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open " + what + " file '" + path + "'");
  if (size > 0) in.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(size));
  if (!in || in.gcount() != std::streamsize(size)) {
    return not_found("cannot read " + what + " file '" + path + "'");
  }
  return bytes;
}

}  // namespace kiln::onnx
