// libtorch's containers: AnyModule, Sequential, ModuleList and ModuleDict, each a module holder
// (nn/module.h) of its XImpl, with libtorch's constructors and accessors.
//
//   tg::nn::Sequential net(tg::nn::Conv2d(tg::nn::Conv2dOptions(1, 8, 3)), tg::nn::ReLU(),
//                          tg::nn::Flatten(), tg::nn::Linear(8 * 26 * 26, 10));
//   net->push_back(tg::nn::LogSoftmax(1));
//   tg::Tensor y = net->forward(x);                  // each module in order
//   tg::nn::ModuleList blocks(tg::nn::Linear(4, 4), tg::nn::ReLU());
//   for (const auto& m : *blocks) ...;               // std::shared_ptr<tg::nn::Module>
//   tg::nn::ModuleDict heads({{"cls", tg::nn::Linear(4, 2)}, {"reg", tg::nn::Linear(4, 1)}});
//   tg::nn::LinearImpl& cls = heads->at<tg::nn::LinearImpl>("cls");
//
// Children are named "0", "1", ... (Sequential, ModuleList) or by their keys (ModuleDict), so
// parameter names are PyTorch's ("0.weight", "cls.bias"). AnyModule's forward takes and returns
// one tensor (the forward every layer has); a module whose forward takes other arguments is
// called through its own holder, not through a container.
#ifndef TAPEGRAD_NN_CONTAINER_H_
#define TAPEGRAD_NN_CONTAINER_H_

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "autograd/variable.h"
#include "nn/module.h"

namespace tg {
namespace nn {

[[noreturn]] void ThrowWrongModuleType(const std::string& container, const std::string& where,
                                       const Module& actual);

// Whether M::forward can be called with one tensor and gives a tensor.
template <typename M, typename = void>
struct HasTensorForward : std::false_type {};
template <typename M>
struct HasTensorForward<
    M, std::void_t<decltype(std::declval<M&>().forward(std::declval<const Tensor&>()))>>
    : std::is_convertible<decltype(std::declval<M&>().forward(std::declval<const Tensor&>())),
                          Tensor> {};

// A module of any type behind one interface: forward(tensor) -> tensor. A module that overrides
// Module::forward(const Tensor&) is called through Module::operator() (forward hooks, autocast
// scope), exactly as its holder calls it; one with a forward of its own signature (a user's
// `Tensor forward(Tensor x)`) through that forward.
class AnyModule {
 public:
  AnyModule() = default;
  template <typename M, typename = std::enable_if_t<std::is_base_of_v<Module, M>>>
  AnyModule(std::shared_ptr<M> module)  // NOLINT: implicit, as libtorch's
      : module_(module), forward_(MakeForward(std::move(module))) {}
  template <typename H, typename = std::enable_if_t<std::is_base_of_v<ModuleHolderTag, H>>,
            typename = void>
  AnyModule(const H& holder) : AnyModule(holder.ptr()) {}  // NOLINT

  Tensor forward(const Tensor& x) const;
  bool is_empty() const { return module_ == nullptr; }
  const std::shared_ptr<Module>& ptr() const { return module_; }
  // The module as T (libtorch's get<T>() and ptr<T>()); throws tg::Error for another type.
  template <typename T>
  std::shared_ptr<T> ptr() const {
    auto typed = std::dynamic_pointer_cast<T>(module_);
    if (typed == nullptr) ThrowWrongModuleType("AnyModule", "", *module_);
    return typed;
  }
  template <typename T>
  T& get() const {
    return *ptr<T>();
  }

 private:
  template <typename M>
  static std::function<Tensor(const Tensor&)> MakeForward(std::shared_ptr<M> m) {
    if constexpr (OverridesSingleForward<M>::value) {
      return [m](const Tensor& x) { return (*m)(x); };
    } else if constexpr (HasTensorForward<M>::value) {
      return [m](const Tensor& x) -> Tensor { return m->forward(x); };
    } else {
      return [m](const Tensor&) -> Tensor { return (*m)(Tensor()); };  // Module's own error
    }
  }

  std::shared_ptr<Module> module_;
  std::function<Tensor(const Tensor&)> forward_;
};

// Runs its modules in order, each on the previous one's output.
class SequentialImpl : public Module {
 public:
  SequentialImpl() = default;
  template <typename... Ms,
            typename = std::enable_if_t<(sizeof...(Ms) > 0) &&
                                        (std::is_constructible_v<AnyModule, Ms&&> && ...)>>
  explicit SequentialImpl(Ms&&... modules) {
    (push_back(AnyModule(std::forward<Ms>(modules))), ...);
  }
  // Named children: Sequential({{"conv", Conv2d(...)}, {"act", ReLU()}}).
  SequentialImpl(std::initializer_list<std::pair<std::string, AnyModule>> named);
  explicit SequentialImpl(const std::vector<std::shared_ptr<Module>>& modules);

  void push_back(AnyModule module);
  void push_back(std::string name, AnyModule module);
  // Appends every module of `other` (sharing them).
  void extend(const SequentialImpl& other);
  Tensor forward(const Tensor& x) override;

