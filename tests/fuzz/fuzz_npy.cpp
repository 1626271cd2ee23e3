// Fuzzes the .npy reader (parse_npy, which load_npy calls on a file's bytes). An accepted
// input must survive a round trip: serialize_npy(t) parses back to the same dtype, shape and
// bytes.
#include <cstring>

#include "fuzz_support.hpp"
#include "phalanx/core/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return phalanx::fuzz::guarded([&] {
    const phalanx::Tensor t = phalanx::parse_npy(data, size, "fuzz.npy");
    const std::string again = phalanx::serialize_npy(t);
    const phalanx::Tensor u = phalanx::parse_npy(again.data(), again.size(), "fuzz.npy (re-serialized)");
    phalanx::fuzz::require(u.dtype() == t.dtype() && u.shape() == t.shape(), "round trip keeps dtype and shape");
    phalanx::fuzz::require(u.nbytes() == t.nbytes() &&
                               std::memcmp(u.raw_data(), t.raw_data(), t.nbytes()) == 0,
                           "round trip keeps the bytes");
  });
}
