// Fuzzes the .npz reader (load_npz: libzip, then parse_npy per member) through a scratch
// file. An accepted archive must survive a round trip through save_npz.
#include <cstring>

#include "fuzz_support.hpp"
#include "phalanx/core/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static phalanx::fuzz::ScratchFile in(".npz"), out(".npz");
  return phalanx::fuzz::guarded([&] {
    const phalanx::TensorMap m = phalanx::load_npz(in.write(data, size));
    phalanx::save_npz(out.path(), m);
    const phalanx::TensorMap back = phalanx::load_npz(out.path());
    phalanx::fuzz::require(back.names() == m.names(), "round trip keeps the member names and order");
    for (const auto& [name, t] : m) {
      const phalanx::Tensor& u = back.at(name);
      phalanx::fuzz::require(u.dtype() == t.dtype() && u.shape() == t.shape() && u.nbytes() == t.nbytes() &&
                                 std::memcmp(u.raw_data(), t.raw_data(), t.nbytes()) == 0,
                             "round trip keeps every member's dtype, shape and bytes");
    }
  });
}
