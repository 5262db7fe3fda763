// 2-D convolution and max pooling over [N, C, H, W].
//
// Convolution in f32 and bf16 runs oneDNN's convolution primitives (tensor/cpu/dnnl.h) where
// oneDNN has a fast implementation for the dtype and shape on the running CPU (bf16 only where
// DnnlBf16ProductsPay(); elsewhere bf16 goes through f32 copies), each single-threaded on a
// fixed chunk of the minibatch (DnnlConvInChunks: the same bits at every thread count). They
// pick their own data layouts (blocked ones on AVX-512/AMX), and our NCHW/OIHW buffers are
// reordered to and from them, which measured 2-10x faster than the plain layouts. bf16 accumulates in f32 and
// rounds each result once, as below. f16 (oneDNN 2.6 has no f16 convolution on CPU) computes on
// f32 copies through the f32 path; f64 (gradchecks) and whatever oneDNN declines, including its
// reference implementations, use the im2col + GEMM code below. The bias gradient is always ours
// (an f64 sum rounded once).
//
// The fallback is im2col + GEMM: the input patches of a chunk of images are unfolded into
// cols [C*kh*kw, images*Ho*Wo] (one row per kernel tap, contiguous runs along the output width),
// the forward multiplies weight [O, C*kh*kw] @ cols, the weight gradient accumulates
// grad @ cols^T over the chunks, and the input gradient is col2im of weight^T @ grad. All GEMMs
// go to OpenBLAS (threaded); the loops here are plain and contiguous along the output width.
// f32/f64 compute natively; f16/bf16 go through f32 copies and round each result once.
//
// Max pooling is our own kernel (planes in parallel), since the op returns PyTorch's flat
// indices into each plane, which oneDNN's pooling workspace does not give; it compares each
// window's elements in row-major order with PyTorch's CPU rule (first maximum, NaN wins).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensor/convert.h"
#include "tensor/cpu/dnnl.h"
#include "tensor/cpu/gemm.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/parallel.h"
#include "tensor/cpu/vec_math.h"

namespace tg::cpu {
namespace {

// How a batch is split into GEMMs (tuned on 2 cores with the Fashion-MNIST CNN: conv 1->32 and
// 32->64, 3x3, batch 128). Images are unfolded in chunks of at most kColsBudget im2col elements
// (4 MiB of f32; larger chunks were not reliably faster and keep more scratch memory). Within a
// chunk, either one GEMM covers all its images (its output [O, images*L] is then copied into
// [images, O, L], and the gradient gathered the other way), or each image gets a GEMM that reads
// its block of columns in place and writes its output directly. The single GEMM keeps OpenBLAS's
// threads busier (about 1.3x faster for the 32->64 conv), but the copies cost as much as a GEMM
// with a short reduction (K = C*kh*kw = 9 for the 1->32 conv: 2-3x slower than per image), so
// images get their own GEMM when K <= kPerImageMaxK.
constexpr int64_t kColsBudget = int64_t{1} << 20;
constexpr int64_t kPerImageMaxK = 32;

int64_t ImagesPerChunk(const Window2d& g) {
  // The larger of the im2col columns and the output rows of one image bounds the chunk.
  const int64_t per_image = std::max<int64_t>(std::max(g.c * g.kh * g.kw, g.o) * g.oh * g.ow, 1);
  return std::clamp<int64_t>(kColsBudget / per_image, 1, std::max<int64_t>(g.n, 1));
}

// Scratch memory (uninitialised), reused across calls on each thread: a fresh multi-megabyte
// block per call costs a page fault per 4 KiB page (malloc hands large blocks back to the
// system), which cost as much as the im2col itself. A slot keeps its largest block up to
// kKeptScratchBytes; larger requests (one huge image) get a block of their own, freed after.
enum ScratchSlot { kCols, kGradCols, kRows, kNumSlots };
constexpr size_t kKeptScratchBytes = size_t{32} << 20;

template <typename T>
class Scratch {
 public:
  Scratch(ScratchSlot slot, int64_t count) {
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T);
    if (bytes > kKeptScratchBytes) {
      own_.reset(new char[bytes]);
      data_ = reinterpret_cast<T*>(own_.get());
      return;
    }
    struct Block {
      std::unique_ptr<char[]> data;
      size_t bytes = 0;
    };
    thread_local Block blocks[kNumSlots];
    Block& b = blocks[slot];
    if (bytes > b.bytes) {
      b.data.reset();  // free before allocating the larger block
      b.data.reset(new char[bytes]);
      b.bytes = bytes;
    }
    data_ = reinterpret_cast<T*>(b.data.get());
  }
  T* get() const { return data_; }

