// The op list (tensor/op_list.inc, which has the recipe for adding an op) as C++: OpId names an
// op, kOpList holds its attributes (name, node name, message name, differentiable, tensor op,
// autocast policy), all constexpr, so a lookup by OpId folds to a constant and costs nothing at run
// time.
//
//   autocast:  AutocastInputs(OpId::kMatmul, a, b) casts per AutocastPolicyOf(OpId::kMatmul);
//   autograd:  Record(OpNodeName(OpId::kMatmul), ...) names the node "MatmulBackward", and
//              messages name the op OpTorchName(OpId::kMatmul), "matmul";
//   tests:     the two op tables enumerate kOpList (a listed op without a row fails).
//
// It sits in tensor/ (header only, no deps) so that the tensor layer, autograd and both test
// tables read the same list.
#ifndef TAPEGRAD_TENSOR_OP_LIST_H_
#define TAPEGRAD_TENSOR_OP_LIST_H_

#include <cstddef>
#include <string_view>

namespace tg {

// What autocast does to an op's floating inputs (tensor/op_list.inc has the meaning of each).
enum class CastPolicy { kLowPrecision, kFloat32, kPromote, kNone };

constexpr const char* CastPolicyName(CastPolicy policy) {
  switch (policy) {
    case CastPolicy::kLowPrecision:
      return "low precision";
    case CastPolicy::kFloat32:
      return "f32";
    case CastPolicy::kPromote:
      return "promote";
    case CastPolicy::kNone:
      return "none";
  }
  return "?";
}

// What an FP8 scope does to an op (tensor/op_list.inc has the meaning of each).
enum class Fp8Policy { kGemm, kNone };

// Whether the op dispatches (autograd/dispatch_mode.h), and if so what selective activation
// checkpointing does with its output when the policy leaves it to the op list
// (tensor/op_list.inc has the meaning of each).
enum class CheckpointDefault { kSave, kRecompute, kNone };

enum class OpId {
#define TG_OP(name, differentiable, tensor_op, autocast, fp8, checkpoint, torch_name) k##name,
#include "tensor/op_list.inc"
#undef TG_OP
};

struct OpInfo {
  OpId id;
  const char* name;        // "Matmul"
  const char* node_name;   // "MatmulBackward": the node the differentiable op records
  const char* torch_name;  // "matmul": the op's name in error messages
  bool differentiable;     // an op of autograd/ops.h
  bool tensor_op;          // a dispatch function of tensor/ops.h
  CastPolicy autocast;
  Fp8Policy fp8;
  CheckpointDefault checkpoint;
};

// clang-format off
inline constexpr OpInfo kOpList[] = {
#define TG_OP(name, differentiable, tensor_op, autocast, fp8, checkpoint, torch_name) \
  OpInfo{OpId::k##name, #name, #name "Backward", torch_name, differentiable, tensor_op, \
         CastPolicy::autocast, Fp8Policy::fp8, CheckpointDefault::checkpoint},
#include "tensor/op_list.inc"
#undef TG_OP
};
// clang-format on

inline constexpr size_t kOpCount = sizeof(kOpList) / sizeof(kOpList[0]);

constexpr const OpInfo& OpInfoOf(OpId id) { return kOpList[static_cast<size_t>(id)]; }
constexpr CastPolicy AutocastPolicyOf(OpId id) { return OpInfoOf(id).autocast; }
constexpr Fp8Policy Fp8PolicyOf(OpId id) { return OpInfoOf(id).fp8; }
constexpr CheckpointDefault CheckpointDefaultOf(OpId id) { return OpInfoOf(id).checkpoint; }
constexpr const char* OpName(OpId id) { return OpInfoOf(id).name; }
constexpr const char* OpNodeName(OpId id) { return OpInfoOf(id).node_name; }
constexpr const char* OpTorchName(OpId id) { return OpInfoOf(id).torch_name; }

// The entry named `name` (its C++ name, "Matmul"), or nullptr.
constexpr const OpInfo* FindOp(std::string_view name) {
  for (const OpInfo& op : kOpList) {
    if (name == op.name) return &op;
  }
  return nullptr;
}

namespace op_list_internal {

// The list's own rules, checked when this header compiles: every op in at least one of the two
// APIs, and an autocast policy and a checkpoint default only where they can apply (the
// differentiable ops; a tensor op's inputs are cast, and its call dispatched, by
// the autograd op that calls it). That kOpList[i] is the entry of OpId i is not checked: both
// are expanded from op_list.inc in one pass order, so it holds by construction.
constexpr bool WellFormed() {
  for (const OpInfo& op : kOpList) {
    if (!op.differentiable && !op.tensor_op) return false;
    if (op.torch_name[0] == '\0') return false;
    if (!op.differentiable && op.autocast != CastPolicy::kNone) return false;
    if (op.fp8 == Fp8Policy::kGemm &&
        (!op.differentiable || op.autocast != CastPolicy::kLowPrecision)) {
      return false;
    }
    if (!op.differentiable && op.checkpoint != CheckpointDefault::kNone) return false;
  }
  return true;
}
static_assert(WellFormed(),
              "tensor/op_list.inc: an entry is neither differentiable nor a tensor op, has no "
              "torch name, is not differentiable but has an autocast policy other than kNone, or "
              "has the fp8 policy kGemm without being a differentiable kLowPrecision (GEMM) op, or "
              "is not differentiable but has a checkpoint default other than kNone");

}  // namespace op_list_internal
}  // namespace tg

#endif  // TAPEGRAD_TENSOR_OP_LIST_H_
