// The methods and operators of tg::Tensor (declared in autograd/variable.h), each the recorded
// op of autograd/ops.h that computes it: a method records history exactly when the op does, so
// `x.relu()` and `tg::relu(x)` and `Relu(x)` are one function. Scalar operands follow PyTorch:
// a Python-number-like double is kept in the op's compute precision (f32 for f16/bf16) and the
// result keeps the tensor's dtype.
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "autograd/variable.h"
#include "tensor/error.h"
#include "tensor/print.h"

namespace tg {
namespace {

Shape ToShape(IntArrayRef dims) { return Shape(dims.begin(), dims.end()); }

// A 0-d constant for an op between `x` and a scalar: in x's compute precision (f64 for f64, f32
// for f16/bf16/f32), on x's device. Integer and bool tensors take an f32 scalar.
Tensor ScalarOperand(const Tensor& x, double s) {
  const DType dtype = x.dtype() == kF64 ? kF64 : kF32;
  return Tensor(RawTensor::Scalar(s, dtype).to(x.device()));
}

// The result of an op computed in a wider type, back in x's dtype (floating x only).
Tensor InDTypeOf(const Tensor& x, const Tensor& result) {
  return result.dtype() == x.dtype() || !IsFloating(x.dtype()) ? result : Cast(result, x.dtype());
}

// A 0-d constant in x's own dtype: comparisons compare in the common dtype, which for a tensor
// and a number is the tensor's (PyTorch's result_type), a float number against an integer
// tensor making it f32.
RawTensor CompareOperand(const Tensor& x, double s) {
  const bool integral_number = std::floor(s) == s;
  const DType dtype = IsFloating(x.dtype()) || integral_number ? x.dtype() : kF32;
  return RawTensor::Scalar(s, dtype).to(x.device());
}

RawTensor AsCompareInput(const Tensor& x, double s) {
  const bool integral_number = std::floor(s) == s;
  return IsFloating(x.dtype()) || integral_number ? x.data() : x.data().to(kF32);
}

// Softmax and log-softmax over `dim`: over the last dim directly, else with dim moved last and
// back (transposes are views; the op's gradient flows through them).
template <typename F>
Tensor OverDim(const Tensor& x, int64_t dim, const char* op, F f) {
  const int64_t d = WrapDim(op, dim, std::max<int64_t>(x.dim(), 1));
  if (x.dim() == 0) return f(x.reshape({1})).reshape({});
  if (d == x.dim() - 1) return f(x);
  return f(x.transpose(d, -1)).transpose(d, -1);
}

}  // namespace

// ---- Shapes and views
// ----------------------------------------------------------------------------

Tensor Tensor::view(IntArrayRef shape) const {
  data().view(ToShape(shape));  // throws when the strides do not allow a view (never copies)
  return Reshape(*this, ToShape(shape));
}
Tensor Tensor::reshape(IntArrayRef shape) const { return Reshape(*this, ToShape(shape)); }
Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  const int64_t s = WrapDim("flatten", start_dim, dim()), e = WrapDim("flatten", end_dim, dim());
  TG_CHECK(s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape out;
  for (int64_t d = 0; d < s; ++d) out.push_back(size(d));
  int64_t joined = 1;
  for (int64_t d = s; d <= e; ++d) joined *= size(d);
  out.push_back(joined);
  for (int64_t d = e + 1; d < dim(); ++d) out.push_back(size(d));
  return Reshape(*this, out);
}
Tensor Tensor::unsqueeze(int64_t d) const { return Unsqueeze(*this, d); }
Tensor Tensor::squeeze() const {
  Shape out;
  for (int64_t s : shape()) {
    if (s != 1) out.push_back(s);
  }
  return out.size() == shape().size() ? *this : Reshape(*this, out);
}
Tensor Tensor::squeeze(int64_t d) const { return Squeeze(*this, d); }
Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const { return Transpose(*this, dim0, dim1); }
Tensor Tensor::t() const {
  TG_CHECK(dim() <= 2, "t: expects a tensor with at most 2 dims, got ", dim());
  return dim() < 2 ? *this : Transpose(*this, 0, 1);
}
Tensor Tensor::permute(IntArrayRef dims) const { return Permute(*this, ToShape(dims)); }
Tensor Tensor::expand(IntArrayRef shape) const { return Expand(*this, ToShape(shape)); }
Tensor Tensor::contiguous() const { return data().is_contiguous() ? *this : clone(); }
Tensor Tensor::select(int64_t d, int64_t index) const { return Select(*this, d, index); }
Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  return Slice(*this, d, start, end, step);
}
Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  return Narrow(*this, d, start, length);
}
Tensor Tensor::operator[](int64_t index) const { return Select(*this, 0, index); }

