// A node's folder gets the job's newest checkpoint from another node (checkpoint_share.hpp).
#include "checkpoint_share.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include <phalanx/phalanx.hpp>

namespace phalanx::trainer {

namespace {

// Steps and sizes travel as two float32 parts below 2^22 each (exact in a float sum): up to 2^44.
constexpr double kPart = 4194304.0;

/// Every rank's (step, size) from an all-reduce in which each rank fills its own row.
std::vector<std::pair<std::int64_t, std::int64_t>> gather(std::int64_t step, std::int64_t size, ProcessGroup& pg,
                                                          Device device) {
  const int world = pg.size();
  Tensor t = zeros({world, 4});
  float* row = t.data<float>() + 4 * pg.rank();
  const auto split = [](std::int64_t v, float* out) {
    const auto u = static_cast<double>(v + 1);  // -1 (none) travels as 0
    out[0] = static_cast<float>(std::floor(u / kPart));
    out[1] = static_cast<float>(u - out[0] * kPart);
  };
  split(step, row);
  split(size, row + 2);
  Tensor on = t.to(device);
  pg.allreduce(on)->wait();
  const Tensor all = on.to(Device::cpu());
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (int r = 0; r < world; ++r) {
    const float* v = all.data<float>() + 4 * r;
    out.emplace_back(static_cast<std::int64_t>(v[0] * kPart + v[1]) - 1,
                     static_cast<std::int64_t>(v[2] * kPart + v[3]) - 1);
  }
  return out;
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

/// Writes `bytes` as `path` through a temporary file in the same folder, fsynced, renamed.
void write_atomically(const std::string& dir, const std::string& path, const std::string& bytes) {
  const std::string tmp = received_temp_name(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError("cannot write " + tmp + ": " + std::strerror(errno) + "; give a writable --checkpoint-dir");
  // Held until the rename: remove_stale_received_temps takes a temporary whose pid this host
  // does not know for a dead writer's only when it can lock it (the pid may be of another pid
  // namespace, or another machine of the same name, on a shared folder).
  ::flock(fd, LOCK_EX | LOCK_NB);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw IoError("writing " + tmp + " failed: " + why + " (is the disk full?)");
    }
    done += static_cast<std::size_t>(n);
  }
  ::fsync(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    ::close(fd);
    throw IoError("cannot rename " + tmp + " to " + path + ": " + why);
  }
  ::close(fd);
  if (const int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
    ::fsync(d);
    ::close(d);
  }
}

/// A name for a received checkpoint of `step` that no file in `dir` has (a damaged file of
/// the step stays as it is).
std::string free_name(const std::string& dir, std::int64_t step) {
  for (int n = 0;; ++n) {
    char b[64];
    if (n == 0) std::snprintf(b, sizeof b, "checkpoint-%010lld.npz", static_cast<long long>(step));
    else std::snprintf(b, sizeof b, "checkpoint-%010lld.%d.npz", static_cast<long long>(step), n);
    const std::string p = dir + "/" + b;
    if (::access(p.c_str(), F_OK) != 0) return p;
  }
}

std::string host_name() {
  char b[256] = {0};
  if (::gethostname(b, sizeof b - 1) != 0 || !b[0]) return "localhost";
  return b;
}

constexpr const char* kTempMark = ".tmp.recv-";

/// The newest keep_last checkpoints stay, as CheckpointDir::save leaves its folder; damaged
/// files (passed over by load_newest) are neither counted nor removed, nor is `received`.
void prune(const parallel::CheckpointDir& dir, int keep_last, const std::string& received,
           const std::vector<parallel::SkippedCheckpoint>& damaged) {
  std::vector<std::string> all;
  for (auto& f : dir.list())
    if (std::none_of(damaged.begin(), damaged.end(), [&](const auto& d) { return d.path == f; })) all.push_back(f);
  for (std::size_t i = 0; i + static_cast<std::size_t>(std::max(keep_last, 1)) < all.size(); ++i)
    if (all[i] != received) std::remove(all[i].c_str());
}

}  // namespace

std::string received_temp_name(const std::string& path) {
  return path + kTempMark + std::to_string(::getpid()) + "-" + host_name();
}

int remove_stale_received_temps(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  const std::string me = host_name();
  std::vector<std::string> stale;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const auto at = name.find(kTempMark);
    if (name.rfind("checkpoint-", 0) != 0 || at == std::string::npos) continue;
    const std::string rest = name.substr(at + std::strlen(kTempMark));  // <pid>-<host>
    const auto dash = rest.find('-');
    const bool digits = dash != std::string::npos && dash > 0 && dash <= 9 &&
                        rest.substr(0, dash).find_first_not_of("0123456789") == std::string::npos;
    if (!digits || rest.substr(dash + 1) != me) continue;  // another host's (its writer may live), or not ours
    const long pid = std::stol(rest.substr(0, dash));
    if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)) {
      const std::string path = dir + "/" + name;
      struct stat st {};
      if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid()) stale.push_back(path);
    }
  }
  ::closedir(d);
  int removed = 0;
  for (const auto& f : stale) {
    // Its writer holds a lock on it until its rename: a file still locked has a live writer
    // whose pid this host cannot see (another pid namespace, another machine of this name).
    const int fd = ::open(f.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) removed += ::unlink(f.c_str()) == 0 ? 1 : 0;
    ::close(fd);
  }
  return removed;
}

