#include "nn/container.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/error.h"

namespace tg {
namespace nn {

void ThrowWrongModuleType(const std::string& container, const std::string& where,
                          const Module& actual) {
  throw Error(absl::StrCat(container, ": module ", where, where.empty() ? "" : " ", "is a ",
                           actual.type_name(), ", not the requested type"));
}

Tensor AnyModule::forward(const Tensor& x) const {
  TG_CHECK(module_ != nullptr, "AnyModule: forward() on an empty AnyModule");
  return forward_(x);
}

// ---- Sequential ------------------------------------------------------------------------------

SequentialImpl::SequentialImpl(std::initializer_list<std::pair<std::string, AnyModule>> named) {
  for (const auto& [name, module] : named) push_back(name, module);
}

SequentialImpl::SequentialImpl(const std::vector<std::shared_ptr<Module>>& modules) {
  for (const auto& m : modules) push_back(AnyModule(m));
}

void SequentialImpl::push_back(AnyModule module) {
  push_back(std::to_string(modules_.size()), std::move(module));
}

void SequentialImpl::push_back(std::string name, AnyModule module) {
  TG_CHECK(!module.is_empty(), "Sequential: push_back of an empty module (", name, ")");
  register_module(name, module.ptr());
  modules_.push_back(std::move(module));
}

void SequentialImpl::extend(const SequentialImpl& other) {
  for (const AnyModule& m : other.modules_) push_back(m);
}

Tensor SequentialImpl::forward(const Tensor& x) {
  Tensor h = x;
  for (const AnyModule& m : modules_) h = m.forward(h);
  return h;
}

const std::shared_ptr<Module>& SequentialImpl::ptr(size_t i) const {
  TG_CHECK(i < modules_.size(), "Sequential: index ", i, " out of range (size ", modules_.size(),
           ")");
  return modules_[i].ptr();
}

// ---- ModuleList ------------------------------------------------------------------------------

void ModuleListImpl::push_back(std::shared_ptr<Module> module) {
  TG_CHECK(module != nullptr, "ModuleList: push_back of an empty module");
  modules_.push_back(register_module(std::to_string(modules_.size()), std::move(module)));
}

void ModuleListImpl::extend(const ModuleListImpl& other) {
  for (const auto& m : other.modules_) push_back(m);
}

const std::shared_ptr<Module>& ModuleListImpl::ptr(size_t i) const {
  TG_CHECK(i < modules_.size(), "ModuleList: index ", i, " out of range (size ", modules_.size(),
           ")");
  return modules_[i];
}

// ---- ModuleDict ------------------------------------------------------------------------------

void ModuleDictImpl::update(const std::vector<Item>& modules) {
  for (const auto& [key, module] : modules) insert(key, module);
}

std::shared_ptr<Module> ModuleDictImpl::insert(const std::string& key,
                                               std::shared_ptr<Module> module) {
  TG_CHECK(module != nullptr, "ModuleDict: insert of an empty module under '", key, "'");
  TG_CHECK(!contains(key), "ModuleDict: key '", key, "' is already there");
  items_.emplace_back(key, register_module(key, std::move(module)));
  return items_.back().second;
}

bool ModuleDictImpl::contains(const std::string& key) const {
  for (const auto& item : items_) {
    if (item.first == key) return true;
  }
  return false;
}

std::vector<std::string> ModuleDictImpl::keys() const {
  std::vector<std::string> out;
  for (const auto& item : items_) out.push_back(item.first);
  return out;
}

std::vector<std::shared_ptr<Module>> ModuleDictImpl::values() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& item : items_) out.push_back(item.second);
  return out;
}

const std::shared_ptr<Module>& ModuleDictImpl::operator[](const std::string& key) const {
  for (const auto& item : items_) {
    if (item.first == key) return item.second;
  }
  throw Error(
      absl::StrCat("ModuleDict: no module '", key, "' (keys: ", absl::StrJoin(keys(), ", "), ")"));
}

}  // namespace nn
}  // namespace tg
