#pragma once
// What each rank posts with its steps: the operation, its dtype, its reduce op, its root and
// its byte count. The first step of every operation compares them across ranks, so a
// mismatched call (other size, dtype, reduce op or root) fails with both calls named instead
// of mixing up bytes. Layout: op 4 bits | dtype 4 | reduce op 4 | root 12 | bytes 40.
#include <cstddef>
#include <cstdint>
#include <string>

#include "phalanx/backends/reduce_op.hpp"
#include "phalanx/core/dtype.hpp"

namespace phalanx::shm {

enum class OpCode : std::uint8_t {
  Barrier = 1, Allreduce, Reduce, Broadcast, Allgather, ReduceScatter, Gather, Scatter,
  AllreduceInPlace  ///< on a zero-copy buffer; its root field holds in_place_tag()
};

constexpr unsigned kNoField = 0xf;   ///< dtype / reduce op not part of this operation
constexpr unsigned kNoRoot = 0xfff;  ///< root not part of this operation

/// The fields an operation carries; the rest stay kNoField / kNoRoot.
struct SigFields {
  unsigned dtype = kNoField, op = kNoField, root = kNoRoot;
};
inline SigFields with_dtype(DType d) { return {static_cast<unsigned>(d), kNoField, kNoRoot}; }
inline SigFields with_reduce(DType d, ReduceOp op) { return {static_cast<unsigned>(d), static_cast<unsigned>(op), kNoRoot}; }
inline SigFields with_root(SigFields f, int root) {
  f.root = static_cast<unsigned>(root) % kNoRoot;  // 12 bits; roots 4095 apart would not be told apart
  return f;
}

/// The root field of an AllreduceInPlace: which zero-copy buffer, and where in it (12 bits of
/// a hash: a tensor at another buffer or offset on another rank fails the check, but for
/// 1 in 4096 pairs).
inline unsigned in_place_tag(std::uint32_t buffer, std::size_t offset) {
  std::uint64_t h = (static_cast<std::uint64_t>(buffer) << 40) ^ static_cast<std::uint64_t>(offset);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return static_cast<unsigned>(h % kNoRoot);
}

inline std::uint64_t make_sig(OpCode op, SigFields f, std::uint64_t bytes) {
  return (static_cast<std::uint64_t>(op) << 60) | (static_cast<std::uint64_t>(f.dtype & 0xf) << 56) |
         (static_cast<std::uint64_t>(f.op & 0xf) << 52) | (static_cast<std::uint64_t>(f.root & 0xfff) << 40) |
         (bytes & ((1ull << 40) - 1));
}

inline std::string sig_str(std::uint64_t sig) {
  static const char* const names[] = {"?", "barrier", "allreduce", "reduce", "broadcast",
                                      "allgather", "reduce_scatter", "gather", "scatter",
                                      "allreduce in place"};
  const unsigned op = static_cast<unsigned>(sig >> 60);
  const unsigned dt = static_cast<unsigned>(sig >> 56) & 0xf, rop = static_cast<unsigned>(sig >> 52) & 0xf;
  const unsigned root = static_cast<unsigned>(sig >> 40) & 0xfff;
  std::string s = std::string(op < 10 ? names[op] : "?") + "(" + std::to_string(sig & ((1ull << 40) - 1)) + " bytes";
  if (dt != kNoField) s += std::string(", ") + (dt <= 3 ? dtype_name(static_cast<DType>(dt)) : "dtype ?");
  if (rop != kNoField) s += std::string(", ") + (rop <= 4 ? reduce_op_name(static_cast<ReduceOp>(rop)) : "op ?");
  if (op == static_cast<unsigned>(OpCode::AllreduceInPlace))
    s += ", zero-copy buffer tag " + std::to_string(root);
  else if (root != kNoRoot)
    s += ", root " + std::to_string(root);
  return s + ")";
}

}  // namespace phalanx::shm
