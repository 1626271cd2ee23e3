// matmul and linear: one GEMM forward, one GEMM per wanted gradient backward; transposes
// are GEMM flags, never materialised copies. Batched matmul is one GEMM per batch on the
// device table at pointer offsets (a broadcast operand is read in place, never copied), or a
// single GEMM when the right operand has no batch dims (the batch folds into the rows).
#include <string>

#include "ops/autocast_support.hpp"
#include "ops/op_support.hpp"
#include "phalanx/core/half.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx {

using namespace ops_detail;

namespace {

// The device pointer of a tensor the op has checked (float32 or bfloat16), with its element
// size so that offsets count elements: GEMM runs on the tensors' device, so this is never
// dereferenced on the host (data<float>() would refuse a CUDA one).
struct Ptr {
  char* p;
  std::size_t es;
  Ptr operator+(std::int64_t off) const { return {p + off * static_cast<std::int64_t>(es), es}; }
};
Ptr dptr(const Tensor& t) { return {static_cast<char*>(t.raw_data()), element_size(t.dtype())}; }

// C = alpha op(A) op(B) + beta C in the product's dtype: the float32 GEMM, or for bfloat16
// operands the bf16 GEMM (float32 sums, C bfloat16 rounded once: PyTorch's bf16 @ bf16 -> bf16).
void gemm(DeviceKernels& kern, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          Ptr a, std::int64_t lda, Ptr b, std::int64_t ldb, float beta, Ptr c, std::int64_t ldc) {
  if (a.es == 2)
    kern.gemm_bf16(ta, tb, m, n, k, alpha, reinterpret_cast<const std::uint16_t*>(a.p), lda,
                   reinterpret_cast<const std::uint16_t*>(b.p), ldb, beta, c.p, ldc, true);
  else
    kern.gemm(ta, tb, m, n, k, alpha, reinterpret_cast<const float*>(a.p), lda,
              reinterpret_cast<const float*>(b.p), ldb, beta, reinterpret_cast<float*>(c.p), ldc);
}

// The same product into a float32 C (accumulating with beta), whatever the operands' dtype.
void gemm_f32_out(DeviceKernels& kern, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, Ptr a,
                  std::int64_t lda, Ptr b, std::int64_t ldb, float beta, Ptr c, std::int64_t ldc) {
  if (a.es == 2)
    kern.gemm_bf16(ta, tb, m, n, k, 1.f, reinterpret_cast<const std::uint16_t*>(a.p), lda,
                   reinterpret_cast<const std::uint16_t*>(b.p), ldb, beta, c.p, ldc, false);
  else
    gemm(kern, ta, tb, m, n, k, 1.f, a, lda, b, ldb, beta, c, ldc);
}

// Both operands float32, or both bfloat16; a mixed pair is a TypeError, as in PyTorch.
DType product_dtype(const Tensor& a, const Tensor& b, const char* op, const char* an, const char* bn) {
  check_defined(a, op, an);
  check_defined(b, op, bn);
  for (const Tensor* t : {&a, &b})
    if (t->dtype() != DType::Float32 && t->dtype() != DType::BFloat16)
      throw TypeError(detail::concat(op, ": '", t == &a ? an : bn, "' must be float32 or bfloat16, got ",
                                     dtype_name(t->dtype()), " ", shape_str(t->shape())));
  if (a.dtype() != b.dtype())
    throw TypeError(detail::concat(op, ": '", an, "' is ", dtype_name(a.dtype()), " but '", bn, "' is ",
                                   dtype_name(b.dtype()), "; cast one with to_dtype() (both float32 or both "
                                   "bfloat16, as PyTorch requires)"));
  return a.dtype();
}

// A gradient buffer in the product's dtype (float32 ones may be written into the leaf's
// gradient destination; bfloat16 ones are always fresh).
Tensor grad_buffer(const Node& node, std::size_t i, const Shape& shape, Device device, DType dt) {
  if (dt == DType::Float32) return autograd::gradient_buffer(node, i, shape, device);
  return Tensor::empty(shape, dt, device);
}

// The incoming gradient in the product's dtype (a caller may hand a float32 one to a bf16 output).
Tensor as_dtype(const Tensor& g, DType dt) { return g.dtype() == dt ? g : to_dtype(g, dt); }

class MatmulBackward final : public Node {
 public:
  MatmulBackward(Tensor a, Tensor b) : a_(std::move(a)), b_(std::move(b)) {}
  std::vector<Tensor> apply(const Tensor& g_in) override {
    const std::int64_t m = a_.shape()[0], k = a_.shape()[1], n = b_.shape()[1];
    const DType dt = a_.dtype();
    const Tensor g = as_dtype(g_in, dt);
    DeviceKernels& kern = kernels_for(g.device());
    Tensor ga, gb;
    if (needs_grad(*this, 0)) {  // dA = dC B^T
      ga = grad_buffer(*this, 0, {m, k}, g.device(), dt);
      gemm(kern, false, true, m, k, n, 1.f, dptr(g), n, dptr(b_), n, 0.f, dptr(ga), k);
    }
    if (needs_grad(*this, 1)) {  // dB = A^T dC
      gb = grad_buffer(*this, 1, {k, n}, g.device(), dt);
      gemm(kern, true, false, k, n, m, 1.f, dptr(a_), k, dptr(g), n, 0.f, dptr(gb), n);
    }
    return {ga, gb};
  }
  const char* name() const override { return "MatmulBackward"; }
  void release_saved() override { a_ = Tensor(); b_ = Tensor(); }

