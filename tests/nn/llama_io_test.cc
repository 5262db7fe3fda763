// nn/models/llama_io.h against transformers 5.24: checkpoint directories that save_pretrained
// wrote (tests/nn/llama_io_reference.py: a Llama with grouped-query attention and llama3 rope
// scaling in f32, a sharded bf16 Qwen2 with a tied head, an f16 Mistral with a sliding window) load
// and give transformers' logits; an export holds the same bits and loads back; config.json's
// fields are checked against their meaning and the tensors' shapes, with messages naming both.
#include "nn/models/llama_io.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "autograd/grad_mode.h"
#include "gtest/gtest.h"
#include "tensor/io/safetensors.h"
#include "tests/tensor/throws.h"

namespace tg::nn {
namespace {

const char kData[] = "tests/nn/testdata/";

RawTensor Tokens() {
  std::vector<int64_t> v;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 7; ++t) v.push_back((7 * b + 5 * t + 3) % 48);
  return RawTensor::FromVector<int64_t>(v, {2, 7});
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

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// A copy of testdata/<name> under TEST_TMPDIR/<copy> whose config.json is `edit` applied to the
// original's text.
std::string CopyWithConfig(const std::string& name, const std::string& copy,
                           const std::vector<std::pair<std::string, std::string>>& edit) {
  const std::string from = kData + name, to = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", copy);
  ::mkdir(to.c_str(), 0755);
  WriteText(to + "/model.safetensors", ReadText(from + "/model.safetensors"));
  const std::string config = ReadText(from + "/config.json");
  const std::string edited = absl::StrReplaceAll(config, edit);
  EXPECT_NE(config, edited) << "the edit changed nothing";
  WriteText(to + "/config.json", edited);
  return to;
}

struct Case {
  const char* dir;
  LlamaFamily family;
  DType dtype;
  const char* format;
  // The largest relative logit error against transformers in the file's dtype (see below).
  double low_precision_bound;
};

// f32: both sides compute the same ops in f32, but the sums (matmuls of length <= 40, softmax,
// the mean of squares) run in other orders and transformers' eager attention materialises the
// scores where tapegrad runs its fused kernel: each sum of n terms of size O(1) differs by at most
// n * 2^-24 relative, about 2.4e-6 for n = 40, and two layers add a few such; 1e-5 holds them with
// room and is far below any wrong formula (a misplaced norm or scale moves logits by 1e-2).
// bf16 / f16: every op rounds its result to 8 (11) significant bits on both sides, so one
// rounding decision that falls the other way (a sum a few f32 ulps apart, then rounded) moves an
// intermediate by one ulp, 2^-8 (2^-11) relative, and such flips accumulate through two layers:
// a few ulps of the logits' scale. The bounds are 4 ulps: 4 * 2^-8 for bf16, 4 * 2^-11 for f16.
class LlamaCheckpointTest : public ::testing::TestWithParam<Case> {};

TEST_P(LlamaCheckpointTest, LoadsAndGivesTransformersLogits) {
  absl::StatusOr<LlamaCheckpoint> ckpt = LoadLlamaCheckpoint(kData + std::string(GetParam().dir));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->settings.family, GetParam().family);
  EXPECT_EQ(ckpt->file_dtype, GetParam().dtype);
  EXPECT_EQ(ckpt->format, GetParam().format);
  absl::StatusOr<io::Safetensors> expected =
      io::LoadSafetensors(absl::StrCat(kData, GetParam().dir, "/expected.safetensors"));
  ASSERT_TRUE(expected.ok()) << expected.status();

