#include "distributed/torch_tcp_store.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/socket_client.h"
#include "distributed/tcp_store.h"

namespace tg::dist {
namespace {

using namespace torch_store;  // NOLINT: the protocol's constants

constexpr char kServer[] = "PyTorch's TCPStore";

void PutU8(std::string* out, uint8_t v) { out->push_back(static_cast<char>(v)); }
void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutStr(std::string* out, const std::string& s) {
  PutLe(out, s.size(), 8);
  out->append(s);
}
void PutKeys(std::string* out, const std::vector<std::string>& keys) {
  PutLe(out, keys.size(), 8);
  for (const std::string& key : keys) PutStr(out, key);
}
uint64_t GetLe(const std::string& in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}

absl::Status CheckKey(const std::string& key, const char* op) {
  if (key.size() <= kTcpStoreMaxKey) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("store: ", op, " '", key.substr(0, 64),
                                                 "...': a key of ", key.size(),
                                                 " bytes exceeds the limit of ", kTcpStoreMaxKey));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TorchTcpStoreClient>> TorchTcpStoreClient::Connect(
    const std::string& host, int port, absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<SocketClient>> socket = SocketClient::Connect(
      host, port, timeout, {kServer, "torchrun's agent has exited or stopped it"});
  if (!socket.ok()) return socket.status();
  std::unique_ptr<TorchTcpStoreClient> client(new TorchTcpStoreClient(*std::move(socket)));
  if (absl::Status s = client->Handshake(); !s.ok()) return s;
  return client;
}

TorchTcpStoreClient::TorchTcpStoreClient(std::unique_ptr<SocketClient> socket)
    : socket_(std::move(socket)) {}

TorchTcpStoreClient::~TorchTcpStoreClient() = default;

const std::string& TorchTcpStoreClient::address() const { return socket_->address(); }

absl::Status TorchTcpStoreClient::Malformed(const std::string& what) {
  return socket_->Malformed(absl::StrCat(": ", what));
}

absl::Status TorchTcpStoreClient::SendLocked(const std::string& bytes, absl::Time deadline) {
  return socket_->SendAll(bytes, deadline);
}

absl::Status TorchTcpStoreClient::RecvLocked(size_t size, absl::Time deadline, std::string* out) {
  return socket_->RecvExact(size, deadline, out);
}

absl::StatusOr<uint64_t> TorchTcpStoreClient::RecvU64Locked(absl::Time deadline) {
  std::string bytes;
  if (absl::Status s = RecvLocked(8, deadline, &bytes); !s.ok()) return s;
  return GetLe(bytes, 8);
}

absl::StatusOr<uint8_t> TorchTcpStoreClient::RecvU8Locked(absl::Time deadline) {
  std::string bytes;
  if (absl::Status s = RecvLocked(1, deadline, &bytes); !s.ok()) return s;
  return static_cast<uint8_t>(bytes[0]);
}

absl::Status TorchTcpStoreClient::Handshake() {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time deadline = absl::Now() + socket_->timeout();
  const uint32_t nonce = static_cast<uint32_t>(getpid());
  std::string request;
  PutU8(&request, kValidate);
  PutLe(&request, kValidationMagic, 4);
  PutU8(&request, kPing);
  PutLe(&request, nonce, 4);
  if (absl::Status s = SendLocked(request, deadline); !s.ok()) return s;
  std::string echo;
  if (absl::Status s = RecvLocked(4, deadline, &echo); !s.ok()) return s;
  if (const uint64_t got = GetLe(echo, 4); got != nonce) {
    return Malformed(absl::StrCat("ping echoed ", got, ", expected ", nonce,
                                  " (is this port PyTorch's TCPStore?)"));
  }
  return absl::OkStatus();
}

absl::Status TorchTcpStoreClient::Set(const std::string& key, const std::string& value) {
  if (absl::Status s = CheckKey(key, "setting"); !s.ok()) return s;
  if (value.size() > kTcpStoreMaxValue) {
    return absl::InvalidArgumentError(absl::StrCat("store: setting '", key, "': a value of ",
                                                   value.size(), " bytes exceeds the limit of ",
                                                   kTcpStoreMaxValue));
  }
  std::string request;
  PutU8(&request, kSet);
  PutStr(&request, key);
  PutStr(&request, value);
  std::lock_guard<std::mutex> lock(mu_);
  return SendLocked(request, absl::Now() + socket_->timeout());
}

absl::StatusOr<std::string> TorchTcpStoreClient::Get(const std::string& key) {
  if (absl::Status s = CheckKey(key, "reading"); !s.ok()) return s;
  std::string request;
  PutU8(&request, kGet);
  PutStr(&request, key);
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time deadline = absl::Now() + socket_->timeout();
  if (absl::Status s = SendLocked(request, deadline); !s.ok()) return s;
  auto size = RecvU64Locked(deadline);
  if (!size.ok()) return size.status();
  if (*size > kTcpStoreMaxValue) {
    return Malformed(absl::StrCat("a value of ", *size, " bytes for '", key, "' (the limit is ",
                                  kTcpStoreMaxValue, ")"));
  }
  std::string value;
  if (absl::Status s = RecvLocked(*size, deadline, &value); !s.ok()) return s;
  return value;
}

absl::StatusOr<int64_t> TorchTcpStoreClient::Add(const std::string& key, int64_t delta) {
  if (absl::Status s = CheckKey(key, "adding to"); !s.ok()) return s;
  std::string request;
  PutU8(&request, kAdd);
  PutStr(&request, key);
  PutLe(&request, static_cast<uint64_t>(delta), 8);
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time deadline = absl::Now() + socket_->timeout();
  if (absl::Status s = SendLocked(request, deadline); !s.ok()) return s;
  auto sum = RecvU64Locked(deadline);
  if (!sum.ok()) return sum.status();
  return static_cast<int64_t>(*sum);
}

absl::StatusOr<bool> TorchTcpStoreClient::Check(const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKey(key, "checking"); !s.ok()) return s;
  }
  std::string request;
  PutU8(&request, kCheck);
  PutKeys(&request, keys);
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time deadline = absl::Now() + socket_->timeout();
  if (absl::Status s = SendLocked(request, deadline); !s.ok()) return s;
  auto answer = RecvU8Locked(deadline);
  if (!answer.ok()) return answer.status();
  if (*answer != kReady && *answer != kNotReady) {
    return Malformed(absl::StrCat("check answered ", int{*answer}, " (expected 0 or 1)"));
  }
  return *answer == kReady;
}

