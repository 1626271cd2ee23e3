// A folder of step-numbered checkpoints: checkpoint-<step>[.<n>].npz, newest kept_last kept.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <tuple>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/file_safety.hpp"
#include "phalanx/parallel/checkpoint.hpp"
#include "checkpoint_internal.hpp"

namespace phalanx::parallel {

namespace {

// "checkpoint-0000000012.npz" -> (12, 0); "checkpoint-0000000012.3.npz" -> (12, 3).
bool parse_name(const std::string& name, std::int64_t& step, std::int64_t& n) {
  static const std::string pre = "checkpoint-", post = ".npz";
  if (name.size() <= pre.size() + post.size() || name.rfind(pre, 0) != 0 ||
      name.compare(name.size() - post.size(), post.size(), post) != 0)
    return false;
  const std::string mid = name.substr(pre.size(), name.size() - pre.size() - post.size());
  const auto dot = mid.find('.');
  const std::string a = mid.substr(0, dot), b = dot == std::string::npos ? "0" : mid.substr(dot + 1);
  for (const auto* part : {&a, &b})
    if (part->empty() || part->size() > 18 || part->find_first_not_of("0123456789") != std::string::npos) return false;
  step = std::stoll(a);
  n = std::stoll(b);
  return true;
}

std::string name_for(std::int64_t step, std::int64_t n) {
  char b[64];
  if (n == 0) std::snprintf(b, sizeof b, "checkpoint-%010lld.npz", static_cast<long long>(step));
  else std::snprintf(b, sizeof b, "checkpoint-%010lld.%lld.npz", static_cast<long long>(step), static_cast<long long>(n));
  return b;
}

// Any entry of that name, a dangling symbolic link included: a name this object did not
// write is never replaced.
bool exists(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

}  // namespace

CheckpointDir::CheckpointDir(std::string dir, int keep_last) : dir_(std::move(dir)), keep_last_(keep_last) {
  if (dir_.empty()) throw ValueError("CheckpointDir: the folder name is empty");
  if (keep_last < 1) throw ValueError(detail::concat("CheckpointDir: keep_last must be >= 1, got ", keep_last));
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  files::make_folders(dir_, files::private_folder_mode(), "checkpoint folder");
  files::check_private_folder(dir_, "checkpoint folder");  // another user could swap the files read on resume
}

CheckpointDir::~CheckpointDir() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

void CheckpointDir::lock() {
  if (lock_fd_ >= 0) return;
  const std::string path = dir_ + "/.lock";
  const int fd = files::open_lock_file(path, files::private_file_mode());  // reused, never through a link
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    char buf[32] = {0};
    const ssize_t got = ::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    std::string pid = got > 0 ? std::string(buf, static_cast<std::size_t>(got)) : "unknown";
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    if (e != EWOULDBLOCK)
      throw IoError("checkpoint folder " + dir_ + ": cannot lock " + path + " (" + std::strerror(e) + ")");
    throw ConfigError("checkpoint folder " + dir_ + " is in use by another run (pid " + pid +
                      "): wait for it to end, or give this run another --checkpoint-dir");
  }
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    ::close(fd);
    throw IoError("checkpoint folder " + dir_ + ": cannot write " + path + " (" + std::strerror(errno) + ")");
  }
  lock_fd_ = fd;
  // Under the lock nobody else writes here: a temporary file is a killed writer's leftover.
  DIR* d = ::opendir(dir_.c_str());
  if (!d) return;
  std::vector<std::string> stale;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("checkpoint-", 0) == 0 && name.find(".tmp.") != std::string::npos) stale.push_back(dir_ + "/" + name);
  }
  ::closedir(d);
  for (const auto& f : stale) std::remove(f.c_str());
}

std::optional<std::pair<std::string, LoadedCheckpoint>> CheckpointDir::load_newest(const CheckpointExpect& expect,
                                                                                    std::vector<SkippedCheckpoint>* skipped) {
  const auto all = list();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      return std::make_pair(*it, load_checkpoint(*it, expect));
    } catch (const IoError& e) {  // damaged: kept as it is, passed over, never pruned
      damaged_.push_back(*it);
      if (skipped) skipped->push_back({*it, e.what()});
    }
  }
  return std::nullopt;
}

