#include "phalanx/core/warning.hpp"

#include <unistd.h>

#include <mutex>
#include <set>

namespace phalanx {

void warn(const std::string& line) {
  const std::string text = "phalanx: warning: " + line + "\n";
  std::size_t done = 0;
  while (done < text.size()) {  // one write() unless interrupted: no interleaving with other lines
    const ssize_t n = ::write(STDERR_FILENO, text.data() + done, text.size() - done);
    if (n <= 0) return;  // stderr closed: a warning is not worth failing for
    done += static_cast<std::size_t>(n);
  }
}

void warn_once(const std::string& key, const std::string& line) {
  static std::mutex mu;
  static std::set<std::string>* seen = new std::set<std::string>;  // never destroyed: usable at exit
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!seen->insert(key).second) return;
  }
  warn(line);
}

}  // namespace phalanx
