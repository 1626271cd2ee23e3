#include <atomic>

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/kernels.hpp"

namespace phalanx {

namespace {
std::atomic<std::uint64_t> g_next_seq{0};
thread_local bool t_grad_mode = true;
}  // namespace

Node::Node() : seq_(g_next_seq.fetch_add(1, std::memory_order_relaxed)) {}

bool grad_mode_enabled() { return t_grad_mode; }
void set_grad_mode(bool enabled) { t_grad_mode = enabled; }

std::vector<Tensor> AccumulateGrad::apply(const Tensor& grad) {
  AutogradMeta& meta = leaf_.impl()->ensure_autograd();
  if (!meta.grad.defined() && meta.grad_destination.defined() &&
      grad.impl() == meta.grad_destination.impl()) {
    meta.grad = grad;  // produced in place (gradient_buffer): adopt the destination itself
  } else if (!meta.grad.defined()) {
    // Steal the incoming buffer when nobody else holds it; otherwise keep our own copy so a
    // later in-place accumulation cannot write into another tensor.
    const bool sole_owner =
        grad.impl_ptr().use_count() == 1 && grad.impl()->storage().use_count() == 1;
    meta.grad = sole_owner ? grad : grad.clone();
  } else {
    meta.grad.add_(grad);
  }
  for (auto& [id, hook] : meta.hooks) hook(leaf_);
  return {};
}

void zero_grads(const std::vector<Tensor>& params, bool set_to_none) {
  for (const auto& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none)
      p.set_grad(Tensor());
    else
      g.zero_();
  }
}

namespace autograd {

Edge gradient_edge(const Tensor& t) {
  AutogradMeta* m = t.impl()->autograd();
  if (!m) return {};
  if (m->grad_fn) return {m->grad_fn};
  if (!m->requires_grad) return {};
  std::shared_ptr<AccumulateGrad> acc = m->accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    m->accumulator = acc;
  }
  return {acc};
}

Tensor gradient_buffer(const Node& node, std::size_t i, const Shape& shape, Device device) {
  if (i < node.next_edges.size()) {
    if (auto* acc = dynamic_cast<AccumulateGrad*>(node.next_edges[i].fn.get())) {
      const AutogradMeta* m = acc->leaf().impl()->autograd();
      // Only the last producer, with nothing summed before it: otherwise two producers
      // could write the same destination, or a partial sum would have to be added to it.
      if (m && m->grad_destination.defined() && !m->grad.defined() && acc->pending_inputs() == 1 &&
          !acc->has_partial_gradient() && m->grad_destination.shape() == shape &&
          m->grad_destination.device() == device)
        return m->grad_destination;
    }
  }
  return Tensor::empty(shape, DType::Float32, device);
}

bool record(const std::shared_ptr<Node>& node, std::initializer_list<const Tensor*> inputs,
            Tensor& output) {
  if (!grad_mode_enabled()) return false;
  bool any = false;
  for (const Tensor* in : inputs)
    if (in && in->defined() && in->requires_grad()) any = true;
  if (!any) return false;
  node->next_edges.reserve(inputs.size());
  for (const Tensor* in : inputs)
    node->next_edges.push_back(in && in->defined() ? gradient_edge(*in) : Edge{});
  output.impl()->ensure_autograd().grad_fn = node;
  return true;
}

}  // namespace autograd
}  // namespace phalanx
