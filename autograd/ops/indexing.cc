// Tensor::index and Tensor::index_put_ (autograd/indexing.h), composed of the recorded view ops
// (Select, Slice, Unsqueeze) and IndexSelect, so the gradient is theirs.
#include "autograd/indexing.h"

#include <cstring>
#include <vector>

#include "autograd/ops.h"
#include "tensor/error.h"

namespace tg {
namespace indexing {

TensorIndex::TensorIndex(const char* ellipsis) : kind_(Kind::kEllipsis) {
  TG_CHECK(ellipsis != nullptr && std::strcmp(ellipsis, "...") == 0,
           "index: a string index must be \"...\", got \"", ellipsis == nullptr ? "" : ellipsis,
           "\"");
}

}  // namespace indexing

namespace {

using indexing::TensorIndex;

// x[..., idx, ...] along `dim` for an integer tensor idx: its shape replaces the dim.
Tensor TakeAlong(const Tensor& x, int64_t dim, const Tensor& idx) {
  TG_CHECK(idx.dtype() == kI64 || idx.dtype() == kI32,
           "index: a tensor index must hold i64 or i32 ", "positions, got ", DTypeName(idx.dtype()),
           " (bool masks are not supported)");
  const int64_t size = x.size(dim);
  std::vector<int64_t> positions = idx.data().to(kI64).to(Device::Cpu()).to_vector<int64_t>();
  for (int64_t& p : positions) {
    TG_CHECK(p >= -size && p < size, "index: position ", p, " is out of bounds for dim ", dim,
             " of size ", size);
    if (p < 0) p += size;
  }
  const RawTensor flat =
      RawTensor::FromVector(positions, {static_cast<int64_t>(positions.size())}).to(x.device());
  Tensor moved = dim == 0 ? x : Transpose(x, 0, dim);
  Tensor picked = IndexSelect(moved, flat);  // [n, rest...]
  if (dim != 0) picked = Transpose(picked, 0, dim);
  Shape shape;
  for (int64_t d = 0; d < dim; ++d) shape.push_back(x.size(d));
  for (int64_t s : idx.sizes()) shape.push_back(s);
  for (int64_t d = dim + 1; d < x.dim(); ++d) shape.push_back(x.size(d));
  return Reshape(picked, shape);
}

Tensor ApplyIndices(const Tensor& self, const std::vector<TensorIndex>& indices) {
  TG_CHECK(self.defined(), "index: the tensor is undefined");
  int64_t consumed = 0, ellipses = 0, tensors = 0;
  for (const TensorIndex& i : indices) {
    consumed += i.ConsumesDim();
    ellipses += i.kind() == TensorIndex::Kind::kEllipsis;
    tensors += i.kind() == TensorIndex::Kind::kTensor;
    TG_CHECK(i.kind() != TensorIndex::Kind::kBool,
             "index: bool indices (x[True]) are not supported");
  }
  TG_CHECK(ellipses <= 1, "index: an index can only have a single ellipsis ('...')");
  TG_CHECK(tensors <= 1, "index: at most one tensor index is supported, got ", tensors);
  TG_CHECK(consumed <= self.dim(), "index: too many indices for a tensor of dimension ", self.dim(),
           " (got ", consumed, ")");
  Tensor x = self;
  int64_t dim = 0;
  for (const TensorIndex& i : indices) {
    switch (i.kind()) {
      case TensorIndex::Kind::kNone:
        x = Unsqueeze(x, dim++);
        break;
      case TensorIndex::Kind::kEllipsis:
        dim += self.dim() - consumed;
        break;
      case TensorIndex::Kind::kInteger: {
        const int64_t size = x.size(dim);
        TG_CHECK(i.integer() >= -size && i.integer() < size, "index: index ", i.integer(),
                 " is out of bounds for dimension ", dim, " with size ", size);
        x = Select(x, dim, i.integer());
        break;
      }
      case TensorIndex::Kind::kSlice: {
        const indexing::Slice& s = i.slice();
        TG_CHECK(s.step() > 0, "index: slice step must be positive, got ", s.step());
        x = Slice(x, dim++, s.start(), s.stop(), s.step());
        break;
      }
      case TensorIndex::Kind::kTensor:
        x = TakeAlong(x, dim, i.tensor());
        dim += i.tensor().dim();
        break;
      case TensorIndex::Kind::kBool:
        break;  // refused above
    }
  }
  return x;
}

// index_put_ writes through a view: no tensor index.
void CheckViewIndices(std::initializer_list<TensorIndex> indices) {
  for (const TensorIndex& i : indices) {
    TG_CHECK(i.kind() != TensorIndex::Kind::kTensor,
             "index_put_: tensor indices are not supported (only views: integers, slices, None, "
             "...)");
  }
}

}  // namespace

Tensor Tensor::index(std::initializer_list<TensorIndex> indices) const {
  return ApplyIndices(*this, std::vector<TensorIndex>(indices));
}
Tensor Tensor::index(const std::vector<TensorIndex>& indices) const {
  return ApplyIndices(*this, indices);
}

const Tensor& Tensor::index_put_(std::initializer_list<TensorIndex> indices,
                                 const Tensor& value) const {
  CheckViewIndices(indices);
  CopyInPlace(ApplyIndices(*this, std::vector<TensorIndex>(indices)), value);
  return *this;
}
const Tensor& Tensor::index_put_(std::initializer_list<TensorIndex> indices, double value) const {
  CheckViewIndices(indices);
  FillInPlace(ApplyIndices(*this, std::vector<TensorIndex>(indices)), value);
  return *this;
}

const Tensor& Tensor::copy_(const Tensor& src) const { return CopyInPlace(*this, src); }

}  // namespace tg
