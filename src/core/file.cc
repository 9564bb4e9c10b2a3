// RegularFile: open(O_NONBLOCK) then fstat on the descriptor, so the check and the read see the
// same file, and a FIFO without a writer is refused instead of waited on.
#include "core/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace kiln {
namespace {

std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "is a directory";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "is a device";
  if (S_ISFIFO(mode)) return "is a FIFO";
  if (S_ISSOCK(mode)) return "is a socket";
  return "is not a regular file";
}

}  // namespace

StatusOr<RegularFile> RegularFile::open(const std::string& path, uint64_t max_bytes,
                                        std::string_view what) {
  std::string name = std::string(what) + " file '" + path + "'";
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT) return not_found(name + " does not exist");
    return invalid_argument("cannot open " + name + ": " + std::strerror(e));
  }
  RegularFile file(fd, 0, name);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return invalid_argument("cannot stat " + name + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return invalid_argument(name + " " + kind_of(st.st_mode) + ", not a regular file");
  }
  if (uint64_t(st.st_size) > max_bytes) {
    return invalid_argument(name + " has " + std::to_string(st.st_size) + " bytes, more than the " +
                            std::to_string(max_bytes) + " a " + std::string(what) +
                            " file may have");
  }
  file.size_ = uint64_t(st.st_size);
  return file;
}

RegularFile::RegularFile(RegularFile&& other) noexcept
    : fd_(other.fd_), size_(other.size_), name_(std::move(other.name_)) {
  other.fd_ = -1;
}

RegularFile& RegularFile::operator=(RegularFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    size_ = other.size_;
    name_ = std::move(other.name_);
    other.fd_ = -1;
  }
  return *this;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status RegularFile::read_at(uint64_t offset, std::span<uint8_t> dst) const {
  size_t done = 0;
  while (done < dst.size()) {
    ssize_t got = ::pread(fd_, dst.data() + done, dst.size() - done, off_t(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return invalid_argument("cannot read " + name_ + ": " + std::strerror(errno));
    if (got == 0) {
      return invalid_argument(name_ + " ended at byte " + std::to_string(offset + done) +
                              " while " + std::to_string(offset + dst.size()) +
                              " were expected; it shrank while it was read");
    }
    done += size_t(got);
  }
  return ok_status();
}

StatusOr<std::vector<uint8_t>> RegularFile::read_all() const {
  std::vector<uint8_t> bytes(size_);
  KILN_RETURN_IF_ERROR(read_at(0, bytes));
  // One byte past the size fstat gave: a file still being written is refused rather than read
  // half-way.
  uint8_t extra;
  ssize_t got;
  do {
    got = ::pread(fd_, &extra, 1, off_t(size_));
  } while (got < 0 && errno == EINTR);
  if (got > 0) {
    return invalid_argument(name_ + " grew past " + std::to_string(size_) +
                            " bytes while it was read");
  }
  return bytes;
}

StatusOr<std::vector<uint8_t>> read_regular_file(const std::string& path, uint64_t max_bytes,
                                                 std::string_view what) {
  KILN_ASSIGN_OR_RETURN(RegularFile file, RegularFile::open(path, max_bytes, what));
  return file.read_all();
}

Status write_regular_file(const std::string& path, std::span<const uint8_t> bytes,
                          std::string_view what) {
  const std::string name = std::string(what) + " file '" + path + "'";
  if (path.empty()) return invalid_argument("cannot write " + name + ": the path is empty");
  std::string target = path;
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    char* resolved = ::realpath(path.c_str(), nullptr);
    if (!resolved) {
      return invalid_argument("cannot write " + name +
                              ": it is a symbolic link that names no file (" +
                              std::strerror(errno) + ")");
    }
    target = resolved;
    std::free(resolved);
  }
  if (::stat(target.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    const std::string kind = kind_of(st.st_mode);
    return invalid_argument("cannot write " + name + ": it exists and " + kind +
                            (kind == "is not a regular file" ? "" : ", not a regular file") +
                            "; kiln writes only regular files, and leaves it as it is");
  }
  // Beside the target, so the rename stays on one file system; the pid and a counter keep two
  // writers (processes or threads) from sharing a temporary file.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      target + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0)
    return invalid_argument("cannot write " + name + ": creating '" + tmp +
                            "': " + std::strerror(errno));
  auto fail = [&](const std::string& step, int e) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return invalid_argument("cannot write " + name + ": " + step + ": " + std::strerror(e));
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail("writing '" + tmp + "'", n < 0 ? errno : EIO);
    done += size_t(n);
  }
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return invalid_argument("cannot write " + name + ": closing '" + tmp +
                            "': " + std::strerror(e));
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return invalid_argument("cannot write " + name + ": renaming '" + tmp +
                            "' to it: " + std::strerror(e));
  }
  return ok_status();
}

Status write_regular_file(const std::string& path, std::string_view text, std::string_view what) {
  return write_regular_file(
      path, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()),
      what);
}

}  // namespace kiln
