// scaled_dot_product_attention on CUDA (docs/attention.md): simple, tiled, exact. One
// thread per query row (forward, grad_q) or per key row (grad_k, grad_v); the rows it loops
// over are staged through shared memory a tile at a time. The forward keeps the online
// softmax's running maximum and sum per row (no L x S matrix anywhere); the backward
// recomputes each weight from q, k and the saved row maximum and sum, as the CPU kernel does, with
// rowsum(grad_out * out) computed first. No atomics: every output element has one writer,
// so results do not depend on scheduling. The dropout decisions are the CPU's (the same
// SplitMix64 counter hash), so CPU and CUDA drop the same weights for the same seed.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "cuda_check.hpp"
#include "cuda_kernels.hpp"

namespace phalanx::cuda {

namespace {

constexpr int kRows = 64;                     // threads (rows) per block
constexpr int kMaxTile = 32;                  // rows staged in shared memory at a time
constexpr std::size_t kSharedBytes = 48 * 1024;  // without opting in to more

__device__ std::int64_t mask_offset(const AttentionParams& p, std::int64_t head) {
  std::int64_t off = 0;
  for (int d = p.lead - 1; d >= 0; --d) {
    off += (head % p.lead_sizes[d]) * p.mask_lead_strides[d];
    head /= p.lead_sizes[d];
  }
  return off;
}

/// The scaled, masked score of (i, j) from the raw dot product (-inf where masked).
__device__ float masked_score(const AttentionParams& p, const float* fmask, const unsigned char* bmask,
                              std::int64_t i, std::int64_t j, float dot) {
  if (p.causal && j > i) return -INFINITY;
  float s = dot * p.scale;
  const std::int64_t at = i * p.mask_row_stride + j * p.mask_col_stride;
  if (fmask) s += fmask[at];
  if (bmask && !bmask[at]) s = -INFINITY;
  return s;
}

/// The dropout multiplier of weight (head, i, j): output (head * L + i) * S + j of
/// SplitMix64 seeded with the call's seed, top 24 bits as a float in [0, 1), kept when >= p.
__device__ float drop_factor(const AttentionParams& p, std::int64_t head, std::int64_t i, std::int64_t j) {
  if (!(p.dropout_p > 0.f)) return 1.f;
  const unsigned long long n = static_cast<unsigned long long>((head * p.l + i) * p.s + j);
  unsigned long long x = p.dropout_seed + (n + 1ull) * 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  const float u = static_cast<float>(x >> 40) * 0x1p-24f;
  return u >= p.dropout_p ? (p.dropout_p < 1.f ? 1.f / (1.f - p.dropout_p) : 0.f) : 0.f;
}

__device__ float dot(const float* a, const float* b, std::int64_t n) {
  float s = 0.f;
  for (std::int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

/// Copies rows [r0, r0 + n) of a [rows, width] matrix into shared memory (block-wide).
__device__ void stage(float* dst, const float* src, std::int64_t r0, std::int64_t n, std::int64_t width) {
  for (std::int64_t idx = threadIdx.x; idx < n * width; idx += blockDim.x) dst[idx] = src[r0 * width + idx];
}

/// The query row a thread of the forward and grad_q kernels owns (blocks of kRows rows per
/// head), with its head's slice of the mask.
struct QueryRow {
  std::int64_t head, i;
  bool active;  // i < L: threads past the last row only help staging
  const float* fm;
  const unsigned char* bm;
};

__device__ QueryRow query_row(const AttentionParams& p, const float* fmask, const unsigned char* bmask) {
  const std::int64_t tiles_per_head = (p.l + kRows - 1) / kRows;
  QueryRow r;
  r.head = blockIdx.x / tiles_per_head;
  r.i = (blockIdx.x % tiles_per_head) * kRows + threadIdx.x;
  r.active = r.i < p.l;
  const std::int64_t moff = (fmask || bmask) ? mask_offset(p, r.head) : 0;
  r.fm = fmask ? fmask + moff : nullptr;
  r.bm = bmask ? bmask + moff : nullptr;
  return r;
}

/// Streams the key and value rows of `row.head` through shared memory `sm`, `tile` rows at a
/// time (block-wide: every thread of the block calls it), and calls visit(j, k_j, v_j) for
/// each key j, in order, on the threads whose row is active.
template <typename Visit>
__device__ void for_each_key(const AttentionParams& p, int tile, const QueryRow& row, const float* k, const float* v,
                             float* sm, Visit visit) {
  float* ks = sm;
  float* vs = sm + tile * p.e;
  for (std::int64_t j0 = 0; j0 < p.s; j0 += tile) {
    const std::int64_t n = min(static_cast<std::int64_t>(tile), p.s - j0);
    __syncthreads();
    stage(ks, k + row.head * p.s * p.e, j0, n, p.e);
    stage(vs, v + row.head * p.s * p.ev, j0, n, p.ev);
    __syncthreads();
    if (!row.active) continue;
    for (std::int64_t jj = 0; jj < n; ++jj) visit(j0 + jj, ks + jj * p.e, vs + jj * p.ev);
  }
}

// Forward: thread = query row i of head `head`; key/value tiles staged in shared memory.
__global__ void attn_fwd_k(AttentionParams p, int tile, const float* q, const float* k, const float* v,
                           const float* fmask, const unsigned char* bmask, float* out, float* stats) {
  extern __shared__ float sm[];
  const QueryRow r = query_row(p, fmask, bmask);
  const std::int64_t head = r.head, i = r.i;
  const float* qi = q + (head * p.l + (r.active ? i : 0)) * p.e;
  float* oi = out + (head * p.l + (r.active ? i : 0)) * p.ev;
  float m = -INFINITY, l = 0.f;
  if (r.active)
    for (std::int64_t d = 0; d < p.ev; ++d) oi[d] = 0.f;
  for_each_key(p, tile, r, k, v, sm, [&](std::int64_t j, const float* kj, const float* vj) {
    const float s = masked_score(p, r.fm, r.bm, i, j, dot(qi, kj, p.e));
    const float m_new = fmaxf(m, s);
    if (m_new == -INFINITY) return;  // every score so far masked
    const float alpha = expf(m - m_new);
    const float w = expf(s - m_new);
    l = l * alpha + w;
    m = m_new;
    const float wd = w * drop_factor(p, head, i, j);
    for (std::int64_t d = 0; d < p.ev; ++d) oi[d] = oi[d] * alpha + wd * vj[d];
  });
  if (!r.active) return;
  // Every score masked (m = -inf, l = 0): zeros, as PyTorch 2.5+'s _safe_softmax.
  for (std::int64_t d = 0; d < p.ev; ++d) oi[d] = m == -INFINITY ? 0.f : oi[d] / l;
  // m and l apart, not m + log l: that rounds to m for a row of -1e9 scores (weights of 1).
  stats[2 * (head * p.l + i)] = m;
  stats[2 * (head * p.l + i) + 1] = l;
}

// rowsum(grad_out * out) per row.
__global__ void attn_dsum_k(std::int64_t rows, std::int64_t ev, const float* g, const float* o, float* dsum) {
  for (std::int64_t r = blockIdx.x * (std::int64_t)blockDim.x + threadIdx.x; r < rows;
       r += (std::int64_t)blockDim.x * gridDim.x)
    dsum[r] = dot(g + r * ev, o + r * ev, ev);
}

// The weight recomputed from its score, its row's maximum m and 1 / (its sum); 0 in a
// fully masked row (m = -inf).
__device__ float weight(float s, float m_i, float inv_l_i) { return m_i == -INFINITY ? 0.f : expf(s - m_i) * inv_l_i; }

// dS of (i, j), scale folded in; 0 for a masked weight.
__device__ float grad_score(const AttentionParams& p, float w, float dp, float dsum_i) {
  return w == 0.f ? 0.f : w * (dp - dsum_i) * p.scale;
}

// grad_q: thread = query row i; key/value tiles staged.
__global__ void attn_bwd_q_k(AttentionParams p, int tile, const float* q, const float* k, const float* v,
                             const float* fmask, const unsigned char* bmask, const float* stats, const float* dsum,
                             const float* gout, float* gq) {
  extern __shared__ float sm[];
  const QueryRow r = query_row(p, fmask, bmask);
  const std::int64_t head = r.head, i = r.i;
  const std::int64_t row = head * p.l + (r.active ? i : 0);
  const float* qi = q + row * p.e;
  const float* gi = gout + row * p.ev;
  float* gqi = gq + row * p.e;
  const float m_i = stats[2 * row], inv_l_i = 1.f / stats[2 * row + 1], dsum_i = dsum[row];
  if (r.active)
    for (std::int64_t d = 0; d < p.e; ++d) gqi[d] = 0.f;
  for_each_key(p, tile, r, k, v, sm, [&](std::int64_t j, const float* kj, const float* vj) {
    const float w = weight(masked_score(p, r.fm, r.bm, i, j, dot(qi, kj, p.e)), m_i, inv_l_i);
    const float dp = dot(gi, vj, p.ev) * drop_factor(p, head, i, j);
    const float ds = grad_score(p, w, dp, dsum_i);
    for (std::int64_t d = 0; d < p.e; ++d) gqi[d] += ds * kj[d];
  });
}

// grad_k, grad_v: thread = key row j; query rows (q, grad_out, stats, dsum) staged.
__global__ void attn_bwd_kv_k(AttentionParams p, int tile, const float* q, const float* k, const float* v,
                              const float* fmask, const unsigned char* bmask, const float* stats, const float* dsum,
                              const float* gout, float* gk, float* gv) {
  extern __shared__ float sm[];
  const std::int64_t tiles_per_head = (p.s + kRows - 1) / kRows;
  const std::int64_t head = blockIdx.x / tiles_per_head;
  const std::int64_t j = (blockIdx.x % tiles_per_head) * kRows + threadIdx.x;
  const bool active = j < p.s;
  const std::int64_t moff = (fmask || bmask) ? mask_offset(p, head) : 0;
  const float* fm = fmask ? fmask + moff : nullptr;
  const unsigned char* bm = bmask ? bmask + moff : nullptr;
  const std::int64_t row = head * p.s + (active ? j : 0);
  const float* kj = k + row * p.e;
  const float* vj = v + row * p.ev;
  float* gkj = gk ? gk + row * p.e : nullptr;
  float* gvj = gv ? gv + row * p.ev : nullptr;
  float* qs = sm;
  float* gs = qs + tile * p.e;
  float* ls = gs + tile * p.ev;
  float* ds_s = ls + 2 * tile;  // ls: (m, l) per row
  if (active) {
    if (gkj)
      for (std::int64_t d = 0; d < p.e; ++d) gkj[d] = 0.f;
    if (gvj)
      for (std::int64_t d = 0; d < p.ev; ++d) gvj[d] = 0.f;
  }
  for (std::int64_t i0 = 0; i0 < p.l; i0 += tile) {
    const std::int64_t n = min(static_cast<std::int64_t>(tile), p.l - i0);
    __syncthreads();
    stage(qs, q + head * p.l * p.e, i0, n, p.e);
    stage(gs, gout + head * p.l * p.ev, i0, n, p.ev);
    stage(ls, stats + 2 * head * p.l, i0, n, 2);
    stage(ds_s, dsum + head * p.l, i0, n, 1);
    __syncthreads();
    if (!active) continue;
    for (std::int64_t ii = 0; ii < n; ++ii) {
      const std::int64_t i = i0 + ii;
      const float w = weight(masked_score(p, fm, bm, i, j, dot(qs + ii * p.e, kj, p.e)), ls[2 * ii], 1.f / ls[2 * ii + 1]);
      const float z = drop_factor(p, head, i, j);
      const float* gi = gs + ii * p.ev;
      if (gvj)
        for (std::int64_t d = 0; d < p.ev; ++d) gvj[d] += w * z * gi[d];
      if (gkj) {
        const float ds = grad_score(p, w, dot(gi, vj, p.ev) * z, ds_s[ii]);
        for (std::int64_t d = 0; d < p.e; ++d) gkj[d] += ds * qs[ii * p.e + d];
      }
    }
  }
}

const float* cf(const Tensor& t) { return t.defined() ? static_cast<const float*>(t.raw_data()) : nullptr; }
float* mf(const Tensor& t) { return t.defined() ? static_cast<float*>(t.raw_data()) : nullptr; }
const float* fmask_of(const Tensor& mask, const AttentionParams& p) {
  return p.mask_kind == AttentionMask::Float ? cf(mask) : nullptr;
}
const unsigned char* bmask_of(const Tensor& mask, const AttentionParams& p) {
  return p.mask_kind == AttentionMask::Bool ? static_cast<const unsigned char*>(mask.raw_data()) : nullptr;
}

/// Rows staged per tile so that `floats_per_row` floats a row (plus `extra`) fit the
/// default shared memory; throws when not even one row fits.
int tile_rows(std::int64_t floats_per_row) {
  floats_per_row = std::max<std::int64_t>(floats_per_row, 1);  // the op refuses E = 0; stay safe
  const std::int64_t fit = static_cast<std::int64_t>(kSharedBytes / sizeof(float)) / floats_per_row;
  if (fit < 1)
    throw CudaError(detail::concat("scaled_dot_product_attention on CUDA: head dims too large for shared memory (",
                                   floats_per_row, " floats a row, at most ", kSharedBytes / sizeof(float), ")"));
  return static_cast<int>(std::min<std::int64_t>(fit, kMaxTile));
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_cuda(what, e, __FILE__, __LINE__);
}

/// One block per 64 rows of each head, on gridDim.x (at most 2^31 - 1 blocks): throws
/// rather than letting the count wrap when cast to unsigned.
unsigned blocks(std::int64_t batch, std::int64_t rows) {
  constexpr std::int64_t kMaxGrid = 2147483647;
  const std::int64_t per_head = (rows + kRows - 1) / kRows;
  if (per_head > 0 && batch > kMaxGrid / per_head)
    throw CudaError(detail::concat("scaled_dot_product_attention on CUDA: ", batch, " heads x ", per_head,
                                   " blocks of ", kRows, " rows exceed the grid limit of ", kMaxGrid,
                                   " blocks; split the batch into several calls"));
  return static_cast<unsigned>(batch * per_head);
}

}  // namespace

void CudaKernels::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                    const AttentionParams& p, Tensor& out, Tensor& stats) {
  PHALANX_CUDA_CHECK(cudaSetDevice(q.device().index));
  if (p.batch * p.l == 0) return;
  const int tile = tile_rows(p.e + p.ev);
  attn_fwd_k<<<blocks(p.batch, p.l), kRows, tile * (p.e + p.ev) * sizeof(float)>>>(
      p, tile, cf(q), cf(k), cf(v), fmask_of(mask, p), bmask_of(mask, p), mf(out), mf(stats));
  check_launch("attention forward kernel");
}

void CudaKernels::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                     const Tensor& out, const Tensor& stats, const Tensor& grad_out,
                                     const AttentionParams& p, Tensor& grad_q, Tensor& grad_k, Tensor& grad_v) {
  PHALANX_CUDA_CHECK(cudaSetDevice(q.device().index));
  if (p.batch * p.l == 0 || p.s == 0) return;
  Tensor dsum = Tensor::empty({p.batch, p.l}, DType::Float32, q.device());
  const std::int64_t rows = p.batch * p.l;
  attn_dsum_k<<<static_cast<unsigned>(std::min<std::int64_t>((rows + 255) / 256, 65535)), 256>>>(
      rows, p.ev, cf(grad_out), cf(out), mf(dsum));
  check_launch("attention backward (rowsum) kernel");
  const float* fm = fmask_of(mask, p);
  const unsigned char* bm = bmask_of(mask, p);
  if (grad_q.defined()) {
    const int tile = tile_rows(p.e + p.ev);
    attn_bwd_q_k<<<blocks(p.batch, p.l), kRows, tile * (p.e + p.ev) * sizeof(float)>>>(
        p, tile, cf(q), cf(k), cf(v), fm, bm, cf(stats), cf(dsum), cf(grad_out), mf(grad_q));
    check_launch("attention backward (grad_q) kernel");
  }
  if (grad_k.defined() || grad_v.defined()) {
    const int tile = tile_rows(p.e + p.ev + 3);
    attn_bwd_kv_k<<<blocks(p.batch, p.s), kRows, tile * (p.e + p.ev + 3) * sizeof(float)>>>(
        p, tile, cf(q), cf(k), cf(v), fm, bm, cf(stats), cf(dsum), cf(grad_out), mf(grad_k), mf(grad_v));
    check_launch("attention backward (grad_k, grad_v) kernel");
  }
}

}  // namespace phalanx::cuda
