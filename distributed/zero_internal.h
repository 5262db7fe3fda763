// The private part of dist::ZeroOptimizer shared by its source files (zero.cc: construction,
// layout, step and inspection; zero_backward.cc: the hooks, buckets and epilogue of backward;
// zero_stage3.cc: gathering and freeing the parameters of stage 3 units; zero_state_dict.cc:
// the world-size independent state_dict). Not a public header: only those files include it.
#ifndef TAPEGRAD_DISTRIBUTED_ZERO_INTERNAL_H_
#define TAPEGRAD_DISTRIBUTED_ZERO_INTERNAL_H_

#include <any>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "autograd/variable.h"
#include "distributed/process_group.h"
#include "distributed/zero.h"
#include "tensor/tensor.h"

namespace tg::dist {
namespace zero_internal {

inline constexpr const char* kName = "ZeroOptimizer";

inline bool IsLowPrecision(DType d) { return d == kF16 || d == kBF16; }
// The dtype of masters, master gradients and optimizer state (optim::StateDType's rule).
inline DType MasterDType(DType d) { return d == kF64 ? kF64 : kF32; }
inline int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
inline int64_t Bytes(const RawTensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

// What a stage 3 unit's pack hook stores for a tensor that is not in a gathered buffer: the
// leaf itself (it has no history to cycle through), or the data of a non-leaf (keeping the
// Tensor would make a cycle node -> saved -> variable -> node for a saved output).
struct PlainSaved {
  Tensor leaf;
  RawTensor data;
  uint64_t version = 0;
};
// A tensor saved while hooks from outside the unit were active: theirs to store and restore.
struct Delegated {
  UnpackHook unpack;
  std::any value;
};

}  // namespace zero_internal

struct ZeroOptimizer::Param {
  Tensor var;
  int group = 0;
  int flat = -1;
  int bucket = -1;
  int unit = -1;
  int64_t offset = 0;  // first element in the flat buffer
  int64_t numel = 0;
  Shape shape;
  DType dtype = kF32;
  bool arrived = false;  // stage 2/3: this backward's gradient is in its bucket
  RawTensor placeholder;  // stage 3: 1-element NaN storage expanded to `shape`
  // .grad holds a gradient accumulated by a backward issued in forward (ForwardScope) that no
  // epilogue has taken yet: the next launch of its bucket includes it (see zero.h).
  bool forward_grad = false;
};

struct ZeroOptimizer::Bucket {
  int flat = 0;
  std::vector<int> params;    // buffer order
  int64_t start = 0;          // first element in the flat buffer
  int64_t numel = 0;          // padded to a multiple of the world size
  int64_t chunk = 0;          // numel / world: the part each rank owns
  int64_t master_offset = 0;  // where this rank's chunk lives in the flat buffer's master
  RawTensor grad;             // [numel] reduce dtype, while filling or in flight
  RawTensor shard_grad;       // [chunk] reduce dtype, the reduce_scatter's output
  std::shared_ptr<Work> work;
  int arrived = 0;
  bool launched = false;
};

struct ZeroOptimizer::Flat {
  int group = 0;
  int unit = -1;
  DType dtype = kF32;
  DType reduce_dtype = kF32;
  std::vector<int> params;   // buffer order
  std::vector<int> buckets;  // buffer order
  int64_t numel = 0;         // padded, all ranks
  int64_t shard_numel = 0;   // this rank's elements
  RawTensor full;            // [numel] model dtype (stage 3: only while gathered)
  RawTensor shard;           // stage 3: [shard_numel] model dtype
  Tensor master;             // [shard_numel] f32 (f64 for f64)
  RawTensor master_grad;     // [shard_numel] master dtype, or undefined
};

struct ZeroOptimizer::Unit {
  std::shared_ptr<nn::Module> module;
  std::string name;
  std::vector<int> flats;
  std::vector<int> params;
  int active = 0;  // forward calls running
  bool gathered = false;
  std::vector<std::unique_ptr<SavedTensorHooks>> guards;
  int64_t task = -1;  // the graph task whose gradients are arriving
  int expected = 0, arrived = 0;
};

// A saved tensor that lives in a gathered flat buffer of a stage 3 unit.
struct ZeroOptimizer::ParamRef {
  int flat = 0;
  Shape shape, strides;
  int64_t offset = 0;
};

}  // namespace tg::dist

#endif  // TAPEGRAD_DISTRIBUTED_ZERO_INTERNAL_H_
