// The TCP store (distributed/tcp_store.h) through Store and on the wire: set/get/add/wait, exact
// timeout texts, a client that starts before the server, a server that dies or stops, malformed
// requests (the server answers and keeps serving others) and malformed replies (a clear error,
// never a crash), bad URLs.
#include "distributed/tcp_store.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/socket_client.h"
#include "distributed/store.h"
#include "distributed/torch_tcp_store.h"
#include "gloo/rendezvous/store.h"
#include "gtest/gtest.h"

namespace tg::dist {
namespace {

// A port nothing listens on: bound to 0 on loopback, read back, released.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::shared_ptr<Store> Host(absl::Duration timeout = absl::Seconds(10)) {
  StoreOptions o;
  o.host_tcp_store = true;
  o.tcp_timeout = timeout;
  auto s = Store::Open("tcp://127.0.0.1:0", o);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

std::shared_ptr<Store> Client(int port, absl::Duration timeout = absl::Seconds(10)) {
  StoreOptions o;
  o.tcp_timeout = timeout;
  auto s = Store::Open(absl::StrCat("tcp://127.0.0.1:", port), o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : nullptr;
}

// A raw connection to 127.0.0.1:port.
int Dial(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

std::string U32(uint32_t n) {
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return s;
}

std::string Frame(const std::string& payload) {
  return U32(static_cast<uint32_t>(payload.size())) + payload;
}

// Everything the server sends until it closes the connection.
std::string ReadToEof(int fd) {
  std::string all;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    all.append(buf, n);
  }
  close(fd);
  return all;
}

// The error text of a one-frame error reply.
std::string ErrorReply(const std::string& reply) {
  if (reply.size() < 5 || reply[4] != 1) return "not an error reply: " + reply;
  return reply.substr(5);
}

TEST(TcpStore, SetGetAddWaitAcrossClients) {
  auto host = Host();
  const int port = host->tcp_server_port();
  ASSERT_GT(port, 0);
  auto client = Client(port);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->tcp_server_port(), -1);
  auto a = host->WithPrefix("job");
  auto b = client->WithPrefix("job");
  ASSERT_TRUE(a->Set("k", "v").ok());
  EXPECT_EQ(*b->Get("k", absl::Seconds(1)), "v");
  ASSERT_TRUE(b->Set("k", std::string("\0bin\xff", 5)).ok());
  EXPECT_EQ(*a->Get("k", absl::Seconds(1)), std::string("\0bin\xff", 5));
  EXPECT_EQ(*a->Add("n", 1), 1);
  EXPECT_EQ(*b->Add("n", 2), 3);
  EXPECT_EQ(*b->Add("n", -5), -2);
  EXPECT_EQ(*a->Get("n", absl::Seconds(1)), "-2");
  EXPECT_EQ(a->Add("k", 1).status().message(),
            "store: adding to 'job/k' failed: the TCP store at 127.0.0.1:" + std::to_string(port) +
                " refused the request: add: the value of 'job/k' is not an "
                "integer");
  // An empty value and a large one (1 MiB) round-trip.
  ASSERT_TRUE(a->Set("empty", "").ok());
  EXPECT_EQ(*b->Get("empty", absl::Seconds(1)), "");
  const std::string big(1 << 20, 'x');
  const absl::Status big_set = a->Set("big", big);
  ASSERT_TRUE(big_set.ok()) << big_set;
  EXPECT_EQ(*b->Get("big", absl::Seconds(1)), big);

  // Wait / Get block until another client sets the key.
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(200));
    (void)a->Set("late", "here");
  });
  EXPECT_EQ(*b->Get("late", absl::Seconds(10)), "here");
  later.join();
  EXPECT_TRUE(b->Wait({"k", "late"}, absl::Seconds(1)).ok());

  // Timeouts: the same text as the file and Redis stores.
  absl::Status s = b->Wait({"k", "x", "y"}, absl::Milliseconds(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "store wait timed out after 100ms; missing keys: job/x, job/y");
  EXPECT_EQ(b->Get("x", absl::Milliseconds(50)).status().message(),
            "store wait timed out after 50ms; missing keys: job/x");
  EXPECT_EQ(b->Missing({"k", "x"}), std::vector<std::string>({"job/x"}));
}

TEST(TcpStore, GlooInterfaceWaitTimesOutWithTheKeys) {
  auto host = Host(absl::Milliseconds(300));
  try {
    host->gloo_store().wait({"never"}, std::chrono::milliseconds(100));
    ADD_FAILURE() << "no exception";
  } catch (const std::exception& e) {
    EXPECT_STREQ(e.what(), "store wait timed out after 100ms; missing keys: never");
  }
  host->gloo_store().set("g", {'1', '2'});
  EXPECT_EQ(host->gloo_store().get("g"), std::vector<char>({'1', '2'}));
}

