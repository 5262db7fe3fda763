#include "nn/models/gpt2_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "nn/models/hf_files.h"
#include "tensor/io/fd.h"
#include "tensor/io/safetensors.h"

namespace tg {
namespace nn {
namespace {

using io::Fd;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the llm.c checkpoint reader assumes a little-endian host");

using hf::DirName;
using hf::Json;
using hf::Quote;

constexpr char kCaller[] = "LoadGpt2Checkpoint";

constexpr int64_t kLlmcHeaderInts = 256;
constexpr int64_t kLlmcHeaderBytes = kLlmcHeaderInts * 4;
// config.json of a GPT-2 is about 1 KB; anything far larger is not one.
constexpr int64_t kMaxConfigJsonBytes = 1 << 20;
constexpr int64_t kGpt2VocabSize = 50257;  // GPT-2's BPE; <|endoftext|> is 50256
constexpr double kLayerNormEps = 1e-5;     // tapegrad's LayerNorm default, GPT-2's value

int64_t RoundUp(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// One HF tensor per layer: the HF suffix, the tapegrad suffix, whether HF stores it transposed
// (Conv1D), and its HF shape in units of C (rows, cols; cols 0 for a vector).
struct LayerTensor {
  const char* hf;
  const char* tg;
  bool conv1d;
  int64_t rows, cols;
};
constexpr LayerTensor kLayerTensors[] = {
    {"ln_1.weight", "ln1.weight", false, 1, 0},
    {"ln_1.bias", "ln1.bias", false, 1, 0},
    {"attn.c_attn.weight", "attn.qkv.weight", true, 1, 3},
    {"attn.c_attn.bias", "attn.qkv.bias", false, 3, 0},
    {"attn.c_proj.weight", "attn.proj.weight", true, 1, 1},
    {"attn.c_proj.bias", "attn.proj.bias", false, 1, 0},
    {"ln_2.weight", "ln2.weight", false, 1, 0},
    {"ln_2.bias", "ln2.bias", false, 1, 0},
    {"mlp.c_fc.weight", "mlp.fc0.weight", true, 1, 4},
    {"mlp.c_fc.bias", "mlp.fc0.bias", false, 4, 0},
    {"mlp.c_proj.weight", "mlp.fc1.weight", true, 4, 1},
    {"mlp.c_proj.bias", "mlp.fc1.bias", false, 1, 0},
};

// The embedding with rows up to `padded` (new rows zero).
RawTensor PadRows(const RawTensor& wte, int64_t padded) {
  if (wte.size(0) == padded) return wte;
  RawTensor out = RawTensor::Zeros({padded, wte.size(1)}, kF32);
  out.narrow(0, 0, wte.size(0)).copy_(wte);
  return out;
}

absl::Status CheckPadOption(const Gpt2LoadOptions& options) {
  if (options.pad_vocab_to < 1 || options.pad_vocab_to > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("LoadGpt2Checkpoint: pad_vocab_to is ",
                                                   options.pad_vocab_to, "; expected 1..1048576"));
  }
  if (options.n_head < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoadGpt2Checkpoint: n_head is ", options.n_head, "; expected >= 0"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Files

// ---------------------------------------------------------------------------------------------
// llm.c

absl::StatusOr<Gpt2Checkpoint> LoadLlmc(const std::string& path, const Gpt2LoadOptions& options) {
  const std::string where = absl::StrCat("llm.c checkpoint ", Quote(path));
  int64_t size = 0;
  absl::StatusOr<int> fd_or = hf::OpenRegular(kCaller, path, &size);
  if (!fd_or.ok()) return fd_or.status();
  Fd fd(*fd_or);
  if (size < kLlmcHeaderBytes) {
    return absl::DataLossError(absl::StrCat(where, " is truncated: ", size,
                                            " bytes, shorter than its ", kLlmcHeaderBytes,
                                            "-byte header"));
  }
  int32_t header[kLlmcHeaderInts];
  if (absl::Status s = hf::ReadAt(fd.get(), 0, kLlmcHeaderBytes, header, where); !s.ok()) return s;
  if (header[0] != kLlmcModelMagic) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": bad magic ", header[0],
                                                   " in header[0]; expected ", kLlmcModelMagic,
                                                   " (llm.c's GPT-2 model file)"));
  }
  const int32_t version = header[1];
  if (version != 3 && version != 5 && version != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unsupported version ", version,
                     " in header[1]; expected 3 (f32), 5 (bf16) or 1 (f32, unpadded vocabulary)"));
  }
  // The version is the parameters' dtype (llm.c's gpt2_write_to_checkpoint: 3 for f32, 5 for
  // bf16); versions 3 and 5 carry the padded vocabulary.
  const bool bf16 = version == 5;
  const int64_t elem_bytes = bf16 ? 2 : 4;
  const char* const dtype_name = bf16 ? "bf16" : "f32";
  const int64_t max_t = header[2], v = header[3], l = header[4], nh = header[5], c = header[6];
  const int64_t vp = version == 1 ? v : header[7];
  struct Field {
    const char* name;
    int64_t value, max;
  };
  const Field fields[] = {
      {"max_seq_len (header[2])", max_t, 1 << 20}, {"vocab_size (header[3])", v, 1 << 24},
      {"num_layers (header[4])", l, 1024},         {"num_heads (header[5])", nh, 1024},
      {"channels (header[6])", c, 65536},          {"padded_vocab_size (header[7])", vp, 1 << 24}};
  for (const Field& f : fields) {
    if (f.value < 1 || f.value > f.max) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", f.name, " is ", f.value, "; expected 1..", f.max));
    }
  }
  if (vp < v) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": padded_vocab_size (header[7]) ", vp, " is below vocab_size ", v));
  }
  if (c % nh != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": channels ", c, " is not a multiple of num_heads ", nh));
  }
  if (options.n_head != 0 && options.n_head != nh) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": the header says ", nh, " heads; the caller asked for ", options.n_head));
  }
  // llm.c's order and shapes (fill_in_parameter_sizes). With the bounds above every product
  // stays below 2^50.
  struct Param {
    const char* name;
    Shape shape;
  };
  const std::vector<Param> params = {{"wte", {vp, c}},
                                     {"wpe", {max_t, c}},
                                     {"ln1w", {l, c}},
                                     {"ln1b", {l, c}},
                                     {"qkvw", {l, 3 * c, c}},
                                     {"qkvb", {l, 3 * c}},
                                     {"attprojw", {l, c, c}},
                                     {"attprojb", {l, c}},
                                     {"ln2w", {l, c}},
                                     {"ln2b", {l, c}},
                                     {"fcw", {l, 4 * c, c}},
                                     {"fcb", {l, 4 * c}},
                                     {"fcprojw", {l, c, 4 * c}},
                                     {"fcprojb", {l, c}},
                                     {"lnfw", {c}},
                                     {"lnfb", {c}}};
  int64_t num_params = 0;
  for (const Param& p : params) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    num_params += n;
  }
  const int64_t expected = kLlmcHeaderBytes + elem_bytes * num_params;
  if (size < expected) {
    return absl::DataLossError(absl::StrCat(
        where, " is truncated: ", size, " bytes; the header (version ", version, ", maxT ", max_t,
        ", V ", v, ", Vp ", vp, ", L ", l, ", C ", c, ") needs ", expected, " (", num_params, " ",
        dtype_name, " parameters after the ", kLlmcHeaderBytes, "-byte header)"));
  }
  if (size > expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", size - expected, " bytes after the parameters (the file has ",
                     size, " bytes; the header implies ", expected, ")"));
  }
  std::map<std::string, RawTensor> read;
  int64_t offset = kLlmcHeaderBytes;
  for (const Param& p : params) {
    RawTensor t = RawTensor::Empty(p.shape, bf16 ? kBF16 : kF32);
    const int64_t n = elem_bytes * t.numel();
    if (absl::Status s = hf::ReadAt(fd.get(), offset, n, t.raw_data(), where); !s.ok()) return s;
    offset += n;
    // bf16 -> f32 is exact (the 16 bits become the top half of the f32).
    read[p.name] = bf16 ? t.to(kF32) : t;
  }

  Gpt2Checkpoint ckpt;
  ckpt.format = absl::StrCat("llm.c version ", version, bf16 ? " (bf16)" : "");
  GptConfig& config = ckpt.config;
  config.vocab_size = v;
  config.padded_vocab_size = RoundUp(vp, options.pad_vocab_to);
  config.block_size = max_t;
  config.n_layer = l;
  config.n_head = nh;
  config.n_embd = c;
  StateDict& w = ckpt.weights;
  // llm.c's padding rows are zero in its own files; rows at or past V are made zero here so that
  // a file with other values there still loads as the GPT-2 it describes.
  RawTensor wte = PadRows(read["wte"], config.padded_vocab_size);
  if (config.padded_vocab_size > v) wte.narrow(0, v, config.padded_vocab_size - v).zero_();
  w.tensors["wte.weight"] = wte;
  w.tensors["wpe.weight"] = read["wpe"];
  const std::pair<const char*, const char*> per_layer[] = {
      {"ln1w", "ln1.weight"},           {"ln1b", "ln1.bias"},
      {"qkvw", "attn.qkv.weight"},      {"qkvb", "attn.qkv.bias"},
      {"attprojw", "attn.proj.weight"}, {"attprojb", "attn.proj.bias"},
      {"ln2w", "ln2.weight"},           {"ln2b", "ln2.bias"},
      {"fcw", "mlp.fc0.weight"},        {"fcb", "mlp.fc0.bias"},
      {"fcprojw", "mlp.fc1.weight"},    {"fcprojb", "mlp.fc1.bias"}};
  for (int64_t i = 0; i < l; ++i) {
    for (const auto& [llmc, tg_name] : per_layer) {
      w.tensors[absl::StrCat("blocks.", i, ".", tg_name)] = read[llmc].select(0, i).clone();
    }
  }
  w.tensors["ln_f.weight"] = read["lnfw"];
  w.tensors["ln_f.bias"] = read["lnfb"];
  return ckpt;
}

