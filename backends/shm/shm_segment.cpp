#include "shm_segment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <new>
#include <random>
#include <thread>
#include <vector>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/backends/store.hpp"
#include "phalanx/core/env.hpp"

namespace phalanx::shm {

namespace {

std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

/// FNV-1a of the job token: the job in the name without the token itself.
std::uint64_t job_hash() {
  const std::string t = env::text("PHALANX_RDZV_TOKEN").value_or("");
  std::uint64_t h = 1469598103934665603ull;
  for (const char* p = t.c_str(); *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
  return h;
}

std::string errno_text(int e) { return std::strerror(e); }

/// This process's pid namespace (the inode of /proc/self/ns/pid), 0 if unknown: a pid in a
/// segment's name means something only to processes of the same namespace.
std::uint64_t pid_namespace() {
  char buf[64] = {0};
  const ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
  if (n <= 0) return 0;
  const char* open = std::strchr(buf, '[');
  return open ? std::strtoull(open + 1, nullptr, 10) : 0;
}

/// "<prefix><job8>-<uid>-<pidns hex>-<creator pid>-": what follows the job hash in this
/// user's names, up to the random id.
std::string owner_part(std::uint64_t ns, int pid) {
  return detail::concat("-", ::getuid(), "-", hex64(ns), "-", pid, "-");
}

/// Removes this user's segments (of this pid namespace) whose creator is dead: left behind
/// by a rank 0 killed while it waited for the others to attach (after every rank attached
/// the name is gone already). A creator still alive, or of another namespace, is left alone.
void sweep_dead_creators(std::uint64_t ns) {
  if (ns == 0) return;
  const std::string mine = owner_part(ns, 0);  // "-<uid>-<ns>-0-"; compared up to the pid
  const std::string head = mine.substr(0, mine.size() - 2);
  DIR* d = ::opendir("/dev/shm");
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    const std::size_t pre = std::strlen(kNamePrefix) + 8;  // prefix and job hash
    if (n.compare(0, std::strlen(kNamePrefix), kNamePrefix) != 0 || n.size() <= pre + head.size() ||
        n.compare(pre, head.size(), head) != 0)
      continue;
    char* end = nullptr;
    const long pid = std::strtol(n.c_str() + pre + head.size(), &end, 10);
    if (pid <= 0 || !end || *end != '-' || pid_alive(static_cast<int>(pid))) continue;
    ::shm_unlink(("/" + n).c_str());
  }
  ::closedir(d);
}

std::string pid_key(int rank) { return "pid/" + std::to_string(rank); }

/// While a rank waits for the others to attach, SIGTERM and SIGINT (a launcher stopping the
/// job because another rank failed) first remove the segment's name, then kill as before.
/// Installed only over the default disposition (an application's own handler is left
/// alone) and by one group at a time; SIGKILL is left to sweep_dead_creators.
char g_unlink_path[256];
std::atomic<bool> g_guard_taken{false};
struct sigaction g_old_term, g_old_int;

extern "C" void unlink_then_die(int sig) {
  ::unlink(g_unlink_path);  // async-signal-safe, unlike shm_unlink
  ::sigaction(sig, sig == SIGTERM ? &g_old_term : &g_old_int, nullptr);
  ::raise(sig);
}

class SignalUnlinkGuard {
 public:
  explicit SignalUnlinkGuard(const std::string& name) {
    if (name.size() + 10 >= sizeof g_unlink_path || g_guard_taken.exchange(true)) return;
    struct sigaction term{}, intr{};
    ::sigaction(SIGTERM, nullptr, &term);
    ::sigaction(SIGINT, nullptr, &intr);
    if (term.sa_handler != SIG_DFL || intr.sa_handler != SIG_DFL) {
      g_guard_taken = false;
      return;
    }
    std::snprintf(g_unlink_path, sizeof g_unlink_path, "/dev/shm%s", name.c_str());
    struct sigaction sa{};
    sa.sa_handler = unlink_then_die;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGTERM, &sa, &g_old_term);
    ::sigaction(SIGINT, &sa, &g_old_int);
    installed_ = true;
  }
  ~SignalUnlinkGuard() {
    if (!installed_) return;
    ::sigaction(SIGTERM, &g_old_term, nullptr);
    ::sigaction(SIGINT, &g_old_int, nullptr);
    g_guard_taken = false;
  }
  SignalUnlinkGuard(const SignalUnlinkGuard&) = delete;
  SignalUnlinkGuard& operator=(const SignalUnlinkGuard&) = delete;

