#pragma once
// The CUDA kernel table: the same operations as the CPU table, on the default stream.
// GEMM goes to cuBLAS; everything else is a kernel in cuda_kernels.cu.
#include <cublas_v2.h>

#include <mutex>
#include <vector>

#include "cuda_allocator.hpp"
#include "label_check.hpp"
#include "phalanx/core/kernels.hpp"

namespace phalanx::cuda {

class CudaKernels final : public DeviceKernels {
 public:
  const char* name() const override { return "cuda"; }
  void* allocate(std::size_t nbytes, int device) override { return alloc_.allocate(nbytes, device); }
  void deallocate(void* p, std::size_t nbytes, int device) override { alloc_.deallocate(p, nbytes, device); }
  void copy(void* dst, const void* src, std::size_t nbytes) override;
  void copy_to_host(void* dst, const void* src, std::size_t nbytes) override;
  void copy_from_host(void* dst, const void* src, std::size_t nbytes) override;

  void fill(Tensor& out, double value) override;
  void unary(UnaryOp op, const Tensor& x, Tensor& out) override;
  void unary_backward(UnaryOp op, const Tensor& grad_y, const Tensor& x, const Tensor& y, Tensor& grad_x) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override;
  void affine_scalar(const Tensor& x, float mul, float add, Tensor& out) override;
  void axpy(float alpha, const Tensor& x, Tensor& y) override;
  void scale(Tensor& x, float factor) override;
  void divide(Tensor& x, float divisor) override;
  void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
            std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) override;
  void sum_to_period(const Tensor& in, Tensor& out, float scale) override;
  void sum_dim(const Tensor& in, std::int64_t outer, std::int64_t d, std::int64_t inner, Tensor& out,
               float scale) override;
  void expand_dim(const Tensor& g, std::int64_t outer, std::int64_t d, std::int64_t inner, Tensor& out,
                  float scale) override;
  void broadcast_rows(const Tensor& row, Tensor& out) override;
  void transpose(const Tensor& in, int d0, int d1, Tensor& out) override;
  void log_softmax(const Tensor& x, std::int64_t outer, std::int64_t d, std::int64_t inner, Tensor& out) override;
  void log_softmax_backward(const Tensor& grad_y, const Tensor& y, std::int64_t outer, std::int64_t d,
                            std::int64_t inner, Tensor& grad_x) override;
  void cross_entropy(const Tensor& logits, const Tensor& target, Tensor& probs, Tensor& loss) override;
  void cross_entropy_backward(const Tensor& probs, const Tensor& target, const Tensor& grad_loss, float scale,
                              Tensor& grad_logits) override;
  std::int64_t find_label_out_of_range(const Tensor& target, std::int64_t classes) override;
  void abs_max_into(const Tensor& x, Tensor& out, std::int64_t index) override;
  void fixed_point_accumulate(const Tensor& x, double scale, Tensor& acc) override;
  void fixed_point_to_float(const Tensor& acc, double scale, double count, Tensor& out) override;
  // ---- normalisation, embedding, argmax, clamp ----
  void batch_norm_stats(const Tensor& x, std::int64_t outer, std::int64_t c, std::int64_t inner, Tensor& mean,
                        Tensor& var) override;
  void batch_norm_elemt(const Tensor& x, std::int64_t outer, std::int64_t c, std::int64_t inner, const Tensor& mean,
                        const Tensor& invstd, const Tensor& weight, const Tensor& bias, Tensor& out) override;
  void batch_norm_backward_reduce(const Tensor& grad_y, const Tensor& x, std::int64_t outer, std::int64_t c,
                                  std::int64_t inner, const Tensor& mean, Tensor& sum_dy, Tensor& sum_dy_xmu) override;
  void batch_norm_backward_elemt(const Tensor& grad_y, const Tensor& x, std::int64_t outer, std::int64_t c,
                                 std::int64_t inner, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                                 const Tensor& sum_dy, const Tensor& sum_dy_xmu, double count, Tensor& grad_x) override;
  void embedding(const Tensor& weight, const Tensor& indices, Tensor& out) override;
  void embedding_backward(const Tensor& grad, const Tensor& indices, std::int64_t padding_idx,
                          Tensor& grad_weight) override;
  void argmax(const Tensor& x, std::int64_t outer, std::int64_t d, std::int64_t inner, Tensor& out) override;
  void clamp(const Tensor& x, float lo, float hi, Tensor& out) override;
  // ---- end normalisation, embedding, argmax, clamp ----
  // ---- layout and masks (cuda_layout.cu) ----
  void strided_copy(const Tensor& src, const StridedLayout& l, Tensor& dst) override;
  void masked_fill(const Tensor& x, const Tensor& mask, float value, Tensor& out) override;
  void triangle(const Tensor& x, std::int64_t rows, std::int64_t cols, std::int64_t diagonal, bool upper,
                Tensor& out) override;
  // ---- end layout and masks ----
  // ---- convolution and pooling ----
  void im2col(const Tensor& x, std::int64_t image, const Window2d& g, Tensor& col) override;
  void col2im(const Tensor& col, std::int64_t image, const Window2d& g, Tensor& grad_x) override;
  void max_pool2d(const Tensor& x, const Window2d& g, Tensor& out, Tensor& indices) override;
  void max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Window2d& g,
                           Tensor& grad_x) override;
  void avg_pool2d(const Tensor& x, const Window2d& g, bool count_include_pad, Tensor& out) override;
  void avg_pool2d_backward(const Tensor& grad_out, const Window2d& g, bool count_include_pad,
                           Tensor& grad_x) override;
  void adaptive_avg_pool2d(const Tensor& x, const Window2d& g, Tensor& out) override;
  void adaptive_avg_pool2d_backward(const Tensor& grad_out, const Window2d& g, Tensor& grad_x) override;
  void add_channel_bias(const Tensor& bias, std::int64_t outer, std::int64_t inner, Tensor& out) override;
  void channel_sum(const Tensor& g, std::int64_t outer, std::int64_t inner, Tensor& out) override;
  // ---- end convolution and pooling ----
  // ---- attention (cuda_attention.cu) ----
  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                         const AttentionParams& p, Tensor& out, Tensor& stats) override;
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Tensor& out,
                          const Tensor& stats, const Tensor& grad_out, const AttentionParams& p, Tensor& grad_q,
                          Tensor& grad_k, Tensor& grad_v) override;
  // ---- end attention ----
  void convert(const Tensor& src, Tensor& dst) override;
  void sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SgdUpdate& u) override;
  void adam_update(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, Tensor& max_exp_avg_sq,
                   const AdamUpdate& u) override;
  // ---- stream ordering: events on the legacy default stream (every kernel's and copy's) ----
  // Untested on a GPU so far. set_comm_stream keeps the default (no-op): a staging copy of a
  // host backend stays a cudaMemcpy, ordered after every kernel already.
  void* event_create(int device) override;
  void event_destroy(void* event) override;
  void event_record(void* event) override;
  void event_synchronize(void* event) override;
  bool event_query(void* event) override;
  void stream_wait_event(void* event) override;
  void* event_handle(void* event) override;

 private:
  static constexpr int kMaxDevices = 64;  ///< cuBLAS handles, one per device index
  cublasHandle_t blas(int device);
  CachingAllocator alloc_;
  LabelCheck labels_;
  std::mutex blas_mu_;
  cublasHandle_t handles_[kMaxDevices] = {};
  /// An event and the device it was created on: cudaEventRecord needs a stream of that
  /// device, and the thread that records it may have another one current.
  struct Event {
    cudaEvent_t event;
    int device;
  };
  std::mutex events_mu_;
  std::vector<Event*> spare_events_;  ///< destroyed events, reused (one per collective)
};

/// The process-wide table (registered by the plugin's create()).
CudaKernels& table();

}  // namespace phalanx::cuda