 private:
  std::unique_ptr<char[]> own_;
  T* data_ = nullptr;
};

// The output positions [lo, hi) of one dim whose input index o * stride + offset lies in
// [0, size).
struct Range {
  int64_t lo, hi;
};

Range ValidRange(int64_t offset, int64_t stride, int64_t size, int64_t out) {
  const int64_t lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t last = size - 1 - offset;  // the largest o * stride
  const int64_t hi = std::min<int64_t>(last < 0 ? 0 : last / stride + 1, out);
  return {std::min(lo, hi), hi};
}

// cols [C*kh*kw, images*L] <- the patches of x [images, C, H, W] (zeros where they read padding).
template <typename T>
void Im2Col(const T* x, int64_t images, const Window2d& g, T* cols) {
  const int64_t L = g.oh * g.ow, row_len = images * L, plane = g.h * g.w;
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t i = 0; i < g.kh; ++i) {
      const int64_t off_y = i * g.dh - g.ph;
      const Range ry = ValidRange(off_y, g.sh, g.h, g.oh);
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t off_x = j * g.dw - g.pw;
        const Range rx = ValidRange(off_x, g.sw, g.w, g.ow);
        T* row = cols + ((c * g.kh + i) * g.kw + j) * row_len;
        for (int64_t b = 0; b < images; ++b) {
          const T* src = x + (b * g.c + c) * plane;
          T* dst = row + b * L;
          std::fill(dst, dst + ry.lo * g.ow, T(0));
          for (int64_t oy = ry.lo; oy < ry.hi; ++oy) {
            const T* in = src + (oy * g.sh + off_y) * g.w;
            T* d = dst + oy * g.ow;
            std::fill(d, d + rx.lo, T(0));
            if (g.sw == 1 && rx.lo < rx.hi) {
              std::copy(in + rx.lo + off_x, in + rx.hi + off_x, d + rx.lo);
            } else {
              for (int64_t ox = rx.lo; ox < rx.hi; ++ox) d[ox] = in[ox * g.sw + off_x];
            }
            std::fill(d + rx.hi, d + g.ow, T(0));
          }
          std::fill(dst + ry.hi * g.ow, dst + L, T(0));
        }
      }
    }
  }
}

// grad_x [images, C, H, W] += the patches in cols [C*kh*kw, images*L] summed back where they
// came from (the adjoint of Im2Col; padding positions are dropped).
template <typename T>
void Col2Im(const T* cols, int64_t images, const Window2d& g, T* grad_x) {
  const int64_t L = g.oh * g.ow, row_len = images * L, plane = g.h * g.w;
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t i = 0; i < g.kh; ++i) {
      const int64_t off_y = i * g.dh - g.ph;
      const Range ry = ValidRange(off_y, g.sh, g.h, g.oh);
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t off_x = j * g.dw - g.pw;
        const Range rx = ValidRange(off_x, g.sw, g.w, g.ow);
        const T* row = cols + ((c * g.kh + i) * g.kw + j) * row_len;
        for (int64_t b = 0; b < images; ++b) {
          T* dst = grad_x + (b * g.c + c) * plane;
          const T* src = row + b * L;
          for (int64_t oy = ry.lo; oy < ry.hi; ++oy) {
            T* out = dst + (oy * g.sh + off_y) * g.w;
            const T* s = src + oy * g.ow;
            if (g.sw == 1) {
              for (int64_t ox = rx.lo; ox < rx.hi; ++ox) out[ox + off_x] += s[ox];
            } else {
              for (int64_t ox = rx.lo; ox < rx.hi; ++ox) out[ox * g.sw + off_x] += s[ox];
            }
          }
        }
      }
    }
  }
}

