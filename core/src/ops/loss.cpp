// Losses: cross_entropy (fused log-softmax + NLL, like torch.nn.functional.cross_entropy)
// and mse_loss.
#include "ops/autocast_support.hpp"
#include "ops/op_support.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/label_flag.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx {

using namespace ops_detail;

namespace {
class CrossEntropyBackward final : public Node {
 public:
  CrossEntropyBackward(Tensor probs, Tensor target, float scale)
      : probs_(std::move(probs)), target_(std::move(target)), scale_(scale) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor gx = empty_like(probs_);
    kernels_for(g.device()).cross_entropy_backward(probs_, target_, g, scale_, gx);
    return {gx};
  }
  const char* name() const override { return "CrossEntropyBackward"; }
  void release_saved() override { probs_ = Tensor(); target_ = Tensor(); }

 private:
  Tensor probs_, target_;
  float scale_;
};
thread_local std::vector<std::weak_ptr<detail::LabelFlagSink>> registered;
thread_local std::vector<const detail::LabelFlagSink*> found;
thread_local const std::vector<const detail::LabelFlagSink*>* checking = nullptr;

/// Marks the label check running on this thread as writing these sinks (label_flag_for_check).
struct CheckingWith {
  explicit CheckingWith(const std::vector<const detail::LabelFlagSink*>* s) { checking = s; }
  ~CheckingWith() { checking = nullptr; }
};
}  // namespace

namespace detail {
void add_label_flag_sink(const std::shared_ptr<LabelFlagSink>& sink) {
  bool have = false;
  for (auto it = registered.begin(); it != registered.end();) {
    const std::shared_ptr<LabelFlagSink> s = it->lock();
    if (!s) {
      it = registered.erase(it);
      continue;
    }
    have = have || s == sink;
    ++it;
  }
  if (!have) registered.push_back(sink);
}
const std::vector<const LabelFlagSink*>& label_flag_sinks(const Device& device) {
  found.clear();
  for (const auto& w : registered)
    if (const std::shared_ptr<LabelFlagSink> s = w.lock();
        s && s->active.load(std::memory_order_relaxed) && s->flag.device() == device)
      found.push_back(s.get());  // the reducer (the owner) outlives this cross_entropy call
  return found;
}
const std::vector<const LabelFlagSink*>* label_flag_for_check() { return checking; }
}  // namespace detail

Tensor cross_entropy(const Tensor& logits_in, const Tensor& target_in, Reduction reduction) {
  const Tensor logits = contiguous_input(logits_in), target = contiguous_input(target_in);
  auto again = [=](const Tensor& l, const Tensor& t) { return cross_entropy(l, t, reduction); };
  if (autocast_detail::applies(autocast_detail::Op::CrossEntropy, logits))
    return autocast_detail::call(autocast_detail::Op::CrossEntropy, again, logits, target);
  if (is_reduced(logits)) return in_float32(logits.dtype(), again, logits, target);
  check_float(logits, "cross_entropy", "input");
  check_defined(target, "cross_entropy", "target");
  check_same_device(logits, target, "cross_entropy");
  if (target.dtype() != DType::Int64)
    throw TypeError(detail::concat("cross_entropy: target must hold int64 class indices, got ",
                                   dtype_name(target.dtype())));
  if (logits.dim() != 2 || target.dim() != 1 || target.shape()[0] != logits.shape()[0])
    throw ShapeError("cross_entropy: expected input [N, C] and target [N], got " +
                     shape_str(logits.shape()) + " and " + shape_str(target.shape()));
  const std::int64_t n = logits.shape()[0], c = logits.shape()[1];
  if (n == 0) throw ValueError("cross_entropy: empty batch");
  DeviceKernels& k = kernels_for(logits.device());
  // Under a DDP step (a backward will follow) a bad label goes to the step flag, so every
  // rank raises together at the end of backward (label_flag.hpp); a deferring device (CUDA)
  // writes the flag itself and returns -1. Evaluation (no backward) still raises here.
  const std::vector<const detail::LabelFlagSink*>* sinks = nullptr;
  if (grad_mode_enabled() && logits.requires_grad())
    if (const auto& s = detail::label_flag_sinks(logits.device()); !s.empty()) sinks = &s;
  std::int64_t bad;
  {
    const CheckingWith scope(sinks);
    bad = k.find_label_out_of_range(target, c);
  }
  Tensor target_used = target;
  if (bad >= 0 && sinks) {
    for (const detail::LabelFlagSink* sink : *sinks) {
      Tensor flag = sink->flag;
      flag.fill_(sink->value);
    }
    // The kernels index rows by label: give them class 0 (the step is void on every rank).
    target_used = zeros({n}, DType::Int64, target.device());
  } else if (bad >= 0) {
    const std::int64_t label = target.narrow_rows(bad, bad + 1).item_int();
    throw ValueError(detail::concat("cross_entropy: target[", bad, "] = ", label,
                                    " is not a class index in [0, ", c, ")"));
  }
  Tensor probs = empty_like(logits);
  Tensor rows = Tensor::empty({n}, DType::Float32, logits.device());
  k.cross_entropy(logits, target_used, probs, rows);
  Tensor out;
  float scale = 1.f;
  if (reduction == Reduction::None) {
    out = rows;
  } else {
    scale = reduction == Reduction::Mean ? 1.f / static_cast<float>(n) : 1.f;
    out = Tensor::empty({}, DType::Float32, logits.device());
    k.sum_dim(rows, 1, n, 1, out, scale);
  }
  if (grad_mode_enabled() && logits.requires_grad())
    autograd::record(std::make_shared<CrossEntropyBackward>(probs, target_used, scale), {&logits}, out);
  return out;
}

Tensor mse_loss(const Tensor& input_in, const Tensor& target_in, Reduction reduction) {
  const Tensor input = contiguous_input(input_in), target = contiguous_input(target_in);
  auto again = [=](const Tensor& i, const Tensor& t) { return mse_loss(i, t, reduction); };
  if (autocast_detail::applies(autocast_detail::Op::MseLoss, input))
    return autocast_detail::call(autocast_detail::Op::MseLoss, again, input, target);
  if (any_reduced(input, target)) return in_float32(promote_types({&input, &target}), again, input, target);
  check_float(input, "mse_loss", "input");
  check_float(target, "mse_loss", "target");
  if (input.shape() != target.shape())
    throw ShapeError("mse_loss: input " + shape_str(input.shape()) + " and target " +
                     shape_str(target.shape()) + " must have the same shape");
  Tensor d = sub(input, target);
  Tensor sq = mul(d, d);
  switch (reduction) {
    case Reduction::None: return sq;
    case Reduction::Sum: return sum(sq);
    case Reduction::Mean: break;
  }
  return mean(sq);
}

}  // namespace phalanx
