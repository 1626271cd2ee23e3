// The transformer's layout and mask ops: permute, contiguous, cat, stack, split, chunk,
// masked_fill, tril/triu. permute and the pieces of split/chunk are views (a shape, strides
// and an offset into the input's storage); contiguous() and every copy here are one or a few
// calls of the device's strided_copy (kernels.hpp, "layout and masks"), which also writes
// through a view's strides for copy_/fill_ (docs/transformer_ops.md, "Views").
#include <algorithm>

#include "ops/autocast_support.hpp"
#include "ops/op_support.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx {

using namespace ops_detail;

namespace {

std::string dims_str(const std::vector<std::int64_t>& v) {
  std::string s = "(";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (v.size() == 1 ? ",)" : ")");
}

/// Row-major element strides of `s`.
std::vector<std::int64_t> strides_of(const Shape& s) {
  std::vector<std::int64_t> st(s.size());
  std::int64_t acc = 1;
  for (std::size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

/// A StridedLayout from per-dim sizes and steps: size-1 dims dropped and neighbours that are
/// contiguous on both sides merged, so that any shape an op builds fits kMaxLayoutDims unless
/// it really walks more dims than that (a ShapeError naming `op`).
StridedLayout make_layout(const std::vector<std::int64_t>& sizes, const std::vector<std::int64_t>& ss,
                          const std::vector<std::int64_t>& ds, std::int64_t src_off, std::int64_t dst_off,
                          const char* op, const Shape& shape) {
  std::vector<std::int64_t> sz, s, d;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 1) continue;
    if (!sz.empty() && s.back() == ss[i] * sizes[i] && d.back() == ds[i] * sizes[i]) {
      sz.back() *= sizes[i];
      s.back() = ss[i];
      d.back() = ds[i];
    } else {
      sz.push_back(sizes[i]);
      s.push_back(ss[i]);
      d.push_back(ds[i]);
    }
  }
  if (sz.size() > static_cast<std::size_t>(kMaxLayoutDims))
    throw ShapeError(detail::concat(op, ": ", shape_str(shape), " needs a copy over ", sz.size(),
                                    " dims that cannot be merged; at most ", kMaxLayoutDims, " are supported"));
  StridedLayout l;
  l.ndim = static_cast<int>(sz.size());
  for (int i = 0; i < l.ndim; ++i) {
    l.sizes[i] = sz[i];
    l.src_strides[i] = s[i];
    l.dst_strides[i] = d[i];
  }
  l.src_offset = src_off;
  l.dst_offset = dst_off;
  return l;
}

/// Connects `node` to a list of inputs (record() takes a fixed list).
void record_inputs(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs, Tensor& out) {
  if (!grad_mode_enabled()) return;
  if (std::none_of(inputs.begin(), inputs.end(), [](const Tensor& t) { return t.requires_grad(); })) return;
  node->next_edges.reserve(inputs.size());
  for (const Tensor& t : inputs) node->next_edges.push_back(autograd::gradient_edge(t));
  out.impl()->ensure_autograd().grad_fn = node;
}

std::vector<std::int64_t> inverse(const std::vector<std::int64_t>& perm) {
  std::vector<std::int64_t> inv(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<std::int64_t>(i);
  return inv;
}

/// One contiguous 1-D tensor over the storage a view spans, from its first element to its
/// last: what strided_copy reads or writes for the view (kernels take contiguous tensors).
Tensor flat_alias(const Tensor& t) {
  std::int64_t extent = 1;
  for (std::size_t i = 0; i < t.shape().size(); ++i) extent += (t.shape()[i] - 1) * t.strides()[i];
  const TensorImpl& i = *t.impl();
  return Tensor(std::make_shared<TensorImpl>(i.storage(), i.byte_offset(), Shape{extent}, i.dtype()));
}

class ContiguousBackward final : public StridedGradientNode {
 public:
  std::vector<Tensor> apply(const Tensor& g) override { return {g}; }
  const char* name() const override { return "ContiguousBackward"; }
};

// out = x with its dims reordered by `perm` (already validated); x contiguous.
Tensor permute_copy(const Tensor& x, const std::vector<std::int64_t>& perm) {
  const Shape& s = x.shape();
  Shape os(s.size());
  const auto xs = strides_of(s);
  std::vector<std::int64_t> src(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    os[i] = s[perm[i]];
    src[i] = xs[perm[i]];
  }
  Tensor out = Tensor::empty(os, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  const StridedLayout l = make_layout(os, src, strides_of(os), 0, 0, "permute", s);
  kernels_for(x.device()).strided_copy(x, l, out);
  return out;
}

class PermuteBackward final : public StridedGradientNode {
 public:
  explicit PermuteBackward(std::vector<std::int64_t> inv) : inv_(std::move(inv)) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    if (g.impl()->is_contiguous()) return {permute_copy(g, inv_)};
    // A strided gradient (split's, in the layout of this permute's output): its permuted
    // view is often contiguous, and then free.
    Shape os(inv_.size());
    std::vector<std::int64_t> st(inv_.size());
    for (std::size_t i = 0; i < inv_.size(); ++i) {
      os[i] = g.shape()[inv_[i]];
      st[i] = g.strides()[inv_[i]];
    }
    Tensor v = make_view(g, std::move(os), std::move(st), 0);
    return {v.impl()->is_contiguous() ? v : materialize(v)};
  }
  const char* name() const override { return "PermuteBackward"; }

 private:
  std::vector<std::int64_t> inv_;
};

// x viewed as [outer, d, inner]: copies [outer, len, inner] between the slice at `start` of a
// full tensor and a compact one (to_slice: full -> compact).
void copy_slab(const Tensor& from, Tensor& to, std::int64_t outer, std::int64_t d, std::int64_t inner,
               std::int64_t start, std::int64_t len, bool to_slice, const char* op) {
  if (outer == 0 || len == 0 || inner == 0) return;
  const std::vector<std::int64_t> sizes{outer, len * inner};
  const std::vector<std::int64_t> full{d * inner, 1}, part{len * inner, 1};
  const StridedLayout l = to_slice ? make_layout(sizes, full, part, start * inner, 0, op, from.shape())
                                   : make_layout(sizes, part, full, 0, start * inner, op, from.shape());
  kernels_for(from.device()).strided_copy(from, l, to);
}

struct Slab {
  std::int64_t outer = 1, d = 1, inner = 1;
};
Slab slab_of(const Shape& s, int dim) {
  Slab b;
  for (int i = 0; i < dim; ++i) b.outer *= s[i];
  b.d = s[dim];
  for (std::size_t i = dim + 1; i < s.size(); ++i) b.inner *= s[i];
  return b;
}

// split's backward. The pieces of one split are one op with several outputs, which the tape
// (one output per node) does not have; summing one full-size gradient per piece would cost a
// zero fill and an add of the whole input per piece. Instead each piece's node copies its
// gradient into its slot of one shared buffer and sends a one-element token on to a join node;
// the join runs once every piece of this pass has (the engine counts it as their dependant),
// zeroes the slots no gradient reached, and passes the buffer on as the input's gradient.
struct SplitGrad {
  Shape in;
  std::vector<std::int64_t> in_strides;  // the input's layout when it is a dense permutation, else empty
  int dim = 0;
  Slab b;
  std::vector<std::int64_t> starts, lens;
  Tensor buf;                  // the input's gradient being assembled in this pass
  std::vector<char> written;   // which slots a piece has filled in this pass
};

/// Piece i's place in split's gradient buffer (a view of it).
Tensor slot(const Tensor& buf, const SplitGrad& s, std::size_t i) {
  Shape sh = s.in;
  sh[s.dim] = s.lens[i];
  return make_view(buf, std::move(sh), buf.strides(), s.starts[i] * buf.strides()[s.dim]);
}

/// x's strides when x is a non-contiguous but dense permutation of a block of numel elements
/// (a permute's output), else empty.
std::vector<std::int64_t> dense_permuted_strides(const Tensor& x) {
  if (x.impl()->is_contiguous()) return {};
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // (stride, size) of the dims of size > 1
  for (std::size_t i = 0; i < x.shape().size(); ++i)
    if (x.shape()[i] > 1) dims.emplace_back(x.strides()[i], x.shape()[i]);
  std::sort(dims.begin(), dims.end());
  std::int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return {};
    expected *= size;
  }
  return x.strides();
}

class SplitJoinBackward final : public Node {
 public:
  explicit SplitJoinBackward(std::shared_ptr<SplitGrad> s) : s_(std::move(s)) {}
  std::vector<Tensor> apply(const Tensor&) override {
    SplitGrad& s = *s_;
    Tensor gx = std::move(s.buf);
    s.buf = Tensor();
    for (std::size_t i = 0; i < s.lens.size(); ++i)
      if (!s.written[i] && s.lens[i] > 0) {  // no gradient reached this piece: zeros, broadcast from one
        const Tensor zero = zeros({1}, gx.dtype(), gx.device());
        if (!gx.impl()->is_contiguous()) {
          write_through(zero, slot(gx, s, i), "split");
          continue;
        }
        const std::vector<std::int64_t> sizes{s.b.outer, s.lens[i] * s.b.inner}, none{0, 0},
            full{s.b.d * s.b.inner, 1};
        kernels_for(gx.device())
            .strided_copy(zero, make_layout(sizes, none, full, 0, s.starts[i] * s.b.inner, "split", s.in), gx);
      }
    std::fill(s.written.begin(), s.written.end(), 0);
    return {gx};
  }
  const char* name() const override { return "SplitBackward"; }
  void release_saved() override { s_->buf = Tensor(); }

