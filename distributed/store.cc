#include "distributed/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "distributed/tcp_store.h"
#include "distributed/torch_tcp_store.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/redis_store.h"
#include "tensor/io/fd.h"

namespace tg::dist {
namespace {

// gloo's stores check for keys without waiting, but only some expose it publicly; these expose
// it through one interface so that a timed-out wait can name the missing keys.
class Checkable {
 public:
  virtual ~Checkable() = default;
  virtual bool Has(const std::string& key) = 0;
  // Every key of `keys` that is not set (one round trip where the store allows it).
  virtual std::vector<std::string> MissingOf(const std::vector<std::string>& keys) {
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      if (!Has(key)) missing.push_back(key);
    }
    return missing;
  }
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
  virtual int tcp_server_port() const { return -1; }
};

// The decimal integer `text` under `key` (0 when empty) plus delta; FailedPrecondition when it
// is not an integer or the sum overflows. Every store's Add but the TCP ones goes through it.
absl::StatusOr<int64_t> AddToText(const std::string& key, absl::string_view text, int64_t delta) {
  int64_t current = 0;
  if (!text.empty() && !absl::SimpleAtoi(text, &current)) {
    return absl::FailedPreconditionError(
        absl::StrCat("store: add: the value of '", key, "' is not an integer"));
  }
  if ((delta > 0 && current > std::numeric_limits<int64_t>::max() - delta) ||
      (delta < 0 && current < std::numeric_limits<int64_t>::min() - delta)) {
    return absl::FailedPreconditionError(
        absl::StrCat("store: add: ", current, " + ", delta, " under '", key, "' overflows"));
  }
  return current + delta;
}

class FileStoreImpl : public gloo::rendezvous::FileStore, public Checkable {
 public:
  using FileStore::FileStore;
  bool Has(const std::string& key) override { return check({key}); }
  // Read, add and write back under an flock on "<key file>.lock" (processes sharing the
  // directory, threads with their own stores), the value replaced by a rename as gloo's set does.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    const std::string path = objectPath(key);
    io::Fd lock(::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (lock.get() < 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("store: add: cannot open ", path, ".lock"));
    }
    while (::flock(lock.get(), LOCK_EX) != 0) {
      if (errno != EINTR) {
        return absl::ErrnoToStatus(errno, absl::StrCat("store: add: cannot lock ", path, ".lock"));
      }
    }
    std::string text;
    if (std::ifstream in(path, std::ios::binary); in) {
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    absl::StatusOr<int64_t> sum = AddToText(key, text, delta);
    if (!sum.ok()) return sum;
    const std::string tmp = path + ".add.tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << *sum;
      out.close();
      if (!out) return absl::InternalError(absl::StrCat("store: add: cannot write ", tmp));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      return absl::ErrnoToStatus(errno,
                                 absl::StrCat("store: add: cannot rename ", tmp, " to ", path));
    }
    return sum;  // the lock goes with `lock`
  }
};

class RedisStoreImpl : public gloo::rendezvous::RedisStore, public Checkable {
 public:
  using RedisStore::RedisStore;
  bool Has(const std::string& key) override { return check({key}); }
  // Redis's INCRBY: atomic on the server, the value kept as decimal text.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    auto* reply = static_cast<redisReply*>(redisCommand(redis_, "INCRBY %b %lld", key.data(),
                                                        key.size(), static_cast<long long>(delta)));
    if (reply == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("store: add: the Redis server did not answer: ", redis_->errstr));
    }
    absl::StatusOr<int64_t> sum;
    if (reply->type == REDIS_REPLY_INTEGER) {
      sum = static_cast<int64_t>(reply->integer);
    } else if (reply->type == REDIS_REPLY_ERROR && absl::StrContains(reply->str, "overflow")) {
      sum = absl::FailedPreconditionError(
          absl::StrCat("store: add: adding ", delta, " under '", key, "' overflows (Redis)"));
    } else if (reply->type == REDIS_REPLY_ERROR) {
      sum = absl::FailedPreconditionError(
          absl::StrCat("store: add: the value of '", key, "' is not an integer"));
    } else {
      sum = absl::InternalError(
          absl::StrCat("store: add: unexpected Redis reply type ", reply->type));
    }
    freeReplyObject(reply);
    return sum;
  }
};

