// External tensor data and whole-file reads. An external location is untrusted: it must be a
// relative path that, after symlinks are resolved, stays inside the model's folder.
#include <charconv>
#include <filesystem>
#include <string>
#include <system_error>

#include "core/checked.h"
#include "core/file.h"
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

StatusOr<Tensor> read_external_data(const ::onnx::TensorProto& tp, const std::string& model_dir,
                                    DType dtype, const Shape& shape, int64_t nbytes) {
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
  // Only the tensor's own bytes are read from the file (checked against its size below), so
  // the file itself, which may hold every weight of a large model, needs no cap.
  auto file = RegularFile::open(full.string(), UINT64_MAX, "external data");
  if (!file.ok()) {
    Status st = file.status();
    return st.with_context(where);
  }
  const uint64_t file_size = file->size();

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
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(dtype, shape));
  if (nbytes == 0) return t;
  Status read = file->read_at(uint64_t(offset), {static_cast<uint8_t*>(t.data()), size_t(nbytes)});
  if (!read.ok()) return read.with_context(where);
  return t;
}

StatusOr<std::vector<uint8_t>> read_file_bytes(const std::string& path, uint64_t max_bytes,
                                               const std::string& what) {
  // No cap at open: the size is checked here, so the refusal can say how to fit under it.
  KILN_ASSIGN_OR_RETURN(RegularFile file, RegularFile::open(path, UINT64_MAX, what));
  if (file.size() > max_bytes) {
    return invalid_model(what + " file '" + path + "' is " + std::to_string(file.size()) +
                         " bytes; protobuf files are limited to 2 GiB (store weights as external "
                         "data next to the model)");
  }
  return file.read_all();
}

}  // namespace kiln::onnx
