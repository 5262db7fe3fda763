// tg::cuda::Matmul and MatmulEx through cuBLASLt (see tensor/cuda/blas.h for the contracts).
//
// Mapping to cuBLASLt. cuBLASLt works on column-major matrices. A row-major [r, c] matrix with
// row stride ld is the column-major [c, r] matrix with leading dimension ld, so the row-major
// product out[m, n] = op(a)[m, k] @ op(b)[k, n] is handed to cuBLASLt as the column-major
// product out^T[n, m] = op(b)^T[n, k] @ op(a)^T[k, m]: cuBLASLt's "A" is our b and its "B" is
// our a. Each operand is stored either row-major (unit column stride) or column-major (unit row
// stride, i.e. a transposed view); its cuBLASLt transpose flag is "stored layout XOR requested
// transpose". In that view cuBLASLt's rows are our columns, so its per-row bias (length n) is
// our per-column bias, BGRADB (sums of its B over k) gives the row sums of op(a), and the
// DGELU_BGRAD gradient (sums over its columns) gives our column sums.
//
// Batches. The batch dims of out, a, b (and aux, and a bias gradient) are walked with
// ForEachRow: dims that are uniformly strided for every operand merge into one strided batch
// (stride 0 for a broadcast operand), and the rest are looped over on the host, one cuBLASLt
// call per outer index.
//
// Algorithms come from cublasLtMatmulAlgoGetHeuristic, cached per problem: shapes, leading
// dims, batch strides, dtypes, compute type, transposes, epilogue, aux leading dim, the
// alignment of every pointer and batch stride (cuBLASLt picks kernels that may rely on it), and
// the device. Descriptors are rebuilt per call (cheap host objects); the heuristic is not.
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensor/cuda/blas.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/lt_desc.h"
#include "tensor/cuda/runtime.h"
#include "tensor/kernel_options.h"
#include "tensor/strided_loop.h"

namespace tg::cuda {
namespace {

// cuBLASLt's workspace: enough for its split-K and stream-K kernels on an H100 (NVIDIA
// recommends 32 MiB on Hopper), taken from the per-device scratch buffer of runtime.h.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// The calling thread's AllowTf32Scope: -1 none (KernelOptions::allow_tf32 decides), else 0 / 1.
thread_local int tf32_scope = -1;

// How one stored matrix [rows, cols] with element strides (row_stride, col_stride) is described
// to cuBLASLt, or ok == false when it must be copied first.
struct StoredLayout {
  bool ok = false;
  bool column_major = false;  // unit row stride: a transposed view of a row-major matrix
  int64_t ld = 0;
};

StoredLayout LayoutOf(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  const int64_t min_rows = std::max<int64_t>(rows, 1), min_cols = std::max<int64_t>(cols, 1);
  // A size-1 dim may have any stride; prefer the row-major reading, as the CPU kernel does.
  if ((cols == 1 || col_stride == 1) && (rows == 1 || row_stride >= min_cols)) {
    return {true, false, rows == 1 ? min_cols : row_stride};
  }
  if ((rows == 1 || row_stride == 1) && (cols == 1 || col_stride >= min_rows)) {
    return {true, true, cols == 1 ? min_rows : col_stride};
  }
  return {};
}

StoredLayout MatrixLayout(const RawTensor& t) {
  const int64_t d = t.dim();
  return LayoutOf(t.size(d - 2), t.size(d - 1), t.strides()[d - 2], t.strides()[d - 1]);
}

cudaDataType CudaType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF64:
      return CUDA_R_64F;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      throw Error(absl::StrCat("matmul: no cuBLASLt type for dtype ", DTypeName(dtype)));
  }
}

// The largest power of two (at most 256, cuBLASLt's default requirement) dividing the address
// and every batch step added to it.
uint32_t AlignmentOf(const void* ptr, const Shape& byte_steps) {
  uint64_t bits = reinterpret_cast<uintptr_t>(ptr) | 256;
  for (int64_t s : byte_steps) bits |= static_cast<uint64_t>(s);
  return static_cast<uint32_t>(bits & (~bits + 1));
}

