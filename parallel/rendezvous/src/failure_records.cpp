#include "phalanx/parallel/internal/failure_records.hpp"

#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/parallel/failure.hpp"

namespace phalanx::parallel {

namespace {
std::mutex g_mu;
std::shared_ptr<FailureContext> g_ctx;
std::atomic<std::int64_t> g_step{-1};
}  // namespace

void note_step(std::int64_t step) noexcept { g_step.store(step, std::memory_order_relaxed); }
std::int64_t noted_step() noexcept { return g_step.load(std::memory_order_relaxed); }

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

std::string encode_failure(const FailureRecord& r) {
  nlohmann::json j;
  j["rank"] = r.rank;
  j["message"] = r.message;
  j["secondary"] = r.secondary;
  j["unix_ns"] = r.unix_ns;
  if (!r.kind.empty()) j["kind"] = r.kind;
  if (r.step >= 0) j["step"] = r.step;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::optional<FailureRecord> decode_failure(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("rank") || !j["rank"].is_number_integer()) return std::nullopt;
  FailureRecord r;
  r.rank = j["rank"].get<int>();
  if (j.contains("message") && j["message"].is_string()) r.message = j["message"].get<std::string>();
  if (j.contains("secondary") && j["secondary"].is_boolean()) r.secondary = j["secondary"].get<bool>();
  if (j.contains("unix_ns") && j["unix_ns"].is_number_integer()) r.unix_ns = j["unix_ns"].get<std::int64_t>();
  if (j.contains("kind") && j["kind"].is_string()) r.kind = j["kind"].get<std::string>();
  if (j.contains("step") && j["step"].is_number_integer()) r.step = j["step"].get<std::int64_t>();
  return r;
}

std::string failure_key(int restart, const std::string& leaf) {
  return "phalanx/r" + std::to_string(restart) + "/failure/" + leaf;
}

std::optional<FailureRecord> read_failure(Store& store, const std::string& key) {
  if (!store.check({key})) return std::nullopt;
  return decode_failure(store.get_string(key));
}

std::optional<FailureRecord> FailureContext::peer_first_failure() const {
  auto r = read_failure(*root, key("first"));
  if (!r || r->rank == rank) return std::nullopt;
  return r;
}

void FailureContext::acknowledge() noexcept {
  if (acked.exchange(true) || store_gone) return;
  try {
    root->add(key("acks"), 1);
  } catch (const std::exception&) {
    store_gone = true;
  }
}

void FailureContext::linger_for_readers(std::chrono::milliseconds limit) noexcept {
  if (!hosts_store || world <= 1 || store_gone) return;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  try {
    if (!root->check({key("first")})) return;  // no cause posted: nothing for them to read
    while (root->add(key("acks"), 0) < world - 1 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } catch (const std::exception&) {
  }
}

void FailureContext::post(std::string message, bool secondary, std::string kind) noexcept {
  posted = true;
  if (store_gone) return;
  try {
    FailureRecord r;
    r.rank = rank;
    r.message = one_line(std::move(message));
    r.secondary = secondary;
    r.kind = std::move(kind);
    r.step = noted_step();
    r.unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::system_clock::now().time_since_epoch()).count();
    const std::string json = encode_failure(r);
    const Bytes value(json.begin(), json.end());
    root->set(key(std::to_string(rank)), value);
    if (!secondary) root->compare_set(key("first"), {}, value);
  } catch (const std::exception&) {
    // The store is gone (its host exited): the others see this process's exit instead.
    store_gone = true;
  }
}

void FailureContext::post_finished(std::uint64_t collectives) noexcept {
  if (posted || store_gone) return;
  try {
    nlohmann::json j;
    j["rank"] = rank;
    j["collectives"] = collectives;
    j["unix_ns"] = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
    const std::string json = j.dump();
    const Bytes value(json.begin(), json.end());
    root->set(finished_key(std::to_string(rank)), value);
    root->compare_set(finished_key("first"), {}, value);
    root->add(finished_key("count"), 1);
  } catch (const std::exception&) {
    store_gone = true;
  }
}

std::optional<std::pair<int, std::uint64_t>> FailureContext::peer_finished() const {
  const std::string k = finished_key("first");
  if (!root->check({k})) return std::nullopt;
  const Bytes b = root->get(k);
  const nlohmann::json j = nlohmann::json::parse(b.begin(), b.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("rank") || !j["rank"].is_number_integer()) return std::nullopt;
  const int r = j["rank"].get<int>();
  if (r == rank) return std::nullopt;
  const std::uint64_t n = j.contains("collectives") && j["collectives"].is_number_unsigned()
                              ? j["collectives"].get<std::uint64_t>() : 0;
  return std::make_pair(r, n);
}

void FailureContext::linger_for_finish(std::chrono::milliseconds limit) noexcept {
  if (!hosts_store || world <= 1 || store_gone || posted) return;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  try {
    while (root->add(finished_key("count"), 0) < world && !root->check({key("first")})) {
      if (std::chrono::steady_clock::now() >= deadline) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } catch (const std::exception&) {
    return;
  }
  // A survivor posted its failure (having read this rank's record): the others may still
  // need to read it.
  linger_for_readers(limit);
}

std::exception_ptr peer_failed_error(const FailureRecord& r, const std::string& noticed) {
  const std::string what = detail::concat("rank ", r.rank, " failed: ", r.message, noticed.empty() ? "" : " (",
                                          noticed, noticed.empty() ? "" : ")");
  // Both sides of a desync find it; whichever posts first must not turn the other's into a
  // different kind of error.
  if (r.kind == "desync") return std::make_exception_ptr(DesyncError(what));
  // The first survivor found that a peer ended cleanly (uneven inputs): every survivor gets
  // the same kind of error, whoever noticed first.
  if (r.kind == "finished")
    return std::make_exception_ptr(PeerFinishedError(detail::concat(
        r.message, " (reported by rank ", r.rank, noticed.empty() ? "" : "; noticed by ", noticed, ")")));
  return std::make_exception_ptr(PeerFailedError(what));
}

std::string failure_kind(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const DesyncError&) {
    return "desync";
  } catch (const PeerFinishedError&) {
    return "finished";
  } catch (...) {
    return {};
  }
}

std::shared_ptr<FailureContext> failure_context() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_ctx;
}

