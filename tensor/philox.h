// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) as one
// function that host code and CUDA kernels share, so a kernel that draws the i-th value of a
// Generator's stream gets exactly the bits Generator::NextU32 would have returned.
//
// Stream layout (tensor/generator.h): draw number d of seed s is word d % 4 of the block
// Philox(counter = d / 4, key = s). The counter's upper 64 bits are zero.
#ifndef TAPEGRAD_TENSOR_PHILOX_H_
#define TAPEGRAD_TENSOR_PHILOX_H_

#include <cstdint>

#include "tensor/host_device.h"

namespace tg {

struct PhiloxBlock {
  uint32_t v[4];
};

// Ten rounds over the 128-bit counter (counter, 0) with the 64-bit key.
TG_HOST_DEVICE inline PhiloxBlock Philox4x32(uint64_t counter, uint64_t key) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {{c0, c1, c2, c3}};
}

// Dropout's rule on one draw u: Generator::NextUniform() = (u >> 8) * 2^-24 < p drops the
// element. As an integer test: (u >> 8) < threshold with threshold = ceil(p * 2^24) (exact,
// since p * 2^24 only shifts p's exponent), which needs no floating point on the device.
inline uint32_t DropoutThreshold(double p) {
  const double scaled = p * 16777216.0;  // p in [0, 1): at most 2^24
  uint32_t t = static_cast<uint32_t>(scaled);
  if (static_cast<double>(t) < scaled) ++t;
  return t;
}

TG_HOST_DEVICE inline bool DropoutKeeps(uint32_t draw, uint32_t threshold) {
  return (draw >> 8) >= threshold;
}

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_PHILOX_H_
