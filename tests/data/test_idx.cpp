#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include <phalanx/phalanx.hpp>

using namespace phalanx;
using namespace phalanx::samplers;

TEST_CASE("Fashion-MNIST loads: 60 000 x 784 train, 10 000 test, known first labels") {
  // The data cache goes to a directory of this test's own (not the user's ~/.cache).
  char dir[] = "/tmp/phalanx_idx_cache_XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  ::setenv("PHALANX_DATA_CACHE", dir, 1);
  struct Cleanup {
    std::string d;
    ~Cleanup() {
      ::unsetenv("PHALANX_DATA_CACHE");
      std::system(("rm -rf " + d).c_str());
    }
  } cleanup{dir};
  MnistOptions o;
  auto train = load_mnist(kFashionMnistDir, o);
  CHECK(train->size() == 60000);
  CHECK(train->feature_shape() == Shape{784});
  const auto y = train->labels().narrow_rows(0, 10).to_vector<std::int64_t>();
  CHECK(y == std::vector<std::int64_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5});
  // first image's pixel sum (raw bytes sum to 76247), normalised by 255
  double s = 0;
  for (float v : train->features().narrow_rows(0, 1).to_vector<float>()) s += v;
  CHECK(s == doctest::Approx(76247.0 / 255.0).epsilon(1e-5));
  o.train = false;
  o.flatten = false;
  auto test = load_mnist(kFashionMnistDir, o);
  CHECK(test->size() == 10000);
  CHECK(test->feature_shape() == Shape{28, 28});
  CHECK(test->labels().narrow_rows(0, 10).to_vector<std::int64_t>() ==
        std::vector<std::int64_t>{9, 2, 1, 1, 6, 1, 4, 6, 5, 7});
}

TEST_CASE("truncated, corrupt and missing IDX files name the file and the problem") {
  const std::string p = "/tmp/phalanx_bad_idx";
  {
    std::ofstream f(p, std::ios::binary);
    const unsigned char head[] = {0, 0, 8, 1, 0, 0, 0, 10, 1, 2, 3};  // promises 10 labels, has 3
    f.write(reinterpret_cast<const char*>(head), sizeof head);
  }
  CHECK_THROWS_WITH_AS(load_idx(p), doctest::Contains("truncated: expected 10 bytes of the data, got 3"), IoError);
  {
    std::ofstream f(p, std::ios::binary);
    f << "PK not an idx file";
  }
  CHECK_THROWS_WITH_AS(load_idx(p), doctest::Contains("not an IDX file"), IoError);
  {
    gzFile g = gzopen(p.c_str(), "wb");
    const unsigned char head[] = {0, 0, 8, 1, 0, 0, 0, 2, 4, 5};
    gzwrite(g, head, sizeof head);
    gzclose(g);
  }
  CHECK(load_idx(p).to_vector<std::int64_t>() == std::vector<std::int64_t>{4, 5});
  CHECK_THROWS_WITH_AS(load_idx("/nonexistent.idx"), doctest::Contains("/nonexistent.idx"), IoError);
  CHECK_THROWS_WITH_AS(load_mnist("/nonexistent"), doctest::Contains("dataset-fashion-mnist"), IoError);
  std::remove(p.c_str());
}

TEST_CASE("an IDX header cannot make the reader allocate what the file does not hold") {
  const std::string p = "/tmp/phalanx_idx_header_" + std::to_string(::getpid());
  auto write = [&](std::initializer_list<unsigned char> bytes) {
    std::ofstream f(p, std::ios::binary);
    for (unsigned char b : bytes) f.put(static_cast<char>(b));
  };
  // 4 GiB promised, 3 bytes present: refused as truncated (memory follows the data read).
  write({0, 0, 8, 1, 0xff, 0xff, 0xff, 0xff, 1, 2, 3});
  CHECK_THROWS_WITH_AS(load_idx(p), doctest::Contains("truncated: expected 4294967295 bytes of the data, got 3"), IoError);
  // 2^96 values (and, with a zero dimension, a product numel_of() would overflow on).
  write({0, 0, 8, 4, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0});
  CHECK_THROWS_WITH_AS(load_idx(p), doctest::Contains("more than 2^56"), IoError);
  // A zero dimension is an empty tensor.
  write({0, 0, 8, 2, 0, 0, 0, 0, 0, 0, 0, 7});
  CHECK(load_idx(p).shape() == Shape{0, 7});
  // A .gz file whose CRC-32 does not match its data is refused, not read.
  {
    gzFile g = gzopen(p.c_str(), "wb");
    const unsigned char file[] = {0, 0, 8, 1, 0, 0, 0, 2, 4, 5};
    gzwrite(g, file, sizeof file);
    gzclose(g);
  }
  std::string gz;
  {
    std::ifstream f(p, std::ios::binary);
    gz.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  gz[gz.size() - 8] ^= 0x01;  // the trailer's CRC-32
  {
    std::ofstream f(p, std::ios::binary);
    f.write(gz.data(), static_cast<std::streamsize>(gz.size()));
  }
  CHECK_THROWS_WITH_AS(load_idx(p), doctest::Contains("corrupt compressed data"), IoError);
  std::remove(p.c_str());
}

TEST_CASE("IDX is read from regular files only, and a plain file must hold exactly what its header promises") {
  const std::string base = "/tmp/phalanx_idx_kinds_" + std::to_string(::getpid());
  const std::string fifo = base + ".fifo", dir = base + "_dir";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(load_idx("/dev/zero"), "/dev/zero: is a character device, not a regular file", IoError);
  CHECK_THROWS_WITH_AS(load_idx(fifo), (fifo + ": is a FIFO, not a regular file").c_str(), IoError);
  CHECK_THROWS_WITH_AS(load_idx(dir), (dir + ": is a directory, not a regular file").c_str(), IoError);
  // A Fashion-MNIST folder whose file is a FIFO: named, not waited on.
  const std::string mnist = base + "_mnist";
  REQUIRE(::mkdir(mnist.c_str(), 0700) == 0);
  const std::string images = mnist + "/train-images-idx3-ubyte.gz";
  REQUIRE(::mkfifo(images.c_str(), 0600) == 0);
  std::ofstream(mnist + "/train-labels-idx1-ubyte");
  CHECK_THROWS_WITH_AS(load_mnist(mnist), (images + ": is a FIFO, not a regular file").c_str(), IoError);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
  const std::string p = base + ".idx";
  {
    std::ofstream f(p, std::ios::binary);
    const unsigned char bytes[] = {0, 0, 8, 1, 0, 0, 0, 2, 4, 5, 6};  // 2 labels promised, 3 present
    f.write(reinterpret_cast<const char*>(bytes), sizeof bytes);
  }
  CHECK_THROWS_WITH_AS(load_idx(p), doctest::Contains("trailing bytes after [2] values"), IoError);
  std::system(("rm -rf " + fifo + " " + dir + " " + mnist + " " + p).c_str());
}
