#include "distributed/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "distributed/socket_client.h"

namespace tg::dist {
namespace {

enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4 };
enum Reply : uint8_t { kOk = 0, kError = 1 };

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutI64(std::string* out, int64_t v) {
  const uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}
void PutStr(std::string* out, absl::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s.data(), s.size());
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

// Reads the fields of a request or reply; every read is bounds-checked.
class Reader {
 public:
  explicit Reader(absl::string_view data) : data_(data) {}
  bool U8(uint8_t* v) {
    if (data_.empty()) return false;
    *v = static_cast<uint8_t>(data_[0]);
    data_.remove_prefix(1);
    return true;
  }
  bool U32(uint32_t* v) {
    if (data_.size() < 4) return false;
    *v = GetU32(data_.data());
    data_.remove_prefix(4);
    return true;
  }
  bool I64(int64_t* v) {
    if (data_.size() < 8) return false;
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= uint64_t{static_cast<unsigned char>(data_[i])} << (8 * i);
    *v = static_cast<int64_t>(u);
    data_.remove_prefix(8);
    return true;
  }
  // A string of at most `max` bytes; `what` names it in `error`.
  bool Str(std::string* s, size_t max, const char* what, std::string* error) {
    uint32_t n;
    if (!U32(&n)) {
      *error = absl::StrCat("malformed request: truncated ", what, " size");
      return false;
    }
    if (n > max) {
      *error = absl::StrCat(what, " of ", n, " bytes exceeds the limit of ", max);
      return false;
    }
    if (data_.size() < n) {
      *error = absl::StrCat("malformed request: ", what, " of ", n, " bytes but ", data_.size(),
                            " left in the frame");
      return false;
    }
    s->assign(data_.data(), n);
    data_.remove_prefix(n);
    return true;
  }
  size_t left() const { return data_.size(); }

 private:
  absl::string_view data_;
};

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Server

struct TcpStoreServer::State {
  struct Conn {
    int fd = -1;
    std::string in;        // bytes received, not yet a whole frame
    std::string out;       // reply bytes not yet sent
    size_t out_pos = 0;    // sent prefix of `out`
    bool closing = false;  // close once `out` is sent (after a malformed request)
  };
  std::map<std::string, std::string> data;
  size_t bytes = 0;  // keys + values in `data`
  std::vector<Conn> conns;

  // Handles one request; false when the connection must be closed after the reply.
  bool Handle(absl::string_view request, std::string* reply_body) {
    std::string body, error;
    const bool keep = Dispatch(request, &body, &error);
    std::string frame;
    if (error.empty()) {
      frame.push_back(static_cast<char>(kOk));
      frame += body;
    } else {
      frame.push_back(static_cast<char>(kError));
      frame += error;
    }
    PutU32(reply_body, static_cast<uint32_t>(frame.size()));
    *reply_body += frame;
    return keep;
  }