// ---- Reductions
// ----------------------------------------------------------------------------------

Tensor Tensor::sum() const { return Sum(*this); }
Tensor Tensor::sum(int64_t d, bool keepdim) const { return Sum(*this, {d}, keepdim); }
Tensor Tensor::sum(IntArrayRef dims, bool keepdim) const {
  return Sum(*this, std::vector<int64_t>(dims.begin(), dims.end()), keepdim);
}
Tensor Tensor::mean() const { return Mean(*this); }
Tensor Tensor::mean(int64_t d, bool keepdim) const { return Mean(*this, {d}, keepdim); }
Tensor Tensor::mean(IntArrayRef dims, bool keepdim) const {
  return Mean(*this, std::vector<int64_t>(dims.begin(), dims.end()), keepdim);
}
Tensor Tensor::max() const {
  TG_CHECK(numel() > 0, "max: an empty tensor has no maximum; give a dim");
  return Max(Reshape(*this, {numel()}), 0);
}
std::tuple<Tensor, Tensor> Tensor::max(int64_t d, bool keepdim) const {
  return {Max(*this, d, keepdim), Tensor(Argmax(data(), d, keepdim))};
}
Tensor Tensor::min() const { return Neg(Neg(*this).max()); }
std::tuple<Tensor, Tensor> Tensor::min(int64_t d, bool keepdim) const {
  const Tensor negated = Neg(*this);
  return {Neg(Max(negated, d, keepdim)), Tensor(Argmax(negated.data(), d, keepdim))};
}
Tensor Tensor::argmax() const { return Tensor(Argmax(data().reshape({numel()}), 0)); }
Tensor Tensor::argmax(int64_t d, bool keepdim) const { return Tensor(Argmax(data(), d, keepdim)); }
Tensor Tensor::argmin() const { return Tensor(Argmax(tg::Neg(data()).reshape({numel()}), 0)); }
Tensor Tensor::argmin(int64_t d, bool keepdim) const {
  return Tensor(Argmax(tg::Neg(data()), d, keepdim));
}
Tensor Tensor::all() const {
  return Tensor(tg::Eq(tg::Sum(tg::Eq(data(), RawTensor::Scalar(0, dtype()).to(device()))),
                       RawTensor::Scalar(0, kI64).to(device())));
}
Tensor Tensor::any() const {
  return Tensor(tg::Gt(tg::Sum(tg::Ne(data(), RawTensor::Scalar(0, dtype()).to(device()))),
                       RawTensor::Scalar(0, kI64).to(device())));
}
Tensor Tensor::norm() const { return Sqrt(Sum(Mul(*this, *this))); }

// ---- Elementwise
// ---------------------------------------------------------------------------------

