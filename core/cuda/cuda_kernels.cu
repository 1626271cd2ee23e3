// CUDA kernels of the device table. Grid-stride loops; float32 unless stated.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>

#include "cuda_check.hpp"
#include "cuda_kernels.hpp"
#include "phalanx/core/half.hpp"
#include "phalanx/core/label_flag.hpp"

namespace phalanx::cuda {

namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kLongRow = 1 << 16;  // sum_dim: rows this long are split over many blocks
inline int blocks_for(std::int64_t n) {
  return static_cast<int>(std::min<std::int64_t>((n + kThreads - 1) / kThreads, 65535 * 4));
}
#define GRID_LOOP(i, n) for (std::int64_t i = blockIdx.x * (std::int64_t)blockDim.x + threadIdx.x; i < (n); i += (std::int64_t)blockDim.x * gridDim.x)

void after_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_cuda(what, e, __FILE__, __LINE__);
}

void on_device(const Tensor& t) { PHALANX_CUDA_CHECK(cudaSetDevice(t.device().index)); }

/// The device that owns `p` (memory from cudaMalloc), made current; throws for other memory.
int device_of_memory(const void* p, const char* what) {
  cudaPointerAttributes attr{};
  PHALANX_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
  if (attr.type != cudaMemoryTypeDevice)
    throw CudaError(detail::concat(what, ": the pointer is not CUDA device memory (cudaPointerGetAttributes)"));
  PHALANX_CUDA_CHECK(cudaSetDevice(attr.device));
  return attr.device;
}

__global__ void fill_f32(float* o, float v, std::int64_t n) { GRID_LOOP(i, n) o[i] = v; }
__global__ void fill_i64(long long* o, long long v, std::int64_t n) { GRID_LOOP(i, n) o[i] = v; }
__global__ void fill_u16(unsigned short* o, unsigned short v, std::int64_t n) { GRID_LOOP(i, n) o[i] = v; }

__global__ void unary_k(int op, const float* x, float* o, std::int64_t n) {
  GRID_LOOP(i, n) {
    const float v = x[i];
    switch (op) {
      case 0: o[i] = -v; break;
      case 1: o[i] = expf(v); break;
      case 2: o[i] = logf(v); break;
      case 3: o[i] = v <= 0.f ? 0.f : v; break;  // NaN stays NaN (as PyTorch; and the CPU kernel)
      case 4: o[i] = tanhf(v); break;
      case 5: o[i] = 1.f / (1.f + expf(-v)); break;
      case 6: o[i] = v * 0.5f * (1.f + erff(v * 0.70710678118654752f)); break;  // Gelu (erf form)
      default: o[i] = 1.f / sqrtf(v); break;                                     // Rsqrt
    }
  }
}

__global__ void unary_bw_k(int op, const float* g, const float* x, const float* y, float* o, std::int64_t n) {
  GRID_LOOP(i, n) {
    switch (op) {
      case 0: o[i] = -g[i]; break;
      case 1: o[i] = g[i] * y[i]; break;
      case 2: o[i] = g[i] / x[i]; break;
      case 3: o[i] = y[i] <= 0.f ? 0.f : g[i]; break;
      case 4: o[i] = g[i] * (1.f - y[i] * y[i]); break;
      case 5: o[i] = g[i] * y[i] * (1.f - y[i]); break;
      case 6: {
        const float v = x[i];
        const float cdf = 0.5f * (1.f + erff(v * 0.70710678118654752f));
        o[i] = g[i] * (cdf + v * 0.39894228040143268f * expf(v * v * -0.5f));
        break;
      }
      default: o[i] = g[i] * -0.5f * y[i] * y[i] * y[i]; break;
    }
  }
}

__global__ void binary_k(int op, const float* a, std::int64_t na, const float* b, std::int64_t nb, float* o,
                         std::int64_t n) {
  GRID_LOOP(i, n) {
    const float x = a[na == n ? i : i % na], y = b[nb == n ? i : i % nb];
    o[i] = op == 0 ? x + y : op == 1 ? x - y : op == 2 ? x * y : x / y;
  }
}

__global__ void affine_k(const float* x, float mul, float add, float* o, std::int64_t n) { GRID_LOOP(i, n) o[i] = x[i] * mul + add; }
__global__ void axpy_k(float alpha, const float* x, float* y, std::int64_t n) { GRID_LOOP(i, n) y[i] += alpha * x[i]; }
__global__ void scale_k(float* x, float f, std::int64_t n) { GRID_LOOP(i, n) x[i] *= f; }
__global__ void divide_k(float* x, float d, std::int64_t n) { GRID_LOOP(i, n) x[i] /= d; }

__global__ void sum_period_k(const float* in, float* out, std::int64_t p, std::int64_t rows, float scale) {
  GRID_LOOP(j, p) {
    float s = 0.f;
    for (std::int64_t r = 0; r < rows; ++r) s += in[r * p + j];
    out[j] = s * scale;
  }
}

// The block's threads' doubles summed by a shared-memory tree (fixed order); thread 0 gets it.
__device__ double block_sum(double s) {
  __shared__ double part[kThreads];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  return part[0];
}

// One block per row of [outer, d] (inner == 1): a shared-memory tree in double.
__global__ void row_sum_k(const float* in, float* out, std::int64_t d, float scale) {
  const float* row = in + static_cast<std::int64_t>(blockIdx.x) * d;
  double s = 0;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) s += row[i];
  const double total = block_sum(s);
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<float>(total * scale);
}

// Long rows: gridDim.x blocks share row blockIdx.y, each writes its partial (double) to
// part[row * gridDim.x + block]; row_parts_k then adds a row's partials in a fixed order,
// so the result does not depend on scheduling.
__global__ void row_part_k(const float* in, double* part, std::int64_t d) {
  const float* row = in + static_cast<std::int64_t>(blockIdx.y) * d;
  double s = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < d;
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x)
    s += row[i];
  const double total = block_sum(s);
  if (threadIdx.x == 0) part[static_cast<std::int64_t>(blockIdx.y) * gridDim.x + blockIdx.x] = total;
}
__global__ void row_parts_k(const double* part, int parts, float* out, float scale) {
  double s = 0;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) s += part[static_cast<std::int64_t>(blockIdx.x) * parts + i];
  const double total = block_sum(s);
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<float>(total * scale);
}

__global__ void sum_dim_k(const float* in, float* out, std::int64_t outer, std::int64_t d, std::int64_t inner, float scale) {
  GRID_LOOP(idx, outer * inner) {
    const std::int64_t o = idx / inner, n = idx % inner;
    float s = 0.f;
    for (std::int64_t i = 0; i < d; ++i) s += in[(o * d + i) * inner + n];
    out[idx] = s * scale;
  }
}

