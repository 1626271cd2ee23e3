#pragma once
// NumPy .npy and .npz files. Reads float32/float64 (as float32) and int64/int32/uint8
// (as int64), C order; writes float32 and int64. .npz archives are NumPy's zip (stored or
// deflated), so `np.savez("w.npz", **{k: v.numpy() for k, v in sd.items()})` loads here.
//
// load_npy memory-maps a file whose data can be used as stored (<f4 or <i8, C order, data
// offset a multiple of 64 as NumPy writes it, at least kNpyMapMinBytes of data): the
// tensor's pages are then the host's page cache, shared by every process that loads the
// file, and a write to the tensor copies the page it touches, never changing the file (see
// Storage::map_file). Other layouts are read and converted into private memory. Replace a
// mapped file by writing a new one and renaming it (as save_npy does); truncating it in
// place while a process maps it makes that process fault (np.save(path) truncates: save to
// a temporary name and os.replace it). PHALANX_MMAP=0 turns mapping off (private copies).
#include <cstddef>
#include <cstdint>
#include <string>

#include "phalanx/core/tensor.hpp"
#include "phalanx/core/tensor_map.hpp"

namespace phalanx {

Tensor load_npy(const std::string& path);
struct NpyLoadInfo {
  bool mapped = false;  ///< the tensor is a copy-on-write mapping of the file
};
Tensor load_npy(const std::string& path, NpyLoadInfo* info);
/// Arrays with less data than this are read, not mapped (a mapping costs whole pages).
inline constexpr std::size_t kNpyMapMinBytes = std::size_t(1) << 20;
void save_npy(const std::string& path, const Tensor& t);
/// Decodes an in-memory .npy image; `what` names it in errors.
Tensor parse_npy(const void* bytes, std::size_t size, const std::string& what);
std::string serialize_npy(const Tensor& t);

/// Verifies every member's CRC-32, and for a file Phalanx wrote the CRC-32 of the whole
/// file; a damaged file is an IoError naming the file (and the member).
TensorMap load_npz(const std::string& path);
struct NpzReadInfo {
  bool file_checksum = false;  ///< the file carried (and passed) Phalanx's whole-file CRC-32
};
TensorMap load_npz(const std::string& path, NpzReadInfo* info);
/// Writes atomically and durably: a temporary file, fsync, renamed into place, fsync of the
/// directory. A crash leaves either the old file or the new one, never a mix. The archive
/// comment (ignored by numpy) holds a CRC-32 of every byte before it. The temporary file is
/// a new one (never an existing name or a symbolic link); the file gets `mode` less the
/// umask (0666: as other programs' files; checkpoints pass files::private_file_mode()).
void save_npz(const std::string& path, const TensorMap& tensors);
void save_npz(const std::string& path, const TensorMap& tensors, unsigned mode);

/// CRC-32 (zip/zlib polynomial); `crc` continues a running value.
std::uint32_t crc32(const void* data, std::size_t size, std::uint32_t crc = 0);

}  // namespace phalanx
