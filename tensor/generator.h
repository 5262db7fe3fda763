// Generator: a seeded, counter-based random number generator (Philox4x32-10, the generator of
// cuRAND and PyTorch's CUDA backend). Its whole state is (seed, offset): offset counts the 32-bit
// values drawn so far, so state() / set_state() save and restore the stream exactly, and a GPU
// kernel can reproduce any slice of the stream from the same two numbers.
//
//   tg::Generator gen(42);
//   tg::RawTensor w = tg::RandNormal({768, 768}, gen, 0.0, 0.02);
//   tg::Generator::State saved = gen.state();
//   float a = gen.NextUniform(); gen.set_state(saved); float b = gen.NextUniform();  // a == b
#ifndef TAPEGRAD_TENSOR_GENERATOR_H_
#define TAPEGRAD_TENSOR_GENERATOR_H_

#include <array>
#include <cstdint>

#include "tensor/tensor.h"

namespace tg {

class Generator {
 public:
  struct State {
    uint64_t seed = 0;
    uint64_t offset = 0;
    bool operator==(const State& o) const { return seed == o.seed && offset == o.offset; }
  };

  explicit Generator(uint64_t seed = 0) : state_{seed, 0} {}

  // Restarts the stream of `seed`.
  void set_seed(uint64_t seed) { state_ = State{seed, 0}; }
  State state() const { return state_; }
  void set_state(const State& state) { state_ = state; }

  uint32_t NextU32();
  // Uniform in [0, 1) with 24 random bits (every value exactly representable in f32).
  float NextUniform();
  // Uniform in [0, 1) with 53 random bits.
  double NextUniformDouble();
  // Standard normal (Box-Muller on two 53-bit uniforms; uses four 32-bit draws).
  double NextNormal();

  // Skips the next `draws` 32-bit draws and returns the state before them: a kernel that draws
  // value k (0 <= k < draws) of the returned stream (tensor/philox.h) gets the bits the k-th
  // NextU32() would have returned.
  State Reserve(uint64_t draws);

  // The four 32-bit outputs of Philox4x32-10 for a 128-bit counter and 64-bit key.
  static std::array<uint32_t, 4> Philox(uint64_t counter, uint64_t key);

 private:
  State state_;
};

// Tensors of `shape` drawn from the generator in row-major order; f16/bf16 draw in f32 and round.
RawTensor RandUniform(const Shape& shape, Generator& gen, double low = 0, double high = 1,
                      DType dtype = kF32);
RawTensor RandNormal(const Shape& shape, Generator& gen, double mean = 0, double stddev = 1,
                     DType dtype = kF32);

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_GENERATOR_H_
