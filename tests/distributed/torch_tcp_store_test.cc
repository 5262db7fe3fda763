// The client of PyTorch's TCPStore (distributed/torch_tcp_store.h) against a fake server that
// answers with exactly the bytes torch 2.15's server sends (recorded between torch's own client and
// server, libuv and classic backends alike): the handshake and request bytes, set/get/add/check,
// waits (served and cancelled), malformed, truncated and missing replies with their exact texts,
// Store's torch-tcp:// views, and two ranks initialised under TORCHELASTIC_USE_AGENT_STORE=True.
#include "distributed/torch_tcp_store.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/init.h"
#include "distributed/store.h"
#include "distributed/tcp_store.h"
#include "gloo/rendezvous/store.h"
#include "gtest/gtest.h"
#include "tensor/tensor.h"
#include "tests/distributed/multiprocess.h"

namespace tg::dist {
namespace {

std::string U64(uint64_t v) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out;
}
std::string Str(const std::string& s) { return U64(s.size()) + s; }

// A loopback server speaking c10d's TCPStore protocol, one thread per connection. Faithful by
// default; `canned` replaces the answer to the first request after the handshake (then the
// connection stays open and silent), `wrong_echo` answers the ping with nonce + 1, and
// `close_after_handshake` closes right after the ping.
struct FakeOptions {
  std::optional<std::string> canned = std::nullopt;
  bool wrong_echo = false;
  bool close_after_handshake = false;
};

class FakeTorchStore {
 public:
  using Options = FakeOptions;
  explicit FakeTorchStore(Options options = {}) : options_(std::move(options)) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(listen_fd_, 64), 0);
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~FakeTorchStore() {
    stop_ = true;
    acceptor_.join();
    close(listen_fd_);
    std::lock_guard<std::mutex> lock(threads_mu_);
    for (std::thread& t : threads_) t.join();
  }
  int port() const { return port_; }
  // Every byte received so far, in arrival order per connection (connections concatenated).
  std::string received() {
    std::lock_guard<std::mutex> lock(mu_);
    return received_;
  }
  std::vector<std::string> keys() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& [k, v] : map_) out.push_back(k);
    return out;
  }

 private:
  void Accept() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      std::lock_guard<std::mutex> lock(threads_mu_);
      threads_.emplace_back([this, fd] {
        Serve(fd);
        close(fd);
      });
    }
  }
  // Reads exactly n bytes (false: closed or stopping).
  bool Read(int fd, size_t n, std::string* out) {
    out->clear();
    while (out->size() < n) {
      pollfd p{fd, POLLIN, 0};
      if (stop_) return false;
      if (poll(&p, 1, 20) <= 0) continue;
      char buf[4096];
      const ssize_t got = recv(fd, buf, std::min(sizeof(buf), n - out->size()), 0);
      if (got <= 0) return false;
      out->append(buf, got);
      std::lock_guard<std::mutex> lock(mu_);
      received_.append(buf, got);
    }
    return true;
  }
  bool ReadU64(int fd, uint64_t* v) {
    std::string b;
    if (!Read(fd, 8, &b)) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i) *v |= uint64_t{static_cast<unsigned char>(b[i])} << (8 * i);
    return true;
  }
  bool ReadStr(int fd, std::string* s) {
    uint64_t n;
    return ReadU64(fd, &n) && n < (1u << 20) && Read(fd, n, s);
  }
  bool ReadKeys(int fd, std::vector<std::string>* keys) {
    uint64_t n;
    if (!ReadU64(fd, &n) || n > 1000) return false;
    keys->resize(n);
    for (std::string& k : *keys) {
      if (!ReadStr(fd, &k)) return false;
    }
    return true;
  }
  void Send(int fd, const std::string& bytes) { send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL); }
  bool AllSet(const std::vector<std::string>& keys) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& k : keys) {
      if (map_.count(k) == 0) return false;
    }
    return true;
  }

  void Serve(int fd) {
    std::string b;
    // VALIDATE + magic, PING + nonce.
    if (!Read(fd, 10, &b)) return;
    if (b.substr(0, 6) != std::string("\x00\xce\xf7\x85\x3c\x0d", 6)) return;
    std::string echo = b.substr(6, 4);
    if (options_.wrong_echo) echo[0] = static_cast<char>(echo[0] + 1);
    Send(fd, echo);
    if (options_.close_after_handshake) return;
    if (options_.canned) {
      pollfd p{fd, POLLIN, 0};
      while (!stop_ && poll(&p, 1, 20) <= 0) {
      }
      char buf[4096];
      const ssize_t got = recv(fd, buf, sizeof(buf), 0);
      if (got > 0) {
        std::lock_guard<std::mutex> lock(mu_);
        received_.append(buf, got);
      }
      Send(fd, *options_.canned);
      while (!stop_ && Read(fd, 1, &b)) {
      }
      return;
    }
    while (Read(fd, 1, &b)) {
      const uint8_t q = static_cast<uint8_t>(b[0]);
      std::string key, value;
      std::vector<std::string> keys;
      if (q == 1) {  // SET
        if (!ReadStr(fd, &key) || !ReadStr(fd, &value)) return;
        std::lock_guard<std::mutex> lock(mu_);
        map_[key] = value;
      } else if (q == 3) {  // GET: a missing key is an error, and the server drops the client
        if (!ReadStr(fd, &key)) return;
        std::unique_lock<std::mutex> lock(mu_);
        auto it = map_.find(key);
        if (it == map_.end()) return;
        const std::string reply = Str(it->second);
        lock.unlock();
        Send(fd, reply);
      } else if (q == 4) {  // ADD
        uint64_t delta;
        if (!ReadStr(fd, &key) || !ReadU64(fd, &delta)) return;
        std::unique_lock<std::mutex> lock(mu_);
        int64_t sum = static_cast<int64_t>(delta);
        if (auto it = map_.find(key); it != map_.end()) sum += std::stoll(it->second);
        map_[key] = std::to_string(sum);
        lock.unlock();
        Send(fd, U64(static_cast<uint64_t>(sum)));
      } else if (q == 5) {  // CHECK
        if (!ReadKeys(fd, &keys)) return;
        Send(fd, std::string(1, AllSet(keys) ? '\0' : '\1'));
      } else if (q == 6) {  // WAIT: STOP_WAITING when set; CANCEL_WAIT -> WAIT_CANCELED
        if (!ReadKeys(fd, &keys)) return;
        for (;;) {
          if (AllSet(keys)) {
            Send(fd, std::string(1, '\0'));
            break;
          }
          pollfd p{fd, POLLIN, 0};
          if (stop_) return;
          if (poll(&p, 1, 5) > 0) {
            if (!Read(fd, 1, &b) || b[0] != 12) return;
            Send(fd, std::string(1, '\1'));
            break;
          }
        }
      } else if (q == 12) {
        Send(fd, std::string(1, '\1'));
      } else {
        return;
      }
    }
  }

  Options options_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::mutex threads_mu_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::string received_;
  std::map<std::string, std::string> map_;
};

