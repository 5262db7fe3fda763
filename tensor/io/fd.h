// An owned POSIX file descriptor, closed when it goes out of scope (the file readers and writers
// of tensor/io and nn/models keep their descriptors in one, so no error path leaks one).
//
//   tg::io::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
//   if (fd.get() < 0) return absl::ErrnoToStatus(errno, ...);
#ifndef TAPEGRAD_TENSOR_IO_FD_H_
#define TAPEGRAD_TENSOR_IO_FD_H_

#include <unistd.h>

namespace tg::io {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now and reports close()'s error (a deferred write error on some filesystems).
  int Close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

}  // namespace tg::io

#endif  // TAPEGRAD_TENSOR_IO_FD_H_
