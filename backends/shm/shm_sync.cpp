#include "shm_sync.hpp"

#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/cpu_count.hpp"
#include "phalanx/core/env.hpp"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace phalanx::shm {

namespace {

long env_us(const char* name, long fallback) {
  return static_cast<long>(env::integer(name, fallback, 0, 10000000, "a number of microseconds"));
}

}  // namespace

std::string bind_to_share(int rank, int world) {
  if (!env::flag("PHALANX_SHM_BIND", true)) return "off (PHALANX_SHM_BIND=0)";
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (::sched_getaffinity(0, sizeof mask, &mask) != 0) return "off (sched_getaffinity failed)";
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mask)) cpus.push_back(c);
  const int per = static_cast<int>(cpus.size()) / world;
  if (per < 1) return "off (more ranks than CPUs)";
  cpu_set_t mine;
  CPU_ZERO(&mine);
  std::string which;
  for (int i = rank * per; i < (rank + 1) * per; ++i) {
    CPU_SET(cpus[i], &mine);
    which += (which.empty() ? "" : ",") + std::to_string(cpus[i]);
  }
  if (::sched_setaffinity(0, sizeof mine, &mine) != 0) return "off (sched_setaffinity failed)";
  return "CPUs " + which;
}

WaitPolicy wait_policy_from_env(int ranks_on_host) {
  const bool oversubscribed = ranks_on_host > usable_cores();
  WaitPolicy p;
  p.spin = std::chrono::microseconds(env_us("PHALANX_SHM_SPIN_US", oversubscribed ? 0 : 50));
  p.yield = std::chrono::microseconds(env_us("PHALANX_SHM_YIELD_US", 200));
  return p;
}

Sync::Sync(Segment& seg, int rank, WaitPolicy policy, std::chrono::milliseconds timeout)
    : seg_(seg), rank_(rank), policy_(policy), pidfds_(seg.world(), -1), timeout_(timeout) {
  // PHALANX_SHM_PIDFD=0: liveness by kill(pid, 0) and /proc only (what runs where pidfd_open
  // is refused; the tests use it to cover that path).
  const bool pidfd = env::flag("PHALANX_SHM_PIDFD", true);
  for (int q = 0; q < seg.world(); ++q) {
    if (q == rank) continue;
    const int pid = seg.line(q).pid;
    const long fd = pidfd ? ::syscall(SYS_pidfd_open, pid, 0) : (errno = ENOSYS, -1);
    if (fd >= 0) {
      pidfds_[q] = static_cast<int>(fd);
    } else if (errno == ESRCH) {
      for (int& f : pidfds_)
        if (f >= 0) ::close(f);
      throw CommError(detail::concat("shm group: rank ", rank, " of ", seg.world(), ": rank ", q, " (pid ", pid,
                                     ") died while the group was being created"));
    }
  }
}

Sync::~Sync() {
  for (int f : pidfds_)
    if (f >= 0) ::close(f);
}

void Sync::wake() {
  Header& h = seg_.header();
  h.epoch.fetch_add(1, std::memory_order_seq_cst);
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&h.epoch), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void Sync::sleep_on(std::uint32_t epoch) {
  // 1 ms at most: the caller checks the peers, the abort flag and the deadline after each.
  struct timespec ts{0, 1000000};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&seg_.header().epoch), FUTEX_WAIT, epoch, &ts, nullptr, 0);
}

void Sync::abort() noexcept {
  aborted_.store(true, std::memory_order_seq_cst);
  mark_failed();
}

void Sync::mark_failed() noexcept {
  RankLine& me = seg_.line(rank_);
  if (me.state.load() == kAlive) me.state.store(kFailed, std::memory_order_seq_cst);
  wake();
}

void Sync::mark_left(std::uint64_t collectives) noexcept {
  RankLine& me = seg_.line(rank_);
  if (me.state.load() == kAlive) {
    // Published by the state store below (a peer reads ops after it saw kLeft).
    me.ops.store(collectives, std::memory_order_relaxed);
    me.state.store(kLeft, std::memory_order_seq_cst);
  }
  wake();
}

int Sync::peer_problem(int q) const {
  // Its own state first: a peer that failed (or left) and then exited is reported as such,
  // not as "died".
  const int st = seg_.line(q).state.load(std::memory_order_acquire);
  if (st == kLeft) return 2;
  if (st == kFailed) return 3;
  bool dead;
  if (pidfds_[q] >= 0) {
    struct pollfd p{pidfds_[q], POLLIN, 0};
    dead = ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR));
  } else {
    dead = !pid_alive(seg_.line(q).pid);
  }
  if (!dead) return 0;
  // It may have marked itself just before exiting, between the two reads.
  const int again = seg_.line(q).state.load(std::memory_order_acquire);
  return again == kLeft ? 2 : again == kFailed ? 3 : 1;
}

void Sync::fail_peer(int q, int why, const std::function<std::string()>& ctx) {
  mark_failed();
  const std::string who = detail::concat("rank ", q, " (pid ", seg_.line(q).pid, ")");
  if (why == 1)
    throw CommError(ctx() + ": " + who + " died (it exited or was killed) while this rank waited for it; "
                    "the job cannot continue: restart it");
  if (why == 2)  // a clean end: the ranks ran different numbers of steps
    throw PeerFinishedError(detail::peer_finished_message(ctx(), q, seg_.line(q).ops.load(std::memory_order_acquire)));
  throw CommError(ctx() + ": " + who + " failed (its own error says why) and will not take part");
}

void Sync::fail_timeout(int q, const std::function<std::string()>& ctx) {
  mark_failed();
  const std::string who = q >= 0 ? detail::concat("rank ", q, " (pid ", seg_.line(q).pid, ")") : std::string("a peer");
  throw TimeoutError(detail::concat(ctx(), " timed out after ", timeout_.count() / 1000.0, " s waiting for ", who,
                                    ", which is alive but did not take part (it may hang, be much slower, or "
                                    "have issued a different sequence of collectives; raise PHALANX_TIMEOUT if "
                                    "it is only slow)"));
}

void Sync::fail_aborted(const std::function<std::string()>& ctx) {
  mark_failed();
  throw CommError(ctx() + ": the process group was aborted");
}

}  // namespace phalanx::shm
