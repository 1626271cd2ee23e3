#include "phalanx/parallel/failure.hpp"

#include "phalanx/parallel/internal/failure_records.hpp"
#include "phalanx/backends/tcp_store.hpp"
#include "phalanx/parallel/launch_env.hpp"

namespace phalanx::parallel {

namespace {

/// Before init_process_group (a rank that fails while loading its data): the launch
/// environment names the store, so the others, already waiting in rendezvous, still learn
/// why. Null when there is no multi-rank environment or the store cannot be reached soon.
std::shared_ptr<FailureContext> context_from_environment() {
  try {
    const LaunchEnv env = read_launch_env();
    if (env.world_size <= 1 || env.master_addr.empty() || env.master_port <= 0) return nullptr;
    TcpStoreOptions so;
    so.host = env.master_addr;
    so.port = env.master_port;
    so.timeout = FailureContext::kRecordTimeout;
    auto ctx = std::make_shared<FailureContext>();
    ctx->root = std::make_shared<TcpStore>(so);
    ctx->rank = env.rank;
    ctx->restart = env.restart_count;
    ctx->world = env.world_size;
    return ctx;
  } catch (const std::exception&) {
    return nullptr;  // a bad environment or no store: nobody to tell
  }
}

constexpr std::chrono::milliseconds kHostLinger{1500};

void post_and_linger(const std::string& message, bool secondary, std::string kind = {}) {
  auto ctx = failure_context();
  if (!ctx) ctx = context_from_environment();
  if (!ctx) return;
  // A rank whose group was ended by a peer's failure (or lost peer) reports a consequence,
  // not a cause.
  ctx->post(message, secondary || ctx->peer_failed.load(), std::move(kind));
  // Rank 0 hosting the store (no launcher): its exit would take the store, and its message,
  // with it before the others read it.
  ctx->linger_for_readers(kHostLinger);
}

}  // namespace

void report_failure(const std::string& message) noexcept { post_and_linger(message, false); }

void report_failure(std::exception_ptr error) noexcept {
  if (!error) return;
  post_and_linger(detail::message_of(error), is_secondary_failure(error), failure_kind(error));
}

}  // namespace phalanx::parallel
