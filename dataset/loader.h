// Batching with exactly resumable state: IndexBatcher (shuffled epochs of example indices),
// ImageBatcher (the same, gathering image and label rows), and TokenBatcher (nanoGPT's random
// [B, T] windows of a token stream, plus a deterministic sequential pass for evaluation).
//
//   tg::data::BatcherOptions o;
//   o.batch_size = 64;
//   o.seed = 1337;
//   tg::data::ImageBatcher batches(train.images, train.labels, o);
//   for (int64_t step = 0; step < steps; ++step) {
//     tg::data::ImageBatcher::Batch b = batches.Next();
//     // b.images: f32 [64, 1, 28, 28], b.labels: i64 [64]
//     ...
//   }
//   checkpoint.Merge("data.", batches.state_dict());     // later: load_state_dict(Sub("data."))
//
//   tg::data::TokenBatcher gpt(std::move(split.train), /*batch_size=*/12,
//                              /*block_size=*/256, /*seed=*/1337);
//   tg::data::TokenBatcher::Batch xy = gpt.Next();   // xy.x, xy.y: i64 [12, 256]
//
// Randomness comes only from a tg::Generator (Philox) owned by the batcher:
// - UniformBelow(gen, bound) is unbiased: for bound <= 2^32 it draws x = gen.NextU32() until
//   x >= (2^32 - bound) % bound and returns x % bound; for larger bounds the same with
//   x = (NextU32() << 32) | NextU32() and 2^64.
// - An epoch's order is the Fisher-Yates shuffle of [0, N): for i = N-1 down to 1,
//   swap(order[i], order[UniformBelow(gen, i + 1)]). With shuffle = false it is 0..N-1.
// - IndexBatcher::State is (epoch, position in the epoch, generator state before the epoch's
//   shuffle): set_state redraws that shuffle and continues from `position`, so a restored
//   batcher returns exactly the batches the saved one would have. After the last batch of an
//   epoch the next epoch starts at once (state() then says position 0 of the next epoch).
// - TokenBatcher's state is its generator state; Next() draws B offsets in order.
// state_dict() stores every integer as a double (64-bit values split in 32-bit halves), so it is
// exact; load_state_dict validates every entry and throws tg::Error naming the bad one.
#ifndef TAPEGRAD_DATASET_LOADER_H_
#define TAPEGRAD_DATASET_LOADER_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "tensor/generator.h"
#include "tensor/state_dict.h"
#include "tensor/tensor.h"

namespace tg::data {

// An unbiased draw from [0, bound), bound >= 1 (the rule above).
uint64_t UniformBelow(Generator& gen, uint64_t bound);

// Rows `indices` of x along dim 0: [indices.size(), x.shape()[1:]...], x's dtype, contiguous.
// Throws tg::Error for an index outside [0, x.size(0)) or a non-CPU tensor.
RawTensor GatherRows(const RawTensor& x, absl::Span<const int64_t> indices);

struct BatcherOptions {
  int64_t batch_size = 1;
  uint64_t seed = 0;
  // false: every epoch visits 0..N-1 in order (evaluation).
  bool shuffle = true;
  // false: an epoch's last batch holds the N % batch_size leftover examples when there are any;
  // true: those examples are skipped for that epoch (needs N >= batch_size).
  bool drop_last = false;
};

class IndexBatcher {
 public:
  struct State {
    int64_t epoch = 0;             // the epoch of the next batch, from 0
    int64_t position = 0;          // examples of that epoch's order already returned
    Generator::State epoch_start;  // the generator before that epoch's order was drawn
    bool operator==(const State& o) const {
      return epoch == o.epoch && position == o.position && epoch_start == o.epoch_start;
    }
  };

  // num_examples >= 1, batch_size >= 1 (tg::Error otherwise). Draws epoch 0's order.
  IndexBatcher(int64_t num_examples, const BatcherOptions& options);

  // The next batch: batch_size indices (fewer for a partial last batch), crossing into the next
  // epoch after an epoch's last batch.
  std::vector<int64_t> Next();

  int64_t num_examples() const { return num_examples_; }
  int64_t batch_size() const { return options_.batch_size; }
  const BatcherOptions& options() const { return options_; }
  // ceil(N / B), or floor(N / B) with drop_last.
  int64_t batches_per_epoch() const;
  int64_t epoch() const { return state_.epoch; }
  // The current epoch's order, a permutation of [0, N).
  const std::vector<int64_t>& order() const { return order_; }

