// .npy format 1.0/2.0/3.0: magic, version, header length, a Python dict literal header
// ({'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }), then raw data.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include "phalanx/core/creation.hpp"
#include "phalanx/core/env.hpp"
#include "phalanx/core/file_safety.hpp"
#include "phalanx/core/npy.hpp"
#include "phalanx/core/tensor_impl.hpp"

namespace phalanx {

namespace {

// PHALANX_MMAP=0 (or off, false, no) reads every .npy into private memory: a snapshot that a
// later in-place rewrite of the file (np.save over the same path) cannot change or fault.
bool npy_mmap_enabled() { return env::flag("PHALANX_MMAP", true); }

[[noreturn]] void bad(const std::string& what, const std::string& why) {
  throw IoError(what + ": " + why);
}

std::string header_value(const std::string& header, const std::string& key, const std::string& what) {
  const auto pos = header.find("'" + key + "'");
  if (pos == std::string::npos) bad(what, "npy header has no '" + key + "' field");
  auto colon = header.find(':', pos);
  if (colon == std::string::npos) bad(what, "malformed npy header");
  auto start = header.find_first_not_of(' ', colon + 1);
  if (start == std::string::npos) bad(what, "malformed npy header");
  return header.substr(start);
}

Shape parse_shape(const std::string& rest, const std::string& what) {
  if (rest.empty() || rest[0] != '(') bad(what, "malformed shape in npy header");
  const auto close = rest.find(')');
  if (close == std::string::npos) bad(what, "malformed shape in npy header");
  Shape s;
  std::string inner = rest.substr(1, close - 1);
  std::stringstream ss(inner);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    const auto b = tok.find_first_not_of(' ');
    if (b == std::string::npos) continue;
    tok = tok.substr(b, tok.find_last_not_of(' ') - b + 1);
    if (tok.empty() || tok.find_first_not_of("0123456789") != std::string::npos)
      bad(what, "bad dimension '" + tok + "' in npy shape");
    errno = 0;
    const long long d = std::strtoll(tok.c_str(), nullptr, 10);
    if (errno == ERANGE)
      bad(what, "dimension " + std::to_string(s.size()) + " of the npy shape (" + tok + ") is out of range");
    s.push_back(d);
  }
  // The element count (times the widest element, 16 bytes) must fit: a shape whose product
  // overflows would otherwise wrap to a small or negative size.
  std::int64_t n = 1;
  for (std::size_t i = 0; i < s.size(); ++i)
    if (s[i] != 0 && n > (std::numeric_limits<std::int64_t>::max() / 16) / s[i])
      bad(what, "npy shape " + shape_str(s) + " is too large (its element count overflows at dimension " +
                    std::to_string(i) + ")");
    else
      n *= s[i];
  return s;
}

// The header of an .npy image: where the data starts and what it holds.
struct NpyHeader {
  std::string descr;
  Shape shape;
  std::int64_t numel = 0;
  std::size_t data_offset = 0;
};

// `size` may be just the first bytes of a file (at least the header); data is not checked.
NpyHeader parse_npy_header(const unsigned char* p, std::size_t size, const std::string& what) {
  if (size < 10 || std::memcmp(p, "\x93NUMPY", 6) != 0) bad(what, "not an .npy file (bad magic)");
  const int major = p[6];
  std::size_t hlen, hstart;
  if (major == 1) {
    hlen = p[8] | (p[9] << 8);
    hstart = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) bad(what, "truncated npy header");
    hlen = p[8] | (p[9] << 8) | (p[10] << 16) | (static_cast<std::size_t>(p[11]) << 24);
    hstart = 12;
  } else {
    bad(what, "unsupported npy version " + std::to_string(major));
  }
  if (hstart + hlen > size) bad(what, "truncated npy header");
  const std::string header(reinterpret_cast<const char*>(p + hstart), hlen);
  const std::string descr_raw = header_value(header, "descr", what);
  if (descr_raw.size() < 2 || descr_raw[0] != '\'') bad(what, "malformed descr in npy header");
  NpyHeader h;
  h.descr = descr_raw.substr(1, descr_raw.find('\'', 1) - 1);
  if (header_value(header, "fortran_order", what).rfind("True", 0) == 0)
    bad(what, "Fortran-order arrays are not supported; save with np.ascontiguousarray");
  h.shape = parse_shape(header_value(header, "shape", what), what);
  h.numel = numel_of(h.shape);
  h.data_offset = hstart + hlen;
  return h;
}

}  // namespace

