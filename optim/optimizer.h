// Optimizer: the base of SGD, Adam and AdamW. It holds parameter groups (each with its own
// hyper-parameters), the per-parameter state (created lazily at a parameter's first step), and
// the state_dict round trip. Subclasses implement one group update (StepGroup) on two paths: a
// per-tensor path of composed tensor ops and a fused multi-tensor path (one pass over memory),
// bit-identical on the CPU.
//
//   tg::optim::AdamWOptions o;
//   o.lr = 3e-4;
//   tg::optim::AdamW opt({tg::optim::ParamGroup({w1, w2}),
//                         tg::optim::ParamGroup({bias}, {{"weight_decay", 0.0}})}, o);
//   loss.backward();
//   opt.step();                       // params without a grad are skipped
//   opt.zero_grad();                  // grads become undefined
//   tg::StateDict sd = opt.state_dict();   // "param_groups.1.lr", "state.2.exp_avg", ...
//
// Decisions (PyTorch where it is silent on the rest):
// - Hyper-parameters are named doubles per group (booleans 0/1), like PyTorch's group dicts;
//   each optimizer also offers a typed Options struct for its defaults.
// - State tensors are f32 for f16/bf16/f32 parameters and f64 for f64 parameters (PyTorch keeps
//   them in the parameter's dtype; f32 state is what mixed-precision training needs, and f16
//   exp_avg_sq underflows). The update is computed in that dtype; the parameter is rounded once.
// - state_dict() returns copies, not references to the live state; load_state_dict() copies too
//   and changes nothing unless every check passes.
// - `fused` is a property of the optimizer (not of a group) and is not saved: both paths give
//   the same bits, so it only chooses how the work is done.
// - State is keyed by parameter identity (PyTorch: by tensor) and holds the parameter alive; a
//   parameter removed from the groups keeps its state until load_state_dict replaces it all.
// - Plain SGD (momentum 0) creates an empty state entry per stepped parameter, so has_state()
//   tells "has stepped" for every optimizer (PyTorch stores momentum_buffer = None).
#ifndef TAPEGRAD_OPTIM_OPTIMIZER_H_
#define TAPEGRAD_OPTIM_OPTIMIZER_H_

#include <cstddef>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "autograd/variable.h"
#include "tensor/state_dict.h"
#include "tensor/tensor.h"

namespace tg::optim {

// Hyper-parameters by name: "lr", "weight_decay" and the optimizer's own ("momentum", "beta1",
// "amsgrad", ...). Booleans are stored as 0 or 1.
using GroupOptions = std::map<std::string, double>;

struct ParamGroup {
  ParamGroup() = default;
  // `options` may set any subset of the optimizer's hyper-parameters; the optimizer fills in
  // the rest from its defaults and rejects names it does not know.
  ParamGroup(std::vector<Variable> params, GroupOptions options = {})  // NOLINT: braced init
      : params(std::move(params)), options(std::move(options)) {}

  // Leaves of floating dtype, each in at most one group. Publicly mutable: a mixed-precision
  // wrapper swaps f16/bf16 params for f32 masters before the first step.
  std::vector<Variable> params;
  GroupOptions options;

  // options["lr"]; LR schedules read and write it.
  double lr() const { return option("lr"); }
  void set_lr(double lr) { options["lr"] = lr; }
  // Throws tg::Error "param group option 'beta1' is not set" when absent.
  double option(const std::string& name) const;
};

// The dtype an optimizer computes in and keeps its state in for a parameter of `param_dtype`:
// f64 for f64, f32 for f16/bf16/f32.
DType StateDType(DType param_dtype);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient (PyTorch skips the others). Reads
  // p.grad().data() and updates p.data() in place, bumping p's version. Everything is validated
  // before any parameter changes (options, dtypes, shapes, duplicates).
  void step();
  // set_to_none: every grad becomes undefined; otherwise grad data is zeroed in place.
  void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Appends a group (missing options from the defaults; the same checks as the constructor).
  void add_param_group(ParamGroup group);
  // The options a group gets for names it does not set.
  const GroupOptions& defaults() const { return defaults_; }

