#include "nn/init.h"

#include <cmath>

#include "tensor/error.h"

namespace tg {
namespace nn {
namespace init {

namespace {

const Tensor& Overwrite(const Tensor& v, const RawTensor& values) {
  TG_CHECK(v.defined(), "init: undefined variable");
  TG_CHECK(IsFloating(v.dtype()), "init: ", v.name().empty() ? "the variable" : v.name(),
           " has dtype ", DTypeName(v.dtype()), "; initialisers need a floating dtype");
  v.data().copy_(values);
  return v;
}

}  // namespace

std::pair<int64_t, int64_t> FanInAndOut(const Shape& shape) {
  TG_CHECK(shape.size() >= 2, "init: fan in/out needs a weight with at least 2 dimensions, got ",
           ShapeToString(shape));
  int64_t receptive = 1;
  for (size_t i = 2; i < shape.size(); ++i) receptive *= shape[i];
  return {shape[1] * receptive, shape[0] * receptive};
}

double Gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::kLinear:
    case Nonlinearity::kSigmoid:
      return 1.0;
    case Nonlinearity::kTanh:
      return 5.0 / 3.0;
    case Nonlinearity::kRelu:
      return std::sqrt(2.0);
    case Nonlinearity::kLeakyRelu:
      return std::sqrt(2.0 / (1.0 + param * param));
  }
  return 1.0;
}

const Tensor& Normal(const Tensor& v, Generator& gen, double mean, double stddev) {
  return Overwrite(v, RandNormal(v.shape(), gen, mean, stddev));
}

const Tensor& Uniform(const Tensor& v, Generator& gen, double low, double high) {
  return Overwrite(v, RandUniform(v.shape(), gen, low, high));
}

const Tensor& Constant(const Tensor& v, double value) {
  TG_CHECK(v.defined(), "init: undefined variable");
  v.data().fill_(value);
  return v;
}

const Tensor& Zeros(const Tensor& v) { return Constant(v, 0); }
const Tensor& Ones(const Tensor& v) { return Constant(v, 1); }

const Tensor& KaimingUniform(const Tensor& v, Generator& gen, double a, Nonlinearity nonlinearity) {
  double bound = Gain(nonlinearity, a) * std::sqrt(3.0 / FanInAndOut(v.shape()).first);
  return Uniform(v, gen, -bound, bound);
}

const Tensor& KaimingNormal(const Tensor& v, Generator& gen, double a, Nonlinearity nonlinearity) {
  double stddev = Gain(nonlinearity, a) / std::sqrt(FanInAndOut(v.shape()).first);
  return Normal(v, gen, 0, stddev);
}

const Tensor& XavierUniform(const Tensor& v, Generator& gen, double gain) {
  auto [fan_in, fan_out] = FanInAndOut(v.shape());
  double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return Uniform(v, gen, -bound, bound);
}

const Tensor& XavierNormal(const Tensor& v, Generator& gen, double gain) {
  auto [fan_in, fan_out] = FanInAndOut(v.shape());
  return Normal(v, gen, 0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)));
}

}  // namespace init
}  // namespace nn
}  // namespace tg
