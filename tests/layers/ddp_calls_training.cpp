// Must not link against ddp's objects and those below it: a function of parallel/training,
// declared by hand (no header needed), as if the reducer asked whether a stop was requested.
namespace phalanx::parallel {
bool stop_requested();
}
bool layer_link_control() { return phalanx::parallel::stop_requested(); }
