#include "nn/models/llama_io.h"

#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nn/models/hf_files.h"

namespace tg::nn {
namespace {

using hf::Json;
using hf::Quote;

constexpr char kCaller[] = "LoadLlamaCheckpoint";
// A Llama config.json is about 1 KB (Qwen2's layer_types make it a few); anything far larger
// is not one.
constexpr int64_t kMaxConfigJsonBytes = 1 << 20;

struct FamilyName {
  LlamaFamily family;
  const char* model_type;
  const char* architecture;
};
constexpr FamilyName kFamilies[] = {
    {LlamaFamily::kLlama, "llama", "LlamaForCausalLM"},
    {LlamaFamily::kQwen2, "qwen2", "Qwen2ForCausalLM"},
    {LlamaFamily::kMistral, "mistral", "MistralForCausalLM"},
};

const FamilyName& NameOf(LlamaFamily family) {
  for (const FamilyName& f : kFamilies) {
    if (f.family == family) return f;
  }
  return kFamilies[0];
}

// The reader of one config.json: each field checked against its meaning, errors naming it.
class ConfigReader {
 public:
  ConfigReader(const Json& j, std::string where) : j_(j), where_(std::move(where)) {}
  const std::string& where() const { return where_; }

  const Json* Field(const char* key) const { return Field(j_, key); }
  static const Json* Field(const Json& object, const char* key) {
    auto it = object.find(key);
    return it == object.end() || it->is_null() ? nullptr : &*it;
  }
  absl::Status Error(const std::string& key, const Json& value, const std::string& expected) const {
    return absl::InvalidArgumentError(
        absl::StrCat(where_, ": '", key, "' is ", value.dump(), "; ", expected));
  }
  // A positive integer; `required` ones must be present.
  absl::Status Int(const char* key, bool required, int64_t* out) const {
    const Json* f = Field(key);
    if (f == nullptr) {
      if (!required) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat(where_, " has no '", key, "'"));
    }
    if (!f->is_number_integer() || f->get<int64_t>() < 1) {
      return Error(key, *f, "expected a positive integer");
    }
    *out = f->get<int64_t>();
    return absl::OkStatus();
  }
  absl::Status Bool(const char* key, bool* out) const {
    const Json* f = Field(key);
    if (f == nullptr) return absl::OkStatus();
    if (!f->is_boolean()) return Error(key, *f, "expected true or false");
    *out = f->get<bool>();
    return absl::OkStatus();
  }
  // A finite number in (lo, hi] of `object` (a nested one has `prefix` in its messages).
  absl::Status Number(const Json& object, const std::string& prefix, const char* key, double lo,
                      double hi, double* out) const {
    const Json* f = Field(object, key);
    if (f == nullptr) return absl::OkStatus();
    if (!f->is_number() || !(f->get<double>() > lo && f->get<double>() <= hi)) {
      return Error(prefix + key, *f, absl::StrCat("expected a number in (", lo, ", ", hi, "]"));
    }
    *out = f->get<double>();
    return absl::OkStatus();
  }
  // Token ids: an id, a list of ids, or null; each in [0, vocab).
  absl::Status TokenIds(const char* key, int64_t vocab, std::vector<int64_t>* out) const {
    const Json* f = Field(key);
    if (f == nullptr) return absl::OkStatus();
    const std::string expected =
        absl::StrCat("expected a token id in [0, ", vocab, "), a list of them, or null");
    std::vector<Json> ids = f->is_array() ? f->get<std::vector<Json>>() : std::vector<Json>{*f};
    for (const Json& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab) {
        return Error(key, *f, expected);
      }
      out->push_back(id.get<int64_t>());
    }
    return absl::OkStatus();
  }

 private:
  const Json& j_;
  std::string where_;
};

