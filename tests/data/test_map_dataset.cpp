// MapDataset (PyTorch's map-style dataset): get(i) per example, batched by the DataLoader
// into its preallocated batch tensors, with any sampler.
#include <doctest/doctest.h>

#include <cstring>

#include <phalanx/phalanx.hpp>

using namespace phalanx;
using namespace phalanx::samplers;

namespace {

Tensor features(std::int64_t n) {
  Generator g(8);
  return randn({n, 3, 2}, &g);
}
Tensor labels(std::int64_t n) {
  Generator g(9);
  return randint(7, {n}, &g);
}

/// The rows of a features tensor and a labels vector, one example at a time (label: a
/// scalar int64 tensor). `odd_index` >= 0 makes that example's features [3, 3].
class Rows : public MapDataset {
 public:
  Rows(Tensor x, Tensor y, std::int64_t odd_index = -1) : x_(std::move(x)), y_(std::move(y)), odd_(odd_index) {}
  std::int64_t size() const override { return x_.shape()[0]; }
  Example get(std::int64_t i) const override {
    if (i == odd_) return {zeros({3, 3}), full({}, 0.0, DType::Int64)};
    Tensor xi = x_.narrow_rows(i, i + 1).reshape({3, 2}).clone();
    Tensor yi = full({}, static_cast<double>(y_.data<std::int64_t>()[i]), DType::Int64);
    return {xi, yi};
  }

 private:
  Tensor x_, y_;
  std::int64_t odd_;
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("a MapDataset through a DataLoader with a DistributedSampler gives a TensorDataset's batches") {
  const std::int64_t n = 23;
  auto map = std::make_shared<Rows>(features(n), labels(n));
  auto flat = std::make_shared<TensorDataset>(features(n), labels(n));
  CHECK(map->feature_shape() == Shape{3, 2});
  CHECK(map->label_shape() == Shape{});
  CHECK(map->label_dtype() == DType::Int64);
  for (int prefetch : {0, 2})
    for (int rank : {0, 1}) {
      CAPTURE(prefetch);
      CAPTURE(rank);
      const auto so = DistributedSamplerOptions().num_replicas(2).rank(rank).seed(3);
      auto s1 = std::make_shared<DistributedSampler>(n, so), s2 = std::make_shared<DistributedSampler>(n, so);
      DataLoader a(map, DataLoaderOptions(4).prefetch(prefetch), s1);
      DataLoader b(flat, DataLoaderOptions(4).prefetch(prefetch), s2);
      for (std::int64_t epoch : {0, 1}) {
        a.set_epoch(epoch);
        b.set_epoch(epoch);
        std::vector<Batch> got, want;
        for (Batch& x : a) got.push_back(x);
        for (Batch& x : b) want.push_back(x);
        REQUIRE(got.size() == 3);  // 12 samples a rank, batches of 4
        REQUIRE(got.size() == want.size());
        for (std::size_t i = 0; i < got.size(); ++i) {
          CHECK(same_bytes(got[i].x, want[i].x));
          CHECK(same_bytes(got[i].y, want[i].y));
        }
      }
    }
}

TEST_CASE("a MapDataset example unlike example 0 is an error naming the index and both shapes") {
  auto odd = std::make_shared<Rows>(features(10), labels(10), 6);
  DataLoader loader(odd, DataLoaderOptions(4));
  loader.start_epoch();
  Batch b;
  CHECK(loader.next(b));  // examples 0..3
  CHECK_THROWS_WITH_AS(loader.next(b),
                       "MapDataset: example 6 has features of shape [3, 3], example 0 [3, 2]; every example must "
                       "have example 0's shapes",
                       ValueError);

  struct FloatLabel : MapDataset {
    std::int64_t size() const override { return 4; }
    Example get(std::int64_t i) const override {
      return {zeros({2}), i == 2 ? full({}, 1.0) : full({}, 1.0, DType::Int64)};
    }
  };
  DataLoader mixed(std::make_shared<FloatLabel>(), DataLoaderOptions(4));
  mixed.start_epoch();
  CHECK_THROWS_WITH_AS(mixed.next(b), doctest::Contains("MapDataset: example 2 has label of dtype float32, example 0 int64"),
                       ValueError);
}

TEST_CASE("int64 features (token ids) batch as int64, from a MapDataset and from a TensorDataset") {
  struct Tokens : MapDataset {
    std::int64_t size() const override { return 5; }
    Example get(std::int64_t i) const override {
      Tensor x = Tensor::empty({3}, DType::Int64);
      for (std::int64_t k = 0; k < 3; ++k) x.data<std::int64_t>()[k] = 10 * i + k;
      return {x, full({}, static_cast<double>(i), DType::Int64)};
    }
  };
  auto tokens = std::make_shared<Tokens>();
  CHECK(tokens->feature_dtype() == DType::Int64);
  Tensor all = Tensor::empty({5, 3}, DType::Int64);
  for (std::int64_t k = 0; k < 15; ++k) all.data<std::int64_t>()[k] = 10 * (k / 3) + k % 3;
  auto flat = std::make_shared<TensorDataset>(all, arange(5, DType::Int64));
  CHECK(flat->feature_dtype() == DType::Int64);
  for (const DatasetPtr& ds : {DatasetPtr(tokens), DatasetPtr(flat)}) {
    DataLoader loader(ds, DataLoaderOptions(2));
    std::vector<std::int64_t> seen;
    for (Batch& b : loader) {
      CHECK(b.x.dtype() == DType::Int64);
      for (std::int64_t k = 0; k < b.x.numel(); ++k) seen.push_back(b.x.data<std::int64_t>()[k]);
    }
    CHECK(seen == std::vector<std::int64_t>{0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32, 40, 41, 42});
  }
}
