#include "nn/rotary.h"

#include <cmath>
#include <vector>

#include "autograd/ops.h"
#include "tensor/error.h"

namespace tg::nn {
namespace {

// One f32 operation's result: every step below rounds to f32 where transformers' f32 tensor
// arithmetic does (a Python float operand is rounded to f32 first).
float F(double v) { return static_cast<float>(v); }

}  // namespace

RawTensor RopeInverseFrequencies(int64_t head_dim, const RopeConfig& c) {
  TG_CHECK(head_dim > 0 && head_dim % 2 == 0,
           "rotary embedding: head_dim must be positive and "
           "even, got ",
           head_dim);
  TG_CHECK(std::isfinite(c.theta) && c.theta > 1,
           "rotary embedding: rope_theta must be a finite "
           "number above 1, got ",
           c.theta);
  const bool llama3 = c.scaling == RopeScaling::kLlama3;
  if (llama3) {
    TG_CHECK(std::isfinite(c.factor) && c.factor >= 1,
             "rotary embedding: rope_scaling factor "
             "must be at least 1, got ",
             c.factor);
    TG_CHECK(std::isfinite(c.high_freq_factor) && c.low_freq_factor > 0 &&
                 c.low_freq_factor < c.high_freq_factor,
             "rotary embedding: rope_scaling needs 0 < low_freq_factor < high_freq_factor, got ",
             c.low_freq_factor, " and ", c.high_freq_factor);
    TG_CHECK(c.original_max_position_embeddings >= 1,
             "rotary embedding: rope_scaling "
             "original_max_position_embeddings must be at least 1, got ",
             c.original_max_position_embeddings);
  }
  const float base = F(c.theta), factor = F(c.factor);
  const float low_wavelen =
      F(static_cast<double>(c.original_max_position_embeddings) / c.low_freq_factor);
  const float high_wavelen =
      F(static_cast<double>(c.original_max_position_embeddings) / c.high_freq_factor);
  const float old_len = F(static_cast<double>(c.original_max_position_embeddings));
  const float low = F(c.low_freq_factor), span = F(c.high_freq_factor - c.low_freq_factor);
  const float two_pi = F(2 * M_PI);
  std::vector<float> out;
  for (int64_t j = 0; j < head_dim; j += 2) {
    const float exponent = F(static_cast<float>(j) / static_cast<float>(head_dim));
    const float power = F(std::pow(static_cast<double>(base), static_cast<double>(exponent)));
    const float inv = F(1.0f / power);  // 1.0 / tensor: the reciprocal, times 1
    if (!llama3) {
      out.push_back(inv);
      continue;
    }
    const float wavelen = F(F(1.0f / inv) * two_pi);  // 2 pi / tensor: reciprocal times 2 pi
    const float scaled = wavelen > low_wavelen ? F(inv / factor) : inv;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    if (!medium) {
      out.push_back(scaled);
      continue;
    }
    const float smooth = F(F(F(F(1.0f / wavelen) * old_len) - low) / span);
    const float blended = F(F(F(F(1.0f - smooth) * scaled) / factor) + F(smooth * scaled));
    out.push_back(blended);
  }
  return RawTensor::FromVector(out, {head_dim / 2});
}

RopeTables RopeCosSin(const RawTensor& inv_freq, int64_t seq_len, DType dtype) {
  TG_CHECK(inv_freq.dim() == 1 && inv_freq.dtype() == kF32,
           "rotary embedding: inv_freq must be "
           "f32 [head_dim / 2], got ",
           DTypeName(inv_freq.dtype()), " ", ShapeToString(inv_freq.shape()));
  TG_CHECK(seq_len >= 0, "rotary embedding: seq_len must be >= 0, got ", seq_len);
  const std::vector<float> inv = inv_freq.to(Device::Cpu()).to_vector<float>();
  const int64_t half = static_cast<int64_t>(inv.size()), dim = 2 * half;
  std::vector<float> cos(static_cast<size_t>(seq_len * dim)), sin(cos.size());
  for (int64_t t = 0; t < seq_len; ++t) {
    for (int64_t j = 0; j < half; ++j) {
      const float angle = F(static_cast<float>(t) * inv[j]);
      const float c = F(std::cos(static_cast<double>(angle)));
      const float s = F(std::sin(static_cast<double>(angle)));
      for (int64_t k : {j, j + half}) {
        cos[t * dim + k] = c;
        sin[t * dim + k] = s;
      }
    }
  }
  return {RawTensor::FromVector(cos, {seq_len, dim}).to(dtype),
          RawTensor::FromVector(sin, {seq_len, dim}).to(dtype)};
}

Tensor RotateHalf(const Tensor& x) {
  TG_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, "rotate_half: the last dim must be even, got ",
           ShapeToString(x.shape()));
  const int64_t half = x.size(-1) / 2;
  return Cat({Neg(Narrow(x, -1, half, half)), Narrow(x, -1, 0, half)}, -1);
}

Tensor ApplyRotary(const Tensor& x, const RopeTables& tables) {
  TG_CHECK(x.dim() >= 2, "rotary embedding: expected x [..., T, head_dim], got ",
           ShapeToString(x.shape()));
  const Shape want = {x.size(-2), x.size(-1)};
  TG_CHECK(tables.cos.shape() == want && tables.sin.shape() == want,
           "rotary embedding: cos and "
           "sin are ",
           ShapeToString(tables.cos.shape()), " and ", ShapeToString(tables.sin.shape()),
           ", x needs ", ShapeToString(want));
  const Device device = x.data().device();
  // One op (a kernel forward and backward where the device has it) with the bits of
  // Add(Mul(x, cos), Mul(RotateHalf(x), sin)).
  return ::tg::RotaryEmbedding(x, tables.cos.to(device, x.dtype()),
                               tables.sin.to(device, x.dtype()));
}

}  // namespace tg::nn
