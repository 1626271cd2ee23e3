// A node's folder gets the job's newest checkpoint from another node (checkpoint_share.hpp).
#include "checkpoint_share.hpp"

#include <fcntl.h>
#include <unistd.h>

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
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError("cannot write " + tmp + ": " + std::strerror(errno) + "; give a writable --checkpoint-dir");
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
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw IoError("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  }
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

}  // namespace

std::int64_t share_newest_checkpoint(parallel::CheckpointDir& dir, const parallel::CheckpointExpect& expect,
                                     ProcessGroup& pg, Device device, int local_rank) {
  if (pg.size() < 2) return -1;
  std::int64_t mine = -1;
  std::string path;
  try {
    std::vector<parallel::SkippedCheckpoint> skipped;  // reported by the resume that follows
    if (auto got = dir.load_newest(expect, &skipped)) {
      mine = got->second.state.step;
      path = got->first;
    }
  } catch (const std::exception&) {
    // Another kind of run's file: the resume that follows says so on this rank.
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
  Tensor on = words.to(device);
  pg.broadcast(on, source)->wait();
  if (mine < newest && local_rank == 0) {
    const Tensor got = on.to(Device::cpu());
    const std::string received(reinterpret_cast<const char*>(got.data<float>()), static_cast<std::size_t>(size));
    const std::string to = free_name(dir.dir(), newest);
    write_atomically(dir.dir(), to, received);
    try {
      parallel::load_checkpoint(to, expect);  // its checksums: what came is what was sent
    } catch (const std::exception& e) {
      ::unlink(to.c_str());
      throw IoError("the checkpoint of step " + std::to_string(newest) + " received from rank " +
                    std::to_string(source) + " does not verify (" + e.what() + "); removed it");
    }
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
