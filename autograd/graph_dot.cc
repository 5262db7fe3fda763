#include "autograd/graph_dot.h"

#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "autograd/node.h"

namespace tg {
namespace {

// DOT string literal contents: quotes and backslashes escaped.
std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string NodeLabel(const Node& node) {
  std::vector<std::string> lines;
  std::vector<std::string> hooks;
  if (node.IsAccumulateGrad()) {
    const VariableImpl& leaf = *static_cast<const AccumulateGrad&>(node).leaf();
    lines.push_back(Escape(node.trace_name()));
    lines.push_back(
        absl::StrCat("leaf ", ShapeToString(leaf.data.shape()), " ", DTypeName(leaf.data.dtype())));
    if (!leaf.tensor_hooks.empty())
      hooks.push_back(absl::StrCat(leaf.tensor_hooks.size(), " tensor hook(s)"));
    if (!leaf.post_accumulate_hooks.empty()) {
      hooks.push_back(
          absl::StrCat(leaf.post_accumulate_hooks.size(), " post-accumulate-grad hook(s)"));
    }
  } else {
    lines.push_back(absl::StrCat(Escape(node.name()), "  #", node.sequence_nr()));
  }
  const Node::HookCounts c = node.hook_counts();
  if (c.tensor_hooks) hooks.push_back(absl::StrCat(c.tensor_hooks, " tensor hook(s)"));
  if (c.retain_grad) hooks.push_back("retains grad");
  if (c.pre_hooks) hooks.push_back(absl::StrCat(c.pre_hooks, " pre-hook(s)"));
  if (c.post_hooks) hooks.push_back(absl::StrCat(c.post_hooks, " post-hook(s)"));
  for (const std::string& h : hooks) lines.push_back(h);
  if (node.recomputed_by_checkpoint()) lines.push_back("recomputed by checkpoint");
  return absl::StrJoin(lines, "\\n");
}

}  // namespace

std::string BackwardGraphToDot(const Tensor& root) {
  std::string out = "digraph backward {\n  rankdir=TB;\n  node [fontname=\"monospace\"];\n";
  std::shared_ptr<Node> start =
      root.defined() && root.requires_grad() ? root.gradient_edge_node() : nullptr;
  absl::flat_hash_map<const Node*, int> ids;
  std::vector<const Node*> stack;
  auto id_of = [&](const Node* n) {
    auto [it, inserted] = ids.emplace(n, static_cast<int>(ids.size()));
    if (inserted) stack.push_back(n);
    return it->second;
  };
  if (start != nullptr) {
    absl::StrAppend(&out, "  root [shape=plaintext, label=\"",
                    Escape(root.name().empty() ? "root" : root.name()), " ",
                    ShapeToString(root.shape()), "\"];\n");
    absl::StrAppend(&out, "  root -> n", id_of(start.get()), ";\n");
  }
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    const Node::HookCounts c = n->hook_counts();
    const bool hooked =
        c.tensor_hooks || c.pre_hooks || c.post_hooks ||
        (n->IsAccumulateGrad() &&
         (!static_cast<const AccumulateGrad*>(n)->leaf()->tensor_hooks.empty() ||
          !static_cast<const AccumulateGrad*>(n)->leaf()->post_accumulate_hooks.empty()));
    // Dashed: what a non-reentrant checkpoint recomputes in backward (its saved tensors are
    // not kept); filled: a retained grad.
    const bool recomputed = n->recomputed_by_checkpoint();
    const char* style = c.retain_grad && recomputed ? ", style=\"filled,dashed\""
                        : c.retain_grad             ? ", style=filled"
                        : recomputed                ? ", style=dashed"
                                                    : "";
    absl::StrAppend(&out, "  n", ids.at(n), " [label=\"", NodeLabel(*n),
                    "\", shape=", n->IsAccumulateGrad() ? "ellipse" : "box", style,
                    c.retain_grad ? ", fillcolor=lightblue" : "", hooked ? ", color=red" : "",
                    "];\n");
    const auto& edges = n->next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      if (!edges[i].valid()) continue;
      const Node* next = edges[i].fn.get();
      absl::StrAppend(&out, "  n", ids.at(n), " -> n", id_of(next));
      if (next->num_inputs() > 1) absl::StrAppend(&out, " [label=\"", edges[i].input_nr, "\"]");
      out += ";\n";
    }
  }
  out += "}\n";
  return out;
}

}  // namespace tg
