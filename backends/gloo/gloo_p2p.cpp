// The Gloo backend's point-to-point operations: send and recv post on an unbound buffer and
// complete on the group's completion thread (defer_completion), so the worker can go on
// posting. Non-CPU tensors are staged (host_staging.hpp).
//
// Tags: a send or receive uses the caller's tag as its slot, as an unsigned 32-bit value,
// so the slot's top byte is 0; a collective's slots are gloo::Slot::build(prefix, tag), whose
// top byte is the collective's prefix (1..8, gloo/types.h). The two never meet, and sends
// and receives with one tag between two ranks match in the order they were issued.
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>

#include "gloo_support.hpp"
#include "phalanx/backends/host_staging.hpp"

namespace phalanx::gloo_backend {

using staging::copy_back;
using staging::host_of;

namespace {
std::uint64_t p2p_slot(int tag) { return static_cast<std::uint64_t>(static_cast<std::uint32_t>(tag)); }
}  // namespace

void GlooBackend::post(const std::shared_ptr<::gloo::transport::UnboundBuffer>& buf, const Tensor& host,
                       bool is_send) {
  std::lock_guard<std::mutex> lock(posted_mu_);
  posted_.push_back({buf, host, is_send});
}

void GlooBackend::wait_posted(const std::shared_ptr<::gloo::transport::UnboundBuffer>& buf, bool is_send,
                              const char* op, std::uint64_t seq) {
  // Forgets the buffer, unless the group is being destroyed: gloo's event loop may still
  // refer to it (a message half written), so it stays, with its memory, until the
  // destructor has closed the connections.
  const auto forget = [&] {
    std::lock_guard<std::mutex> lock(posted_mu_);
    if (closing_) return true;
    const auto it = std::find_if(posted_.begin(), posted_.end(), [&](const Posted& p) { return p.buf == buf; });
    if (it != posted_.end()) posted_.erase(it);
    return false;
  };
  bool completed = false;
  {
    // on_close ran before this wait began: end now, not at the timeout.
    std::lock_guard<std::mutex> lock(posted_mu_);
    completed = !closing_;
  }
  if (completed) {
    try {
      guarded(op, seq, [&] { completed = is_send ? buf->waitSend(timeout()) : buf->waitRecv(timeout()); });
    } catch (...) {
      forget();
      throw;
    }
  }
  // A wait that on_close aborted returns false.
  if (forget() && !completed)
    throw CommError(describe(op, seq) + ": the process group was destroyed before it completed");
  if (!completed) throw CommError(describe(op, seq) + ": gloo aborted the wait");
}

void GlooBackend::on_close() noexcept {
  try {
    std::lock_guard<std::mutex> lock(posted_mu_);
    closing_ = true;
    for (const auto& p : posted_) {
      if (p.is_send)
        p.buf->abortWaitSend();
      else
        p.buf->abortWaitRecv();
    }
  } catch (...) {
    // best effort: such a wait then ends at its timeout
  }
}

void GlooBackend::run_send(const Tensor& t, int dst, int tag, std::uint64_t seq) {
  const Tensor h = host_of(t);
  std::shared_ptr<::gloo::transport::UnboundBuffer> buf;
  guarded("send", seq, [&] {
    buf = context_->createUnboundBuffer(h.raw_data(), h.nbytes());
    buf->send(dst, p2p_slot(tag));
  });
  post(buf, h, true);
  // The (host) tensor is captured so its memory outlives the transfer.
  defer_completion([this, buf, h, seq] { wait_posted(buf, true, "send", seq); });
}

void GlooBackend::run_recv(Tensor& t, int src, int tag, std::uint64_t seq) {
  const Tensor h = host_of(t, false);
  std::shared_ptr<::gloo::transport::UnboundBuffer> buf;
  guarded("recv", seq, [&] {
    buf = context_->createUnboundBuffer(h.raw_data(), h.nbytes());
    buf->recv(src, p2p_slot(tag));
  });
  post(buf, h, false);
  // A staged receive lands in `t` when it completes (before its Work does).
  defer_completion([this, buf, h, t, seq] {
    wait_posted(buf, false, "recv", seq);
    copy_back(h, t);
  });
}

}  // namespace phalanx::gloo_backend
