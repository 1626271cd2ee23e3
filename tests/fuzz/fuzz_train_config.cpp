// Fuzzes phalanx-train's configuration: the input is a --config JSON file, parsed by
// parse_config() exactly as `phalanx-train --config F` does (JSON keys become options, then
// CLI11 and the checks). A refused config returns false with exit code 2 (0 for --help);
// an accepted one must hold values in their documented ranges (finite, positive rates and
// sizes). parse_config() prints its one-line errors and CLI11 its help through stdio and
// iostreams: both are silenced while it runs (sanitizer reports write to fd 2 directly).
#include <cmath>
#include <iostream>

#include "fuzz_support.hpp"
#include "tools/trainer/train_config.hpp"

namespace {

// Swaps stdio's stderr and the standard streams for /dev/null for one call.
class Quiet {
 public:
  Quiet() : err_(stderr), out_(std::cout.rdbuf(nullptr)), cerr_(std::cerr.rdbuf(nullptr)) {
    static FILE* null = std::fopen("/dev/null", "w");
    if (null) stderr = null;
  }
  ~Quiet() {
    stderr = err_;
    std::cout.rdbuf(out_);
    std::cout.clear();
    std::cerr.rdbuf(cerr_);
    std::cerr.clear();
  }

 private:
  FILE* err_;
  std::streambuf* out_;
  std::streambuf* cerr_;
};

bool finite_positive(double v) { return std::isfinite(v) && v > 0; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static phalanx::fuzz::ScratchFile file(".json");
  using phalanx::fuzz::require;
  return phalanx::fuzz::guarded([&] {
    std::string path = file.write(data, size);
    std::string arg0 = "phalanx-train", opt = "--config";
    char* argv[] = {arg0.data(), opt.data(), path.data(), nullptr};
    phalanx::trainer::TrainConfig c;
    int code = -1;
    bool ok;
    {
      Quiet quiet;
      ok = phalanx::trainer::parse_config(3, argv, c, code);
    }
    if (!ok) {
      require(code == 0 || code == 2, "a refused config exits 2 (0 for --help)");
      return;
    }
    require(c.lr.has_value() != c.base_lr.has_value(), "either lr or base-lr is set");
    require(!c.lr || finite_positive(*c.lr), "lr is finite and > 0");
    require(!c.base_lr || finite_positive(*c.base_lr), "base-lr is finite and > 0");
    require(!c.base_batch || *c.base_batch >= 1, "base-batch >= 1");
    require(std::isfinite(c.momentum) && c.momentum >= 0 && c.momentum <= 1, "momentum is in [0, 1]");
    require(std::isfinite(c.weight_decay) && c.weight_decay >= 0, "weight-decay is finite and >= 0");
    require(finite_positive(c.lr_gamma), "lr-gamma is finite and > 0");
    require(c.global_batch >= 1 && c.epochs >= 1, "global-batch and epochs >= 1");
    require(c.warmup_steps >= 0 && c.checkpoint_every >= 0, "warmup-steps and checkpoint-every >= 0");
    require(c.model.size() >= 2, "the model has an input and an output width");
    for (auto w : c.model) require(w >= 1, "layer widths >= 1");
  });
}