 private:
  std::shared_ptr<SplitGrad> s_;
};

class SplitPieceBackward final : public Node {
 public:
  SplitPieceBackward(std::shared_ptr<SplitGrad> s, std::size_t i) : s_(std::move(s)), i_(i) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    SplitGrad& s = *s_;
    if (!s.buf.defined()) {
      if (s.in_strides.empty()) {
        s.buf = Tensor::empty(s.in, g.dtype(), g.device());
      } else {  // the input's own layout, so that its grad_fn (a permute) gets it back as a view
        const Tensor flat = Tensor::empty({numel_of(s.in)}, g.dtype(), g.device());
        s.buf = make_view(flat, s.in, s.in_strides, 0);
      }
      s.written.assign(s.lens.size(), 0);
    }
    if (s.buf.impl()->is_contiguous())
      copy_slab(g, s.buf, s.b.outer, s.b.d, s.b.inner, s.starts[i_], s.lens[i_], false, "split");
    else
      write_through(g, slot(s.buf, s, i_), "split");
    s.written[i_] = 1;
    return {zeros({}, DType::Float32, g.device())};  // the token: "this piece is in"
  }
  const char* name() const override { return "SplitBackward"; }

 private:
  std::shared_ptr<SplitGrad> s_;
  std::size_t i_;
};

