#include "sim_kernels.hpp"

#include <cstring>
#include <memory>
#include <vector>

#include "phalanx/core/tensor_impl.hpp"
#include "sim_allocator.hpp"
#include "sim_side_stream.hpp"
#include "sim_stream.hpp"

namespace phalanx::sim {

namespace {

DeviceKernels& cpu() { return kernels_for(Device::cpu()); }

/// A CPU tensor over the host memory of sim tensor `t` (undefined stays undefined); it
/// keeps `t`'s storage alive.
Tensor host_view(const Tensor& t, const char* op) {
  if (!t.defined()) return t;
  if (t.device().type != DeviceType::Sim)
    throw TypeError(detail::concat("sim kernel ", op, ": got ", t.str(), "; every operand must be on the "
                                   "sim device (move it with .to(Device::sim()))"));
  void* p = Allocator::instance().host(t.raw_data(), t.nbytes(), op);
  auto storage = Storage::borrow(p, t.nbytes(), Device::cpu(), t.impl()->storage());
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), 0, t.shape(), t.dtype()));
}

/// Bytes a row-major GEMM operand of `rows` x `cols` with leading dimension `ld` spans.
std::size_t span(std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  if (rows <= 0 || cols <= 0) return 0;
  return static_cast<std::size_t>((rows - 1) * ld + cols) * sizeof(float);
}

class SimKernels final : public DeviceKernels {
 public:
  const char* name() const override { return "sim"; }

