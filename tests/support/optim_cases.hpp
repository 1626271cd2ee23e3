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
  if (name == "sgd_momentum") return std::make_unique<optim::SGD>(ps, optim::SGDOptions(0.1).momentum(0.9));
  if (name == "sgd_nesterov") {
    return std::make_unique<optim::SGD>(ps, optim::SGDOptions(0.05).momentum(0.9).nesterov(true));
  }
  if (name == "sgd_wd_dampening") return std::make_unique<optim::SGD>(ps, optim::SGDOptions(0.1).momentum(0.8).dampening(0.1).weight_decay(1e-2));
  if (name == "adam") return std::make_unique<optim::Adam>(ps, optim::AdamOptions(1e-2));
  if (name == "adam_wd")
    return std::make_unique<optim::Adam>(ps, optim::AdamOptions(1e-2).betas(0.8, 0.99).weight_decay(0.1));
  if (name == "adamw") return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions(1e-2).weight_decay(0.1));
  return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions(1e-2).weight_decay(0.1).amsgrad(true));
}

}  // namespace phalanx::test
