// The FP8 entries of the kernel list on the CPU: tile amaxes, the scale rule, the fused
// cast (+ transpose + amax) and the FP8 GEMM.
//
// The GEMM: every e4m3 and e5m2 value (NaN and inf included) is exactly a bf16, and the product
// of two of them is exact in f32, so an FP8 GEMM is a bf16 GEMM of the decoded operands with f32
// sums: oneDNN's (AVX-512 BF16 / AMX) where LowPrecisionGemm runs it, else (AVX2) the operands
// decoded to f32 and the f32 Gemm (the same products, the same kind of sums). Per-tensor scaling is
// one GEMM and an epilogue pass (scale, bias, one rounding). Block scaling runs per output tile of
// 128 x 768 (the tasks of ParallelFor, each with its own f32 scratch): a GEMM per 128-wide slice
// of k into a scratch, whose partial sums are scaled by their two tiles' scale_invs and added to
// the tile's f32 accumulator in slice order (DeepSeek-V3's promotion); both stay in L2.
//
// Threads: the amax, cast, scale and epilogue loops compute each element with the serial code
// (and the amaxes are maxima: exact in any order), so they give the same bits at any thread
// count; the GEMMs are the libraries' (deterministic for a fixed thread count, docs/cpu.md).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "tensor/convert.h"
#include "tensor/cpu/convert_rows.h"
#include "tensor/cpu/gemm.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/parallel.h"
#include "tensor/float8.h"

