#include "phalanx/backends/file_store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/file_safety.hpp"

namespace phalanx {

namespace {

// Record: [u8 kind: 0 set, 1 delete][u32 key length][key][u32 value length][value]
using Map = std::map<std::string, Bytes>;

class LockedFile {
 public:
  LockedFile(const std::string& path, bool exclusive) : path_(path) {
    // Never through a symbolic link, and only this user's regular file: the log is rewritten
    // (repaired) in place, so a planted link would make every rank write another file.
    try {
      fd_ = files::open_lock_file(path, files::private_file_mode());
    } catch (const IoError& e) {
      throw ConfigError(std::string("file store: ") + e.what() +
                        " (the file:// path must be on a filesystem every rank can write)");
    }
    while (::flock(fd_, exclusive ? LOCK_EX : LOCK_SH) != 0) {
      if (errno != EINTR) {
        const int err = errno;
        ::close(fd_);  // the destructor does not run for a constructor that throws
        fd_ = -1;
        throw IoError("file store: cannot lock " + path + ": " + std::strerror(err));
      }
    }
  }
  ~LockedFile() {
    if (fd_ >= 0) {
      ::flock(fd_, LOCK_UN);
      ::close(fd_);
    }
  }

  /// Replays the log. A truncated last record (a writer that died mid-append) is ignored
  /// and, under an exclusive lock, cut off.
  Map replay(bool repair) {
    std::string data;
    char buf[65536];
    ::lseek(fd_, 0, SEEK_SET);
    for (;;) {
      const ssize_t r = ::read(fd_, buf, sizeof buf);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw IoError("file store: cannot read " + path_ + ": " + std::strerror(errno));
      if (r == 0) break;
      data.append(buf, static_cast<std::size_t>(r));
    }
    Map m;
    std::size_t pos = 0, good = 0;
    auto u32 = [&](std::uint32_t& v) {
      if (pos + 4 > data.size()) return false;
      std::memcpy(&v, data.data() + pos, 4);
      pos += 4;
      return true;
    };
    while (pos < data.size()) {
      const auto kind = static_cast<std::uint8_t>(data[pos++]);
      std::uint32_t kl, vl;
      if (!u32(kl) || pos + kl > data.size()) break;
      std::string key = data.substr(pos, kl);
      pos += kl;
      if (!u32(vl) || pos + vl > data.size()) break;
      if (kind == 0)
        m[key] = Bytes(data.begin() + pos, data.begin() + pos + vl);
      else
        m.erase(key);
      pos += vl;
      good = pos;
    }
    if (repair && good < data.size() && ::ftruncate(fd_, static_cast<off_t>(good)) != 0)
      throw IoError("file store: cannot repair " + path_);
    return m;
  }

  void append(std::uint8_t kind, const std::string& key, const Bytes& value) {
    std::string rec(1, static_cast<char>(kind));
    auto put32 = [&](std::uint32_t v) { rec.append(reinterpret_cast<const char*>(&v), 4); };
    put32(static_cast<std::uint32_t>(key.size()));
    rec += key;
    put32(static_cast<std::uint32_t>(value.size()));
    rec.append(value.begin(), value.end());
    ::lseek(fd_, 0, SEEK_END);
    std::size_t done = 0;
    while (done < rec.size()) {
      const ssize_t w = ::write(fd_, rec.data() + done, rec.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) throw IoError("file store: cannot write " + path_ + ": " + std::strerror(errno));
      done += static_cast<std::size_t>(w);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

FileStore::FileStore(std::string path, std::chrono::milliseconds timeout) : path_(std::move(path)) {
  timeout_ = timeout;
  LockedFile f(path_, true);  // fails early, with the path, when it cannot be created
}

void FileStore::set(const std::string& key, const Bytes& value) {
  LockedFile f(path_, true);
  f.replay(true);
  f.append(0, key, value);
}

Bytes FileStore::get(const std::string& key) {
  wait({key}, timeout_);
  LockedFile f(path_, false);
  return f.replay(false).at(key);
}

std::int64_t FileStore::add(const std::string& key, std::int64_t delta) {
  LockedFile f(path_, true);
  Map m = f.replay(true);
  auto it = m.find(key);
  const std::int64_t v = (it == m.end() ? 0 : parse_store_int(it->second, key)) + delta;
  const std::string s = std::to_string(v);
  f.append(0, key, Bytes(s.begin(), s.end()));
  return v;
}

Bytes FileStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  LockedFile f(path_, true);
  Map m = f.replay(true);
  auto it = m.find(key);
  if ((it == m.end() && expected.empty()) || (it != m.end() && it->second == expected)) {
    f.append(0, key, desired);
    return desired;
  }
  return it == m.end() ? Bytes{} : it->second;
}

void FileStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto sleep = std::chrono::milliseconds(1);
  for (;;) {
    std::vector<std::string> missing;
    {
      LockedFile f(path_, false);
      const Map m = f.replay(false);
      for (const auto& k : keys)
        if (!m.count(k)) missing.push_back(k);
    }
    if (missing.empty()) return;
    if (std::chrono::steady_clock::now() >= deadline) throw_store_timeout(missing, timeout, "file store " + path_);
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::milliseconds(50));
  }
}

bool FileStore::check(const std::vector<std::string>& keys) {
  LockedFile f(path_, false);
  const Map m = f.replay(false);
  for (const auto& k : keys)
    if (!m.count(k)) return false;
  return true;
}

bool FileStore::delete_key(const std::string& key) {
  LockedFile f(path_, true);
  Map m = f.replay(true);
  if (!m.count(key)) return false;
  f.append(1, key, {});
  return true;
}

std::int64_t FileStore::num_keys() {
  LockedFile f(path_, false);
  return static_cast<std::int64_t>(f.replay(false).size());
}

}  // namespace phalanx