Tensor Tensor::pow(double exponent) const { return Pow(*this, exponent); }
Tensor Tensor::pow(const Tensor& exponent) const { return Pow(*this, exponent); }
Tensor Tensor::sqrt() const { return Sqrt(*this); }
Tensor Tensor::exp() const { return Exp(*this); }
Tensor Tensor::log() const { return Log(*this); }
Tensor Tensor::abs() const { return Abs(*this); }
Tensor Tensor::neg() const { return Neg(*this); }
Tensor Tensor::relu() const { return Relu(*this); }
Tensor Tensor::sigmoid() const { return Sigmoid(*this); }
Tensor Tensor::tanh() const { return Tanh(*this); }
Tensor Tensor::softmax(int64_t d) const {
  return OverDim(*this, d, "softmax", [](const Tensor& x) { return Softmax(x); });
}
Tensor Tensor::log_softmax(int64_t d) const {
  return OverDim(*this, d, "log_softmax", [](const Tensor& x) { return LogSoftmax(x); });
}
Tensor Tensor::mm(const Tensor& other) const {
  TG_CHECK(dim() == 2 && other.dim() == 2, "mm: expects two matrices, got ", ShapeToString(shape()),
           " and ", ShapeToString(other.shape()));
  return Matmul(*this, other);
}
Tensor Tensor::matmul(const Tensor& other) const { return Matmul(*this, other); }
Tensor Tensor::clamp(std::optional<double> min, std::optional<double> max) const {
  TG_CHECK(min.has_value() || max.has_value(), "clamp: give at least one of min and max");
  // Where(x < min, min, x) then the same for max: the gradient passes where x is inside, as
  // torch.clamp's (x equal to a bound keeps its gradient).
  Tensor out = *this;
  if (min.has_value()) {
    out = Where(tg::Lt(out.data(), CompareOperand(out, *min)),
                Tensor(RawTensor::Full(shape(), *min, dtype(), device())), out);
  }
  if (max.has_value()) {
    out = Where(tg::Gt(out.data(), CompareOperand(out, *max)),
                Tensor(RawTensor::Full(shape(), *max, dtype(), device())), out);
  }
  return out;
}
Tensor Tensor::clamp_min(double min) const { return clamp(min, std::nullopt); }
Tensor Tensor::clamp_max(double max) const { return clamp(std::nullopt, max); }
Tensor Tensor::masked_fill(const Tensor& mask, double value) const {
  TG_CHECK(mask.dtype() == kBool, "masked_fill: the mask must be bool, got ",
           DTypeName(mask.dtype()));
  return Where(mask.data(), Tensor(RawTensor::Full({}, value, dtype(), device())), *this);
}
Tensor Tensor::to(DType dtype) const { return Cast(*this, dtype); }
Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  // A copy across devices, differentiable: its gradient is copied back.
  const Device from = this->device();
  return Record(
      "ToCopyBackward0", data().to(device), {*this}, {},
      [from](const BackwardContext& ctx) -> VariableList { return {ctx.grads[0].to(from)}; });
}
Tensor Tensor::to(Device device, DType dtype) const { return to(device).to(dtype); }
Tensor Tensor::clone() const {
  return Record("CloneBackward0", data().clone(), {*this}, {},
                [](const BackwardContext& ctx) -> VariableList { return {ctx.grads[0]}; });
}

Tensor Tensor::eq(const Tensor& other) const { return Tensor(tg::Eq(data(), other.data())); }
Tensor Tensor::ne(const Tensor& other) const { return Tensor(tg::Ne(data(), other.data())); }
Tensor Tensor::lt(const Tensor& other) const { return Tensor(tg::Lt(data(), other.data())); }
Tensor Tensor::le(const Tensor& other) const { return Tensor(tg::Le(data(), other.data())); }
Tensor Tensor::gt(const Tensor& other) const { return Tensor(tg::Gt(data(), other.data())); }
Tensor Tensor::ge(const Tensor& other) const { return Tensor(tg::Ge(data(), other.data())); }
Tensor Tensor::eq(double s) const {
  return Tensor(tg::Eq(AsCompareInput(*this, s), CompareOperand(*this, s)));
}
Tensor Tensor::ne(double s) const {
  return Tensor(tg::Ne(AsCompareInput(*this, s), CompareOperand(*this, s)));
}
Tensor Tensor::lt(double s) const {
  return Tensor(tg::Lt(AsCompareInput(*this, s), CompareOperand(*this, s)));
}
Tensor Tensor::le(double s) const {
  return Tensor(tg::Le(AsCompareInput(*this, s), CompareOperand(*this, s)));
}
Tensor Tensor::gt(double s) const {
  return Tensor(tg::Gt(AsCompareInput(*this, s), CompareOperand(*this, s)));
}
Tensor Tensor::ge(double s) const {
  return Tensor(tg::Ge(AsCompareInput(*this, s), CompareOperand(*this, s)));
}