template <typename T>
void Conv2dImpl(const RawTensor& out, const RawTensor& x, const RawTensor& weight,
                const RawTensor& bias, const Window2d& g) {
  const int64_t K = g.c * g.kh * g.kw, L = g.oh * g.ow, chunk = ImagesPerChunk(g);
  if (out.numel() == 0) return;
  const T* xp = x.data<T>();
  const T* wp = weight.data<T>();
  const T* bp = bias.defined() ? bias.data<T>() : nullptr;
  T* op = out.data<T>();
  if (K == 0) {  // no input channels: the output is the bias
    for (int64_t i = 0; i < g.n * g.o; ++i)
      std::fill(op + i * L, op + (i + 1) * L, bp ? bp[i % g.o] : T(0));
    return;
  }
  const bool per_image = K <= kPerImageMaxK || chunk == 1;
  const Scratch<T> cols_block(kCols, K * chunk * L);
  const Scratch<T> rows_block(kRows, per_image ? 0 : g.o * chunk * L);
  T* cols = cols_block.get();
  T* rows = rows_block.get();
  for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
    const int64_t images = std::min(chunk, g.n - n0), row_len = images * L;
    T* dst = op + n0 * g.o * L;
    Im2Col(xp + n0 * g.c * g.h * g.w, images, g, cols);
    if (per_image) {
      for (int64_t b = 0; b < images; ++b) {
        T* d = dst + b * g.o * L;
        Gemm<T>(false, false, g.o, L, K, wp, K, cols + b * L, row_len, d, L, false);
        if (bp) {
          for (int64_t o = 0; o < g.o; ++o) {
            const T add = bp[o];
            for (int64_t l = 0; l < L; ++l) d[o * L + l] += add;
          }
        }
      }
    } else {
      Gemm<T>(false, false, g.o, row_len, K, wp, K, cols, row_len, rows, row_len, false);
      // rows [O, images*L] -> out [images, O, L], adding the bias.
      for (int64_t b = 0; b < images; ++b) {
        for (int64_t o = 0; o < g.o; ++o) {
          const T* s = rows + o * row_len + b * L;
          T* d = dst + (b * g.o + o) * L;
          const T add = bp ? bp[o] : T(0);
          for (int64_t l = 0; l < L; ++l) d[l] = s[l] + add;
        }
      }
    }
  }
}

template <typename T>
void Conv2dBackwardImpl(const RawTensor& grad_input, const RawTensor& grad_weight,
                        const RawTensor& grad_out, const RawTensor& x, const RawTensor& weight,
                        const Window2d& g) {
  const int64_t K = g.c * g.kh * g.kw, L = g.oh * g.ow, chunk = ImagesPerChunk(g);
  const bool need_input = grad_input.defined(), need_weight = grad_weight.defined();
  T* gip = need_input ? grad_input.data<T>() : nullptr;
  T* gwp = need_weight ? grad_weight.data<T>() : nullptr;
  if (gip) std::fill(gip, gip + grad_input.numel(), T(0));
  if (gwp) std::fill(gwp, gwp + grad_weight.numel(), T(0));
  if (K == 0 || g.o == 0 || g.n == 0 || (!need_input && !need_weight)) return;
  const T* gop = grad_out.data<T>();
  const T* xp = need_weight ? x.data<T>() : nullptr;
  const T* wp = need_input ? weight.data<T>() : nullptr;
  const bool per_image = K <= kPerImageMaxK || chunk == 1;
  const Scratch<T> cols_block(kCols, need_weight ? K * chunk * L : 0);
  const Scratch<T> dcols_block(kGradCols, need_input ? K * chunk * L : 0);
  const Scratch<T> rows_block(kRows, per_image ? 0 : g.o * chunk * L);
  T* cols = cols_block.get();
  T* dcols = dcols_block.get();
  T* rows = rows_block.get();
  for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
    const int64_t images = std::min(chunk, g.n - n0), row_len = images * L;
    const T* go = gop + n0 * g.o * L;
    // The GEMMs of this chunk: per image, grad_out's own [O, L] blocks against column blocks
    // of cols (leading dimension row_len); otherwise one GEMM over the gradient gathered as
    // [O, images*L].
    const int64_t gemms = per_image ? images : 1, width = per_image ? L : row_len;
    if (!per_image) {
      for (int64_t b = 0; b < images; ++b) {
        for (int64_t o = 0; o < g.o; ++o) {
          std::copy(go + (b * g.o + o) * L, go + (b * g.o + o + 1) * L, rows + o * row_len + b * L);
        }
      }
      go = rows;
    }
    if (need_weight) {  // grad_weight [O, K] += grad [O, width] @ cols^T
      Im2Col(xp + n0 * g.c * g.h * g.w, images, g, cols);
      for (int64_t b = 0; b < gemms; ++b) {
        Gemm<T>(false, true, g.o, K, width, go + b * g.o * L, width, cols + b * L, row_len, gwp, K,
                true);
      }
    }
    if (need_input) {  // dcols [K, width] = weight^T @ grad [O, width], then col2im
      for (int64_t b = 0; b < gemms; ++b) {
        Gemm<T>(true, false, K, width, g.o, wp, K, go + b * g.o * L, width, dcols + b * L, row_len,
                false);
      }
      Col2Im(dcols, images, g, gip + n0 * g.c * g.h * g.w);
    }
  }
}

