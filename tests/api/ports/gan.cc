// A small DCGAN written for libtorch (port_prelude.h): a generator of ConvTranspose2d +
// BatchNorm2d + ReLU + Tanh and a discriminator of Conv2d + LeakyReLU + BatchNorm2d + Sigmoid in
// a Sequential, trained with Adam on 8x8 images of one bright bar (a random row or column),
// then checkpointed with save/load. It prints the losses every 100 steps, the mean pixel of
// generated and real images and their share of pixels above 0 (a bar covers 1/8 of an image),
// and whether a generator and an optimizer loaded from the checkpoint take the next step to
// exactly the parameters the originals reach.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/api/ports/port_prelude.h"

struct GeneratorImpl : tg::nn::Module {
  GeneratorImpl()
      : up1(tg::nn::ConvTranspose2dOptions(8, 32, 4).bias(false)),
        bn1(32),
        up2(tg::nn::ConvTranspose2dOptions(32, 1, 4).stride(2).padding(1).bias(false)) {
    register_module("up1", up1);
    register_module("bn1", bn1);
    register_module("up2", up2);
  }
  tg::Tensor forward(tg::Tensor z) {
    return tg::tanh(up2(tg::relu(bn1(up1(z)))));  // [N, 8, 1, 1] -> [N, 1, 8, 8]
  }
  tg::nn::ConvTranspose2d up1;
  tg::nn::BatchNorm2d bn1;
  tg::nn::ConvTranspose2d up2;
};
TG_MODULE(Generator);

tg::nn::Sequential MakeDiscriminator() {
  return tg::nn::Sequential(
      tg::nn::Conv2d(tg::nn::Conv2dOptions(1, 32, 4).stride(2).padding(1).bias(false)),
      tg::nn::LeakyReLU(tg::nn::LeakyReLUOptions().negative_slope(0.2)), tg::nn::BatchNorm2d(32),
      tg::nn::Conv2d(tg::nn::Conv2dOptions(32, 1, 4).bias(false)), tg::nn::Sigmoid());
}

// n images of -1 with one row or column of +1, chosen by the default generator.
tg::Tensor RealImages(int64_t n) {
  tg::Tensor which = tg::randint(0, 16, {n});
  std::vector<float> pixels(static_cast<size_t>(n * 64), -1.0f);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = which[i].item<int64_t>();
    for (int64_t j = 0; j < 8; ++j) {
      const int64_t at = k < 8 ? k * 8 + j : j * 8 + (k - 8);
      pixels[static_cast<size_t>(i * 64 + at)] = 1.0f;
    }
  }
  return tg::tensor(pixels).reshape({n, 1, 8, 8});
}

// One step of each network; returns {d_loss, g_loss}.
std::pair<float, float> TrainStep(Generator& g, tg::nn::Sequential& d, tg::optim::Adam& g_opt,
                                  tg::optim::Adam& d_opt, const tg::Tensor& real,
                                  const tg::Tensor& noise) {
  const int64_t n = real.size(0);
  d->zero_grad();
  tg::Tensor d_real = tg::binary_cross_entropy(d->forward(real).reshape({n}), tg::ones({n}) * 0.9);
  d_real.backward();
  tg::Tensor fake = g->forward(noise);
  tg::Tensor d_fake =
      tg::binary_cross_entropy(d->forward(fake.detach()).reshape({n}), tg::zeros({n}));
  d_fake.backward();
  d_opt.step();
  g->zero_grad();
  tg::Tensor g_loss = tg::binary_cross_entropy(d->forward(fake).reshape({n}), tg::ones({n}));
  g_loss.backward();
  g_opt.step();
  return {(d_real + d_fake).item<float>(), g_loss.item<float>()};
}

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: gan STEPS CHECKPOINT_DIR [SEED]\n");
    return 2;
  }
  const int steps = std::atoi(argv[1]);
  const std::string dir = argv[2];
  tg::manual_seed(argc == 4 ? std::atoll(argv[3]) : 0);
  Generator g;
  tg::nn::Sequential d = MakeDiscriminator();
  tg::optim::Adam g_opt(g->parameters(), tg::optim::AdamOptions(2e-3).betas({0.5, 0.999}));
  tg::optim::Adam d_opt(d->parameters(), tg::optim::AdamOptions(2e-3).betas({0.5, 0.999}));
  const int64_t batch = 32;
  for (int step = 1; step <= steps; ++step) {
    tg::Tensor real = RealImages(batch);
    auto [d_loss, g_loss] = TrainStep(g, d, g_opt, d_opt, real, tg::randn({batch, 8, 1, 1}));
    if (step % 100 == 0) std::printf("step %d d_loss %.4f g_loss %.4f\n", step, d_loss, g_loss);
  }
  {
    tg::NoGradGuard no_grad;
    g->eval();
    tg::Tensor fake = g->forward(tg::randn({256, 8, 1, 1}));
    tg::Tensor real = RealImages(256);
    std::printf("fake_mean %.4f real_mean %.4f fake_bright %.4f real_bright %.4f\n",
                fake.mean().item<float>(), real.mean().item<float>(),
                (fake > 0).to(tg::kFloat32).mean().item<float>(),
                (real > 0).to(tg::kFloat32).mean().item<float>());
    g->train();
  }
  // Checkpoint, load into fresh objects, and take one more step with both.
  tg::save(g, dir + "/g.ckpt");
  tg::save(g_opt, dir + "/g_opt.ckpt");
  tg::save(d, dir + "/d.ckpt");
  tg::save(d_opt, dir + "/d_opt.ckpt");
  Generator g2;
  tg::nn::Sequential d2 = MakeDiscriminator();
  tg::optim::Adam g2_opt(g2->parameters(), tg::optim::AdamOptions(2e-3).betas({0.5, 0.999}));
  tg::optim::Adam d2_opt(d2->parameters(), tg::optim::AdamOptions(2e-3).betas({0.5, 0.999}));
  tg::load(g2, dir + "/g.ckpt");
  tg::load(g2_opt, dir + "/g_opt.ckpt");
  tg::load(d2, dir + "/d.ckpt");
  tg::load(d2_opt, dir + "/d_opt.ckpt");
  tg::Tensor real = RealImages(batch), noise = tg::randn({batch, 8, 1, 1});
  TrainStep(g, d, g_opt, d_opt, real, noise);
  TrainStep(g2, d2, g2_opt, d2_opt, real, noise);
  bool same = true;
  auto a = g->parameters(), b = g2->parameters();
  for (size_t i = 0; i < a.size(); ++i) same = same && tg::equal(a[i], b[i]);
  auto c = d->parameters(), e = d2->parameters();
  for (size_t i = 0; i < c.size(); ++i) same = same && tg::equal(c[i], e[i]);
  std::printf("resumed step identical: %s\n", same ? "yes" : "no");
  return 0;
}
