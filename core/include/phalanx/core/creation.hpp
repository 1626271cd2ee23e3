#pragma once
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "phalanx/core/generator.hpp"
#include "phalanx/core/tensor.hpp"

namespace phalanx {

Tensor zeros(const Shape& shape, DType dtype = DType::Float32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::Float32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::Float32,
            Device device = Device::cpu());
/// [0, 1, ..., n-1]
Tensor arange(std::int64_t n, DType dtype = DType::Float32, Device device = Device::cpu());
/// Copies `count` elements from host memory.
Tensor from_buffer(const float* data, const Shape& shape, Device device = Device::cpu());
Tensor from_buffer(const std::int64_t* data, const Shape& shape, Device device = Device::cpu());
Tensor tensor(const std::vector<float>& values, const Shape& shape);
Tensor tensor(const std::vector<std::int64_t>& values, const Shape& shape);
Tensor scalar_tensor(float value, Device device = Device::cpu());

/// Standard normal / uniform [lo, hi) from `gen` (default generator when null).
Tensor randn(const Shape& shape, Generator* gen = nullptr);
Tensor rand(const Shape& shape, float lo = 0.f, float hi = 1.f, Generator* gen = nullptr);
/// Uniform integers in [0, high).
Tensor randint(std::int64_t high, const Shape& shape, Generator* gen = nullptr);

}  // namespace phalanx
