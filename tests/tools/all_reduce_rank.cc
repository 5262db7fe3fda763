// One rank of a distributed job for the launcher tests: joins the default group from the
// environment (distributed/init.h), all-reduces (rank + 1) * [1, 2, 3], checks the sum and prints
// "rank R of W (local L): all_reduce ok". Exit 1 with the reason on any failure.
//   all_reduce_rank               # under tools:launch, torchrun, srun, ...
//   all_reduce_rank --free_port   # prints a loopback port nothing listens on, for the tests
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "distributed/init.h"
#include "distributed/process_group.h"
#include "tensor/tensor.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--free_port") == 0) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      std::perror("free port");
      return 1;
    }
    close(fd);
    std::printf("%d\n", ntohs(addr.sin_port));
    return 0;
  }
  auto env = tg::dist::ResolveDistEnv({});
  if (!env.ok()) {
    std::fprintf(stderr, "%s\n", env.status().ToString().c_str());
    return 1;
  }
  auto pg = tg::dist::InitProcessGroup();
  if (!pg.ok()) {
    std::fprintf(stderr, "%s\n", pg.status().ToString().c_str());
    return 1;
  }
  const int r = (*pg)->rank(), w = (*pg)->size();
  const float k = r + 1;
  tg::RawTensor t = tg::RawTensor::FromVector(std::vector<float>{k, 2 * k, 3 * k}, {3}, tg::kF32);
  absl::Status s = (*pg)->all_reduce(t, tg::dist::ReduceOp::kSum)->wait();
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  const float sum = w * (w + 1) / 2.f;
  if (t.to_vector<float>() != std::vector<float>{sum, 2 * sum, 3 * sum}) {
    std::fprintf(stderr, "rank %d: wrong all_reduce result\n", r);
    return 1;
  }
  std::printf("rank %d of %d (local %d): all_reduce ok\n", r, w, env->local_rank);
  return 0;
}