// ---------------------------------------------------------------------------------------------
// HuggingFace

// The fields of config.json that matter here; -1 where absent.
struct HfConfig {
  bool present = false;
  int64_t n_layer = -1, n_head = -1, n_embd = -1, n_positions = -1, vocab_size = -1;
  bool tie_word_embeddings = true;  // false: lm_head.weight is the head, not wte
  Gpt2HfSettings settings;  // dropouts and token ids, carried to an export
};

absl::StatusOr<HfConfig> ReadHfConfig(const std::string& path) {
  HfConfig out;
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) return out;
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("LoadGpt2Checkpoint: cannot stat ", Quote(path)));
  }
  const std::string where = absl::StrCat("config ", Quote(path));
  absl::StatusOr<Json> json =
      hf::ReadJsonFile(kCaller, path, where, kMaxConfigJsonBytes, "a GPT-2 config.json");
  if (!json.ok()) return json.status();
  const Json& j = *json;
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " is not a JSON object"));
  }
  out.present = true;
  auto get_int = [&](const char* key, int64_t* value) -> absl::Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_number_integer() || it->get<int64_t>() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": '", key, "' is ", it->dump(), "; expected a positive integer"));
    }
    *value = it->get<int64_t>();
    return absl::OkStatus();
  };
  for (auto [key, value] : {std::pair<const char*, int64_t*>{"n_layer", &out.n_layer},
                            {"n_head", &out.n_head},
                            {"n_embd", &out.n_embd},
                            {"n_positions", &out.n_positions},
                            {"vocab_size", &out.vocab_size}}) {
    if (absl::Status s = get_int(key, value); !s.ok()) return s;
  }
  // Dropouts (only training uses them): probabilities, kept for an export.
  for (auto [key, value] :
       {std::pair<const char*, double*>{"resid_pdrop", &out.settings.resid_pdrop},
        {"embd_pdrop", &out.settings.embd_pdrop},
        {"attn_pdrop", &out.settings.attn_pdrop}}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_number() || !(it->get<double>() >= 0 && it->get<double>() <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": '", key, "' is ", it->dump(),
                                                     "; expected a probability in [0, 1]"));
    }
    *value = it->get<double>();
  }
  // Token ids: kept when they are single ids (checked against the vocabulary by the caller);
  // null, absent or a list of ids: none carried.
  for (auto [key, value] :
       {std::pair<const char*, int64_t*>{"bos_token_id", &out.settings.bos_token_id},
        {"eos_token_id", &out.settings.eos_token_id}}) {
    auto it = j.find(key);
    if (it != j.end() && it->is_number_integer() && it->get<int64_t>() >= 0) {
      *value = it->get<int64_t>();
    }
  }
  // Settings that change what the model computes: only GPT-2's own are accepted.
  auto refuse = [&](const char* key, const Json& value, const char* expected) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": '", key, "' is ", value.dump(),
                                                   "; tapegrad's GPT computes ", expected));
  };
  auto field = [&](const char* key) -> const Json* {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  if (const Json* f = field("model_type"); f && *f != "gpt2") {
    return refuse("model_type", *f, "\"gpt2\"");
  }
  if (const Json* f = field("activation_function");
      f && *f != "gelu_new" && *f != "gelu_pytorch_tanh") {
    return refuse("activation_function", *f, "\"gelu_new\" (GELU, tanh approximation)");
  }
  if (const Json* f = field("layer_norm_epsilon");
      f && (!f->is_number() || std::fabs(f->get<double>() - kLayerNormEps) > 1e-12)) {
    return refuse("layer_norm_epsilon", *f, "1e-05");
  }
  if (const Json* f = field("n_inner");
      f && (!f->is_number_integer() || out.n_embd < 1 || f->get<int64_t>() != 4 * out.n_embd)) {
    return refuse("n_inner", *f, "4 n_embd (null)");
  }
  if (const Json* f = field("scale_attn_weights"); f && *f != true) {
    return refuse("scale_attn_weights", *f, "true");
  }
  if (const Json* f = field("scale_attn_by_inverse_layer_idx"); f && *f != false) {
    return refuse("scale_attn_by_inverse_layer_idx", *f, "false");
  }
  if (const Json* f = field("reorder_and_upcast_attn"); f && *f != false) {
    return refuse("reorder_and_upcast_attn", *f,
                  "false (attention scores in the model's dtype, scaled before the product)");
  }
  if (const Json* f = field("tie_word_embeddings")) {
    if (!f->is_boolean()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": 'tie_word_embeddings' is ",
                                                     f->dump(), "; expected true or false"));
    }
    out.tie_word_embeddings = f->get<bool>();
  }
  return out;
}