__global__ void expand_dim_k(const float* g, float* out, std::int64_t outer, std::int64_t d, std::int64_t inner, float scale) {
  GRID_LOOP(idx, outer * d * inner) {
    const std::int64_t n = idx % inner, o = idx / (d * inner);
    out[idx] = g[o * inner + n] * scale;
  }
}

__global__ void broadcast_rows_k(const float* row, float* out, std::int64_t p, std::int64_t n) { GRID_LOOP(i, n) out[i] = row[i % p]; }

template <typename T>
__global__ void transpose_k(const T* in, T* out, std::int64_t A, std::int64_t n0, std::int64_t B, std::int64_t n1,
                            std::int64_t C) {
  GRID_LOOP(dst, A * n1 * B * n0 * C) {
    std::int64_t r = dst;
    const std::int64_t c = r % C; r /= C;
    const std::int64_t i0 = r % n0; r /= n0;
    const std::int64_t b = r % B; r /= B;
    const std::int64_t i1 = r % n1; r /= n1;
    const std::int64_t a = r;
    out[dst] = in[(((a * n0 + i0) * B + b) * n1 + i1) * C + c];
  }
}

__global__ void log_softmax_k(const float* x, float* o, std::int64_t outer, std::int64_t d, std::int64_t inner) {
  GRID_LOOP(idx, outer * inner) {
    const std::int64_t r = idx / inner, j = idx % inner;
    const float* base = x + r * d * inner + j;
    float* ob = o + r * d * inner + j;
    float mx = -FLT_MAX;
    for (std::int64_t i = 0; i < d; ++i) mx = fmaxf(mx, base[i * inner]);
    double s = 0;
    for (std::int64_t i = 0; i < d; ++i) s += exp(static_cast<double>(base[i * inner] - mx));
    const float log_sum = static_cast<float>(log(s));  // (x - max) - log(sum), as the CPU's
    for (std::int64_t i = 0; i < d; ++i) ob[i * inner] = (base[i * inner] - mx) - log_sum;
  }
}

__global__ void log_softmax_bw_k(const float* g, const float* y, float* o, std::int64_t outer, std::int64_t d, std::int64_t inner) {
  GRID_LOOP(idx, outer * inner) {
    const std::int64_t off = (idx / inner) * d * inner + idx % inner;
    double s = 0;
    for (std::int64_t i = 0; i < d; ++i) s += g[off + i * inner];
    for (std::int64_t i = 0; i < d; ++i) o[off + i * inner] = g[off + i * inner] - expf(y[off + i * inner]) * static_cast<float>(s);
  }
}

__global__ void cross_entropy_k(const float* x, const long long* t, float* p, float* l, std::int64_t n, std::int64_t c) {
  GRID_LOOP(r, n) {
    const float* row = x + r * c;
    float* prow = p + r * c;
    float mx = row[0];
    for (std::int64_t j = 1; j < c; ++j) mx = fmaxf(mx, row[j]);
    float s = 0.f;
    for (std::int64_t j = 0; j < c; ++j) {
      prow[j] = expf(row[j] - mx);
      s += prow[j];
    }
    const float inv = 1.f / s;
    for (std::int64_t j = 0; j < c; ++j) prow[j] *= inv;
    const long long tr = t[r];  // a bad label (reported by the label check) gives NaN, never a stray read
    l[r] = tr < 0 || tr >= c ? __int_as_float(0x7fffffff) : logf(s) - (row[tr] - mx);
  }
}

__global__ void cross_entropy_bw_k(const float* p, const long long* t, const float* gl, bool per_row, float scale, float* o,
                                   std::int64_t n, std::int64_t c) {
  GRID_LOOP(idx, n * c) {
    const std::int64_t r = idx / c, j = idx % c;
    const float g = (per_row ? gl[r] : gl[0]) * scale;
    o[idx] = p[idx] * g - (j == t[r] ? g : 0.f);
  }
}

__global__ void to_half_k(const float* s, __half* d, std::int64_t n) { GRID_LOOP(i, n) d[i] = __float2half_rn(s[i]); }
__global__ void to_bf16_k(const float* s, __nv_bfloat16* d, std::int64_t n) { GRID_LOOP(i, n) d[i] = __float2bfloat16_rn(s[i]); }
__global__ void from_half_k(const __half* s, float* d, std::int64_t n) { GRID_LOOP(i, n) d[i] = __half2float(s[i]); }
__global__ void from_bf16_k(const __nv_bfloat16* s, float* d, std::int64_t n) { GRID_LOOP(i, n) d[i] = __bfloat162float(s[i]); }

__global__ void sgd_k(float* p, const float* g, float* b, SgdUpdate u, std::int64_t n) {
  GRID_LOOP(i, n) {
    float d = g[i];
    if (u.weight_decay != 0.f) d = d + u.weight_decay * p[i];
    if (b) {
      b[i] = u.first_step ? d : b[i] * u.momentum + (1.f - u.dampening) * d;
      d = u.nesterov ? d + u.momentum * b[i] : b[i];
    }
    p[i] = p[i] + (-u.lr) * d;
  }
}

__global__ void adam_k(float* p, const float* g, float* m, float* v, float* vmax, AdamUpdate u, std::int64_t n) {
  GRID_LOOP(i, n) {
    float gi = g[i];
    if (u.decoupled) {
      if (u.weight_decay != 0.f) p[i] = p[i] * u.decay_factor;
    } else if (u.weight_decay != 0.f) {
      gi = gi + u.weight_decay * p[i];
    }
    m[i] = m[i] * u.beta1 + u.one_minus_beta1 * gi;
    v[i] = v[i] * u.beta2 + u.one_minus_beta2 * gi * gi;
    float second = v[i];
    if (vmax) {
      vmax[i] = fmaxf(vmax[i], v[i]);
      second = vmax[i];
    }
    const float denom = sqrtf(second) / u.bias_correction2_sqrt + u.eps;
    p[i] = p[i] + (-u.step_size) * m[i] / denom;
  }
}

const float* cf(const Tensor& t) { return static_cast<const float*>(t.raw_data()); }
float* mf(const Tensor& t) { return static_cast<float*>(t.raw_data()); }

}  // namespace

CudaKernels& table() {
  // Never destroyed (as the sim device's): tensors held by other statics (a process group's
  // buffers, a cached model) are freed during exit, after a function-local static would be.
  static CudaKernels* const k = new CudaKernels;
  return *k;
}

