#include "train/train_step.h"

#include <cmath>

#include "autograd/ops.h"
#include "tensor/error.h"

namespace tg::train {

StepStats TrainStep(amp::TrainingOptimizer& opt, optim::LrSchedule& schedule,
                    const ForwardPrecision& precision, double max_grad_norm,
                    const std::function<Tensor()>& loss_fn) {
  return TrainStep(
      opt, schedule, precision, max_grad_norm, [&](int64_t) { return loss_fn(); },
      Accumulation{});
}

StepStats TrainStep(amp::TrainingOptimizer& opt, optim::LrSchedule& schedule,
                    const ForwardPrecision& precision, double max_grad_norm,
                    const std::function<Tensor(int64_t micro)>& loss_fn,
                    const Accumulation& accumulation) {
  const int64_t n = accumulation.micro_batches;
  TG_CHECK(n >= 1, "TrainStep: micro_batches must be >= 1, got ", n);
  TG_CHECK(accumulation.summed_ranks >= 1, "TrainStep: summed_ranks must be >= 1, got ",
           accumulation.summed_ranks);
  const int64_t divisor = n * accumulation.summed_ranks;
  StepStats stats;
  stats.lr = opt.optimizer().param_groups()[0].lr();
  opt.zero_grad();
  const bool defer = n > 1 && opt.can_defer_master_grads();
  double loss_sum = 0;
  for (int64_t k = 0; k < n; ++k) {
    const bool last = k == n - 1;
    auto body = [&] {
      Tensor loss;
      {
        PrecisionScope scope(precision);
        loss = loss_fn(k);
        scope.Finish();
      }
      // One micro-batch: the loss as it is (bit for bit the unaccumulated step).
      amp::MasterBackwardOptions options;
      options.update_master_grads = last || !defer;
      opt.backward(divisor == 1 ? loss : MulScalar(loss, 1.0 / static_cast<double>(divisor)),
                   options);
      loss_sum += loss.item();
    };
    if (accumulation.sync_scope && defer) {
      accumulation.sync_scope(last, body);
    } else {
      body();
    }
  }
  stats.loss = n == 1 ? loss_sum : loss_sum / static_cast<double>(n);
  stats.grad_norm = opt.clip_master_grads(max_grad_norm > 0 ? max_grad_norm : INFINITY);
  stats.result = opt.step();
  stats.loss_scale_next = opt.scaler().scale();
  schedule.step(stats.result.skipped);
  return stats;
}

}  // namespace tg::train
