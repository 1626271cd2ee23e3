// Every op's output and gradient on CUDA equal the CPU path within float tolerance; fused
// optimizer updates; DDP over NCCL in a world of one.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>

#include "support/gradcheck.hpp"

using namespace phalanx;
using phalanx::test::away_from_zero;
using phalanx::test::max_rel_err;

namespace {
const Device kGpu = Device::cuda(0);

/// Runs f on CPU inputs and on their CUDA copies; compares outputs and input gradients.
void same_on_gpu(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> cpu, double tol = 1e-5) {
  std::vector<Tensor> gpu;
  for (auto& t : cpu) {
    gpu.push_back(t.to(kGpu));
    if (t.dtype() == DType::Float32) {
      t.requires_grad_();
      gpu.back().requires_grad_();
    }
  }
  Tensor yc = f(cpu), yg = f(gpu);
  CHECK(yg.device() == kGpu);
  CHECK(max_rel_err(yg.to(Device::cpu()), yc) < tol);
  Generator g(1);
  Tensor r = randn(yc.shape(), &g);
  yc.backward(r);
  yg.backward(r.to(kGpu));
  for (std::size_t i = 0; i < cpu.size(); ++i)
    if (cpu[i].dtype() == DType::Float32) CHECK(max_rel_err(gpu[i].grad().to(Device::cpu()), cpu[i].grad()) < tol);
}
}  // namespace

TEST_CASE("elementwise, matmul, linear, reductions, softmax and losses match the CPU") {
  same_on_gpu([](auto& in) { return relu(in[0]); }, {away_from_zero({37, 5}, 1)});
  same_on_gpu([](auto& in) { return tanh(in[0]); }, {away_from_zero({37, 5}, 2)});
  same_on_gpu([](auto& in) { return sigmoid(in[0]); }, {away_from_zero({37, 5}, 3)});
  same_on_gpu([](auto& in) { return exp(in[0]); }, {away_from_zero({37, 5}, 4)});
  same_on_gpu([](auto& in) { return log(exp(in[0])); }, {away_from_zero({37, 5}, 5)});
  same_on_gpu([](auto& in) { return neg(in[0]); }, {away_from_zero({37, 5}, 6)});
  same_on_gpu([](auto& in) { return add(in[0], in[1]); }, {away_from_zero({8, 5}, 7), away_from_zero({5}, 8)});
  same_on_gpu([](auto& in) { return sub(in[0], in[1]); }, {away_from_zero({8, 5}, 9), away_from_zero({8, 5}, 10)});
  same_on_gpu([](auto& in) { return mul(in[0], in[1]); }, {away_from_zero({8, 5}, 11), away_from_zero({5}, 12)});
  same_on_gpu([](auto& in) { return div(in[0], in[1]); }, {away_from_zero({8, 5}, 13), away_from_zero({8, 5}, 14)});
  same_on_gpu([](auto& in) { return mul(add(in[0], 2.f), 3.f); }, {away_from_zero({8, 5}, 15)});
  same_on_gpu([](auto& in) { return matmul(in[0], in[1]); }, {away_from_zero({33, 17}, 16), away_from_zero({17, 9}, 17)});
  same_on_gpu([](auto& in) { return linear(in[0], in[1], in[2]); },
              {away_from_zero({64, 784}, 18), away_from_zero({256, 784}, 19), away_from_zero({256}, 20)}, 1e-4);
  same_on_gpu([](auto& in) { return sum(in[0]); }, {away_from_zero({1000}, 21)});
  same_on_gpu([](auto& in) { return mean(in[0], 1); }, {away_from_zero({6, 7, 3}, 22)});
  same_on_gpu([](auto& in) { return transpose(in[0], 0, 2); }, {away_from_zero({4, 3, 5}, 23)});
  same_on_gpu([](auto& in) { return log_softmax(in[0], 1); }, {away_from_zero({9, 10}, 24)});
  Generator g(3);
  Tensor target = randint(10, {64}, &g);
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None})
    same_on_gpu([&](auto& in) { return cross_entropy(in[0], in[0].device().is_cpu() ? target : target.to(kGpu), r); },
                {away_from_zero({64, 10}, 25)});
  same_on_gpu([](auto& in) { return mse_loss(in[0], in[1]); }, {away_from_zero({9, 4}, 26), away_from_zero({9, 4}, 27)});
  CHECK_THROWS_AS(cross_entropy(zeros({2, 3}, DType::Float32, kGpu), tensor(std::vector<std::int64_t>{0, 7}, {2}).to(kGpu)),
                  ValueError);
}

