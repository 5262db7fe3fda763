// libtorch's tensor indexing (torch::indexing), spelled tg::indexing: the C++ form of Python's
// x[:, 0], x[..., None], x[1:3] and x[idx].
//
//   using namespace tg::indexing;
//   tg::Tensor col = x.index({Slice(), 0});            // x[:, 0]
//   tg::Tensor last = x.index({"...", -1});            // x[..., -1]
//   tg::Tensor rows = x.index({Slice(1, None, 2)});    // x[1::2]
//   x.index_put_({Slice(), 0}, 0.0);                   // x[:, 0] = 0
//
// An integer selects (the dim goes), a Slice keeps the dim (start/stop/step, each optional and
// negative from the end), None inserts a dim of size 1, "..." (Ellipsis) stands for the dims
// not named, and one i64/i32 tensor picks entries along its dim (its shape replaces the dim).
// Everything but a tensor index gives a view of x, so index_put_ writes into x through it, and
// each recorded op gives the gradient PyTorch gives. Left out, with an error naming them: bool
// indices and masks, and more than one tensor index (PyTorch broadcasts them together).
#ifndef TAPEGRAD_AUTOGRAD_INDEXING_H_
#define TAPEGRAD_AUTOGRAD_INDEXING_H_

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "autograd/variable.h"

namespace tg {
namespace indexing {

struct NoneIndexType {};
struct EllipsisIndexType {};
inline constexpr NoneIndexType None{};
inline constexpr EllipsisIndexType Ellipsis{};

// One bound or step of a Slice: a number, or None / std::nullopt for "absent".
class SliceBound {
 public:
  SliceBound(int64_t v) : value_(v) {}                 // NOLINT: implicit, as libtorch's SymInt
  SliceBound(int v) : value_(v) {}                     // NOLINT
  SliceBound(NoneIndexType) {}                         // NOLINT
  SliceBound(std::nullopt_t) {}                        // NOLINT
  SliceBound(std::optional<int64_t> v) : value_(v) {}  // NOLINT
  const std::optional<int64_t>& value() const { return value_; }

 private:
  std::optional<int64_t> value_;
};

// Python's start:stop:step; an absent bound is the whole dim (Slice() is ':', Slice(None, None,
// 2) is '::2').
class Slice {
 public:
  Slice(SliceBound start = std::nullopt, SliceBound stop = std::nullopt,
        SliceBound step = std::nullopt)
      : start_(start.value()), stop_(stop.value()), step_(step.value()) {}
  int64_t start() const { return start_.value_or(0); }
  int64_t stop() const { return stop_.value_or(std::numeric_limits<int64_t>::max()); }
  int64_t step() const { return step_.value_or(1); }

 private:
  std::optional<int64_t> start_, stop_, step_;
};

class TensorIndex {
 public:
  enum class Kind { kNone, kEllipsis, kInteger, kBool, kSlice, kTensor };
  TensorIndex(NoneIndexType) : kind_(Kind::kNone) {}              // NOLINT: implicit, as libtorch's
  TensorIndex(EllipsisIndexType) : kind_(Kind::kEllipsis) {}      // NOLINT
  TensorIndex(const char* ellipsis);                              // NOLINT: "..." only
  TensorIndex(int64_t i) : kind_(Kind::kInteger), integer_(i) {}  // NOLINT
  TensorIndex(int i) : TensorIndex(static_cast<int64_t>(i)) {}    // NOLINT
  TensorIndex(bool b) : kind_(Kind::kBool), integer_(b) {}        // NOLINT
  TensorIndex(Slice s) : kind_(Kind::kSlice), slice_(s) {}        // NOLINT
  TensorIndex(Tensor t) : kind_(Kind::kTensor), tensor_(std::move(t)) {}  // NOLINT

  Kind kind() const { return kind_; }
  int64_t integer() const { return integer_; }
  const Slice& slice() const { return slice_; }
  const Tensor& tensor() const { return tensor_; }
  // Whether the index stands for one dim of the indexed tensor (integer, slice, tensor).
  bool ConsumesDim() const {
    return kind_ == Kind::kInteger || kind_ == Kind::kSlice || kind_ == Kind::kTensor;
  }

 private:
  Kind kind_;
  int64_t integer_ = 0;
  Slice slice_;
  Tensor tensor_;
};

}  // namespace indexing
}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_INDEXING_H_
