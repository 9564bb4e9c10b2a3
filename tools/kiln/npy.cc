// .npy reading and writing. The header is a Python dict literal; only the three keys NumPy writes
// are read, and every size is checked against the file before any byte is copied.
#include "npy.h"

#include <cstring>
#include <fstream>
#include <vector>

#include "core/checked.h"
#include "core/file.h"

namespace kiln::cli {
namespace {

struct NpyType {
  const char* descr;
  DType dtype;
};
// '|' marks one-byte types, '<' little-endian ones: the only byte order kiln reads or writes.
constexpr NpyType kNpyTypes[] = {
    {"<f4", DType::kFloat32}, {"<f8", DType::kFloat64}, {"<f2", DType::kFloat16},
    {"<i8", DType::kInt64},   {"<i4", DType::kInt32},   {"<i2", DType::kInt16},
    {"|i1", DType::kInt8},    {"|u1", DType::kUInt8},   {"<u2", DType::kUInt16},
    {"<u4", DType::kUInt32},  {"<u8", DType::kUInt64},  {"|b1", DType::kBool},
};

// The value after `'key':` in the header dict, up to the next ',' at depth 0 or the closing '}'.
std::string dict_value(const std::string& header, const std::string& key) {
  size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) return "";
  size_t colon = header.find(':', k);
  if (colon == std::string::npos) return "";
  int depth = 0;
  size_t i = colon + 1;
  std::string v;
  for (; i < header.size(); ++i) {
    char c = header[i];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if ((c == ',' || c == '}') && depth == 0) break;
    v += c;
  }
  size_t a = v.find_first_not_of(" "), b = v.find_last_not_of(" ");
  return a == std::string::npos ? "" : v.substr(a, b - a + 1);
}

}  // namespace

Result<Tensor> parse_npy(std::span<const uint8_t> bytes, const std::string& path) {
  const std::string bad = "'" + path + "' is not a valid .npy file: ";
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0)
    return failure(bad + "bad magic");
  int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return failure(bad + "truncated header");
    for (int i = 0; i < 4; ++i)
      header_len |= size_t(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    header_start = 12;
  } else {
    return failure(bad + "unsupported format version " + std::to_string(major));
  }
  if (header_start + header_len > bytes.size()) return failure(bad + "truncated header");
  std::string header(reinterpret_cast<const char*>(bytes.data()) + header_start, header_len);
  std::string descr = dict_value(header, "descr");
  std::string fortran = dict_value(header, "fortran_order");
  std::string shape_text = dict_value(header, "shape");
  if (descr.size() < 2 || shape_text.size() < 2 || shape_text.front() != '(' ||
      shape_text.back() != ')') {
    return failure(bad + "cannot read its header " + header);
  }
  descr = descr.substr(1, descr.size() - 2);
  if (fortran != "False")
    return failure(bad +
                   "Fortran-ordered arrays are not supported; save with np.ascontiguousarray");
  DType dtype = DType::kUndefined;
  for (const auto& t : kNpyTypes) {
    if (descr == t.descr || (descr[0] == '=' && descr.substr(1) == t.descr + 1)) dtype = t.dtype;
  }
  if (dtype == DType::kUndefined)
    return failure(bad + "dtype '" + descr + "' is not supported (big-endian or exotic)");
  Shape shape;
  std::string dims = shape_text.substr(1, shape_text.size() - 2);
  size_t start = 0;
  while (start < dims.size()) {
    size_t comma = dims.find(',', start);
    std::string tok =
        dims.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t a = tok.find_first_not_of(" "), b = tok.find_last_not_of(" ");
    if (a != std::string::npos) {
      tok = tok.substr(a, b - a + 1);
      char* end = nullptr;
      long long v = std::strtoll(tok.c_str(), &end, 10);
      if (*end != '\0' || v < 0) return failure(bad + "bad shape " + shape_text);
      shape.push_back(v);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  auto n = checked_numel(shape);
  if (!n) return failure(bad + "shape " + shape_text + " overflows");
  auto nbytes = checked_mul(*n, int64_t(dtype_size(dtype)));
  size_t data_start = header_start + header_len;
  if (!nbytes || size_t(*nbytes) != bytes.size() - data_start) {
    return failure(bad + "holds " + std::to_string(bytes.size() - data_start) +
                   " data bytes, but shape " + shape_text + " of " + descr + " needs " +
                   (nbytes ? std::to_string(*nbytes) : "too many"));
  }
  auto t = Tensor::zeros(dtype, shape);
  if (!t.ok()) return failure(t.status(), "reading '" + path + "'");
  std::memcpy(t->data(), bytes.data() + data_start, t->nbytes());
  return std::move(t).value();
}

Result<Tensor> read_npy(const std::string& path, uint64_t max_bytes, std::string_view what) {
  auto read = read_regular_file(path, max_bytes, what);
  if (!read.ok()) return failure(read.status().message());
  return parse_npy(*read, path);
}

Check write_npy(const std::string& path, const Tensor& tensor) {
  const char* descr = nullptr;
  for (const auto& t : kNpyTypes) {
    if (t.dtype == tensor.dtype()) descr = t.descr;
  }
  if (!descr)
    return failure("cannot write " + std::string(dtype_name(tensor.dtype())) + " to .npy");
  std::string shape = "(";
  for (size_t i = 0; i < tensor.shape().size(); ++i) {
    shape += std::to_string(tensor.shape()[i]) +
             (tensor.shape().size() == 1 || i + 1 < tensor.shape().size() ? "," : "");
  }
  shape += ")";
  std::string header =
      "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Magic + version + length + header + '\n' is padded to a multiple of 64, as NumPy does.
  size_t total = 10 + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::string bytes("\x93NUMPY\x01\x00", 8);
  bytes += char(header.size() & 0xff);
  bytes += char(header.size() >> 8);
  bytes += header;
  bytes.append(static_cast<const char*>(tensor.data()), tensor.nbytes());
  if (Status w = write_regular_file(path, bytes, "output"); !w.ok()) return failure(w.message());
  return ok();
}

}  // namespace kiln::cli
