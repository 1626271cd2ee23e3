#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include <phalanx/phalanx.hpp>
#include <phalanx/core/tensor_impl.hpp>

using namespace phalanx;

namespace {
std::string tmp_path(const std::string& name) {
  return std::string("/tmp/phalanx_test_") + std::to_string(::getpid()) + "_" + name;
}
}  // namespace

TEST_CASE("npy round trip for float32 and int64, any rank") {
  for (const Shape& s : {Shape{}, Shape{5}, Shape{2, 3}, Shape{2, 1, 4}}) {
    CAPTURE(shape_str(s));
    Generator g(1);
    Tensor f = randn(s, &g);
    save_npy(tmp_path("f.npy"), f);
    Tensor f2 = load_npy(tmp_path("f.npy"));
    CHECK(f2.shape() == s);
    CHECK(f2.to_vector<float>() == f.to_vector<float>());
    Tensor i = randint(100, s, &g);
    save_npy(tmp_path("i.npy"), i);
    CHECK(load_npy(tmp_path("i.npy")).to_vector<std::int64_t>() == i.to_vector<std::int64_t>());
  }
  std::remove(tmp_path("f.npy").c_str());
  std::remove(tmp_path("i.npy").c_str());
}

TEST_CASE("npz round trip keeps names and order") {
  TensorMap m;
  m.set("0.weight", randn({3, 2}));
  m.set("0.bias", randn({3}));
  m.set("labels", arange(4, DType::Int64));
  save_npz(tmp_path("m.npz"), m);
  TensorMap r = load_npz(tmp_path("m.npz"));
  CHECK(r.names() == m.names());
  CHECK(r.at("0.weight").to_vector<float>() == m.at("0.weight").to_vector<float>());
  CHECK(r.at("labels").to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2, 3});
  CHECK_THROWS_WITH_AS(r.at("nope"), doctest::Contains("have: 0.weight, 0.bias, labels"), ValueError);
  std::remove(tmp_path("m.npz").c_str());
}

TEST_CASE("files written by NumPy load (the committed fixtures)") {
  TensorMap m = load_npz(std::string(PHALANX_FIXTURES) + "/mlp_relu_parity.npz");
  CHECK(m.at("x").shape() == Shape{16, 64});
  CHECK(m.at("y").dtype() == DType::Int64);
  CHECK(m.at("init.0.weight").shape() == Shape{32, 64});
  CHECK(m.at("loss_mean").dim() == 0);
}

TEST_CASE("corrupt, truncated and missing files are named in the error") {
  CHECK_THROWS_WITH_AS(load_npy("/nonexistent/x.npy"), doctest::Contains("/nonexistent/x.npy"), IoError);
  const std::string p = tmp_path("bad.npy");
  { std::ofstream(p) << "hello world, not numpy"; }
  CHECK_THROWS_WITH_AS(load_npy(p), doctest::Contains("bad magic"), IoError);
  save_npy(p, randn({10, 10}));
  {
    std::ifstream in(p, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), 200);
  }
  CHECK_THROWS_WITH_AS(load_npy(p), doctest::Contains("truncated data"), IoError);
  CHECK_THROWS_WITH_AS(load_npz(p), doctest::Contains("cannot open as .npz"), IoError);
  std::remove(p.c_str());
}

TEST_CASE("npy shapes that overflow: a one-line error naming the file and the dimension, not stoll") {
  auto with_shape = [](const std::string& shape) {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
    bytes += static_cast<char>(header.size() & 0xff);
    bytes += static_cast<char>(header.size() >> 8);
    return bytes + header + std::string(64, '\0');
  };
  const std::string huge = with_shape("(99999999999999999999, 64)");
  CHECK_THROWS_WITH_AS(parse_npy(huge.data(), huge.size(), "x.npy"),
                       doctest::Contains("x.npy: dimension 0 of the npy shape (99999999999999999999) is out of range"),
                       IoError);
  const std::string wraps = with_shape("(4294967296, 4294967296, 16)");  // 2^68 elements
  CHECK_THROWS_WITH_AS(parse_npy(wraps.data(), wraps.size(), "y.npy"),
                       doctest::Contains("y.npy: npy shape [4294967296, 4294967296, 16] is too large"), IoError);
  const std::string wraps_to_small = with_shape("(4611686018427387905,)");  // x 4 bytes wraps to 4
  CHECK_THROWS_WITH_AS(parse_npy(wraps_to_small.data(), wraps_to_small.size(), "w.npy"),
                       doctest::Contains("is too large"), IoError);
  const std::string fine = with_shape("(4, 4)");
  CHECK(parse_npy(fine.data(), fine.size(), "z.npy").numel() == 16);
}

