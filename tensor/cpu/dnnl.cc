#include "tensor/cpu/dnnl.h"

#include <cpuid.h>
#include <omp.h>

#include <cstring>

#include <string>
#include <unordered_map>
#include <utility>

#include "tensor/cpu/parallel.h"

namespace tg::cpu {
namespace {

// A stream is not safe to use from two threads at once; a CPU stream is cheap, so each thread
// that runs a primitive (a caller of ParallelFor's region included) gets its own.
dnnl::stream& ThreadStream() {
  thread_local dnnl::stream stream(DnnlEngine());
  return stream;
}

// Per-thread buffers for arguments in the primitive's own layout, one per argument position,
// kept at their largest size: a fresh multi-megabyte block per call would cost a page fault
// per 4 KiB page (as conv.cc's Scratch explains).
void* ThreadScratch(size_t slot, size_t bytes) {
  struct Block {
    std::unique_ptr<char[]> data;
    size_t bytes = 0;
  };
  thread_local std::vector<Block> blocks;
  if (blocks.size() <= slot) blocks.resize(slot + 1);
  Block& b = blocks[slot];
  if (bytes > b.bytes) {
    b.data.reset();  // free before allocating the larger block
    b.data.reset(new char[bytes]);
    b.bytes = bytes;
  }
  return b.data.get();
}

}  // namespace

dnnl::engine& DnnlEngine() {
  static dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

dnnl::primitive_attr DnnlAttr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

dnnl::memory::data_type DnnlType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return dnnl::memory::data_type::f32;
    case DType::kBF16:
      return dnnl::memory::data_type::bf16;
    case DType::kF16:
      return dnnl::memory::data_type::f16;
    default:
      return dnnl::memory::data_type::undef;
  }
}

bool IsDnnlReference(const dnnl::primitive_desc_base& pd) {
  return std::string(pd.impl_info_str()).find("ref") != std::string::npos;
}

void DnnlPrimitive::AddArg(int id, const dnnl::memory::desc& plain,
                           const dnnl::memory::desc& wanted, bool output) {
  Arg arg{id, plain, wanted, output, dnnl::reorder()};
  if (wanted != plain) {
    const dnnl::memory::desc& from = output ? wanted : plain;
    const dnnl::memory::desc& to = output ? plain : wanted;
    arg.reorder =
        dnnl::reorder(dnnl::reorder::primitive_desc(DnnlEngine(), from, DnnlEngine(), to));
  }
  args.push_back(std::move(arg));
}

