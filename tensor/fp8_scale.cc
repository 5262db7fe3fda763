#include "tensor/fp8_scale.h"

#include <algorithm>

namespace tg {

const char* Fp8TilingName(Fp8Tiling tiling) {
  switch (tiling) {
    case Fp8Tiling::kTensor:
      return "tensor";
    case Fp8Tiling::k1x128:
      return "1x128";
    case Fp8Tiling::k128x128:
      return "128x128";
  }
  return "?";
}

Fp8Tile Fp8TileOf(int64_t rows, int64_t cols, Fp8Tiling tiling) {
  switch (tiling) {
    case Fp8Tiling::kTensor:
      return {std::max<int64_t>(rows, 1), std::max<int64_t>(cols, 1)};
    case Fp8Tiling::k1x128:
      return {1, kFp8BlockSize};
    case Fp8Tiling::k128x128:
      return {kFp8BlockSize, kFp8BlockSize};
  }
  return {1, 1};
}

Fp8Tile Fp8GridOf(int64_t rows, int64_t cols, Fp8Tiling tiling) {
  const Fp8Tile tile = Fp8TileOf(rows, cols, tiling);
  return {(rows + tile.rows - 1) / tile.rows, (cols + tile.cols - 1) / tile.cols};
}

}  // namespace tg