std::int64_t share_newest_checkpoint(parallel::CheckpointDir& dir, const parallel::CheckpointExpect& expect,
                                     ProcessGroup& pg, Device device, int local_rank, int keep_last) {
  if (pg.size() < 2) return -1;
  std::int64_t mine = -1;
  std::string path;
  std::vector<parallel::SkippedCheckpoint> skipped;  // reported by the resume that follows
  bool foreign = false;
  try {
    if (auto got = dir.load_newest(expect, &skipped)) {
      mine = got->second.state.step;
      path = got->first;
    }
  } catch (const std::exception&) {
    // Another kind of run's file: the resume that follows says so on this rank (or loads
    // the file received). Those files are not this job's: nothing here is pruned.
    foreign = true;
  }
  const std::string bytes = path.empty() ? std::string() : read_bytes(path);
  const auto all = gather(mine, static_cast<std::int64_t>(bytes.size()), pg, device);
  int source = -1;
  bool behind = false;
  for (int r = 0; r < static_cast<int>(all.size()); ++r)
    if (source < 0 || all[r].first > all[source].first) source = r;
  const std::int64_t newest = all[source].first;
  for (const auto& [step, size] : all) behind = behind || step < newest;
  if (newest < 0 || !behind) return -1;
  // The bytes, as float32 words (a broadcast copies them as they are).
  const std::int64_t size = all[source].second;
  Tensor words = zeros({(size + 3) / 4});
  if (pg.rank() == source) std::memcpy(words.data<float>(), bytes.data(), bytes.size());
  const bool receive = mine < newest && local_rank == 0;
  std::string to;
  try {
    Tensor on = words.to(device);
    pg.broadcast(on, source)->wait();
    if (receive) {
      const Tensor got = on.to(Device::cpu());
      const std::string received(reinterpret_cast<const char*>(got.data<float>()), static_cast<std::size_t>(size));
      to = free_name(dir.dir(), newest);
      write_atomically(dir.dir(), to, received);
      try {
        parallel::load_checkpoint(to, expect);  // its checksums: what came is what was sent
      } catch (const std::exception& e) {
        ::unlink(to.c_str());
        throw IoError("the checkpoint of step " + std::to_string(newest) + " received from rank " +
                      std::to_string(source) + " does not verify (" + e.what() + "); removed it");
      }
    }
  } catch (...) {
    if (receive) remove_stale_received_temps(dir.dir());  // and this process's own, if any
    if (receive && !to.empty()) ::unlink(received_temp_name(to).c_str());
    throw;
  }
  if (receive) {
    if (!foreign) prune(dir, keep_last, to, skipped);  // the folder keeps what rank 0's keeps: --keep-checkpoints
    std::printf("phalanx-train: received the checkpoint of step %lld from rank %d (%lld bytes, verified) into %s\n",
                static_cast<long long>(newest), source, static_cast<long long>(size), to.c_str());
    std::fflush(stdout);
  }
  // The other ranks of this node read the folder only once the file is there.
  Tensor done = zeros({1});
  Tensor d = done.to(device);
  pg.allreduce(d)->wait();
  return newest;
}

}  // namespace phalanx::trainer