bool DnnlExecute(const DnnlPrimitive& p, const std::vector<void*>& pointers) {
  // The primitive and its reorders run with the thread count they were created for
  // (RegionThreads may have moved since; a call inside a parallel region runs on its one thread).
  const LibraryThreads threads(omp_in_parallel() ? omp_get_max_threads() : p.threads);
  try {
    dnnl::stream& stream = ThreadStream();
    std::unordered_map<int, dnnl::memory> exec_args;
    struct Pending {  // an output in the primitive's layout, reordered into ours after it ran
      const dnnl::reorder* reorder;
      dnnl::memory from, to;
    };
    std::vector<Pending> outputs;
    for (size_t i = 0; i < p.args.size(); ++i) {
      const DnnlPrimitive::Arg& a = p.args[i];
      dnnl::memory plain(a.plain, DnnlEngine(), pointers[i]);
      if (a.wanted == a.plain) {
        exec_args.emplace(a.id, plain);
        continue;
      }
      dnnl::memory wanted(a.wanted, DnnlEngine(), ThreadScratch(i, a.wanted.get_size()));
      if (a.output) {
        outputs.push_back({&a.reorder, wanted, plain});
      } else {
        a.reorder.execute(stream, plain, wanted);
      }
      exec_args.emplace(a.id, wanted);
    }
    if (p.scratchpad.get_size() > 0) {
      // The slot after the arguments' own (ThreadScratch slots 0..args-1).
      exec_args.emplace(DNNL_ARG_SCRATCHPAD,
                        dnnl::memory(p.scratchpad, DnnlEngine(),
                                     ThreadScratch(p.args.size(), p.scratchpad.get_size())));
    }
    p.primitive.execute(stream, exec_args);
    for (Pending& o : outputs) o.reorder->execute(stream, o.from, o.to);
    stream.wait();
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

std::shared_ptr<const DnnlPrimitive> DnnlCache::Get(
    const Key& key_without_threads, const std::function<std::shared_ptr<DnnlPrimitive>()>& make) {
  // Some implementations split their work (and reductions) for the thread count they were
  // created under, and a call from inside a parallel region runs on its one thread: the thread
  // count the primitive will run with is part of the key.
  Key key = key_without_threads;
  const int threads = omp_in_parallel() ? 1 : RegionThreads();
  key.push_back(threads);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) return it->second;
  }
  std::shared_ptr<const DnnlPrimitive> made;
  try {
    // Created for that count: oneDNN sizes a primitive's split of the work when it is created,
    // and runs it with that many threads whatever omp_get_max_threads() says later.
    const LibraryThreads created_for(threads);
    std::shared_ptr<DnnlPrimitive> fresh = make();
    if (fresh != nullptr) fresh->threads = threads;
    made = std::move(fresh);
  } catch (const dnnl::error&) {
    made = nullptr;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (map_.size() >= kCapacity) map_.clear();
  return map_.emplace(key, std::move(made)).first->second;
}

bool DnnlBf16ProductsPay() {
  static const bool pays = [] {
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    if (isa == dnnl::cpu_isa::avx512_core_amx) return true;
    if (isa != dnnl::cpu_isa::avx512_core_bf16) return false;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return false;
    char vendor[13] = {};
    std::memcpy(vendor, &ebx, 4);
    std::memcpy(vendor + 4, &edx, 4);
    std::memcpy(vendor + 8, &ecx, 4);
    return std::strcmp(vendor, "AuthenticAMD") == 0;
  }();
  return pays;
}

bool DnnlMatmul(DType in, DType out, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                const void* a, int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc,
                const float* bias) {
  if (in != DType::kBF16 && in != DType::kF16 && in != DType::kF32) return false;
  if (in == DType::kBF16 && !DnnlBf16ProductsPay()) return false;
  if (out != in && out != DType::kF32) return false;
  if (bias != nullptr && out != DType::kF32) return false;
  if (m <= 0 || n <= 0 || k <= 0) return false;
  static DnnlCache* cache = new DnnlCache;
  const bool with_bias = bias != nullptr;
  const std::shared_ptr<const DnnlPrimitive> p = cache->Get(
      {static_cast<int64_t>(in), static_cast<int64_t>(out), ta, tb, m, n, k, lda, ldb, ldc,
       with_bias},
      [&] {
        using dnnl::memory;
        const memory::data_type ti = DnnlType(in), to = DnnlType(out);
        // A transposed operand is the same matrix with its strides swapped.
        const memory::desc a_md({m, k}, ti, ta ? memory::dims{1, lda} : memory::dims{lda, 1});
        const memory::desc b_md({k, n}, ti, tb ? memory::dims{1, ldb} : memory::dims{ldb, 1});
        const memory::desc c_md({m, n}, to, memory::dims{ldc, 1});
        const memory::desc bias_md({1, n}, memory::data_type::f32, memory::dims{n, 1});
        const dnnl::matmul::desc desc = with_bias ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md)
                                                  : dnnl::matmul::desc(a_md, b_md, c_md);
        const dnnl::matmul::primitive_desc pd(desc, DnnlAttr(), DnnlEngine());
        if (IsDnnlReference(pd)) return std::shared_ptr<DnnlPrimitive>();
        auto prim = std::make_shared<DnnlPrimitive>();
        prim->primitive = dnnl::matmul(pd);
        prim->scratchpad = pd.scratchpad_desc();
        prim->AddArg(DNNL_ARG_SRC, a_md, pd.src_desc(), false);
        prim->AddArg(DNNL_ARG_WEIGHTS, b_md, pd.weights_desc(), false);
        prim->AddArg(DNNL_ARG_DST, c_md, pd.dst_desc(), true);
        if (with_bias) prim->AddArg(DNNL_ARG_BIAS, bias_md, pd.bias_desc(), false);
        return prim;
      });
  std::vector<void*> pointers = {const_cast<void*>(a), const_cast<void*>(b), c};
  if (with_bias) pointers.push_back(const_cast<float*>(bias));
  return p != nullptr && DnnlExecute(*p, pointers);
}

}  // namespace tg::cpu
