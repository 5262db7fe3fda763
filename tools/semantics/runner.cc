// The oracle's tapegrad runner (tools/semantics/README.md): executes scenarios (JSON lines) and
// prints each one's events in the format tools/semantics/run_pytorch.py prints for PyTorch.
//
//   bazel run //tools/semantics:runner -- scenarios.jsonl > tapegrad_events.txt
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "autograd/variable.h"
#include "autograd/warning.h"
#include "nn/module.h"
#include "tensor/error.h"

namespace tg {
namespace {

using Json = nlohmann::json;

std::string Fmt(const Tensor& t) {
  if (!t.defined()) return "None";
  std::string out = "[";
  for (double v : t.data().to(kF64).contiguous().to_vector<double>()) {
    absl::StrAppend(&out, " ", absl::StrFormat("%.17g", v));
  }
  return out + " ]";
}

std::string FmtAll(const VariableList& ts) {
  std::string out;
  for (size_t i = 0; i < ts.size(); ++i) absl::StrAppend(&out, i ? " " : "", Fmt(ts[i]));
  return out;
}

// PyTorch's Double of run_pytorch.py: y = 2x, its backward 2g.
struct Double : Function<Double> {
  static constexpr const char* kName = "Double";
  static VariableList Forward(FunctionCtx&, const VariableList& in) {
    return {MulScalar(in[0], 2.0)};
  }
  static VariableList Backward(FunctionCtx&, const VariableList& grads) {
    return {MulScalar(grads[0], 2.0)};
  }
};

// run_pytorch.py's Module: y = tanh(x) * 2, with the backward hooks the op asks for.
struct TanhTwice : nn::Module {
  TanhTwice(const Json& op, const std::string& tag, std::vector<std::string>& ev) {
    if (!op["pre_scale"].is_null()) {
      const double c = op["pre_scale"];
      register_full_backward_pre_hook([&ev, tag, c](Module&, const VariableList& go) {
        ev.push_back("module_pre " + tag + " " + FmtAll(go));
        if (c == 1.0) return VariableList();
        VariableList scaled;
        for (const Tensor& g : go) scaled.push_back(g.defined() ? MulScalar(g, c) : Tensor());
        return scaled;
      });
    }
    if (!op["hook_scale"].is_null()) {
      const double c = op["hook_scale"];
      register_full_backward_hook(
          [&ev, tag, c](Module&, const VariableList& gi, const VariableList& go) {
            ev.push_back("module_hook " + tag + " " + FmtAll(gi) + " | " + FmtAll(go));
            if (c == 1.0 || !gi[0].defined()) return VariableList();
            return VariableList{MulScalar(gi[0], c)};
          });
    }
  }
  Tensor forward(const Tensor& x) override { return MulScalar(Tanh(x), 2.0); }
};

// run_pytorch.py's DirtyDouble: doubles its input in place and returns it (mark_dirty).
struct DirtyDouble : Function<DirtyDouble> {
  static constexpr const char* kName = "DirtyDouble";
  static VariableList Forward(FunctionCtx& ctx, const VariableList& in) {
    in[0].mul_(2.0);  // under no-grad, as PyTorch's forward
    ctx.mark_dirty({in[0]});
    return {in[0]};
  }
  static VariableList Backward(FunctionCtx&, const VariableList& grads) {
    return {MulScalar(grads[0], 2.0)};
  }
};

void Run(const Json& s, std::vector<std::string>& ev) {
  // Every warning is an event (its text a comment), as run_pytorch.py records them.
  WarningHandlerGuard warnings([&ev](const std::string& message) {
    ev.push_back("warning");
    ev.push_back("# " + message.substr(0, message.find('\n')));
  });
  std::vector<std::shared_ptr<nn::Module>> modules;  // alive until the backward ran
  // The leaf nested backwards accumulate into (as in run_pytorch.py).
  const Tensor aux(RawTensor::FromVector<double>({1.5}, {1}), /*requires_grad=*/true);
  std::map<std::string, Tensor> t;
  for (const Json& leaf : s["leaves"]) {
    std::vector<double> values = leaf["values"].get<std::vector<double>>();
    const int64_t n = static_cast<int64_t>(values.size());
    t[leaf["name"]] = Tensor(RawTensor::FromVector<double>(values, {n}), leaf["requires_grad"]);
  }
  try {
    for (const Json& op : s["ops"]) {
      std::vector<Tensor> a;
      for (const Json& name : op["args"]) a.push_back(t.at(name.get<std::string>()));
      const std::string kind = op["op"];
      Tensor y;
      if (kind == "add") {
        y = Add(a[0], a[1]);
      } else if (kind == "sub") {
        y = Sub(a[0], a[1]);
      } else if (kind == "mul") {
        y = Mul(a[0], a[1]);
      } else if (kind == "tanh") {
        y = Tanh(a[0]);
      } else if (kind == "exp") {
        y = Exp(a[0]);
      } else if (kind == "neg") {
        y = Neg(a[0]);
      } else if (kind == "mul_scalar") {
        y = MulScalar(a[0], op["scalar"].get<double>());
      } else if (kind == "clone") {
        y = a[0].clone();
      } else if (kind == "view") {
        y = a[0].view({-1});
      } else if (kind == "narrow") {
        y = a[0].narrow(0, 0, 1);
      } else if (kind == "custom_double") {
        y = Double::Apply({a[0]})[0];
      } else if (kind == "custom_dirty") {
        y = DirtyDouble::Apply({a[0]})[0];
      } else if (kind == "checkpoint") {
        CheckpointOptions options;
        options.reentrant = op["reentrant"].get<bool>();
        if (op.contains("keep")) {  // a selective policy: the outputs of these ops are kept
          std::vector<OpId> keep;
          for (const auto& k : op["keep"]) {
            keep.push_back(k.get<std::string>() == "tanh" ? OpId::kTanh : OpId::kMul);
          }
          options.context_fn = [keep] { return CreateSelectiveCheckpointContexts(keep); };
        }
        y = Checkpoint([](const VariableList& in) { return Mul(Tanh(in[0]), in[0]); }, {a[0]},
                       options);
      } else if (kind == "module") {
        modules.push_back(std::make_shared<TanhTwice>(op, op["out"].get<std::string>(), ev));
        y = (*modules.back())(a[0]);
      } else {
        throw Error("runner: unknown op " + kind);
      }
      if (op.contains("inplace_mul")) y.mul_(op["inplace_mul"].get<double>());
      t[op["out"]] = y;
    }
    const Json& hooks = s["hooks"];
    for (size_t i = 0; i < hooks.size(); ++i) {
      const Json& h = hooks[i];
      const Tensor x = t.at(h["on"].get<std::string>());
      const std::string tag = absl::StrCat(h["on"].get<std::string>(), "#", i);
      const std::string kind = h["kind"];
      if (!x.requires_grad()) {
        ev.push_back("skip " + tag);
        continue;
      }
      if (kind == "tensor") {
        const double scale = h["scale"];
        x.register_hook([&ev, tag, scale](const Tensor& g) {
          ev.push_back("tensor_hook " + tag + " " + Fmt(g));
          return scale != 1.0 ? MulScalar(g, scale) : Tensor();
        });
      } else if (kind == "callback") {
        x.register_hook([&ev, tag](const Tensor& g) {
          ev.push_back("tensor_hook " + tag + " " + Fmt(g));
          queue_callback([&ev, tag] { ev.push_back("callback " + tag); });
          return Tensor();
        });
      } else if (kind == "multi_all" || kind == "multi_any") {
        const Tensor other = t.at(h["with"].get<std::string>());
        if (!other.requires_grad()) {
          ev.push_back("skip " + tag);
          continue;
        }
        if (kind == "multi_all") {
          register_multi_grad_hook({x, other}, [&ev, tag](const VariableList& gs) {
            ev.push_back("multi_all " + tag + " " + FmtAll(gs));
          });
        } else {
          register_multi_grad_hook(
              {x, other},
              [&ev, tag](const Tensor& g) { ev.push_back("multi_any " + tag + " " + Fmt(g)); },
              MultiGradMode::kAny);
        }
      } else if (kind == "nested") {
        x.register_hook([&ev, tag, aux](const Tensor&) {
          EnableGradGuard grad;  // hooks run with grad mode off
          Sum(Mul(aux, aux)).backward();
          ev.push_back("nested " + tag + " " + Fmt(aux.grad()));
          return Tensor();
        });
      } else if (kind == "callback_nested") {
        x.register_hook([&ev, tag, aux](const Tensor&) {
          queue_callback([&ev, tag, aux] {
            EnableGradGuard grad;
            Sum(Mul(aux, aux)).backward();
            ev.push_back("callback_nested " + tag + " " + Fmt(aux.grad()));
          });
          return Tensor();
        });
      } else if (kind == "raise") {
        x.register_hook([tag](const Tensor&) -> Tensor { throw Error("hook " + tag + " raised"); });
      } else if (kind == "retain_grad") {
        if (x.is_leaf()) {
          ev.push_back("skip " + tag);
          continue;
        }
        x.retain_grad();
      } else if (kind == "post_acc") {
        if (!x.is_leaf()) {
          ev.push_back("skip " + tag);
          continue;
        }
        x.register_post_accumulate_grad_hook(
            [&ev, tag](const Tensor& p) { ev.push_back("post_acc " + tag + " " + Fmt(p.grad())); });
      } else if (kind == "node_pre" || kind == "node_post") {
        if (x.grad_fn() == nullptr) {
          ev.push_back("skip " + tag);
          continue;
        }
        if (kind == "node_pre") {
          x.grad_fn()->RegisterPreHook([&ev, tag](const VariableList& go) {
            ev.push_back("node_pre " + tag + " " + FmtAll(go));
            return VariableList();
          });
        } else {
          x.grad_fn()->RegisterPostHook([&ev, tag](const VariableList& gi, const VariableList&) {
            ev.push_back("node_post " + tag + " " + FmtAll(gi));
          });
        }
      }
    }
    const Json& root_names = s["root"];
    Tensor root = Sum(t.at(root_names[0].get<std::string>()));
    for (size_t i = 1; i < root_names.size(); ++i) {
      root = Add(root, Sum(t.at(root_names[i].get<std::string>())));
    }
    const Json& b = s["backward"];
    const std::string api = b["api"];
    if (api == "backward" || api == "backward_twice" || api == "backward_inputs") {
      if (api == "backward_twice") {
        BackwardOptions retain;
        retain.retain_graph = true;
        Engine::Backward({root}, {}, retain);
        ev.push_back("second");
        root.backward();
      } else if (api == "backward_inputs") {
        VariableList inputs;
        for (const Json& name : b["inputs"]) inputs.push_back(t.at(name.get<std::string>()));
        BackwardOptions options;
        options.inputs = &inputs;
        Engine::Backward({root}, {}, options);
      } else {
        root.backward();
      }
      for (const Json& leaf : s["leaves"]) {
        ev.push_back("grad " + leaf["name"].get<std::string>() + " " +
                     Fmt(t.at(leaf["name"].get<std::string>()).grad()));
      }
      for (size_t i = 0; i < hooks.size(); ++i) {
        const Tensor& x = t.at(hooks[i]["on"].get<std::string>());
        if (hooks[i]["kind"] == "retain_grad" && !x.is_leaf() && x.requires_grad()) {
          ev.push_back(absl::StrCat("retained ", hooks[i]["on"].get<std::string>(), "#", i, " ",
                                    Fmt(x.grad())));
        }
      }
    } else {
      std::vector<GradTarget> inputs;
      for (const Json& name : b["inputs"]) {
        const Tensor& x = t.at(name.get<std::string>());
        if (api == "grad_edges") {
          inputs.emplace_back(get_gradient_edge(x));
        } else {
          inputs.emplace_back(x);
        }
      }
      GradOptions options;
      options.allow_unused = true;
      const VariableList res = Engine::GradEdges({root}, inputs, {}, options);
      for (size_t i = 0; i < res.size(); ++i) {
        ev.push_back("result " + b["inputs"][i].get<std::string>() + " " + Fmt(res[i]));
      }
      for (const Json& leaf : s["leaves"]) {
        ev.push_back("grad " + leaf["name"].get<std::string>() + " " +
                     Fmt(t.at(leaf["name"].get<std::string>()).grad()));
      }
    }
  } catch (const std::exception& e) {
    ev.push_back("error");
    std::string what = e.what();
    ev.push_back("# " + what.substr(0, what.find('\n')));
  }
}

}  // namespace
}  // namespace tg

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: runner SCENARIOS.jsonl\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::fprintf(stderr, "runner: cannot open %s\n", argv[1]);
    return 1;
  }
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    tg::Json s;
    try {
      s = tg::Json::parse(line);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "runner: %s line %ld: not JSON: %s\n", argv[1],
                   static_cast<long>(number), e.what());
      return 1;
    }
    std::vector<std::string> events;
    try {
      tg::Run(s, events);
    } catch (const std::exception& e) {  // a malformed scenario (a missing field)
      std::fprintf(stderr, "runner: %s line %ld: %s\n", argv[1], static_cast<long>(number),
                   e.what());
      return 1;
    }
    std::printf("### scenario %ld\n", static_cast<long>(s["id"].get<int64_t>()));
    for (const std::string& e : events) std::printf("%s\n", e.c_str());
  }
  return 0;
}
