// Parameter initialisation, in place and seeded from a tg::Generator (so a model built twice from
// the same seed is bit-identical). The formulas are PyTorch's torch.nn.init.
//
//   tg::Generator gen(0);
//   tg::nn::init::KaimingUniform(linear->weight, gen, /*a=*/std::sqrt(5.0));
//   tg::nn::init::Zeros(linear->bias);
#ifndef TAPEGRAD_NN_INIT_H_
#define TAPEGRAD_NN_INIT_H_

#include <cstdint>
#include <utility>

#include "autograd/variable.h"
#include "tensor/generator.h"

namespace tg {
namespace nn {
namespace init {

enum class Nonlinearity { kLinear, kRelu, kLeakyRelu, kTanh, kSigmoid };

// (fan_in, fan_out) of a weight: [out, in] for Linear, [out, in, kh, kw] for Conv2d (times the
// receptive field). Throws for fewer than 2 dimensions.
std::pair<int64_t, int64_t> FanInAndOut(const Shape& shape);
// PyTorch's calculate_gain (`param` is the negative slope of leaky relu).
double Gain(Nonlinearity nonlinearity, double param = 0.01);

// Each overwrites the variable's data (any floating dtype; drawn in f32 and rounded) and returns
// it. They do not record on the tape.
const Tensor& Normal(const Tensor& v, Generator& gen, double mean = 0, double stddev = 1);
const Tensor& Uniform(const Tensor& v, Generator& gen, double low = 0, double high = 1);
const Tensor& Constant(const Tensor& v, double value);
const Tensor& Zeros(const Tensor& v);
const Tensor& Ones(const Tensor& v);
// U(-b, b) with b = gain * sqrt(3 / fan_in), gain = Gain(nonlinearity, a) (fan_in mode).
const Tensor& KaimingUniform(const Tensor& v, Generator& gen, double a = 0,
                             Nonlinearity nonlinearity = Nonlinearity::kLeakyRelu);
// N(0, std) with std = gain / sqrt(fan_in).
const Tensor& KaimingNormal(const Tensor& v, Generator& gen, double a = 0,
                            Nonlinearity nonlinearity = Nonlinearity::kLeakyRelu);
// U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)).
const Tensor& XavierUniform(const Tensor& v, Generator& gen, double gain = 1);
// N(0, std) with std = gain * sqrt(2 / (fan_in + fan_out)).
const Tensor& XavierNormal(const Tensor& v, Generator& gen, double gain = 1);

}  // namespace init
}  // namespace nn
}  // namespace tg

#endif  // TAPEGRAD_NN_INIT_H_
