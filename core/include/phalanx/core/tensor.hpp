#pragma once
// Tensor: a handle (shared ownership) to a strided view of a Storage (a byte offset, a shape
// and element strides, as PyTorch's), with autograd metadata. Copying a Tensor aliases it, as
// in PyTorch. Kernels, data<T>() and raw_data() need contiguous tensors (docs/transformer_ops.md, "Views").
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "phalanx/core/device.hpp"
#include "phalanx/core/dtype.hpp"
#include "phalanx/core/shape.hpp"

namespace phalanx {

class Node;
class TensorImpl;
class Tensor;

/// Called after a leaf's gradient has been accumulated during backward (DDP's trigger).
using GradAccumulatedHook = std::function<void(const Tensor& leaf)>;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  /// Uninitialised tensor (the fast path for outputs that are fully written).
  static Tensor empty(const Shape& shape, DType dtype = DType::Float32,
                      Device device = Device::cpu());

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  std::int64_t size(std::int64_t dim) const;
  std::int64_t dim() const;
  std::int64_t numel() const;
  DType dtype() const;
  Device device() const;
  std::size_t nbytes() const;
  /// Element strides, one per dim (PyTorch's Tensor.stride()).
  const std::vector<std::int64_t>& strides() const;
  std::int64_t stride(std::int64_t dim) const;
  /// PyTorch's rule: row-major strides, size-1 dims' strides ignored; an empty tensor is contiguous.
  bool is_contiguous() const;
  /// Offset of the first element from the storage's start, in elements.
  std::int64_t storage_offset() const;
  /// Itself when contiguous, else a contiguous copy (differentiable: phalanx::contiguous).
  Tensor contiguous() const;

  /// Typed host pointer to the first element; checks that T matches the dtype, that the
  /// tensor is in host memory (a CUDA or sim tensor throws TypeError: copy it to the CPU) and
  /// that it is contiguous (a view throws TypeError: call .contiguous() first).
  template <typename T> T* data() const;
  /// The first element's address on the tensor's own device (a device pointer for CUDA and
  /// sim tensors: for kernels, plugins and byte copies through the device's kernel table).
  /// A non-contiguous view throws TypeError: call .contiguous() first.
  void* raw_data() const;
  /// Value of a one-element tensor (copied to the host if needed).
  float item() const;
  std::int64_t item_int() const;
  template <typename T> std::vector<T> to_vector() const;

  // ---- autograd ----
  bool requires_grad() const;
  /// Marks a leaf as requiring gradients. Throws on a non-leaf.
  Tensor& requires_grad_(bool on = true);
  bool is_leaf() const;
  /// The accumulated gradient (undefined before the first backward / after zero_grad(set_to_none)).
  Tensor grad() const;
  void set_grad(const Tensor& g) const;
  const std::shared_ptr<Node>& grad_fn() const;
  /// Backpropagates from this tensor. A scalar needs no `gradient`.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  /// Same storage and strides, no history.
  Tensor detach() const;
  /// Registers a hook run right after this leaf's gradient is accumulated; returns a handle
  /// for remove_grad_accumulated_hook.
  std::uint64_t register_grad_accumulated_hook(GradAccumulatedHook hook) const;
  void remove_grad_accumulated_hook(std::uint64_t handle) const;
  /// Asks the op that produces this leaf's first gradient of a backward pass to write it
  /// into `destination` (same shape; undefined clears it). The gradient then lives there
  /// without a copy, unless the leaf is reached along several paths.
  void set_grad_destination(const Tensor& destination) const;

  // ---- shape and copies ----
  /// A view when the strides allow one, else a contiguous copy (torch.reshape).
  Tensor reshape(const Shape& shape) const;
  /// Always a view; throws ShapeError when the strides do not allow one (torch.view).
  Tensor view(const Shape& shape) const;
  Tensor flatten(std::int64_t start_dim = 1) const;
  Tensor transpose(std::int64_t d0, std::int64_t d1) const;  ///< a view
  Tensor t() const { return transpose(0, 1); }
  /// A contiguous copy of the values (outside autograd).
  Tensor clone() const;
  Tensor to(Device device) const;
  /// Rows [begin, end) along dim 0, sharing storage (no copy).
  Tensor narrow_rows(std::int64_t begin, std::int64_t end) const;

  // ---- in-place, outside autograd (optimizers, initialisation, DDP) ----
  // zero_, fill_ and copy_ write through a view's strides into its base; add_ and mul_ need a
  // contiguous tensor (a view throws TypeError).
  Tensor& zero_();
  Tensor& fill_(double value);
  Tensor& copy_(const Tensor& src);
  Tensor& add_(const Tensor& other, float alpha = 1.0f);
  Tensor& mul_(float factor);

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  /// Short description: "Tensor[2, 3] float32 cpu".
  std::string str() const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

/// The values as PyTorch 1.13 prints them ("tensor([[ 0.1000, -2.0000], ..."; summarised past 1000
/// elements; device/dtype/grad suffixes); str() is the short description.
std::ostream& operator<<(std::ostream& os, const Tensor& t);

namespace detail {
/// Throws the TypeError of data<T>()/raw_data() on a non-contiguous view.
[[noreturn]] void throw_not_contiguous(const char* what, const Tensor& t);
}  // namespace detail

}  // namespace phalanx

#include "phalanx/core/tensor_impl.hpp"
