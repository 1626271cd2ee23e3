#pragma once
// A per-host cache of arrays derived from source files (decompressed, converted), so every
// process on the host maps one copy instead of building its own: a cache file is built
// once (concurrent processes wait for one writer under flock), written under a temporary
// name and renamed into place, and then memory-mapped copy-on-write (Storage::map_file).
//
// Location: $PHALANX_DATA_CACHE, else $XDG_CACHE_HOME/phalanx, else $HOME/.cache/phalanx;
// PHALANX_DATA_CACHE=off builds every array in private memory (no cache). The directory can
// be cleared at any time (running processes keep their mappings).
//
// An entry is keyed by the source's size and checksums of its bytes (CRC-32, Adler-32; not
// its mtime, so identical copies share an entry) and by the transformation's name; its
// header also records the CRC-32 of the data, checked on every load (one read pass over the
// mapping): a damaged entry is rebuilt. Entries of one source file (by its real path) and
// transform replace each other's older versions; other files' entries are never removed, so
// same-named sources (MNIST and Fashion-MNIST) coexist. A builder killed mid-build leaves a
// temporary that the next builder of that entry removes. An entry not owned by the current
// user (or a symlink) is never used: the array goes to private memory with a warning.
#include <cstddef>
#include <functional>
#include <string>

#include "phalanx/core/tensor.hpp"

namespace phalanx::samplers {

/// Receives a cached array: its shape once, then its bytes in order (exactly
/// numel * element size in all, in as many pieces as convenient).
class CacheSink {
 public:
  virtual ~CacheSink() = default;
  virtual void begin(const Shape& shape) = 0;
  virtual void write(const void* bytes, std::size_t n) = 0;
};

/// Produces the array from the source (reads the source itself).
using CacheProducer = std::function<void(CacheSink&)>;

struct CacheInfo {
  bool mapped = false;  ///< the result maps a cache file (false: private memory, cache off or unusable)
  bool built = false;   ///< this call ran the producer
  bool rebuilt_damaged = false;  ///< an entry existed with the right key but failed its checksum
  std::string path;     ///< the cache file (when mapped)
};

/// The cache directory (see above); empty when the cache is off.
std::string data_cache_dir();

/// The array `transform` makes of the file `source`, of dtype Float32 or Int64, from the
/// cache, building it with `produce` when the cache has no valid entry. Where the cache
/// cannot be used (off; the directory is not writable, or writing the entry fails, e.g. a
/// full disk: a one-line warning on stderr), the array is produced into private memory.
/// Errors of the producer (a corrupt source) propagate, and nothing is cached.
Tensor cached_array(const std::string& source, const std::string& transform, DType dtype,
                    const CacheProducer& produce, CacheInfo* info = nullptr);

}  // namespace phalanx::samplers
