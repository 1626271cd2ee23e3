#pragma once
// One number reduced over the group, for users' metrics (loss, accuracy, sample counts):
//
//   const double mean_loss = parallel::all_reduce_scalar(loss.item(), ReduceOp::Avg);
//   const std::int64_t seen = parallel::all_reduce_scalar(std::int64_t{n}, ReduceOp::Sum);
//
// Every rank of the group must call it, in the same order as its other collectives. The
// value travels as a one-element tensor on `device` (default: local_device(), the device
// init_process_group decided, so NCCL gets a CUDA tensor); the result is copied back.
// Floating values travel as float32 (the backends' float type), integers as int64 (exact).
#include <cstdint>
#include <type_traits>
#include <utility>

#include "phalanx/backends/process_group.hpp"

namespace phalanx::parallel {

/// Sum, Avg, Min, Max or Product of `value` over the group (default: the default group).
double all_reduce_scalar(double value, ReduceOp op = ReduceOp::Sum, ProcessGroupPtr pg = nullptr);
double all_reduce_scalar(double value, ReduceOp op, ProcessGroupPtr pg, Device device);
/// Exact integer version (Avg is refused: the mean of integers is not an integer; use the
/// double overload).
std::int64_t all_reduce_scalar(std::int64_t value, ReduceOp op = ReduceOp::Sum, ProcessGroupPtr pg = nullptr);
std::int64_t all_reduce_scalar(std::int64_t value, ReduceOp op, ProcessGroupPtr pg, Device device);

/// Any other integer (an `int` counter, a `std::size_t` count) takes the exact int64 path
/// instead of being ambiguous between the two above.
template <typename T, typename = std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool> &&
                                                  !std::is_same_v<T, std::int64_t>>>
std::int64_t all_reduce_scalar(T value, ReduceOp op = ReduceOp::Sum, ProcessGroupPtr pg = nullptr) {
  return all_reduce_scalar(static_cast<std::int64_t>(value), op, std::move(pg));
}
template <typename T, typename = std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool> &&
                                                  !std::is_same_v<T, std::int64_t>>>
std::int64_t all_reduce_scalar(T value, ReduceOp op, ProcessGroupPtr pg, Device device) {
  return all_reduce_scalar(static_cast<std::int64_t>(value), op, std::move(pg), device);
}

}  // namespace phalanx::parallel
