#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <unistd.h>

#include <phalanx/phalanx.hpp>

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