namespace tg::cpu {
namespace {

// Rows of x a task of the cast covers; its transpose is written kBand bytes (a cache line) per
// row of out_t.
constexpr int64_t kBand = 64;
// The output tile of a task of the block-scaled GEMM: 128 rows (a 128x128 tile of a) by up to
// 768 columns, so that its f32 partial sums and accumulator (2 x 384 KiB) stay in L2 while the
// slices are added.
constexpr int64_t kGemmRows = 128;
constexpr int64_t kGemmCols = 768;

// |v| > m ? |v| : m: fmaxf over non-negative maxima, a NaN skipped (it compares false).
inline float MaxAbs(float m, float v) {
  const float a = std::fabs(v);
  return a > m ? a : m;
}

// The largest |v[j]|, NaN skipped (fmaxf from 0), over the bits: |v|'s bits order as its values,
// and a NaN's (above 0x7f800000) are masked to 0. An integer max reduction, which GCC
// vectorises (a float one it may not reassociate).
inline float AbsMax(const float* v, int64_t n) {
  uint32_t m = 0;
  for (int64_t j = 0; j < n; ++j) {
    uint32_t b = FloatBits(v[j]) & 0x7fffffffu;
    b &= 0u - static_cast<uint32_t>(b <= 0x7f800000u);
    m = b > m ? b : m;
  }
  return BitsToFloat(m);
}

// dst[j * dst_stride + i] = src[i * src_stride + j] for an 8 x 8 block of bytes: the rows as
// 64-bit words (byte j of word i is element (i, j): little-endian), transposed by exchanging
// d x d sub-blocks between words i and i + d for d = 4, 2, 1.
inline void Transpose8x8(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride) {
  uint64_t x[8];
  for (int i = 0; i < 8; ++i) std::memcpy(&x[i], src + i * src_stride, 8);
  for (int d = 4; d >= 1; d /= 2) {
    const int shift = 8 * d;
    const uint64_t mask = d == 4   ? 0x00000000ffffffffull
                          : d == 2 ? 0x0000ffff0000ffffull
                                   : 0x00ff00ff00ff00ffull;
    for (int i = 0; i < 8; ++i) {
      if (i & d) continue;
      // Little-endian: byte j of word i is bits [8j, 8j + 8). Swap the high d bytes of each
      // 2d-byte group of word i with the low d bytes of word i + d.
      const uint64_t a = x[i], b = x[i + d];
      x[i] = (a & mask) | ((b & mask) << shift);
      x[i + d] = ((a >> shift) & mask) | (b & ~mask);
    }
  }
  for (int i = 0; i < 8; ++i) std::memcpy(dst + i * dst_stride, &x[i], 8);
}

// The saturating cast to the format of out's dtype (kNone: no output, amaxes only); the cast
// itself is vec_math's ScaleToFp8F32 (Highway, the widest vectors this CPU has).
enum class Fp8Out { kNone, kE4M3, kE5M2 };

// One pass over x [rows, cols] (T: f32/bf16/f16), row by row in bands of kBand rows: per element
// v = x * scale[tile] in f32, out = the cast of v, and row_max[r, tile col] = the largest |x| of
// row r within the tile column (when row_max is given); then the band's out_t[c, r] = out[r, c]
// (when out_t is given) from the band's rows, still in cache. out / out_t may be null.
template <typename T, Fp8Out kOut>
void CastPass(const T* x, int64_t rows, int64_t cols, Fp8Tile tile, int64_t grid_cols,
              const float* scale, uint8_t* out, uint8_t* out_t, float* row_max) {
  const int64_t bands = (rows + kBand - 1) / kBand;
  ParallelFor(bands, RowsPerThread(kBand * cols), [&](int64_t band_begin, int64_t band_end) {
    ScratchVector<float> v(static_cast<size_t>(cols));
    for (int64_t band = band_begin; band < band_end; ++band) {
      const int64_t r0 = band * kBand, r1 = std::min(rows, r0 + kBand);
      for (int64_t r = r0; r < r1; ++r) {
        LoadRow(x + r * cols, 1, cols, v.data());
        for (int64_t c0 = 0, tc = 0; c0 < cols; c0 += tile.cols, ++tc) {
          const int64_t width = std::min(cols - c0, tile.cols);
          const float* vc = v.data() + c0;
          if (row_max != nullptr) row_max[r * grid_cols + tc] = AbsMax(vc, width);
          if constexpr (kOut != Fp8Out::kNone) {
            const float s = scale[(r / tile.rows) * grid_cols + tc];
            ScaleToFp8F32(vc, s, out + r * cols + c0, width, kOut == Fp8Out::kE4M3);
          }
        }
      }
      if (out_t == nullptr) continue;
      // The band's out_t[c, r0:r1] = out[r0:r1, c]: 8 x 8 byte blocks through 64-bit words
      // (Transpose8x8), then the ragged rows and columns byte by byte.
      const int64_t r8 = r0 + (r1 - r0) / 8 * 8, c8 = cols / 8 * 8;
      for (int64_t c = 0; c < c8; c += 8) {
        for (int64_t r = r0; r < r8; r += 8) {
          Transpose8x8(out + r * cols + c, cols, out_t + c * rows + r, rows);
        }
        for (int64_t r = r8; r < r1; ++r) {
          for (int64_t j = 0; j < 8; ++j) out_t[(c + j) * rows + r] = out[r * cols + c + j];
        }
      }
      for (int64_t c = c8; c < cols; ++c) {
        uint8_t* dst = out_t + c * rows;
        for (int64_t r = r0; r < r1; ++r) dst[r] = out[r * cols + c];
      }
    }
  });
}

// amax[g, tc] = the largest row_max[r, tc] over the rows r of tile row g.
void ReduceRowMax(const float* row_max, int64_t rows, Fp8Tile tile, Fp8Tile grid, float* amax) {
  ParallelFor(grid.rows, RowsPerThread(tile.rows * grid.cols), [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      float* a = amax + g * grid.cols;
      std::fill(a, a + grid.cols, 0.0f);
      for (int64_t r = g * tile.rows; r < std::min(rows, (g + 1) * tile.rows); ++r) {
        for (int64_t tc = 0; tc < grid.cols; ++tc)
          a[tc] = MaxAbs(a[tc], row_max[r * grid.cols + tc]);
      }
    }
  });
}

// Fp8Amax and Fp8Cast: the cast pass with the amaxes gathered per row, then reduced per tile
// (1x128 tiles are rows: their row maxima are the amaxes, written in place).
void CastAndAmax(const RawTensor& out, const RawTensor& out_t, const RawTensor& amax,
                 const RawTensor& x, const RawTensor& scale, Fp8Tiling tiling) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const Fp8Tile tile = Fp8TileOf(rows, cols, tiling), grid = Fp8GridOf(rows, cols, tiling);
  if (rows == 0 || cols == 0) return;
  ScratchVector<float> row_max_scratch;
  float* row_max = nullptr;
  if (amax.defined()) {
    if (tile.rows == 1) {
      row_max = amax.data<float>();
    } else {
      row_max_scratch.resize(static_cast<size_t>(rows * grid.cols));
      row_max = row_max_scratch.data();
    }
  }
  const float* s = scale.defined() ? scale.data<float>() : nullptr;
  uint8_t* o = out.defined() ? static_cast<uint8_t*>(out.raw_data()) : nullptr;
  uint8_t* ot = out_t.defined() ? static_cast<uint8_t*>(out_t.raw_data()) : nullptr;
  VisitFloating("fp8_cast", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, double>) {
      throw Error("fp8_cast: the CPU kernel takes f32, bf16 or f16 input, got f64");
    } else {
      const T* xs = x.data<T>();
      if (!out.defined()) {
        CastPass<T, Fp8Out::kNone>(xs, rows, cols, tile, grid.cols, s, o, ot, row_max);
      } else if (out.dtype() == kF8E4M3) {
        CastPass<T, Fp8Out::kE4M3>(xs, rows, cols, tile, grid.cols, s, o, ot, row_max);
      } else {
        CastPass<T, Fp8Out::kE5M2>(xs, rows, cols, tile, grid.cols, s, o, ot, row_max);
      }
    }
  });
  if (row_max != nullptr && tile.rows != 1) {
    ReduceRowMax(row_max, rows, tile, grid, amax.data<float>());
  }
}