  Generator gen(0);
  LlamaForCausalLM model(ckpt->config, gen);
  model.load_state_dict(ckpt->weights);  // strict: every name, every shape
  NoGradGuard no_grad;
  const RawTensor logits_f32 = model(Tensor(Tokens())).data();
  const double f32_error = RelativeError(logits_f32, expected->tensors.at("logits_f32"));
  EXPECT_LT(f32_error, 1e-5);
  std::printf("%s: f32 logits within %.3g (relative)\n", GetParam().dir, f32_error);
  if (GetParam().dtype != kF32) {
    model.to(GetParam().dtype);
    const RawTensor logits = model(Tensor(Tokens())).data();
    EXPECT_EQ(logits.dtype(), GetParam().dtype);
    const double error = RelativeError(logits, expected->tensors.at("logits"));
    EXPECT_LT(error, GetParam().low_precision_bound);
    std::printf("%s: %s logits within %.3g (relative)\n", GetParam().dir,
                DTypeName(GetParam().dtype), error);
  }
}

TEST_P(LlamaCheckpointTest, AnExportHoldsTheFilesBitsAndLoadsBack) {
  const std::string from = kData + std::string(GetParam().dir);
  absl::StatusOr<LlamaCheckpoint> ckpt = LoadLlamaCheckpoint(from);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  Generator gen(0);
  LlamaForCausalLM model(ckpt->config, gen);
  model.load_state_dict(ckpt->weights);
  model.to(GetParam().dtype);
  // Nested and missing, as save_pretrained creates it.
  const std::string dir =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/export_", GetParam().dir, "/a/b");
  LlamaExportOptions options;
  options.settings = ckpt->settings;
  options.dtype = GetParam().dtype;
  ASSERT_TRUE(ExportLlamaHf(model, dir, options).ok());

  // Every tensor with the bits save_pretrained wrote (the widening to f32 and back is exact).
  absl::StatusOr<io::Safetensors> written = io::LoadSafetensors(dir + "/model.safetensors");
  ASSERT_TRUE(written.ok()) << written.status();
  absl::StatusOr<LlamaCheckpoint> back = LoadLlamaCheckpoint(dir);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->file_dtype, GetParam().dtype);
  EXPECT_EQ(back->settings.family, GetParam().family);
  EXPECT_EQ(written->tensors.size(), ckpt->weights.tensors.size());
  for (const auto& [name, t] : ckpt->weights.tensors) {
    ASSERT_EQ(written->tensors.count(name), 1u) << name;
    const RawTensor& w = written->tensors.at(name);
    EXPECT_EQ(w.dtype(), GetParam().dtype) << name;
    EXPECT_EQ(w.to(kF32).to_vector<float>(), t.to_vector<float>()) << name;
    EXPECT_EQ(back->weights.tensors.at(name).to_vector<float>(), t.to_vector<float>()) << name;
  }
  // The config reads back as the same model.
  const LlamaConfig& a = ckpt->config;
  const LlamaConfig& b = back->config;
  EXPECT_EQ(b.vocab_size, a.vocab_size);
  EXPECT_EQ(b.hidden_size, a.hidden_size);
  EXPECT_EQ(b.intermediate_size, a.intermediate_size);
  EXPECT_EQ(b.num_hidden_layers, a.num_hidden_layers);
  EXPECT_EQ(b.num_attention_heads, a.num_attention_heads);
  EXPECT_EQ(b.kv_heads(), a.kv_heads());
  EXPECT_EQ(b.head_size(), a.head_size());
  EXPECT_EQ(b.max_position_embeddings, a.max_position_embeddings);
  EXPECT_EQ(b.rms_norm_eps, a.rms_norm_eps);
  EXPECT_EQ(b.rope.theta, a.rope.theta);
  EXPECT_EQ(b.rope.scaling, a.rope.scaling);
  EXPECT_EQ(b.rope.factor, a.rope.factor);
  EXPECT_EQ(b.rope.original_max_position_embeddings, a.rope.original_max_position_embeddings);
  EXPECT_EQ(b.tie_word_embeddings, a.tie_word_embeddings);
  EXPECT_EQ(b.attention_bias, a.attention_bias);
  EXPECT_EQ(b.o_proj_bias, a.o_proj_bias);
  EXPECT_EQ(b.sliding_window, a.sliding_window);
}

INSTANTIATE_TEST_SUITE_P(SavePretrained, LlamaCheckpointTest,
                         ::testing::Values(Case{"hf_llama_gqa_llama3", LlamaFamily::kLlama, kF32,
                                                "HuggingFace safetensors", 0},
                                           Case{"hf_qwen2_bf16_sharded", LlamaFamily::kQwen2, kBF16,
                                                "HuggingFace safetensors, 3 shards", 4.0 / 256},
                                           Case{"hf_mistral_f16", LlamaFamily::kMistral, kF16,
                                                "HuggingFace safetensors", 4.0 / 2048}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.dir);
                         });

