#include "job_rounds.hpp"

#include <cstdlib>
#include <stdexcept>

#include <nlohmann/json.hpp>
#include <phalanx/backends/comm_error.hpp>

#include "failure_records.hpp"

namespace phalanx::launcher {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {
std::string round_key(int k, const std::string& what) { return "phalanx/launch/r" + std::to_string(k) + "/" + what; }
std::string alive_key(int node) { return "phalanx/launch/alive/" + std::to_string(node); }
std::string nproc_key(int node) { return "phalanx/launch/nproc/" + std::to_string(node); }
const char* kCurrentRound = "phalanx/launch/round";
std::string text_of(const Bytes& b) { return std::string(b.begin(), b.end()); }
}  // namespace

std::string to_json(const NodeReport& r) {
  // Worker output is any bytes: each tail line is cut at kReportLineBytes, and text that is
  // not UTF-8 is replaced (U+FFFD) rather than failing the report.
  std::vector<std::string> tail;
  for (const auto& l : r.tail)
    tail.push_back(l.size() <= kReportLineBytes ? l : l.substr(0, kReportLineBytes) + " [...]");
  json j = {{"node", r.node}, {"ok", r.ok}, {"interrupted", r.interrupted}, {"max_restarts", r.max_restarts},
            {"tail", tail}};
  if (!r.fatal.empty()) j["fatal"] = r.fatal;
  if (r.failure) {
    WorkerFailure f = *r.failure;
    if (f.message.size() > kReportLineBytes) f.message = f.message.substr(0, kReportLineBytes) + " [...]";
    j["failure"] = json::parse(to_json(f));
  }
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

bool from_json(const std::string& text, NodeReport& r) {
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return false;
  try {
    r.node = j.at("node").get<int>();
    r.ok = j.at("ok").get<bool>();
    r.interrupted = j.at("interrupted").get<int>();
    r.max_restarts = j.at("max_restarts").get<int>();
    r.tail = j.at("tail").get<std::vector<std::string>>();
    r.fatal = j.value("fatal", std::string());
    r.failure.reset();
    if (j.contains("failure")) {
      WorkerFailure f;
      if (!from_json(j["failure"].dump(), f)) return false;
      r.failure = f;
    }
  } catch (const json::exception&) {
    return false;
  }
  return true;
}

std::optional<NodeReport> job_blame(const std::vector<NodeReport>& reports) {
  const NodeReport* best = nullptr;
  for (const auto& r : reports)
    if (r.failure && (!best || job_blame_before(*r.failure, *best->failure))) best = &r;
  if (!best) return std::nullopt;
  return *best;
}

JobRounds::JobRounds(std::shared_ptr<Store> store, int nnodes, int node, std::chrono::milliseconds tick,
                     std::chrono::milliseconds stale_after)
    : store_(std::move(store)), nnodes_(nnodes), node_(node), tick_(tick), stale_after_(stale_after) {
  loop_.start([this](std::unique_lock<std::mutex>& lock) { return heartbeat(lock); });
}

JobRounds::~JobRounds() { loop_.stop(); }

void JobRounds::wake() {
  if (woken_.exchange(true)) return;
  wake_.notify();
}

std::string JobRounds::why() const {
  std::lock_guard<std::mutex> lock(mu_);
  return why_;
}

bool JobRounds::store_lost() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !lost_.empty();
}

int JobRounds::join(int nproc_per_node, std::string& fatal) {
  fatal.clear();
  store_->set(nproc_key(node_), std::to_string(nproc_per_node));
  if (node_ == 0) return 0;
  const std::string theirs = text_of(store_->get(nproc_key(0)));
  const int k = store_->check({kCurrentRound}) ? std::atoi(text_of(store_->get(kCurrentRound)).c_str()) : 0;
  if (theirs != std::to_string(nproc_per_node))
    fatal = "--nproc-per-node is " + std::to_string(nproc_per_node) + " on node " + std::to_string(node_) + " but " +
            theirs + " on node 0: every node must run the same number of workers";
  return k;
}

void JobRounds::post_fatal(int k, const std::string& fatal) {
  close(k, fatal);
  NodeReport r;
  r.node = node_;
  r.fatal = fatal;
  try {
    store_->set(round_key(k, "report/" + std::to_string(node_)), to_json(r));
  } catch (const std::exception&) {
  }
  leave(k);
}

void JobRounds::leave(int k) {
  try {
    store_->set(round_key(k, "read/" + std::to_string(node_)), std::string("1"));
  } catch (const std::exception&) {
  }
}

void JobRounds::begin(int k) {
  if (node_ == 0) {
    try {
      store_->set(kCurrentRound, std::to_string(k));
    } catch (const std::exception&) {  // the heartbeat finds out
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  // Under the lock: a wake for the last round written after this drain would stay unread.
  wake_.drain();
  woken_ = false;
  round_ = k;
  why_.clear();
  if (!lost_.empty()) {  // the store went away between rounds: this round ends at once
    why_ = lost_;
    wake();
  }
}

bool JobRounds::heartbeat(std::unique_lock<std::mutex>& lock) {
  {
    const int k = round_.load();
    lock.unlock();
    std::string why, lost;
    try {
      store_->add(alive_key(node_), 1);
      if (k >= 0 && !woken_ && store_->check({round_key(k, "closed")})) {
        const std::string closer = text_of(store_->get(round_key(k, "closed")));
        if (closer.rfind("node " + std::to_string(node_) + ":", 0) != 0) why = closer;
      }
    } catch (const std::exception& e) {
      why = lost = std::string("lost the job's store (is node 0's launcher gone?): ") + e.what();
    }
    lock.lock();
    if (!lost.empty()) lost_ = lost;
    if (!why.empty() && k == round_.load() && !woken_) {
      why_ = why;
      wake();
    }
    if (!lost_.empty()) return false;  // nothing more to say to a store that is gone
  }
  return true;
}

void JobRounds::throw_if_lost() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!lost_.empty()) throw std::runtime_error(lost_);
}

void JobRounds::close(int k, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!lost_.empty()) return;
  }
  const std::string text = "node " + std::to_string(node_) + ": " + what;
  try {
    store_->compare_set(round_key(k, "closed"), {}, Bytes(text.begin(), text.end()));
  } catch (const std::exception&) {
    // The store is gone: the other nodes find out on their own.
  }
}