std::unique_ptr<TorchTcpStoreClient> Connect(int port,
                                             absl::Duration timeout = absl::Seconds(10)) {
  auto c = TorchTcpStoreClient::Connect("127.0.0.1", port, timeout);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

std::string Addr(const FakeTorchStore& fake) { return absl::StrCat("127.0.0.1:", fake.port()); }

TEST(TorchTcpStore, HandshakeAndRequestBytes) {
  FakeTorchStore fake;
  auto c = Connect(fake.port());
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Set("k", "v").ok());
  ASSERT_EQ(*c->Add("n", 5), 5);  // a reply: every byte before it has arrived
  const uint32_t pid = static_cast<uint32_t>(getpid());
  std::string nonce;
  for (int i = 0; i < 4; ++i) nonce.push_back(static_cast<char>((pid >> (8 * i)) & 0xff));
  EXPECT_EQ(fake.received(), std::string("\x00\xce\xf7\x85\x3c", 5) + "\x0d" + nonce +  //
                                 "\x01" + Str("k") + Str("v") +                         //
                                 "\x04" + Str("n") + U64(5));
}

TEST(TorchTcpStore, SetGetAddCheckWait) {
  FakeTorchStore fake;
  auto c = Connect(fake.port());
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(*c->Check({"k"}), false);
  ASSERT_TRUE(c->Set("k", std::string("v\0w", 3)).ok());
  EXPECT_EQ(*c->Check({"k"}), true);
  EXPECT_EQ(*c->Check({"k", "zz"}), false);
  EXPECT_EQ(*c->Check({}), true);
  EXPECT_TRUE(c->Wait({"k"}, absl::Seconds(1)).ok());
  EXPECT_EQ(*c->Get("k"), std::string("v\0w", 3));
  EXPECT_EQ(*c->Add("n", 5), 5);
  EXPECT_EQ(*c->Add("n", -7), -2);
  EXPECT_EQ(*c->Get("n"), "-2");
  ASSERT_TRUE(c->Set("empty", "").ok());
  EXPECT_EQ(*c->Get("empty"), "");

  // A wait the server serves when another client sets the key.
  auto other = Connect(fake.port());
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(other->Set("late", "1").ok());
  });
  EXPECT_TRUE(c->Wait({"k", "late"}, absl::Seconds(10)).ok());
  setter.join();

  // A timed-out wait is cancelled on the server; the connection stays usable.
  absl::Status w = c->Wait({"missing"}, absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(w)) << w;
  EXPECT_EQ(w.message(), absl::StrCat("store: waiting for keys on PyTorch's TCPStore at ",
                                      Addr(fake), " timed out after 100ms"));
  EXPECT_EQ(*c->Add("n", 2), 0);
}

