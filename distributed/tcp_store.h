// The TCP key-value store hosted by one process of a job (the role PyTorch's TCPStore plays):
// rank 0 runs a TcpStoreServer on MASTER_PORT, and every rank, rank 0 included, talks to it
// through a TcpStoreClient. tg::dist::Store wraps both ("tcp://host:port", store.h); use this
// header directly only for the wire-level pieces (tests, tools).
//
//   auto server = tg::dist::TcpStoreServer::Start(29500).value();   // 0: any free port
//   auto client = tg::dist::TcpStoreClient::Connect("127.0.0.1", server->port(),
//                                                   absl::Seconds(30)).value();
//   TG_DIST_CHECK_OK(client->Set("k", "v"));
//   std::optional<std::string> v = client->Get("k").value();    // non-blocking: nullopt if unset
//
// Wire format (little-endian): every request and reply is a frame `u32 length` + `length` bytes.
// A request is `u8 op` + fields; a string field is `u32 size` + bytes, an integer `i64`.
//   set   (1): key, value           -> (empty)
//   get   (2): key                  -> u8 found [+ value]
//   add   (3): key, i64 delta       -> i64 new value (the value is kept as decimal text)
//   check (4): u32 n, n keys        -> n bytes, 1 where the key is set
// A reply is `u8 status` (0 ok, 1 error) + the op's fields, or + the error text. Sizes are
// bounded (kTcpStoreMaxKey, kTcpStoreMaxValue, kTcpStoreMaxFrame, kTcpStoreMaxBytes). A
// malformed request gets an error reply and the connection is closed (its framing is lost); the
// server keeps serving everyone else. A malformed reply is a DataLoss error at the client, and
// the client refuses every later call (its framing is lost too). The connection itself (connect
// with retries, sends and receives bounded by the timeout, their errors) is SocketClient's
// (socket_client.h), shared with the client of PyTorch's TCPStore.
//
// The server is one thread around poll(2) over non-blocking sockets; it listens on every
// interface (as PyTorch's TCPStore does) with SO_REUSEADDR, and stops, closing every connection,
// when destroyed. Clients connect with retries until their timeout (they may start before the
// server: ECONNREFUSED is retried), send with MSG_NOSIGNAL and bound every exchange by the
// timeout. Blocking waits are client-side polls (store.h), as for the file and Redis stores.
#ifndef TAPEGRAD_DISTRIBUTED_TCP_STORE_H_
#define TAPEGRAD_DISTRIBUTED_TCP_STORE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "distributed/socket_client.h"

namespace tg::dist {

inline constexpr size_t kTcpStoreMaxKey = 4096;
inline constexpr size_t kTcpStoreMaxValue = size_t{64} << 20;
inline constexpr size_t kTcpStoreMaxFrame = kTcpStoreMaxValue + 2 * kTcpStoreMaxKey;
// Keys + values held by one server.
inline constexpr size_t kTcpStoreMaxBytes = size_t{1} << 30;

class TcpStoreServer {
 public:
  // Listens on every interface at `port` (0: a free port, see port()). Unavailable with the
  // reason when the port cannot be bound ("Address already in use").
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(int port);
  ~TcpStoreServer();  // stops the thread and closes every connection

  int port() const { return port_; }

  struct State;

 private:
  TcpStoreServer(int listen_fd, int port);
  void Loop();

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a byte written to wake_[1] stops the loop
  int port_ = 0;
  std::unique_ptr<State> state_;  // the keys and connections, owned by the loop's thread
  std::thread thread_;
};

class TcpStoreClient {
 public:
  // Connects to host:port, retrying refused or unreachable connections until `timeout` (the
  // server may start later). `timeout` also bounds every later exchange with the server.
  //   DeadlineExceeded: "store: cannot connect to the TCP store at H:P within 2s: Connection
  //   refused"; Unavailable: "store: cannot resolve the TCP store host 'H': ..."
  static absl::StatusOr<std::unique_ptr<TcpStoreClient>> Connect(const std::string& host, int port,
                                                                 absl::Duration timeout);
  ~TcpStoreClient();

  absl::Status Set(const std::string& key, const std::string& value);
  // The value, or nullopt when the key is not set (no waiting).
  absl::StatusOr<std::optional<std::string>> Get(const std::string& key);
  // Adds `delta` to the integer under `key` (0 when unset) and returns the sum.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  // For each key, whether it is set.
  absl::StatusOr<std::vector<bool>> Check(const std::vector<std::string>& keys);

  const std::string& address() const;  // "host:port"

 private:
  explicit TcpStoreClient(std::unique_ptr<SocketClient> socket);
  // Sends one request frame and returns the reply's fields (after an ok status byte).
  absl::StatusOr<std::string> Call(const std::string& request);
  // Breaks the connection (a malformed reply: the framing is lost) and returns the DataLoss
  // error "store: malformed reply from the TCP store at H:P" + detail.
  absl::Status Malformed(absl::string_view detail);

  std::mutex mu_;                         // one exchange at a time
  std::unique_ptr<SocketClient> socket_;  // broken once the framing is lost
};

}  // namespace tg::dist

#endif  // TAPEGRAD_DISTRIBUTED_TCP_STORE_H_
