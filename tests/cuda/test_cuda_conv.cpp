// Every convolution and pooling kernel on CUDA against the CPU (im2col, col2im, the channel
// bias, max/avg/adaptive-avg pooling and their backward), through the ops that use them:
// outputs and input gradients within float tolerance, over strides, padding, dilation,
// groups and odd sizes (partial windows, more than one block per image).
#include <doctest/doctest.h>

#include "support/gradcheck.hpp"
#include "support/same_on_device.hpp"

using namespace phalanx;
using phalanx::test::away_from_zero;

namespace {
const Device kGpu = Device::cuda(0);
void same_on_gpu(const phalanx::test::Fn& f, std::vector<Tensor> cpu, double tol = 1e-5) {
  phalanx::test::same_on_device(kGpu, f, std::move(cpu), tol);
}
}  // namespace

TEST_CASE("cuda: conv2d (im2col, col2im, channel bias) and its gradients match the CPU") {
  // plain, bias; stride and padding; dilation; groups; a 1x1; an image larger than a block
  same_on_gpu([](auto& in) { return conv2d(in[0], in[1]); }, {away_from_zero({2, 3, 7, 6}, 1), away_from_zero({4, 3, 3, 3}, 2)});
  same_on_gpu([](auto& in) { return conv2d(in[0], in[1], in[2]); },
              {away_from_zero({2, 3, 7, 6}, 3), away_from_zero({4, 3, 3, 3}, 4), away_from_zero({4}, 5)});
  same_on_gpu([](auto& in) { return conv2d(in[0], in[1], in[2], {2, 1}, {1, 2}); },
              {away_from_zero({3, 2, 9, 8}, 6), away_from_zero({5, 2, 3, 2}, 7), away_from_zero({5}, 8)});
  same_on_gpu([](auto& in) { return conv2d(in[0], in[1], in[2], 1, 2, 2); },
              {away_from_zero({1, 2, 10, 9}, 9), away_from_zero({3, 2, 3, 3}, 10), away_from_zero({3}, 11)});
  same_on_gpu([](auto& in) { return conv2d(in[0], in[1], in[2], 1, 1, 1, 2); },
              {away_from_zero({2, 4, 6, 6}, 12), away_from_zero({6, 2, 3, 3}, 13), away_from_zero({6}, 14)});
  same_on_gpu([](auto& in) { return conv2d(in[0], in[1], in[2]); },
              {away_from_zero({2, 8, 5, 5}, 15), away_from_zero({3, 8, 1, 1}, 16), away_from_zero({3}, 17)});
  same_on_gpu([](auto& in) { return conv2d(in[0], in[1], in[2], 1, 1); },
              {away_from_zero({2, 3, 40, 37}, 18), away_from_zero({8, 3, 3, 3}, 19), away_from_zero({8}, 20)}, 1e-4);
}

TEST_CASE("cuda: max, avg and adaptive avg pooling and their gradients match the CPU") {
  same_on_gpu([](auto& in) { return max_pool2d(in[0], 2); }, {away_from_zero({2, 3, 8, 7}, 30)});
  same_on_gpu([](auto& in) { return max_pool2d(in[0], 3, 2, 1); }, {away_from_zero({2, 3, 9, 10}, 31)});
  same_on_gpu([](auto& in) { return max_pool2d(in[0], 2, 1, 0, 2); }, {away_from_zero({1, 2, 7, 7}, 32)});
  same_on_gpu([](auto& in) { return avg_pool2d(in[0], 2); }, {away_from_zero({2, 3, 8, 7}, 33)});
  same_on_gpu([](auto& in) { return avg_pool2d(in[0], 3, 2, 1); }, {away_from_zero({2, 3, 9, 10}, 34)});
  same_on_gpu([](auto& in) { return avg_pool2d(in[0], 3, 2, 1, false); }, {away_from_zero({2, 3, 9, 10}, 35)});
  same_on_gpu([](auto& in) { return adaptive_avg_pool2d(in[0], {3, 2}); }, {away_from_zero({2, 3, 8, 7}, 36)});
  same_on_gpu([](auto& in) { return adaptive_avg_pool2d(in[0], 1); }, {away_from_zero({2, 5, 6, 6}, 37)});
  same_on_gpu([](auto& in) { return adaptive_avg_pool2d(in[0], 4); }, {away_from_zero({1, 2, 10, 9}, 38)});
}
