#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>

#include <phalanx/phalanx.hpp>

using namespace phalanx;
using namespace phalanx::samplers;

namespace {
std::shared_ptr<TensorDataset> toy(std::int64_t n) {
  Tensor x = arange(n * 3).reshape({n, 3});
  Tensor y = arange(n, DType::Int64);
  return std::make_shared<TensorDataset>(x, y);
}
}  // namespace

TEST_CASE("batches follow the sampler order, collated contiguously") {
  auto ds = toy(10);
  DataLoader loader(ds, {4});
  CHECK(loader.num_batches() == 3);
  std::vector<std::int64_t> seen;
  for (Batch& b : loader) {
    CHECK(b.x.shape()[1] == 3);
    for (std::int64_t i = 0; i < b.y.numel(); ++i) {
      const std::int64_t label = b.y.data<std::int64_t>()[i];
      seen.push_back(label);
      CHECK(b.x.data<float>()[i * 3] == static_cast<float>(label * 3));
    }
  }
  CHECK(seen == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  DataLoader dropping(ds, DataLoaderOptions(4).drop_last(true));
  int batches = 0;
  for (Batch& b : dropping) {
    CHECK(b.y.numel() == 4);
    ++batches;
  }
  CHECK(batches == 2);
}

TEST_CASE("prefetching keeps the order, epoch after epoch") {
  auto ds = toy(50);
  auto sampler = std::make_shared<RandomSampler>(50, 3);
  DataLoader plain(ds, {7}, sampler);
  DataLoaderOptions po{7};
  po.prefetch(3);
  DataLoader ahead(ds, po, sampler);
  for (std::int64_t epoch = 0; epoch < 3; ++epoch) {
    sampler->set_epoch(epoch);
    std::vector<std::int64_t> a, b;
    for (Batch& x : plain) for (auto v : x.y.to_vector<std::int64_t>()) a.push_back(v);
    for (Batch& x : ahead) for (auto v : x.y.to_vector<std::int64_t>()) b.push_back(v);
    CHECK(a == b);
    CHECK(a.size() == 50);
  }
  // abandoning an epoch halfway is fine
  ahead.start_epoch();
  Batch one;
  CHECK(ahead.next(one));
}

namespace {
// The order 0..n-1, with one index out of the dataset's range at `bad` in the epochs it names.
struct FaultySampler : Sampler {
  std::int64_t n, bad;
  std::vector<std::int64_t> bad_epochs;
  FaultySampler(std::int64_t n_, std::int64_t bad_, std::vector<std::int64_t> epochs) : n(n_), bad(bad_), bad_epochs(epochs) {}
  std::vector<std::int64_t> indices() const override {
    std::vector<std::int64_t> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
    if (std::find(bad_epochs.begin(), bad_epochs.end(), epoch_) != bad_epochs.end()) v[static_cast<std::size_t>(bad)] = 1000;
    return v;
  }
  std::int64_t size() const override { return n; }
};

std::vector<std::int64_t> labels_of(DataLoader& loader) {
  std::vector<std::int64_t> seen;
  for (Batch& b : loader) for (auto v : b.y.to_vector<std::int64_t>()) seen.push_back(v);
  return seen;
}
}  // namespace

TEST_CASE("prefetching: an epoch left early, then whole epochs, in the sampler's order") {
  auto ds = toy(40);
  auto sampler = std::make_shared<RandomSampler>(40, 5);
  DataLoader plain(ds, {3}, sampler);
  for (int prefetch : {1, 2, 5}) {
    CAPTURE(prefetch);
    DataLoaderOptions po{3};
    po.prefetch(prefetch);
    DataLoader ahead(ds, po, sampler);
    for (std::int64_t epoch = 0; epoch < 40; ++epoch) {
      sampler->set_epoch(epoch);
      // Leave after 0, 1 or 2 batches (the worker may be collating or waiting for room) ...
      ahead.start_epoch();
      Batch b;
      for (std::int64_t i = 0; i < epoch % 3; ++i) REQUIRE(ahead.next(b));
      // ... and the next epoch is whole and in order.
      const auto want = labels_of(plain);
      REQUIRE(want.size() == 40);
      CHECK(labels_of(ahead) == want);
    }
  }
}

TEST_CASE("prefetching: a batch that fails is thrown after the batches before it; the next epoch is whole") {
  auto ds = toy(20);
  auto sampler = std::make_shared<FaultySampler>(20, 13, std::vector<std::int64_t>{1});
  DataLoaderOptions po{4};
  po.prefetch(2);
  DataLoader loader(ds, po, sampler);
  CHECK(labels_of(loader).size() == 20);
  sampler->set_epoch(1);
  loader.start_epoch();
  Batch b;
  for (int i = 0; i < 3; ++i) REQUIRE(loader.next(b));  // rows 0-11
  CHECK_THROWS_WITH_AS(loader.next(b), doctest::Contains("dataset index 1000 is outside [0, 20)"), ValueError);
  sampler->set_epoch(2);
  const auto seen = labels_of(loader);
  REQUIRE(seen.size() == 20);
  for (std::int64_t i = 0; i < 20; ++i) CHECK(seen[static_cast<std::size_t>(i)] == i);
}

TEST_CASE("DistributedSampler in a DataLoader gives each rank its shard") {
  auto ds = toy(12);
  DistributedSamplerOptions o;
  o.num_replicas(3);
  o.rank(1);
  o.shuffle(false);
  DataLoader loader(ds, {2}, std::make_shared<DistributedSampler>(12, o));
  std::vector<std::int64_t> seen;
  for (Batch& b : loader) for (auto v : b.y.to_vector<std::int64_t>()) seen.push_back(v);
  CHECK(seen == std::vector<std::int64_t>{1, 4, 7, 10});
}

TEST_CASE("dataset errors") {
  CHECK_THROWS_AS(DataLoader(toy(3), {0}), ValueError);
  CHECK_THROWS_WITH_AS(TensorDataset(zeros({3, 2}), tensor(std::vector<std::int64_t>{0, 5, 1}, {3}), 3),
                       doctest::Contains("label[1] = 5 is outside [0, 3)"), ValueError);
  CHECK_THROWS_AS(TensorDataset(zeros({3, 2}), zeros({2}, DType::Int64)), ShapeError);
  CHECK_THROWS_AS(TensorDataset(zeros({0, 2}), zeros({0}, DType::Int64)), ValueError);
  const std::string fx = "/tmp/phalanx_ds_x.npy", fy = "/tmp/phalanx_ds_y.npy";
  save_npy(fx, randn({5, 4}));
  save_npy(fy, tensor(std::vector<std::int64_t>{0, 1, 2, 1, 0}, {5}));
  auto ds = load_npy_dataset(fx, fy, 3);
  CHECK(ds->size() == 5);
  CHECK(ds->feature_shape() == Shape{4});
  save_npy(fy, tensor(std::vector<std::int64_t>{0, 1}, {2}));
  CHECK_THROWS_WITH_AS(load_npy_dataset(fx, fy), doctest::Contains("first dimensions must agree"), ShapeError);
  std::remove(fx.c_str());
  std::remove(fy.c_str());
}

TEST_CASE("load_npy_dataset: .npz members, non-finite features, float labels") {
  const std::string fz = "/tmp/phalanx_ds_" + std::to_string(::getpid()) + ".npz";
  Tensor x = randn({6, 4});
  x.data<float>()[4 * 4 + 2] = -std::numeric_limits<float>::infinity();
  TensorMap m;
  m.set("x", x);
  m.set("y", tensor(std::vector<std::int64_t>{0, 1, 2, 1, 0, 2}, {6}));
  m.set("yf", tensor(std::vector<float>{0, 1, 2, 1, 0, 2}, {6}));
  save_npz(fz, m);
  CHECK_THROWS_WITH_AS(load_npy_dataset(fz + ":x", fz + ":y", 3), doctest::Contains((fz + ":x: row 4, column 2 is -inf (1 non-finite value in all)").c_str()),
                       ValueError);
  NpyDatasetOptions o;
  o.num_classes = 3;
  o.check_finite = false;
  auto ds = load_npy_dataset(fz + ":x", fz + ":y", o);
  CHECK(ds->size() == 6);
  CHECK(std::isinf(ds->features().data<float>()[18]));
  CHECK_THROWS_WITH_AS(load_npy_dataset(fz + ":x", fz + ":yf", o), doctest::Contains("labels are floating point"), TypeError);
  CHECK_THROWS_WITH_AS(load_array(fz + ":z"), doctest::Contains((fz + " has no member 'z' (members: x, y, yf)").c_str()), ValueError);
  CHECK_THROWS_WITH_AS(load_array(fz), doctest::Contains(("name the array as " + fz + ":KEY").c_str()), ValueError);
  CHECK(load_array(fz + ":y").to_vector<std::int64_t>() == m.at("y").to_vector<std::int64_t>());
  // A float32 .npy of labels: the message names the stored dtype
  const std::string fy = "/tmp/phalanx_ds_yf_" + std::to_string(::getpid()) + ".npy";
  save_npy(fy, m.at("yf"));
  CHECK_THROWS_WITH_AS(load_npy_dataset(fz + ":x", fy, o),
                       doctest::Contains((fy + ": labels are float32, but class labels must be integers; convert them with y.astype(np.int64)").c_str()),
                       TypeError);
  std::remove(fz.c_str());
  std::remove(fy.c_str());
}

namespace {

// Runs `f` with stderr (fd 2) sent to a file; returns what was written.
template <class F>
std::string stderr_of(F&& f) {
  const std::string path = "/tmp/phalanx_stderr_" + std::to_string(::getpid()) + ".txt";
  std::fflush(stderr);
  const int saved = ::dup(2);
  std::FILE* file = std::fopen(path.c_str(), "w");
  REQUIRE(file);
  ::dup2(::fileno(file), 2);
  try {
    f();
  } catch (...) {
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    std::fclose(file);
    throw;
  }
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::fclose(file);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path.c_str());
  return text;
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

void drain(DataLoader& loader) {
  for (Batch& b : loader) (void)b;
}

DistributedSamplerOptions one_replica(bool shuffle) {
  return DistributedSamplerOptions().num_replicas(1).rank(0).shuffle(shuffle);
}

const char* const kSecondPass =
    "phalanx: warning: DistributedSampler starts a second pass at epoch 0 with the same order: call "
    "sampler->set_epoch(epoch) (or loader.set_epoch(epoch)) before each epoch\n";

}  // namespace

TEST_CASE("a forgotten set_epoch: a shuffling sampler's second pass at one epoch warns once, through one loader or new ones") {
  auto ds = toy(12);
  for (int prefetch : {0, 2}) {
    CAPTURE(prefetch);
    // The same loader iterated again, three epochs without set_epoch: one line.
    auto sampler = std::make_shared<DistributedSampler>(12, one_replica(true));
    const auto o = DataLoaderOptions(4).prefetch(prefetch);
    DataLoader loader(ds, o, sampler);
    const std::string same_loader = stderr_of([&] {
      for (int epoch = 0; epoch < 3; ++epoch) drain(loader);
    });
    CHECK(same_loader == kSecondPass);
    // A new loader each epoch on one sampler: caught too.
    auto shared = std::make_shared<DistributedSampler>(12, one_replica(true));
    const std::string new_loaders = stderr_of([&] {
      for (int epoch = 0; epoch < 3; ++epoch) {
        DataLoader each(ds, o, shared);
        drain(each);
      }
    });
    CHECK(count_of(new_loaders, "starts a second pass at epoch 0") == 1);
    // The real class name.
    auto random = std::make_shared<RandomSampler>(12);
    DataLoader r(ds, o, random);
    const std::string named = stderr_of([&] {
      drain(r);
      drain(r);
    });
    CHECK(named.find("phalanx: warning: RandomSampler starts a second pass at epoch 0") == 0);
  }
}

TEST_CASE("no warning with set_epoch, without shuffling, or for two loaders reading one epoch at once") {
  auto ds = toy(12);
  const std::string quiet = stderr_of([&] {
    // set_epoch before each epoch (through the loader or the sampler).
    auto sampler = std::make_shared<DistributedSampler>(12, one_replica(true));
    DataLoader loader(ds, {4}, sampler);
    for (int epoch = 0; epoch < 3; ++epoch) {
      loader.set_epoch(epoch);
      drain(loader);
    }
    sampler->set_epoch(3);
    drain(loader);
    sampler->set_epoch(3);  // an explicit repeat of an epoch is the caller's choice
    drain(loader);
    // Not shuffling: every epoch's order is the same anyway.
    auto plain = std::make_shared<DistributedSampler>(12, one_replica(false));
    DataLoader p(ds, {4}, plain);
    for (int epoch = 0; epoch < 3; ++epoch) drain(p);
    DataLoader seq(ds, {4});
    for (int epoch = 0; epoch < 3; ++epoch) drain(seq);
    // Two live loaders over one sampler, reading epoch 0 at the same time (interleaved).
    auto shared = std::make_shared<RandomSampler>(12);
    DataLoader a(ds, {4}, shared), b(ds, {4}, shared);
    a.start_epoch();
    b.start_epoch();
    Batch x;
    while (a.next(x) | b.next(x)) {
    }
    // An incomplete pass (a break) is not a pass: starting over is not warned about.
    auto partial = std::make_shared<RandomSampler>(12, 5);
    DataLoader c(ds, {4}, partial);
    c.start_epoch();
    c.next(x);
    drain(c);
  });
  CHECK(quiet.empty());
  CHECK_FALSE(DistributedSampler(12, one_replica(false)).shuffles());
  CHECK(DistributedSampler(12, one_replica(true)).shuffles());
  CHECK(RandomSampler(4).shuffles());
  CHECK_FALSE(SequentialSampler(4).shuffles());
}

TEST_CASE("warn_once writes one line per key") {
  const std::string text = stderr_of([] {
    for (int i = 0; i < 3; ++i) {
      warn_once("test key a", "first thing: do this");
      warn_once("test key b", "second thing");
    }
    warn("every time");
  });
  CHECK(text == "phalanx: warning: first thing: do this\nphalanx: warning: second thing\nphalanx: warning: every time\n");
}
