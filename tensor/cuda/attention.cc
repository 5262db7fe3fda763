// Scaled dot-product attention on CUDA (tensor/cuda/attention.h): the fused cuDNN kernels
// (backend graph API). Where they decline, the op runs the one composed form of every device
// (tensor/composed.h).
//
// The cuDNN graphs. cuDNN 9 runs attention as one fused "flash" kernel when the operation graph
// has the shape its attention engines recognise; the graph is the specification, the engine
// the implementation. cudnn_graph.h also declares single-operation SDPA descriptors
// (CUDNN_BACKEND_OPERATION_SDPA_FWD/BWD_DESCRIPTOR, new in late 9.x releases), but they have no
// causal attribute (only a block mask) and older 9.x libraries lack them, so we build the
// pattern graph, which is what cudnn-frontend builds for its sdpa() node on cuDNN 9:
//
//   forward:  S = Q @ K^T              (matmul; K enters transposed: dims [B, H, D, Tk])
//             S = S * scale            (pointwise MUL with a by-value scalar)
//             S = select(S, -inf, row >= col)   (causal: GEN_INDEX on axes 2 and 3, CMP_GE,
//                                                BINARY_SELECT; the masked value is MaskValue())
//             M = max_k S; E = exp(S - M); Z = sum_k E          (reductions over the last dim)
//             stats = M + log(Z)       (the only row output, f32 [B, H, Tq, 1])
//             O = (E / Z) @ V          (E / Z in the input type: the engines want bmm2's A so)
//   backward: Delta = (sum_d dO * O) * 1   (a non-virtual f32 [B, H, Tq, 1] row vector in
//                                           workspace; the * 1 is the frontend's dropout slot)
//             P = exp(mask(scale * Q @ K^T - stats))
//             dV = P^T @ dO            (P^T: a RESHAPE with swapped dims and strides, in the
//                                       input type; P itself stays f32)
//             dS = P * (dO @ V^T - Delta) * scale      (f32)
//             dK = dS^T @ Q;  dQ = dS @ K   (dS^T in the input type; K from K^T by a RESHAPE;
//                                            dQ accumulated in an f32 workspace tensor, then
//                                            converted by an IDENTITY)
//
// What is not certain without running it (checked by tests/tensor/cuda/cudnn_test.cc): whether
// the installed cuDNN accepts exactly these intermediate types and this order of the backward's
// mask and stats subtraction (cudnn-frontend moved the mask after the subtraction in later
// releases). BuildPlan therefore tries a short list of graph "flavours" in order, the frontend's
// first, and keeps the first one cuDNN accepts (per problem, once). A graph no flavour of which
// cuDNN accepts, or whose descriptors it rejects, fails with "cuDNN has no fused attention
// engine", which tensor/ops_attention.cc answers with the composed implementation.
// Plans are cached per thread (a cuDNN handle belongs to one thread), keyed by every shape,
// stride, dtype, the causal flag and the device.
#include "tensor/cuda/attention.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensor/cuda/blas.h"
#include "tensor/cuda/cudnn_plan.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"

