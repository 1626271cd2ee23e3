#include "mpi_runtime.hpp"

#include <dlfcn.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "phalanx/backends/comm_error.hpp"

namespace phalanx::mpi_backend {

namespace {

const char* level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

/// The plugin is opened RTLD_LOCAL by the registry, and libmpi with it as its dependency:
/// libmpi's symbols are then invisible to the components OpenMPI dlopen()s during MPI_Init
/// (mca_pml_ob1.so, mca_coll_tuned.so, ... are not linked against libmpi), which fail to
/// load. Re-opening the already loaded libmpi with RTLD_NOLOAD | RTLD_GLOBAL moves it (and
/// its own dependencies, libopen-pal and libopen-rte) into the global scope, as mpi4py does.
void promote_libmpi_to_global() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&MPI_Init_thread), &info) == 0 || info.dli_fname == nullptr) return;
  // The handle is kept: the library stays loaded for the process's life anyway.
  if (::dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD) == nullptr)
    std::fprintf(stderr, "phalanx: mpi: cannot re-open %s with RTLD_GLOBAL (%s); MPI_Init may fail to load its components\n",
                 info.dli_fname, ::dlerror());
}

/// on_exit handler (glibc), registered once the plugin initialised MPI. A failed process
/// (status != 0) aborts the job: MPI_Finalize would wait in its closing fence for peers that
/// are themselves waiting for this rank in a collective, and the job would hang.
void end_mpi(int status, void*) {
  int done = 0;
  MPI_Finalized(&done);
  if (done) return;
  if (status != 0)
    MPI_Abort(MPI_COMM_WORLD, status);
  else
    MPI_Finalize();
}

}  // namespace

int ensure_initialized(int wanted) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  int done = 0;
  MPI_Finalized(&done);
  if (done)
    throw ConfigError("backend 'mpi': MPI_Finalize has already run in this process and MPI cannot be "
                      "initialised again; create the MPI process group before MPI_Finalize");
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    promote_libmpi_to_global();
    const int rc = MPI_Init_thread(nullptr, nullptr, wanted, &provided);
    if (rc != MPI_SUCCESS)
      throw CommError("backend 'mpi': MPI_Init_thread failed (error " + std::to_string(rc) +
                      "); was the job started by mpirun or srun?");
    ::on_exit(&end_mpi, nullptr);
  } else {
    MPI_Query_thread(&provided);  // the application (or an earlier group) initialised MPI
  }
  if (provided < wanted)
    throw ConfigError(std::string("backend 'mpi': MPI runs at ") + level_name(provided) + ", but " +
                      "PHALANX_MPI_ASYNC=1 or PHALANX_MPI_THREADS=serialized calls MPI from two threads (one at "
                      "a time) and needs " + level_name(wanted) + " or higher; " +
                      (initialized ? "MPI was initialised before this group (by the application, or by an earlier "
                                     "group at the default MPI_THREAD_SINGLE: set PHALANX_MPI_THREADS=serialized "
                                     "before the first group, or initialise MPI with MPI_Init_thread(..., "
                                     "MPI_THREAD_SERIALIZED, ...))"
                                   : "use an MPI library built with thread support, or leave both unset (the "
                                     "default runs every MPI call on one thread)"));
  return provided;
}

namespace call_lock {

std::atomic<bool> mpi_busy{false};

void wait_for_mpi() noexcept {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  for (;;) {
    // Read before exchanging: a waiter does not keep stealing the holder's cache line.
    if (!mpi_busy.load(std::memory_order_relaxed) && !mpi_busy.exchange(true, std::memory_order_acquire)) return;
    if (Clock::now() - start < std::chrono::milliseconds(1))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace call_lock

bool finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

}  // namespace phalanx::mpi_backend
