// Rotary position embeddings as transformers' Llama applies them (modeling_llama.py:
// LlamaRotaryEmbedding, rotate_half, apply_rotary_pos_emb; modeling_rope_utils.py for the
// inverse frequencies), for the Llama-family models:
//
//   tg::nn::RopeConfig rope;                       // config.json's rope_theta, rope_scaling
//   rope.theta = 500000;
//   rope.scaling = tg::nn::RopeScaling::kLlama3;   // factor 8, low 1, high 4, original 8192
//   const tg::RawTensor inv_freq = tg::nn::RopeInverseFrequencies(head_dim, rope);
//   const tg::nn::RopeTables t = tg::nn::RopeCosSin(inv_freq, /*seq_len=*/T, q.dtype());
//   q = tg::nn::ApplyRotary(q, t);                 // q [B, H, T, head_dim]; k likewise
//
// The layout is rotate_half's (the two halves of head_dim rotate together: dimension i pairs
// with i + head_dim / 2), not the interleaved pairs of the original RoPE paper.
#ifndef TAPEGRAD_NN_ROTARY_H_
#define TAPEGRAD_NN_ROTARY_H_

#include <cstdint>

#include "autograd/variable.h"
#include "tensor/tensor.h"

namespace tg::nn {

// config.json's rope_scaling: absent or "default", or "llama3" (Llama 3.1 and later).
enum class RopeScaling { kDefault, kLlama3 };

struct RopeConfig {
  double theta = 10000.0;  // rope_theta
  RopeScaling scaling = RopeScaling::kDefault;
  // rope_scaling's "llama3" fields (Llama 3.1's values).
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// inv_freq[j] = 1 / theta^(2j / head_dim), j < head_dim / 2, f32 [head_dim / 2], computed in
// f32 as transformers does; "llama3" then divides the low frequencies (wavelength 2 pi / inv_freq
// above original / low_freq_factor) by factor, keeps the high ones (below original /
// high_freq_factor) and blends between. Throws tg::Error for an odd or non-positive head_dim, a
// theta <= 1, or llama3 fields out of range (factor >= 1, 0 < low < high, original >= 1).
RawTensor RopeInverseFrequencies(int64_t head_dim, const RopeConfig& config);

// cos and sin of positions 0..seq_len-1 times inv_freq, each [seq_len, head_dim] (the half
// repeated, as torch.cat((freqs, freqs), -1)): the angles in f32 (position times inv_freq, one
// f32 product), cos and sin in double rounded to f32, then to `dtype` (the activations').
struct RopeTables {
  RawTensor cos, sin;
};
RopeTables RopeCosSin(const RawTensor& inv_freq, int64_t seq_len, DType dtype);

// cat(-x[..., d/2:], x[..., :d/2]) over the last dim (differentiable).
Tensor RotateHalf(const Tensor& x);
// x * cos + RotateHalf(x) * sin for x [..., T, head_dim] (cos and sin [T, head_dim] broadcast
// over the leading dims, moved to x's device), in x's dtype, each product and the sum rounded
// as torch's ops round them (differentiable in x): one op, tg::RotaryEmbedding.
Tensor ApplyRotary(const Tensor& x, const RopeTables& tables);

}  // namespace tg::nn

#endif  // TAPEGRAD_NN_ROTARY_H_
