#pragma once
// Shared helpers for op implementations: argument checks and output allocation.
#include <string>

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/tensor.hpp"

namespace phalanx::ops_detail {

inline void check_defined(const Tensor& t, const char* op, const char* arg) {
  if (!t.defined()) throw ValueError(detail::concat(op, ": argument '", arg, "' is undefined"));
}

inline void check_float(const Tensor& t, const char* op, const char* arg = "input") {
  check_defined(t, op, arg);
  if (t.dtype() != DType::Float32)
    throw TypeError(detail::concat(op, ": '", arg, "' must be float32, got ", dtype_name(t.dtype()),
                                   " ", shape_str(t.shape())));
}

inline void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  if (a.device() != b.device())
    throw TypeError(detail::concat(op, ": tensors are on different devices (", a.device().str(),
                                   " and ", b.device().str(), "); move one with .to()"));
}

/// Output of the same shape and device as `like`.
inline Tensor empty_like(const Tensor& like) {
  return Tensor::empty(like.shape(), like.dtype(), like.device());
}

/// Whether gradient input `i` of `node` is wanted by the graph.
inline bool needs_grad(const Node& node, std::size_t i) {
  return i < node.next_edges.size() && node.next_edges[i].valid();
}

/// Sums `g` down to `shape` (the inverse of suffix broadcasting).
Tensor reduce_to(const Tensor& g, const Shape& shape);

}  // namespace phalanx::ops_detail
