#include "gloo_backend.hpp"

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include "gloo_store_adapter.hpp"
#include "phalanx/backends/comm_error.hpp"
#include "phalanx/backends/prefix_store.hpp"

namespace phalanx::gloo_backend {

GlooBackend::GlooBackend(const BackendConfig& c)
    : Backend(c.rank, c.size, c.timeout), options_(GlooOptions::from_env(c.ranks_on_machine > 0 ? c.ranks_on_machine : c.local_world_size)) {
  ::gloo::transport::tcp::attr attr;
  attr.hostname = c.hostname;
  try {
    device_ = ::gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<::gloo::rendezvous::Context>(c.rank, c.size);
    ctx->setTimeout(c.timeout);
    StoreAdapter adapter(c.store);
    ctx->connectFullMesh(adapter, device_);
    context_ = ctx;
    if (options_.sync_max_bytes > 0 && c.size > 1) {
      auto sync_ctx = std::make_shared<::gloo::rendezvous::Context>(c.rank, c.size);
      sync_ctx->setTimeout(c.timeout);
      StoreAdapter sync_adapter(std::make_shared<PrefixStore>("sync", c.store));
      sync_ctx->connectFullMesh(sync_adapter, device_);
      for (int r = 0; r < c.size; ++r)
        if (r != c.rank) sync_ctx->getPair(r)->setSync(true, options_.busy_poll);
      sync_context_ = sync_ctx;
    }
  } catch (const ::gloo::Exception& e) {
    const std::string what = e.what();
    const std::string msg = detail::concat("gloo rendezvous on rank ", c.rank, " of ", c.size, " failed: ", what);
    // A peer that never connected is a timeout, and stays one (callers catch TimeoutError).
    if (what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos)
      throw TimeoutError(msg + " (a peer did not connect within " + std::to_string(c.timeout.count() / 1000.0) +
                         " s; raise PHALANX_TIMEOUT if ranks start far apart)");
    throw CommError(msg);
  }
  wait_until_all_connected(c);
}

// A rank's connectFullMesh can return while a peer is still finishing its side of the
// handshake; were this rank to destroy its group at once (a short-lived group, a process
// that exits), that peer's rendezvous would fail with "Connection closed by peer". So no
// rank leaves the constructor before every rank has its meshes: one key per rank in the
// group's store, awaited within the group's timeout.
void GlooBackend::wait_until_all_connected(const BackendConfig& c) {
  if (c.size == 1) return;
  std::vector<std::string> keys;
  keys.reserve(static_cast<std::size_t>(c.size));
  for (int r = 0; r < c.size; ++r) keys.push_back("connected/" + std::to_string(r));
  c.store->set(keys[static_cast<std::size_t>(c.rank)], Bytes{1});
  try {
    c.store->wait(keys, c.timeout);
  } catch (const TimeoutError& e) {
    throw TimeoutError(detail::concat("gloo rendezvous on rank ", c.rank, " of ", c.size,
                                      ": connected, but not every peer finished connecting within ",
                                      c.timeout.count() / 1000.0, " s (", e.what(), ")"));
  }
}

// The group stopped its threads before destroying this: no operation uses the contexts.
// The connections close first: the buffers of sends and receives that on_close aborted
// (posted_) may be in use by gloo's event loop until then.
GlooBackend::~GlooBackend() {
  sync_context_.reset();
  context_.reset();
  posted_.clear();
}

// Debian's libgloo ships gloo/transport/tcp/pair.h without the header it includes
// (gloo/common/memory.h), so tcp::Pair cannot be named here. Its exported member
// signalExceptionExternal(msg) fails the pair and wakes every operation waiting on it
// (close() does not wake them). The declaration below names that one function; the call
// is made only on an object whose dynamic type is gloo's tcp::Pair, whose first base is
// transport::Pair (so the pointer needs no adjustment).
}  // namespace phalanx::gloo_backend

namespace gloo::transport::tcp {
class Pair {
 public:
  std::exception_ptr signalExceptionExternal(const std::string& msg);
};
}  // namespace gloo::transport::tcp

namespace phalanx::gloo_backend {

namespace {
void fail_tcp_pair(::gloo::transport::Pair* pair, const std::string& msg) {
  if (pair == nullptr || std::string(typeid(*pair).name()) != "N4gloo9transport3tcp4PairE") return;
  reinterpret_cast<::gloo::transport::tcp::Pair*>(pair)->signalExceptionExternal(msg);
}
}  // namespace

void GlooBackend::on_abort() noexcept {
  // The event-driven mesh only: a busy-polling pair is locked while its operation runs, so
  // failing it would wait for that operation to end anyway (at its timeout). On a thread of
  // its own, which holds the context (it outlives a group destroyed meanwhile).
  for (const auto& ctx : {context_}) {
    if (!ctx) continue;
    try {
      std::thread([device = device_, ctx, size = size(), rank = rank()] {
        // Failing each pair wakes the operations waiting on it; closing alone does not.
        for (int r = 0; r < size; ++r) {
          if (r == rank) continue;
          try {
            fail_tcp_pair(ctx->getPair(r).get(), "the process group was aborted (another rank failed)");
          } catch (...) {
            // best effort: the operation then ends at its timeout
          }
        }
      }).detach();
    } catch (...) {
    }
  }
}

}  // namespace phalanx::gloo_backend
