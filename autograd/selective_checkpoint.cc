// Selective activation checkpointing (autograd/checkpoint.h): two op dispatch modes sharing one
// store of the outputs a policy keeps, and GraphExecGroup.
#include "autograd/selective_checkpoint.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/checkpoint.h"
#include "autograd/dispatch_mode.h"
#include "autograd/engine.h"
#include "tensor/error.h"

namespace tg {
namespace {

// One op call of the forward: recomputed, or its result kept until the recomputation takes it.
struct StoredCall {
  enum class State { kRecompute, kKept, kTaken };
  State state = State::kRecompute;
  DispatchResult result;           // kKept: what the kernel returned
  std::vector<uint64_t> versions;  // kKept: each result tensor's version when it was kept
};

// The calls of one checkpointed forward, per op in call order (PyTorch keys its store by op and
// call index the same way).
struct SelectiveStore {
  std::map<OpId, std::vector<StoredCall>> calls;
};

std::vector<uint64_t> VersionsOf(const std::vector<RawTensor>& tensors) {
  std::vector<uint64_t> versions;
  versions.reserve(tensors.size());
  for (const RawTensor& t : tensors) versions.push_back(t.defined() ? t.storage()->version() : 0);
  return versions;
}

bool IsSave(CheckpointPolicy p) {
  return p == CheckpointPolicy::kMustSave || p == CheckpointPolicy::kPreferSave;
}

// The forward: every dispatched call runs; the policy decides whether its result is kept.
class CachingMode : public OpDispatchMode {
 public:
  CachingMode(CheckpointPolicyFn policy, std::shared_ptr<SelectiveStore> store)
      : policy_(std::move(policy)), store_(std::move(store)) {}

  DispatchResult Call(OpId op, const VariableList& inputs,
                      const std::function<DispatchResult()>& run) override {
    DispatchResult result = run();
    SelectiveCheckpointContext ctx;
    for (const RawTensor& t : result.tensors) {
      ctx.op_output.push_back(t.defined() ? Tensor(t) : Tensor());
    }
    StoredCall call;
    if (IsSave(policy_(ctx, op, inputs))) {
      call.state = StoredCall::State::kKept;
      call.result = result;
      call.versions = VersionsOf(result.tensors);
    }
    store_->calls[op].push_back(std::move(call));
    return result;
  }

 private:
  CheckpointPolicyFn policy_;
  std::shared_ptr<SelectiveStore> store_;
};

constexpr const char* kNondeterministicHint =
    "; the checkpointed function must call the same ops in the same order in the forward and "
    "in the recomputation (it may not depend on state that changed in between)";

// A recomputation: kept calls hand their result back (once), the others run again. The last
// call is provisional (selective_checkpoint.h).
class CachedMode : public OpDispatchMode {
 public:
  CachedMode(std::shared_ptr<SelectiveStore> store, bool allow_mutation)
      : store_(std::move(store)), allow_mutation_(allow_mutation) {}

  DispatchResult Call(OpId op, const VariableList& /*inputs*/,
                      const std::function<DispatchResult()>& run) override {
    MakeFinal();
    const size_t index = next_index_[op]++;
    const auto it = store_->calls.find(op);
    TG_CHECK(it != store_->calls.end(), "checkpoint: the recomputation called ", OpTorchName(op),
             ", which the checkpointed forward did not call", kNondeterministicHint);
    TG_CHECK(index < it->second.size(), "checkpoint: the recomputation called ", OpTorchName(op),
             " ", index + 1, " times, the checkpointed forward ", it->second.size(),
             kNondeterministicHint);
    StoredCall& call = it->second[index];
    if (call.state == StoredCall::State::kRecompute) return run();
    last_ = Last{&call, call.state, call.result, ""};
    if (call.state == StoredCall::State::kTaken) {
      last_->error = absl::StrCat(
          "checkpoint: a second recomputation of a selectively checkpointed segment reached ",
          OpTorchName(op), " (call ", index + 1,
          "), whose kept output the first one already took: a segment under a selective policy "
          "can be backpropagated through once; run the backward calls of one step under one "
          "GraphExecGroup to recompute once for all of them");
      last_->result = run();  // a stand-in, unless the error becomes final
      last_->handed_out_versions = VersionsOf(last_->result.tensors);
      return last_->result;
    }
    if (!allow_mutation_) {
      const std::vector<uint64_t> now = VersionsOf(call.result.tensors);
      for (size_t i = 0; i < now.size() && last_->error.empty(); ++i) {
        if (now[i] == call.versions[i]) continue;
        last_->error = absl::StrCat(
            "checkpoint: output ", i, " of ", OpTorchName(op), " (call ", index + 1,
            "), kept by the selective checkpoint policy, was modified in place after the "
            "forward (version ",
            call.versions[i], ", now ", now[i],
            "); pass allow_cache_entry_mutation = true to CreateSelectiveCheckpointContexts to "
            "allow it");
      }
    }
    call.state = StoredCall::State::kTaken;
    call.result = DispatchResult();
    last_->handed_out_versions = VersionsOf(last_->result.tensors);
    return last_->result;
  }

  // Nothing may write into what the last call handed out while it can still be undone.
  void BeforeInPlaceWrite(const Tensor& /*self*/) override { MakeFinal(); }