  void* allocate(std::size_t nbytes, int) override {
    Stream::instance().note_allocation(nbytes);
    return Allocator::instance().allocate(nbytes);
  }
  /// Stream-ordered, as a caching allocator's free on the stream that used the block: the
  /// block is poisoned and quarantined only after the work queued before the free has run.
  void deallocate(void* p, std::size_t nbytes, int) override {
    Stream::instance().submit_ordered([p, nbytes] { Allocator::instance().deallocate(p, nbytes); });
  }
  void copy(void* dst, const void* src, std::size_t n) override {
    if (!n) return;
    submit([=] {
      auto& a = Allocator::instance();
      std::memmove(a.host(dst, n, "copy (destination)"), a.host(src, n, "copy (source)"), n);
    });
  }
  // A read to the host waits for the compute stream, as cudaMemcpy does; a write from the
  // host is queued there with a copy of the bytes (the caller may reuse its buffer at once),
  // as a staged cudaMemcpyAsync: no host wait that would hide a missing event. On a
  // communication-stream thread both move the bytes as they are now.
  void copy_to_host(void* host_dst, const void* src, std::size_t n) override {
    if (!n) return;
    check_host(host_dst, "copy_to_host (destination)");
    host_wait();
    std::memcpy(host_dst, Allocator::instance().host(src, n, "copy_to_host (source)"), n);
  }
  void copy_from_host(void* dst, const void* host_src, std::size_t n) override {
    if (!n) return;
    check_host(host_src, "copy_from_host (source)");
    if (!on_comm_stream() && Stream::instance().mode() != Mode::Sync) {
      auto bytes = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(host_src),
                                                                static_cast<const unsigned char*>(host_src) + n);
      submit([dst, n, bytes] {
        std::memcpy(Allocator::instance().host(dst, n, "copy_from_host (destination)"), bytes->data(), n);
      });
      return;
    }
    std::memcpy(Allocator::instance().host(dst, n, "copy_from_host (destination)"), host_src, n);
  }

  // ---- stream ordering: an event is a stream's item count when it was recorded ----
  // The compute stream's (event_record), or the side stream's (SideEvent::record: the
  // stream of a backend that orders device streams itself, through the test hooks).
  void* event_create(int) override { return new SimEvent; }
  void event_destroy(void* e) override { delete static_cast<SimEvent*>(e); }
  void event_record(void* e) override { *static_cast<SimEvent*>(e) = SimEvent{Stream::instance().ticket(), false}; }
  void event_synchronize(void* e) override {
    const SimEvent& ev = *static_cast<SimEvent*>(e);
    if (ev.side)
      SideStream::instance().wait_ticket(ev.ticket);
    else
      Stream::instance().wait_ticket(ev.ticket);
  }
  bool event_query(void* e) override {
    const SimEvent& ev = *static_cast<SimEvent*>(e);
    return ev.side ? SideStream::instance().ticket_done(ev.ticket) : Stream::instance().ticket_done(ev.ticket);
  }
  // One compute stream: waiting for its own event is a no-op. For a side-stream event the
  // compute stream queues a wait (the device-side wait of a Work: no host block); a
  // communication-stream thread (which runs its work at once) waits on the host.
  void stream_wait_event(void* e) override {
    const SimEvent ev = *static_cast<SimEvent*>(e);
    if (!ev.side || ev.ticket == 0) return;
    if (on_comm_stream() || Stream::instance().mode() == Mode::Sync) {
      SideStream::instance().wait_ticket(ev.ticket);
      return;
    }
    Stream::instance().submit([t = ev.ticket] { SideStream::instance().wait_ticket(t); });
  }
  void* event_handle(void* e) override { return e; }  // the SimEvent itself (test hooks)
  void set_comm_stream(bool on) override { sim::set_comm_stream(on); }

  void fill(Tensor& out, double value) override {
    submit([=] {
      Tensor o = host_view(out, "fill");
      cpu().fill(o, value);
    });
  }
  void unary(UnaryOp op, const Tensor& x, Tensor& out) override {
    submit([=] {
      Tensor o = host_view(out, "unary");
      cpu().unary(op, host_view(x, "unary"), o);
    });
  }
  void unary_backward(UnaryOp op, const Tensor& gy, const Tensor& x, const Tensor& y, Tensor& gx) override {
    submit([=] {
      Tensor o = host_view(gx, "unary_backward");
      cpu().unary_backward(op, host_view(gy, "unary_backward"), host_view(x, "unary_backward"),
                           host_view(y, "unary_backward"), o);
    });
  }
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override {
    submit([=] {
      Tensor o = host_view(out, "binary");
      cpu().binary(op, host_view(a, "binary"), host_view(b, "binary"), o);
    });
  }
  void affine_scalar(const Tensor& x, float mul, float add, Tensor& out) override {
    submit([=] {
      Tensor o = host_view(out, "affine_scalar");
      cpu().affine_scalar(host_view(x, "affine_scalar"), mul, add, o);
    });
  }
  void axpy(float alpha, const Tensor& x, Tensor& y) override {
    submit([=] {
      Tensor o = host_view(y, "axpy");
      cpu().axpy(alpha, host_view(x, "axpy"), o);
    });
  }
  void scale(Tensor& x, float factor) override {
    submit([=] {
      Tensor o = host_view(x, "scale");
      cpu().scale(o, factor);
    });
  }
  void divide(Tensor& x, float divisor) override {
    submit([=] {
      Tensor o = host_view(x, "divide");
      cpu().divide(o, divisor);
    });
  }

  void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
            std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) override {
    submit([=] {
      auto& al = Allocator::instance();
      const float* ha = static_cast<const float*>(al.host(a, ta ? span(k, m, lda) : span(m, k, lda), "gemm (A)"));
      const float* hb = static_cast<const float*>(al.host(b, tb ? span(n, k, ldb) : span(k, n, ldb), "gemm (B)"));
      float* hc = static_cast<float*>(al.host(c, span(m, n, ldc), "gemm (C)"));
      cpu().gemm(ta, tb, m, n, k, alpha, ha, lda, hb, ldb, beta, hc, ldc);
    });
  }

  void sum_to_period(const Tensor& in, Tensor& out, float scale) override {
    submit([=] {
      Tensor o = host_view(out, "sum_to_period");
      cpu().sum_to_period(host_view(in, "sum_to_period"), o, scale);
    });
  }
  void sum_dim(const Tensor& in, std::int64_t outer, std::int64_t d, std::int64_t inner, Tensor& out,
               float scale) override {
    submit([=] {
      Tensor o = host_view(out, "sum_dim");
      cpu().sum_dim(host_view(in, "sum_dim"), outer, d, inner, o, scale);
    });
  }
  void expand_dim(const Tensor& g, std::int64_t outer, std::int64_t d, std::int64_t inner, Tensor& out,
                  float scale) override {
    submit([=] {
      Tensor o = host_view(out, "expand_dim");
      cpu().expand_dim(host_view(g, "expand_dim"), outer, d, inner, o, scale);
    });
  }
  void broadcast_rows(const Tensor& row, Tensor& out) override {
    submit([=] {
      Tensor o = host_view(out, "broadcast_rows");
      cpu().broadcast_rows(host_view(row, "broadcast_rows"), o);
    });
  }
  void transpose(const Tensor& in, int d0, int d1, Tensor& out) override {
    submit([=] {
      Tensor o = host_view(out, "transpose");
      cpu().transpose(host_view(in, "transpose"), d0, d1, o);
    });
  }

  // ---- layout and masks ----
  void strided_copy(const Tensor& src, const StridedLayout& l, Tensor& dst) override {
    submit([=] {
      Tensor o = host_view(dst, "strided_copy");
      cpu().strided_copy(host_view(src, "strided_copy"), l, o);
    });
  }
  void masked_fill(const Tensor& x, const Tensor& mask, float value, Tensor& out) override {
    submit([=] {
      Tensor o = host_view(out, "masked_fill");
      cpu().masked_fill(host_view(x, "masked_fill"), host_view(mask, "masked_fill"), value, o);
    });
  }
  void triangle(const Tensor& x, std::int64_t rows, std::int64_t cols, std::int64_t diagonal, bool upper,
                Tensor& out) override {
    submit([=] {
      Tensor o = host_view(out, "triangle");
      cpu().triangle(host_view(x, "triangle"), rows, cols, diagonal, upper, o);
    });
  }
  // ---- end layout and masks ----

  void log_softmax(const Tensor& x, std::int64_t outer, std::int64_t d, std::int64_t inner, Tensor& out) override {
    submit([=] {
      Tensor o = host_view(out, "log_softmax");
      cpu().log_softmax(host_view(x, "log_softmax"), outer, d, inner, o);
    });
  }
  void log_softmax_backward(const Tensor& gy, const Tensor& y, std::int64_t outer, std::int64_t d,
                            std::int64_t inner, Tensor& gx) override {
    submit([=] {
      Tensor o = host_view(gx, "log_softmax_backward");
      cpu().log_softmax_backward(host_view(gy, "log_softmax_backward"), host_view(y, "log_softmax_backward"),
                                 outer, d, inner, o);
    });
  }
  void cross_entropy(const Tensor& logits, const Tensor& target, Tensor& probs, Tensor& loss) override {
    submit([=] {
      Tensor p = host_view(probs, "cross_entropy"), l = host_view(loss, "cross_entropy");
      cpu().cross_entropy(host_view(logits, "cross_entropy"), host_view(target, "cross_entropy"), p, l);
    });
  }
  void cross_entropy_backward(const Tensor& probs, const Tensor& target, const Tensor& grad_loss, float scale,
                              Tensor& grad_logits) override {
    submit([=] {
      Tensor o = host_view(grad_logits, "cross_entropy_backward");
      cpu().cross_entropy_backward(host_view(probs, "cross_entropy_backward"),
                                   host_view(target, "cross_entropy_backward"),
                                   host_view(grad_loss, "cross_entropy_backward"), scale, o);
    });
  }
  void convert(const Tensor& src, Tensor& dst) override {
    submit([=] {
      Tensor o = host_view(dst, "convert");
      cpu().convert(host_view(src, "convert"), o);
    });
  }

  void sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, const SgdUpdate& u) override {
    submit([=] {
      Tensor p = host_view(param, "sgd_update"), b = host_view(buf, "sgd_update");
      cpu().sgd_update(p, host_view(grad, "sgd_update"), b, u);
    });
  }
  void adam_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, Tensor& vmax,
                   const AdamUpdate& u) override {
    submit([=] {
      Tensor p = host_view(param, "adam_update"), hm = host_view(m, "adam_update"),
             hv = host_view(v, "adam_update"), hx = host_view(vmax, "adam_update");
      cpu().adam_update(p, host_view(grad, "adam_update"), hm, hv, hx, u);
    });
  }

  void abs_max_into(const Tensor& x, Tensor& out, std::int64_t index) override {
    submit([=] {
      Tensor o = host_view(out, "abs_max_into");
      cpu().abs_max_into(host_view(x, "abs_max_into"), o, index);
    });
  }
  void fixed_point_accumulate(const Tensor& x, double scale, Tensor& acc) override {
    submit([=] {
      Tensor o = host_view(acc, "fixed_point_accumulate");
      cpu().fixed_point_accumulate(host_view(x, "fixed_point_accumulate"), scale, o);
    });
  }
  void fixed_point_to_float(const Tensor& acc, double scale, double count, Tensor& out) override {
    submit([=] {
      Tensor o = host_view(out, "fixed_point_to_float");
      cpu().fixed_point_to_float(host_view(acc, "fixed_point_to_float"), scale, count, o);
    });
  }

  // ---- attention ----
  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                         const AttentionParams& p, Tensor& out, Tensor& stats) override {
    submit([=] {
      Tensor o = host_view(out, "attention_forward"), l = host_view(stats, "attention_forward");
      cpu().attention_forward(host_view(q, "attention_forward"), host_view(k, "attention_forward"),
                              host_view(v, "attention_forward"), host_view(mask, "attention_forward"), p, o, l);
    });
  }
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Tensor& out,
                          const Tensor& stats, const Tensor& grad_out, const AttentionParams& p, Tensor& grad_q,
                          Tensor& grad_k, Tensor& grad_v) override {
    submit([=] {
      const char* op = "attention_backward";
      Tensor gq = host_view(grad_q, op), gk = host_view(grad_k, op), gv = host_view(grad_v, op);
      cpu().attention_backward(host_view(q, op), host_view(k, op), host_view(v, op), host_view(mask, op),
                               host_view(out, op), host_view(stats, op), host_view(grad_out, op), p, gq, gk, gv);
    });
  }
  // ---- end attention ----
  // ---- normalisation, embedding, argmax, clamp ----
  void batch_norm_stats(const Tensor& x, std::int64_t outer, std::int64_t c, std::int64_t inner, Tensor& mean,
                        Tensor& var) override {
    submit([=] {
      Tensor m = host_view(mean, "batch_norm_stats"), v = host_view(var, "batch_norm_stats");
      cpu().batch_norm_stats(host_view(x, "batch_norm_stats"), outer, c, inner, m, v);
    });
  }
  void batch_norm_elemt(const Tensor& x, std::int64_t outer, std::int64_t c, std::int64_t inner, const Tensor& mean,
                        const Tensor& invstd, const Tensor& weight, const Tensor& bias, Tensor& out) override {
    submit([=] {
      const char* op = "batch_norm_elemt";
      Tensor o = host_view(out, op);
      cpu().batch_norm_elemt(host_view(x, op), outer, c, inner, host_view(mean, op), host_view(invstd, op),
                             host_view(weight, op), host_view(bias, op), o);
    });
  }
  void batch_norm_backward_reduce(const Tensor& gy, const Tensor& x, std::int64_t outer, std::int64_t c,
                                  std::int64_t inner, const Tensor& mean, Tensor& sum_dy, Tensor& sum_dy_xmu) override {
    submit([=] {
      const char* op = "batch_norm_backward_reduce";
      Tensor s = host_view(sum_dy, op), d = host_view(sum_dy_xmu, op);
      cpu().batch_norm_backward_reduce(host_view(gy, op), host_view(x, op), outer, c, inner, host_view(mean, op), s, d);
    });
  }
  void batch_norm_backward_elemt(const Tensor& gy, const Tensor& x, std::int64_t outer, std::int64_t c,
                                 std::int64_t inner, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                                 const Tensor& sum_dy, const Tensor& sum_dy_xmu, double count, Tensor& gx) override {
    submit([=] {
      const char* op = "batch_norm_backward_elemt";
      Tensor o = host_view(gx, op);
      cpu().batch_norm_backward_elemt(host_view(gy, op), host_view(x, op), outer, c, inner, host_view(mean, op),
                                      host_view(invstd, op), host_view(weight, op), host_view(sum_dy, op),
                                      host_view(sum_dy_xmu, op), count, o);
    });
  }
  void embedding(const Tensor& weight, const Tensor& indices, Tensor& out) override {
    submit([=] {
      Tensor o = host_view(out, "embedding");
      cpu().embedding(host_view(weight, "embedding"), host_view(indices, "embedding"), o);
    });
  }
  void embedding_backward(const Tensor& grad, const Tensor& indices, std::int64_t padding_idx,
                          Tensor& grad_weight) override {
    submit([=] {
      Tensor o = host_view(grad_weight, "embedding_backward");
      cpu().embedding_backward(host_view(grad, "embedding_backward"), host_view(indices, "embedding_backward"),
                               padding_idx, o);
    });
  }
  void argmax(const Tensor& x, std::int64_t outer, std::int64_t d, std::int64_t inner, Tensor& out) override {
    submit([=] {
      Tensor o = host_view(out, "argmax");
      cpu().argmax(host_view(x, "argmax"), outer, d, inner, o);
    });
  }
  void clamp(const Tensor& x, float lo, float hi, Tensor& out) override {
    submit([=] {
      Tensor o = host_view(out, "clamp");
      cpu().clamp(host_view(x, "clamp"), lo, hi, o);
    });
  }
  // ---- end normalisation, embedding, argmax, clamp ----

  // ---- convolution and pooling ----
  void im2col(const Tensor& x, std::int64_t image, const Window2d& g, Tensor& col) override {
    submit([=] {
      Tensor o = host_view(col, "im2col");
      cpu().im2col(host_view(x, "im2col"), image, g, o);
    });
  }
  void col2im(const Tensor& col, std::int64_t image, const Window2d& g, Tensor& grad_x) override {
    submit([=] {
      Tensor o = host_view(grad_x, "col2im");
      cpu().col2im(host_view(col, "col2im"), image, g, o);
    });
  }
  void max_pool2d(const Tensor& x, const Window2d& g, Tensor& out, Tensor& indices) override {
    submit([=] {
      Tensor o = host_view(out, "max_pool2d"), i = host_view(indices, "max_pool2d");
      cpu().max_pool2d(host_view(x, "max_pool2d"), g, o, i);
    });
  }
  void max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Window2d& g,
                           Tensor& grad_x) override {
    submit([=] {
      Tensor o = host_view(grad_x, "max_pool2d_backward");
      cpu().max_pool2d_backward(host_view(grad_out, "max_pool2d_backward"), host_view(indices, "max_pool2d_backward"),
                                g, o);
    });
  }
  void avg_pool2d(const Tensor& x, const Window2d& g, bool count_include_pad, Tensor& out) override {
    submit([=] {
      Tensor o = host_view(out, "avg_pool2d");
      cpu().avg_pool2d(host_view(x, "avg_pool2d"), g, count_include_pad, o);
    });
  }
  void avg_pool2d_backward(const Tensor& grad_out, const Window2d& g, bool count_include_pad,
                           Tensor& grad_x) override {
    submit([=] {
      Tensor o = host_view(grad_x, "avg_pool2d_backward");
      cpu().avg_pool2d_backward(host_view(grad_out, "avg_pool2d_backward"), g, count_include_pad, o);
    });
  }
  void adaptive_avg_pool2d(const Tensor& x, const Window2d& g, Tensor& out) override {
    submit([=] {
      Tensor o = host_view(out, "adaptive_avg_pool2d");
      cpu().adaptive_avg_pool2d(host_view(x, "adaptive_avg_pool2d"), g, o);
    });
  }
  void adaptive_avg_pool2d_backward(const Tensor& grad_out, const Window2d& g, Tensor& grad_x) override {
    submit([=] {
      Tensor o = host_view(grad_x, "adaptive_avg_pool2d_backward");
      cpu().adaptive_avg_pool2d_backward(host_view(grad_out, "adaptive_avg_pool2d_backward"), g, o);
    });
  }
  void add_channel_bias(const Tensor& bias, std::int64_t outer, std::int64_t inner, Tensor& out) override {
    submit([=] {
      Tensor o = host_view(out, "add_channel_bias");
      cpu().add_channel_bias(host_view(bias, "add_channel_bias"), outer, inner, o);
    });
  }
  void channel_sum(const Tensor& g, std::int64_t outer, std::int64_t inner, Tensor& out) override {
    submit([=] {
      Tensor o = host_view(out, "channel_sum");
      cpu().channel_sum(host_view(g, "channel_sum"), outer, inner, o);
    });
  }
  // ---- end convolution and pooling ----

  std::int64_t find_label_out_of_range(const Tensor& target, std::int64_t classes) override {
    host_wait();  // returns a value to the host
    return cpu().find_label_out_of_range(host_view(target, "find_label_out_of_range"), classes);
  }

 private:
  static void submit(std::function<void()> fn) { Stream::instance().submit(std::move(fn)); }
  static void host_wait() {
    if (!on_comm_stream() && Stream::instance().mode() != Mode::Sync) Stream::instance().synchronize();
  }
  static void check_host(const void* p, const char* what) {
    if (is_tagged(p))
      throw ValueError(detail::concat("sim device: ", what, " got a sim pointer (", p,
                                      ") where host memory belongs"));
  }
};

}  // namespace

DeviceKernels& table() {
  static SimKernels* k = new SimKernels;  // never destroyed: storages may die during exit
  return *k;
}

}  // namespace phalanx::sim
