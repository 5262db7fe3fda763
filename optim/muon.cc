#include "optim/muon.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "tensor/error.h"
#include "tensor/ops.h"

namespace tg::optim {
namespace {

constexpr char kMomentumBuffer[] = "momentum_buffer";

}  // namespace

std::unique_ptr<OptimizerOptions> MuonOptions::clone() const {
  return std::make_unique<MuonOptions>(*this);
}

std::vector<NamedOption> MuonOptions::named() const {
  return {{"adjust_lr_fn", static_cast<double>(adjust_lr_fn_)},
          {"eps", eps_},
          {"lr", lr_},
          {"momentum", momentum_},
          {"nesterov", nesterov_ ? 1.0 : 0.0},
          {"ns_a", ns_a_},
          {"ns_b", ns_b_},
          {"ns_c", ns_c_},
          {"ns_steps", static_cast<double>(ns_steps_)},
          {"weight_decay", weight_decay_}};
}

bool MuonOptions::SetNamed(const std::string& name, double value, const std::string& context) {
  if (name == "adjust_lr_fn") {
    TG_CHECK(value == 0 || value == 1 || value == 2, context,
             "adjust_lr_fn must be 0 (original), 1 (match_rms_adamw) or 2 (spectral_unclamped), "
             "got ",
             value);
    adjust_lr_fn_ = static_cast<MuonAdjustLr>(static_cast<int>(value));
  } else if (name == "eps") {
    eps_ = value;
  } else if (name == "lr") {
    lr_ = value;
  } else if (name == "momentum") {
    momentum_ = value;
  } else if (name == "nesterov") {
    nesterov_ = NamedBool(name, value, context);
  } else if (name == "ns_a") {
    ns_a_ = value;
  } else if (name == "ns_b") {
    ns_b_ = value;
  } else if (name == "ns_c") {
    ns_c_ = value;
  } else if (name == "ns_steps") {
    TG_CHECK(value == std::floor(value) && value >= 0 && value < 100, context,
             "ns_steps must be an integer in 0..99, got ", value);
    ns_steps_ = static_cast<int64_t>(value);
  } else if (name == "weight_decay") {
    weight_decay_ = value;
  } else {
    return false;
  }
  return true;
}

namespace {

void CheckNewtonSchulz(const RawTensor& update, int64_t ns_steps, DType ns_dtype) {
  TG_CHECK(update.dim() == 2, "Muon: the Newton-Schulz iteration takes a 2-D matrix, got ",
           ShapeToString(update.shape()));
  TG_CHECK(ns_steps >= 0 && ns_steps < 100, "Muon: ns_steps must be in 0..99, got ", ns_steps);
  TG_CHECK(IsFloating(ns_dtype) && ns_dtype != kF8E4M3 && ns_dtype != kF8E5M2,
           "Muon: ns_dtype must be bf16, f16, f32 or f64, got ", DTypeName(ns_dtype));
}

// A tall matrix goes through the iteration transposed (torch's choice: the Gram matrix is then
// the smaller one).
bool Tall(const RawTensor& update) { return update.size(0) > update.size(1); }

}  // namespace

std::vector<RawTensor> MuonNewtonSchulz(const std::vector<RawTensor>& updates, double a, double b,
                                        double c, int64_t ns_steps, double eps, DType ns_dtype) {
  for (const RawTensor& u : updates) CheckNewtonSchulz(u, ns_steps, ns_dtype);
  std::vector<RawTensor> out(updates.size());
  std::vector<bool> done(updates.size(), false);
  for (size_t first = 0; first < updates.size(); ++first) {
    if (done[first]) continue;
    // The matrices of first's oriented shape and device, in list order.
    const Shape shape = updates[first].shape();
    const Device device = updates[first].device();
    std::vector<size_t> members;
    for (size_t i = first; i < updates.size(); ++i) {
      if (!done[i] && updates[i].shape() == shape && updates[i].device() == device) {
        members.push_back(i);
        done[i] = true;
      }
    }
    const bool tall = Tall(updates[first]);
    const int64_t m = tall ? shape[1] : shape[0], n = tall ? shape[0] : shape[1];
    const RawTensor batch =
        RawTensor::Empty({static_cast<int64_t>(members.size()), m, n}, ns_dtype, device);
    for (size_t k = 0; k < members.size(); ++k) {
      const RawTensor& u = updates[members[k]];
      batch.select(0, static_cast<int64_t>(k)).copy_(tall ? u.transpose(0, 1) : u);
    }
    const RawTensor ortho = NewtonSchulz(batch, a, b, c, ns_steps, eps);
    for (size_t k = 0; k < members.size(); ++k) {
      const RawTensor o = ortho.select(0, static_cast<int64_t>(k));
      out[members[k]] = tall ? o.transpose(0, 1).contiguous() : o;
    }
  }
  return out;
}

RawTensor MuonNewtonSchulz(const RawTensor& update, double a, double b, double c, int64_t ns_steps,
                           double eps, DType ns_dtype) {
  return MuonNewtonSchulz(std::vector<RawTensor>{update}, a, b, c, ns_steps, eps, ns_dtype)[0];
}

double MuonAdjustedLr(double lr, MuonAdjustLr fn, int64_t rows, int64_t cols) {
  const double ratio = static_cast<double>(rows) / static_cast<double>(cols);
  switch (fn) {
    case MuonAdjustLr::kOriginal:
      return lr * std::sqrt(std::max(1.0, ratio));
    case MuonAdjustLr::kMatchRmsAdamW:
      return lr * 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)));
    case MuonAdjustLr::kSpectralUnclamped:
      return lr * std::sqrt(ratio);
  }
  return lr;
}

