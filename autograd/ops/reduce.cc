// Differentiable reductions and matmul.
#include <algorithm>

#include "autograd/dispatch_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "autograd/ops/autocast_inputs.h"
#include "autograd/ops/fp8_linear.h"
#include "tensor/op_list.h"

namespace tg {
namespace {

// `shape` with the reduced `dims` kept as size 1 (for broadcasting a reduced gradient back).
Shape KeptShape(const Shape& shape, const std::vector<int64_t>& dims) {
  Shape kept = shape;
  const int64_t nd = static_cast<int64_t>(shape.size());
  if (dims.empty()) {
    std::fill(kept.begin(), kept.end(), 1);
    return kept;
  }
  for (int64_t d : dims) kept[WrapDim("sum", d, nd)] = 1;
  return kept;
}

}  // namespace

Tensor Sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  if (const auto in = AutocastInputs(OpId::kSum, x)) return Sum(in[0], dims, keepdim);
  const Shape in_shape = x.shape();
  const Shape kept = KeptShape(in_shape, dims);
  return Record(OpNodeName(OpId::kSum),
                Dispatch<OpId::kSum>([&] { return tg::Sum(x.data(), dims, keepdim); }, x), {x}, {},
                [in_shape, kept](const BackwardContext& ctx) -> VariableList {
                  return {Expand(Reshape(ctx.grads[0], kept), in_shape)};
                });
}

Tensor Mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  if (const auto in = AutocastInputs(OpId::kMean, x)) return Mean(in[0], dims, keepdim);
  const Shape in_shape = x.shape();
  const Shape kept = KeptShape(in_shape, dims);
  const int64_t count = std::max<int64_t>(NumElements(kept), 1);
  const double scale = NumElements(in_shape) == 0 ? 0.0
                                                  : static_cast<double>(count) /
                                                        static_cast<double>(NumElements(in_shape));
  return Record(OpNodeName(OpId::kMean),
                Dispatch<OpId::kMean>([&] { return tg::Mean(x.data(), dims, keepdim); }, x), {x},
                {}, [in_shape, kept, scale](const BackwardContext& ctx) -> VariableList {
                  return {Expand(Reshape(MulScalar(ctx.grads[0], scale), kept), in_shape)};
                });
}

Tensor Max(const Tensor& x, int64_t dim, bool keepdim) {
  constexpr const char* kOp = OpTorchName(OpId::kMax);
  const Shape in_shape = x.shape();
  const int64_t d = WrapDim(kOp, dim, x.dim());
  const std::vector<RawTensor> r = Dispatch<OpId::kMax>(
      [&] {
        return std::vector<RawTensor>{tg::Max(x.data(), d, keepdim),
                                      tg::Argmax(x.data(), d, /*keepdim=*/true)};
      },
      x);
  const RawTensor& index = r[1];
  return Record(OpNodeName(OpId::kMax), r[0], {x}, {Tensor(index)},
                [in_shape, d](const BackwardContext& ctx) -> VariableList {
                  // Scatter the gradient to the arg-max: a one-hot mask times the broadcast grad.
                  // The mask is scattered where the index lives (ones at the arg-max along d),
                  // so CUDA uploads nothing.
                  const RawTensor& index = ctx.saved[0].data();
                  Shape kept = in_shape;
                  kept[d] = 1;
                  const DType dtype = ctx.grads[0].dtype();
                  const RawTensor mask =
                      tg::ScatterAdd(RawTensor::Zeros(in_shape, dtype, index.device()), d, index,
                                     RawTensor::Ones(kept, dtype, index.device()));
                  return {Mul(Expand(Reshape(ctx.grads[0], kept), in_shape), Tensor(mask))};
                });
}

Tensor SumTo(const Tensor& x, const Shape& shape) {
  constexpr const char* kOp = OpTorchName(OpId::kSumTo);
  if (x.shape() == shape) return x;
  const int64_t lead = x.dim() - static_cast<int64_t>(shape.size());
  TG_CHECK(lead >= 0, kOp, ": cannot reduce shape ", ShapeToString(x.shape()), " to ",
           ShapeToString(shape));
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (i < lead) {
      dims.push_back(i);
    } else if (shape[i - lead] == 1 && x.size(i) != 1) {
      dims.push_back(i);
    } else {
      TG_CHECK(shape[i - lead] == x.size(i), kOp, ": cannot reduce shape ",
               ShapeToString(x.shape()), " to ", ShapeToString(shape));
    }
  }
  Tensor summed = dims.empty() ? x : Sum(x, dims, /*keepdim=*/true);
  return Reshape(summed, shape);
}