// ---- GEMM ----

// The bits of every code of an FP8 format as E (bf16: the decoded float's top half; f32), both
// exact.
template <typename E>
struct DecodeTable {
  std::array<E, 256> values;
  explicit DecodeTable(DType dtype) {
    for (int c = 0; c < 256; ++c) {
      const uint8_t b = static_cast<uint8_t>(c);
      const float f = dtype == kF8E4M3 ? E4M3BitsToFloat(b) : E5M2BitsToFloat(b);
      if constexpr (std::is_same_v<E, float>) {
        values[c] = f;
      } else {
        values[c] = BFloat16::FromBits(static_cast<uint16_t>(FloatBits(f) >> 16));
      }
    }
  }
};

// The FP8 tensor t (contiguous) decoded into `dst` as E (bf16 or f32).
template <typename E>
void Decode(const RawTensor& t, ScratchVector<E>& dst) {
  static const DecodeTable<E> e4m3(kF8E4M3), e5m2(kF8E5M2);
  const std::array<E, 256>& table = (t.dtype() == kF8E4M3 ? e4m3 : e5m2).values;
  const uint8_t* src = static_cast<const uint8_t*>(t.raw_data());
  const int64_t count = t.numel();
  dst.resize(static_cast<size_t>(count));
  E* d = dst.data();
  ParallelFor(count, int64_t{1} << 15, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<E, float>) {
      Fp8ToF32(src + begin, d + begin, end - begin, t.dtype() == kF8E4M3);  // Highway vectors
    } else {
      for (int64_t i = begin; i < end; ++i) d[i] = table[src[i]];
    }
  });
}

// Whether oneDNN multiplies bf16 on this CPU (AVX-512 and up), asked once with a small product.
// Where it does not (AVX2), the GEMM decodes straight to f32: one pass, no bf16 copy to widen.
bool HasBf16Gemm() {
  static const bool has = [] {
    constexpr int64_t kM = 64, kK = 128;
    std::vector<BFloat16> ab(kM * kK);
    std::vector<float> c(kM * kM);
    return LowPrecisionGemm<BFloat16, float>(false, true, kM, kM, kK, ab.data(), kK, ab.data(), kK,
                                             c.data(), kM);
  }();
  return has;
}

