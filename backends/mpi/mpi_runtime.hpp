#pragma once
// The process's MPI library: initialised once (MPI cannot be initialised twice), by the first
// MPI process group or by the application before it, and finalised when the process exits;
// and the lock that keeps its calls one at a time.
#include <atomic>

namespace phalanx::mpi_backend {

/// Makes sure MPI is initialised, and returns the thread level it runs at. `wanted` is
/// MPI_THREAD_SINGLE (the default inline mode: every MPI call on one thread) or
/// MPI_THREAD_SERIALIZED (PHALANX_MPI_THREADS=serialized, PHALANX_MPI_ASYNC=1: the caller's
/// or worker's thread and a completion thread, one at a time). On first use: re-opens
/// libmpi with RTLD_GLOBAL (OpenMPI's components, loaded later by libmpi itself, resolve
/// their symbols against it), MPI_Init_thread(wanted), and an exit handler that ends MPI as
/// the exit status says: MPI_Finalize after a clean exit, MPI_Abort (the whole job ends at
/// once, with this status) after a failed one. Already initialised (by the application, or
/// by an earlier group): the level it has (MPI_Query_thread). Throws ConfigError with one
/// line when MPI was finalised already or the level is below `wanted`.
/// (OpenMPI 4.1 turns on its internal locks at any level above MPI_THREAD_SINGLE, which
/// costs every call: hence SINGLE by default, docs/mpi.md "Threads".)
int ensure_initialized(int wanted);

/// MPI_Finalize has run (objects that outlive it must not call MPI any more).
bool finalized();

namespace call_lock {
extern std::atomic<bool> mpi_busy;  // an MPI call of this process is under way
void wait_for_mpi() noexcept;       // the contended path of MpiCall: yields, then sleeps
}  // namespace call_lock

/// Held around every MPI call of every MPI group in this process at MPI_THREAD_SERIALIZED
/// or above (`lock` true; at MPI_THREAD_SINGLE every MPI call of the process is on one
/// thread, checked at each call, so there is nothing to serialise: `lock` false costs a
/// branch). MPI_THREAD_SERIALIZED
/// allows one call at a time per process (not per group), and the caller's (or worker's)
/// thread and the completion thread of sends and receives both call MPI. Uncontended it costs
/// one atomic exchange and one store (a collective on the caller's thread takes no mutex, no
/// library call). A waiter yields for the first millisecond, then sleeps 50 µs between tries:
/// the holder may be inside a collective that waits for a slow peer. Not recursive.
class MpiCall {
 public:
  explicit MpiCall(bool lock) noexcept : lock_(lock) {
    if (lock_ && call_lock::mpi_busy.exchange(true, std::memory_order_acquire)) call_lock::wait_for_mpi();
  }
  ~MpiCall() {
    if (lock_) call_lock::mpi_busy.store(false, std::memory_order_release);
  }
  MpiCall(const MpiCall&) = delete;
  MpiCall& operator=(const MpiCall&) = delete;

 private:
  bool lock_;
};

}  // namespace phalanx::mpi_backend
