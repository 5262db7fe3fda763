// Batching (dataset/loader.h): unbiased bounded draws and the Fisher-Yates order against
// reference implementations of the documented rules, epoch and partial-batch bookkeeping,
// determinism per seed, exact resume (mid-epoch, across epochs, through a StateDict of doubles)
// and nanoGPT-style token windows.
#include "dataset/loader.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/generator.h"
#include "tests/tensor/throws.h"

namespace tg::data {
namespace {

using ::tg::testing::ThrowsError;

// The rule in loader.h, written independently.
uint64_t RefUniformBelow(Generator& gen, uint64_t bound) {
  if (bound <= (uint64_t{1} << 32)) {
    const uint64_t threshold = ((uint64_t{1} << 32) - bound) % bound;
    for (;;) {
      const uint64_t x = gen.NextU32();
      if (x >= threshold) return x % bound;
    }
  }
  const unsigned __int128 two64 = static_cast<unsigned __int128>(1) << 64;
  const uint64_t threshold = static_cast<uint64_t>((two64 - bound) % bound);
  for (;;) {
    const uint64_t hi = gen.NextU32(), lo = gen.NextU32();
    const uint64_t x = (hi << 32) | lo;
    if (x >= threshold) return x % bound;
  }
}

std::vector<int64_t> RefOrder(Generator& gen, int64_t n) {
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  for (int64_t i = n - 1; i >= 1; --i) {
    std::swap(order[i], order[RefUniformBelow(gen, static_cast<uint64_t>(i + 1))]);
  }
  return order;
}

BatcherOptions Options(int64_t batch_size, uint64_t seed, bool drop_last = false,
                       bool shuffle = true) {
  BatcherOptions o;
  o.batch_size = batch_size;
  o.seed = seed;
  o.drop_last = drop_last;
  o.shuffle = shuffle;
  return o;
}

TEST(UniformBelowTest, FollowsTheDocumentedRule) {
  for (uint64_t bound : {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{10}, uint64_t{60000},
                         (uint64_t{1} << 31) + 1, (uint64_t{1} << 32) - 1, uint64_t{1} << 32,
                         (uint64_t{1} << 32) + 1, (uint64_t{1} << 63) + 5, ~uint64_t{0}}) {
    Generator a(7), b(7);
    for (int i = 0; i < 200; ++i) {
      const uint64_t x = UniformBelow(a, bound);
      ASSERT_LT(x, bound);
      ASSERT_EQ(x, RefUniformBelow(b, bound)) << "bound " << bound << " draw " << i;
    }
    EXPECT_EQ(a.state(), b.state());
  }
  // 2^31 + 1 rejects almost half of the 32-bit draws: more draws than values.
  Generator g(1);
  for (int i = 0; i < 1000; ++i) UniformBelow(g, (uint64_t{1} << 31) + 1);
  EXPECT_GT(g.state().offset, 1300u);
  EXPECT_TRUE(ThrowsError([&] { UniformBelow(g, 0); }, "UniformBelow: bound must be at least 1"));
}

TEST(UniformBelowTest, IsRoughlyUniform) {
  Generator g(3);
  std::vector<int> counts(6, 0);
  for (int i = 0; i < 60000; ++i) ++counts[UniformBelow(g, 6)];
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);  // > 5 sigma
}

TEST(IndexBatcherTest, EpochsArePermutationsWithAPartialLastBatch) {
  IndexBatcher b(10, Options(4, 42));
  EXPECT_EQ(b.batches_per_epoch(), 3);
  std::vector<std::vector<int64_t>> epochs;
  for (int e = 0; e < 3; ++e) {
    EXPECT_EQ(b.epoch(), e);
    std::vector<int64_t> seen;
    for (size_t expected_size : {4u, 4u, 2u}) {
      const std::vector<int64_t> batch = b.Next();
      EXPECT_EQ(batch.size(), expected_size);
      seen.insert(seen.end(), batch.begin(), batch.end());
    }
    std::vector<int64_t> sorted = seen;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
    epochs.push_back(seen);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
}

TEST(IndexBatcherTest, OrderIsTheDocumentedFisherYates) {
  IndexBatcher b(37, Options(5, 1234));
  Generator ref(1234);
  for (int e = 0; e < 4; ++e) {
    const Generator::State before = ref.state();
    EXPECT_EQ(b.state().epoch_start, before);
    EXPECT_EQ(b.order(), RefOrder(ref, 37)) << "epoch " << e;
    for (int64_t k = 0; k < b.batches_per_epoch(); ++k) b.Next();
  }
}

TEST(IndexBatcherTest, DropLastSkipsTheLeftovers) {
  IndexBatcher b(10, Options(4, 5, /*drop_last=*/true));
  EXPECT_EQ(b.batches_per_epoch(), 2);
  const std::vector<int64_t> order0 = b.order();
  EXPECT_EQ(b.Next(), std::vector<int64_t>(order0.begin(), order0.begin() + 4));
  EXPECT_EQ(b.Next(), std::vector<int64_t>(order0.begin() + 4, order0.begin() + 8));
  EXPECT_EQ(b.epoch(), 1);
  EXPECT_EQ(b.state().position, 0);
  EXPECT_EQ(b.Next().size(), 4u);
  IndexBatcher exact(8, Options(4, 5, true));
  exact.Next();
  exact.Next();
  EXPECT_EQ(exact.epoch(), 1);
}

TEST(IndexBatcherTest, WithoutShuffleEveryEpochIsInOrder) {
  IndexBatcher b(5, Options(2, 9, false, /*shuffle=*/false));
  for (int e = 0; e < 2; ++e) {
    EXPECT_EQ(b.Next(), (std::vector<int64_t>{0, 1}));
    EXPECT_EQ(b.Next(), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(b.Next(), (std::vector<int64_t>{4}));
  }
}

TEST(IndexBatcherTest, SameSeedSameBatchesOtherSeedOtherBatches) {
  IndexBatcher a(100, Options(8, 77)), b(100, Options(8, 77)), c(100, Options(8, 78));
  bool differs = false;
  for (int i = 0; i < 40; ++i) {
    const std::vector<int64_t> x = a.Next();
    EXPECT_EQ(x, b.Next());
    differs = differs || x != c.Next();
  }
  EXPECT_TRUE(differs);
}

// Runs `steps` batches of a fresh batcher and records the state before each batch.
void Record(int64_t n, const BatcherOptions& o, int steps, std::vector<IndexBatcher::State>* states,
            std::vector<std::vector<int64_t>>* batches) {
  IndexBatcher b(n, o);
  for (int s = 0; s < steps; ++s) {
    states->push_back(b.state());
    batches->push_back(b.Next());
  }
}

TEST(IndexBatcherTest, ResumesExactlyFromAnyStep) {
  for (bool drop_last : {false, true}) {
    // 10 examples, batches of 3: 4 batches per epoch (3 with drop_last); 2.5 epochs and beyond.
    const BatcherOptions o = Options(3, 2024, drop_last);
    std::vector<IndexBatcher::State> states;
    std::vector<std::vector<int64_t>> batches;
    Record(10, o, 30, &states, &batches);
    for (int k = 0; k < 15; ++k) {  // 15 steps = 3.75 / 5 epochs: every position and epoch edge
      IndexBatcher resumed(10, Options(3, 999, drop_last));  // another seed: the state decides
      resumed.set_state(states[k]);
      EXPECT_EQ(resumed.state(), states[k]);
      for (int j = k; j < 30; ++j) {
        ASSERT_EQ(resumed.Next(), batches[j]) << "resumed at " << k << ", batch " << j;
      }
    }
  }
}

TEST(IndexBatcherTest, ResumesExactlyThroughAStateDictOfDoubles) {
  // A seed above 2^53 would not survive a single double; the state dict splits it.
  const uint64_t seed = (uint64_t{1} << 63) + 12345;
  IndexBatcher a(10, Options(4, seed));
  for (int i = 0; i < 7; ++i) a.Next();  // 2.33 epochs: epoch 2, position 4
  EXPECT_EQ(a.state().epoch, 2);
  EXPECT_EQ(a.state().position, 4);
  const StateDict sd = a.state_dict();
  EXPECT_EQ(sd.scalar("epoch"), 2);
  EXPECT_EQ(sd.scalar("position"), 4);
  EXPECT_EQ(sd.scalar("num_examples"), 10);
  EXPECT_EQ(sd.scalar("generator.seed_hi"), 2147483648.0);
  EXPECT_EQ(sd.scalar("generator.seed_lo"), 12345);

  IndexBatcher b(10, Options(4, 0));
  b.load_state_dict(sd);
  EXPECT_EQ(b.state(), a.state());
  for (int i = 0; i < 20; ++i) ASSERT_EQ(b.Next(), a.Next()) << i;
}

TEST(IndexBatcherTest, AfterAnEpochsLastBatchTheStateIsTheNextEpochsStart) {
  IndexBatcher b(10, Options(3, 1));
  const Generator::State start0 = b.state().epoch_start;
  for (int i = 0; i < 4; ++i) b.Next();
  const IndexBatcher::State s = b.state();
  EXPECT_EQ(s.epoch, 1);
  EXPECT_EQ(s.position, 0);
  EXPECT_FALSE(s.epoch_start == start0);
  EXPECT_EQ(s.epoch_start.seed, 1u);
}

TEST(IndexBatcherTest, MisuseThrows) {
  EXPECT_TRUE(ThrowsError([] { IndexBatcher(0, Options(1, 0)); },
                          "IndexBatcher: num_examples must be at least 1, got 0"));
  EXPECT_TRUE(ThrowsError([] { IndexBatcher(5, Options(0, 0)); },
                          "IndexBatcher: batch_size must be at least 1, got 0"));
  EXPECT_TRUE(ThrowsError([] { IndexBatcher(5, Options(6, 0, true)); },
                          "IndexBatcher: drop_last with batch_size 6 and only 5 examples"));
  IndexBatcher b(10, Options(4, 0, true));
  IndexBatcher::State s = b.state();
  s.position = 10;
  EXPECT_TRUE(ThrowsError([&] { b.set_state(s); },
                          "IndexBatcher.set_state: position 10 is outside [0, 10)"));
  s.position = 7;
  EXPECT_TRUE(ThrowsError([&] { b.set_state(s); }, "leaves fewer than batch_size 4"));
  s.position = 0;
  s.epoch = -1;
  EXPECT_TRUE(ThrowsError([&] { b.set_state(s); }, "epoch must be non-negative, got -1"));
}

TEST(IndexBatcherTest, LoadStateDictValidatesEveryEntry) {
  IndexBatcher b(10, Options(4, 0));
  StateDict sd = b.state_dict();
  IndexBatcher other(11, Options(4, 0));
  EXPECT_TRUE(ThrowsError([&] { other.load_state_dict(sd); },
                          "IndexBatcher.load_state_dict: the state is for 10 examples, this "
                          "batcher has 11"));
  StateDict missing = sd;
  missing.scalars.erase("position");
  EXPECT_TRUE(ThrowsError([&] { b.load_state_dict(missing); },
                          "IndexBatcher.load_state_dict: missing scalar 'position'"));
  StateDict fractional = sd;
  fractional.scalars["generator.offset_lo"] = 1.5;
  EXPECT_TRUE(ThrowsError([&] { b.load_state_dict(fractional); },
                          "'generator.offset_lo' is 1.5; expected an integer in [0, 4294967296)"));
  StateDict extra = sd;
  extra.scalars["lr"] = 1;
  EXPECT_TRUE(ThrowsError([&] { b.load_state_dict(extra); },
                          "IndexBatcher.load_state_dict: unexpected scalar 'lr'"));
}

TEST(ImageBatcherTest, GathersTheRowsOfEachBatch) {
  std::vector<float> pixels(5 * 4);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>(i) * 0.5f;
  const RawTensor images = RawTensor::FromVector<float>(pixels, {5, 1, 2, 2});
  const RawTensor labels = RawTensor::FromVector<int64_t>({10, 11, 12, 13, 14}, {5});
  ImageBatcher b(images, labels, Options(2, 3));
  ImageBatcher same(images, labels, Options(2, 3));
  for (int step = 0; step < 7; ++step) {
    const ImageBatcher::Batch batch = b.Next();
    const int64_t rows = static_cast<int64_t>(batch.indices.size());
    EXPECT_EQ(rows, step % 3 == 2 ? 1 : 2);
    EXPECT_EQ(batch.images.shape(), (Shape{rows, 1, 2, 2}));
    EXPECT_EQ(batch.images.dtype(), kF32);
    EXPECT_EQ(batch.labels.dtype(), kI64);
    const std::vector<float> got = batch.images.to_vector<float>();
    const std::vector<int64_t> got_labels = batch.labels.to_vector<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = batch.indices[r];
      EXPECT_EQ(got_labels[r], 10 + i);
      for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(got[r * 4 + k], pixels[i * 4 + k]);
    }
    EXPECT_EQ(same.Next().indices, batch.indices);
  }
  EXPECT_TRUE(ThrowsError([&] { ImageBatcher(images, RawTensor::Zeros({4}, kI64), Options(2, 0)); },
                          "ImageBatcher: expected labels [5], got [4]"));
  EXPECT_TRUE(ThrowsError([&] { ImageBatcher(RawTensor(), labels, Options(2, 0)); },
                          "ImageBatcher: expected images [N, ...], got an undefined tensor"));
}

TEST(ImageBatcherTest, ResumesExactly) {
  const RawTensor images = RawTensor::Arange(0, 7 * 3, 1, kF32).reshape({7, 3});
  const RawTensor labels = RawTensor::Arange(0, 7, 1, kI64);
  ImageBatcher a(images, labels, Options(3, 8));
  for (int i = 0; i < 4; ++i) a.Next();
  ImageBatcher b(images, labels, Options(3, 1));
  b.load_state_dict(a.state_dict());
  for (int i = 0; i < 9; ++i) {
    const ImageBatcher::Batch x = a.Next(), y = b.Next();
    EXPECT_EQ(x.indices, y.indices);
    EXPECT_EQ(x.images.to_vector<float>(), y.images.to_vector<float>());
  }
}

TEST(GatherRowsTest, CopiesRowsInIndexOrderAndChecksIndices) {
  const RawTensor x = RawTensor::FromVector<int32_t>({1, 2, 3, 4, 5, 6}, {3, 2});
  const RawTensor g = GatherRows(x.transpose(0, 1).contiguous().transpose(0, 1), {2, 0, 2});
  EXPECT_EQ(g.shape(), (Shape{3, 2}));
  EXPECT_EQ(g.to_vector<int32_t>(), (std::vector<int32_t>{5, 6, 1, 2, 5, 6}));
  EXPECT_EQ(GatherRows(x, {}).shape(), (Shape{0, 2}));
  EXPECT_TRUE(ThrowsError(
      [&] {
        GatherRows(x, {0, 3});
      },
      "GatherRows: index 3 at position 1 is outside [0, 3) for shape [3, 2]"));
}

std::vector<uint16_t> Iota(int64_t n) {
  std::vector<uint16_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(i);
  return t;
}

TEST(TokenBatcherTest, RandomWindowsAreNanoGptsGetBatch) {
  // tokens[i] = i, so x[b, 0] is the offset.
  const int64_t n = 200, B = 6, T = 8;
  TokenBatcher tb(Iota(n), B, T, 11);
  Generator ref(11);
  for (int step = 0; step < 20; ++step) {
    const TokenBatcher::Batch batch = tb.Next();
    ASSERT_EQ(batch.x.shape(), (Shape{B, T}));
    ASSERT_EQ(batch.y.shape(), (Shape{B, T}));
    EXPECT_EQ(batch.x.dtype(), kI64);
    EXPECT_EQ(batch.y.dtype(), kI64);
    const std::vector<int64_t> x = batch.x.to_vector<int64_t>(), y = batch.y.to_vector<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      const int64_t o = static_cast<int64_t>(RefUniformBelow(ref, n - T));
      for (int64_t t = 0; t < T; ++t) {
        ASSERT_EQ(x[b * T + t], o + t);
        ASSERT_EQ(y[b * T + t], o + t + 1);
      }
    }
  }
  EXPECT_EQ(tb.state(), ref.state());
}

TEST(TokenBatcherTest, OffsetsCoverExactlyZeroToNMinusTMinusOne) {
  const int64_t T = 5;
  TokenBatcher tb(Iota(T + 3), 4, T, 2);  // offsets 0, 1, 2
  std::set<int64_t> seen;
  for (int i = 0; i < 50; ++i) {
    const std::vector<int64_t> x = tb.Next().x.to_vector<int64_t>();
    for (int64_t b = 0; b < 4; ++b) seen.insert(x[b * T]);
  }
  EXPECT_EQ(seen, (std::set<int64_t>{0, 1, 2}));
  TokenBatcher minimal(Iota(T + 1), 2, T, 2);  // a single window
  const TokenBatcher::Batch m = minimal.Next();
  EXPECT_EQ(m.x.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
  EXPECT_EQ(m.y.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3, 4, 5, 1, 2, 3, 4, 5}));
}