namespace tg::cuda {
namespace {

struct Sizes {
  int64_t b, h, tq, tk, d;
};

void CheckTensor(const char* op, const RawTensor& t, const char* what, const Shape& shape,
                 DType dtype, Device device) {
  TG_CHECK(t.defined(), op, ": ", what, " is undefined");
  TG_CHECK(t.device() == device, op, ": ", what, " is on ", t.device().ToString(), ", expected ",
           device.ToString());
  TG_CHECK(t.shape() == shape, op, ": ", what, " has shape ", ShapeToString(t.shape()),
           ", expected ", ShapeToString(shape));
  TG_CHECK(t.dtype() == dtype, op, ": ", what, " is ", DTypeName(t.dtype()), ", expected ",
           DTypeName(dtype));
}

// Validates the forward's tensors (shared by the backward) and returns the sizes.
Sizes Validate(const char* op, const RawTensor& out, const RawTensor& stats, const RawTensor& q,
               const RawTensor& k, const RawTensor& v, bool causal, double scale) {
  TG_CHECK(q.defined() && k.defined() && v.defined(), op, ": q, k and v must be defined");
  TG_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, ": expected q, k, v as [B, H, T, D],",
           " got ", ShapeToString(q.shape()), ", ", ShapeToString(k.shape()), ", ",
           ShapeToString(v.shape()));
  const Sizes s = {q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
  TG_CHECK(q.device().is_cuda(), op, ": q is on ", q.device().ToString(),
           ", expected a CUDA device");
  const DType dtype = q.dtype();
  TG_CHECK(dtype == kF16 || dtype == kBF16 || dtype == kF32, op,
           ": expected f16, bf16 or f32 heads, got ", DTypeName(dtype));
  CheckTensor(op, k, "k", {s.b, s.h, s.tk, s.d}, dtype, q.device());
  CheckTensor(op, v, "v", {s.b, s.h, s.tk, s.d}, dtype, q.device());
  CheckTensor(op, out, "out", {s.b, s.h, s.tq, s.d}, dtype, q.device());
  CheckTensor(op, stats, "softmax_stats", {s.b, s.h, s.tq, 1}, kF32, q.device());
  TG_CHECK(stats.is_contiguous(), op, ": softmax_stats must be contiguous");
  TG_CHECK(!causal || s.tq == s.tk, op, ": causal attention needs as many queries as keys, got ",
           s.tq, " and ", s.tk);
  TG_CHECK(s.tk > 0 || s.tq == 0 || s.b * s.h == 0, op, ": ", s.tq,
           " queries attend to no keys (k is ", ShapeToString(k.shape()), ")");
  TG_CHECK(std::isfinite(scale), op, ": scale ", scale, " is not finite");
  return s;
}

// ---------------------------------------------------------------------------------------------
// The cuDNN implementation.

cudnnDataType_t IoType(DType dtype) {
  return dtype == kF16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
}

std::vector<int64_t> Strides(const RawTensor& t) {
  return std::vector<int64_t>(t.strides().begin(), t.strides().end());
}

// The same memory read as [B, H, D, T]: the last two dims and strides swapped.
std::vector<int64_t> SwapLast(std::vector<int64_t> v) {
  std::swap(v[2], v[3]);
  return v;
}

// Builds one SDPA operation graph: tensors, operations and the helper descriptors they use.
class SdpaGraph {
 public:
  const dnn::Descriptor& Input(int64_t uid, cudnnDataType_t type, std::vector<int64_t> dims,
                               std::vector<int64_t> strides, bool by_value = false) {
    return graph.RawTensor({uid, type, std::move(dims), std::move(strides), false, by_value, 16});
  }
  const dnn::Descriptor& Virtual(cudnnDataType_t type, std::vector<int64_t> dims,
                                 std::vector<int64_t> strides) {
    return graph.RawTensor(
        {next_uid_++, type, std::move(dims), std::move(strides), true, false, 16});
  }
  // y = mode(x[, b[, t]]), computed in `compute`; axis for GEN_INDEX.
  void Pointwise(cudnnPointwiseMode_t mode, const dnn::Descriptor& x, const dnn::Descriptor* b,
                 const dnn::Descriptor* t, const dnn::Descriptor& y,
                 cudnnDataType_t compute = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    dnn::Descriptor pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.Set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
        .SetDataType(CUDNN_ATTR_POINTWISE_MATH_PREC, compute);
    if (axis >= 0) pw.SetInt64(CUDNN_ATTR_POINTWISE_AXIS, axis);
    pw.Finalize("pointwise descriptor");
    const dnn::Descriptor& pwd = graph.Keep(std::move(pw));
    dnn::Descriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.SetDesc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pwd)
        .SetDesc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b != nullptr) op.SetDesc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    if (t != nullptr) op.SetDesc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    op.SetDesc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    op.Finalize("pointwise operation");
    graph.AddOp(std::move(op));
  }
  // c = a @ b over the last two dims, f32 accumulation.
  void Matmul(const dnn::Descriptor& a, const dnn::Descriptor& b, const dnn::Descriptor& c) {
    dnn::Descriptor mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    mm.SetDataType(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT);
    mm.Finalize("matmul descriptor");
    const dnn::Descriptor& mmd = graph.Keep(std::move(mm));
    dnn::Descriptor op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.SetDesc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
        .SetDesc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
        .SetDesc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
        .SetDesc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mmd);
    op.Finalize("matmul operation");
    graph.AddOp(std::move(op));
  }
  // y = reduce(x) over the dims where y has size 1, in f32.
  void Reduce(cudnnReduceTensorOp_t mode, const dnn::Descriptor& x, const dnn::Descriptor& y) {
    dnn::Descriptor red(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    red.Set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode)
        .SetDataType(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT);
    red.Finalize("reduction descriptor");
    const dnn::Descriptor& redd = graph.Keep(std::move(red));
    dnn::Descriptor op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.SetDesc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
        .SetDesc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
        .SetDesc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, redd);
    op.Finalize("reduction operation");
    graph.AddOp(std::move(op));
  }
  // y = x viewed with y's dims and strides (used as a transpose).
  void Reshape(const dnn::Descriptor& x, const dnn::Descriptor& y) {
    dnn::Descriptor op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.SetDesc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x)
        .SetDesc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    op.Finalize("reshape operation");
    graph.AddOp(std::move(op));
  }

  dnn::Graph graph;

 private:
  int64_t next_uid_ = 1000;  // virtual tensors; inputs and outputs use small uids
};

