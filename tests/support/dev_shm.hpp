#pragma once
// The shm backend's segment names now in /dev/shm ("phalanx-shm-*"), for the tests that check
// nothing is left behind.
#include <dirent.h>

#include <cstring>
#include <set>
#include <string>

namespace phalanx::test {

inline std::set<std::string> shm_names() {
  std::set<std::string> out;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d))
      if (std::strncmp(e->d_name, "phalanx-shm-", 12) == 0) out.insert(e->d_name);
    ::closedir(d);
  }
  return out;
}

}  // namespace phalanx::test