class HashStoreImpl : public gloo::rendezvous::HashStore, public Checkable {
 public:
  bool Has(const std::string& key) override {
    std::lock_guard<std::mutex> lock(m_);
    return map_.count(key) != 0;
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(m_);
    auto it = map_.find(key);
    absl::StatusOr<int64_t> sum =
        AddToText(key,
                  it == map_.end() ? absl::string_view()
                                   : absl::string_view(it->second.data(), it->second.size()),
                  delta);
    if (!sum.ok()) return sum;
    const std::string text = absl::StrCat(*sum);
    map_[key] = std::vector<char>(text.begin(), text.end());
    return sum;
  }
};

// The TCP store (tcp_store.h) behind gloo's Store interface: gloo's rendezvous calls get/wait
// and expects exceptions on failure. Waits poll, as gloo's file and Redis stores do.
class TcpStoreImpl : public gloo::rendezvous::Store, public Checkable {
 public:
  TcpStoreImpl(std::unique_ptr<TcpStoreServer> server, std::unique_ptr<TcpStoreClient> client,
               absl::Duration timeout)
      : server_(std::move(server)), client_(std::move(client)), timeout_(timeout) {}
  // The client goes first: its connection closes before the server stops.
  ~TcpStoreImpl() override {
    client_.reset();
    server_.reset();
  }

  void set(const std::string& key, const std::vector<char>& data) override {
    Throw(client_->Set(key, std::string(data.begin(), data.end())));
  }
  std::vector<char> get(const std::string& key) override {
    wait({key}, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
    auto value = client_->Get(key);
    Throw(value.status());
    if (!value->has_value()) throw std::runtime_error(absl::StrCat("store: '", key, "' vanished"));
    return std::vector<char>((*value)->begin(), (*value)->end());
  }
  void wait(const std::vector<std::string>& keys) override {
    wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const absl::Duration limit = absl::FromChrono(timeout);
    const absl::Time deadline = absl::Now() + limit;
    absl::Duration pause = absl::Milliseconds(1);
    for (;;) {
      std::vector<std::string> missing = MissingOf(keys);
      if (missing.empty()) return;
      if (absl::Now() >= deadline) {
        throw std::runtime_error(absl::StrCat("store wait timed out after ",
                                              absl::FormatDuration(limit),
                                              "; missing keys: ", absl::StrJoin(missing, ", ")));
      }
      absl::SleepFor(std::min(pause, deadline - absl::Now()));
      pause = std::min(pause * 2, absl::Milliseconds(50));
    }
  }

  bool Has(const std::string& key) override { return MissingOf({key}).empty(); }
  std::vector<std::string> MissingOf(const std::vector<std::string>& keys) override {
    auto present = client_->Check(keys);
    Throw(present.status());
    std::vector<std::string> missing;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!(*present)[i]) missing.push_back(keys[i]);
    }
    return missing;
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return client_->Add(key, delta);
  }
  int tcp_server_port() const override { return server_ == nullptr ? -1 : server_->port(); }

 private:
  static void Throw(const absl::Status& s) {
    // The wrappers in Store add their own "store: " and the key.
    if (!s.ok()) throw std::runtime_error(std::string(absl::StripPrefix(s.message(), "store: ")));
  }

  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStoreClient> client_;
  absl::Duration timeout_;
};

// PyTorch's TCPStore (torch_tcp_store.h) behind gloo's Store interface. Waits run on the server
// (c10d's WAIT, cancelled at the timeout); a timed-out wait then names the keys still missing.
class TorchTcpStoreImpl : public gloo::rendezvous::Store, public Checkable {
 public:
  TorchTcpStoreImpl(std::unique_ptr<TorchTcpStoreClient> client, absl::Duration timeout)
      : client_(std::move(client)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Throw(client_->Set(key, std::string(data.begin(), data.end())));
  }
  std::vector<char> get(const std::string& key) override {
    wait({key}, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
    auto value = client_->Get(key);
    Throw(value.status());
    return std::vector<char>(value->begin(), value->end());
  }
  void wait(const std::vector<std::string>& keys) override {
    wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const absl::Duration limit = absl::FromChrono(timeout);
    absl::Status s = client_->Wait(keys, limit);
    if (absl::IsDeadlineExceeded(s)) {
      throw std::runtime_error(absl::StrCat("store wait timed out after ",
                                            absl::FormatDuration(limit), "; missing keys: ",
                                            absl::StrJoin(MissingOf(keys), ", ")));
    }
    Throw(s);
  }

  // c10d's CHECK answers for all keys at once: one round trip per key.
  bool Has(const std::string& key) override {
    auto set = client_->Check({key});
    Throw(set.status());
    return *set;
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return client_->Add(key, delta);
  }

 private:
  static void Throw(const absl::Status& s) {
    if (!s.ok()) throw std::runtime_error(std::string(absl::StripPrefix(s.message(), "store: ")));
  }

  std::unique_ptr<TorchTcpStoreClient> client_;
  absl::Duration timeout_;
};

// mkdir -p.
absl::Status MakeDirs(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    const std::string prefix = path.substr(0, pos);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::UnavailableError(
          absl::StrCat("store: cannot create directory '", prefix, "': ", std::strerror(errno)));
    }
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::UnavailableError(absl::StrCat("store: '", path, "' is not a directory"));
  }
  return absl::OkStatus();
}

}  // namespace

