// Optimizer: the base of SGD, Adam and AdamW. It holds parameter groups (each with its own
// hyper-parameters), the per-parameter state (created lazily at a parameter's first step), and
// the state_dict round trip. Subclasses implement one group update (StepGroup) on two paths: a
// per-tensor path of composed tensor ops and a fused multi-tensor path (one pass over memory),
// bit-identical on the CPU.
//
//   auto o = tg::optim::AdamWOptions(3e-4);
//   auto no_decay = tg::optim::AdamWOptions(o).weight_decay(0);
//   tg::optim::AdamW opt({tg::optim::ParamGroup({w1, w2}),          // the defaults: o
//                         tg::optim::ParamGroup({bias}, no_decay)}, o);
//   opt.param_groups()[1].options_as<tg::optim::AdamWOptions>().beta2(0.95);
//   loss.backward();
//   opt.step();                       // params without a grad are skipped
//   opt.zero_grad();                  // grads become undefined
//   tg::StateDict sd = opt.state_dict();   // "param_groups.1.lr", "state.2.exp_avg", ...
//
// Decisions (PyTorch where it is silent on the rest):
// - Hyper-parameters are typed per optimizer (SGDOptions, AdamOptions, AdamWOptions, as libtorch's
//   torch::optim::AdamOptions), one copy per group: a group made without options gets a copy of
//   the optimizer's defaults, a group made with options keeps them whole (libtorch: no merging of
//   a subset with the defaults; copy the defaults and change a field instead). Each option is
//   libtorch's chained setter and getter (SGDOptions(0.1).momentum(0.9), o.lr()), so a libtorch
//   program's options port unchanged (issue 40). state_dict stores each under its old name
//   ("param_groups.<g>.lr", booleans 0/1: OptimizerOptions::named()), so checkpoints written when
//   groups were maps of names to doubles load unchanged.
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
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "autograd/variable.h"
#include "tensor/state_dict.h"
#include "tensor/tensor.h"

namespace tg::optim {

// One hyper-parameter under the name state_dict stores it by ("param_groups.<g>.<name>").
struct NamedOption {
  std::string name;
  double value;  // booleans as 0 or 1
  bool operator==(const NamedOption& o) const { return name == o.name && value == o.value; }
};

// The base of each optimizer's typed hyper-parameters (libtorch's torch::optim::OptimizerOptions).
class OptimizerOptions {
 public:
  virtual ~OptimizerOptions() = default;
  virtual std::unique_ptr<OptimizerOptions> clone() const = 0;
  // "SGDOptions", "AdamOptions", "AdamWOptions": named when a group has the wrong type.
  virtual const char* type_name() const = 0;
  // The learning rate every optimizer has; LR schedules read and write it through these.
  virtual double get_lr() const = 0;
  virtual void set_lr(double lr) = 0;
  // Every group hyper-parameter by its state_dict name, sorted by name (`fused` is not one).
  virtual std::vector<NamedOption> named() const = 0;
  // Sets the hyper-parameter called `name`; false (nothing changed) when there is none. A
  // boolean takes 0 or 1 only: other values throw tg::Error `context` + "amsgrad must be 0 or 1,
  // got 2". For generic code (the training binaries' --override, state_dict); typed code sets
  // the fields.
  bool set_named(const std::string& name, double value, const std::string& context = "");

 protected:
  OptimizerOptions() = default;
  OptimizerOptions(const OptimizerOptions&) = default;
  OptimizerOptions& operator=(const OptimizerOptions&) = default;
  virtual bool SetNamed(const std::string& name, double value, const std::string& context) = 0;
  // 0 -> false, 1 -> true; otherwise throws as set_named says.
  static bool NamedBool(const std::string& name, double value, const std::string& context);
};

class Optimizer;

// Each gradient set to undefined (set_to_none) or zeroed in place (after detaching one that has
// history), as PyTorch's zero_grad; what Optimizer::zero_grad and Module::zero_grad do.
void ZeroGrads(const std::vector<Tensor>& params, bool set_to_none = true);

struct ParamGroup {
  ParamGroup() = default;
  // A group that takes the optimizer's defaults when it is added.
  ParamGroup(std::vector<Tensor> params)  // NOLINT: ParamGroup({w, b})
      : params(std::move(params)) {}
  // A group with its own hyper-parameters (a copy of `options`, which must be the optimizer's
  // type: the optimizer throws tg::Error otherwise).
  ParamGroup(std::vector<Tensor> params, const OptimizerOptions& options)
      : params(std::move(params)), options_(options.clone()) {}
  ParamGroup(const ParamGroup& other);
  ParamGroup& operator=(const ParamGroup& other);
  ParamGroup(ParamGroup&&) = default;
  ParamGroup& operator=(ParamGroup&&) = default;

  // Leaves of floating dtype, each in at most one group. Publicly mutable: a mixed-precision
  // wrapper swaps f16/bf16 params for f32 masters before the first step.
  std::vector<Tensor> params;

