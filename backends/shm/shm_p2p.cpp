// send/recv of the shm backend: one ring buffer per ordered pair of ranks (the sender
// advances its head, the receiver its tail). Each message is a 16-byte header (tag, byte
// count) and its bytes. A message larger than the ring streams through it: whichever
// thread of this rank waits for a send or a receive advances every pending one, so a ring
// of sends and receives completes whatever the sizes.
#include <cstring>

#include "phalanx/backends/comm_error.hpp"
#include "shm_process_group.hpp"
#include "shm_staging.hpp"

namespace phalanx::shm {

struct ShmProcessGroup::P2p {
  bool is_send;
  int peer;
  std::uint64_t tag;
  std::uint64_t seq;
  Tensor host;    ///< the bytes (the tensor itself on the CPU, else a host copy)
  Tensor target;  ///< a staged receive lands here when complete
  std::size_t done = 0;  ///< message bytes moved so far, header included
  bool complete = false;
  std::string error;
  Clock::time_point deadline;
};

namespace {

constexpr std::size_t kHeader = 16;

void ring_write(char* ring, std::size_t cap, std::uint64_t pos, const char* src, std::size_t len) {
  const std::size_t at = pos & (cap - 1), first = std::min(len, cap - at);
  std::memcpy(ring + at, src, first);
  if (len > first) std::memcpy(ring, src + first, len - first);
}

void ring_read(const char* ring, std::size_t cap, std::uint64_t pos, char* dst, std::size_t len) {
  const std::size_t at = pos & (cap - 1), first = std::min(len, cap - at);
  std::memcpy(dst, ring + at, first);
  if (len > first) std::memcpy(dst + first, ring, len - first);
}

}  // namespace

bool ShmProcessGroup::progress_send(P2p& p) {
  ChannelCtl& c = seg_->channel_ctl(rank(), p.peer);
  char* ring = seg_->channel(rank(), p.peer);
  const std::size_t cap = seg_->chan_bytes(), total = kHeader + p.host.nbytes();
  const std::uint64_t head = c.head.load(std::memory_order_relaxed);
  const std::size_t space = cap - static_cast<std::size_t>(head - c.tail.load(std::memory_order_acquire));
  std::size_t n = std::min(space, total - p.done);
  if (n == 0) return false;
  std::uint64_t pos = head;
  std::size_t left = n;
  if (p.done < kHeader) {
    const std::uint64_t hdr[2] = {p.tag, static_cast<std::uint64_t>(p.host.nbytes())};
    const std::size_t k = std::min(left, kHeader - p.done);
    ring_write(ring, cap, pos, reinterpret_cast<const char*>(hdr) + p.done, k);
    pos += k, left -= k, p.done += k;
  }
  if (left > 0) {
    ring_write(ring, cap, pos, static_cast<const char*>(p.host.raw_data()) + (p.done - kHeader), left);
    pos += left, p.done += left;
  }
  c.head.store(pos, std::memory_order_seq_cst);
  sync_->wake_if_sleepers();
  p.complete = p.done == total;
  return true;
}

bool ShmProcessGroup::progress_recv(P2p& p) {
  ChannelCtl& c = seg_->channel_ctl(p.peer, rank());
  const char* ring = seg_->channel(p.peer, rank());
  const std::size_t cap = seg_->chan_bytes(), total = kHeader + p.host.nbytes();
  const std::uint64_t tail = c.tail.load(std::memory_order_relaxed);
  const std::size_t avail = static_cast<std::size_t>(c.head.load(std::memory_order_acquire) - tail);
  std::uint64_t pos = tail;
  if (p.done < kHeader) {
    if (avail < kHeader) return false;  // the sender writes the header in one piece (the ring holds >= 16 KiB)
    std::uint64_t hdr[2];
    ring_read(ring, cap, pos, reinterpret_cast<char*>(hdr), kHeader);
    if (hdr[0] != p.tag || hdr[1] != p.host.nbytes()) {
      p.error = detail::concat(describe("recv", p.seq), ": the next message from rank ", p.peer, " has tag ", hdr[0],
                               " and ", hdr[1], " bytes, but this receive expects tag ", p.tag, " and ",
                               p.host.nbytes(), " bytes (the shm backend matches the sends and receives between "
                               "two ranks in the order they were issued)");
      p.complete = true;
      sync_->mark_failed();
      return true;
    }
    pos += kHeader;
    p.done = kHeader;
  }
  const std::size_t n = std::min(static_cast<std::size_t>(tail + avail - pos), total - p.done);
  if (n > 0) {
    ring_read(ring, cap, pos, static_cast<char*>(p.host.raw_data()) + (p.done - kHeader), n);
    pos += n, p.done += n;
  }
  if (pos == tail) return false;
  c.tail.store(pos, std::memory_order_seq_cst);
  sync_->wake_if_sleepers();
  p.complete = p.done == total;
  return true;
}

bool ShmProcessGroup::progress_locked() {
  bool moved = false;
  for (auto* queues : {&sends_, &recvs_})
    for (auto& q : *queues)
      while (!q.empty()) {
        P2p& p = *q.front();
        moved = (p.is_send ? progress_send(p) : progress_recv(p)) || moved;
        if (!p.complete) break;
        q.pop_front();  // the next message to this peer may go now
      }
  return moved;
}

void ShmProcessGroup::post_p2p(const P2pPtr& p) {
  p->deadline = Clock::now() + timeout();
  {
    std::lock_guard<std::mutex> lock(p2p_mu_);
    (p->is_send ? sends_ : recvs_)[p->peer].push_back(p);
    progress_locked();
  }
  defer_completion([this, p] { wait_p2p(p); });
}

void ShmProcessGroup::on_close() noexcept {
  closing_.store(true, std::memory_order_seq_cst);
  if (sync_) sync_->wake();  // a wait asleep on the futex sees the flag now, not in 1 ms
}

void ShmProcessGroup::wait_p2p(const P2pPtr& p) {
  bool complete = false;
  auto done = [&] {
    std::lock_guard<std::mutex> lock(p2p_mu_);
    if (!p->complete) progress_locked();
    complete = p->complete;
    return complete || closing_.load(std::memory_order_acquire);
  };
  sync_->wait(done, [&](int q) { return q == p->peer && !p->complete; }, p->deadline,
              [&] { return describe(p->is_send ? "send" : "recv", p->seq); });
  // The group is being destroyed: the operation stays queued (its bytes held) and its peer
  // sees this rank leave.
  if (!complete)
    throw CommError(describe(p->is_send ? "send" : "recv", p->seq) +
                    ": the process group was destroyed before it completed");
  if (!p->error.empty()) throw CommError(p->error);
  if (!p->is_send) copy_back(p->host, p->target);
}

void ShmProcessGroup::run_send(const Tensor& t, int dst, int tag, std::uint64_t seq) {
  auto p = std::make_shared<P2p>();
  p->is_send = true;
  p->peer = dst;
  p->tag = static_cast<std::uint64_t>(static_cast<std::uint32_t>(tag));
  p->seq = seq;
  p->host = host_of(t);
  post_p2p(p);
}

void ShmProcessGroup::run_recv(Tensor& t, int src, int tag, std::uint64_t seq) {
  auto p = std::make_shared<P2p>();
  p->is_send = false;
  p->peer = src;
  p->tag = static_cast<std::uint64_t>(static_cast<std::uint32_t>(tag));
  p->seq = seq;
  p->host = host_of(t, false);
  p->target = t;
  post_p2p(p);
}

}  // namespace phalanx::shm