cublasLtEpilogue_t LtEpilogue(Epilogue e, bool has_aux) {
  switch (e) {
    case Epilogue::kNone:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::kGelu:
      return has_aux ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU;
    case Epilogue::kBiasGelu:
      return has_aux ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
    case Epilogue::kDGelu:
      return CUBLASLT_EPILOGUE_DGELU;
    case Epilogue::kDGeluBgrad:
      return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case Epilogue::kBgrad:
      return CUBLASLT_EPILOGUE_BGRADB;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

bool IsBgrad(Epilogue e) { return e == Epilogue::kBgrad || e == Epilogue::kDGeluBgrad; }
bool ReadsBias(Epilogue e) { return e == Epilogue::kBias || e == Epilogue::kBiasGelu; }
bool TakesAux(Epilogue e) {
  return e == Epilogue::kGelu || e == Epilogue::kBiasGelu || e == Epilogue::kDGelu ||
         e == Epilogue::kDGeluBgrad;
}
bool NeedsAux(Epilogue e) { return e == Epilogue::kDGelu || e == Epilogue::kDGeluBgrad; }

// One cuBLASLt column-major operand: the stored matrix (rows x cols, leading dim ld) and its
// batch.
struct LtMatrix {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch;
  int64_t batch_stride;  // elements
};

// The column-major matrix cuBLASLt sees in a stored [rows, cols] tapegrad matrix: [cols, rows]
// when row-major, [rows, cols] when column-major (not yet batched).
LtMatrix StoredMatrix(cudaDataType type, const StoredLayout& s, int64_t rows, int64_t cols) {
  const int64_t lt_rows = s.column_major ? rows : cols, lt_cols = s.column_major ? cols : rows;
  return {type,
          static_cast<uint64_t>(lt_rows),
          static_cast<uint64_t>(lt_cols),
          std::max<int64_t>(s.ld, std::max<int64_t>(lt_rows, 1)),
          1,
          0};
}

LayoutDesc MakeLayout(const LtMatrix& m) {
  cublasLtMatrixLayout_t raw = nullptr;
  TG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&raw, m.type, m.rows, m.cols, m.ld));
  LayoutDesc layout(raw);
  if (m.batch > 1) {
    TG_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                     &m.batch, sizeof(m.batch)));
    TG_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &m.batch_stride, sizeof(m.batch_stride)));
  }
  return layout;
}

// Everything about one (strided-batched) cuBLASLt call except the pointers.
struct LtProblem {
  int device;
  cublasComputeType_t compute;
  cudaDataType scale_type;
  cublasOperation_t op_a, op_b;  // cuBLASLt's A (our b) and B (our a)
  LtMatrix a, b, d;              // C is D (in place)
  cublasLtEpilogue_t epilogue;
  int64_t aux_ld, aux_batch_stride, bias_batch_stride;
  uint32_t align_a, align_b, align_d, align_bias, align_aux;

  std::vector<int64_t> Key() const {
    std::vector<int64_t> key = {
        device,           compute,           scale_type, op_a,    op_b,    epilogue,   aux_ld,
        aux_batch_stride, bias_batch_stride, align_a,    align_b, align_d, align_bias, align_aux};
    for (const LtMatrix* m : {&a, &b, &d}) {
      key.insert(key.end(), {m->type, static_cast<int64_t>(m->rows), static_cast<int64_t>(m->cols),
                             m->ld, m->batch, m->batch_stride});
    }
    return key;
  }
};

LtAlgoCache& AlgoCache() {
  static auto* cache = new LtAlgoCache;
  return *cache;
}

// Describes the call that failed, for the error when cuBLASLt has no algorithm.
struct CallContext {
  const char* op;
  const RawTensor* out;
  const RawTensor* a;
  bool transpose_a;
  const RawTensor* b;
  bool transpose_b;
  Epilogue epilogue;
};

std::string Describe(const CallContext& c, const LtProblem& p) {
  return absl::StrCat(c.op, ": cuBLASLt has no algorithm for out ", ShapeToString(c.out->shape()),
                      " (", DTypeName(c.out->dtype()), ") = a ", ShapeToString(c.a->shape()),
                      c.transpose_a ? " transposed" : "", " @ b ", ShapeToString(c.b->shape()),
                      c.transpose_b ? " transposed" : "", " (", DTypeName(c.a->dtype()),
                      "), epilogue ", EpilogueName(c.epilogue), ", pointer alignments a ",
                      p.align_b, ", b ", p.align_a, ", out ", p.align_d, ", bias ", p.align_bias,
                      ", aux ", p.align_aux, " bytes");
}