TEST(TokenBatcherTest, TooFewTokensIsAClearError) {
  EXPECT_TRUE(ThrowsError([] { TokenBatcher(Iota(256), 4, 256, 0); },
                          "TokenBatcher: 256 tokens are too few for block_size 256; need at least "
                          "block_size + 1 = 257 (a window and its next-token targets)"));
  EXPECT_TRUE(ThrowsError([] { TokenBatcher(Iota(10), 0, 4, 0); },
                          "TokenBatcher: batch_size must be at least 1, got 0"));
  EXPECT_TRUE(ThrowsError([] { TokenBatcher(Iota(10), 1, 0, 0); },
                          "TokenBatcher: block_size must be at least 1, got 0"));
}

TEST(TokenBatcherTest, SameSeedSameBatchesAndExactResume) {
  TokenBatcher a(Iota(1000), 4, 16, 5), b(Iota(1000), 4, 16, 5);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a.Next().x.to_vector<int64_t>(), b.Next().x.to_vector<int64_t>());
  }
  const StateDict sd = a.state_dict();
  EXPECT_EQ(sd.scalar("num_tokens"), 1000);
  std::vector<std::vector<int64_t>> expected;
  for (int i = 0; i < 5; ++i) expected.push_back(a.Next().y.to_vector<int64_t>());
  TokenBatcher c(Iota(1000), 4, 16, 123);
  c.load_state_dict(sd);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(c.Next().y.to_vector<int64_t>(), expected[i]) << i;
  TokenBatcher d(Iota(999), 4, 16, 5);
  EXPECT_TRUE(ThrowsError([&] { d.load_state_dict(sd); },
                          "TokenBatcher.load_state_dict: the state is for 1000 tokens, this "
                          "batcher has 999"));
}

