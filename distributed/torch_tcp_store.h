// A client of PyTorch's c10d TCPStore (the store torchrun's agent hosts on MASTER_ADDR:MASTER_PORT
// and announces to its workers with TORCHELASTIC_USE_AGENT_STORE=True). tg::dist::Store wraps it
// ("torch-tcp://host:port", store.h) and init uses it under that variable (init.h); use this
// header directly only for the wire-level pieces (tests, tools). No PyTorch is linked or needed:
// this speaks the wire protocol, written from the bytes torch 2.15's TCPStore client exchanges
// with its server (both the libuv and the classic backends answer the same).
//
//   auto c = tg::dist::TorchTcpStoreClient::Connect("127.0.0.1", 29500, absl::Seconds(30)).value();
//   TG_DIST_CHECK_OK(c->Set("tapegrad/k", "v"));
//   TG_DIST_CHECK_OK(c->Wait({"tapegrad/k"}, absl::Seconds(5)));
//   std::string v = c->Get("tapegrad/k").value();   // only after a successful Wait
//
// Wire format (little-endian, no framing: each side parses the other's fields as they come). A
// request is `u8 query` + fields; a string is `u64 size` + bytes, a list of strings `u64 n` +
// n strings.
//   on connect: VALIDATE (0) u32 0x3C85F7CE   -> nothing
//               PING (13) u32 nonce            -> u32 nonce (echoed)
//   SET (1): key, value                        -> nothing
//   GET (3): key                               -> string value (the key must exist: wait first)
//   ADD (4): key, i64 delta                    -> i64 sum (kept as decimal text)
//   CHECK (5): keys                            -> u8 0 when every key is set, 1 otherwise
//   WAIT (6): keys                             -> u8 0 (STOP_WAITING) once every key is set
//   CANCEL_WAIT (12), after a wait timed out   -> u8 1 (WAIT_CANCELED), preceded by a u8 0 when
//                                                 the keys arrived meanwhile
// PyTorch's own clients prefix every key with "/", and torchrun's agent keeps its rendezvous
// state in the same store; callers put their keys under a prefix of their own (Store does:
// "tapegrad/...").
//
// Every exchange is bounded by the timeout given to Connect (a wait by its own timeout, then the
// cancel by Connect's); keys and values are bounded by kTcpStoreMaxKey and kTcpStoreMaxValue in
// both directions. A malformed reply (a value size over the bound, an unknown response byte, a
// wrong ping echo) is a DataLoss error, a closed connection Unavailable, a silent server
// DeadlineExceeded; after any of them the client refuses every later call with the same error
// (the stream's position is lost). The connection and those errors are SocketClient's
// (socket_client.h), shared with the TCP store's client.
#ifndef TAPEGRAD_DISTRIBUTED_TORCH_TCP_STORE_H_
#define TAPEGRAD_DISTRIBUTED_TORCH_TCP_STORE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "distributed/socket_client.h"

namespace tg::dist {

// c10d's query bytes and response bytes (torch/csrc/distributed/c10d: QueryType,
// CheckResponseType, WaitResponseType) and its validation number, as sent by torch 2.15.
namespace torch_store {
inline constexpr uint8_t kValidate = 0;
inline constexpr uint8_t kSet = 1;
inline constexpr uint8_t kGet = 3;
inline constexpr uint8_t kAdd = 4;
inline constexpr uint8_t kCheck = 5;
inline constexpr uint8_t kWait = 6;
inline constexpr uint8_t kCancelWait = 12;
inline constexpr uint8_t kPing = 13;
inline constexpr uint8_t kReady = 0;         // CHECK
inline constexpr uint8_t kNotReady = 1;      // CHECK
inline constexpr uint8_t kStopWaiting = 0;   // WAIT
inline constexpr uint8_t kWaitCanceled = 1;  // CANCEL_WAIT
inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;
}  // namespace torch_store

class TorchTcpStoreClient {
 public:
  // Connects (retrying refused connections until `timeout`: the agent may start later), sends
  // VALIDATE and a PING, and checks the echo. `timeout` also bounds every later exchange.
  //   DeadlineExceeded: "store: cannot connect to PyTorch's TCPStore at H:P within 2s: ..."
  //   DataLoss: "store: malformed reply from PyTorch's TCPStore at H:P: ping echoed 7, expected 9"
  static absl::StatusOr<std::unique_ptr<TorchTcpStoreClient>> Connect(const std::string& host,
                                                                      int port,
                                                                      absl::Duration timeout);
  ~TorchTcpStoreClient();

  absl::Status Set(const std::string& key, const std::string& value);
  // The value of a key that is set (Wait for it first: PyTorch's server fails a GET of a missing
  // key).
  absl::StatusOr<std::string> Get(const std::string& key);
  // Adds `delta` to the integer under `key` (0 when unset) and returns the sum.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  // Whether every key of `keys` is set (one answer for all of them, as c10d's CHECK gives).
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys);
  // Waits on the server until every key is set. DeadlineExceeded after `timeout`:
  // "store: waiting for keys on PyTorch's TCPStore at H:P timed out after 1s" (the wait is
  // cancelled on the server, and the connection stays usable).
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout);

  const std::string& address() const;  // "host:port"

 private:
  explicit TorchTcpStoreClient(std::unique_ptr<SocketClient> socket);

  // Under mu_: send all of `bytes` / receive exactly `size` bytes by `deadline` (SocketClient's;
  // on failure the connection is closed and the client broken).
  absl::Status SendLocked(const std::string& bytes, absl::Time deadline);
  absl::Status RecvLocked(size_t size, absl::Time deadline, std::string* out);
  absl::StatusOr<uint64_t> RecvU64Locked(absl::Time deadline);
  absl::StatusOr<uint8_t> RecvU8Locked(absl::Time deadline);
  // Breaks the client with DataLoss "store: malformed reply from PyTorch's TCPStore at H:P: "
  // + what, and returns it.
  absl::Status Malformed(const std::string& what);
  absl::Status Handshake();

  std::mutex mu_;  // one exchange at a time
  std::unique_ptr<SocketClient> socket_;
};

}  // namespace tg::dist

#endif  // TAPEGRAD_DISTRIBUTED_TORCH_TCP_STORE_H_
