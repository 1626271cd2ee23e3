// A worker for tests/tools/test_netns_hosts.cpp, started by phalanx-run: says which address
// it advertises (the rule of parallel/rendezvous/src/advertise_address.hpp, from its own environment),
// then runs the conformance suite on the default process group and says so.
//   netns_worker          prints "rank R of W advertises ADDR", runs the conformance suite,
//                         prints "rank R conformance ok on BACKEND"
//   netns_worker quick    one allreduce instead of the suite, then "rank R allreduce ok"
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include <phalanx/phalanx.hpp>

#include "../../parallel/rendezvous/src/advertise_address.hpp"
#include "support/conformance.hpp"

using namespace phalanx;

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "quick";
  try {
    const parallel::LaunchEnv env = parallel::read_launch_env();
    const parallel::AdvertiseInputs in{env.master_addr, env.master_port, env.world_size, env.local_world_size};
    try {
      std::printf("rank %d of %d advertises %s\n", env.rank, env.world_size, parallel::advertise_address(in).c_str());
    } catch (const ConfigError&) {
      // init_process_group says it (the error under test)
    }
    auto pg = parallel::init_process_group();
    if (quick) {
      Tensor t = full({16}, pg->rank() + 1.0);
      pg->allreduce(t)->wait();
      const float want = pg->size() * (pg->size() + 1) / 2.f;
      if (t.data<float>()[0] != want) throw std::runtime_error("wrong allreduce result");
      std::printf("rank %d allreduce ok\n", pg->rank());
    } else {
      test::run_conformance(*pg);
      std::printf("rank %d conformance ok on %s\n", pg->rank(), pg->backend_name().c_str());
    }
    parallel::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "netns_worker: %s\n", e.what());
    return 1;
  }
}
