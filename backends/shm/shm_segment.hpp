#pragma once
// The shared-memory segment of one shm group: its layout, and how the ranks create and
// attach it through the group's store (docs/shm.md).
//
// Layout (every part cache-line aligned, the slots and channels page aligned):
//   Header            fixed fields written once by rank 0, the attach counter, the futex word
//   RankLine[W]       one line per rank, written only by that rank (step, signature, state, pid)
//   ChannelCtl[W*W]   head/tail counters of each directed send/recv channel (src*W + dst)
//   slot[W]           each rank's staging area (slot_bytes: two halves, used alternately)
//   channel[W*W]      each directed channel's ring buffer (chan_bytes; src == dst unused)
//
// The name carries the job (a hash of PHALANX_RDZV_TOKEN), this user, the creator's pid
// namespace and pid, and a random id; rank 0 publishes it in the store. Every rank unlinks
// it as soon as all W ranks attached, so nothing is left in /dev/shm even when a rank is
// killed afterwards; a name left by a creator killed before that is removed by the next
// group this user creates in the same pid namespace (docs/shm.md).
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace phalanx {
class Store;
}

namespace phalanx::shm {

constexpr std::uint64_t kMagic = 0x50484c5853484d31ull;  // "PHLXSHM1"
constexpr std::uint32_t kVersion = 3;  // 2: RankLine::ops; 3: Header::user
constexpr std::size_t kLine = 64;
/// The prefix of every segment name (in /dev/shm without the slash).
constexpr const char* kNamePrefix = "phalanx-shm-";
/// Published instead of a segment's name when rank 0 cannot create one (the reason follows).
constexpr const char* kUnavailableMark = "!unavailable: ";

enum RankState : std::int32_t { kAttaching = 0, kAlive = 1, kLeft = 2, kFailed = 3 };

struct alignas(kLine) Header {
  std::uint64_t magic;
  std::uint32_t version;
  std::int32_t world;
  std::uint64_t slot_bytes;
  std::uint64_t chan_bytes;
  std::uint64_t total_bytes;
  std::uint64_t small_bytes;  ///< rank 0's algorithm choices, adopted by every rank
  std::uint64_t chunk_bytes;
  std::uint64_t user;  ///< rank 0's value for the segment's owner (Segment's `user`)
  alignas(kLine) std::atomic<std::int32_t> attached;
  alignas(kLine) std::atomic<std::uint32_t> epoch;  ///< futex word: bumped when a sleeper must wake
  std::atomic<std::int32_t> sleepers;                ///< ranks/threads in futex_wait now
};

struct alignas(kLine) RankLine {
  std::atomic<std::uint64_t> step;     ///< the last step this rank posted
  std::atomic<std::uint64_t> sig[2];   ///< the signature of the op posting step s, at sig[s & 1]
  std::atomic<std::int32_t> state;     ///< RankState
  std::int32_t pid;
  /// The collectives this rank ran (begun; on a clean end all completed), written once when
  /// it leaves (before state becomes kLeft): a peer still waiting names the count in its
  /// PeerFinishedError.
  std::atomic<std::uint64_t> ops;
};

struct alignas(kLine) ChannelCtl {
  alignas(kLine) std::atomic<std::uint64_t> head;  ///< bytes the sender has written, in total
  alignas(kLine) std::atomic<std::uint64_t> tail;  ///< bytes the receiver has consumed, in total
};

/// One attached segment (the mapping and the offsets into it).
class Segment {
 public:
  /// Rank 0 creates the segment and publishes its name under `key` in `store`; the others
  /// attach. Returns once all `world` ranks attached and the name is unlinked. Throws a
  /// one-line CommError/TimeoutError/ConfigError on failure (and leaves nothing behind).
  /// `small_bytes` and `chunk_bytes` (the allreduce algorithm's switch and round size) are
  /// rank 0's: every rank must cut a message alike, so the others adopt them (small_bytes(),
  /// chunk_bytes()), as they adopt its slot size.
  /// `channels` false: no send/recv rings (a zero-copy buffer's segment: only the slots).
  /// `user`: a value of rank 0's that every rank reads back (user()): the group's zero-copy
  /// switch, a zero-copy buffer's byte count. `peer_gone(r)`, when given: why rank r can no
  /// longer come ("" while it can), asked every few milliseconds while waiting for rank 0's
  /// name and every 100 ms while waiting for the others to attach; a reason fails the wait at
  /// once (a zero-copy buffer's ranks are the group's: their pids are known before they come).
  Segment(Store& store, int rank, int world, std::uint64_t slot_bytes, std::uint64_t small_bytes,
          std::uint64_t chunk_bytes, std::chrono::milliseconds timeout, bool channels = true,
          std::uint64_t user = 0, const std::function<std::string(int)>& peer_gone = {});
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  Header& header() const { return *reinterpret_cast<Header*>(base_); }
  RankLine& line(int r) const { return reinterpret_cast<RankLine*>(base_ + lines_off_)[r]; }
  ChannelCtl& channel_ctl(int src, int dst) const {
    return reinterpret_cast<ChannelCtl*>(base_ + chanctl_off_)[src * world_ + dst];
  }
  /// Rank r's whole slot (slot_bytes()).
  char* slot_base(int r) const { return base_ + slots_off_ + r * slot_bytes_; }
  std::size_t slot_bytes() const { return slot_bytes_; }
  /// Half `h` (0 or 1) of rank r's staging slot.
  char* slot(int r, int h) const { return base_ + slots_off_ + r * slot_bytes_ + h * half_bytes(); }
  char* channel(int src, int dst) const {
    return base_ + chans_off_ + static_cast<std::size_t>(src * world_ + dst) * chan_bytes_;
  }
  std::size_t half_bytes() const { return slot_bytes_ / 2; }
  std::size_t chan_bytes() const { return chan_bytes_; }
  std::size_t small_bytes() const { return static_cast<std::size_t>(header().small_bytes); }
  std::size_t chunk_bytes() const { return static_cast<std::size_t>(header().chunk_bytes); }
  std::uint64_t user() const { return header().user; }
  const std::string& name() const { return name_; }
  int world() const { return world_; }

 private:
  void compute_layout();
  std::string name_;
  int world_;
  std::size_t slot_bytes_, chan_bytes_ = 0;
  std::size_t lines_off_ = 0, chanctl_off_ = 0, slots_off_ = 0, chans_off_ = 0, total_ = 0;
  char* base_ = nullptr;
};

/// Whether process `pid` (of this pid namespace) runs: kill(pid, 0), and a zombie (exited,
/// not yet reaped by its parent) counts as dead.
bool pid_alive(int pid);

/// Publishes this rank's pid in the group's store: the first thing a rank does, so that the
/// others waiting for it to attach see at once when it exits instead (any error before
/// attaching). Segment's attach loop reads these.
void publish_pid(Store& store, int rank);

/// PHALANX_SHM_BYTES (staging bytes per rank; default 4 MiB), validated.
std::uint64_t slot_bytes_from_env();

}  // namespace phalanx::shm
