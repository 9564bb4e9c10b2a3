// The timing cache's entries and its file. The file, little-endian:
//   "KILNTCAC" magic, u32 format version, u64 entry count,
//   per entry, sorted by key: u64 FNV-1a 64 of the key, u64 length + key bytes, u64 length +
//   tactic, u64 checksum64 of every byte before it.
// Sorting makes the bytes a function of the entries alone (not of insertion or hash-table order).
#include "builder/timing_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/file.h"
#include "core/hash.h"
#include "plan/byte_io.h"

namespace kiln {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'T', 'C', 'A', 'C'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = sizeof(kMagic) + 4 + 8;

uint64_t key_hash(std::string_view key) {
  return fnv1a64({reinterpret_cast<const uint8_t*>(key.data()), key.size()});
}

// A bounds-checked little-endian reader over the checksummed part of a cache file. The checksum
// has been verified before it runs, so an overrun here means a file written wrong, not damage.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  std::optional<uint64_t> u64() {
    if (b_.size() - pos_ < 8) return std::nullopt;
    uint64_t v = 0;
    for (int k = 0; k < 8; ++k) v |= uint64_t(b_[pos_ + k]) << (8 * k);
    pos_ += 8;
    return v;
  }
  std::optional<std::string> str() {
    auto n = u64();
    if (!n || *n > b_.size() - pos_) return std::nullopt;
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), size_t(*n));
    pos_ += size_t(*n);
    return s;
  }
  size_t remaining() const { return b_.size() - pos_; }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

Status corrupted(const std::string& what) {
  return invalid_argument("the timing cache is corrupted: " + what);
}

}  // namespace

std::optional<std::string> TimingCache::lookup(std::string_view key) {
  auto it = by_hash_.find(key_hash(key));
  if (it != by_hash_.end()) {
    for (const Entry& e : it->second) {
      if (e.key == key) {
        ++hits_;
        return e.tactic;
      }
    }
  }
  ++misses_;
  return std::nullopt;
}

void TimingCache::insert(std::string key, std::string tactic) {
  std::vector<Entry>& bucket = by_hash_[key_hash(key)];
  for (Entry& e : bucket) {
    if (e.key == key) {
      e.tactic = std::move(tactic);
      return;
    }
  }
  bucket.push_back({std::move(key), std::move(tactic)});
  ++size_;
}

std::vector<std::pair<std::string, std::string>> TimingCache::entries() const {
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(size_);
  for (const auto& [hash, bucket] : by_hash_) {
    for (const Entry& e : bucket) out.emplace_back(e.key, e.tactic);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<uint8_t> TimingCache::serialize() const {
  plan::ByteWriter w;
  w.bytes({reinterpret_cast<const uint8_t*>(kMagic), sizeof(kMagic)});
  w.u32(kVersion);
  w.u64(size_);
  for (const auto& [key, tactic] : entries()) {
    w.u64(key_hash(key));
    w.str(key);
    w.str(tactic);
  }
  w.u64(checksum64(w.data()));
  return w.take();
}

StatusOr<TimingCache> TimingCache::deserialize(std::span<const uint8_t> bytes) {
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return invalid_argument("not a kiln timing cache (no KILNTCAC magic)");
  }
  if (bytes.size() < kHeaderBytes + 8) {
    return invalid_argument("the timing cache is truncated: " + std::to_string(bytes.size()) +
                            " bytes, less than its header and checksum");
  }
  uint32_t version = 0;
  for (int k = 0; k < 4; ++k) version |= uint32_t(bytes[sizeof(kMagic) + k]) << (8 * k);
  if (version != kVersion) {
    return invalid_argument("the timing cache has format version " + std::to_string(version) +
                            "; this kiln reads version " + std::to_string(kVersion));
  }
  std::span<const uint8_t> body = bytes.first(bytes.size() - 8);
  Reader tail(bytes.last(8));
  if (checksum64(body) != *tail.u64()) {
    return invalid_argument(
        "the timing cache is truncated or corrupted: its checksum does not match its bytes");
  }
  Reader r(body.subspan(kHeaderBytes - 8));
  uint64_t count = *r.u64();
  // Each entry takes at least its hash and two lengths: a count beyond that cannot be right.
  if (count > r.remaining() / 24) {
    return corrupted(std::to_string(count) + " entries cannot fit in " +
                     std::to_string(bytes.size()) + " bytes");
  }
  TimingCache cache;
  std::string previous;
  for (uint64_t i = 0; i < count; ++i) {
    auto hash = r.u64();
    auto key = r.str();
    auto tactic = hash && key ? r.str() : std::nullopt;
    if (!tactic) return corrupted("entry " + std::to_string(i) + " runs past the end");
    if (*hash != key_hash(*key)) {
      return corrupted("entry " + std::to_string(i) + " has a hash that is not its key's");
    }
    // The writer sorts and never repeats a key; anything else was not written by kiln.
    if (i > 0 && *key <= previous) {
      return corrupted("entry " + std::to_string(i) + " is out of order or repeated");
    }
    previous = *key;
    cache.insert(std::move(*key), std::move(*tactic));
  }
  if (r.remaining() != 0) {
    return corrupted(std::to_string(r.remaining()) + " bytes follow the last entry");
  }
  return cache;
}

StatusOr<TimingCache> TimingCache::load(const std::string& path) {
  auto bytes = read_regular_file(path, kMaxFileBytes, "timing cache");
  if (!bytes.ok() && bytes.status().code() == StatusCode::kNotFound) return TimingCache();
  if (!bytes.ok()) return bytes.status();
  auto cache = deserialize(*bytes);
  if (!cache.ok()) {
    return invalid_argument("timing cache '" + path + "': " + cache.status().message());
  }
  return cache;
}

Status TimingCache::save(const std::string& path) const {
  // Only ever a regular file, replaced in one rename (core/file.h): a device or FIFO given by
  // mistake (load() refused it) stays what it is, and a symbolic link keeps pointing where it did.
  return write_regular_file(path, serialize(), "timing cache");
}

}  // namespace kiln
