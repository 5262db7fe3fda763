// RawTensor: a cheap handle to a strided view of a shared Storage.
//
// A RawTensor holds a shape, element strides, an element offset into its storage, a dtype and (via
// the storage) a device. Copying a RawTensor copies the handle, not the data. View methods
// (reshape of viewable data, slice, select, transpose, permute, expand, squeeze, unsqueeze) share
// storage with their source; contiguous(), clone() and to() copy when they must. Every view is
// validated so that no element it addresses lies outside its storage.
//
// Tensors on a CUDA device allocate, copy and fill through the device backend registered in
// tensor/device_backend.h (link //tensor/cuda:backend); without it those calls throw. Host
// reads of device data (item(), to_vector(), ToString()) copy to the CPU first, which waits for
// the device.
//
//   tg::RawTensor x = tg::RawTensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
//   tg::RawTensor xt = x.transpose(0, 1);          // [3, 2] view, strides {1, 3}
//   tg::RawTensor y = xt.contiguous().to(tg::kF16);
//   float v = x.slice(1, 1, 3).select(0, 1).item();   // 5
//   tg::RawTensor g = x.to(tg::Device::Cuda(0));   // with //tensor/cuda:backend linked
#ifndef TAPEGRAD_TENSOR_TENSOR_H_
#define TAPEGRAD_TENSOR_TENSOR_H_

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/storage.h"

namespace tg {

// Sizes, strides and dim lists. Inline storage for up to 6 dims keeps the copies that every
// tensor handle and op makes off the heap (this is most of the cost of ops on small tensors).
using Shape = absl::InlinedVector<int64_t, 6>;

// A read-only list of sizes or dims (libtorch's IntArrayRef): {2, 3}, one number, a Shape, a
// std::vector<int64_t> or a tensor's sizes(). It refers to the caller's values: a parameter
// type, not something to keep.
class IntArrayRef : public absl::Span<const int64_t> {
 public:
  using absl::Span<const int64_t>::Span;
  IntArrayRef(const Shape& s) : Span(s.data(), s.size()) {}  // NOLINT: implicit, as libtorch's
  IntArrayRef(const int64_t& one) : Span(&one, 1) {}         // NOLINT
  std::vector<int64_t> vec() const { return std::vector<int64_t>(begin(), end()); }
};
// Prints "[2, 3]", as libtorch prints sizes.
std::ostream& operator<<(std::ostream& out, IntArrayRef dims);

// "[2, 3]"; takes a Shape or a std::vector<int64_t>.
std::string ShapeToString(absl::Span<const int64_t> shape);
// Product of the sizes; throws if a size is negative or the product overflows int64.
int64_t NumElements(const Shape& shape);
// Row-major (C-order) strides for `shape`, in elements.
Shape ContiguousStrides(const Shape& shape);
// The shape two shapes broadcast to (numpy rules); throws "<op>: shapes [..] and [..] cannot be
// broadcast".
Shape BroadcastShapes(const char* op, const Shape& a, const Shape& b);
// Wraps a possibly negative dim into [0, ndim); throws naming the op when it is out of range.
int64_t WrapDim(const char* op, int64_t dim, int64_t ndim);

class RawTensor {
 public:
  // An undefined tensor (defined() == false); most methods throw on it.
  RawTensor() = default;
  // A view of `storage`; throws unless every addressed element lies inside the storage.
  RawTensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset,
            DType dtype);

  // Uninitialised memory of the given shape (contiguous). A non-CPU device allocates through
  // its backend; throws when the backend is not linked or the device does not exist.
  static RawTensor Empty(const Shape& shape, DType dtype = kF32, Device device = Device::Cpu());
  static RawTensor Zeros(const Shape& shape, DType dtype = kF32, Device device = Device::Cpu());
  static RawTensor Ones(const Shape& shape, DType dtype = kF32, Device device = Device::Cpu());
  static RawTensor Full(const Shape& shape, double value, DType dtype = kF32,
                        Device device = Device::Cpu());
  // A 0-d tensor holding `value`.
  static RawTensor Scalar(double value, DType dtype = kF32);
  // [start, start + step, ...) below `end` (above it for a negative step), like torch.arange.
  static RawTensor Arange(double start, double end, double step = 1, DType dtype = kF32);
  // Copies `values` (converted to `dtype`, default the dtype of T) into a tensor of `shape`.
  template <typename T>
  static RawTensor FromVector(const std::vector<T>& values, const Shape& shape);
  template <typename T>
  static RawTensor FromVector(const std::vector<T>& values, const Shape& shape, DType dtype) {
    return FromVector(values, shape).to(dtype);
  }