std::string ShapeText(const Shape& s) { return ShapeToString(s); }

// The tensors of `path` (one safetensors file, or the index of sharded ones, already read into
// `st`) as a GPT-2, with config.json beside `path`.
absl::StatusOr<Gpt2Checkpoint> LoadHf(const std::string& path, io::Safetensors st,
                                      const std::string& format, const Gpt2LoadOptions& options) {
  const std::string where = absl::StrCat("GPT-2 safetensors ", Quote(path));
  const std::string config_path = absl::StrCat(DirName(path), "/config.json");
  absl::StatusOr<HfConfig> hf_config = ReadHfConfig(config_path);
  if (!hf_config.ok()) return hf_config.status();

  // Names without "transformer."; lm_head and the attention mask buffers set aside.
  std::map<std::string, RawTensor> tensors;
  RawTensor lm_head;
  std::set<int64_t> layers;
  for (auto& [full_name, tensor] : st.tensors) {
    absl::string_view name = full_name;
    absl::ConsumePrefix(&name, "transformer.");
    if (name == "lm_head.weight") {
      lm_head = tensor;
      continue;
    }
    if (absl::StartsWith(name, "h.")) {
      absl::string_view rest = name.substr(2);
      const size_t dot = rest.find('.');
      int64_t layer = -1;
      if (dot != absl::string_view::npos && absl::SimpleAtoi(rest.substr(0, dot), &layer) &&
          layer >= 0 && absl::StrCat(layer) == rest.substr(0, dot)) {
        const absl::string_view suffix = rest.substr(dot + 1);
        if (suffix == "attn.bias" || suffix == "attn.masked_bias") continue;  // buffers
        bool known = false;
        for (const LayerTensor& lt : kLayerTensors) known |= suffix == lt.hf;
        if (known) layers.insert(layer);
      }
    }
    if (!tensors.emplace(std::string(name), tensor).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tensor ", Quote(std::string(name)),
                                                     " appears with and without 'transformer.'"));
    }
  }
  std::set<std::string> used;
  auto take = [&](const std::string& name, const Shape& shape,
                  const std::string& why) -> absl::StatusOr<RawTensor> {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": missing tensor ", Quote(name), " (", why, ")"));
    }
    const RawTensor& t = it->second;
    if (t.shape() != shape) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tensor ", Quote(name), " has shape ",
                                                     ShapeText(t.shape()), "; expected ",
                                                     ShapeText(shape), " (", why, ")"));
    }
    if (t.dtype() != kF32 && t.dtype() != kF16 && t.dtype() != kBF16 && t.dtype() != kF64) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tensor ", Quote(name), " is ",
                                                     DTypeName(t.dtype()),
                                                     "; expected a floating-point dtype"));
    }
    used.insert(name);
    return t.to(kF32);
  };

  auto wte_it = tensors.find("wte.weight");
  if (wte_it == tensors.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": missing tensor 'wte.weight'"));
  }
  if (wte_it->second.dim() != 2 || wte_it->second.size(0) < 1 || wte_it->second.size(1) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": tensor 'wte.weight' has shape ",
                                                   ShapeText(wte_it->second.shape()),
                                                   "; expected [vocab_size, n_embd]"));
  }
  const int64_t rows = wte_it->second.size(0), c = wte_it->second.size(1);
  auto wpe_it = tensors.find("wpe.weight");
  if (wpe_it == tensors.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": missing tensor 'wpe.weight'"));
  }
  if (wpe_it->second.dim() != 2 || wpe_it->second.size(0) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": tensor 'wpe.weight' has shape ",
                                                   ShapeText(wpe_it->second.shape()),
                                                   "; expected [n_positions, n_embd]"));
  }
  const int64_t positions = wpe_it->second.size(0);
  if (layers.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": missing tensor 'h.0.ln_1.weight' (no transformer layer h.0...)"));
  }
  const int64_t n_layer = static_cast<int64_t>(layers.size());
  if (*layers.rbegin() != n_layer - 1) {
    for (int64_t i = 0;; ++i) {
      if (layers.count(i) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": missing layer h.", i,
                                                       " (the file has layers up to h.",
                                                       *layers.rbegin(), ")"));
      }
    }
  }

  // config.json against the shapes.
  const HfConfig& hc = *hf_config;
  auto disagree = [&](const char* key, int64_t in_config, int64_t in_file, const char* from) {
    return absl::InvalidArgumentError(absl::StrCat(Quote(config_path), ": '", key, "' is ",
                                                   in_config, " but ", Quote(path), " has ",
                                                   in_file, " (", from, ")"));
  };
  if (hc.n_embd > 0 && hc.n_embd != c) return disagree("n_embd", hc.n_embd, c, "wte.weight");
  if (hc.n_layer > 0 && hc.n_layer != n_layer) {
    return disagree("n_layer", hc.n_layer, n_layer, "layers h.0...");
  }
  if (hc.n_positions > 0 && hc.n_positions != positions) {
    return disagree("n_positions", hc.n_positions, positions, "wpe.weight rows");
  }
  if (hc.vocab_size > rows) return disagree("vocab_size", hc.vocab_size, rows, "wte.weight rows");
  int64_t n_head = 0;
  if (hc.n_head > 0) {
    n_head = hc.n_head;
    if (options.n_head != 0 && options.n_head != n_head) {
      return disagree("n_head", n_head, options.n_head, "the caller's n_head");
    }
  } else if (options.n_head != 0) {
    n_head = options.n_head;
  } else {
    // The shapes do not hold the head count, and guessing GPT-2's head size 64 loads a model
    // of another head size as a different model, without any error: refused.
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": cannot tell the number of heads: ",
        hc.present ? absl::StrCat(Quote(config_path), " has no 'n_head'")
                   : absl::StrCat("there is no config.json beside it (", Quote(config_path), ")"),
        "; put the model's config.json there, or give the head count (train_gpt --n_head, "
        "Gpt2LoadOptions::n_head)"));
  }
  if (c % n_head != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": n_embd ", c, " is not a multiple of n_head ", n_head));
  }

  Gpt2Checkpoint ckpt;
  ckpt.format = format;
  ckpt.hf_settings = hc.settings;
  GptConfig& config = ckpt.config;
  config.vocab_size = hc.vocab_size > 0 ? hc.vocab_size : rows;
  ckpt.char_vocab =
      hf::ReadCharVocab(kCaller, absl::StrCat(DirName(path), "/vocab.json"), config.vocab_size);
  for (int64_t* id : {&ckpt.hf_settings.bos_token_id, &ckpt.hf_settings.eos_token_id}) {
    if (*id >= config.vocab_size) *id = -1;  // not a token of this model: not carried
  }
  config.padded_vocab_size = RoundUp(rows, options.pad_vocab_to);
  config.block_size = positions;
  config.n_layer = n_layer;
  config.n_head = n_head;
  config.n_embd = c;
  StateDict& w = ckpt.weights;
  const std::string from_wte = absl::StrCat("n_embd ", c, " from wte.weight");
  absl::StatusOr<RawTensor> wte = take("wte.weight", {rows, c}, "[vocab_size, n_embd]");
  if (!wte.ok()) return wte.status();
  RawTensor padded = PadRows(*wte, config.padded_vocab_size);
  if (padded.shares_storage(*wte)) padded = padded.clone();
  // Rows past the vocabulary are padding: zero, whatever the file holds there.
  if (config.padded_vocab_size > config.vocab_size) {
    padded.narrow(0, config.vocab_size, config.padded_vocab_size - config.vocab_size).zero_();
  }
  w.tensors["wte.weight"] = padded;
  absl::StatusOr<RawTensor> wpe = take("wpe.weight", {positions, c}, from_wte);
  if (!wpe.ok()) return wpe.status();
  w.tensors["wpe.weight"] = *wpe;
  for (int64_t i = 0; i < n_layer; ++i) {
    for (const LayerTensor& lt : kLayerTensors) {
      Shape shape = {lt.rows * c};
      if (lt.cols > 0) shape.push_back(lt.cols * c);
      absl::StatusOr<RawTensor> t = take(absl::StrCat("h.", i, ".", lt.hf), shape, from_wte);
      if (!t.ok()) return t.status();
      w.tensors[absl::StrCat("blocks.", i, ".", lt.tg)] =
          lt.conv1d ? t->transpose(0, 1).contiguous() : *t;
    }
  }
  for (const char* name : {"weight", "bias"}) {
    absl::StatusOr<RawTensor> t = take(absl::StrCat("ln_f.", name), {c}, from_wte);
    if (!t.ok()) return t.status();
    w.tensors[absl::StrCat("ln_f.", name)] = *t;
  }
  for (const auto& [name, t] : tensors) {
    if (used.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unexpected tensor ", Quote(name), " of shape ",
                       ShapeText(t.shape()), " (not part of GPT-2 with ", n_layer, " layers)"));
    }
  }
  // A tied head is wte: a file with its own head must hold the same values. An untied head
  // (config.json's tie_word_embeddings false) is lm_head.weight, padded as wte is.
  if (lm_head.defined() && lm_head.shape() != Shape{rows, c}) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": tensor 'lm_head.weight' has shape ", ShapeText(lm_head.shape()),
                     "; expected ", ShapeText({rows, c}), " (the rows of wte.weight)"));
  }
  if (!hc.tie_word_embeddings) {
    if (!lm_head.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": missing tensor 'lm_head.weight' (", Quote(config_path),
                       " has 'tie_word_embeddings' false: the head is not the token embedding)"));
    }
    config.tie_word_embeddings = false;
    RawTensor head = PadRows(lm_head.to(kF32), config.padded_vocab_size);
    if (head.shares_storage(lm_head)) head = head.clone();
    if (config.padded_vocab_size > config.vocab_size) {
      head.narrow(0, config.vocab_size, config.padded_vocab_size - config.vocab_size).zero_();
    }
    w.tensors["lm_head.weight"] = head;
  } else if (lm_head.defined()) {
    const std::vector<float> head = lm_head.to(kF32).to_vector<float>();
    const std::vector<float> emb = wte->to_vector<float>();
    if (head != emb) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": 'lm_head.weight' differs from 'wte.weight', and ", Quote(config_path),
          " does not say 'tie_word_embeddings': false; tapegrad's GPT ties them unless it does"));
    }
  }
  return ckpt;
}

}  // namespace

