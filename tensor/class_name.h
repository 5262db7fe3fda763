// The unqualified name of a C++ class from its typeid name: "tg::nn::LinearImpl" -> "LinearImpl"
// (demangled, namespaces dropped). Names modules and custom functions in messages and nodes.
#ifndef TAPEGRAD_TENSOR_CLASS_NAME_H_
#define TAPEGRAD_TENSOR_CLASS_NAME_H_

#include <string>

namespace tg {

std::string UnqualifiedClassName(const char* mangled);

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_CLASS_NAME_H_
