// Must not link against core's objects alone: a function of a layer above, declared by hand
// (no header needed), as core/src/kernels_registry.cpp once did with a function of backends/.
namespace phalanx::parallel {
void destroy_process_group();
}
void layer_link_control() { phalanx::parallel::destroy_process_group(); }
