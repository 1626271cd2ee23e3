// reshape (a view: shares storage), transpose (a materialised copy) and narrow (a view when
// the slice is one block of memory, else a copy of one block per outer index).
#include "ops/op_support.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx {

using namespace ops_detail;

namespace {

class ReshapeBackward final : public Node {
 public:
  explicit ReshapeBackward(Shape in) : in_(std::move(in)) {}
  std::vector<Tensor> apply(const Tensor& g) override { return {view_as(g, in_)}; }
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

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  check_defined(x, "reshape", "input");
  const Shape s = infer_shape(shape, x.numel(), x.shape());
  Tensor out = ReshapeBackward::view_as(x, s);
  if (grad_mode_enabled() && x.requires_grad())
    autograd::record(std::make_shared<ReshapeBackward>(x.shape()), {&x}, out);
  return out;
}

Tensor transpose(const Tensor& x, std::int64_t d0, std::int64_t d1) {
  check_defined(x, "transpose", "input");
  const int a = normalize_dim(d0, x.shape().size(), "transpose");
  const int b = normalize_dim(d1, x.shape().size(), "transpose");
  Shape s = x.shape();
  std::swap(s[a], s[b]);
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  if (a == b)
    kernels_for(x.device()).copy(out.raw_data(), x.raw_data(), x.nbytes());
  else
    kernels_for(x.device()).transpose(x, a, b, out);
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
  Tensor out;
  if (outer == 1) {  // one block: a view
    const std::size_t offset = static_cast<std::size_t>(start * inner) * element_size(x.dtype());
    out = Tensor(std::make_shared<TensorImpl>(x.impl()->storage(), x.impl()->byte_offset() + offset, out_shape,
                                              x.dtype()));
  } else {
    out = Tensor::empty(out_shape, x.dtype(), x.device());
    copy_blocks(x, out, outer, d, inner, start, length, true);
  }
  if (grad_mode_enabled() && x.requires_grad())
    autograd::record(std::make_shared<NarrowBackward>(s, outer, d, inner, start, length), {&x}, out);
  return out;
}

}  // namespace phalanx