Tensor parse_npy(const void* bytes, std::size_t size, const std::string& what) {
  const auto* p = static_cast<const unsigned char*>(bytes);
  const NpyHeader h = parse_npy_header(p, size, what);
  const std::string& descr = h.descr;
  const Shape& shape = h.shape;
  const std::int64_t n = h.numel;
  const unsigned char* data = p + h.data_offset;
  const std::size_t avail = size - h.data_offset;

  auto need = [&](std::size_t esz) {
    if (avail < static_cast<std::size_t>(n) * esz)
      bad(what, "truncated data: header promises " + shape_str(shape) + " of " + descr + " (" +
                    std::to_string(n * esz) + " bytes), file has " + std::to_string(avail));
  };
  if (descr == "<f4") {
    need(4);
    Tensor t = Tensor::empty(shape, DType::Float32);
    std::memcpy(t.raw_data(), data, n * 4);
    return t;
  }
  if (descr == "<f2") {
    need(2);
    Tensor t = Tensor::empty(shape, DType::Float16);
    std::memcpy(t.raw_data(), data, n * 2);
    return t;
  }
  if (descr == "<f8") {
    need(8);
    Tensor t = Tensor::empty(shape, DType::Float32);
    float* o = t.data<float>();
    for (std::int64_t i = 0; i < n; ++i) {
      double v;
      std::memcpy(&v, data + i * 8, 8);
      o[i] = static_cast<float>(v);
    }
    return t;
  }
  if (descr == "<i8" || descr == "<i4" || descr == "|u1" || descr == "|i1" || descr == "<u8") {
    const std::size_t esz = descr == "<i8" || descr == "<u8" ? 8 : descr == "<i4" ? 4 : 1;
    need(esz);
    Tensor t = Tensor::empty(shape, DType::Int64);
    auto* o = t.data<std::int64_t>();
    for (std::int64_t i = 0; i < n; ++i) {
      if (esz == 8) {
        std::memcpy(&o[i], data + i * 8, 8);
      } else if (esz == 4) {
        std::int32_t v;
        std::memcpy(&v, data + i * 4, 4);
        o[i] = v;
      } else {
        o[i] = descr == "|u1" ? static_cast<std::int64_t>(data[i])
                              : static_cast<std::int64_t>(static_cast<signed char>(data[i]));
      }
    }
    return t;
  }
  if (descr == "|b1") {  // numpy's bool: one byte each; any non-zero byte is true
    need(1);
    Tensor t = Tensor::empty(shape, DType::Bool);
    auto* o = static_cast<std::uint8_t*>(t.raw_data());
    for (std::int64_t i = 0; i < n; ++i) o[i] = data[i] != 0;
    return t;
  }
  bad(what, "unsupported dtype '" + descr + "' (supported: <f4, <f2, <f8, <i8, <i4, |u1, |i1, |b1)");
}

std::string serialize_npy(const Tensor& t) {
  // A view is saved as its values (row-major, as numpy writes a C-order array).
  const Tensor host = t.is_contiguous() ? t.to(Device::cpu()) : t.clone().to(Device::cpu());
  if (host.dtype() == DType::BFloat16)
    throw TypeError("save_npy: NumPy has no bfloat16; convert to float32 first");
  const char* descr = host.dtype() == DType::Float32   ? "<f4"
                      : host.dtype() == DType::Float16 ? "<f2"
                      : host.dtype() == DType::Bool    ? "|b1"
                                                       : "<i8";
  std::string shape = "(";
  for (std::size_t i = 0; i < host.shape().size(); ++i)
    shape += std::to_string(host.shape()[i]) + (host.shape().size() == 1 ? "," : i + 1 < host.shape().size() ? ", " : "");
  shape += ")";
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " +
                       shape + ", }";
  // Pad so the data starts on a 64-byte boundary, header ends with '\n' (format 1.0).
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>((header.size() >> 8) & 0xff);
  out += header;
  out.append(static_cast<const char*>(host.raw_data()), host.nbytes());
  return out;
}

Tensor load_npy(const std::string& path) { return load_npy(path, nullptr); }

