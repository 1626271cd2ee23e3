#pragma once
// Autograd: a define-by-run tape. Each op that sees an input requiring grad records a Node
// whose edges point at the nodes of its inputs (or at the AccumulateGrad of a leaf).
// backward() runs nodes in dependency order, highest sequence number first, so the
// gradients of the last layers are ready first (what DDP's buckets rely on).
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "phalanx/core/tensor.hpp"

namespace phalanx {

struct Edge {
  std::shared_ptr<Node> fn;
  bool valid() const { return fn != nullptr; }
};

class Node {
 public:
  /// Inputs of this node still to arrive in the backward pass in progress (-1 outside one).
  int pending_inputs() const { return pending_; }
  /// Whether some gradient already arrived for this node in the pass in progress.
  bool has_partial_gradient() const { return grad_in_.defined(); }
  Node();
  virtual ~Node() = default;
  /// Gradients for each input given the gradient of the (single) output.
  /// An undefined Tensor means "no gradient for this input".
  virtual std::vector<Tensor> apply(const Tensor& grad_output) = 0;
  virtual const char* name() const = 0;
  /// Frees saved tensors after a backward without retain_graph.
  virtual void release_saved() {}
  /// Whether the node may run again after a backward without retain_graph because it saves
  /// nothing (autocast's cached casts are reused by every forward of the region).
  virtual bool reusable() const { return false; }

  std::vector<Edge> next_edges;
  std::uint64_t sequence_nr() const { return seq_; }
  bool released = false;

 private:
  friend struct EngineAccess;
  std::uint64_t seq_;
  // Scratch state of the backward pass in progress (the engine is not re-entrant), kept
  // in the node so a pass needs no hash maps.
  int pending_ = -1;  // dependants not yet run; -1 when not part of a pass
  Tensor grad_in_;    // the gradient summed so far for this node's output
};

/// The node at a leaf: adds the incoming gradient into `leaf.grad` and runs its hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf) : leaf_(std::move(leaf)) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override;
  const char* name() const override { return "AccumulateGrad"; }
  const Tensor& leaf() const { return leaf_; }

 private:
  Tensor leaf_;
};

/// Whether ops record history (thread-local; on by default).
bool grad_mode_enabled();
void set_grad_mode(bool enabled);

/// RAII: ops inside record no history (evaluation, optimizer updates).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_mode_enabled()) { set_grad_mode(false); }
  ~NoGradGuard() { set_grad_mode(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

/// Clears the gradients of `params`: undefined (set_to_none) or zero-filled in place.
/// Module::zero_grad and Optimizer::zero_grad both come here.
void zero_grads(const std::vector<Tensor>& params, bool set_to_none);

/// Queues `fn` to run once when the backward pass in progress on this thread ends
/// (DDP waits for its buckets there). Throws AutogradError outside backward.
void queue_backward_callback(std::function<void()> fn);
/// True while this thread runs a backward pass.
bool in_backward();

namespace autograd {
/// Runs backward from `roots` with the given output gradients.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              bool retain_graph);
/// The edge that a gradient for `t` flows along (its grad_fn, or its leaf accumulator).
Edge gradient_edge(const Tensor& t);
/// The tensor a node should write the gradient for its input `i` into: the leaf's
/// grad destination when that input is a leaf with one, whose gradient is still undefined,
/// and which this node is the only one left to feed in this pass; otherwise a new tensor.
Tensor gradient_buffer(const Node& node, std::size_t i, const Shape& shape, Device device);
/// Connects `node` to `inputs` and makes it the grad_fn of `output` when any input requires
/// grad and grad mode is on. Returns whether the node was recorded.
bool record(const std::shared_ptr<Node>& node, std::initializer_list<const Tensor*> inputs,
            Tensor& output);
}  // namespace autograd

}  // namespace phalanx
