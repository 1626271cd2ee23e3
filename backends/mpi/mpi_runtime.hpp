#pragma once
// The process's MPI library: initialised once (MPI cannot be initialised twice), by the first
// MPI process group or by the application before it, and finalised when the process exits;
// and the lock that keeps its calls one at a time.
#include <atomic>

namespace phalanx::mpi_backend {

/// Makes sure MPI is initialised with at least MPI_THREAD_SERIALIZED (the group calls MPI
/// from the caller's thread and from its completion thread, one at a time). On first use:
/// re-opens libmpi with RTLD_GLOBAL (OpenMPI's components, loaded later by libmpi itself,
/// resolve their symbols against it), MPI_Init_thread, and an exit handler that ends MPI as
/// the exit status says: MPI_Finalize after a clean exit, MPI_Abort (the whole job ends at
/// once, with this status) after a failed one. Throws ConfigError with one line when MPI was
/// finalised already or gives a lower thread level.
void ensure_initialized();

/// MPI_Finalize has run (objects that outlive it must not call MPI any more).
bool finalized();

namespace call_lock {
extern std::atomic<bool> mpi_busy;  // an MPI call of this process is under way
void wait_for_mpi() noexcept;       // the contended path of MpiCall: yields, then sleeps
}  // namespace call_lock

/// Held around every MPI call of every MPI group in this process: MPI_THREAD_SERIALIZED
/// allows one call at a time per process (not per group), and the caller's (or worker's)
/// thread and the completion thread of sends and receives both call MPI. Uncontended it costs
/// one atomic exchange and one store (a collective on the caller's thread takes no mutex, no
/// library call). A waiter yields for the first millisecond, then sleeps 50 µs between tries:
/// the holder may be inside a collective that waits for a slow peer. Not recursive.
class MpiCall {
 public:
  MpiCall() noexcept {
    if (call_lock::mpi_busy.exchange(true, std::memory_order_acquire)) call_lock::wait_for_mpi();
  }
  ~MpiCall() { call_lock::mpi_busy.store(false, std::memory_order_release); }
  MpiCall(const MpiCall&) = delete;
  MpiCall& operator=(const MpiCall&) = delete;
};

}  // namespace phalanx::mpi_backend
