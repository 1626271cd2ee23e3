#include <doctest/doctest.h>

#include <phalanx/core/xtensor.hpp>
#include <xtensor/xio.hpp>

using namespace phalanx;

TEST_CASE("to and from xt::xarray, and a zero-copy view") {
  xt::xarray<float> a = {{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}};
  Tensor t = from_xarray(a);
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  xt::xarray<float> back = to_xarray<float>(t);
  CHECK(back == a);
  auto v = as_xview<float>(t);
  v(1, 2) = 60.f;
  CHECK(t.data<float>()[5] == 60.f);
  xt::xarray<std::int64_t> labels = {3, 1, 4};
  CHECK(from_xarray(labels).dtype() == DType::Int64);
}
