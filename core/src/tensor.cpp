#include "phalanx/core/tensor.hpp"

#include <atomic>
#include <ostream>

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/ops.hpp"
#include "ops/op_support.hpp"

namespace phalanx {

namespace {
const TensorImpl& need(const std::shared_ptr<TensorImpl>& impl, const char* what) {
  if (!impl) throw ValueError(std::string(what) + ": the tensor is undefined");
  return *impl;
}
const std::shared_ptr<Node> kNoNode;
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (auto d : shape)
    if (d < 0) throw ValueError("Tensor::empty: negative dimension in shape " + shape_str(shape));
  const std::size_t nbytes = static_cast<std::size_t>(numel_of(shape)) * element_size(dtype);
  auto storage = std::make_shared<Storage>(nbytes, device);
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), 0, shape, dtype));
}

const Shape& Tensor::shape() const { return need(impl_, "shape()").shape(); }
std::int64_t Tensor::dim() const { return static_cast<std::int64_t>(shape().size()); }
std::int64_t Tensor::size(std::int64_t d) const { return shape()[normalize_dim(d, shape().size(), "size")]; }
std::int64_t Tensor::numel() const { return need(impl_, "numel()").numel(); }
DType Tensor::dtype() const { return need(impl_, "dtype()").dtype(); }
Device Tensor::device() const { return need(impl_, "device()").device(); }
std::size_t Tensor::nbytes() const { return static_cast<std::size_t>(numel()) * element_size(dtype()); }
void* Tensor::raw_data() const {
  const TensorImpl& i = need(impl_, "raw_data()");
  if (!i.is_contiguous()) detail::throw_not_contiguous("raw_data()", *this);
  return i.data();
}
const std::vector<std::int64_t>& Tensor::strides() const { return need(impl_, "strides()").strides(); }
std::int64_t Tensor::stride(std::int64_t d) const {
  return strides()[normalize_dim(d, shape().size(), "stride")];
}
bool Tensor::is_contiguous() const { return need(impl_, "is_contiguous()").is_contiguous(); }
std::int64_t Tensor::storage_offset() const {
  const TensorImpl& i = need(impl_, "storage_offset()");
  return static_cast<std::int64_t>(i.byte_offset() / element_size(i.dtype()));
}
Tensor Tensor::contiguous() const { return phalanx::contiguous(*this); }

namespace detail {
void throw_not_contiguous(const char* what, const Tensor& t) {
  std::string st;
  for (std::size_t i = 0; i < t.strides().size(); ++i) st += (i ? ", " : "") + std::to_string(t.strides()[i]);
  throw TypeError(concat(what, ": ", t.str(), " is a non-contiguous view (strides (", st,
                         ")); call .contiguous() first"));
}
}  // namespace detail

float Tensor::item() const {
  if (numel() != 1)
    throw ShapeError("item(): expected a tensor with one element, got shape " + shape_str(shape()));
  if (dtype() == DType::Int64 || dtype() == DType::Bool) return static_cast<float>(item_int());
  if (dtype() != DType::Float32)
    throw TypeError(std::string("item(): convert a ") + dtype_name(dtype()) + " tensor to float32 first");
  float v;
  kernels_for(device()).copy_to_host(&v, raw_data(), sizeof v);
  return v;
}

std::int64_t Tensor::item_int() const {
  if (numel() != 1)
    throw ShapeError("item_int(): expected a tensor with one element, got shape " +
                     shape_str(shape()));
  if (dtype() == DType::Float32) return static_cast<std::int64_t>(item());
  if (dtype() == DType::Bool) {
    std::uint8_t b;
    kernels_for(device()).copy_to_host(&b, raw_data(), 1);
    return b != 0;
  }
  if (dtype() != DType::Int64)
    throw TypeError(std::string("item_int(): convert a ") + dtype_name(dtype()) + " tensor to float32 first");
  std::int64_t v;
  kernels_for(device()).copy_to_host(&v, raw_data(), sizeof v);
  return v;
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  if (dtype() != dtype_of<T>::value)
    throw TypeError(detail::concat("to_vector<T>(): tensor is ", dtype_name(dtype()),
                                   ", asked for ", dtype_name(dtype_of<T>::value)));
  std::vector<T> out(static_cast<std::size_t>(numel()));
  if (!is_contiguous()) return ops_detail::materialize(*this).to_vector<T>();
  kernels_for(device()).copy_to_host(out.data(), raw_data(), nbytes());
  return out;
}
// std::vector<bool> packs bits: the bytes go through a staging vector.
template <>
std::vector<bool> Tensor::to_vector<bool>() const {
  if (dtype() != DType::Bool)
    throw TypeError(detail::concat("to_vector<T>(): tensor is ", dtype_name(dtype()), ", asked for bool"));
  if (!is_contiguous()) return ops_detail::materialize(*this).to_vector<bool>();
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(numel()));
  kernels_for(device()).copy_to_host(bytes.data(), raw_data(), nbytes());
  return std::vector<bool>(bytes.begin(), bytes.end());
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<std::int64_t> Tensor::to_vector<std::int64_t>() const;