 private:
  bool installed_ = false;
};

}  // namespace

bool pid_alive(int pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  std::FILE* f = std::fopen(path, "r");
  if (!f) return true;  // no /proc: kill() is all we know
  char buf[512] = {0};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* paren = std::strrchr(buf, ')');  // "pid (comm) S ...": a zombie counts as dead
  return !(n > 0 && paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X'));
}

void publish_pid(Store& store, int rank) {
  store.set(pid_key(rank), std::to_string(::getpid()));
}

std::uint64_t slot_bytes_from_env() {
  return round_up(env::bytes("PHALANX_SHM_BYTES", 4u << 20, 64 * 1024, 1ull << 34, "a staging size per rank"), 8192);
}

void Segment::compute_layout() {
  const std::size_t page = 4096;
  lines_off_ = round_up(sizeof(Header), kLine);
  chanctl_off_ = round_up(lines_off_ + world_ * sizeof(RankLine), kLine);
  slots_off_ = round_up(chanctl_off_ + static_cast<std::size_t>(world_ * world_) * sizeof(ChannelCtl), page);
  chans_off_ = slots_off_ + world_ * slot_bytes_;
  total_ = chans_off_ + static_cast<std::size_t>(world_ * world_) * chan_bytes_;
}

Segment::Segment(Store& store, int rank, int world, std::uint64_t slot_bytes, std::uint64_t small_bytes,
                 std::uint64_t chunk_bytes, std::chrono::milliseconds timeout, bool channels,
                 std::uint64_t user, const std::function<std::string(int)>& peer_gone)
    : world_(world), slot_bytes_(slot_bytes) {
  // Rings (W² of them): a power of two of at least 16 KiB, at most 256 KiB, a quarter of a
  // slot and a W-th of one (a large message streams through; W = 8 at the default staging
  // needs 48 MiB in all, inside Docker's default /dev/shm).
  const std::size_t ring_max = std::min<std::size_t>({slot_bytes_ / 4, 256u << 10, slot_bytes_ / world});
  std::size_t c = 16 * 1024;
  while (c * 2 <= ring_max) c *= 2;
  chan_bytes_ = channels ? c : 0;
  int fd = -1;
  bool created = false;
  const auto fail = [&](const std::string& msg) {
    if (base_) ::munmap(base_, total_);
    base_ = nullptr;
    if (fd >= 0) ::close(fd);
    if (!name_.empty()) ::shm_unlink(name_.c_str());  // whoever fails removes the name
    throw CommError(detail::concat("shm group: rank ", rank, " of ", world, ": ", msg));
  };
  if (rank == 0) {
    compute_layout();
    std::random_device rd;
    const std::uint64_t id = (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid());
    // The creator's uid, pid namespace and pid are in the name: a later group sweeps the
    // names whose creator died before the others attached (sweep_dead_creators).
    const std::uint64_t ns = pid_namespace();
    sweep_dead_creators(ns);
    name_ = std::string("/") + kNamePrefix + hex64(job_hash()).substr(0, 8) + owner_part(ns, ::getpid()) + hex64(id);
    // The segment cannot be made here: the others are told at once through the store (they
    // wait for its name), and every rank throws BackendUnavailableError, which `auto` takes
    // as "use gloo on this host" (parallel/rendezvous/src/host_topology.cpp).
    const auto unavailable = [&](const std::string& msg) {
      if (base_) ::munmap(base_, total_);
      base_ = nullptr;
      if (fd >= 0) ::close(fd);
      if (!name_.empty() && created) ::shm_unlink(name_.c_str());
      name_.clear();
      try {
        store.set("name", std::string(kUnavailableMark) + msg);
      } catch (const std::exception&) {
      }
      throw BackendUnavailableError(detail::concat("shm group: rank ", rank, " of ", world, ": ", msg));
    };
    struct statvfs vfs{};
    if (::statvfs("/dev/shm", &vfs) == 0 && static_cast<double>(vfs.f_bavail) * vfs.f_frsize < total_)
      unavailable(detail::concat("/dev/shm has ", static_cast<double>(vfs.f_bavail) * vfs.f_frsize / 1048576.0,
                                 " MiB free, the segment needs ", total_ / 1048576.0,
                                 chan_bytes_ > 0 ? " MiB: lower PHALANX_SHM_BYTES, or enlarge /dev/shm (docker: --shm-size)"
                                                 : " MiB (W x the buffer): enlarge /dev/shm (docker: --shm-size) for "
                                                   "zero-copy buffers, or set PHALANX_SHM_ZERO_COPY=0"));
    fd = ::shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) unavailable("shm_open(O_CREAT) failed: " + errno_text(errno) + " (is /dev/shm mounted and writable?)");
    created = true;
    if (::ftruncate(fd, static_cast<off_t>(total_)) != 0) unavailable("ftruncate failed: " + errno_text(errno));
    void* p = ::mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) unavailable(detail::concat("mmap of ", total_, " bytes failed: ", errno_text(errno)));
    base_ = static_cast<char*>(p);
  }
  if (created) {
    ::close(fd);
    fd = -1;
    // Initialised before the name is published: no rank maps a half-written header.
    std::memset(base_, 0, slots_off_);
    Header& hd = *new (base_) Header;
    hd.world = world;
    hd.slot_bytes = slot_bytes_;
    hd.chan_bytes = chan_bytes_;
    hd.total_bytes = total_;
    hd.small_bytes = std::min<std::uint64_t>(small_bytes, half_bytes());
    hd.chunk_bytes = std::max<std::uint64_t>(4096, std::min<std::uint64_t>(chunk_bytes, half_bytes()));
    hd.user = user;
    hd.version = kVersion;
    hd.magic = kMagic;
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  if (rank != 0 && peer_gone) {
    // Rank 0 may never come (it died first): ask after it while polling for the name.
    const auto give_up = std::chrono::steady_clock::now() + timeout;
    std::string why;
    // 1 ms doubling to 50 ms: a rank 0 that comes minutes later (still loading its data)
    // costs the store 20 requests a second per waiting rank, not 500.
    auto pause = std::chrono::milliseconds(1);
    try {
      while (why.empty() && !store.check({"name"}) && std::chrono::steady_clock::now() < give_up) {
        why = peer_gone(0);
        if (why.empty()) std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::milliseconds(50));
      }
    } catch (const std::exception&) {
      // the store failed: get_string below says how
    }
    if (why.empty() && std::chrono::steady_clock::now() >= give_up)
      why = detail::concat("rank 0 did not publish the segment's name within ", timeout.count() / 1000.0, " s");
    if (!why.empty()) fail(why);
  }
  try {
    if (rank == 0) store.set("name", name_);
    else name_ = store.get_string("name");
  } catch (const std::exception& e) {
    if (rank != 0) name_.clear();
    fail(std::string(rank != 0 && dynamic_cast<const TimeoutError*>(&e) ? "rank 0 did not publish the segment's name: "
                                                                         : "the store failed: ") + e.what());
  }
  if (!created && name_.rfind(kUnavailableMark, 0) == 0) {
    const std::string why = name_.substr(std::strlen(kUnavailableMark));
    name_.clear();
    throw BackendUnavailableError(
        detail::concat("shm group: rank ", rank, " of ", world, ": rank 0 could not create the segment: ", why));
  }
  if (!created) {
    fd = ::shm_open(name_.c_str(), O_RDWR, 0600);
    // A name already removed is an earlier group's under the same store prefix (destroyed,
    // then created again): wait for rank 0 to publish this group's name.
    const auto give_up = std::chrono::steady_clock::now() + timeout;
    while (fd < 0 && errno == ENOENT && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::string again;
      try {
        again = store.get_string("name");
      } catch (const std::exception&) {
        break;
      }
      if (again.rfind(kUnavailableMark, 0) == 0)
        throw BackendUnavailableError(detail::concat("shm group: rank ", rank, " of ", world,
                                                     ": rank 0 could not create the segment: ",
                                                     again.substr(std::strlen(kUnavailableMark))));
      name_ = again;
      fd = ::shm_open(name_.c_str(), O_RDWR, 0600);
    }
    if (fd < 0) {
      const int e = errno;
      const std::string n = name_;
      name_.clear();  // not ours to remove: rank 0 may still be attaching others
      fail("cannot open the segment " + n + " rank 0 created: " + errno_text(e) +
           (e == ENOENT ? " (it was already removed: rank 0 failed, or this rank joined a stale group)" : ""));
    }
    struct stat st{};
    if (::fstat(fd, &st) != 0) fail("fstat failed: " + errno_text(errno));
    if (static_cast<std::size_t>(st.st_size) < sizeof(Header))
      fail(detail::concat("the segment ", name_, " is too small (", st.st_size, " bytes)"));
    // Read rank 0's sizes from its header (its PHALANX_SHM_BYTES decides).
    void* h = ::mmap(nullptr, sizeof(Header), PROT_READ, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED) fail("mmap of the header failed: " + errno_text(errno));
    const auto* hp = static_cast<const Header*>(h);
    const std::uint64_t magic = hp->magic, sb = hp->slot_bytes, cb = hp->chan_bytes, tb = hp->total_bytes;
    const std::uint32_t version = hp->version;
    const std::int32_t hw = hp->world;
    ::munmap(h, sizeof(Header));
    if (magic != kMagic || version != kVersion || hw != world)
      fail(detail::concat("the segment ", name_, " is not a version-", kVersion, " shm segment of world ", world,
                          " (its world: ", hw, "); are two jobs sharing one store prefix?"));
    slot_bytes_ = sb;
    chan_bytes_ = cb;
    compute_layout();
    if (tb != total_ || static_cast<std::size_t>(st.st_size) != total_)
      fail(detail::concat("the segment's size ", st.st_size, " does not match its layout (", total_, ")"));
    void* p = ::mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) fail(detail::concat("mmap of ", total_, " bytes failed: ", errno_text(errno)));
    base_ = static_cast<char*>(p);
    ::close(fd);
    fd = -1;
  }
  // Touch this rank's own slot and its outgoing channels now (first-touch page faults are
  // paid at creation, not in the first collective).
  std::memset(slot(rank, 0), 0, slot_bytes_);
  RankLine& me = line(rank);
  me.pid = static_cast<std::int32_t>(::getpid());
  me.state.store(kAlive, std::memory_order_seq_cst);
  header().attached.fetch_add(1, std::memory_order_seq_cst);
  // Wait until every rank attached, then remove the name: from here on the segment lives
  // exactly as long as some rank maps it.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(50);
  // Every 100 ms: has a rank that has not attached yet exited? (Each rank published its pid
  // in the store before anything that can fail; see publish_pid.)
  std::vector<int> pids(world, 0);
  const SignalUnlinkGuard on_sigterm(name_);
  auto next_check = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (header().attached.load(std::memory_order_acquire) < world) {
    if (std::chrono::steady_clock::now() >= next_check) {
      next_check = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      for (int r = 0; r < world; ++r) {
        if (r == rank || line(r).state.load() != kAttaching) continue;
        const std::string why = peer_gone ? peer_gone(r) : std::string();
        if (!why.empty()) {
          ::munmap(base_, total_);
          base_ = nullptr;
          ::shm_unlink(name_.c_str());
          throw CommError(detail::concat("shm group: rank ", rank, " of ", world, ": ", why));
        }
        if (pids[r] == 0) {
          try {
            if (store.check({pid_key(r)})) pids[r] = std::stoi(store.get_string(pid_key(r)));
          } catch (const std::exception&) {
            // the store is gone or the value odd: the timeout below still ends the wait
          }
        }
        if (pids[r] > 0 && !pid_alive(pids[r])) {
          const std::string msg = detail::concat(
              "shm group: rank ", rank, " of ", world, ": rank ", r, " (pid ", pids[r],
              ") exited or was killed before it attached to the segment (its own error, if any, says why); "
              "the job cannot continue: restart it");
          ::munmap(base_, total_);
          base_ = nullptr;
          ::shm_unlink(name_.c_str());
          throw CommError(msg);
        }
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::string missing;
      for (int r = 0; r < world; ++r)
        if (line(r).state.load() == kAttaching) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      const std::string msg = detail::concat(
          "shm group: rank ", rank, " of ", world, ": ranks ", missing, " did not attach to the segment within ",
          timeout.count() / 1000.0, " s (did they start, and choose the shm backend too?)");
      ::munmap(base_, total_);
      base_ = nullptr;
      ::shm_unlink(name_.c_str());
      throw TimeoutError(msg);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
  ::shm_unlink(name_.c_str());  // every rank tries; ENOENT once one of them did
}

Segment::~Segment() {
  if (base_) ::munmap(base_, total_);
}

}  // namespace phalanx::shm
