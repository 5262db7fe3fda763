// tapegrad's public C++ API, in one header: libtorch's C++ frontend spelled tg:: (at:: and
// torch:: alike). A libtorch program ports by including this header instead of <torch/torch.h>
// and writing tg:: for torch:: and at::; its cc_binary depends on //:tapegrad.
//
//   #include "tapegrad.h"
//   tg::Tensor x = tg::ones({2, 2}, tg::requires_grad());
//   tg::Tensor y = (x + 2).pow(2).mean();
//   y.backward();
//   std::cout << x.grad() << "\n";      // 1.5 1.5 / 1.5 1.5 [ CPUFloatType{2,2} ]
//
// What is here (docs/api.md lists it, with what is not there yet): tg::Tensor, the one
// user-facing handle (autograd/variable.h), with libtorch's methods and operators; factories
// and tg::TensorOptions (autograd/factories.h); free functions (autograd/torch_functions.h);
// NoGradGuard; custom functions (autograd/function.h); indexing (autograd/indexing.h); nn
// modules, containers, losses and init; tg::save/tg::load (nn/serialize.h); optimizers (and
// torch.optim.Muon, optim/muon.h) and libtorch's schedulers; mixed precision (amp/, with
// PyTorch's GradScaler).
#ifndef TAPEGRAD_TAPEGRAD_H_
#define TAPEGRAD_TAPEGRAD_H_

#include "amp/grad_scaler.h"
#include "amp/mixed_precision_optimizer.h"
#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/factories.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/indexing.h"
#include "autograd/mutation_on_saved.h"
#include "autograd/ops.h"
#include "autograd/save_on_cpu.h"
#include "autograd/torch_autograd.h"
#include "autograd/torch_functions.h"
#include "autograd/variable.h"
#include "dataset/torch_data.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/functional.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "nn/norm.h"
#include "nn/serialize.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/lr_schedule.h"
#include "optim/lr_scheduler.h"
#include "optim/muon.h"
#include "optim/sgd.h"
#include "tensor/print.h"

// libtorch's AT_ASSERT / TORCH_CHECK spelled TG_: throws tg::Error "Assertion failed: <cond>"
// (TG_CHECK, tensor/error.h, takes a message).
#define TG_ASSERT(cond) TG_CHECK(cond, "Assertion failed: ", #cond)

#endif  // TAPEGRAD_TAPEGRAD_H_
