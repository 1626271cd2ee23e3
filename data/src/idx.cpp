#include "phalanx/data/idx.hpp"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "phalanx/core/error.hpp"
#include "phalanx/core/file_safety.hpp"
#include "phalanx/data/data_cache.hpp"

namespace phalanx::samplers {

namespace {
struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};

std::uint32_t be32(const unsigned char* p) {
  return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) | p[3];
}

// Reads up to n bytes; fewer only at the end of the (decompressed) data.
std::size_t read_some(gzFile f, void* buf, std::size_t n, const std::string& path, const char* what) {
  std::size_t got = 0;
  auto* p = static_cast<unsigned char*>(buf);
  while (got < n) {
    const int r = gzread(f, p + got, static_cast<unsigned>(std::min<std::size_t>(n - got, 1u << 30)));
    if (r < 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      throw IoError(path + ": corrupt compressed data while reading " + what + " (" + msg + ")");
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  return got;
}

void read_exact(gzFile f, void* buf, std::size_t n, const std::string& path, const char* what) {
  const std::size_t got = read_some(f, buf, n, path, what);
  if (got < n)
    throw IoError(detail::concat(path, ": truncated: expected ", n, " bytes of ", what, ", got ", got));
}

// A plain (not gzipped) file holds exactly the header and the values it promises: checked
// before anything is read or allocated for them.
void check_plain_size(const std::string& path, std::size_t file_size, std::size_t head, std::int64_t n,
                      const Shape& shape) {
  const std::size_t have = file_size > head ? file_size - head : 0;
  if (have < static_cast<std::uint64_t>(n))
    throw IoError(detail::concat(path, ": truncated: expected ", n, " bytes of the data, got ", have));
  if (have > static_cast<std::uint64_t>(n))
    throw IoError(path + ": trailing bytes after " + shape_str(shape) + " values: corrupt header?");
}

// The IDX file's values (unsigned bytes) and its shape.
std::vector<unsigned char> read_idx_bytes(const std::string& path, Shape& shape) {
  std::size_t file_size = 0;
  const int fd = files::open_regular(path, &file_size);  // /dev/zero or a FIFO would be read without end
  std::unique_ptr<gzFile_s, GzCloser> f(gzdopen(fd, "rb"));  // reads plain files too; closes fd
  if (!f) {
    ::close(fd);
    throw IoError(path + ": cannot open for reading");
  }
  unsigned char head[4];
  read_exact(f.get(), head, 4, path, "the header");
  if (head[0] != 0 || head[1] != 0)
    throw IoError(path + ": not an IDX file (the magic number must start with two zero bytes)");
  if (head[2] != 0x08)
    throw IoError(detail::concat(path, ": IDX element type 0x", std::hex, int(head[2]),
                                 " is not supported (only unsigned bytes, 0x08)"));
  const int ndim = head[3];
  if (ndim < 1 || ndim > 4) throw IoError(detail::concat(path, ": IDX with ", ndim, " dimensions"));
  std::vector<unsigned char> dims_raw(4 * ndim);
  read_exact(f.get(), dims_raw.data(), dims_raw.size(), path, "the dimensions");
  shape.clear();
  for (int i = 0; i < ndim; ++i) shape.push_back(be32(&dims_raw[4 * i]));
  // The header is not trusted: the values it promises must fit an int64 tensor, and so must
  // the product of its non-zero dimensions (numel_of() multiplies them all) ...
  constexpr std::uint64_t kMaxValues = std::uint64_t(1) << 56;
  std::uint64_t nonzero = 1;
  for (const std::int64_t d : shape) {
    if (d == 0) continue;
    if (nonzero > kMaxValues / static_cast<std::uint64_t>(d))
      throw IoError(path + ": the IDX header promises " + shape_str(shape) +
                    " values, more than 2^56: corrupt header?");
    nonzero *= static_cast<std::uint64_t>(d);
  }
  const std::int64_t n = numel_of(shape);
  if (gzdirect(f.get())) check_plain_size(path, file_size, 4 + dims_raw.size(), n, shape);
  // ... and memory grows with the data actually read, never with what the header promises
  // (a 20-byte file cannot claim gigabytes).
  std::vector<unsigned char> bytes;
  std::size_t got = 0;
  while (got < static_cast<std::size_t>(n)) {
    const std::size_t want = std::min<std::size_t>(n - got, std::max<std::size_t>(got, 1u << 20));
    bytes.resize(got + want);
    got += read_some(f.get(), bytes.data() + got, want, path, "the data");
    if (got < bytes.size())
      throw IoError(detail::concat(path, ": truncated: expected ", n, " bytes of the data, got ", got));
  }
  // One more read: trailing bytes mean a wrong header; for a .gz file it also checks the
  // stream's CRC-32 and length, so a damaged archive is refused rather than read as data.
  unsigned char extra;
  if (read_some(f.get(), &extra, 1, path, "the end of the data") > 0)
    throw IoError(path + ": trailing bytes after " + shape_str(shape) + " values: corrupt header?");
  return bytes;
}
}  // namespace

Tensor load_idx(const std::string& path) {
  Shape shape;
  const std::vector<unsigned char> bytes = read_idx_bytes(path, shape);
  Tensor t = Tensor::empty(shape, DType::Int64);
  auto* o = t.data<std::int64_t>();
  for (std::int64_t i = 0; i < t.numel(); ++i) o[i] = bytes[i];
  return t;
}

namespace {
std::string find_file(const std::string& dir, const std::string& stem) {
  for (const std::string& candidate : {dir + "/" + stem + ".gz", dir + "/" + stem}) {
    if (::access(candidate.c_str(), F_OK) == 0) return candidate;  // not opened: a FIFO would block
  }
  throw IoError("MNIST: neither " + dir + "/" + stem + ".gz nor " + dir + "/" + stem +
                " exists; install Debian's dataset-fashion-mnist or pass the directory that "
                "holds the four IDX files");
}
}  // namespace

std::shared_ptr<TensorDataset> load_mnist(const std::string& dir, const MnistOptions& o) {
  const std::string prefix = o.train ? "train" : "t10k";
  const std::string ipath = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string lpath = find_file(dir, prefix + "-labels-idx1-ubyte");
  // Both arrays come from the per-host data cache (decompressed and converted once, then
  // mapped by every process); the transform names every option that changes the values, and a version (v2) to bump
  // whenever the conversion's code changes what it writes.
  const float scale = o.normalize ? 1.f / 255.f : 1.f;
  char transform[160];
  std::snprintf(transform, sizeof transform, "mnist-images v2 f32 scale=%a standardize=%d mean=%a std=%a flatten=%d",
                scale, int(o.standardize), o.mean, o.std, int(o.flatten));
  Tensor x = cached_array(ipath, transform, DType::Float32, [&](CacheSink& sink) {
    Shape shape;
    const std::vector<unsigned char> bytes = read_idx_bytes(ipath, shape);
    if (shape.size() != 3) throw IoError(ipath + ": expected images [N, rows, cols], got " + shape_str(shape));
    sink.begin(o.flatten ? Shape{shape[0], shape[1] * shape[2]} : shape);
    std::vector<float> chunk(1 << 16);
    for (std::size_t at = 0; at < bytes.size(); at += chunk.size()) {
      const std::size_t m = std::min(chunk.size(), bytes.size() - at);
      for (std::size_t i = 0; i < m; ++i) {
        float v = static_cast<float>(bytes[at + i]) * scale;
        if (o.standardize) v = (v - o.mean) / o.std;
        chunk[i] = v;
      }
      sink.write(chunk.data(), m * sizeof(float));
    }
  });
  Tensor labels = cached_array(lpath, "mnist-labels v2 i64", DType::Int64, [&](CacheSink& sink) {
    Shape shape;
    const std::vector<unsigned char> bytes = read_idx_bytes(lpath, shape);
    if (shape.size() != 1) throw IoError(lpath + ": expected labels [N], got " + shape_str(shape));
    sink.begin(shape);
    std::vector<std::int64_t> v(bytes.begin(), bytes.end());
    sink.write(v.data(), v.size() * sizeof(std::int64_t));
  });
  if (labels.shape()[0] != x.shape()[0])
    throw IoError(lpath + ": " + shape_str(labels.shape()) + " labels for " + shape_str(x.shape()) + " images");
  return std::make_shared<TensorDataset>(x, labels, 10);
}

}  // namespace phalanx::samplers
