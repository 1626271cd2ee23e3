// Uses the backend that PHALANX_BACKEND names: the program does not know which it is.
#include <cstdio>

#include <phalanx/phalanx.hpp>

int main() {
  using namespace phalanx;
  auto pg = parallel::init_process_group();
  Tensor t = full({4}, pg->rank() + 1.0);
  pg->allreduce(t)->wait();
  const float want = pg->size() * (pg->size() + 1) / 2.f;
  std::printf("rank %d of %d on backend '%s': allreduce sum = %g (expected %g)\n", pg->rank(), pg->size(),
              pg->backend_name().c_str(), t.data<float>()[0], want);
  // a small DDP step over the same backend
  Generator g(1);
  parallel::DDP model(nn::mlp({8, 4, 2}, "relu", &g), pg);
  cross_entropy(model.forward(randn({6, 8}, &g)), randint(2, {6}, &g)).backward();
  pg->barrier()->wait();
  parallel::destroy_process_group();
  return t.data<float>()[0] == want ? 0 : 1;
}