// rope_parameters (transformers 5) or rope_theta + rope_scaling (4.x) into `rope`.
absl::Status ReadRope(const ConfigReader& r, const Json& j, RopeConfig* rope) {
  const Json* params = ConfigReader::Field(j, "rope_parameters");
  const Json* scaling = ConfigReader::Field(j, "rope_scaling");
  std::string prefix = "rope_parameters.";
  const Json* object = params;
  if (params == nullptr) {
    prefix = "rope_scaling.";
    object = scaling;
    if (absl::Status s = r.Number(j, "", "rope_theta", 1, 1e12, &rope->theta); !s.ok()) return s;
  }
  if (object == nullptr) return absl::OkStatus();
  if (!object->is_object()) {
    return r.Error(params ? "rope_parameters" : "rope_scaling", *object,
                   "expected an object {rope_type, ...} or null");
  }
  if (params) {
    if (absl::Status s = r.Number(*object, prefix, "rope_theta", 1, 1e12, &rope->theta); !s.ok()) {
      return s;
    }
  }
  const Json* type = ConfigReader::Field(*object, "rope_type");
  if (type == nullptr) type = ConfigReader::Field(*object, "type");  // transformers 4.3x
  const std::string type_name = type && type->is_string() ? type->get<std::string>() : "";
  if (type != nullptr && type_name != "default" && type_name != "llama3") {
    return r.Error(prefix + "rope_type", *type,
                   "tapegrad's rotary embeddings compute \"default\" and \"llama3\"");
  }
  if (const Json* f = ConfigReader::Field(*object, "partial_rotary_factor");
      f && !(f->is_number() && f->get<double>() == 1.0)) {
    return r.Error(prefix + "partial_rotary_factor", *f,
                   "tapegrad's rotary embeddings rotate the whole head (1.0)");
  }
  if (type_name != "llama3") return absl::OkStatus();
  rope->scaling = RopeScaling::kLlama3;
  for (auto [key, value] : {std::pair<const char*, double*>{"factor", &rope->factor},
                            {"low_freq_factor", &rope->low_freq_factor},
                            {"high_freq_factor", &rope->high_freq_factor}}) {
    if (ConfigReader::Field(*object, key) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          r.where(), ": '", prefix, "rope_type' \"llama3\" needs '", prefix, key, "'"));
    }
    if (absl::Status s = r.Number(*object, prefix, key, 0, 1e6, value); !s.ok()) return s;
  }
  const Json* original = ConfigReader::Field(*object, "original_max_position_embeddings");
  if (original == nullptr || !original->is_number_integer() || original->get<int64_t>() < 1) {
    return r.Error(prefix + "original_max_position_embeddings",
                   original ? *original : Json(nullptr),
                   "rope_type 'llama3' needs a positive integer");
  }
  rope->original_max_position_embeddings = original->get<int64_t>();
  return absl::OkStatus();
}

std::string ShapeText(const Shape& s) { return ShapeToString(s); }

}  // namespace

const char* LlamaFamilyModelType(LlamaFamily family) { return NameOf(family).model_type; }
const char* LlamaFamilyArchitecture(LlamaFamily family) { return NameOf(family).architecture; }

