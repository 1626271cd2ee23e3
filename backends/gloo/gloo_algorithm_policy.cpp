#include "gloo_algorithm_policy.hpp"

#include <algorithm>

namespace phalanx::gloo_backend {

AllreducePath choose_allreduce(const GlooOptions& o, bool sync_mesh, DType dtype, std::size_t bytes) {
  // Gloo's class algorithms know no bfloat16: the generic allreduce with our own reduction.
  if (dtype == DType::Float16 || dtype == DType::BFloat16) return AllreducePath::Generic16;
  switch (o.algo) {
    case AllreduceAlgo::Auto:
      // Measured on 2 ranks over loopback (docs/algorithms.md): small messages go to
      // halving-doubling on the busy-polling mesh, larger ones to gloo::allreduce's ring.
      return sync_mesh && bytes <= o.sync_max_bytes ? AllreducePath::SyncHalvingDoubling : AllreducePath::Ring;
    case AllreduceAlgo::Ring: return AllreducePath::Ring;
    case AllreduceAlgo::Bcube: return AllreducePath::Bcube;
    case AllreduceAlgo::RingChunked: return AllreducePath::RingChunked;
    case AllreduceAlgo::HalvingDoubling: return AllreducePath::HalvingDoubling;
  }
  return AllreducePath::Ring;
}

std::size_t sync_chunk_elems(const GlooOptions& o, std::size_t element_bytes) {
  // Halving-doubling's bandwidth drops on messages much larger than a few MiB (its temporary
  // buffers, the page faults on them), so a large message goes as mid-sized pieces.
  return std::max<std::size_t>(1, o.sync_chunk_bytes / element_bytes);
}

}  // namespace phalanx::gloo_backend
