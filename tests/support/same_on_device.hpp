#pragma once
// A device against the CPU: run one function on CPU tensors and on their copies on another
// device (the sim plugin, CUDA) and compare the outputs and the input gradients.
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "support/gradcheck.hpp"

namespace phalanx::test {

/// Same bytes (NaN payloads and signed zeros included); a view is compared by its values.
inline bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous().to(Device::cpu()), y = b.contiguous().to(Device::cpu());
  if (x.shape() != y.shape() || x.dtype() != y.dtype()) return false;
  return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

/// Runs f on the CPU inputs `cpu` and on their copies on `device`. The output (bit for bit when
/// it is not float32) and the gradients of the float32 inputs under one random upstream
/// gradient agree: the same bits when `tol` is 0, else within `tol` by max_rel_err. An output
/// that needs no gradient ends the check after the forward.
inline void same_on_device(Device device, const Fn& f, std::vector<Tensor> cpu, double tol = 0) {
  std::vector<Tensor> dev;
  for (auto& t : cpu) {
    dev.push_back(t.to(device));
    if (t.dtype() == DType::Float32) {
      t.requires_grad_();
      dev.back().requires_grad_();
    }
  }
  const auto agree = [tol](const Tensor& got, const Tensor& want) {
    if (tol == 0 || want.dtype() != DType::Float32)
      CHECK(same_bits(got, want));
    else
      CHECK(max_rel_err(got.to(Device::cpu()), want) < tol);
  };
  Tensor yc = f(cpu), yd = f(dev);
  CHECK(yd.device() == device);
  agree(yd, yc);
  if (!yc.requires_grad()) return;
  Generator g(1);
  Tensor r = randn(yc.shape(), &g);
  yc.backward(r);
  yd.backward(r.to(device));
  for (std::size_t i = 0; i < cpu.size(); ++i)
    if (cpu[i].dtype() == DType::Float32) {
      REQUIRE(dev[i].grad().defined());
      CHECK(dev[i].grad().device() == device);
      agree(dev[i].grad(), cpu[i].grad());
    }
}

}  // namespace phalanx::test
