#include "dataset/loader.h"

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tensor/error.h"

namespace tg::data {
namespace {

constexpr double kTwo32 = 4294967296.0;

// A scalar of `sd` that must be an integer in [0, limit); throws naming `op` and the key.
uint64_t GetUnsigned(const char* op, const StateDict& sd, const std::string& key, double limit) {
  TG_CHECK(sd.has_scalar(key), op, ": missing scalar '", key, "'");
  const double v = sd.scalar(key);
  TG_CHECK(v >= 0 && v < limit && std::floor(v) == v, op, ": '", key, "' is ", v,
           "; expected an integer in [0, ", static_cast<uint64_t>(limit), ")");
  return static_cast<uint64_t>(v);
}

void PutGenerator(const Generator::State& s, StateDict* sd) {
  sd->scalars["generator.seed_lo"] = static_cast<double>(s.seed & 0xFFFFFFFFu);
  sd->scalars["generator.seed_hi"] = static_cast<double>(s.seed >> 32);
  sd->scalars["generator.offset_lo"] = static_cast<double>(s.offset & 0xFFFFFFFFu);
  sd->scalars["generator.offset_hi"] = static_cast<double>(s.offset >> 32);
}

Generator::State GetGenerator(const char* op, const StateDict& sd) {
  Generator::State s;
  s.seed = GetUnsigned(op, sd, "generator.seed_lo", kTwo32) |
           (GetUnsigned(op, sd, "generator.seed_hi", kTwo32) << 32);
  s.offset = GetUnsigned(op, sd, "generator.offset_lo", kTwo32) |
             (GetUnsigned(op, sd, "generator.offset_hi", kTwo32) << 32);
  return s;
}

// Throws on a key outside `known` or on any tensor.
void CheckOnlyKeys(const char* op, const StateDict& sd, std::initializer_list<const char*> known) {
  for (const auto& [key, value] : sd.scalars) {
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    TG_CHECK(ok, op, ": unexpected scalar '", key, "'");
  }
  TG_CHECK(sd.tensors.empty(), op, ": unexpected tensor '",
           sd.tensors.empty() ? "" : sd.tensors.begin()->first, "'");
}

// N of images [N, ...], checked before the IndexBatcher is built.
int64_t NumRows(const RawTensor& images) {
  TG_CHECK(images.defined() && images.dim() >= 1, "ImageBatcher: expected images [N, ...], got ",
           images.defined() ? ShapeToString(images.shape()) : "an undefined tensor");
  return images.size(0);
}

}  // namespace

uint64_t UniformBelow(Generator& gen, uint64_t bound) {
  TG_CHECK(bound >= 1, "UniformBelow: bound must be at least 1, got 0");
  if (bound <= (uint64_t{1} << 32)) {
    if (bound == (uint64_t{1} << 32)) return gen.NextU32();
    const uint32_t b = static_cast<uint32_t>(bound);
    const uint32_t threshold = static_cast<uint32_t>(-b) % b;  // (2^32 - b) % b
    for (;;) {
      const uint32_t x = gen.NextU32();
      if (x >= threshold) return x % b;
    }
  }
  const uint64_t threshold = (0 - bound) % bound;  // (2^64 - bound) % bound
  for (;;) {
    const uint64_t hi = gen.NextU32();
    const uint64_t x = (hi << 32) | gen.NextU32();
    if (x >= threshold) return x % bound;
  }
}

RawTensor GatherRows(const RawTensor& x, absl::Span<const int64_t> indices) {
  TG_CHECK(x.defined(), "GatherRows: undefined tensor");
  TG_CHECK(x.device().is_cpu(), "GatherRows: expected a CPU tensor, got ", x.device().ToString());
  TG_CHECK(x.dim() >= 1, "GatherRows: expected at least 1 dim, got shape ",
           ShapeToString(x.shape()));
  const RawTensor c = x.contiguous();
  const int64_t n = c.size(0);
  Shape shape = c.shape();
  shape[0] = static_cast<int64_t>(indices.size());
  RawTensor out = RawTensor::Empty(shape, c.dtype());
  const size_t row_bytes = static_cast<size_t>(n == 0 ? 0 : c.numel() / n) * c.element_size();
  const char* src = static_cast<const char*>(c.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (size_t i = 0; i < indices.size(); ++i) {
    TG_CHECK(indices[i] >= 0 && indices[i] < n, "GatherRows: index ", indices[i], " at position ",
             i, " is outside [0, ", n, ") for shape ", ShapeToString(x.shape()));
    if (row_bytes > 0) std::memcpy(dst + i * row_bytes, src + indices[i] * row_bytes, row_bytes);
  }
  return out;
}

// ---- IndexBatcher ----

IndexBatcher::IndexBatcher(int64_t num_examples, const BatcherOptions& options)
    : num_examples_(num_examples), options_(options), gen_(options.seed) {
  TG_CHECK(num_examples >= 1, "IndexBatcher: num_examples must be at least 1, got ", num_examples);
  TG_CHECK(options.batch_size >= 1, "IndexBatcher: batch_size must be at least 1, got ",
           options.batch_size);
  TG_CHECK(!options.drop_last || options.batch_size <= num_examples,
           "IndexBatcher: drop_last with batch_size ", options.batch_size, " and only ",
           num_examples, " examples would give no batch");
  state_.epoch_start = gen_.state();
  DrawOrder();
}

int64_t IndexBatcher::batches_per_epoch() const {
  const int64_t b = options_.batch_size;
  return options_.drop_last ? num_examples_ / b : (num_examples_ + b - 1) / b;
}

void IndexBatcher::DrawOrder() {
  order_.resize(static_cast<size_t>(num_examples_));
  for (int64_t i = 0; i < num_examples_; ++i) order_[i] = i;
  if (!options_.shuffle) return;
  for (int64_t i = num_examples_ - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(UniformBelow(gen_, static_cast<uint64_t>(i) + 1));
    std::swap(order_[i], order_[j]);
  }
}

Generator::State IndexBatcher::EpochStart(int64_t epoch) const {
  TG_CHECK(epoch >= 0, "IndexBatcher.EpochStart: epoch must be non-negative, got ", epoch);
  Generator gen(options_.seed);
  if (!options_.shuffle) return gen.state();
  // DrawOrder's draws, without the permutation.
  for (int64_t e = 0; e < epoch; ++e) {
    for (int64_t i = num_examples_ - 1; i > 0; --i) UniformBelow(gen, static_cast<uint64_t>(i) + 1);
  }
  return gen.state();
}

std::vector<int64_t> IndexBatcher::Next() {
  const int64_t begin = state_.position;
  const int64_t end = std::min(num_examples_, begin + options_.batch_size);
  std::vector<int64_t> batch(order_.begin() + begin, order_.begin() + end);
  state_.position = end;
  const int64_t remaining = num_examples_ - end;
  if (remaining == 0 || (options_.drop_last && remaining < options_.batch_size)) {
    ++state_.epoch;
    state_.position = 0;
    state_.epoch_start = gen_.state();
    DrawOrder();
  }
  return batch;
}

void IndexBatcher::set_state(const State& state) {
  TG_CHECK(state.epoch >= 0, "IndexBatcher.set_state: epoch must be non-negative, got ",
           state.epoch);
  TG_CHECK(state.position >= 0 && state.position < num_examples_,
           "IndexBatcher.set_state: position ", state.position, " is outside [0, ", num_examples_,
           ")");
  TG_CHECK(!options_.drop_last || state.position + options_.batch_size <= num_examples_,
           "IndexBatcher.set_state: position ", state.position, " leaves fewer than batch_size ",
           options_.batch_size, " of ", num_examples_, " examples with drop_last");
  state_ = state;
  gen_.set_state(state.epoch_start);
  DrawOrder();
}

StateDict IndexBatcher::state_dict() const {
  StateDict sd;
  sd.scalars["epoch"] = static_cast<double>(state_.epoch);
  sd.scalars["position"] = static_cast<double>(state_.position);
  sd.scalars["num_examples"] = static_cast<double>(num_examples_);
  PutGenerator(state_.epoch_start, &sd);
  return sd;
}

void IndexBatcher::load_state_dict(const StateDict& sd) {
  const char* op = "IndexBatcher.load_state_dict";
  CheckOnlyKeys(op, sd,
                {"epoch", "position", "num_examples", "generator.seed_lo", "generator.seed_hi",
                 "generator.offset_lo", "generator.offset_hi"});
  constexpr double kTwo53 = 9007199254740992.0;
  const uint64_t n = GetUnsigned(op, sd, "num_examples", kTwo53);
  TG_CHECK(static_cast<int64_t>(n) == num_examples_, op, ": the state is for ", n,
           " examples, this batcher has ", num_examples_);
  State s;
  s.epoch = static_cast<int64_t>(GetUnsigned(op, sd, "epoch", kTwo53));
  s.position = static_cast<int64_t>(GetUnsigned(op, sd, "position", kTwo53));
  s.epoch_start = GetGenerator(op, sd);
  set_state(s);
}

// ---- ImageBatcher ----

ImageBatcher::ImageBatcher(RawTensor images, RawTensor labels, const BatcherOptions& options)
    : images_(std::move(images)), labels_(std::move(labels)), indices_(NumRows(images_), options) {
  TG_CHECK(labels_.defined() && labels_.dim() == 1 && labels_.size(0) == images_.size(0),
           "ImageBatcher: expected labels [", images_.size(0), "], got ",
           labels_.defined() ? ShapeToString(labels_.shape()) : "an undefined tensor");
  TG_CHECK(images_.device().is_cpu() && labels_.device().is_cpu(),
           "ImageBatcher: expected CPU tensors, got ", images_.device().ToString(), " and ",
           labels_.device().ToString());
  images_ = images_.contiguous();
  labels_ = labels_.contiguous();
}

ImageBatcher::Batch ImageBatcher::Next() { return Next(0, 1); }

namespace {

// Rows [part * n / parts, (part + 1) * n / parts) of n.
std::pair<int64_t, int64_t> PartOf(const char* op, int64_t n, int64_t part, int64_t parts) {
  TG_CHECK(parts >= 1 && part >= 0 && part < parts, op, ": part ", part, " is outside [0, ", parts,
           ")");
  TG_CHECK(n % parts == 0, op, ": ", n, " rows do not split evenly into ", parts, " parts");
  return {part * (n / parts), n / parts};
}

}  // namespace

ImageBatcher::Batch ImageBatcher::Next(int64_t part, int64_t parts) {
  Batch b;
  b.indices = indices_.Next();
  const auto [first, count] =
      PartOf("ImageBatcher.Next", static_cast<int64_t>(b.indices.size()), part, parts);
  const absl::Span<const int64_t> rows = absl::MakeConstSpan(b.indices).subspan(first, count);
  b.images = GatherRows(images_, rows);
  b.labels = GatherRows(labels_, rows);
  return b;
}

// ---- TokenBatcher ----

TokenBatcher::TokenBatcher(std::vector<uint16_t> tokens, int64_t batch_size, int64_t block_size,
                           uint64_t seed)
    : tokens_(std::move(tokens)),
      batch_size_(batch_size),
      block_size_(block_size),
      seed_(seed),
      gen_(seed) {
  TG_CHECK(batch_size >= 1, "TokenBatcher: batch_size must be at least 1, got ", batch_size);
  TG_CHECK(block_size >= 1, "TokenBatcher: block_size must be at least 1, got ", block_size);
  TG_CHECK(num_tokens() > block_size, "TokenBatcher: ", num_tokens(),
           " tokens are too few for block_size ", block_size,
           "; need at least block_size + 1 = ", block_size + 1,
           " (a window and its next-token targets)");
}

TokenBatcher::Batch TokenBatcher::Windows(absl::Span<const int64_t> offsets) const {
  const int64_t b = static_cast<int64_t>(offsets.size()), t = block_size_;
  Batch out;
  out.x = RawTensor::Empty({b, t}, kI64);
  out.y = RawTensor::Empty({b, t}, kI64);
  int64_t* x = out.x.data<int64_t>();
  int64_t* y = out.y.data<int64_t>();
  for (int64_t r = 0; r < b; ++r) {
    const uint16_t* src = tokens_.data() + offsets[r];
    for (int64_t k = 0; k < t; ++k) {
      x[r * t + k] = src[k];
      y[r * t + k] = src[k + 1];
    }
  }
  return out;
}

TokenBatcher::Batch TokenBatcher::Next() { return Next(0, 1); }

TokenBatcher::Batch TokenBatcher::Next(int64_t part, int64_t parts) {
  const auto [first, count] = PartOf("TokenBatcher.Next", batch_size_, part, parts);
  std::vector<int64_t> offsets(static_cast<size_t>(batch_size_));
  const uint64_t bound = static_cast<uint64_t>(num_tokens() - block_size_);
  for (int64_t& o : offsets) o = static_cast<int64_t>(UniformBelow(gen_, bound));
  return Windows(absl::MakeConstSpan(offsets).subspan(first, count));
}

Generator::State TokenBatcher::StateAfter(int64_t batches) const {
  TG_CHECK(batches >= 0, "TokenBatcher.StateAfter: batches must be non-negative, got ", batches);
  Generator gen(seed_);
  const uint64_t bound = static_cast<uint64_t>(num_tokens() - block_size_);
  for (int64_t b = 0; b < batches; ++b) {
    for (int64_t k = 0; k < batch_size_; ++k) UniformBelow(gen, bound);  // Next()'s draws
  }
  return gen.state();
}

int64_t TokenBatcher::num_eval_batches() const {
  return (num_eval_windows() + batch_size_ - 1) / batch_size_;
}

TokenBatcher::Batch TokenBatcher::EvalBatch(int64_t index) const {
  TG_CHECK(index >= 0 && index < num_eval_batches(), "TokenBatcher.EvalBatch: index ", index,
           " is outside [0, ", num_eval_batches(), ")");
  const int64_t first = index * batch_size_;
  const int64_t count = std::min(batch_size_, num_eval_windows() - first);
  std::vector<int64_t> offsets(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) offsets[i] = (first + i) * block_size_;
  return Windows(offsets);
}

StateDict TokenBatcher::state_dict() const {
  StateDict sd;
  sd.scalars["num_tokens"] = static_cast<double>(num_tokens());
  PutGenerator(gen_.state(), &sd);
  return sd;
}

void TokenBatcher::load_state_dict(const StateDict& sd) {
  const char* op = "TokenBatcher.load_state_dict";
  CheckOnlyKeys(op, sd,
                {"num_tokens", "generator.seed_lo", "generator.seed_hi", "generator.offset_lo",
                 "generator.offset_hi"});
  const uint64_t n = GetUnsigned(op, sd, "num_tokens", 9007199254740992.0);
  TG_CHECK(static_cast<int64_t>(n) == num_tokens(), op, ": the state is for ", n,
           " tokens, this batcher has ", num_tokens());
  gen_.set_state(GetGenerator(op, sd));
}

}  // namespace tg::data