 private:
  Tensor a_, b_;
};

// torch.matmul beyond 2-D x 2-D: 1-D operands promoted (a: [K] -> [1, K], b: [K] -> [K, 1]),
// batch dims (all but the last two) broadcast against each other.
struct MatmulPlan {
  Shape a_shape, b_shape, out_shape;
  std::int64_t m = 0, k = 0, n = 0;
  Shape batch;                       // the broadcast batch dims
  std::vector<std::int64_t> sa, sb;  // per batch dim: step in matrices through a / b (0: broadcast)
  std::int64_t count = 1;            // matrices in the batch
  bool fold = false;                 // b has no batch dims: one GEMM over [count * m, k] rows
};

std::string batch_str(const Shape& s, std::size_t drop) {
  return shape_str(Shape(s.begin(), s.end() - static_cast<std::ptrdiff_t>(std::min(drop, s.size()))));
}

MatmulPlan plan_matmul(const Shape& as, const Shape& bs) {
  MatmulPlan p;
  p.a_shape = as;
  p.b_shape = bs;
  if (as.empty() || bs.empty())
    throw ShapeError("matmul: both operands need at least one dim, got " + shape_str(as) + " x " + shape_str(bs));
  const std::size_t da = as.size(), db = bs.size();
  p.m = da == 1 ? 1 : as[da - 2];
  p.k = as[da - 1];
  const std::int64_t kb = db == 1 ? bs[0] : bs[db - 2];
  p.n = db == 1 ? 1 : bs[db - 1];
  if (p.k != kb)
    throw ShapeError(detail::concat("matmul: ", shape_str(as), " x ", shape_str(bs), ": a's last dim (", p.k,
                                    ") must equal b's ", db == 1 ? "only" : "second-to-last", " dim (", kb, ")"));
  const std::size_t na = da > 2 ? da - 2 : 0, nb = db > 2 ? db - 2 : 0;
  const std::size_t nbatch = std::max(na, nb);
  p.batch.assign(nbatch, 1);
  for (std::size_t i = 0; i < nbatch; ++i) {  // right-aligned, as numpy broadcasting
    const std::int64_t x = i + na >= nbatch ? as[i + na - nbatch] : 1;
    const std::int64_t y = i + nb >= nbatch ? bs[i + nb - nbatch] : 1;
    if (x != y && x != 1 && y != 1)
      throw ShapeError(detail::concat("matmul: the batch dims of ", shape_str(as), " and ", shape_str(bs), " (",
                                      batch_str(as, 2), " and ", batch_str(bs, 2), ") do not broadcast"));
    p.batch[i] = x == 1 ? y : x;
  }
  // Steps in matrices, innermost batch dim last; 0 along a dim the operand broadcasts.
  p.sa.assign(nbatch, 0);
  p.sb.assign(nbatch, 0);
  std::int64_t acc_a = 1, acc_b = 1;
  for (std::size_t i = nbatch; i-- > 0;) {
    const std::int64_t x = i + na >= nbatch ? as[i + na - nbatch] : 1;
    const std::int64_t y = i + nb >= nbatch ? bs[i + nb - nbatch] : 1;
    if (x != 1) p.sa[i] = acc_a;
    if (y != 1) p.sb[i] = acc_b;
    acc_a *= x;
    acc_b *= y;
  }
  for (std::int64_t d : p.batch) p.count *= d;
  p.fold = nb == 0;
  p.out_shape = p.batch;
  if (da > 1) p.out_shape.push_back(p.m);
  if (db > 1) p.out_shape.push_back(p.n);
  return p;
}

// Calls f(i, a_off, b_off, first_a, first_b) for every matrix i of the batch: the offsets (in
// matrices) of its operands, and whether this is the first visit of that a / b matrix (row-major
// order: every index along the dims the operand broadcasts is 0), which a backward uses to
// write (beta = 0) rather than accumulate (beta = 1) a broadcast operand's gradient.
template <typename F>
void for_each_matrix(const MatmulPlan& p, F&& f) {
  const std::size_t nd = p.batch.size();
  std::vector<std::int64_t> idx(nd, 0);
  std::int64_t a_off = 0, b_off = 0;
  for (std::int64_t i = 0; i < p.count; ++i) {
    bool first_a = true, first_b = true;
    for (std::size_t d = 0; d < nd; ++d)
      if (idx[d] != 0) {
        if (p.sa[d] == 0) first_a = false;
        if (p.sb[d] == 0) first_b = false;
      }
    f(i, a_off, b_off, first_a, first_b);
    for (std::size_t d = nd; d-- > 0;) {
      a_off += p.sa[d];
      b_off += p.sb[d];
      if (++idx[d] < p.batch[d]) break;
      a_off -= p.sa[d] * p.batch[d];
      b_off -= p.sb[d] * p.batch[d];
      idx[d] = 0;
    }
  }
}

class BatchedMatmulBackward final : public Node {
 public:
  BatchedMatmulBackward(MatmulPlan p, Tensor a, Tensor b) : p_(std::move(p)), a_(std::move(a)), b_(std::move(b)) {}
  std::vector<Tensor> apply(const Tensor& g_in) override {
    const DType dt = a_.dtype();
    const Tensor g = as_dtype(g_in, dt);
    DeviceKernels& kern = kernels_for(g.device());
    const std::int64_t m = p_.m, k = p_.k, n = p_.n;
    const bool want_a = needs_grad(*this, 0), want_b = needs_grad(*this, 1);
    Tensor ga, gb;
    if (want_a) ga = grad_buffer(*this, 0, p_.a_shape, g.device(), dt);
    if (want_b) gb = grad_buffer(*this, 1, p_.b_shape, g.device(), dt);
    if (m * n * k * p_.count == 0) {  // an empty product: the gradients are zeros (GEMM needs ld >= 1)
      if (want_a) kern.fill(ga, 0.0);
      if (want_b) kern.fill(gb, 0.0);
      return {ga, gb};
    }
    if (p_.fold) {
      const std::int64_t rows = p_.count * m;
      if (want_a)  // dA = dC B^T
        gemm(kern, false, true, rows, k, n, 1.f, dptr(g), n, dptr(b_), n, 0.f, dptr(ga), k);
      if (want_b)  // dB = A^T dC, summed over the folded batch by the GEMM itself
        gemm(kern, true, false, k, n, rows, 1.f, dptr(a_), k, dptr(g), n, 0.f, dptr(gb), n);
      return {ga, gb};
    }
    const Ptr pa = dptr(a_), pb = dptr(b_), pg = dptr(g);
    const Ptr pga = want_a ? dptr(ga) : Ptr{nullptr, 0};
    const Ptr pgb = want_b ? dptr(gb) : Ptr{nullptr, 0};
    // A broadcast operand's gradient sums several products: in bfloat16 each partial sum would
    // be rounded, so those accumulate in float32 and are rounded once at the end.
    Tensor ga32, gb32;
    Ptr acc_a = pga, acc_b = pgb;
    if (dt == DType::BFloat16) {
      if (want_a && ga.numel() < p_.count * m * k) acc_a = dptr(ga32 = Tensor::empty(p_.a_shape, DType::Float32, g.device()));
      if (want_b && gb.numel() < p_.count * k * n) acc_b = dptr(gb32 = Tensor::empty(p_.b_shape, DType::Float32, g.device()));
    }
    for_each_matrix(p_, [&](std::int64_t i, std::int64_t ao, std::int64_t bo, bool first_a, bool first_b) {
      const Ptr gi = pg + i * m * n;
      if (want_a) {
        const Ptr dst = acc_a + ao * m * k;
        if (dt == DType::BFloat16 && !ga32.defined())
          gemm(kern, false, true, m, k, n, 1.f, gi, n, pb + bo * k * n, n, 0.f, dst, k);
        else
          gemm_f32_out(kern, false, true, m, k, n, gi, n, pb + bo * k * n, n, first_a ? 0.f : 1.f, dst, k);
      }
      if (want_b) {
        const Ptr dst = acc_b + bo * k * n;
        if (dt == DType::BFloat16 && !gb32.defined())
          gemm(kern, true, false, k, n, m, 1.f, pa + ao * m * k, k, gi, n, 0.f, dst, n);
        else
          gemm_f32_out(kern, true, false, k, n, m, pa + ao * m * k, k, gi, n, first_b ? 0.f : 1.f, dst, n);
      }
    });
    if (ga32.defined()) convert_into(ga32, ga);
    if (gb32.defined()) convert_into(gb32, gb);
    return {ga, gb};
  }
  const char* name() const override { return "MatmulBackward"; }
  void release_saved() override { a_ = Tensor(); b_ = Tensor(); }

