#include "nn/serialize.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "tensor/error.h"
#include "tensor/io/safetensors.h"

namespace tg {
namespace {

constexpr char kKindKey[] = "tapegrad.kind";

StateDict OnCpu(StateDict sd) {
  for (auto& [key, t] : sd.tensors) t = t.to(Device::Cpu());
  return sd;
}

void Save(const StateDict& sd, const std::string& kind, const std::string& path) {
  const absl::Status status = io::SaveStateDict(path, OnCpu(sd), {{kKindKey, kind}});
  if (!status.ok())
    throw Error(absl::StrCat("tg::save(", kind, ", \"", path, "\"): ", status.ToString()));
}

// The file's state dict, checked to be of `kind` (a prefix: "module:" takes any module type).
StateDict Load(const std::string& path, const std::string& kind, const std::string& what) {
  std::map<std::string, std::string> metadata;
  absl::StatusOr<StateDict> sd = io::LoadStateDict(path, &metadata);
  if (!sd.ok())
    throw Error(absl::StrCat("tg::load(", what, ", \"", path, "\"): ", sd.status().ToString()));
  const auto it = metadata.find(kKindKey);
  const std::string found = it == metadata.end() ? "" : it->second;
  TG_CHECK(found.compare(0, kind.size(), kind) == 0, "tg::load(", what, ", \"", path,
           "\"): the file holds ", found.empty() ? "no tg::save result" : found, ", not ",
           kind.back() == ':' ? kind + "..." : kind);
  return *std::move(sd);
}

// "optimizer:Adam" for an optimizer whose options are AdamOptions.
std::string OptimizerKind(const optim::Optimizer& optimizer) {
  std::string name = optimizer.defaults().type_name();
  const std::string suffix = "Options";
  if (name.size() > suffix.size() &&
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    name.resize(name.size() - suffix.size());
  }
  return "optimizer:" + name;
}

}  // namespace

void save(const nn::Module& module, const std::string& path) {
  Save(module.state_dict(), "module:" + module.type_name(), path);
}

void save(const optim::Optimizer& optimizer, const std::string& path) {
  Save(optimizer.state_dict(), OptimizerKind(optimizer), path);
}

void save(const Tensor& tensor, const std::string& path) {
  TG_CHECK(tensor.defined(), "tg::save(tensor, \"", path, "\"): the tensor is undefined");
  StateDict sd;
  sd.tensors["tensor"] = tensor.data();
  Save(sd, "tensor", path);
}

void save(const std::vector<Tensor>& tensors, const std::string& path) {
  StateDict sd;
  for (size_t i = 0; i < tensors.size(); ++i) {
    TG_CHECK(tensors[i].defined(), "tg::save(tensors, \"", path, "\"): tensor ", i,
             " is undefined");
    sd.tensors[std::to_string(i)] = tensors[i].data();
  }
  sd.scalars["size"] = static_cast<double>(tensors.size());
  Save(sd, "tensors", path);
}

void load(nn::Module& module, const std::string& path) {
  module.load_state_dict(Load(path, "module:", module.type_name()), /*strict=*/true);
}

void load(optim::Optimizer& optimizer, const std::string& path) {
  optimizer.load_state_dict(Load(path, OptimizerKind(optimizer), "optimizer"));
}

void load(Tensor& tensor, const std::string& path) {
  const StateDict sd = Load(path, "tensor", "tensor");
  const RawTensor& loaded = sd.tensor("tensor");
  tensor = Tensor(tensor.defined() ? loaded.to(tensor.device()) : loaded);
}

void load(std::vector<Tensor>& tensors, const std::string& path) {
  const StateDict sd = Load(path, "tensors", "tensors");
  const double size = sd.scalar("size");
  TG_CHECK(size >= 0 && static_cast<double>(static_cast<size_t>(size)) == size &&
               static_cast<size_t>(size) == sd.tensors.size(),
           "tg::load(tensors, \"", path, "\"): the file's size entry ", size, " does not match ",
           "its ", sd.tensors.size(), " tensors");
  std::vector<Tensor> out;
  for (size_t i = 0; i < static_cast<size_t>(size); ++i) {
    out.emplace_back(sd.tensor(std::to_string(i)));
  }
  tensors = std::move(out);
}

}  // namespace tg
