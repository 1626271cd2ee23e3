// The transformer ops on CUDA (core/cuda/cuda_layout.cu): batched matmul at pointer offsets,
// permute/cat/split through the strided copy, masked_fill, tril/triu and Bool tensors, equal
// to the CPU (layout ops bit for bit: they only move bytes).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "support/gradcheck.hpp"
#include "support/same_on_device.hpp"

using namespace phalanx;
using phalanx::test::same_bits;
using phalanx::test::away_from_zero;
using phalanx::test::max_rel_err;

namespace {
const Device kGpu = Device::cuda(0);

/// f on CPU inputs and on their CUDA copies: output and input gradients within `tol` (0: the same bits).
void same_on_gpu(const phalanx::test::Fn& f, std::vector<Tensor> cpu, double tol = 0) {
  phalanx::test::same_on_device(kGpu, f, std::move(cpu), tol);
}

}  // namespace

TEST_CASE("cuda: batched and broadcast matmul match the CPU") {
  same_on_gpu([](auto& in) { return matmul(in[0], in[1]); }, {away_from_zero({2, 3, 7, 8}, 1), away_from_zero({2, 3, 8, 5}, 2)},
              1e-5);
  same_on_gpu([](auto& in) { return matmul(in[0], in[1]); }, {away_from_zero({7, 8}, 3), away_from_zero({4, 8, 5}, 4)}, 1e-5);
  same_on_gpu([](auto& in) { return matmul(in[0], in[1]); }, {away_from_zero({4, 7, 8}, 5), away_from_zero({8}, 6)}, 1e-5);
  same_on_gpu([](auto& in) { return matmul(in[0], in[1]); }, {away_from_zero({2, 1, 3, 4}, 7), away_from_zero({1, 3, 4, 2}, 8)},
              1e-5);
}

TEST_CASE("cuda: permute, cat, stack, split and chunk move the same bytes as the CPU") {
  same_on_gpu([](auto& in) { return permute(in[0], {0, 2, 1, 3}); }, {away_from_zero({2, 9, 3, 4}, 10)});
  same_on_gpu([](auto& in) { return permute(in[0], {1, 0}); }, {away_from_zero({37, 53}, 11)});
  same_on_gpu([](auto& in) { return transpose(in[0], 2, 3); }, {away_from_zero({2, 3, 5, 7}, 12)});
  same_on_gpu([](auto& in) { return cat({in[0], in[1]}, 1); }, {away_from_zero({2, 3, 4}, 13), away_from_zero({2, 5, 4}, 14)});
  same_on_gpu([](auto& in) { return stack({in[0], in[1]}, 2); }, {away_from_zero({2, 3}, 15), away_from_zero({2, 3}, 16)});
  same_on_gpu([](auto& in) {
    auto p = split(in[0], 4, 2);
    return add(p[0], mul(p[2], 3.f));
  }, {away_from_zero({2, 3, 12}, 17)});
  same_on_gpu([](auto& in) { return chunk(in[0], 3, 1)[1]; }, {away_from_zero({2, 9}, 18)});
  Tensor i64 = arange(60, DType::Int64).reshape({3, 4, 5});
  CHECK(same_bits(permute(i64.to(kGpu), {2, 0, 1}), permute(i64, {2, 0, 1})));
  Tensor h = to_dtype(away_from_zero({3, 4, 5}, 19), DType::Float16);
  CHECK(same_bits(permute(h.to(kGpu), {1, 2, 0}), permute(h, {1, 2, 0})));
}

TEST_CASE("cuda: Bool masks, masked_fill and tril/triu") {
  Tensor m = tril(ones({5, 5}, DType::Bool, kGpu));
  CHECK(same_bits(m, tril(ones({5, 5}, DType::Bool))));
  CHECK(same_bits(permute(m, {1, 0}), triu(ones({5, 5}, DType::Bool))));
  CHECK(same_bits(full({257}, 2.0, DType::Bool, kGpu), ones({257}, DType::Bool)));
  Tensor causal = triu(ones({6, 6}, DType::Bool), 1);
  same_on_gpu([](auto& in) { return masked_fill(in[0], in[1], -INFINITY); }, {away_from_zero({2, 3, 6, 6}, 20), causal});
  Tensor pad = tril(ones({2, 6}, DType::Bool), 2).reshape({2, 1, 1, 6});  // [B, 1, 1, S] padding
  same_on_gpu([](auto& in) { return masked_fill(in[0], in[1], 0.f); }, {away_from_zero({2, 3, 6, 6}, 21), pad});
  same_on_gpu([](auto& in) { return tril(in[0], -1); }, {away_from_zero({2, 5, 7}, 22)});
  same_on_gpu([](auto& in) { return triu(in[0], 2); }, {away_from_zero({7, 5}, 23)});
}