  // Whether any parameter has state, i.e. the optimizer has stepped (or loaded a state).
  bool has_state() const { return !state_.empty(); }
  // The state of `param` (its tensors and scalars, e.g. "exp_avg", "step"); null before its
  // first step.
  const StateDict* param_state(const Variable& param) const;

  // Keys like PyTorch, parameters numbered 0, 1, ... across groups in order:
  //   param_groups.<g>.<option>   scalar, every option of group g
  //   param_groups.<g>.params     i64 [n]: the numbers of the group's parameters
  //   state.<i>.<name>            tensor (param's shape, StateDType) or scalar ("step")
  StateDict state_dict() const;
  // Restores group options and per-parameter state. Throws tg::Error naming the problem (group
  // count, params per group, missing or unexpected keys, bad option values, state shape or
  // dtype) and then leaves the optimizer unchanged.
  void load_state_dict(const StateDict& state_dict);

  // Mixed precision: after every update of `param` (an f32 master), its new value rounded to
  // copy's dtype is written into `copy` (the model's f16/bf16 parameter: param's shape and
  // device). The fused Adam kernels (tg::FusedAdam) write it in the same pass as the update;
  // every other path copies it when the update is done. An undefined `copy` removes the entry.
  // Copies are not part of state_dict().
  void set_model_copy(const Variable& param, const Tensor& copy);

  // "SGD", "Adam", "AdamW": the prefix of every error message.
  const std::string& name() const { return name_; }
  bool fused() const { return fused_; }
  void set_fused(bool fused) { fused_ = fused; }

 protected:
  // One parameter of a step: its data is updated in place.
  struct ParamUpdate {
    Variable param;
    Tensor grad;        // param's shape, any floating dtype
    StateDict* state;   // this parameter's state; empty at its first step
    Tensor model_copy;  // set_model_copy's tensor, or undefined
    // Set by a StepGroup that wrote model_copy itself; otherwise step() copies afterwards.
    mutable bool model_copy_written = false;
  };
  // The state entries a parameter of `group` has once it stepped (checked by load_state_dict):
  // required ones must all be present; optional ones may be.
  struct StateSpec {
    std::vector<std::string> tensors;  // shape of the param, dtype StateDType(param dtype)
    std::vector<std::string> optional_tensors;
    std::vector<std::string> scalars;  // non-negative integers ("step")
  };

  Optimizer(std::string name, GroupOptions defaults, bool fused);
  // Adds the groups (called at the end of a subclass constructor, when CheckOptions works).
  void Init(std::vector<ParamGroup> groups);

  // Throws tg::Error `context` + "..." for a value out of range (context is e.g.
  // "Adam: param group 1: "); names are checked and values are finite already.
  virtual void CheckOptions(const GroupOptions& options, const std::string& context) const = 0;
  virtual StateSpec ParamStateSpec(const GroupOptions& options) const = 0;
  // Updates `updates` (the params of `group` that have a grad). fused() picks the path.
  virtual void StepGroup(const ParamGroup& group, const std::vector<ParamUpdate>& updates) = 0;

 private:
  struct Entry {
    Variable param;  // keeps the key alive (no address reuse), as PyTorch's state dict does
    StateDict state;
  };
  // Fills defaults and validates names and values; errors start with `context`.
  GroupOptions CompleteOptions(const GroupOptions& options, const std::string& context) const;
  // Non-finite values, then CheckOptions.
  void CheckValues(const GroupOptions& options, const std::string& context) const;
  void CheckParam(const Variable& p, size_t group, size_t index) const;

  std::string name_;
  GroupOptions defaults_;
  bool fused_;
  std::vector<ParamGroup> groups_;
  std::unordered_map<const VariableImpl*, Entry> state_;
  std::unordered_map<const VariableImpl*, Tensor> model_copies_;
};

}  // namespace tg::optim

#endif  // TAPEGRAD_OPTIM_OPTIMIZER_H_
