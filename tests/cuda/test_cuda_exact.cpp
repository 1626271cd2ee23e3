// Exact mode's kernels (abs max, fixed-point accumulate and convert) give the CPU's bits on
// CUDA, and a tensor of more than 2^31 elements is filled, scaled and summed right.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include <phalanx/core/kernels.hpp>

#include "support/gradcheck.hpp"

using namespace phalanx;
using phalanx::test::away_from_zero;

namespace {
const Device kGpu = Device::cuda(0);
}  // namespace

TEST_CASE("cuda: abs_max_into, fixed_point_accumulate and fixed_point_to_float equal the CPU bit for bit") {
  DeviceKernels& cpu = kernels_for(Device::cpu());
  DeviceKernels& gpu = kernels_for(kGpu);
  // abs max: into a slot holding less, into one holding more, of a tensor with a NaN, of a large one
  Tensor x = away_from_zero({100003}, 1);
  x.data<float>()[77777] = -123.25f;  // the largest magnitude is negative
  Tensor nan = away_from_zero({1000}, 2);
  nan.data<float>()[999] = std::numeric_limits<float>::quiet_NaN();
  const float neg_nan = -std::numeric_limits<float>::quiet_NaN();  // x86's 0/0: the sign bit set
  Tensor oc = tensor(std::vector<float>{0.5f, 1000.f, 0.f, neg_nan}, {4}), og = oc.to(kGpu);
  cpu.abs_max_into(x, oc, 0);
  gpu.abs_max_into(x.to(kGpu), og, 0);
  cpu.abs_max_into(x, oc, 1);
  gpu.abs_max_into(x.to(kGpu), og, 1);
  cpu.abs_max_into(nan, oc, 2);
  gpu.abs_max_into(nan.to(kGpu), og, 2);
  cpu.abs_max_into(x, oc, 3);  // a NaN already in the slot stays
  gpu.abs_max_into(x.to(kGpu), og, 3);
  const auto c = oc.to_vector<float>(), g = og.to(Device::cpu()).to_vector<float>();
  CHECK(g[0] == 123.25f);
  CHECK(c[0] == 123.25f);
  CHECK(g[1] == 1000.f);
  CHECK(c[1] == g[1]);
  CHECK(std::isnan(g[2]));
  CHECK(std::isnan(c[2]));
  CHECK(std::isnan(g[3]));
  CHECK(std::isnan(c[3]));

  // fixed point: three accumulations, then the conversion back
  const double scale = std::ldexp(1.0, 30);
  Tensor ac = zeros({100003}, DType::Int64), ag = ac.to(kGpu);
  for (int k = 0; k < 3; ++k) {
    Tensor v = away_from_zero({100003}, 10 + k);
    cpu.fixed_point_accumulate(v, scale, ac);
    gpu.fixed_point_accumulate(v.to(kGpu), scale, ag);
  }
  CHECK(ag.to(Device::cpu()).to_vector<std::int64_t>() == ac.to_vector<std::int64_t>());
  Tensor fc = Tensor::empty({100003}), fg = Tensor::empty({100003}, DType::Float32, kGpu);
  cpu.fixed_point_to_float(ac, scale, 3.0, fc);
  gpu.fixed_point_to_float(ag, scale, 3.0, fg);
  CHECK(fg.to(Device::cpu()).to_vector<float>() == fc.to_vector<float>());
}

TEST_CASE("cuda: a tensor of 2^31 + 5 float32 elements (8 GiB) is filled, scaled and summed") {
  const std::int64_t n = (std::int64_t{1} << 31) + 5;
  Tensor x;
  try {
    x = ones({n}, DType::Float32, kGpu);
  } catch (const Error& e) {
    MESSAGE("SKIPPED: cannot allocate 8 GiB on cuda:0: " << e.what());
    return;
  }
  // double partial sums: 2^31 + 5 exactly, which rounds to 2^31 as a float
  CHECK(sum(x).item() == 2147483648.f);
  x.mul_(0.5f);
  CHECK(x.narrow_rows(n - 6, n).to(Device::cpu()).to_vector<float>() == std::vector<float>(6, 0.5f));
  CHECK(x.narrow_rows(std::int64_t{1} << 31, (std::int64_t{1} << 31) + 1).item() == 0.5f);
  x.narrow_rows(n - 1, n).fill_(1000.f);  // an element past 2^31, then the sum sees it
  CHECK(sum(x).item() == 1073742848.f);   // 1073741826.5 + 999.5 = 1073742826, to float (step 128)
}