// grad_bias[o] = the sum of grad_out[:, o] over N, Ho, Wo, in f64, rounded once; channels in
// parallel (each summed by one thread in the serial order, so any thread count gives the same).
template <typename T>
void BiasGrad(const RawTensor& grad_bias, const RawTensor& grad_out, const Window2d& g) {
  const int64_t L = g.oh * g.ow;
  const T* go = grad_out.data<T>();
  T* gb = grad_bias.data<T>();
  using C = ComputeType<T>;
  ParallelFor(g.o, RowsPerThread(g.n * L), [&](int64_t o0, int64_t o1) {
    // f16/bf16 rows are widened first, in one vectorised pass (gemm.h): the conversion per element
    // in the sum's loop would cost more than the sum.
    ScratchVector<C> widened;
    for (int64_t o = o0; o < o1; ++o) {
      double acc = 0;
      for (int64_t n = 0; n < g.n; ++n) {
        const C* s = GemmOperand<C>(go + (n * g.o + o) * L, L, widened);
        // Four partial sums: a single f64 chain would be latency-bound (no reassociation).
        double part[4] = {0, 0, 0, 0};
        int64_t l = 0;
        for (; l + 4 <= L; l += 4) {
          for (int k = 0; k < 4; ++k) part[k] += static_cast<double>(s[l + k]);
        }
        for (; l < L; ++l) part[0] += static_cast<double>(s[l]);
        acc += (part[0] + part[1]) + (part[2] + part[3]);
      }
      gb[o] = Convert<T>(acc);
    }
  });
}

// The three convolution primitives oneDNN has, one per pass.
enum class ConvPass : int64_t { kForward, kBackwardData, kBackwardWeights };

// oneDNN's primitive for `pass` over window g in `dtype` (f32 or bf16), arguments in the order
//   forward:          x, weight, [bias], out
//   backward data:    grad_out, weight, grad_input
//   backward weights: x, grad_out, grad_weight (f32 for either dtype)
// or nullptr where oneDNN has only a reference implementation.
std::shared_ptr<DnnlPrimitive> MakeDnnlConv(ConvPass pass, DType dtype, const Window2d& g,
                                            bool with_bias) {
  using dnnl::memory;
  using Tag = memory::format_tag;
  const memory::data_type t = DnnlType(dtype);
  const memory::dims src{g.n, g.c, g.h, g.w}, wei{g.o, g.c, g.kh, g.kw}, dst{g.n, g.o, g.oh, g.ow};
  const memory::desc src_plain(src, t, Tag::nchw), wei_plain(wei, t, Tag::oihw);
  const memory::desc dst_plain(dst, t, Tag::nchw), bias_plain({g.o}, t, Tag::x);
  // Layouts of oneDNN's choice.
  const memory::desc src_any(src, t, Tag::any), wei_any(wei, t, Tag::any);
  const memory::desc dst_any(dst, t, Tag::any);
  // oneDNN counts dilation from 0 and wants the right/bottom padding that makes the output
  // size come out exactly (negative when the last input rows/columns are never read).
  const memory::dims strides{g.sh, g.sw}, dilates{g.dh - 1, g.dw - 1}, pad_l{g.ph, g.pw};
  const memory::dims pad_r{(g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1 - g.h - g.ph,
                           (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1 - g.w - g.pw};
  const auto algo = dnnl::algorithm::convolution_direct;
  dnnl::engine& engine = DnnlEngine();
  const auto fwd_desc =
      with_bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src_any,
                                                  wei_any, bias_plain, dst_any, strides, dilates,
                                                  pad_l, pad_r)
                : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src_any,
                                                  wei_any, dst_any, strides, dilates, pad_l, pad_r);
  const dnnl::primitive_attr attr = DnnlAttr();
  const dnnl::convolution_forward::primitive_desc fwd(fwd_desc, attr, engine);
  auto p = std::make_shared<DnnlPrimitive>();
  switch (pass) {
    case ConvPass::kForward:
      if (IsDnnlReference(fwd)) return nullptr;
      p->primitive = dnnl::convolution_forward(fwd);
      p->scratchpad = fwd.scratchpad_desc();
      p->AddArg(DNNL_ARG_SRC, src_plain, fwd.src_desc(), false);
      p->AddArg(DNNL_ARG_WEIGHTS, wei_plain, fwd.weights_desc(), false);
      if (with_bias) p->AddArg(DNNL_ARG_BIAS, bias_plain, fwd.bias_desc(), false);
      p->AddArg(DNNL_ARG_DST, dst_plain, fwd.dst_desc(), true);
      return p;
    case ConvPass::kBackwardData: {
      const dnnl::convolution_backward_data::primitive_desc bwd(
          {algo, src_any, wei_any, dst_any, strides, dilates, pad_l, pad_r}, attr, engine, fwd);
      if (IsDnnlReference(bwd)) return nullptr;
      p->primitive = dnnl::convolution_backward_data(bwd);
      p->scratchpad = bwd.scratchpad_desc();
      p->AddArg(DNNL_ARG_DIFF_DST, dst_plain, bwd.diff_dst_desc(), false);
      p->AddArg(DNNL_ARG_WEIGHTS, wei_plain, bwd.weights_desc(), false);
      p->AddArg(DNNL_ARG_DIFF_SRC, src_plain, bwd.diff_src_desc(), true);
      return p;
    }
    case ConvPass::kBackwardWeights: {
      // The weight gradient is f32 whatever the operands (bf16 accumulates in f32 anyway): it
      // is a partial sum over a chunk of the minibatch, added to the other chunks' before the
      // one rounding (DnnlConvInChunks).
      const memory::data_type f32 = memory::data_type::f32;
      const memory::desc gw_any(wei, f32, Tag::any), gw_plain(wei, f32, Tag::oihw);
      const dnnl::convolution_backward_weights::primitive_desc bwd(
          {algo, src_any, gw_any, dst_any, strides, dilates, pad_l, pad_r}, attr, engine, fwd);
      if (IsDnnlReference(bwd)) return nullptr;
      p->primitive = dnnl::convolution_backward_weights(bwd);
      p->scratchpad = bwd.scratchpad_desc();
      p->AddArg(DNNL_ARG_SRC, src_plain, bwd.src_desc(), false);
      p->AddArg(DNNL_ARG_DIFF_DST, dst_plain, bwd.diff_dst_desc(), false);
      p->AddArg(DNNL_ARG_DIFF_WEIGHTS, gw_plain, bwd.diff_weights_desc(), true);
      return p;
    }
  }
  return nullptr;
}