// Elements [start, start + len) of dim `dim` (validated), without history: a view.
Tensor slice(const Tensor& x, int dim, const Slab& b, std::int64_t start, std::int64_t len) {
  (void)b;
  Shape os = x.shape();
  os[dim] = len;
  return make_view(x, std::move(os), x.strides(), start * x.strides()[dim]);
}

class CatBackward final : public Node {
 public:
  CatBackward(std::vector<Shape> shapes, int dim) : shapes_(std::move(shapes)), dim_(dim) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    std::vector<Tensor> grads(shapes_.size());
    const Slab full = slab_of(g.shape(), dim_);
    std::int64_t start = 0;
    for (std::size_t i = 0; i < shapes_.size(); ++i) {
      const std::int64_t len = shapes_[i][dim_];
      if (needs_grad(*this, i)) {
        grads[i] = Tensor::empty(shapes_[i], g.dtype(), g.device());
        copy_slab(g, grads[i], full.outer, full.d, full.inner, start, len, true, "cat");
      }
      start += len;
    }
    return grads;
  }
  const char* name() const override { return "CatBackward"; }

 private:
  std::vector<Shape> shapes_;
  int dim_;
};

int split_dim(const Tensor& x, std::int64_t dim, const char* op) {
  check_defined(x, op, "input");
  if (x.dim() == 0) throw ShapeError(detail::concat(op, ": the input is a scalar (0-d); it has no dimension to split"));
  return normalize_dim(dim, x.shape().size(), op);
}

