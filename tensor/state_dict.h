// StateDict: the serialisable state of an optimizer, a loss scaler or a model: named tensors and
// named scalars. Keys are dotted paths ("state.3.exp_avg", "scaler.scale"); a component that
// holds others stores their state under a prefix (Merge / Sub). Scalars are doubles: exact for
// every int64 counter below 2^53 and for every f32/f64 hyper-parameter, so a round trip through
// a StateDict is bit-exact. (The checkpoint writer of the nn issue stores tensors as safetensors
// and scalars in its __metadata__.)
//
//   tg::StateDict sd;
//   sd.scalars["step"] = 10;
//   sd.tensors["state.0.exp_avg"] = m;
//   double step = sd.scalar("step");          // throws tg::Error naming a missing key
#ifndef TAPEGRAD_TENSOR_STATE_DICT_H_
#define TAPEGRAD_TENSOR_STATE_DICT_H_

#include <map>
#include <string>

#include "tensor/tensor.h"

namespace tg {

struct StateDict {
  std::map<std::string, RawTensor> tensors;
  std::map<std::string, double> scalars;

  // The entry under `key`; throws tg::Error "StateDict: missing tensor 'key'" if absent.
  const RawTensor& tensor(const std::string& key) const;
  double scalar(const std::string& key) const;
  bool has_tensor(const std::string& key) const { return tensors.count(key) != 0; }
  bool has_scalar(const std::string& key) const { return scalars.count(key) != 0; }

  // Adds every entry of `other` under `prefix` + key (prefix usually ends with '.'); throws on a
  // key that already exists.
  void Merge(const std::string& prefix, const StateDict& other);
  // The entries whose key starts with `prefix`, with the prefix removed.
  StateDict Sub(const std::string& prefix) const;
};

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_STATE_DICT_H_