// Runs one pass through oneDNN on `pointers` (MakeDnnlConv's order); false where oneDNN cannot
// (dtype other than f32/bf16, an empty dimension, no fast implementation, a failure), and then
// the caller computes the pass itself.
bool DnnlConv(ConvPass pass, DType dtype, const Window2d& g, bool with_bias,
              const std::vector<void*>& pointers) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) return false;
  if (g.n == 0 || g.c == 0 || g.o == 0 || g.oh == 0 || g.ow == 0) return false;
  static DnnlCache* cache = new DnnlCache;
  const std::shared_ptr<const DnnlPrimitive> p =
      cache->Get({static_cast<int64_t>(pass), static_cast<int64_t>(dtype), g.n, g.c, g.h, g.w, g.o,
                  g.kh, g.kw, g.oh, g.ow, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, with_bias ? 1 : 0},
                 [&] { return MakeDnnlConv(pass, dtype, g, with_bias); });
  return p != nullptr && DnnlExecute(*p, pointers);
}

// Every pass through oneDNN with the same bits at every thread count, by construction: oneDNN
// chooses how to share a primitive's work among threads from the thread count, and some of its
// kernels share a reduction (the backward-weights primitives share the minibatch and add their
// partial sums; tests/train:thread_count_test's CNN differed at 1 and 3 threads in f32 on AVX2
// and in bf16 on AVX-512 BF16), and which ones do depends on the ISA the CPU has. So no
// primitive here ever runs on more than one thread: the minibatch is cut into chunks of
// kDnnlImagesPerChunk images (the last one shorter), fixed by the shape alone, each chunk is one
// single-threaded primitive call, and the chunks are spread over the threads. A forward or
// input-gradient chunk writes its own images' outputs, which depend on its images only; the
// weight gradient of each chunk is an f32 partial sum (bf16 too), and the chunks' partial sums are
// added in chunk order (AddDepthParts, as a product's k parts are), then rounded once into
// `pointers`' gradient. `pointers` are MakeDnnlConv's for the whole minibatch. False where oneDNN
// cannot (then nothing reliable was written, and the caller computes the pass itself).
constexpr int64_t kDnnlImagesPerChunk = 16;

