#include "phalanx/parallel/consistency.hpp"

#include <cstring>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/world.hpp"
#include "phalanx/parallel/init.hpp"
#include "phalanx/parallel/internal/model_sync.hpp"

namespace phalanx::parallel {

namespace {

using Settings = std::vector<std::pair<std::string, std::string>>;

void put_string(std::string& out, const std::string& s) {
  const std::uint64_t n = s.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out += s;
}

std::string encode(const Settings& settings) {
  std::string out;
  for (const auto& [name, value] : settings) {
    put_string(out, name);
    put_string(out, value);
  }
  return out;
}

Settings decode(const std::string& bytes) {
  Settings out;
  std::size_t pos = 0;
  const auto take = [&](std::string& s) {
    std::uint64_t n = 0;
    if (bytes.size() - pos < sizeof n) throw InternalError("check_consistent: a truncated settings list");
    std::memcpy(&n, bytes.data() + pos, sizeof n);
    pos += sizeof n;
    if (bytes.size() - pos < n) throw InternalError("check_consistent: a truncated settings list");
    s = bytes.substr(pos, n);
    pos += n;
  };
  while (pos < bytes.size()) {
    std::pair<std::string, std::string> kv;
    take(kv.first);
    take(kv.second);
    out.push_back(std::move(kv));
  }
  return out;
}

/// Every rank's bytes, on this rank's device (NCCL carries device tensors only).
std::vector<std::string> allgather_bytes(ProcessGroup& pg, const std::string& mine) {
  return parallel::allgather_bytes(pg, mine, local_device());
}

const std::string* find(const Settings& s, const std::string& name) {
  for (const auto& [n, v] : s)
    if (n == name) return &v;
  return nullptr;
}

}  // namespace

void check_consistent(const Settings& settings, const ProcessGroupPtr& group) {
  // Without a group, a launch environment of several workers means each would compare
  // only with itself: an error, as for DDP.
  if (!group && !is_initialized()) require_world_initialized("check_consistent");
  const ProcessGroupPtr pg = group ? group : default_process_group();
  if (pg->size() == 1) return;
  std::vector<Settings> all;
  for (const auto& bytes : allgather_bytes(*pg, encode(settings))) all.push_back(decode(bytes));
  // Every rank holds every list, so every rank names the same setting and ranks: rank 0's
  // settings in its order first, then any that rank 0 lacks.
  const int world = static_cast<int>(all.size());
  for (const auto& [name, value] : all[0])
    for (int r = 1; r < world; ++r) {
      const std::string* theirs = find(all[r], name);
      if (!theirs || *theirs != value)
        throw ConfigError(detail::concat(name, " differs across ranks: rank 0 has ", value, ", rank ", r, " has ",
                                         theirs ? *theirs : std::string("no value"),
                                         "; every worker must be started with the same settings"));
    }
  for (int r = 1; r < world; ++r)
    for (const auto& [name, value] : all[r])
      if (!find(all[0], name))
        throw ConfigError(detail::concat(name, " differs across ranks: rank 0 has no value, rank ", r, " has ", value,
                                         "; every worker must be started with the same settings"));
}

}  // namespace phalanx::parallel