TEST(LlamaIoTest, ConfigsAreReadAsTransformersReadsThem) {
  absl::StatusOr<LlamaCheckpoint> llama =
      LoadLlamaCheckpoint(kData + std::string("hf_llama_gqa_llama3"));
  ASSERT_TRUE(llama.ok()) << llama.status();
  const LlamaConfig& c = llama->config;
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.kv_heads(), 2);
  EXPECT_EQ(c.head_size(), 8);
  EXPECT_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.scaling, RopeScaling::kLlama3);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 16);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(llama->settings.bos_token_id, std::vector<int64_t>{1});
  EXPECT_EQ(llama->settings.eos_token_id, std::vector<int64_t>{2});

  absl::StatusOr<LlamaCheckpoint> qwen = LoadLlamaCheckpoint(
      kData + std::string("hf_qwen2_bf16_sharded/model.safetensors.index.json"));
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(qwen->config.kv_heads(), 1);
  EXPECT_EQ(qwen->config.head_size(), 16);  // not hidden_size / heads = 8
  EXPECT_TRUE(qwen->config.attention_bias);
  EXPECT_FALSE(qwen->config.o_proj_bias);
  EXPECT_TRUE(qwen->config.tie_word_embeddings);
  EXPECT_EQ(qwen->weights.tensors.count("lm_head.weight"), 0u);

  absl::StatusOr<LlamaCheckpoint> mistral =
      LoadLlamaCheckpoint(kData + std::string("hf_mistral_f16"));
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_EQ(mistral->config.sliding_window, 64);

  // transformers 4.x's spelling of the same rotary settings: rope_theta and rope_scaling.
  const std::string v4 = R"({"model_type": "llama", "vocab_size": 48, "hidden_size": 32,
      "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "max_position_embeddings": 128, "rope_theta": 500000.0,
      "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 16}, "eos_token_id": [2, 7]})";
  absl::StatusOr<std::pair<LlamaConfig, LlamaHfSettings>> old = ParseLlamaConfigJson(v4, "v4");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->first.rope.theta, 500000.0);
  EXPECT_EQ(old->first.rope.scaling, RopeScaling::kLlama3);
  EXPECT_EQ(old->first.rope.factor, 8.0);
  EXPECT_EQ(old->first.rope.high_freq_factor, 4.0);
  EXPECT_EQ(old->first.rope.original_max_position_embeddings, 16);
  EXPECT_EQ(old->first.rms_norm_eps, 1e-6);  // transformers' default
  EXPECT_EQ(old->second.eos_token_id, (std::vector<int64_t>{2, 7}));
  // Written back and read again: the same fields.
  absl::StatusOr<std::pair<LlamaConfig, LlamaHfSettings>> again =
      ParseLlamaConfigJson(LlamaHfConfigJson(old->first, old->second, kBF16), "again");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->first.rope.factor, 8.0);
  EXPECT_EQ(again->first.rope.low_freq_factor, 1.0);
  EXPECT_EQ(again->first.rms_norm_eps, 1e-6);
  EXPECT_EQ(again->second.eos_token_id, (std::vector<int64_t>{2, 7}));
}

TEST(LlamaIoTest, TensorShapesAreTheModelsParameters) {
  for (const bool tied : {false, true}) {
    LlamaConfig c;
    c.vocab_size = 48;
    c.hidden_size = 32;
    c.intermediate_size = 40;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 1;
    c.head_dim = 16;
    c.attention_bias = true;
    c.tie_word_embeddings = tied;
    Generator gen(0);
    LlamaForCausalLM model(c, gen);
    const std::vector<LlamaTensorShape> shapes = LlamaTensorShapes(c);
    const auto params = model.named_parameters();
    ASSERT_EQ(shapes.size(), params.size());
    size_t i = 0;
    for (const auto& [name, p] : params) {
      EXPECT_EQ(shapes[i].name, name);
      EXPECT_EQ(shapes[i].shape, p.shape()) << name;
      ++i;
    }
  }
}