bool DnnlConvInChunks(ConvPass pass, DType dtype, const Window2d& g, bool with_bias,
                      const std::vector<void*>& pointers) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) return false;
  if (dtype == DType::kBF16 && !DnnlBf16ProductsPay()) return false;
  if (g.n == 0 || g.c == 0 || g.o == 0 || g.oh == 0 || g.ow == 0) return false;
  const int64_t chunks = (g.n + kDnnlImagesPerChunk - 1) / kDnnlImagesPerChunk;
  const int64_t esize = static_cast<int64_t>(ElementSize(dtype));
  // Bytes per image of the input and of the output (or their gradients).
  const int64_t x_bytes = g.c * g.h * g.w * esize, y_bytes = g.o * g.oh * g.ow * esize;
  const int64_t wsize = g.o * g.c * g.kh * g.kw;
  const bool weights = pass == ConvPass::kBackwardWeights;
  // [chunks, wsize] f32: each chunk's weight gradient.
  ScratchVector<float> parts(weights ? static_cast<size_t>(chunks * wsize) : 0);
  std::atomic<bool> ok{true};
  ParallelFor(chunks, 1, [&](int64_t begin, int64_t end) {
    const LibraryThreads single(1);
    for (int64_t i = begin; i < end && ok.load(std::memory_order_relaxed); ++i) {
      Window2d chunk = g;
      const int64_t first = i * kDnnlImagesPerChunk;
      chunk.n = std::min(kDnnlImagesPerChunk, g.n - first);
      // The chunk's images in each per-image argument; the weight and bias are whole.
      auto at = [&](void* p, int64_t bytes_per_image) {
        return static_cast<void*>(static_cast<char*>(p) + first * bytes_per_image);
      };
      std::vector<void*> args = pointers;
      switch (pass) {
        case ConvPass::kForward:
          args.front() = at(args.front(), x_bytes);
          args.back() = at(args.back(), y_bytes);
          break;
        case ConvPass::kBackwardData:
          args[0] = at(args[0], y_bytes);
          args[2] = at(args[2], x_bytes);
          break;
        case ConvPass::kBackwardWeights:
          args[0] = at(args[0], x_bytes);
          args[1] = at(args[1], y_bytes);
          args[2] = parts.data() + i * wsize;
          break;
      }
      if (!DnnlConv(pass, dtype, chunk, with_bias, args)) {
        ok.store(false, std::memory_order_relaxed);
      }
    }
  });
  if (!ok.load()) return false;
  if (!weights) return true;
  // The chunks' gradients added in order, viewed as [o, wsize / o] rows, then rounded once.
  const int64_t cols = wsize / g.o;
  if (dtype == DType::kF32) {
    AddDepthParts(chunks, g.o, cols, parts.data(), static_cast<float*>(pointers[2]), cols,
                  /*accumulate=*/false);
  } else {
    ScratchVector<float> sum(static_cast<size_t>(wsize));
    AddDepthParts(chunks, g.o, cols, parts.data(), sum.data(), cols, /*accumulate=*/false);
    StoreGemmResult(sum.data(), wsize, static_cast<BFloat16*>(pointers[2]));
  }
  return true;
}

// One step of a window's running maximum (value, tap) over its elements in row-major order, with
// PyTorch's rule: take the first strict maximum, except that every NaN is taken (so the last NaN
// of the window wins).
template <typename C>
inline void MaxTap(C v, int32_t t, C& value, int32_t& tap) {
  const bool take = (v > value) | (v != v);
  value = take ? v : value;
  tap = take ? t : tap;
}