// Unique ids of the non-virtual tensors.
enum Uid : int64_t {
  kQ = 1,
  kK,  // bound to k's memory, described as K^T
  kV,  // forward: V; backward: described as V^T
  kO,
  kDO,
  kStats,
  kScale,
  kNegInf,
  kDQ,
  kDK,
  kDV,
  kDelta,
  kDQAccum,
  kOne,  // backward: the by-value 1 that scales Delta
};

// Graph choices tried in order until cuDNN accepts one (see the file comment).
struct Flavour {
  // Forward: the probabilities that feed bmm2 in the input dtype (else f32). Backward: P and dS
  // themselves in the input dtype (else f32).
  bool io_probabilities;
  // Backward: the transposed P^T and dS^T (the reshape outputs that feed dV and dK) in the input
  // dtype while P and dS stay f32, as cudnn-frontend builds them.
  bool io_transposes;
  // Backward: dQ accumulated in an f32 workspace tensor, then converted.
  bool dq_accumulator;
  // Backward: the causal mask applied to S - stats (later cudnn-frontend) rather than to S.
  bool mask_after_stats;
};
constexpr Flavour kForwardFlavours[] = {{true, false, false, false}, {false, false, false, false}};
constexpr Flavour kBackwardFlavours[] = {{false, true, true, true},   {false, true, true, false},
                                         {false, true, false, true},  {false, false, false, false},
                                         {true, false, false, false}, {false, false, true, false},
                                         {true, false, true, false}};

struct Problem {
  Sizes z;
  cudnnDataType_t io;
  bool causal;
  std::vector<int64_t> q, k, v, o, d_o, dq, dk, dv;  // strides (the backward's last four)
};

Problem MakeProblem(const Sizes& z, const RawTensor& q, const RawTensor& k, const RawTensor& v,
                    const RawTensor& out, bool causal) {
  Problem p;
  p.z = z;
  p.io = IoType(q.dtype());
  p.causal = causal;
  p.q = Strides(q);
  p.k = Strides(k);
  p.v = Strides(v);
  p.o = Strides(out);
  return p;
}

// The value masked scores take: cudnn-frontend passes the lowest finite float to cuDNN before
// 9.10 and -inf from 9.10 on. Either gives probability 0 (the diagonal is never masked, so no
// row maximum is masked and no inf - inf appears).
float MaskValue() {
  return cudnnGetVersion() < 91000 ? std::numeric_limits<float>::lowest()
                                   : -std::numeric_limits<float>::infinity();
}

// x [B, H, Tq, Tk] with the entries above the diagonal (key > query) replaced by MaskValue().
const dnn::Descriptor& CausalMasked(SdpaGraph& g, const Problem& p, const dnn::Descriptor& x) {
  const Sizes& z = p.z;
  const std::vector<int64_t> dims = {z.b, z.h, z.tq, z.tk},
                             strides = {z.h * z.tq * z.tk, z.tq * z.tk, z.tk, 1};
  const dnn::Descriptor& row = g.Virtual(CUDNN_DATA_INT32, dims, strides);
  g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, row, CUDNN_DATA_INT32, 2);
  const dnn::Descriptor& col = g.Virtual(CUDNN_DATA_INT32, dims, strides);
  g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, col, CUDNN_DATA_INT32, 3);
  const dnn::Descriptor& keep = g.Virtual(CUDNN_DATA_BOOLEAN, dims, strides);
  g.Pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, nullptr, keep, CUDNN_DATA_BOOLEAN);
  const dnn::Descriptor& neg =
      g.Input(kNegInf, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, /*by_value=*/true);
  const dnn::Descriptor& y = g.Virtual(CUDNN_DATA_FLOAT, dims, strides);
  g.Pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, &neg, &keep, y);
  return y;
}

