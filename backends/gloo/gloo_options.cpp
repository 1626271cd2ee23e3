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
  const std::string v =
      env::choice("PHALANX_GLOO_ALLREDUCE", "auto", {"auto", "ring", "bcube", "ring_chunked", "halving_doubling"});
  if (v == "auto") return AllreduceAlgo::Auto;
  if (v == "ring") return AllreduceAlgo::Ring;
  if (v == "bcube") return AllreduceAlgo::Bcube;
  if (v == "ring_chunked") return AllreduceAlgo::RingChunked;
  return AllreduceAlgo::HalvingDoubling;
}

std::size_t sync_max_bytes_from_env() {
  constexpr auto kEvery = std::numeric_limits<std::size_t>::max();  // unset: every size (in chunks)
  return env::bytes("PHALANX_GLOO_SYNC_MAX_BYTES", kEvery, 0, kEvery);
}

}  // namespace

GlooOptions GlooOptions::from_env(int ranks_on_machine) {
  GlooOptions o;
  o.algo = algo_from_env();
  o.sync_max_bytes = sync_max_bytes_from_env();
  o.sync_chunk_bytes = env::bytes("PHALANX_GLOO_SYNC_CHUNK_BYTES", o.sync_chunk_bytes, 0, std::size_t(1) << 40);
  // Spinning pairs on more ranks than cores take turns on them: every message then waits a
  // scheduler slice (two launchers of 2 workers on 2 cores: 200x slower than blocking).
  o.busy_poll = env::flag("PHALANX_GLOO_BUSY_POLL", ranks_on_machine <= usable_cores());
  return o;
}

}  // namespace phalanx::gloo_backend