// c [m, n] (f32, ldc) = a [m, k] (lda) @ b [n, k]^T (ldb) with exact products and f32 sums. bf16
// operands: oneDNN's bf16 product, or where it declines this shape the operands widened to f32;
// f32 operands: the f32 Gemm.
void GemmNT(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
            int64_t ldb, float* c, int64_t ldc) {
  Gemm<float>(false, true, m, n, k, a, lda, b, ldb, c, ldc);
}
void GemmNT(int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t lda, const BFloat16* b,
            int64_t ldb, float* c, int64_t ldc) {
  if (LowPrecisionGemm<BFloat16, float>(false, true, m, n, k, a, lda, b, ldb, c, ldc)) return;
  ScratchVector<float> a32(static_cast<size_t>(m * k)), b32(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < m; ++r) WidenToF32(a + r * lda, a32.data() + r * k, k);
  for (int64_t r = 0; r < n; ++r) WidenToF32(b + r * ldb, b32.data() + r * k, k);
  GemmNT(m, n, k, a32.data(), k, b32.data(), k, c, ldc);
}

// out[i, j] = acc[i, j] + bias[j], rounded once to T, for rows x cols values (acc: ld acc_ld;
// out: ld out_ld; acc may be out itself when T is f32).
template <typename T>
void StoreTile(float* acc, int64_t acc_ld, const float* bias, int64_t rows, int64_t cols, T* out,
               int64_t out_ld) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = acc + i * acc_ld;
    if (bias != nullptr) {
      for (int64_t j = 0; j < cols; ++j) row[j] += bias[j];
    }
    if (row != reinterpret_cast<float*>(out + i * out_ld)) StoreRow(row, cols, out + i * out_ld, 1);
  }
}

// T: out's type; E: the decoded operands' (bf16 or f32).
template <typename T, typename E>
void Fp8GemmTyped(const RawTensor& out, const RawTensor& a, const RawTensor& a_scale_inv,
                  Fp8Tiling a_tiling, const RawTensor& b, const RawTensor& b_scale_inv,
                  Fp8Tiling b_tiling, const float* bias) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  T* o = out.data<T>();
  ScratchVector<E> ad, bd;
  Decode(a, ad);
  Decode(b, bd);
  const float* sa = a_scale_inv.data<float>();
  const float* sb = b_scale_inv.data<float>();
  if (a_tiling == Fp8Tiling::kTensor) {
    // One GEMM (threaded by the library), then sum * (sa * sb) + bias, rounded once.
    ScratchVector<float> scratch;
    float* c = GemmResult<float>(o, m * n, scratch);
    GemmNT(m, n, k, ad.data(), k, bd.data(), k, c, n);
    const float s = sa[0] * sb[0];
    ParallelFor(m, RowsPerThread(n), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float* row = c + i * n;
        for (int64_t j = 0; j < n; ++j) row[j] *= s;
      }
      StoreTile(c + begin * n, n, bias, end - begin, n, o + begin * n, n);
    });
    return;
  }
  // Block scaling: the scale_inv grids are [m or ceil(m / 128), slices] and [n or ceil(n / 128),
  // slices]. Per output tile: a GEMM per slice into `partial`, scaled and added to `acc` in slice
  // order. The tiles are independent and each is computed the same way at any thread count.
  const int64_t slices = (k + kFp8BlockSize - 1) / kFp8BlockSize;
  const int64_t a_tile_rows = Fp8TileOf(m, k, a_tiling).rows;
  const int64_t b_tile_rows = Fp8TileOf(n, k, b_tiling).rows;
  const int64_t row_tiles = (m + kGemmRows - 1) / kGemmRows;
  const int64_t col_tiles = (n + kGemmCols - 1) / kGemmCols;
  ParallelFor(row_tiles * col_tiles, 1, [&](int64_t tile_begin, int64_t tile_end) {
    ScratchVector<float> partial(static_cast<size_t>(kGemmRows * kGemmCols));
    ScratchVector<float> acc(static_cast<size_t>(kGemmRows * kGemmCols));
    float col_scale[kGemmCols];  // b's scale_inv per column of the tile
    for (int64_t t = tile_begin; t < tile_end; ++t) {
      const int64_t i0 = (t / col_tiles) * kGemmRows, rows = std::min(m - i0, kGemmRows);
      const int64_t j0 = (t % col_tiles) * kGemmCols, cols = std::min(n - j0, kGemmCols);
      std::fill(acc.begin(), acc.begin() + rows * cols, 0.0f);
      for (int64_t s = 0; s < slices; ++s) {
        const int64_t k0 = s * kFp8BlockSize, width = std::min(k - k0, kFp8BlockSize);
        GemmNT(rows, cols, width, ad.data() + i0 * k + k0, k, bd.data() + j0 * k + k0, k,
               partial.data(), cols);
        for (int64_t j = 0; j < cols; ++j) col_scale[j] = sb[((j0 + j) / b_tile_rows) * slices + s];
        for (int64_t i = 0; i < rows; ++i) {
          const float row_scale = sa[((i0 + i) / a_tile_rows) * slices + s];
          const float* p = partial.data() + i * cols;
          float* c = acc.data() + i * cols;
          for (int64_t j = 0; j < cols; ++j) c[j] += p[j] * (row_scale * col_scale[j]);
        }
      }
      StoreTile(acc.data(), cols, bias == nullptr ? nullptr : bias + j0, rows, cols,
                o + i0 * n + j0, n);
    }
  });
}

}  // namespace