// Each config.json field that changes what the model computes, given a value tapegrad does not
// compute, is refused naming the file, the field and the value.
TEST(LlamaIoTest, FieldsThatTapegradDoesNotComputeAreRefused) {
  const std::string base = R"({"model_type": "llama", "vocab_size": 48, "hidden_size": 32,
      "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4,
      "max_position_embeddings": 128 EXTRA})";
  struct Refusal {
    std::string extra, message;
  };
  const std::vector<Refusal> refusals = {
      {R"(, "hidden_act": "gelu")",
       "c: 'hidden_act' is \"gelu\"; tapegrad's SwiGLU MLP computes \"silu\""},
      {R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0})",
       "c: 'rope_scaling.rope_type' is \"yarn\"; tapegrad's rotary embeddings compute \"default\" "
       "and \"llama3\""},
      {R"(, "rope_parameters": {"rope_type": "linear", "rope_theta": 1e4})",
       "c: 'rope_parameters.rope_type' is \"linear\"; tapegrad's rotary embeddings compute "
       "\"default\" and \"llama3\""},
      {R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0})",
       "c: 'rope_scaling.rope_type' \"llama3\" needs 'rope_scaling.high_freq_factor'"},
      {R"(, "attention_dropout": 0.1)",
       "c: 'attention_dropout' is 0.1; tapegrad's Llama decoder has no dropout (0.0)"},
      {R"(, "num_key_value_heads": 3)",
       "c: 'num_key_value_heads' is 3; expected a divisor of num_attention_heads 4"},
      {R"(, "head_dim": 7)",
       "c: the head size 7 ('head_dim', or hidden_size / "
       "num_attention_heads) must be even (rotary embeddings rotate pairs)"},
      {R"(, "rms_norm_eps": -1)", "c: 'rms_norm_eps' is -1; expected a number in (0, 1]"},
      {R"(, "tie_word_embeddings": "yes")",
       "c: 'tie_word_embeddings' is \"yes\"; expected true or false"},
      {R"(, "eos_token_id": 48)",
       "c: 'eos_token_id' is 48; expected a token id in [0, 48), a list of them, or null"},
      {R"(, "architectures": ["LlamaForSequenceClassification"])",
       "c: 'architectures' is [\"LlamaForSequenceClassification\"]; expected "
       "[\"LlamaForCausalLM\"] for model_type \"llama\""},
  };
  for (const Refusal& r : refusals) {
    absl::StatusOr<std::pair<LlamaConfig, LlamaHfSettings>> parsed =
        ParseLlamaConfigJson(absl::StrReplaceAll(base, {{"EXTRA", r.extra}}), "c");
    ASSERT_FALSE(parsed.ok()) << r.extra;
    EXPECT_EQ(parsed.status().message(), r.message);
  }
  EXPECT_EQ(ParseLlamaConfigJson(R"({"model_type": "qwen3"})", "c").status().message(),
            "c: 'model_type' is \"qwen3\"; tapegrad's Llama decoder reads \"llama\", \"qwen2\" "
            "and \"mistral\"");
  // Qwen2 without its sliding-window fields: accepted, with its q, k, v biases.
  absl::StatusOr<std::pair<LlamaConfig, LlamaHfSettings>> qwen = ParseLlamaConfigJson(
      absl::StrReplaceAll(base, {{"EXTRA", ""}, {"\"llama\"", "\"qwen2\""}}), "c");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_TRUE(qwen->first.attention_bias);
  EXPECT_EQ(
      ParseLlamaConfigJson(absl::StrReplaceAll(base, {{"EXTRA", R"(, "use_sliding_window": true)"},
                                                      {"\"llama\"", "\"qwen2\""}}),
                           "c")
          .status()
          .message(),
      "c: 'use_sliding_window' is true; tapegrad's Llama decoder computes full attention in "
      "every layer (false)");
  EXPECT_EQ(ParseLlamaConfigJson(
                absl::StrReplaceAll(base, {{", \"hidden_size\": 32", ""}, {"EXTRA", ""}}), "c")
                .status()
                .message(),
            "c has no 'hidden_size'");
}

