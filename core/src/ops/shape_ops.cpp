// The view ops of one tensor: reshape/view (a view when the strides allow one; reshape copies
// otherwise, as torch.reshape), transpose, narrow, unsqueeze and squeeze (always views: a
// shape, strides and an offset into the input's storage). Their backward nodes produce
// contiguous gradients (the engine hands every node a contiguous gradient).
#include "ops/op_support.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx {

using namespace ops_detail;

namespace {

bool view_strides(const Shape& from, const std::vector<std::int64_t>& st, const Shape& to,
                  std::vector<std::int64_t>& out);

class ReshapeBackward final : public StridedGradientNode {
 public:
  explicit ReshapeBackward(Shape in) : in_(std::move(in)) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    if (g.impl()->is_contiguous()) return {view_as(g, in_)};
    std::vector<std::int64_t> st;
    if (view_strides(g.shape(), g.strides(), in_, st)) return {make_view(g, in_, std::move(st), 0)};
    return {view_as(materialize(g), in_)};
  }
  const char* name() const override { return "ReshapeBackward"; }
  static Tensor view_as(const Tensor& t, const Shape& s) {
    return Tensor(std::make_shared<TensorImpl>(t.impl()->storage(), t.impl()->byte_offset(), s,
                                               t.dtype()));
  }

 private:
  Shape in_;
};

class TransposeBackward final : public Node {
 public:
  TransposeBackward(int d0, int d1) : d0_(d0), d1_(d1) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    Shape s = g.shape();
    std::swap(s[d0_], s[d1_]);
    Tensor out = Tensor::empty(s, g.dtype(), g.device());
    kernels_for(g.device()).transpose(g, d0_, d1_, out);
    return {out};
  }
  const char* name() const override { return "TransposeBackward"; }

 private:
  int d0_, d1_;
};

// narrow's slices of a contiguous [outer, d, inner] tensor: block o is elements
// [(o*d + start)*inner, (o*d + start + length)*inner). Copies them between the two layouts
// (to_slice: from the full tensor into the slice) with the device's own copy, so it works on
// every device.
void copy_blocks(const Tensor& from, Tensor& to, std::int64_t outer, std::int64_t d, std::int64_t inner,
                 std::int64_t start, std::int64_t length, bool to_slice) {
  const std::size_t es = element_size(from.dtype());
  const std::size_t block = static_cast<std::size_t>(length * inner) * es;
  if (block == 0) return;
  auto& k = kernels_for(from.device());
  const auto* src = static_cast<const char*>(from.raw_data());
  auto* dst = static_cast<char*>(to.raw_data());
  for (std::int64_t o = 0; o < outer; ++o) {
    const std::size_t full = static_cast<std::size_t>((o * d + start) * inner) * es;
    const std::size_t part = static_cast<std::size_t>(o) * block;
    if (to_slice)
      k.copy(dst + part, src + full, block);
    else
      k.copy(dst + full, src + part, block);
  }
}

class NarrowBackward final : public Node {
 public:
  NarrowBackward(Shape in, std::int64_t outer, std::int64_t d, std::int64_t inner, std::int64_t start,
                 std::int64_t length)
      : in_(std::move(in)), outer_(outer), d_(d), inner_(inner), start_(start), length_(length) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor gx = Tensor::empty(in_, g.dtype(), g.device());
    kernels_for(g.device()).fill(gx, 0.0);
    copy_blocks(g, gx, outer_, d_, inner_, start_, length_, false);
    return {gx};
  }
  const char* name() const override { return "NarrowBackward"; }

 private:
  Shape in_;
  std::int64_t outer_, d_, inner_, start_, length_;
};

Shape infer_shape(const Shape& requested, std::int64_t numel, const Shape& from) {
  Shape s = requested;
  int infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (infer >= 0) throw ValueError("reshape: only one dimension can be -1, got " + shape_str(requested));
      infer = static_cast<int>(i);
    } else if (s[i] < 0) {
      throw ValueError("reshape: invalid dimension in " + shape_str(requested));
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      throw ShapeError("reshape: cannot view " + shape_str(from) + " as " + shape_str(requested));
    s[infer] = numel / known;
  }
  if (numel_of(s) != numel)
    throw ShapeError(detail::concat("reshape: cannot view ", shape_str(from), " (", numel,
                                    " elements) as ", shape_str(requested)));
  return s;
}