// ---- autograd ----
bool Tensor::requires_grad() const {
  const AutogradMeta* m = need(impl_, "requires_grad()").autograd();
  return m && (m->requires_grad || m->grad_fn);
}

Tensor& Tensor::requires_grad_(bool on) {
  AutogradMeta& m = impl_->ensure_autograd();
  if (m.grad_fn)
    throw AutogradError("requires_grad_(): only leaf tensors can change requires_grad; use "
                        "detach() to make a leaf from a computed tensor");
  if (on && dtype() != DType::Float32 && dtype() != DType::BFloat16 && dtype() != DType::Float16)
    throw TypeError("requires_grad_(): only floating tensors (float32, bfloat16, float16) can require gradients");
  m.requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const {
  const AutogradMeta* m = need(impl_, "is_leaf()").autograd();
  return !m || !m->grad_fn;
}

Tensor Tensor::grad() const {
  const AutogradMeta* m = need(impl_, "grad()").autograd();
  return m ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined() && (g.shape() != shape() || g.dtype() != dtype()))
    throw ShapeError("set_grad(): gradient of shape " + shape_str(g.shape()) +
                     " does not match tensor of shape " + shape_str(shape()));
  impl_->ensure_autograd().grad = g;
}

const std::shared_ptr<Node>& Tensor::grad_fn() const {
  const AutogradMeta* m = need(impl_, "grad_fn()").autograd();
  return m ? m->grad_fn : kNoNode;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward({*this}, {gradient}, retain_graph);
}

Tensor Tensor::detach() const {
  const TensorImpl& i = need(impl_, "detach()");
  return Tensor(std::make_shared<TensorImpl>(i.storage(), i.byte_offset(), i.shape(), i.strides(), i.dtype()));
}

std::uint64_t Tensor::register_grad_accumulated_hook(GradAccumulatedHook hook) const {
  if (!is_leaf() || !requires_grad())
    throw AutogradError("register_grad_accumulated_hook(): only leaves that require grad "
                        "accumulate gradients");
  static std::atomic<std::uint64_t> next{1};
  const std::uint64_t id = next.fetch_add(1);
  impl_->ensure_autograd().hooks.emplace_back(id, std::move(hook));
  return id;
}

void Tensor::set_grad_destination(const Tensor& destination) const {
  if (destination.defined() && (destination.shape() != shape() || destination.dtype() != dtype()))
    throw ShapeError("set_grad_destination(): " + destination.str() + " does not match " + str());
  impl_->ensure_autograd().grad_destination = destination;
}

void Tensor::remove_grad_accumulated_hook(std::uint64_t handle) const {
  AutogradMeta* m = impl_ ? impl_->autograd() : nullptr;
  if (!m) return;
  auto& hooks = m->hooks;
  for (auto it = hooks.begin(); it != hooks.end(); ++it)
    if (it->first == handle) {
      hooks.erase(it);
      return;
    }
}

// ---- shape and copies ----
Tensor Tensor::reshape(const Shape& s) const { return phalanx::reshape(*this, s); }
Tensor Tensor::view(const Shape& s) const { return phalanx::view(*this, s); }
Tensor Tensor::transpose(std::int64_t d0, std::int64_t d1) const {
  return phalanx::transpose(*this, d0, d1);
}

Tensor Tensor::flatten(std::int64_t start_dim) const {
  const int sd = normalize_dim(start_dim, shape().size(), "flatten");
  Shape s(shape().begin(), shape().begin() + sd);
  std::int64_t rest = 1;
  for (std::size_t i = sd; i < shape().size(); ++i) rest *= shape()[i];
  s.push_back(rest);
  return reshape(s);
}

Tensor Tensor::clone() const {
  if (!is_contiguous()) return ops_detail::materialize(*this);
  Tensor out = Tensor::empty(shape(), dtype(), device());
  kernels_for(device()).copy(out.raw_data(), raw_data(), nbytes());
  return out;
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  if (!is_contiguous()) return ops_detail::materialize(*this).to(d);
  Tensor out = Tensor::empty(shape(), dtype(), d);
  if (device().is_cpu())
    kernels_for(d).copy_from_host(out.raw_data(), raw_data(), nbytes());
  else if (d.is_cpu())
    kernels_for(device()).copy_to_host(out.raw_data(), raw_data(), nbytes());
  else
    return to(Device::cpu()).to(d);
  return out;
}