namespace {

// Bytes per element of a dtype parse_npy reads; 0 for others (parse_npy names them).
std::size_t descr_size(const std::string& d) {
  if (d == "<f8" || d == "<i8" || d == "<u8") return 8;
  if (d == "<f4" || d == "<i4") return 4;
  if (d == "<f2") return 2;
  if (d == "|u1" || d == "|i1" || d == "|b1") return 1;
  return 0;
}

// Exactly n bytes at `offset` of a regular file (short only if it shrank while read).
void read_at(int fd, char* buf, std::size_t n, std::size_t offset, const std::string& path) {
  for (std::size_t got = 0; got < n;) {
    const ssize_t r = ::pread(fd, buf + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) bad(path, std::string("read failed (") + std::strerror(errno) + ")");
    if (r == 0) bad(path, "the file shrank while it was read");
    got += static_cast<std::size_t>(r);
  }
}

// Where the header ends, from its first bytes (the whole prefix when it is no .npy header:
// parse_npy_header then says why).
std::size_t header_end(const std::string& first) {
  const auto* p = reinterpret_cast<const unsigned char*>(first.data());
  if (first.size() < 10 || std::memcmp(p, "\x93NUMPY", 6) != 0) return first.size();
  if (p[6] == 1) return 10 + (p[8] | (p[9] << 8));
  if (first.size() < 12) return first.size();
  return 12 + (p[8] | (p[9] << 8) | (p[10] << 16) | (static_cast<std::size_t>(p[11]) << 24));
}

struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

}  // namespace

Tensor load_npy(const std::string& path, NpyLoadInfo* info) {
  if (info) *info = NpyLoadInfo{};
  std::size_t fsize = 0;
  const FdCloser f{files::open_regular(path, &fsize)};  // /dev/zero or a FIFO would be read without end
  // Every read is bounded by the header and the file's size: the header is checked against
  // the size before any memory is set aside for the data.
  std::string head(std::min<std::size_t>(fsize, 12), '\0');
  read_at(f.fd, &head[0], head.size(), 0, path);
  const std::size_t hend = header_end(head);
  if (hend > fsize) bad(path, "truncated npy header");
  head.resize(hend);
  read_at(f.fd, &head[0], hend, 0, path);
  const NpyHeader h = parse_npy_header(reinterpret_cast<const unsigned char*>(head.data()), head.size(), path);
  const std::size_t nbytes = static_cast<std::size_t>(h.numel) * descr_size(h.descr);
  const std::size_t avail = fsize - h.data_offset;
  if (avail < nbytes)
    bad(path, "truncated data: header promises " + shape_str(h.shape) + " of " + h.descr + " (" +
                  std::to_string(nbytes) + " bytes), file has " + std::to_string(avail));
  const bool f4 = h.descr == "<f4", i8 = h.descr == "<i8";
  if ((f4 || i8) && h.data_offset % 64 == 0 && nbytes >= kNpyMapMinBytes && npy_mmap_enabled()) {
    auto storage = Storage::map_fd(f.fd, path, h.data_offset, nbytes);
    if (info) info->mapped = true;
    return Tensor(std::make_shared<TensorImpl>(std::move(storage), 0, h.shape, f4 ? DType::Float32 : DType::Int64));
  }
  std::string bytes(h.data_offset + nbytes, '\0');
  std::memcpy(&bytes[0], head.data(), h.data_offset);
  read_at(f.fd, &bytes[h.data_offset], nbytes, h.data_offset, path);
  return parse_npy(bytes.data(), bytes.size(), path);
}

void save_npy(const std::string& path, const Tensor& t) {
  const std::string bytes = serialize_npy(t);
  std::string tmp;
  const int fd = files::create_temp(path, 0666, tmp);  // a new name: never a planted file or link
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) break;
    done += static_cast<std::size_t>(w);
  }
  const int e = errno;
  if (::close(fd) != 0 || done < bytes.size()) {
    ::unlink(tmp.c_str());
    throw IoError(path + ": write failed (" + std::strerror(done < bytes.size() ? e : errno) + ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int re = errno;
    ::unlink(tmp.c_str());
    throw IoError(path + ": rename failed (" + std::strerror(re) + ")");
  }
}

}  // namespace phalanx
