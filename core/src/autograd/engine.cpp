// The backward engine: count each node's dependants, then run ready nodes highest
// sequence number first (the reverse of creation), summing gradients that meet at a node.
#include <queue>

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/timeline.hpp"
#include "ops/op_support.hpp"

namespace phalanx {

namespace {
thread_local std::vector<std::function<void()>>* t_callbacks = nullptr;

struct BySeq {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr() < b->sequence_nr(); }
};

void accumulate_into(Tensor& slot, const Tensor& g) {
  if (!slot.defined()) {
    slot = g;
  } else if (slot.impl()->is_contiguous() && slot.impl_ptr().use_count() == 1 &&
             slot.impl()->storage().use_count() == 1) {
    // Nobody else sees this buffer (not even through a view): add in place.
    slot.add_(g);
  } else {
    Tensor sum = slot.clone();
    sum.add_(g);
    slot = sum;
  }
}
}  // namespace

bool in_backward() { return t_callbacks != nullptr; }

void queue_backward_callback(std::function<void()> fn) {
  if (!t_callbacks)
    throw AutogradError("queue_backward_callback(): no backward pass is running on this thread");
  t_callbacks->push_back(std::move(fn));
}

struct EngineAccess {
  static int& pending(Node* n) { return n->pending_; }
  static Tensor& grad_in(Node* n) { return n->grad_in_; }
};

namespace autograd {

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              bool retain_graph) {
  if (t_callbacks) throw AutogradError("backward(): re-entrant backward is not supported");
  // The whole pass, end-of-backward callbacks (DDP's wait for its buckets) included.
  timeline::Span span("backward", "autograd");
  NoGradGuard no_grad;  // gradients themselves carry no history

  std::vector<std::shared_ptr<Node>> keep;  // keeps root nodes alive while we hold raw pointers
  std::vector<Node*> visited, stack;
  // Leaves every node's scratch state clean, also when a node throws.
  struct Cleanup {
    std::vector<Node*>& nodes;
    ~Cleanup() {
      for (Node* n : nodes) {
        EngineAccess::pending(n) = -1;
        EngineAccess::grad_in(n) = Tensor();
      }
    }
  } cleanup{visited};

  for (std::size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    if (!root.defined()) throw AutogradError("backward(): the tensor is undefined");
    if (!root.requires_grad())
      throw AutogradError("backward(): " + root.str() +
                          " does not require grad and has no grad_fn; did the forward pass run "
                          "under NoGradGuard, or do no parameters require grad?");
    Tensor g = i < grads.size() ? grads[i] : Tensor();
    if (!g.defined()) {
      if (root.numel() != 1)
        throw AutogradError("backward(): gradient can be implicit only for a scalar output, got "
                            "shape " + shape_str(root.shape()) + "; pass a gradient");
      g = ones(root.shape(), DType::Float32, root.device());
    } else if (g.shape() != root.shape()) {
      throw ShapeError("backward(): gradient shape " + shape_str(g.shape()) +
                       " does not match output shape " + shape_str(root.shape()));
    }
    Edge e = gradient_edge(root);
    keep.push_back(e.fn);
    Node* n = e.fn.get();
    if (EngineAccess::pending(n) < 0) {
      EngineAccess::pending(n) = 0;
      visited.push_back(n);
      stack.push_back(n);
    }
    accumulate_into(EngineAccess::grad_in(n), g);
  }
  const std::vector<Node*> root_nodes = stack;

  // Dependency counts over the reachable graph.
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      Node* next = e.fn.get();
      if (!next) continue;
      int& p = EngineAccess::pending(next);
      if (p < 0) {
        p = 0;
        visited.push_back(next);
        stack.push_back(next);
      }
      ++p;
    }
  }

  std::vector<std::function<void()>> callbacks;
  t_callbacks = &callbacks;
  struct Reset {
    ~Reset() { t_callbacks = nullptr; }
  } reset;

  std::priority_queue<Node*, std::vector<Node*>, BySeq> ready;
  for (Node* n : root_nodes)
    if (EngineAccess::pending(n) == 0) ready.push(n);
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    if (n->released)
      throw AutogradError(std::string("backward(): trying to backward through the graph a second "
                                      "time (node ") + n->name() +
                          "): its saved tensors were freed after the first backward; pass "
                          "retain_graph=true to the first backward() if you need a second one");
    Tensor grad = std::move(EngineAccess::grad_in(n));
    EngineAccess::grad_in(n) = Tensor();
    // A node that no gradient reached (every path into it gave none) is skipped, but its
    // inputs' dependency counts still drop.
    // Nodes (their kernels) take contiguous gradients; a view's gradient may arrive strided.
    if (grad.defined() && !grad.impl()->is_contiguous() && !ops_detail::takes_strided_gradient(*n))
      grad = ops_detail::materialize(grad);
    std::vector<Tensor> outs = grad.defined() ? n->apply(grad) : std::vector<Tensor>{};
    grad = Tensor();
    if (!retain_graph) {
      n->release_saved();
      if (!n->reusable() && !dynamic_cast<AccumulateGrad*>(n)) n->released = true;
    }
    for (std::size_t i = 0; i < n->next_edges.size(); ++i) {
      Node* next = n->next_edges[i].fn.get();
      if (!next) continue;
      if (i < outs.size() && outs[i].defined()) accumulate_into(EngineAccess::grad_in(next), outs[i]);
      if (--EngineAccess::pending(next) == 0) ready.push(next);
    }
  }

  // End-of-backward callbacks (DDP waits for its buckets here). Callbacks may queue more.
  for (std::size_t i = 0; i < callbacks.size(); ++i) callbacks[i]();
}

}  // namespace autograd
}  // namespace phalanx
