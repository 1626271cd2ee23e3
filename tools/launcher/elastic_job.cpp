#include "elastic_job.hpp"

#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

#include "failure_report.hpp"
#include "job_rounds.hpp"
#include "launch_error.hpp"
#include "membership.hpp"
#include "worker_group.hpp"

namespace phalanx::launcher {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

std::chrono::milliseconds ms(double s) { return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000)); }
std::string text_of(const Bytes& b) { return std::string(b.begin(), b.end()); }
/// 0.5 as "0.5", 60 as "60" (std::to_string(int) said "waited 0 s" for --rdzv-timeout 0.5).
std::string seconds_text(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", s);
  return b;
}
bool contains(const std::vector<int>& v, int x) {
  for (int y : v)
    if (y == x) return true;
  return false;
}

/// A launcher that leaves the job of its own accord (a signal) outside a round's report
/// says so, so that the host neither puts it in the next round nor counts it as gone.
std::string left_key(int id) { return elastic_key("left/" + std::to_string(id)); }
void say_left(Store& s, int id) {
  try {
    s.set(left_key(id), std::string("1"));
  } catch (const std::exception&) {  // the store is gone: nothing to tell
  }
}
bool has_left(Store& s, int id) { return s.check({left_key(id)}); }

/// A member says it read round k's members and starts its workers: a member that never
/// does (it died between registering and the round's close) was never in the round.
std::string started_key(int k, int id) { return elastic_round_key(k, "started/" + std::to_string(id)); }

/// The launcher that hosts the job's store is gone (the store goes with it): what a launcher
/// that is not the host says, in one line, and exits 1 with (the job cannot go on).
LaunchError host_gone(const LaunchOptions& o, const JobStore& js, const std::string& detail = {}) {
  return LaunchError(1, "lost the job's store: the launcher that hosts it (" + o.master_addr + ":" +
                            std::to_string(js.port) + ") is gone" + (detail.empty() ? "" : " (" + detail + ")") +
                            "; an elastic job cannot outlive it: restart the job, starting that node's launcher "
                            "again first");
}

/// A launcher waiting to be admitted read that the job ended.
std::string end_ack_key(int id) { return elastic_key("end_ack/" + std::to_string(id)); }

/// The host's verdict on a round: the job ends with `code`, or goes on with `next` in round k+1.
struct Verdict {
  bool end = false;
  int code = 0;
  std::vector<int> next;
};

std::string to_json(const Verdict& v) { return json{{"end", v.end}, {"code", v.code}, {"next", v.next}}.dump(); }
Verdict verdict_from(const std::string& text) {
  const json j = json::parse(text);
  return {j.at("end").get<bool>(), j.at("code").get<int>(), j.at("next").get<std::vector<int>>()};
}