std::vector<Tensor> split_sizes(const Tensor& x, const std::vector<std::int64_t>& sizes, int dim) {
  const Slab b = slab_of(x.shape(), dim);
  std::vector<Tensor> out;
  out.reserve(sizes.size());
  std::vector<std::int64_t> starts;
  std::int64_t start = 0;
  for (std::int64_t len : sizes) {
    out.push_back(slice(x, dim, b, start, len));
    starts.push_back(start);
    start += len;
  }
  if (grad_mode_enabled() && x.requires_grad()) {
    auto s = std::make_shared<SplitGrad>();
    s->in = x.shape();
    s->in_strides = dense_permuted_strides(x);
    s->dim = dim;
    s->b = b;
    s->starts = std::move(starts);
    s->lens = sizes;
    s->written.assign(sizes.size(), 0);
    auto join = std::make_shared<SplitJoinBackward>(s);
    join->next_edges.push_back(autograd::gradient_edge(x));
    for (std::size_t i = 0; i < out.size(); ++i) {
      auto piece = std::make_shared<SplitPieceBackward>(s, i);
      piece->next_edges.push_back(Edge{join});
      out[i].impl()->ensure_autograd().grad_fn = piece;
    }
  }
  return out;
}

// masked_fill's mask as the kernel takes it: one that repeats with its numel as period (it
// already is one when, leading 1s dropped, it equals x's trailing dims), else expanded to x's
// shape by one strided copy with step 0 along the broadcast dims.
Tensor mask_for(const Tensor& mask, const Shape& xs) {
  const Shape& ms = mask.shape();
  std::size_t lead = 0;
  while (lead < ms.size() && ms[lead] == 1) ++lead;
  if (std::equal(ms.begin() + static_cast<std::ptrdiff_t>(lead), ms.end(),
                 xs.end() - static_cast<std::ptrdiff_t>(ms.size() - lead)))
    return mask;
  Tensor full = Tensor::empty(xs, DType::Bool, mask.device());
  const auto mst = strides_of(ms);
  std::vector<std::int64_t> src(xs.size(), 0);
  const std::size_t off = xs.size() - ms.size();
  for (std::size_t i = 0; i < ms.size(); ++i) src[off + i] = ms[i] == 1 ? 0 : mst[i];
  if (full.numel() > 0)
    kernels_for(mask.device()).strided_copy(mask, make_layout(xs, src, strides_of(xs), 0, 0, "masked_fill", xs), full);
  return full;
}

class MaskedFillBackward final : public Node {
 public:
  explicit MaskedFillBackward(Tensor mask) : mask_(std::move(mask)) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor gx = empty_like(g);
    kernels_for(g.device()).masked_fill(g, mask_, 0.f, gx);
    return {gx};
  }
  const char* name() const override { return "MaskedFillBackward"; }
  void release_saved() override { mask_ = Tensor(); }

 private:
  Tensor mask_;
};

