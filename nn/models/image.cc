#include "nn/models/image.h"

#include "nn/conv.h"
#include "tensor/error.h"

namespace tg {
namespace nn {

Sequential MakeImageMlp(Generator& gen, const std::vector<int64_t>& hidden, int64_t classes) {
  Sequential net;
  net->push_back(Flatten());
  int64_t in = 28 * 28;
  for (int64_t h : hidden) {
    net->push_back(Linear(in, h, gen));
    net->push_back(ReLU());
    in = h;
  }
  net->push_back(Linear(in, classes, gen));
  return net;
}

Sequential MakeImageCnn(Generator& gen, const std::vector<int64_t>& channels, int64_t classes) {
  TG_CHECK(!channels.empty() && channels.size() <= 4, "MakeImageCnn: 1 to 4 conv stages, got ",
           channels.size());
  Sequential net;
  int64_t in = 1, side = 28;
  for (int64_t c : channels) {
    net->push_back(Conv2d(Conv2dOptions(in, c, 3).padding(1), gen));
    net->push_back(ReLU());
    net->push_back(MaxPool2d(2));
    in = c;
    side /= 2;
  }
  net->push_back(Flatten());
  net->push_back(Linear(in * side * side, 128, gen));
  net->push_back(ReLU());
  net->push_back(Linear(128, classes, gen));
  return net;
}

}  // namespace nn
}  // namespace tg
