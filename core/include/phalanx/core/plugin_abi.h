/* The plugin ABI, shared by device plugins (CUDA, the sim test device) and communication
 * plugins (gloo, nccl, shm, mpi): every plugin is a MODULE library libphalanx_<name>.so
 * exporting one C-linkage entry point, phalanx_plugin_entry, that returns a static
 * descriptor. core/src/plugin_loader.cpp finds and checks it (phalanx/core/plugin_loader.hpp).
 * The loader checks abi_version first, then kind, then the probe; each failure has its own
 * error. Plugins are built against this Phalanx's headers (the factory hands C++ objects
 * across), so PHALANX_PLUGIN_ABI_VERSION changes whenever those headers change layout. */
#ifndef PHALANX_CORE_PLUGIN_ABI_H
#define PHALANX_CORE_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

/* 12: Backend's vtable gained alloc_symmetric (ProcessGroup::symmetric_zeros); 11: DeviceKernels gained event_handle (NCCL's stream-ordered Works), Work a device done
 * event; 10: DeviceKernels gained gemm_bf16; TensorImpl gained strides (views); autograd's Node a
 * virtual (reusable); 9: DeviceKernels gained the stream-ordering events (event_*, stream_wait_event,
 * set_comm_stream), Backend orders_device_streams_ (tests/backends/test_failures.cpp checks
 * the layouts against this number); 8: Backend's vtable and layout (inline_work; defer_polled and restrict_to_this_thread went
 * to the MPI plugin); 7: BackendConfig gained ranks_on_machine; 6: DeviceKernels gained sgd_update_group/
 * adam_update_group (multi-tensor optimizer steps);
 * 5: Backend's and Work's layout (defer_polled, restrict_to_this_thread); 4: comm plugins'
 * create returns a phalanx::Backend* (the ProcessGroup that owns it is made by the loader);
 * 3: Sim device, exact-mode kernels; 2: Storage file mappings */
#define PHALANX_PLUGIN_ABI_VERSION 12u
#define PHALANX_PLUGIN_ENTRY_SYMBOL "phalanx_plugin_entry"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct phalanx_plugin_descriptor {
  uint32_t abi_version;    /* PHALANX_PLUGIN_ABI_VERSION the plugin was built with */
  const char* name;        /* "gloo": must match the file name libphalanx_<name>.so */
  const char* kind;        /* "comm" (a Backend factory) or "device" (kernel tables) */
  const char* description; /* one line for listings */
  /* Availability probe (may be NULL = always available): returns nonzero when the backend
   * can run here; otherwise writes a reason (e.g. "no CUDA device") into `reason`. */
  int (*probe)(char* reason, size_t reason_len);
  /* comm: `config` is a const phalanx::BackendConfig*; returns a new phalanx::Backend*
   * (converted to Backend* before void*) owned by the caller, who wraps it in a
   * ProcessGroup; or NULL with a message in `error`.
   * device: `config` is NULL; registers the device's kernel table and returns non-NULL. */
  void* (*create)(const void* config, char* error, size_t error_len);
  /* Destroys what `create` returned (comm plugins; called after the group's threads stopped). */
  void (*destroy)(void* object);
} phalanx_plugin_descriptor;

typedef const phalanx_plugin_descriptor* (*phalanx_plugin_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif
