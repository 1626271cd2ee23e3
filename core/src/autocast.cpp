// Autocast state (thread-local, as PyTorch's), the cast cache and the op lists.
#include "phalanx/core/autocast.hpp"

#include <unordered_map>
#include <utility>

#include "ops/autocast_support.hpp"
#include "phalanx/core/autograd.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/half.hpp"

namespace phalanx {

namespace {

struct DeviceState {
  bool enabled = false;
  DType dtype;
};

struct State {
  DeviceState cpu{false, DType::BFloat16};
  DeviceState cuda{false, DType::Float16};
  bool cache_enabled = true;
  bool suspended = false;
  int nesting = 0;
  std::uint64_t casts = 0;
  // Keyed by the source's TensorImpl*; the value holds the source itself so that its address
  // cannot be reused by another tensor while the entry lives (PyTorch holds a weak reference
  // for the same reason).
  std::unordered_map<const TensorImpl*, std::pair<Tensor, Tensor>> cache;
};

State& state() {
  thread_local State s;
  return s;
}

DeviceState* device_state(DeviceType d) {
  State& s = state();
  if (d == DeviceType::CPU) return &s.cpu;
  if (d == DeviceType::CUDA) return &s.cuda;
  return nullptr;
}

DeviceState& checked_state(DeviceType d, DType dtype, bool enabled) {
  DeviceState* ds = device_state(d);
  if (ds == nullptr)
    throw ValueError(detail::concat("autocast: device type ", static_cast<int>(d),
                                    " has no autocast; use DeviceType::CPU or DeviceType::CUDA"));
  if (enabled && d == DeviceType::CPU && dtype != DType::BFloat16)
    throw ValueError(detail::concat("autocast: the CPU autocasts to bfloat16 only, got ", dtype_name(dtype),
                                    "; use DType::BFloat16"));
  if (enabled && d == DeviceType::CUDA && dtype != DType::BFloat16 && dtype != DType::Float16)
    throw ValueError(detail::concat("autocast: CUDA autocasts to float16 or bfloat16, got ", dtype_name(dtype)));
  return *ds;
}

}  // namespace

autocast::autocast(DType dtype, bool enabled, DeviceType device, bool cache_enabled)
    : autocast(device, dtype, enabled, cache_enabled) {}

autocast::autocast(DeviceType device, DType dtype, bool enabled, bool cache_enabled) : device_(device) {
  DeviceState& ds = checked_state(device, dtype, enabled);
  State& s = state();
  prev_enabled_ = ds.enabled;
  prev_dtype_ = ds.dtype;
  prev_cache_ = s.cache_enabled;
  ds.enabled = enabled;
  if (enabled) ds.dtype = dtype;
  s.cache_enabled = cache_enabled;
  ++s.nesting;
}

autocast::~autocast() {
  State& s = state();
  DeviceState& ds = *device_state(device_);
  ds.enabled = prev_enabled_;
  ds.dtype = prev_dtype_;
  s.cache_enabled = prev_cache_;
  if (--s.nesting == 0) s.cache.clear();  // torch.autocast.__exit__: the outermost scope
}

bool autocast::is_enabled(DeviceType device) {
  const DeviceState* ds = device_state(device);
  return ds != nullptr && ds->enabled;
}

DType autocast::dtype(DeviceType device) {
  const DeviceState* ds = device_state(device);
  return ds != nullptr ? ds->dtype : DType::Float32;
}

std::size_t autocast::cache_size() { return state().cache.size(); }
std::uint64_t autocast::cast_count() { return state().casts; }
void autocast::clear_cache() { state().cache.clear(); }

namespace autocast_detail {

Suspend::Suspend() : prev_(state().suspended) { state().suspended = true; }
Suspend::~Suspend() { state().suspended = prev_; }

bool active(DeviceType device) {
  const State& s = state();
  if (s.suspended) return false;
  const DeviceState* ds = device_state(device);
  return ds != nullptr && ds->enabled;
}

// PyTorch's lists (aten/src/ATen/autocast_mode.cpp; docs/mixed_precision.md gives them whole):
// only the ops Phalanx has. On the CPU, softmax, log_softmax, layer_norm, exp, log and sum are
// on no list and run in their input's dtype; on CUDA they are fp32 (or fp32_set_opt_dtype,
// which for a 16-bit input also gives a float32 result).
Policy policy(Op op, DeviceType device) {
  switch (op) {
    case Op::Linear:
    case Op::Matmul:
    case Op::Conv2d:
    case Op::Attention:  // scaled_dot_product_attention: PyTorch 2.x's lists (1.13 has no such op)
      return Policy::LowerPrecision;
    case Op::CrossEntropy:  // CPU: cross_entropy_loss, nll_loss; CUDA: log_softmax + nll_loss
    case Op::MseLoss:
      return Policy::Fp32;
    case Op::Softmax:
    case Op::LogSoftmax:
    case Op::LayerNorm:
    case Op::Exp:
    case Op::Log:
    case Op::Sum:
      return device == DeviceType::CUDA ? Policy::Fp32 : Policy::None;
  }
  return Policy::None;
}

Tensor cast(const Tensor& t, Policy policy, DeviceType device) {
  if (!t.defined() || t.device().type != device) return t;
  const DType from = t.dtype();
  if (from != DType::Float32 && from != DType::BFloat16 && from != DType::Float16) return t;
  State& s = state();
  const DType to = policy == Policy::LowerPrecision ? device_state(device)->dtype : DType::Float32;
  if (from == to || policy == Policy::None) return t;
  // Not under NoGradGuard: a cast made there has no history, and a later forward in the
  // region that reused it would give the weight no gradient (PyTorch 1.13 does that).
  const bool cacheable = policy == Policy::LowerPrecision && from == DType::Float32 && s.cache_enabled &&
                         t.is_leaf() && t.requires_grad() && grad_mode_enabled();
  if (cacheable) {
    auto it = s.cache.find(t.impl());
    if (it != s.cache.end()) return it->second.second;
  }
  // 16-bit to the other 16-bit type goes through float32 (exact on the way up)
  Tensor out = from != DType::Float32 && to != DType::Float32 ? to_dtype(to_dtype(t, DType::Float32), to)
                                                                : to_dtype(t, to);
  ++s.casts;
  if (cacheable) s.cache.emplace(t.impl(), std::make_pair(t, out));
  return out;
}

}  // namespace autocast_detail

}  // namespace phalanx
