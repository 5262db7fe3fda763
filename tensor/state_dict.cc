#include "tensor/state_dict.h"

#include "tensor/error.h"

namespace tg {
namespace {

template <typename Map>
const typename Map::mapped_type& Lookup(const Map& map, const std::string& key, const char* kind) {
  auto it = map.find(key);
  TG_CHECK(it != map.end(), "StateDict: missing ", kind, " '", key, "'");
  return it->second;
}

template <typename Map>
void MergeInto(Map& into, const std::string& prefix, const Map& from, const char* kind) {
  for (const auto& [key, value] : from) {
    TG_CHECK(into.emplace(prefix + key, value).second, "StateDict::Merge: duplicate ", kind, " '",
             prefix + key, "'");
  }
}

template <typename Map>
void SubInto(Map& into, const std::string& prefix, const Map& from) {
  for (auto it = from.lower_bound(prefix); it != from.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    into.emplace(it->first.substr(prefix.size()), it->second);
  }
}

}  // namespace

const RawTensor& StateDict::tensor(const std::string& key) const {
  return Lookup(tensors, key, "tensor");
}

double StateDict::scalar(const std::string& key) const { return Lookup(scalars, key, "scalar"); }

void StateDict::Merge(const std::string& prefix, const StateDict& other) {
  MergeInto(tensors, prefix, other.tensors, "tensor");
  MergeInto(scalars, prefix, other.scalars, "scalar");
}

StateDict StateDict::Sub(const std::string& prefix) const {
  StateDict out;
  SubInto(out.tensors, prefix, tensors);
  SubInto(out.scalars, prefix, scalars);
  return out;
}

}  // namespace tg
