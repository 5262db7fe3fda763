#include "nn/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/grad_mode.h"
#include "tensor/error.h"

namespace tg::nn {

std::vector<int64_t> SampleTokens(Module& model,
                                  const std::function<Tensor(const Tensor& ids)>& logits_of,
                                  Device device, int64_t vocab, int64_t context,
                                  const std::vector<int64_t>& prompt, int64_t new_tokens,
                                  Generator& gen, double temperature, int64_t top_k,
                                  const std::string& who) {
  TG_CHECK(!prompt.empty(), who, ": the prompt is empty");
  TG_CHECK(temperature > 0, who, ": temperature must be positive, got ", temperature);
  for (int64_t token : prompt) {
    TG_CHECK(token >= 0 && token < vocab, who, ": prompt token ", token,
             " is outside the vocabulary [0, ", vocab, ")");
  }
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  std::vector<int64_t> out = prompt;
  const int64_t v = vocab;
  std::vector<double> probs(v);
  std::vector<int64_t> order(v);
  for (int64_t step = 0; step < new_tokens; ++step) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(out.size()) - context);
    std::vector<int64_t> window(out.begin() + start, out.end());
    const int64_t t = static_cast<int64_t>(window.size());
    const RawTensor ids = RawTensor::FromVector(window, {1, t}).to(device);
    RawTensor logits = logits_of(Tensor(ids)).data();
    std::vector<float> last = logits.select(1, t - 1).to_vector<float>();  // [v]
    // softmax(last / temperature) over the top_k entries (all when top_k <= 0).
    std::iota(order.begin(), order.end(), 0);
    int64_t keep = top_k > 0 ? std::min(top_k, v) : v;
    std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                      [&](int64_t a, int64_t b) { return last[a] > last[b]; });
    double max_logit = last[order[0]] / temperature, total = 0;
    for (int64_t i = 0; i < keep; ++i) {
      probs[i] = std::exp(last[order[i]] / temperature - max_logit);
      total += probs[i];
    }
    double u = gen.NextUniformDouble() * total;
    int64_t pick = keep - 1;
    for (int64_t i = 0; i < keep; ++i) {
      u -= probs[i];
      if (u < 0) {
        pick = i;
        break;
      }
    }
    out.push_back(order[pick]);
  }
  model.train(was_training);
  return out;
}

}  // namespace tg::nn