TEST(TorchTcpStore, StoreViewsLiveUnderTapegrad) {
  FakeTorchStore fake;
  StoreOptions o;
  o.tcp_timeout = absl::Seconds(5);
  o.host_tcp_store = true;  // ignored: the agent hosts
  auto opened = Store::Open(absl::StrCat("torch-tcp://127.0.0.1:", fake.port()), o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ((*opened)->prefix(), "tapegrad");
  EXPECT_EQ((*opened)->tcp_server_port(), -1);
  auto job = (*opened)->WithPrefix("job");
  ASSERT_TRUE(job->Set("a", "1").ok());
  EXPECT_EQ(*job->Get("a", absl::Seconds(1)), "1");
  EXPECT_EQ(*job->Add("c", 3), 3);
  EXPECT_EQ(job->Missing({"a", "b"}), std::vector<std::string>({"tapegrad/job/b"}));
  EXPECT_EQ(fake.keys(), std::vector<std::string>({"tapegrad/job/a", "tapegrad/job/c"}));
  absl::Status w = job->Wait({"a", "b"}, absl::Milliseconds(200));
  EXPECT_EQ(w.message(), "store wait timed out after 200ms; missing keys: tapegrad/job/b");
  // gloo's view waits on the server and names the missing keys.
  try {
    job->gloo_store().wait({"b"}, std::chrono::milliseconds(100));
    ADD_FAILURE() << "no timeout";
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()),
              "store wait timed out after 100ms; missing keys: tapegrad/job/b");
  }
  EXPECT_EQ(Store::Open("torch-tcp://127.0.0.1:0").status().message(),
            "store: bad port in torch-tcp rendezvous 'torch-tcp://127.0.0.1:0' "
            "(torch-tcp://host:port)");
  EXPECT_EQ(Store::Open("torch-tcp://:5").status().message(),
            "store: no host in torch-tcp rendezvous 'torch-tcp://:5' (torch-tcp://host:port)");
}

TEST(TorchTcpStore, NoServer) {
  int port;
  {
    FakeTorchStore gone;
    port = gone.port();
  }
  auto c = TorchTcpStoreClient::Connect("127.0.0.1", port, absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(c.status())) << c.status();
  EXPECT_EQ(c.status().message(),
            absl::StrCat("store: cannot connect to PyTorch's TCPStore at 127.0.0.1:", port,
                         " within 200ms: Connection refused"));
}

TEST(TorchTcpStore, WrongPingEcho) {
  FakeTorchStore fake({.wrong_echo = true});
  auto c = TorchTcpStoreClient::Connect("127.0.0.1", fake.port(), absl::Seconds(5));
  EXPECT_TRUE(absl::IsDataLoss(c.status())) << c.status();
  const uint32_t pid = static_cast<uint32_t>(getpid());
  const uint32_t wrong = (pid & ~0xffu) | ((pid + 1) & 0xffu);
  EXPECT_EQ(c.status().message(),
            absl::StrCat("store: malformed reply from PyTorch's TCPStore at ", Addr(fake),
                         ": ping echoed ", wrong, ", expected ", pid,
                         " (is this port PyTorch's TCPStore?)"));
}

