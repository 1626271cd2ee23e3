// A worker for tests/tools/test_two_nodes.cpp, started by phalanx-run:
//   hierarchy_worker EXPECTED_BACKEND DIR
// init_process_group() (auto), checks the backend's name, runs the conformance suite and
// DDP against one process, then writes DIR/ok_<rank>. Any failure: a message, exit 1.
#include <cstdio>
#include <fstream>

#include "support/hierarchy_checks.hpp"

using namespace phalanx;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: hierarchy_worker EXPECTED_BACKEND DIR\n");
    return 2;
  }
  try {
    auto pg = parallel::init_process_group();
    if (pg->backend_name() != argv[1])
      throw std::runtime_error(detail::concat("rank ", pg->rank(), ": backend ", pg->backend_name(), ", expected ", argv[1]));
    test::run_conformance(*pg);
    test::check_ddp_equals_one_process(pg);
    pg->barrier()->wait();
    std::ofstream(std::string(argv[2]) + "/ok_" + std::to_string(pg->rank())) << pg->backend_name();
    parallel::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hierarchy_worker: %s\n", e.what());
    return 1;
  }
}
