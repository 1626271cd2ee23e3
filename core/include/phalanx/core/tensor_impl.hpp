#pragma once
// The state behind a Tensor handle. Public so device and communication plugins can
// reach storage; user code normally goes through Tensor.
#include <memory>
#include <vector>

#include "phalanx/core/error.hpp"
#include "phalanx/core/storage.hpp"
#include "phalanx/core/tensor.hpp"

namespace phalanx {

class AccumulateGrad;

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;              // non-leaf: the node that made it
  std::weak_ptr<AccumulateGrad> accumulator;  // leaf: created on first use
  std::vector<std::pair<std::uint64_t, GradAccumulatedHook>> hooks;
  // Where this leaf's first gradient of a pass should be written (DDP points it at the
  // leaf's slice of a bucket): the op producing the gradient writes there directly, so
  // the gradient is not copied. See autograd::gradient_buffer.
  Tensor grad_destination;
};

/// Row-major (contiguous) element strides of `shape`.
inline std::vector<std::int64_t> contiguous_strides(const Shape& shape) {
  std::vector<std::int64_t> st(shape.size());
  std::int64_t acc = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    // saturate: an empty tensor may have dims whose product overflows (its strides never
    // address memory); a non-empty one was checked for overflow where its shape was made
    if (__builtin_mul_overflow(acc, shape[i] > 1 ? shape[i] : 1, &acc)) acc = INT64_MAX;
  }
  return st;
}

/// PyTorch's rule: the strides are row-major's, ignoring dims of size 1; an empty tensor is
/// contiguous.
inline bool strides_are_contiguous(const Shape& shape, const std::vector<std::int64_t>& strides) {
  for (const std::int64_t d : shape)
    if (d == 0) return true;
  std::int64_t expected = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

class TensorImpl {
 public:
  /// A contiguous (row-major) view.
  TensorImpl(std::shared_ptr<Storage> storage, std::size_t byte_offset, Shape shape, DType dtype)
      : storage_(std::move(storage)), offset_(byte_offset), shape_(std::move(shape)),
        strides_(contiguous_strides(shape_)), numel_(numel_of(shape_)), dtype_(dtype), contiguous_(true) {}
  /// A view with element strides (>= 0; 0 repeats an element, as expand does).
  TensorImpl(std::shared_ptr<Storage> storage, std::size_t byte_offset, Shape shape,
             std::vector<std::int64_t> strides, DType dtype)
      : storage_(std::move(storage)), offset_(byte_offset), shape_(std::move(shape)),
        strides_(std::move(strides)), numel_(numel_of(shape_)), dtype_(dtype),
        contiguous_(strides_are_contiguous(shape_, strides_)) {}

  const Shape& shape() const { return shape_; }
  /// Element strides, one per dim.
  const std::vector<std::int64_t>& strides() const { return strides_; }
  bool is_contiguous() const { return contiguous_; }
  std::int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_->device(); }
  void* data() const { return static_cast<char*>(storage_->data()) + offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  std::size_t byte_offset() const { return offset_; }

  /// Points this tensor at other storage that holds its values row-major from `byte_offset`
  /// (as Tensor::to writes them; Module::to moves parameters this way, so every handle to
  /// them, an optimizer's included, sees the move). A view becomes contiguous: its old
  /// strides described the old storage.
  void set_storage(std::shared_ptr<Storage> storage, std::size_t byte_offset) {
    storage_ = std::move(storage);
    offset_ = byte_offset;
    strides_ = contiguous_strides(shape_);
    contiguous_ = true;
  }

  AutogradMeta* autograd() const { return autograd_.get(); }
  AutogradMeta& ensure_autograd() {
    if (!autograd_) autograd_ = std::make_unique<AutogradMeta>();
    return *autograd_;
  }

 private:
  std::shared_ptr<Storage> storage_;
  std::size_t offset_;
  Shape shape_;
  std::vector<std::int64_t> strides_;
  std::int64_t numel_;
  DType dtype_;
  bool contiguous_;
  std::unique_ptr<AutogradMeta> autograd_;
};

template <typename T>
T* Tensor::data() const {
  if (!impl_) throw ValueError("data(): the tensor is undefined");
  if (impl_->dtype() != dtype_of<T>::value)
    throw TypeError(detail::concat("data<T>(): tensor is ", dtype_name(impl_->dtype()),
                                   ", asked for ", dtype_name(dtype_of<T>::value)));
  if (!impl_->device().is_cpu())
    throw TypeError(detail::concat("data<T>(): ", str(), " is not in host memory; copy it first with "
                                   ".to(Device::cpu()) (or read it with item()/to_vector())"));
  if (!impl_->is_contiguous()) detail::throw_not_contiguous("data<T>()", *this);
  return static_cast<T*>(impl_->data());
}

}  // namespace phalanx
