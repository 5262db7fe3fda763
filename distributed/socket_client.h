// SocketClient: the client end of a store's TCP connection, shared by the two store clients
// (TcpStoreClient, tcp_store.h; TorchTcpStoreClient, torch_tcp_store.h), which differ only in
// their wire formats. It connects with retries until a timeout (the server may start later), sends
// and receives whole byte strings by a deadline on a non-blocking socket (send with MSG_NOSIGNAL:
// a closed peer is an error, not a SIGPIPE), and words every failure the same way, naming the
// server and its address:
//   DeadlineExceeded "store: cannot connect to <server> at H:P within 2s: Connection refused"
//   Unavailable      "store: cannot resolve <server> host 'H': ..."
//   Unavailable      "store: <server> at H:P closed the connection (<who closes it>)"
//   DeadlineExceeded "store: no reply from <server> at H:P within 2s"
//   DeadlineExceeded "store: sending to <server> at H:P timed out after 2s"
//   Unavailable      "store: sending to / receiving from <server> at H:P failed: <errno text>"
//   DataLoss         "store: malformed reply from <server> at H:P<detail>"   (Malformed)
// After any of them the connection is closed and the client broken: every later call returns the
// same status (the stream's position is lost). Not thread-safe: the store clients hold their own
// mutex around each exchange.
//
//   auto c = SocketClient::Connect("127.0.0.1", 29500, absl::Seconds(30),
//                                  {"the TCP store", "rank 0 has exited"}).value();
//   const absl::Time deadline = absl::Now() + c->timeout();
//   TG_DIST_CHECK_OK(c->SendAll(request, deadline));
//   std::string reply;
//   TG_DIST_CHECK_OK(c->RecvExact(4, deadline, &reply));
#ifndef TAPEGRAD_DISTRIBUTED_SOCKET_CLIENT_H_
#define TAPEGRAD_DISTRIBUTED_SOCKET_CLIENT_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tg::dist {

// Connects to host:port, retrying refused or unreachable connections until `timeout`, and
// returns the connected socket (non-blocking, TCP_NODELAY; the caller closes it). `server` names
// the peer in errors as listed above. SocketClient::Connect uses it; it is public for tests.
absl::StatusOr<int> ConnectWithRetry(const std::string& host, int port, absl::Duration timeout,
                                     absl::string_view server);

class SocketClient {
 public:
  struct Peer {
    std::string server;      // "the TCP store", "PyTorch's TCPStore"
    std::string who_closes;  // why the connection may close: "torchrun's agent has exited ..."
  };

  static absl::StatusOr<std::unique_ptr<SocketClient>> Connect(const std::string& host, int port,
                                                               absl::Duration timeout, Peer peer);
  ~SocketClient();
  SocketClient(const SocketClient&) = delete;
  SocketClient& operator=(const SocketClient&) = delete;

  // All of `bytes` by `deadline`.
  absl::Status SendAll(absl::string_view bytes, absl::Time deadline);
  // Exactly `size` bytes into `out` by `deadline`.
  absl::Status RecvExact(size_t size, absl::Time deadline, std::string* out);
  // Waits until bytes can be read: true, false at `deadline` (nothing changes), or an error
  // (the client breaks).
  absl::StatusOr<bool> WaitReadable(absl::Time deadline);

  // Breaks the client with `status` (kept if it is already broken) and returns `status`.
  absl::Status Fail(absl::Status status);
  // Fail(DataLoss "store: malformed reply from <server> at <address>" + detail); detail starts
  // with ": " or " to ...".
  absl::Status Malformed(absl::string_view detail);

  // OK until the client breaks.
  const absl::Status& broken() const { return broken_; }
  const std::string& address() const { return address_; }  // "host:port"
  const std::string& server() const { return peer_.server; }
  // The bound of one exchange, as given to Connect.
  absl::Duration timeout() const { return timeout_; }

 private:
  SocketClient(int fd, std::string address, absl::Duration timeout, Peer peer);
  // Waits until the socket is ready for `events`: true, false at the deadline, or an error.
  absl::StatusOr<bool> Ready(short events, absl::Time deadline);
  absl::Status Closed();

  int fd_ = -1;
  absl::Status broken_;
  std::string address_;
  absl::Duration timeout_;
  Peer peer_;
};

}  // namespace tg::dist

#endif  // TAPEGRAD_DISTRIBUTED_SOCKET_CLIENT_H_
