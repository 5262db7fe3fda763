// tg::OrderedDict: libtorch's torch::OrderedDict, the type Module::named_parameters(),
// named_buffers(), named_children() and named_modules() return: items in insertion order, each
// with key() and value() (libtorch's) and first / second (a std::pair, so structured bindings and
// code written for a vector of pairs keep working), looked up by position or by key.
//
//   for (const auto& p : net->named_parameters()) std::cout << p.key() << "\n";
//   tg::Tensor w = net->named_parameters()["fc1.weight"];
//   for (const auto& [name, t] : net->named_buffers()) ...;
#ifndef TAPEGRAD_NN_ORDERED_DICT_H_
#define TAPEGRAD_NN_ORDERED_DICT_H_

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "tensor/error.h"

namespace tg {

template <typename Key, typename Value>
class OrderedDict {
 public:
  class Item : public std::pair<Key, Value> {
   public:
    using std::pair<Key, Value>::pair;
    const Key& key() const { return this->first; }
    Value& value() { return this->second; }
    const Value& value() const { return this->second; }
    const std::pair<Key, Value>& pair() const { return *this; }
  };

  OrderedDict() = default;
  explicit OrderedDict(std::vector<std::pair<Key, Value>> items) {
    items_.reserve(items.size());
    for (auto& [key, value] : items) items_.emplace_back(std::move(key), std::move(value));
  }
  // Code written for the vector of pairs these functions used to return.
  operator std::vector<std::pair<Key, Value>>() const {  // NOLINT: implicit
    return std::vector<std::pair<Key, Value>>(items_.begin(), items_.end());
  }

  size_t size() const { return items_.size(); }
  bool is_empty() const { return items_.empty(); }
  bool empty() const { return items_.empty(); }
  typename std::vector<Item>::iterator begin() { return items_.begin(); }
  typename std::vector<Item>::iterator end() { return items_.end(); }
  typename std::vector<Item>::const_iterator begin() const { return items_.begin(); }
  typename std::vector<Item>::const_iterator end() const { return items_.end(); }
  const std::vector<Item>& items() const { return items_; }
  Item& operator[](size_t index) { return At(index); }
  const Item& operator[](size_t index) const { return const_cast<OrderedDict*>(this)->At(index); }
  Item& front() { return At(0); }
  Item& back() { return At(items_.size() - 1); }

  // The value under `key`; throws tg::Error "OrderedDict: key 'x' not found" if there is none.
  Value& operator[](const Key& key) {
    Value* v = find(key);
    TG_CHECK(v != nullptr, "OrderedDict: key '", key, "' not found");
    return *v;
  }
  const Value& operator[](const Key& key) const { return (*const_cast<OrderedDict*>(this))[key]; }
  // The value under `key`, or nullptr.
  Value* find(const Key& key) {
    for (Item& item : items_) {
      if (item.first == key) return &item.second;
    }
    return nullptr;
  }
  bool contains(const Key& key) const {
    return const_cast<OrderedDict*>(this)->find(key) != nullptr;
  }
  std::vector<Key> keys() const {
    std::vector<Key> out;
    for (const Item& item : items_) out.push_back(item.first);
    return out;
  }
  std::vector<Value> values() const {
    std::vector<Value> out;
    for (const Item& item : items_) out.push_back(item.second);
    return out;
  }

 private:
  Item& At(size_t index) {
    TG_CHECK(index < items_.size(), "OrderedDict: index ", index, " out of range (size ",
             items_.size(), ")");
    return items_[index];
  }
  std::vector<Item> items_;
};

}  // namespace tg

#endif  // TAPEGRAD_NN_ORDERED_DICT_H_