// Planes (n, c) in parallel; within a plane, one output row at a time, tap by tap: for each
// kernel tap (i, j) in row-major order, every output of the row whose window holds that tap
// compares it with the running maximum of its window, so each window sees its elements in
// row-major order. The running maximum and its tap's offset i * W + j from the window's corner
// live in two arrays along the row, so that the loop over the row's outputs is a select between
// vectors, which GCC vectorises (a jump on the data-dependent comparison would be mispredicted
// half the time).
template <typename T>
void MaxPool2dImpl(const RawTensor& out, const RawTensor& indices, const RawTensor& x,
                   const Window2d& g) {
  using C = ComputeType<T>;
  TG_CHECK((g.kh - 1) * g.w + g.kw <= std::numeric_limits<int32_t>::max(), "max_pool2d: a window [",
           g.kh, ", ", g.kw, "] over an input ", g.w, " wide spans more than 2^31 - 1 elements");
  const int64_t planes = g.n * g.c, plane = g.h * g.w, L = g.oh * g.ow;
  const int64_t width = g.w, ow = g.ow, sw = g.sw, kw = g.kw;
  const T* xp = x.data<T>();
  T* op = out.data<T>();
  int64_t* ip = indices.data<int64_t>();
  std::vector<Range> tap_range(static_cast<size_t>(kw));
  for (int64_t j = 0; j < kw; ++j) tap_range[j] = ValidRange(j - g.pw, sw, width, ow);
  const bool window_2x2 = g.kh == 2 && g.kw == 2 && g.ph == 0 && g.pw == 0;
  ParallelFor(planes, RowsPerThread(plane), [&](int64_t p0, int64_t p1) {
    std::vector<C> value_row(static_cast<size_t>(ow));      // each window's running maximum
    std::vector<int32_t> tap_row(static_cast<size_t>(ow));  // and its tap's offset i * W + j
    C* value = value_row.data();
    int32_t* tap = tap_row.data();
    ScratchVector<C> widened;
    for (int64_t p = p0; p < p1; ++p) {
      const T* in = xp + p * plane;
      // f16/bf16 planes are widened first, in one vectorised pass (gemm.h): the comparisons
      // through a conversion per element would not vectorise.
      const C* src = GemmOperand<C>(in, plane, widened);
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        const int64_t y0 = oy * g.sh - g.ph;
        if (window_2x2 && sw == 2 && std::is_same_v<C, float>) {
          // The CNNs' pooling (f32 and the widened f16/bf16 planes) through whole vectors
          // (vec_math.h): the same rule, the same results.
          if constexpr (std::is_same_v<C, float>) {
            const float* r0 = src + y0 * width;
            MaxPool2x2RowF32(r0, r0 + width, ow, static_cast<int32_t>(width), value, tap);
          }
        } else if (window_2x2) {  // the common 2 x 2 window without padding: all four taps at once
          const C* r0 = src + y0 * width;
          const C* r1 = r0 + width;
          const int32_t below = static_cast<int32_t>(width);
          for (int64_t ox = 0; ox < ow; ++ox) {
            const int64_t x0 = ox * sw;
            C v = r0[x0];
            int32_t t = 0;
            MaxTap(r0[x0 + 1], 1, v, t);
            MaxTap(r1[x0], below, v, t);
            MaxTap(r1[x0 + 1], below + 1, v, t);
            value[ox] = v;
            tap[ox] = t;
          }
        } else {
          // Every window starts at its first element (PyTorch starts from -inf there, which
          // selects the same element); padding never takes part (the validation guarantees
          // non-empty windows).
          const int64_t y_lo = std::max<int64_t>(y0, 0), y_hi = std::min(y0 + g.kh, g.h);
          for (int64_t ox = 0; ox < ow; ++ox) {
            const int64_t x0 = ox * sw - g.pw, x_lo = std::max<int64_t>(x0, 0);
            tap[ox] = static_cast<int32_t>((y_lo - y0) * width + (x_lo - x0));
            value[ox] = src[y_lo * width + x_lo];
          }
          for (int64_t yy = y_lo; yy < y_hi; ++yy) {
            const C* row = src + yy * width;
            for (int64_t j = 0; j < kw; ++j) {
              const int64_t off = j - g.pw;
              const int32_t t = static_cast<int32_t>((yy - y0) * width + j);
              const Range r = tap_range[j];
              for (int64_t ox = r.lo; ox < r.hi; ++ox) {
                MaxTap(row[ox * sw + off], t, value[ox], tap[ox]);
              }
            }
          }
        }
        int64_t* best = ip + p * L + oy * ow;
        T* o = op + p * L + oy * ow;
        for (int64_t ox = 0; ox < ow; ++ox) {
          best[ox] = y0 * width + ox * sw - g.pw + tap[ox];
          o[ox] = in[best[ox]];  // NaN payloads included
        }
      }
    }
  });
}

// Planes in parallel: each scatters its own gradient into its own input plane, in the serial
// order, so any thread count gives the same bits. An index outside its plane throws (the first
// one in memory order), naming its position; the check rides along with the scatter, which reads
// the indices once.
template <typename T>
void MaxPool2dBackwardImpl(const RawTensor& grad_input, const RawTensor& grad_out,
                           const RawTensor& indices) {
  using C = ComputeType<T>;
  const int64_t planes = grad_input.size(0) * grad_input.size(1);
  const int64_t plane = grad_input.size(2) * grad_input.size(3);
  const int64_t L = grad_out.size(2) * grad_out.size(3);
  const T* go = grad_out.data<T>();
  const int64_t* ip = indices.data<int64_t>();
  T* gi = grad_input.data<T>();
  ParallelFor(planes, RowsPerThread(plane + L), [&](int64_t p0, int64_t p1) {
    // f16/bf16 accumulate in C (f32: overlapping windows add up) and round once; for bf16 only
    // the selected positions are rounded (and then zeroed again for the next plane), the others
    // are the zero they were filled with.
    std::vector<C> acc(std::is_same_v<T, C> ? 0 : static_cast<size_t>(plane), C(0));
    for (int64_t p = p0; p < p1; ++p) {
      T* out = gi + p * plane;
      std::fill(out, out + plane, T(0));
      C* dst;
      if constexpr (std::is_same_v<T, C>) {
        dst = out;
      } else {
        dst = acc.data();
      }
      const T* s = go + p * L;
      const int64_t* idx = ip + p * L;
      for (int64_t l = 0; l < L; ++l) {
        const int64_t k = idx[l];
        if (static_cast<uint64_t>(k) >= static_cast<uint64_t>(plane)) {
          throw Error(absl::StrCat("max_pool2d_backward: index ", k, " at position ", p * L + l,
                                   " is out of range for an input plane of ", grad_input.size(2),
                                   " x ", grad_input.size(3), " elements"));
        }
        dst[k] += static_cast<C>(Widen(s[l]));
      }
      if constexpr (std::is_same_v<T, Half>) {  // the vectorised rounding of the plane is cheaper
        RoundFromF32(acc.data(), out, plane);
        std::fill(acc.begin(), acc.end(), C(0));
      } else if constexpr (!std::is_same_v<T, C>) {
        for (int64_t l = 0; l < L; ++l) out[idx[l]] = Convert<T>(acc[idx[l]]);
        for (int64_t l = 0; l < L; ++l) acc[idx[l]] = C(0);
      }
    }
  });
}