TEST(TokenBatcherTest, EvalBatchesAreConsecutiveWindows) {
  // 23 tokens, T = 4: (23 - 1) / 4 = 5 windows at 0, 4, 8, 12, 16; B = 2 -> 3 batches.
  TokenBatcher tb(Iota(23), 2, 4, 0);
  const Generator::State before = tb.state();
  EXPECT_EQ(tb.num_eval_windows(), 5);
  ASSERT_EQ(tb.num_eval_batches(), 3);
  std::vector<int64_t> firsts;
  for (int64_t i = 0; i < 3; ++i) {
    const TokenBatcher::Batch b = tb.EvalBatch(i);
    const int64_t rows = b.x.size(0);
    EXPECT_EQ(rows, i < 2 ? 2 : 1);
    const std::vector<int64_t> x = b.x.to_vector<int64_t>(), y = b.y.to_vector<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      firsts.push_back(x[r * 4]);
      for (int64_t t = 0; t < 4; ++t) {
        EXPECT_EQ(x[r * 4 + t], x[r * 4] + t);
        EXPECT_EQ(y[r * 4 + t], x[r * 4] + t + 1);
      }
    }
    EXPECT_EQ(tb.EvalBatch(i).x.to_vector<int64_t>(), x);  // deterministic
  }
  EXPECT_EQ(firsts, (std::vector<int64_t>{0, 4, 8, 12, 16}));
  EXPECT_EQ(tb.state(), before);  // the generator is not touched
  EXPECT_TRUE(
      ThrowsError([&] { tb.EvalBatch(3); }, "TokenBatcher.EvalBatch: index 3 is outside [0, 3)"));
}

