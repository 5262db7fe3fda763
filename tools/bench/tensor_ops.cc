// RawTensor op throughput on the CPU, printed next to a baseline measured in the same run:
// a 512x512x512 f32 matmul (GFLOP/s) against a naive triple loop, and 10^6-element elementwise
// ops (GB/s moved) against a plain memcpy of the same bytes, with the fused SwiGLU next to the
// composed ops it replaces. Ratios, not timings, are what to compare across machines.
//
//   bazel run -c opt //tools/bench:tensor_ops
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tools/bench/timing.h"

namespace {

using tg::bench::BestSeconds;

// The baseline GEMM: i-k-j loops over contiguous f32, what a C++ user writes by hand.
void NaiveMatmul(const float* a, const float* b, float* c, int64_t n) {
  std::fill(c, c + n * n, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < n; ++k) {
      const float aik = a[i * n + k];
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += aik * b[k * n + j];
    }
  }
}

}  // namespace

int main() {
  tg::Generator gen(0);

  const int64_t n = 512;
  const tg::RawTensor a = tg::RandNormal({n, n}, gen);
  const tg::RawTensor b = tg::RandNormal({n, n}, gen);
  tg::RawTensor c = tg::RawTensor::Empty({n, n});
  const double flops = 2.0 * n * n * n;
  const double naive_s =
      BestSeconds(3, [&] { NaiveMatmul(a.data<float>(), b.data<float>(), c.data<float>(), n); });
  const double gemm_s = BestSeconds(10, [&] { c = tg::Matmul(a, b); });
  const double gemm_t_s = BestSeconds(10, [&] { c = tg::Matmul(a.transpose(0, 1), b); });
  const tg::RawTensor ah = a.to(tg::kF16), bh = b.to(tg::kF16);
  const double gemm_h_s = BestSeconds(5, [&] { c = tg::Matmul(ah, bh); });
  std::printf("matmul 512x512x512\n");
  std::printf("  %-28s %8.2f GFLOP/s  (baseline)\n", "naive i-k-j loop f32",
              flops / naive_s * 1e-9);
  std::printf("  %-28s %8.2f GFLOP/s  x%.1f\n", "tg::Matmul f32", flops / gemm_s * 1e-9,
              naive_s / gemm_s);
  std::printf("  %-28s %8.2f GFLOP/s  x%.1f\n", "tg::Matmul f32 (A transposed)",
              flops / gemm_t_s * 1e-9, naive_s / gemm_t_s);
  std::printf("  %-28s %8.2f GFLOP/s  x%.1f\n", "tg::Matmul f16 (via f32)", flops / gemm_h_s * 1e-9,
              naive_s / gemm_h_s);

  const int64_t m = 1000000;
  const tg::RawTensor x = tg::RandUniform({m}, gen, 0.5, 2.0);
  const tg::RawTensor y = tg::RandUniform({m}, gen, 0.5, 2.0);
  std::vector<float> dst(m);
  const double bytes2 = 2.0 * m * sizeof(float);  // read one, write one
  const double copy_s =
      BestSeconds(50, [&] { std::memcpy(dst.data(), x.data<float>(), m * sizeof(float)); });
  const double copy_gbs = bytes2 / copy_s * 1e-9;
  std::printf("\nelementwise, 10^6 f32 elements (GB/s of memory traffic; ratio to memcpy)\n");
  std::printf("  %-28s %8.2f GB/s     (baseline)\n", "memcpy", copy_gbs);
  tg::RawTensor out;
  struct Case {
    const char* name;
    double bytes;
    std::function<void()> fn;
  };
  const tg::RawTensor xt = x.reshape({1000, 1000}).transpose(0, 1);
  const tg::RawTensor xh = x.to(tg::kF16), yh = y.to(tg::kF16);
  const tg::RawTensor xb = x.to(tg::kBF16), yb = y.to(tg::kBF16);
  // SwiGLU's backward as the composed ops compute it (Mul's, then Silu's formula).
  const auto swiglu_backward_composed = [](const tg::RawTensor& dy, const tg::RawTensor& g,
                                           const tg::RawTensor& u) {
    const tg::RawTensor s = tg::Sigmoid(g);
    const tg::RawTensor silu_grad =
        tg::Mul(s, tg::AddScalar(tg::Mul(g, tg::AddScalar(tg::Neg(s), 1)), 1));
    return std::make_pair(tg::Mul(tg::Mul(dy, u), silu_grad), tg::Mul(dy, tg::Silu(g)));
  };
  const std::vector<Case> cases = {
      {"add", 3.0 * m * 4, [&] { out = tg::Add(x, y); }},
      {"mul", 3.0 * m * 4, [&] { out = tg::Mul(x, y); }},
      {"add (row broadcast)", 2.0 * m * 4,
       [&] {
         out = tg::Add(x.reshape({1000, 1000}), y.slice(0, 0, 1000));
       }},
      {"mul_scalar", 2.0 * m * 4, [&] { out = tg::MulScalar(x, 3.0); }},
      {"exp", 2.0 * m * 4, [&] { out = tg::Exp(x); }},
      {"gelu_tanh", 2.0 * m * 4, [&] { out = tg::GeluTanh(x); }},
      {"contiguous(transposed)", 2.0 * m * 4, [&] { out = xt.contiguous(); }},
      {"add f16", 3.0 * m * 2, [&] { out = tg::Add(xh, yh); }},
      {"to(f16)", 1.0 * m * 4 + m * 2, [&] { out = x.to(tg::kF16); }},
      {"sum", 1.0 * m * 4, [&] { out = tg::Sum(x); }},
      {"softmax [1000, 1000]", 2.0 * m * 4,
       [&] {
         out = tg::Softmax(x.reshape({1000, 1000}));
       }},
      // SwiGLU fused and as the ops it replaces (the same bits), counted at the fused bytes.
      {"swiglu f32", 3.0 * m * 4, [&] { out = tg::Swiglu(x, y); }},
      {"  silu(x) * y f32", 3.0 * m * 4, [&] { out = tg::Mul(tg::Silu(x), y); }},
      {"swiglu bf16", 3.0 * m * 2, [&] { out = tg::Swiglu(xb, yb); }},
      {"  silu(x) * y bf16", 3.0 * m * 2, [&] { out = tg::Mul(tg::Silu(xb), yb); }},
      {"swiglu_backward bf16", 5.0 * m * 2,
       [&] { out = tg::SwigluBackward(yb, xb, yb).grad_gate; }},
      {"  composed backward bf16", 5.0 * m * 2,
       [&] { out = swiglu_backward_composed(yb, xb, yb).first; }},
  };
  for (const Case& cs : cases) {
    const double s = BestSeconds(20, cs.fn);
    const double gbs = cs.bytes / s * 1e-9;
    std::printf("  %-28s %8.2f GB/s     x%.2f\n", cs.name, gbs, gbs / copy_gbs);
  }
  return 0;
}
