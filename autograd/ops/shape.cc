// Differentiable ops that select or move elements: slice, select, cat, stack, split, gather and
// index_select. Each backward is the adjoint op (write or scatter-add the gradient into zeros of
// the input's shape), itself recorded with the forward op as its backward, so create_graph gives
// higher-order gradients. Semantics follow PyTorch (torch.cat promotes dtypes, torch.split keeps
// a shorter last chunk, gather/index_select reject negative indices).
#include <algorithm>

#include "autograd/dispatch_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/op_list.h"

namespace tg {
namespace {

// Zeros of `shape` with `g` written into slice (dim, start, end, step): the adjoint of Slice.
Tensor SliceScatter(const Tensor& g, const Shape& shape, int64_t dim, int64_t start, int64_t end,
                    int64_t step) {
  RawTensor out = RawTensor::Zeros(shape, g.dtype(), g.data().device());
  out.slice(dim, start, end, step).copy_(g.data());
  return Record("SliceScatterBackward", out, {g}, {},
                [dim, start, end, step](const BackwardContext& ctx) -> VariableList {
                  return {Slice(ctx.grads[0], dim, start, end, step)};
                });
}

// Zeros of `shape` with `g` written at `index` of `dim`: the adjoint of Select.
Tensor SelectScatter(const Tensor& g, const Shape& shape, int64_t dim, int64_t index) {
  RawTensor out = RawTensor::Zeros(shape, g.dtype(), g.data().device());
  out.select(dim, index).copy_(g.data());
  return Record("SelectScatterBackward", out, {g}, {},
                [dim, index](const BackwardContext& ctx) -> VariableList {
                  return {Select(ctx.grads[0], dim, index)};
                });
}

// Zeros of `shape` with `g` scatter-added along `dim` at `index`: the adjoint of Gather.
Tensor ScatterAddInto(const Tensor& g, const Shape& shape, int64_t dim, const RawTensor& index) {
  const RawTensor zeros = RawTensor::Zeros(shape, g.dtype(), g.data().device());
  return Record(OpNodeName(OpId::kScatterAdd), tg::ScatterAdd(zeros, dim, index, g.data()), {g},
                {Tensor(index)}, [dim](const BackwardContext& ctx) -> VariableList {
                  return {Gather(ctx.grads[0], dim, ctx.saved[0].data())};
                });
}

// Zeros of `shape` with the rows of `g` added at rows `index`: the adjoint of IndexSelect.
Tensor IndexAddInto(const Tensor& g, const Shape& shape, const RawTensor& index) {
  const RawTensor zeros = RawTensor::Zeros(shape, g.dtype(), g.data().device());
  return Record(OpNodeName(OpId::kIndexAdd), tg::IndexAdd(zeros, 0, index, g.data()), {g},
                {Tensor(index)}, [](const BackwardContext& ctx) -> VariableList {
                  return {IndexSelect(ctx.grads[0], ctx.saved[0].data())};
                });
}

}  // namespace

Tensor Slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  constexpr const char* kOp = OpTorchName(OpId::kSlice);
  const RawTensor out = x.data().slice(dim, start, end, step);  // validates dim and step
  const int64_t d = WrapDim(kOp, dim, x.dim());
  const Shape in_shape = x.shape();
  return MakeView(
      Record(OpNodeName(OpId::kSlice), out, {x}, {},
             [in_shape, d, start, end, step](const BackwardContext& ctx) -> VariableList {
               return {SliceScatter(ctx.grads[0], in_shape, d, start, end, step)};
             }),
      x, [d, start, end, step](const Tensor& b) { return Slice(b, d, start, end, step); });
}

Tensor Narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  constexpr const char* kOp = OpTorchName(OpId::kNarrow);
  TG_CHECK(x.dim() > 0, kOp, ": cannot narrow a 0-d tensor");
  const int64_t d = WrapDim(kOp, dim, x.dim());
  const int64_t size = x.size(d);
  TG_CHECK(start >= -size && start <= size, kOp, ": start ", start, " is out of range for dim ", d,
           " of size ", size);
  const int64_t s = start < 0 ? start + size : start;
  TG_CHECK(length >= 0 && s + length <= size, kOp, ": start (", s, ") + length (", length,
           ") exceeds dim ", d, " of size ", size);
  return Slice(x, d, s, s + length);
}

Tensor Select(const Tensor& x, int64_t dim, int64_t index) {
  constexpr const char* kOp = OpTorchName(OpId::kSelect);
  const RawTensor out = x.data().select(dim, index);  // validates dim and index
  const int64_t d = WrapDim(kOp, dim, x.dim());
  const int64_t i = index < 0 ? index + x.size(d) : index;
  const Shape in_shape = x.shape();
  return MakeView(Record(OpNodeName(OpId::kSelect), out, {x}, {},
                         [in_shape, d, i](const BackwardContext& ctx) -> VariableList {
                           return {SelectScatter(ctx.grads[0], in_shape, d, i)};
                         }),
                  x, [d, i](const Tensor& b) { return Select(b, d, i); });
}

