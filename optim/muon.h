// Muon (MomentUm Orthogonalized by Newton-Schulz), with torch.optim.Muon's update (PyTorch 2.9
// and later; torch/optim/_muon.py of torch 2.15). For each 2-D parameter p with gradient g:
//
//   buf = lerp(buf, g, 1 - momentum)               (buf starts at zero: an average, not a sum)
//   u   = nesterov ? lerp(g, buf, momentum) : buf
//   o   = NewtonSchulz(u)                          (below)
//   p   = p * (1 - lr * weight_decay)              (decoupled weight decay, with the unadjusted lr)
//   p   = p - AdjustLr(lr, p.shape) * o
//
// lerp(a, b, w) is PyTorch's: a + w * (b - a) for |w| < 0.5, else b - (b - a) * (1 - w).
//
// NewtonSchulz(u), as _zeropower_via_newtonschulz: X = u in ns_dtype (bf16 by default, torch's
// only choice), transposed when it has more rows than columns; X = X / max(||X||_F, eps); then
// ns_steps times, with (a, b, c) = ns_coefficients:
//   A = X X^T,  B = b A + c A A,  X = a X + B X
// and the transpose undone. Each product is accumulated in f32 (f64 for ns_dtype f64) and each of
// A, B and X is rounded to ns_dtype once, where torch's bf16 addmm rounds (the sums' order is the
// GEMM's, so bf16 results are torch's within bf16 rounding, not bit for bit).
//
// AdjustLr(lr, [A, B]): "original" (the default) lr * sqrt(max(1, A / B)) (Keller Jordan's);
// "match_rms_adamw" lr * 0.2 * sqrt(max(A, B)) (Moonshot's); "spectral_unclamped"
// lr * sqrt(A / B) (Bernstein's).
//
// Muon takes 2-D parameters only (the hidden matrices); embeddings, the output head, norms and
// biases go to AdamW. Either in a second optimizer, as torch.optim.Muon's documentation sets it
// up, or in one MuonWithAdamW, whose groups step with Muon or AdamW by their options' type (one
// step(), one state_dict, one LR schedule over every group: what the training binaries use):
//
//   std::vector<tg::Tensor> matrices, others;   // e.g. p.dim() == 2 and not an embedding/head
//   tg::optim::Muon muon(matrices, tg::optim::MuonOptions(0.02).momentum(0.95));
//   tg::optim::AdamW adamw(others, tg::optim::AdamWOptions(3e-4).weight_decay(0.01));
//   ... loss.backward(); muon.step(); adamw.step();
//
//   tg::optim::MuonWithAdamW opt({tg::optim::ParamGroup(matrices, tg::optim::MuonOptions(0.02)),
//                                 tg::optim::ParamGroup(others, tg::optim::AdamWOptions(3e-4))});
//
// Arithmetic outside the iteration: f32 for f16/bf16/f32 parameters (f64 for f64); each scalar
// (1 - momentum, 1 - lr * weight_decay, the adjusted lr; computed in double) is rounded to the
// compute dtype. The momentum buffer ("momentum_buffer", PyTorch's name) has the compute dtype.
#ifndef TAPEGRAD_OPTIM_MUON_H_
#define TAPEGRAD_OPTIM_MUON_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "optim/adam.h"
#include "optim/optimizer.h"
#include "tensor/arg.h"
#include "tensor/dtype.h"

namespace tg::optim {

// How Muon scales its orthogonalised update by the parameter's shape [A, B].
enum class MuonAdjustLr { kOriginal, kMatchRmsAdamW, kSpectralUnclamped };

// libtorch-style chain: MuonOptions(0.02).momentum(0.95).adjust_lr_fn(MuonAdjustLr::kOriginal).
// The defaults are torch.optim.Muon's.
struct MuonOptions : OptimizerOptions {
  TG_ARG(double, lr) = 1e-3;
  TG_ARG(double, weight_decay) = 0.1;
  TG_ARG(double, momentum) = 0.95;
  TG_ARG(bool, nesterov) = true;
  // The quintic's coefficients (a, b, c), Keller Jordan's.
  TG_ARG(double, ns_a) = 3.4445;
  TG_ARG(double, ns_b) = -4.7750;
  TG_ARG(double, ns_c) = 2.0315;
  TG_ARG(double, eps) = 1e-7;
  TG_ARG(int64_t, ns_steps) = 5;  // 0..99 (torch refuses 100 and more)
  TG_ARG(MuonAdjustLr, adjust_lr_fn) = MuonAdjustLr::kOriginal;
  // The dtype of the iteration: bf16 (torch's), or f32/f64 for a reference run. Not a group
  // option (not in state_dict): the optimizer's, read from the options it is constructed with.
  TG_ARG(DType, ns_dtype) = kBF16;

