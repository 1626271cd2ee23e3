#pragma once
// Interop with xtensor. Include only where needed: xtensor is heavy to compile.
#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>

#include "phalanx/core/creation.hpp"
#include "phalanx/core/tensor.hpp"

namespace phalanx {

/// A copy of a CPU tensor as an xarray.
template <typename T>
xt::xarray<T> to_xarray(const Tensor& t) {
  if (!t.device().is_cpu()) return to_xarray<T>(t.to(Device::cpu()));
  std::vector<std::size_t> shape(t.shape().begin(), t.shape().end());
  xt::xarray<T> out = xt::adapt(t.data<T>(), static_cast<std::size_t>(t.numel()),
                                xt::no_ownership(), shape);
  return out;
}

/// A non-owning xtensor view over a CPU tensor's storage (no copy); keep `t` alive.
template <typename T>
auto as_xview(const Tensor& t) {
  std::vector<std::size_t> shape(t.shape().begin(), t.shape().end());
  return xt::adapt(t.data<T>(), static_cast<std::size_t>(t.numel()), xt::no_ownership(), shape);
}

/// A new tensor holding a copy of `a` (row-major).
template <typename T>
Tensor from_xarray(const xt::xarray<T>& a) {
  Shape shape(a.shape().begin(), a.shape().end());
  Tensor t = Tensor::empty(shape, dtype_of<T>::value);
  std::copy(a.begin(), a.end(), t.data<T>());
  return t;
}

}  // namespace phalanx
