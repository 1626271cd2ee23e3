#pragma once
// The per-device dispatch table. Ops (core/src/ops) check shapes, allocate outputs and
// record autograd; the arithmetic is delegated to the table of the tensors' device.
// The CPU table is built in; a device plugin (CUDA) registers its own. Kernels receive
// contiguous tensors whose shapes the op has already validated.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "phalanx/core/device.hpp"
#include "phalanx/core/tensor.hpp"

namespace phalanx {

/// Hyper-parameters of one fused SGD update, PyTorch's formula (torch.optim.SGD, 1.13).
struct SgdUpdate {
  float lr, momentum, dampening, weight_decay;
  bool nesterov;
  bool first_step;  ///< the momentum buffer is initialised from the gradient
};

/// Hyper-parameters of one fused Adam/AdamW update (torch.optim.Adam/AdamW, 1.13).
struct AdamUpdate {
  float lr, beta1, beta2, eps, weight_decay;
  bool decoupled;  ///< AdamW: p *= 1 - lr * wd, instead of adding wd * p to the gradient
  bool amsgrad;
  float one_minus_beta1, one_minus_beta2;  ///< computed in double, as Python does
  float step_size;                         ///< lr / (1 - beta1^t), computed in double
  float bias_correction2_sqrt;             ///< sqrt(1 - beta2^t), computed in double
  float decay_factor;                      ///< 1 - lr * wd (AdamW), computed in double
};

/// One parameter of a multi-tensor SGD step (DeviceKernels::sgd_update_group): the tensors
/// sgd_update takes and whether this parameter's momentum buffer starts from its gradient
/// (SgdUpdate::first_step, which differs between parameters of one group).
struct SgdGroupEntry {
  Tensor* param;
  const Tensor* grad;
  Tensor* momentum_buffer;  ///< an undefined tensor when the group has no momentum
  bool first_step;
};

/// One parameter of a multi-tensor Adam/AdamW step (DeviceKernels::adam_update_group): the
/// tensors adam_update takes and its scalars (the step count, hence the bias corrections, is
/// per parameter).
struct AdamGroupEntry {
  Tensor* param;
  const Tensor* grad;
  Tensor* exp_avg;
  Tensor* exp_avg_sq;
  Tensor* max_exp_avg_sq;  ///< an undefined tensor without amsgrad
  AdamUpdate u;
};

/// Gelu: PyTorch's exact form x * (1 + erf(x / sqrt 2)) / 2;
/// Rsqrt: 1 / sqrt(x), correctly rounded sqrt then division (not an approximate rsqrt).
enum class UnaryOp : std::uint8_t { Neg, Exp, Log, Relu, Tanh, Sigmoid, Gelu, Rsqrt };
enum class BinaryOp : std::uint8_t { Add, Sub, Mul, Div };

// ---- convolution and pooling geometry ----
/// The windows of a 2-D convolution or pooling over NCHW input: n images of c channels
/// h x w, output oh x ow, kernel kh x kw, stride sh/sw, zero padding ph/pw, dilation dh/dw.
struct Window2d {
  std::int64_t n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
};
// ---- end convolution and pooling geometry ----

// ---- layout and masks geometry ----
/// The most dims a strided copy walks (after merging dims that are contiguous on both sides).
constexpr int kMaxLayoutDims = 8;
/// The index space of a strided copy: `ndim` dims of `sizes`, and per dim the step, in
/// elements, through the source and through the destination. A source step of 0 repeats the
/// source along that dim (broadcast). Offsets are in elements from each tensor's first element.
/// Steps are >= 0; every element the copy writes is distinct.
struct StridedLayout {
  int ndim = 0;
  std::int64_t sizes[kMaxLayoutDims] = {};
  std::int64_t src_strides[kMaxLayoutDims] = {};
  std::int64_t dst_strides[kMaxLayoutDims] = {};
  std::int64_t src_offset = 0, dst_offset = 0;
};
// ---- end layout and masks geometry ----
// ---- attention geometry ----
/// One scaled_dot_product_attention call as its kernels see it: `batch` independent heads
/// (the leading dims flattened, `lead` of them, sizes in lead_sizes), each q [l, e],
/// k [s, e], v [s, ev] and out [l, ev], contiguous float32 (q/k/v may be strided views on the
/// CPU: qkv_strided). The optional mask (kind) is
/// read at mask[offset(head) + i * mask_row_stride + j * mask_col_stride], where offset
/// sums head index * mask_lead_strides over the leading dims (stride 0: broadcast); strides
/// are in elements. Dropout (p > 0) keeps weight (head, i, j) when the counter-based hash
/// of (dropout_seed, (head * l + i) * s + j) is >= p (docs/attention.md), scaling kept
/// weights by 1 / (1 - p).
enum class AttentionMask : std::uint8_t { None, Float, Bool };
struct AttentionParams {
  static constexpr int kMaxLead = 8;
  std::int64_t batch, l, s, e, ev;
  float scale;
  bool causal;  ///< masks j > i (top-left aligned, PyTorch's tril(ones(L, S)))
  AttentionMask mask_kind;
  int lead;
  std::int64_t lead_sizes[kMaxLead];
  std::int64_t mask_lead_strides[kMaxLead];
  std::int64_t mask_row_stride, mask_col_stride;
  float dropout_p;
  std::uint64_t dropout_seed;
  /// The CPU kernels read q, k and v as views in place (nanoGPT's split/view/transpose of a
  /// packed qkv): when set, q/k/v are flat tensors spanning the views, head h's rows start at
  /// the sum of its leading indices times *_lead_strides and lie *_row_stride apart, each
  /// row's elements adjacent. Other devices get contiguous operands (false; strides unused).
  bool qkv_strided;
  std::int64_t q_lead_strides[kMaxLead], k_lead_strides[kMaxLead], v_lead_strides[kMaxLead];
  std::int64_t q_row_stride, k_row_stride, v_row_stride;
};
// ---- end attention geometry ----

class DeviceKernels {
 public:
  virtual ~DeviceKernels() = default;
  virtual const char* name() const = 0;

