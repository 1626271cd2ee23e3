// The Gloo backend's point-to-point operations: send and recv post on an unbound buffer and
// complete on the group's completion thread (defer_completion), so the worker can go on
// posting. Non-CPU tensors are staged (host_staging.hpp).
#include <gloo/transport/unbound_buffer.h>

#include "gloo_support.hpp"
#include "phalanx/backends/host_staging.hpp"

namespace phalanx::gloo_backend {

using staging::copy_back;
using staging::host_of;

void GlooBackend::run_send(const Tensor& t, int dst, int tag, std::uint64_t seq) {
  const Tensor h = host_of(t);
  std::shared_ptr<::gloo::transport::UnboundBuffer> buf;
  guarded("send", seq, [&] {
    buf = context_->createUnboundBuffer(h.raw_data(), h.nbytes());
    buf->send(dst, static_cast<std::uint64_t>(tag));
  });
  // The (host) tensor is captured so its memory outlives the transfer.
  defer_completion([this, buf, h, seq] { guarded("send", seq, [&] { buf->waitSend(timeout()); }); });
}

void GlooBackend::run_recv(Tensor& t, int src, int tag, std::uint64_t seq) {
  const Tensor h = host_of(t, false);
  std::shared_ptr<::gloo::transport::UnboundBuffer> buf;
  guarded("recv", seq, [&] {
    buf = context_->createUnboundBuffer(h.raw_data(), h.nbytes());
    buf->recv(src, static_cast<std::uint64_t>(tag));
  });
  // A staged receive lands in `t` when it completes (before its Work does).
  defer_completion([this, buf, h, t, seq] {
    guarded("recv", seq, [&] { buf->waitRecv(timeout()); });
    copy_back(h, t);
  });
}

}  // namespace phalanx::gloo_backend
