// StepRecord: what a training loop knows about one optimizer step, handed to the progress
// reporter (progress.h) and the metrics CSV writer (metrics.h). Fields that a run does not
// compute keep their defaults: grad_norm and items_per_second NaN (not shown / written as "nan"),
// loss_scale 1 (no loss scaling), eta_seconds NaN (the reporter estimates it).
//
//   tg::train::StepRecord rec;
//   rec.step = step;  rec.epoch = step / steps_per_epoch;  rec.loss = loss;  rec.lr = lr;
//   rec.loss_scale = scale_used;  rec.loss_scale_next = scaler.scale();
//   rec.skipped_steps = skipped;
//   rec.items_per_second = batch / step_seconds;  rec.elapsed_seconds = clock_seconds;
//   reporter.Report(rec);
//   status = writer.Write(rec);
#ifndef TAPEGRAD_TRAIN_STEP_RECORD_H_
#define TAPEGRAD_TRAIN_STEP_RECORD_H_

#include <cstdint>
#include <limits>

namespace tg::train {

struct StepRecord {
  static constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

  int64_t step = 0;                // optimizer steps done, counting from 1 for the first
  double epoch = 0;                // fractional epochs are fine (1.25)
  double loss = kNaN;              // training loss of this step (unscaled)
  double lr = kNaN;                // learning rate used by this step
  double grad_norm = kNaN;         // total gradient norm; NaN when not computed
  double loss_scale = 1;           // the scale this step's backward used (before the step's
                                   // scaler update); 1 without loss scaling
  double loss_scale_next = 1;      // the scale after this step's scaler update: the next step's
  int64_t skipped_steps = 0;       // cumulative steps skipped for inf/NaN gradients
  double items_per_second = kNaN;  // images/s, tokens/s, ... (the reporter names the unit)
  double elapsed_seconds = 0;      // wall time since the start of the run
  double eta_seconds = kNaN;       // NaN: ProgressReporter estimates it from step times
};

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_STEP_RECORD_H_
