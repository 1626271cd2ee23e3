// phalanx-train --device sim: the trainer's whole loop (DDP over Gloo, staged through host
// memory; the optimizer; the loss sums and the evaluation on the device) on the sim test
// accelerator, whose memory the host cannot read, gives the same --save bytes as --device cpu.
#include <doctest/doctest.h>

#include <string>

#include <phalanx/phalanx.hpp>

#include "tools/trainer_harness.hpp"

namespace {

using trainer_test::Result;

std::string dir() {
  static const std::string d = trainer_test::case_study_dir("phalanx_train_device");
  return d;
}

Result run(const std::string& args, int workers) {
  const std::string cmd = std::string(PHALANX_RUN) + " --nproc-per-node " + std::to_string(workers) + " " +
                          PHALANX_TRAIN + " " + args;
  return trainer_test::run_command(cmd, dir() + "/out.txt");
}

const std::string kData = " --train-x " + dir() + "/x.npy --train-y " + dir() + "/y.npy --init " + dir() + "/init.npz";

}  // namespace

TEST_CASE("--device sim on 2 workers over gloo: the same --save bytes as --device cpu") {
  // SGD with momentum and weight decay, then AdamW: both fused updates and the gradient
  // buckets run on the device; a test set exercises the evaluation's device path.
  for (const std::string opt : {"--optimizer sgd --momentum 0.9 --weight-decay 1e-4 --lr 0.05",
                                "--optimizer adamw --lr 0.01 --weight-decay 0.01"}) {
    CAPTURE(opt);
    std::string saved[2];
    int i = 0;
    for (const std::string device : {"cpu", "sim"}) {
      const std::string save = dir() + "/w_" + device + ".npz";
      const Result r = run(kData + " --test-x " + dir() + "/x.npy --test-y " + dir() + "/y.npy " + opt +
                               " --backend gloo --global-batch 64 --epochs 2 --device " + device + " --save " + save,
                           2);
      INFO(r.out);
      REQUIRE(r.code == 0);
      saved[i++] = trainer_test::slurp(save);
      CHECK(!saved[i - 1].empty());
    }
    CHECK(saved[0] == saved[1]);
  }
}

TEST_CASE("--device: an unknown device, or a device whose plugin cannot run, fails before any training") {
  Result r = run(kData + " --backend gloo --device tpu", 2);
  CHECK(r.code != 0);
  CHECK(r.out.find("unknown device 'tpu' (from the device option)") != std::string::npos);
  CHECK(r.out.find("epoch") == std::string::npos);
  // The sim run above really ran on sim: with its plugin switched off it cannot start.
  r = run(kData + " --backend gloo --device sim", 2);
  REQUIRE(r.code == 0);
  ::setenv("PHALANX_SIM_UNAVAILABLE", "switched off by the test", 1);
  r = run(kData + " --backend gloo --device sim", 2);
  ::unsetenv("PHALANX_SIM_UNAVAILABLE");
  CHECK(r.code != 0);
  CHECK(r.out.find("no kernels for device sim:0") != std::string::npos);
  CHECK(r.out.find("epoch") == std::string::npos);
}