// d = epilogue(alpha * op_a(a) @ op_b(b) + beta * d) in cuBLASLt's column-major terms. Returns
// false, with the reason in *why and nothing enqueued, when cuBLASLt has no algorithm for it.
bool RunLt(const LtProblem& p, const CallContext& ctx, const void* a, const void* b, void* d,
           void* bias, void* aux, double alpha, double beta, std::string* why) {
  cublasLtMatmulDesc_t raw_desc = nullptr;
  TG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw_desc, p.compute, p.scale_type));
  MatmulDesc desc(raw_desc);
  SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, p.op_a);
  SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, p.op_b);
  SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, p.epilogue);
  if (bias != nullptr && p.bias_batch_stride != 0) {
    SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, p.bias_batch_stride);
  }
  if (aux != nullptr) {
    SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, p.aux_ld);
    if (p.aux_batch_stride != 0) {
      SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, p.aux_batch_stride);
    }
  }
  // The bias and aux pointers go into the descriptor itself, and the heuristic reads their
  // values for the alignment they promise (cublasLt.h: "Routines that don't dereference this
  // pointer, like cublasLtMatmulAlgoGetHeuristic() depend on its value to determine expected
  // pointer alignment"). The algorithm is cached per key and reused for every batch entry and
  // later call with that key, whose pointers may be less aligned than this call's, so the
  // heuristic is shown addresses with exactly the key's alignments (never dereferenced), and
  // the real pointers are set for the product.
  auto set_pointers = [&](void* bias_value, void* aux_value) {
    if (bias != nullptr) SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_value);
    if (aux != nullptr) SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux_value);
  };
  const LayoutDesc la = MakeLayout(p.a), lb = MakeLayout(p.b), ld = MakeLayout(p.d);
  cublasLtHandle_t handle = CublasLtHandle(p.device);

  LtAlgo algo{};
  const std::vector<int64_t> key = p.Key();
  if (const std::optional<LtAlgo> cached = AlgoCache().Find(key)) {
    algo = *cached;
  } else {
    set_pointers(reinterpret_cast<void*>(static_cast<uintptr_t>(p.align_bias)),
                 reinterpret_cast<void*>(static_cast<uintptr_t>(p.align_aux)));
    cublasLtMatmulPreference_t raw_pref = nullptr;
    TG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw_pref));
    PreferenceDesc pref(raw_pref);
    const uint64_t max_workspace = kWorkspaceBytes;
    TG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace)));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, p.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, p.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, p.align_d},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, p.align_d}};
    for (const auto& [attr, value] : alignments) {
      TG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw_pref, attr, &value, sizeof(value)));
    }
    // Split-K partial products are summed in the compute type (f32) only. cuBLASLt's default
    // also allows summing them in the output buffer or type (REDUCTION_SCHEME_INPLACE and
    // _OUTPUT_TYPE), which for f16/bf16 outputs rounds every partial sum (PyTorch's
    // allow_{fp16,bf16}_reduced_precision_reduction, on by default there). On the H200 the
    // dGELU + bias-gradient epilogue of blas_test was off by more than its bound in 1 (f16) and
    // 7 (bf16) elements with the default mask, and within it with this one.
    const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    TG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        raw_pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof(reduction)));
    cublasLtMatmulHeuristicResult_t result = {};
    int count = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle, raw_desc, la.get(), lb.get(), ld.get(), ld.get(), raw_pref, 1, &result, &count);
    // NOT_SUPPORTED is cuBLASLt's "no algorithm for this configuration", like count == 0.
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) TG_CUBLAS_CHECK(status);
    if (status != CUBLAS_STATUS_SUCCESS || count == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
      *why = Describe(ctx, p);
      return false;
    }
    algo = {result.algo, result.workspaceSize};
    AlgoCache().Put(key, algo);
  }
  set_pointers(bias, aux);

  void* workspace = algo.workspace > 0 ? Workspace(kWorkspaceBytes, p.device) : nullptr;
  const size_t workspace_bytes = algo.workspace > 0 ? kWorkspaceBytes : 0;
  // alpha and beta have the scale type: f64 for f64, else f32.
  const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
  const bool f64 = p.scale_type == CUDA_R_64F;
  const void* alpha_ptr = f64 ? static_cast<const void*>(&alpha) : &alpha_f;
  const void* beta_ptr = f64 ? static_cast<const void*>(&beta) : &beta_f;
  TG_CUBLAS_CHECK(cublasLtMatmul(handle, raw_desc, alpha_ptr, a, la.get(), b, lb.get(), beta_ptr, d,
                                 ld.get(), d, ld.get(), &algo.algo, workspace, workspace_bytes,
                                 CurrentStream(p.device)));
  return true;
}