cublasHandle_t CudaKernels::blas(int device) {
  std::lock_guard<std::mutex> lock(blas_mu_);
  if (device < 0 || device >= kMaxDevices)
    throw CudaError(detail::concat("cuda:", device, " is outside the ", kMaxDevices,
                                   " devices this build supports (cuda_kernels.hpp, kMaxDevices)"));
  if (!handles_[device]) {
    PHALANX_CUDA_CHECK(cudaSetDevice(device));
    PHALANX_CUBLAS_CHECK(cublasCreate(&handles_[device]));
  }
  return handles_[device];
}

// Copies run on the legacy default stream of the memory's own device, so that they follow
// the kernels queued there, whichever device this thread (a comm worker, say) had current.
void CudaKernels::copy(void* dst, const void* src, std::size_t n) {
  if (!n) return;
  device_of_memory(dst, "copy");
  PHALANX_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, 0));
}
void CudaKernels::copy_to_host(void* dst, const void* src, std::size_t n) {
  if (n) {
    device_of_memory(src, "copy_to_host");
    PHALANX_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
  }
  labels_.resolve();  // a result reaches the host: report a bad label found on the device
}
void CudaKernels::copy_from_host(void* dst, const void* src, std::size_t n) {
  if (!n) return;
  device_of_memory(dst, "copy_from_host");
  PHALANX_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
}

// Events of the legacy default stream of their own device (every kernel's and copy's). A
// process group makes one per collective on a device tensor: they are kept for reuse rather
// than created and destroyed each time. Reusing one whose last record has not completed is
// safe: cudaEventRecord replaces what it captures, and nobody waits on a destroyed event.
void* CudaKernels::event_create(int device) {
  {
    std::lock_guard<std::mutex> lock(events_mu_);
    for (auto it = spare_events_.rbegin(); it != spare_events_.rend(); ++it)
      if ((*it)->device == device) {
        Event* e = *it;
        spare_events_.erase(std::next(it).base());
        return e;
      }
  }
  PHALANX_CUDA_CHECK(cudaSetDevice(device));
  cudaEvent_t e = nullptr;
  // BlockingSync: event_synchronize (Work::synchronize, the ready-event wait of host-reading
  // backends) sleeps in the driver instead of spinning a core while the GPU works; the
  // watchdog's event_query polls are unaffected.
  PHALANX_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync));
  return new Event{e, device};
}
void CudaKernels::event_destroy(void* e) {
  if (!e) return;
  std::lock_guard<std::mutex> lock(events_mu_);
  spare_events_.push_back(static_cast<Event*>(e));
}
void CudaKernels::event_record(void* e) {
  const Event& ev = *static_cast<Event*>(e);
  PHALANX_CUDA_CHECK(cudaSetDevice(ev.device));  // the stream must be on the event's device
  PHALANX_CUDA_CHECK(cudaEventRecord(ev.event, 0));
}
void CudaKernels::event_synchronize(void* e) {
  PHALANX_CUDA_CHECK(cudaEventSynchronize(static_cast<Event*>(e)->event));
}
bool CudaKernels::event_query(void* e) {
  const cudaError_t q = cudaEventQuery(static_cast<Event*>(e)->event);
  if (q == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not finished is no error (as PyTorch's CUDAEvent::query)
    return false;
  }
  PHALANX_CUDA_CHECK(q);
  return true;
}
void CudaKernels::stream_wait_event(void* e) {
  const Event& ev = *static_cast<Event*>(e);
  PHALANX_CUDA_CHECK(cudaSetDevice(ev.device));
  PHALANX_CUDA_CHECK(cudaStreamWaitEvent(0, ev.event, 0));
}
// The cudaEvent_t, which NCCL records on its own stream (the done event of a collective).
void* CudaKernels::event_handle(void* e) { return e ? static_cast<Event*>(e)->event : nullptr; }

void CudaKernels::fill(Tensor& out, double v) {
  on_device(out);
  const std::int64_t n = out.numel();
  if (!n) return;
  switch (out.dtype()) {
    case DType::Float32: fill_f32<<<blocks_for(n), kThreads>>>(mf(out), static_cast<float>(v), n); break;
    case DType::Int64:
      fill_i64<<<blocks_for(n), kThreads>>>(static_cast<long long*>(out.raw_data()), static_cast<long long>(v), n);
      break;
    case DType::Float16:
    case DType::BFloat16: {  // one 2-byte pattern, rounded on the host exactly as the CPU fill does
      const float f = static_cast<float>(v);
      const unsigned short bits = out.dtype() == DType::Float16 ? float_to_fp16(f) : float_to_bf16(f);
      fill_u16<<<blocks_for(n), kThreads>>>(static_cast<unsigned short*>(out.raw_data()), bits, n);
      break;
    }
    case DType::Bool:  // one byte, 1 for any non-zero value (as the CPU fill)
      PHALANX_CUDA_CHECK(cudaMemset(out.raw_data(), v != 0.0 ? 1 : 0, static_cast<std::size_t>(n)));
      break;
  }
  after_launch("fill kernel");
}

void CudaKernels::unary(UnaryOp op, const Tensor& x, Tensor& out) {
  on_device(x);
  const std::int64_t n = x.numel();
  if (n) unary_k<<<blocks_for(n), kThreads>>>(static_cast<int>(op), cf(x), mf(out), n);
  after_launch("unary kernel");
}

void CudaKernels::unary_backward(UnaryOp op, const Tensor& g, const Tensor& x, const Tensor& y, Tensor& gx) {
  on_device(g);
  const std::int64_t n = g.numel();
  if (n)
    unary_bw_k<<<blocks_for(n), kThreads>>>(static_cast<int>(op), cf(g), x.defined() ? cf(x) : nullptr,
                                            y.defined() ? cf(y) : nullptr, mf(gx), n);
  after_launch("unary backward kernel");
}

void CudaKernels::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  on_device(out);
  const std::int64_t n = out.numel();
  if (n) binary_k<<<blocks_for(n), kThreads>>>(static_cast<int>(op), cf(a), a.numel(), cf(b), b.numel(), mf(out), n);
  after_launch("binary kernel");
}

void CudaKernels::affine_scalar(const Tensor& x, float mul, float add, Tensor& out) {
  on_device(x);
  if (x.numel()) affine_k<<<blocks_for(x.numel()), kThreads>>>(cf(x), mul, add, mf(out), x.numel());
  after_launch("affine kernel");
}

void CudaKernels::axpy(float alpha, const Tensor& x, Tensor& y) {
  on_device(y);
  if (y.numel()) axpy_k<<<blocks_for(y.numel()), kThreads>>>(alpha, cf(x), mf(y), y.numel());
  after_launch("axpy kernel");
}

void CudaKernels::scale(Tensor& x, float f) {
  on_device(x);
  if (x.numel()) scale_k<<<blocks_for(x.numel()), kThreads>>>(mf(x), f, x.numel());
  after_launch("scale kernel");
}

