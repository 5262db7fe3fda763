// TG_ARG: one named, chainable option of a layer's options class, the shape libtorch users know
// (torch::nn::LinearOptions(in, out).bias(false)). Inside a class,
//
//   TG_ARG(bool, bias) = true;
//
// declares the member bias_ (default true), the setter bias(v) returning *this (so calls chain)
// and the getter bias(). Layers keep their Options and read them through the getters; the
// Generator a layer draws its initial values from stays a separate constructor argument (it is
// state the caller owns and checkpoints, not an option).
#ifndef TAPEGRAD_NN_OPTIONS_H_
#define TAPEGRAD_NN_OPTIONS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "tensor/arg.h"
#include "tensor/error.h"

namespace tg {

// D sizes given as one number for all of them or as D numbers, as libtorch's
// torch::ExpandingArray: Conv2dOptions(1, 10, 5) and Conv2dOptions(1, 10, {5, 3}) both work.
template <size_t D>
class ExpandingArray {
 public:
  ExpandingArray(int64_t all) { values_.fill(all); }       // NOLINT: implicit, as libtorch's
  ExpandingArray(std::initializer_list<int64_t> values) {  // NOLINT
    TG_CHECK(values.size() == D, "expected ", D, " sizes, got ", values.size());
    size_t i = 0;
    for (int64_t v : values) values_[i++] = v;
  }
  ExpandingArray(const std::array<int64_t, D>& values) : values_(values) {}  // NOLINT
  int64_t operator[](size_t i) const { return values_[i]; }
  int64_t& operator[](size_t i) { return values_[i]; }
  static constexpr size_t size() { return D; }
  const int64_t* data() const { return values_.data(); }
  const std::array<int64_t, D>& value() const { return values_; }
  operator std::array<int64_t, D>() const { return values_; }  // NOLINT
  bool operator==(const ExpandingArray& o) const { return values_ == o.values_; }

 private:
  std::array<int64_t, D> values_;
};

}  // namespace tg

#endif  // TAPEGRAD_NN_OPTIONS_H_
