// GPT: parameter counts (GPT-2 small: 124,475,904), names, shapes, causality, the initial loss,
// learning a fixed sequence, seeded sampling, errors.
#include "nn/models/gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "autograd/ops.h"
#include "nn/loss.h"
#include "optim/adam.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace nn {
namespace {

TEST(GptTest, ParameterCountsMatchTheConfig) {
  EXPECT_EQ(GptConfig::Gpt2Small().NumParameters(), 124475904);  // llm.c's figure
  Generator gen(0);
  GptConfig c = GptConfig::Tiny(65);
  Gpt tiny(c, gen);
  EXPECT_EQ(tiny.num_parameters(), c.NumParameters());
  c.padded_vocab_size = 128;
  c.bias = false;
  Gpt padded(c, gen);
  EXPECT_EQ(padded.num_parameters(), c.NumParameters());
  EXPECT_EQ(padded.state_dict().tensor("wte.weight").shape(), (Shape{128, 64}));
}

TEST(GptTest, NamesFollowTheTree) {
  Generator gen(0);
  GptConfig c = GptConfig::Tiny(11);
  c.n_layer = 1;
  Gpt model(c, gen);
  std::vector<std::string> names;
  for (const auto& e : model.named_parameters()) names.push_back(e.first);
  EXPECT_EQ(names.front(), "wte.weight");
  EXPECT_EQ(names[2], "blocks.0.ln1.weight");
  EXPECT_EQ(names[4], "blocks.0.attn.qkv.weight");
  EXPECT_EQ(names.back(), "ln_f.bias");
  EXPECT_EQ(names.size(), 2u + 12u + 2u);
}

TEST(GptTest, ShapesCausalityAndInitialLoss) {
  Generator gen(1);
  GptConfig c = GptConfig::Tiny(50);
  c.padded_vocab_size = 64;
  Gpt model(c, gen);
  RawTensor tokens = RawTensor::FromVector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  RawTensor logits = model(Tensor(tokens)).data();
  EXPECT_EQ(logits.shape(), (Shape{2, 4, 50}));  // padding rows dropped
  RawTensor changed = tokens.clone();
  changed.select(1, 3).fill_(0);
  RawTensor logits2 = model(Tensor(changed)).data();
  EXPECT_EQ(logits.slice(1, 0, 3).to_vector<float>(), logits2.slice(1, 0, 3).to_vector<float>());
  // Small initial weights: the loss starts at about ln(vocab).
  // (Targets other than the inputs: the tied head favours the input token itself.)
  RawTensor targets = RawTensor::FromVector<int64_t>({20, 31, 42, 13, 24, 35, 46, 17}, {2, 4});
  double loss = CrossEntropyLoss(Tensor(logits), targets).item();
  EXPECT_NEAR(loss, std::log(50.0), 0.1);
}

TEST(GptTest, LearnsAFixedSequenceAndSamplesIt) {
  Generator gen(2);
  GptConfig c = GptConfig::Tiny(8);
  c.block_size = 8;
  c.n_layer = 1;
  c.n_embd = 32;
  Gpt model(c, gen);
  // The cyclic sequence 0 1 2 ... 7 0 1 ...: each next token is determined by the current one.
  std::vector<int64_t> seq;
  for (int i = 0; i < 9; ++i) seq.push_back(i % 8);
  RawTensor x =
      RawTensor::FromVector<int64_t>(std::vector<int64_t>(seq.begin(), seq.end() - 1), {1, 8});
  RawTensor y =
      RawTensor::FromVector<int64_t>(std::vector<int64_t>(seq.begin() + 1, seq.end()), {1, 8});
  optim::AdamWOptions o;
  o.lr(1e-2);
  o.weight_decay(0);
  optim::AdamW opt(model.parameters(), o);
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    opt.zero_grad();
    Tensor loss = CrossEntropyLoss(model(Tensor(x)), y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  EXPECT_LT(last, 0.05 * first) << first << " -> " << last;
  Generator sample_a(9), sample_b(9);
  // The model saw the sequence only from position 0, so sample within one window.
  std::vector<int64_t> a = model.Generate({0}, 7, sample_a, /*temperature=*/1.0, /*top_k=*/2);
  std::vector<int64_t> b = model.Generate({0}, 7, sample_b, 1.0, 2);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(model.is_training());  // restored after sampling
}

TEST(GptTest, BadInputsThrow) {
  Generator gen(3);
  Gpt model(GptConfig::Tiny(10), gen);
  EXPECT_TRUE(::tg::testing::ThrowsErrorExactly(
      [&] {
        model(Tensor(RawTensor::Zeros({1, 65}, kI64)));
      },
      "Gpt: sequence length 65 exceeds block_size 64"));
  EXPECT_TRUE(::tg::testing::ThrowsErrorExactly([&] { model.Generate({12}, 1, gen); },
                                                "Gpt::Generate: prompt token 12 is outside the "
                                                "vocabulary [0, 10)"));
}

}  // namespace
}  // namespace nn
}  // namespace tg
