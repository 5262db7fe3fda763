#include "autograd/engine.h"
#include "autograd/ops.h"
int main() {
  tg::Variable x(tg::Tensor::Ones({1}), true);
  for (int r = 0; r < 3; ++r) {
    tg::Variable y = x;
    for (int i = 0; i < 20000; ++i) y = tg::AddScalar(y, 1);
    tg::Sum(y).backward();
  }
}