void CudaKernels::divide(Tensor& x, float d) {
  on_device(x);
  if (x.numel()) divide_k<<<blocks_for(x.numel()), kThreads>>>(mf(x), d, x.numel());
  after_launch("divide kernel");
}

void CudaKernels::gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
                       std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;  // an empty C (k == 0 still scales C by beta)
  constexpr std::int64_t kIntMax = 2147483647;  // cublasSgemm takes int sizes and strides
  if (m > kIntMax || n > kIntMax || k > kIntMax || lda > kIntMax || ldb > kIntMax || ldc > kIntMax)
    throw ValueError(detail::concat("matmul on CUDA: [", m, " x ", k, "] x [", k, " x ", n,
                                    "] has a dimension over 2^31 - 1, which cuBLAS's sgemm cannot take; split it"));
  // The output's device, not the thread's current one (cuBLAS runs on its handle's device).
  const int device = device_of_memory(c, "gemm");
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  PHALANX_CUBLAS_CHECK(cublasSgemm(blas(device), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                   static_cast<int>(ldb), a, static_cast<int>(lda), &beta, c, static_cast<int>(ldc)));
}

void CudaKernels::sum_to_period(const Tensor& in, Tensor& out, float s) {
  on_device(in);
  const std::int64_t p = out.numel();
  if (p) sum_period_k<<<blocks_for(p), kThreads>>>(cf(in), mf(out), p, in.numel() / p, s);
  after_launch("sum_to_period kernel");
}

void CudaKernels::sum_dim(const Tensor& in, std::int64_t outer, std::int64_t d, std::int64_t inner, Tensor& out, float s) {
  on_device(in);
  if (inner == 1 && d >= kLongRow && outer >= 1 && outer < 1024) {  // a few long rows: many blocks per row
    const int parts = static_cast<int>(std::min<std::int64_t>(1024, (d + kLongRow - 1) / kLongRow * 8));
    Tensor part = Tensor::empty({outer * parts}, DType::Int64, in.device());  // 8-byte slots for doubles
    row_part_k<<<dim3(static_cast<unsigned>(parts), static_cast<unsigned>(outer)), kThreads>>>(
        cf(in), static_cast<double*>(part.raw_data()), d);
    after_launch("sum_dim kernel (partial sums)");
    row_parts_k<<<static_cast<unsigned>(outer), kThreads>>>(static_cast<const double*>(part.raw_data()), parts,
                                                            mf(out), s);
  } else if (inner == 1) {
    if (outer) row_sum_k<<<static_cast<unsigned>(outer), kThreads>>>(cf(in), mf(out), d, s);
  } else if (outer * inner) {
    sum_dim_k<<<blocks_for(outer * inner), kThreads>>>(cf(in), mf(out), outer, d, inner, s);
  }
  after_launch("sum_dim kernel");
}

void CudaKernels::expand_dim(const Tensor& g, std::int64_t outer, std::int64_t d, std::int64_t inner, Tensor& out, float s) {
  on_device(g);
  const std::int64_t n = outer * d * inner;
  if (n) expand_dim_k<<<blocks_for(n), kThreads>>>(cf(g), mf(out), outer, d, inner, s);
  after_launch("expand_dim kernel");
}

void CudaKernels::broadcast_rows(const Tensor& row, Tensor& out) {
  on_device(out);
  if (out.numel()) broadcast_rows_k<<<blocks_for(out.numel()), kThreads>>>(cf(row), mf(out), row.numel(), out.numel());
  after_launch("broadcast_rows kernel");
}

void CudaKernels::transpose(const Tensor& in, int d0, int d1, Tensor& out) {
  on_device(in);
  const Shape& s = in.shape();
  if (d0 > d1) std::swap(d0, d1);
  std::int64_t A = 1, B = 1, C = 1;
  for (int i = 0; i < d0; ++i) A *= s[i];
  for (int i = d0 + 1; i < d1; ++i) B *= s[i];
  for (std::size_t i = d1 + 1; i < s.size(); ++i) C *= s[i];
  const std::int64_t n = in.numel();
  if (!n) return;
  if (element_size(in.dtype()) == 4)
    transpose_k<float><<<blocks_for(n), kThreads>>>(cf(in), mf(out), A, s[d0], B, s[d1], C);
  else if (element_size(in.dtype()) == 1)
    transpose_k<unsigned char><<<blocks_for(n), kThreads>>>(static_cast<const unsigned char*>(in.raw_data()),
                                                            static_cast<unsigned char*>(out.raw_data()), A, s[d0], B, s[d1], C);
  else if (element_size(in.dtype()) == 8)
    transpose_k<long long><<<blocks_for(n), kThreads>>>(static_cast<const long long*>(in.raw_data()),
                                                        static_cast<long long*>(out.raw_data()), A, s[d0], B, s[d1], C);
  else
    transpose_k<unsigned short><<<blocks_for(n), kThreads>>>(static_cast<const unsigned short*>(in.raw_data()),
                                                             static_cast<unsigned short*>(out.raw_data()), A, s[d0], B, s[d1], C);
  after_launch("transpose kernel");
}

void CudaKernels::log_softmax(const Tensor& x, std::int64_t outer, std::int64_t d, std::int64_t inner, Tensor& out) {
  on_device(x);
  if (outer * inner) log_softmax_k<<<blocks_for(outer * inner), kThreads>>>(cf(x), mf(out), outer, d, inner);
  after_launch("log_softmax kernel");
}

void CudaKernels::log_softmax_backward(const Tensor& g, const Tensor& y, std::int64_t outer, std::int64_t d,
                                       std::int64_t inner, Tensor& gx) {
  on_device(g);
  if (outer * inner) log_softmax_bw_k<<<blocks_for(outer * inner), kThreads>>>(cf(g), cf(y), mf(gx), outer, d, inner);
  after_launch("log_softmax backward kernel");
}

void CudaKernels::cross_entropy(const Tensor& logits, const Tensor& target, Tensor& probs, Tensor& loss) {
  on_device(logits);
  const std::int64_t n = logits.shape()[0], c = logits.shape()[1];
  if (n == 0) return;  // a launch of 0 blocks is an invalid configuration
  cross_entropy_k<<<blocks_for(n), kThreads>>>(cf(logits), static_cast<const long long*>(target.raw_data()), mf(probs),
                                               mf(loss), n, c);
  after_launch("cross_entropy kernel");
}

void CudaKernels::cross_entropy_backward(const Tensor& probs, const Tensor& target, const Tensor& gl, float s, Tensor& o) {
  on_device(probs);
  const std::int64_t n = probs.shape()[0], c = probs.shape()[1];
  if (n * c == 0) return;
  cross_entropy_bw_k<<<blocks_for(n * c), kThreads>>>(cf(probs), static_cast<const long long*>(target.raw_data()), cf(gl),
                                                      gl.numel() == n && n != 1, s, mf(o), n, c);
  after_launch("cross_entropy backward kernel");
}

