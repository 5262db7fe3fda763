// The one difference between a port and its libtorch original: which library it includes. The
// ports under tests/api/ports are libtorch programs with torch:: and at:: written tg:: (and
// libtorch's TORCH_/AT_ macro prefixes written TG_); with -DPORT_LIBTORCH this header maps tg::
// back to libtorch, so the same source builds against both (tests/api/BUILD says how).
#ifndef TAPEGRAD_TESTS_API_PORTS_PORT_PRELUDE_H_
#define TAPEGRAD_TESTS_API_PORTS_PORT_PRELUDE_H_

#ifdef PORT_LIBTORCH
#include <torch/torch.h>
namespace tg = torch;
#define TG_MODULE TORCH_MODULE
#define TG_ASSERT AT_ASSERT
#else
#include "tapegrad.h"
#endif

#endif  // TAPEGRAD_TESTS_API_PORTS_PORT_PRELUDE_H_
