#include "train/format_number.h"

#include <charconv>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace tg::train {

std::string FormatNumber(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // Whole numbers of up to 15 digits as integers ("100000", not "1e+05").
  if (std::floor(value) == value && std::fabs(value) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, r.ptr);
}

}  // namespace tg::train