// scale * Q @ K^T, causally masked when `mask`: the scores both directions start from.
const dnn::Descriptor& Scores(SdpaGraph& g, const Problem& p, const dnn::Descriptor& q,
                              const dnn::Descriptor& kt, const dnn::Descriptor& scale, bool mask) {
  const Sizes& z = p.z;
  const std::vector<int64_t> dims = {z.b, z.h, z.tq, z.tk},
                             strides = {z.h * z.tq * z.tk, z.tq * z.tk, z.tk, 1};
  const dnn::Descriptor& s1 = g.Virtual(CUDNN_DATA_FLOAT, dims, strides);
  g.Matmul(q, kt, s1);
  const dnn::Descriptor& s2 = g.Virtual(CUDNN_DATA_FLOAT, dims, strides);
  g.Pointwise(CUDNN_POINTWISE_MUL, s1, &scale, nullptr, s2);
  return mask && p.causal ? CausalMasked(g, p, s2) : s2;
}

SdpaGraph ForwardGraph(const Problem& p, const Flavour& f) {
  const Sizes& z = p.z;
  SdpaGraph g;
  const std::vector<int64_t> sdims = {z.b, z.h, z.tq, z.tk},
                             sstr = {z.h * z.tq * z.tk, z.tq * z.tk, z.tk, 1};
  const std::vector<int64_t> rdims = {z.b, z.h, z.tq, 1}, rstr = {z.h * z.tq, z.tq, 1, 1};
  const dnn::Descriptor& q = g.Input(kQ, p.io, {z.b, z.h, z.tq, z.d}, p.q);
  const dnn::Descriptor& kt = g.Input(kK, p.io, {z.b, z.h, z.d, z.tk}, SwapLast(p.k));
  const dnn::Descriptor& v = g.Input(kV, p.io, {z.b, z.h, z.tk, z.d}, p.v);
  const dnn::Descriptor& o = g.Input(kO, p.io, {z.b, z.h, z.tq, z.d}, p.o);
  const dnn::Descriptor& stats = g.Input(kStats, CUDNN_DATA_FLOAT, rdims, rstr);
  const dnn::Descriptor& scale =
      g.Input(kScale, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, /*by_value=*/true);
  const dnn::Descriptor& s = Scores(g, p, q, kt, scale, /*mask=*/true);
  // Softmax with statistics.
  const dnn::Descriptor& mx = g.Virtual(CUDNN_DATA_FLOAT, rdims, rstr);
  g.Reduce(CUDNN_REDUCE_TENSOR_MAX, s, mx);
  const dnn::Descriptor& centred = g.Virtual(CUDNN_DATA_FLOAT, sdims, sstr);
  g.Pointwise(CUDNN_POINTWISE_SUB, s, &mx, nullptr, centred);
  const dnn::Descriptor& e = g.Virtual(CUDNN_DATA_FLOAT, sdims, sstr);
  g.Pointwise(CUDNN_POINTWISE_EXP, centred, nullptr, nullptr, e);
  const dnn::Descriptor& sum = g.Virtual(CUDNN_DATA_FLOAT, rdims, rstr);
  g.Reduce(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  const dnn::Descriptor& log_sum = g.Virtual(CUDNN_DATA_FLOAT, rdims, rstr);
  g.Pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, nullptr, log_sum);
  g.Pointwise(CUDNN_POINTWISE_ADD, mx, &log_sum, nullptr, stats);
  const dnn::Descriptor& prob =
      g.Virtual(f.io_probabilities ? p.io : CUDNN_DATA_FLOAT, sdims, sstr);
  g.Pointwise(CUDNN_POINTWISE_DIV, e, &sum, nullptr, prob);
  g.Matmul(prob, v, o);
  return g;
}

