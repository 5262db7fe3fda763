// oneDNN for the CPU kernels (convolution in conv.cc, matmul here): the engine, a stream per
// thread, a thread-safe cache of created primitives, and the execution of a primitive on our
// plain (row-major, contiguous or strided) buffers, reordering to and from the layouts the
// primitive chose where they differ.
//
//   static DnnlCache cache;
//   std::shared_ptr<const DnnlPrimitive> p = cache.Get(key, [&] { ... build or nullptr ... });
//   if (p == nullptr || !DnnlExecute(*p, {x_ptr, w_ptr, out_ptr})) { ... our own kernel ... }
//
// oneDNN picks its instruction set (AVX2, AVX-512, AVX-512 BF16, AMX) on the machine it runs on
// and runs on libgomp's pool of OMP_NUM_THREADS threads (tensor/cpu/parallel.h); for a fixed
// thread count its results are the same run to run. A dnnl::error never leaves this file: a
// primitive that cannot be created is cached as nullptr and one that fails to run makes
// DnnlExecute return false, and the caller then runs its own kernel.
#ifndef TAPEGRAD_TENSOR_CPU_DNNL_H_
#define TAPEGRAD_TENSOR_CPU_DNNL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "tensor/dtype.h"

namespace tg::cpu {

dnnl::engine& DnnlEngine();

// oneDNN's type for f32/bf16/f16; undef for the others (f64 and integers never go to oneDNN).
dnnl::memory::data_type DnnlType(DType dtype);

// Whether oneDNN would run primitive descriptor `pd` with one of its reference implementations
// (plain C++ loops, much slower than our own kernels), judged by its implementation name.
bool IsDnnlReference(const dnnl::primitive_desc_base& pd);

// Whether oneDNN's bf16 products beat widening the operands to f32 and multiplying in f32 on this
// CPU; decided once per process from the ISA oneDNN dispatches to (ONEDNN_MAX_CPU_ISA caps it)
// and the CPU's vendor, never by timing (a timed choice would make results depend on the load):
// - AMX: yes (tile products, several times the f32 rate);
// - AVX-512 BF16 without AMX: on AMD yes (Zen 4: 251 against 150 GFLOP/s f32, issue 39), on
//   Intel no (VDPBF16PS issues on one port where f32 FMAs use two: 73 against 124 GFLOP/s on an
//   Emerald Rapids VM whose AMX is hidden, PyTorch's own matmul alike; docs/performance.md);
// - below that oneDNN has only reference bf16 kernels, which are refused anyway.
// DnnlMatmul declines bf16 where this is false, and its callers widen (gemm.h).
bool DnnlBf16ProductsPay();

// The attributes every primitive here is created with: a user-managed scratchpad, which
// DnnlExecute gives per thread. (oneDNN's own scratchpad is one global buffer in Debian's build,
// without concurrent execution: two threads running primitives at once, as attention heads in
// a parallel region do, would share it, and results would change from run to run.)
dnnl::primitive_attr DnnlAttr();

// A created primitive and its arguments, in the order DnnlExecute takes their pointers.
struct DnnlPrimitive {
  struct Arg {
    int id;                     // DNNL_ARG_*
    dnnl::memory::desc plain;   // our buffer's layout
    dnnl::memory::desc wanted;  // the primitive's layout (== plain: no reorder)
    bool output;
    dnnl::reorder reorder;  // plain -> wanted for an input, wanted -> plain for an output
  };
  dnnl::primitive primitive;
  dnnl::memory::desc scratchpad;  // the primitive descriptor's scratchpad_desc() (DnnlAttr)
  std::vector<Arg> args;
  int threads = 1;  // the thread count it was created for and runs with (DnnlCache::Get)

  // Appends an argument; a reorder is created when `wanted` differs from `plain`.
  void AddArg(int id, const dnnl::memory::desc& plain, const dnnl::memory::desc& wanted,
              bool output);
};

// Runs `p` on the buffers `pointers` (one per argument, in p.args' order) on this thread's
// stream, through per-thread scratch buffers for arguments the primitive wants in another
// layout. Returns false (having written nothing reliable into outputs) if oneDNN failed.
bool DnnlExecute(const DnnlPrimitive& p, const std::vector<void*>& pointers);

// Primitives by key (the op, dtypes, shapes and parameters as integers; the thread count the
// primitive will run with is added here). make() builds one, or
// returns nullptr where oneDNN has no fast implementation; a dnnl::error it throws counts as
// nullptr. Both answers are kept (up to kCapacity keys; the cache is emptied when full), so a
// shape pays the creation once. Creation runs outside the lock: two threads may both build the
// same key, and the first stored wins.
class DnnlCache {
 public:
  using Key = std::vector<int64_t>;
  std::shared_ptr<const DnnlPrimitive> Get(
      const Key& key, const std::function<std::shared_ptr<DnnlPrimitive>()>& make);

 private:
  static constexpr size_t kCapacity = 256;
  std::mutex mu_;
  std::map<Key, std::shared_ptr<const DnnlPrimitive>> map_;
};

// c [m, n] = a [m, k] @ b [k, n] for f32, f16 or bf16 operands of dtype `in`, accumulated in
// f32 and written as `out` (f32: the unrounded sums; `in`: each rounded once), all row-major with
// leading dimensions lda/ldb/ldc, a and b optionally stored transposed (as in cblas). Returns
// false, and the caller multiplies itself, where oneDNN has no fast implementation for it on
// this CPU (oneDNN 2.6: f16 anywhere, bf16 without AVX-512 BF16 or where DnnlBf16ProductsPay()
// says widening is faster), for empty sizes, or on a failure.
// With `bias` (f32 [n], only for an f32 result) each c[i, j] is the f32 sum plus bias[j],
// rounded once more: what adding the bias to the finished product gives, in the product's pass.
bool DnnlMatmul(DType in, DType out, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                const void* a, int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc,
                const float* bias = nullptr);

}  // namespace tg::cpu

#endif  // TAPEGRAD_TENSOR_CPU_DNNL_H_
