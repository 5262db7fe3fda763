// Grad mode: a thread-local switch that says whether differentiable ops record the graph.
// Backward bodies and hooks run with it off unless create_graph is set.
//
//   {
//     tg::NoGradGuard no_grad;
//     tg::Tensor y = tg::Mul(x, w);   // y.grad_fn() == nullptr
//   }
#ifndef TAPEGRAD_AUTOGRAD_GRAD_MODE_H_
#define TAPEGRAD_AUTOGRAD_GRAD_MODE_H_

namespace tg {

class GradMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// Sets grad mode for its lifetime and restores the previous value.
class AutoGradMode {
 public:
  explicit AutoGradMode(bool enabled) : previous_(GradMode::is_enabled()) {
    GradMode::set_enabled(enabled);
  }
  ~AutoGradMode() { GradMode::set_enabled(previous_); }
  AutoGradMode(const AutoGradMode&) = delete;
  AutoGradMode& operator=(const AutoGradMode&) = delete;

 private:
  bool previous_;
};

class NoGradGuard : public AutoGradMode {
 public:
  NoGradGuard() : AutoGradMode(false) {}
};

class EnableGradGuard : public AutoGradMode {
 public:
  EnableGradGuard() : AutoGradMode(true) {}
};

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_GRAD_MODE_H_