SdpaGraph BackwardGraph(const Problem& p, const Flavour& f) {
  const Sizes& z = p.z;
  SdpaGraph g;
  const std::vector<int64_t> sdims = {z.b, z.h, z.tq, z.tk},
                             sstr = {z.h * z.tq * z.tk, z.tq * z.tk, z.tk, 1};
  // The same memory as [B, H, Tk, Tq]: a transposed view of a scores tensor.
  const std::vector<int64_t> tdims = {z.b, z.h, z.tk, z.tq},
                             tstr = {z.h * z.tq * z.tk, z.tq * z.tk, 1, z.tk};
  const std::vector<int64_t> rdims = {z.b, z.h, z.tq, 1}, rstr = {z.h * z.tq, z.tq, 1, 1};
  const std::vector<int64_t> qdims = {z.b, z.h, z.tq, z.d}, kdims = {z.b, z.h, z.tk, z.d};
  const cudnnDataType_t prob_type = f.io_probabilities ? p.io : CUDNN_DATA_FLOAT;
  const cudnnDataType_t trans_type = f.io_transposes ? p.io : prob_type;

  const dnn::Descriptor& q = g.Input(kQ, p.io, qdims, p.q);
  const dnn::Descriptor& kt = g.Input(kK, p.io, {z.b, z.h, z.d, z.tk}, SwapLast(p.k));
  const dnn::Descriptor& vt = g.Input(kV, p.io, {z.b, z.h, z.d, z.tk}, SwapLast(p.v));
  const dnn::Descriptor& o = g.Input(kO, p.io, qdims, p.o);
  const dnn::Descriptor& d_o = g.Input(kDO, p.io, qdims, p.d_o);
  const dnn::Descriptor& stats = g.Input(kStats, CUDNN_DATA_FLOAT, rdims, rstr);
  const dnn::Descriptor& scale =
      g.Input(kScale, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, /*by_value=*/true);
  const dnn::Descriptor& dq = g.Input(kDQ, p.io, qdims, p.dq);
  const dnn::Descriptor& dk = g.Input(kDK, p.io, kdims, p.dk);
  const dnn::Descriptor& dv = g.Input(kDV, p.io, kdims, p.dv);
  const dnn::Descriptor& delta = g.Input(kDelta, CUDNN_DATA_FLOAT, rdims, rstr);
  const dnn::Descriptor& one =
      g.Input(kOne, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, /*by_value=*/true);

  // Delta = (sum_d dO * O) * 1
  const dnn::Descriptor& do_o =
      g.Virtual(CUDNN_DATA_FLOAT, qdims, {z.h * z.tq * z.d, z.tq * z.d, z.d, 1});
  g.Pointwise(CUDNN_POINTWISE_MUL, d_o, &o, nullptr, do_o);
  const dnn::Descriptor& do_o_sum = g.Virtual(CUDNN_DATA_FLOAT, rdims, rstr);
  g.Reduce(CUDNN_REDUCE_TENSOR_ADD, do_o, do_o_sum);
  g.Pointwise(CUDNN_POINTWISE_MUL, do_o_sum, &one, nullptr, delta);
  // P = exp(mask(S) - stats), or exp(mask(S - stats))
  const dnn::Descriptor& s = Scores(g, p, q, kt, scale, /*mask=*/!f.mask_after_stats);
  const dnn::Descriptor& centred = g.Virtual(CUDNN_DATA_FLOAT, sdims, sstr);
  g.Pointwise(CUDNN_POINTWISE_SUB, s, &stats, nullptr, centred);
  const dnn::Descriptor& exponent =
      f.mask_after_stats && p.causal ? CausalMasked(g, p, centred) : centred;
  const dnn::Descriptor& prob = g.Virtual(prob_type, sdims, sstr);
  g.Pointwise(CUDNN_POINTWISE_EXP, exponent, nullptr, nullptr, prob);
  // dV = P^T @ dO
  const dnn::Descriptor& prob_t = g.Virtual(trans_type, tdims, tstr);
  g.Reshape(prob, prob_t);
  g.Matmul(prob_t, d_o, dv);
  // dS = P * (dO @ V^T - Delta) * scale
  const dnn::Descriptor& dp = g.Virtual(CUDNN_DATA_FLOAT, sdims, sstr);
  g.Matmul(d_o, vt, dp);
  const dnn::Descriptor& dp_centred = g.Virtual(CUDNN_DATA_FLOAT, sdims, sstr);
  g.Pointwise(CUDNN_POINTWISE_SUB, dp, &delta, nullptr, dp_centred);
  const dnn::Descriptor& ds_unscaled = g.Virtual(CUDNN_DATA_FLOAT, sdims, sstr);
  g.Pointwise(CUDNN_POINTWISE_MUL, dp_centred, &prob, nullptr, ds_unscaled);
  const dnn::Descriptor& ds = g.Virtual(prob_type, sdims, sstr);
  g.Pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, &scale, nullptr, ds);
  // dK = dS^T @ Q
  const dnn::Descriptor& ds_t = g.Virtual(trans_type, tdims, tstr);
  g.Reshape(ds, ds_t);
  g.Matmul(ds_t, q, dk);
  // dQ = dS @ K, with K read through the K^T input
  const dnn::Descriptor& k = g.Virtual(p.io, kdims, p.k);
  g.Reshape(kt, k);
  if (f.dq_accumulator) {
    const dnn::Descriptor& acc =
        g.Input(kDQAccum, CUDNN_DATA_FLOAT, qdims, {z.h * z.tq * z.d, z.tq * z.d, z.d, 1});
    g.Matmul(ds, k, acc);
    g.Pointwise(CUDNN_POINTWISE_IDENTITY, acc, nullptr, nullptr, dq);
  } else {
    g.Matmul(ds, k, dq);
  }
  return g;
}

