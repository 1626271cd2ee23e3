// The collectives of the shm backend, in rounds over the staging slots (see the header).
#include <algorithm>
#include <cstring>

#include "phalanx/backends/comm_error.hpp"
#include "shm_process_group.hpp"
#include "shm_reduce.hpp"
#include "shm_signature.hpp"
#include "shm_staging.hpp"

namespace phalanx::shm {

namespace {

/// Rank q's slice [lo, hi) of a round of `len` elements: 64-byte aligned pieces, the last short.
struct Slice {
  std::size_t lo, hi;
};
Slice slice_of(int q, int W, std::size_t len, std::size_t es) {
  const std::size_t align = std::max<std::size_t>(1, 64 / es);
  std::size_t per = (len + W - 1) / W;
  per = (per + align - 1) / align * align;
  const std::size_t lo = std::min(len, per * q);
  return {lo, std::min(len, lo + per)};
}

}  // namespace

void ShmProcessGroup::reduce_impl(Tensor& t, ReduceOp op, int root, Op& o) {
  const int W = size(), me = rank();
  const DType dt = t.dtype();
  const std::size_t es = element_size(dt), n = static_cast<std::size_t>(t.numel()), bytes = n * es;
  char* data = static_cast<char*>(t.raw_data());
  const bool keep = root < 0 || root == me;
  const int divisor = op == ReduceOp::Avg ? W : 0;
  const void* src[64];
  std::vector<const void*> big_src;
  const void** srcs = src;
  if (W > 64) {
    big_src.resize(W);
    srcs = big_src.data();
  }
  Segment& seg = *seg_;
  if (bytes <= small_max_) {
    // One round: every rank reads every slot and reduces the whole message itself.
    const int h = half();
    std::memcpy(seg.slot(me, h), data, bytes);
    step(o);
    if (keep) {
      for (int q = 0; q < W; ++q) srcs[q] = q == me ? data : seg.slot(q, h);
      reduce_into(dt, op, data, nullptr, srcs, W, n, divisor);
    }
    next_round();
    return;
  }
  // Rounds of chunk_bytes_: each rank reduces its 1/W slice of the round (reading the other
  // slices from its own tensor, theirs from their slots), publishes it in its slot, and
  // copies the others' reduced slices out of theirs.
  const std::size_t chunk = std::max<std::size_t>(1, chunk_bytes_ / es);
  for (std::size_t off = 0; off < n; off += chunk) {
    const std::size_t len = std::min(chunk, n - off);
    const int h = half();
    char* base = data + off * es;
    char* mine = seg.slot(me, h);
    for (int q = 0; q < W; ++q) {
      if (q == me) continue;
      const Slice s = slice_of(q, W, len, es);
      std::memcpy(mine + s.lo * es, base + s.lo * es, (s.hi - s.lo) * es);
    }
    step(o);
    const Slice my = slice_of(me, W, len, es);
    for (int q = 0; q < W; ++q) srcs[q] = q == me ? base + my.lo * es : seg.slot(q, h) + my.lo * es;
    reduce_into(dt, op, keep ? base + my.lo * es : nullptr, mine + my.lo * es, srcs, W, my.hi - my.lo, divisor);
    step(o);
    if (keep)
      for (int q = 0; q < W; ++q) {
        if (q == me) continue;
        const Slice s = slice_of(q, W, len, es);
        std::memcpy(base + s.lo * es, seg.slot(q, h) + s.lo * es, (s.hi - s.lo) * es);
      }
    next_round();
  }
}

void ShmProcessGroup::allreduce_in_place(Tensor& t, ReduceOp op, Segment& seg, std::size_t offset,
                                         std::uint32_t index, std::uint64_t seq) {
  const int W = size(), me = rank();
  const DType dt = t.dtype();
  const std::size_t es = element_size(dt), n = static_cast<std::size_t>(t.numel());
  Op o = begin("allreduce", seq,
               make_sig(OpCode::AllreduceInPlace, with_root(with_reduce(dt, op), in_place_tag(index, offset)),
                        t.nbytes()));
  void* ptrs[64];
  std::vector<void*> big;
  void** at = ptrs;
  if (W > 64) {
    big.resize(W);
    at = big.data();
  }
  // Step 1: every rank's buffer holds its input. Each rank then reduces its slice of the
  // message from the W buffers (in rank order: the staged path's bits) into all W of them;
  // no other rank reads or writes that slice. Step 2: every slice is written everywhere.
  step(o);
  const Slice my = slice_of(me, W, n, es);
  for (int q = 0; q < W; ++q) at[q] = seg.slot_base(q) + offset + my.lo * es;
  if (my.hi > my.lo)
    reduce_into_all(dt, op, at, W, at, W, my.hi - my.lo, op == ReduceOp::Avg ? W : 0);
  step(o);
}

void ShmProcessGroup::run_allreduce(Tensor& t, ReduceOp op, std::uint64_t seq) {
  if (size() > 1) {
    std::size_t offset = 0;
    std::uint32_t index = 0;
    if (const std::shared_ptr<Segment> seg = find_region(t, &offset, &index)) {
      allreduce_in_place(t, op, *seg, offset, index, seq);
      return;
    }
  }
  Tensor h = host_of(t);
  Op o = begin("allreduce", seq, make_sig(OpCode::Allreduce, with_reduce(t.dtype(), op), t.nbytes()));
  reduce_impl(h, op, -1, o);
  copy_back(h, t);
}

void ShmProcessGroup::run_reduce(Tensor& t, int root, ReduceOp op, std::uint64_t seq) {
  Tensor h = host_of(t);
  Op o = begin("reduce", seq, make_sig(OpCode::Reduce, with_root(with_reduce(t.dtype(), op), root), t.nbytes()));
  reduce_impl(h, op, root, o);
  if (rank() == root) copy_back(h, t);
}

void ShmProcessGroup::run_broadcast(Tensor& t, int root, std::uint64_t seq) {
  const bool is_root = rank() == root;
  Tensor h = host_of(t, is_root);
  Op o = begin("broadcast", seq, make_sig(OpCode::Broadcast, with_root(with_dtype(t.dtype()), root), t.nbytes()));
  char* data = static_cast<char*>(h.raw_data());
  const std::size_t bytes = h.nbytes(), chunk = seg_->half_bytes();
  std::size_t off = 0;
  do {
    const std::size_t len = std::min(chunk, bytes - off);
    char* slot = seg_->slot(root, half());
    if (is_root) std::memcpy(slot, data + off, len);
    step(o);
    if (!is_root) std::memcpy(data + off, slot, len);
    next_round();
    off += len;
  } while (off < bytes);
  if (!is_root) copy_back(h, t);
}

void ShmProcessGroup::run_allgather(std::vector<Tensor>& out, const Tensor& in, std::uint64_t seq) {
  const Tensor h = host_of(in);
  Op o = begin("allgather", seq, make_sig(OpCode::Allgather, with_dtype(in.dtype()), in.nbytes()));
  const char* data = static_cast<const char*>(h.raw_data());
  const std::size_t bytes = h.nbytes(), chunk = seg_->half_bytes();
  std::size_t off = 0;
  do {
    const std::size_t len = std::min(chunk, bytes - off);
    std::memcpy(seg_->slot(rank(), half()), data + off, len);
    step(o);
    for (int q = 0; q < size(); ++q) write_back(out[q], off, q == rank() ? data + off : seg_->slot(q, half()), len);
    next_round();
    off += len;
  } while (off < bytes);
}

void ShmProcessGroup::run_gather(std::vector<Tensor>& out, const Tensor& in, int root, std::uint64_t seq) {
  const Tensor h = host_of(in);
  Op o = begin("gather", seq, make_sig(OpCode::Gather, with_root(with_dtype(in.dtype()), root), in.nbytes()));
  const char* data = static_cast<const char*>(h.raw_data());
  const std::size_t bytes = h.nbytes(), chunk = seg_->half_bytes();
  std::size_t off = 0;
  do {
    const std::size_t len = std::min(chunk, bytes - off);
    if (rank() != root) std::memcpy(seg_->slot(rank(), half()), data + off, len);
    step(o);
    if (rank() == root)
      for (int q = 0; q < size(); ++q) write_back(out[q], off, q == root ? data + off : seg_->slot(q, half()), len);
    next_round();
    off += len;
  } while (off < bytes);
}

void ShmProcessGroup::run_scatter(Tensor& out, std::vector<Tensor>& in, int root, std::uint64_t seq) {
  const bool is_root = rank() == root;
  std::vector<Tensor> hin;
  if (is_root)
    for (auto& t : in) hin.push_back(host_of(t));
  Op o = begin("scatter", seq, make_sig(OpCode::Scatter, with_root(with_dtype(out.dtype()), root), out.nbytes()));
  const int W = size();
  const std::size_t bytes = out.nbytes();
  const std::size_t chunk = std::max<std::size_t>(64, seg_->half_bytes() / W / 64 * 64);
  std::size_t off = 0;
  do {
    const std::size_t len = std::min(chunk, bytes - off);
    char* slot = seg_->slot(root, half());
    if (is_root)
      for (int q = 0; q < W; ++q)
        if (q != root) std::memcpy(slot + q * chunk, static_cast<const char*>(hin[q].raw_data()) + off, len);
    step(o);
    write_back(out, off, is_root ? static_cast<const char*>(hin[root].raw_data()) + off : slot + rank() * chunk, len);
    next_round();
    off += len;
  } while (off < bytes);
}

void ShmProcessGroup::run_reduce_scatter(Tensor& out, std::vector<Tensor>& in, ReduceOp op, std::uint64_t seq) {
  std::vector<Tensor> hin;
  for (auto& t : in) hin.push_back(host_of(t));
  Tensor h = host_of(out, false);
  const int W = size(), me = rank();
  const DType dt = out.dtype();
  Op o = begin("reduce_scatter", seq, make_sig(OpCode::ReduceScatter, with_reduce(dt, op), out.nbytes()));
  const std::size_t es = element_size(dt), n = static_cast<std::size_t>(out.numel());
  // Each round: rank q's slot holds its inputs[j] piece for every j at j * piece_bytes.
  const std::size_t piece = std::max<std::size_t>(1, seg_->half_bytes() / W / 64 * 64 / es);
  std::vector<const void*> srcs(W);
  std::size_t off = 0;
  do {
    const std::size_t len = std::min(piece, n - off);
    char* mine = seg_->slot(me, half());
    for (int j = 0; j < W; ++j)
      if (j != me)
        std::memcpy(mine + j * piece * es, static_cast<const char*>(hin[j].raw_data()) + off * es, len * es);
    step(o);
    for (int q = 0; q < W; ++q)
      srcs[q] = q == me ? static_cast<const char*>(hin[me].raw_data()) + off * es
                        : seg_->slot(q, half()) + me * piece * es;
    reduce_into(dt, op, static_cast<char*>(h.raw_data()) + off * es, nullptr, srcs.data(), W, len,
                op == ReduceOp::Avg ? W : 0);
    next_round();
    off += len;
  } while (off < n);
  copy_back(h, out);
}

void ShmProcessGroup::run_barrier(std::uint64_t seq) {
  Op o = begin("barrier", seq, make_sig(OpCode::Barrier, SigFields{}, 0));
  step(o);
  next_round();
}

}  // namespace phalanx::shm
