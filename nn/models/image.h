// Image classifiers for 28x28 single-channel images (Fashion-MNIST), built from nn layers.
//
//   tg::Generator gen(0);
//   tg::nn::Sequential cnn = tg::nn::MakeImageCnn(gen);
//   tg::Tensor logits = cnn(images);   // [batch, 1, 28, 28] f32 -> [batch, 10]
#ifndef TAPEGRAD_NN_MODELS_IMAGE_H_
#define TAPEGRAD_NN_MODELS_IMAGE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "nn/layers.h"
#include "tensor/generator.h"

namespace tg {
namespace nn {

// Flatten -> Linear(784, h) -> ReLU -> ... -> Linear(h_last, classes). Default hidden {256, 128}.
Sequential MakeImageMlp(Generator& gen, const std::vector<int64_t>& hidden = {256, 128},
                        int64_t classes = 10);

// [conv 3x3 (pad 1) -> ReLU -> max pool 2x2] for each of `channels` (default {32, 64}: 28 -> 14 ->
// 7), then Flatten -> Linear(c * 7 * 7, 128) -> ReLU -> Linear(128, classes).
Sequential MakeImageCnn(Generator& gen, const std::vector<int64_t>& channels = {32, 64},
                        int64_t classes = 10);

}  // namespace nn
}  // namespace tg

#endif  // TAPEGRAD_NN_MODELS_IMAGE_H_
