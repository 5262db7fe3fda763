// The CPU's FP8 GEMM (tg::Fp8Gemm: per-tensor and block scaling) and the FP8 cast as ratios to
// a bf16 GEMM of the same shape (tg::Matmul of bf16 inputs, the weight a transposed view as in
// Linear) measured in the same run, on GPT-2-small's MLP shapes: x [m, k] times w [n, k]^T.
// Issue 30 expects about equal: the FP8 GEMM is the bf16 GEMM of the decoded inputs (oneDNN's
// on AVX-512 BF16 / AMX, f32 otherwise) plus an epilogue (per-tensor) or per-slice scaled
// accumulation (block).
//
//   bazel run -c opt --config=cpu //tools/bench:fp8_gemm
#include <cstdint>
#include <cstdio>

#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tools/bench/timing.h"

namespace {

using tg::bench::BestSeconds;

void Shape(int64_t m, int64_t k, int64_t n, tg::Generator& gen) {
  const tg::RawTensor x = tg::RandNormal({m, k}, gen).to(tg::kBF16);
  const tg::RawTensor w = tg::RandNormal({n, k}, gen).to(tg::kBF16);
  const tg::RawTensor wt = w.transpose(0, 1);
  // Quantized operands with their scales, as a recipe makes them (E4M3 both, 448 / amax).
  tg::Fp8ScaleOptions options;
  const auto quantize = [&](const tg::RawTensor& t, tg::Fp8Tiling tiling, tg::RawTensor* data,
                            tg::RawTensor* scale_inv) {
    const tg::Fp8Scales s = tg::Fp8ScaleFromAmax(tg::Fp8Amax(t, tiling), options);
    *data = tg::Fp8Cast(t, s.scale, tiling, tg::kF8E4M3).data;
    *scale_inv = s.scale_inv;
  };
  tg::RawTensor xt8, xts, wt8, wts, xb8, xbs, wb8, wbs;
  quantize(x, tg::Fp8Tiling::kTensor, &xt8, &xts);
  quantize(w, tg::Fp8Tiling::kTensor, &wt8, &wts);
  quantize(x, tg::Fp8Tiling::k1x128, &xb8, &xbs);
  quantize(w, tg::Fp8Tiling::k128x128, &wb8, &wbs);

  tg::RawTensor out;
  const int reps = 5;
  const double bf16_s = BestSeconds(reps, [&] { out = tg::Matmul(x, wt); });
  const double f32_s = BestSeconds(
      reps, [&, x32 = x.to(tg::kF32), w32 = wt.to(tg::kF32)] { out = tg::Matmul(x32, w32); });
  const double tensor_s = BestSeconds(reps, [&] {
    out = tg::Fp8Gemm(xt8, xts, tg::Fp8Tiling::kTensor, wt8, wts, tg::Fp8Tiling::kTensor,
                      tg::RawTensor(), tg::kBF16);
  });
  const double block_s = BestSeconds(reps, [&] {
    out = tg::Fp8Gemm(xb8, xbs, tg::Fp8Tiling::k1x128, wb8, wbs, tg::Fp8Tiling::k128x128,
                      tg::RawTensor(), tg::kBF16);
  });
  // The cast a step adds per activation: x to E4M3 with its transpose and its 1x128 amaxes.
  const tg::RawTensor cast_scale = tg::RawTensor::Ones({m, (k + 127) / 128});
  const double cast_s = BestSeconds(reps, [&] {
    out = tg::Fp8Cast(x, cast_scale, tg::Fp8Tiling::k1x128, tg::kF8E4M3, true, true).data;
  });
  const double plain_cast_s = BestSeconds(
      reps, [&] { out = tg::Fp8Cast(x, cast_scale, tg::Fp8Tiling::k1x128, tg::kF8E4M3).data; });
  const double amax_s = BestSeconds(reps, [&] { out = tg::Fp8Amax(x, tg::Fp8Tiling::k1x128); });
  const double transpose_s = BestSeconds(reps, [&] {
    out = tg::Fp8Cast(x, cast_scale, tg::Fp8Tiling::k1x128, tg::kF8E4M3, true).data;
  });
  const double copy_s = BestSeconds(reps, [&] { out = x.to(tg::kF32); });
  const double flops = 2.0 * m * n * k;
  std::printf("m=%lld k=%lld n=%lld (%.2f GFLOP)\n", static_cast<long long>(m),
              static_cast<long long>(k), static_cast<long long>(n), flops * 1e-9);
  const auto line = [&](const char* name, double s) {
    std::printf("  %-40s %8.2f ms  %7.1f GFLOP/s  x%.2f of bf16\n", name, s * 1e3, flops / s * 1e-9,
                s / bf16_s);
  };
  line("tg::Matmul bf16 (baseline)", bf16_s);
  line("tg::Matmul f32", f32_s);
  line("tg::Fp8Gemm per-tensor E4M3 -> bf16", tensor_s);
  line("tg::Fp8Gemm 1x128 x 128x128 E4M3 -> bf16", block_s);
  const auto cast_line = [&](const char* name, double s) {
    std::printf("  %-40s %8.2f ms  %7.2f ns/element  x%.3f of bf16\n", name, s * 1e3,
                s / (m * k) * 1e9, s / bf16_s);
  };
  cast_line("tg::Fp8Cast x [m, k] to E4M3", plain_cast_s);
  cast_line("tg::Fp8Cast x, +transpose", transpose_s);
  cast_line("tg::Fp8Cast x, +transpose, +1x128 amax", cast_s);
  cast_line("tg::Fp8Amax x 1x128", amax_s);
  cast_line("x.to(f32) (a copy, for scale)", copy_s);
}

}  // namespace

int main() {
  tg::Generator gen(0);
  std::printf(
      "FP8 GEMM on the CPU, time as a ratio to a bf16 GEMM of the same shape (best of "
      "5)\n");
  Shape(1024, 768, 3072, gen);  // GPT-2 small's MLP up-projection, 1024 tokens
  Shape(1024, 3072, 768, gen);  // its down-projection
  return 0;
}