  // False only for a group not yet added to an optimizer that was made without options.
  bool has_options() const { return options_ != nullptr; }
  // Throws tg::Error "param group has no options (it takes the optimizer's defaults when
  // added)" when !has_options().
  OptimizerOptions& options();
  const OptimizerOptions& options() const;
  // The options as O (e.g. AdamOptions, which AdamWOptions also is); throws tg::Error "param
  // group options are SGDOptions, not AdamOptions" for another type.
  template <class O>
  O& options_as() {
    return const_cast<O&>(static_cast<const ParamGroup&>(*this).options_as<O>());
  }
  template <class O>
  const O& options_as() const {
    const O* o = dynamic_cast<const O*>(&options());
    if (o == nullptr) ThrowWrongType(O().type_name());
    return *o;
  }

  // LR schedules read and write the lr here.
  double lr() const { return options().get_lr(); }
  void set_lr(double lr) { options().set_lr(lr); }

 private:
  friend class Optimizer;  // fills in the defaults and commits load_state_dict
  [[noreturn]] void ThrowWrongType(const char* wanted) const;
  std::unique_ptr<OptimizerOptions> options_;
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
  // Appends a group (without options: a copy of the defaults; the same checks as the
  // constructor).
  void add_param_group(ParamGroup group);
  // The options a group added without options gets a copy of.
  const OptimizerOptions& defaults() const { return *defaults_; }

  // Whether any parameter has state, i.e. the optimizer has stepped (or loaded a state).
  bool has_state() const;
  // The state of `param` (its tensors and scalars, e.g. "exp_avg", "step"); null before its
  // first step.
  const StateDict* param_state(const Tensor& param) const;

  // Keys like PyTorch, parameters numbered 0, 1, ... across groups in order:
  //   param_groups.<g>.<option>   scalar, every option of group g (OptimizerOptions::named())
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
  void set_model_copy(const Tensor& param, const RawTensor& copy);

  // "SGD", "Adam", "AdamW": the prefix of every error message.
  const std::string& name() const { return name_; }
  bool fused() const { return fused_; }
  void set_fused(bool fused) { fused_ = fused; }

 protected:
  // One parameter of a step: its data is updated in place.
  struct ParamUpdate {
    Tensor param;
    RawTensor grad;              // param's shape, any floating dtype
    StateDict* state = nullptr;  // this parameter's state; empty at its first step
    RawTensor model_copy;        // set_model_copy's tensor, or undefined
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

  Optimizer(std::string name, std::unique_ptr<OptimizerOptions> defaults, bool fused);
  // One group holding `params`, for the constructors that take a parameter list; throws tg::Error
  // "<name>: got an empty parameter list" for an empty one.
  static std::vector<ParamGroup> OneGroup(const char* name, std::vector<Tensor> params);
  // Adds the groups (called at the end of a subclass constructor, when CheckOptions works).
  void Init(std::vector<ParamGroup> groups);

  // Throws tg::Error `context` + "..." for a value out of range (context is e.g.
  // "Adam: param group 1: "); the type is checked and values are finite already.
  virtual void CheckOptions(const OptimizerOptions& options, const std::string& context) const = 0;
  virtual StateSpec ParamStateSpec(const OptimizerOptions& options) const = 0;
  // Whether `options` is this optimizer's type (the defaults' type or one derived from it).
  virtual bool AcceptsOptions(const OptimizerOptions& options) const = 0;
  // Updates `updates` (the params of `group` that have a grad). fused() picks the path.
  virtual void StepGroup(const ParamGroup& group, const std::vector<ParamUpdate>& updates) = 0;
  // The shapes the optimizer takes in a group of `options`: "" for `shape`, else why not (Muon:
  // "Muon only supports 2-D parameters"). Asked of every parameter when a group is added, at
  // every step and at load_state_dict, before anything changes. Every shape by default.
  virtual std::string RefuseShape(const OptimizerOptions& options, const Shape& shape) const;
  // The options types AcceptsOptions takes, for messages: the defaults' type by default.
  virtual std::string AcceptedOptions() const;

 private:
  struct Entry {
    Tensor param;  // keeps the key alive (no address reuse), as PyTorch's state dict does
    StateDict state;
  };
  // The type, non-finite values, then CheckOptions; errors start with `context`.
  void CheckValues(const OptimizerOptions& options, const std::string& context) const;
  void CheckParam(const Tensor& p, const OptimizerOptions& options, size_t group,
                  size_t index) const;

  std::string name_;
  std::unique_ptr<OptimizerOptions> defaults_;
  bool fused_;
  std::vector<ParamGroup> groups_;
  std::unordered_map<const VariableImpl*, Entry> state_;
  std::unordered_map<const VariableImpl*, RawTensor> model_copies_;
};

}  // namespace tg::optim

#endif  // TAPEGRAD_OPTIM_OPTIMIZER_H_