void set_failure_context(std::shared_ptr<FailureContext> ctx) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_ctx = std::move(ctx);
}

bool is_secondary_failure(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const DesyncError&) {
    return false;  // both sides of a desync are at fault; each is a primary failure
  } catch (const PeerFinishedError&) {
    return false;  // the peer ended cleanly: this rank's error is the one that says why
  } catch (const CommError&) {
    return true;  // a lost connection, a timeout, a peer's posted failure
  } catch (...) {
    return false;
  }
}

ProcessGroup::FailureHook make_failure_hook(std::shared_ptr<FailureContext> ctx, std::chrono::milliseconds grace) {
  return [ctx, grace](std::exception_ptr error, const std::string& what) -> std::exception_ptr {
    bool secondary = is_secondary_failure(error);
    std::exception_ptr better;
    if (!secondary) {
      // A backend that saw the clean end itself (shm): a failure posted meanwhile still wins.
      try {
        std::rethrow_exception(error);
      } catch (const PeerFinishedError&) {
        try {
          if (!ctx->store_gone)
            if (auto first = ctx->peer_first_failure()) {
              better = peer_failed_error(*first, "noticed by " + what);
              ctx->acknowledge();
              secondary = true;
            }
        } catch (const std::exception&) {
          ctx->store_gone = true;
        }
      } catch (...) {
      }
    } else {
      // Remembered: the rank's own report_failure(message) later is a consequence too
      // (cleared below when the cause turns out to be a peer's clean end).
      ctx->peer_failed = true;
      // A peer that failed posts its record before it exits, so by the time its connection
      // closes here the record is usually there; wait briefly in case it is on its way.
      const auto deadline = std::chrono::steady_clock::now() + grace;
      while (!ctx->store_gone) {
        try {
          if (auto first = ctx->peer_first_failure()) {
            better = peer_failed_error(*first, "noticed by " + what);
            ctx->acknowledge();
            break;
          }
          // No failure, but a peer ended cleanly (it posts before its connections close):
          // the lost peer is uneven inputs, and this rank's error says so (a primary one).
          if (auto fin = ctx->peer_finished()) {
            better = std::make_exception_ptr(
                PeerFinishedError(detail::peer_finished_message(what, fin->first, fin->second)));
            secondary = false;
            ctx->peer_failed = false;
            break;
          }
        } catch (const std::exception&) {
          ctx->store_gone = true;  // unreachable: keep the backend's own error
          break;
        }
        if (std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    ctx->post(detail::message_of(better ? better : error), secondary, failure_kind(better ? better : error));
    return better;
  };
}

}  // namespace phalanx::parallel