  // memory
  virtual void* allocate(std::size_t nbytes, int device_index) = 0;
  virtual void deallocate(void* ptr, std::size_t nbytes, int device_index) = 0;
  /// Byte copies; `to_host`/`from_host` copy between this device and host memory.
  virtual void copy(void* dst, const void* src, std::size_t nbytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, std::size_t nbytes) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, std::size_t nbytes) = 0;

  // elementwise (float32 unless stated)
  virtual void fill(Tensor& out, double value) = 0;  ///< any dtype (float16/bfloat16 rounded to nearest even)
  virtual void unary(UnaryOp op, const Tensor& x, Tensor& out) = 0;
  /// grad_x = grad_y * f'(x); `x` and `y` (= f(x)) are both given, a kernel uses what it needs.
  virtual void unary_backward(UnaryOp op, const Tensor& grad_y, const Tensor& x, const Tensor& y,
                              Tensor& grad_x) = 0;
  /// out = a op b where a smaller operand repeats with its own numel as period (the
  /// suffix broadcasting of a bias row or a scalar; op checked the shapes).
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) = 0;
  /// out = x * mul + add
  virtual void affine_scalar(const Tensor& x, float mul, float add, Tensor& out) = 0;
  /// y += alpha * x  (same numel)
  virtual void axpy(float alpha, const Tensor& x, Tensor& y) = 0;
  /// x *= factor
  virtual void scale(Tensor& x, float factor) = 0;
  /// x /= divisor (correctly rounded, unlike multiplying by a rounded reciprocal)
  virtual void divide(Tensor& x, float divisor) = 0;

  // GEMM (row-major): C = alpha * op(A) op(B) + beta * C, op(A) is M x K, op(B) is K x N.
  virtual void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                    float alpha, const float* a, std::int64_t lda, const float* b,
                    std::int64_t ldb, float beta, float* c, std::int64_t ldc) = 0;
  /// The same product with A and B bfloat16 (raw bits) and every product summed in float32.
  /// C is float32, or bfloat16 when `c_bf16` (then read as bfloat16 when beta != 0, and
  /// alpha * sum + beta * C rounded to nearest even once, at the store: PyTorch's addmm on
  /// bfloat16). The default throws a TypeError: a device without a bf16 GEMM (CUDA, sim).
  virtual void gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                         float alpha, const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b,
                         std::int64_t ldb, float beta, void* c, std::int64_t ldc, bool c_bf16);

  // reductions and layout
  /// out[j] = scale * sum_i in[i * P + j], P = out.numel() (reduces broadcast/bias gradients).
  virtual void sum_to_period(const Tensor& in, Tensor& out, float scale) = 0;
  /// View `in` as [outer, d, inner]; out[o, n] = scale * sum_i in[o, i, n].
  virtual void sum_dim(const Tensor& in, std::int64_t outer, std::int64_t d, std::int64_t inner,
                       Tensor& out, float scale) = 0;
  /// Inverse of sum_dim: out[o, i, n] = scale * g[o, n].
  virtual void expand_dim(const Tensor& g, std::int64_t outer, std::int64_t d, std::int64_t inner,
                          Tensor& out, float scale) = 0;
  /// Copies each row of `row` (numel = out's last dim) into every row of `out`.
  virtual void broadcast_rows(const Tensor& row, Tensor& out) = 0;
  /// out = in with dims d0 and d1 swapped (materialised).
  virtual void transpose(const Tensor& in, int d0, int d1, Tensor& out) = 0;

  // softmax family, over the middle dim of [outer, d, inner]
  virtual void log_softmax(const Tensor& x, std::int64_t outer, std::int64_t d, std::int64_t inner,
                           Tensor& out) = 0;
  virtual void log_softmax_backward(const Tensor& grad_y, const Tensor& y, std::int64_t outer,
                                    std::int64_t d, std::int64_t inner, Tensor& grad_x) = 0;
  /// logits [N, C], target int64 [N] (validated by the caller) -> probs [N, C], loss [N].
  virtual void cross_entropy(const Tensor& logits, const Tensor& target, Tensor& probs,
                             Tensor& loss) = 0;
  /// grad_logits[n, c] = (probs[n, c] - [c == target[n]]) * grad_loss[n or 0] * scale.
  /// `grad_loss` has N elements (reduction none) or one (mean/sum).
  virtual void cross_entropy_backward(const Tensor& probs, const Tensor& target,
                                      const Tensor& grad_loss, float scale,
                                      Tensor& grad_logits) = 0;
  /// float32 <-> float16 / bfloat16 (round to nearest even), same numel.
  virtual void convert(const Tensor& src, Tensor& dst) = 0;

  // fused optimizer updates over one parameter (no temporaries)
  virtual void sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buffer,
                          const SgdUpdate& u) = 0;
  virtual void adam_update(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                           Tensor& max_exp_avg_sq, const AdamUpdate& u) = 0;
  /// The step of every parameter of one group in one call (what the optimizers call; every
  /// tensor on this table's device, one device per call). `u.first_step` is ignored: each
  /// entry carries its own. The default calls sgd_update once per entry, so a table that
  /// does not override it (CUDA, sim) gives the same results; the CPU's picks its vector
  /// kernel once for the whole group.
  virtual void sgd_update_group(const std::vector<SgdGroupEntry>& params, const SgdUpdate& u);
  /// Likewise for Adam/AdamW: the default calls adam_update once per entry with its own `u`.
  virtual void adam_update_group(const std::vector<AdamGroupEntry>& params);

  // exact mode (docs/exact.md): fixed-point sums that do not depend on the order of addition
  /// out[index] = max(out[index], max_i |x[i]|); out is float32; a NaN in x (or already in
  /// out[index]) leaves NaN there.
  virtual void abs_max_into(const Tensor& x, Tensor& out, std::int64_t index) = 0;
  /// acc[i] += llrint(double(x[i]) * scale): x float32, acc int64, same numel. The caller
  /// picks `scale` (a power of two) so that no sum leaves int64's range.
  virtual void fixed_point_accumulate(const Tensor& x, double scale, Tensor& acc) = 0;
  /// out[i] = float((double(acc[i]) / scale) / count): acc int64, out float32, same numel.
  virtual void fixed_point_to_float(const Tensor& acc, double scale, double count, Tensor& out) = 0;

  // ---- convolution and pooling (CPU: core/src/cpu/cpu_conv.cpp) ----
  /// col[(ci * kh + i) * kw + j, oy * ow + ox] = x[image, ci, oy*sh - ph + i*dh, ox*sw - pw + j*dw]
  /// (0 in the padding): col is [c * kh * kw, oh * ow], x is [n, c, h, w].
  virtual void im2col(const Tensor& x, std::int64_t image, const Window2d& g, Tensor& col) = 0;
  /// The adjoint of im2col: grad_x[image] = every col entry summed back at its position
  /// (overwrites that image, other images untouched).
  virtual void col2im(const Tensor& col, std::int64_t image, const Window2d& g, Tensor& grad_x) = 0;
  /// out [n, c, oh, ow] = window maxima (padding is -inf; NaN wins, as in PyTorch); indices
  /// (int64, same shape) = the flat y * w + x position of each maximum in its input plane.
  virtual void max_pool2d(const Tensor& x, const Window2d& g, Tensor& out, Tensor& indices) = 0;
  /// grad_x = 0, then grad_x[plane, indices[o]] += grad_out[o].
  virtual void max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Window2d& g,
                                   Tensor& grad_x) = 0;
  /// Window means (dilation 1); the divisor counts the padding when count_include_pad.
  virtual void avg_pool2d(const Tensor& x, const Window2d& g, bool count_include_pad, Tensor& out) = 0;
  virtual void avg_pool2d_backward(const Tensor& grad_out, const Window2d& g, bool count_include_pad,
                                   Tensor& grad_x) = 0;
  /// PyTorch's adaptive windows: rows [floor(i*h/oh), ceil((i+1)*h/oh)), likewise columns
  /// (only n, c, h, w, oh, ow of `g` are used).
  virtual void adaptive_avg_pool2d(const Tensor& x, const Window2d& g, Tensor& out) = 0;
  virtual void adaptive_avg_pool2d_backward(const Tensor& grad_out, const Window2d& g, Tensor& grad_x) = 0;
  /// out[i, c, :] += bias[c], out viewed as [outer, bias.numel(), inner] (a conv's bias).
  virtual void add_channel_bias(const Tensor& bias, std::int64_t outer, std::int64_t inner, Tensor& out) = 0;
  /// out[c] = sum over i and k of g[i, c, k], g viewed as [outer, out.numel(), inner].
  virtual void channel_sum(const Tensor& g, std::int64_t outer, std::int64_t inner, Tensor& out) = 0;
  // ---- end convolution and pooling ----

  // ---- normalisation, embedding, argmax, clamp (CPU: cpu_norm.cpp) ----
  // x is viewed as [outer, c, inner] and statistics are per channel c (BatchNorm: outer = N,
  // inner = H * W; LayerNorm: outer = 1, c = rows, inner = the normalised size).
  /// mean[c] and the biased variance var[c] over outer and inner, accumulated in double.
  virtual void batch_norm_stats(const Tensor& x, std::int64_t outer, std::int64_t c, std::int64_t inner,
                                Tensor& mean, Tensor& var) = 0;
  /// out = (x - mean[c]) * invstd[c] * weight[c] + bias[c]; weight and bias may be undefined.
  virtual void batch_norm_elemt(const Tensor& x, std::int64_t outer, std::int64_t c, std::int64_t inner,
                                const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                                const Tensor& bias, Tensor& out) = 0;
  /// sum_dy[c] = sum of grad_y, sum_dy_xmu[c] = sum of grad_y * (x - mean[c]) (double accumulation).
  virtual void batch_norm_backward_reduce(const Tensor& grad_y, const Tensor& x, std::int64_t outer,
                                          std::int64_t c, std::int64_t inner, const Tensor& mean,
                                          Tensor& sum_dy, Tensor& sum_dy_xmu) = 0;
  /// grad_x = (grad_y - sum_dy[c] / count - (x - mean[c]) * invstd[c]^2 * sum_dy_xmu[c] / count)
  ///          * invstd[c] * weight[c]; with sum_dy undefined (statistics that are constants,
  /// eval mode) grad_x = grad_y * invstd[c] * weight[c]. weight may be undefined (1).
  virtual void batch_norm_backward_elemt(const Tensor& grad_y, const Tensor& x, std::int64_t outer,
                                         std::int64_t c, std::int64_t inner, const Tensor& mean,
                                         const Tensor& invstd, const Tensor& weight, const Tensor& sum_dy,
                                         const Tensor& sum_dy_xmu, double count, Tensor& grad_x) = 0;
  /// out[i, :] = weight[indices[i], :]: weight [V, D], indices int64 (validated), out [n, D].
  virtual void embedding(const Tensor& weight, const Tensor& indices, Tensor& out) = 0;
  /// grad_weight[indices[i], :] += grad[i, :], skipping rows where indices[i] == padding_idx
  /// (-1: none); grad_weight is zeroed by the caller.
  virtual void embedding_backward(const Tensor& grad, const Tensor& indices, std::int64_t padding_idx,
                                  Tensor& grad_weight) = 0;
  /// out[o, n] (int64) = the first index of the maximum of x[o, :, n]; a NaN counts as the maximum.
  virtual void argmax(const Tensor& x, std::int64_t outer, std::int64_t d, std::int64_t inner, Tensor& out) = 0;
  /// out = min(max(x, lo), hi); NaN stays NaN.
  virtual void clamp(const Tensor& x, float lo, float hi, Tensor& out) = 0;
  // ---- end normalisation, embedding, argmax, clamp ----

  // ---- layout and masks (CPU: core/src/cpu/cpu_layout.cpp) ----
  /// dst[dst_offset + sum_d i_d * dst_strides[d]] = src[src_offset + sum_d i_d * src_strides[d]]
  /// for every index i of l.sizes; src and dst of one dtype (any), not overlapping. Serves
  /// permute, cat, stack, split, chunk and the broadcast of a mask.
  virtual void strided_copy(const Tensor& src, const StridedLayout& l, Tensor& dst) = 0;
  /// out = value where mask is true, x elsewhere: x and out float32 of one numel (out may be
  /// x), mask Bool whose numel divides x's and which repeats with its numel as period (the
  /// suffix broadcasting of binary(); other broadcasts are expanded with strided_copy first).
  virtual void masked_fill(const Tensor& x, const Tensor& mask, float value, Tensor& out) = 0;
  /// x (any dtype) viewed as [batch, rows, cols]: out keeps element (i, j) where j - i <=
  /// diagonal (lower) or j - i >= diagonal (upper) and is zero elsewhere (out may be x).
  virtual void triangle(const Tensor& x, std::int64_t rows, std::int64_t cols, std::int64_t diagonal,
                        bool upper, Tensor& out) = 0;
  // ---- end layout and masks ----
  // ---- attention (CPU: core/src/cpu/cpu_attention.cpp, docs/attention.md) ----
  /// out [batch, l, ev] = softmax(q k^T * scale + mask, causal) (dropped out) v, and
  /// stats [batch, l, 2] = per row of the masked, scaled scores its maximum m and
  /// sum(exp(s - m)) l (m = -inf, l = 0 for a row whose every score is masked: its output is
  /// 0, as PyTorch 2.5+'s, and its weights count as 0 in the backward). m and l stay apart,
  /// not folded into a log-sum-exp: m + log l rounds to m when every score is about -1e9 (a
  /// masked row), and exp(s - lse) would then give weights of 1 instead of 1/l. Never holds
  /// an l x s matrix.
  virtual void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                 const AttentionParams& p, Tensor& out, Tensor& stats) = 0;
  /// FlashAttention-2's backward: recomputes the weights tile by tile from q, k and stats
  /// (P = exp(s - m) / l),
  /// with rowsum(grad_out * out) per row; writes grad_q, grad_k, grad_v (each overwritten;
  /// one that is undefined is not wanted, though it may still be computed internally).
  virtual void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                  const Tensor& out, const Tensor& stats, const Tensor& grad_out,
                                  const AttentionParams& p, Tensor& grad_q, Tensor& grad_k,
                                  Tensor& grad_v) = 0;
  // ---- end attention ----

  /// Checks that every int64 label is in [0, classes); returns the first bad index or -1.
  /// A device table may instead check asynchronously (CUDA: no copy per step): it returns -1
  /// and throws the same ValueError when the calling thread next reads a result to the host
  /// (copy_to_host, e.g. the loss).
  virtual std::int64_t find_label_out_of_range(const Tensor& target, std::int64_t classes) = 0;

  // ---- stream ordering (docs/gpu.md, "Stream ordering") ----
  // A device may run its kernels and device copies later, in issue order, on its compute
  // stream (CUDA; the sim device in its asynchronous mode); copy_to_host waits for the work
  // issued before it, as cudaMemcpy does. A thread that moves a tensor's bytes for a
  // collective works on the communication stream instead (set_comm_stream), which is not
  // ordered with the compute stream: it must wait for an event recorded where the data was
  // produced. The defaults suit a device whose work is done when the call returns (the CPU):
  // no event (nullptr), nothing to wait for.
  /// A new event on device `device_index` (the operation's tensors' device, which need not
  /// be the calling thread's current one), or nullptr when the device needs none.
  virtual void* event_create(int /*device_index*/) { return nullptr; }
  virtual void event_destroy(void* /*event*/) {}
  /// Records `event` on the calling thread's stream of the event's device: it completes once
  /// the work issued there before this call has run.
  virtual void event_record(void* /*event*/) {}
  /// Blocks the calling thread until `event` completed (the last record before this call).
  virtual void event_synchronize(void* /*event*/) {}
  /// Whether `event` completed (never blocks).
  virtual bool event_query(void* /*event*/) { return true; }
  /// Device-side wait: the work the calling thread issues afterwards on the event's device
  /// runs once `event` completed; the host does not block.
  virtual void stream_wait_event(void* /*event*/) {}
  /// Whether the calling thread issues its copies and kernels on the device's communication
  /// stream (true) or its compute stream (false, every thread's default).
  virtual void set_comm_stream(bool /*on*/) {}
  /// The device's own handle of `event` (CUDA: its cudaEvent_t), for a communication
  /// backend that records and waits for it on a stream of its own (NCCL: the ready event
  /// issued by the process group, and the done event a Work's wait() waits for on the
  /// device); nullptr when the device has none.
  virtual void* event_handle(void* /*event*/) { return nullptr; }
};

/// The kernel table for a device type; throws TypeError naming the missing plugin.
DeviceKernels& kernels_for(Device device);
/// Registers (or replaces) the table for a device type. Called by device plugins.
void register_device_kernels(DeviceType type, DeviceKernels* table);

}  // namespace phalanx