// Batch-dim byte strides of t (its dims before the last `matrix_dims`).
Shape BatchByteStrides(const RawTensor& t, int64_t batch_dims) {
  Shape s(t.strides().begin(), t.strides().begin() + batch_dims);
  for (int64_t& v : s) v *= static_cast<int64_t>(t.element_size());
  return s;
}

// The shared implementation; every argument is validated by the caller. Returns "" when the
// product was enqueued, else why cuBLASLt cannot run it (nothing was enqueued then: every batch
// call shares one problem, so only the first can miss).
std::string TryGemm(const char* op, const RawTensor& out, RawTensor a, bool transpose_a,
                    RawTensor b, bool transpose_b, Epilogue epilogue, const RawTensor& bias,
                    const RawTensor& aux, double alpha, double beta) {
  const int64_t nd = out.dim(), batch_dims = nd - 2;
  const int64_t m = out.size(nd - 2), n = out.size(nd - 1);
  const int64_t k = transpose_a ? a.size(nd - 2) : a.size(nd - 1);
  const int device = out.device().index;
  DeviceGuard guard(device);
  if (out.numel() == 0) {
    // A bias gradient over an empty reduction is zero.
    if (IsBgrad(epilogue) && bias.numel() > 0) bias.zero_();
    return "";
  }
  if (k == 0) {  // no products: out = beta * out with beta 0 or 1 (checked by the callers)
    if (beta == 0) out.zero_();
    return "";
  }
  if (!MatrixLayout(a).ok) a = a.contiguous();
  if (!MatrixLayout(b).ok) b = b.contiguous();
  const StoredLayout sa = MatrixLayout(a), sb = MatrixLayout(b);

  const Shape batch(out.shape().begin(), out.shape().begin() + batch_dims);
  const size_t out_size = out.element_size();
  Shape bias_steps(batch_dims, 0);
  if (IsBgrad(epilogue)) {  // contiguous [batch..., len]
    const Shape s = ContiguousStrides(bias.shape());
    for (int64_t i = 0; i < batch_dims; ++i) bias_steps[i] = s[i] * out_size;
  }
  const std::array<Shape, 5> steps = {
      BatchByteStrides(out, batch_dims), BatchByteStrides(a, batch_dims),
      BatchByteStrides(b, batch_dims),
      aux.defined() ? BatchByteStrides(aux, batch_dims) : Shape(batch_dims, 0), bias_steps};
  void* bias_ptr = bias.defined() ? bias.raw_data() : nullptr;
  void* aux_ptr = aux.defined() ? aux.raw_data() : nullptr;

  LtProblem p;
  p.device = device;
  const DType in = a.dtype();
  if (in == kF64) {
    p.compute = CUBLAS_COMPUTE_64F;
    p.scale_type = CUDA_R_64F;
  } else {
    p.compute = in == kF32 && Tf32Allowed() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    p.scale_type = CUDA_R_32F;
  }
  // cuBLASLt's A is our b and must read op(b)^T; its B is our a and must read op(a)^T.
  p.op_a = (sb.column_major != transpose_b) ? CUBLAS_OP_T : CUBLAS_OP_N;
  p.a = StoredMatrix(CudaType(in), sb, b.size(nd - 2), b.size(nd - 1));
  p.op_b = (sa.column_major != transpose_a) ? CUBLAS_OP_T : CUBLAS_OP_N;
  p.b = StoredMatrix(CudaType(in), sa, a.size(nd - 2), a.size(nd - 1));
  // out is row-major [m, n] with unit column stride: column-major [n, m].
  p.d =
      StoredMatrix(CudaType(out.dtype()), {true, false, m == 1 ? n : out.strides()[nd - 2]}, m, n);
  p.epilogue = LtEpilogue(epilogue, aux.defined());
  p.aux_ld = aux.defined() ? aux.strides()[nd - 2] : 0;
  p.aux_batch_stride = 0;
  p.bias_batch_stride = 0;
  p.align_a = AlignmentOf(b.raw_data(), steps[2]);
  p.align_b = AlignmentOf(a.raw_data(), steps[1]);
  p.align_d = AlignmentOf(out.raw_data(), steps[0]);
  p.align_aux = AlignmentOf(aux_ptr, steps[3]);
  p.align_bias = AlignmentOf(bias_ptr, steps[4]);
  const CallContext ctx = {op, &out, &a, transpose_a, &b, transpose_b, epilogue};

  const size_t in_size = a.element_size();
  std::string failure;
  ForEachRow<5>(
      batch,
      {static_cast<char*>(out.raw_data()), static_cast<char*>(a.raw_data()),
       static_cast<char*>(b.raw_data()), static_cast<char*>(aux_ptr), static_cast<char*>(bias_ptr)},
      steps, [&](std::array<char*, 5> ptr, int64_t count, std::array<int64_t, 5> step) {
        if (!failure.empty()) return;
        TG_CHECK(count <= INT32_MAX, op, ": ", count, " matrices in one batch is too many");
        LtProblem q = p;
        const int32_t batch_count = static_cast<int32_t>(count);
        q.d.batch = q.a.batch = q.b.batch = batch_count;
        if (count > 1) {
          q.d.batch_stride = step[0] / static_cast<int64_t>(out_size);
          q.b.batch_stride = step[1] / static_cast<int64_t>(in_size);
          q.a.batch_stride = step[2] / static_cast<int64_t>(in_size);
          q.aux_batch_stride = step[3] / static_cast<int64_t>(out_size);
          q.bias_batch_stride = step[4] / static_cast<int64_t>(out_size);
        }
        RunLt(q, ctx, ptr[2], ptr[1], ptr[0], bias.defined() ? ptr[4] : nullptr,
              aux.defined() ? ptr[3] : nullptr, alpha, beta, &failure);
      });
  return failure;
}

