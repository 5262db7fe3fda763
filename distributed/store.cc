#include "distributed/store.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/redis_store.h"

namespace tg::dist {
namespace {

// gloo's stores check for keys without waiting, but only some expose it publicly; these expose
// it through one interface so that a timed-out wait can name the missing keys.
class Checkable {
 public:
  virtual ~Checkable() = default;
  virtual bool Has(const std::string& key) = 0;
};

class FileStoreImpl : public gloo::rendezvous::FileStore, public Checkable {
 public:
  using FileStore::FileStore;
  bool Has(const std::string& key) override { return check({key}); }
};

class RedisStoreImpl : public gloo::rendezvous::RedisStore, public Checkable {
 public:
  using RedisStore::RedisStore;
  bool Has(const std::string& key) override { return check({key}); }
};

class HashStoreImpl : public gloo::rendezvous::HashStore, public Checkable {
 public:
  bool Has(const std::string& key) override {
    std::lock_guard<std::mutex> lock(m_);
    return map_.count(key) != 0;
  }
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

absl::StatusOr<std::shared_ptr<Store>> Store::Open(const std::string& url) {
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
  return absl::InvalidArgumentError(absl::StrCat(
      "store: unsupported rendezvous '", url, "' (expected file:///dir or redis://host:port)"));
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
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (!checkable->Has(Key(key))) missing.push_back(Key(key));
  }
  return missing;
}

absl::Status Store::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(1);
  try {
    for (;;) {
      std::vector<std::string> missing = Missing(keys);
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