namespace {

absl::StatusOr<std::pair<LlamaConfig, LlamaHfSettings>> ParseConfig(const Json& j,
                                                                    const std::string& where) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " is not a JSON object"));
  }
  const ConfigReader r(j, where);
  LlamaConfig c;
  LlamaHfSettings settings;
  const Json* type = r.Field("model_type");
  if (type == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has no 'model_type' (\"llama\", \"qwen2\" or \"mistral\")"));
  }
  const FamilyName* family = nullptr;
  for (const FamilyName& f : kFamilies) {
    if (*type == f.model_type) family = &f;
  }
  if (family == nullptr) {
    return r.Error("model_type", *type,
                   "tapegrad's Llama decoder reads \"llama\", \"qwen2\" and \"mistral\"");
  }
  settings.family = family->family;
  if (const Json* arch = r.Field("architectures")) {
    if (!arch->is_array() || arch->size() != 1 || (*arch)[0] != family->architecture) {
      return r.Error("architectures", *arch,
                     absl::StrCat("expected [\"", family->architecture, "\"] for model_type \"",
                                  family->model_type, "\""));
    }
  }
  for (auto [key, value] : {std::pair<const char*, int64_t*>{"vocab_size", &c.vocab_size},
                            {"hidden_size", &c.hidden_size},
                            {"intermediate_size", &c.intermediate_size},
                            {"num_hidden_layers", &c.num_hidden_layers},
                            {"num_attention_heads", &c.num_attention_heads},
                            {"max_position_embeddings", &c.max_position_embeddings}}) {
    if (absl::Status s = r.Int(key, /*required=*/true, value); !s.ok()) return s;
  }
  c.num_key_value_heads = c.num_attention_heads;
  if (absl::Status s = r.Int("num_key_value_heads", false, &c.num_key_value_heads); !s.ok()) {
    return s;
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return r.Error(
        "num_key_value_heads", c.num_key_value_heads,
        absl::StrCat("expected a divisor of num_attention_heads ", c.num_attention_heads));
  }
  c.head_dim = 0;
  if (absl::Status s = r.Int("head_dim", false, &c.head_dim); !s.ok()) return s;
  if (c.head_dim == 0 && c.hidden_size % c.num_attention_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": 'hidden_size' ", c.hidden_size, " is not a multiple of 'num_attention_heads' ",
        c.num_attention_heads, " and there is no 'head_dim'"));
  }
  if (c.head_size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the head size ", c.head_size(),
                                                   " ('head_dim', or hidden_size / "
                                                   "num_attention_heads) must be even (rotary "
                                                   "embeddings rotate pairs)"));
  }
  c.rms_norm_eps = 1e-6;
  if (absl::Status s = r.Number(j, "", "rms_norm_eps", 0, 1, &c.rms_norm_eps); !s.ok()) return s;
  if (absl::Status s = ReadRope(r, j, &c.rope); !s.ok()) return s;
  c.tie_word_embeddings = false;
  if (absl::Status s = r.Bool("tie_word_embeddings", &c.tie_word_embeddings); !s.ok()) return s;
  if (absl::Status s = r.Number(j, "", "initializer_range", 0, 10, &c.initializer_range); !s.ok()) {
    return s;
  }
  if (const Json* f = r.Field("hidden_act"); f && *f != "silu") {
    return r.Error("hidden_act", *f, "tapegrad's SwiGLU MLP computes \"silu\"");
  }
  if (const Json* f = r.Field("attention_dropout");
      f && !(f->is_number() && f->get<double>() == 0.0)) {
    return r.Error("attention_dropout", *f, "tapegrad's Llama decoder has no dropout (0.0)");
  }
  switch (family->family) {
    case LlamaFamily::kLlama: {
      bool bias = false;
      if (absl::Status s = r.Bool("attention_bias", &bias); !s.ok()) return s;
      c.attention_bias = c.o_proj_bias = bias;
      if (absl::Status s = r.Bool("mlp_bias", &c.mlp_bias); !s.ok()) return s;
      break;
    }
    case LlamaFamily::kQwen2: {
      c.attention_bias = true;  // Qwen2Attention: q, k and v with biases, o without
      bool sliding = false;
      if (absl::Status s = r.Bool("use_sliding_window", &sliding); !s.ok()) return s;
      if (sliding) {
        return r.Error("use_sliding_window", true,
                       "tapegrad's Llama decoder computes full attention in every layer (false)");
      }
      if (const Json* f = r.Field("layer_types")) {
        if (!f->is_array()) return r.Error("layer_types", *f, "expected a list");
        for (const Json& t : *f) {
          if (t != "full_attention") {
            return r.Error("layer_types", *f,
                           "tapegrad's Llama decoder computes \"full_attention\" in every layer");
          }
        }
      }
      break;
    }
    case LlamaFamily::kMistral:
      if (absl::Status s = r.Int("sliding_window", false, &c.sliding_window); !s.ok()) return s;
      break;
  }
  for (auto [key, ids] :
       {std::pair<const char*, std::vector<int64_t>*>{"bos_token_id", &settings.bos_token_id},
        {"eos_token_id", &settings.eos_token_id}}) {
    if (absl::Status s = r.TokenIds(key, c.vocab_size, ids); !s.ok()) return s;
  }
  return std::make_pair(c, settings);
}

}  // namespace