absl::StatusOr<Gpt2Checkpoint> LoadGpt2Checkpoint(const std::string& path,
                                                  const Gpt2LoadOptions& options) {
  if (absl::Status s = CheckPadOption(options); !s.ok()) return s;
  // An llm.c file: a regular file that starts with its magic, or any non-pickle named ".bin".
  if (hf::IsFile(path) && !absl::EndsWith(path, ".safetensors.index.json")) {
    int64_t size = 0;
    absl::StatusOr<int> fd_or = hf::OpenRegular(kCaller, path, &size);
    if (!fd_or.ok()) return fd_or.status();
    Fd fd(*fd_or);
    int32_t magic = 0;
    if (size >= 4) {
      if (absl::Status s = hf::ReadAt(fd.get(), 0, 4, &magic, path); !s.ok()) return s;
    }
    absl::StatusOr<bool> pickle = hf::IsPyTorchPickle(kCaller, path);
    if (!pickle.ok()) return pickle.status();
    if (!*pickle && (magic == kLlmcModelMagic || absl::EndsWith(path, ".bin"))) {
      return LoadLlmc(path, options);
    }
  }
  absl::StatusOr<hf::Tensors> files = hf::ReadTensors(kCaller, path, "GPT2LMHeadModel");
  if (!files.ok()) return files.status();
  return LoadHf(files->path, std::move(files->st), files->format, options);
}

