// Per-thread accounting of the time spent in GEMM, for benchmarks that report the share of a
// training step spent in matrix multiplication. Off (one thread-local load per GEMM) unless a
// GemmProfileScope is alive on the thread.
//
//   tg::GemmProfile gemm;
//   {
//     tg::GemmProfileScope scope(&gemm);
//     RunTrainingStep();
//   }
//   printf("%.0f%% in GEMM\n", 100 * gemm.seconds / step_seconds);
#ifndef TAPEGRAD_TENSOR_PROFILE_H_
#define TAPEGRAD_TENSOR_PROFILE_H_

#include <cstdint>

namespace tg {

struct GemmProfile {
  int64_t calls = 0;
  double seconds = 0;  // wall time inside BLAS
  double flops = 0;    // 2 m n k per call
};

class GemmProfileScope {
 public:
  explicit GemmProfileScope(GemmProfile* profile);
  ~GemmProfileScope();
  GemmProfileScope(const GemmProfileScope&) = delete;
  GemmProfileScope& operator=(const GemmProfileScope&) = delete;

 private:
  GemmProfile* previous_;
};

// The profile GEMMs on this thread add to, or null.
GemmProfile* CurrentGemmProfile();

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_PROFILE_H_
