#pragma once
// What gloo_collectives.cpp and gloo_p2p.cpp share: Gloo's errors turned into Phalanx's
// (GlooBackend::guarded), the dtype dispatch and the reduction functions.
#include <gloo/common/error.h>
#include <gloo/algorithm.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "gloo_backend.hpp"
#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/half_sum.hpp"

namespace phalanx::gloo_backend {

template <typename Fn>
void GlooBackend::guarded(const char* op, std::uint64_t seq, Fn&& fn) {
  try {
    fn();
  } catch (const ::gloo::IoException& e) {
    const std::string what = e.what();
    const std::string ctx = describe(op, seq);
    // Gloo says "Timed out waiting ..." (async pairs) or "Read timeout" (sync pairs).
    const bool p2p = std::strcmp(op, "send") == 0 || std::strcmp(op, "recv") == 0;
    if (what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos)
      throw TimeoutError(ctx + " timed out after " + std::to_string(timeout().count() / 1000.0) +
                         " s: a peer did not take part (it may have exited, hung, or " +
                         (p2p ? "not posted the matching " + std::string(op[0] == 's' ? "recv" : "send") +
                                    " with this tag"
                              : std::string("issued a different sequence of collectives (sends and receives "
                                            "do not count)")) +
                         "); gloo: " + what);
    throw CommError(ctx + " failed: a peer closed its connection (the process may have died); gloo: " + what);
  } catch (const ::gloo::Exception& e) {
    throw CommError(describe(op, seq) + " failed: " + e.what());
  }
}

/// Dispatches on the tensor's dtype (16-bit floats travel as raw 16-bit words).
template <typename Fn>
void by_dtype(const Tensor& t, Fn&& fn) {
  switch (t.dtype()) {
    case DType::Float32: fn(static_cast<float*>(nullptr)); break;
    case DType::Int64: fn(static_cast<std::int64_t*>(nullptr)); break;
    case DType::Bool: fn(static_cast<std::uint8_t*>(nullptr)); break;  // moved, never reduced
    default: fn(static_cast<std::uint16_t*>(nullptr)); break;
  }
}

template <typename T>
::gloo::AllreduceOptions::Func reduce_fn(ReduceOp op) {
  using Raw = void (*)(void*, const void*, const void*, std::size_t);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return static_cast<Raw>(&::gloo::sum<T>);
    case ReduceOp::Product: return static_cast<Raw>(&::gloo::product<T>);
    case ReduceOp::Min: return static_cast<Raw>(&::gloo::min<T>);
    case ReduceOp::Max: return static_cast<Raw>(&::gloo::max<T>);
  }
  return static_cast<Raw>(&::gloo::sum<T>);
}

template <typename T>
const ::gloo::ReductionFunction<T>* reduction(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return ::gloo::ReductionFunction<T>::sum;
    case ReduceOp::Product: return ::gloo::ReductionFunction<T>::product;
    case ReduceOp::Min: return ::gloo::ReductionFunction<T>::min;
    case ReduceOp::Max: return ::gloo::ReductionFunction<T>::max;
  }
  return ::gloo::ReductionFunction<T>::sum;
}

/// Sums of 16-bit floats, c = a + b as Gloo's reduce functions take them (c may be a): widen,
/// add in float32, round back to nearest even; libphalanx's AVX2 code (phalanx/core/half_sum.hpp).
template <void (*Sum)(void*, void*, const void* const*, int, std::size_t)>
void sum16(void* c, const void* a, const void* b, std::size_t n) {
  const void* const src[2] = {a, b};
  Sum(c, nullptr, src, 2, n);
}

}  // namespace phalanx::gloo_backend
