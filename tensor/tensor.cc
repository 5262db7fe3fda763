#include "tensor/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/strings/str_join.h"
#include "tensor/convert.h"
#include "tensor/device_backend.h"

namespace tg {

std::ostream& operator<<(std::ostream& out, IntArrayRef dims) { return out << ShapeToString(dims); }

std::string ShapeToString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    TG_CHECK(s >= 0, "shape ", ShapeToString(shape), " has a negative size");
    TG_CHECK(!__builtin_mul_overflow(n, s, &n), "shape ", ShapeToString(shape),
             " has more elements than int64 can count");
  }
  return n;
}

Shape ContiguousStrides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

Shape BroadcastShapes(const char* op, const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    TG_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", ShapeToString(a), " and ",
             ShapeToString(b), " cannot be broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int64_t WrapDim(const char* op, int64_t dim, int64_t ndim) {
  const int64_t lo = ndim == 0 ? -1 : -ndim;
  const int64_t hi = ndim == 0 ? 0 : ndim - 1;
  TG_CHECK(dim >= lo && dim <= hi, op, ": dim ", dim, " is out of range for a tensor with ", ndim,
           " dims");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

Shape BroadcastByteStrides(const RawTensor& t, const Shape& shape) {
  const size_t n = shape.size();
  TG_CHECK(t.shape().size() <= n, "broadcast: cannot broadcast shape ", ShapeToString(t.shape()),
           " to ", ShapeToString(shape));
  const size_t lead = n - t.shape().size();
  const int64_t esize = static_cast<int64_t>(t.element_size());
  Shape out(n, 0);
  for (size_t i = lead; i < n; ++i) {
    const int64_t size = t.shape()[i - lead];
    TG_CHECK(size == shape[i] || size == 1, "broadcast: cannot broadcast shape ",
             ShapeToString(t.shape()), " to ", ShapeToString(shape));
    out[i] = size == 1 ? 0 : t.strides()[i - lead] * esize;
  }
  return out;
}

namespace {

// The device dispatch: every device, the CPU included, is reached through its backend
// (tensor/device_backend.h); an unlinked one throws naming the op and what to link.

[[noreturn]] ABSL_ATTRIBUTE_NOINLINE void ThrowNoBackend(const std::string& context,
                                                         DeviceType type) {
  try {
    GetDeviceBackend(type);
  } catch (const Error& e) {
    throw Error(absl::StrCat(context, ": ", e.what()));
  }
  throw Error(absl::StrCat(context, ": no backend"));  // not reached: the lookup above failed
}

Allocator* BackendAllocator(const char* op, Device device) {
  DeviceBackend* backend = FindDeviceBackend(device.type);
  if (ABSL_PREDICT_FALSE(backend == nullptr)) {
    ThrowNoBackend(absl::StrCat(op, ": cannot allocate on ", device.ToString()), device.type);
  }
  try {
    return backend->allocator(device.index);
  } catch (const Error& e) {
    throw Error(absl::StrCat(op, ": cannot allocate on ", device.ToString(), ": ", e.what()));
  }
}

// Row-major layout check behind is_contiguous(). Like torch: a tensor without elements is
// contiguous whatever its strides (the strides of Empty({3, 0}) are [1, 1], which the loop
// would reject), and size-1 dims may have any stride.
bool ComputeContiguous(const Shape& shape, const Shape& strides, int64_t numel) {
  if (numel == 0) return true;
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

// A destination that overlaps itself (an expanded view) would be written twice.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void CheckWritable(const char* op, const RawTensor& dst) {
  for (size_t i = 0; i < dst.shape().size(); ++i) {
    TG_CHECK(dst.strides()[i] != 0 || dst.shape()[i] <= 1, op, ": the destination of shape ",
             ShapeToString(dst.shape()),
             " is an expanded view (stride 0); writing to it is ambiguous");
  }
}

}  // namespace

RawTensor::RawTensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset,
                     DType dtype)
    : storage_(std::move(storage)),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      offset_(offset),
      numel_(NumElements(shape_)),
      dtype_(dtype) {
  TG_CHECK(storage_ != nullptr, "RawTensor: null storage");
  TG_CHECK(shape_.size() == strides_.size(), "RawTensor: shape ", ShapeToString(shape_),
           " and strides ", ShapeToString(strides_), " differ in length");
  TG_CHECK(offset_ >= 0, "RawTensor: negative offset ", offset_);
  contiguous_ = ComputeContiguous(shape_, strides_, numel_);
  if (numel_ == 0) return;
  // The lowest and highest element addressed must lie inside the storage.
  int64_t lo = offset_, hi = offset_;
  for (size_t i = 0; i < shape_.size(); ++i) {
    const int64_t span = (shape_[i] - 1) * strides_[i];
    (span < 0 ? lo : hi) += span;
  }
  const int64_t capacity = static_cast<int64_t>(storage_->nbytes() / ElementSize(dtype_));
  TG_CHECK(lo >= 0 && hi < capacity, "RawTensor: view of shape ", ShapeToString(shape_),
           " with strides ", ShapeToString(strides_), " and offset ", offset_,
           " reaches outside a storage of ", capacity, " ", DTypeName(dtype_), " elements");
}