Tensor Cat(const VariableList& xs, int64_t dim) {
  constexpr const char* kOp = OpTorchName(OpId::kCat);
  TG_CHECK(!xs.empty(), kOp, ": expected a non-empty list of tensors");
  for (size_t i = 0; i < xs.size(); ++i) {
    TG_CHECK(xs[i].defined(), kOp, ": tensor ", i, " is undefined");
    TG_CHECK(xs[i].dim() > 0, kOp, ": tensor ", i, " is 0-d; 0-d tensors cannot be concatenated");
  }
  const Shape& first = xs[0].shape();
  const int64_t d = WrapDim(kOp, dim, xs[0].dim());
  Shape out_shape = first;
  out_shape[d] = 0;
  DType dtype = xs[0].dtype();
  std::vector<int64_t> sizes;
  std::vector<DType> dtypes;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Shape& s = xs[i].shape();
    bool match = s.size() == first.size();
    for (size_t k = 0; match && k < s.size(); ++k) {
      match = k == static_cast<size_t>(d) || s[k] == first[k];
    }
    TG_CHECK(match, kOp, ": tensor ", i, " has shape ", ShapeToString(s),
             " but tensor 0 has shape ", ShapeToString(first), "; shapes must match except in dim ",
             d);
    out_shape[d] += s[d];
    sizes.push_back(s[d]);
    dtypes.push_back(xs[i].dtype());
    dtype = PromoteTypes(dtype, xs[i].dtype());  // torch.cat promotes like binary ops
  }
  const RawTensor out = DispatchList<OpId::kCat>(
      [&] {
        RawTensor result = RawTensor::Empty(out_shape, dtype, xs[0].data().device());
        for (size_t i = 0, offset = 0; i < xs.size(); offset += sizes[i], ++i) {
          result.slice(d, static_cast<int64_t>(offset), static_cast<int64_t>(offset) + sizes[i])
              .copy_(xs[i].data());
        }
        return result;
      },
      xs);
  return Record(OpNodeName(OpId::kCat), out, xs, {},
                [d, sizes, dtypes](const BackwardContext& ctx) -> VariableList {
                  VariableList grads(sizes.size());
                  int64_t offset = 0;
                  for (size_t i = 0; i < sizes.size(); offset += sizes[i], ++i) {
                    if (!ctx.needs(i)) continue;
                    grads[i] = Cast(Slice(ctx.grads[0], d, offset, offset + sizes[i]), dtypes[i]);
                  }
                  return grads;
                });
}

Tensor Stack(const VariableList& xs, int64_t dim) {
  constexpr const char* kOp = OpTorchName(OpId::kStack);
  TG_CHECK(!xs.empty(), kOp, ": expected a non-empty list of tensors");
  for (size_t i = 0; i < xs.size(); ++i) {
    TG_CHECK(xs[i].defined(), kOp, ": tensor ", i, " is undefined");
    TG_CHECK(xs[i].shape() == xs[0].shape(), kOp, ": tensor ", i, " has shape ",
             ShapeToString(xs[i].shape()), " but tensor 0 has shape ", ShapeToString(xs[0].shape()),
             "; stacked tensors must have equal shapes");
  }
  const int64_t d = WrapDim(kOp, dim, xs[0].dim() + 1);
  // stack = cat of the inputs unsqueezed at dim; the gradient flows back through both ops.
  VariableList unsqueezed;
  unsqueezed.reserve(xs.size());
  for (const Tensor& x : xs) unsqueezed.push_back(Unsqueeze(x, d));
  return Cat(unsqueezed, d);
}

VariableList Split(const Tensor& x, int64_t split_size, int64_t dim) {
  constexpr const char* kOp = OpTorchName(OpId::kSplit);
  TG_CHECK(split_size > 0, kOp, ": split_size must be positive, got ", split_size);
  TG_CHECK(x.dim() > 0, kOp, ": cannot split a 0-d tensor");
  const int64_t d = WrapDim(kOp, dim, x.dim());
  const int64_t n = x.size(d);
  // Chunks of split_size, the last one shorter; an empty dim gives one empty chunk (PyTorch).
  std::vector<RawTensor> chunks;
  for (int64_t start = 0; start < n || chunks.empty(); start += split_size) {
    chunks.push_back(x.data().slice(d, start, std::min(start + split_size, n)));
  }
  VariableList outputs = RecordMulti(OpNodeName(OpId::kSplit), chunks, {x}, {},
                                     [d](const BackwardContext& ctx) -> VariableList {
                                       // Chunks that got no gradient arrive as zeros.
                                       return {Cat(ctx.grads, d)};
                                     });
  for (size_t i = 0; i < outputs.size(); ++i) {
    outputs[i] = MakeMultiOutputView(std::move(outputs[i]), x, "Split", i);
  }
  return outputs;
}

Tensor Gather(const Tensor& x, int64_t dim, const RawTensor& index) {
  constexpr const char* kOp = OpTorchName(OpId::kGather);
  const RawTensor out = Dispatch<OpId::kGather>([&] { return tg::Gather(x.data(), dim, index); }, x,
                                                Tensor(index));  // validates
  const int64_t d = WrapDim(kOp, dim, x.dim());
  const Shape in_shape = x.shape();
  return Record(OpNodeName(OpId::kGather), out, {x}, {Tensor(index)},
                [in_shape, d](const BackwardContext& ctx) -> VariableList {
                  return {ScatterAddInto(ctx.grads[0], in_shape, d, ctx.saved[0].data())};
                });
}

Tensor IndexSelect(const Tensor& x, const RawTensor& index) {
  const RawTensor out = Dispatch<OpId::kIndexSelect>(
      [&] { return tg::IndexSelect(x.data(), 0, index); }, x, Tensor(index));  // validates
  const Shape in_shape = x.shape();
  return Record(OpNodeName(OpId::kIndexSelect), out, {x}, {Tensor(index)},
                [in_shape](const BackwardContext& ctx) -> VariableList {
                  return {IndexAddInto(ctx.grads[0], in_shape, ctx.saved[0].data())};
                });
}

}  // namespace tg
