#include "desync_check.hpp"

#include <cstdlib>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/env.hpp"

namespace phalanx::parallel {

bool debug_detail_enabled() {
  const std::string s = env::choice("PHALANX_DEBUG", "off", {"detail", "off", "DETAIL", "OFF"});
  return s == "detail" || s == "DETAIL";
}

ProcessGroup::CollectiveCheck make_desync_check(StorePtr store, int rank, int world) {
  return [store, rank, world](std::uint64_t index, const std::string& sig) {
    const auto key = [](std::uint64_t i, int r) { return detail::concat("debug/", i, "/", r); };
    store->set(key(index, rank), sig);
    std::vector<std::string> sigs(world);
    for (int r = 0; r < world; ++r) sigs[r] = r == rank ? sig : store->get_string(key(index, r));
    // Every rank reached collective index - 1's check, so all have read our key of index - 2.
    if (index >= 2) store->delete_key(key(index - 2, rank));
    // Every rank compares against rank 0, so all name the same pair.
    for (int r = 1; r < world; ++r)
      if (sigs[r] != sigs[0])
        throw DesyncError(detail::concat(
            "collective desync (PHALANX_DEBUG=detail) at collective #", index, ": rank 0 called ", sigs[0],
            " but rank ", r, " called ", sigs[r],
            "; every rank must issue the same collectives, in the same order, with the same dtypes and shapes"));
  };
}

}  // namespace phalanx::parallel