RawTensor RawTensor::NewContiguous(const char* op, const Shape& shape, DType dtype, Device device) {
  const int64_t n = NumElements(shape);
  TG_CHECK(n <= std::numeric_limits<int64_t>::max() / 8, op, ": shape ", ShapeToString(shape),
           " is too large");
  Allocator* allocator = BackendAllocator(op, device);
  RawTensor t;
  t.storage_ =
      std::make_shared<Storage>(static_cast<size_t>(n) * ElementSize(dtype), allocator, device);
  t.shape_ = shape;
  t.strides_.resize(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {  // ContiguousStrides, without a second Shape
    t.strides_[i] = stride;
    stride *= std::max<int64_t>(shape[i], 1);
  }
  t.numel_ = n;
  t.dtype_ = dtype;
  return t;
}

RawTensor RawTensor::Empty(const Shape& shape, DType dtype, Device device) {
  return NewContiguous("empty", shape, dtype, device);
}

RawTensor RawTensor::Zeros(const Shape& shape, DType dtype, Device device) {
  RawTensor t = Empty(shape, dtype, device);
  t.fill_(0);  // the CPU's backend memsets
  return t;
}

RawTensor RawTensor::Ones(const Shape& shape, DType dtype, Device device) {
  return Full(shape, 1, dtype, device);
}

RawTensor RawTensor::Full(const Shape& shape, double value, DType dtype, Device device) {
  RawTensor t = Empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

RawTensor RawTensor::Scalar(double value, DType dtype) { return Full({}, value, dtype); }

RawTensor RawTensor::Arange(double start, double end, double step, DType dtype) {
  TG_CHECK(step != 0 && std::isfinite(step) && std::isfinite(start) && std::isfinite(end),
           "arange: start ", start, ", end ", end, " and step ", step,
           " must be finite with a non-zero step");
  const double count = std::ceil((end - start) / step);
  TG_CHECK(count < 1e15, "arange: ", count, " elements is too many");
  // Clamp before converting: a hugely negative count (an empty range such as
  // Arange(0, 1e300, -1)) does not fit int64, and converting it would be undefined behaviour.
  const int64_t n = count > 0 ? static_cast<int64_t>(count) : 0;
  RawTensor values = Empty({n}, kF64);
  double* p = values.data<double>();
  for (int64_t i = 0; i < n; ++i) p[i] = start + static_cast<double>(i) * step;
  return values.to(dtype);
}

Device RawTensor::device() const {
  CheckDefined("device");
  return storage_->device();
}

int64_t RawTensor::size(int64_t d) const { return shape_[WrapDim("size", d, dim())]; }

void* RawTensor::raw_data() const {
  CheckDefined("raw_data");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(element_size());
}

void RawTensor::ThrowUndefined(const char* op) {
  throw Error(absl::StrCat(op, ": the tensor is undefined"));
}

namespace {

// Resolves one -1 in `shape` against `numel`.
Shape InferShape(const char* op, const Shape& shape, int64_t numel) {
  Shape out = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      TG_CHECK(infer < 0, op, ": only one dimension can be -1 in ", ShapeToString(shape));
      infer = static_cast<int>(i);
    } else {
      TG_CHECK(out[i] >= 0, op, ": invalid size ", out[i], " in ", ShapeToString(shape));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    TG_CHECK(known != 0 && numel % known == 0, op, ": shape ", ShapeToString(shape),
             " is invalid for ", numel, " elements");
    out[infer] = numel / known;
  }
  TG_CHECK(NumElements(out) == numel, op, ": shape ", ShapeToString(shape), " is invalid for ",
           numel, " elements");
  return out;
}

// Strides that present data of (shape, strides) as `target` without copying, if possible
// (the algorithm of torch's computeStride: split runs of dims that are contiguous among
// themselves). Returns an empty optional-like flag through `ok`.
Shape ViewStrides(const Shape& shape, const Shape& strides, const Shape& target, bool* ok) {
  *ok = true;
  Shape out(target.size());
  if (NumElements(shape) == 0 || shape.empty()) {
    out = ContiguousStrides(target);
    return out;
  }
  int64_t view_d = static_cast<int64_t>(target.size()) - 1;
  int64_t chunk_base_stride = strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= shape[d];
    if (d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || target[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= target[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) {
        *ok = false;
        return out;
      }
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) *ok = false;
  return out;
}

}  // namespace

RawTensor RawTensor::view(const Shape& shape) const {
  CheckDefined("view");
  const Shape target = InferShape("view", shape, numel_);
  bool ok;
  Shape strides = ViewStrides(shape_, strides_, target, &ok);
  TG_CHECK(ok, "view: shape ", ShapeToString(target), " is not compatible with the strides ",
           ShapeToString(strides_), " of a tensor of shape ", ShapeToString(shape_),
           "; use reshape() to copy");
  return RawTensor(storage_, target, std::move(strides), offset_, dtype_);
}

RawTensor RawTensor::reshape(const Shape& shape) const {
  CheckDefined("reshape");
  const Shape target = InferShape("reshape", shape, numel_);
  bool ok;
  Shape strides = ViewStrides(shape_, strides_, target, &ok);
  if (ok) return RawTensor(storage_, target, std::move(strides), offset_, dtype_);
  return contiguous().view(target);
}

RawTensor RawTensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  CheckDefined("slice");
  const int64_t d = WrapDim("slice", dim, this->dim());
  TG_CHECK(this->dim() > 0, "slice: cannot slice a 0-d tensor");
  TG_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t n = shape_[d];
  auto clamp = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  start = clamp(start);
  end = std::max(clamp(end), start);
  Shape shape = shape_, strides = strides_;
  shape[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  const int64_t offset = shape[d] == 0 ? offset_ : offset_ + start * strides_[d];
  return RawTensor(storage_, std::move(shape), std::move(strides), offset, dtype_);
}

RawTensor RawTensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  CheckDefined("narrow");
  const int64_t d = WrapDim("narrow", dim, this->dim());
  TG_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d], "narrow: range [", start, ", ",
           start + length, ") is out of bounds for dim ", d, " of size ", shape_[d]);
  return slice(d, start, start + length);
}

