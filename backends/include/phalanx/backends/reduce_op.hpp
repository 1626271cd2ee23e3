#pragma once
#include <cstdint>

namespace phalanx {

/// Reductions for allreduce / reduce / reduce_scatter. Avg is the sum divided by the world
/// size once, after the sum (float32 only).
enum class ReduceOp : std::uint8_t { Sum, Avg, Min, Max, Product };

const char* reduce_op_name(ReduceOp op);

}  // namespace phalanx