void Fp8Amax(const RawTensor& amax, const RawTensor& x, Fp8Tiling tiling) {
  CastAndAmax(RawTensor(), RawTensor(), amax, x, RawTensor(), tiling);
}

void Fp8Scale(const RawTensor& scale, const RawTensor& scale_inv, const RawTensor& amax,
              const Fp8ScaleOptions& options) {
  const float* a = amax.data<float>();
  float* s = scale.data<float>();
  float* si = scale_inv.data<float>();
  for (int64_t i = 0; i < amax.numel(); ++i) {
    s[i] = Fp8ScaleFromAmax(a[i], options);
    si[i] = 1.0f / s[i];
  }
}

void Fp8Cast(const RawTensor& out, const RawTensor& out_t, const RawTensor& amax,
             const RawTensor& x, const RawTensor& scale, Fp8Tiling tiling) {
  CastAndAmax(out, out_t, amax, x, scale, tiling);
}

void Fp8Gemm(const RawTensor& out, const RawTensor& a, const RawTensor& a_scale_inv,
             Fp8Tiling a_tiling, const RawTensor& b, const RawTensor& b_scale_inv,
             Fp8Tiling b_tiling, const RawTensor& bias) {
  if (out.numel() == 0) return;
  VisitFloating("fp8_gemm", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, double>) {
      throw Error("fp8_gemm: the CPU kernel writes f32, bf16 or f16, got f64");
    } else {
      // The bias in f32 (exact), added to the f32 result before its one rounding.
      ScratchVector<float> bias32;
      const float* bias_f = nullptr;
      if (bias.defined()) {
        bias32.resize(static_cast<size_t>(bias.numel()));
        LoadRow(bias.data<T>(), 1, bias.numel(), bias32.data());
        bias_f = bias32.data();
      }
      if (HasBf16Gemm()) {
        Fp8GemmTyped<T, BFloat16>(out, a, a_scale_inv, a_tiling, b, b_scale_inv, b_tiling, bias_f);
      } else {
        Fp8GemmTyped<T, float>(out, a, a_scale_inv, a_tiling, b, b_scale_inv, b_tiling, bias_f);
      }
    }
  });
}

}  // namespace tg::cpu