// A resumed run checks the checkpoint's generator state against a replay from the seed: the
// state at each epoch's start, and the token batcher's after each step's batch.
TEST(IndexBatcherTest, EpochStartIsTheReplayedGeneratorState) {
  for (const bool shuffle : {true, false}) {
    BatcherOptions o = Options(3, 7, false);
    o.shuffle = shuffle;
    IndexBatcher b(10, o);
    for (int64_t epoch = 0; epoch < 4; ++epoch) {
      EXPECT_EQ(b.state().epoch, epoch);
      EXPECT_TRUE(b.EpochStart(epoch) == b.state().epoch_start) << epoch;
      for (int64_t k = 0; k < b.batches_per_epoch(); ++k) b.Next();
    }
    EXPECT_EQ(b.EpochStart(2) == b.EpochStart(3), !shuffle);
  }
}

TEST(TokenBatcherTest, StateAfterIsTheReplayedGeneratorState) {
  TokenBatcher tb(Iota(50), 4, 5, 11);
  for (int64_t batches = 0; batches < 6; ++batches) {
    EXPECT_TRUE(tb.StateAfter(batches) == tb.state()) << batches;
    tb.Next();
  }
  EXPECT_FALSE(tb.StateAfter(2) == tb.StateAfter(3));
}

}  // namespace
}  // namespace tg::data
