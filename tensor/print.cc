#include "tensor/print.h"

#include <cmath>
#include <iomanip>
#include <ios>
#include <tuple>
#include <vector>

namespace tg {
namespace {

// Restores the stream's flags, precision and fill when the printing is done.
class FormatSaver {
 public:
  explicit FormatSaver(std::ostream& out) : out_(out), saved_(nullptr) { saved_.copyfmt(out); }
  ~FormatSaver() { out_.copyfmt(saved_); }

 private:
  std::ostream& out_;
  std::ios saved_;
};

std::ostream& DefaultFloat(std::ostream& out) {
  out.unsetf(std::ios_base::floatfield);
  return out;
}

// The number of decimal digits before the point of |v| (1 for 0 and below 1 as libtorch counts:
// floor(log10 |v|) + 1).
double DigitsOf(double v) { return v != 0 ? std::floor(std::log10(v)) + 1 : 1; }

// libtorch's choice of format for a set of values: sets the stream's notation and precision
// and returns {scale, field width}. Its rules, kept exactly (the largest value is tracked by
// its signed value, as ATen does).
std::tuple<double, int64_t> ChooseFormat(std::ostream& out, const std::vector<double>& v) {
  if (v.empty()) return {1.0, 0};
  bool integers = true;
  for (double z : v) {
    if (std::isfinite(z) && z != std::ceil(z)) {
      integers = false;
      break;
    }
  }
  size_t first = 0;
  while (first < v.size() && !std::isfinite(v[first])) ++first;
  double exp_min = 1, exp_max = 1;
  if (first < v.size()) {
    double lo = std::fabs(v[first]), hi = std::fabs(v[first]);
    for (size_t i = first; i < v.size(); ++i) {
      const double z = std::fabs(v[i]);
      if (!std::isfinite(z)) continue;
      if (z < lo) lo = z;
      if (v[i] > hi) hi = z;
    }
    exp_min = DigitsOf(lo);
    exp_max = DigitsOf(hi);
  }
  double scale = 1;
  int64_t width;
  if (integers) {
    if (exp_max > 9) {
      width = 11;
      out << std::scientific << std::setprecision(4);
    } else {
      width = static_cast<int64_t>(exp_max) + 1;
      DefaultFloat(out);
    }
  } else if (exp_max - exp_min > 4) {
    width = 11;
    if (std::fabs(exp_max) > 99 || std::fabs(exp_min) > 99) ++width;
    out << std::scientific << std::setprecision(4);
  } else if (exp_max > 5 || exp_max < 0) {
    width = 7;
    scale = std::pow(10, exp_max - 1);
    out << std::fixed << std::setprecision(4);
  } else {
    width = exp_max == 0 ? 7 : static_cast<int64_t>(exp_max) + 6;
    out << std::fixed << std::setprecision(4);
  }
  return {scale, width};
}

void Indent(std::ostream& out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out << ' ';
}

void PrintScale(std::ostream& out, double scale) {
  FormatSaver saver(out);
  DefaultFloat(out) << scale << " *" << std::endl;
}

// A [rows, cols] matrix of `v` (row-major), split into column groups that fit `linesize`.
void PrintMatrix(std::ostream& out, const std::vector<double>& v, int64_t rows, int64_t cols,
                 int64_t linesize, int64_t indent) {
  const auto [scale, width] = ChooseFormat(out, v);
  // (No indent before the first row: libtorch 2.15 prints none there, only before the others.)
  const int64_t per_line = (linesize - indent) / (width + 1);
  int64_t first = 0;
  while (first < cols) {
    const int64_t last = first + per_line <= cols ? first + per_line - 1 : cols - 1;
    if (per_line < cols) {
      if (first != 0) out << std::endl;
      out << "Columns " << first + 1 << " to " << last + 1;
      Indent(out, indent);
    }
    if (scale != 1) {
      PrintScale(out, scale);
      Indent(out, indent);
    }
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = first; c <= last; ++c) {
        out << std::setw(static_cast<int>(width)) << v[r * cols + c] / scale;
        if (c == last) {
          out << std::endl;
          if (r != rows - 1) {
            Indent(out, indent);
            if (scale != 1) out << ' ';
          }
        } else {
          out << ' ';
        }
      }
    }
    first = last + 1;
  }
}

}  // namespace

std::string LibtorchTypeString(DType dtype, Device device) {
  const char* name = "Float";
  switch (dtype) {
    case DType::kF32:
      name = "Float";
      break;
    case DType::kF64:
      name = "Double";
      break;
    case DType::kF16:
      name = "Half";
      break;
    case DType::kBF16:
      name = "BFloat16";
      break;
    case DType::kI32:
      name = "Int";
      break;
    case DType::kI64:
      name = "Long";
      break;
    case DType::kU8:
      name = "Byte";
      break;
    case DType::kBool:
      name = "Bool";
      break;
    case DType::kF8E4M3:
      name = "Float8_e4m3fn";
      break;
    case DType::kF8E5M2:
      name = "Float8_e5m2";
      break;
  }
  return std::string(DeviceTypeDisplayName(device.type)) + name + "Type";
}

std::ostream& PrintLikeLibtorch(std::ostream& out, const RawTensor& t, int64_t linesize) {
  FormatSaver saver(out);
  if (!t.defined()) return out << "[ Tensor (undefined) ]";
  const std::vector<double> v = t.to_vector<double>();
  const std::string type = LibtorchTypeString(t.dtype(), t.device());
  const int64_t dims = t.dim();
  if (dims == 0) {
    DefaultFloat(out) << v[0] << std::endl;
    out << "[ " << type << "{}";
  } else if (dims == 1) {
    if (!v.empty()) {
      const auto [scale, width] = ChooseFormat(out, v);
      if (scale != 1) PrintScale(out, scale);
      for (double z : v) out << std::setw(static_cast<int>(width)) << z / scale << std::endl;
    }
    out << "[ " << type << "{" << t.size(0) << "}";
  } else if (dims == 2) {
    if (!v.empty()) PrintMatrix(out, v, t.size(0), t.size(1), linesize, 0);
    out << "[ " << type << "{" << t.size(0) << "," << t.size(1) << "}";
  } else {
    if (!v.empty()) {
      // One matrix per index of the leading dims, the first of them varying fastest (ATen's
      // counter), each headed "(i,j,.,.) = ".
      const int64_t rows = t.size(dims - 2), cols = t.size(dims - 1);
      std::vector<int64_t> counter(static_cast<size_t>(dims - 2), 0);
      int64_t matrices = 1;
      for (int64_t d = 0; d < dims - 2; ++d) matrices *= t.size(d);
      for (int64_t m = 0; m < matrices; ++m) {
        if (m > 0) out << std::endl;
        out << "(";
        int64_t offset = 0;
        for (int64_t d = 0; d < dims - 2; ++d) {
          out << counter[d] + 1 << ",";
          int64_t stride = rows * cols;
          for (int64_t e = d + 1; e < dims - 2; ++e) stride *= t.size(e);
          offset += counter[d] * stride;
        }
        out << ".,.) = " << std::endl;
        const std::vector<double> matrix(v.begin() + offset, v.begin() + offset + rows * cols);
        PrintMatrix(out, matrix, rows, cols, linesize, 1);
        for (int64_t d = 0; d < dims - 2; ++d) {
          if (++counter[d] < t.size(d)) break;
          counter[d] = 0;
        }
      }
    }
    out << "[ " << type << "{" << t.size(0);
    for (int64_t d = 1; d < dims; ++d) out << "," << t.size(d);
    out << "}";
  }
  return out << " ]";
}

}  // namespace tg