Tensor Tensor::narrow_rows(std::int64_t begin, std::int64_t end) const {
  if (!is_contiguous()) return phalanx::narrow(*this, 0, begin, end - begin).detach();
  if (dim() < 1 || begin < 0 || end < begin || end > shape()[0])
    throw ValueError(detail::concat("narrow_rows(", begin, ", ", end, "): out of range for shape ",
                                    shape_str(shape())));
  Shape s = shape();
  s[0] = end - begin;
  const std::size_t row_bytes = (shape()[0] ? nbytes() / shape()[0] : 0);
  return Tensor(std::make_shared<TensorImpl>(impl_->storage(),
                                             impl_->byte_offset() + begin * row_bytes, s, dtype()));
}

// ---- in-place ----
Tensor& Tensor::zero_() { return fill_(0.0); }
Tensor& Tensor::fill_(double v) {
  if (!is_contiguous()) {
    Tensor one = Tensor::empty({1}, dtype(), device());
    kernels_for(device()).fill(one, v);
    ops_detail::write_through(one, *this, "fill_");
    return *this;
  }
  kernels_for(device()).fill(*this, v);
  return *this;
}
Tensor& Tensor::copy_(const Tensor& src) {
  if (src.numel() != numel() || src.dtype() != dtype())
    throw ShapeError("copy_(): source " + src.str() + " does not match destination " + str());
  if (src.device() == device() && (!is_contiguous() || !src.is_contiguous())) {
    // A view as destination writes through its strides; a source sharing the destination's
    // storage is copied first, so the two never overlap mid-copy.
    const bool shares = src.impl()->storage() == impl_->storage();
    const Tensor s = shares || !src.is_contiguous() ? ops_detail::materialize(src) : src;
    if (is_contiguous())
      kernels_for(device()).copy(raw_data(), s.raw_data(), nbytes());
    else
      ops_detail::write_through(s, *this, "copy_");
  } else if (src.device() == device())
    kernels_for(device()).copy(raw_data(), src.raw_data(), nbytes());
  else
    copy_(src.to(device()));
  return *this;
}
Tensor& Tensor::add_(const Tensor& other, float alpha) {
  if (other.numel() != numel())
    throw ShapeError("add_(): shapes " + shape_str(shape()) + " and " + shape_str(other.shape()) +
                     " differ");
  if (other.device() != device())
    throw TypeError("add_(): " + other.str() + " is on another device than " + str() +
                    "; move it with .to(" + device().str() + ")");
  if (!is_contiguous())
    throw TypeError("add_(): " + str() + " is a non-contiguous view; add_ and mul_ need a contiguous "
                    "tensor (write the result through the view with copy_)");
  const Tensor src = other.is_contiguous() ? other : ops_detail::materialize(other);
  DeviceKernels& k = kernels_for(device());
  if (dtype() != src.dtype() || dtype() == DType::Float16) {
    // mixed or float16 (the kernel's axpy takes float32 or bfloat16 pairs): add in float32,
    // round once
    auto widened = [&](const Tensor& t) {
      if (t.dtype() == DType::Float32) return t;
      Tensor w = Tensor::empty(t.shape(), DType::Float32, t.device());
      k.convert(t, w);
      return w;
    };
    Tensor acc = dtype() == DType::Float32 ? *this : widened(*this);
    k.axpy(alpha, widened(src), acc);
    if (acc.impl() != impl()) k.convert(acc, *this);
    return *this;
  }
  k.axpy(alpha, src, *this);
  return *this;
}
Tensor& Tensor::mul_(float f) {
  if (!is_contiguous())
    throw TypeError("mul_(): " + str() + " is a non-contiguous view; add_ and mul_ need a contiguous "
                    "tensor (write the result through the view with copy_)");
  DeviceKernels& k = kernels_for(device());
  if (dtype() == DType::BFloat16 || dtype() == DType::Float16) {
    // the kernel's scale is float32: scale a float32 copy, round once (PyTorch's bf16 mul_)
    Tensor w = Tensor::empty(shape(), DType::Float32, device());
    k.convert(*this, w);
    k.scale(w, f);
    k.convert(w, *this);
    return *this;
  }
  k.scale(*this, f);
  return *this;
}

std::string Tensor::str() const {
  if (!impl_) return "Tensor(undefined)";
  return "Tensor" + shape_str(shape()) + " " + dtype_name(dtype()) + " " + device().str();
}

// operator<< (the values, as PyTorch prints them) is in tensor_print.cpp.

}  // namespace phalanx