  // Fills `body` or `error`; false when the request is malformed (framing no longer trusted).
  bool Dispatch(absl::string_view request, std::string* body, std::string* error) {
    Reader r(request);
    uint8_t op;
    if (!r.U8(&op)) {
      *error = "malformed request: empty frame";
      return false;
    }
    std::string key, value;
    switch (op) {
      case kSet: {
        if (!r.Str(&key, kTcpStoreMaxKey, "key", error) ||
            !r.Str(&value, kTcpStoreMaxValue, "value", error)) {
          return false;
        }
        if (r.left() != 0) break;
        auto it = data.find(key);
        const size_t old = it == data.end() ? 0 : key.size() + it->second.size();
        if (bytes - old + key.size() + value.size() > kTcpStoreMaxBytes) {
          *error = absl::StrCat("the store is full (", kTcpStoreMaxBytes,
                                " bytes of keys and values); setting '", key, "' refused");
          return true;
        }
        bytes = bytes - old + key.size() + value.size();
        data[key] = std::move(value);
        return true;
      }
      case kGet: {
        if (!r.Str(&key, kTcpStoreMaxKey, "key", error)) return false;
        if (r.left() != 0) break;
        auto it = data.find(key);
        body->push_back(it == data.end() ? 0 : 1);
        if (it != data.end()) PutStr(body, it->second);
        return true;
      }
      case kAdd: {
        int64_t delta;
        if (!r.Str(&key, kTcpStoreMaxKey, "key", error)) return false;
        if (!r.I64(&delta)) {
          *error = "malformed request: truncated add delta";
          return false;
        }
        if (r.left() != 0) break;
        int64_t current = 0;
        auto it = data.find(key);
        if (it != data.end() && !absl::SimpleAtoi(it->second, &current)) {
          *error = absl::StrCat("add: the value of '", key, "' is not an integer");
          return true;
        }
        if ((delta > 0 && current > std::numeric_limits<int64_t>::max() - delta) ||
            (delta < 0 && current < std::numeric_limits<int64_t>::min() - delta)) {
          *error = absl::StrCat("add: ", current, " + ", delta, " under '", key, "' overflows");
          return true;
        }
        const std::string text = absl::StrCat(current + delta);
        const size_t old = it == data.end() ? 0 : key.size() + it->second.size();
        if (bytes - old + key.size() + text.size() > kTcpStoreMaxBytes) {
          *error = absl::StrCat("the store is full (", kTcpStoreMaxBytes,
                                " bytes of keys and values); add to '", key, "' refused");
          return true;
        }
        bytes = bytes - old + key.size() + text.size();
        data[key] = text;
        PutI64(body, current + delta);
        return true;
      }
      case kCheck: {
        uint32_t n;
        if (!r.U32(&n)) {
          *error = "malformed request: truncated key count";
          return false;
        }
        if (n > r.left() / 4) {  // every key takes at least its 4-byte size
          *error = absl::StrCat("malformed request: ", n, " keys cannot fit in the frame");
          return false;
        }
        for (uint32_t i = 0; i < n; ++i) {
          if (!r.Str(&key, kTcpStoreMaxKey, "key", error)) return false;
          body->push_back(data.count(key) ? 1 : 0);
        }
        if (r.left() != 0) break;
        return true;
      }
      default:
        *error = absl::StrCat("malformed request: unknown op ", int{op});
        return false;
    }
    body->clear();
    *error =
        absl::StrCat("malformed request: ", r.left(), " bytes after the fields of op ", int{op});
    return false;
  }
};

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(int port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("store: TCP store port must be in [0, 65535], got ", port));
  }
  // Every interface, IPv6 with IPv4-mapped addresses when the host has IPv6, else IPv4.
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1, zero = 0;
  std::string why;
  if (fd >= 0) {
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(static_cast<uint16_t>(port));
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      why = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  if (fd < 0 && why.empty()) {  // no IPv6 here
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      return absl::UnavailableError(
          absl::StrCat("store: cannot create the TCP store's socket: ", std::strerror(errno)));
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      why = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("store: cannot host the TCP store on port ", port, ": ", why));
  }
  if (listen(fd, 1024) != 0) {
    why = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("store: cannot listen on port ", port, " for the TCP store: ", why));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int actual = bound.ss_family == AF_INET6
                         ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                         : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  SetNonBlocking(fd);
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer(fd, actual));
  if (pipe2(server->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::UnavailableError(
        absl::StrCat("store: TCP store: pipe failed: ", std::strerror(errno)));
  }
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

TcpStoreServer::TcpStoreServer(int listen_fd, int port)
    : listen_fd_(listen_fd), port_(port), state_(std::make_unique<State>()) {}

TcpStoreServer::~TcpStoreServer() {
  if (thread_.joinable()) {
    const char byte = 1;
    while (write(wake_[1], &byte, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  for (auto& c : state_->conns) close(c.fd);
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void TcpStoreServer::Loop() {
  State& st = *state_;
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const auto& c : st.conns) {
      short events = 0;
      // No new requests from a client that does not read its replies (bounded memory).
      if (!c.closing && c.out.size() - c.out_pos < kTcpStoreMaxFrame) events |= POLLIN;
      if (c.out_pos < c.out.size()) events |= POLLOUT;
      fds.push_back({c.fd, events, 0});
    }
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;  // nothing sensible left to do; clients see the connections close
    }
    if (fds[0].revents != 0) return;
    if (fds[1].revents & POLLIN) {
      for (;;) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;  // EAGAIN, or out of descriptors (the client's connect times out)
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        st.conns.emplace_back().fd = fd;
      }
    }
    // fds[2 + i] belongs to conns[i] for the connections that existed before accepting.
    std::vector<bool> dead(st.conns.size(), false);
    for (size_t i = 0; i + 2 < fds.size(); ++i) {
      State::Conn& c = st.conns[i];
      const short rev = fds[i + 2].revents;
      if (rev == 0) continue;
      if (rev & POLLIN) {
        bool eof = false;
        char buf[64 << 10];
        for (;;) {
          const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
          if (n > 0) {
            c.in.append(buf, static_cast<size_t>(n));
            if (c.in.size() >= 4 + kTcpStoreMaxFrame) break;
            continue;
          }
          if (n < 0 && errno == EINTR) continue;
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
          // EOF (the client is done sending: answer what it sent, then close) or a reset.
          if (n == 0) {
            eof = true;
          } else {
            dead[i] = true;
          }
          break;
        }
        size_t used = 0;
        while (!dead[i] && !c.closing && c.in.size() - used >= 4) {
          const uint32_t len = GetU32(c.in.data() + used);
          if (len > kTcpStoreMaxFrame) {
            std::string frame(1, static_cast<char>(kError));
            frame +=
                absl::StrCat("request of ", len, " bytes exceeds the limit of ", kTcpStoreMaxFrame);
            PutU32(&c.out, static_cast<uint32_t>(frame.size()));
            c.out += frame;
            c.closing = true;
            break;
          }
          if (c.in.size() - used - 4 < len) break;
          const bool keep = st.Handle(absl::string_view(c.in).substr(used + 4, len), &c.out);
          used += 4 + len;
          if (!keep) c.closing = true;
        }
        c.in.erase(0, used);
        if (eof) c.closing = true;
      } else if (rev & (POLLERR | POLLHUP | POLLNVAL)) {
        dead[i] = true;
      }
      while (!dead[i] && c.out_pos < c.out.size()) {
        const ssize_t n =
            send(c.fd, c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL);
        if (n > 0) {
          c.out_pos += static_cast<size_t>(n);
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        dead[i] = true;
      }
      if (c.out_pos == c.out.size()) {
        c.out.clear();
        c.out_pos = 0;
        if (c.closing) dead[i] = true;
      }
    }
    size_t kept = 0;
    for (size_t i = 0; i < st.conns.size(); ++i) {
      if (i < dead.size() && dead[i]) {
        close(st.conns[i].fd);
      } else {
        st.conns[kept++] = std::move(st.conns[i]);
      }
    }
    st.conns.resize(kept);
  }
}

// ---------------------------------------------------------------------------------------------
// Client

absl::StatusOr<std::unique_ptr<TcpStoreClient>> TcpStoreClient::Connect(const std::string& host,
                                                                        int port,
                                                                        absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<SocketClient>> socket = SocketClient::Connect(
      host, port, timeout,
      {"the TCP store", "the process hosting it, rank 0, has exited or stopped it"});
  if (!socket.ok()) return socket.status();
  return std::unique_ptr<TcpStoreClient>(new TcpStoreClient(*std::move(socket)));
}

TcpStoreClient::TcpStoreClient(std::unique_ptr<SocketClient> socket) : socket_(std::move(socket)) {}

TcpStoreClient::~TcpStoreClient() = default;

const std::string& TcpStoreClient::address() const { return socket_->address(); }

absl::StatusOr<std::string> TcpStoreClient::Call(const std::string& request) {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time deadline = absl::Now() + socket_->timeout();
  std::string frame;
  PutU32(&frame, static_cast<uint32_t>(request.size()));
  frame += request;
  if (absl::Status s = socket_->SendAll(frame, deadline); !s.ok()) return s;
  std::string header, reply;
  if (absl::Status s = socket_->RecvExact(4, deadline, &header); !s.ok()) return s;
  const uint32_t len = GetU32(header.data());
  if (len == 0 || len > kTcpStoreMaxFrame + 1) {
    return socket_->Malformed(absl::StrCat(": a frame of ", len, " bytes"));
  }
  if (absl::Status s = socket_->RecvExact(len, deadline, &reply); !s.ok()) return s;
  if (reply[0] == static_cast<char>(kError)) {
    // The server closes the connection after refusing a malformed request; other refusals
    // (a full store, a non-integer add) leave it usable.
    return absl::FailedPreconditionError(
        absl::StrCat("store: the TCP store at ", socket_->address(),
                     " refused the request: ", absl::string_view(reply).substr(1)));
  }
  if (reply[0] != static_cast<char>(kOk)) {
    return socket_->Malformed(
        absl::StrCat(": status byte ", int{static_cast<unsigned char>(reply[0])}));
  }
  return reply.substr(1);
}

absl::Status TcpStoreClient::Malformed(absl::string_view detail) {
  std::lock_guard<std::mutex> lock(mu_);
  return socket_->Malformed(detail);
}

absl::Status TcpStoreClient::Set(const std::string& key, const std::string& value) {
  if (key.size() > kTcpStoreMaxKey || value.size() > kTcpStoreMaxValue) {
    return absl::InvalidArgumentError(
        absl::StrCat("store: setting '", key.substr(0, 64), "': key of ", key.size(),
                     " bytes or value of ", value.size(), " bytes exceeds the TCP store's limits (",
                     kTcpStoreMaxKey, ", ", kTcpStoreMaxValue, ")"));
  }
  std::string request(1, static_cast<char>(kSet));
  PutStr(&request, key);
  PutStr(&request, value);
  auto reply = Call(request);
  if (!reply.ok()) return reply.status();
  if (!reply->empty()) {
    return Malformed(absl::StrCat(": ", reply->size(), " unexpected bytes after set"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> TcpStoreClient::Get(const std::string& key) {
  if (key.size() > kTcpStoreMaxKey) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store: key of ", key.size(), " bytes exceeds the TCP store's limit of ", kTcpStoreMaxKey));
  }
  std::string request(1, static_cast<char>(kGet));
  PutStr(&request, key);
  auto reply = Call(request);
  if (!reply.ok()) return reply.status();
  Reader r(*reply);
  uint8_t found = 2;
  std::string value, error;
  if (r.U8(&found) && found == 0 && r.left() == 0) return std::optional<std::string>();
  if (found == 1 && r.Str(&value, kTcpStoreMaxValue, "value", &error) && r.left() == 0) {
    return std::optional<std::string>(std::move(value));
  }
  return Malformed(absl::StrCat(" to get '", key, "'"));
}

absl::StatusOr<int64_t> TcpStoreClient::Add(const std::string& key, int64_t delta) {
  if (key.size() > kTcpStoreMaxKey) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store: key of ", key.size(), " bytes exceeds the TCP store's limit of ", kTcpStoreMaxKey));
  }
  std::string request(1, static_cast<char>(kAdd));
  PutStr(&request, key);
  PutI64(&request, delta);
  auto reply = Call(request);
  if (!reply.ok()) return reply.status();
  Reader r(*reply);
  int64_t value;
  if (r.I64(&value) && r.left() == 0) return value;
  return Malformed(absl::StrCat(" to add '", key, "'"));
}

absl::StatusOr<std::vector<bool>> TcpStoreClient::Check(const std::vector<std::string>& keys) {
  std::string request(1, static_cast<char>(kCheck));
  PutU32(&request, static_cast<uint32_t>(keys.size()));
  for (const std::string& key : keys) {
    if (key.size() > kTcpStoreMaxKey) {
      return absl::InvalidArgumentError(absl::StrCat("store: key of ", key.size(),
                                                     " bytes exceeds the TCP store's limit of ",
                                                     kTcpStoreMaxKey));
    }
    PutStr(&request, key);
  }
  if (request.size() > kTcpStoreMaxFrame) {
    return absl::InvalidArgumentError(absl::StrCat("store: checking ", keys.size(),
                                                   " keys at once exceeds the TCP store's "
                                                   "frame limit of ",
                                                   kTcpStoreMaxFrame, " bytes"));
  }
  auto reply = Call(request);
  if (!reply.ok()) return reply.status();
  if (reply->size() != keys.size()) {
    return Malformed(
        absl::StrCat(": ", reply->size(), " check results for ", keys.size(), " keys"));
  }
  std::vector<bool> present(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) present[i] = (*reply)[i] != 0;
  return present;
}

}  // namespace tg::dist