Tensor Matmul(const Tensor& a, const Tensor& b) {
  if (const auto in = AutocastInputs(OpId::kMatmul, a, b)) return Matmul(in[0], in[1]);
  const Shape sa = a.shape(), sb = b.shape();
  return Record(
      OpNodeName(OpId::kMatmul),
      Dispatch<OpId::kMatmul>([&] { return tg::Matmul(a.data(), b.data()); }, a, b), {a, b}, {a, b},
      [sa, sb](const BackwardContext& ctx) -> VariableList {
        Tensor g = ctx.grads[0];
        Tensor a = ctx.saved[0], b = ctx.saved[1];
        // Treat 1-D operands as a row (left) / column (right), as the forward did.
        if (sa.size() == 1) a = Unsqueeze(a, 0);
        if (sb.size() == 1) b = Unsqueeze(b, 1);
        if (sa.size() == 1) g = Unsqueeze(g, sb.size() == 1 ? 0 : -2);
        if (sb.size() == 1) g = Unsqueeze(g, -1);
        Tensor ga, gb;
        if (ctx.needs(0))
          ga = Reshape(SumTo(Matmul(g, Transpose(b, -1, -2)), sa.size() == 1 ? a.shape() : sa), sa);
        if (ctx.needs(1))
          gb = Reshape(SumTo(Matmul(Transpose(a, -1, -2), g), sb.size() == 1 ? b.shape() : sb), sb);
        return {ga, gb};
      });
}

Tensor Bmm(const Tensor& a, const Tensor& b) {
  constexpr const char* kOp = OpTorchName(OpId::kBmm);
  TG_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1), kOp,
           ": expected [b, m, k] and [b, k, n], got ", ShapeToString(a.shape()), " and ",
           ShapeToString(b.shape()));
  return Matmul(a, b);
}

Tensor Linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  constexpr const char* kOp = OpTorchName(OpId::kLinear);
  if (auto fp8 = MaybeFp8Linear(x, weight, bias, Activation::kNone)) return *fp8;
  if (const auto in = AutocastInputs(OpId::kLinear, x, weight, bias)) {
    return Linear(in[0], in[1], in[2]);
  }
  TG_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(x.dim() - 1) == weight.size(1), kOp,
           ": expected x [..., in] and weight [out, in], got ", ShapeToString(x.shape()), " and ",
           ShapeToString(weight.shape()));
  TG_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), kOp,
           ": expected bias [", weight.size(0), "], got ", ShapeToString(bias.shape()));
  // The kernel list's fused Linear on every device (a cuBLASLt product with the bias epilogue on
  // CUDA, one GEMM plus one bias pass on the CPU): the sum rounds once to the dtype.
  return Linear(x, weight, bias, Activation::kNone);
}

// ---- Views ----

Tensor Reshape(const Tensor& x, const Shape& shape) {
  const Shape in_shape = x.shape();
  return MakeView(Record(OpNodeName(OpId::kReshape), x.data().reshape(shape), {x}, {},
                         [in_shape](const BackwardContext& ctx) -> VariableList {
                           return {Reshape(ctx.grads[0], in_shape)};
                         }),
                  x, [shape](const Tensor& b) { return Reshape(b, shape); });
}

Tensor Transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  return MakeView(Record(OpNodeName(OpId::kTranspose), x.data().transpose(dim0, dim1), {x}, {},
                         [dim0, dim1](const BackwardContext& ctx) -> VariableList {
                           return {Transpose(ctx.grads[0], dim0, dim1)};
                         }),
                  x, [dim0, dim1](const Tensor& b) { return Transpose(b, dim0, dim1); });
}

Tensor Permute(const Tensor& x, const Shape& dims) {
  constexpr const char* kOp = OpTorchName(OpId::kPermute);
  const RawTensor out = x.data().permute(dims);
  Shape inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i)
    inverse[WrapDim(kOp, dims[i], x.dim())] = static_cast<int64_t>(i);
  return MakeView(Record(OpNodeName(OpId::kPermute), out, {x}, {},
                         [inverse](const BackwardContext& ctx) -> VariableList {
                           return {Permute(ctx.grads[0], inverse)};
                         }),
                  x, [dims](const Tensor& b) { return Permute(b, dims); });
}

Tensor Expand(const Tensor& x, const Shape& shape) {
  const Shape in_shape = x.shape();
  return MakeView(Record(OpNodeName(OpId::kExpand), x.data().expand(shape), {x}, {},
                         [in_shape](const BackwardContext& ctx) -> VariableList {
                           return {SumTo(ctx.grads[0], in_shape)};
                         }),
                  x, [shape](const Tensor& b) { return Expand(b, shape); });
}

Tensor Unsqueeze(const Tensor& x, int64_t dim) {
  const Shape in_shape = x.shape();
  return MakeView(Record(OpNodeName(OpId::kUnsqueeze), x.data().unsqueeze(dim), {x}, {},
                         [in_shape](const BackwardContext& ctx) -> VariableList {
                           return {Reshape(ctx.grads[0], in_shape)};
                         }),
                  x, [dim](const Tensor& b) { return Unsqueeze(b, dim); });
}

Tensor Squeeze(const Tensor& x, int64_t dim) {
  const Shape in_shape = x.shape();
  return MakeView(Record(OpNodeName(OpId::kSqueeze), x.data().squeeze(dim), {x}, {},
                         [in_shape](const BackwardContext& ctx) -> VariableList {
                           return {Reshape(ctx.grads[0], in_shape)};
                         }),
                  x, [dim](const Tensor& b) { return Squeeze(b, dim); });
}

}  // namespace tg
