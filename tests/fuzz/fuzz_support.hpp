#pragma once
// Shared pieces of the libFuzzer harnesses (docs/reliability.md, "Fuzzing"):
//  - guarded(): runs one input; a phalanx::Error is a normal outcome (bad input refused),
//    any other exception is a finding (printed, then abort() so libFuzzer saves the input);
//  - ScratchFile: one file per process, rewritten for each input, for readers that only take
//    a path. It lives in $TMPDIR (scripts/fuzz.sh points it at its work folder), else
//    /dev/shm, else /tmp, and is removed at exit;
//  - require(): a property the harness checks on an accepted input (round trips, value
//    ranges); a violation is a finding ("silent garbage").
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <typeinfo>

#include "phalanx/core/error.hpp"

namespace phalanx::fuzz {

template <typename F>
int guarded(F&& run_one) {
  try {
    run_one();
  } catch (const phalanx::Error&) {
    // Refused with a message: what bad input must get.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz finding: non-Phalanx exception %s: %s\n", typeid(e).name(), e.what());
    std::abort();
  }
  return 0;
}

inline void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz finding: accepted input violates: %s\n", what);
  std::abort();
}

class ScratchFile {
 public:
  /// `suffix` matters to readers that look at the extension (".npz", ".gz").
  explicit ScratchFile(const std::string& suffix) {
    std::string dir = "/tmp";
    if (const char* t = std::getenv("TMPDIR"); t && *t) dir = t;
    else if (access("/dev/shm", W_OK) == 0) dir = "/dev/shm";
    path_ = dir + "/phalanx-fuzz-" + std::to_string(getpid()) + "-" + std::to_string(counter()++) + suffix;
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  ~ScratchFile() { unlink(path_.c_str()); }

  const std::string& path() const { return path_; }

  /// Replaces the file's content with `data`; returns the path.
  const std::string& write(const void* data, std::size_t size) {
    const int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) fail("cannot create");
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd, p, size);
      if (n <= 0) fail("cannot write");
      p += n;
      size -= static_cast<std::size_t>(n);
    }
    close(fd);
    return path_;
  }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  [[noreturn]] void fail(const char* why) const {
    // The harness's own environment is broken, not the code under test: stop loudly.
    std::fprintf(stderr, "fuzz harness: %s %s\n", why, path_.c_str());
    std::exit(3);
  }
  std::string path_;
};

}  // namespace phalanx::fuzz