Store::Store(std::shared_ptr<gloo::rendezvous::Store> base, std::string prefix)
    : base_(std::move(base)), prefix_(std::move(prefix)) {}

Store::~Store() = default;

absl::StatusOr<std::shared_ptr<Store>> Store::Open(const std::string& url,
                                                   const StoreOptions& options) {
  if (absl::StartsWith(url, "file://")) {
    const std::string path = url.substr(7);
    if (path.empty() || path[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "store: a file rendezvous needs an absolute path (file:///dir), got '", url, "'"));
    }
    absl::Status made = MakeDirs(path);
    if (!made.ok()) return made;
    return std::shared_ptr<Store>(new Store(std::make_shared<FileStoreImpl>(path), ""));
  }
  if (absl::StartsWith(url, "redis://")) {
    const std::string hostport = url.substr(8);
    const size_t colon = hostport.rfind(':');
    int port = 6379;
    std::string host = hostport;
    if (colon != std::string::npos) {
      host = hostport.substr(0, colon);
      if (!absl::SimpleAtoi(hostport.substr(colon + 1), &port) || port <= 0 || port > 65535) {
        return absl::InvalidArgumentError(
            absl::StrCat("store: bad port in redis rendezvous '", url, "'"));
      }
    }
    if (host.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("store: no host in redis rendezvous '", url, "' (redis://host:port)"));
    }
    // Probe first, with a connect timeout: gloo's RedisStore connects without one (an unreachable
    // host would hang) and leaks hiredis's context when the connection fails.
    const timeval connect_timeout{10, 0};
    redisContext* probe = redisConnectWithTimeout(host.c_str(), port, connect_timeout);
    if (probe == nullptr || probe->err != 0) {
      const std::string why = probe == nullptr ? "out of memory" : probe->errstr;
      if (probe != nullptr) redisFree(probe);
      return absl::UnavailableError(absl::StrCat("store: cannot connect to the Redis server at ",
                                                 host, ":", port, ": ", why));
    }
    redisFree(probe);
    try {
      return std::shared_ptr<Store>(new Store(std::make_shared<RedisStoreImpl>(host, port), ""));
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("store: cannot connect to the Redis server at ",
                                                 host, ":", port, ": ", e.what()));
    }
  }
  if (absl::StartsWith(url, "torch-tcp://")) {
    std::string hostport = url.substr(12);
    const size_t colon = hostport.rfind(':');
    int port = -1;
    if (colon == std::string::npos || !absl::SimpleAtoi(hostport.substr(colon + 1), &port) ||
        port < 1 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "store: bad port in torch-tcp rendezvous '", url, "' (torch-tcp://host:port)"));
    }
    std::string host = hostport.substr(0, colon);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);  // [::1]
    }
    if (host.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("store: no host in torch-tcp rendezvous '",
                                                     url, "' (torch-tcp://host:port)"));
    }
    auto client = TorchTcpStoreClient::Connect(host, port, options.tcp_timeout);
    if (!client.ok()) return client.status();
    // The store is shared with torchrun's agent (whose keys start with "/" or "torchelastic/"):
    // every tapegrad key lives under "tapegrad/".
    return std::shared_ptr<Store>(new Store(
        std::make_shared<TorchTcpStoreImpl>(std::move(*client), options.tcp_timeout),
        "tapegrad"));
  }
  if (absl::StartsWith(url, "tcp://")) {
    std::string hostport = url.substr(6);
    const size_t colon = hostport.rfind(':');
    int port = -1;
    if (colon == std::string::npos || !absl::SimpleAtoi(hostport.substr(colon + 1), &port) ||
        port < 0 || port > 65535 || (port == 0 && !options.host_tcp_store)) {
      return absl::InvalidArgumentError(
          absl::StrCat("store: bad port in tcp rendezvous '", url, "' (tcp://host:port)"));
    }
    std::string host = hostport.substr(0, colon);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);  // [::1]
    }
    if (host.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("store: no host in tcp rendezvous '", url, "' (tcp://host:port)"));
    }
    std::unique_ptr<TcpStoreServer> server;
    if (options.host_tcp_store) {
      auto started = TcpStoreServer::Start(port);
      if (!started.ok()) return started.status();
      server = std::move(*started);
      port = server->port();
    }
    auto client = TcpStoreClient::Connect(host, port, options.tcp_timeout);
    if (!client.ok()) return client.status();
    return std::shared_ptr<Store>(new Store(
        std::make_shared<TcpStoreImpl>(std::move(server), std::move(*client), options.tcp_timeout),
        ""));
  }
  return absl::InvalidArgumentError(absl::StrCat("store: unsupported rendezvous '", url,
                                                 "' (expected file:///dir, redis://host:port, "
                                                 "tcp://host:port or torch-tcp://host:port)"));
}