absl::StatusOr<std::pair<LlamaConfig, LlamaHfSettings>> ParseLlamaConfigJson(
    const std::string& text, const std::string& where) {
  try {
    return ParseConfig(Json::parse(text), where);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, " is not valid JSON: ", e.what()));
  }
}

std::vector<LlamaTensorShape> LlamaTensorShapes(const LlamaConfig& c) {
  const int64_t h = c.hidden_size, i = c.intermediate_size, d = c.head_size();
  const int64_t q = c.num_attention_heads * d, kv = c.kv_heads() * d;
  const std::string hidden = absl::StrCat("hidden_size ", h);
  const std::string q_why =
      absl::StrCat("num_attention_heads ", c.num_attention_heads, " x head_dim ", d);
  const std::string kv_why = absl::StrCat("num_key_value_heads ", c.kv_heads(), " x head_dim ", d);
  const std::string mlp = absl::StrCat("intermediate_size ", i);
  std::vector<LlamaTensorShape> out;
  out.push_back({"model.embed_tokens.weight",
                 {c.vocab_size, h},
                 absl::StrCat("vocab_size ", c.vocab_size, ", ", hidden)});
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = absl::StrCat("model.layers.", layer, ".");
    auto linear = [&](const char* name, int64_t rows, int64_t cols, const std::string& why,
                      bool bias) {
      out.push_back({p + name + ".weight", {rows, cols}, why});
      if (bias) out.push_back({p + name + ".bias", {rows}, why});
    };
    linear("self_attn.q_proj", q, h, q_why + ", " + hidden, c.attention_bias);
    linear("self_attn.k_proj", kv, h, kv_why + ", " + hidden, c.attention_bias);
    linear("self_attn.v_proj", kv, h, kv_why + ", " + hidden, c.attention_bias);
    linear("self_attn.o_proj", h, q, hidden + ", " + q_why, c.o_proj_bias);
    linear("mlp.gate_proj", i, h, mlp + ", " + hidden, c.mlp_bias);
    linear("mlp.up_proj", i, h, mlp + ", " + hidden, c.mlp_bias);
    linear("mlp.down_proj", h, i, hidden + ", " + mlp, c.mlp_bias);
    out.push_back({p + "input_layernorm.weight", {h}, hidden});
    out.push_back({p + "post_attention_layernorm.weight", {h}, hidden});
  }
  out.push_back({"model.norm.weight", {h}, hidden});
  if (!c.tie_word_embeddings) {
    out.push_back({"lm_head.weight",
                   {c.vocab_size, h},
                   absl::StrCat("vocab_size ", c.vocab_size, ", ", hidden)});
  }
  return out;
}