void Gemm(const char* op, const RawTensor& out, const RawTensor& a, bool transpose_a,
          const RawTensor& b, bool transpose_b, Epilogue epilogue, const RawTensor& bias,
          const RawTensor& aux, double alpha, double beta) {
  const std::string failure =
      TryGemm(op, out, a, transpose_a, b, transpose_b, epilogue, bias, aux, alpha, beta);
  if (!failure.empty()) throw Error(failure);
}

// `matrix` [r, c] broadcast (stride 0) to [batch..., r, c].
RawTensor BroadcastTo(const RawTensor& matrix, const Shape& batch) {
  RawTensor t = matrix;
  Shape shape = batch;
  shape.insert(shape.end(), {matrix.size(0), matrix.size(1)});
  for (size_t i = 0; i < batch.size(); ++i) t = t.unsqueeze(0);
  return t.expand(shape);
}

std::string Shapes(const RawTensor& out, const RawTensor& a, const RawTensor& b) {
  return absl::StrCat("out ", ShapeToString(out.shape()), ", a ", ShapeToString(a.shape()), ", b ",
                      ShapeToString(b.shape()));
}

void CheckOnDevice(const char* op, const RawTensor& t, const char* what, const RawTensor& out) {
  TG_CHECK(t.device() == out.device(), op, ": ", what, " is on ", t.device().ToString(),
           " but out is on ", out.device().ToString());
}

}  // namespace

const char* EpilogueName(Epilogue epilogue) {
  switch (epilogue) {
    case Epilogue::kNone:
      return "none";
    case Epilogue::kBias:
      return "bias";
    case Epilogue::kGelu:
      return "gelu";
    case Epilogue::kBiasGelu:
      return "bias_gelu";
    case Epilogue::kDGelu:
      return "dgelu";
    case Epilogue::kDGeluBgrad:
      return "dgelu_bgrad";
    case Epilogue::kBgrad:
      return "bgrad";
  }
  return "?";
}