StateDict Gpt2HfStateDict(const Gpt& model) {
  const GptConfig& config = model.config();
  TG_CHECK(config.bias, "Gpt2HfStateDict: GPT-2 has biases; the model was built with bias=false");
  std::map<std::string, RawTensor> params;
  for (const auto& [name, p] : model.named_parameters()) {
    params[name] = p.data().to(Device::Cpu(), kF32);
  }
  auto get = [&](const std::string& name) -> const RawTensor& {
    auto it = params.find(name);
    TG_CHECK(it != params.end(), "Gpt2HfStateDict: the model has no parameter '", name, "'");
    return it->second;
  };
  StateDict sd;
  sd.tensors["wte.weight"] = get("wte.weight").narrow(0, 0, config.vocab_size).contiguous();
  sd.tensors["wpe.weight"] = get("wpe.weight");
  for (int64_t i = 0; i < config.n_layer; ++i) {
    for (const LayerTensor& lt : kLayerTensors) {
      const RawTensor& t = get(absl::StrCat("blocks.", i, ".", lt.tg));
      sd.tensors[absl::StrCat("h.", i, ".", lt.hf)] =
          lt.conv1d ? t.transpose(0, 1).contiguous() : t;
    }
  }
  sd.tensors["ln_f.weight"] = get("ln_f.weight");
  sd.tensors["ln_f.bias"] = get("ln_f.bias");
  if (!config.tie_word_embeddings) {
    sd.tensors["lm_head.weight"] =
        get("lm_head.weight").narrow(0, 0, config.vocab_size).contiguous();
  }
  return sd;
}