  size_t size() const { return modules_.size(); }
  bool is_empty() const { return modules_.empty(); }
  const std::shared_ptr<Module>& operator[](size_t i) const { return ptr(i); }
  const std::shared_ptr<Module>& ptr(size_t i) const;
  template <typename T>
  std::shared_ptr<T> ptr(size_t i) const {
    auto typed = std::dynamic_pointer_cast<T>(ptr(i));
    if (typed == nullptr) ThrowWrongModuleType("Sequential", std::to_string(i), *ptr(i));
    return typed;
  }
  template <typename T>
  T& at(size_t i) const {
    return *ptr<T>(i);
  }
  std::vector<AnyModule>::const_iterator begin() const { return modules_.begin(); }
  std::vector<AnyModule>::const_iterator end() const { return modules_.end(); }

 private:
  std::vector<AnyModule> modules_;
};
// The holder, with libtorch's extra constructor for named children.
class Sequential : public ModuleHolder<SequentialImpl> {
 public:
  using ModuleHolder<SequentialImpl>::ModuleHolder;
  using Impl = SequentialImpl;
  Sequential() : ModuleHolder(std::make_shared<SequentialImpl>()) {}
  Sequential(std::initializer_list<std::pair<std::string, AnyModule>> named)
      : ModuleHolder(std::make_shared<SequentialImpl>(named)) {}
};

// A list of modules with no forward of its own (the owner iterates).
class ModuleListImpl : public Module {
 public:
  ModuleListImpl() = default;
  template <typename... Ms, typename = std::enable_if_t<
                                (sizeof...(Ms) > 0) &&
                                (std::is_convertible_v<Ms&&, std::shared_ptr<Module>> && ...)>>
  explicit ModuleListImpl(Ms&&... modules) {
    (push_back(std::shared_ptr<Module>(std::forward<Ms>(modules))), ...);
  }
  void push_back(std::shared_ptr<Module> module);
  void extend(const ModuleListImpl& other);

  size_t size() const { return modules_.size(); }
  bool is_empty() const { return modules_.empty(); }
  const std::shared_ptr<Module>& operator[](size_t i) const { return ptr(i); }
  const std::shared_ptr<Module>& ptr(size_t i) const;
  // The i-th module as T; throws tg::Error "ModuleList: module 0 is a ReLU, not the requested
  // type" for another type.
  template <typename T>
  std::shared_ptr<T> ptr(size_t i) const {
    auto typed = std::dynamic_pointer_cast<T>(ptr(i));
    if (typed == nullptr) ThrowWrongModuleType("ModuleList", std::to_string(i), *ptr(i));
    return typed;
  }
  template <typename T>
  T& at(size_t i) const {
    return *ptr<T>(i);
  }
  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return modules_.begin(); }
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};
TG_MODULE(ModuleList);

// Modules by name, in insertion order.
class ModuleDictImpl : public Module {
 public:
  using Item = std::pair<std::string, std::shared_ptr<Module>>;
  ModuleDictImpl() = default;
  explicit ModuleDictImpl(const std::vector<Item>& modules) { update(modules); }
  ModuleDictImpl(std::initializer_list<Item> modules) { update(std::vector<Item>(modules)); }

  // Adds each (key, module); throws tg::Error for a key that is already there.
  void update(const std::vector<Item>& modules);
  std::shared_ptr<Module> insert(const std::string& key, std::shared_ptr<Module> module);

  size_t size() const { return items_.size(); }
  bool is_empty() const { return items_.empty(); }
  bool contains(const std::string& key) const;
  std::vector<std::string> keys() const;
  std::vector<std::shared_ptr<Module>> values() const;
  const std::vector<Item>& items() const { return items_; }
  // Throws tg::Error "ModuleDict: no module 'x' (keys: a, b)" for a missing key.
  const std::shared_ptr<Module>& operator[](const std::string& key) const;
  template <typename T>
  std::shared_ptr<T> ptr(const std::string& key) const {
    auto typed = std::dynamic_pointer_cast<T>((*this)[key]);
    if (typed == nullptr) ThrowWrongModuleType("ModuleDict", "'" + key + "'", *(*this)[key]);
    return typed;
  }
  template <typename T>
  T& at(const std::string& key) const {
    return *ptr<T>(key);
  }
  std::vector<Item>::const_iterator begin() const { return items_.begin(); }
  std::vector<Item>::const_iterator end() const { return items_.end(); }

 private:
  std::vector<Item> items_;
};
class ModuleDict : public ModuleHolder<ModuleDictImpl> {
 public:
  using ModuleHolder<ModuleDictImpl>::ModuleHolder;
  using Impl = ModuleDictImpl;
  ModuleDict() : ModuleHolder(std::make_shared<ModuleDictImpl>()) {}
  ModuleDict(std::initializer_list<ModuleDictImpl::Item> items)
      : ModuleHolder(std::make_shared<ModuleDictImpl>(items)) {}
};

}  // namespace nn
}  // namespace tg

#endif  // TAPEGRAD_NN_CONTAINER_H_
