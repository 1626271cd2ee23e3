#include "gloo_options.hpp"

#include <cstdlib>
#include <limits>
#include <string>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/cpu_count.hpp"
#include "phalanx/core/env.hpp"

namespace phalanx::gloo_backend {

namespace {

AllreduceAlgo algo_from_env() {
  const char* s = std::getenv("PHALANX_GLOO_ALLREDUCE");
  if (!s || !*s || std::string(s) == "auto") return AllreduceAlgo::Auto;
  const std::string v = s;
  if (v == "ring") return AllreduceAlgo::Ring;
  if (v == "bcube") return AllreduceAlgo::Bcube;
  if (v == "ring_chunked") return AllreduceAlgo::RingChunked;
  if (v == "halving_doubling") return AllreduceAlgo::HalvingDoubling;
  throw ConfigError("PHALANX_GLOO_ALLREDUCE='" + v +
                    "' is not one of auto, ring, bcube, ring_chunked, halving_doubling");
}

std::size_t sync_max_bytes_from_env() {
  const char* s = std::getenv("PHALANX_GLOO_SYNC_MAX_BYTES");
  if (!s || !*s) return std::numeric_limits<std::size_t>::max();  // every size (in chunks)
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (end == s || *end || v < 0)
    throw ConfigError(std::string("PHALANX_GLOO_SYNC_MAX_BYTES='") + s + "' is not a byte count");
  return static_cast<std::size_t>(v);
}

}  // namespace

GlooOptions GlooOptions::from_env(int ranks_on_machine) {
  GlooOptions o;
  o.algo = algo_from_env();
  o.sync_max_bytes = sync_max_bytes_from_env();
  if (const char* ch = std::getenv("PHALANX_GLOO_SYNC_CHUNK_BYTES")) o.sync_chunk_bytes = std::strtoull(ch, nullptr, 10);
  // Spinning pairs on more ranks than cores take turns on them: every message then waits a
  // scheduler slice (two launchers of 2 workers on 2 cores: 200x slower than blocking).
  o.busy_poll = env::flag("PHALANX_GLOO_BUSY_POLL", ranks_on_machine <= usable_cores());
  return o;
}

}  // namespace phalanx::gloo_backend
