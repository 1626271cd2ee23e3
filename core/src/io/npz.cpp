// .npz: a zip of .npy members named "<key>.npy", read and written through libzip.
// Reading verifies every member's CRC-32 (as numpy does); writing is durable: a temporary
// file, fsync, rename into place, fsync of the directory.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "phalanx/core/file_safety.hpp"
#include "phalanx/core/npy.hpp"

namespace phalanx {

namespace {
struct ZipCloser {
  void operator()(zip_t* z) const { zip_discard(z); }
};

std::string hex32(std::uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

// fsync of a file or directory; throws with the path on failure.
void sync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw IoError(path + ": cannot open to sync (" + std::strerror(errno) + ")");
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  // Some file systems do not sync directories (EINVAL); the rename is still atomic there.
  if (rc != 0 && !(directory && (e == EINVAL || e == EROFS)))
    throw IoError(path + ": fsync failed (" + std::strerror(e) + ")");
}

constexpr const char* kFileTag = "phalanx-file-crc32:";

// Replaces the placeholder at the end of the file with the CRC-32 of everything before it.
void seal(const std::string& path, const std::string& placeholder) {
  const int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  std::FILE* fp = fd < 0 ? nullptr : ::fdopen(fd, "r+b");
  if (!fp) {
    const int e = errno;
    if (fd >= 0) ::close(fd);
    throw IoError(path + ": cannot reopen to seal (" + std::strerror(e) + ")");
  }
  std::uint32_t crc = 0;
  std::string tail;
  char chunk[1 << 16];
  std::size_t got;
  while ((got = std::fread(chunk, 1, sizeof chunk, fp)) > 0) {
    tail.append(chunk, got);
    if (tail.size() > placeholder.size() + sizeof chunk) {
      const std::size_t keep = placeholder.size();
      crc = crc32(tail.data(), tail.size() - keep, crc);
      tail.erase(0, tail.size() - keep);
    }
  }
  bool ok = !std::ferror(fp) && tail.size() >= placeholder.size() &&
            tail.compare(tail.size() - placeholder.size(), placeholder.size(), placeholder) == 0;
  if (ok) {
    crc = crc32(tail.data(), tail.size() - 8, crc);
    const std::string h = hex32(crc);
    ok = std::fseek(fp, -8, SEEK_END) == 0 && std::fwrite(h.data(), 1, 8, fp) == 8;
  }
  ok = std::fclose(fp) == 0 && ok;
  if (!ok) throw IoError(path + ": cannot seal the file with its checksum");
}

std::string dir_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}
}  // namespace