// ---- Arithmetic
// ----------------------------------------------------------------------------------

Tensor Tensor::add(const Tensor& other, double alpha) const {
  return alpha == 1 ? Add(*this, other) : Add(*this, MulScalar(other, alpha));
}
Tensor Tensor::sub(const Tensor& other, double alpha) const {
  return alpha == 1 ? Sub(*this, other) : Sub(*this, MulScalar(other, alpha));
}
Tensor Tensor::mul(const Tensor& other) const { return Mul(*this, other); }
Tensor Tensor::div(const Tensor& other) const { return Div(*this, other); }

Tensor operator+(const Tensor& x, double s) { return AddScalar(x, s); }
Tensor operator+(double s, const Tensor& x) { return AddScalar(x, s); }
Tensor operator-(const Tensor& x, double s) { return AddScalar(x, -s); }
Tensor operator-(double s, const Tensor& x) { return AddScalar(Neg(x), s); }
Tensor operator*(const Tensor& x, double s) { return MulScalar(x, s); }
Tensor operator*(double s, const Tensor& x) { return MulScalar(x, s); }
Tensor operator/(const Tensor& x, double s) { return InDTypeOf(x, Div(x, ScalarOperand(x, s))); }
Tensor operator/(double s, const Tensor& x) { return InDTypeOf(x, Div(ScalarOperand(x, s), x)); }

// In place: the recorded in-place ops of autograd/ops/inplace.cc (version counter bumped, the
// history rewritten), refused on a leaf that requires grad outside no-grad, as in PyTorch.
const Tensor& Tensor::add_(const Tensor& other, double alpha) const {
  return AddInPlace(*this, alpha == 1 ? other : MulScalar(other, alpha));
}
const Tensor& Tensor::add_(double s) const { return AddInPlace(*this, ScalarOperand(*this, s)); }
const Tensor& Tensor::sub_(const Tensor& other, double alpha) const {
  return AddInPlace(*this, MulScalar(other, -alpha));
}
const Tensor& Tensor::sub_(double s) const { return AddInPlace(*this, ScalarOperand(*this, -s)); }
const Tensor& Tensor::mul_(const Tensor& other) const { return MulInPlace(*this, other); }
const Tensor& Tensor::mul_(double s) const { return MulScalarInPlace(*this, s); }
const Tensor& Tensor::div_(const Tensor& other) const {
  return CopyInPlace(*this, Div(*this, other));
}
const Tensor& Tensor::div_(double s) const { return CopyInPlace(*this, *this / s); }
const Tensor& Tensor::zero_() const { return FillInPlace(*this, 0); }
const Tensor& Tensor::fill_(double value) const { return FillInPlace(*this, value); }
const Tensor& Tensor::operator+=(const Tensor& other) const { return add_(other); }
const Tensor& Tensor::operator+=(double s) const { return add_(s); }
const Tensor& Tensor::operator-=(const Tensor& other) const { return sub_(other); }
const Tensor& Tensor::operator-=(double s) const { return sub_(s); }
const Tensor& Tensor::operator*=(const Tensor& other) const { return mul_(other); }
const Tensor& Tensor::operator*=(double s) const { return mul_(s); }
const Tensor& Tensor::operator/=(const Tensor& other) const { return div_(other); }
const Tensor& Tensor::operator/=(double s) const { return div_(s); }

std::ostream& operator<<(std::ostream& out, const Tensor& t) {
  return PrintLikeLibtorch(out, t.defined() ? t.data() : RawTensor());
}

}  // namespace tg