std::shared_ptr<Store> Store::InMemory() {
  return std::shared_ptr<Store>(new Store(std::make_shared<HashStoreImpl>(), ""));
}

std::shared_ptr<Store> Store::WithPrefix(const std::string& prefix) const {
  return std::shared_ptr<Store>(new Store(base_, Key(prefix)));
}

std::string Store::Key(const std::string& key) const {
  return prefix_.empty() ? key : absl::StrCat(prefix_, "/", key);
}

absl::Status Store::Set(const std::string& key, const std::string& value) {
  try {
    base_->set(Key(key), std::vector<char>(value.begin(), value.end()));
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("store: setting '", Key(key), "' failed: ", e.what()));
  }
}

std::vector<std::string> Store::Missing(const std::vector<std::string>& keys) {
  auto* checkable = dynamic_cast<Checkable*>(base_.get());
  std::vector<std::string> full;
  for (const std::string& key : keys) full.push_back(Key(key));
  return checkable->MissingOf(full);  // throws when the store cannot be reached
}

absl::StatusOr<int64_t> Store::Add(const std::string& key, int64_t delta) {
  try {
    absl::StatusOr<int64_t> sum = dynamic_cast<Checkable*>(base_.get())->Add(Key(key), delta);
    if (sum.ok()) return sum;
    return absl::Status(sum.status().code(),
                        absl::StrCat("store: adding to '", Key(key), "' failed: ",
                                     absl::StripPrefix(sum.status().message(), "store: ")));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("store: adding to '", Key(key), "' failed: ", e.what()));
  }
}

int Store::tcp_server_port() const {
  return dynamic_cast<Checkable*>(base_.get())->tcp_server_port();
}

absl::Status Store::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(1);
  try {
    auto* checkable = dynamic_cast<Checkable*>(base_.get());
    std::vector<std::string> full;
    for (const std::string& key : keys) full.push_back(Key(key));
    for (;;) {
      // Throws when the store cannot be reached (a lost TCP store): an error now, not a timeout.
      std::vector<std::string> missing = checkable->MissingOf(full);
      if (missing.empty()) return absl::OkStatus();
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("store wait timed out after ", absl::FormatDuration(timeout),
                         "; missing keys: ", absl::StrJoin(missing, ", ")));
      }
      absl::SleepFor(std::min(pause, deadline - absl::Now()));
      pause = std::min(pause * 2, absl::Milliseconds(50));
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("store: waiting for keys failed: ", e.what()));
  }
}

absl::StatusOr<std::string> Store::Get(const std::string& key, absl::Duration timeout) {
  absl::Status present = Wait({key}, timeout);
  if (!present.ok()) return present;
  try {
    std::vector<char> value = base_->get(Key(key));
    return std::string(value.begin(), value.end());
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("store: reading '", Key(key), "' failed: ", e.what()));
  }
}

gloo::rendezvous::Store& Store::gloo_store() {
  if (prefix_.empty()) return *base_;
  if (prefixed_ == nullptr) {
    prefixed_ = std::make_unique<gloo::rendezvous::PrefixStore>(prefix_, *base_);
  }
  return *prefixed_;
}

}  // namespace tg::dist
