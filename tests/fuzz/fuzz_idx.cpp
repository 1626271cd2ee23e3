// Fuzzes the IDX reader (load_idx, zlib's gzread over plain or gzip files) through a scratch
// file. The first input byte picks the encoding: odd = the harness gzips the rest itself (so
// mutations reach the IDX parser behind a valid gzip stream), even = the rest is written as
// is (plain IDX files, and hand-made or damaged .gz files). An accepted file must hold
// exactly the promised number of values, each a byte; when the harness knows the
// uncompressed bytes, the values must be exactly those bytes.
#include <zlib.h>

#include <vector>

#include "fuzz_support.hpp"
#include "phalanx/data/idx.hpp"

namespace {

std::vector<unsigned char> gzip(const std::uint8_t* data, std::size_t size) {
  z_stream z{};
  if (deflateInit2(&z, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) std::abort();
  std::vector<unsigned char> out(deflateBound(&z, size));
  z.next_in = const_cast<Bytef*>(data);
  z.avail_in = static_cast<uInt>(size);
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) std::abort();
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static phalanx::fuzz::ScratchFile file(".gz");
  if (size == 0) return 0;
  const bool compress = data[0] & 1;
  ++data;
  --size;
  // The uncompressed file, unless the input is itself a gzip stream (gzread decodes those).
  const bool known = compress || size < 2 || data[0] != 0x1f || data[1] != 0x8b;
  return phalanx::fuzz::guarded([&] {
    std::string path;
    if (compress) {
      const std::vector<unsigned char> gz = gzip(data, size);
      path = file.write(gz.data(), gz.size());
    } else {
      path = file.write(data, size);
    }
    const phalanx::Tensor t = phalanx::samplers::load_idx(path);
    phalanx::fuzz::require(t.dtype() == phalanx::DType::Int64 && t.dim() >= 1 && t.dim() <= 4,
                           "an IDX tensor is int64 with 1 to 4 dimensions");
    const auto* v = t.data<std::int64_t>();
    for (std::int64_t i = 0; i < t.numel(); ++i)
      phalanx::fuzz::require(v[i] >= 0 && v[i] <= 255, "IDX values are unsigned bytes");
    if (known) {
      const std::size_t header = 4 + 4 * static_cast<std::size_t>(t.dim());
      phalanx::fuzz::require(size == header + static_cast<std::size_t>(t.numel()),
                             "the file holds exactly the header and the promised values");
      for (std::int64_t i = 0; i < t.numel(); ++i)
        phalanx::fuzz::require(v[i] == data[header + i], "the values are the file's bytes");
    }
  });
}
