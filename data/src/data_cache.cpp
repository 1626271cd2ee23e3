#include "phalanx/data/data_cache.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <vector>

#include "phalanx/core/env.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/file_safety.hpp"
#include "phalanx/core/tensor_impl.hpp"

namespace phalanx::samplers {

namespace {

constexpr std::size_t kHeaderBytes = 4096;  // the data starts here (page and SIMD aligned)
constexpr const char* kMagic = "PHALANX-DATA-CACHE 1\n";

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

std::uint32_t crc(const void* p, std::size_t n, std::uint32_t c = 0) {
  const auto* b = static_cast<const Bytef*>(p);
  while (n > 0) {
    const auto piece = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    c = static_cast<std::uint32_t>(::crc32(c, b, piece));
    b += piece;
    n -= piece;
  }
  return c;
}

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

std::string hex(std::uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

// What identifies the source's version: its size and two checksums of its bytes (CRC-32 and
// Adler-32). Not its mtime: identical copies (another host's, a fresh download) share entries.
struct SourceKey {
  long long size = 0;
  std::uint32_t crc = 0, adler = 1;
  std::string str() const { return detail::concat(size, ' ', crc, ' ', adler); }
};

SourceKey source_key(const std::string& path) {
  Fd f(files::open_regular(path));  // /dev/zero or a FIFO would be read without end
  SourceKey k;
  std::vector<unsigned char> buf(1 << 20);
  for (;;) {
    const ssize_t r = ::read(f.fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw IoError(path + ": read failed (" + std::strerror(errno) + ")");
    if (r == 0) break;
    k.size += r;
    k.crc = crc(buf.data(), static_cast<std::size_t>(r), k.crc);
    k.adler = static_cast<std::uint32_t>(::adler32(k.adler, buf.data(), static_cast<uInt>(r)));
  }
  return k;
}

const char* dtype_tag(DType d) { return d == DType::Float32 ? "f32" : "i64"; }

std::string header_text(const std::string& key_line, DType dtype, const Shape& shape, std::uint32_t data_crc) {
  std::string s = kMagic;
  s += "key " + key_line + "\n";
  s += std::string("dtype ") + dtype_tag(dtype) + "\n";
  s += "shape";
  for (auto d : shape) s += detail::concat(' ', d);
  s += detail::concat("\ndata-crc32 ", data_crc, "\n");
  s += detail::concat("header-crc32 ", crc(s.data(), s.size()), "\n");
  return s;
}

// The cache file's shape, if its header is intact and carries `key_line` and `dtype`.
bool read_header(int fd, const std::string& key_line, DType dtype, Shape& shape, std::uint32_t& data_crc) {
  std::string h(kHeaderBytes, '\0');
  if (::pread(fd, &h[0], kHeaderBytes, 0) != static_cast<ssize_t>(kHeaderBytes)) return false;
  h.resize(std::strlen(h.c_str()));
  const auto tail = h.rfind("header-crc32 ");
  if (h.rfind(kMagic, 0) != 0 || tail == std::string::npos) return false;
  if (std::strtoul(h.c_str() + tail + 13, nullptr, 10) != crc(h.data(), tail)) return false;
  std::istringstream in(h.substr(std::strlen(kMagic)));
  std::string line, word;
  std::getline(in, line);
  if (line != "key " + key_line) return false;
  std::getline(in, line);
  if (line != std::string("dtype ") + dtype_tag(dtype)) return false;
  std::getline(in, line);
  std::istringstream sl(line);
  sl >> word;
  if (word != "shape") return false;
  shape.clear();
  for (long long d; sl >> d;) {
    if (d < 0) return false;
    shape.push_back(d);
  }
  in >> word >> data_crc;
  return word == "data-crc32";
}

enum class Entry { ok, missing, damaged, foreign };

// The entry open on `fd`, checked (owner, header, size, data checksum) and mapped.
Tensor map_entry(int fd, const std::string& path, const std::string& key_line, DType dtype, Entry& state) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    state = Entry::damaged;
    return {};
  }
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
    state = Entry::foreign;
    return {};
  }
  Shape shape;
  std::uint32_t want = 0;
  const bool header_ok = read_header(fd, key_line, dtype, shape, want);
  const std::size_t nbytes = header_ok ? static_cast<std::size_t>(numel_of(shape)) * element_size(dtype) : 0;
  if (!header_ok || static_cast<std::size_t>(st.st_size) != kHeaderBytes + nbytes) {
    state = Entry::damaged;
    return {};
  }
  auto storage = Storage::map_fd(fd, path, kHeaderBytes, nbytes);
  if (crc(storage->data(), nbytes) != want) {  // reads the shared pages; copies nothing
    state = Entry::damaged;
    return {};
  }
  state = Entry::ok;
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), 0, shape, dtype));
}