Muon::Muon(std::vector<Tensor> params, const MuonOptions& options)
    : Muon(OneGroup("Muon", std::move(params)), options) {}

Muon::Muon(std::vector<ParamGroup> groups, const MuonOptions& defaults)
    : Optimizer("Muon", std::make_unique<MuonOptions>(defaults), /*fused=*/false),
      ns_dtype_(defaults.ns_dtype()) {
  TG_CHECK(IsFloating(ns_dtype_) && ns_dtype_ != kF8E4M3 && ns_dtype_ != kF8E5M2,
           "Muon: ns_dtype must be bf16, f16, f32 or f64, got ", DTypeName(ns_dtype_));
  Init(std::move(groups));
}

bool Muon::AcceptsOptions(const OptimizerOptions& options) const {
  return dynamic_cast<const MuonOptions*>(&options) != nullptr;
}

void Muon::CheckOptions(const OptimizerOptions& options, const std::string& context) const {
  CheckMuonOptions(static_cast<const MuonOptions&>(options), context);
}

void Muon::CheckMuonOptions(const MuonOptions& o, const std::string& context) {
  TG_CHECK(o.lr() >= 0, context, "invalid lr ", o.lr(), " (must be >= 0)");
  TG_CHECK(o.momentum() >= 0, context, "invalid momentum ", o.momentum(), " (must be >= 0)");
  TG_CHECK(o.weight_decay() >= 0, context, "invalid weight_decay ", o.weight_decay(),
           " (must be >= 0)");
  TG_CHECK(o.eps() >= 0, context, "invalid eps ", o.eps(), " (must be >= 0)");
  TG_CHECK(o.ns_steps() >= 0 && o.ns_steps() < 100, context, "invalid ns_steps ", o.ns_steps(),
           " (must be in 0..99)");
}

std::string Muon::RefuseShape(const OptimizerOptions&, const Shape& shape) const {
  return RefuseMuonShape(shape, sharding_ != nullptr);
}

std::string Muon::RefuseMuonShape(const Shape& shape, bool sharded) {
  if (shape.size() == 2 || (sharded && shape.size() == 1)) return "";
  return "Muon only supports 2-D parameters (give embeddings' other parameters, biases and norms "
         "to AdamW)";
}

Optimizer::StateSpec Muon::ParamStateSpec(const OptimizerOptions&) const { return MuonStateSpec(); }

Optimizer::StateSpec Muon::MuonStateSpec() {
  StateSpec spec;
  spec.tensors.push_back(kMomentumBuffer);
  return spec;
}

void Muon::StepGroup(const ParamGroup& group, const std::vector<ParamUpdate>& updates) {
  StepMuon(group.options_as<MuonOptions>(), ns_dtype_, updates, sharding_.get(), &orthogonalised_);
}

