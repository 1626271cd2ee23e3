#pragma once
// Shared helpers for op implementations: argument checks and output allocation.
#include <string>

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/ops.hpp"
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

/// A view of x's storage: `shape` and element `strides`, starting `element_offset` elements
/// after x's first element; no history (the view op records its own node).
Tensor make_view(const Tensor& x, Shape shape, std::vector<std::int64_t> strides, std::int64_t element_offset);
/// A contiguous copy of a view's values, outside autograd (layout_ops.cpp).
Tensor materialize(const Tensor& x);
/// Writes `src` (contiguous, dst's numel; or one element, repeated) through the strides of
/// the view `dst` into its storage (copy_/fill_ on a view). `op` names the caller in errors.
void write_through(const Tensor& src, const Tensor& dst, const char* op);

/// The one way an op takes a tensor input: kernels see contiguous tensors, so a view is
/// materialised here, differentiably (its gradient flows back through the view). A
/// contiguous (or undefined) tensor passes through untouched.
inline Tensor contiguous_input(const Tensor& t) {
  return !t.defined() || t.impl()->is_contiguous() ? t : phalanx::contiguous(t);
}

/// The backward nodes of view ops (permute, reshape, contiguous) take a gradient that is a
/// view and pass on a view where one exists: the engine materialises a strided gradient
/// only for other nodes. So split's gradient, assembled in the layout of a permuted input,
/// becomes contiguous again through permute's backward without a copy.
class StridedGradientNode : public Node {};
inline bool takes_strided_gradient(const Node& n) { return dynamic_cast<const StridedGradientNode*>(&n) != nullptr; }

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
