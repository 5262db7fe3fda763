// The elementwise ops of tensor/ops.h (Binary, BinaryScalar, Compare, Unary, Where) and the
// dropout mask: validation, promotion and broadcasting, then the device's kernel.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tensor/composed.h"
#include "tensor/kernel_table.h"
#include "tensor/ops.h"
#include "tensor/ops_internal.h"

namespace tg {

using ops_internal::CheckDefined;
using ops_internal::CheckFloating;
using ops_internal::CommonDevice;
using ops_internal::Declined;
using ops_internal::IndicesI64;

namespace {

bool IsFloatingOnly(UnaryOp op) {
  return op != UnaryOp::kNeg && op != UnaryOp::kAbs && op != UnaryOp::kRelu;
}

}  // namespace

RawTensor Binary(BinaryOp op, const RawTensor& a, const RawTensor& b) {
  const char* name = BinaryOpName(op);
  CheckDefined(name, a, "the first input");
  CheckDefined(name, b, "the second input");
  const Device device = CommonDevice(name, {&a, &b});
  const DType dtype = PromoteTypes(a.dtype(), b.dtype());
  TG_CHECK(dtype != kBool, name, ": not defined for bool tensors; cast them first");
  if (IsFloat8(dtype)) throw Error(Float8NotComputedMessage(name, dtype));
  if (op == BinaryOp::kDiv || op == BinaryOp::kPow || op == BinaryOp::kGeluTanhBackward) {
    TG_CHECK(IsFloating(dtype), name, ": expected floating inputs, got ", DTypeName(a.dtype()),
             " and ", DTypeName(b.dtype()), "; cast them first");
  }
  RawTensor out = RawTensor::Empty(BroadcastShapes(name, a.shape(), b.shape()), dtype, device);
  KernelsFor(device).Binary(op, out, a.to(dtype), b.to(dtype));
  return out;
}

RawTensor BinaryScalar(BinaryOp op, const RawTensor& x, double scalar) {
  const char* name = BinaryOpName(op);
  CheckDefined(name, x, "the input");
  const Device device = CommonDevice(name, {&x});
  TG_CHECK(x.dtype() != kBool, name, ": not defined for bool tensors; cast them first");
  if (IsFloat8(x.dtype())) throw Error(Float8NotComputedMessage(name, x.dtype()));
  if (IsIntegral(x.dtype())) {
    TG_CHECK(op != BinaryOp::kDiv && op != BinaryOp::kPow && op != BinaryOp::kGeluTanhBackward,
             name,
             ": expected a floating tensor, got ", DTypeName(x.dtype()), "; cast it first");
    TG_CHECK(std::trunc(scalar) == scalar && std::abs(scalar) < 9.2e18, name, ": scalar ", scalar,
             " is not an integer, and the tensor is ", DTypeName(x.dtype()), "; cast it first");
  }
  RawTensor out = RawTensor::Empty(x.shape(), x.dtype(), device);
  KernelsFor(device).BinaryScalar(op, out, x, scalar);
  return out;
}

RawTensor Compare(CompareOp op, const RawTensor& a, const RawTensor& b) {
  const char* name = CompareOpName(op);
  CheckDefined(name, a, "the first input");
  CheckDefined(name, b, "the second input");
  const Device device = CommonDevice(name, {&a, &b});
  const DType dtype = PromoteTypes(a.dtype(), b.dtype());
  RawTensor out = RawTensor::Empty(BroadcastShapes(name, a.shape(), b.shape()), kBool, device);
  KernelsFor(device).Compare(op, out, a.to(dtype), b.to(dtype));
  return out;
}

RawTensor Unary(UnaryOp op, const RawTensor& x) {
  const char* name = UnaryOpName(op);
  CheckDefined(name, x, "the input");
  const Device device = CommonDevice(name, {&x});
  if (IsFloat8(x.dtype())) throw Error(Float8NotComputedMessage(name, x.dtype()));
  if (IsFloatingOnly(op)) CheckFloating(name, x.dtype());
  TG_CHECK(x.dtype() != kBool, name, ": not defined for bool tensors; cast them first");
  RawTensor out = RawTensor::Empty(x.shape(), x.dtype(), device);
  KernelsFor(device).Unary(op, out, x);
  return out;
}

RawTensor Where(const RawTensor& cond, const RawTensor& a, const RawTensor& b) {
  CheckDefined("where", cond, "the condition");
  CheckDefined("where", a, "the first input");
  CheckDefined("where", b, "the second input");
  const Device device = CommonDevice("where", {&cond, &a, &b});
  TG_CHECK(cond.dtype() == kBool || cond.dtype() == kU8,
           "where: the condition must be bool or u8, got ", DTypeName(cond.dtype()));
  const DType dtype = PromoteTypes(a.dtype(), b.dtype());
  const Shape shape =
      BroadcastShapes("where", cond.shape(), BroadcastShapes("where", a.shape(), b.shape()));
  RawTensor out = RawTensor::Empty(shape, dtype, device);
  KernelsFor(device).Where(out, cond, a.to(dtype), b.to(dtype));
  return out;
}

RawTensor DropoutMask(const Shape& shape, double p, Generator& gen, DType dtype, Device device) {
  TG_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1), got ", p);
  CheckFloating("dropout", dtype);
  RawTensor out = RawTensor::Empty(shape, dtype, device);
  const Generator::State start = gen.Reserve(static_cast<uint64_t>(out.numel()));
  KernelsFor(device).DropoutMask(out, start.seed, start.offset, p);
  return out;
}

}  // namespace tg