AllowTf32Scope::AllowTf32Scope(bool allow) : previous_(tf32_scope) { tf32_scope = allow ? 1 : 0; }
AllowTf32Scope::~AllowTf32Scope() { tf32_scope = previous_; }
bool Tf32Allowed() { return tf32_scope < 0 ? GetKernelOptions().allow_tf32 : tf32_scope == 1; }

void Matmul(const RawTensor& out, const RawTensor& a, const RawTensor& b) {
  const char* op = "matmul";
  TG_CHECK(out.device().is_cuda(), op, ": out is on ", out.device().ToString(),
           ", expected a CUDA device");
  CheckOnDevice(op, a, "a", out);
  CheckOnDevice(op, b, "b", out);
  TG_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype(), op, ": dtypes ",
           DTypeName(a.dtype()), " @ ", DTypeName(b.dtype()), " -> ", DTypeName(out.dtype()),
           " must all be equal");
  TG_CHECK(out.dim() >= 2 && a.dim() == out.dim() && b.dim() == out.dim() &&
               a.size(-1) == b.size(-2) && a.size(-2) == out.size(-2) && b.size(-1) == out.size(-1),
           op, ": ", Shapes(out, a, b), " do not form [batch..., m, k] @ [batch..., k, n]");
  TG_CHECK(out.is_contiguous(), op, ": out ", ShapeToString(out.shape()), " must be contiguous");
  Gemm(op, out, a, false, b, false, Epilogue::kNone, RawTensor(), RawTensor(), 1.0, 0.0);
}

