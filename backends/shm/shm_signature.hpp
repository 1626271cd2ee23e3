#pragma once
// What each rank posts with its steps: the operation, its parameter (root, or reduce op and
// dtype) and its byte count. The first step of every operation compares them across ranks,
// so a mismatched call fails with both calls named instead of mixing up bytes.
#include <cstdint>
#include <string>

namespace phalanx::shm {

enum class OpCode : std::uint8_t {
  Barrier = 1, Allreduce, Reduce, Broadcast, Allgather, ReduceScatter, Gather, Scatter
};

inline std::uint64_t make_sig(OpCode op, unsigned param, std::uint64_t bytes) {
  return (static_cast<std::uint64_t>(op) << 56) | (static_cast<std::uint64_t>(param & 0xff) << 48) |
         (bytes & ((1ull << 48) - 1));
}

inline std::string sig_str(std::uint64_t sig) {
  static const char* const names[] = {"?", "barrier", "allreduce", "reduce", "broadcast",
                                      "allgather", "reduce_scatter", "gather", "scatter"};
  const unsigned op = static_cast<unsigned>(sig >> 56);
  return std::string(op < 9 ? names[op] : "?") + "(" + std::to_string(sig & ((1ull << 48) - 1)) +
         " bytes, parameter " + std::to_string((sig >> 48) & 0xff) + ")";
}

}  // namespace phalanx::shm