  // The recomputation stopped on `tensor`: on an input of the last call (PyTorch would not have
  // run it) that call is undone, on one of its outputs it is final; so it is when what it handed
  // out was written into since (a custom function's in-place write, which no mode sees).
  void StoppedAt(const Tensor& tensor) {
    if (!last_.has_value()) return;
    if (VersionsOf(last_->result.tensors) != last_->handed_out_versions) {
      MakeFinal();
      return;
    }
    const bool output = std::any_of(
        last_->result.tensors.begin(), last_->result.tensors.end(),
        [&](const RawTensor& t) { return t.defined() && t.storage() == tensor.data().storage(); });
    if (output) {
      MakeFinal();
      return;
    }
    last_->call->state = last_->state;
    if (last_->state == StoredCall::State::kKept) last_->call->result = std::move(last_->result);
    last_.reset();
  }

  void MakeFinal() {
    if (!last_.has_value()) return;
    const std::string error = std::move(last_->error);
    last_.reset();
    if (!error.empty()) throw Error(error);
  }

 private:
  // The last call that took (or tried to take) a kept output, until it is final.
  struct Last {
    StoredCall* call;
    StoredCall::State state;  // before the call
    DispatchResult result;    // what it handed out
    std::string error;        // raised when the call becomes final
    std::vector<uint64_t> handed_out_versions = {};
  };

  std::shared_ptr<SelectiveStore> store_;
  bool allow_mutation_;
  std::map<OpId, size_t> next_index_;  // calls of each op so far in this recomputation
  std::optional<Last> last_;
};

// The selective recompute mode entered on this thread, innermost first (recomputations do not
// nest, but a recomputation may run checkpointed segments' forwards).
thread_local CachedMode* active_recompute = nullptr;

// Installs `mode` while what it returns is alive.
std::shared_ptr<void> Enter(std::shared_ptr<OpDispatchMode> mode) {
  struct Entered {
    std::shared_ptr<OpDispatchMode> mode;
    OpDispatchModeGuard guard;
    explicit Entered(std::shared_ptr<OpDispatchMode> m) : mode(std::move(m)), guard(mode.get()) {}
  };
  return std::make_shared<Entered>(std::move(mode));
}

std::atomic<int64_t> next_group_id{0};

}  // namespace

const char* CheckpointPolicyName(CheckpointPolicy policy) {
  switch (policy) {
    case CheckpointPolicy::kMustSave:
      return "MUST_SAVE";
    case CheckpointPolicy::kPreferSave:
      return "PREFER_SAVE";
    case CheckpointPolicy::kMustRecompute:
      return "MUST_RECOMPUTE";
    case CheckpointPolicy::kPreferRecompute:
      return "PREFER_RECOMPUTE";
  }
  return "?";
}

CheckpointPolicy OpListCheckpointPolicy(const SelectiveCheckpointContext& /*ctx*/, OpId op,
                                        const VariableList& /*inputs*/) {
  return CheckpointDefaultOf(op) == CheckpointDefault::kSave ? CheckpointPolicy::kPreferSave
                                                             : CheckpointPolicy::kPreferRecompute;
}

CheckpointContexts CreateSelectiveCheckpointContexts(CheckpointPolicyFn policy,
                                                     bool allow_cache_entry_mutation) {
  TG_CHECK(policy != nullptr, "CreateSelectiveCheckpointContexts: the policy function is empty");
  auto store = std::make_shared<SelectiveStore>();
  CheckpointContexts contexts;
  contexts.forward = [policy = std::move(policy), store] {
    return Enter(std::make_shared<CachingMode>(policy, store));
  };
  // A fresh mode per recomputation: its call counts start at zero.
  contexts.recompute = [store, allow_cache_entry_mutation]() -> std::shared_ptr<void> {
    struct Active {
      std::shared_ptr<void> entered;
      CachedMode* previous = nullptr;
      ~Active() { active_recompute = previous; }
    };
    auto mode = std::make_shared<CachedMode>(store, allow_cache_entry_mutation);
    auto active = std::make_shared<Active>();
    active->previous = active_recompute;
    active_recompute = mode.get();
    active->entered = Enter(std::move(mode));
    return active;
  };
  return contexts;
}

CheckpointContexts CreateSelectiveCheckpointContexts(const std::vector<OpId>& ops_to_save,
                                                     bool allow_cache_entry_mutation) {
  for (const OpId op : ops_to_save) {
    TG_CHECK(CheckpointDefaultOf(op) != CheckpointDefault::kNone,
             "CreateSelectiveCheckpointContexts: ", OpName(op),
             " is not a dispatched op (a view, an in-place op, a composite op or a tensor-level "
             "kernel; its checkpoint column in tensor/op_list.inc is kNone), so no policy sees "
             "it; list the ops it is made of instead");
  }
  return CreateSelectiveCheckpointContexts(
      [ops_to_save](const SelectiveCheckpointContext&, OpId op, const VariableList&) {
        return std::find(ops_to_save.begin(), ops_to_save.end(), op) != ops_to_save.end()
                   ? CheckpointPolicy::kMustSave
                   : CheckpointPolicy::kPreferRecompute;
      },
      allow_cache_entry_mutation);
}

namespace selective_internal {

void StoppedAt(const Tensor& last) {
  if (active_recompute != nullptr) active_recompute->StoppedAt(last);
}

void Finished() {
  if (active_recompute != nullptr) active_recompute->MakeFinal();
}

}  // namespace selective_internal

GraphExecGroup::GraphExecGroup() : id_(next_group_id.fetch_add(1)) {
  TG_CHECK(current_graph_exec_group() < 0, "GraphExecGroup: groups cannot be nested (group ",
           current_graph_exec_group(), " is alive on this thread)");
  set_current_graph_exec_group(id_);
}

GraphExecGroup::~GraphExecGroup() { set_current_graph_exec_group(-1); }

int64_t GraphExecGroup::current() { return current_graph_exec_group(); }

}  // namespace tg