// A cached plan, or the reason none exists (so that a failing problem fails fast next time).
struct CachedPlan {
  std::shared_ptr<const dnn::Plan> plan;
  Flavour flavour;
  std::string failure;
};

std::vector<int64_t> Key(bool backward, int device, const Problem& p) {
  std::vector<int64_t> key = {backward, device, p.io,   p.causal, p.z.b,
                              p.z.h,    p.z.tq, p.z.tk, p.z.d};
  for (const auto* s : {&p.q, &p.k, &p.v, &p.o, &p.d_o, &p.dq, &p.dk, &p.dv}) {
    key.push_back(static_cast<int64_t>(s->size()));
    key.insert(key.end(), s->begin(), s->end());
  }
  return key;
}

// Why cuDNN's fused kernel must not be used for this problem, or "" when it may: releases whose
// fused attention cudnn-frontend refuses for known wrong results. cuDNN 9.10.0 and 9.10.1 have
// forward bugs; before 9.15.1 the backward can produce NaN or wrong gradients when the key length
// is not a multiple of 128 and the graph has no padding mask (cudnn-frontend issue #160; the
// frontend adds a padding mask with the full lengths for those versions). The composed
// implementation takes these instead.
std::string Declined(bool backward, const Problem& p) {
  const size_t version = cudnnGetVersion();
  if (!backward && (version == 91000 || version == 91001)) {
    return absl::StrCat("cuDNN ", version, " has known fused attention forward bugs");
  }
  if (backward && version < 91501 && p.z.tk % 128 != 0) {
    return absl::StrCat("cuDNN ", version, " < 9.15.1 miscomputes the backward for Tk = ", p.z.tk,
                        ", not a multiple of 128");
  }
  return "";
}

const CachedPlan& SdpaPlan(const char* op, bool backward, int device, const Problem& p) {
  // Per thread: plans are built on this thread's cuDNN handle.
  thread_local std::map<std::vector<int64_t>, CachedPlan> cache;
  const std::vector<int64_t> key = Key(backward, device, p);
  auto it = cache.find(key);
  if (it == cache.end()) {
    CachedPlan entry;
    std::string failures = Declined(backward, p);
    const Flavour* flavours = backward ? kBackwardFlavours : kForwardFlavours;
    const size_t count =
        failures.empty() ? (backward ? std::size(kBackwardFlavours) : std::size(kForwardFlavours))
                         : 0;
    for (size_t i = 0; i < count && entry.plan == nullptr; ++i) {
      std::string why;
      // A descriptor cuDNN rejects while the graph is built (an attribute or type this version
      // does not take) rules out this flavour like an engine that does not apply: both end in
      // the composed fallback, not in an error of the op.
      try {
        SdpaGraph g = backward ? BackwardGraph(p, flavours[i]) : ForwardGraph(p, flavours[i]);
        dnn::PlanOptions options;
        // Fused attention engines may carry these notes; the graph fixes the precision anyway.
        options.exclude_down_convert = false;
        options.exclude_reduced_precision = false;
        entry.plan = dnn::BuildPlan(CudnnHandle(device), std::move(g.graph), options, &why);
      } catch (const Error& e) {
        entry.plan = nullptr;
        why = e.what();
      }
      entry.flavour = flavours[i];
      if (entry.plan == nullptr) {
        absl::StrAppend(&failures, failures.empty() ? "" : "; ", "graph ", i, ": ", why);
      }
    }
    if (entry.plan == nullptr) {
      entry.failure =
          absl::StrCat(op, ": cuDNN has no fused attention engine for B=", p.z.b, " H=", p.z.h,
                       " Tq=", p.z.tq, " Tk=", p.z.tk, " D=", p.z.d, p.causal ? " causal" : "",
                       " (the op then runs tensor/composed.h): ", failures);
    }
    it = cache.emplace(key, std::move(entry)).first;
  }
  return it->second;  // plan == nullptr: no engine, failure says why
}