namespace {
std::string read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
// Writes a new file and renames it into place (a file that a test maps is never rewritten).
void write_bytes(const std::string& p, const std::string& bytes) {
  {
    std::ofstream f(p + ".new", std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  REQUIRE(std::rename((p + ".new").c_str(), p.c_str()) == 0);
}
// A format-1.0 .npy image whose header is padded to `align` bytes (NumPy pads to 64).
std::string npy_image(const std::string& descr, const Shape& shape, const std::string& data, std::size_t align) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (";
  for (auto d : shape) header += std::to_string(d) + ",";
  header += "), }";
  const std::size_t total = 10 + header.size() + 1;
  header.append((align - total % align) % align, ' ');
  if (align % 64 != 0 && (10 + header.size() + 1) % 64 == 0) header.append(align, ' ');  // never 64-aligned
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  return out + header + data;
}
}  // namespace

TEST_CASE("a large float32/int64 .npy is mapped copy-on-write and equals the read one") {
  Generator g(3);
  const Tensor f = randn({600, 512}, &g);  // 1.2 MB
  const Tensor i = randint(1000, {300, 512}, &g);
  save_npy(tmp_path("big_f.npy"), f);
  save_npy(tmp_path("big_i.npy"), i);
  NpyLoadInfo info;
  Tensor fm = load_npy(tmp_path("big_f.npy"), &info);
  CHECK(info.mapped);
  CHECK(fm.impl()->storage()->mapped());
  const std::string bytes = read_all(tmp_path("big_f.npy"));
  const Tensor fr = parse_npy(bytes.data(), bytes.size(), "read");
  CHECK_FALSE(fr.impl()->storage()->mapped());
  CHECK(fm.shape() == fr.shape());
  CHECK(fm.to_vector<float>() == fr.to_vector<float>());
  CHECK(fm.to_vector<float>() == f.to_vector<float>());
  Tensor im = load_npy(tmp_path("big_i.npy"), &info);
  CHECK(info.mapped);
  CHECK(im.to_vector<std::int64_t>() == i.to_vector<std::int64_t>());

  // An in-place op copies the pages it writes: the file and a second mapping keep the data.
  fm.mul_(2.f);
  CHECK(fm.to_vector<float>()[7] == 2.f * f.to_vector<float>()[7]);
  CHECK(read_all(tmp_path("big_f.npy")) == bytes);
  CHECK(load_npy(tmp_path("big_f.npy")).to_vector<float>() == f.to_vector<float>());
  // The mapping outlives the file's name.
  std::remove(tmp_path("big_i.npy").c_str());
  CHECK(im.to_vector<std::int64_t>() == i.to_vector<std::int64_t>());

  // Truncated data is an error, not a fault on access.
  write_bytes(tmp_path("big_f.npy"), bytes.substr(0, bytes.size() - 100));
  CHECK_THROWS_WITH_AS(load_npy(tmp_path("big_f.npy")), doctest::Contains("truncated data"), IoError);
  std::remove(tmp_path("big_f.npy").c_str());
}

TEST_CASE("PHALANX_MMAP=0 reads a mappable .npy into private memory (a snapshot)") {
  Generator g(4);
  const Tensor f = randn({600, 512}, &g);
  save_npy(tmp_path("snap.npy"), f);
  ::setenv("PHALANX_MMAP", "0", 1);
  NpyLoadInfo info;
  Tensor t = load_npy(tmp_path("snap.npy"), &info);
  ::unsetenv("PHALANX_MMAP");
  CHECK_FALSE(info.mapped);
  CHECK_FALSE(t.impl()->storage()->mapped());
  // Rewritten in place (as np.save does: truncate, write): the snapshot keeps its values.
  write_bytes(tmp_path("snap.npy"), "");
  CHECK(t.to_vector<float>() == f.to_vector<float>());
  CHECK_THROWS_AS(load_npy(tmp_path("snap.npy")), IoError);
  std::remove(tmp_path("snap.npy").c_str());
}

TEST_CASE("layouts that cannot be mapped are read: float64, small arrays, a data offset not 64-aligned") {
  std::string f8, f4;
  for (int k = 0; k < 300000; ++k) {
    const double d = k * 0.5;
    const float s = static_cast<float>(k) - 7.f;
    f8.append(reinterpret_cast<const char*>(&d), 8);
    f4.append(reinterpret_cast<const char*>(&s), 4);
  }
  NpyLoadInfo info;
  write_bytes(tmp_path("f8.npy"), npy_image("<f8", {300000}, f8, 64));
  const Tensor a = load_npy(tmp_path("f8.npy"), &info);
  CHECK_FALSE(info.mapped);
  CHECK(a.dtype() == DType::Float32);
  CHECK(a.to_vector<float>()[299999] == 149999.5f);
  write_bytes(tmp_path("f4_16.npy"), npy_image("<f4", {300000}, f4, 16));  // old NumPy padding
  const Tensor b = load_npy(tmp_path("f4_16.npy"), &info);
  CHECK_FALSE(info.mapped);
  CHECK(b.to_vector<float>()[0] == -7.f);
  CHECK(b.to_vector<float>()[299999] == 299992.f);
  write_bytes(tmp_path("f4_64.npy"), npy_image("<f4", {300000}, f4, 64));
  CHECK(load_npy(tmp_path("f4_64.npy"), &info).to_vector<float>() == b.to_vector<float>());
  CHECK(info.mapped);
  write_bytes(tmp_path("small.npy"), npy_image("<f4", {1000}, f4.substr(0, 4000), 64));
  CHECK(load_npy(tmp_path("small.npy"), &info).to_vector<float>()[999] == 992.f);
  CHECK_FALSE(info.mapped);
  for (const char* n : {"f8.npy", "f4_16.npy", "f4_64.npy", "small.npy"}) std::remove(tmp_path(n).c_str());
}

TEST_CASE("load_npy reads regular files only, and never more than the header promises") {
  const std::string fifo = tmp_path("x.fifo"), dir = tmp_path("x_dir.npy");
  std::remove(fifo.c_str());
  ::rmdir(dir.c_str());
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
  // /dev/zero was read without end, a FIFO blocked, a directory failed mid-read unnamed.
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(load_npy("/dev/zero"), "/dev/zero: is a character device, not a regular file", IoError);
  CHECK_THROWS_WITH_AS(load_npy(fifo), (fifo + ": is a FIFO, not a regular file").c_str(), IoError);
  CHECK_THROWS_WITH_AS(load_npy(dir), (dir + ": is a directory, not a regular file").c_str(), IoError);
  CHECK_THROWS_WITH_AS(load_npz(dir), (dir + ": is a directory, not a regular file").c_str(), IoError);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
  // 10^12 float32 promised by a 128-byte file: refused from the file's size, nothing allocated.
  const std::string p = tmp_path("claims.npy");
  write_bytes(p, npy_image("<f4", {1000000000000}, std::string(64, '\0'), 64));
  CHECK_THROWS_WITH_AS(load_npy(p),
                       (p + ": truncated data: header promises [1000000000000] of <f4 (4000000000000 bytes), file has 64").c_str(),
                       IoError);
  // A header longer than the file (format 2.0 allows 4 GiB): refused the same way.
  std::string v2("\x93NUMPY\x02\x00\xff\xff\xff\x7f", 12);
  write_bytes(p, v2 + "{'descr': '<f4'");
  CHECK_THROWS_WITH_AS(load_npy(p), doctest::Contains("truncated npy header"), IoError);
  // Bytes after the data are not read (and, as before, not an error).
  write_bytes(p, npy_image("<f4", {2}, std::string(8, '\0') + "trailing", 64));
  CHECK(load_npy(p).to_vector<float>() == std::vector<float>{0, 0});
  std::remove(p.c_str());
  std::remove(fifo.c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("save_npy and save_npz never write through a planted temporary name or the target's link") {
  const std::string p = tmp_path("planted.npy"), victim = tmp_path("victim");
  { std::ofstream(victim) << "precious"; }
  std::remove((p + ".tmp").c_str());
  REQUIRE(::symlink(victim.c_str(), (p + ".tmp").c_str()) == 0);  // save_npy's fixed temporary name, once
  save_npy(p, zeros({3}));
  CHECK(read_all(victim) == "precious");
  struct stat st {};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  CHECK(load_npy(p).numel() == 3);
  // A link at the target's own name is replaced by the new file, its target untouched.
  const std::string z = tmp_path("planted.npz");
  std::remove(z.c_str());
  REQUIRE(::symlink(victim.c_str(), z.c_str()) == 0);
  TensorMap m;
  m.set("w", zeros({2}));
  save_npz(z, m);
  CHECK(read_all(victim) == "precious");
  REQUIRE(::lstat(z.c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  const mode_t old = ::umask(022);
  save_npz(z, m, 0600);
  REQUIRE(::stat(z.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  save_npz(z, m);
  REQUIRE(::stat(z.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0644);  // 0666 less the umask, as other programs' files
  ::umask(old);
  for (const auto& f : {p, p + ".tmp", z, victim}) std::remove(f.c_str());
}

TEST_CASE("an .npz member whose directory entry claims a huge size is refused before any allocation") {
  const std::string path = tmp_path("bomb.npz");
  TensorMap m;
  m.set("x", zeros({64}));
  save_npz(path, m);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  in.close();
  // The uncompressed size of every local (offset 22) and central (offset 24) header: 1.3 GB.
  auto patch = [&](const std::string& sig, std::size_t at) {
    for (std::size_t p = bytes.find(sig); p != std::string::npos; p = bytes.find(sig, p + 4)) {
      const std::uint32_t v = 1300000000u;
      std::memcpy(&bytes[p + at], &v, 4);
    }
  };
  patch(std::string("PK\x03\x04", 4), 22);
  patch(std::string("PK\x01\x02", 4), 24);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(load_npz(path), doctest::Contains("claims an impossible size (1300000000 bytes from"), IoError);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(500));  // not a 1.3 GB zeroed buffer
}