// CRC-32 by slicing-by-8 (eight table lookups per 8 bytes; several times faster than a
// byte at a time): checkpoints are verified on every load.
std::uint32_t crc32(const void* data, std::size_t size, std::uint32_t crc) {
  using Tables = std::array<std::array<std::uint32_t, 256>, 8>;
  static const Tables t = [] {
    Tables x{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      x[0][i] = c;
    }
    for (std::uint32_t i = 0; i < 256; ++i)
      for (int k = 1; k < 8; ++k) x[k][i] = (x[k - 1][i] >> 8) ^ x[0][x[k - 1][i] & 0xff];
    return x;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (; size >= 8; size -= 8, p += 8) {
    const std::uint32_t lo = crc ^ (std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 |
                                    std::uint32_t(p[3]) << 24);
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^ t[3][p[4]] ^
          t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
  }
  for (; size > 0; --size, ++p) crc = t[0][(crc ^ *p) & 0xff] ^ (crc >> 8);
  return ~crc;
}

// The members of an in-memory archive; `check_members`: verify each member's CRC-32.
static TensorMap read_members(const std::string& bytes, const std::string& path, bool check_members) {
  zip_error_t ze;
  zip_error_init(&ze);
  zip_source_t* src = zip_source_buffer_create(bytes.data(), bytes.size(), 0, &ze);
  std::unique_ptr<zip_t, ZipCloser> z(src ? zip_open_from_source(src, ZIP_RDONLY, &ze) : nullptr);
  if (!z) {
    if (src) zip_source_free(src);
    std::string msg = path + ": cannot open as .npz (" + zip_error_strerror(&ze) + ")";
    zip_error_fini(&ze);
    throw IoError(msg);
  }
  zip_error_fini(&ze);
  TensorMap out;
  const zip_int64_t n = zip_get_num_entries(z.get(), 0);
  for (zip_int64_t i = 0; i < n; ++i) {
    zip_stat_t st;
    if (zip_stat_index(z.get(), i, 0, &st) != 0 || !(st.valid & ZIP_STAT_NAME) || !(st.valid & ZIP_STAT_SIZE))
      throw IoError(path + ": corrupt zip directory");
    std::string name = st.name;
    const std::string shown = detail::printable(name);  // a damaged name's bytes, escaped for a one-line message
    // A stored member is exactly its compressed size, a deflated one at most ~1032 times it
    // (and nothing is larger than ~1032 times the archive): checked before the buffer is made,
    // so a forged directory entry cannot make this allocate gigabytes.
    const bool has_comp = (st.valid & ZIP_STAT_COMP_SIZE) && (st.valid & ZIP_STAT_COMP_METHOD);
    const bool impossible = st.size > bytes.size() * 1100ull + (1u << 20) ||
                            (has_comp && st.comp_method == ZIP_CM_STORE && st.size != st.comp_size) ||
                            (has_comp && st.comp_method != ZIP_CM_STORE && st.size > st.comp_size * 1032ull + 1024);
    if (impossible)
      throw IoError(path + ": member '" + shown + "' claims an impossible size (" + std::to_string(st.size) + " bytes" +
                    (has_comp ? " from " + std::to_string(st.comp_size) + " stored" : std::string()) +
                    "): the file is damaged");
    zip_file_t* f = zip_fopen_index(z.get(), i, 0);
    if (!f) throw IoError(path + ": cannot read member '" + shown + "' (" + zip_strerror(z.get()) + ")");
    std::vector<char> buf(st.size);
    const zip_int64_t got = st.size ? zip_fread(f, buf.data(), st.size) : 0;
    zip_fclose(f);
    if (got != static_cast<zip_int64_t>(st.size))
      throw IoError(path + ": member '" + shown + "' is truncated or corrupt");
    if (check_members && (st.valid & ZIP_STAT_CRC)) {
      const std::uint32_t have = crc32(buf.data(), buf.size());
      if (have != st.crc)
        throw IoError(path + ": member '" + shown + "' fails its CRC-32 checksum (stored " + hex32(st.crc) +
                      ", computed " + hex32(have) + "): the file is damaged");
    }
    if (name.size() >= 4 && name.compare(name.size() - 4, 4, ".npy") == 0)
      name.resize(name.size() - 4);
    if (out.contains(name)) throw IoError(path + ": member '" + shown + "' appears twice");
    out.set(name, parse_npy(buf.data(), buf.size(), path + "[" + detail::printable(name) + "]"));
  }
  return out;
}

TensorMap load_npz(const std::string& path) { return load_npz(path, nullptr); }

TensorMap load_npz(const std::string& path, NpzReadInfo* info) {
  // The whole file is read once: its checksum is verified over exactly the bytes parsed.
  std::string bytes;
  {
    std::size_t size = 0;
    const int fd = files::open_regular(path, &size);  // /dev/zero or a FIFO would be read without end
    bytes.resize(size);
    std::size_t got = 0;
    while (got < size) {  // what the file held when opened, no more
      const ssize_t r = ::read(fd, &bytes[got], size - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        const int e = r < 0 ? errno : 0;
        ::close(fd);
        throw IoError(path + (e ? ": read failed (" + std::string(std::strerror(e)) + ")" : ": shrank while being read"));
      }
      got += static_cast<std::size_t>(r);
    }
    ::close(fd);
  }
  const std::size_t tag = std::strlen(kFileTag);
  const bool tagged = bytes.size() > tag + 8 && bytes.compare(bytes.size() - tag - 8, tag, kFileTag) == 0;
  if (info) info->file_checksum = tagged;
  // A file whose whole-file CRC-32 passes needs no member CRCs (they cover a subset of its
  // bytes); when it fails, the members are checked first so the message can name one.
  std::string stored_sum, computed_sum;
  if (tagged) {
    stored_sum = bytes.substr(bytes.size() - 8);
    computed_sum = hex32(crc32(bytes.data(), bytes.size() - 8));
  }
  const bool damaged = tagged && stored_sum != computed_sum;
  const std::string file_sum_error = path + ": file checksum mismatch (CRC-32 stored " + stored_sum + ", computed " +
                                     computed_sum + "): the file is damaged";
  if (!damaged) return read_members(bytes, path, /*check_members=*/!tagged);
  try {
    read_members(bytes, path, true);
  } catch (const IoError& e) {
    if (std::strstr(e.what(), "fails its CRC-32 checksum")) throw;  // names the damaged member
    throw IoError(file_sum_error + " (" + e.what() + ")");
  }
  throw IoError(file_sum_error);  // the members are sound: the damage is between them
}

void save_npz(const std::string& path, const TensorMap& tensors) { save_npz(path, tensors, 0666); }

void save_npz(const std::string& path, const TensorMap& tensors, unsigned mode) {
  // A new file of a unique name beside the target (never an existing name, never through a
  // link): two writers never share one, and a killed writer's leftover (path.tmp.XXXXXX) is
  // recognisable (CheckpointDir::lock removes them). libzip writes the archive to a file of
  // its own and renames it onto this one, keeping this one's mode.
  std::string tmp;
  ::close(files::create_temp(path, mode, tmp));
  int err = 0;
  zip_t* z = zip_open(tmp.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
  if (!z) {
    std::remove(tmp.c_str());
    throw IoError(path + ": cannot create");
  }
  std::vector<std::string> blobs;  // must outlive zip_close
  blobs.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    blobs.push_back(serialize_npy(t));
    zip_source_t* src = zip_source_buffer(z, blobs.back().data(), blobs.back().size(), 0);
    const zip_int64_t idx = src ? zip_file_add(z, (name + ".npy").c_str(), src, ZIP_FL_OVERWRITE) : -1;
    if (idx < 0) {
      if (src) zip_source_free(src);
      zip_discard(z);
      std::remove(tmp.c_str());
      throw IoError(path + ": cannot add member '" + name + "'");
    }
    zip_set_file_compression(z, idx, ZIP_CM_STORE, 0);  // like numpy.savez
    // A fixed member time (the DOS epoch's 1980-01-01 00:00), not the clock: the same tensors
    // give the same bytes (exact mode's runs on 1, 2 or 4 workers compare --save files by sha256).
    zip_file_set_dostime(z, idx, 0, (0 << 9) | (1 << 5) | 1, 0);
  }
  // The archive comment (the file's last bytes, ignored by numpy) carries a CRC-32 of every
  // byte before it: headers and directory included, so no flipped byte goes unnoticed.
  const std::string placeholder = std::string(kFileTag) + "00000000";
  zip_set_archive_comment(z, placeholder.data(), static_cast<zip_uint16_t>(placeholder.size()));
  if (zip_close(z) != 0) {
    std::string msg = path + ": write failed (" + zip_strerror(z) + ")";
    zip_discard(z);
    std::remove(tmp.c_str());
    throw IoError(msg);
  }
  try {
    seal(tmp, placeholder);
    sync_path(tmp, false);  // the content is on disk before the name points at it
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw IoError(path + ": rename failed (" + why + ")");
  }
  sync_path(dir_of(path), true);  // and the new name itself
}

}  // namespace phalanx
