#pragma once
// Op-entry helpers for mixed precision (docs/mixed_precision.md):
//  - autocast_detail::applies / call: the autocast hook, one `if` at the top of an op on one of
//    PyTorch's autocast lists; casts the op's tensor arguments and calls the op again with
//    autocast off for that call (PyTorch's ExcludeDispatchKeyGuard).
//  - ops_detail::any_reduced / in_float32: 16-bit float inputs for ops whose kernels are
//    float32: the op runs on float32 copies and its result is rounded once (to nearest even)
//    to the output dtype, as PyTorch's CPU bf16 kernels compute in float and store bf16. The
//    conversions are differentiable, so the backward is the float32 one between two casts.
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "phalanx/core/autocast.hpp"
#include "phalanx/core/half.hpp"
#include "phalanx/core/tensor.hpp"

namespace phalanx::autocast_detail {

/// The ops of PyTorch's autocast lists that Phalanx has.
enum class Op : std::uint8_t { Linear, Matmul, Conv2d, Attention, CrossEntropy, MseLoss, Softmax, LogSoftmax,
                               LayerNorm, Exp, Log, Sum };
enum class Policy : std::uint8_t { None, LowerPrecision, Fp32 };

/// The list `op` is on for `device` (PyTorch's CPU or CUDA lists).
Policy policy(Op op, DeviceType device);
/// Whether autocast is on for `device` on this thread and not suspended by call().
bool active(DeviceType device);
/// `t` cast for `policy` (undefined, non-floating or other-device tensors unchanged; a
/// float32 leaf that requires grad goes through the cast cache for LowerPrecision).
Tensor cast(const Tensor& t, Policy policy, DeviceType device);

/// RAII: autocast suspended on this thread (the call() of an op that autocast has cast).
class Suspend {
 public:
  Suspend();
  ~Suspend();
  Suspend(const Suspend&) = delete;
  Suspend& operator=(const Suspend&) = delete;

 private:
  bool prev_;
};

inline bool applies(Op op, const Tensor& first) {
  if (!first.defined()) return false;
  const DeviceType d = first.device().type;
  return active(d) && policy(op, d) != Policy::None;
}

/// f(casted args...) with autocast suspended; `first` names the device (PyTorch: the first
/// tensor argument's device picks the autocast key).
template <typename F, typename... T>
auto call(Op op, F&& f, const Tensor& first, const T&... rest) {
  const DeviceType d = first.device().type;
  const Policy p = policy(op, d);
  Tensor a = cast(first, p, d);
  auto cast_one = [&](const auto& t) {
    if constexpr (std::is_same_v<std::decay_t<decltype(t)>, Tensor>) return cast(t, p, d);
    else return t;
  };
  auto tup = std::make_tuple(cast_one(rest)...);
  (void)cast_one;  // unused for one-tensor ops
  Suspend s;
  return std::apply([&](auto&... r) { return f(a, r...); }, tup);
}

}  // namespace phalanx::autocast_detail

namespace phalanx::ops_detail {

inline bool is_reduced(const Tensor& t) {
  return t.defined() && (t.dtype() == DType::BFloat16 || t.dtype() == DType::Float16);
}
template <typename... T>
bool any_reduced(const T&... t) {
  return (is_reduced(t) || ...);
}
inline bool is_floating(const Tensor& t) {
  return t.defined() && (t.dtype() == DType::Float32 || is_reduced(t));
}
/// PyTorch's promotion among the floating dtypes of the defined arguments (bf16 with float32
/// is float32; bf16 with float16 is float32); integer and bool arguments do not take part.
/// As PyTorch's result_type, a 0-dim tensor takes part only when no argument with dimensions
/// is floating: bf16 (n) with a float32 0-dim tensor is bf16, with a float32 (1) it is float32.
inline DType promote_types(std::initializer_list<const Tensor*> ts) {
  bool dimensioned = false;
  for (const Tensor* t : ts) dimensioned |= is_floating(*t) && !t->shape().empty();
  bool f32 = false, bf = false, h = false;
  for (const Tensor* t : ts) {
    if (!is_floating(*t) || (dimensioned && t->shape().empty())) continue;
    f32 |= t->dtype() == DType::Float32;
    bf |= t->dtype() == DType::BFloat16;
    h |= t->dtype() == DType::Float16;
  }
  if (f32 || (bf && h)) return DType::Float32;
  return bf ? DType::BFloat16 : h ? DType::Float16 : DType::Float32;
}
inline Tensor to_float32(const Tensor& t) { return is_reduced(t) ? to_dtype(t, DType::Float32) : t; }
/// A float32 result rounded to `dtype` (others, and integer results, unchanged).
inline Tensor round_to(const Tensor& y, DType dtype) {
  return y.defined() && y.dtype() == DType::Float32 && dtype != DType::Float32 ? to_dtype(y, dtype) : y;
}
inline std::vector<Tensor> round_to(std::vector<Tensor> ys, DType dtype) {
  for (Tensor& y : ys) y = round_to(y, dtype);
  return ys;
}
inline std::vector<Tensor> to_float32(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  out.reserve(ts.size());
  for (const Tensor& t : ts) out.push_back(to_float32(t));
  return out;
}
/// When the tensors of `xs` (all floating) have more than one dtype, `out` gets them converted
/// to the promoted one (torch.cat's promotion) and the result is true.
inline bool promote_floating(const std::vector<Tensor>& xs, std::vector<Tensor>& out) {
  // two different floating dtypes always promote to float32 (bf16 with float16 too)
  const DType to = DType::Float32;
  bool mixed = false;
  for (const Tensor& x : xs) {
    const DType d = x.dtype();
    if (d != DType::Float32 && d != DType::BFloat16 && d != DType::Float16) return false;
    mixed |= d != xs[0].dtype();
  }
  if (!mixed) return false;
  out.reserve(xs.size());
  for (const Tensor& x : xs) out.push_back(x.dtype() == to ? x : to_dtype(x, to));
  return true;
}
/// f(float32 copies of the tensor arguments, others as given), rounded to `out`.
template <typename F, typename... T>
auto in_float32(DType out, F&& f, const T&... args) {
  auto conv = [](const auto& t) {
    if constexpr (std::is_same_v<std::decay_t<decltype(t)>, Tensor>) return to_float32(t);
    else return t;
  };
  return round_to(f(conv(args)...), out);
}

}  // namespace phalanx::ops_detail