class TriangleBackward final : public Node {
 public:
  TriangleBackward(std::int64_t diagonal, bool upper) : diagonal_(diagonal), upper_(upper) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor gx = empty_like(g);
    const Shape& s = g.shape();
    kernels_for(g.device()).triangle(g, s[s.size() - 2], s.back(), diagonal_, upper_, gx);
    return {gx};
  }
  const char* name() const override { return upper_ ? "TriuBackward" : "TrilBackward"; }

 private:
  std::int64_t diagonal_;
  bool upper_;
};

Tensor triangle(const Tensor& x_in, std::int64_t diagonal, bool upper) {
  const char* op = upper ? "triu" : "tril";
  check_defined(x_in, op, "input");
  const Tensor x = contiguous_input(x_in);
  if (x.dim() < 2)
    throw ShapeError(detail::concat(op, ": the input ", shape_str(x.shape()),
                                    " has fewer than 2 dims; it works on the last two (matrices)"));
  const Shape& s = x.shape();
  Tensor out = empty_like(x);
  kernels_for(x.device()).triangle(x, s[s.size() - 2], s.back(), diagonal, upper, out);
  if (grad_mode_enabled() && x.requires_grad())
    autograd::record(std::make_shared<TriangleBackward>(diagonal, upper), {&x}, out);
  return out;
}

}  // namespace

Tensor masked_fill(const Tensor& x_in, const Tensor& mask_in, float value) {
  if (is_reduced(x_in))
    return in_float32(x_in.dtype(), [=](const Tensor& t, const Tensor& m) { return masked_fill(t, m, value); }, x_in,
                      mask_in);
  check_float(x_in, "masked_fill", "input");
  check_defined(mask_in, "masked_fill", "mask");
  const Tensor x = contiguous_input(x_in), mask = contiguous_input(mask_in);
  if (mask.dtype() != DType::Bool)
    throw TypeError(detail::concat("masked_fill: the mask must be bool, got ", dtype_name(mask.dtype()), " ",
                                   shape_str(mask.shape()), " (build it with tril(ones(shape, DType::Bool)) or a comparison)"));
  check_same_device(x, mask, "masked_fill");
  const Shape &xs = x.shape(), &ms = mask.shape();
  bool ok = ms.size() <= xs.size();
  for (std::size_t i = 0; ok && i < ms.size(); ++i) {
    const std::int64_t m = ms[ms.size() - 1 - i], d = xs[xs.size() - 1 - i];
    if (m != d && m != 1) ok = false;
  }
  if (!ok)
    throw ShapeError("masked_fill: the mask " + shape_str(ms) + " does not broadcast to the input " + shape_str(xs));
  const Tensor m = mask_for(mask, xs);
  Tensor out = empty_like(x);
  kernels_for(x.device()).masked_fill(x, m, value, out);
  if (grad_mode_enabled() && x.requires_grad())
    autograd::record(std::make_shared<MaskedFillBackward>(m), {&x}, out);
  return out;
}

Tensor tril(const Tensor& x, std::int64_t diagonal) { return triangle(x, diagonal, false); }
Tensor triu(const Tensor& x, std::int64_t diagonal) { return triangle(x, diagonal, true); }

Tensor permute(const Tensor& x, const std::vector<std::int64_t>& dims) {
  check_defined(x, "permute", "input");
  const std::size_t n = x.shape().size();
  if (dims.size() != n)
    throw ShapeError(detail::concat("permute: dims ", dims_str(dims), " name ", dims.size(), " dims but the input ",
                                    shape_str(x.shape()), " has ", n));
  std::vector<std::int64_t> perm(n);
  std::vector<bool> seen(n, false);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t d = dims[i];
    if (d < -static_cast<std::int64_t>(n) || d >= static_cast<std::int64_t>(n))
      throw ShapeError(detail::concat("permute: dim ", d, " in ", dims_str(dims), " is out of range for ",
                                      shape_str(x.shape())));
    perm[i] = d < 0 ? d + static_cast<std::int64_t>(n) : d;
    if (seen[perm[i]])
      throw ShapeError(detail::concat("permute: dims ", dims_str(dims), " repeat dim ", perm[i],
                                      "; give each dim of ", shape_str(x.shape()), " once"));
    seen[perm[i]] = true;
  }
  Shape os(n);
  std::vector<std::int64_t> st(n);
  for (std::size_t i = 0; i < n; ++i) {
    os[i] = x.shape()[perm[i]];
    st[i] = x.strides()[perm[i]];
  }
  Tensor out = make_view(x, std::move(os), std::move(st), 0);
  if (grad_mode_enabled() && x.requires_grad())
    autograd::record(std::make_shared<PermuteBackward>(inverse(perm)), {&x}, out);
  return out;
}

