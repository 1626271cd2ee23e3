#pragma once
// The process's MPI library: initialised once (MPI cannot be initialised twice), by the first
// MPI process group or by the application before it, and finalised when the process exits.
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

}  // namespace phalanx::mpi_backend