TEST_CASE("fused SGD and AdamW updates match the CPU; 16-bit conversions round alike") {
  for (int which = 0; which < 2; ++which) {
    Tensor pc = away_from_zero({1000}, 30).requires_grad_(), pg = pc.to(kGpu).requires_grad_();
    std::unique_ptr<optim::Optimizer> oc, og;
    if (which == 0) {
      oc = std::make_unique<optim::SGD>(std::vector<Tensor>{pc}, optim::SGDOptions{0.1, 0.9, 0, 0.01, true});
      og = std::make_unique<optim::SGD>(std::vector<Tensor>{pg}, optim::SGDOptions{0.1, 0.9, 0, 0.01, true});
    } else {
      optim::AdamOptions a;
      a.weight_decay = 0.1;
      a.amsgrad = true;
      oc = std::make_unique<optim::AdamW>(std::vector<Tensor>{pc}, a);
      og = std::make_unique<optim::AdamW>(std::vector<Tensor>{pg}, a);
    }
    for (int s = 0; s < 10; ++s) {
      Tensor g = away_from_zero({1000}, 40 + s);
      pc.set_grad(g);
      pg.set_grad(g.to(kGpu));
      oc->step();
      og->step();
    }
    CHECK(max_rel_err(pg.to(Device::cpu()), pc) < 1e-6);
  }
  Tensor x = away_from_zero({4096}, 50);
  for (DType dt : {DType::Float16, DType::BFloat16})
    CHECK(to_dtype(to_dtype(x.to(kGpu), dt), DType::Float32).to(Device::cpu()).to_vector<float>() ==
          to_dtype(to_dtype(x, dt), DType::Float32).to_vector<float>());
}

TEST_CASE("an MLP step and DDP over NCCL (world of one) on the GPU") {
  parallel::InitOptions o;
  o.backend = "nccl";
  auto pg = parallel::init_process_group(o);
  CHECK(pg->backend_name() == "nccl");
  Generator g(5);
  auto net = nn::mlp({784, 256, 10}, "relu", &g);
  auto ref = nn::mlp({784, 256, 10}, "relu", &g);
  ref->load_state_dict(net->state_dict());
  net->to(kGpu);
  parallel::DDP model(net, pg);
  optim::SGD opt(model.parameters(), optim::SGDOptions{0.1, 0.9});
  optim::SGD ref_opt(ref->parameters(), optim::SGDOptions{0.1, 0.9});
  Tensor x = randn({128, 784}, &g), y = randint(10, {128}, &g);
  Tensor xg = x.to(kGpu), yg = y.to(kGpu);
  for (int s = 0; s < 5; ++s) {
    opt.zero_grad();
    cross_entropy(model.forward(xg), yg).backward();
    opt.step();
    ref_opt.zero_grad();
    cross_entropy(ref->forward(x), y).backward();
    ref_opt.step();
  }
  for (std::size_t i = 0; i < ref->parameters().size(); ++i)
    CHECK(max_rel_err(model.parameters()[i].to(Device::cpu()), ref->parameters()[i]) < 1e-4);
  Tensor t = ones({1000}, DType::Float32, kGpu);
  pg->allreduce(t, ReduceOp::Avg)->wait();
  CHECK(t.to(Device::cpu()).to_vector<float>()[999] == 1.f);
  parallel::destroy_process_group();
}