Tensor contiguous(const Tensor& x) {
  check_defined(x, "contiguous", "input");
  if (x.impl()->is_contiguous()) return x;
  Tensor out = materialize(x);
  if (grad_mode_enabled() && x.requires_grad())
    autograd::record(std::make_shared<ContiguousBackward>(), {&x}, out);
  return out;
}

namespace ops_detail {

Tensor make_view(const Tensor& x, Shape shape, std::vector<std::int64_t> strides, std::int64_t element_offset) {
  const TensorImpl& i = *x.impl();
  const std::size_t off = i.byte_offset() + static_cast<std::size_t>(element_offset) * element_size(i.dtype());
  return Tensor(std::make_shared<TensorImpl>(i.storage(), off, std::move(shape), std::move(strides), i.dtype()));
}

Tensor materialize(const Tensor& x) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  if (x.impl()->is_contiguous()) {
    kernels_for(x.device()).copy(out.raw_data(), x.raw_data(), x.nbytes());
    return out;
  }
  const StridedLayout l = make_layout(x.shape(), x.strides(), strides_of(x.shape()), 0, 0, "contiguous", x.shape());
  kernels_for(x.device()).strided_copy(flat_alias(x), l, out);
  return out;
}

void write_through(const Tensor& src, const Tensor& dst, const char* op) {
  const Shape& s = dst.shape();
  for (std::size_t i = 0; i < s.size(); ++i)
    if (s[i] > 1 && dst.strides()[i] == 0)
      throw ValueError(detail::concat(op, ": the destination ", dst.str(), " repeats elements (stride 0 in dim ", i,
                                      ", as expand makes); write into a tensor whose elements are distinct"));
  if (dst.numel() == 0) return;
  const std::vector<std::int64_t> from =
      src.numel() == 1 ? std::vector<std::int64_t>(s.size(), 0) : strides_of(s);
  const StridedLayout l = make_layout(s, from, dst.strides(), 0, 0, op, s);
  Tensor flat = flat_alias(dst);
  kernels_for(dst.device()).strided_copy(src, l, flat);
}

}  // namespace ops_detail

