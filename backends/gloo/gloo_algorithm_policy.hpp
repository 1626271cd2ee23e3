#pragma once
// Which allreduce the Gloo backend runs for a message (docs/algorithms.md), decided from
// the options, whether the busy-polling mesh exists, the dtype and the size alone.
#include <cstddef>

#include "gloo_options.hpp"
#include "phalanx/core/dtype.hpp"

namespace phalanx::gloo_backend {

enum class AllreducePath {
  Generic16,            ///< float16/bfloat16: gloo::allreduce with our widening sum
  SyncHalvingDoubling,  ///< halving-doubling on the busy-polling mesh, in pieces
  RingChunked,          ///< gloo::AllreduceRingChunked on the event-driven mesh
  HalvingDoubling,      ///< gloo::AllreduceHalvingDoubling on the event-driven mesh
  Ring,                 ///< gloo::allreduce(RING) on the event-driven mesh
  Bcube,                ///< gloo::allreduce(BCUBE) on the event-driven mesh
};

/// `sync_mesh`: the busy-polling mesh was built (sync_max_bytes > 0, more than one rank).
AllreducePath choose_allreduce(const GlooOptions& options, bool sync_mesh, DType dtype, std::size_t bytes);

/// Elements per piece on the busy-polling mesh (every rank cuts a message alike).
std::size_t sync_chunk_elems(const GlooOptions& options, std::size_t element_bytes);

}  // namespace phalanx::gloo_backend