RawTensor RawTensor::select(int64_t dim, int64_t index) const {
  CheckDefined("select");
  TG_CHECK(this->dim() > 0, "select: cannot select from a 0-d tensor");
  const int64_t d = WrapDim("select", dim, this->dim());
  const int64_t n = shape_[d];
  TG_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dim ", d,
           " of size ", n);
  if (index < 0) index += n;
  Shape shape = shape_, strides = strides_;
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return RawTensor(storage_, std::move(shape), std::move(strides), offset_ + index * strides_[d],
                   dtype_);
}

RawTensor RawTensor::transpose(int64_t dim0, int64_t dim1) const {
  CheckDefined("transpose");
  if (this->dim() == 0) return *this;
  Shape dims(shape_.size());
  for (size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<int64_t>(i);
  std::swap(dims[WrapDim("transpose", dim0, this->dim())],
            dims[WrapDim("transpose", dim1, this->dim())]);
  return permute(dims);
}

RawTensor RawTensor::permute(const Shape& dims) const {
  CheckDefined("permute");
  TG_CHECK(static_cast<int64_t>(dims.size()) == this->dim(), "permute: ", dims.size(),
           " dims given for a tensor of shape ", ShapeToString(shape_));
  Shape shape(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = WrapDim("permute", dims[i], this->dim());
    TG_CHECK(!seen[d], "permute: dim ", d, " repeats in ", ShapeToString(dims));
    seen[d] = true;
    shape[i] = shape_[d];
    strides[i] = strides_[d];
  }
  return RawTensor(storage_, std::move(shape), std::move(strides), offset_, dtype_);
}

RawTensor RawTensor::expand(const Shape& shape) const {
  CheckDefined("expand");
  TG_CHECK(shape.size() >= shape_.size(), "expand: cannot expand shape ", ShapeToString(shape_),
           " to ", ShapeToString(shape));
  const size_t lead = shape.size() - shape_.size();
  Shape out_shape(shape.size()), out_strides(shape.size(), 0);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      TG_CHECK(shape[i] >= 0, "expand: invalid size ", shape[i], " in ", ShapeToString(shape));
      out_shape[i] = shape[i];
      continue;
    }
    const int64_t have = shape_[i - lead];
    const int64_t want = shape[i] == -1 ? have : shape[i];
    TG_CHECK(want == have || have == 1, "expand: cannot expand shape ", ShapeToString(shape_),
             " to ", ShapeToString(shape));
    out_shape[i] = want;
    out_strides[i] = have == 1 && want != 1 ? 0 : strides_[i - lead];
  }
  return RawTensor(storage_, std::move(out_shape), std::move(out_strides), offset_, dtype_);
}