Tensor cat(const std::vector<Tensor>& inputs, std::int64_t dim) {
  if (inputs.empty()) throw ValueError("cat: expected a non-empty list of tensors");
  for (std::size_t i = 0; i < inputs.size(); ++i) check_defined(inputs[i], "cat", "tensors");
  std::vector<Tensor> xs;
  xs.reserve(inputs.size());
  for (const Tensor& t : inputs) xs.push_back(contiguous_input(t));
  if (std::vector<Tensor> promoted; promote_floating(xs, promoted)) return cat(promoted, dim);
  const Tensor& x0 = xs[0];
  if (x0.dim() == 0) throw ShapeError("cat: zero-dimensional tensor 0 cannot be concatenated");
  const int d = normalize_dim(dim, x0.shape().size(), "cat");
  std::int64_t total = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    if (x.dtype() != x0.dtype())
      throw TypeError(detail::concat("cat: tensor ", i, " is ", dtype_name(x.dtype()), " but tensor 0 is ",
                                     dtype_name(x0.dtype()), "; convert them to one dtype"));
    check_same_device(x0, x, "cat");
    bool ok = x.dim() == x0.dim();
    for (std::size_t k = 0; ok && k < x.shape().size(); ++k)
      if (static_cast<int>(k) != d && x.shape()[k] != x0.shape()[k]) ok = false;
    if (!ok)
      throw ShapeError(detail::concat("cat: tensor ", i, " is ", shape_str(x.shape()), " but tensor 0 is ",
                                      shape_str(x0.shape()), "; they must match in every dim but dim ", d));
    total += x.shape()[d];
  }
  Shape os = x0.shape();
  os[d] = total;
  Tensor out = Tensor::empty(os, x0.dtype(), x0.device());
  const Slab full = slab_of(os, d);
  std::int64_t start = 0;
  for (const Tensor& x : xs) {
    const std::int64_t len = x.shape()[d];
    copy_slab(x, out, full.outer, full.d, full.inner, start, len, false, "cat");
    start += len;
  }
  if (grad_mode_enabled()) {
    std::vector<Shape> shapes;
    shapes.reserve(xs.size());
    for (const Tensor& x : xs) shapes.push_back(x.shape());
    record_inputs(std::make_shared<CatBackward>(std::move(shapes), d), xs, out);
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& xs, std::int64_t dim) {
  if (xs.empty()) throw ValueError("stack: expected a non-empty list of tensors");
  for (std::size_t i = 0; i < xs.size(); ++i) check_defined(xs[i], "stack", "tensors");
  const Shape& s0 = xs[0].shape();
  for (std::size_t i = 1; i < xs.size(); ++i)
    if (xs[i].shape() != s0)
      throw ShapeError(detail::concat("stack: tensor ", i, " is ", shape_str(xs[i].shape()), " but tensor 0 is ",
                                      shape_str(s0), "; stack needs equal shapes"));
  const int d = normalize_dim(dim, s0.size() + 1, "stack");
  Shape unsq = s0;
  unsq.insert(unsq.begin() + d, 1);
  std::vector<Tensor> parts;
  parts.reserve(xs.size());
  for (const Tensor& x : xs) parts.push_back(reshape(x, unsq));
  return cat(parts, d);
}

std::vector<Tensor> split(const Tensor& x, std::int64_t split_size, std::int64_t dim) {
  const int d = split_dim(x, dim, "split");
  const std::int64_t n = x.shape()[d];
  if (split_size < 0 || (split_size == 0 && n != 0))
    throw ValueError(detail::concat("split: split_size must be positive, got ", split_size, " (dim ", d, " of ",
                                    shape_str(x.shape()), ")"));
  std::vector<std::int64_t> sizes;
  if (n == 0) {
    sizes.push_back(0);
  } else {
    for (std::int64_t start = 0; start < n; start += split_size) sizes.push_back(std::min(split_size, n - start));
  }
  return split_sizes(x, sizes, d);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<std::int64_t>& sizes, std::int64_t dim) {
  const int d = split_dim(x, dim, "split");
  std::int64_t total = 0;
  for (std::int64_t s : sizes) {
    if (s < 0)
      throw ValueError(detail::concat("split: sizes ", dims_str(sizes), " contain a negative size"));
    total += s;
  }
  if (total != x.shape()[d])
    throw ShapeError(detail::concat("split: sizes ", dims_str(sizes), " sum to ", total, " but dim ", d, " of ",
                                    shape_str(x.shape()), " is ", x.shape()[d]));
  return split_sizes(x, sizes, d);
}

std::vector<Tensor> chunk(const Tensor& x, std::int64_t chunks, std::int64_t dim) {
  const int d = split_dim(x, dim, "chunk");
  if (chunks <= 0) throw ValueError(detail::concat("chunk: chunks must be positive, got ", chunks));
  const std::int64_t n = x.shape()[d];
  // torch.chunk: pieces of ceil(n / chunks), so fewer than `chunks` can come back.
  return split(x, n == 0 ? 0 : (n + chunks - 1) / chunks, d);
}

}  // namespace phalanx
