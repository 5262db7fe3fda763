// tg::Error: the exception every API misuse throws (shape, dtype or device mismatch, bad index,
// misuse of the engine). Its message names the op and the values involved, e.g.
//   "add: shapes [2, 3] and [4] cannot be broadcast"
//
//   TG_CHECK(a.dim() == 2, "matmul: expected a 2-D tensor, got shape ", ShapeToString(a.shape()));
#ifndef TAPEGRAD_TENSOR_ERROR_H_
#define TAPEGRAD_TENSOR_ERROR_H_

#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"

namespace tg {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace tg

// Throws tg::Error with the arguments concatenated (absl::StrCat) when `cond` is false.
#define TG_CHECK(cond, ...)                                      \
  do {                                                           \
    if (!(cond)) throw ::tg::Error(::absl::StrCat(__VA_ARGS__)); \
  } while (false)

#endif  // TAPEGRAD_TENSOR_ERROR_H_