bool TryMatmulEx(const RawTensor& out, const RawTensor& a, bool transpose_a, const RawTensor& b,
                 bool transpose_b, Epilogue epilogue, const RawTensor& bias, const RawTensor& aux,
                 float alpha, float beta, std::string* why) {
  const char* op = "matmul_ex";
  TG_CHECK(out.defined() && a.defined() && b.defined(), op, ": out, a and b must be defined");
  TG_CHECK(out.device().is_cuda(), op, ": out is on ", out.device().ToString(),
           ", expected a CUDA device");
  CheckOnDevice(op, a, "a", out);
  CheckOnDevice(op, b, "b", out);
  // Shapes.
  const int64_t nd = out.dim();
  TG_CHECK(nd >= 2 && a.dim() == nd && b.dim() == nd, op, ": ", Shapes(out, a, b),
           " must all have the same rank (>= 2)");
  const int64_t m = out.size(-2), n = out.size(-1);
  const int64_t am = transpose_a ? a.size(-1) : a.size(-2);
  const int64_t k = transpose_a ? a.size(-2) : a.size(-1);
  const int64_t bk = transpose_b ? b.size(-1) : b.size(-2);
  const int64_t bn = transpose_b ? b.size(-2) : b.size(-1);
  TG_CHECK(am == m && bk == k && bn == n, op, ": ", Shapes(out, a, b),
           transpose_a ? " (a transposed)" : "", transpose_b ? " (b transposed)" : "",
           " do not form out [m, n] = op(a) [m, k] @ op(b) [k, n]");
  for (int64_t i = 0; i < nd - 2; ++i) {
    TG_CHECK(a.size(i) == out.size(i) && b.size(i) == out.size(i), op, ": ", Shapes(out, a, b),
             ": the batch dims of a and b must equal out's (expand() to broadcast)");
    TG_CHECK(out.size(i) == 1 || out.strides()[i] != 0, op, ": out ", ShapeToString(out.shape()),
             " is broadcast along batch dim ", i);
  }
  TG_CHECK((n == 1 || out.strides()[nd - 1] == 1) && (m == 1 || out.strides()[nd - 2] >= n), op,
           ": out ", ShapeToString(out.shape()), " with strides ", ShapeToString(out.strides()),
           " must have unit stride along n and a row stride >= n");
  // Dtypes.
  const DType in = a.dtype();
  TG_CHECK(b.dtype() == in, op, ": a is ", DTypeName(in), " but b is ", DTypeName(b.dtype()));
  TG_CHECK(in == kF32 || in == kF64 || in == kF16 || in == kBF16, op,
           ": expected f32, f64, f16 or bf16 inputs, got ", DTypeName(in));
  TG_CHECK(out.dtype() == in || (out.dtype() == kF32 && (in == kF16 || in == kBF16)), op,
           ": out is ", DTypeName(out.dtype()), " for ", DTypeName(in),
           " inputs (expected the inputs' dtype, or f32 for f16/bf16 inputs)");
  // Epilogue operands.
  const std::string ep = absl::StrCat(" (epilogue ", EpilogueName(epilogue), ")");
  const Shape batch(out.shape().begin(), out.shape().end() - 2);
  if (ReadsBias(epilogue) || IsBgrad(epilogue)) {
    TG_CHECK(bias.defined(), op, ": bias is required", ep);
    CheckOnDevice(op, bias, "bias", out);
    Shape expected = ReadsBias(epilogue) ? Shape{n} : batch;
    if (epilogue == Epilogue::kBgrad) expected.push_back(m);
    if (epilogue == Epilogue::kDGeluBgrad) expected.push_back(n);
    TG_CHECK(bias.shape() == expected, op, ": bias ", ShapeToString(bias.shape()),
             " does not match ", ShapeToString(expected), " for out ", ShapeToString(out.shape()),
             ep);
    TG_CHECK(bias.dtype() == out.dtype(), op, ": bias is ", DTypeName(bias.dtype()), " but out is ",
             DTypeName(out.dtype()), ep);
    TG_CHECK(bias.is_contiguous(), op, ": bias ", ShapeToString(bias.shape()),
             " must be contiguous", ep);
  } else {
    TG_CHECK(!bias.defined(), op, ": no bias is used", ep, ", got ", ShapeToString(bias.shape()));
  }
  if (TakesAux(epilogue)) {
    TG_CHECK(aux.defined() || !NeedsAux(epilogue), op,
             ": aux (the GELU input saved by the forward) is required", ep);
  } else {
    TG_CHECK(!aux.defined(), op, ": no aux is used", ep, ", got ", ShapeToString(aux.shape()));
  }
  if (aux.defined()) {
    CheckOnDevice(op, aux, "aux", out);
    TG_CHECK(aux.shape() == out.shape() && aux.dtype() == out.dtype(), op, ": aux ",
             ShapeToString(aux.shape()), " ", DTypeName(aux.dtype()), " must match out ",
             ShapeToString(out.shape()), " ", DTypeName(out.dtype()), ep);
    bool ok = (n == 1 || aux.strides()[nd - 1] == 1) && aux.strides()[nd - 2] >= n &&
              aux.strides()[nd - 2] % 8 == 0;
    for (int64_t i = 0; i < nd - 2; ++i) ok &= aux.size(i) == 1 || aux.strides()[i] % 8 == 0;
    TG_CHECK(ok, op, ": aux ", ShapeToString(aux.shape()), " with strides ",
             ShapeToString(aux.strides()),
             " needs unit stride along n and row and batch strides that are multiples of 8 "
             "(cuBLASLt's rule for the GELU input; pad the row stride and pass a narrow() view)",
             ep);
    // The forward GELU epilogues write aux: every batch entry needs its own (the backward ones
    // only read it, so a broadcast aux is fine there).
    for (int64_t i = 0; i < nd - 2 && !NeedsAux(epilogue); ++i) {
      TG_CHECK(aux.size(i) == 1 || aux.strides()[i] != 0, op, ": aux ", ShapeToString(aux.shape()),
               " is broadcast along batch dim ", i, ", but the epilogue writes it", ep);
    }
  }
  if (k == 0) {
    TG_CHECK(epilogue == Epilogue::kNone && (beta == 0 || beta == 1), op, ": ", Shapes(out, a, b),
             " is an empty product (k == 0), supported only with epilogue "
             "none and beta 0 or 1",
             ep);
  }
  // An empty out (n == 0) still has a bias gradient under kBgrad: the sums of op(a) over k, not
  // zeros (TryGemm only zeroes the bias of an empty out), so that goes to the unfused form.
  const bool empty_out_bgrad = epilogue == Epilogue::kBgrad && n == 0 && m > 0 && k > 0;
  const std::string failure =
      empty_out_bgrad
          ? std::string("empty out")
          : TryGemm(op, out, a, transpose_a, b, transpose_b, epilogue, bias, aux, alpha, beta);
  if (failure.empty()) return true;
  // No fused kernel for this epilogue here (cuBLASLt's epilogue kernels have layout, type and
  // alignment limits). The bias epilogues have exact unfused forms as products with a vector of
  // ones, so they fall back to those; the GELU epilogues need elementwise kernels and throw.
  // The products with ones run in full f32 even where TF32 is allowed: they are sums and
  // broadcasts, which TF32 would round to 11 bits (the fused epilogues work in f32).
  const int device = out.device().index;
  auto with_matrix = [&](int64_t r, int64_t c) {
    Shape s = batch;
    s.insert(s.end(), {r, c});
    return s;
  };
  switch (epilogue) {
    case Epilogue::kBias: {  // out = P, then out += ones [m, 1] @ bias [1, n]
      Gemm(op, out, a, transpose_a, b, transpose_b, Epilogue::kNone, RawTensor(), RawTensor(),
           alpha, beta);
      AllowTf32Scope exact(false);
      Gemm(op, out, BroadcastTo(OnesVector(m, out.dtype(), device).view({m, 1}), batch), false,
           BroadcastTo(bias.view({1, n}), batch), false, Epilogue::kNone, RawTensor(), RawTensor(),
           1.0, 1.0);
      return true;
    }
    case Epilogue::kBgrad: {  // out = P, and bias [.., m, 1] = op(a) [m, k] @ ones [k, 1]
      Gemm(op, out, a, transpose_a, b, transpose_b, Epilogue::kNone, RawTensor(), RawTensor(),
           alpha, beta);
      AllowTf32Scope exact(false);
      Gemm(op, bias.view(with_matrix(m, 1)), a, transpose_a,
           BroadcastTo(OnesVector(k, in, device).view({k, 1}), batch), false, Epilogue::kNone,
           RawTensor(), RawTensor(), 1.0, 0.0);
      return true;
    }
    case Epilogue::kDGeluBgrad: {  // out = dgelu(P), and bias [.., 1, n] = ones [1, m] @ out
      Gemm(op, out, a, transpose_a, b, transpose_b, Epilogue::kDGelu, RawTensor(), aux, alpha,
           beta);
      AllowTf32Scope exact(false);
      Gemm(op, bias.view(with_matrix(1, n)),
           BroadcastTo(OnesVector(m, out.dtype(), device).view({1, m}), batch), false, out, false,
           Epilogue::kNone, RawTensor(), RawTensor(), 1.0, 0.0);
      return true;
    }
    default:
      if (why != nullptr) *why = failure;
      return false;
  }
}