TEST(TorchTcpStore, MalformedRepliesBreakTheClient) {
  struct Case {
    std::string reply;
    std::function<absl::Status(TorchTcpStoreClient&)> call;
    std::string error;  // after "store: malformed reply from PyTorch's TCPStore at H:P: "
  };
  const std::vector<Case> cases = {
      {U64(kTcpStoreMaxValue + 1), [](auto& c) { return c.Get("k").status(); },
       "a value of 67108865 bytes for 'k' (the limit is 67108864)"},
      {"\x07", [](auto& c) { return c.Check({"k"}).status(); },
       "check answered 7 (expected 0 or 1)"},
      {"\x05", [](auto& c) { return c.Wait({"k"}, absl::Seconds(5)); },
       "wait answered 5 (expected 0)"},
  };
  for (const Case& test : cases) {
    FakeTorchStore fake({.canned = test.reply});
    auto c = Connect(fake.port());
    ASSERT_NE(c, nullptr);
    absl::Status s = test.call(*c);
    EXPECT_TRUE(absl::IsDataLoss(s)) << s;
    const std::string want = absl::StrCat("store: malformed reply from PyTorch's TCPStore at ",
                                          Addr(fake), ": ", test.error);
    EXPECT_EQ(s.message(), want);
    EXPECT_EQ(c->Set("x", "y").message(), want);  // the stream's position is lost
  }
}

TEST(TorchTcpStore, ClosedTruncatedAndSilent) {
  {
    FakeTorchStore fake({.close_after_handshake = true});
    auto c = Connect(fake.port());
    ASSERT_NE(c, nullptr);
    absl::StatusOr<int64_t> sum = c->Add("n", 1);
    EXPECT_TRUE(absl::IsUnavailable(sum.status())) << sum.status();
    EXPECT_EQ(sum.status().message(),
              absl::StrCat("store: PyTorch's TCPStore at ", Addr(fake),
                           " closed the connection (torchrun's agent has exited or stopped it)"));
  }
  {
    // 5 bytes announced, 2 sent: a silent server after that, so the read times out.
    FakeTorchStore fake({.canned = U64(5) + "ab"});
    auto c = Connect(fake.port(), absl::Milliseconds(300));
    ASSERT_NE(c, nullptr);
    absl::StatusOr<std::string> v = c->Get("k");
    EXPECT_TRUE(absl::IsDeadlineExceeded(v.status())) << v.status();
    EXPECT_EQ(v.status().message(), absl::StrCat("store: no reply from PyTorch's TCPStore at ",
                                                 Addr(fake), " within 300ms"));
  }
  {
    FakeTorchStore fake({.canned = ""});
    auto c = Connect(fake.port(), absl::Milliseconds(200));
    ASSERT_NE(c, nullptr);
    absl::StatusOr<int64_t> sum = c->Add("n", 1);
    EXPECT_EQ(sum.status().message(), absl::StrCat("store: no reply from PyTorch's TCPStore at ",
                                                   Addr(fake), " within 200ms"));
  }
  {
    FakeTorchStore fake;
    auto c = Connect(fake.port());
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->Set(std::string(kTcpStoreMaxKey + 1, 'k'), "v").message(),
              absl::StrCat("store: setting '", std::string(64, 'k'), "...': a key of 4097 bytes "
                           "exceeds the limit of 4096"));
  }
}

// torchrun's workers: TORCHELASTIC_USE_AGENT_STORE=True and MASTER_PORT = the agent's store (the
// fake, which holds the port: a rank 0 that tried to host there would fail to bind). Every rank
// connects as a client, and the group's keys live under "tapegrad/<job>/attempt0/".
TEST(TorchTcpStore, TorchrunAgentStoreInit) {
  std::unique_ptr<FakeTorchStore> fake;
  testing::RunOptions o;
  o.tcp_store = true;
  if (!testing::IsRankProcess()) {
    fake = std::make_unique<FakeTorchStore>();
    o.agent_store_port = fake->port();
  }
  auto results = testing::RunRanks(
      2,
      [](const testing::Rank& me) {
        auto env = ResolveDistEnv({});
        ASSERT_TRUE(env.ok()) << env.status();
        EXPECT_TRUE(absl::StartsWith(env->rdzv, "torch-tcp://127.0.0.1:")) << env->rdzv;
        auto pg = testing::JoinDefaultGroup();
        RawTensor t = RawTensor::FromVector(std::vector<float>{1.f * (me.rank + 1)}, {1}, kF32);
        TG_DIST_CHECK_OK(pg->all_reduce(t, ReduceOp::kSum)->wait());
        EXPECT_EQ(t.to_vector<float>(), std::vector<float>({3.f}));
      },
      o);
  testing::ExpectAllSucceeded(results);
  if (fake != nullptr) {
    const std::vector<std::string> keys = fake->keys();
    ASSERT_FALSE(keys.empty());
    for (const std::string& k : keys) {
      EXPECT_TRUE(absl::StartsWith(k, "tapegrad/")) << k;
      EXPECT_TRUE(absl::StrContains(k, "/attempt0/default/")) << k;
    }
  }
}

}  // namespace
}  // namespace tg::dist