// The mapped entry; `state` says why there is none: missing (or removed while opening),
// damaged (or for another key), or foreign (owned by another user, or not a regular file).
// The descriptor opened and checked is the one mapped, so a concurrent rename or unlink of
// the path cannot make this fail.
Tensor open_entry(const std::string& path, const std::string& key_line, DType dtype, Entry& state) {
  state = Entry::missing;
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (f.fd < 0) {
    if (errno == ENOENT) return {};
    state = errno == ELOOP ? Entry::foreign : Entry::damaged;  // a symlink is not ours to follow
    return {};
  }
  return map_entry(f.fd, path, key_line, dtype, state);
}

// A failure to write the cache (disk full, quota, file size limit), as opposed to bad data.
struct CacheWriteError : IoError {
  using IoError::IoError;
};

// Writes the array to a file descriptor after the header's room, computing its CRC-32.
class FileSink : public CacheSink {
 public:
  FileSink(int fd, std::string what, DType dtype) : fd_(fd), what_(std::move(what)), dtype_(dtype) {}
  void begin(const Shape& shape) override {
    shape_ = shape;
    begun_ = true;
  }
  void write(const void* bytes, std::size_t n) override {
    if (!begun_) throw ValueError("data cache: the producer wrote before begin()");
    data_crc_ = crc(bytes, n, data_crc_);
    const auto* p = static_cast<const char*>(bytes);
    while (n > 0) {
      const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(kHeaderBytes + written_));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) throw CacheWriteError(what_ + ": write failed (" + std::strerror(errno) + ")");
      p += w;
      n -= static_cast<std::size_t>(w);
      written_ += static_cast<std::size_t>(w);
    }
  }
  void finish(const std::string& key_line) {
    const std::size_t want = static_cast<std::size_t>(numel_of(shape_)) * element_size(dtype_);
    if (!begun_ || written_ != want)
      throw ValueError(detail::concat("data cache: the producer wrote ", written_, " bytes for ", shape_str(shape_),
                                      " (", want, " expected)"));
    std::string h = header_text(key_line, dtype_, shape_, data_crc_);
    if (h.size() >= kHeaderBytes) throw ValueError("data cache: the entry's key is too long");
    h.resize(kHeaderBytes, '\0');
    if (::pwrite(fd_, h.data(), h.size(), 0) != static_cast<ssize_t>(h.size()) || ::fsync(fd_) != 0)
      throw CacheWriteError(what_ + ": write failed (" + std::strerror(errno) + ")");
  }

 private:
  int fd_;
  std::string what_;
  DType dtype_;
  Shape shape_;
  bool begun_ = false;
  std::size_t written_ = 0;
  std::uint32_t data_crc_ = 0;
};

// Private memory, for when the cache is off or unusable.
class TensorSink : public CacheSink {
 public:
  explicit TensorSink(DType dtype) : dtype_(dtype) {}
  void begin(const Shape& shape) override { t_ = Tensor::empty(shape, dtype_); }
  void write(const void* bytes, std::size_t n) override {
    if (!t_.defined() || at_ + n > t_.nbytes()) throw ValueError("data cache: the producer wrote more than its shape holds");
    std::memcpy(static_cast<char*>(t_.raw_data()) + at_, bytes, n);
    at_ += n;
  }
  Tensor finish() {
    if (!t_.defined() || at_ != t_.nbytes()) throw ValueError("data cache: the producer wrote less than its shape holds");
    return t_;
  }

 private:
  DType dtype_;
  Tensor t_;
  std::size_t at_ = 0;
};

Tensor produce_private(DType dtype, const CacheProducer& produce) {
  TensorSink sink(dtype);
  produce(sink);
  return sink.finish();
}

// Why the cache folder cannot be used ("" when it can): it cannot be made or written, or
// another user could plant or swap its entries.
std::string cache_dir_refusal(const std::string& dir) {
  try {
    files::make_folders(dir, files::private_folder_mode(), "data cache");
  } catch (const IoError& e) {
    return std::string(e.what()) + " (set PHALANX_DATA_CACHE to a writable directory, or to 'off')";
  }
  if (::access(dir.c_str(), W_OK) != 0)
    return "data cache " + dir + " is not writable (set PHALANX_DATA_CACHE to a writable directory, or to 'off')";
  return files::folder_refusal(dir, "data cache");
}

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The source's canonical path (symlinks and ".." resolved), or the path as given.
std::string real_path(const std::string& path) {
  std::unique_ptr<char, void (*)(void*)> r(::realpath(path.c_str(), nullptr), std::free);
  return r ? std::string(r.get()) : path;
}

// Unlinks the files in `dir` whose names start with `prefix`, except `keep`, that end in
// `suffix` (empty: any).
void remove_prefixed(const std::string& dir, const std::string& prefix, const std::string& keep,
                     const std::string& suffix) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) return;
  std::vector<std::string> doomed;
  while (dirent* e = ::readdir(d.get())) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) == 0 && name != keep && name.size() >= prefix.size() + suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      doomed.push_back(name);
  }
  for (const auto& name : doomed) ::unlink((dir + "/" + name).c_str());  // mappers keep their pages
}