// An f32 copy of an f16/bf16 tensor (undefined stays undefined).
RawTensor ToF32(const RawTensor& t) { return t.defined() ? t.to(kF32) : RawTensor(); }

}  // namespace

void Conv2d(const RawTensor& out, const RawTensor& x, const RawTensor& weight,
            const RawTensor& bias, const Window2d& g) {
  const DType dtype = out.dtype();
  if (DnnlConvInChunks(
          ConvPass::kForward, dtype, g, bias.defined(),
          bias.defined()
              ? std::vector<void*>{x.raw_data(), weight.raw_data(), bias.raw_data(), out.raw_data()}
              : std::vector<void*>{x.raw_data(), weight.raw_data(), out.raw_data()})) {
    return;
  }
  switch (dtype) {
    case DType::kF32:
      return Conv2dImpl<float>(out, x, weight, bias, g);
    case DType::kF64:
      return Conv2dImpl<double>(out, x, weight, bias, g);
    default: {  // f16/bf16: compute in f32 (bias included), round once
      VisitFloating("conv2d", dtype, [](auto) {});
      RawTensor out32 = RawTensor::Empty(out.shape(), kF32);
      Conv2d(out32, ToF32(x), ToF32(weight), ToF32(bias), g);
      out.copy_(out32);
    }
  }
}

void Conv2dBackward(const RawTensor& grad_input, const RawTensor& grad_weight,
                    const RawTensor& grad_bias, const RawTensor& grad_out, const RawTensor& x,
                    const RawTensor& weight, const Window2d& g) {
  const DType dtype = grad_out.dtype();
  if (grad_bias.defined()) {
    VisitFloating("conv2d_backward", dtype,
                  [&](auto tag) { BiasGrad<decltype(tag)>(grad_bias, grad_out, g); });
  }
  // Each gradient through oneDNN where it can; those left undefined here are computed below.
  RawTensor gi = grad_input, gw = grad_weight;
  if (gi.defined() && DnnlConvInChunks(ConvPass::kBackwardData, dtype, g, false,
                                       {grad_out.raw_data(), weight.raw_data(), gi.raw_data()})) {
    gi.reset();
  }
  if (gw.defined() && DnnlConvInChunks(ConvPass::kBackwardWeights, dtype, g, false,
                                       {x.raw_data(), grad_out.raw_data(), gw.raw_data()})) {
    gw.reset();
  }
  if (!gi.defined() && !gw.defined()) return;
  switch (dtype) {
    case DType::kF32:
      return Conv2dBackwardImpl<float>(gi, gw, grad_out, x, weight, g);
    case DType::kF64:
      return Conv2dBackwardImpl<double>(gi, gw, grad_out, x, weight, g);
    default: {  // f16/bf16: compute in f32 (through oneDNN where it can), round each gradient once
      VisitFloating("conv2d_backward", dtype, [](auto) {});
      const RawTensor gi32 = gi.defined() ? RawTensor::Empty(gi.shape(), kF32) : RawTensor();
      const RawTensor gw32 = gw.defined() ? RawTensor::Empty(gw.shape(), kF32) : RawTensor();
      Conv2dBackward(gi32, gw32, RawTensor(), ToF32(grad_out),
                     gw32.defined() ? ToF32(x) : RawTensor(),
                     gi32.defined() ? ToF32(weight) : RawTensor(), g);
      if (gi32.defined()) gi.copy_(gi32);
      if (gw32.defined()) gw.copy_(gw32);
    }
  }
}

void MaxPool2d(const RawTensor& out, const RawTensor& indices, const RawTensor& x,
               const Window2d& g) {
  VisitFloating("max_pool2d", x.dtype(),
                [&](auto tag) { MaxPool2dImpl<decltype(tag)>(out, indices, x, g); });
}

void MaxPool2dBackward(const RawTensor& grad_input, const RawTensor& grad_out,
                       const RawTensor& indices) {
  VisitFloating("max_pool2d_backward", grad_out.dtype(), [&](auto tag) {
    MaxPool2dBackwardImpl<decltype(tag)>(grad_input, grad_out, indices);
  });
}

}  // namespace tg::cpu