void JobRounds::check_peers_alive(std::vector<std::pair<std::int64_t, Clock::time_point>>& seen) {
  const auto now = Clock::now();
  for (int n = 0; n < nnodes_; ++n) {
    if (n == node_) continue;
    const std::int64_t v = store_->add(alive_key(n), 0);
    if (v != seen[n].first) {
      seen[n] = {v, now};
    } else if (now - seen[n].second > stale_after_) {
      throw std::runtime_error("node " + std::to_string(n) + "'s launcher stopped answering (no sign of life for " +
                               std::to_string(stale_after_.count() / 1000.0).substr(0, 5) +
                               " s, --rdzv-timeout): it is gone or stuck; giving up");
    }
  }
}

std::vector<NodeReport> JobRounds::exchange(int k, const NodeReport& mine, const std::function<int()>& interrupted) {
  std::vector<std::string> keys;
  for (int n = 0; n < nnodes_; ++n) keys.push_back(round_key(k, "report/" + std::to_string(n)));
  throw_if_lost();
  try {
    try {
      store_->set(keys[node_], to_json(mine));
    } catch (const CommError&) {
      throw;
    } catch (const std::exception&) {
      // The full report cannot be sent (too large for a frame...): how the node ended, and
      // who failed, without the words.
      NodeReport minimal = mine;
      minimal.tail.clear();
      if (minimal.failure) minimal.failure->message.clear();
      store_->set(keys[node_], to_json(minimal));
    }
    std::vector<std::pair<std::int64_t, Clock::time_point>> seen(nnodes_, {-1, Clock::now()});
    for (;;) {
      if (const int sig = interrupted ? interrupted() : 0) {
        NodeReport stop;
        stop.node = node_;
        stop.interrupted = sig;
        stop.max_restarts = mine.max_restarts;
        store_->set(keys[node_], to_json(stop));
        leave(k);
        throw Interrupted(sig);
      }
      try {
        store_->wait(keys, std::chrono::milliseconds(200));
        break;
      } catch (const TimeoutError&) {
        throw_if_lost();
        check_peers_alive(seen);
      }
    }
    std::vector<NodeReport> out(nnodes_);
    for (int n = 0; n < nnodes_; ++n)
      if (!from_json(text_of(store_->get(keys[n])), out[n]))
        throw std::runtime_error("node " + std::to_string(n) + "'s report for round " + std::to_string(k) +
                                 " is unreadable (different phalanx-run versions?)");
    return out;
  } catch (const CommError& e) {
    throw std::runtime_error(std::string("lost the job's store (is node 0's launcher gone?): ") + e.what());
  }
}

Interrupted::Interrupted(int s) : std::runtime_error("interrupted by signal " + std::to_string(s)), sig(s) {}

void JobRounds::finish(int k, const std::function<int()>& interrupted) {
  try {
    throw_if_lost();
    if (node_ != 0) {
      store_->set(round_key(k, "read/" + std::to_string(node_)), std::string("1"));
      return;
    }
    std::vector<std::string> keys;
    for (int n = 1; n < nnodes_; ++n) keys.push_back(round_key(k, "read/" + std::to_string(n)));
    std::vector<std::pair<std::int64_t, Clock::time_point>> seen(nnodes_, {-1, Clock::now()});
    const auto deadline = Clock::now() + stale_after_;
    while (Clock::now() < deadline && !(interrupted && interrupted() != 0)) {
      try {
        store_->wait(keys, std::chrono::milliseconds(200));
        return;
      } catch (const TimeoutError&) {
        check_peers_alive(seen);
      }
    }
  } catch (const std::exception&) {
    // Best effort: a node that does not read the verdict finds the store gone and says so.
  }
}

}  // namespace phalanx::launcher