absl::StatusOr<LlamaCheckpoint> LoadLlamaCheckpoint(const std::string& path) {
  absl::StatusOr<hf::Tensors> files = hf::ReadTensors(kCaller, path, "AutoModelForCausalLM");
  if (!files.ok()) return files.status();
  const std::string config_path = absl::StrCat(hf::DirName(files->path), "/config.json");
  const std::string config_where = absl::StrCat("config ", Quote(config_path));
  if (!hf::IsFile(config_path)) {
    return absl::NotFoundError(absl::StrCat(
        kCaller, ": ", Quote(files->path), " has no config.json beside it (", Quote(config_path),
        "): the head counts, rotary settings and norm epsilon are not in the tensors' shapes"));
  }
  absl::StatusOr<Json> json = hf::ReadJsonFile(kCaller, config_path, config_where,
                                               kMaxConfigJsonBytes, "a Llama config.json");
  if (!json.ok()) return json.status();
  absl::StatusOr<std::pair<LlamaConfig, LlamaHfSettings>> parsed = ParseConfig(*json, config_where);
  if (!parsed.ok()) return parsed.status();

  LlamaCheckpoint ckpt;
  std::tie(ckpt.config, ckpt.settings) = *parsed;
  ckpt.format = files->format;
  const LlamaConfig& c = ckpt.config;
  const std::string where = absl::StrCat("Llama safetensors ", Quote(files->path));
  std::map<std::string, RawTensor>& tensors = files->st.tensors;
  // Older checkpoints keep the rotary inverse frequencies as a buffer per layer: computed here.
  for (auto it = tensors.begin(); it != tensors.end();) {
    it = absl::EndsWith(it->first, ".self_attn.rotary_emb.inv_freq") ? tensors.erase(it) : ++it;
  }
  RawTensor lm_head;
  if (c.tie_word_embeddings) {
    if (auto it = tensors.find("lm_head.weight"); it != tensors.end()) {
      lm_head = it->second;
      tensors.erase(it);
    }
  }
  std::set<DType> dtypes;
  for (const LlamaTensorShape& want : LlamaTensorShapes(c)) {
    auto it = tensors.find(want.name);
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": missing tensor ", Quote(want.name),
                                                     " (", want.why, " in ", Quote(config_path),
                                                     ")"));
    }
    const RawTensor& t = it->second;
    if (t.shape() != want.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": tensor ", Quote(want.name), " has shape ", ShapeText(t.shape()), "; ",
          Quote(config_path), " says ", ShapeText(want.shape), " (", want.why, ")"));
    }
    if (t.dtype() != kF32 && t.dtype() != kF16 && t.dtype() != kBF16 && t.dtype() != kF64) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tensor ", Quote(want.name), " is ",
                                                     DTypeName(t.dtype()),
                                                     "; expected a floating-point dtype"));
    }
    dtypes.insert(t.dtype());
    ckpt.weights.tensors[want.name] = t.to(kF32);
    tensors.erase(it);
  }
  if (!tensors.empty()) {
    const auto& [name, t] = *tensors.begin();
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unexpected tensor ", Quote(name), " of shape ", ShapeText(t.shape()),
                     " (not part of a ", LlamaFamilyArchitecture(ckpt.settings.family), " with ",
                     c.num_hidden_layers, " layers", c.tie_word_embeddings ? ", a tied head" : "",
                     c.attention_bias ? "" : ", no attention biases", " as ", Quote(config_path),
                     " describes)"));
  }
  if (lm_head.defined()) {
    const RawTensor& embed = ckpt.weights.tensors.at("model.embed_tokens.weight");
    if (lm_head.shape() != embed.shape() ||
        lm_head.to(kF32).to_vector<float>() != embed.to_vector<float>()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": 'lm_head.weight' differs from 'model.embed_tokens.weight', but ",
                       Quote(config_path), " says 'tie_word_embeddings': true"));
    }
  }
  ckpt.file_dtype = dtypes.size() == 1 ? *dtypes.begin() : kF32;
  ckpt.char_vocab = hf::ReadCharVocab(
      kCaller, absl::StrCat(hf::DirName(files->path), "/vocab.json"), c.vocab_size);
  return ckpt;
}