std::int64_t CudaKernels::find_label_out_of_range(const Tensor& target, std::int64_t classes) {
  // Deferred (kernels.hpp): the check runs on the device; a bad label is reported by this
  // thread's next copy_to_host (the loss read), or by its next label check.
  on_device(target);
  if (!target.numel()) return -1;
  // Under a DDP step the check writes the reducer's step flag on the device (no host round
  // trip; label_flag.hpp); otherwise into pinned host memory, read at the next host read.
  if (const auto* sinks = detail::label_flag_for_check()) {
    for (const detail::LabelFlagSink* sink : *sinks) labels_.flag_into(target, classes, sink->flag, sink->value);
  } else
    labels_.launch(target, classes);
  return -1;
}

namespace {
// |x| as int bits orders like the float for every non-negative value, NaN above infinity:
// a maximum on the bits keeps the largest magnitude, and a NaN wins.
// slot = max(slot, m) on float bits, m >= 0: a NaN already in the slot stays, whatever its
// sign (a negative one would lose a plain atomicMax on the int bits).
__device__ void atomic_abs_max(int* slot, int m) {
  int old = *static_cast<volatile int*>(slot);
  while ((old & 0x7fffffff) <= 0x7f800000 && old < m) {
    const int seen = atomicCAS(slot, old, m);
    if (seen == old) break;
    old = seen;
  }
}
__global__ void abs_max_k(const float* x, std::int64_t n, int* slot) {
  int m = 0;
  GRID_LOOP(i, n) m = max(m, __float_as_int(fabsf(x[i])));
  for (int off = 16; off > 0; off /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
  if ((threadIdx.x & 31) == 0) atomic_abs_max(slot, m);  // one per warp (kThreads is a multiple of 32)
}
__global__ void fixed_acc_k(const float* x, double scale, long long* acc, std::int64_t n) {
  GRID_LOOP(i, n) acc[i] += __double2ll_rn(static_cast<double>(x[i]) * scale);
}
__global__ void fixed_to_float_k(const long long* acc, double scale, double count, float* o, std::int64_t n) {
  GRID_LOOP(i, n) o[i] = static_cast<float>((static_cast<double>(acc[i]) / scale) / count);
}
}  // namespace

void CudaKernels::abs_max_into(const Tensor& x, Tensor& out, std::int64_t index) {
  on_device(x);
  const std::int64_t n = x.numel();
  if (!n) return;
  abs_max_k<<<blocks_for(n), kThreads>>>(cf(x), n, static_cast<int*>(out.raw_data()) + index);
  after_launch("abs-max kernel");
}

void CudaKernels::fixed_point_accumulate(const Tensor& x, double scale, Tensor& acc) {
  on_device(x);
  const std::int64_t n = x.numel();
  if (!n) return;
  fixed_acc_k<<<blocks_for(n), kThreads>>>(cf(x), scale, static_cast<long long*>(acc.raw_data()), n);
  after_launch("fixed-point accumulate kernel");
}

void CudaKernels::fixed_point_to_float(const Tensor& acc, double scale, double count, Tensor& out) {
  on_device(acc);
  const std::int64_t n = out.numel();
  if (!n) return;
  fixed_to_float_k<<<blocks_for(n), kThreads>>>(static_cast<const long long*>(acc.raw_data()), scale, count, mf(out), n);
  after_launch("fixed-point to float kernel");
}

void CudaKernels::convert(const Tensor& src, Tensor& dst) {
  on_device(src);
  const std::int64_t n = src.numel();
  if (!n) return;
  const DType from = src.dtype(), to = dst.dtype();
  if (from == DType::Float32 && to == DType::Float16)
    to_half_k<<<blocks_for(n), kThreads>>>(cf(src), static_cast<__half*>(dst.raw_data()), n);
  else if (from == DType::Float32 && to == DType::BFloat16)
    to_bf16_k<<<blocks_for(n), kThreads>>>(cf(src), static_cast<__nv_bfloat16*>(dst.raw_data()), n);
  else if (from == DType::Float16 && to == DType::Float32)
    from_half_k<<<blocks_for(n), kThreads>>>(static_cast<const __half*>(src.raw_data()), mf(dst), n);
  else if (from == DType::BFloat16 && to == DType::Float32)
    from_bf16_k<<<blocks_for(n), kThreads>>>(static_cast<const __nv_bfloat16*>(src.raw_data()), mf(dst), n);
  else
    throw TypeError(std::string("convert: ") + dtype_name(from) + " to " + dtype_name(to) + " is not supported");
  after_launch("convert kernel");
}

void CudaKernels::sgd_update(Tensor& p, const Tensor& g, Tensor& buf, const SgdUpdate& u) {
  on_device(p);
  if (p.numel())
    sgd_k<<<blocks_for(p.numel()), kThreads>>>(mf(p), cf(g), u.momentum != 0.f ? mf(buf) : nullptr, u, p.numel());
  after_launch("sgd kernel");
}

void CudaKernels::adam_update(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, Tensor& vmax, const AdamUpdate& u) {
  on_device(p);
  if (p.numel())
    adam_k<<<blocks_for(p.numel()), kThreads>>>(mf(p), cf(g), mf(m), mf(v), u.amsgrad ? mf(vmax) : nullptr, u, p.numel());
  after_launch("adam kernel");
}

// ---- normalisation, embedding, argmax, clamp ----
namespace {
constexpr int kNormThreads = 256;
/// Block-wide sum of one double per thread (kNormThreads threads); every thread gets the total.
__device__ double block_sum(double v, double* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = kNormThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  const double r = sh[0];
  __syncthreads();
  return r;
}
// One block per channel; elements of channel ch: (o * c + ch) * inner + i.
__global__ void bn_stats_k(const float* x, std::int64_t outer, std::int64_t c, std::int64_t inner, float* mean,
                           float* var) {
  __shared__ double sh[kNormThreads];
  const std::int64_t ch = blockIdx.x, n = outer * inner;
  double s = 0;
  for (std::int64_t k = threadIdx.x; k < n; k += kNormThreads) s += x[((k / inner) * c + ch) * inner + k % inner];
  const double m = n ? block_sum(s, sh) / n : 0.0;
  double q = 0;
  for (std::int64_t k = threadIdx.x; k < n; k += kNormThreads) {
    const double d = x[((k / inner) * c + ch) * inner + k % inner] - m;
    q += d * d;
  }
  q = block_sum(q, sh);
  if (threadIdx.x == 0) {
    mean[ch] = static_cast<float>(m);
    var[ch] = static_cast<float>(n ? q / n : 0.0);
  }
}
__global__ void bn_elemt_k(const float* x, std::int64_t c, std::int64_t inner, const float* mean, const float* invstd,
                           const float* w, const float* b, float* o, std::int64_t n) {
  GRID_LOOP(i, n) {
    const std::int64_t ch = (i / inner) % c;
    const float alpha = invstd[ch] * (w ? w[ch] : 1.f);
    const float beta = (b ? b[ch] : 0.f) - mean[ch] * alpha;
    o[i] = x[i] * alpha + beta;
  }
}
__global__ void bn_bw_reduce_k(const float* g, const float* x, std::int64_t outer, std::int64_t c, std::int64_t inner,
                               const float* mean, float* sum_dy, float* sum_dy_xmu) {
  __shared__ double sh[kNormThreads];
  const std::int64_t ch = blockIdx.x, n = outer * inner;
  const double m = mean[ch];
  double s = 0, d = 0;
  for (std::int64_t k = threadIdx.x; k < n; k += kNormThreads) {
    const std::int64_t i = ((k / inner) * c + ch) * inner + k % inner;
    s += g[i];
    d += static_cast<double>(g[i]) * (x[i] - m);
  }
  s = block_sum(s, sh);
  d = block_sum(d, sh);
  if (threadIdx.x == 0) {
    sum_dy[ch] = static_cast<float>(s);
    sum_dy_xmu[ch] = static_cast<float>(d);
  }
}
__global__ void bn_bw_elemt_k(const float* g, const float* x, std::int64_t c, std::int64_t inner, const float* mean,
                              const float* invstd, const float* w, const float* sum_dy, const float* sum_dy_xmu,
                              double count, float* o, std::int64_t n) {
  GRID_LOOP(i, n) {
    const std::int64_t ch = (i / inner) % c;
    const float is = invstd[ch];
    const float scale = is * (w ? w[ch] : 1.f);
    if (sum_dy) {
      const float mean_dy = static_cast<float>(sum_dy[ch] / count);
      const float proj = static_cast<float>(sum_dy_xmu[ch] / count) * is * is;
      o[i] = (g[i] - mean_dy - (x[i] - mean[ch]) * proj) * scale;
    } else {
      o[i] = g[i] * scale;
    }
  }
}
__global__ void embedding_k(const float* w, const long long* idx, std::int64_t dim, float* o, std::int64_t n) {
  GRID_LOOP(i, n) o[i] = w[idx[i / dim] * dim + i % dim];
}
__global__ void embedding_bw_k(const float* g, const long long* idx, std::int64_t dim, long long pad, float* gw,
                               std::int64_t n) {
  GRID_LOOP(i, n) {
    const long long r = idx[i / dim];
    if (r != pad) atomicAdd(gw + r * dim + i % dim, g[i]);
  }
}
__global__ void argmax_k(const float* x, std::int64_t outer, std::int64_t d, std::int64_t inner, long long* o) {
  GRID_LOOP(idx, outer * inner) {
    const float* base = x + (idx / inner) * d * inner + idx % inner;
    long long best = 0;
    float bv = base[0];
    for (std::int64_t i = 1; i < d && !isnan(bv); ++i) {
      const float v = base[i * inner];
      if (v > bv || isnan(v)) {
        bv = v;
        best = i;
      }
    }
    o[idx] = best;
  }
}
__global__ void clamp_k(const float* x, float lo, float hi, float* o, std::int64_t n) {
  GRID_LOOP(i, n) {
    const float v = x[i];
    o[i] = v < lo ? lo : (v > hi ? hi : v);
  }
}
inline const float* cf_or_null(const Tensor& t) { return t.defined() ? cf(t) : nullptr; }
inline const long long* ci64(const Tensor& t) { return static_cast<const long long*>(t.raw_data()); }
}  // namespace

void CudaKernels::batch_norm_stats(const Tensor& x, std::int64_t outer, std::int64_t c, std::int64_t inner,
                                   Tensor& mean, Tensor& var) {
  on_device(x);
  if (c) bn_stats_k<<<static_cast<unsigned>(c), kNormThreads>>>(cf(x), outer, c, inner, mf(mean), mf(var));
  after_launch("batch_norm_stats kernel");
}

void CudaKernels::batch_norm_elemt(const Tensor& x, std::int64_t outer, std::int64_t c, std::int64_t inner,
                                   const Tensor& mean, const Tensor& invstd, const Tensor& weight, const Tensor& bias,
                                   Tensor& out) {
  on_device(x);
  const std::int64_t n = outer * c * inner;
  if (n)
    bn_elemt_k<<<blocks_for(n), kThreads>>>(cf(x), c, inner, cf(mean), cf(invstd), cf_or_null(weight), cf_or_null(bias),
                                            mf(out), n);
  after_launch("batch_norm_elemt kernel");
}

void CudaKernels::batch_norm_backward_reduce(const Tensor& g, const Tensor& x, std::int64_t outer, std::int64_t c,
                                             std::int64_t inner, const Tensor& mean, Tensor& sum_dy, Tensor& sum_dy_xmu) {
  on_device(x);
  if (c)
    bn_bw_reduce_k<<<static_cast<unsigned>(c), kNormThreads>>>(cf(g), cf(x), outer, c, inner, cf(mean), mf(sum_dy),
                                                              mf(sum_dy_xmu));
  after_launch("batch_norm_backward_reduce kernel");
}

void CudaKernels::batch_norm_backward_elemt(const Tensor& g, const Tensor& x, std::int64_t outer, std::int64_t c,
                                            std::int64_t inner, const Tensor& mean, const Tensor& invstd,
                                            const Tensor& weight, const Tensor& sum_dy, const Tensor& sum_dy_xmu,
                                            double count, Tensor& gx) {
  on_device(x);
  const std::int64_t n = outer * c * inner;
  if (n)
    bn_bw_elemt_k<<<blocks_for(n), kThreads>>>(cf(g), cf(x), c, inner, cf(mean), cf(invstd), cf_or_null(weight),
                                               cf_or_null(sum_dy), cf_or_null(sum_dy_xmu), count, mf(gx), n);
  after_launch("batch_norm_backward_elemt kernel");
}

void CudaKernels::embedding(const Tensor& weight, const Tensor& indices, Tensor& out) {
  on_device(weight);
  const std::int64_t n = out.numel();
  if (n) embedding_k<<<blocks_for(n), kThreads>>>(cf(weight), ci64(indices), weight.shape()[1], mf(out), n);
  after_launch("embedding kernel");
}

void CudaKernels::embedding_backward(const Tensor& grad, const Tensor& indices, std::int64_t padding_idx,
                                     Tensor& grad_weight) {
  on_device(grad);
  const std::int64_t n = grad.numel();
  if (n)
    embedding_bw_k<<<blocks_for(n), kThreads>>>(cf(grad), ci64(indices), grad_weight.shape()[1], padding_idx,
                                                mf(grad_weight), n);
  after_launch("embedding backward kernel");
}

void CudaKernels::argmax(const Tensor& x, std::int64_t outer, std::int64_t d, std::int64_t inner, Tensor& out) {
  on_device(x);
  if (outer * inner && d)
    argmax_k<<<blocks_for(outer * inner), kThreads>>>(cf(x), outer, d, inner, static_cast<long long*>(out.raw_data()));
  after_launch("argmax kernel");
}

void CudaKernels::clamp(const Tensor& x, float lo, float hi, Tensor& out) {
  on_device(x);
  const std::int64_t n = x.numel();
  if (n) clamp_k<<<blocks_for(n), kThreads>>>(cf(x), lo, hi, mf(out), n);
  after_launch("clamp kernel");
}
// ---- end normalisation, embedding, argmax, clamp ----

// ---- convolution and pooling: the CPU's windows (cpu_conv.cpp) ----
namespace {
__global__ void im2col_k(const float* x, Window2d g, float* col, std::int64_t n) {
  const std::int64_t L = g.oh * g.ow;
  GRID_LOOP(e, n) {
    const std::int64_t row = e / L, pos = e % L;
    const std::int64_t j = row % g.kw, i = (row / g.kw) % g.kh, ci = row / (g.kw * g.kh);
    const std::int64_t iy = (pos / g.ow) * g.sh - g.ph + i * g.dh, ix = (pos % g.ow) * g.sw - g.pw + j * g.dw;
    col[e] = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w ? x[(ci * g.h + iy) * g.w + ix] : 0.f;
  }
}
// Gathers every column entry that lands on input pixel e (no atomics: deterministic).
__global__ void col2im_k(const float* col, Window2d g, float* gx, std::int64_t n) {
  const std::int64_t L = g.oh * g.ow;
  GRID_LOOP(e, n) {
    const std::int64_t ix = e % g.w, iy = (e / g.w) % g.h, ci = e / (g.w * g.h);
    float s = 0.f;
    for (std::int64_t i = 0; i < g.kh; ++i) {
      const std::int64_t ty = iy + g.ph - i * g.dh;
      if (ty < 0 || ty % g.sh) continue;
      const std::int64_t oy = ty / g.sh;
      if (oy >= g.oh) continue;
      for (std::int64_t j = 0; j < g.kw; ++j) {
        const std::int64_t tx = ix + g.pw - j * g.dw;
        if (tx < 0 || tx % g.sw) continue;
        const std::int64_t ox = tx / g.sw;
        if (ox >= g.ow) continue;
        s += col[((ci * g.kh + i) * g.kw + j) * L + oy * g.ow + ox];
      }
    }
    gx[e] = s;
  }
}
__global__ void max_pool_k(const float* x, Window2d g, float* out, long long* idx, std::int64_t n) {
  GRID_LOOP(e, n) {
    const std::int64_t ox = e % g.ow, oy = (e / g.ow) % g.oh, pl = e / (g.ow * g.oh);
    const float* p = x + pl * g.h * g.w;
    std::int64_t y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
    const std::int64_t y1 = min(y0 + (g.kh - 1) * g.dh + 1, g.h), x1 = min(x0 + (g.kw - 1) * g.dw + 1, g.w);
    while (y0 < 0) y0 += g.dh;
    while (x0 < 0) x0 += g.dw;
    std::int64_t best = y0 * g.w + x0;
    float m = -INFINITY;
    for (std::int64_t iy = y0; iy < y1; iy += g.dh)
      for (std::int64_t ix = x0; ix < x1; ix += g.dw) {
        const float v = p[iy * g.w + ix];
        if (v > m || isnan(v)) m = v, best = iy * g.w + ix;
      }
    out[e] = m;
    idx[e] = best;
  }
}
__global__ void max_pool_bw_k(const float* go, const long long* idx, Window2d g, float* gx, std::int64_t n) {
  const std::int64_t L = g.oh * g.ow;
  GRID_LOOP(e, n) atomicAdd(gx + (e / L) * g.h * g.w + idx[e], go[e]);
}
struct AvgWin {
  std::int64_t y0, y1, x0, x1;
  float div;
};
__device__ AvgWin avg_win(const Window2d& g, bool include_pad, std::int64_t oy, std::int64_t ox) {
  AvgWin a;
  a.y0 = oy * g.sh - g.ph, a.x0 = ox * g.sw - g.pw;
  a.y1 = min(a.y0 + g.kh, g.h + g.ph), a.x1 = min(a.x0 + g.kw, g.w + g.pw);
  const std::int64_t pool = (a.y1 - a.y0) * (a.x1 - a.x0);
  a.y0 = max(a.y0, (std::int64_t)0), a.x0 = max(a.x0, (std::int64_t)0);
  a.y1 = min(a.y1, g.h), a.x1 = min(a.x1, g.w);
  a.div = static_cast<float>(include_pad ? pool : (a.y1 - a.y0) * (a.x1 - a.x0));
  return a;
}
__global__ void avg_pool_k(const float* x, Window2d g, bool include_pad, float* out, std::int64_t n) {
  GRID_LOOP(e, n) {
    const std::int64_t ox = e % g.ow, oy = (e / g.ow) % g.oh, pl = e / (g.ow * g.oh);
    const float* p = x + pl * g.h * g.w;
    const AvgWin a = avg_win(g, include_pad, oy, ox);
    float s = 0.f;
    for (std::int64_t iy = a.y0; iy < a.y1; ++iy)
      for (std::int64_t ix = a.x0; ix < a.x1; ++ix) s += p[iy * g.w + ix];
    out[e] = a.y0 >= a.y1 || a.x0 >= a.x1 ? 0.f : s / a.div;
  }
}
__global__ void avg_pool_bw_k(const float* go, Window2d g, bool include_pad, float* gx, std::int64_t n) {
  GRID_LOOP(e, n) {
    const std::int64_t ox = e % g.ow, oy = (e / g.ow) % g.oh, pl = e / (g.ow * g.oh);
    float* p = gx + pl * g.h * g.w;
    const AvgWin a = avg_win(g, include_pad, oy, ox);
    if (a.y0 >= a.y1 || a.x0 >= a.x1) continue;
    const float v = go[e] / a.div;
    for (std::int64_t iy = a.y0; iy < a.y1; ++iy)
      for (std::int64_t ix = a.x0; ix < a.x1; ++ix) atomicAdd(p + iy * g.w + ix, v);
  }
}
__global__ void adaptive_avg_k(const float* x, Window2d g, float* out, std::int64_t n, bool backward) {
  GRID_LOOP(e, n) {
    const std::int64_t ox = e % g.ow, oy = (e / g.ow) % g.oh, pl = e / (g.ow * g.oh);
    const std::int64_t y0 = (oy * g.h) / g.oh, y1 = ((oy + 1) * g.h + g.oh - 1) / g.oh;
    const std::int64_t x0 = (ox * g.w) / g.ow, x1 = ((ox + 1) * g.w + g.ow - 1) / g.ow;
    const float cnt = static_cast<float>((y1 - y0) * (x1 - x0));
    if (backward) {  // x is grad_out, out is grad_x (zeroed)
      const float v = x[e] / cnt;
      for (std::int64_t iy = y0; iy < y1; ++iy)
        for (std::int64_t ix = x0; ix < x1; ++ix) atomicAdd(out + pl * g.h * g.w + iy * g.w + ix, v);
    } else {
      const float* p = x + pl * g.h * g.w;
      float s = 0.f;
      for (std::int64_t iy = y0; iy < y1; ++iy)
        for (std::int64_t ix = x0; ix < x1; ++ix) s += p[iy * g.w + ix];
      out[e] = s / cnt;
    }
  }
}
}  // namespace

void CudaKernels::im2col(const Tensor& x, std::int64_t image, const Window2d& g, Tensor& col) {
  on_device(x);
  const std::int64_t n = col.numel();
  if (n) im2col_k<<<blocks_for(n), kThreads>>>(cf(x) + image * g.c * g.h * g.w, g, mf(col), n);
  after_launch("im2col kernel");
}

void CudaKernels::col2im(const Tensor& col, std::int64_t image, const Window2d& g, Tensor& grad_x) {
  on_device(col);
  const std::int64_t n = g.c * g.h * g.w;
  if (n) col2im_k<<<blocks_for(n), kThreads>>>(cf(col), g, mf(grad_x) + image * n, n);
  after_launch("col2im kernel");
}

void CudaKernels::max_pool2d(const Tensor& x, const Window2d& g, Tensor& out, Tensor& indices) {
  on_device(x);
  const std::int64_t n = out.numel();
  if (n) max_pool_k<<<blocks_for(n), kThreads>>>(cf(x), g, mf(out), static_cast<long long*>(indices.raw_data()), n);
  after_launch("max_pool2d kernel");
}

void CudaKernels::max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Window2d& g,
                                      Tensor& grad_x) {
  on_device(grad_out);
  if (grad_x.nbytes()) PHALANX_CUDA_CHECK(cudaMemsetAsync(grad_x.raw_data(), 0, grad_x.nbytes()));
  const std::int64_t n = grad_out.numel();
  if (n)
    max_pool_bw_k<<<blocks_for(n), kThreads>>>(cf(grad_out), static_cast<const long long*>(indices.raw_data()), g,
                                               mf(grad_x), n);
  after_launch("max_pool2d backward kernel");
}

