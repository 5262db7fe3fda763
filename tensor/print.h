// Printing a tensor the way libtorch's `std::cout << tensor` does (ATen's Formatting): the
// values as one column (1-d), a matrix (2-d) or a matrix per leading index "(i,j,.,.) = ", in a
// format chosen from all the values (integers, fixed with 4 decimals and a common scale factor,
// or scientific), then "[ CPUFloatType{2,3} ]".
//
//   tg::PrintLikeLibtorch(std::cout, t);   // " 1  2\n 3  4\n[ CPULongType{2,2} ]"
#ifndef TAPEGRAD_TENSOR_PRINT_H_
#define TAPEGRAD_TENSOR_PRINT_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "tensor/tensor.h"

namespace tg {

// libtorch's type string: "CPUFloatType", "CUDABFloat16Type", "CPULongType", ...
std::string LibtorchTypeString(DType dtype, Device device);

// Writes `t` as libtorch prints it, lines at most `linesize` characters wide (80 by default);
// an undefined tensor prints "[ Tensor (undefined) ]". Copies the values to the host as f64.
std::ostream& PrintLikeLibtorch(std::ostream& out, const RawTensor& t, int64_t linesize = 80);

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_PRINT_H_