TEST(TcpStore, ClientStartedBeforeTheServerConnectsOnceItListens) {
  const int port = FreePort();
  absl::StatusOr<std::shared_ptr<Store>> client;
  std::thread early([&] {
    StoreOptions o;
    o.tcp_timeout = absl::Seconds(20);
    client = Store::Open(absl::StrCat("tcp://localhost:", port), o);
  });
  absl::SleepFor(absl::Milliseconds(300));  // the client is retrying refused connections
  StoreOptions o;
  o.host_tcp_store = true;
  auto host = Store::Open(absl::StrCat("tcp://127.0.0.1:", port), o);
  ASSERT_TRUE(host.ok()) << host.status();
  early.join();
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*host)->Set("a", "1").ok());
  EXPECT_EQ(*(*client)->Get("a", absl::Seconds(1)), "1");
}

TEST(TcpStore, NoServerTimesOutWithTheReason) {
  const int port = FreePort();
  StoreOptions o;
  o.tcp_timeout = absl::Milliseconds(200);
  const absl::Time start = absl::Now();
  auto s = Store::Open(absl::StrCat("tcp://127.0.0.1:", port), o);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.status().message(), absl::StrCat("store: cannot connect to the TCP store at "
                                               "127.0.0.1:",
                                               port, " within 200ms: Connection refused"));
  // The port is taken: the host says so.
  auto first = Host();
  StoreOptions h;
  h.host_tcp_store = true;
  auto second = Store::Open(absl::StrCat("tcp://127.0.0.1:", first->tcp_server_port()), h);
  EXPECT_EQ(second.status().message(),
            absl::StrCat("store: cannot host the TCP store on port ", first->tcp_server_port(),
                         ": Address already in use"));
}

TEST(TcpStore, BadUrls) {
  EXPECT_EQ(Store::Open("tcp://h").status().message(),
            "store: bad port in tcp rendezvous 'tcp://h' (tcp://host:port)");
  EXPECT_EQ(Store::Open("tcp://h:0").status().message(),
            "store: bad port in tcp rendezvous 'tcp://h:0' (tcp://host:port)");
  EXPECT_EQ(Store::Open("tcp://h:70000").status().message(),
            "store: bad port in tcp rendezvous 'tcp://h:70000' (tcp://host:port)");
  EXPECT_EQ(Store::Open("tcp://:5").status().message(),
            "store: no host in tcp rendezvous 'tcp://:5' (tcp://host:port)");
  auto unknown = Store::Open("tcp://no-such-host.invalid:5");
  EXPECT_TRUE(absl::StartsWith(unknown.status().message(),
                               "store: cannot resolve the TCP store host 'no-such-host.invalid': "))
      << unknown.status();
}

TEST(TcpStore, ServerStoppedOrKilledIsAClearErrorNotAHang) {
  // Stopped: the hosting store is destroyed.
  auto host = Host();
  const int port = host->tcp_server_port();
  auto client = Client(port, absl::Seconds(30));
  ASSERT_TRUE(client->Set("k", "v").ok());
  host.reset();
  const absl::Time start = absl::Now();
  absl::Status s = client->Set("k2", "v");
  const std::string closed = absl::StrCat(
      "the TCP store at 127.0.0.1:", port,
      " closed the connection (the process hosting it, rank 0, has exited or stopped it)");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), absl::StrCat("store: setting 'k2' failed: ", closed));
  // Every later call says the same at once.
  EXPECT_EQ(client->Get("k", absl::Seconds(30)).status().message(),
            absl::StrCat("store: waiting for keys failed: ", closed));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  // Killed: a child process hosts the store and dies with SIGKILL.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  if (child == 0) {
    auto server = TcpStoreServer::Start(0);
    const int p = server.ok() ? (*server)->port() : -1;
    (void)!write(fds[1], &p, sizeof(p));
    pause();
    _exit(0);
  }
  int child_port = -1;
  ASSERT_EQ(read(fds[0], &child_port, sizeof(child_port)), sizeof(child_port));
  ASSERT_GT(child_port, 0);
  auto c = Client(child_port, absl::Seconds(30));
  ASSERT_TRUE(c->Set("x", "1").ok());
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  absl::Status w = c->Wait({"x", "y"}, absl::Seconds(30));
  EXPECT_EQ(w.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(w.message(), absl::StrCat("store: waiting for keys failed: the TCP store at "
                                      "127.0.0.1:",
                                      child_port,
                                      " closed the connection (the process hosting it, rank 0, "
                                      "has exited or stopped it)"));
  close(fds[0]);
  close(fds[1]);
}

