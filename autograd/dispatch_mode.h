// Op dispatch modes: a thread-local object that sees every call of a dispatched op (the op
// list's `checkpoint` column is not kNone) before its kernel runs and may answer it instead,
// as PyTorch's TorchDispatchMode sees ATen ops. Selective activation checkpointing
// (autograd/checkpoint.h) is built on it: in the checkpointed forward a mode records each op's
// outputs that its policy saves, and in the recomputation a mode hands those back instead of
// running the kernels again.
//
// A differentiable op dispatches its kernel call, below autocast (the op sees its cast inputs)
// and above Record (the node is recorded either way):
//
//   Tensor Exp(const Tensor& x) {
//     ...
//     return Record(OpNodeName(OpId::kExp),
//                   Dispatch<OpId::kExp>([&] { return tg::Exp(x.data()); }, x), {x}, ...);
//   }
//
// A composite op (one written with other differentiable ops) dispatches through those, as
// PyTorch's composite ops decompose above the mode. Views and in-place ops are not dispatched
// (their column says kNone): a view aliases its input and costs nothing to redo, and an in-place
// op's output is its input, so neither has an output worth keeping. Without a mode Dispatch is
// one thread-local read and the kernel call. Modes stack (OpDispatchModeGuard), as PyTorch's do.
#ifndef TAPEGRAD_AUTOGRAD_DISPATCH_MODE_H_
#define TAPEGRAD_AUTOGRAD_DISPATCH_MODE_H_

#include <any>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#include "autograd/variable.h"
#include "tensor/op_list.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace tg {

// What a dispatched kernel call returned: the value (RawTensor, LayerNormResult, ...) and its
// tensors (ResultTensors below; undefined ones included).
struct DispatchResult {
  std::any value;
  std::vector<RawTensor> tensors;
};

class OpDispatchMode {
 public:
  virtual ~OpDispatchMode() = default;
  // One call of `op` on `inputs` (the op's tensor arguments, in its parameter order; undefined
  // for an absent optional one). `run` runs the kernel. Returns the call's result: run()'s, or
  // one of the same op kept earlier. While Call runs, the modes below this one are the
  // current ones (see OpDispatchModeGuard).
  virtual DispatchResult Call(OpId op, const VariableList& inputs,
                              const std::function<DispatchResult()>& run) = 0;
  // An in-place op is about to write into `self` (in-place ops are not dispatched; a mode that
  // hands out tensors it keeps may need to know). Every installed mode is told, topmost first.
  virtual void BeforeInPlaceWrite(const Tensor& /*self*/) {}
};

// Tells the installed modes that an in-place op is about to write into `self`.
void NotifyInPlaceWrite(const Tensor& self);

// Installs `mode` on this thread for the guard's lifetime, above the modes installed before
// (PyTorch's mode stack): a dispatched call goes to the topmost mode, and while a mode handles a
// call the modes below it are the current ones, so what it runs (its `run`, the ops of a policy)
// goes to them, and `run` reaches the kernel once every mode below has had it.
class OpDispatchModeGuard {
 public:
  explicit OpDispatchModeGuard(OpDispatchMode* mode);
  ~OpDispatchModeGuard();
  OpDispatchModeGuard(const OpDispatchModeGuard&) = delete;
  OpDispatchModeGuard& operator=(const OpDispatchModeGuard&) = delete;

  // One installed mode and the ones below it.
  struct Entry {
    OpDispatchMode* mode;
    const Entry* below;
  };

 private:
  Entry entry_;
};

namespace dispatch_internal {

// The topmost installed mode on this thread (nullptr: none).
const OpDispatchModeGuard::Entry* Top();
// Makes `top` the topmost mode for its lifetime (a backward handed off to a fresh thread takes
// the caller's modes with it).
class ScopedTop {
 public:
  explicit ScopedTop(const OpDispatchModeGuard::Entry* top);
  ~ScopedTop();
  ScopedTop(const ScopedTop&) = delete;
  ScopedTop& operator=(const ScopedTop&) = delete;

 private:
  const OpDispatchModeGuard::Entry* previous_;
};
// Hands one call to `entry`'s mode, and its `run` to the modes below, then to `kernel`.
DispatchResult CallFrom(const OpDispatchModeGuard::Entry* entry, OpId op,
                        const VariableList& inputs, const std::function<DispatchResult()>& kernel);

}  // namespace dispatch_internal

// The tensors of a kernel's result, for a mode that looks at them (versions, the policy's
// op_output): one overload per result type a dispatched op returns.
inline std::vector<RawTensor> ResultTensors(const RawTensor& r) { return {r}; }
inline std::vector<RawTensor> ResultTensors(const LayerNormResult& r) {
  return {r.output, r.mean, r.rstd};
}
inline std::vector<RawTensor> ResultTensors(const LlamaRmsNormResult& r) {
  return {r.output, r.rstd};
}
inline std::vector<RawTensor> ResultTensors(const MaxPool2dResult& r) {
  return {r.output, r.indices};
}
inline std::vector<RawTensor> ResultTensors(const LinearResult& r) {
  return {r.output, r.pre_activation};
}
inline std::vector<RawTensor> ResultTensors(const AttentionResult& r) {
  return {r.output, r.stats};
}
inline std::vector<RawTensor> ResultTensors(const CrossEntropyResult& r) {
  return {r.loss, r.grad_logits};
}
inline std::vector<RawTensor> ResultTensors(const std::vector<RawTensor>& r) { return r; }

namespace dispatch_internal {

template <OpId op, typename Kernel, typename MakeInputs>
auto Run(Kernel& kernel, const MakeInputs& make_inputs) {
  static_assert(CheckpointDefaultOf(op) != CheckpointDefault::kNone,
                "an op that dispatches needs kSave or kRecompute in its checkpoint column");
  using Result = std::invoke_result_t<Kernel&>;
  const OpDispatchModeGuard::Entry* top = Top();
  if (top == nullptr) return kernel();
  DispatchResult result = CallFrom(top, op, make_inputs(), [&kernel] {
    Result value = kernel();
    std::vector<RawTensor> tensors = ResultTensors(value);
    return DispatchResult{std::move(value), std::move(tensors)};
  });
  return std::any_cast<Result>(std::move(result.value));
}

}  // namespace dispatch_internal

// Runs `kernel` (a callable returning the op's result) for one call of `op` on `inputs` (Tensors),
// through the installed modes if there are any. Only an op whose `checkpoint` column is not kNone
// dispatches (checked at compile time), so the column says exactly which ops a mode (and a
// checkpoint policy) sees.
template <OpId op, typename Kernel, typename... Inputs>
auto Dispatch(Kernel&& kernel, const Inputs&... inputs) {
  return dispatch_internal::Run<op>(kernel, [&] { return VariableList{inputs...}; });
}

// The same for an op whose tensor arguments are a list (Cat).
template <OpId op, typename Kernel>
auto DispatchList(Kernel&& kernel, const VariableList& inputs) {
  return dispatch_internal::Run<op>(kernel, [&] { return inputs; });
}

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_DISPATCH_MODE_H_
