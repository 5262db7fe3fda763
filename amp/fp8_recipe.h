// FP8 scaling recipes: how the f32 scale that maps a tensor into an FP8 format's range is chosen,
// as state machines over amax values (the largest |x| of a tensor). No FP8 dtype is involved
// here: the recipes move amaxes and scales (f32 values, held in floats); the casts that use them
// come later (issue 30). Each rule reproduces NVIDIA Transformer Engine (TE) bit for bit:
//
//   Formats (TE recipe Format): E4M3 max 448, E5M2 max 57344; HYBRID = E4M3 in the forward pass
//   (input, weight), E5M2 in the backward pass (grad_output). TE refuses pure E5M2 training
//   ("Pure E5M2 training is not supported."), so do the delayed and current recipes here.
//
//   Delayed scaling (TE DelayedScaling; the fused update TE's PyTorch side runs by default,
//   common/recipe/delayed_scaling.cu kernel_bulk after the data-parallel amax all-reduce):
//     Each tensor (one per role per layer) has an amax history of L floats in TE's layout:
//     h[0] is the slot where the current step's amax is recorded (0 between updates), h[1..L-1]
//     hold the previous L-1 amaxes, oldest first. An update with this step's (reduced) amax a:
//       last = (a != 0) ? a : h[0];
//       if last == 0: nothing moves (no roll; the scale is kept).
//       else: the window W = {h[1], ..., h[L-1], last}; the history becomes
//             {0, h[2], ..., h[L-1], last} (for L = 1: {0});
//             amax = "max": the fmaxf of W (NaN entries are skipped, as fmaxf does; inf wins),
//                    "most_recent": last;
//       scale = (amax finite and > 0) ? f32(f32(fp8_max * 2^-margin) / amax) : previous scale;
//       a scale that is inf in f32 (amax tiny) becomes FLT_MAX.
//     The scale starts at 1 and the history at zeros (TE's fp8_meta). scale_inv = f32(1 / scale).
//     TE's unfused Python path (NVTE_UNFUSED_FP8_UPDATE=1, or a callable algo) differs in two
//     corner cases that are not reproduced: it rolls the history also for a zero amax, and its
//     torch.max propagates NaN (so a NaN in the window keeps the scale for L steps, where the
//     fused kernel skips it).
//
//   Current scaling (TE Float8CurrentScaling, common/recipe/recipe_common.cuh
//     compute_scale_from_amax): the scale comes from this step's amax alone:
//       amax = max(amax, amax_epsilon) (a NaN amax stays NaN); amax inf, 0 or NaN: scale 1;
//       else scale = f32(fp8_max / amax), inf -> value_for_inf (the input type's largest finite:
//       FLT_MAX for f32 input); force_pow_2_scales: the scale's mantissa bits cleared (rounded
//       down to a power of two; a subnormal scale becomes 0, as in TE). TE's defaults: epsilon 0,
//       no power of two.
//     torchao (float8_utils.amax_to_scale) differs: it clamps the amax at EPS = 1e-12 and
//     divides in f64 (then rounds to f32), so an amax of 0 gives fp8_max * 1e12 (TE: 1), an inf
//     amax gives 0 (TE: 1), a NaN amax gives NaN (TE: 1); its power-of-two rounding is
//     exp2(floor(log2(scale))) (the same as clearing the mantissa for normal scales). We follow
//     TE. For a finite amax above 1e-12 both give the same f32 scale (an f64 quotient of f32
//     operands rounded to f32 is the f32 quotient); amax_epsilon = 1e-12f approximates torchao's
//     clamp below that (1e-12f is not the double 1e-12, so the clamped scale differs in the last
//     bits).
//
//   Block scaling (TE Float8BlockScaling, DeepSeek-V3's fine-grained rule): one scale per tile of
//     a 2-D tensor, tiles of 1x128 (activations and gradients: TE's x/grad_block_scaling_dim 1)
//     or 128x128 (weights: w_block_scaling_dim 2); the edge tiles of dimensions that are not
//     multiples of 128 cover what remains. Tile amax = fmaxf of |x| over the tile (NaN skipped);
//     the scale is current scaling's rule on it (TE's quantize_transpose_*_blockwise call the same
//     compute_scale_from_amax), so an all-zero tile gets scale 1. TE's default: E4M3, power-of-two
//     scales (NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1 turns them off), epsilon 0.
//
// State in checkpoints: Fp8DelayedScaling::state_dict() holds, per layer i and role r in
// {input, weight, grad_output}, the scalar "layer.<i>.<r>.scale" and the f32 tensor
// "layer.<i>.<r>.amax_history" of shape [L]; load_state_dict refuses anything else and changes
// nothing, and a restored recipe continues bit-identically.
#ifndef TAPEGRAD_AMP_FP8_RECIPE_H_
#define TAPEGRAD_AMP_FP8_RECIPE_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "tensor/state_dict.h"
#include "tensor/tensor.h"