TEST(TcpStore, MalformedRequestsGetAnErrorAndTheServerKeepsServing) {
  auto host = Host();
  const int port = host->tcp_server_port();
  auto send_raw = [&](const std::string& bytes) {
    const int fd = Dial(port);
    EXPECT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    shutdown(fd, SHUT_WR);
    return ErrorReply(ReadToEof(fd));
  };
  EXPECT_EQ(send_raw(U32(0xffffffffu)),
            absl::StrCat("request of 4294967295 bytes exceeds the limit of ", kTcpStoreMaxFrame));
  EXPECT_EQ(send_raw(Frame("")), "malformed request: empty frame");
  EXPECT_EQ(send_raw(Frame("\x09")), "malformed request: unknown op 9");
  EXPECT_EQ(send_raw(Frame(std::string("\x01") + U32(10) + "abc")),
            "malformed request: key of 10 bytes but 3 left in the frame");
  EXPECT_EQ(send_raw(Frame(std::string("\x01") + U32(5000))),
            "key of 5000 bytes exceeds the limit of 4096");
  EXPECT_EQ(send_raw(Frame(std::string("\x02") + U32(1) + "k" + "extra")),
            "malformed request: 5 bytes after the fields of op 2");
  EXPECT_EQ(send_raw(Frame(std::string("\x03") + U32(1) + "k" + "123")),
            "malformed request: truncated add delta");
  EXPECT_EQ(send_raw(Frame(std::string("\x04") + U32(1000000))),
            "malformed request: 1000000 keys cannot fit in the frame");
  EXPECT_EQ(send_raw(Frame(std::string("\x01") + U32(1) + "k" + U32(1u << 30))),
            absl::StrCat("value of 1073741824 bytes exceeds the limit of ", kTcpStoreMaxValue));
  // A client that disconnects mid-frame does not disturb the server.
  {
    const int fd = Dial(port);
    const std::string partial = U32(100) + "\x01";
    EXPECT_EQ(write(fd, partial.data(), partial.size()), static_cast<ssize_t>(partial.size()));
    close(fd);
  }
  // Two requests in one write, answered in order.
  {
    const int fd = Dial(port);
    const std::string both = Frame(std::string("\x01") + U32(1) + "z" + U32(2) + "zz") +
                             Frame(std::string("\x02") + U32(1) + "z");
    EXPECT_EQ(write(fd, both.data(), both.size()), static_cast<ssize_t>(both.size()));
    shutdown(fd, SHUT_WR);
    EXPECT_EQ(ReadToEof(fd),
              Frame(std::string(1, '\0')) + Frame(std::string(1, '\0') + "\x01" + U32(2) + "zz"));
  }
  // Still serving.
  auto client = Client(port);
  ASSERT_TRUE(client->Set("after", "ok").ok());
  EXPECT_EQ(*host->Get("after", absl::Seconds(1)), "ok");
  EXPECT_EQ(*host->Get("z", absl::Seconds(1)), "zz");
  // Limits are checked before sending, too.
  auto c = TcpStoreClient::Connect("127.0.0.1", port, absl::Seconds(5));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->Get(std::string(5000, 'k')).status().message(),
            "store: key of 5000 bytes exceeds the TCP store's limit of 4096");
}

// A fake server that answers every request with `reply`.
class FakeServer {
 public:
  explicit FakeServer(std::string reply) : reply_(std::move(reply)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, 4), 0);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      char buf[4096];
      if (read(c, buf, sizeof(buf)) > 0) (void)!write(c, reply_.data(), reply_.size());
      absl::SleepFor(absl::Milliseconds(500));
      close(c);
    });
  }
  ~FakeServer() {
    thread_.join();
    close(fd_);
  }
  int port() const { return port_; }

 private:
  std::string reply_;
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