// Its buffer is created at the first step; elementwise, so a shard's direction is the matching
// part of the whole parameter's.
RawTensor Muon::MomentumDirection(const MuonOptions& o, const ParamUpdate& u, DType dtype) {
  const RawTensor& param = u.param.data();
  const DType compute = StateDType(param.dtype());
  auto it = u.state->tensors.find(kMomentumBuffer);
  if (it == u.state->tensors.end()) {
    it = u.state->tensors
             .emplace(kMomentumBuffer, RawTensor::Zeros(param.shape(), compute, param.device()))
             .first;
  }
  const RawTensor& buf = it->second;
  const RawTensor grad = u.grad.to(compute);
  LerpInPlace(buf, grad, 1 - o.momentum());  // torch: buf.lerp_(grad, 1 - momentum)
  // torch: grad.lerp(buf, momentum) or buf, then .bfloat16() for the iteration.
  return o.nesterov() ? Lerp(grad, buf, o.momentum(), dtype) : buf.to(dtype);
}

namespace {

// param = param * (1 - lr * weight_decay) - lr_adjusted * ortho, on `param` (a whole parameter
// or a run of a shard) with `ortho` of its shape.
void ApplyUpdate(const MuonOptions& o, const RawTensor& param, const RawTensor& ortho,
                 const Shape& matrix_shape) {
  const DType compute = StateDType(param.dtype());
  const double lr = MuonAdjustedLr(o.lr(), o.adjust_lr_fn(), matrix_shape[0], matrix_shape[1]);
  // Without decay the factor is 1, whose product changes no value: the pass is skipped.
  const double keep = 1 - o.lr() * o.weight_decay();
  // torch's param.add_(update, alpha=-lr): one fused rounding in the dtype the two promote to
  // (f32 for a bf16 update, f64 for an f64 one, then rounded to the parameter's).
  const DType sum = PromoteTypes(compute, ortho.dtype());
  // (ortho, narrower than the sum or of its dtype, is widened in AddScaled's pass.)
  if (param.dtype() == sum) {  // torch's param.mul_ then param.add_, in one pass
    AddScaledInPlace(param, ortho, -lr, keep);
    return;
  }
  const RawTensor decayed = keep == 1 ? param.to(compute) : MulScalar(param.to(compute), keep);
  param.copy_(AddScaled(decayed.to(sum), ortho, -lr));
}

}  // namespace

void Muon::StepMuonSharded(const MuonOptions& o, DType ns_dtype,
                           const std::vector<ParamUpdate>& updates, const MuonSharding& sharding,
                           int64_t* count) {
  // (1, 2) The directions of every flat buffer, whole.
  std::vector<RawTensor> full;
  for (const ParamUpdate& u : updates) {
    full.push_back(sharding.Gather(u.param, MomentumDirection(o, u, ns_dtype)));
  }
  // (3) Owners, the same on every rank.
  struct Job {
    size_t update;
    const MuonSharding::Matrix* matrix;
    int owner;
  };
  std::vector<Job> jobs;
  std::vector<double> load(static_cast<size_t>(sharding.world()), 0.0);
  for (size_t i = 0; i < updates.size(); ++i) {
    for (const MuonSharding::Matrix& m : sharding.layout(updates[i].param).matrices) {
      const double small = static_cast<double>(std::min(m.shape[0], m.shape[1]));
      const double large = static_cast<double>(std::max(m.shape[0], m.shape[1]));
      const int owner = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      load[static_cast<size_t>(owner)] += small * small * large;
      jobs.push_back({i, &m, owner});
    }
  }
  std::vector<RawTensor> mine;
  for (const Job& j : jobs) {
    if (j.owner != sharding.rank()) continue;
    mine.push_back(full[j.update]
                       .narrow(0, j.matrix->offset, NumElements(j.matrix->shape))
                       .reshape(j.matrix->shape));
  }
  const std::vector<RawTensor> ortho =
      MuonNewtonSchulz(mine, o.ns_a(), o.ns_b(), o.ns_c(), o.ns_steps(), o.eps(), ns_dtype);
  *count += static_cast<int64_t>(ortho.size());
  // (4) Each owner's results, packed in job order, to every rank, into the full buffers (the
  // directions are not needed any more).
  for (int root = 0; root < sharding.world(); ++root) {
    int64_t total = 0;
    for (const Job& j : jobs) total += j.owner == root ? NumElements(j.matrix->shape) : 0;
    if (total == 0) continue;
    const RawTensor packed = RawTensor::Empty({total}, ns_dtype, full[0].device());
    int64_t at = 0;
    size_t k = 0;
    for (const Job& j : jobs) {
      if (j.owner != root) continue;
      const int64_t n = NumElements(j.matrix->shape);
      if (root == sharding.rank()) packed.narrow(0, at, n).copy_(ortho[k++].reshape({n}));
      at += n;
    }
    sharding.Broadcast(packed, root);
    at = 0;
    for (const Job& j : jobs) {
      if (j.owner != root) continue;
      const int64_t n = NumElements(j.matrix->shape);
      full[j.update].narrow(0, j.matrix->offset, n).copy_(packed.narrow(0, at, n));
      at += n;
    }
  }
  // (5) Each shard element of a matrix, with that matrix's learning rate.
  for (size_t i = 0; i < updates.size(); ++i) {
    const MuonSharding::Layout& layout = sharding.layout(updates[i].param);
    const RawTensor& shard = updates[i].param.data();
    for (const MuonSharding::Matrix& m : layout.matrices) {
      const int64_t end = m.offset + NumElements(m.shape);
      for (const MuonSharding::Chunk& c : layout.chunks) {
        const int64_t lo = std::max(c.start, m.offset), hi = std::min(c.start + c.size, end);
        if (lo >= hi) continue;
        ApplyUpdate(o, shard.narrow(0, c.shard_offset + (lo - c.start), hi - lo),
                    full[i].narrow(0, lo, hi - lo), m.shape);
      }
    }
  }
}