std::string LlamaHfConfigJson(const LlamaConfig& c, const LlamaHfSettings& settings, DType dtype) {
  auto ids = [](const std::vector<int64_t>& v) -> Json {
    if (v.empty()) return nullptr;
    if (v.size() == 1) return v[0];
    return v;
  };
  Json rope_scaling = nullptr;
  if (c.rope.scaling == RopeScaling::kLlama3) {
    rope_scaling = {{"rope_type", "llama3"},
                    {"factor", c.rope.factor},
                    {"low_freq_factor", c.rope.low_freq_factor},
                    {"high_freq_factor", c.rope.high_freq_factor},
                    {"original_max_position_embeddings", c.rope.original_max_position_embeddings}};
  }
  Json j = {
      {"architectures", {LlamaFamilyArchitecture(settings.family)}},
      {"model_type", LlamaFamilyModelType(settings.family)},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.kv_heads()},
      {"head_dim", c.head_size()},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope.theta},
      {"rope_scaling", rope_scaling},
      {"hidden_act", "silu"},
      {"attention_dropout", 0.0},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"initializer_range", c.initializer_range},
      {"bos_token_id", ids(settings.bos_token_id)},
      {"eos_token_id", ids(settings.eos_token_id)},
      {"use_cache", true},
      {"dtype", dtype == kBF16  ? "bfloat16"
                : dtype == kF16 ? "float16"
                                : "float32"},
  };
  switch (settings.family) {
    case LlamaFamily::kLlama:
      j["attention_bias"] = c.attention_bias;
      j["mlp_bias"] = c.mlp_bias;
      break;
    case LlamaFamily::kQwen2:
      j["use_sliding_window"] = false;
      j["sliding_window"] = nullptr;
      break;
    case LlamaFamily::kMistral:
      j["sliding_window"] = c.sliding_window > 0 ? Json(c.sliding_window) : Json(nullptr);
      break;
  }
  return j.dump(2) + "\n";
}

absl::Status ExportLlamaHf(const LlamaForCausalLM& model, const std::string& dir,
                           const LlamaExportOptions& options) {
  const LlamaConfig& c = model.config();
  const char* family = LlamaFamilyModelType(options.settings.family);
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExportLlamaHf: model_type \"", family, "\" cannot hold this model: ", why));
  };
  switch (options.settings.family) {
    case LlamaFamily::kLlama:
      if (c.o_proj_bias != c.attention_bias) {
        return refuse("Llama's attention_bias puts biases on q, k, v and o alike");
      }
      break;
    case LlamaFamily::kQwen2:
      if (!c.attention_bias || c.o_proj_bias || c.mlp_bias) {
        return refuse("Qwen2 has biases on q, k and v and nowhere else");
      }
      break;
    case LlamaFamily::kMistral:
      if (c.attention_bias || c.o_proj_bias || c.mlp_bias) return refuse("Mistral has no biases");
      break;
  }
  if (options.dtype != kF32 && options.dtype != kBF16 && options.dtype != kF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ExportLlamaHf: dtype ", DTypeName(options.dtype), "; expected f32, bf16 or f16"));
  }
  const bool char_level = !options.char_vocab.empty();
  if (char_level && static_cast<int64_t>(options.char_vocab.size()) != c.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExportLlamaHf: char_vocab has ", options.char_vocab.size(),
                     " characters; the model's vocab_size is ", c.vocab_size));
  }
  std::vector<std::pair<std::string, std::string>> files;
  if (char_level) files = hf::CharTokenizerFiles(options.char_vocab, c.max_position_embeddings);
  LlamaHfSettings settings = options.settings;
  if (char_level) settings.bos_token_id = settings.eos_token_id = {};  // characters have none
  files.emplace_back("config.json", LlamaHfConfigJson(c, settings, options.dtype));
  io::Safetensors st;
  for (const auto& [name, p] : model.named_parameters()) {
    st.tensors[name] = p.data().to(Device::Cpu(), kF32).to(options.dtype).contiguous();
  }
  return hf::WriteModelDirectory("ExportLlamaHf", dir, std::move(st), files);
}

}  // namespace tg::nn
