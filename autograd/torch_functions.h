// libtorch's free functions on tensors (torch::relu(x), torch::matmul(a, b), torch::cat({a, b},
// 1), ...), each the method of tg::Tensor or the recorded op of autograd/ops.h that computes it:
// a free function records history exactly when the method does. Reached through tapegrad.h.
//
//   tg::Tensor y = tg::relu(tg::matmul(x, w));
//   tg::Tensor p = tg::softmax(y, /*dim=*/1);
#ifndef TAPEGRAD_AUTOGRAD_TORCH_FUNCTIONS_H_
#define TAPEGRAD_AUTOGRAD_TORCH_FUNCTIONS_H_

#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/ops.h"
#include "autograd/variable.h"

namespace tg {

inline Tensor relu(const Tensor& x) { return x.relu(); }
inline Tensor sigmoid(const Tensor& x) { return x.sigmoid(); }
inline Tensor tanh(const Tensor& x) { return x.tanh(); }
inline Tensor exp(const Tensor& x) { return x.exp(); }
inline Tensor log(const Tensor& x) { return x.log(); }
inline Tensor sqrt(const Tensor& x) { return x.sqrt(); }
inline Tensor abs(const Tensor& x) { return x.abs(); }
inline Tensor neg(const Tensor& x) { return x.neg(); }
inline Tensor pow(const Tensor& x, double exponent) { return x.pow(exponent); }
inline Tensor pow(const Tensor& x, const Tensor& exponent) { return x.pow(exponent); }
inline Tensor matmul(const Tensor& a, const Tensor& b) { return a.matmul(b); }
inline Tensor mm(const Tensor& a, const Tensor& b) { return a.mm(b); }
inline Tensor bmm(const Tensor& a, const Tensor& b) { return Bmm(a, b); }
inline Tensor add(const Tensor& a, const Tensor& b, double alpha = 1) { return a.add(b, alpha); }
inline Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1) { return a.sub(b, alpha); }
inline Tensor mul(const Tensor& a, const Tensor& b) { return a.mul(b); }
inline Tensor div(const Tensor& a, const Tensor& b) { return a.div(b); }
inline Tensor softmax(const Tensor& x, int64_t dim) { return x.softmax(dim); }
inline Tensor log_softmax(const Tensor& x, int64_t dim) { return x.log_softmax(dim); }
inline Tensor sum(const Tensor& x) { return x.sum(); }
inline Tensor sum(const Tensor& x, IntArrayRef dims, bool keepdim = false) {
  return x.sum(dims, keepdim);
}
inline Tensor mean(const Tensor& x) { return x.mean(); }
inline Tensor mean(const Tensor& x, IntArrayRef dims, bool keepdim = false) {
  return x.mean(dims, keepdim);
}
inline Tensor max(const Tensor& x) { return x.max(); }
inline std::tuple<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false) {
  return x.max(dim, keepdim);
}
inline Tensor min(const Tensor& x) { return x.min(); }
inline std::tuple<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false) {
  return x.min(dim, keepdim);
}
inline Tensor argmax(const Tensor& x) { return x.argmax(); }
inline Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false) {
  return x.argmax(dim, keepdim);
}
inline Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false) {
  return x.argmin(dim, keepdim);
}
inline Tensor clamp(const Tensor& x, std::optional<double> min,
                    std::optional<double> max = std::nullopt) {
  return x.clamp(min, max);
}
inline Tensor norm(const Tensor& x) { return x.norm(); }
inline Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1) {
  return x.flatten(start_dim, end_dim);
}
inline Tensor reshape(const Tensor& x, IntArrayRef shape) { return x.reshape(shape); }
inline Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  return x.transpose(dim0, dim1);
}
inline Tensor t(const Tensor& x) { return x.t(); }
inline Tensor unsqueeze(const Tensor& x, int64_t dim) { return x.unsqueeze(dim); }
inline Tensor squeeze(const Tensor& x) { return x.squeeze(); }
inline Tensor squeeze(const Tensor& x, int64_t dim) { return x.squeeze(dim); }
// cond ? a : b elementwise (cond bool, broadcast); the gradient flows to a and b where chosen.
inline Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  return Where(cond.data(), a, b);
}
// The index tensors of these take no gradient (integer tensors), as in libtorch; each is the
// recorded op of autograd/ops.h, which takes the index's data.
// torch::gather: out[i][j] = x[i][index[i][j]] along dim (index i64/i32 of x's rank).
inline Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  return Gather(x, dim, index.data());
}
// torch::index_select: the entries of x along dim at the 1-D index's positions.
inline Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  const int64_t d = WrapDim("index_select", dim, x.dim());
  if (d == 0) return IndexSelect(x, index.data());
  return Transpose(IndexSelect(Transpose(x, 0, d), index.data()), 0, d);
}
// torch::embedding(weight, indices): rows of weight [num, dim] -> [indices..., dim].
inline Tensor embedding(const Tensor& weight, const Tensor& indices) {
  return Embedding(weight, indices.data());
}
inline Tensor cat(const std::vector<Tensor>& xs, int64_t dim = 0) {
  return Cat(VariableList(xs.begin(), xs.end()), dim);
}
inline Tensor stack(const std::vector<Tensor>& xs, int64_t dim = 0) {
  return Stack(VariableList(xs.begin(), xs.end()), dim);
}
// torch::equal: the same sizes and the same values (NaN equals nothing), compared in f64.
inline bool equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  return a.data().to_vector<double>() == b.data().to_vector<double>();
}
// Whether |a - b| <= atol + rtol |b| everywhere (a and b broadcast), compared in f64 without
// history; NaN is never close, equal infinities are.
inline bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8) {
  const Shape shape = BroadcastShapes("allclose", a.shape(), b.shape());
  const std::vector<double> x = a.data().expand(shape).to_vector<double>();
  const std::vector<double> y = b.data().expand(shape).to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i]) continue;
    if (!(std::fabs(x[i] - y[i]) <= atol + rtol * std::fabs(y[i]))) return false;
  }
  return true;
}

// c10::str: its arguments streamed into one string (tg::str("sample-", 3, ".pt")).
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_TORCH_FUNCTIONS_H_