void CudaKernels::avg_pool2d(const Tensor& x, const Window2d& g, bool count_include_pad, Tensor& out) {
  on_device(x);
  const std::int64_t n = out.numel();
  if (n) avg_pool_k<<<blocks_for(n), kThreads>>>(cf(x), g, count_include_pad, mf(out), n);
  after_launch("avg_pool2d kernel");
}

void CudaKernels::avg_pool2d_backward(const Tensor& grad_out, const Window2d& g, bool count_include_pad,
                                      Tensor& grad_x) {
  on_device(grad_out);
  if (grad_x.nbytes()) PHALANX_CUDA_CHECK(cudaMemsetAsync(grad_x.raw_data(), 0, grad_x.nbytes()));
  const std::int64_t n = grad_out.numel();
  if (n) avg_pool_bw_k<<<blocks_for(n), kThreads>>>(cf(grad_out), g, count_include_pad, mf(grad_x), n);
  after_launch("avg_pool2d backward kernel");
}

void CudaKernels::adaptive_avg_pool2d(const Tensor& x, const Window2d& g, Tensor& out) {
  on_device(x);
  const std::int64_t n = out.numel();
  if (n) adaptive_avg_k<<<blocks_for(n), kThreads>>>(cf(x), g, mf(out), n, false);
  after_launch("adaptive_avg_pool2d kernel");
}

