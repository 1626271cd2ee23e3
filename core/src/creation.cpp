#include "phalanx/core/creation.hpp"

#include <cstring>

#include "phalanx/core/kernels.hpp"

namespace phalanx {

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  kernels_for(device).fill(t, value);
  return t;
}
Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }

namespace {
template <typename T>
Tensor host_to(const T* data, const Shape& shape, Device device) {
  Tensor t = Tensor::empty(shape, dtype_of<T>::value, device);
  kernels_for(device).copy_from_host(t.raw_data(), data, t.nbytes());
  return t;
}
template <typename T>
Tensor from_vec(const std::vector<T>& v, const Shape& shape) {
  if (static_cast<std::int64_t>(v.size()) != numel_of(shape))
    throw ShapeError(detail::concat("tensor(): ", v.size(), " values do not fill shape ",
                                    shape_str(shape)));
  return host_to(v.data(), shape, Device::cpu());
}
}  // namespace

Tensor from_buffer(const float* data, const Shape& shape, Device device) {
  return host_to(data, shape, device);
}
Tensor from_buffer(const std::int64_t* data, const Shape& shape, Device device) {
  return host_to(data, shape, device);
}
Tensor tensor(const std::vector<float>& v, const Shape& shape) { return from_vec(v, shape); }
Tensor tensor(const std::vector<std::int64_t>& v, const Shape& shape) { return from_vec(v, shape); }
Tensor scalar_tensor(float value, Device device) { return full({}, value, DType::Float32, device); }

Tensor arange(std::int64_t n, DType dtype, Device device) {
  if (dtype == DType::Float32) {
    std::vector<float> v(n);
    for (std::int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i);
    return from_buffer(v.data(), {n}, device);
  }
  std::vector<std::int64_t> v(n);
  for (std::int64_t i = 0; i < n; ++i) v[i] = i;
  return from_buffer(v.data(), {n}, device);
}

Tensor randn(const Shape& shape, Generator* gen) {
  GeneratorGuard guard(gen);
  Generator& g = guard.get();
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = g.normal();
  return t;
}

Tensor rand(const Shape& shape, float lo, float hi, Generator* gen) {
  GeneratorGuard guard(gen);
  Generator& g = guard.get();
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  const float span = hi - lo;
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = lo + span * g.uniform();
  return t;
}

Tensor randint(std::int64_t high, const Shape& shape, Generator* gen) {
  if (high <= 0) throw ValueError(detail::concat("randint(): high must be > 0, got ", high));
  GeneratorGuard guard(gen);
  Generator& g = guard.get();
  Tensor t = Tensor::empty(shape, DType::Int64);
  auto* p = t.data<std::int64_t>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<std::int64_t>(g.below(static_cast<std::uint64_t>(high)));
  return t;
}

}  // namespace phalanx
