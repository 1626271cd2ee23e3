// Must compile: parallel/training may use every layer below it, the other two parts of
// parallel/ and their internal headers included.
#include "phalanx/backends/process_group.hpp"
#include "phalanx/core/tensor.hpp"
#include "phalanx/data/data_loader.hpp"
#include "phalanx/optim/sgd.hpp"
#include "phalanx/parallel/ddp.hpp"
#include "phalanx/parallel/init.hpp"
#include "phalanx/parallel/internal/failure_records.hpp"
#include "phalanx/parallel/internal/model_sync.hpp"
#include "phalanx/parallel/stop.hpp"
#include "phalanx/samplers/distributed_sampler.hpp"
