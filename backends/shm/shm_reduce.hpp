#pragma once
// The shm backend's reductions: element-wise over W sources in a FIXED order (source 0, then
// 1, ..., W-1), so every rank and every run computes the same bits whatever the message
// size or the algorithm (whole message by every rank, or each rank its 1/W slice).
#include <cstddef>

#include "phalanx/backends/reduce_op.hpp"
#include "phalanx/core/dtype.hpp"

namespace phalanx::shm {

/// dst[i] = src[0][i] op src[1][i] op ... op src[nsrc-1][i]; Avg divides the sum by
/// `divisor` (float32 only). float16/bfloat16 (sum only) accumulate in float32 and round
/// once. dst may be one of the sources; dst2 (optional) receives a second copy. The work
/// runs in L1-sized blocks through a private buffer, so the inner loops vectorise.
void reduce_into(DType dtype, ReduceOp op, void* dst, void* dst2, const void* const* src, int nsrc, std::size_t n,
                 int divisor);
/// The same into `ndst` destinations (each may be one of the sources, none another's overlap).
void reduce_into_all(DType dtype, ReduceOp op, void* const* dst, int ndst, const void* const* src, int nsrc,
                     std::size_t n, int divisor);

}  // namespace phalanx::shm
