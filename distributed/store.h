// Store: the key-value rendezvous of a job's processes, on gloo's stores. A file store works on
// one machine or a shared filesystem (file:///path/to/dir), a Redis store across machines
// (redis://host:port), and so does the TCP store that one process of the job hosts
// (tcp://host:port, tcp_store.h; PyTorch's TCPStore: rank 0 hosts, every rank connects), and a
// store PyTorch's own TCPStore serves, e.g. torchrun's agent (torch-tcp://host:port,
// torch_tcp_store.h; a client only; its views start under "tapegrad/", as the store is shared
// with the agent's keys). Every
// Store view has a key prefix (PrefixStore semantics): a job and each of its groups use their own,
// so that keys never collide.
//
//   auto store = tg::dist::Store::Open("file:///tmp/job42").value()->WithPrefix("job42");
//   TG_DIST_CHECK_OK(store->Set("rank/0", "ready"));
//   absl::Status s = store->Wait({"rank/1", "rank/2"}, absl::Seconds(30));
//   // DeadlineExceeded: "store wait timed out after 30s; missing keys: job42/rank/2"
#ifndef TAPEGRAD_DISTRIBUTED_STORE_H_
#define TAPEGRAD_DISTRIBUTED_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gloo::rendezvous {
class Store;
}

namespace tg::dist {

struct StoreOptions {
  // tcp:// only: this process hosts the store (listens on the URL's port on every interface)
  // and stops it when the last view of the store is destroyed. Port 0: a free port
  // (tcp_server_port() says which).
  bool host_tcp_store = false;
  // tcp:// and torch-tcp://: how long to retry connecting (the host may start later), and the bound on
  // every exchange with the server.
  absl::Duration tcp_timeout = absl::Seconds(300);
};

class Store {
 public:
  // file:///abs/dir (created when missing), redis://host:port, tcp://host:port or
  // torch-tcp://host:port (DeadlineExceeded when no TCPStore answers within options.tcp_timeout;
  // DataLoss when the port answers the handshake with something else).
  // InvalidArgument for any other form; Unavailable when the Redis server cannot be reached or
  // the TCP store's port cannot be bound; DeadlineExceeded when no TCP store answers within
  // options.tcp_timeout.
  static absl::StatusOr<std::shared_ptr<Store>> Open(const std::string& url,
                                                     const StoreOptions& options = {});
  // An in-process store (gloo's HashStore): for world size 1 and tests.
  static std::shared_ptr<Store> InMemory();

  ~Store();

  // A view of the same store whose keys are prefixed with `prefix` + "/" (nested views nest).
  std::shared_ptr<Store> WithPrefix(const std::string& prefix) const;
  const std::string& prefix() const { return prefix_; }

  absl::Status Set(const std::string& key, const std::string& value);
  // Waits up to `timeout` for the key, then returns its value.
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout);
  // Waits until every key is set. DeadlineExceeded names the keys still missing (prefixed).
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout);
  // Of `keys`, those not set now (a non-blocking check).
  std::vector<std::string> Missing(const std::vector<std::string>& keys);
  // Adds `delta` to the integer under `key` (0 when unset; kept as decimal text, so Get returns
  // "3") atomically across processes and returns the sum: the TCP and in-memory stores' own
  // add, INCRBY on Redis, an flock'ed read-add-rename on the file store. FailedPrecondition when
  // the value is not an integer or the sum would overflow.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  // The port of the TCP store this process hosts, else -1.
  int tcp_server_port() const;

  // The gloo store with this view's prefix applied, for gloo's rendezvous (connectFullMesh).
  gloo::rendezvous::Store& gloo_store();

 private:
  Store(std::shared_ptr<gloo::rendezvous::Store> base, std::string prefix);
  std::string Key(const std::string& key) const;

  std::shared_ptr<gloo::rendezvous::Store> base_;
  std::string prefix_;
  std::unique_ptr<gloo::rendezvous::Store> prefixed_;
};

}  // namespace tg::dist

#endif  // TAPEGRAD_DISTRIBUTED_STORE_H_