/// PyTorch's computeStride: the strides that view x's (shape, strides) as `to` without a copy,
/// or false when none exist (a dim of `to` would span two blocks that are not evenly spaced).
bool view_strides(const Shape& from, const std::vector<std::int64_t>& st, const Shape& to,
                  std::vector<std::int64_t>& out) {
  out.assign(to.size(), 1);
  if (from.empty()) return true;
  if (numel_of(from) == 0) {
    out = contiguous_strides(to);
    return true;
  }
  std::int64_t view_d = static_cast<std::int64_t>(to.size()) - 1;
  std::int64_t chunk_base = st.back(), tensor_numel = 1, view_numel = 1;
  for (std::int64_t d = static_cast<std::int64_t>(from.size()) - 1; d >= 0; --d) {
    tensor_numel *= from[d];
    if (d == 0 || (from[d - 1] != 1 && st[d - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || to[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base;
        view_numel *= to[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base = st[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

// A view of x as shape s (validated) with the given strides, recorded as a reshape.
Tensor reshape_view(const Tensor& x, const Shape& s, std::vector<std::int64_t> st) {
  Tensor out = x.impl()->is_contiguous() ? ReshapeBackward::view_as(x, s) : make_view(x, s, std::move(st), 0);
  if (grad_mode_enabled() && x.requires_grad())
    autograd::record(std::make_shared<ReshapeBackward>(x.shape()), {&x}, out);
  return out;
}

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  check_defined(x, "reshape", "input");
  const Shape s = infer_shape(shape, x.numel(), x.shape());
  std::vector<std::int64_t> st;
  if (x.impl()->is_contiguous() || view_strides(x.shape(), x.strides(), s, st)) return reshape_view(x, s, std::move(st));
  return reshape_view(contiguous(x), s, {});  // torch.reshape: a copy when no view exists
}

Tensor view(const Tensor& x, const Shape& shape) {
  check_defined(x, "view", "input");
  const Shape s = infer_shape(shape, x.numel(), x.shape());
  std::vector<std::int64_t> st;
  if (!x.impl()->is_contiguous() && !view_strides(x.shape(), x.strides(), s, st))
    throw ShapeError("view: size " + shape_str(s) + " is not compatible with the input's size " +
                     shape_str(x.shape()) + " and strides (at least one dimension spans across two "
                     "contiguous subspaces); use .reshape(...) instead");
  return reshape_view(x, s, std::move(st));
}

Tensor unsqueeze(const Tensor& x, std::int64_t dim) {
  check_defined(x, "unsqueeze", "input");
  const int d = normalize_dim(dim, x.shape().size() + 1, "unsqueeze");
  Shape s = x.shape();
  std::vector<std::int64_t> st = x.strides();
  const std::int64_t step = d < x.dim() ? s[d] * st[d] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, step);
  return reshape_view(x, s, std::move(st));
}

Tensor squeeze(const Tensor& x, std::int64_t dim) {
  check_defined(x, "squeeze", "input");
  if (x.dim() == 0) return reshape_view(x, x.shape(), x.strides());
  const int d = normalize_dim(dim, x.shape().size(), "squeeze");
  Shape s = x.shape();
  std::vector<std::int64_t> st = x.strides();
  if (s[d] == 1) {
    s.erase(s.begin() + d);
    st.erase(st.begin() + d);
  }
  return reshape_view(x, s, std::move(st));
}

Tensor squeeze(const Tensor& x) {
  check_defined(x, "squeeze", "input");
  Shape s;
  std::vector<std::int64_t> st;
  for (std::size_t i = 0; i < x.shape().size(); ++i)
    if (x.shape()[i] != 1) {
      s.push_back(x.shape()[i]);
      st.push_back(x.strides()[i]);
    }
  return reshape_view(x, s, std::move(st));
}

Tensor transpose(const Tensor& x, std::int64_t d0, std::int64_t d1) {
  check_defined(x, "transpose", "input");
  const int a = normalize_dim(d0, x.shape().size(), "transpose");
  const int b = normalize_dim(d1, x.shape().size(), "transpose");
  Shape s = x.shape();
  std::vector<std::int64_t> st = x.strides();
  std::swap(s[a], s[b]);
  std::swap(st[a], st[b]);
  Tensor out = make_view(x, std::move(s), std::move(st), 0);
  if (a == b) {
    if (grad_mode_enabled() && x.requires_grad())
      autograd::record(std::make_shared<ReshapeBackward>(x.shape()), {&x}, out);
    return out;
  }
  if (grad_mode_enabled() && x.requires_grad())
    autograd::record(std::make_shared<TransposeBackward>(a, b), {&x}, out);
  return out;
}

Tensor narrow(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t length) {
  check_defined(x, "narrow", "input");
  const Shape& s = x.shape();
  if (s.empty()) throw ShapeError("narrow: the input is a scalar (0-d); it has no dimension to narrow");
  const int a = normalize_dim(dim, s.size(), "narrow");
  const std::int64_t d = s[a];
  if (start < 0) start += d;
  if (start < 0 || length < 0 || start + length > d)
    throw ShapeError(detail::concat("narrow: elements [", start, ", ", start + length, ") of dimension ", a,
                                    " are out of range for ", shape_str(s), " (size ", d, ")"));
  std::int64_t outer = 1, inner = 1;
  for (int i = 0; i < a; ++i) outer *= s[i];
  for (std::size_t i = a + 1; i < s.size(); ++i) inner *= s[i];
  Shape out_shape = s;
  out_shape[a] = length;
  Tensor out = make_view(x, std::move(out_shape), x.strides(), start * x.strides()[a]);
  if (grad_mode_enabled() && x.requires_grad())
    autograd::record(std::make_shared<NarrowBackward>(s, outer, d, inner, start, length), {&x}, out);
  return out;
}

}  // namespace phalanx