absl::Status TorchTcpStoreClient::Wait(const std::vector<std::string>& keys,
                                       absl::Duration timeout) {
  if (keys.empty()) return absl::OkStatus();
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKey(key, "waiting for"); !s.ok()) return s;
  }
  std::string request;
  PutU8(&request, kWait);
  PutKeys(&request, keys);
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = SendLocked(request, absl::Now() + socket_->timeout()); !s.ok()) return s;
  auto arrived = socket_->WaitReadable(absl::Now() + timeout);
  if (!arrived.ok()) return arrived.status();
  const absl::Time deadline = absl::Now() + socket_->timeout();
  if (*arrived) {
    auto answer = RecvU8Locked(deadline);
    if (!answer.ok()) return answer.status();
    if (*answer != kStopWaiting) {
      return Malformed(absl::StrCat("wait answered ", int{*answer}, " (expected 0)"));
    }
    return absl::OkStatus();
  }
  // Timed out: cancel the wait on the server. Its answer is WAIT_CANCELED, or STOP_WAITING then
  // WAIT_CANCELED when the keys arrived before the cancel did (then the wait succeeded).
  std::string cancel;
  PutU8(&cancel, kCancelWait);
  if (absl::Status s = SendLocked(cancel, deadline); !s.ok()) return s;
  auto answer = RecvU8Locked(deadline);
  if (!answer.ok()) return answer.status();
  bool stopped = false;
  if (*answer == kStopWaiting) {
    stopped = true;
    answer = RecvU8Locked(deadline);
    if (!answer.ok()) return answer.status();
  }
  if (*answer != kWaitCanceled) {
    return Malformed(absl::StrCat("cancelling a wait answered ", int{*answer}, " (expected 1)"));
  }
  if (stopped) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat("store: waiting for keys on ", kServer, " at ",
                                                  socket_->address(), " timed out after ",
                                                  absl::FormatDuration(timeout)));
}

}  // namespace tg::dist
