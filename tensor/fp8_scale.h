// The FP8 scale rule and the tiling of block scaling, written once for the host (the recipes of
// amp/fp8_recipe.h) and the kernels of every device (Fp8Scale, Fp8Amax, Fp8Cast, Fp8Gemm of the
// kernel list), as tensor/loss_scale_update.h does for the loss scale.
//
//   Fp8ScaleOptions o;  o.fp8_max = 448;                 // E4M3
//   float scale = Fp8ScaleFromAmax(3.5f, o);             // 128: x * 128 fills E4M3's range
//
// Transformer Engine's compute_scale_from_amax (common/recipe/recipe_common.cuh), the rule of its
// current and block scaling: amax = max(amax, amax_epsilon) (a NaN amax stays NaN); an amax that
// is inf, 0 or NaN gives scale 1; else scale = fp8_max / amax in one f32 division, an inf
// quotient becomes value_for_inf, and with force_pow_2_scales the scale's mantissa is cleared (the
// largest power of two not above it; a subnormal scale becomes 0, as in TE).
//
// Tiling: a scale (and an amax) covers a tile of a 2-D tensor [rows, cols]: the whole tensor
// (per-tensor scaling, a grid [1, 1]), or tiles of 1x128 (activations and gradients) or 128x128
// (weights: DeepSeek-V3's and TE's block scaling), the edge tiles covering what remains. The
// grid of scales is [ceil(rows / tile rows), ceil(cols / tile cols)], row-major, f32.
#ifndef TAPEGRAD_TENSOR_FP8_SCALE_H_
#define TAPEGRAD_TENSOR_FP8_SCALE_H_

#include <cstdint>
#include <cstring>
#include <limits>

#include "tensor/host_device.h"

namespace tg {

struct Fp8ScaleOptions {
  float fp8_max = 448.0f;           // the format's largest finite value (E4M3 448, E5M2 57344)
  float amax_epsilon = 0.0f;        // >= 0, finite: amaxes below it count as it
  bool force_pow_2_scales = false;  // round scales down to a power of two
  // What an f32-overflowing scale becomes: the largest finite value of the input's type.
  float value_for_inf = std::numeric_limits<float>::max();
};

TG_HOST_DEVICE inline float Fp8ScaleFromAmax(float amax, const Fp8ScaleOptions& o) {
  if (amax < o.amax_epsilon) amax = o.amax_epsilon;  // NaN compares false and stays NaN
  // inf, 0 and NaN (x - x is NaN for inf and NaN) give 1.
  if (amax == 0.0f || !(amax - amax == 0.0f)) return 1.0f;
  float scale = o.fp8_max / amax;
  if (scale - scale != 0.0f) scale = o.value_for_inf;  // inf (amax finite, so no NaN)
  if (o.force_pow_2_scales) {
    uint32_t bits;
    memcpy(&bits, &scale, sizeof bits);
    bits &= 0xFF800000u;  // sign and exponent
    memcpy(&scale, &bits, sizeof bits);
  }
  return scale;
}

// How the scales of one tensor tile it.
enum class Fp8Tiling { kTensor, k1x128, k128x128 };

inline constexpr int64_t kFp8BlockSize = 128;

// "tensor", "1x128", "128x128".
const char* Fp8TilingName(Fp8Tiling tiling);

struct Fp8Tile {
  int64_t rows = 0;  // rows of x a tile covers (the last tile may cover fewer)
  int64_t cols = 0;
};

// The tile of `tiling` over [rows, cols] (kTensor: the whole tensor, at least 1 x 1).
Fp8Tile Fp8TileOf(int64_t rows, int64_t cols, Fp8Tiling tiling);
// The grid of scales: [ceil(rows / tile.rows), ceil(cols / tile.cols)] (0 for an empty side).
Fp8Tile Fp8GridOf(int64_t rows, int64_t cols, Fp8Tiling tiling);

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_FP8_SCALE_H_