size_t RoundUp(size_t n) { return (n + 255) / 256 * 256; }

void CheckCudnn(const char* op, std::initializer_list<const RawTensor*> tensors) {
  std::string why;
  TG_CHECK(CudnnAttentionSupported(tensors, &why), op,
           ": cuDNN's fused attention does not support these tensors: ", why);
}

// Returns false (nothing enqueued, *why set) when cuDNN has no engine for the problem.
bool CudnnForward(const RawTensor& out, const RawTensor& stats, const RawTensor& q,
                  const RawTensor& k, const RawTensor& v, bool causal, double scale, const Sizes& z,
                  std::string* why) {
  const char* op = "attention_forward";
  CheckCudnn(op, {&out, &q, &k, &v});
  const int device = q.device().index;
  const Problem p = MakeProblem(z, q, k, v, out, causal);
  const CachedPlan& plan = SdpaPlan(op, false, device, p);
  if (plan.plan == nullptr) {
    if (why != nullptr) *why = plan.failure;
    return false;
  }
  // By-value scalars: host pointers that cudnnBackendExecute reads before it returns.
  float scale_f = static_cast<float>(scale);
  float masked = MaskValue();
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> ptrs = {q.raw_data(),   k.raw_data(),     v.raw_data(),
                             out.raw_data(), stats.raw_data(), &scale_f};
  if (causal) {
    uids.push_back(kNegInf);
    ptrs.push_back(&masked);
  }
  const int64_t ws = plan.plan->workspace_bytes();
  void* workspace = ws > 0 ? Workspace(static_cast<size_t>(ws), device) : nullptr;
  plan.plan->Execute(CudnnHandle(device), uids, ptrs, workspace);
  return true;
}

bool CudnnBackward(const RawTensor& dq, const RawTensor& dk, const RawTensor& dv,
                   const RawTensor& dout, const RawTensor& q, const RawTensor& k,
                   const RawTensor& v, const RawTensor& out, const RawTensor& stats, bool causal,
                   double scale, const Sizes& z, std::string* why) {
  const char* op = "attention_backward";
  CheckCudnn(op, {&dq, &dk, &dv, &dout, &q, &k, &v, &out});
  const int device = q.device().index;
  Problem p = MakeProblem(z, q, k, v, out, causal);
  p.d_o = Strides(dout);
  p.dq = Strides(dq);
  p.dk = Strides(dk);
  p.dv = Strides(dv);
  const CachedPlan& plan = SdpaPlan(op, true, device, p);
  if (plan.plan == nullptr) {
    if (why != nullptr) *why = plan.failure;
    return false;
  }
  // One workspace request: the engine's scratch, then Delta [B, H, Tq] f32, then (flavours
  // that want it) the f32 dQ accumulator. Both are zeroed first: an engine may accumulate into
  // them.
  const size_t engine = RoundUp(static_cast<size_t>(plan.plan->workspace_bytes()));
  const size_t delta_bytes = RoundUp(static_cast<size_t>(z.b * z.h * z.tq) * sizeof(float));
  const size_t acc_bytes =
      plan.flavour.dq_accumulator ? RoundUp(static_cast<size_t>(z.b * z.h * z.tq * z.d) * 4) : 0;
  char* workspace = static_cast<char*>(Workspace(engine + delta_bytes + acc_bytes, device));
  const cudaStream_t stream = CurrentStream(device);
  TG_CUDA_CHECK(cudaMemsetAsync(workspace + engine, 0, delta_bytes + acc_bytes, stream));
  float scale_f = static_cast<float>(scale);
  float one = 1.0f;
  float masked = MaskValue();
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kDO, kStats, kScale, kDQ, kDK, kDV, kDelta, kOne};
  std::vector<void*> ptrs = {q.raw_data(),    k.raw_data(),     v.raw_data(),       out.raw_data(),
                             dout.raw_data(), stats.raw_data(), &scale_f,           dq.raw_data(),
                             dk.raw_data(),   dv.raw_data(),    workspace + engine, &one};
  if (causal) {
    uids.push_back(kNegInf);
    ptrs.push_back(&masked);
  }
  if (plan.flavour.dq_accumulator) {
    uids.push_back(kDQAccum);
    ptrs.push_back(workspace + engine + delta_bytes);
  }
  plan.plan->Execute(CudnnHandle(device), uids, ptrs, engine > 0 ? workspace : nullptr);
  return true;
}

}  // namespace

