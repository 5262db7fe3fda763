// tg::save / tg::load: libtorch's torch::save and torch::load of modules, optimizers and
// tensors, to safetensors files (tensor/io/safetensors.h: written to a temporary file, then
// renamed; checksummed; every read checked).
//
//   tg::save(net, "net.safetensors");            // a holder, a Module or a shared_ptr to one
//   tg::save(optimizer, "opt.safetensors");
//   tg::save(samples, "samples.safetensors");    // a Tensor, or a std::vector<Tensor>
//   tg::load(net, "net.safetensors");            // into the existing parameters and buffers
//
// A module's file holds its state_dict() under PyTorch's dotted names ("conv1.weight",
// "bn.running_mean"), so Python's safetensors.torch.load_file gives a dict that
// model.load_state_dict takes; an optimizer's holds its state_dict(); a tensor's holds it under
// "tensor" (a vector's under "0", "1", ...). The file records which of these it is
// ("tapegrad.kind": "module:Net", "optimizer:Adam", "tensor", "tensors"), and load() refuses a
// file of another kind. Loading a module is strict (libtorch's too): a missing or unexpected key
// or a shape mismatch throws, naming them, before anything changes.
//
// As libtorch's, both throw on failure (tg::Error with the file and the I/O or format error);
// tensors are saved from any device and loaded to the device of what they load into.
#ifndef TAPEGRAD_NN_SERIALIZE_H_
#define TAPEGRAD_NN_SERIALIZE_H_

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "autograd/variable.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace tg {

void save(const nn::Module& module, const std::string& path);
void save(const optim::Optimizer& optimizer, const std::string& path);
void save(const Tensor& tensor, const std::string& path);
void save(const std::vector<Tensor>& tensors, const std::string& path);
template <typename M, typename = std::enable_if_t<std::is_base_of_v<nn::Module, M>>>
void save(const std::shared_ptr<M>& module, const std::string& path) {
  save(static_cast<const nn::Module&>(*module), path);
}
template <typename H, typename = std::enable_if_t<std::is_base_of_v<nn::ModuleHolderTag, H>>,
          typename = void>
void save(const H& holder, const std::string& path) {
  save(static_cast<const nn::Module&>(*holder), path);
}

void load(nn::Module& module, const std::string& path);
void load(optim::Optimizer& optimizer, const std::string& path);
// Replaces `tensor` with the file's (on the CPU, or on `tensor`'s device when it is defined).
void load(Tensor& tensor, const std::string& path);
void load(std::vector<Tensor>& tensors, const std::string& path);
template <typename M, typename = std::enable_if_t<std::is_base_of_v<nn::Module, M>>>
void load(const std::shared_ptr<M>& module, const std::string& path) {
  load(static_cast<nn::Module&>(*module), path);
}
template <typename H, typename = std::enable_if_t<std::is_base_of_v<nn::ModuleHolderTag, H>>,
          typename = void>
void load(const H& holder, const std::string& path) {
  load(static_cast<nn::Module&>(*holder), path);
}

}  // namespace tg

#endif  // TAPEGRAD_NN_SERIALIZE_H_