 public:
  MuonOptions() = default;
  MuonOptions(double lr) : lr_(lr) {}  // NOLINT: implicit, as libtorch's option types
  MuonOptions(const MuonOptions&) = default;
  MuonOptions& operator=(const MuonOptions&) = default;
  std::unique_ptr<OptimizerOptions> clone() const override;
  const char* type_name() const override { return "MuonOptions"; }
  double get_lr() const override { return lr_; }
  void set_lr(double new_lr) override { lr_ = new_lr; }
  // adjust_lr_fn (0 original, 1 match_rms_adamw, 2 spectral_unclamped), eps, lr, momentum,
  // nesterov, ns_a, ns_b, ns_c, ns_steps, weight_decay.
  std::vector<NamedOption> named() const override;

 protected:
  bool SetNamed(const std::string& name, double value, const std::string& context) override;
};

// Muon on the flat master shards of ZeRO (distributed/zero.h sets it on the optimizer it wraps):
// each parameter of a Muon group is then a 1-D shard of a flat buffer of whole matrices, and a
// step (1) runs the momentum and Nesterov lerps on the shard (elementwise: the single process's
// bits), (2) gathers the directions, rounded to ns_dtype, into full flat buffers, (3) has each
// matrix orthogonalised by one rank, its owner (the matrices in group order, each to the rank
// with the least Newton-Schulz work so far, m^2 n for an m x n iterate, ties to the lowest rank),
// which batches its matrices by shape, (4) broadcasts each owner's results to every rank, and (5)
// applies them to the shard elements. Every rank computes the same owners, so the collectives
// match; each matrix is orthogonalised once per step in the whole group, with the bits of one
// process (the iteration's bits do not depend on the batch it is in). The implementer describes
// the layout and runs the collectives.
class MuonSharding {
 public:
  struct Matrix {
    int64_t offset = 0;  // first element in the full flat buffer
    Shape shape;         // the parameter's [rows, cols]
  };
  struct Chunk {
    int64_t start = 0;         // first element in the full flat buffer
    int64_t size = 0;          // elements
    int64_t shard_offset = 0;  // where they are in this rank's shard
  };
  struct Layout {
    int64_t full_numel = 0;
    std::vector<Matrix> matrices;
    std::vector<Chunk> chunks;  // this rank's
  };
  virtual ~MuonSharding() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // The layout of the flat buffer that `shard` (a group parameter) is this rank's part of;
  // throws tg::Error for a tensor that is not such a shard.
  virtual const Layout& layout(const Tensor& shard) const = 0;
  // The full flat buffer [full_numel] whose chunks are every rank's `values` (this rank's,
  // shaped as `shard`, of any dtype): an all-gather, issued by every rank.
  virtual RawTensor Gather(const Tensor& shard, const RawTensor& values) const = 0;
  // Rank `root`'s `buffer` into every rank's: a broadcast, issued by every rank.
  virtual void Broadcast(const RawTensor& buffer, int root) const = 0;
};

// What Muon and MuonWithAdamW share for ZeRO: the sharding of their Muon groups, and how many
// matrices this object has orthogonalised (on this rank; over every step so far).
class MuonShardable {
 public:
  // Null: the parameters are whole matrices (the default).
  void set_muon_sharding(std::shared_ptr<const MuonSharding> sharding) {
    sharding_ = std::move(sharding);
  }
  int64_t orthogonalised_matrices() const { return orthogonalised_; }

