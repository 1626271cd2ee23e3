#pragma once
// Settings that must agree across ranks (global batch, model, optimizer, exact mode, ...),
// compared at start-up so a mismatch is an error naming the values, not a hang later.
#include <string>
#include <utility>
#include <vector>

#include "phalanx/backends/process_group.hpp"

namespace phalanx::parallel {

/// Every rank passes its (name, value) list. Throws ConfigError on every rank naming the
/// first setting that differs and two ranks' values. `pg`: nullptr = the default group.
void check_consistent(const std::vector<std::pair<std::string, std::string>>& settings,
                      const ProcessGroupPtr& pg = nullptr);

}  // namespace phalanx::parallel
