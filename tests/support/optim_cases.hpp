#pragma once
// The optimizer cases of the PyTorch 1.13 parity fixture (scripts/make_fixtures.py,
// optim_parity.npz): each name builds the optimizer with the settings the fixture recorded.
// Shared by tests/optim/test_optimizers.cpp (CPU against PyTorch) and
// tests/optim/test_optimizers_devices.cpp (sim against CPU).
#include <memory>
#include <string>
#include <vector>

#include <phalanx/phalanx.hpp>

namespace phalanx::test {

inline TensorMap optim_fixture() { return load_npz(std::string(PHALANX_FIXTURES) + "/optim_parity.npz"); }

inline const char* const kOptimCases[] = {"sgd",  "sgd_momentum", "sgd_nesterov", "sgd_wd_dampening",
                                          "adam", "adam_wd",      "adamw",        "adamw_amsgrad"};

inline std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& name, std::vector<Tensor> ps) {
  if (name == "sgd") return std::make_unique<optim::SGD>(ps, optim::SGDOptions{0.1});
  if (name == "sgd_momentum") return std::make_unique<optim::SGD>(ps, optim::SGDOptions{0.1, 0.9});
  if (name == "sgd_nesterov") {
    optim::SGDOptions o{0.05, 0.9};
    o.nesterov = true;
    return std::make_unique<optim::SGD>(ps, o);
  }
  if (name == "sgd_wd_dampening") return std::make_unique<optim::SGD>(ps, optim::SGDOptions{0.1, 0.8, 0.1, 1e-2});
  optim::AdamOptions a;
  a.lr = 1e-2;
  if (name == "adam") return std::make_unique<optim::Adam>(ps, a);
  if (name == "adam_wd") {
    a.beta1 = 0.8;
    a.beta2 = 0.99;
    a.weight_decay = 0.1;
    return std::make_unique<optim::Adam>(ps, a);
  }
  a.weight_decay = 0.1;
  if (name == "adamw") return std::make_unique<optim::AdamW>(ps, a);
  a.amsgrad = true;
  return std::make_unique<optim::AdamW>(ps, a);
}

}  // namespace phalanx::test