void MatmulEx(const RawTensor& out, const RawTensor& a, bool transpose_a, const RawTensor& b,
              bool transpose_b, Epilogue epilogue, const RawTensor& bias, const RawTensor& aux,
              float alpha, float beta) {
  std::string why;
  if (!TryMatmulEx(out, a, transpose_a, b, transpose_b, epilogue, bias, aux, alpha, beta, &why)) {
    throw Error(why);
  }
}

RawTensor OnesVector(int64_t n, DType dtype, int device) {
  static std::mutex* mu = new std::mutex;
  static auto* cache = new std::map<std::pair<int, DType>, RawTensor>;
  static auto* retired = new std::vector<RawTensor>;
  std::lock_guard<std::mutex> lock(*mu);
  RawTensor& ones = (*cache)[{device, dtype}];
  if (!ones.defined() || ones.numel() < n) {
    // Work already enqueued may still read the old vector: keep it (sizes double, so the
    // retired vectors cost at most as much as the current one).
    if (ones.defined()) retired->push_back(ones);
    const int64_t size = std::max<int64_t>(n, ones.defined() ? 2 * ones.numel() : int64_t{1} << 16);
    DeviceGuard guard(device);
    ones = RawTensor::Full({size}, 1.0, dtype, Device::Cuda(device));
    // The fill is enqueued on this thread's current stream, but the vector is handed to work on
    // any stream (and thread): wait for it once here, so no reader needs an event.
    SynchronizeStream(CurrentStream(device));
  }
  return ones.narrow(0, 0, n);
}

}  // namespace tg::cuda
