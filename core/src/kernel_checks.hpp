#pragma once
// The kernel-table boundary's invariants (docs/errors.md, "Internal checks"). Ops validate
// user input with typed exceptions, then call the table of the tensors' device; what they
// promise the kernels (every tensor defined and on that one device, the dtypes a kernel
// reads, sizes that agree with each other and with the geometry passed) is checked once
// here, for every kernel of every table, with PHALANX_CHECK: a broken promise is a bug in
// an op (or in a plugin's caller), reported as an InternalError naming the kernel and the
// invariant instead of a kernel reading past a buffer.
//
// The checks sit in a decorator of DeviceKernels that the registry puts in front of each
// table it holds (the CPU's and each plugin's). On the success path they are a few loads
// and compares per call: no allocation, no message built (the message is formatted only
// when a check fails, out of line).
#include "phalanx/core/kernels.hpp"

namespace phalanx {

/// The table that checks each call's invariants, then forwards to `table` (the devices of
/// type `type`). The same wrapper is returned for the same table; a wrapper is returned as
/// it is; nullptr gives nullptr. Wrappers live until the process ends (kernels may run
/// during static destruction).
DeviceKernels* with_boundary_checks(DeviceType type, DeviceKernels* table);

}  // namespace phalanx
