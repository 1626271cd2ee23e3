#include "phalanx/backends/store.hpp"

#include "phalanx/backends/comm_error.hpp"

namespace phalanx {

void throw_store_timeout(const std::vector<std::string>& missing, std::chrono::milliseconds timeout,
                         const std::string& where) {
  std::string keys;
  for (const auto& k : missing) keys += (keys.empty() ? "" : ", ") + k;
  throw TimeoutError(detail::concat(where, ": timed out after ", timeout.count() / 1000.0,
                                    " s waiting for key(s) ", keys));
}

std::int64_t parse_store_int(const Bytes& b, const std::string& key) {
  const std::string s(b.begin(), b.end());
  try {
    std::size_t pos = 0;
    const long long v = std::stoll(s, &pos);
    if (pos == s.size()) return v;
  } catch (...) {
  }
  throw ValueError("store: key '" + key + "' holds '" + s + "', not an integer");
}

}  // namespace phalanx