  State state() const { return state_; }
  // Throws tg::Error unless epoch >= 0 and 0 <= position < N (position + batch_size <= N with
  // drop_last).
  void set_state(const State& state);
  // Scalars "epoch", "position", "num_examples", "generator.seed_lo/_hi",
  // "generator.offset_lo/_hi". load_state_dict also checks that num_examples matches.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state_dict);
  // The generator state that epoch `epoch` (>= 0) starts with: replayed from the seed, one order
  // per epoch (epoch * N draws; Fashion-MNIST's 10 epochs take milliseconds). A resumed run
  // compares the checkpoint's state with it, so a changed offset cannot silently reorder the
  // data; bound `epoch` by the run's own count first.
  Generator::State EpochStart(int64_t epoch) const;

 private:
  // Draws order_ from gen_ (which must stand at state_.epoch_start).
  void DrawOrder();

  int64_t num_examples_;
  BatcherOptions options_;
  Generator gen_;
  State state_;
  std::vector<int64_t> order_;
};

// An IndexBatcher that gathers the rows of a data set.
class ImageBatcher {
 public:
  struct Batch {
    RawTensor images;  // [b, images.shape()[1:]...], the images' dtype (f32 [b, 1, 28, 28])
    RawTensor labels;  // [b], the labels' dtype (i64)
    std::vector<int64_t> indices;  // the example indices of the batch, in order
  };

  // images [N, ...] and labels [N] on the CPU (tg::Error otherwise).
  ImageBatcher(RawTensor images, RawTensor labels, const BatcherOptions& options);

  Batch Next();
  // Data parallel: the same batch as Next() (the same indices, the same state afterwards), but
  // only part `part` of `parts` equal parts of its rows is read: images and labels hold rows
  // [part * b / parts, (part + 1) * b / parts), `indices` the whole batch's. tg::Error when the
  // batch's b rows do not split evenly.
  Batch Next(int64_t part, int64_t parts);
  const IndexBatcher& indices() const { return indices_; }
  int64_t batches_per_epoch() const { return indices_.batches_per_epoch(); }
  int64_t epoch() const { return indices_.epoch(); }
  IndexBatcher::State state() const { return indices_.state(); }
  void set_state(const IndexBatcher::State& state) { indices_.set_state(state); }
  StateDict state_dict() const { return indices_.state_dict(); }
  void load_state_dict(const StateDict& state_dict) { indices_.load_state_dict(state_dict); }

 private:
  RawTensor images_;
  RawTensor labels_;
  IndexBatcher indices_;
};

class TokenBatcher {
 public:
  struct Batch {
    RawTensor x;  // i64 [B, T]: tokens[o_b + t]
    RawTensor y;  // i64 [B, T]: tokens[o_b + t + 1], the next-token targets
  };

  // Needs at least block_size + 1 tokens (one window and its targets), batch_size >= 1 and
  // block_size >= 1; throws tg::Error otherwise, with the counts.
  TokenBatcher(std::vector<uint16_t> tokens, int64_t batch_size, int64_t block_size, uint64_t seed);

  // nanoGPT's get_batch: B offsets o_b = UniformBelow(gen, n - T), i.e. in [0, n - T - 1].
  Batch Next();
  // Data parallel: the windows of part `part` of `parts` equal parts of the batch Next() would
  // return (all B offsets are drawn, so the generator moves as in Next(); only [part * B / parts,
  // (part + 1) * B / parts) are read). tg::Error when B does not split evenly.
  Batch Next(int64_t part, int64_t parts);

  // Evaluation: the (n - 1) / T consecutive non-overlapping windows o = k * T, in order, B per
  // batch; the last batch holds the remaining windows (fewer than B when B does not divide the
  // window count). Deterministic and independent of the generator.
  int64_t num_eval_windows() const { return (num_tokens() - 1) / block_size_; }
  int64_t num_eval_batches() const;
  Batch EvalBatch(int64_t index) const;

  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t batch_size() const { return batch_size_; }
  int64_t block_size() const { return block_size_; }
  const std::vector<uint16_t>& tokens() const { return tokens_; }

  Generator::State state() const { return gen_.state(); }
  void set_state(const Generator::State& state) { gen_.set_state(state); }
  // Scalars "num_tokens", "generator.seed_lo/_hi", "generator.offset_lo/_hi"; load_state_dict
  // checks that num_tokens matches.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state_dict);
  // The generator state after `batches` (>= 0) calls of Next() from the start: replayed from the
  // seed (batches * B draws, far cheaper than the steps they stand for). A resumed run compares
  // the checkpoint's state with it for its step count.
  Generator::State StateAfter(int64_t batches) const;

 private:
  Batch Windows(absl::Span<const int64_t> offsets) const;

  std::vector<uint16_t> tokens_;
  int64_t batch_size_;
  int64_t block_size_;
  uint64_t seed_;
  Generator gen_;
};

}  // namespace tg::data

#endif  // TAPEGRAD_DATASET_LOADER_H_
