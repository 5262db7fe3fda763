#include "tensor/op_kinds.h"

namespace tg {

const char* BinaryOpName(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return "add";
    case BinaryOp::kSub:
      return "sub";
    case BinaryOp::kMul:
      return "mul";
    case BinaryOp::kDiv:
      return "div";
    case BinaryOp::kPow:
      return "pow";
    case BinaryOp::kMaximum:
      return "maximum";
    case BinaryOp::kMinimum:
      return "minimum";
    case BinaryOp::kReluBackward:
      return "relu_backward";
    case BinaryOp::kGeluTanhBackward:
      return "gelu_tanh_backward";
  }
  return "binary";
}

const char* CompareOpName(CompareOp op) {
  switch (op) {
    case CompareOp::kEq:
      return "eq";
    case CompareOp::kNe:
      return "ne";
    case CompareOp::kLt:
      return "lt";
    case CompareOp::kLe:
      return "le";
    case CompareOp::kGt:
      return "gt";
    case CompareOp::kGe:
      return "ge";
  }
  return "compare";
}

const char* UnaryOpName(UnaryOp op) {
  switch (op) {
    case UnaryOp::kNeg:
      return "neg";
    case UnaryOp::kAbs:
      return "abs";
    case UnaryOp::kExp:
      return "exp";
    case UnaryOp::kLog:
      return "log";
    case UnaryOp::kSqrt:
      return "sqrt";
    case UnaryOp::kTanh:
      return "tanh";
    case UnaryOp::kSigmoid:
      return "sigmoid";
    case UnaryOp::kRelu:
      return "relu";
    case UnaryOp::kGeluTanh:
      return "gelu_tanh";
    case UnaryOp::kGelu:
      return "gelu";
    case UnaryOp::kErf:
      return "erf";
    case UnaryOp::kSilu:
      return "silu";
  }
  return "unary";
}

}  // namespace tg
