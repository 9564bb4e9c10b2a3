// Little-endian byte writer and bounds-checked reader for the engine file (its checksum is
// kiln::checksum64 in core/hash.h).
// The reader never trusts its input: every read that would run past the end is a Status, and counts
// are checked against the bytes left before anyone allocates for them.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/hash.h"
#include "core/status.h"

namespace kiln::plan {

class ByteWriter {
 public:
  void u8(uint8_t v) { buf_.push_back(v); }
  void u32(uint32_t v) { put_le(v, 4); }
  void u64(uint64_t v) { put_le(v, 8); }
  void i32(int32_t v) { put_le(uint32_t(v), 4); }
  void i64(int64_t v) { put_le(uint64_t(v), 8); }
  void f32(float v) { put_le(std::bit_cast<uint32_t>(v), 4); }
  // Strings are a u64 byte count followed by the bytes, no terminator.
  void str(std::string_view s) {
    u64(s.size());
    bytes({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
  }
  void bytes(std::span<const uint8_t> b) { buf_.insert(buf_.end(), b.begin(), b.end()); }
  // Zero-pads to a multiple of `alignment` and returns the new size.
  size_t align(size_t alignment) {
    while (buf_.size() % alignment != 0) buf_.push_back(0);
    return buf_.size();
  }
  // Overwrites 8 bytes written earlier (used to patch offsets and checksums in place).
  void patch_u64(size_t at, uint64_t v) {
    for (int k = 0; k < 8; ++k) buf_[at + k] = uint8_t(v >> (8 * k));
  }

  size_t size() const { return buf_.size(); }
  const std::vector<uint8_t>& data() const { return buf_; }
  std::vector<uint8_t> take() { return std::move(buf_); }

 private:
  void put_le(uint64_t v, int n) {
    for (int k = 0; k < n; ++k) buf_.push_back(uint8_t(v >> (8 * k)));
  }
  std::vector<uint8_t> buf_;
};

// Reads from a span; `where` names the region ("section GRPH", "header") in every error, and the
// error prefix says whether an overrun means a truncated file or a corrupted one.
class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> bytes, std::string where, bool overrun_is_truncation = false)
      : bytes_(bytes), where_(std::move(where)), overrun_is_truncation_(overrun_is_truncation) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }
  const std::string& where() const { return where_; }

  StatusOr<uint8_t> u8() {
    KILN_RETURN_IF_ERROR(need(1));
    return bytes_[pos_++];
  }
  StatusOr<uint32_t> u32() {
    KILN_RETURN_IF_ERROR(need(4));
    return uint32_t(get_le(4));
  }
  StatusOr<uint64_t> u64() {
    KILN_RETURN_IF_ERROR(need(8));
    return get_le(8);
  }
  StatusOr<int32_t> i32() {
    KILN_RETURN_IF_ERROR(need(4));
    return int32_t(uint32_t(get_le(4)));
  }
  StatusOr<int64_t> i64() {
    KILN_RETURN_IF_ERROR(need(8));
    return int64_t(get_le(8));
  }
  StatusOr<float> f32() {
    KILN_RETURN_IF_ERROR(need(4));
    return std::bit_cast<float>(uint32_t(get_le(4)));
  }
  StatusOr<std::string> str() {
    KILN_ASSIGN_OR_RETURN(uint64_t n, u64());
    if (n > remaining()) {
      return corrupted("string of " + std::to_string(n) + " bytes at offset " +
                       std::to_string(pos_ - 8) + " exceeds the " + std::to_string(remaining()) +
                       " bytes left");
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), size_t(n));
    pos_ += size_t(n);
    return s;
  }
  // A u64 element count, refused unless `count * min_elem_bytes` fits in what is left, so a hostile
  // count can never drive an allocation larger than the file itself.
  StatusOr<size_t> count(size_t min_elem_bytes, std::string_view what) {
    KILN_ASSIGN_OR_RETURN(uint64_t n, u64());
    size_t unit = min_elem_bytes == 0 ? 1 : min_elem_bytes;
    if (n > remaining() / unit) {
      return corrupted("count " + std::to_string(n) + " of " + std::string(what) + " at offset " +
                       std::to_string(pos_ - 8) + " exceeds the " + std::to_string(remaining()) +
                       " bytes left");
    }
    return size_t(n);
  }
  StatusOr<std::span<const uint8_t>> take(size_t n) {
    KILN_RETURN_IF_ERROR(need(n));
    auto s = bytes_.subspan(pos_, n);
    pos_ += n;
    return s;
  }

  Status corrupted(const std::string& what) const {
    return invalid_argument("engine file is corrupted: " + where_ + ": " + what);
  }

 private:
  Status need(size_t n) const {
    if (n <= remaining()) return ok_status();
    if (overrun_is_truncation_) {
      return invalid_argument("engine file is truncated: the " + where_ + " needs more than the " +
                              std::to_string(bytes_.size()) + " bytes present");
    }
    return corrupted("read of " + std::to_string(n) + " bytes at offset " + std::to_string(pos_) +
                     " runs past its end (" + std::to_string(bytes_.size()) + " bytes)");
  }
  uint64_t get_le(int n) {
    uint64_t v = 0;
    for (int k = 0; k < n; ++k) v |= uint64_t(bytes_[pos_ + k]) << (8 * k);
    pos_ += n;
    return v;
  }

  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
  std::string where_;
  bool overrun_is_truncation_;
};

}  // namespace kiln::plan