/// Host: the members of the next round: `keep` (still alive, in their order) and the nodes
/// waiting, up to MAX. The first round waits until MAX have joined, or MIN and then the last
/// call; a later round takes who is there at once (the survivors must not wait). Throws
/// LaunchError after --rdzv-timeout with fewer than MIN, Interrupted on a signal.
std::vector<int> form_round(const LaunchOptions& o, Membership& m, const std::vector<int>& keep, bool first,
                            const std::vector<int>& departed = {}) {
  const auto start = Clock::now();
  std::optional<Clock::time_point> enough_since;
  bool said = false;
  for (;;) {
    if (const int sig = take_signal()) throw Interrupted(sig);
    std::vector<int> c;
    for (int id : keep)
      if (m.alive(id) && !has_left(m.store(), id)) c.push_back(id);
    for (int id : m.waiting(c))  // a launcher that left (asked to stop) is on its way out
      if (static_cast<int>(c.size()) < o.nnodes && !contains(departed, id) && !has_left(m.store(), id)) c.push_back(id);
    const auto now = Clock::now();
    if (static_cast<int>(c.size()) >= o.nnodes) return c;
    if (static_cast<int>(c.size()) >= o.min_nodes) {
      if (!first) return c;
      if (!enough_since) enough_since = now;
      if (now - *enough_since >= ms(o.last_call)) return c;
    } else {
      enough_since.reset();
      if (!said && !first)
        std::fprintf(stderr, "phalanx-run: %zu node(s) left, the job needs %d: waiting up to %.3g s (--rdzv-timeout) "
                     "for more.\n", c.size(), o.min_nodes, o.rdzv_timeout);
      said = true;
      if (now - start > ms(o.rdzv_timeout))
        throw LaunchError(1, std::to_string(c.size()) + " node(s) in the job after waiting " +
                                 seconds_text(o.rdzv_timeout) + " s (--rdzv-timeout), fewer than " +
                                 "the " + std::to_string(o.min_nodes) + " --nnodes " + std::to_string(o.min_nodes) +
                                 ":" + std::to_string(o.nnodes) + " needs: start more nodes' launchers with the same "
                                 "--rdzv-endpoint and --rdzv-id, or lower MIN");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void publish_round(Store& s, int k, const std::vector<int>& members) {
  s.set(elastic_round_key(k, "members"), join_ids(members));
  s.set(elastic_key("round"), std::to_string(k));
}

/// A launcher that is not the host: waits until a round after `after` admits it. Returns
/// the round and its members, or nullopt with `code` set when the job ended (or a signal came).
std::optional<std::pair<int, std::vector<int>>> wait_admitted(const LaunchOptions& o, const JobStore& js,
                                                              Membership& m, int after, int& code) {
  Store& s = m.store();
  bool said = false;
  for (;;) {
    if (const int sig = take_signal()) {
      std::fprintf(stderr, "phalanx-run: got %s while waiting to be admitted; leaving the job.\n", strsignal(sig));
      say_left(s, m.id());
      code = 128 + sig;
      return std::nullopt;
    }
    // The host's death takes the store with it: that is no clean end (exit 1), whichever of
    // the keep-alive thread or this loop finds out first.
    if (m.store_lost()) throw host_gone(o, js);
    if (s.check({elastic_key("end")})) {
      // Said to the host, which waits for it before its store goes: else a launcher that
      // reads the end late (a loaded machine) would find the store gone and take the job's
      // clean end for the host's death.
      s.set(end_ack_key(m.id()), std::string("1"));
      std::fprintf(stderr, "phalanx-run: the job ended before this node was admitted.\n");
      code = 0;
      return std::nullopt;
    }
    if (s.check({elastic_key("round")})) {
      const int r = std::atoi(text_of(s.get(elastic_key("round"))).c_str());
      if (r > after) {
        const auto members = split_ids(text_of(s.get(elastic_round_key(r, "members"))));
        if (contains(members, m.id())) return std::make_pair(r, members);
        if (!said)
          std::fprintf(stderr, "phalanx-run: the job runs round %d without this node (it has its most nodes, or "
                       "formed before this node arrived); waiting for the next round.\n", r);
        said = true;
        after = r;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// Runs round k of this node's workers at the round's size.
Outcome run_round(const LaunchOptions& o, const JobStore& js, Membership& m, int k, const std::vector<int>& members,
                  int node_rank) {
  LaunchOptions ro = o;
  ro.nnodes = static_cast<int>(members.size());
  ro.node_rank = node_rank;
  ro.elastic_job = true;
  std::fprintf(stderr, "phalanx-run: round %d: node %d of %d (world size %d).\n", k, node_rank, ro.nnodes,
               ro.nnodes * o.nproc_per_node);
  Attempt a;
  a.master_port = js.port;
  a.token = o.rdzv_token;
  a.restart_count = k;
  a.store = js.store.get();
  a.progress_passthrough = false;
  m.begin(k, members);
  a.stop_fd = m.wake_fd();
  a.stop_reason = [&m] { return m.why(); };
  a.store_lost = [&m] { return m.store_lost(); };
  a.on_first_failure = [&m, k, node_rank](const WorkerFailure& f) {
    m.close(k, "node " + std::to_string(node_rank) + ": rank " + std::to_string(f.rank) + " " + describe_exit(f));
  };
  Outcome r = run_workers(ro, a);
  m.end_watch();
  if (!r.launch_error.empty()) {
    std::fprintf(stderr, "phalanx-run: %s; stopped the %d worker(s) already started.\n", r.launch_error.c_str(),
                 r.stopped_others);
    m.close(k, "node " + std::to_string(node_rank) + ": " + r.launch_error);
  }
  if (!r.stopped_because.empty())
    std::fprintf(stderr, "phalanx-run: node %d: stopped %d worker(s): %s\n", node_rank, r.stopped_others,
                 r.stopped_because.c_str());
  return r;
}

NodeReport report_of(int node_rank, const LaunchOptions& o, const Outcome& r) {
  NodeReport mine;
  mine.node = node_rank;
  mine.ok = r.ok;
  mine.interrupted = r.interrupted ? (r.signal_received ? r.signal_received : SIGTERM) : 0;
  mine.max_restarts = o.max_restarts;
  mine.failure = r.blamed;
  mine.tail = r.tail;
  if (!r.launch_error.empty()) mine.fatal = r.launch_error;
  return mine;
}

/// The host's bookkeeping across rounds.
struct HostState {
  int failures = 0;
  std::optional<WorkerFailure> last_failure;
  int last_world = 0;  ///< the world size of the round last_failure ended
  std::vector<int> departed;  ///< launchers that left the job (asked to stop): never readmitted
};

/// A failure before any training step that recurs at the same world size: a setting this
/// size cannot run (exact mode's micro-batches that W does not divide). Restarting at the
/// same size would meet it again.
bool recurs_at_size(const std::optional<WorkerFailure>& before, int before_world,
                    const std::optional<WorkerFailure>& now, int world) {
  return before && now && before->has_record && now->has_record && before->step < 0 && now->step < 0 &&
         before_world == world && before->message == now->message;
}

/// Host: ends the job with `code`, tells every launcher (and those waiting), and gives the
/// live members a moment to read it before the store goes away.
int end_job(Membership& m, int k, const std::vector<int>& members, int code) {
  Store& s = m.store();
  try {
    Verdict v;
    v.end = true;
    v.code = code;
    s.set(elastic_round_key(k, "next"), to_json(v));
    s.set(elastic_key("end"), std::to_string(code));
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    for (int id : members) {
      if (id == m.id()) continue;
      while (Clock::now() < deadline && m.alive(id) && !s.check({elastic_round_key(k, "ack/" + std::to_string(id))}))
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    // And the launchers waiting to be admitted: each says it read the end (wait_admitted).
    for (int id : m.waiting(members))
      while (Clock::now() < deadline && m.alive(id) && !has_left(s, id) && !s.check({end_ack_key(id)}))
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } catch (const std::exception&) {
  }
  return code;
}

/// Host: how round k ended on every member (a member whose launcher is gone has no report),
/// and what comes next. Returns the exit code when the job ends, else sets `next`.
std::optional<int> settle_as_host(const LaunchOptions& o, Membership& m, HostState& hs, int k,
                                  const std::vector<int>& members, const NodeReport& mine, std::vector<int>& next) {
  Store& s = m.store();
  std::vector<NodeReport> reports{mine};
  std::vector<int> gone, left, dropped;
  for (std::size_t i = 0; i < members.size(); ++i) {
    const int id = members[i];
    if (id == m.id()) continue;
    const std::string key = elastic_round_key(k, "report/" + std::to_string(id));
    while (!s.check({key}) && m.alive(id)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    NodeReport rep;
    if (!s.check({key}) && has_left(s, id)) {  // asked to stop before it could report
      left.push_back(id);
      std::fprintf(stderr, "phalanx-run: node %zu's launcher was asked to stop: it leaves the job.\n", i);
      continue;
    }
    if (!s.check({key}) && !s.check({started_key(k, id)})) {
      // It died after it registered and before it read this round's members (the first
      // round's last call, or between rounds): never a member, as torchrun's rendezvous
      // counts only the nodes alive at the round's close. Not a failure: no restart spent.
      dropped.push_back(id);
      std::fprintf(stderr, "phalanx-run: node %zu (launcher id %d) died before it started round %d: it was "
                   "never in the round; the job re-forms without it.\n", i, id, k);
      continue;
    }
    if (!s.check({key}) || !from_json(text_of(s.get(key)), rep)) {
      gone.push_back(id);
      std::fprintf(stderr, "phalanx-run: node %zu (launcher id %d) is gone: no keep-alive for %.3g s "
                   "(--rdzv-keep-alive); the job goes on without it.\n", i, id, o.keep_alive);
      continue;
    }
    if (rep.interrupted) {
      left.push_back(id);
      std::fprintf(stderr, "phalanx-run: node %d's launcher got %s: it leaves the job.\n", rep.node,
                   strsignal(rep.interrupted));
    }
    reports.push_back(rep);
  }
  if (mine.interrupted) {
    std::fprintf(stderr, "phalanx-run: the launcher that hosts the job's store got %s; the job ends.\n",
                 strsignal(mine.interrupted));
    return end_job(m, k, members, 128 + mine.interrupted);
  }
  for (const auto& rep : reports)
    if (!rep.fatal.empty()) {
      std::fprintf(stderr, "phalanx-run: node %d: %s; the job ends.\n", rep.node, rep.fatal.c_str());
      return end_job(m, k, members, 2);
    }
  bool all_ok = gone.empty() && left.empty() && dropped.empty();
  for (const auto& rep : reports) all_ok = all_ok && rep.ok;
  if (all_ok) return end_job(m, k, members, 0);

  // The host closed the round for a join or a departure before any worker failed: whatever
  // the workers did after that (a peer on another node stopped first, a connection closed)
  // is the stop's consequence, whatever its tier. A node gone is counted below.
  const bool membership = m.closed_for_membership(k);
  const auto verdict = job_blame(reports);
  const bool worker_failed = verdict && !membership;
  if (!gone.empty() || worker_failed) {
    ++hs.failures;  // a node that died counts, as torchrun counts its survivors' failed workers
    std::optional<WorkerFailure> blamed;
    if (worker_failed) {
      blamed = verdict->failure;
      print_failure("round " + std::to_string(k) + ": ", *blamed, verdict->tail, -1, o.nproc_per_node,
                    static_cast<int>(members.size()));
    }
    if (recurs(hs.last_failure, blamed)) {
      std::fprintf(stderr,
                   "phalanx-run: the same failure recurred at step %lld after a restart (%s); not restarting "
                   "again (%d restart(s) left): it will recur there until its cause is fixed.\n",
                   static_cast<long long>(blamed->step), blamed->message.c_str(), o.max_restarts - hs.failures + 1);
      return end_job(m, k, members, exit_code_for(*blamed));
    }
    const int world = static_cast<int>(members.size()) * o.nproc_per_node;
    if (recurs_at_size(hs.last_failure, hs.last_world, blamed, world)) {
      std::fprintf(stderr,
                   "phalanx-run: the same failure came before any training step twice at world size %d (%s): it "
                   "will recur at this size; not restarting again. Give --nnodes a range whose sizes the program "
                   "can run on.\n",
                   world, blamed->message.c_str());
      return end_job(m, k, members, exit_code_for(*blamed));
    }
    hs.last_failure = blamed;
    hs.last_world = world;
    if (hs.failures > o.max_restarts) {
      std::fprintf(stderr, "phalanx-run: giving up after %d restart(s) (--max-restarts %d).\n", hs.failures - 1,
                   o.max_restarts);
      return end_job(m, k, members, blamed ? exit_code_for(*blamed) : 1);
    }
  } else {
    std::fprintf(stderr, "phalanx-run: round %d ended for a change of membership (%s): not counted as a restart.\n",
                 k, !left.empty()      ? "a node left"
                    : !dropped.empty() ? "a node died before it started"
                                       : "a node joins");
  }
  std::vector<int> keep;
  for (int id : members)
    if (!contains(gone, id) && !contains(left, id) && !contains(dropped, id)) keep.push_back(id);
  hs.departed.insert(hs.departed.end(), left.begin(), left.end());
  for (int id : left) m.forget(id);
  try {
    next = form_round(o, m, keep, false, hs.departed);
  } catch (const Interrupted& e) {
    return end_job(m, k, members, 128 + e.sig);
  } catch (const LaunchError& e) {
    std::fprintf(stderr, "phalanx-run: %s\n", e.what());
    return end_job(m, k, members, e.exit_code);
  }
  std::fprintf(stderr, "phalanx-run: round %d: %zu node(s), world size %zu (restarts counted: %d of %d).\n", k + 1,
               next.size(), next.size() * o.nproc_per_node, hs.failures, o.max_restarts);
  Verdict v;
  v.next = next;
  s.set(elastic_round_key(k, "next"), to_json(v));
  publish_round(s, k + 1, next);
  return std::nullopt;
}

/// Not the host: posts this node's report and waits for the host's verdict.
Verdict settle_as_member(const LaunchOptions& o, const JobStore& js, Membership& m, int k, const NodeReport& mine) {
  Store& s = m.store();
  s.set(elastic_round_key(k, "report/" + std::to_string(m.id())), launcher::to_json(mine));
  if (mine.interrupted) {
    say_left(s, m.id());
    std::fprintf(stderr, "phalanx-run: got %s: this node leaves the job; the others go on.\n",
                 strsignal(mine.interrupted));
    return {true, 128 + mine.interrupted, {}};
  }
  const std::string key = elastic_round_key(k, "next");
  for (;;) {
    if (const int sig = take_signal()) {
      std::fprintf(stderr, "phalanx-run: got %s while waiting for the job's verdict; leaving.\n", strsignal(sig));
      say_left(s, m.id());
      return {true, 128 + sig, {}};
    }
    if (m.store_lost()) throw host_gone(o, js);
    if (s.check({key})) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const Verdict v = verdict_from(text_of(s.get(key)));
  s.set(elastic_round_key(k, "ack/" + std::to_string(m.id())), std::string("1"));
  if (v.end && v.code != 0)
    std::fprintf(stderr, "phalanx-run: the job ends (exit code %d); the launcher that hosts its store says why.\n",
                 v.code);
  return v;
}

}  // namespace

int launch_elastic(LaunchOptions& o, const JobStore& js) {
  const auto tick = std::min(std::max(ms(o.monitor_interval), std::chrono::milliseconds(20)),
                             std::chrono::milliseconds(250));
  std::unique_ptr<Membership> mp;
  // Every node computes WORLD_SIZE and RANK as members x its own --nproc-per-node: a node
  // with another count would give its workers ranks the others do not have. Checked before
  // it takes an id, so the job never admits it.
  std::string theirs;
  try {
    if (js.hosting) js.store->set(elastic_key("nproc"), std::to_string(o.nproc_per_node));
    else theirs = text_of(js.store->get(elastic_key("nproc")));
  } catch (const std::exception& e) {
    throw LaunchError(1, std::string("cannot join the job's store: ") + e.what());
  }
  if (!js.hosting && theirs != std::to_string(o.nproc_per_node))
    throw LaunchError(2, "--nproc-per-node is " + std::to_string(o.nproc_per_node) + " on this node but " + theirs +
                             " on the node that hosts the job's store: every node must run the same number of "
                             "workers");
  try {
    mp = std::make_unique<Membership>(js.store, js.hosting, tick, ms(o.keep_alive), o.nnodes);
  } catch (const std::exception& e) {
    throw LaunchError(1, std::string("cannot join the job's store: ") + e.what());
  }
  Membership& m = *mp;
  std::fprintf(stderr, "phalanx-run: elastic job (--nnodes %d:%d): %s (launcher id %d).\n", o.min_nodes, o.nnodes,
               js.hosting ? ("hosts the job's store on " + o.master_addr + ":" + std::to_string(js.port) +
                             " and forms its rounds").c_str()
                          : "waits to be admitted to a round",
               m.id());
  HostState hs;
  int k = -1;
  std::vector<int> members;
  try {
    if (js.hosting) {
      try {
        members = form_round(o, m, {0}, true);
      } catch (const Interrupted& e) {
        return end_job(m, 0, {}, 128 + e.sig);
      } catch (const LaunchError& e) {
        end_job(m, 0, {}, e.exit_code);
        throw;
      }
      k = 0;
      publish_round(m.store(), k, members);
    }
    for (;;) {
      if (!js.hosting && (k < 0 || !contains(members, m.id()))) {
        int code = 0;
        const auto admitted = wait_admitted(o, js, m, k, code);
        if (!admitted) return code;
        k = admitted->first;
        members = admitted->second;
      }
      if (!js.hosting) m.store().set(started_key(k, m.id()), std::string("1"));
      int node_rank = 0;
      for (std::size_t i = 0; i < members.size(); ++i)
        if (members[i] == m.id()) node_rank = static_cast<int>(i);
      const Outcome r = run_round(o, js, m, k, members, node_rank);
      const NodeReport mine = report_of(node_rank, o, r);
      if (js.hosting) {
        std::vector<int> next;
        if (const auto code = settle_as_host(o, m, hs, k, members, mine, next)) return *code;
        members = next;
        ++k;
      } else {
        const Verdict v = settle_as_member(o, js, m, k, mine);
        if (v.end) return v.code;
        members = v.next;
        ++k;
      }
    }
  } catch (const LaunchError&) {
    throw;
  } catch (const std::exception& e) {
    if (js.hosting) throw LaunchError(1, std::string("the job's store failed: ") + e.what());
    throw host_gone(o, js, e.what());
  }
}

}  // namespace phalanx::launcher