void Muon::StepMuon(const MuonOptions& o, DType ns_dtype, const std::vector<ParamUpdate>& updates,
                    const MuonSharding* sharding, int64_t* count) {
  if (sharding != nullptr) return StepMuonSharded(o, ns_dtype, updates, *sharding, count);
  // The momentum of every parameter, then the group's matrices orthogonalised together (those of
  // one shape in one batch), then the parameters.
  std::vector<RawTensor> directions;
  for (const ParamUpdate& u : updates) directions.push_back(MomentumDirection(o, u, ns_dtype));
  const std::vector<RawTensor> ortho =
      MuonNewtonSchulz(directions, o.ns_a(), o.ns_b(), o.ns_c(), o.ns_steps(), o.eps(), ns_dtype);
  *count += static_cast<int64_t>(ortho.size());
  for (size_t i = 0; i < updates.size(); ++i) {
    const RawTensor& param = updates[i].param.data();
    ApplyUpdate(o, param, ortho[i], param.shape());
  }
}

MuonWithAdamW::MuonWithAdamW(std::vector<ParamGroup> groups, const MuonOptions& muon_defaults,
                             bool adamw_fused)
    : AdamW("MuonWithAdamW", std::make_unique<MuonOptions>(muon_defaults), adamw_fused),
      ns_dtype_(muon_defaults.ns_dtype()) {
  TG_CHECK(IsFloating(ns_dtype_) && ns_dtype_ != kF8E4M3 && ns_dtype_ != kF8E5M2,
           "MuonWithAdamW: ns_dtype must be bf16, f16, f32 or f64, got ", DTypeName(ns_dtype_));
  Init(std::move(groups));
}

namespace {
const MuonOptions* AsMuon(const OptimizerOptions& options) {
  return dynamic_cast<const MuonOptions*>(&options);
}
}  // namespace

bool MuonWithAdamW::AcceptsOptions(const OptimizerOptions& options) const {
  return AsMuon(options) != nullptr || dynamic_cast<const AdamWOptions*>(&options) != nullptr;
}

void MuonWithAdamW::CheckOptions(const OptimizerOptions& options,
                                 const std::string& context) const {
  if (const MuonOptions* muon = AsMuon(options)) {
    Muon::CheckMuonOptions(*muon, context);
  } else {
    AdamW::CheckOptions(options, context);
  }
}

Optimizer::StateSpec MuonWithAdamW::ParamStateSpec(const OptimizerOptions& options) const {
  return AsMuon(options) ? Muon::MuonStateSpec() : AdamW::ParamStateSpec(options);
}

std::string MuonWithAdamW::RefuseShape(const OptimizerOptions& options, const Shape& shape) const {
  return AsMuon(options) ? Muon::RefuseMuonShape(shape, sharding_ != nullptr) : "";
}

void MuonWithAdamW::StepGroup(const ParamGroup& group, const std::vector<ParamUpdate>& updates) {
  if (const MuonOptions* muon = AsMuon(group.options())) {
    Muon::StepMuon(*muon, ns_dtype_, updates, sharding_.get(), &orthogonalised_);
  } else {
    AdamW::StepGroup(group, updates);
  }
}

}  // namespace tg::optim