void CudaKernels::adaptive_avg_pool2d_backward(const Tensor& grad_out, const Window2d& g, Tensor& grad_x) {
  on_device(grad_out);
  if (grad_x.nbytes()) PHALANX_CUDA_CHECK(cudaMemsetAsync(grad_x.raw_data(), 0, grad_x.nbytes()));
  const std::int64_t n = grad_out.numel();
  if (n) adaptive_avg_k<<<blocks_for(n), kThreads>>>(cf(grad_out), g, mf(grad_x), n, true);
  after_launch("adaptive_avg_pool2d backward kernel");
}

namespace {
__global__ void add_channel_bias_k(const float* b, std::int64_t c, std::int64_t inner, float* o, std::int64_t n) {
  GRID_LOOP(i, n) o[i] += b[(i / inner) % c];
}
// One block per channel; double partial sums, then one float.
__global__ void channel_sum_k(const float* g, std::int64_t outer, std::int64_t c, std::int64_t inner, float* o) {
  __shared__ double part[kThreads];
  const std::int64_t ch = blockIdx.x, count = outer * inner;
  double s = 0;
  for (std::int64_t e = threadIdx.x; e < count; e += blockDim.x) s += g[((e / inner) * c + ch) * inner + e % inner];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int step = blockDim.x / 2; step > 0; step /= 2) {
    if (threadIdx.x < step) part[threadIdx.x] += part[threadIdx.x + step];
    __syncthreads();
  }
  if (threadIdx.x == 0) o[ch] = static_cast<float>(part[0]);
}
}  // namespace

void CudaKernels::add_channel_bias(const Tensor& bias, std::int64_t outer, std::int64_t inner, Tensor& out) {
  on_device(out);
  const std::int64_t n = out.numel();
  if (n) add_channel_bias_k<<<blocks_for(n), kThreads>>>(cf(bias), bias.numel(), inner, mf(out), n);
  after_launch("add_channel_bias kernel");
}

void CudaKernels::channel_sum(const Tensor& g, std::int64_t outer, std::int64_t inner, Tensor& out) {
  on_device(g);
  const std::int64_t c = out.numel();
  if (c) channel_sum_k<<<static_cast<unsigned>(c), kThreads>>>(cf(g), outer, c, inner, mf(out));
  after_launch("channel_sum kernel");
}
// ---- end convolution and pooling ----

}  // namespace phalanx::cuda