 protected:
  ~MuonShardable() = default;
  std::shared_ptr<const MuonSharding> sharding_;
  int64_t orthogonalised_ = 0;
};

class MuonWithAdamW;

class Muon : public Optimizer, public MuonShardable {
 public:
  // One group holding `params`: every one 2-D (throws tg::Error naming the first that is not,
  // and on an empty list).
  explicit Muon(std::vector<Tensor> params, const MuonOptions& options = {});
  explicit Muon(std::vector<ParamGroup> groups, const MuonOptions& defaults = {});

 protected:
  void CheckOptions(const OptimizerOptions& options, const std::string& context) const override;
  StateSpec ParamStateSpec(const OptimizerOptions& options) const override;
  bool AcceptsOptions(const OptimizerOptions& options) const override;
  void StepGroup(const ParamGroup& group, const std::vector<ParamUpdate>& updates) override;
  std::string RefuseShape(const OptimizerOptions& options, const Shape& shape) const override;

 private:
  friend class MuonWithAdamW;  // steps its Muon groups with these
  static void CheckMuonOptions(const MuonOptions& o, const std::string& context);
  // Steps `updates` (whole matrices, or shards when `sharding` is set), adding the matrices this
  // rank orthogonalised to *count.
  static void StepMuon(const MuonOptions& o, DType ns_dtype,
                       const std::vector<ParamUpdate>& updates, const MuonSharding* sharding,
                       int64_t* count);
  static void StepMuonSharded(const MuonOptions& o, DType ns_dtype,
                              const std::vector<ParamUpdate>& updates, const MuonSharding& sharding,
                              int64_t* count);
  // The momentum step of one parameter and the direction Muon orthogonalises, rounded to `dtype`
  // (the iteration's; in the same pass as Nesterov's lerp where the device can).
  static RawTensor MomentumDirection(const MuonOptions& o, const ParamUpdate& u, DType dtype);
  static StateSpec MuonStateSpec();
  static std::string RefuseMuonShape(const Shape& shape, bool sharded);

  DType ns_dtype_;
};

// Muon and AdamW in one optimizer: a group with MuonOptions steps with Muon (2-D parameters only;
// its state "momentum_buffer"), a group with AdamWOptions with AdamW (fused as `muon_defaults`'
// companion `adamw_fused` says; its state "exp_avg", "exp_avg_sq", "step"); a group added without
// options gets a copy of `muon_defaults`. The Newton-Schulz dtype is muon_defaults.ns_dtype().
// state_dict holds each group's options under their own names, so a checkpoint records which
// group is which; load_state_dict refuses a state whose group types differ (the option names do).
class MuonWithAdamW : public AdamW, public MuonShardable {
 public:
  explicit MuonWithAdamW(std::vector<ParamGroup> groups, const MuonOptions& muon_defaults = {},
                         bool adamw_fused = true);

 protected:
  void CheckOptions(const OptimizerOptions& options, const std::string& context) const override;
  StateSpec ParamStateSpec(const OptimizerOptions& options) const override;
  bool AcceptsOptions(const OptimizerOptions& options) const override;
  void StepGroup(const ParamGroup& group, const std::vector<ParamUpdate>& updates) override;
  std::string RefuseShape(const OptimizerOptions& options, const Shape& shape) const override;
  std::string AcceptedOptions() const override { return "MuonOptions or AdamWOptions"; }

 private:
  DType ns_dtype_;
};

// The orthogonalised update of `update` ([rows, cols], any floating dtype) in `ns_dtype`, as
// Muon's step computes it (the NewtonSchulz op of tensor/ops.h; a tall matrix transposed there
// and back); the result has ns_dtype.
RawTensor MuonNewtonSchulz(const RawTensor& update, double a, double b, double c, int64_t ns_steps,
                           double eps, DType ns_dtype);
// The same for each of `updates`, those of one shape and device in one batch of the op: each
// result equals the one-matrix call's.
std::vector<RawTensor> MuonNewtonSchulz(const std::vector<RawTensor>& updates, double a, double b,
                                        double c, int64_t ns_steps, double eps, DType ns_dtype);
// The learning rate Muon applies to a parameter of shape [rows, cols].
double MuonAdjustedLr(double lr, MuonAdjustLr fn, int64_t rows, int64_t cols);

}  // namespace tg::optim

#endif  // TAPEGRAD_OPTIM_MUON_H_
