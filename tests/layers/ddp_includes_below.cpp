// Must compile: parallel/ddp may use parallel/rendezvous (public and internal headers) and
// the layers below it.
#include "phalanx/backends/process_group.hpp"
#include "phalanx/core/tensor.hpp"
#include "phalanx/parallel/ddp.hpp"
#include "phalanx/parallel/init.hpp"
#include "phalanx/parallel/internal/failure_records.hpp"