TEST(TcpStore, MalformedRepliesAreErrorsAndBreakTheClient) {
  struct Case {
    std::string reply;
    std::string error;  // after "store: malformed reply from the TCP store at 127.0.0.1:P"
  };
  const std::vector<Case> cases = {
      {Frame("\x07"
             "abc"),
       ": status byte 7"},
      {U32(0xfffffff0u), ": a frame of 4294967280 bytes"},
      {U32(0), ": a frame of 0 bytes"},
      {Frame(std::string(1, '\0') + "junk"), ": 4 unexpected bytes after set"},
  };
  for (const Case& c : cases) {
    FakeServer fake(c.reply);
    auto client = TcpStoreClient::Connect("127.0.0.1", fake.port(), absl::Seconds(5));
    ASSERT_TRUE(client.ok()) << client.status();
    const std::string expected = absl::StrCat(
        "store: malformed reply from the TCP store at "
        "127.0.0.1:",
        fake.port(), c.error);
    absl::Status s = (*client)->Set("k", "v");
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_EQ(s.message(), expected);
    EXPECT_EQ((*client)->Get("k").status().message(), expected);  // broken from now on
  }
  {  // a get reply whose value runs past the frame
    FakeServer fake(Frame(std::string(1, '\0') + "\x01" + U32(100) + "ab"));
    auto client = TcpStoreClient::Connect("127.0.0.1", fake.port(), absl::Seconds(5));
    ASSERT_TRUE(client.ok());
    EXPECT_EQ((*client)->Get("k").status().message(),
              absl::StrCat("store: malformed reply from the TCP store at 127.0.0.1:", fake.port(),
                           " to get 'k'"));
  }
  {  // a truncated reply, then silence: bounded by the timeout
    FakeServer fake(U32(10) +
                    "\x00"
                    "ab");
    auto client = TcpStoreClient::Connect("127.0.0.1", fake.port(), absl::Milliseconds(200));
    ASSERT_TRUE(client.ok());
    EXPECT_EQ((*client)->Set("k", "v").message(),
              absl::StrCat("store: no reply from the TCP store at 127.0.0.1:", fake.port(),
                           " within 200ms"));
  }
}

// A loopback port that listens but never accepts or reads: connects complete (the kernel's
// backlog), sends fill the socket buffers, replies never come.
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, 4), 0);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~SilentListener() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// The one socket client under both store clients: the same words for the same failure, the
// server named, and broken for good after it.
TEST(SocketClient, BothStoreClientsWordTheirConnectionFailuresAlike) {
  SilentListener silent;
  const std::string at = absl::StrCat(" at 127.0.0.1:", silent.port());
  {  // A send that cannot finish (nobody reads): bounded by the timeout and named as a send.
    auto client = TcpStoreClient::Connect("127.0.0.1", silent.port(), absl::Milliseconds(200));
    ASSERT_TRUE(client.ok()) << client.status();
    const std::string want =
        absl::StrCat("store: sending to the TCP store", at, " timed out after 200ms");
    const absl::Status s = (*client)->Set("k", std::string(kTcpStoreMaxValue, 'v'));
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ(s.message(), want);
    EXPECT_EQ((*client)->Get("k").status().message(), want);  // broken from now on
  }
  {  // A reply that never comes: the torch client's handshake waits for its ping's echo.
    auto client = TorchTcpStoreClient::Connect("127.0.0.1", silent.port(), absl::Milliseconds(200));
    EXPECT_EQ(client.status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ(client.status().message(),
              absl::StrCat("store: no reply from PyTorch's TCPStore", at, " within 200ms"));
  }
  {  // The shared client itself: a wait that times out changes nothing; a malformed reply breaks.
    auto c = SocketClient::Connect("127.0.0.1", silent.port(), absl::Milliseconds(200),
                                   {"the test server", "the test closed it"});
    ASSERT_TRUE(c.ok()) << c.status();
    SocketClient& socket = **c;
    EXPECT_EQ(socket.address(), absl::StrCat("127.0.0.1:", silent.port()));
    auto readable = socket.WaitReadable(absl::Now() + absl::Milliseconds(20));
    ASSERT_TRUE(readable.ok()) << readable.status();
    EXPECT_FALSE(*readable);
    EXPECT_TRUE(socket.broken().ok());
    EXPECT_TRUE(socket.SendAll("ping", absl::Now() + absl::Seconds(1)).ok());
    const std::string want = absl::StrCat("store: malformed reply from the test server", at,
                                          ": a byte 7 where 0 was due");
    EXPECT_EQ(socket.Malformed(": a byte 7 where 0 was due").message(), want);
    EXPECT_EQ(socket.broken().code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(socket.SendAll("x", absl::Now() + absl::Seconds(1)).message(), want);
    std::string out;
    EXPECT_EQ(socket.RecvExact(1, absl::Now() + absl::Seconds(1), &out).message(), want);
  }
  {  // A server that closes: named with who closes it.
    FakeServer closes("");
    auto c = SocketClient::Connect("127.0.0.1", closes.port(), absl::Seconds(5),
                                   {"the test server", "the test closed it"});
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->SendAll("request", absl::Now() + absl::Seconds(5)).ok());
    std::string out;
    const absl::Status s = (*c)->RecvExact(4, absl::Now() + absl::Seconds(5), &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(s.message(), absl::StrCat("store: the test server at 127.0.0.1:", closes.port(),
                                        " closed the connection (the test closed it)"));
  }
}

}  // namespace
}  // namespace tg::dist