void warn_foreign(const std::string& path, const std::string& source) {
  std::fprintf(stderr, "phalanx: data cache entry %s is not a file owned by this user; loading %s into private "
               "memory (remove it, or set PHALANX_DATA_CACHE to a directory of your own)\n", path.c_str(),
               source.c_str());
}

}  // namespace

std::string data_cache_dir() {
  if (const auto d = env::path("PHALANX_DATA_CACHE")) return *d == "off" ? std::string() : *d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/phalanx";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/phalanx";
  return {};
}

Tensor cached_array(const std::string& source, const std::string& transform, DType dtype,
                    const CacheProducer& produce, CacheInfo* info) {
  if (dtype != DType::Float32 && dtype != DType::Int64)
    throw TypeError("data cache: arrays must be float32 or int64");
  CacheInfo local;
  CacheInfo& in = info ? *info : local;
  in = CacheInfo{};
  const std::string dir = data_cache_dir();
  if (dir.empty()) {
    in.built = true;
    return produce_private(dtype, produce);
  }
  if (const std::string refusal = cache_dir_refusal(dir); !refusal.empty()) {
    std::fprintf(stderr, "phalanx: %s; loading %s into private memory\n", refusal.c_str(), source.c_str());
    in.built = true;
    return produce_private(dtype, produce);
  }
  const SourceKey key = source_key(source);
  const std::string key_line = key.str() + " " + transform;
  // The prefix names one source file (by its real path) and one transform: entries for
  // other versions of that file are replaced, entries of any other file are never touched.
  const std::string prefix = base_name(source) + "." + hex(fnv1a(real_path(source))).substr(0, 8) + "." +
                             hex(fnv1a(transform)).substr(0, 8) + ".";
  const std::string name = prefix + hex(fnv1a(key_line)) + ".phxc";
  const std::string path = dir + "/" + name;
  in.path = path;

  Entry state = Entry::missing;
  if (Tensor t = open_entry(path, key_line, dtype, state); t.defined()) {
    in.mapped = true;
    return t;
  }
  if (state == Entry::foreign) {
    warn_foreign(path, source);
    in.built = true;
    return produce_private(dtype, produce);
  }
  // Build under an exclusive lock: the others wait here (asleep in flock), then map the entry.
  int lock_fd = -1;
  try {
    lock_fd = files::open_lock_file(path + ".lock", files::private_file_mode());  // never through a link
  } catch (const IoError& e) {
    std::fprintf(stderr, "phalanx: data cache: %s; loading %s into private memory\n", e.what(), source.c_str());
    in.built = true;
    return produce_private(dtype, produce);
  }
  Fd lock(lock_fd);
  while (::flock(lock.fd, LOCK_EX) != 0)
    if (errno != EINTR) throw IoError(path + ".lock: cannot lock (" + std::strerror(errno) + ")");
  if (Tensor t = open_entry(path, key_line, dtype, state); t.defined()) {
    in.mapped = true;
    return t;  // another process built it while this one waited
  }
  if (state == Entry::foreign) {
    warn_foreign(path, source);
    in.built = true;
    return produce_private(dtype, produce);
  }
  in.rebuilt_damaged = state == Entry::damaged;
  // Holding the lock, no one else writes this entry: temporaries left here were orphaned
  // by builders that died (killed mid-build).
  remove_prefixed(dir, name + ".tmp.", std::string(), std::string());
  std::string tmp, create_error;
  int out_fd = -1;
  try {
    out_fd = files::create_temp(path, files::private_file_mode(), tmp);  // a new file: never a planted name
  } catch (const IoError& e) {
    create_error = e.what();
  }
  Fd out(out_fd);
  {
    FileSink sink(out.fd, tmp, dtype);
    try {
      if (out.fd < 0) throw CacheWriteError(create_error);
      produce(sink);
      sink.finish(key_line);
    } catch (const CacheWriteError& e) {  // the disk, not the data: train from private memory
      ::unlink(tmp.c_str());
      std::fprintf(stderr, "phalanx: cannot write the data cache (%s); loading %s into private memory\n", e.what(),
                   source.c_str());
      in.built = true;
      return produce_private(dtype, produce);
    } catch (...) {
      ::unlink(tmp.c_str());
      throw;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw IoError(path + ": rename failed (" + std::strerror(errno) + ")");
  }
  in.built = true;
  remove_prefixed(dir, prefix, name, ".phxc");  // older versions of this source
  // Mapped from the descriptor written: what a concurrent cleaner does to the path is moot.
  Tensor t = map_entry(out.fd, path, key_line, dtype, state);
  if (!t.defined()) throw IoError(path + ": the entry just written does not verify (is the disk full or failing?)");
  in.mapped = true;
  return t;
}

}  // namespace phalanx::samplers
