#include "tools/train/data_parallel.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "distributed/init.h"
#include "tensor/error.h"

namespace tg::train {

DataParallel::~DataParallel() {
  if (log_ != stderr) std::fclose(log_);
}

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::Start(const Flags& flags,
                                                                  int64_t global_batch,
                                                                  Device device) {
  auto dp = std::make_unique<DataParallel>();
  dp->device_ = device;
  const int64_t world_size = flags.world_size;
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--world_size must be >= 1, got ", world_size));
  }
  dist::DistOptions options;
  options.rdzv = flags.rdzv;
  if (flags.rank >= 0) {  // by hand: the flags decide, not a launcher's environment
    options.rank = static_cast<int>(flags.rank);
    options.world_size = static_cast<int>(world_size);
  }
  absl::StatusOr<dist::DistEnv> env = dist::ResolveDistEnv(options);
  if (!env.ok()) return env.status();
  if (env->world_size != world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--world_size=", world_size, " but the environment has WORLD_SIZE=", env->world_size,
        world_size > 1 && env->world_size == 1
            ? absl::StrCat(" (start the ranks with: bazel run //tools:launch -- --nproc=",
                           world_size, " -- <binary> --world_size=", world_size, ")")
            : ""));
  }
  if (global_batch % world_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("the batch size ", global_batch,
                                                   " does not split evenly across ", world_size,
                                                   " ranks"));
  }
  if (world_size == 1) return dp;
  if (device.is_cuda()) {
    options.backend = "nccl";
    dp->device_ = Device::Cuda(env->local_rank);
  }
  absl::StatusOr<std::shared_ptr<dist::ProcessGroup>> group = dist::InitProcessGroup(options);
  if (!group.ok()) return group.status();
  dp->group_ = *group;
  dp->rank_ = dp->group_->rank();
  dp->world_size_ = dp->group_->size();
  if (dp->rank_ != 0) {
    dp->log_ = std::fopen("/dev/null", "w");
    if (dp->log_ == nullptr) dp->log_ = stderr;
  }
  return dp;
}

void DataParallel::Wrap(std::shared_ptr<nn::Module> model) {
  if (group_ != nullptr) {
    ddp_ = std::make_unique<dist::DistributedDataParallel>(std::move(model), group_);
  }
}

Variable DataParallel::Forward(nn::Module& model, const Variable& input) {
  if (ddp_ != nullptr) {
    TG_CHECK(ddp_->module().get() == &model,
             "DataParallel::Forward: the model is not the one passed to Wrap()");
    return (*ddp_)(input);
  }
  return model(input);
}

Tensor DataParallel::Local(const Tensor& global) const {
  if (world_size_ == 1) return global;
  const int64_t rows = global.size(0) / world_size_;
  TG_CHECK(rows * world_size_ == global.size(0), "DataParallel::Local: ", global.size(0),
           " rows do not split evenly across ", world_size_, " ranks");
  return global.narrow(0, rank_ * rows, rows);
}

DataParallel::Agreement DataParallel::Agree(double loss, bool stop) const {
  if (group_ == nullptr) return {loss, stop};
  // [loss sum, stop count], reduced with one sum.
  Tensor t = Tensor::FromVector(std::vector<double>{loss, stop ? 1.0 : 0.0}, {2})
                 .to(group_->device());
  TG_DIST_CHECK_OK(group_->all_reduce(t, dist::ReduceOp::kSum)->wait());
  const std::vector<double> v = t.to_vector<double>();
  return {v[0] / world_size_, v[1] > 0};
}

std::function<void(const Tensor&)> DataParallel::ReduceFoundInf() const {
  if (group_ == nullptr) return nullptr;
  return dist::MaxFoundInfAcrossRanks(group_);
}

}  // namespace tg::train