std::vector<std::string> CheckpointDir::supersede_after(std::int64_t step) {
  std::vector<std::string> renamed;
  for (const auto& path : list()) {
    std::int64_t s, n;
    if (!parse_name(path.substr(dir_.size() + 1), s, n) || s <= step) continue;
    std::string to = path + ".superseded";  // an earlier superseded file of that name stays too
    for (int k = 1; exists(to); ++k) to = path + ".superseded." + std::to_string(k);
    if (std::rename(path.c_str(), to.c_str()) != 0)
      throw IoError("checkpoint folder " + dir_ + ": cannot rename " + path + " to " + to + " (" + std::strerror(errno) + ")");
    renamed.push_back(to);
  }
  return renamed;
}

std::vector<std::string> CheckpointDir::list() const {
  std::vector<std::tuple<std::int64_t, std::int64_t, std::string>> found;
  DIR* d = ::opendir(dir_.c_str());
  if (!d) throw IoError("checkpoint folder " + dir_ + ": cannot list (" + std::strerror(errno) + ")");
  while (const dirent* e = ::readdir(d)) {
    std::int64_t step, n;
    if (!parse_name(e->d_name, step, n)) continue;
    // Only this user's regular files are checkpoints: never resumed from, counted or pruned
    // otherwise (a link, or a file someone else put here).
    const std::string path = dir_ + "/" + e->d_name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
    found.emplace_back(step, n, path);
  }
  ::closedir(d);
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::get<2>(f));
  return out;
}

std::optional<std::string> CheckpointDir::latest() const {
  const auto all = list();
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::string CheckpointDir::save(const CheckpointState& state) {
  ckpt_internal::require_step_set(state.step);
  auto has = [](const std::vector<std::string>& v, const std::string& p) {
    return std::find(v.begin(), v.end(), p) != v.end();
  };
  // One step, one trained state: a save that reuses a step with other weights means the
  // caller's step does not advance, and each save would silently replace the last. Only on
  // a step that already has files does this cost anything (a read of each of them).
  std::string reuse;  // this object's own file of the step, holding the same state
  for (const auto& f : list()) {
    std::int64_t s, n;
    if (!parse_name(f.substr(dir_.size() + 1), s, n) || s != state.step) continue;
    switch (compare_trained_state(f, state)) {
      case StepFileMatch::damaged:  // kept as it is for inspection; never replaced
        break;
      case StepFileMatch::different:
        throw ConfigError(detail::concat(
            "checkpoint folder ", dir_, ": ", f, " already holds step ", state.step,
            " with a different model or optimizer state: two saves at one step with different weights mean the step "
            "is not advancing; set CheckpointState.step to the optimizer steps taken so far",
            has(written_, f) ? "" : " (if that file is another run's: resume from it, or give this run an empty folder)"));
      case StepFileMatch::same:
        if (reuse.empty() && has(written_, f)) reuse = f;
        break;
    }
  }
  // A file of this step that this object did not write (a damaged one kept for inspection,
  // or another run's) is never replaced: the new one gets the next free suffix.
  std::string path = reuse;
  for (std::int64_t n = 0; path.empty(); ++n)
    if (!exists(dir_ + "/" + name_for(state.step, n))) path = dir_ + "/" + name_for(state.step, n);
  save_checkpoint(path, state);
  if (std::find(written_.begin(), written_.end(), path) == written_.end()) written_.push_back(path);
  // Only now, with a newer one complete, the oldest beyond keep_last go; files passed over as
  // damaged are neither counted nor removed, and the file resumed from stays.
  std::vector<std::string> all;
  for (auto& f : list())
    if (!has(damaged_, f)) all.push_back(f);
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep_last_) < all.size(); ++i)
    if (all[i] != path && !has(protected_, all[i])) std::remove(all[i].c_str());
  return path;
}

}  // namespace phalanx::parallel
