#pragma once
// The nanoGPT/PyTorch 1.13 fixture shared by the GPT, MultiheadAttention and GPT-DDP tests
// (tests/fixtures/gpt_parity.npz, written by scripts/fixtures/gpt.py): loaded once per
// process, read by key or by key prefix.
#include <string>

#include "phalanx/core/npy.hpp"
#include "phalanx/core/tensor_map.hpp"

namespace phalanx::test {

inline const TensorMap& fixture() {
  static const TensorMap m = load_npz(std::string(PHALANX_FIXTURES) + "/gpt_parity.npz");
  return m;
}

inline const Tensor& fx(const std::string& k) { return fixture().at(k); }

/// The entries under `prefix`, with it taken off.
inline TensorMap under(const std::string& prefix) {
  TensorMap out;
  for (const auto& [k, v] : fixture())
    if (k.rfind(prefix, 0) == 0) out.set(k.substr(prefix.size()), v);
  return out;
}

}  // namespace phalanx::test