bool CudnnAttentionSupported(std::initializer_list<const RawTensor*> tensors, std::string* why) {
  auto fail = [&](const std::string& reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  for (const RawTensor* t : tensors) {
    if (t == nullptr || !t->defined()) continue;
    const std::string name = ShapeToString(t->shape());
    if (t->dtype() != kF16 && t->dtype() != kBF16) {
      return fail(absl::StrCat(name, " is ", DTypeName(t->dtype()), "; cuDNN's fused attention ",
                               "takes f16 or bf16"));
    }
    if (t->dim() != 4) return fail(absl::StrCat(name, " is not [B, H, T, D]"));
    const int64_t d = t->size(3);
    if (d == 0 || d % 8 != 0 || d > 128) {
      return fail(
          absl::StrCat(name, ": the head size ", d, " must be a multiple of 8, at most 128"));
    }
    if (t->strides()[3] != 1) return fail(absl::StrCat(name, " needs unit stride along D"));
    for (int i = 0; i < 3; ++i) {
      if (t->size(i) > 1 && t->strides()[i] % 8 != 0) {
        return fail(absl::StrCat(name, " with strides ", ShapeToString(t->strides()),
                                 ": strides must be multiples of 8 elements (16 bytes)"));
      }
    }
    if (reinterpret_cast<uintptr_t>(t->raw_data()) % 16 != 0) {
      return fail(absl::StrCat(name, " does not start at a 16-byte aligned address"));
    }
  }
  return true;
}

bool AttentionForward(const RawTensor& out, const RawTensor& softmax_stats, const RawTensor& q,
                      const RawTensor& k, const RawTensor& v, bool causal, double scale,
                      double dropout, std::string* why) {
  const char* op = "attention_forward";
  const Sizes z = Validate(op, out, softmax_stats, q, k, v, causal, scale);
  TG_CHECK(dropout == 0, op, ": attention dropout ", dropout,
           " is not supported (the backward has no dropout mask); apply dropout outside");
  TG_CHECK(out.size(3) == 1 || out.strides()[3] == 1, op, ": out needs unit stride along D");
  // With D == 0 out is empty but the stats are not (every score is 0).
  if (softmax_stats.numel() == 0) return true;
  DeviceGuard guard(q.device().index);
  return CudnnForward(out, softmax_stats, q, k, v, causal, scale, z, why);
}

bool AttentionBackward(const RawTensor& dq, const RawTensor& dk, const RawTensor& dv,
                       const RawTensor& dout, const RawTensor& q, const RawTensor& k,
                       const RawTensor& v, const RawTensor& out, const RawTensor& softmax_stats,
                       bool causal, double scale, std::string* why) {
  const char* op = "attention_backward";
  const Sizes z = Validate(op, out, softmax_stats, q, k, v, causal, scale);
  const DType dtype = q.dtype();
  CheckTensor(op, dout, "dout", out.shape(), dtype, q.device());
  CheckTensor(op, dq, "dq", q.shape(), dtype, q.device());
  CheckTensor(op, dk, "dk", k.shape(), dtype, q.device());
  CheckTensor(op, dv, "dv", v.shape(), dtype, q.device());
  for (const RawTensor* t : {&dq, &dk, &dv}) {
    TG_CHECK(t->size(3) == 1 || t->strides()[3] == 1, op, ": gradient ", ShapeToString(t->shape()),
             " needs unit stride along D");
  }
  DeviceGuard guard(q.device().index);
  if (z.tq == 0 || z.b * z.h == 0 || z.d == 0) {
    // No scores (or empty heads): what is not written by a product is zero.
    for (const RawTensor* t : {&dq, &dk, &dv}) {
      if (t->numel() > 0) t->zero_();
    }
    return true;
  }
  return CudnnBackward(dq, dk, dv, dout, q, k, v, out, softmax_stats, causal, scale, z, why);
}

}  // namespace tg::cuda
