// Reading files whose paths users give (models, external weights, engines, inputs, timing caches):
// only regular files, opened so that a FIFO or device never blocks, bounded before any byte is
// read.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kiln {

// An open regular file. open() follows symbolic links and refuses what is not a regular file (a
// directory, a device such as /dev/zero, a FIFO, a socket) and a file over `max_bytes`; errors
// name the file as "WHAT file 'PATH'". A missing file is kNotFound, everything else
// kInvalidArgument.
class RegularFile {
 public:
  static StatusOr<RegularFile> open(const std::string& path, uint64_t max_bytes,
                                    std::string_view what);
  RegularFile(RegularFile&& other) noexcept;
  RegularFile& operator=(RegularFile&& other) noexcept;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile();

  // The size fstat reported when the file was opened.
  uint64_t size() const { return size_; }
  // Exactly dst.size() bytes at `offset`; the file ending first (it shrank) is an error.
  Status read_at(uint64_t offset, std::span<uint8_t> dst) const;
  // The whole file, exactly size() bytes; a file that shrank or grew while read is an error.
  StatusOr<std::vector<uint8_t>> read_all() const;

 private:
  RegularFile(int fd, uint64_t size, std::string name) : fd_(fd), size_(size), name_(name) {}
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string name_;  // "WHAT file 'PATH'", for errors
};

// RegularFile::open(path, max_bytes, what) and read_all().
StatusOr<std::vector<uint8_t>> read_regular_file(const std::string& path, uint64_t max_bytes,
                                                 std::string_view what);

// Writes `bytes` as the file at `path`, only ever as a regular file: what exists there and is not
// one (a FIFO, whose open would block until a reader came, a device, a directory, a socket) is
// refused and left as it is; the bytes go to a new temporary file beside the target (created
// exclusively, no symbolic link followed) that then replaces it in one rename, so a reader never
// sees half a file and a failed write leaves the old one. A symbolic link keeps pointing where it
// did: the file it names is replaced. Errors name the file as "WHAT file 'PATH'".
Status write_regular_file(const std::string& path, std::span<const uint8_t> bytes,
                          std::string_view what);
Status write_regular_file(const std::string& path, std::string_view text, std::string_view what);

}  // namespace kiln