 private:
  MatmulPlan p_;
  Tensor a_, b_;
};

Tensor batched_matmul(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = contiguous_input(a_in), b = contiguous_input(b_in);
  MatmulPlan p = plan_matmul(a.shape(), b.shape());
  Tensor out = Tensor::empty(p.out_shape, a.dtype(), a.device());
  DeviceKernels& kern = kernels_for(a.device());
  const std::int64_t m = p.m, k = p.k, n = p.n;
  if (out.numel() > 0) {
    if (k == 0) {
      kern.fill(out, 0.0);
    } else if (p.fold) {
      gemm(kern, false, false, p.count * m, n, k, 1.f, dptr(a), k, dptr(b), n, 0.f, dptr(out), n);
    } else {
      const Ptr pa = dptr(a), pb = dptr(b), po = dptr(out);
      for_each_matrix(p, [&](std::int64_t i, std::int64_t ao, std::int64_t bo, bool, bool) {
        gemm(kern, false, false, m, n, k, 1.f, pa + ao * m * k, k, pb + bo * k * n, n, 0.f, po + i * m * n, n);
      });
    }
  }
  if (grad_mode_enabled() && (a.requires_grad() || b.requires_grad()))
    autograd::record(std::make_shared<BatchedMatmulBackward>(std::move(p), a.detach(), b.detach()), {&a, &b}, out);
  return out;
}

class LinearBackward final : public Node {
 public:
  LinearBackward(Tensor x, Tensor w, bool has_bias)
      : x_(std::move(x)), w_(std::move(w)), has_bias_(has_bias) {}
  std::vector<Tensor> apply(const Tensor& g_in) override {
    const std::int64_t out_f = w_.shape()[0], in_f = w_.shape()[1];
    const DType dt = w_.dtype();
    const Tensor g = as_dtype(g_in, dt);
    const std::int64_t rows = g.numel() / out_f;
    DeviceKernels& k = kernels_for(g.device());
    Tensor gx, gw, gb;
    if (needs_grad(*this, 0)) {  // dX = dY W
      gx = Tensor::empty(x_.shape(), dt, g.device());
      gemm(k, false, false, rows, in_f, out_f, 1.f, dptr(g), out_f, dptr(w_), in_f, 0.f, dptr(gx), in_f);
    }
    if (needs_grad(*this, 1)) {  // dW = dY^T X
      gw = grad_buffer(*this, 1, w_.shape(), g.device(), dt);
      gemm(k, true, false, out_f, in_f, rows, 1.f, dptr(g), out_f, dptr(x_), in_f, 0.f, dptr(gw), in_f);
    }
    if (has_bias_ && needs_grad(*this, 2)) {  // db = column sums of dY
      gb = grad_buffer(*this, 2, {out_f}, g.device(), dt);
      if (dt == DType::Float32) {
        k.sum_to_period(g, gb, 1.f);
      } else {  // summed in float32, rounded once (the CPU kernel reads bf16 itself)
        Tensor sum = Tensor::empty({out_f}, DType::Float32, g.device());
        k.sum_to_period(g.device().is_cpu() ? g : to_dtype(g, DType::Float32), sum, 1.f);
        convert_into(sum, gb);
      }
    }
    return {gx, gw, gb};
  }
  const char* name() const override { return "LinearBackward"; }
  void release_saved() override { x_ = Tensor(); w_ = Tensor(); }

