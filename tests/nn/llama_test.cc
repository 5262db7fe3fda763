// nn::LlamaForCausalLM against transformers' LlamaForCausalLM, Qwen2ForCausalLM (biases on q, k
// and v) and MistralForCausalLM without a sliding window (transformers 5.24, torch 2.15): a tiny
// model of each with grouped-query attention, saved by tests/nn/llama_reference.py, loads under
// transformers' names and gives its logits, loss and every parameter's gradient. Also the config
// checks, tied heads and the bf16 forward's dtypes.
#include "nn/models/llama.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "gtest/gtest.h"
#include "tensor/io/safetensors.h"
#include "tests/tensor/throws.h"

namespace tg::nn {
namespace {


LlamaConfig TinyConfig() {
  LlamaConfig c;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-6;
  return c;
}

RawTensor Tokens() {
  std::vector<int64_t> v;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 6; ++t) v.push_back((7 * b + 5 * t + 3) % 32);
  return RawTensor::FromVector<int64_t>(v, {2, 6});
}

io::Safetensors Load(const std::string& dir, const std::string& name) {
  absl::StatusOr<io::Safetensors> st =
      io::LoadSafetensors("tests/nn/testdata/" + dir + "/" + name);
  EXPECT_TRUE(st.ok()) << st.status();
  return st.ok() ? *st : io::Safetensors();
}

// The largest |a - b| over max(1, max |b|).
double RelativeError(const RawTensor& a, const RawTensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double err = 0, scale = 1;
  for (size_t i = 0; i < y.size(); ++i) {
    err = std::max(err, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return err / scale;
}

// f32 on both sides; the sums (matmuls, softmax, mean) run in other orders and transformers'
// eager attention materialises the scores where this one runs the fused kernel: a few f32
// rounding errors of O(1) values through two layers, far below 1e-5.
struct Family {
  const char* dir;
  bool qkv_bias;
};

class LlamaFamilyTest : public ::testing::TestWithParam<Family> {};

TEST_P(LlamaFamilyTest, TransformersWeightsGiveItsLogitsLossAndGradients) {
  Generator gen(0);
  LlamaConfig config = TinyConfig();
  config.attention_bias = GetParam().qkv_bias;  // Qwen2's: q, k and v; o_proj has none
  LlamaForCausalLM model(config, gen);
  const io::Safetensors weights = Load(GetParam().dir, "model.safetensors");
  StateDict sd;
  sd.tensors = weights.tensors;
  model.load_state_dict(sd);  // strict: every transformers name, nothing else
  const io::Safetensors expected = Load(GetParam().dir, "expected.safetensors");

  const Tensor logits = model(Tensor(Tokens()));
  ASSERT_EQ(logits.shape(), (Shape{2, 6, 32}));
  EXPECT_LT(RelativeError(logits.data(), expected.tensors.at("logits")), 1e-5);

  const Tensor pred = Reshape(Slice(logits, 1, 0, 5), {10, 32});
  const RawTensor next = Tokens().narrow(1, 1, 5).contiguous().reshape({10});
  const Tensor loss = CrossEntropy(pred, next);
  EXPECT_NEAR(loss.item<double>(), expected.tensors.at("loss").to_vector<double>()[0], 1e-5);
  loss.backward();
  int checked = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_LT(RelativeError(p.grad().data(), expected.tensors.at("grad." + name)), 1e-5) << name;
    ++checked;
  }
  // embed, lm_head; per layer 7 linears (+ 3 biases) and 2 norms; the final norm.
  EXPECT_EQ(checked, 2 + 2 * (9 + (GetParam().qkv_bias ? 3 : 0)) + 1);
}

INSTANTIATE_TEST_SUITE_P(Families, LlamaFamilyTest,
                         ::testing::Values(Family{"llama_tiny", false}, Family{"qwen2_tiny", true},
                                           Family{"mistral_tiny", false}),
                         [](const ::testing::TestParamInfo<Family>& info) {
                           return std::string(info.param.dir);
                         });

TEST(LlamaTest, TiedHeadUsesTheEmbeddingAndBf16KeepsItsDtype) {
  LlamaConfig c = TinyConfig();
  c.tie_word_embeddings = true;
  Generator gen(1);
  LlamaForCausalLM model(c, gen);
  for (const auto& [name, p] : model.named_parameters()) EXPECT_NE(name, "lm_head.weight");
  model.to(kBF16);
  const Tensor logits = model(Tensor(Tokens()));
  EXPECT_EQ(logits.dtype(), kBF16);
  EXPECT_EQ(logits.shape(), (Shape{2, 6, 32}));
}

TEST(LlamaTest, BadConfigsAreRefused) {
  using testing::ThrowsErrorExactly;
  Generator gen(0);
  LlamaConfig c = TinyConfig();
  c.num_key_value_heads = 3;
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { LlamaForCausalLM m(c, gen); },
      "LlamaConfig: num_attention_heads 4 must be a multiple of num_key_value_heads 3"));
  c = TinyConfig();
  c.head_dim = 5;
  EXPECT_TRUE(ThrowsErrorExactly([&] { LlamaForCausalLM m(c, gen); },
                                 "LlamaConfig: head_dim 5 must be even (rotary embeddings rotate "
                                 "pairs)"));
}

}  // namespace
}  // namespace tg::nn
