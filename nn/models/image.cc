#include "nn/models/image.h"

#include "nn/conv.h"
#include "tensor/error.h"

namespace tg {
namespace nn {

std::shared_ptr<Sequential> MakeImageMlp(Generator& gen, const std::vector<int64_t>& hidden,
                                         int64_t classes) {
  auto net = std::make_shared<Sequential>();
  net->push_back(std::make_shared<FlattenImpl>());
  int64_t in = 28 * 28;
  for (int64_t h : hidden) {
    net->push_back(std::make_shared<LinearImpl>(in, h, gen));
    net->push_back(std::make_shared<ReLUImpl>());
    in = h;
  }
  net->push_back(std::make_shared<LinearImpl>(in, classes, gen));
  return net;
}

std::shared_ptr<Sequential> MakeImageCnn(Generator& gen, const std::vector<int64_t>& channels,
                                         int64_t classes) {
  TG_CHECK(!channels.empty() && channels.size() <= 4, "MakeImageCnn: 1 to 4 conv stages, got ",
           channels.size());
  auto net = std::make_shared<Sequential>();
  int64_t in = 1, side = 28;
  for (int64_t c : channels) {
    net->push_back(std::make_shared<Conv2dImpl>(Conv2dOptions(in, c, {3, 3}).padding({1, 1}), gen));
    net->push_back(std::make_shared<ReLUImpl>());
    net->push_back(std::make_shared<MaxPool2dImpl>(std::array<int64_t, 2>{2, 2}));
    in = c;
    side /= 2;
  }
  net->push_back(std::make_shared<FlattenImpl>());
  net->push_back(std::make_shared<LinearImpl>(in * side * side, 128, gen));
  net->push_back(std::make_shared<ReLUImpl>());
  net->push_back(std::make_shared<LinearImpl>(128, classes, gen));
  return net;
}

}  // namespace nn
}  // namespace tg
