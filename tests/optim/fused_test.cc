// The fused (multi-tensor) path and the per-tensor path (composed tensor ops) must give the same
// bits: for every optimizer and option combination, parameter and gradient dtypes, strided
// parameters, and parameters that miss some steps (so their step counts differ), 10 steps on
// random data, comparing every parameter and every state tensor bit for bit after each step.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"
#include "tensor/generator.h"
#include "tensor/state_dict.h"

namespace tg::optim {
namespace {

struct DTypes {
  DType param;
  DType grad;
};

// f32/f32, the reduced types with their own grads and with f32 grads, f64, and a grad whose
// dtype is neither the param's nor the compute type (converted first).
const DTypes kDTypes[] = {{kF32, kF32},  {kF16, kF16}, {kBF16, kBF16}, {kF16, kF32},
                          {kBF16, kF32}, {kF64, kF64}, {kF32, kBF16},  {kF16, kBF16}};

bool SameBits(const RawTensor& a, const RawTensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const RawTensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), ca.numel() * ca.element_size()) == 0;
}

// Parameters of several sizes; one is a transposed (non-contiguous) view of its storage.
std::vector<Tensor> MakeParams(Generator& gen, DType dtype) {
  std::vector<Tensor> params;
  for (const Shape& shape : {Shape{7}, Shape{3, 5}, Shape{1}, Shape{33}, Shape{4, 6}}) {
    RawTensor t = RandNormal(shape, gen, 0, 1, dtype);
    params.emplace_back(t, true);
  }
  params.emplace_back(RandNormal({5, 3}, gen, 0, 1, dtype).transpose(0, 1), true);
  return params;
}

std::vector<Tensor> Clone(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) {
    // Keep the layout: a transposed view stays a transposed view.
    RawTensor data = p.data().is_contiguous() ? p.data().clone()
                                              : p.data().transpose(0, 1).clone().transpose(0, 1);
    out.emplace_back(data, true);
  }
  return out;
}

using MakeOptimizer =
    std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup> groups, bool fused)>;

// Two groups (the second with its own lr and weight decay), 10 steps; parameter i gets no grad
// at step k when (k + i) % 4 == 0, so state is created at different steps.
void ExpectFusedMatchesPerTensor(const std::string& label, const MakeOptimizer& make,
                                 const OptimizerOptions& second_group) {
  for (const DTypes& dt : kDTypes) {
    SCOPED_TRACE(absl::StrCat(label, " param ", DTypeName(dt.param), " grad ", DTypeName(dt.grad)));
    Generator gen(1234);
    const std::vector<Tensor> a = MakeParams(gen, dt.param);
    const std::vector<Tensor> b = Clone(a);
    auto groups = [&](const std::vector<Tensor>& p) {
      return std::vector<ParamGroup>{ParamGroup({p[0], p[1], p[2]}),
                                     ParamGroup({p[3], p[4], p[5]}, second_group)};
    };
    std::unique_ptr<Optimizer> fused = make(groups(a), true);
    std::unique_ptr<Optimizer> per_tensor = make(groups(b), false);
    ASSERT_TRUE(fused->fused());
    ASSERT_FALSE(per_tensor->fused());
    for (int k = 0; k < 10; ++k) {
      for (size_t i = 0; i < a.size(); ++i) {
        if ((k + static_cast<int>(i)) % 4 == 0) {
          a[i].set_grad(Tensor());
          b[i].set_grad(Tensor());
          continue;
        }
        const RawTensor g = RandNormal(a[i].shape(), gen, 0, k < 5 ? 1.0 : 0.01, dt.grad);
        a[i].set_grad(Tensor(g));
        b[i].set_grad(Tensor(g.clone()));
      }
      fused->step();
      per_tensor->step();
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_TRUE(SameBits(a[i].data(), b[i].data())) << "param " << i << " step " << k;
      }
      const StateDict sa = fused->state_dict(), sb = per_tensor->state_dict();
      ASSERT_EQ(sa.scalars, sb.scalars) << "step " << k;
      ASSERT_EQ(sa.tensors.size(), sb.tensors.size()) << "step " << k;
      for (const auto& [key, t] : sa.tensors) {
        ASSERT_TRUE(sb.has_tensor(key)) << key;
        ASSERT_TRUE(SameBits(t, sb.tensor(key))) << key << " step " << k;
      }
    }
    // The transposed parameter stays a view of its own storage.
    EXPECT_FALSE(a[5].data().is_contiguous());
  }
}

