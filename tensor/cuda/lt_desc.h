// cuBLASLt's descriptors as owned handles, and the one-line attribute setter: what the product
// kernels (matmul.cc, fp8_gemm.cc) build every call with. Private to tensor/cuda.
//
//   MatmulDesc desc(raw);                              // destroyed with the handle
//   SetDesc(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
#ifndef TAPEGRAD_TENSOR_CUDA_LT_DESC_H_
#define TAPEGRAD_TENSOR_CUDA_LT_DESC_H_

#include <cublasLt.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "tensor/cuda/runtime.h"

namespace tg::cuda {

struct LtDescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
  void operator()(cublasLtMatrixLayoutOpaque_t* d) const { cublasLtMatrixLayoutDestroy(d); }
  void operator()(cublasLtMatmulPreferenceOpaque_t* d) const { cublasLtMatmulPreferenceDestroy(d); }
};
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, LtDescDeleter>;
using LayoutDesc = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LtDescDeleter>;
using PreferenceDesc = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, LtDescDeleter>;

template <typename T>
void SetDesc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

// The algorithm cuBLASLt's heuristic chose for a kind of call, and the workspace it asked for.
struct LtAlgo {
  cublasLtMatmulAlgo_t algo;
  size_t workspace;
};

// The algorithms chosen so far, by the key of a call (its types, shapes, layouts, alignments,
// epilogue): the heuristic runs once per key. Shared by the threads; one per kind of product.
class LtAlgoCache {
 public:
  std::optional<LtAlgo> Find(const std::vector<int64_t>& key) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  void Put(const std::vector<int64_t>& key, const LtAlgo& algo) {
    std::lock_guard<std::mutex> lock(mu_);
    map_.emplace(key, algo);
  }

 private:
  std::mutex mu_;
  std::map<std::vector<int64_t>, LtAlgo> map_;
};

}  // namespace tg::cuda

#endif  // TAPEGRAD_TENSOR_CUDA_LT_DESC_H_