std::string Gpt2HfConfigJson(const GptConfig& config, const Gpt2HfSettings& settings,
                             bool char_level) {
  auto pdrop = [&](double p) { return p >= 0 ? p : config.dropout; };
  // GPT-2's <|endoftext|> is the last of its 50257 tokens; other vocabularies have the ids an
  // imported config.json gave, or none.
  auto token = [&](int64_t id) -> Json {
    if (char_level) return nullptr;
    if (id >= 0 && id < config.vocab_size) return id;
    if (config.vocab_size == kGpt2VocabSize) return kGpt2VocabSize - 1;
    return nullptr;
  };
  Json j = {
      {"activation_function", "gelu_new"},
      {"architectures", {"GPT2LMHeadModel"}},
      {"attn_pdrop", pdrop(settings.attn_pdrop)},
      {"bos_token_id", token(settings.bos_token_id)},
      {"embd_pdrop", pdrop(settings.embd_pdrop)},
      {"eos_token_id", token(settings.eos_token_id)},
      {"initializer_range", 0.02},
      {"layer_norm_epsilon", kLayerNormEps},
      {"model_type", "gpt2"},
      {"n_ctx", config.block_size},
      {"n_embd", config.n_embd},
      {"n_head", config.n_head},
      {"n_inner", nullptr},
      {"n_layer", config.n_layer},
      {"n_positions", config.block_size},
      {"reorder_and_upcast_attn", false},
      {"resid_pdrop", pdrop(settings.resid_pdrop)},
      {"scale_attn_by_inverse_layer_idx", false},
      {"scale_attn_weights", true},
      {"tie_word_embeddings", config.tie_word_embeddings},
      {"dtype", "float32"},
      {"use_cache", true},
      {"vocab_size", config.vocab_size},
  };
  return j.dump(2) + "\n";
}

