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

#include "tensor/arg.h"

#endif  // TAPEGRAD_NN_OPTIONS_H_