RawTensor RawTensor::unsqueeze(int64_t dim) const {
  CheckDefined("unsqueeze");
  const int64_t d = WrapDim("unsqueeze", dim, this->dim() + 1);
  Shape shape = shape_, strides = strides_;
  const int64_t stride = d < this->dim() ? strides_[d] * shape_[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  return RawTensor(storage_, std::move(shape), std::move(strides), offset_, dtype_);
}

RawTensor RawTensor::squeeze(int64_t dim) const {
  CheckDefined("squeeze");
  if (this->dim() == 0) return *this;
  const int64_t d = WrapDim("squeeze", dim, this->dim());
  if (shape_[d] != 1) return *this;
  Shape shape = shape_, strides = strides_;
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return RawTensor(storage_, std::move(shape), std::move(strides), offset_, dtype_);
}

RawTensor RawTensor::contiguous() const {
  CheckDefined("contiguous");
  return is_contiguous() ? *this : clone();
}

RawTensor RawTensor::clone() const {
  CheckDefined("clone");
  RawTensor out = NewContiguous("clone", shape_, dtype_, device());
  CopyInto(out, *this);
  return out;
}

RawTensor RawTensor::to(DType dtype) const {
  CheckDefined("to");
  if (dtype == dtype_) return *this;
  RawTensor out = NewContiguous("to", shape_, dtype, device());
  CopyInto(out, *this);
  return out;
}

RawTensor RawTensor::to(Device device) const {
  CheckDefined("to");
  return to(device, dtype_);
}

RawTensor RawTensor::to(Device device, DType dtype) const {
  CheckDefined("to");
  if (device == storage_->device() && dtype == dtype_) return *this;
  RawTensor out = NewContiguous("to", shape_, dtype, device);
  CopyInto(out, *this);
  return out;
}

const RawTensor& RawTensor::fill_(double value) const {
  CheckDefined("fill_");
  CheckWritable("fill_", *this);
  const Device device = storage_->device();
  DeviceBackend* backend = FindDeviceBackend(device.type);
  if (ABSL_PREDICT_FALSE(backend == nullptr)) {
    ThrowNoBackend(absl::StrCat("fill_: tensor on ", device.ToString()), device.type);
  }
  backend->Fill(*this, value);
  return *this;
}

const RawTensor& RawTensor::copy_(const RawTensor& src) const {
  CheckDefined("copy_");
  CopyInto(*this, src);
  return *this;
}

double RawTensor::item() const {
  CheckDefined("item");
  TG_CHECK(numel_ == 1, "item: the tensor has ", numel_, " elements (shape ", ShapeToString(shape_),
           "), expected 1");
  // Read on the host: a copy there (which synchronises with a device's stream) unless the
  // tensor is in host memory already (to() returns it then).
  const RawTensor host = to(Device::Cpu());
  return VisitStorage(dtype_, [&](auto tag) {
    using T = decltype(tag);
    return Convert<double>(*static_cast<const T*>(host.raw_data()));
  });
}

std::string RawTensor::ToString(int64_t max_elements) const {
  if (!defined()) return "tensor(undefined)";
  const std::vector<double> v =
      numel_ <= max_elements ? to_vector<double>() : std::vector<double>{};
  std::string body;
  if (numel_ > max_elements) {
    body = absl::StrCat("... ", numel_, " elements ...");
  } else if (shape_.empty()) {
    body = absl::StrCat(v[0]);
  } else {
    // Open a bracket at each dim boundary, row-major.
    const Shape strides = ContiguousStrides(shape_);
    for (int64_t i = 0; i < numel_; ++i) {
      for (size_t d = 0; d < shape_.size(); ++d) {
        if (i % (strides[d] * shape_[d]) == 0) body += "[";
      }
      absl::StrAppend(&body, v[i]);
      int closed = 0;
      for (size_t d = 0; d < shape_.size(); ++d) {
        if ((i + 1) % (strides[d] * shape_[d]) == 0) ++closed;
      }
      body += std::string(closed, ']');
      if (i + 1 < numel_) body += ", ";
    }
    if (numel_ == 0) body = "[]";
  }
  const Device device = storage_->device();
  return absl::StrCat("tensor(", body, ", ", DTypeName(dtype_), ", shape=", ShapeToString(shape_),
                      device.is_cpu() ? "" : absl::StrCat(", device=", device.ToString()), ")");
}

namespace {

// The backend that copies between dst's and src's devices: the one of the side that is not the
// host (the CPU), or the host's for a copy within host memory.
DeviceBackend* CopyBackend(const RawTensor& dst, const RawTensor& src) {
  const Device to = dst.device(), from = src.device();
  const DeviceType type = to.is_cpu() ? from.type : to.type;
  DeviceBackend* backend = FindDeviceBackend(type);
  if (ABSL_PREDICT_TRUE(backend != nullptr &&
                        (to.type == from.type || from.is_cpu() || to.is_cpu()))) {
    return backend;
  }
  TG_CHECK(to.is_cpu() || from.is_cpu() || to.type == from.type, "copy_: from ", from.ToString(),
           " to ", to.ToString(), ": copies between two kinds of device are not supported");
  ThrowNoBackend(absl::StrCat("copy_: from ", from.ToString(), " to ", to.ToString()), type);
}

}  // namespace

void CopyInto(const RawTensor& dst, const RawTensor& src) {
  TG_CHECK(dst.defined() && src.defined(), "copy_: undefined tensor");
  CheckWritable("copy_", dst);
  if (src.shape() == dst.shape()) {
    CopyBackend(dst, src)->Copy(dst, src);
    return;
  }
  RawTensor expanded;
  try {
    expanded = src.expand(dst.shape());
  } catch (const Error&) {
    throw Error(absl::StrCat("copy_: source shape ", ShapeToString(src.shape()),
                             " cannot be broadcast to ", ShapeToString(dst.shape())));
  }
  CopyBackend(dst, expanded)->Copy(dst, expanded);
}

}  // namespace tg