namespace tg {
namespace amp {

constexpr float kE4M3Max = 448.0f;
constexpr float kE5M2Max = 57344.0f;

enum class Fp8Format { kE4M3, kE5M2, kHybrid };

// The tensor roles of one FP8 layer; input and weight are cast in the forward pass, grad_output
// in the backward pass.
enum class Fp8Role { kInput = 0, kWeight = 1, kGradOutput = 2 };

const char* Fp8FormatName(Fp8Format format);
const char* Fp8RoleName(Fp8Role role);  // "input", "weight", "grad_output"
// The largest finite value of the format a tensor of `role` is cast to (HYBRID: E4M3 forward,
// E5M2 backward).
float Fp8Max(Fp8Format format, Fp8Role role);

// ---- Current scaling -------------------------------------------------------------------------

struct Fp8CurrentScalingOptions {
  float amax_epsilon = 0.0f;        // >= 0, finite: amaxes below it count as it
  bool force_pow_2_scales = false;  // round scales down to a power of two
  // What an f32-overflowing scale becomes: the largest finite value of the input's type.
  float value_for_inf = std::numeric_limits<float>::max();
};

// TE's compute_scale_from_amax (see the header comment). Throws tg::Error for invalid options.
float ComputeScaleFromAmax(float amax, float fp8_max, const Fp8CurrentScalingOptions& options);

// ---- Block scaling ---------------------------------------------------------------------------

enum class Fp8BlockShape {
  k1x128,    // 1 row x 128 columns: activations, gradients
  k128x128,  // 128 x 128: weights
};

struct Fp8BlockScales {
  int64_t grid_rows = 0;      // rows of tiles: rows (1x128) or ceil(rows / 128)
  int64_t grid_cols = 0;      // ceil(cols / 128)
  std::vector<float> amaxes;  // [grid_rows, grid_cols] row-major
  std::vector<float> scales;  // the same layout; dequantize with 1 / scale
};

// TE Float8BlockScaling's defaults: power-of-two scales, epsilon 0.
Fp8CurrentScalingOptions BlockScalingDefaults();

// Per-tile amaxes and scales of the row-major rows x cols matrix `values`. Throws tg::Error when
// values.size() != rows * cols or a dimension is negative (0 gives an empty grid).
Fp8BlockScales ComputeBlockScales(const std::vector<float>& values, int64_t rows, int64_t cols,
                                  Fp8BlockShape shape, float fp8_max,
                                  const Fp8CurrentScalingOptions& options = BlockScalingDefaults());
// The same for a 2-D f32 tensor on the CPU (any strides).
Fp8BlockScales ComputeBlockScales(const RawTensor& x, Fp8BlockShape shape, float fp8_max,
                                  const Fp8CurrentScalingOptions& options = BlockScalingDefaults());

// ---- Delayed scaling -------------------------------------------------------------------------

enum class AmaxComputeAlgo { kMax, kMostRecent };

struct Fp8DelayedScalingOptions {
  Fp8Format format = Fp8Format::kHybrid;  // E4M3 or HYBRID
  int margin = 0;                         // scale = fp8_max / amax / 2^margin; in [-64, 64]
  int64_t amax_history_len = 1024;        // >= 1
  AmaxComputeAlgo amax_compute_algo = AmaxComputeAlgo::kMax;
  bool reduce_amax = true;  // call the reducer (the data-parallel all-reduce MAX) before updating
};

// One tensor's delayed-scaling state and TE's fused update of it (see the header comment).
struct Fp8TensorScaling {
  std::vector<float> amax_history;  // TE's layout, length L
  float scale = 1.0f;

  float scale_inv() const { return 1.0f / scale; }
  // One update with this step's amax (already reduced across data-parallel ranks).
  void Update(float amax, AmaxComputeAlgo algo, float fp8_max, int margin);
};

class Fp8DelayedScaling {
 public:
  using Options = Fp8DelayedScalingOptions;
  // Reduces the amaxes in place (all-reduce MAX over the data-parallel group); must keep the size.
  using AmaxReducer = std::function<void(std::vector<float>&)>;

  // Throws tg::Error naming the first invalid option and its value.
  Fp8DelayedScaling(int64_t num_layers, const Options& options = Options());

  int64_t num_layers() const { return num_layers_; }
  const Options& options() const { return options_; }
  float fp8_max(Fp8Role role) const { return Fp8Max(options_.format, role); }
  const Fp8TensorScaling& tensor(int64_t layer, Fp8Role role) const;
  float scale(int64_t layer, Fp8Role role) const { return tensor(layer, role).scale; }
  float scale_inv(int64_t layer, Fp8Role role) const { return tensor(layer, role).scale_inv(); }

  // The update after a forward pass: local_amaxes = {layer 0 input, layer 0 weight, layer 1
  // input, ...} (2 * num_layers), the amaxes this rank saw. With reduce_amax and a reducer, the
  // reducer is called once on a copy of them (TE's one all-reduce per pass) before any scale
  // moves; then every tensor is updated with its reduced amax. Throws tg::Error, changing
  // nothing, for a wrong count (before or after the reducer) or a negative amax.
  void UpdateForward(const std::vector<float>& local_amaxes,
                     const AmaxReducer& reduce_max = nullptr);
  // The same after a backward pass: one grad_output amax per layer.
  void UpdateBackward(const std::vector<float>& local_amaxes,
                      const AmaxReducer& reduce_max = nullptr);

  StateDict state_dict() const;
  // Throws tg::Error (and changes nothing) naming missing and unexpected keys, a history tensor
  // that is not f32 of shape [amax_history_len] or holds a negative entry, or a scale that is
  // not a positive finite f32 value.
  void load_state_dict(const StateDict& state);

 private:
  void Update(const char* op, const std::vector<Fp8Role>& roles,
              const std::vector<float>& local_amaxes, const AmaxReducer& reduce_max);

  int64_t num_layers_;
  Options options_;
  std::vector<Fp8TensorScaling> tensors_;  // [layer * 3 + role]
};

}  // namespace amp
}  // namespace tg

#endif  // TAPEGRAD_AMP_FP8_RECIPE_H_