  bool defined() const { return storage_ != nullptr; }
  // Makes this tensor undefined, releasing its storage (libtorch's reset()). Preferred over
  // `t = RawTensor()`: moving from a default Shape copies its uninitialised inline buffer, which
  // GCC 12 rightly reports (-Wmaybe-uninitialized).
  void reset() {
    storage_.reset();
    shape_.clear();
    strides_.clear();
    offset_ = 0;
    numel_ = 0;
    dtype_ = kF32;
    contiguous_ = true;
  }
  DType dtype() const { return dtype_; }
  Device device() const;
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  // Size of dim `d` (negative counts from the end).
  int64_t size(int64_t d) const;
  int64_t numel() const { return numel_; }
  size_t element_size() const { return ElementSize(dtype_); }
  bool is_contiguous() const { return contiguous_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  // Whether two tensors address the same storage.
  bool shares_storage(const RawTensor& other) const { return storage_ == other.storage_; }

  // Pointer to the first element (at offset()); T must match dtype().
  template <typename T>
  T* data() const;
  void* raw_data() const;

  // Views. Dims may be negative. reshape() returns a view when the strides allow it and a copy
  // otherwise (like torch.reshape); view() throws instead of copying. One size may be -1.
  RawTensor view(const Shape& shape) const;
  RawTensor reshape(const Shape& shape) const;
  // Elements start, start+step, ... below end of `dim`; start/end are clamped like Python slices
  // (negative values count from the end); step must be positive.
  RawTensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  RawTensor narrow(int64_t dim, int64_t start, int64_t length) const;
  // Index `index` of `dim`, removing that dim.
  RawTensor select(int64_t dim, int64_t index) const;
  RawTensor transpose(int64_t dim0, int64_t dim1) const;
  RawTensor permute(const Shape& dims) const;
  // Broadcast view: size-1 dims (or new leading dims) get stride 0. -1 keeps a size.
  RawTensor expand(const Shape& shape) const;
  RawTensor unsqueeze(int64_t dim) const;
  RawTensor squeeze(int64_t dim) const;
  RawTensor flatten() const { return reshape({numel_}); }

  // Copies: contiguous() returns *this when already contiguous.
  RawTensor contiguous() const;
  RawTensor clone() const;
  // Converts to `dtype` (returns *this when equal). Float -> int truncates toward zero and
  // saturates, NaN becomes 0; anything -> bool is `value != 0`.
  RawTensor to(DType dtype) const;
  // Copies to `device` (returns *this when equal); with a dtype, converts in the same copy.
  RawTensor to(Device device) const;
  RawTensor to(Device device, DType dtype) const;

  // In place (const like every handle method: they change the data, not the handle).
  // copy_ broadcasts `src` to this shape and converts its dtype.
  const RawTensor& fill_(double value) const;
  const RawTensor& zero_() const { return fill_(0); }
  const RawTensor& copy_(const RawTensor& src) const;

  // The value of a one-element tensor, as double (a device tensor is copied to the host).
  double item() const;
  // All elements in row-major order, converted to T.
  template <typename T>
  std::vector<T> to_vector() const;
  // "tensor([[1, 2], [3, 4]], f32, shape=[2, 2])"; with more than `max_elements` elements the
  // values are elided: "tensor(... 100 elements ..., f32, shape=[100])". A device tensor
  // ends with ", device=cuda:0".
  std::string ToString(int64_t max_elements = 64) const;

 private:
  // Uninitialised contiguous memory; `op` names the caller in errors. Skips the view checks of
  // the public constructor (the storage is sized for the shape): this is the allocation every
  // op makes, and its cost dominates ops on small tensors.
  static RawTensor NewContiguous(const char* op, const Shape& shape, DType dtype, Device device);

  void CheckDefined(const char* op) const {
    if (storage_ == nullptr) ThrowUndefined(op);
  }
  [[noreturn]] static void ThrowUndefined(const char* op);

  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;
  int64_t numel_ = 0;
  DType dtype_ = kF32;
  bool contiguous_ = true;  // computed once at construction (kernels ask on every call)
};

// Copies src (broadcast to dst's shape) into dst with dtype conversion. Both on the CPU runs
// here; otherwise the device backend copies (same device, across devices, or host <-> device).
void CopyInto(const RawTensor& dst, const RawTensor& src);

template <typename T>
T* RawTensor::data() const {
  CheckDefined("data");
  TG_CHECK(DTypeOf<T>() == dtype_, "data<", DTypeName(DTypeOf<T>()), ">: tensor has dtype ",
           DTypeName(dtype_));
  return static_cast<T*>(storage_->data()) + offset_;
}

template <typename T>
RawTensor RawTensor::FromVector(const std::vector<T>& values, const Shape& shape) {
  RawTensor t = Empty(shape, DTypeOf<T>());
  TG_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "FromVector: ", values.size(),
           " values do not fill shape ", ShapeToString(shape));
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

template <typename T>
std::vector<T> RawTensor::to_vector() const {
  RawTensor c = to(Device::Cpu(), DTypeOf<T>()).contiguous();
  const T* p = c.data<T>();
  return std::vector<T>(p, p + c.numel());
}

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_TENSOR_H_
