#include "phalanx/core/world.hpp"

#include <mutex>

namespace phalanx {

namespace {
std::mutex g_mu;
WorldInfo g_world;
}  // namespace

WorldInfo default_world() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_world;
}

void set_default_world(WorldInfo w) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_world = w;
}

}  // namespace phalanx