// The shapes against config.json: a field that disagrees with a tensor names both.
TEST(LlamaIoTest, ShapesThatDisagreeWithTheConfigAreRefused) {
  const std::string name = "hf_llama_gqa_llama3";
  auto load = [&](const std::string& copy,
                  const std::vector<std::pair<std::string, std::string>>& edit) {
    return LoadLlamaCheckpoint(CopyWithConfig(name, copy, edit)).status();
  };
  const std::string tmp = std::getenv("TEST_TMPDIR");
  absl::Status s = load("kv", {{"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 4"}});
  EXPECT_EQ(s.message(),
            absl::StrCat("Llama safetensors '", tmp,
                         "/kv/model.safetensors': tensor 'model.layers.0.self_attn.k_proj.weight' "
                         "has shape [16, 32]; '",
                         tmp,
                         "/kv/config.json' says [32, 32] (num_key_value_heads 4 x head_dim 8, "
                         "hidden_size 32)"));
  s = load("layers", {{"\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3"}});
  EXPECT_EQ(s.message(),
            absl::StrCat("Llama safetensors '", tmp,
                         "/layers/model.safetensors': missing tensor "
                         "'model.layers.2.self_attn.q_proj.weight' (num_attention_heads 4 x "
                         "head_dim 8, hidden_size 32 in '",
                         tmp, "/layers/config.json')"));
  s = load("fewer", {{"\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1"}});
  EXPECT_EQ(s.message(),
            absl::StrCat("Llama safetensors '", tmp,
                         "/fewer/model.safetensors': unexpected tensor "
                         "'model.layers.1.input_layernorm.weight' of shape [32] (not part of a "
                         "LlamaForCausalLM with 1 layers, no attention biases as '",
                         tmp, "/fewer/config.json' describes)"));
  s = load("tied", {{"\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true"}});
  EXPECT_EQ(s.message(), absl::StrCat("Llama safetensors '", tmp,
                                      "/tied/model.safetensors': 'lm_head.weight' differs from "
                                      "'model.embed_tokens.weight', but '",
                                      tmp, "/tied/config.json' says 'tie_word_embeddings': true"));
  // No config.json: the head counts are not in the shapes.
  const std::string bare = tmp + "/bare";
  ::mkdir(bare.c_str(), 0755);
  WriteText(bare + "/model.safetensors", ReadText(kData + name + "/model.safetensors"));
  s = LoadLlamaCheckpoint(bare).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), absl::StrCat("LoadLlamaCheckpoint: '", bare,
                                      "/model.safetensors' has no config.json "
                                      "beside it ('",
                                      bare,
                                      "/config.json'): the head counts, rotary settings "
                                      "and norm epsilon are not in the tensors' shapes"));
}

TEST(LlamaIoTest, ExportRefusesWhatTheFamilyCannotHold) {
  LlamaConfig c;
  c.vocab_size = 16;
  c.hidden_size = 8;
  c.intermediate_size = 8;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  Generator gen(0);
  LlamaForCausalLM no_bias(c, gen);
  LlamaExportOptions qwen;
  qwen.settings.family = LlamaFamily::kQwen2;
  EXPECT_EQ(ExportLlamaHf(no_bias, std::getenv("TEST_TMPDIR") + std::string("/q"), qwen).message(),
            "ExportLlamaHf: model_type \"qwen2\" cannot hold this model: Qwen2 has biases on q, k "
            "and v and nowhere else");
  LlamaExportOptions ints;
  ints.dtype = kI64;
  EXPECT_EQ(ExportLlamaHf(no_bias, std::getenv("TEST_TMPDIR") + std::string("/i"), ints).message(),
            "ExportLlamaHf: dtype i64; expected f32, bf16 or f16");
}

TEST(LlamaIoTest, SequencesLongerThanTheSlidingWindowAreRefused) {
  LlamaConfig c;
  c.vocab_size = 48;
  c.hidden_size = 8;
  c.intermediate_size = 8;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.sliding_window = 6;
  Generator gen(0);
  LlamaForCausalLM model(c, gen);
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { model(Tensor(Tokens())); },
      "Llama: sequence length 7 exceeds sliding_window 6 (full causal attention equals the "
      "sliding window only up to its length)"));
  c.sliding_window = 7;
  LlamaForCausalLM fits(c, gen);
  EXPECT_EQ(fits(Tensor(Tokens())).shape(), (Shape{2, 7, 48}));
}

}  // namespace
}  // namespace tg::nn