TEST(FusedTest, SgdEveryOptionCombination) {
  for (double momentum : {0.0, 0.9}) {
    for (double dampening : {0.0, 0.3}) {
      for (bool nesterov : {false, true}) {
        for (double weight_decay : {0.0, 0.01}) {
          if (nesterov && (momentum == 0 || dampening != 0)) continue;
          SGDOptions o;
          o.lr(0.1);
          o.momentum(momentum);
          o.dampening(dampening);
          o.nesterov(nesterov);
          o.weight_decay(weight_decay);
          ExpectFusedMatchesPerTensor(
              absl::StrCat("SGD momentum ", momentum, " dampening ", dampening, " nesterov ",
                           nesterov, " weight_decay ", weight_decay),
              [o](std::vector<ParamGroup> groups, bool fused) {
                SGDOptions f = o;
                f.fused(fused);
                return std::make_unique<SGD>(std::move(groups), f);
              },
              [&] {
                SGDOptions second = o;
                second.lr(0.03);
                second.weight_decay(0.05);
                return second;
              }());
        }
      }
    }
  }
}

TEST(FusedTest, AdamAndAdamWEveryOptionCombination) {
  for (bool decoupled : {false, true}) {
    for (bool amsgrad : {false, true}) {
      for (double weight_decay : {0.0, 0.05}) {
        AdamOptions o;
        o.lr(0.01);
        o.beta1(0.8);
        o.beta2(0.99);
        o.eps(1e-6);
        o.amsgrad(amsgrad);
        o.weight_decay(weight_decay);
        ExpectFusedMatchesPerTensor(
            absl::StrCat(decoupled ? "AdamW" : "Adam", " amsgrad ", amsgrad, " weight_decay ",
                         weight_decay),
            [o, decoupled](std::vector<ParamGroup> groups,
                           bool fused) -> std::unique_ptr<Optimizer> {
              if (decoupled) {
                AdamWOptions w;
                static_cast<AdamOptions&>(w) = o;
                w.fused(fused);
                return std::make_unique<AdamW>(std::move(groups), w);
              }
              AdamOptions f = o;
              f.fused(fused);
              return std::make_unique<Adam>(std::move(groups), f);
            },
            [&] {
              AdamOptions second = o;
              second.lr(0.002);
              second.weight_decay(0.2);
              second.amsgrad(!amsgrad);
              return second;
            }());
      }
    }
  }
}

// Non-finite gradients flow through both paths identically (NaN propagation in the maximum,
// inf in the moments).
TEST(FusedTest, NonFiniteGradientsGiveTheSameBits) {
  for (bool amsgrad : {false, true}) {
    std::vector<Tensor> params[2];
    std::unique_ptr<Optimizer> opts[2];
    for (int f = 0; f < 2; ++f) {
      params[f] = {Tensor(RawTensor::FromVector<float>({1, 2, 3, 4}, {4}), true)};
      AdamWOptions o;
      o.amsgrad(amsgrad);
      o.fused(f == 0);
      opts[f] = std::make_unique<AdamW>(params[f], o);
    }
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<std::vector<float>> grads = {
        {1, -1, 0.5f, 2}, {inf, 1, -inf, 0}, {nan, 0, 1, -nan}, {1, 2, 3, 4}};
    for (const auto& g : grads) {
      for (int f = 0; f < 2; ++f) {
        params[f][0].set_grad(Tensor(RawTensor::FromVector<float>(g, {4})));
        opts[f]->step();
      }
      EXPECT_TRUE(SameBits(params[0][0].data(), params[1][0].data()));
    }
  }
}

}  // namespace
}  // namespace tg::optim
