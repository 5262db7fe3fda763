// The printing cases of tests/api/tensor_api_test.cc, printed by libtorch itself.
#include <torch/torch.h>

#include <iostream>
int main() {
  auto show = [](const char* name, const torch::Tensor& t) {
    std::cout << "== " << name << "\n" << t << "\n";
  };
  show("ones_2x2", torch::ones({2, 2}));
  show("floats_1d", torch::tensor({1.5, 2.25, -3.0}));
  show("arange_long", torch::arange(10));
  show("mixed_magnitudes", torch::tensor({{0.001, 1000.0}, {1.0, 2.0}}));
  show("large_scale", torch::tensor({123456.0, 1.5}));
  show("small_scale", torch::tensor({0.0012, 0.0034}));
  show("scalar", torch::tensor(3.5));
  show("bools", torch::tensor({true, false, true}));
  show("three_d", torch::arange(12).reshape({2, 2, 3}));
  show("four_d", torch::arange(24).reshape({2, 3, 2, 2}).to(torch::kFloat) / 4);
  show("bf16", torch::tensor({0.1, 0.2}).to(torch::kBFloat16));
  show("empty", torch::zeros({0}));
  show("wide", torch::arange(30).reshape({2, 15}).to(torch::kFloat) * 1.5);
  show("int32_big", torch::tensor({int64_t{12345678901}, int64_t{2}}));
  show("nan_inf",
       torch::tensor({1.5, std::nan(""), std::numeric_limits<double>::infinity(), -2.0}));
  show("negatives_int", torch::tensor({-5, 3, 100}));
  show("double", torch::tensor({0.5, 0.25}, torch::kDouble));
  return 0;
}
