// Trains a tiny MLP through the installed shared library and checks the loss falls.
#include <cstdio>

#include <phalanx/phalanx.hpp>

int main() {
  using namespace phalanx;
  manual_seed(0);
  auto model = nn::mlp({8, 16, 3});
  Tensor x = randn({32, 8});
  Tensor y = randint(3, {32});
  float first = 0, last = 0;
  for (int step = 0; step < 50; ++step) {
    model->zero_grad();
    Tensor loss = cross_entropy(model->forward(x), y);
    loss.backward();
    NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.add_(p.grad(), -0.5f);
    (step == 0 ? first : last) = loss.item();
  }
  std::printf("consumer: loss %.4f -> %.4f\n", first, last);
  return last < 0.8f * first ? 0 : 1;
}
