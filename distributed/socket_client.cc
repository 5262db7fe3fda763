#include "distributed/socket_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tg::dist {
namespace {

// The time left until `deadline` as a poll(2) timeout (at least 0).
int PollMillis(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

// One non-blocking connect to `ai`, waiting up to `deadline`. The connected fd, or -1 with the
// reason in `why`.
int ConnectOnce(const addrinfo* ai, absl::Time deadline, std::string* why) {
  const int fd =
      socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
  if (fd < 0) {
    *why = std::strerror(errno);
    return -1;
  }
  int rc;
  do {
    rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0 && errno != EINPROGRESS) {
    *why = std::strerror(errno);
    close(fd);
    return -1;
  }
  if (rc != 0) {
    pollfd p{fd, POLLOUT, 0};
    int n;
    do {
      n = poll(&p, 1, PollMillis(deadline));
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
      *why = n == 0 ? "connection timed out" : std::strerror(errno);
      close(fd);
      return -1;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      *why = std::strerror(err);
      close(fd);
      return -1;
    }
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

absl::StatusOr<int> ConnectWithRetry(const std::string& host, int port, absl::Duration timeout,
                                     absl::string_view server) {
  const std::string address = absl::StrCat(host, ":", port);
  if (port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("store: the port of ", server, " must be in [1, 65535], got ", port));
  }
  if (host.empty()) return absl::InvalidArgumentError(absl::StrCat("store: no host for ", server));
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(10);
  std::string why = "not tried";
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* list = nullptr;
    const std::string service = absl::StrCat(port);
    const int gai = getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
    if (gai != 0 && gai != EAI_AGAIN) {
      return absl::UnavailableError(absl::StrCat("store: cannot resolve ", server, " host '", host,
                                                 "': ", gai_strerror(gai)));
    }
    if (gai == EAI_AGAIN) why = gai_strerror(gai);
    for (const addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
      const int fd = ConnectOnce(ai, deadline, &why);
      if (fd >= 0) {
        freeaddrinfo(list);
        return fd;
      }
    }
    if (list != nullptr) freeaddrinfo(list);
    // Refused (no server yet), unreachable, timed out: retry until the deadline.
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("store: cannot connect to ", server, " at ",
                                                      address, " within ",
                                                      absl::FormatDuration(timeout), ": ", why));
    }
    absl::SleepFor(std::min(pause, deadline - absl::Now()));
    pause = std::min(pause * 2, absl::Milliseconds(500));
  }
}

absl::StatusOr<std::unique_ptr<SocketClient>> SocketClient::Connect(const std::string& host,
                                                                    int port,
                                                                    absl::Duration timeout,
                                                                    Peer peer) {
  absl::StatusOr<int> fd = ConnectWithRetry(host, port, timeout, peer.server);
  if (!fd.ok()) return fd.status();
  return std::unique_ptr<SocketClient>(
      new SocketClient(*fd, absl::StrCat(host, ":", port), timeout, std::move(peer)));
}

SocketClient::SocketClient(int fd, std::string address, absl::Duration timeout, Peer peer)
    : fd_(fd), address_(std::move(address)), timeout_(timeout), peer_(std::move(peer)) {}

SocketClient::~SocketClient() {
  if (fd_ >= 0) close(fd_);
}

absl::Status SocketClient::Fail(absl::Status status) {
  if (broken_.ok()) broken_ = status;
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  return status;
}

absl::Status SocketClient::Malformed(absl::string_view detail) {
  return Fail(absl::DataLossError(
      absl::StrCat("store: malformed reply from ", peer_.server, " at ", address_, detail)));
}

absl::Status SocketClient::Closed() {
  return Fail(
      absl::UnavailableError(absl::StrCat("store: ", peer_.server, " at ", address_,
                                          " closed the connection (", peer_.who_closes, ")")));
}

absl::StatusOr<bool> SocketClient::Ready(short events, absl::Time deadline) {
  for (;;) {
    pollfd p{fd_, events, 0};
    const int n = poll(&p, 1, PollMillis(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::UnavailableError(absl::StrCat("poll: ", std::strerror(errno)));
    return n > 0;
  }
}

absl::StatusOr<bool> SocketClient::WaitReadable(absl::Time deadline) {
  if (!broken_.ok()) return broken_;
  absl::StatusOr<bool> ready = Ready(POLLIN, deadline);
  if (!ready.ok()) return Fail(ready.status());
  return *ready;
}

absl::Status SocketClient::SendAll(absl::string_view bytes, absl::Time deadline) {
  if (!broken_.ok()) return broken_;
  for (size_t sent = 0; sent < bytes.size();) {
    const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      absl::StatusOr<bool> ready = Ready(POLLOUT, deadline);
      if (!ready.ok()) return Fail(ready.status());
      if (!*ready) {
        return Fail(absl::DeadlineExceededError(absl::StrCat("store: sending to ", peer_.server,
                                                             " at ", address_, " timed out after ",
                                                             absl::FormatDuration(timeout_))));
      }
      continue;
    }
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) return Closed();
    return Fail(absl::UnavailableError(absl::StrCat("store: sending to ", peer_.server, " at ",
                                                    address_, " failed: ", std::strerror(errno))));
  }
  return absl::OkStatus();
}

absl::Status SocketClient::RecvExact(size_t size, absl::Time deadline, std::string* out) {
  if (!broken_.ok()) return broken_;
  out->resize(size);
  for (size_t got = 0; got < size;) {
    const ssize_t n = recv(fd_, out->data() + got, size - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return Closed();
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      absl::StatusOr<bool> ready = Ready(POLLIN, deadline);
      if (!ready.ok()) return Fail(ready.status());
      if (!*ready) {
        return Fail(absl::DeadlineExceededError(absl::StrCat("store: no reply from ", peer_.server,
                                                             " at ", address_, " within ",
                                                             absl::FormatDuration(timeout_))));
      }
      continue;
    }
    return Fail(absl::UnavailableError(absl::StrCat("store: receiving from ", peer_.server, " at ",
                                                    address_, " failed: ", std::strerror(errno))));
  }
  return absl::OkStatus();
}

}  // namespace tg::dist