 private:
  Tensor x_, w_;
  bool has_bias_;
};

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = contiguous_input(a_in), b = contiguous_input(b_in);
  if (autocast_detail::applies(autocast_detail::Op::Matmul, a))
    return autocast_detail::call(autocast_detail::Op::Matmul, [](const Tensor& x, const Tensor& y) { return matmul(x, y); },
                                 a, b);
  const DType dt = product_dtype(a, b, "matmul", "a", "b");
  check_same_device(a, b, "matmul");
  if (a.dim() != 2 || b.dim() != 2) return batched_matmul(a, b);
  if (a.shape()[1] != b.shape()[0])
    throw ShapeError("matmul: expected [M, K] x [K, N], got " + shape_str(a.shape()) + " x " +
                     shape_str(b.shape()));
  const std::int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  Tensor out = Tensor::empty({m, n}, dt, a.device());
  gemm(kernels_for(a.device()), false, false, m, n, k, 1.f, dptr(a), k, dptr(b), n, 0.f, dptr(out), n);
  if (grad_mode_enabled() && (a.requires_grad() || b.requires_grad()))
    autograd::record(std::make_shared<MatmulBackward>(a.detach(), b.detach()), {&a, &b}, out);
  return out;
}

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
  const Tensor x = contiguous_input(x_in), weight = contiguous_input(weight_in), bias = contiguous_input(bias_in);
  auto again = [](const Tensor& a, const Tensor& w, const Tensor& b) { return linear(a, w, b); };
  if (autocast_detail::applies(autocast_detail::Op::Linear, x))
    return autocast_detail::call(autocast_detail::Op::Linear, again, x, weight, bias);
  const DType dt = product_dtype(x, weight, "linear", "input", "weight");
  check_same_device(x, weight, "linear");
  if (weight.dim() != 2)
    throw ShapeError("linear: weight must be [out_features, in_features], got " +
                     shape_str(weight.shape()));
  const std::int64_t out_f = weight.shape()[0], in_f = weight.shape()[1];
  if (x.dim() < 1 || x.shape().back() != in_f)
    throw ShapeError(detail::concat("linear: input ", shape_str(x.shape()),
                                    " does not end in in_features = ", in_f, " (weight ",
                                    shape_str(weight.shape()), ")"));
  const bool has_bias = bias.defined();
  if (has_bias) {
    if (bias.dtype() != dt)
      throw TypeError(detail::concat("linear: 'bias' is ", dtype_name(bias.dtype()), " but the product is ",
                                     dtype_name(dt), "; cast it with to_dtype() (PyTorch requires one dtype)"));
    if (bias.numel() != out_f || bias.dim() != 1)
      throw ShapeError(detail::concat("linear: bias ", shape_str(bias.shape()),
                                      " does not match out_features = ", out_f));
  }
  const std::int64_t rows = x.numel() / in_f;
  Shape out_shape = x.shape();
  out_shape.back() = out_f;
  Tensor out = Tensor::empty(out_shape, dt, x.device());
  DeviceKernels& k = kernels_for(x.device());
  if (has_bias) {  // then GEMM accumulates onto it (beta = 1; bf16: bias + sum rounded once)
    if (dt == DType::Float32) {
      k.broadcast_rows(bias, out);
    } else {
      StridedLayout l;
      l.ndim = 2;
      l.sizes[0] = rows, l.sizes[1] = out_f;
      l.src_strides[0] = 0, l.src_strides[1] = 1;
      l.dst_strides[0] = out_f, l.dst_strides[1] = 1;
      if (rows > 0 && out_f > 0) k.strided_copy(bias, l, out);
    }
  }
  gemm(k, false, true, rows, out_f, in_f, 1.f, dptr(x), in_f, dptr(weight), in_f, has_bias ? 1.f : 0.f,
       dptr(out), out_f);
  if (grad_mode_enabled() &&
      (x.requires_grad() || weight.requires_grad() || (has_bias && bias.requires_grad()))) {
    auto node = std::make_shared<LinearBackward>(x.detach(), weight.detach(), has_bias);
    autograd::record(node, {&x, &weight, has_bias ? &bias : nullptr}, out);
  }
  return out;
}

}  // namespace phalanx
