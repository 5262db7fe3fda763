// The backward graph below a variable as Graphviz DOT: one box per node (its name and sequence
// number, and the hooks registered on it), one arrow per edge in the direction the gradient
// flows (labelled with the input it feeds when a node has several), leaves as ellipses with
// their name, shape and hooks. Retained grads are marked on the node whose output keeps them
// (filled), and the nodes a non-reentrant checkpoint recomputes are dashed and labelled
// "recomputed by checkpoint".
//
//   std::string dot = tg::BackwardGraphToDot(loss);   // dot -Tsvg graph.dot > graph.svg
#ifndef TAPEGRAD_AUTOGRAD_GRAPH_DOT_H_
#define TAPEGRAD_AUTOGRAD_GRAPH_DOT_H_

#include <string>

#include "autograd/variable.h"

namespace tg {

// Walks the graph iteratively (no recursion: graphs may be long); each node appears once.
// A root that is a leaf without grad_fn gives its AccumulateGrad alone; one that does not
// require grad gives an empty graph.
std::string BackwardGraphToDot(const Tensor& root);

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_GRAPH_DOT_H_