absl::Status ExportGpt2Hf(const Gpt& model, const std::string& dir,
                          const Gpt2ExportOptions& options) {
  if (!model.config().bias) {
    return absl::InvalidArgumentError(
        "ExportGpt2Hf: the model was built with bias=false; GPT-2 has biases");
  }
  const bool char_level = !options.char_vocab.empty();
  if (char_level && static_cast<int64_t>(options.char_vocab.size()) != model.config().vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExportGpt2Hf: char_vocab has ", options.char_vocab.size(),
                     " characters; the model's vocab_size is ", model.config().vocab_size));
  }
  io::Safetensors st;
  // save_pretrained's names for GPT2LMHeadModel (a tied lm_head left out).
  for (auto& [name, t] : Gpt2HfStateDict(model).tensors) {
    st.tensors[name == "lm_head.weight" ? name : "transformer." + name] = t;
  }
  std::vector<std::pair<std::string, std::string>> files;
  if (char_level) files = hf::CharTokenizerFiles(options.char_vocab, model.config().block_size);
  files.emplace_back("config.json", Gpt2HfConfigJson(model.config(), options.settings, char_level));
  return hf::WriteModelDirectory("ExportGpt2Hf", dir, std::move(st), files);
}

}  // namespace nn
}  // namespace tg
