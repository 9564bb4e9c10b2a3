// The timing cache (TensorRT's ITimingCache): the tactic the builder chose for each layer
// signature, so that a rebuild with the cache times nothing and writes a byte-identical engine.
// Kept in a file between builds (kiln build --timingCacheFile=FILE); the format is described in
// timing_cache.cc.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"

namespace kiln {

class TimingCache {
 public:
  // Files larger than this are refused unread: a cache holds a few hundred bytes per distinct
  // layer, so anything near it is not a timing cache.
  static constexpr uint64_t kMaxFileBytes = uint64_t(64) << 20;

  // The tactic recorded for `key` (the builder's canonical text of a layer signature, see
  // builder::timing_cache_key), counted as a hit; nullopt counted as a miss. Entries are found by a
  // 64-bit hash of the key and then compared by their full text, so a hash collision is a miss.
  std::optional<std::string> lookup(std::string_view key);
  // Records the tactic for `key`, replacing any earlier one.
  void insert(std::string key, std::string tactic);
  size_t size() const { return size_; }
  // Every entry as (key, tactic), sorted by key: the order the file stores them in.
  std::vector<std::pair<std::string, std::string>> entries() const;

  // Lookups since the cache was made: a hit reused a tactic, a miss had the implementation rank its
  // tactics (timing them on a device) and inserted the result.
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }

  // The file's bytes; the same entries always give the same bytes.
  std::vector<uint8_t> serialize() const;
  // kInvalidArgument naming what is wrong: another magic or version, a checksum that does not
  // match (truncated or corrupted), an entry whose hash is not its key's.
  static StatusOr<TimingCache> deserialize(std::span<const uint8_t> bytes);
  // Reads a cache file. A file that does not exist is an empty cache (the build then writes it). A
  // directory, device or FIFO, a file over kMaxFileBytes, or one deserialize() refuses is an error
  // naming the file and the reason, never a hang: the caller warns and builds with an empty cache,
  // as TensorRT does with a cache it cannot use.
  static StatusOr<TimingCache> load(const std::string& path);
  // Writes the file atomically (a temporary file beside it, then rename), so a build that is
  // interrupted, or runs beside another, never leaves a half-written cache.
  Status save(const std::string& path) const;

 private:
  struct Entry {
    std::string key, tactic;
  };
  std::unordered_map<uint64_t, std::vector<Entry>> by_hash_;
  size_t size_ = 0;
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace kiln
