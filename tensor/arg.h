// TG_ARG: one named, chainable option of an options class, the shape libtorch users know
// (torch::nn::LinearOptions(in, out).bias(false), torch::optim::SGDOptions(0.1).momentum(0.9)).
// Inside a class,
//
//   TG_ARG(bool, bias) = true;
//
// declares the member bias_ (default true), the setter bias(v) returning *this (so calls chain)
// and the getter bias(). Here, below every package that has options (nn's layers, optim's
// optimizers); nn/options.h is its old name.
#ifndef TAPEGRAD_TENSOR_ARG_H_
#define TAPEGRAD_TENSOR_ARG_H_

#define TG_ARG(T, name)                     \
 public:                                    \
  auto& name(const T& new_##name) {         \
    this->name##_ = new_##name;             \
    return *this;                           \
  }                                         \
  const T& name() const { return name##_; } \
                                            \
 private:                                   \
  T name##_

#endif  // TAPEGRAD_TENSOR_ARG_H_
