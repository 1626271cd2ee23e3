// Fuzzes the checkpoint loader (parallel::load_checkpoint: the .npz with its whole-file and
// member CRC-32s, the content checksum, the manifest and the member layout). The first input
// byte picks how the rest becomes a file:
//  - even: the rest is the file, as is (damaged archives, truncations, flipped bytes);
//  - odd: the rest is a list of members, each [u8 name length][name][u32 length][.npy
//    image], saved with save_npz (so the CRCs are right and the mutations reach the
//    manifest and layout checks); with bit 1 set the harness also stores the right content
//    checksum, so the checks after it are reached too.
// Bits 2-3 choose an expectation (world size 2, global batch 64) to check against. An
// accepted checkpoint must survive save_checkpoint + load_checkpoint unchanged.
// Seeds: tests/fuzz/corpus/checkpoint/, written by tests/fuzz/make_checkpoint_seeds.cpp.
#include <cstring>

#include "fuzz_support.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/npy.hpp"
#include "phalanx/parallel/checkpoint.hpp"

namespace {

using phalanx::TensorMap;

TensorMap members(const std::uint8_t* p, std::size_t n) {
  TensorMap m;
  while (n > 0) {
    const std::size_t len = p[0];
    if (1 + len + 4 > n) break;
    const std::string name(reinterpret_cast<const char*>(p + 1), len);
    p += 1 + len;
    n -= 1 + len;
    std::uint32_t size;
    std::memcpy(&size, p, 4);
    p += 4;
    n -= 4;
    const std::size_t take = size < n ? size : n;
    m.set(name, phalanx::parse_npy(p, take, name));
    p += take;
    n -= take;
  }
  return m;
}

bool same(const TensorMap& a, const TensorMap& b) {
  if (a.names() != b.names()) return false;
  for (const auto& [k, t] : a) {
    const phalanx::Tensor& u = b.at(k);
    if (u.dtype() != t.dtype() || u.shape() != t.shape() || std::memcmp(u.raw_data(), t.raw_data(), t.nbytes()) != 0)
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static phalanx::fuzz::ScratchFile in(".npz"), out(".npz");
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  ++data;
  --size;
  return phalanx::fuzz::guarded([&] {
    if (mode & 1) {
      TensorMap m = members(data, size);
      if (mode & 2) {
        const auto sum = static_cast<std::int64_t>(phalanx::parallel::content_checksum(m));
        m.set("manifest.checksum", phalanx::tensor(std::vector<std::int64_t>{sum}, {}));
      }
      phalanx::save_npz(in.path(), m);
    } else {
      in.write(data, size);
    }
    phalanx::parallel::CheckpointExpect expect;
    expect.world_size = mode & 4 ? 2 : phalanx::parallel::kAnyWorld;
    if (mode & 8) expect.global_batch = 64;
    const auto ck = phalanx::parallel::load_checkpoint(in.path(), expect);
    phalanx::fuzz::require(ck.state.step >= 0 && ck.state.epoch >= 0 && ck.state.step_in_epoch >= 0 &&
                               ck.state.world_size >= 1,
                           "an accepted checkpoint has a possible position");
    phalanx::parallel::save_checkpoint(out.path(), ck.state);
    const auto back = phalanx::parallel::load_checkpoint(out.path(), expect);
    const auto& s = ck.state;
    const auto& t = back.state;
    bool scalars = s.scalars.size() == t.scalars.size();
    for (const auto& [k, v] : s.scalars)
      scalars = scalars && t.scalars.count(k) && std::memcmp(&v, &t.scalars.at(k), sizeof v) == 0;
    bool rngs = s.generators.size() == t.generators.size();
    for (const auto& [k, g] : s.generators)
      rngs = rngs && t.generators.count(k) && t.generators.at(k).state == g.state && t.generators.at(k).inc == g.inc &&
             t.generators.at(k).has_spare == g.has_spare && std::memcmp(&t.generators.at(k).spare, &g.spare, 4) == 0;
    phalanx::fuzz::require(t.step == s.step && t.epoch == s.epoch && t.step_in_epoch == s.step_in_epoch &&
                               t.world_size == s.world_size && t.global_batch == s.global_batch &&
                               t.micro_batch == s.micro_batch && same(s.model, t.model) &&
                               same(s.optimizer, t.optimizer) && same(s.scheduler, t.scheduler) &&
                               same(s.user, t.user) && scalars && rngs,
                           "an accepted checkpoint survives save_checkpoint + load_checkpoint unchanged");
  });
}
