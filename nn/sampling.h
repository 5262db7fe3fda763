// Autoregressive sampling for the language models (Gpt::Generate, LlamaForCausalLM::Generate):
// softmax(last logits / temperature) over the top_k most likely tokens (all when top_k <= 0),
// one token per full forward of the last `context` tokens, under no-grad in eval mode.
#ifndef TAPEGRAD_NN_SAMPLING_H_
#define TAPEGRAD_NN_SAMPLING_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nn/module.h"
#include "tensor/generator.h"
#include "tensor/tensor.h"

namespace tg::nn {

// Appends `new_tokens` tokens to `prompt` (non-empty, every token in [0, vocab)) and returns the
// whole sequence. `logits_of` maps ids i64 [1, t] on `device` to logits [1, t, vocab]; `model` is
// put in eval mode meanwhile (its training mode restored). Errors name `who` ("Gpt::Generate").
std::vector<int64_t> SampleTokens(Module& model,
                                  const std::function<Tensor(const Tensor& ids)>& logits_of,
                                  Device device, int64_t vocab, int64_t context,
                                  const std::vector<int64_t>& prompt, int64_t new_tokens,
                                  Generator& gen, double temperature, int64_t top_k,
                                  const std::string& who);

}  // namespace tg::nn

#endif  // TAPEGRAD_NN_SAMPLING_H_
